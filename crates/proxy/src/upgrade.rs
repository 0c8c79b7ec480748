//! Protocol upgrades (RFC 9110 §7.8): WebSocket and anything else a `101 Switching Protocols`
//! starts. An HTTP/1.1 request with `Upgrade` and `Connection: upgrade` goes upstream with
//! those headers on a fresh connection (never one from the pool, and never returned to it);
//! the backend's `101` is relayed, and both connections become one byte stream
//! ([`tunnel`]). Any other answer (a refused upgrade) is relayed as it is.
//!
//! Over HTTP/1 the downstream connection changes hands: the framing check holds every byte
//! after an upgrade request until the handler says how it ended ([`ConnUpgrade::decide`]),
//! and once hyper has written the `101` the connection's task runs the tunnel in place of
//! HTTP. Over HTTP/2 (RFC 8441 extended CONNECT) the tunnel is one stream; see `h2`.
//!
//! Upstream, a group whose peer connection is HTTP/2 gets the upgrade as an extended CONNECT
//! when the peer enables it (`upstream_h2`); an `auto` group whose peer does not is reached
//! over a fresh HTTP/1.1 connection instead, and an `http2` group answers
//! `upstream_no_upgrade`.

mod h2;
mod tunnel;
mod upstream_h2;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use hyper::upgrade::OnUpgrade;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::body::{OnDone, ReqBody, RespBody};
use crate::config::UpstreamProtocol;
use crate::error::{Kind, NoPeersReason, ProxyError};
use crate::headers::strip_hop_by_hop;
use crate::pool::ConnectError;
use crate::upstream::{Group, Peer};

pub use tunnel::Tunnel;

const UNDECIDED: u8 = 0;
const SWITCHED: u8 = 1;
const REFUSED: u8 = 2;

/// Upgrade state of one downstream connection, shared by its handler and its framing check.
#[derive(Default)]
pub struct ConnUpgrade {
    decision: AtomicU8,
    waker: AtomicWaker,
    /// The tunnel to run once hyper has written the `101` (HTTP/1).
    tunnel: Mutex<Option<Tunnel>>,
    /// Becomes true when the process shuts down (connections close once idle).
    closing: OnceLock<watch::Receiver<bool>>,
}

impl ConnUpgrade {
    /// The outcome of the request that asked for an upgrade: the `101` goes out (`switched`),
    /// or the connection goes on as HTTP.
    pub fn decide(&self, switched: bool) {
        self.decision
            .store(if switched { SWITCHED } else { REFUSED }, Ordering::Release);
        self.waker.wake();
    }

    /// The outcome, once known (taken: the next upgrade request starts undecided).
    pub fn poll_decision(&self, cx: &mut Context<'_>) -> Poll<bool> {
        self.waker.register(cx.waker());
        match self.decision.swap(UNDECIDED, Ordering::AcqRel) {
            SWITCHED => Poll::Ready(true),
            REFUSED => Poll::Ready(false),
            _ => Poll::Pending,
        }
    }

    /// The shutdown signal upgraded connections watch (set once, when the connection starts).
    pub fn watch_shutdown(&self, closing: watch::Receiver<bool>) {
        let _ = self.closing.set(closing);
    }

    /// The tunnel waiting for hyper to hand the connection over, if any.
    pub fn take_tunnel(&self) -> Option<Tunnel> {
        self.tunnel.lock().unwrap().take()
    }
}

/// hyper's (and the framing check's) view: an HTTP/1.1 request with an `Upgrade` header
/// gets a pending upgrade, whose outcome the handler must report.
pub fn asks<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11 && req.headers().contains_key(header::UPGRADE)
}

/// An upgrade upkeep forwards, read from the request before hop-by-hop headers go.
pub(crate) struct Wanted {
    /// The `Upgrade` value to send upstream (`websocket`).
    protocol: HeaderValue,
    /// Where the downstream side of the tunnel comes from.
    downstream: tunnel::Downstream,
    /// RFC 8441 extended CONNECT over HTTP/2: answered `200`, spoken upstream as HTTP/1.1.
    h2: bool,
}

impl Wanted {
    /// An upgrade to forward: HTTP/1.1 with `Upgrade` named in `Connection` (RFC 9110 §7.8)
    /// and no body, or an HTTP/2 extended CONNECT with a `:protocol`. Takes the request's
    /// pending upgrade out of `extensions`.
    pub(crate) fn take(
        version: Version,
        method: &Method,
        headers: &HeaderMap,
        extensions: &mut http::Extensions,
        bodyless: bool,
    ) -> Option<Wanted> {
        if version == Version::HTTP_2 {
            return h2::wanted(method, extensions);
        }
        if version != Version::HTTP_11 || !bodyless {
            return None;
        }
        let named = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
        if !named {
            return None;
        }
        let protocols: Vec<&str> = headers
            .get_all(header::UPGRADE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let protocol = HeaderValue::from_str(&protocols.join(", ")).ok()?;
        if protocol.is_empty() {
            return None;
        }
        let downstream = tunnel::Downstream::Hyper(extensions.remove::<OnUpgrade>()?);
        Some(Wanted {
            protocol,
            downstream,
            h2: false,
        })
    }
}

/// What the request path needs to forward an upgrade.
pub(crate) struct Forward<'a> {
    /// The group routed to.
    pub group: &'a Arc<Group>,
    /// Method as received.
    pub method: Method,
    /// Target to send.
    pub uri: Uri,
    /// Headers, hop-by-hop ones already removed.
    pub headers: HeaderMap,
    /// Process metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Request bytes of this request (the tunnel adds client-to-upstream bytes here).
    pub bytes_in: Arc<AtomicU64>,
    /// How long upgraded connections stay open once shutdown begins.
    pub shutdown_timeout: Duration,
}

