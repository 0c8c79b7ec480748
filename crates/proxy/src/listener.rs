//! Downstream listeners: accept, TLS, HTTP/1.1 (behind the strict framing check) or HTTP/2,
//! idle and header-read timeouts, graceful shutdown.

mod balance;
mod framing;
mod h2_resets;
pub(crate) mod h2_stall;
mod limit;
mod tls;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

pub use balance::{Balance, Deliver, Moved};
pub use framing::{check_invariants as framing_invariants, Framer, Refused};
pub use limit::ConnLimit;
pub use tls::acceptor as tls_acceptor;

use crate::body::DownBody;
use crate::config::ListenerConfig;
use crate::proxy::{handle, ConnCtx};
use crate::state::Shared;

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Milliseconds of the coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`: the time of the
/// last timer tick, 1-4 ms behind, read without looking at the hardware clock). A connection
/// notes its activity a few times per request, and its timeouts are seconds long; the
/// precise clock cost three times as much per reading.
fn coarse_ms() -> u64 {
    use nix::time::{clock_gettime, ClockId};
    // Linux has had this clock since 2.6.32; the precise one stands in should it fail.
    clock_gettime(ClockId::CLOCK_MONOTONIC_COARSE)
        .or_else(|_| clock_gettime(ClockId::CLOCK_MONOTONIC))
        .map_or(0, |t| {
            // Both fields are non-negative for a monotonic clock.
            u64::try_from(t.tv_sec()).unwrap_or(0) * 1000
                + u64::try_from(t.tv_nsec()).unwrap_or(0) / 1_000_000
        })
}

/// Activity of one downstream connection, for its idle and header-read timeouts.
pub struct ConnActivity {
    /// When the connection was accepted, on the coarse clock (`coarse_ms`).
    epoch_ms: u64,
    last_ms: AtomicU64,
    head_since_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// Wakes the connection's timer when its deadline may have moved.
    changed: tokio::sync::Notify,
    /// Why the framing check refused a request on this connection (for its log line).
    refusal: std::sync::OnceLock<&'static str>,
    /// The client accepted no response byte for `send_timeout` (for the access log).
    send_timed_out: AtomicBool,
    /// Upgrade outcome and the tunnel that takes the connection over after a `101`.
    pub upgrade: crate::upgrade::ConnUpgrade,
    /// The header read timeout ran out with part of a head received: the next read answers
    /// 408 (HTTP/1) and fails, ending the connection.
    head_timed_out: AtomicBool,
    /// That read found part of an HTTP/1 head held back and answered it `408`.
    head_timeout_answered: AtomicBool,
    /// HTTP/2 streams the codec refused (reset) since the connection's task last logged them.
    refused_streams: std::sync::Mutex<Vec<(crate::error::Cause, &'static str)>>,
    refused_streams_pending: AtomicBool,
}

impl ConnActivity {
    /// A new connection: the header read timeout runs from accept, so a socket that sends
    /// nothing (or half a TLS handshake or HTTP/2 preface) is closed at that timeout.
    fn new() -> Self {
        Self {
            epoch_ms: coarse_ms(),
            last_ms: AtomicU64::new(0),
            head_since_ms: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
            changed: tokio::sync::Notify::new(),
            refusal: std::sync::OnceLock::new(),
            send_timed_out: AtomicBool::new(false),
            upgrade: crate::upgrade::ConnUpgrade::default(),
            head_timed_out: AtomicBool::new(false),
            head_timeout_answered: AtomicBool::new(false),
            refused_streams: std::sync::Mutex::new(Vec::new()),
            refused_streams_pending: AtomicBool::new(false),
        }
    }

    /// A connection's activity for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        Self::new()
    }

    /// Whether the connection was cut at `send_timeout`.
    pub fn send_timed_out(&self) -> bool {
        self.send_timed_out.load(Ordering::Relaxed)
    }

    /// The client accepted no response byte for `send_timeout`: the connection is cut.
    pub(crate) fn note_send_timeout(&self) {
        self.send_timed_out.store(true, Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        coarse_ms().saturating_sub(self.epoch_ms)
    }

    /// Something arrived from the client (the idle clock restarts).
    pub(crate) fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Part of a request head is buffered (the header read timeout runs) or not.
    pub(crate) fn set_head_in_progress(&self, on: bool) {
        let cur = self.head_since_ms.load(Ordering::Relaxed);
        if on && cur == 0 {
            self.head_since_ms
                .store(self.now_ms() + 1, Ordering::Relaxed);
            self.changed.notify_one();
        } else if !on && cur != 0 {
            self.head_since_ms.store(0, Ordering::Relaxed);
            self.changed.notify_one();
        }
    }
}

/// Marks a request in flight on its connection until dropped (with the response body). It
/// holds the request's reference to the connection's context: the request's one count of
/// it, not one for the context and another for the activity.
pub struct InFlight(Arc<ConnCtx>);

impl InFlight {
    /// Starts counting.
    pub fn new(ctx: Arc<ConnCtx>) -> Self {
        ctx.activity.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(ctx)
    }

    /// The connection's context.
    pub fn ctx(&self) -> &Arc<ConnCtx> {
        &self.0
    }

    /// The connection's activity.
    pub fn activity(&self) -> &ConnActivity {
        &self.0.activity
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = self.activity();
        a.touch();
        if a.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            // Now idle: the idle deadline starts counting.
            a.changed.notify_one();
        }
    }
}

/// The downstream stream as hyper's HTTP/1 server reads it: through the framing check.
struct Guarded<IO> {
    io: IO,
    framer: Option<Framer>,
    out: BytesMut,
    scratch: Box<[u8]>,
    activity: Arc<ConnActivity>,
    refused: bool,
    /// HTTP/2 preface bytes still to come; the header read timeout runs until they have.
    preface_left: usize,
    send: SendTimer,
    /// HTTP/2: the server's frames, watched for streams the codec refuses.
    resets: Option<h2_resets::ResetWatch>,
}

impl<IO> Guarded<IO> {
    fn new(
        io: IO,
        framer: Option<Framer>,
        prefix: &[u8],
        activity: Arc<ConnActivity>,
        send_timeout: Duration,
    ) -> Self {
        let h2 = framer.is_none();
        let mut g = Self {
            io,
            framer,
            out: BytesMut::new(),
            scratch: vec![0; 16 * 1024].into_boxed_slice(),
            activity,
            refused: false,
            preface_left: if h2 { H2_PREFACE.len() } else { 0 },
            send: SendTimer::new(send_timeout),
            resets: h2.then(h2_resets::ResetWatch::default),
        };
        // Nothing read yet (TLS): the header read timeout keeps running from accept.
        if !prefix.is_empty() {
            g.take_in(prefix.len(), Some(prefix));
        }
        g
    }

    /// Follows what the server wrote (HTTP/2 only): a stream the codec reset as refused is
    /// noted for the connection's task to log and count.
    fn wrote<'a>(&mut self, written: usize, bufs: impl IntoIterator<Item = &'a [u8]>) {
        let Some(watch) = &mut self.resets else {
            return;
        };
        let activity = &self.activity;
        let mut left = written;
        for b in bufs {
            if left == 0 {
                break;
            }
            let n = left.min(b.len());
            left -= n;
            watch.feed(&b[..n], |code| {
                if let Some(r) = h2_resets::refusal(code) {
                    activity.refused_streams.lock().unwrap().push(r);
                    activity
                        .refused_streams_pending
                        .store(true, Ordering::Release);
                    activity.changed.notify_one();
                }
            });
        }
    }

    fn take_in(&mut self, n: usize, from: Option<&[u8]>) {
        // Not `unwrap_or`: a prefix handed over by the own server may be longer than
        // `scratch`, whose slice would be taken (and panic) even when unused.
        let data = match from {
            Some(d) => d,
            None => &self.scratch[..n],
        };
        match &mut self.framer {
            None => {
                self.out.extend_from_slice(data);
                if self.preface_left > 0 {
                    self.preface_left = self.preface_left.saturating_sub(data.len());
                    if self.preface_left == 0 {
                        self.activity.set_head_in_progress(false);
                    }
                }
            }
            Some(f) => {
                let r = f.feed(data, &mut self.out);
                self.checked(r);
            }
        }
    }

    /// Acts on the framing check's verdict on what it was just given.
    fn checked(&mut self, r: Result<(), Refused>) {
        let Some(f) = &mut self.framer else { return };
        if let Err(Refused(why)) = r {
            tracing::info!(reason = why, "refused a malformed request (400)");
            f.poison(&mut self.out);
            self.refused = true;
            let _ = self.activity.refusal.set(why);
        } else if f.long_target() {
            let _ = self.activity.refusal.set(crate::refused::URI_TOO_LONG);
        }
        self.activity.set_head_in_progress(f.head_in_progress());
    }

    /// After a request that asked for an upgrade: `Ready` once the bytes held since are
    /// released (the outcome is known); `Pending` while more input would only be held past
    /// what one request head may take.
    fn poll_upgrade_outcome(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(f) = &mut self.framer else {
            return Poll::Ready(());
        };
        if !f.awaiting_upgrade() {
            return Poll::Ready(());
        }
        match self.activity.upgrade.poll_decision(cx) {
            Poll::Ready(switched) => {
                let r = f.upgrade_decided(switched, &mut self.out);
                self.checked(r);
                Poll::Ready(())
            }
            Poll::Pending if f.held() >= f.max_head() => Poll::Pending,
            Poll::Pending => Poll::Ready(()),
        }
    }
}

impl<IO: AsyncWrite + Unpin> Guarded<IO> {
    /// The header read timeout ran out: a client that sent part of an HTTP/1 head (held
    /// back by the framing check, so hyper has seen none of it and writes nothing) gets
    /// `408 client_timeout` before the close; one that sent nothing, or an HTTP/2 client,
    /// is closed silently. Best effort: a client that does not read either gets nothing.
    fn answer_head_timeout(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let partial_head = self.framer.as_ref().is_some_and(|f| f.head_in_progress());
        if partial_head
            && !self
                .activity
                .head_timeout_answered
                .swap(true, Ordering::Relaxed)
        {
            let _ = Pin::new(&mut self.io).poll_write(cx, crate::refused::HEAD_TIMEOUT_RESPONSE);
            let _ = Pin::new(&mut self.io).poll_flush(cx);
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no complete request head within header_read_timeout",
        )))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.activity.head_timed_out.load(Ordering::Relaxed) {
            return this.answer_head_timeout(cx);
        }
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out[..n]);
                this.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.refused {
                return Poll::Ready(Ok(()));
            }
            ready!(this.poll_upgrade_outcome(cx));
            if !this.out.is_empty() {
                continue;
            }
            let mut rb = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                return Poll::Ready(Ok(()));
            }
            this.activity.touch();
            this.take_in(n, None);
        }
    }
}

/// `send_timeout`: a write the client does not accept for this long fails the connection
/// (nginx's `send_timeout`, between two successive writes).
struct SendTimer {
    limit: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
}

impl SendTimer {
    fn new(limit: Duration) -> Self {
        Self {
            limit,
            timer: None,
            armed: false,
        }
    }

    /// Passes a write's outcome through; a write pending for `limit` becomes an error.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<T>>,
        activity: &ConnActivity,
    ) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.armed = false;
            return r;
        }
        if !self.armed {
            self.armed = true;
            let at = Instant::now() + self.limit;
            match &mut self.timer {
                Some(t) => t.as_mut().reset(at),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        match self.timer.as_mut().map(|t| t.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => {
                activity.send_timed_out.store(true, Ordering::Relaxed);
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client accepted no response byte for send_timeout",
                )))
            }
            _ => Poll::Pending,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // No activity stamp on writes: a response is written while its request is in
        // flight, when the idle clock does not run, and `InFlight` stamps its end.
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.wrote(n, [buf]);
        }
        this.send.check(cx, r, &this.activity)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        // One plain write where it can (`crate::h1::poll_write_gathered`).
        let r = crate::h1::poll_write_gathered(Pin::new(&mut this.io), cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            this.wrote(n, bufs.iter().map(|b| &**b));
        }
        this.send.check(cx, r, &this.activity)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.send.check(cx, r, &this.activity)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Signals shared by the accept loops and connections.
#[derive(Clone)]
pub struct Signals {
    /// Becomes true when listeners must stop accepting.
    pub stop_accepting: watch::Receiver<bool>,
    /// Becomes true when connections must close once idle.
    pub close_idle: watch::Receiver<bool>,
}

/// A listener's settings and TLS acceptor as of the last reload: each new connection takes
/// the current ones, an established connection keeps those it started with.
pub struct Live {
    /// Settings.
    pub cfg: Arc<ListenerConfig>,
    /// TLS acceptor (certificate and key read at start or at the last reload).
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Accepts connections until told to stop; connections are tracked by `tracker`. On a
/// serving thread with a `balance`, a connection goes to a less busy worker when this one
/// serves more than its share (`balance`).
pub async fn accept_loop(
    listener: TcpListener,
    live: Arc<arc_swap::ArcSwap<Live>>,
    shared: Arc<Shared>,
    signals: Signals,
    tracker: TaskTracker,
    balance: Option<Arc<Balance>>,
) {
    let mut stop = signals.stop_accepting.clone();
    let addr = live.load().cfg.listen;
    let limit = listener
        .local_addr()
        .map_or_else(|_| Arc::new(ConnLimit::default()), ConnLimit::of);
    let me = crate::pool::worker();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, remote)) => {
                    let cur = live.load();
                    let (cfg, signals, tls) = (cur.cfg.clone(), signals.clone(), cur.tls.clone());
                    let Some(slot) = limit.try_open(cfg.max_connections) else {
                        if let Some(r) = limit.try_refuse() {
                            tracker.spawn(limit::refuse(stream, cfg, shared.clone(), tls, r));
                        } else {
                            shared.metrics.connections_refused.inc();
                        }
                        continue;
                    };
                    let Some(b) = &balance else {
                        tracker.spawn(serve(stream, remote, cfg, shared.clone(), signals, tls, slot, None));
                        continue;
                    };
                    let to = b.pick(me);
                    if to != me {
                        match stream.into_std() {
                            Ok(std) => {
                                let m = Moved { stream: std, remote, cfg, tls, signals, slot, on: b.open_on(to) };
                                if let Err(mut m) = b.deliver(to, m) {
                                    // That worker is shutting down: serve it here.
                                    m.on = b.open_on(me);
                                    serve_moved(m, &shared, &tracker);
                                }
                            }
                            Err(e) => tracing::debug!(error = %e, "accepted connection could not be moved"),
                        }
                        continue;
                    }
                    let on = b.open_on(me);
                    tracker.spawn(serve(stream, remote, cfg, shared.clone(), signals, tls, slot, Some(on)));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
        }
    }
    tracing::info!(listener = %addr, "stopped accepting");
}

/// Serves a connection another worker accepted (`balance`) on this thread's runtime.
pub fn serve_moved(m: Moved, shared: &Arc<Shared>, tracker: &TaskTracker) {
    let Moved {
        stream,
        remote,
        cfg,
        tls,
        signals,
        slot,
        on,
    } = m;
    match TcpStream::from_std(stream) {
        Ok(stream) => {
            tracker.spawn(serve(
                stream,
                remote,
                cfg,
                shared.clone(),
                signals,
                tls,
                slot,
                Some(on),
            ));
        }
        Err(e) => tracing::warn!(error = %e, "moved connection could not join this worker"),
    }
}

/// A connection served until it ends, counted on the open-connections gauge, against the
/// listener's limit (`slot`) and against its serving thread (`on`) meanwhile.
#[allow(clippy::too_many_arguments)]
async fn serve(
    stream: TcpStream,
    remote: SocketAddr,
    cfg: Arc<ListenerConfig>,
    shared: Arc<Shared>,
    signals: Signals,
    tls: Option<tokio_rustls::TlsAcceptor>,
    slot: limit::ConnSlot,
    on: Option<balance::OnWorker>,
) {
    let _slot = slot;
    let _on = on;
    // A guard: even a connection task that panics takes itself off the gauge.
    let _open = crate::metrics::GaugeGuard::new(&shared.metrics.downstream_open);
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(ConnActivity::new());
    activity.upgrade.watch_shutdown(signals.close_idle.clone());
    let keepalive = http::HeaderValue::from_str(&format!("timeout={}", cfg.idle_timeout.as_secs()))
        .unwrap_or(http::HeaderValue::from_static("timeout=0"));
    let local = stream.local_addr().unwrap_or(cfg.listen);
    let ctx = Arc::new(ConnCtx {
        shared,
        listener: cfg.clone(),
        remote,
        local,
        tls: tls.is_some(),
        activity: activity.clone(),
        keepalive,
        client_ip: crate::headers::client_ip_value(remote),
    });
    match tls {
        // Boxed: held inline, the TLS session's state would be part of every connection
        // task's memory, plain ones included.
        Some(acceptor) => Box::pin(serve_tls(stream, acceptor, ctx, signals)).await,
        None => {
            let mut stream = stream;
            let mut prefix = Vec::with_capacity(H2_PREFACE.len());
            // Enough bytes to tell an HTTP/2 preface from an HTTP/1 request line.
            let sniff = async {
                let mut buf = [0u8; 24];
                while prefix.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(&prefix) {
                    let n = stream
                        .read(&mut buf[..H2_PREFACE.len() - prefix.len()])
                        .await?;
                    if n == 0 {
                        break;
                    }
                    prefix.extend_from_slice(&buf[..n]);
                }
                io::Result::Ok(())
            };
            // The header read timeout runs from accept: a silent socket, or one that sends
            // half a preface, is closed at it.
            match tokio::time::timeout(cfg.header_read_timeout, sniff).await {
                Ok(Ok(())) if !prefix.is_empty() => {}
                Err(_) => {
                    count_timeout(&ctx.shared, "header_read");
                    return;
                }
                _ => return,
            }
            activity.touch();
            let h2 = prefix == H2_PREFACE;
            serve_proto(stream, h2, &prefix, ctx, signals).await;
        }
    }
}

/// Accepts TLS on a connection, then serves it.
async fn serve_tls(
    stream: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    ctx: Arc<ConnCtx>,
    signals: Signals,
) {
    let tls_stream =
        match tokio::time::timeout(ctx.listener.header_read_timeout, acceptor.accept(stream)).await
        {
            Ok(Ok(s)) => s,
            Err(_) => {
                count_timeout(&ctx.shared, "header_read");
                return;
            }
            Ok(Err(_)) => return,
        };
    let h2 = tls_stream.get_ref().1.alpn_protocol() == Some(b"h2");
    serve_proto(tls_stream, h2, &[], ctx, signals).await;
}

trait GracefulConn: Future<Output = Result<(), hyper::Error>> {
    fn graceful(self: Pin<&mut Self>);
}

impl<I, S> GracefulConn for hyper::server::conn::http1::Connection<I, S>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::ResBody: http_body::Body + 'static,
    <S::ResBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S> GracefulConn for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::ResBody: http_body::Body + 'static,
    <S::ResBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I> GracefulConn for crate::h2server::H2Conn<I>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    fn graceful(self: Pin<&mut Self>) {
        self.get_mut().graceful_shutdown();
    }
}

async fn serve_proto<IO>(io: IO, h2: bool, prefix: &[u8], ctx: Arc<ConnCtx>, mut signals: Signals)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // HTTP/1: upkeep's own server, until a request it hands over to hyper (below) with the
    // bytes it has read.
    let handed;
    let (io, prefix) = if h2 {
        (io, prefix)
    } else {
        match crate::h1::server::serve(io, prefix, &ctx, &mut signals).await {
            crate::h1::server::Outcome::Closed => return,
            crate::h1::server::Outcome::HandOver(io, buffered) => {
                handed = buffered;
                (io, &handed[..])
            }
        }
    };
    // Boxed: held inline, hyper's connection state (with its request handler's) would be part
    // of every connection task's memory, own-server connections that never use it included.
    Box::pin(serve_hyper(io, h2, prefix, ctx, signals)).await;
}

/// Serves the rest of a connection with hyper (HTTP/2, or HTTP/1 handed over by the own
/// server), behind the framing check.
async fn serve_hyper<IO>(io: IO, h2: bool, prefix: &[u8], ctx: Arc<ConnCtx>, signals: Signals)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let cfg = ctx.listener.clone();
    let activity = ctx.activity.clone();
    let framer = (!h2).then(|| Framer::new(cfg.max_header_bytes));
    let io = Guarded::new(io, framer, prefix, activity.clone(), cfg.send_timeout);
    let conn_ctx = ctx.clone();
    if h2 {
        // Each stream's task is watched for a client that grants no window (send_timeout).
        let exec = h2_stall::StreamExec::new(cfg.send_timeout, conn_ctx.shared.clone());
        let conn = crate::h2server::H2Conn::new(io, ctx, exec);
        drive(conn, &conn_ctx, &cfg, signals).await;
    } else {
        let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            handle(req.map(DownBody::Hyper), ctx.clone())
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .max_buf_size(cfg.max_header_bytes.max(8192) + 16 * 1024)
            .max_header_size(cfg.max_header_bytes)
            .keep_alive(true)
            .serve_connection(TokioIo::new(io), svc)
            .with_upgrades();
        drive(conn, &conn_ctx, &cfg, signals).await;
    }
}

/// Counts one timeout of the kind named.
pub(crate) fn count_timeout(shared: &Shared, timeout: &'static str) {
    shared
        .metrics
        .timeouts
        .get_or_create(&crate::metrics::TimeoutLabel { timeout })
        .inc();
}

/// Runs a connection with its timeouts: idle (no request in flight, nothing received) closes
/// it gracefully; a request head not complete within the header read timeout drops it.
async fn drive<C: GracefulConn>(
    conn: C,
    ctx: &ConnCtx,
    cfg: &ListenerConfig,
    mut signals: Signals,
) {
    let activity = &*ctx.activity;
    let shared = &*ctx.shared;
    tokio::pin!(conn);
    // Told to close (shutdown, upgrade, a removed listener): closing a connection at once
    // races the request its client may be sending on it right then. So a connection closes
    // after its next response (`Connection: close`) once a request is under way; one whose
    // request head is still arriving (a fresh one included) waits for that request, up to
    // the header read timeout; an idle keep-alive one closes once it has been quiet for
    // `CLOSE_QUIET` (clients that send often send on it first and are answered).
    let mut close_pending = *signals.close_idle.borrow();
    let mut closing = false;
    loop {
        log_refused_streams(ctx);
        if close_pending && !closing && may_close(activity, cfg) {
            closing = true;
            conn.as_mut().graceful();
        }
        let mut wait = next_deadline(activity, cfg);
        if close_pending && !closing {
            wait = wait.map(|w| w.min(Duration::from_millis(50)));
        }
        tokio::select! {
            r = conn.as_mut() => {
                log_refused_streams(ctx);
                if let Err(e) = r {
                    tracing::debug!(error = %e, "downstream connection ended with an error");
                    // hyper answered a request it could not parse (400, 414, 431) itself.
                    let refusal = activity.refusal.get().copied();
                    if let Some((cause, reason)) = crate::refused::classify(&e, refusal) {
                        crate::refused::record(&ctx.shared, ctx.remote, "HTTP/1.1", cause, reason);
                    }
                }
                if activity.send_timed_out() {
                    count_timeout(shared, "send");
                }
                // After a relayed `101` the connection is the tunnel's.
                if let Some(tunnel) = activity.upgrade.take_tunnel() {
                    tunnel.run().await;
                }
                return;
            }
            _ = activity.changed.notified() => {}
            _ = async { let _ = signals.close_idle.wait_for(|s| *s).await; }, if !closing && !close_pending => {
                close_pending = true;
            }
            _ = tokio::time::sleep(wait.unwrap_or(Duration::from_secs(3600))) => {
                if wait.is_some() {
                    match expired(activity, cfg) {
                        Some(Expired::Idle) if !closing => {
                            closing = true;
                            conn.as_mut().graceful();
                        }
                        Some(Expired::HeadTimeout) => {
                            count_timeout(shared, "header_read");
                            head_timed_out(conn.as_mut(), ctx).await;
                            return;
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

/// Logs and counts the HTTP/2 streams the codec refused since the last call.
fn log_refused_streams(ctx: &ConnCtx) {
    if !ctx
        .activity
        .refused_streams_pending
        .swap(false, Ordering::AcqRel)
    {
        return;
    }
    let refused = std::mem::take(&mut *ctx.activity.refused_streams.lock().unwrap());
    for (cause, reason) in refused {
        crate::refused::record(&ctx.shared, ctx.remote, "HTTP/2", cause, Some(reason));
    }
}

/// Ends a connection whose request head did not complete in time: its next read answers
/// `408` if part of an HTTP/1 head came (logged and counted like every refused request) and
/// fails; hyper then ends the connection, given a second at most to close it cleanly.
async fn head_timed_out<C: GracefulConn>(conn: Pin<&mut C>, ctx: &ConnCtx) {
    ctx.activity.head_timed_out.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
    if ctx.activity.head_timeout_answered.load(Ordering::Relaxed) {
        crate::refused::record(
            &ctx.shared,
            ctx.remote,
            "HTTP/1.1",
            crate::error::Cause::ClientTimeout,
            Some("header_read_timeout"),
        );
    }
}

/// Which of a connection's own timers ran out.
pub(crate) enum Expired {
    /// The idle timeout.
    Idle,
    /// The header read timeout.
    HeadTimeout,
}

/// How long a keep-alive connection told to close must have been quiet before it is closed.
const CLOSE_QUIET: Duration = Duration::from_secs(1);

/// Whether a connection told to close can be closed without racing its client: a request is
/// under way (closed after its response), or it is idle and has been quiet for
/// `CLOSE_QUIET` (or its own idle timeout, if shorter).
pub(crate) fn may_close(a: &ConnActivity, cfg: &ListenerConfig) -> bool {
    if a.in_flight.load(Ordering::Relaxed) > 0 {
        return true;
    }
    if a.head_since_ms.load(Ordering::Relaxed) != 0 {
        return false;
    }
    let quiet = a.now_ms().saturating_sub(a.last_ms.load(Ordering::Relaxed));
    quiet >= CLOSE_QUIET.min(cfg.idle_timeout).as_millis() as u64
}

/// The timer of `a` that has run out, if one has.
pub(crate) fn expired(a: &ConnActivity, cfg: &ListenerConfig) -> Option<Expired> {
    if a.in_flight.load(Ordering::Relaxed) > 0 {
        return None;
    }
    let now = a.now_ms();
    let head = a.head_since_ms.load(Ordering::Relaxed);
    if head != 0 {
        return (now + 1 >= head + cfg.header_read_timeout.as_millis() as u64)
            .then_some(Expired::HeadTimeout);
    }
    (now >= a.last_ms.load(Ordering::Relaxed) + cfg.idle_timeout.as_millis() as u64)
        .then_some(Expired::Idle)
}

/// How long until one of the timers of `a` may run out.
pub(crate) fn next_deadline(a: &ConnActivity, cfg: &ListenerConfig) -> Option<Duration> {
    if a.in_flight.load(Ordering::Relaxed) > 0 {
        // Re-check after a while; the request's own timeouts bound it meanwhile.
        return Some(
            cfg.header_read_timeout
                .min(cfg.idle_timeout)
                .max(Duration::from_millis(10)),
        );
    }
    let now = a.now_ms();
    let head = a.head_since_ms.load(Ordering::Relaxed);
    let due = if head != 0 {
        head - 1 + cfg.header_read_timeout.as_millis() as u64
    } else {
        a.last_ms.load(Ordering::Relaxed) + cfg.idle_timeout.as_millis() as u64
    };
    Some(Duration::from_millis(due.saturating_sub(now).max(10)))
}
