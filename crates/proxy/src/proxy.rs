//! The request path: route -> group -> peer -> pooled connection -> streamed response, with
//! retries to other peers, stale-connection replays, and the retry budget.

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use http::uri::PathAndQuery;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, Uri, Version};
use http_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::access_log::{Field, Record, Text};
use crate::body::{DownBody, OnDone, ReqBody, RespBody};
use crate::boundary::{CatchPanic, Panicked};
use crate::config::{ListenerConfig, RouteConfig};
use crate::error::{Cut, Kind, NoPeersReason, ProxyError};
use crate::h1::fields::RawFields;
use crate::headers::{
    add_forwarded, strip_hop_by_hop, strip_hop_by_hop_keeping, Added, Present, KEEP_ALIVE,
};
use crate::listener::{ConnActivity, InFlight};
use crate::metrics::{class, ReasonLabel};
use crate::normalize::{self, message, Invalid};
use crate::pool::{keepalive_hint, Checkin, ConnectError};
use crate::request_id;
use crate::rescue;
use crate::route::RouteName;
use crate::rules;
use crate::state::{Shared, State};
use crate::upstream::{Group, Peer};

/// What a request handler knows about its downstream connection.
pub struct ConnCtx {
    /// Process-wide state.
    pub shared: Arc<Shared>,
    /// The listener's settings.
    pub listener: Arc<ListenerConfig>,
    /// Client address.
    pub remote: SocketAddr,
    /// The address the client connected to.
    pub local: SocketAddr,
    /// Arrived over TLS.
    pub tls: bool,
    /// Idle and in-flight tracking of the connection.
    pub activity: Arc<ConnActivity>,
    /// `Keep-Alive: timeout=N` for this listener, made once per connection.
    pub keepalive: HeaderValue,
    /// The client's IP address as a header value, made once per connection.
    pub client_ip: HeaderValue,
}

/// A response on the heap. It goes up the request path's layers (the exchange, the attempt,
/// the retries, `forward`, the panic boundary, the handler, the writer) as a pointer: each
/// layer's result was otherwise moved in and out of its future, 192 bytes at a time.
pub type Resp = Box<Response<RespBody>>;

/// Moves a value out of its box and frees the box at once. `*boxed` in an `async fn` frees
/// the emptied allocation only when the function ends: after the upstream's answer, for
/// `forward`, by when its memory has gone cold, and the next request's box of that size (made
/// from the allocator's most recently freed one) is written into cold memory. (Taking the
/// box is the point: the lint asks for the value instead.)
#[allow(clippy::boxed_local)]
pub(crate) fn unbox<T>(boxed: Box<T>) -> T {
    *boxed
}

/// A downstream request as the handler takes it: with its fields as received when
/// upkeep's own HTTP/1 server kept them so (`crate::h1::fields`; the request's map is then
/// empty). One box for both, which each layer of the request's future holds as a pointer; it
/// reads as the request it carries.
pub(crate) struct DownRequest {
    pub(crate) req: Request<DownBody>,
    pub(crate) fields: Option<RawFields>,
}

impl std::ops::Deref for DownRequest {
    type Target = Request<DownBody>;
    fn deref(&self) -> &Request<DownBody> {
        &self.req
    }
}

impl std::ops::DerefMut for DownRequest {
    fn deref_mut(&mut self) -> &mut Request<DownBody> {
        &mut self.req
    }
}

/// Handles one downstream request; never fails (failures become responses in `rescue`).
pub async fn handle(
    req: Request<DownBody>,
    ctx: Arc<ConnCtx>,
) -> Result<Response<RespBody>, Infallible> {
    let present = Present::of(req.headers());
    let down = Box::new(DownRequest { req, fields: None });
    let Ok(resp) = handle_with(down, ctx, present, false).await;
    Ok(*resp)
}

/// [`handle`] for a caller that has looked at the request's fields already (`present`).
/// `own_writer`: the response goes to upkeep's own HTTP/1 server, which writes an upstream
/// head passed on as received (`crate::h1::head::RawHead`); any other writer needs every
/// field in the response's map. The request comes boxed: each layer of the request's future
/// (this one, the panic boundary, `forward`) keeps what it was called with for as long as it
/// runs, a pointer rather than the request's 272 bytes and its kept fields.
///
/// This and the functions of the request path it awaits (`forward`, the retries, the
/// attempt, `h1::client::exchange`, the server's `handled` and `response::write`, an
/// HTTP/2 stream's `run`) are plain functions that return an `async` block: an `async fn`
/// keeps each argument twice in its future, as the argument and as the local it is moved
/// into, and these futures nest, in the box each request's future is made in. As blocks,
/// the HTTP/1 request's box is 2,864 bytes instead of 3,168 (`-Zprint-type-sizes`), under
/// the allocator's 3 KiB size class, and less of it is written per request.
#[allow(clippy::manual_async_fn)]
pub(crate) fn handle_with(
    mut req: Box<DownRequest>,
    ctx: Arc<ConnCtx>,
    present: Present,
    own_writer: bool,
) -> impl std::future::Future<Output = Result<Resp, Infallible>> + Send {
    async move {
        let start = Instant::now();
        // The request's reference to its connection's context, held until its response
        // body ends (`Done`).
        let in_flight = InFlight::new(ctx);
        let ctx = in_flight.ctx();
        // Borrowed, and the state taken through this thread's handle: the reference counts of
        // `Shared` and of the `State` are lines every serving thread would write per request
        // (docs/benchmarks.md, "How the design scales to 16 and 64 cores").
        let shared = &ctx.shared;
        shared.metrics.requests.inc();
        let state = shared.state_here();
        let version = req.version();
        let asks_upgrade = present.has(Present::UPGRADE) && crate::upgrade::asks(&req);
        // An HTTP/1.0 client keeps its connection only when it asks to; to any other the
        // keep-alive hint would announce a connection that closes after this response.
        let hint_keepalive = version == Version::HTTP_11
            || (version == Version::HTTP_10 && message::asks_keep_alive(req.headers()));
        let method = req.method().clone();
        // A new id goes out beside the map (`Added`), not into it: an insert is a hash of the
        // custom name and a probe.
        let new_id = if present.has(Present::X_REQUEST_ID) {
            // Fields kept as received hold one valid id (`crate::h1::fields`): kept as it is.
            if req.fields.is_none() {
                request_id::ensure_present(req.headers_mut());
            }
            None
        } else {
            Some(request_id::Id::new())
        };
        // What only the access log needs is made only while it is on: the request's text and
        // the wall-clock time of its line (no clock read while it is off).
        let head = shared.access_log.is_on().then(|| {
            (
                SystemTime::now(),
                logged_text(
                    &req,
                    req.fields.as_ref(),
                    &method,
                    logged_path(req.uri()),
                    new_id.as_ref().map(request_id::Id::as_bytes),
                ),
            )
        });
        // Fields kept as received are never a gRPC call's (`crate::h1::fields`).
        let grpc = present.has(Present::CONTENT_TYPE)
            && req.fields.is_none()
            && crate::grpc::is_grpc(req.headers());
        let mut info = AttemptInfo::default();

        let found = Found {
            present,
            grpc,
            own_writer,
            new_id,
            start,
        };
        let result = caught_forward(req, found, ctx, &state, &mut info).await;
        // The target as received, for the warnings below (`prepare` moved it to `info`).
        let path = info.target.as_ref().map_or("", logged_path);
        let result = result.unwrap_or_else(|Panicked(why)| {
            tracing::error!(cause = "internal", panic = %why, method = %method, path = %path, "request handler panicked; answered 500");
            Err(ProxyError::new(Kind::Internal))
        });
        // For the access log only: no clock read while it is off.
        let upstream_header_ms =
            (head.is_some() && result.is_ok()).then(|| millis(start.elapsed()));
        let (mut resp, cause, reason) = match result {
            Ok(r) => (r, None, None),
            Err(e) => {
                if e.cause().status().is_server_error() && !matches!(e.kind(), Kind::Internal) {
                    tracing::warn!(cause = e.cause().as_str(), error = %e, path = %path, "request failed");
                }
                (
                    Box::new(rescue::response_for(&e, grpc)),
                    Some(e.cause().as_str()),
                    e.detail(),
                )
            }
        };
        let origin = if cause.is_some() || info.answered {
            "proxy"
        } else {
            "upstream"
        };
        let switching = resp.status() == http::StatusCode::SWITCHING_PROTOCOLS;
        if (version == Version::HTTP_11 || version == Version::HTTP_10) && !switching {
            if shared.is_draining() {
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            } else if hint_keepalive {
                if own_writer {
                    // Written by the server after the map's fields, where the map would have
                    // put it: no insert (a hash and a probe) per response.
                    resp.body_mut().hint_keepalive();
                } else {
                    resp.headers_mut().insert(KEEP_ALIVE, ctx.keepalive.clone());
                }
            }
        }
        let status = resp.status();
        shared
            .metrics
            .latency
            .observe(start.elapsed().as_secs_f64());
        shared
            .metrics
            .response(origin, class(status), cause.unwrap_or(""));
        count_by_route_and_peer(shared, &info, status, origin);
        let record = head.map(|(wall, mut text)| {
            if let Some(r) = &info.route {
                text.set(Field::Route, &r.route);
                if !r.group.is_empty() {
                    text.set(Field::Group, &r.group);
                }
            }
            Box::new(Record {
                time: wall,
                client: ctx.remote.ip(),
                text,
                proto: proto_name(version),
                status: status.as_u16(),
                duration_ms: 0.0,
                peer: info.peer.as_ref().map(|p| p.addr()),
                attempts: info.attempts,
                upstream_status: (origin == "upstream").then_some(status.as_u16()),
                upstream_header_ms: upstream_header_ms.filter(|_| origin == "upstream"),
                bytes_in: 0,
                bytes_out: 0,
                origin,
                cause,
                reason,
                incomplete: false,
                format: state.config.access_log_format,
            })
        });
        // A tunnel is set going after `Done` took the request's reference to the connection:
        // it takes one of its own.
        let tunnel = crate::upgrade::take_tunnel(&ctx.activity.upgrade, asks_upgrade, &mut resp)
            .map(|t| (t, ctx.clone()));
        let done = Done {
            start,
            record,
            bytes_in: info.bytes_in.take(),
            in_flight,
        };
        let done = crate::expect::on_done(&mut resp, Box::new(done));
        match tunnel {
            // An upgraded connection logs its line when it ends, with the bytes it carried.
            Some((tunnel, ctx)) => crate::upgrade::start(&ctx.activity.upgrade, tunnel, done),
            None => resp.body_mut().on_done(done),
        }
        Ok(resp)
    }
}