/// A tunnel waiting in a response's extensions for the handler to attach its log line.
#[derive(Clone)]
struct Pending(Arc<Mutex<Option<Tunnel>>>);

/// Forwards an upgrade request on a fresh connection to a peer of the group (another peer
/// when one refuses the connection). A `101` becomes the response to relay with a tunnel
/// waiting in its extensions ([`finish`] starts it); any other answer is relayed as it is.
pub(crate) async fn forward(
    want: Wanted,
    f: Forward<'_>,
    on_attempt: &mut (dyn FnMut(&Arc<Peer>) + Send),
) -> Result<Response<RespBody>, ProxyError> {
    let group = f.group;
    let cfg = group.config();
    if group.known_down() {
        return Err(ProxyError::new(Kind::NoPeers(NoPeersReason::AllDown)));
    }
    let deadline = Instant::now() + cfg.deadline;
    let mut tried: Vec<SocketAddr> = Vec::new();
    let mut last: Option<ProxyError> = None;
    let (peer, mut conn) = loop {
        let peer = match group.pick(&tried) {
            Ok(p) => p,
            Err(reason) => {
                return Err(last.unwrap_or_else(|| ProxyError::new(Kind::NoPeers(reason))))
            }
        };
        on_attempt(&peer);
        tried.push(peer.addr());
        let timeout = cfg
            .connect_timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        match group.pool().connect(peer.addr(), timeout).await {
            Ok(c) => break (peer, c),
            Err(e) => {
                let (kind, blameless) = match e {
                    ConnectError::Full(_) => (Kind::PeerFull, true),
                    ConnectError::Timeout(_) => (Kind::ConnectTimeout, false),
                    ConnectError::Tls(_) => (Kind::Tls, false),
                    _ => (Kind::Connect, false),
                };
                let weight = match kind {
                    Kind::ConnectTimeout => cfg.health.consecutive_failures,
                    _ => 1,
                };
                if !blameless {
                    group.record_connect_failure(peer.addr());
                    group.record_failure(&peer, weight);
                }
                tracing::debug!(peer.addr = %peer.addr(), error = %e, "upgrade: connect failed");
                last = Some(ProxyError::new(kind).with_source(e).on_peer(
                    peer.addr(),
                    false,
                    false,
                ));
                if Instant::now() >= deadline {
                    return Err(last.unwrap_or_else(|| ProxyError::new(Kind::Connect)));
                }
            }
        }
    };
    let via_h2 = match conn.h2_stream() {
        None => false,
        Some(stream) => {
            // A connection just opened has not heard the peer's SETTINGS yet.
            let wait = cfg
                .connect_timeout
                .min(deadline.saturating_duration_since(Instant::now()));
            let enabled = stream.extended_connect(wait).await == Some(true);
            if !enabled {
                conn = http1_instead(group, &peer, deadline).await?;
            }
            enabled
        }
    };
    let mut headers = f.headers;
    // Sec-WebSocket-Accept for an HTTP/1.1 client whose upgrade goes as an extended CONNECT.
    let mut accept = None;
    let req = if via_h2 {
        let https = conn.h2_stream().is_some_and(|s| s.https());
        let (req, a) = upstream_h2::extended_connect(f.uri, headers, &want.protocol, https);
        accept = a;
        req
    } else {
        let (method, protocol) = if want.h2 {
            h2::to_http1(&mut headers, &want.protocol)
        } else {
            (f.method.clone(), want.protocol.clone())
        };
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol);
        let mut req = Request::new(ReqBody::Empty);
        *req.method_mut() = method;
        *req.uri_mut() = f.uri;
        *req.version_mut() = Version::HTTP_11;
        *req.headers_mut() = headers;
        req
    };
    let sent_at = Instant::now();
    let due = (sent_at + cfg.try_timeout).min(deadline);
    let in_flight = peer.start_request();
    let res = tokio::time::timeout_at(due, conn.sender.send_request(req)).await;
    drop(in_flight);
    group.record_connected(peer.addr());
    let mut resp = match res {
        Err(_) => {
            group.record_failure(&peer, 1);
            return Err(ProxyError::new(Kind::Timeout).on_peer(peer.addr(), false, true));
        }
        Ok(Err(e)) => {
            group.record_failure(&peer, 1);
            return Err(ProxyError::new(Kind::Reset).with_source(e).on_peer(
                peer.addr(),
                false,
                true,
            ));
        }
        Ok(Ok(r)) => r,
    };
    group.record_success(&peer, sent_at);
    // An extended CONNECT is accepted with a 200 (RFC 8441 §5), an HTTP/1.1 upgrade with a 101.
    let switched = if via_h2 {
        StatusCode::OK
    } else {
        StatusCode::SWITCHING_PROTOCOLS
    };
    if resp.status() != switched {
        // Refused: relayed as it is; the connection is not pooled (it carried an upgrade
        // request, and the backend may still switch its side).
        tracing::debug!(peer.addr = %peer.addr(), status = resp.status().as_u16(), "upgrade refused by the upstream");
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        parts.version = crate::normalize::message::DOWNSTREAM_VERSION;
        return Ok(Response::from_parts(
            parts,
            RespBody::upstream(body, None, cfg.read_timeout),
        ));
    }
    let upstream = hyper::upgrade::on(&mut resp);
    let (parts, _) = resp.into_parts();
    let protocol = parts.headers.get(header::UPGRADE).cloned();
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    let mut out = Response::new(RespBody::empty());
    if via_h2 && want.h2 {
        // HTTP/2 on both sides: the peer's 200 is the client's.
        headers.remove(header::CONTENT_LENGTH);
        *out.status_mut() = StatusCode::OK;
    } else if via_h2 {
        *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        upstream_h2::to_http1_switch(&mut headers, want.protocol.clone(), accept);
    } else if want.h2 {
        // RFC 8441 §5: the stream is the tunnel; a 200 says so (no Upgrade, no 101).
        h2::from_http1(&mut headers);
        *out.status_mut() = StatusCode::OK;
    } else {
        *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(p) = protocol {
            headers.insert(header::UPGRADE, p);
        }
    }
    *out.headers_mut() = headers;
    let tunnel = Tunnel::new(
        want.downstream,
        upstream,
        conn,
        cfg.upgrade_idle_timeout,
        f.shutdown_timeout,
        f.metrics,
        f.bytes_in,
        want.h2,
    );
    out.extensions_mut()
        .insert(Pending(Arc::new(Mutex::new(Some(tunnel)))));
    Ok(out)
}

