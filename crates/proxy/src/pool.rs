//! The upstream connection pool. Every pooled connection knows its idle deadline (the
//! configured idle timeout, lowered under the server's `Keep-Alive: timeout=N` hint) and whether
//! it is being reused, and is tested before reuse, so upkeep closes first and never races a FIN.
//!
//! HTTP/2 groups (`protocol = "http2"`, or `"auto"` when ALPN says `h2`) share connections
//! between requests instead (`h2`).

pub mod h2;
mod h2_continue;
mod h2_settings;
mod io;
mod load;
pub mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::body::ReqBody;
use crate::config::{PoolConfig, UpstreamProtocol, KEEPALIVE_HINT_MARGIN};
use crate::metrics::Metrics;

use self::h2::{H2Conns, Stream};
pub use io::Counters;
/// The socket under an own-codec connection (`crate::h1`), counting bytes like hyper's.
pub(crate) type OwnIo = SharedIo;
use io::{Peeker, SharedIo, Transport};
use load::{Loads, OpenGuard};
use tls::ClientTls;

/// Why a connect attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The peer did not complete the TCP handshake in time.
    #[error("connect timed out after {0:?}")]
    Timeout(Duration),
    /// The peer refused or the network failed.
    #[error("connect failed: {0}")]
    Io(#[from] std::io::Error),
    /// The TLS handshake failed (certificate, protocol, or the peer closed during it).
    #[error("tls handshake failed: {0}")]
    Tls(std::io::Error),
    /// The HTTP/1.1 handshake failed.
    #[error("handshake failed: {0}")]
    Handshake(#[from] hyper::Error),
    /// The peer already has `max_connections_per_peer` open connections.
    #[error("peer is at max_connections_per_peer ({0})")]
    Full(usize),
}

/// How a request is sent: on an HTTP/1.1 connection of its own, or on a stream of a shared
/// HTTP/2 connection.
pub(crate) enum Sender {
    H1(http1::SendRequest<ReqBody>),
    H2(Box<Stream>),
    /// An HTTP/1.1 connection the request task drives itself (`crate::h1`).
    Own(Option<Box<crate::h1::OwnWire>>),
}

/// What sending a request gives: the response head, or the error (with the request when
/// hyper never sent it).
pub(crate) type SendResult = Result<
    http::Response<hyper::body::Incoming>,
    hyper::client::conn::TrySendError<http::Request<ReqBody>>,
>;

impl Sender {
    /// Sends `req` on whichever connection this is (upgrades use it on a fresh connection).
    pub(crate) fn send_request(
        &mut self,
        req: http::Request<ReqBody>,
    ) -> impl std::future::Future<Output = hyper::Result<http::Response<hyper::body::Incoming>>>
           + Send
           + 'static {
        use futures_util::future::Either;
        self.make_hyper();
        match self {
            Sender::H1(s) => Either::Left(s.send_request(req)),
            Sender::H2(s) => Either::Right(s.sender().send_request(req)),
            Sender::Own(_) => unreachable!("make_hyper handed the connection to hyper"),
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
            // Its liveness is looked at before reuse (`quiet_while_idle`, then the peek).
            Sender::Own(_) => false,
        }
    }

    /// An idle own-codec connection that the runtime has seen nothing arrive on since its
    /// last read drained it: fit for reuse without the peek (`SharedIo::quiet_since_drained`).
    /// Not asked of hyper's connections, whose task keeps reading the socket.
    fn quiet_while_idle(&self) -> bool {
        match self {
            Sender::Own(Some(w)) => w.io().quiet_since_drained(),
            _ => false,
        }
    }

    fn is_ready(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_ready(),
            Sender::H2(s) => !s.is_closed(),
            Sender::Own(w) => w.as_ref().is_some_and(|w| w.is_clean()),
        }
    }

    /// Hands an own-codec connection over to hyper's client (for the requests that stay on
    /// hyper: `Expect: 100-continue`). hyper's HTTP/1 handshake does no I/O and cannot fail
    /// (it sets up a channel), so this completes at once.
    fn make_hyper(&mut self) {
        use futures_util::FutureExt;
        let Sender::Own(wire) = self else {
            return;
        };
        let Some(wire) = wire.take() else {
            return;
        };
        let builder = http1::Builder::new();
        let handshake = match wire.into_io() {
            Some(io) => builder
                .handshake::<_, ReqBody>(TokioIo::new(io))
                .now_or_never()
                .map(|r| r.map(|(s, c)| (s, futures_util::future::Either::Left(c)))),
            // Bytes were read ahead (never so for a pooled connection): a dead stand-in
            // makes the send fail as a reset, retried on a fresh connection.
            None => builder
                .handshake::<_, ReqBody>(TokioIo::new(tokio::io::duplex(1).0))
                .now_or_never()
                .map(|r| r.map(|(s, c)| (s, futures_util::future::Either::Right(c)))),
        };
        let (sender, conn) = handshake
            .expect("hyper's HTTP/1 handshake is ready at once")
            .expect("hyper's HTTP/1 handshake does not fail");
        tokio::spawn(async move {
            let r = match conn {
                futures_util::future::Either::Left(c) => c.with_upgrades().await,
                futures_util::future::Either::Right(c) => c.await,
            };
            if let Err(e) = r {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        *self = Sender::H1(sender);
    }
}

/// One upstream connection: HTTP/1.1, or a stream on a shared HTTP/2 connection.
pub struct Conn {
    pub(crate) sender: Sender,
    /// `None` on HTTP/2, whose liveness is its PINGs.
    peeker: Option<Peeker>,
    counters: Arc<Counters>,
    peer: SocketAddr,
    created: Instant,
    reused: bool,
    /// Counts an HTTP/1.1 connection against its peer while it is open (an HTTP/2
    /// connection's task holds its own).
    open: Option<OpenGuard>,
}

impl Conn {
    /// Whether the idle connection's socket has received nothing (no FIN, no stray bytes, no
    /// error): asked of the runtime first, without a system call, for upkeep's own codec
    /// (`Sender::quiet_while_idle`), and otherwise of the socket itself (the peek).
    fn idle_socket_is_clean(&self) -> bool {
        self.sender.quiet_while_idle()
            || self
                .peeker
                .as_ref()
                .is_some_and(Peeker::idle_socket_is_clean)
    }

    /// The peer address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Taken from the pool rather than freshly connected.
    pub fn is_reused(&self) -> bool {
        self.reused
    }

    /// Request bytes written so far.
    pub fn written(&self) -> u64 {
        self.counters.written.load(Ordering::Relaxed)
    }

    /// Response bytes read so far.
    pub fn read(&self) -> u64 {
        self.counters.read.load(Ordering::Relaxed)
    }

    /// The byte counters, shared with the connection.
    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// A stream on a shared HTTP/2 connection: its counters count every stream's bytes.
    pub fn is_h2(&self) -> bool {
        matches!(self.sender, Sender::H2(_))
    }

    /// The connection when upkeep's own HTTP/1 codec drives it (`crate::h1`).
    pub(crate) fn wire_mut(&mut self) -> Option<&mut crate::h1::OwnWire> {
        match &mut self.sender {
            Sender::Own(Some(w)) => Some(w),
            _ => None,
        }
    }

    /// The stream of a shared HTTP/2 connection this is, if it is one.
    pub(crate) fn h2_stream(&self) -> Option<&Stream> {
        match &self.sender {
            Sender::H2(s) => Some(s),
            _ => None,
        }
    }

    /// An HTTP/2 connection whose peer refused a stream unprocessed takes no new stream.
    pub(crate) fn retire(&self) {
        if let Sender::H2(s) = &self.sender {
            s.retire();
        }
    }

    /// Sends `req`; on HTTP/1.1 hyper hands back a request it never wrote.
    pub(crate) fn send(
        &mut self,
        req: http::Request<ReqBody>,
    ) -> impl std::future::Future<Output = SendResult> + Send + 'static {
        use futures_util::future::Either;
        self.sender.make_hyper();
        match &mut self.sender {
            Sender::H1(s) => Either::Left(s.try_send_request(req)),
            Sender::H2(s) => {
                let req = self::h2::with_authority(req, s.https());
                Either::Right(s.sender().try_send_request(req))
            }
            Sender::Own(_) => unreachable!("make_hyper handed the connection to hyper"),
        }
    }
}

impl Conn {
    /// Taken off an idle list (reused, expired or closed).
    fn left_idle(&self) {
        if let Some(open) = &self.open {
            open.load().idle_left();
        }
    }

    fn h2(stream: Stream, peer: SocketAddr, reused: bool) -> Self {
        Conn {
            sender: Sender::H2(Box::new(stream)),
            peeker: None,
            counters: Arc::default(),
            peer,
            created: Instant::now(),
            reused,
            open: None,
        }
    }
}

struct Idle {
    conn: Conn,
    /// The idle timeout's end, or the end of the connection's `max_age` if sooner.
    deadline: Instant,
}

thread_local! {
    /// Which serving worker this thread is (0: not a dedicated worker). Each worker runs its
    /// own single-threaded runtime, and a connection is reused only by the worker whose
    /// runtime drives it, so a reuse never hops threads.
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks the current thread as serving worker `id` (1-based).
pub fn set_worker(id: usize) {
    WORKER.with(|w| w.set(id));
}

/// Which serving worker this thread is (0: not a dedicated worker).
pub(crate) fn worker() -> usize {
    WORKER.with(|w| w.get())
}

/// Idle connections by (worker, peer).
/// Looked up twice per request: keyed by a fast hash (`crate::fxhash`), not SipHash (about
/// 300 instructions a lookup). The keys are configured or resolved peers, never chosen by a
/// client.
type IdleMap = HashMap<(usize, SocketAddr), Vec<Idle>, crate::fxhash::FxBuild>;

/// Idle lists are split by worker so that serving threads never wait on each other's lock
/// (a contended lock costs a futex call and a wake-up per request).
const SHARDS: usize = 16;

/// A serving thread's handle on a pool (`Group::pool_here`), which a response body holds
/// until its connection is checked back in: its count of references is on a line of that
/// thread's. A clone of the pool's own `Arc` per request was a line every serving thread
/// wrote (docs/benchmarks.md, "How the design scales to 16 and 64 cores").
pub struct Handle(Arc<Pool>);

impl Handle {
    /// One handle on `pool` per thread shard.
    pub(crate) fn per_thread(pool: &Arc<Pool>) -> crate::metrics::PerThread<Arc<Handle>> {
        crate::metrics::PerThread::new(|| Arc::new(Handle(pool.clone())))
    }
}

impl std::ops::Deref for Handle {
    type Target = Pool;

    fn deref(&self) -> &Pool {
        &self.0
    }
}

/// Pooled connections per peer address.
pub struct Pool {
    cfg: PoolConfig,
    tls: Option<ClientTls>,
    shards: [Mutex<IdleMap>; SHARDS],
    metrics: Arc<Metrics>,
    /// Open and idle connections and the busy peak per peer, across serving threads.
    loads: Loads,
    protocol: UpstreamProtocol,
    h2: H2Conns,
}

impl Pool {
    /// A pool with a background sweeper that closes expired idle connections.
    pub fn new(cfg: PoolConfig, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::with_tls(cfg, None, metrics)
    }

    /// Like `new`; with `tls`, every connection does a TLS handshake after connecting.
    pub fn with_tls(cfg: PoolConfig, tls: Option<ClientTls>, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::for_protocol(cfg, tls, UpstreamProtocol::Http1, metrics)
    }

    /// Like `with_tls`, speaking `protocol` (whose ALPN `tls` must offer).
    pub fn for_protocol(
        cfg: PoolConfig,
        tls: Option<ClientTls>,
        protocol: UpstreamProtocol,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let loads = Loads::new(cfg.idle_peak_window);
        let pool = Arc::new(Self {
            cfg,
            tls,
            shards: std::array::from_fn(|_| Mutex::new(IdleMap::default())),
            loads,
            metrics,
            protocol,
            h2: H2Conns::default(),
        });
        let weak = Arc::downgrade(&pool);
        let every = SWEEP_EVERY.min(pool.loads.slot());
        tokio::spawn(sweep(weak, every));
        pool
    }

    /// The pool's settings.
    pub fn config(&self) -> &PoolConfig {
        &self.cfg
    }

    /// This worker's idle lists.
    fn shard(&self) -> std::sync::MutexGuard<'_, IdleMap> {
        self.shards[worker() % SHARDS].lock().unwrap()
    }

    /// Idle connections per peer, every serving thread's together.
    pub fn idle_count(&self, peer: SocketAddr) -> usize {
        self.loads.idle_count(peer)
    }

    /// A live idle connection to `peer`, most recently used first; closed, expired and
    /// dirty ones are discarded on the way.
    pub fn checkout(&self, peer: SocketAddr) -> Option<Conn> {
        self.checkout_at(peer, Instant::now())
    }

    /// [`Pool::checkout`] with the clock already read (`now`).
    pub fn checkout_at(&self, peer: SocketAddr, now: Instant) -> Option<Conn> {
        if self.protocol != UpstreamProtocol::Http1 {
            if let Some(stream) = self.h2.checkout(peer, self.cfg.max_age) {
                self.metrics.pool_event("reused");
                return Some(Conn::h2(stream, peer, true));
            }
            if self.protocol == UpstreamProtocol::Http2 {
                return None;
            }
        }
        let mut discarded = Vec::new();
        let found = {
            let mut idle = self.shard();
            let list = idle.get_mut(&(worker(), peer))?;
            let mut found = None;
            while let Some(entry) = list.pop() {
                self.metrics.pool_idle.dec();
                entry.conn.left_idle();
                if now >= entry.deadline {
                    self.metrics.pool_event("expired");
                    discarded.push(entry);
                } else if entry.conn.sender.is_closed()
                    || !entry.conn.sender.is_ready()
                    || !entry.conn.idle_socket_is_clean()
                {
                    self.metrics.pool_event("stale_discarded");
                    discarded.push(entry);
                } else {
                    found = Some(entry.conn);
                    break;
                }
            }
            found
        };
        drop(discarded);
        let mut conn = found?;
        if let Some(open) = &conn.open {
            open.load().note_busy();
        }
        conn.reused = true;
        self.metrics.pool_event("reused");
        Some(conn)
    }

    /// Open connections (busy and idle) to `peer`.
    pub fn open_count(&self, peer: SocketAddr) -> usize {
        self.loads.open_count(peer)
    }

    /// Opens a new connection to `peer` (TCP, then TLS for `https://` groups); `timeout`
    /// bounds both handshakes together. On HTTP/2 a connect waits for one already under way
    /// to the same peer and shares its connection.
    pub async fn connect(&self, peer: SocketAddr, timeout: Duration) -> Result<Conn, ConnectError> {
        let until = Instant::now() + timeout;
        if self.protocol == UpstreamProtocol::Http1 {
            return self.connect_new(peer, timeout, until, false).await;
        }
        let lock = self.h2.connect_lock(peer);
        let _turn = match tokio::time::timeout_at(until, lock.lock()).await {
            Err(_) => return Err(ConnectError::Timeout(timeout)),
            Ok(g) => g,
        };
        if let Some(stream) = self.h2.checkout(peer, self.cfg.max_age) {
            self.metrics.pool_event("reused");
            return Ok(Conn::h2(stream, peer, true));
        }
        match self.connect_new(peer, timeout, until, false).await {
            // At `max_connections_per_peer`, another serving thread's connection with room
            // takes the request rather than refusing it.
            Err(ConnectError::Full(n)) => {
                // Their connects under way first: what they open is what this thread may use.
                for other in self.h2.connect_locks_elsewhere(peer) {
                    if tokio::time::timeout_at(until, other.lock()).await.is_err() {
                        break;
                    }
                }
                match self.h2.checkout_elsewhere(peer, self.cfg.max_age) {
                    Some(stream) => {
                        self.metrics.pool_event("reused");
                        Ok(Conn::h2(stream, peer, true))
                    }
                    None => Err(ConnectError::Full(n)),
                }
            }
            r => r,
        }
    }

    async fn connect_new(
        &self,
        peer: SocketAddr,
        timeout: Duration,
        until: Instant,
        own: bool,
    ) -> Result<Conn, ConnectError> {
        self.connect_via(peer, timeout, until, own, self.tls.as_ref(), None)
            .await
    }

    /// A fresh HTTP/1.1 connection to `peer` of an `auto` group over TLS (ALPN offers only
    /// `http/1.1`), never pooled: for an upgrade the peer's HTTP/2 side cannot carry
    /// (`crate::upgrade`).
    pub(crate) async fn connect_http1(
        &self,
        peer: SocketAddr,
        timeout: Duration,
    ) -> Result<Conn, ConnectError> {
        let tls = self
            .tls
            .as_ref()
            .map(|t| t.with_alpn(vec![b"http/1.1".to_vec()]));
        let until = Instant::now() + timeout;
        self.connect_via(peer, timeout, until, false, tls.as_ref(), None)
            .await
    }

    /// A fresh connection to `peer` for one request with `Expect: 100-continue`, never
    /// pooled nor shared. When it speaks HTTP/2, `on_continue` is called if the peer's first
    /// answer is `100` (hyper's HTTP/2 client does not report it; see `h2_continue`); over
    /// HTTP/1.1 hyper's `on_informational` reports it as on any connection.
    pub(crate) async fn connect_for_continue(
        &self,
        peer: SocketAddr,
        timeout: Duration,
        on_continue: self::h2_continue::OnContinue,
    ) -> Result<Conn, ConnectError> {
        let until = Instant::now() + timeout;
        self.connect_via(
            peer,
            timeout,
            until,
            false,
            self.tls.as_ref(),
            Some(on_continue),
        )
        .await
    }

    /// Whether this pool's connections may speak HTTP/2 (`protocol = "http2"` or `"auto"`).
    pub(crate) fn may_speak_http2(&self) -> bool {
        self.protocol != UpstreamProtocol::Http1
    }

    async fn connect_via(
        &self,
        peer: SocketAddr,
        timeout: Duration,
        until: Instant,
        own: bool,
        tls: Option<&ClientTls>,
        on_continue: Option<self::h2_continue::OnContinue>,
    ) -> Result<Conn, ConnectError> {
        let open = self
            .loads
            .open(peer, self.cfg.max_connections_per_peer)
            .map_err(ConnectError::Full)?;
        let stream = match tokio::time::timeout_at(until, TcpStream::connect(peer)).await {
            Err(_) => return Err(ConnectError::Timeout(timeout)),
            Ok(r) => r?,
        };
        stream.set_nodelay(true)?;
        let peeker = Peeker::new(&stream)?;
        let (transport, h2) = match tls {
            None => (
                Transport::Plain(stream),
                self.protocol == UpstreamProtocol::Http2,
            ),
            Some(tls) => match tokio::time::timeout_at(until, tls.handshake(stream)).await {
                Err(_) => return Err(ConnectError::Timeout(timeout)),
                Ok(Err(e)) => return Err(ConnectError::Tls(e)),
                Ok(Ok(s)) => {
                    // `http2` offers only h2; `auto` goes by what the server picked.
                    let h2 = match self.protocol {
                        UpstreamProtocol::Http1 => false,
                        UpstreamProtocol::Http2 => true,
                        UpstreamProtocol::Auto => s.get_ref().1.alpn_protocol() == Some(b"h2"),
                    };
                    (Transport::Tls(Box::new(s)), h2)
                }
            },
        };
        let (io, counters) = SharedIo::new(transport);
        if h2 {
            let (connect_protocol, connect_protocol_rx) = tokio::sync::watch::channel(None);
            let dedicated = on_continue.is_some();
            let io = self::h2_settings::SettingsWatch::new(io, connect_protocol)
                .with_continue(on_continue);
            let (sender, conn) = http2::Builder::new(self::h2::BoxedExec)
                .timer(TokioTimer::new())
                .keep_alive_interval(self.cfg.http2_keepalive_interval)
                .keep_alive_timeout(self.cfg.http2_keepalive_timeout)
                .keep_alive_while_idle(true)
                .handshake(TokioIo::new(io))
                .await?;
            let max_streams = Arc::new(std::sync::atomic::AtomicUsize::new(100));
            let limit = max_streams.clone();
            tokio::spawn(async move {
                // The guard counts the connection, not a request: held until it closes.
                let _open = open;
                if let Err(e) = self::h2::drive(conn, limit).await {
                    tracing::debug!(peer.addr = %peer, error = %e, "upstream HTTP/2 connection ended with an error");
                }
            });
            self.metrics.pool_event("new");
            let shared =
                self::h2::Shared::new(sender, self.tls.is_some(), max_streams, connect_protocol_rx);
            // A connection for one request stays out of the pool: hyper closes it when the
            // request's handle goes.
            let stream = if dedicated {
                shared.claim()
            } else {
                self.h2.insert(peer, shared)
            };
            return Ok(Conn {
                counters,
                ..Conn::h2(stream, peer, false)
            });
        }
        if own {
            self.metrics.pool_event("new");
            return Ok(Conn {
                sender: Sender::Own(Some(Box::new(crate::h1::Wire::new(io)))),
                peeker: Some(peeker),
                counters,
                peer,
                created: Instant::now(),
                reused: false,
                open: Some(open),
            });
        }
        let (sender, conn) = http1::Builder::new().handshake(TokioIo::new(io)).await?;
        tokio::spawn(async move {
            // With upgrades: a `101` hands the socket to `crate::upgrade` (never pooled).
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(peer.addr = %peer, error = %e, "upstream connection ended with an error");
            }
        });
        self.metrics.pool_event("new");
        Ok(Conn {
            sender: Sender::H1(sender),
            peeker: Some(peeker),
            counters,
            peer,
            created: Instant::now(),
            reused: false,
            open: Some(open),
        })
    }

    /// The idle timeout for a connection whose last response carried `hint`
    /// (`Keep-Alive: timeout=N`): min(configured, N - 1 s); zero means do not reuse.
    pub fn idle_timeout_for(&self, hint: Option<Duration>) -> Duration {
        match hint {
            Some(h) => self
                .cfg
                .idle_timeout
                .min(h.saturating_sub(KEEPALIVE_HINT_MARGIN)),
            None => self.cfg.idle_timeout,
        }
    }

    /// Keeps `conn` idle on this thread's list when its peer has an idle place left: at
    /// most its recent busy peak, and `max_idle_per_peer` across threads. At the limit this
    /// thread's oldest idle connection to the peer makes way, or `conn` is closed.
    fn put(&self, conn: Conn, idle_timeout: Duration) {
        let now = Instant::now();
        // `None`: an age that cannot be reached (the deadline is the idle timeout's).
        let retire = conn.created.checked_add(self.cfg.max_age);
        if idle_timeout.is_zero()
            || conn.is_h2()
            || self.cfg.max_idle_per_peer == 0
            || retire.is_some_and(|r| now >= r)
            || conn.sender.is_closed()
        {
            return;
        }
        // Borrowed, not cloned: a clone would write the shared reference count per request.
        let placed = match conn.open.as_ref() {
            Some(open) => {
                let load = open.load();
                load.try_idle(load.idle_limit(self.cfg.max_idle_per_peer))
            }
            None => return,
        };
        let mut evicted = None;
        {
            let mut idle = self.shard();
            let list = idle.entry((worker(), conn.peer)).or_default();
            if !placed {
                if list.is_empty() {
                    drop(idle);
                    self.metrics.pool_event("evicted");
                    return;
                }
                // The oldest makes way; the count of idle connections stays the same.
                evicted = Some(list.remove(0));
                self.metrics.pool_idle.dec();
            }
            // One deadline for both limits: a check-out compares it alone.
            let idle_end = now + idle_timeout;
            list.push(Idle {
                conn,
                deadline: retire.map_or(idle_end, |r| r.min(idle_end)),
            });
            self.metrics.pool_idle.inc();
        }
        if evicted.is_some() {
            self.metrics.pool_event("evicted");
        }
    }

    fn sweep_once(&self) {
        let now = Instant::now();
        let mut discarded = Vec::new();
        for shard in &self.shards {
            let mut idle = shard.lock().unwrap();
            for list in idle.values_mut() {
                let before = list.len();
                let mut i = 0;
                while i < list.len() {
                    let e = &list[i];
                    if now >= e.deadline || e.conn.sender.is_closed() {
                        let e = list.remove(i);
                        e.conn.left_idle();
                        discarded.push(e);
                    } else {
                        i += 1;
                    }
                }
                self.metrics.pool_idle.dec_by((before - list.len()) as u64);
            }
            idle.retain(|_, l| !l.is_empty());
        }
        for _ in &discarded {
            self.metrics.pool_event("expired");
        }
        drop(discarded);
        // Idle connections above a peer's decayed peak: the oldest of each list go first.
        let mut shrunk = Vec::new();
        for (peer, mut excess) in self.loads.tick(self.cfg.max_idle_per_peer) {
            for shard in &self.shards {
                let mut idle = shard.lock().unwrap();
                for ((_, p), list) in idle.iter_mut() {
                    while *p == peer && excess > 0 && !list.is_empty() {
                        let e = list.remove(0);
                        e.conn.left_idle();
                        self.metrics.pool_idle.dec();
                        shrunk.push(e);
                        excess -= 1;
                    }
                }
                idle.retain(|_, l| !l.is_empty());
            }
        }
        for _ in &shrunk {
            self.metrics.pool_event("evicted");
        }
        drop(shrunk);
        for _ in 0..self.h2.sweep(self.cfg.idle_timeout, self.cfg.max_age) {
            self.metrics.pool_event("expired");
        }
    }

    /// Drops every idle connection (on shutdown or when the group goes away).
    pub fn clear(&self) {
        self.h2.clear();
        for shard in &self.shards {
            let drained: Vec<_> = shard.lock().unwrap().drain().collect();
            let n: usize = drained.iter().map(|(_, l)| l.len()).sum();
            for (_, list) in &drained {
                for e in list {
                    e.conn.left_idle();
                }
            }
            self.metrics.pool_idle.dec_by(n as u64);
        }
    }
}