struct Done {
    start: Instant,
    /// `None` when the access log is off. Boxed: `Done` is moved into its own box per
    /// request, a pointer's worth rather than the whole line's when the log is off.
    record: Option<Box<Record>>,
    /// The request body's bytes, counted as they go upstream; `None`: it had none.
    bytes_in: Option<Arc<AtomicU64>>,
    /// With the connection's context (for `Shared`): its count of references is the
    /// connection's, on its own thread.
    in_flight: InFlight,
}

impl OnDone for Done {
    fn done(self: Box<Self>, bytes: u64, complete: bool, cut: Option<Cut>) {
        let Done {
            start,
            record,
            bytes_in,
            in_flight,
        } = *self;
        let shared = &in_flight.ctx().shared;
        let cut = cut.or_else(|| {
            in_flight
                .activity()
                .send_timed_out()
                .then_some(Cut::ClientSendTimeout)
        });
        // A send timeout is counted by its connection; a read timeout only here.
        if cut == Some(Cut::UpstreamReadTimeout) {
            shared
                .metrics
                .timeouts
                .get_or_create(&crate::metrics::TimeoutLabel { timeout: "read" })
                .inc();
        }
        let Some(mut record) = record else { return };
        if let Some(c) = cut {
            record.cause = record.cause.or(Some(c.as_str()));
        }
        record.duration_ms = millis(start.elapsed());
        record.bytes_out = bytes;
        record.bytes_in = bytes_in.map_or(0, |b| b.load(Ordering::Relaxed));
        record.incomplete = !complete;
        shared.access_log.log(*record);
    }
}

/// Milliseconds with microsecond precision.
fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// What the access log keeps from the request head before the request moves on, in one
/// buffer with room for the route and group it adds at the end. The host is as received:
/// routing uses the validated and normalised forms.
fn logged_text<'r, B>(
    req: &'r Request<B>,
    received: Option<&'r RawFields>,
    method: &Method,
    path: &str,
    new_id: Option<&'r [u8]>,
) -> Text {
    let host = match received {
        Some(f) => req
            .uri()
            .authority()
            .map(|a| a.as_str())
            .or_else(|| f.host().and_then(|h| h.to_str().ok())),
        None => request_host(req),
    }
    .unwrap_or_default();
    // One pass over the fields (a request has few) rather than a lookup by name for each;
    // the first of repeated fields, as a lookup would give.
    let (mut request_id, mut user_agent, mut referer) = (new_id, None, None);
    let mut look = |name: &[u8], value: &'r [u8]| {
        let slot = match name {
            b"user-agent" => &mut user_agent,
            b"referer" => &mut referer,
            b"x-request-id" => &mut request_id,
            _ => return,
        };
        slot.get_or_insert(value);
    };
    match received {
        Some(f) => f.iter().for_each(|(n, v)| look(n, v)),
        None => req
            .headers()
            .iter()
            .for_each(|(n, v)| look(n.as_str().as_bytes(), v.as_bytes())),
    }
    let len = |v: Option<&[u8]>| v.map_or(0, <[u8]>::len);
    let mut text = Text::with_capacity(
        method.as_str().len()
            + host.len()
            + path.len()
            + len(request_id)
            + len(user_agent)
            + len(referer)
            + 48,
    );
    text.set(Field::Method, method.as_str());
    text.set(Field::Host, host);
    text.set(Field::Path, path);
    text.set_lossy(Field::RequestId, request_id.unwrap_or_default());
    if let Some(v) = user_agent {
        text.set_lossy(Field::UserAgent, v);
    }
    if let Some(v) = referer {
        text.set_lossy(Field::Referer, v);
    }
    text
}

/// The request target as logged: path and query, as received.
fn logged_path(uri: &Uri) -> &str {
    uri.path_and_query()
        .map_or_else(|| uri.path(), |p| p.as_str())
}

/// The per-route family, and the per-peer counters of the peer that answered.
fn count_by_route_and_peer(
    shared: &Shared,
    info: &AttemptInfo<'_>,
    status: http::StatusCode,
    origin: &str,
) {
    let class = class(status);
    if let Some(route) = info.route {
        shared.metrics.route_response(route, class);
    }
    if origin == "upstream" {
        if let Some(peer) = &info.peer {
            peer.stats().response(status);
        }
    }
}

fn proto_name(v: Version) -> &'static str {
    match v {
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2",
        _ => "HTTP/?",
    }
}

fn request_host<B>(req: &Request<B>) -> Option<&str> {
    req.uri().authority().map(|a| a.as_str()).or_else(|| {
        req.headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
    })
}

/// The request's authority, checked (rule H1-H3 of `normalize/rules.md`): the target's
/// authority (`:authority`, absolute-form) or else `Host`; both present must name one host.
/// Returns the value as sent (forwarded as `Host`) and its host part (routed on).
fn checked_authority<'r>(
    uri_authority: Option<&'r http::uri::Authority>,
    host_field: Option<&'r HeaderValue>,
) -> Result<Option<(&'r str, &'r str)>, Invalid> {
    let from_host = match host_field {
        None => None,
        Some(v) => {
            let v = v.to_str().map_err(|_| Invalid::Host)?;
            Some((v, normalize::check_authority(v)?))
        }
    };
    let Some(a) = uri_authority.map(|a| a.as_str()) else {
        return Ok(from_host.filter(|(v, _)| !v.is_empty()));
    };
    let host = normalize::check_authority(a)?;
    if let Some((_, h)) = from_host {
        if !h.eq_ignore_ascii_case(host) {
            return Err(Invalid::HostMismatch);
        }
    }
    Ok(Some((a, host)).filter(|(v, _)| !v.is_empty()))
}