/// The peer's HTTP/2 connection does not take extended CONNECT: an `auto` group over TLS asks
/// the peer for HTTP/1.1 on a fresh connection (ALPN offering only `http/1.1`); an `http2`
/// group cannot carry the upgrade (`upstream_no_upgrade`).
async fn http1_instead(
    group: &Group,
    peer: &Peer,
    deadline: Instant,
) -> Result<crate::pool::Conn, ProxyError> {
    let cfg = group.config();
    let addr = peer.addr();
    if cfg.protocol != UpstreamProtocol::Auto {
        tracing::debug!(peer.addr = %addr, "upgrade: the HTTP/2 peer does not enable extended CONNECT");
        return Err(ProxyError::new(Kind::NoUpgrade)
            .with_source("the peer's HTTP/2 SETTINGS do not enable extended CONNECT (RFC 8441)")
            .on_peer(addr, false, false));
    }
    let timeout = cfg
        .connect_timeout
        .min(deadline.saturating_duration_since(Instant::now()));
    match group.pool().connect_http1(addr, timeout).await {
        Ok(c) => Ok(c),
        Err(ConnectError::Full(n)) => Err(ProxyError::new(Kind::PeerFull)
            .with_source(ConnectError::Full(n))
            .on_peer(addr, false, false)),
        Err(e @ ConnectError::Timeout(_)) => Err(ProxyError::new(Kind::ConnectTimeout)
            .with_source(e)
            .on_peer(addr, false, false)),
        // It just spoke TLS with the same peer: a refusal now is of `http/1.1` itself.
        Err(e @ ConnectError::Tls(_)) => Err(ProxyError::new(Kind::NoUpgrade)
            .with_source(e)
            .on_peer(addr, false, false)),
        Err(e) => Err(ProxyError::new(Kind::Connect)
            .with_source(e)
            .on_peer(addr, false, false)),
    }
}

/// Called by the handler with the response about to go out: the tunnel it starts, if it
/// starts one. A request that asked for an upgrade (`asks`) and got none is reported now.
pub(crate) fn take_tunnel(
    conn: &ConnUpgrade,
    asks: bool,
    resp: &mut Response<RespBody>,
) -> Option<Tunnel> {
    let tunnel = resp
        .extensions_mut()
        .remove::<Pending>()
        .and_then(|p| p.0.lock().unwrap().take());
    if tunnel.is_none() && asks {
        conn.decide(false);
    }
    tunnel
}

/// Gives the tunnel [`take_tunnel`] found the request's log line (written when the tunnel
/// ends) and sets it going.
pub(crate) fn start(conn: &ConnUpgrade, mut tunnel: Tunnel, done: Box<dyn OnDone>) {
    tunnel.set_done(done);
    if let Some(closing) = conn.closing.get() {
        tunnel.watch_shutdown(closing.clone());
    }
    if tunnel.is_h2() {
        // The stream is the tunnel; the connection goes on serving other streams.
        tokio::spawn(tunnel.run());
    } else {
        *conn.tunnel.lock().unwrap() = Some(tunnel);
        conn.decide(true);
    }
}
