//! HTTP/2 upstream connections. One connection carries many requests at once, up to the
//! peer's `SETTINGS_MAX_CONCURRENT_STREAMS`; a second connection is opened only when every
//! open one is at that limit. Liveness is hyper's PING keepalive (a peer that stops answering
//! PINGs closes the connection and fails its streams), and a GOAWAY stops new streams on the
//! connection at once, so the next request opens a fresh one.
//!
//! Which failed requests the peer never processed (RFC 9113 §8.7: streams refused with
//! `REFUSED_STREAM`, streams above a GOAWAY's last-stream-id, and streams refused by a
//! connection already going away) is read from the `h2` error under hyper's.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Uri};
use hyper::client::conn::http2;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::body::ReqBody;

/// Spawns hyper's HTTP/2 client tasks on the heap. hyper hands each task over as one enum
/// sized to its largest kind, the connection's own (the `h2` codec's state); spawned as it
/// is, every request's response task (hyper spawns one a request) took that size, copied in
/// whole on its way into tokio's task cell and again as it finished. Boxed, it is copied
/// once and tokio moves a pointer.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BoxedExec;

impl<F> hyper::rt::Executor<F> for BoxedExec
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(Box::pin(fut));
    }
}

/// One shared HTTP/2 connection; clones are handles on the same connection.
#[derive(Clone)]
pub(crate) struct Shared {
    /// The peer's `SETTINGS_ENABLE_CONNECT_PROTOCOL` (RFC 8441 §3): `None` until its first
    /// SETTINGS frame has been read (`h2_settings`).
    connect_protocol: watch::Receiver<Option<bool>>,
    pub(crate) sender: http2::SendRequest<ReqBody>,
    /// Requests in flight on this connection through upkeep (until their response body ends).
    streams: Arc<AtomicUsize>,
    /// Milliseconds after `created` of the last stream's end (for the idle timeout).
    last_used_ms: Arc<AtomicU64>,
    /// Retired after a stream was refused unprocessed: the peer is going away.
    retired: Arc<AtomicBool>,
    pub(crate) created: Instant,
    /// Over TLS: the `:scheme` of its requests.
    https: bool,
    /// The peer's `SETTINGS_MAX_CONCURRENT_STREAMS`, as last seen by the connection task.
    max_streams: Arc<AtomicUsize>,
}

/// A request's claim on a stream of a shared connection; released when dropped.
pub(crate) struct Stream {
    shared: Shared,
}

impl Drop for Stream {
    fn drop(&mut self) {
        let s = &self.shared;
        s.last_used_ms
            .store(s.created.elapsed().as_millis() as u64, Ordering::Relaxed);
        s.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Stream {
    /// The connection's sender.
    pub(crate) fn sender(&mut self) -> &mut http2::SendRequest<ReqBody> {
        &mut self.shared.sender
    }

    /// The connection can take no new stream (closed, or going away after a GOAWAY).
    pub(crate) fn is_closed(&self) -> bool {
        !self.shared.usable()
    }

    /// The connection is over TLS.
    pub(crate) fn https(&self) -> bool {
        self.shared.https
    }

    /// No new stream goes to this connection (its streams in flight go on).
    pub(crate) fn retire(&self) {
        self.shared.retired.store(true, Ordering::Relaxed);
    }

    /// Whether the peer announced `SETTINGS_ENABLE_CONNECT_PROTOCOL` (RFC 8441), waiting up
    /// to `wait` for its first SETTINGS on a connection just opened. `None`: no SETTINGS in
    /// time.
    pub(crate) async fn extended_connect(&self, wait: Duration) -> Option<bool> {
        let mut rx = self.shared.connect_protocol.clone();
        let seen = tokio::time::timeout(wait, rx.wait_for(Option::is_some)).await;
        match seen {
            Ok(Ok(v)) => *v,
            _ => None,
        }
    }
}

impl Shared {
    pub(crate) fn new(
        sender: http2::SendRequest<ReqBody>,
        https: bool,
        max_streams: Arc<AtomicUsize>,
        connect_protocol: watch::Receiver<Option<bool>>,
    ) -> Self {
        Self {
            connect_protocol,
            https,
            max_streams,
            sender,
            streams: Arc::new(AtomicUsize::new(0)),
            last_used_ms: Arc::new(AtomicU64::new(0)),
            retired: Arc::new(AtomicBool::new(false)),
            created: Instant::now(),
        }
    }

    /// Claims a stream on this connection.
    pub(crate) fn claim(&self) -> Stream {
        self.streams.fetch_add(1, Ordering::Relaxed);
        Stream {
            shared: self.clone(),
        }
    }

    fn usable(&self) -> bool {
        !self.retired.load(Ordering::Relaxed) && !self.sender.is_closed() && self.sender.is_ready()
    }

    fn has_room(&self) -> bool {
        self.streams.load(Ordering::Relaxed) < self.max_streams.load(Ordering::Relaxed).max(1)
    }

    fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.streams.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = self.created + Duration::from_millis(self.last_used_ms.load(Ordering::Relaxed));
        Some(now.saturating_duration_since(last))
    }
}

/// A serving thread (`super::worker`) and a peer.
type Key = (usize, SocketAddr);

/// The shared HTTP/2 connections of one pool, by serving thread and peer. Each serving thread
/// has its own connections, driven by its own runtime: a request and the connection carrying
/// it never wait on another thread (a connection shared across threads cost two cross-thread
/// wake-ups a request, and put every thread's framing on the thread that drove it). The lists
/// are split by thread like the HTTP/1.1 idle lists (`super::SHARDS`), so that a request's look
/// into them takes a lock no other serving thread takes.
pub(crate) struct H2Conns {
    shards: [Mutex<HashMap<Key, Vec<Shared>>>; super::SHARDS],
    /// One connect at a time per serving thread and peer: a burst of first requests shares one
    /// new connection instead of opening one each.
    connecting: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>,
}

impl Default for H2Conns {
    fn default() -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::default()),
            connecting: Mutex::default(),
        }
    }
}