/// Routes on the normalised path (rules P1-P5): a path with an encoded separator is refused
/// unless the route it reaches allows them. Returns the route and the path to forward.
/// A matched route and its name as written.
type Matched<'s> = (&'s RouteConfig, &'s RouteName);

fn route_request<'s, 'p>(
    state: &'s State,
    host: Option<&str>,
    raw: &'p str,
) -> Result<(Option<Matched<'s>>, Cow<'p, str>), Invalid> {
    match normalize::normalize_path(raw, false) {
        Ok(p) => Ok((state.routes.find_route(host, &p), p)),
        Err(Invalid::EncodedSeparator) => {
            let p = normalize::normalize_path(raw, true)?;
            match state.routes.find_route(host, &p) {
                Some((r, n)) if r.allow_encoded_separators => Ok((Some((r, n)), p)),
                _ => Err(Invalid::EncodedSeparator),
            }
        }
        Err(e) => Err(e),
    }
}

/// What the handler learns of a request's way upstream. `'s`: the state it was routed on.
#[derive(Default)]
struct AttemptInfo<'s> {
    /// The matched route, borrowed from the state the request was routed on: a clone would
    /// write the name's shared reference counts (three lines every serving thread writes)
    /// per request, and its drop again (docs/benchmarks.md, "Reference counts every thread
    /// writes").
    route: Option<&'s RouteName>,
    /// The peer of the last attempt.
    peer: Option<Arc<Peer>>,
    attempts: u32,
    /// The route answered itself (`redirect`, `respond`): the response is upkeep's.
    answered: bool,
    /// The request body's bytes as they go upstream (made only for a request with a body:
    /// most have none, and a counter is an allocation).
    bytes_in: Option<Arc<AtomicU64>>,
    /// The request's target as received, for the handler's warnings: moved here by
    /// `prepare` (which forwards a target of its own), not copied for every request.
    target: Option<Uri>,
}

impl AttemptInfo<'_> {
    /// The body's byte counter, made at the first ask.
    fn body_counter(&mut self) -> Arc<AtomicU64> {
        self.bytes_in.get_or_insert_with(Default::default).clone()
    }
}

/// The request to send upstream, rebuildable for retries while its body is not consumed.
struct Outgoing {
    method: Method,
    /// The target as it goes out (origin form).
    target: PathAndQuery,
    headers: HeaderMap,
    /// The fields as received, sent before `headers` (which then holds only what upkeep
    /// inserted): no map was made of them (`crate::h1::fields`).
    received: Option<RawFields>,
    /// Fields upkeep adds, sent after `headers` (`crate::headers::Added`).
    added: Added,
    /// `None` once a streamed body has gone to an attempt that kept it.
    body: Option<ReqBody>,
    bodyless: bool,
    /// The client takes trailers in the response.
    trailers: bool,
    /// An HTTP/1 upstream's response head may stay as received (`crate::h1::head::RawHead`).
    raw_head: bool,
}

impl Outgoing {
    /// Makes the fields kept as received part of the map, in front of what it holds, and
    /// what upkeep adds after it: for a client other than upkeep's own (hyper's, for HTTP/2
    /// upstreams), which takes a map. The added fields go in here, once, rather than into
    /// each attempt's copy of the map ([`Outgoing::build`]): a copy has room for its own
    /// fields only, and grew twice a request to take them.
    fn materialize(&mut self) -> Result<(), ProxyError> {
        let Some(f) = self.received.take() else {
            self.added.move_into(&mut self.headers);
            return Ok(());
        };
        let mut map = crate::headers::map_with_capacity(self.headers.len() + 8);
        f.fill(&mut map)
            .map_err(|e| ProxyError::new(Kind::BadRequest).with_source(e))?;
        // A map's iterator names a field once, before its first value.
        let mut name = None;
        for (n, value) in std::mem::take(&mut self.headers) {
            if n.is_some() {
                name = n;
            }
            if let Some(n) = &name {
                map.append(n.clone(), value);
            }
        }
        self.added.move_into(&mut map);
        self.headers = map;
        Ok(())
    }

    /// The request for hyper's client; [`Outgoing::materialize`] first.
    fn build(&mut self) -> Option<Request<ReqBody>> {
        debug_assert!(self.received.is_none(), "fields left out of the map");
        let body = if self.bodyless {
            ReqBody::Empty
        } else if let Some(ReqBody::Replay(r)) = &self.body {
            ReqBody::Replay(r.rewind()?)
        } else {
            self.body.take()?
        };
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = Uri::from(self.target.clone());
        *req.version_mut() = Version::HTTP_11;
        *req.headers_mut() = self.headers.clone();
        crate::headers::mark_never_indexed(req.headers_mut());
        Some(req)
    }

    fn restore(&mut self, req: Request<ReqBody>) {
        if !self.bodyless {
            self.body = Some(req.into_body());
        }
    }

    /// The method is idempotent (RFC 9110 §9.2.2): sending it again after part of it went
    /// out is safe.
    fn idempotent(&self) -> bool {
        matches!(
            self.method,
            Method::GET
                | Method::HEAD
                | Method::OPTIONS
                | Method::TRACE
                | Method::PUT
                | Method::DELETE
        )
    }

    fn replayable(&self) -> bool {
        match &self.body {
            Some(ReqBody::Replay(r)) => !r.overflowed(),
            Some(_) => true,
            None => self.bodyless,
        }
    }

    /// Keeps the body as it goes out (up to `pool.http2_replay_buffer_bytes`), so that an HTTP/2 peer's refusal
    /// can be answered by sending it again.
    fn keep_for_replay(&mut self, limit: usize) {
        if matches!(self.body, Some(ReqBody::Stream(_))) {
            let body = self.body.take().expect("matched above");
            self.body = Some(ReqBody::Replay(crate::body::Replay::new(body, limit)));
        }
    }
}

/// `forward` under the panic boundary. A plain function, so that the handler's future holds
/// the request's future once (passed to `CatchPanic::new` from an `async fn`, it would be
/// held twice: the argument and the awaited value).
fn caught_forward<'a, 's>(
    req: Box<DownRequest>,
    found: Found,
    ctx: &'a ConnCtx,
    state: &'s State,
    info: &'a mut AttemptInfo<'s>,
) -> CatchPanic<impl std::future::Future<Output = Result<Resp, ProxyError>> + use<'a, 's>> {
    CatchPanic::new(forward(req, found, ctx, state, info))
}

/// What the handler found out about a request before forwarding it.
struct Found {
    /// Which of the fields the request path reads it carries.
    present: Present,
    /// A gRPC call.
    grpc: bool,
    /// The response goes to upkeep's own HTTP/1 server (see [`handle_with`]).
    own_writer: bool,
    /// The `x-request-id` made for a request that came without one; it goes upstream with
    /// the fields upkeep adds (`Added`).
    new_id: Option<request_id::Id>,
    /// When the handler took the request: the retries' start when nothing was awaited
    /// since (no clock read of their own).
    start: Instant,
}