impl Pool {
    /// Like `connect`, for a request that upkeep's own HTTP/1 codec sends (`crate::h1`): the
    /// connection is not handed to hyper. Other protocols connect as `connect` does.
    pub(crate) async fn connect_own(
        &self,
        peer: SocketAddr,
        timeout: Duration,
    ) -> Result<Conn, ConnectError> {
        // `hyper_http1` (tests only): a connection of hyper's, which the request path then
        // drives as it does for `Expect` requests.
        if self.protocol != UpstreamProtocol::Http1 || self.cfg.hyper_http1 {
            return self.connect(peer, timeout).await;
        }
        let until = Instant::now() + timeout;
        self.connect_new(peer, timeout, until, true).await
    }

    /// Returns an own-codec connection whose response ended cleanly (`crate::h1`).
    pub(crate) fn check_in(&self, mut conn: Conn, idle_timeout: Duration) {
        if let Some(w) = conn.wire_mut() {
            w.release();
        }
        self.put(conn, idle_timeout);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.clear();
    }
}

/// How often expired idle connections are closed (sooner when the peak window is short).
const SWEEP_EVERY: Duration = Duration::from_millis(250);

async fn sweep(pool: Weak<Pool>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match pool.upgrade() {
            Some(p) => p.sweep_once(),
            None => return,
        }
    }
}

