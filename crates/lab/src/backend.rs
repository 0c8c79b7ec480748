//! HTTP/1.1 fault backends whose faults switch at run time.
//!
//! A [`Backend`] answers every path with a body that names it, except `/livez`, `/readyz` and
//! `/health`, which report simulated dependencies. Faults apply to requests that arrive after
//! the switch; `Refuse` closes the listener itself so that connects are answered by a RST.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};

mod fault;

pub use fault::{DepState, Fault, FaultParseError, KeepAlive};

/// How long a `slow` dependency makes a health endpoint wait.
const DEP_SLOW_DELAY: Duration = Duration::from_secs(2);

/// A running fault backend on a fixed loopback port.
#[derive(Debug)]
pub struct Backend {
    shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: JoinHandle<()>,
}

#[derive(Debug)]
struct Shared {
    name: String,
    fault: watch::Sender<Fault>,
    keepalive: watch::Sender<KeepAlive>,
    core: watch::Sender<DepState>,
    optional: watch::Sender<DepState>,
    served: AtomicU64,
    accepted: AtomicU64,
    stop: Notify,
}

impl Backend {
    /// Binds `addr` (port 0 picks one) and starts serving as `name`.
    pub async fn start(addr: SocketAddr, name: &str) -> io::Result<Backend> {
        let listener = bind(addr)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            fault: watch::Sender::new(Fault::None),
            keepalive: watch::Sender::new(KeepAlive::default()),
            core: watch::Sender::new(DepState::Up),
            optional: watch::Sender::new(DepState::Up),
            served: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            stop: Notify::new(),
        });
        let acceptor = tokio::spawn(accept_loop(shared.clone(), listener, addr));
        Ok(Backend {
            shared,
            addr,
            acceptor,
        })
    }

    /// The address the backend listens on (kept across `Refuse`).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The name the backend puts in its bodies and in the `x-backend` header.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Switches the fault applied to new requests (and the listener, for `Refuse`).
    pub fn set_fault(&self, fault: Fault) {
        self.shared.fault.send_replace(fault);
    }

    /// The fault in force now.
    pub fn fault(&self) -> Fault {
        self.shared.fault.borrow().clone()
    }

    /// Sets the keep-alive behaviour: close idle connections after `idle_close`, announce `hint`.
    pub fn set_keepalive(&self, idle_close: Option<Duration>, hint: Option<u32>) {
        self.shared
            .keepalive
            .send_replace(KeepAlive { idle_close, hint });
    }

    /// Sets the simulated core and optional dependencies seen by `/readyz` and `/health`.
    pub fn set_deps(&self, core: DepState, optional: DepState) {
        self.shared.core.send_replace(core);
        self.shared.optional.send_replace(optional);
    }

    /// Requests answered so far (any status).
    pub fn served(&self) -> u64 {
        self.shared.served.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Stops accepting and closes the listener; open connections end with their tasks.
    pub async fn shutdown(mut self) {
        self.shared.stop.notify_waiters();
        self.shared.stop.notify_one();
        let acceptor = std::mem::replace(&mut self.acceptor, tokio::spawn(async {}));
        let _ = acceptor.await;
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // Re-opening the same port after `Refuse` must work while old connections sit in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, addr: SocketAddr) {
    let mut fault_rx = shared.fault.subscribe();
    let mut listener = Some(listener);
    loop {
        let refusing = matches!(*fault_rx.borrow_and_update(), Fault::Refuse);
        if refusing {
            // Dropping the listener makes the kernel answer SYNs with RST.
            listener = None;
        } else if listener.is_none() {
            match bind(addr) {
                Ok(l) => listener = Some(l),
                Err(err) => {
                    tracing::warn!(%addr, %err, "backend could not re-open its port");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(20)) => continue,
                        _ = shared.stop.notified() => return,
                    }
                }
            }
        }
        tokio::select! {
            changed = fault_rx.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = shared.stop.notified() => return,
            accepted = accept(listener.as_ref()) => {
                if let Ok((stream, _)) = accepted {
                    shared.accepted.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(serve_connection(shared.clone(), stream));
                }
            }
        }
    }
}