/// `forward`'s work before its first wait, in a plain function: its locals (the request's
/// parts, the authority, the path, what the route's rules expand) live in this function's
/// frame, not in the request's future, which the downstream connection allocates per request
/// and which would otherwise carry them through the whole exchange. The request made ready
/// goes into `slot`, a place in `forward`'s future: returned instead, it was moved twice more
/// on its way there.
fn prepare<'s, 'r>(
    down: DownRequest,
    found: Found,
    ctx: &ConnCtx,
    state: &'s State,
    info: &mut AttemptInfo<'s>,
    slot: &'r mut Option<Ready<'s>>,
) -> Result<Step<'r, 's>, ProxyError> {
    let Found {
        present,
        grpc,
        own_writer,
        new_id,
        start: _,
    } = found;
    let DownRequest {
        mut req,
        fields: mut received,
    } = down;
    // The target moves to `info` (the handler logs it), and is read from there.
    let target = &*info.target.insert(std::mem::take(req.uri_mut()));
    if req.method() == Method::CONNECT && req.extensions().get::<hyper::ext::Protocol>().is_none() {
        return Err(ProxyError::new(Kind::BadRequest).with_source("CONNECT is not supported"));
    }
    let invalid = |e: Invalid| ProxyError::new(Kind::Invalid(e.as_str()));
    // The `Host` field as received: routed on, forwarded, and the default `X-Forwarded-Host`.
    let host_field = match &received {
        Some(f) => f.host().cloned(),
        None if present.has(Present::HOST) => req.headers().get(header::HOST).cloned(),
        None => None,
    };
    // The target is out of the request: what is borrowed from it outlives the changes to the
    // request below.
    let authority = checked_authority(target.authority(), host_field.as_ref()).map_err(invalid)?;
    let (host_value, host) = authority.unzip();
    let (route, path) = route_request(state, host, target.path()).map_err(invalid)?;
    let (route, route_name) = route.ok_or_else(|| ProxyError::new(Kind::NoRoute))?;
    info.route = Some(route_name);
    // Route rules may change the forwarded path (`strip_prefix`, `rewrite`).
    let path = match rules::forwarded_path(route, &path) {
        Some(p) => Cow::Owned(p),
        None => path,
    };
    // What is forwarded is what was routed: the normalised path, the query as sent.
    let forwarded = match (&path, target.path_and_query()) {
        (Cow::Borrowed(_), Some(pq)) => pq.clone(),
        (Cow::Borrowed(_), None) => PathAndQuery::from_static("/"),
        (Cow::Owned(p), pq) => {
            let target = match pq.and_then(|pq| pq.query()) {
                Some(q) => format!("{p}?{q}"),
                None => p.clone(),
            };
            PathAndQuery::try_from(target).map_err(|_| invalid(Invalid::Path))?
        }
    };
    let route_rules = &route.rules;
    // Looked at three times below; each look is three collections'.
    let request_rules = !route_rules.request_headers.is_empty();
    if received.is_some() && (route_rules.uses_request_values() || request_rules) {
        // The route's rules read and write the request's fields in its map.
        if let Some(f) = received.take() {
            f.fill(req.headers_mut())
                .map_err(|e| ProxyError::new(Kind::BadRequest).with_source(e))?;
        }
    }
    // The values templates expand to; made only for a route whose rules use them, so a
    // plain route allocates nothing here.
    let values = route_rules.uses_request_values().then(|| {
        let id = req
            .headers()
            .get(&request_id::X_REQUEST_ID)
            .map(HeaderValue::as_bytes)
            .or(new_id.as_ref().map(request_id::Id::as_bytes))
            .and_then(|v| std::str::from_utf8(v).ok())
            .unwrap_or_default()
            .to_owned();
        let h = host.map_or_else(|| ctx.local.ip().to_string(), str::to_ascii_lowercase);
        Box::new(Values {
            request_id: id,
            host: h,
        })
    });
    if route_rules.answers_itself() {
        if let Some(resp) = rules::answer(route_rules, &Values::of(&values).vars(ctx, &forwarded)) {
            info.answered = true;
            return Ok(Step::Answered(resp));
        }
    }
    // Borrowed from the state, like the route: a clone would write the group's shared
    // reference count per request.
    let group = route
        .group
        .as_ref()
        .and_then(|g| state.groups.get(g))
        .ok_or_else(|| ProxyError::new(Kind::NoRoute))?;
    if let Some(max) = route_rules.max_body_bytes {
        // A declared length over the limit is refused before any byte of the body is read.
        if body_declared_over(req.body(), max) {
            return Err(ProxyError::new(Kind::BodyTooLarge));
        }
    }

    let (mut parts, body) = req.into_parts();
    let upgrade = if present.has(Present::CONNECTION) || parts.version == Version::HTTP_2 {
        crate::upgrade::Wanted::take(
            parts.version,
            &parts.method,
            &parts.headers,
            &mut parts.extensions,
            body.is_end_stream(),
        )
        .map(Box::new)
    } else {
        None
    };
    let mut headers = parts.headers;
    let trailers = if present.has(Present::TE) || present.has(Present::TRAILER) {
        crate::trailers::Wanted::of(&headers, parts.version)
    } else {
        crate::trailers::Wanted::none(parts.version)
    };
    if present.has(Present::HOP_BY_HOP) {
        strip_hop_by_hop_keeping(&mut headers, |n| route_rules.request_headers.writes(n));
    }
    let mut added = Added::default();
    if trailers.te(grpc && group.config().protocol != crate::config::UpstreamProtocol::Http1) {
        if present.has(Present::TE) {
            // A `TE` a route's rules kept is replaced, as an insert does.
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        } else {
            // Beside the map: an insert hashes, probes and may grow a map decoded from
            // HTTP/2, whose every request takes trailers.
            added.set_te();
        }
    }
    trailers.restore_declared(&mut headers);
    // Rule H4: an HTTP/1.1 request upstream always names a host; without a `Host` field, the
    // target's authority (HTTP/2's `:authority`, an absolute-form target) is made one.
    let made_host = match host_field {
        None => host_value.and_then(crate::headers::authority_value),
        Some(_) => None,
    };
    if present.has(Present::COOKIES) {
        message::join_cookie_crumbs(&mut headers);
    }
    if let Some(id) = new_id {
        // First, where the map's insert put it: before the forwarding fields.
        added.set_id(id);
    }
    let trusted = ctx
        .listener
        .trusted_proxies
        .iter()
        .any(|c| c.contains(ctx.remote.ip()));
    add_forwarded(
        &mut headers,
        ctx.listener.forwarded,
        present.has(Present::FORWARDING),
        trusted,
        ctx.remote,
        &ctx.client_ip,
        if ctx.tls { "https" } else { "http" },
        host_value,
        host_field.as_ref().or(made_host.as_ref()),
        &mut added,
    );
    if host_field.is_none() {
        match made_host {
            // Beside the map, as the `x-forwarded-host` with the same value.
            Some(v) if added.set_host_as_forwarded(&v) => {}
            made => {
                headers.insert(
                    header::HOST,
                    made.unwrap_or_else(|| message::default_host(ctx.local)),
                );
            }
        }
    }
    if upgrade.is_some() || request_rules {
        // The upgrade path sends the map as it is, and a route's rules may change or remove
        // what upkeep added.
        added.move_into(&mut headers);
    }
    // After upkeep's own headers, so a route can override them (nginx `proxy_set_header`).
    if request_rules {
        rules::apply_headers(
            &route_rules.request_headers,
            &mut headers,
            &Values::of(&values).vars(ctx, &forwarded),
        );
    }
    let expects_continue =
        present.has(Present::EXPECT) && crate::expect::expects_continue(parts.version, &headers);
    Ok(Step::Forward(
        slot.insert(Ready {
            out: Outgoing {
                method: parts.method,
                target: forwarded,
                headers,
                added,
                received,
                body: None,
                bodyless: true,
                trailers: trailers.accepts,
                // Nothing between here and the own server's writer reads or changes the
                // upstream's fields but a route's response header rules (and gRPC's
                // trailers).
                raw_head: own_writer && !grpc && route_rules.response_headers.is_empty(),
            },
            group,
            rules: route_rules,
            upgrade,
            expects_continue,
            grpc,
            values,
        }),
        body,
    ))
}