impl H2Conns {
    /// The lists of serving thread `worker`.
    fn shard(&self, worker: usize) -> std::sync::MutexGuard<'_, HashMap<Key, Vec<Shared>>> {
        self.shards[worker % super::SHARDS].lock().unwrap()
    }

    /// A stream on an open connection to `peer` with room for one more, if there is one.
    /// Closed, going-away and too old connections are dropped on the way (a dropped handle
    /// lets hyper close the connection once its last stream ends).
    pub(crate) fn checkout(&self, peer: SocketAddr, max_age: Duration) -> Option<Stream> {
        let now = Instant::now();
        let key = (super::worker(), peer);
        let mut peers = self.shard(key.0);
        let list = peers.get_mut(&key)?;
        list.retain(|c| c.usable() && now.duration_since(c.created) < max_age);
        let found = list.iter().find(|c| c.has_room()).map(Shared::claim);
        if list.is_empty() {
            peers.remove(&key);
        }
        found
    }

    /// A stream on another serving thread's connection to `peer` with room for one more:
    /// when this thread may open none (`max_connections_per_peer`). Its requests then wake
    /// that thread, as every request did when all threads shared their connections.
    pub(crate) fn checkout_elsewhere(&self, peer: SocketAddr, max_age: Duration) -> Option<Stream> {
        let now = Instant::now();
        self.shards.iter().find_map(|shard| {
            shard
                .lock()
                .unwrap()
                .iter()
                .filter(|((_, p), _)| *p == peer)
                .flat_map(|(_, list)| list)
                .find(|c| c.usable() && now.duration_since(c.created) < max_age && c.has_room())
                .map(Shared::claim)
        })
    }

    /// The other serving threads' connect locks for `peer`.
    pub(crate) fn connect_locks_elsewhere(
        &self,
        peer: SocketAddr,
    ) -> Vec<Arc<tokio::sync::Mutex<()>>> {
        let me = super::worker();
        self.connecting
            .lock()
            .unwrap()
            .iter()
            .filter(|((w, p), _)| *p == peer && *w != me)
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Registers a new connection and claims its first stream.
    pub(crate) fn insert(&self, peer: SocketAddr, shared: Shared) -> Stream {
        let stream = shared.claim();
        let key = (super::worker(), peer);
        self.shard(key.0).entry(key).or_default().push(shared);
        stream
    }

    /// This serving thread's connect lock for `peer`.
    pub(crate) fn connect_lock(&self, peer: SocketAddr) -> Arc<tokio::sync::Mutex<()>> {
        self.connecting
            .lock()
            .unwrap()
            .entry((super::worker(), peer))
            .or_default()
            .clone()
    }

    /// Drops connections that are closed, idle past `idle`, or past `max_age` with no stream.
    pub(crate) fn sweep(&self, idle: Duration, max_age: Duration) -> usize {
        let now = Instant::now();
        let mut dropped = 0;
        for shard in &self.shards {
            let mut peers = shard.lock().unwrap();
            for list in peers.values_mut() {
                let before = list.len();
                list.retain(|c| {
                    let idle_for = c.idle_for(now);
                    c.usable()
                        && idle_for.is_none_or(|d| d < idle)
                        && (idle_for.is_none() || now.duration_since(c.created) < max_age)
                });
                dropped += before - list.len();
            }
            peers.retain(|_, l| !l.is_empty());
        }
        self.connecting
            .lock()
            .unwrap()
            .retain(|_, m| Arc::strong_count(m) > 1 || m.try_lock().is_err());
        dropped
    }

    /// Drops every handle (shutdown, or the group went away).
    pub(crate) fn clear(&self) {
        for shard in &self.shards {
            shard.lock().unwrap().clear();
        }
    }
}