async fn accept(listener: Option<&TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Tracks in-flight requests and the end of the last response for the idle-close timer.
#[derive(Debug, Default)]
struct ConnState {
    in_flight: AtomicU64,
    activity: Notify,
}

async fn serve_connection(shared: Arc<Shared>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    // A second handle on the same socket lets a request turn on SO_LINGER 0 before hyper
    // drops the connection, so the close becomes a RST.
    let linger_handle = match stream.into_std().and_then(|s| {
        let dup = s.try_clone()?;
        Ok((TcpStream::from_std(s)?, dup))
    }) {
        Ok(pair) => pair,
        Err(_) => return,
    };
    let (stream, dup) = linger_handle;
    let dup = Arc::new(dup);
    let conn_state = Arc::new(ConnState::default());
    let svc_shared = shared.clone();
    let svc_conn = conn_state.clone();
    let service = hyper::service::service_fn(move |req| {
        let shared = svc_shared.clone();
        let conn = svc_conn.clone();
        let dup = dup.clone();
        async move {
            conn.in_flight.fetch_add(1, Ordering::SeqCst);
            let resp = handle(&shared, req, &dup).await;
            conn.in_flight.fetch_sub(1, Ordering::SeqCst);
            conn.activity.notify_one();
            Ok::<_, Infallible>(resp)
        }
    });
    let keepalive = *shared.keepalive.borrow();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    let idle = async {
        match keepalive.idle_close {
            // Node closes a keep-alive connection `keepAliveTimeout` after the last response;
            // dropping the connection future closes the socket (FIN) at that moment.
            Some(idle) => idle_timer(&conn_state, idle).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = conn => {}
        _ = idle => {}
        _ = refused(&shared) => {}
    }
}

/// Resolves when the backend starts refusing: a dead process closes its open connections too.
async fn refused(shared: &Shared) {
    let mut rx = shared.fault.subscribe();
    loop {
        if matches!(*rx.borrow_and_update(), Fault::Refuse) {
            return;
        }
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

async fn idle_timer(conn: &ConnState, idle: Duration) {
    loop {
        let deadline = Instant::now() + idle;
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                if conn.in_flight.load(Ordering::SeqCst) == 0 {
                    return;
                }
            }
            _ = conn.activity.notified() => {}
        }
    }
}

/// A response body that may end early with a RST.
type LabBody = http_body_util::Either<Full<Bytes>, ResetBody>;

async fn handle(
    shared: &Shared,
    req: Request<Incoming>,
    dup: &std::net::TcpStream,
) -> Response<LabBody> {
    shared.served.fetch_add(1, Ordering::Relaxed);
    let path = req.uri().path().to_owned();
    // Drain the request body so POSTs behave like real ones; errors only mean the peer left.
    let _ = http_body_util::BodyExt::collect(req.into_body()).await;
    match path.as_str() {
        "/livez" => return text(shared, StatusCode::OK, "alive\n".into()),
        "/readyz" => {
            let core = *shared.core.borrow();
            return dep_response(shared, &[("core", core)]).await;
        }
        "/health" => {
            let core = *shared.core.borrow();
            let optional = *shared.optional.borrow();
            return dep_response(shared, &[("core", core), ("optional", optional)]).await;
        }
        _ => {}
    }
    let fault = shared.fault.borrow().clone();
    match fault {
        Fault::None | Fault::Refuse => ok(shared),
        Fault::Stall => std::future::pending().await,
        Fault::Slow(delay) => {
            tokio::time::sleep(delay).await;
            ok(shared)
        }
        Fault::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            text(shared, status, format!("{} fault {code}\n", shared.name))
        }
        Fault::ResetMidResponse => {
            let _ = socket2::SockRef::from(dup).set_linger(Some(Duration::ZERO));
            let mut resp = Response::new(http_body_util::Either::Right(ResetBody::new(
                Bytes::from(format!("{} partial", shared.name)),
            )));
            decorate(shared, &mut resp);
            resp.headers_mut()
                .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(4096));
            resp
        }
    }
}

async fn dep_response(shared: &Shared, deps: &[(&str, DepState)]) -> Response<LabBody> {
    let mut body = String::new();
    let mut healthy = true;
    for (name, state) in deps {
        match state {
            DepState::Up => {}
            DepState::Slow => tokio::time::sleep(DEP_SLOW_DELAY).await,
            DepState::Down => healthy = false,
        }
        body.push_str(&format!("{name}: {state}\n"));
    }
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    text(shared, status, body)
}

fn ok(shared: &Shared) -> Response<LabBody> {
    text(shared, StatusCode::OK, format!("{}\n", shared.name))
}

fn text(shared: &Shared, status: StatusCode, body: String) -> Response<LabBody> {
    let mut resp = Response::new(http_body_util::Either::Left(Full::new(Bytes::from(body))));
    *resp.status_mut() = status;
    decorate(shared, &mut resp);
    resp
}

fn decorate(shared: &Shared, resp: &mut Response<LabBody>) {
    let headers = resp.headers_mut();
    if let Ok(v) = http::HeaderValue::from_str(&shared.name) {
        headers.insert("x-backend", v);
    }
    if let Some(hint) = shared.keepalive.borrow().hint {
        headers.insert(
            http::header::CONNECTION,
            "keep-alive".parse().expect("static"),
        );
        if let Ok(v) = http::HeaderValue::from_str(&format!("timeout={hint}")) {
            headers.insert("keep-alive", v);
        }
    }
}

/// Sends a first chunk, waits so it reaches the wire, then fails, so hyper drops the socket.
#[derive(Debug)]
pub struct ResetBody {
    first: Option<Bytes>,
    pause: Pin<Box<Sleep>>,
}

impl ResetBody {
    fn new(first: Bytes) -> Self {
        ResetBody {
            first: Some(first),
            pause: Box::pin(tokio::time::sleep(Duration::from_millis(5))),
        }
    }
}

/// The error that ends a [`ResetBody`].
#[derive(Debug, thiserror::Error)]
#[error("reset mid-response (fault)")]
pub struct MidResponseReset;

impl Body for ResetBody {
    type Data = Bytes;
    type Error = MidResponseReset;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, MidResponseReset>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        match self.pause.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(MidResponseReset))),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests;