/// What [`prepare`] leads to.
enum Step<'r, 's> {
    /// The route answered itself (`redirect`, `respond`).
    Answered(Response<RespBody>),
    /// The request goes upstream, with its body as received (nothing of it read yet).
    Forward(&'r mut Ready<'s>, DownBody),
}

/// A request made ready to go upstream.
struct Ready<'s> {
    /// The request as it goes out; its body is set once the first frame is read
    /// (`forward`).
    out: Outgoing,
    group: &'s Arc<Group>,
    rules: &'s crate::config::RouteRules,
    /// An upgrade (WebSocket, extended CONNECT) to carry instead; boxed, like `values`, to
    /// keep what most requests carry small (it is written into memory gone cold, "Memory
    /// touched per request" in docs/performance-history.md).
    upgrade: Option<Box<crate::upgrade::Wanted>>,
    /// The body waits for the upstream's `100 Continue`.
    expects_continue: bool,
    grpc: bool,
    /// Made only for a route whose rules use them.
    values: Option<Box<Values>>,
}

/// The request's values a route's templates expand to, besides the connection's and the
/// forwarded path (empty for a route whose rules use none).
#[derive(Default)]
struct Values {
    request_id: String,
    host: String,
}

/// The values of a route whose rules use none.
static NO_VALUES: Values = Values {
    request_id: String::new(),
    host: String::new(),
};

impl Values {
    /// `values`, or empty ones.
    fn of(values: &Option<Box<Values>>) -> &Values {
        values.as_deref().unwrap_or(&NO_VALUES)
    }

    /// The template values, with `target` the forwarded one.
    fn vars<'a>(&'a self, ctx: &'a ConnCtx, target: &'a PathAndQuery) -> rules::Vars<'a> {
        rules::Vars {
            client_ip: ctx.client_ip.to_str().unwrap_or_default(),
            host: &self.host,
            scheme: if ctx.tls { "https" } else { "http" },
            request_id: &self.request_id,
            path: target.as_str(),
        }
    }
}

#[allow(clippy::manual_async_fn)] // an `async fn` keeps its arguments twice (`proxy::handle_with`)
fn forward<'a, 's>(
    req: Box<DownRequest>,
    found: Found,
    ctx: &'a ConnCtx,
    state: &'s State,
    info: &'a mut AttemptInfo<'s>,
) -> impl std::future::Future<Output = Result<Resp, ProxyError>> + Send + use<'a, 's> {
    async move {
        let mut slot = None;
        // The retries' start, unless the client's body is awaited first.
        let mut clock = Some(found.start);
        let (ready, body) = match prepare(unbox(req), found, ctx, state, info, &mut slot)? {
            Step::Answered(resp) => return Ok(Box::new(resp)),
            Step::Forward(ready, body) => (ready, body),
        };
        if let Some(want) = ready.upgrade.take() {
            let out = &mut ready.out;
            out.materialize()?;
            let f = crate::upgrade::Forward {
                group: ready.group,
                method: out.method.clone(),
                uri: Uri::from(std::mem::replace(
                    &mut out.target,
                    PathAndQuery::from_static("/"),
                )),
                headers: std::mem::take(&mut out.headers),
                metrics: ctx.shared.metrics.clone(),
                bytes_in: info.body_counter(),
                shutdown_timeout: state.config.lifecycle.shutdown_timeout,
            };
            return boxed(crate::upgrade::forward(unbox(want), f, &mut |p| {
                info.attempts += 1;
                info.peer = Some(p.clone());
            }))
            .await
            .map(Box::new);
        }
        let route_rules = ready.rules;

        // Read the first body frame before choosing a peer, so a malformed body start is refused
        // with 400 before any upstream sees the request.
        let body = if body.is_end_stream() {
            None
        } else if ready.expects_continue {
            // The upstream decides whether the client uploads: nothing is read before it asks.
            Some(
                ReqBody::gated(body, info.body_counter(), ctx.listener.client_body_timeout)
                    .with_limit(route_rules.max_body_bytes),
            )
        } else {
            let mut body = body;
            let timeout = ctx.listener.client_body_timeout;
            // Time waiting for the client is not the deadline's.
            clock = None;
            match tokio::time::timeout(timeout, body.frame()).await {
                Err(_) => {
                    count_client_body_timeout(&ctx.shared.metrics);
                    return Err(ProxyError::new(Kind::ClientTimeout)
                        .with_source(crate::body::ClientBodyTimeout(timeout)));
                }
                Ok(Some(Err(e))) => return Err(ProxyError::new(Kind::BadRequest).with_source(e)),
                Ok(None) => None,
                Ok(Some(Ok(first))) => {
                    let limit = route_rules.max_body_bytes;
                    let len = first.data_ref().map_or(0, |d| d.len() as u64);
                    if limit.is_some_and(|max| len > max) {
                        return Err(ProxyError::new(Kind::BodyTooLarge));
                    }
                    Some(
                        ReqBody::stream(first, body, info.body_counter(), timeout)
                            .with_limit(limit),
                    )
                }
            }
        };
        ready.out.bodyless = body.is_none();
        ready.out.body = body;
        let grpc = ready.grpc;
        let out = &mut ready.out;
        let idempotent = out.idempotent();
        let timeouts = RouteTimeouts {
            try_timeout: route_rules.try_timeout,
            deadline: route_rules.deadline,
        };
        // A gRPC call's own deadline bounds upkeep's too.
        let cap = grpc.then(|| crate::grpc::timeout(&out.headers)).flatten();
        // For gRPC, `grpc-timeout` and a route's `deadline` bound the call as a whole, its
        // streamed body included (a group's default `deadline` would cut long-lived streams).
        let call_limit = grpc
            .then(|| crate::grpc::call_limit(&out.headers, route_rules.deadline))
            .flatten();
        let call_start = call_limit.map(|_| Instant::now());
        let started = clock.unwrap_or_else(Instant::now);
        let resp =
            send_with_retries(ready.group, out, idempotent, cap, info, timeouts, started).await;
        // The request's fields went out with it: the map's memory serves the next message. A map
        // that never held any (fields kept as received) stays: taking it would make a new empty
        // one to drop as well.
        if ready.out.headers.capacity() > 0 {
            crate::headers::recycle_map(std::mem::take(&mut ready.out.headers));
        }
        let mut resp = resp?;
        if let Some(limit) = call_limit {
            let start = call_start.unwrap_or_else(Instant::now);
            resp = Box::new(resp.map(|b| b.with_call_deadline(start + limit)));
        }
        if !route_rules.response_headers.is_empty() {
            rules::apply_headers(
                &route_rules.response_headers,
                resp.headers_mut(),
                &Values::of(&ready.values).vars(ctx, &ready.out.target),
            );
        }
        Ok(resp)
    }
}

/// A route's own `try_timeout` / `deadline`, over the group's.
#[derive(Clone, Copy)]
struct RouteTimeouts {
    try_timeout: Option<Duration>,
    deadline: Option<Duration>,
}

/// Whether a request body's declared length (`Content-Length`) is over `max`.
fn body_declared_over(body: &DownBody, max: u64) -> bool {
    body.size_hint().lower() > max
}