/// Drives a connection, keeping `max_streams` at the peer's current
/// `SETTINGS_MAX_CONCURRENT_STREAMS` (read after every poll: SETTINGS may come at any time).
pub(crate) async fn drive<T>(
    conn: http2::Connection<T, ReqBody, BoxedExec>,
    max_streams: Arc<AtomicUsize>,
) -> hyper::Result<()>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let mut conn = std::pin::pin!(conn);
    std::future::poll_fn(|cx| {
        let r = conn.as_mut().poll(cx);
        max_streams.store(conn.current_max_send_streams(), Ordering::Relaxed);
        r
    })
    .await
}

/// The request as HTTP/2 sends it: `Host` becomes `:authority` (RFC 9113 §8.3.1) and the
/// scheme that of the connection; without a `Host` the target stays as it is.
pub(crate) fn with_authority(mut req: Request<ReqBody>, https: bool) -> Request<ReqBody> {
    // Taken out at once (one look into the map); a value that is no authority goes back.
    let Some(host) = req.headers_mut().remove(http::header::HOST) else {
        return req;
    };
    let Ok(authority) = Authority::try_from(host.as_bytes()) else {
        req.headers_mut().insert(http::header::HOST, host);
        return req;
    };
    let mut parts = req.uri().clone().into_parts();
    parts.scheme = Some(if https { Scheme::HTTPS } else { Scheme::HTTP });
    parts.authority = Some(authority);
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(PathAndQuery::from_static("/"));
    }
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
    req
}

/// Whether a failed request was certainly not processed by the peer, so that it may be sent
/// again on another connection whatever its method: refused with `REFUSED_STREAM`, above the
/// last-stream-id of a GOAWAY, or refused because the connection was already going away.
pub fn unprocessed(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<::h2::Error>() {
            return (h2.is_go_away() && h2.is_remote())
                || (h2.is_reset() && h2.reason() == Some(::h2::Reason::REFUSED_STREAM));
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn request(host: &'static str, target: &str) -> Request<ReqBody> {
        let mut req = Request::new(ReqBody::Empty);
        *req.uri_mut() = target.parse().unwrap();
        req.headers_mut()
            .insert(http::header::HOST, HeaderValue::from_static(host));
        req.headers_mut()
            .insert("x-after", HeaderValue::from_static("1"));
        req
    }

    #[test]
    fn a_host_becomes_the_authority_with_the_connections_scheme() {
        let req = with_authority(request("a.test:8080", "/p?q=1"), true);
        assert_eq!(req.uri(), "https://a.test:8080/p?q=1");
        assert!(req.headers().get(http::header::HOST).is_none());
        assert_eq!(req.headers().len(), 1);
        let req = with_authority(request("b.test", "/"), false);
        assert_eq!(req.uri(), "http://b.test/");
    }

    #[test]
    fn a_host_that_is_no_authority_stays_a_field() {
        for bad in ["a b.test", "a.test/x", ""] {
            let req = with_authority(request(bad, "/p"), false);
            assert_eq!(req.uri(), "/p", "{bad:?}");
            assert_eq!(
                req.headers().get(http::header::HOST).unwrap(),
                bad,
                "{bad:?}"
            );
        }
        let mut req = Request::new(ReqBody::Empty);
        *req.uri_mut() = "/p".parse().unwrap();
        assert_eq!(with_authority(req, false).uri(), "/p");
    }
}