/// Returns a connection to the pool once its response body has been read to the end.
pub struct Checkin {
    pool: Arc<Pool>,
    conn: Conn,
    idle_timeout: Duration,
}

impl Checkin {
    /// A ticket to return `conn` with this idle timeout; `None` when it must not be reused.
    pub fn new(pool: Arc<Pool>, conn: Conn, idle_timeout: Duration) -> Option<Self> {
        (!idle_timeout.is_zero()).then_some(Self {
            pool,
            conn,
            idle_timeout,
        })
    }

    /// Whether the connection goes back to the idle list at the body's end (HTTP/1.1), or
    /// is shared and only its stream ends (HTTP/2).
    pub fn returns_to_pool(&self) -> bool {
        !self.conn.is_h2()
    }

    /// The body ended: back to the pool once hyper is ready for the next request (an HTTP/2
    /// stream just ends: its connection stays shared).
    pub fn finish(mut self, cx: &mut Context<'_>) {
        if matches!(self.conn.sender, Sender::Own(_)) {
            self.pool.put(self.conn, self.idle_timeout);
            return;
        }
        let Sender::H1(sender) = &mut self.conn.sender else {
            return;
        };
        match sender.poll_ready(cx) {
            Poll::Ready(Ok(())) => self.pool.put(self.conn, self.idle_timeout),
            Poll::Ready(Err(_)) => {}
            Poll::Pending => self.finish_later(),
        }
    }