#[allow(clippy::manual_async_fn)] // an `async fn` keeps its arguments twice (`proxy::handle_with`)
fn send_with_retries<'a, 's>(
    group: &'a Arc<Group>,
    out: &'a mut Outgoing,
    idempotent: bool,
    cap: Option<Duration>,
    info: &'a mut AttemptInfo<'s>,
    timeouts: RouteTimeouts,
    started: Instant,
) -> impl std::future::Future<Output = Result<Resp, ProxyError>> + Send + use<'a, 's> {
    async move {
        let cfg = group.config();
        let deadline = started
            + cap.map_or(timeouts.deadline.unwrap_or(cfg.deadline), |c| {
                c.min(timeouts.deadline.unwrap_or(cfg.deadline))
            });
        let try_timeout = timeouts.try_timeout.unwrap_or(cfg.try_timeout);
        let window_end = started + cfg.retry.connect_retry_window;
        let metrics = group.metrics();
        if group.known_down_at(started) {
            return Err(ProxyError::new(Kind::NoPeers(NoPeersReason::AllDown)));
        }
        let mut budget = group.start_request();
        let mut tried: Vec<SocketAddr> = Vec::new();
        let mut last: Option<ProxyError> = None;
        let mut retry_reason: Option<&'static str> = None;
        let mut first = true;
        loop {
            // The first pick is made now: no second clock read.
            let now = if std::mem::take(&mut first) {
                started
            } else {
                Instant::now()
            };
            let peer = match group.pick_at(&tried, now) {
                Ok(p) => p,
                Err(reason) => {
                    // Every peer refused a connection (or reset a fresh one before answering, as a
                    // peer going down does to connections left in its accept queue; only a
                    // request safe to send again gets here after one): inside the connect retry
                    // window, wait and go round again, so a short blip costs latency, not errors.
                    // One request at a time probes every 50-100 ms; the others wait for its
                    // success.
                    let only_connects = last.as_ref().is_some_and(ProxyError::is_peer_unreachable);
                    if only_connects
                        && Instant::now() + Duration::from_millis(100) < window_end.min(deadline)
                    {
                        // Not charged to the retry budget: these tries are paced by the probe,
                        // and a refused connect costs the upstream nothing.
                        retry_reason = None;
                        metrics
                            .retries
                            .get_or_create(&ReasonLabel {
                                reason: "connect_window",
                            })
                            .inc();
                        // Boxed, as every rare wait here: held inline, its state would be part of
                        // every request's (see `boxed`).
                        boxed(group.connect_window_wait(window_end.min(deadline))).await;
                        tried.clear();
                        continue;
                    }
                    return Err(last.unwrap_or_else(|| ProxyError::new(Kind::NoPeers(reason))));
                }
            };
            let _permit = match retry_reason.take() {
                None => None,
                Some(reason) => match budget.try_retry() {
                    Some(p) => {
                        metrics.retries.get_or_create(&ReasonLabel { reason }).inc();
                        Some(p)
                    }
                    None => {
                        let err = ProxyError::new(Kind::RetryBudget);
                        return Err(match last {
                            Some(l) => err.with_source(l),
                            None => err,
                        });
                    }
                },
            };
            info.attempts += 1;
            // Moved into `info` and borrowed from there: a clone would write the peer's shared
            // reference count per request, and its drop again.
            let peer = &*info.peer.insert(peer);
            let sent_at = now;
            match attempt(group, peer, out, deadline, try_timeout, now).await {
                Ok(resp) => {
                    group.record_success(peer, sent_at);
                    group.connect_window_recovered();
                    return Ok(resp);
                }
                Err(err) => {
                    tracing::debug!(peer.addr = %peer.addr(), error = %err, attempt = info.attempts, "attempt failed");
                    let weight = match err.kind() {
                        // A peer that does not even complete a handshake in time is taken out at once,
                        // so later requests do not pay the same timeout.
                        Kind::ConnectTimeout => cfg.health.consecutive_failures,
                        _ => 1,
                    };
                    if matches!(
                        err.kind(),
                        Kind::BadRequest | Kind::ClientTimeout | Kind::BodyTooLarge
                    ) {
                        return Err(err);
                    }
                    if err.is_connect() {
                        group.record_connect_failure(peer.addr());
                    } else {
                        // It connected (or reused a connection): whatever failed, it is not down.
                        group.record_connected(peer.addr());
                    }
                    if !err.is_peer_blameless() {
                        group.record_failure(peer, weight);
                    }
                    tried.push(peer.addr());
                    // Idempotent requests are also retried after a reset before the response head
                    // and after a per-try timeout (a stalled peer), as nginx's
                    // `proxy_next_upstream error timeout` does.
                    let safe = err.is_connect()
                        || !err.is_written()
                        || (idempotent && matches!(err.kind(), Kind::Reset | Kind::Timeout));
                    let attempts_left = info.attempts < cfg.retry.attempts || err.is_connect();
                    if !safe || !out.replayable() || !attempts_left || Instant::now() >= deadline {
                        return Err(err);
                    }
                    retry_reason = Some(match err.kind() {
                        Kind::PeerFull => "peer_full",
                        Kind::Connect | Kind::ConnectTimeout | Kind::Tls => "connect_failed",
                        Kind::Timeout => "upstream_timeout",
                        _ => "upstream_reset",
                    });
                    last = Some(err);
                }
            }
        }
    }
}

/// One attempt on one peer. A reused connection that turns out closed before any response
/// byte arrived is a pool event: the request is replayed on a fresh connection when safe.
/// `now`: the clock as the peer was picked, for the pool's look at idle deadlines and the
/// per-try timer of a request that goes out on a pooled connection at once (a new connection,
/// or a second try, reads the clock again).
#[allow(clippy::manual_async_fn)] // an `async fn` keeps its arguments twice (`proxy::handle_with`)
fn attempt<'a>(
    group: &'a Arc<Group>,
    peer: &'a Arc<Peer>,
    out: &'a mut Outgoing,
    deadline: Instant,
    try_timeout: Duration,
    now: Instant,
) -> impl std::future::Future<Output = Result<Resp, ProxyError>> + Send + 'a {
    async move {
        let cfg = group.config();
        let pool = group.pool();
        let mut fresh_only = false;
        let mut clock = Some(now);
        // HTTP/2 streams the peer refused unprocessed are sent again; a peer that refuses every
        // stream gets a bounded number of tries.
        let mut h2_replays = 0;
        loop {
            // upkeep's own HTTP/1 codec sends every request but those whose body waits for the
            // upstream's `100 Continue` (hyper's client relays it; see `crate::expect`).
            let own = !matches!(out.body, Some(ReqBody::Gated(..)));
            // A gated body to a group that may speak HTTP/2 goes on a connection of its own, on
            // which the peer's `100` can be seen (`pool::h2_continue`).
            let continue_gate = if pool.may_speak_http2() {
                out.body.as_ref().and_then(ReqBody::gate)
            } else {
                None
            };
            let mut conn = match if fresh_only || continue_gate.is_some() {
                None
            } else {
                pool.checkout_at(peer.addr(), clock.unwrap_or_else(Instant::now))
            } {
                Some(c) => c,
                None => {
                    let timeout = cfg
                        .connect_timeout
                        .min(deadline.saturating_duration_since(Instant::now()));
                    // The request goes out after the handshake: its try timer starts then.
                    clock = None;
                    match connect(pool, peer.addr(), timeout, own, continue_gate).await {
                        Ok(c) => c,
                        Err(ConnectError::Full(_)) => {
                            return Err(ProxyError::new(Kind::PeerFull).on_peer(
                                peer.addr(),
                                false,
                                false,
                            ))
                        }
                        Err(ConnectError::Timeout(_)) => {
                            return Err(ProxyError::new(Kind::ConnectTimeout).on_peer(
                                peer.addr(),
                                false,
                                false,
                            ))
                        }
                        Err(e) => {
                            let kind = match e {
                                ConnectError::Tls(_) => Kind::Tls,
                                _ => Kind::Connect,
                            };
                            return Err(ProxyError::new(kind).with_source(e).on_peer(
                                peer.addr(),
                                false,
                                false,
                            ));
                        }
                    }
                }
            };
            if own && conn.wire_mut().is_some() {
                let sent_at = clock.take().unwrap_or_else(Instant::now);
                match send_own(group, peer, out, conn, deadline, try_timeout, sent_at).await {
                    Ok(resp) => return Ok(resp),
                    Err(Some(e)) => return Err(e),
                    Err(None) => {
                        fresh_only = true;
                        continue;
                    }
                }
            }
            if conn.is_h2() {
                out.keep_for_replay(cfg.pool.http2_replay_buffer_bytes);
            }
            out.materialize()?;
            let Some(mut req) = out.build() else {
                return Err(ProxyError::new(Kind::Reset).on_peer(peer.addr(), false, true));
            };
            let gate = crate::expect::prepare(&mut req);
            let reused = conn.is_reused();
            let (w0, r0) = (conn.written(), conn.read());
            let progress = req.body().progress();
            let in_flight = peer.start_request();
            let res = boxed(send_timed(&mut conn, req, progress, try_timeout, deadline)).await;
            drop(in_flight);
            match res {
                Err(_) => {
                    // An HTTP/2 stream's bytes are not told apart from its neighbours': assume sent.
                    let written = conn.is_h2() || conn.written() > w0;
                    return Err(ProxyError::new(Kind::Timeout).on_peer(
                        peer.addr(),
                        reused,
                        written,
                    ));
                }
                Ok(Ok(resp)) => {
                    let resp = crate::expect::on_response(gate.as_ref(), resp);
                    return Ok(Box::new(upstream_response(resp, group, conn, out.trailers)));
                }
                Ok(Err(mut e)) => {
                    let handed_back = match e.take_message() {
                        Some(req) => {
                            out.restore(req);
                            true
                        }
                        None => false,
                    };
                    if conn.is_h2() {
                        let unprocessed = handed_back || crate::pool::h2::unprocessed(e.error());
                        if unprocessed {
                            conn.retire();
                        }
                        if unprocessed && out.replayable() && h2_replays < 3 {
                            h2_replays += 1;
                            group.metrics().pool_event("h2_refused_replay");
                            tracing::debug!(peer.addr = %peer.addr(), error = %e.error(), "HTTP/2 stream refused unprocessed (GOAWAY or REFUSED_STREAM); sending it on a fresh connection");
                            fresh_only = true;
                            continue;
                        }
                        let e = e.into_error();
                        if e.is_user() {
                            return Err(client_fault(group, e, peer.addr(), reused, !unprocessed));
                        }
                        return Err(ProxyError::new(Kind::Reset).with_source(e).on_peer(
                            peer.addr(),
                            reused,
                            !unprocessed,
                        ));
                    }
                    let written = conn.written() > w0;
                    let got_response_bytes = conn.read() > r0;
                    if reused
                        && !got_response_bytes
                        && (!written || out.idempotent())
                        && out.replayable()
                    {
                        group.metrics().pool_stale_replays.inc();
                        tracing::debug!(peer.addr = %peer.addr(), error = %e.error(), "reused connection was closed; replaying on a fresh one");
                        fresh_only = true;
                        continue;
                    }
                    let e = e.into_error();
                    if e.is_user() {
                        return Err(client_fault(group, e, peer.addr(), reused, written));
                    }
                    return Err(ProxyError::new(Kind::Reset)
                        .with_source(e)
                        .on_peer(peer.addr(), reused, written)
                        .unanswered(!got_response_bytes));
                }
            }
        }
    }
}

