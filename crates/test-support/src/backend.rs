//! A loopback HTTP/1.1 backend that records every request it sees.
//!
//! Paths: `/bytes/N` streams N bytes; `/sleep/MS` answers after MS milliseconds; `/upload`
//! counts the request body; anything else answers `name` with the path.

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
use tokio::task::JoinHandle;

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

/// A running backend; stops when dropped.
pub struct TestBackend {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = BoxBody<Bytes, Infallible>;

impl TestBackend {
    /// Starts a backend named `name` on 127.0.0.1:0; `keep_alive_hint` adds `Keep-Alive: timeout=N`.
    pub async fn start(name: &'static str) -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap(), name).await
    }

    /// Starts on a given address.
    pub async fn start_on(addr: SocketAddr, name: &'static str) -> Self {
        let listener = TcpListener::bind(addr).await.expect("bind backend");
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (s, c) = (seen.clone(), connections.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                c.fetch_add(1, Ordering::Relaxed);
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle(req, name, s.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            seen,
            connections,
            task,
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
}

async fn handle(
    req: Request<Incoming>,
    name: &'static str,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> Result<Response<Body>, Infallible> {
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
    seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path: path.clone(),
        headers: parts.headers,
        body_len,
    });
    let resp = if let Some(n) = path
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
    } else if path == "/upload" {
        text(format!("{body_len}\n"))
    } else {
        text(format!("{name} {path}\n"))
    };
    Ok(resp)
}

fn text(s: String) -> Response<Body> {
    Response::builder()
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from(s)).boxed())
        .unwrap()
}