    /// Like `finish`, without a task context.
    pub fn finish_later(mut self) {
        if self.conn.is_h2() {
            return;
        }
        if matches!(self.conn.sender, Sender::Own(_)) {
            self.pool.put(self.conn, self.idle_timeout);
            return;
        }
        tokio::spawn(async move {
            let Sender::H1(sender) = &mut self.conn.sender else {
                return;
            };
            if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(1), sender.ready()).await {
                self.pool.put(self.conn, self.idle_timeout);
            }
        });
    }
}

/// Reads `Keep-Alive: timeout=N` from response headers.
pub fn keepalive_hint(headers: &http::HeaderMap) -> Option<Duration> {
    keepalive_timeout(headers.get(crate::headers::KEEP_ALIVE)?.as_bytes())
}

/// The `timeout=N` of one `Keep-Alive` value (none in a value with a byte that is not
/// visible ASCII, as `HeaderValue::to_str` refuses it).
pub fn keepalive_timeout(value: &[u8]) -> Option<Duration> {
    if !value
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return None;
    }
    let v = std::str::from_utf8(value).ok()?;
    v.split(',').find_map(|part| {
        let (k, v) = part.split_once('=')?;
        if k.trim().eq_ignore_ascii_case("timeout") {
            v.trim()
                .trim_matches('"')
                .parse::<u64>()
                .ok()
                .map(Duration::from_secs)
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_hint_is_parsed() {
        let mut h = http::HeaderMap::new();
        assert_eq!(keepalive_hint(&h), None);
        h.insert("keep-alive", "timeout=5, max=100".parse().unwrap());
        assert_eq!(keepalive_hint(&h), Some(Duration::from_secs(5)));
        h.insert("keep-alive", "max=100,Timeout=\"2\"".parse().unwrap());
        assert_eq!(keepalive_hint(&h), Some(Duration::from_secs(2)));
    }

    #[tokio::test]
    async fn idle_timeout_is_lowered_under_the_keepalive_hint() {
        let pool = Pool::new(PoolConfig::default(), Metrics::new());
        assert_eq!(pool.idle_timeout_for(None), Duration::from_secs(4));
        // Node announces 5 s: keep at most 4 s.
        assert_eq!(
            pool.idle_timeout_for(Some(Duration::from_secs(5))),
            Duration::from_secs(4)
        );
        assert_eq!(
            pool.idle_timeout_for(Some(Duration::from_secs(3))),
            Duration::from_secs(2)
        );
        // timeout=1 or less: do not reuse at all.
        assert_eq!(
            pool.idle_timeout_for(Some(Duration::from_secs(1))),
            Duration::ZERO
        );
        assert_eq!(pool.idle_timeout_for(Some(Duration::ZERO)), Duration::ZERO);
    }
}