/// A rare wait (a new connection, the connect retry window, an upgrade, hyper's client) on
/// the heap. Its state would otherwise be part of every request's future, which the
/// downstream connection boxes per request (`h1::server`): a larger one costs a larger
/// allocation and copy on each. A plain function, so the future is made in its frame and
/// moved once.
fn boxed<'a, F: std::future::Future + Send + 'a>(f: F) -> BoxFuture<'a, F::Output> {
    Box::pin(f)
}

/// A future on the heap.
type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What a send under the per-try timer gives.
type Timed<T> = Result<T, tokio::time::error::Elapsed>;

/// Opens a connection to `addr` for an attempt: for upkeep's own codec (`own`), for an upload
/// waiting on the peer's `100 Continue` (`continue_gate`), or for hyper's client.
fn connect<'a>(
    pool: &'a crate::pool::Pool,
    addr: SocketAddr,
    timeout: Duration,
    own: bool,
    continue_gate: Option<Arc<crate::expect::Gate>>,
) -> BoxFuture<'a, Result<crate::pool::Conn, ConnectError>> {
    if own {
        boxed(pool.connect_own(addr, timeout))
    } else if let Some(gate) = continue_gate {
        boxed(pool.connect_for_continue(addr, timeout, crate::expect::on_upstream_continue(gate)))
    } else {
        boxed(pool.connect(addr, timeout))
    }
}

/// Sends `req` on `conn` under the per-try timer. `try_timeout` counts from the moment the
/// upstream side holds the request body (its last frame handed over), so a long upload at a
/// steady rate never times out; time spent waiting for the client's body (bounded by
/// `client_body_timeout`) is not counted against the deadline either.
async fn send_timed(
    conn: &mut crate::pool::Conn,
    req: Request<ReqBody>,
    progress: Option<Arc<crate::body::SendProgress>>,
    try_timeout: Duration,
    deadline: Instant,
) -> Result<crate::pool::SendResult, tokio::time::error::Elapsed> {
    timed(conn.send(req), progress, try_timeout, deadline).await
}

/// Runs `send` under the per-try timer (see `send_timed`). A plain function: a request
/// without a body (most) gets one timer around `send`, made in place, and a future no larger
/// than `send`'s; one with a body gets the loop below, on the heap.
fn timed<'a, F: std::future::Future + Send + 'a>(
    send: F,
    progress: Option<Arc<crate::body::SendProgress>>,
    try_timeout: Duration,
    deadline: Instant,
) -> futures_util::future::Either<tokio::time::Timeout<F>, BoxFuture<'a, Timed<F::Output>>> {
    use futures_util::future::Either;
    match progress {
        None => {
            let due = (Instant::now() + try_timeout).min(deadline);
            Either::Left(tokio::time::timeout_at(due, send))
        }
        Some(progress) => Either::Right(boxed(timed_with_progress(
            send,
            progress,
            try_timeout,
            deadline,
        ))),
    }
}

/// `timed` for a request whose body is still going out.
async fn timed_with_progress<F: std::future::Future>(
    send: F,
    progress: Arc<crate::body::SendProgress>,
    try_timeout: Duration,
    deadline: Instant,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    progress.restart();
    tokio::pin!(send);
    loop {
        // While the client is awaited no try timer runs; look again after a while.
        let due = progress
            .try_due(try_timeout)
            .unwrap_or_else(|| Instant::now() + try_timeout)
            .min(deadline + progress.client_waited());
        match tokio::time::timeout_at(due, &mut send).await {
            Ok(r) => return Ok(r),
            Err(elapsed) => {
                let now = Instant::now();
                let expired = now >= deadline + progress.client_waited()
                    || progress.try_due(try_timeout).is_some_and(|d| now >= d);
                if expired {
                    return Err(elapsed);
                }
            }
        }
    }
}

/// A send that failed on the client's side of the body: never the peer's fault.
fn client_fault(
    group: &Group,
    e: hyper::Error,
    peer: SocketAddr,
    reused: bool,
    written: bool,
) -> ProxyError {
    client_fault_boxed(group, Box::new(e), peer, reused, written)
}

fn count_client_body_timeout(metrics: &crate::metrics::Metrics) {
    metrics
        .timeouts
        .get_or_create(&crate::metrics::TimeoutLabel {
            timeout: "client_body",
        })
        .inc();
}

/// Whether `e` or an error it wraps is a `T`: the client-body errors `ReqBody` makes keep
/// their type under hyper's client error and under each `DownBody` variant's.
fn caused_by<T: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if c.is::<T>() {
            return true;
        }
        cur = c.source();
    }
    false
}

fn upstream_response(
    resp: Response<Incoming>,
    group: &Arc<Group>,
    conn: crate::pool::Conn,
    trailers: bool,
) -> Response<RespBody> {
    let (mut parts, body) = resp.into_parts();
    let idle = rewrite_response_head(&mut parts, group, trailers, conn.is_h2());
    let checkin = Checkin::new(group.pool().clone(), conn, idle);
    Response::from_parts(
        parts,
        RespBody::upstream(body, checkin, group.config().read_timeout),
    )
}

