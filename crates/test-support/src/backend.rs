//! A loopback HTTP/1.1 backend that records every request it sees, and can refuse
//! connections (listener closed, so connects get RST) or close idle keep-alive connections
//! like Node does.
//!
//! Paths: `/bytes/N` streams N bytes; `/sleep/MS` answers after MS milliseconds; `/upload`
//! counts the request body; `/status/N` answers status N; anything else answers `name path`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// One request as the backend saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers.
    pub headers: HeaderMap,
    /// Body bytes received.
    pub body_len: u64,
}

/// Keep-alive behaviour: close a connection idle this long; announce `Keep-Alive: timeout=N`.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeepAlive {
    /// Close after this much idle time (none: never).
    pub idle_close: Option<Duration>,
    /// Announce this hint on every response.
    pub hint_secs: Option<u32>,
}

struct Inner {
    name: &'static str,
    seen: Mutex<Vec<Seen>>,
    connections: AtomicUsize,
    keepalive: Mutex<KeepAlive>,
}

/// A running backend; stops when dropped.
pub struct TestBackend {
    addr: SocketAddr,
    inner: Arc<Inner>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap().take() {
            t.abort();
        }
    }
}

type Body = BoxBody<Bytes, Infallible>;

impl TestBackend {
    /// Starts a backend named `name` on 127.0.0.1:0.
    pub async fn start(name: &'static str) -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap(), name).await
    }

    /// Starts on a given address.
    pub async fn start_on(addr: SocketAddr, name: &'static str) -> Self {
        let listener = TcpListener::bind(addr).await.expect("bind backend");
        let addr = listener.local_addr().unwrap();
        let inner = Arc::new(Inner {
            name,
            seen: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
            keepalive: Mutex::new(KeepAlive::default()),
        });
        let task = tokio::spawn(accept(listener, inner.clone()));
        Self {
            addr,
            inner,
            task: Mutex::new(Some(task)),
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.inner.seen.lock().unwrap().clone()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.inner.connections.load(Ordering::Relaxed)
    }

    /// Sets keep-alive behaviour for new responses and idle periods.
    pub fn set_keepalive(&self, ka: KeepAlive) {
        *self.inner.keepalive.lock().unwrap() = ka;
    }

    /// Closes the listener and every open connection: connects now get RST.
    pub fn refuse(&self) {
        if let Some(t) = self.task.lock().unwrap().take() {
            t.abort();
        }
    }

    /// Listens again on the same address.
    pub async fn resume(&self) {
        let start = Instant::now();
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if start.elapsed() < Duration::from_secs(5) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => panic!("re-bind {}: {e}", self.addr),
            }
        };
        *self.task.lock().unwrap() = Some(tokio::spawn(accept(listener, self.inner.clone())));
    }
}

async fn accept(listener: TcpListener, inner: Arc<Inner>) {
    // Connections live in this set, so aborting the accept task closes them too.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((stream, _)) = r else { continue };
                inner.connections.fetch_add(1, Ordering::Relaxed);
                conns.spawn(serve(stream, inner.clone()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

struct ConnState {
    in_flight: AtomicUsize,
    last_done: Mutex<Instant>,
}

async fn serve(stream: tokio::net::TcpStream, inner: Arc<Inner>) {
    let state = Arc::new(ConnState {
        in_flight: AtomicUsize::new(0),
        last_done: Mutex::new(Instant::now()),
    });
    let (i, s) = (inner.clone(), state.clone());
    let svc = service_fn(move |req| {
        let (i, s) = (i.clone(), s.clone());
        async move {
            s.in_flight.fetch_add(1, Ordering::Relaxed);
            let r = handle(req, &i).await;
            *s.last_done.lock().unwrap() = Instant::now();
            s.in_flight.fetch_sub(1, Ordering::Relaxed);
            r
        }
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    loop {
        let idle = inner.keepalive.lock().unwrap().idle_close;
        let wake = match idle {
            Some(d) => *state.last_done.lock().unwrap() + d,
            None => Instant::now() + Duration::from_secs(3600),
        };
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = tokio::time::sleep_until(wake) => {
                let idle_for = state.last_done.lock().unwrap().elapsed();
                if idle.is_some_and(|d| idle_for >= d) && state.in_flight.load(Ordering::Relaxed) == 0 {
                    // Like Node: the socket is closed when its idle timer fires.
                    return;
                }
            }
        }
    }
}

async fn handle(req: Request<Incoming>, inner: &Inner) -> Result<Response<Body>, Infallible> {
    let (parts, mut body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/".to_owned(), |p| p.to_string());
    let mut body_len = 0u64;
    while let Some(Ok(f)) = body.frame().await {
        if let Some(d) = f.data_ref() {
            body_len += d.len() as u64;
        }
    }
    inner.seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path: path.clone(),
        headers: parts.headers,
        body_len,
    });
    let name = inner.name;
    let mut resp = if let Some(n) = path
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<u64>().ok())
    {
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        let chunks = n / chunk.len() as u64;
        let rest = (n % chunk.len() as u64) as usize;
        let s = stream::iter(
            (0..chunks)
                .map(move |_| Ok::<_, Infallible>(Frame::data(chunk.clone())))
                .chain(std::iter::once(Ok(Frame::data(Bytes::from(vec![
                    b'x';
                    rest
                ]))))),
        );
        Response::builder()
            .header("content-length", n)
            .body(BodyExt::boxed(StreamBody::new(s)))
            .unwrap()
    } else if let Some(ms) = path
        .strip_prefix("/sleep/")
        .and_then(|n| n.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        text(format!("{name} slept {ms}\n"))
    } else if let Some(code) = path
        .strip_prefix("/status/")
        .and_then(|n| n.parse::<u16>().ok())
    {
        let mut r = text(format!("{name} status {code}\n"));
        *r.status_mut() = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::OK);
        r
    } else if path == "/upload" {
        text(format!("{body_len}\n"))
    } else {
        text(format!("{name} {path}\n"))
    };
    if let Some(h) = inner.keepalive.lock().unwrap().hint_secs {
        resp.headers_mut()
            .insert("keep-alive", format!("timeout={h}").parse().unwrap());
    }
    Ok(resp)
}

fn text(s: String) -> Response<Body> {
    Response::builder()
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from(s)).boxed())
        .unwrap()
}