/// The upstream's response head made ready for downstream (hop-by-hop fields gone, length
/// under a transfer coding dropped, trailers announced as agreed); returns how long the
/// connection may then stay idle in the pool (zero: not reused). `h2`: the upstream spoke HTTP/2
/// (its gRPC trailers are declared for HTTP/1.1 clients).
fn rewrite_response_head(
    parts: &mut http::response::Parts,
    group: &Arc<Group>,
    trailers: bool,
    h2: bool,
) -> Duration {
    let present = Present::of(&parts.headers);
    let close = present.has(Present::CONNECTION)
        && parts.headers.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
        })
        || parts.version == Version::HTTP_10;
    let idle = if close {
        Duration::ZERO
    } else {
        let hint = if present.has(Present::KEEP_ALIVE) {
            keepalive_hint(&parts.headers)
        } else {
            None
        };
        group.pool().idle_timeout_for(hint)
    };
    if present.has(Present::TRANSFER_ENCODING) {
        message::drop_length_under_transfer_coding(&mut parts.headers);
    }
    let mut declared = if present.has(Present::TRAILER) {
        crate::trailers::declared(&parts.headers)
    } else {
        Vec::new()
    };
    if h2 && present.has(Present::CONTENT_TYPE) {
        crate::trailers::declare_grpc(&parts.headers, &mut declared);
    }
    if present.has(Present::HOP_BY_HOP) {
        strip_hop_by_hop(&mut parts.headers);
    }
    crate::trailers::restore_response(&mut parts.headers, declared, trailers);
    parts.version = message::DOWNSTREAM_VERSION;
    idle
}

/// One attempt on an HTTP/1.1 connection driven by upkeep's own codec (`crate::h1`): the
/// request task owns the connection until the response body ends. `Err(None)`: the reused
/// connection turned out closed before any response byte, and the request is to be sent
/// again on a fresh connection (the same rule as on hyper's path).
#[allow(clippy::manual_async_fn)] // an `async fn` keeps its arguments twice (`proxy::handle_with`)
fn send_own<'a>(
    group: &'a Arc<Group>,
    peer: &'a Arc<Peer>,
    out: &'a mut Outgoing,
    mut conn: crate::pool::Conn,
    deadline: Instant,
    try_timeout: Duration,
    now: Instant,
) -> impl std::future::Future<Output = Result<Resp, Option<ProxyError>>> + Send + 'a {
    async move {
        use crate::h1::client::SendError;
        let addr = peer.addr();
        let reused = conn.is_reused();
        let (w0, r0) = (conn.written(), conn.read());
        let mut body = if out.bodyless {
            None
        } else {
            match out.body.take() {
                Some(b) => Some(b),
                None => {
                    return Err(Some(
                        ProxyError::new(Kind::Reset).on_peer(addr, false, true),
                    ))
                }
            }
        };
        let progress = body.as_ref().and_then(ReqBody::progress);
        let Some(wire) = conn.wire_mut() else {
            out.body = body;
            return Err(None);
        };
        let in_flight = peer.start_request();
        let mut sent_any = false;
        // No body going out (most requests): the connection's own timer (`Wire::take_timer`).
        let timer = match progress {
            None => {
                let due = (now + try_timeout).min(deadline);
                futures_util::future::Either::Left((wire.take_timer(due), due))
            }
            Some(progress) => futures_util::future::Either::Right(progress),
        };
        // Pinned where it is made: moved into a `select!` or a timeout, its state (about 1 KB)
        // would be copied on every request.
        let (res, timer) = {
            let req = crate::h1::client::RequestHead {
                method: &out.method,
                target: &out.target,
                received: out.received.as_ref(),
                headers: &out.headers,
                added: &out.added,
                raw_head: out.raw_head,
            };
            let mut exchange = std::pin::pin!(crate::h1::client::exchange(
                wire,
                req,
                &mut body,
                &mut sent_any
            ));
            match timer {
                futures_util::future::Either::Left((mut timer, due)) => {
                    let res = poll_fn(|cx| {
                        if let Poll::Ready(r) = exchange.as_mut().poll(cx) {
                            return Poll::Ready(Some(r));
                        }
                        crate::h1::client::poll_timer(&mut timer, due, cx).map(|()| None)
                    })
                    .await;
                    (res, Some(timer))
                }
                // On the heap, as in `timed`: a rare wait (see `boxed`).
                futures_util::future::Either::Right(progress) => {
                    let res = boxed(timed_with_progress(
                        exchange,
                        progress,
                        try_timeout,
                        deadline,
                    ))
                    .await
                    .ok();
                    (res, None)
                }
            }
        };
        if let Some(timer) = timer {
            wire.keep_timer(timer);
        }
        drop(in_flight);
        if body.is_some() {
            // Handed back whole: nothing of it went out.
            out.body = body;
        }
        let written = conn.written() > w0;
        let sent = match res {
            None => {
                return Err(Some(
                    ProxyError::new(Kind::Timeout).on_peer(addr, reused, written),
                ))
            }
            Some(Ok(sent)) => sent,
            Some(Err(SendError::Body(e))) => {
                return Err(Some(client_fault_boxed(group, e, addr, reused, written)))
            }
            Some(Err(SendError::Bad(bad))) => {
                tracing::warn!(peer.addr = %addr, error = %bad, "refused an invalid upstream response");
                return Err(Some(
                    ProxyError::new(Kind::BadResponse)
                        .with_source(bad)
                        .on_peer(addr, reused, written),
                ));
            }
            Some(Err(e)) => {
                let got_response_bytes = conn.read() > r0;
                if reused
                    && !got_response_bytes
                    && (!written || out.idempotent())
                    && out.replayable()
                {
                    group.metrics().pool_stale_replays.inc();
                    tracing::debug!(peer.addr = %addr, error = %e, "reused connection was closed; replaying on a fresh one");
                    return Err(None);
                }
                return Err(Some(
                    ProxyError::new(Kind::Reset)
                        .with_source(e)
                        .on_peer(addr, reused, written)
                        .unanswered(!got_response_bytes),
                ));
            }
        };
        let (head, reading) = crate::h1::client::Reading::new(sent);
        let (mut parts, ()) = Response::new(()).into_parts();
        parts.status = head.status;
        parts.version = head.version;
        if let Some(map) = head.headers {
            parts.headers = map;
        }
        let idle = if head.hop_free {
            // Nothing to rewrite: the head held no hop-by-hop field but the framing ones,
            // `Connection` and `Keep-Alive`, which stayed behind, and no `Trailer`.
            parts.version = message::DOWNSTREAM_VERSION;
            group.pool().idle_timeout_for(head.keepalive_hint)
        } else {
            rewrite_response_head(&mut parts, group, out.trailers, false)
        };
        let idle = if head.keep_alive {
            idle
        } else {
            Duration::ZERO
        };
        // Made in its box (allocated first), not on the stack and copied in.
        let mut streaming = Box::write(
            Box::new_uninit(),
            crate::h1::Streaming::new(conn, reading, group.pool_here(), idle),
        );
        streaming.set_raw_head(head.raw);
        Ok(Box::new(Response::from_parts(
            parts,
            RespBody::own(streaming, group.config().read_timeout),
        )))
    }
}

/// A body error seen by upkeep's own codec (or wrapped by hyper's client): the client went
/// silent inside its body, passed the route's body limit, or sent a malformed body or left.
fn client_fault_boxed(
    group: &Group,
    e: crate::error::BoxError,
    peer: SocketAddr,
    reused: bool,
    written: bool,
) -> ProxyError {
    let kind = if caused_by::<crate::body::ClientBodyTimeout>(&*e) {
        count_client_body_timeout(group.metrics());
        Kind::ClientTimeout
    } else if caused_by::<crate::body::BodyTooLarge>(&*e) {
        Kind::BodyTooLarge
    } else {
        Kind::BadRequest
    };
    ProxyError::new(kind)
        .with_source(e)
        .on_peer(peer, reused, written)
}
