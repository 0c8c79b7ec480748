//! HTTP/2 backends and an HTTP/2 client for the proxy's tests, on loopback port 0.
//!
//! - [`H2Backend`]: hyper's HTTP/2 server (h2c, prior knowledge); counts accepted
//!   connections and the most requests it had in flight at once. `/sleep/MS` answers after MS
//!   milliseconds; anything else answers at once; every answer carries a trailer `x-sum: 42`.
//! - [`GoawayBackend`]: a frame-level HTTP/2 server. On its first connection it waits until
//!   `expect` requests have arrived, answers stream 1 and sends GOAWAY with last-stream-id 1
//!   (so every other stream was not processed); later connections answer every stream once
//!   its request has ended, and keep its body. [`GoawayBackend::start_refusing`]: the first
//!   connection resets every stream with `REFUSED_STREAM` instead.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What an HTTP/2 backend saw.
#[derive(Default)]
pub struct Stats {
    /// Connections accepted.
    pub connections: AtomicUsize,
    /// Requests being answered now.
    pub in_flight: AtomicUsize,
    /// Most requests in flight at once.
    pub max_in_flight: AtomicUsize,
    /// Request heads seen, in arrival order.
    pub heads: Mutex<Vec<(http::Method, http::Uri, HeaderMap)>>,
}

/// hyper's HTTP/2 server on 127.0.0.1:0; stops when dropped.
pub struct H2Backend {
    /// Its address.
    pub addr: SocketAddr,
    /// What it saw.
    pub stats: Arc<Stats>,
    task: JoinHandle<()>,
}

impl Drop for H2Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type RespBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn answer(
    req: Request<Incoming>,
    stats: Arc<Stats>,
) -> Result<Response<RespBody>, Infallible> {
    let now = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    stats.max_in_flight.fetch_max(now, Ordering::SeqCst);
    stats.heads.lock().unwrap().push((
        req.method().clone(),
        req.uri().clone(),
        req.headers().clone(),
    ));
    let path = req.uri().path().to_owned();
    let _ = req.into_body().collect().await;
    if let Some(ms) = path.strip_prefix("/sleep/").and_then(|m| m.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    stats.in_flight.fetch_sub(1, Ordering::SeqCst);
    let mut trailers = HeaderMap::new();
    trailers.insert("x-sum", "42".parse().unwrap());
    let frames = vec![
        Ok::<_, Infallible>(Frame::data(Bytes::from(format!("h2 {path}")))),
        Ok(Frame::trailers(trailers)),
    ];
    let body = StreamBody::new(futures_util::stream::iter(frames));
    Ok(Response::new(BodyExt::boxed(body)))
}

impl H2Backend {
    /// Starts the backend.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(Stats::default());
        let s = stats.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                s.connections.fetch_add(1, Ordering::SeqCst);
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(req, s.clone()));
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .timer(TokioTimer::new())
                        .serve_connection(TokioIo::new(sock), svc)
                        .await;
                });
            }
        });
        Self { addr, stats, task }
    }
}

/// A frame-level HTTP/2 server that refuses streams with GOAWAY (see the module comment).
pub struct GoawayBackend {
    /// Its address.
    pub addr: SocketAddr,
    /// Stream ids answered, per connection in accept order.
    pub answered: Arc<Mutex<Vec<Vec<u32>>>>,
    /// Request bodies of the streams answered on later connections.
    pub bodies: Arc<Mutex<Vec<Vec<u8>>>>,
    task: JoinHandle<()>,
}

impl Drop for GoawayBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// `:status: 200` (HPACK static index 8), END_HEADERS | END_STREAM.
fn ok_headers(stream: u32) -> Vec<u8> {
    frame(0x1, 0x4 | 0x1, stream, &[0x88])
}

async fn read_frame(sock: &mut TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    sock.read_exact(&mut head).await.ok()?;
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    sock.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], stream, payload))
}

impl GoawayBackend {
    /// Starts the backend; its first connection waits for `expect` requests (at most 3 s).
    pub async fn start(expect: usize) -> Self {
        Self::start_mode(expect, false).await
    }

    /// Starts the backend; its first connection refuses every stream with `REFUSED_STREAM`.
    pub async fn start_refusing() -> Self {
        Self::start_mode(0, true).await
    }

    async fn start_mode(expect: usize, refuse: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let answered: Arc<Mutex<Vec<Vec<u32>>>> = Arc::default();
        let bodies: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let a = answered.clone();
        let bs = bodies.clone();
        let task = tokio::spawn(async move {
            let mut first = true;
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let index = {
                    let mut a = a.lock().unwrap();
                    a.push(Vec::new());
                    a.len() - 1
                };
                let goaway = std::mem::replace(&mut first, false);
                let a = a.clone();
                let bs = bs.clone();
                tokio::spawn(async move {
                    let (goaway_after, refusing) = match (goaway, refuse) {
                        (true, false) => (Some(expect), false),
                        (true, true) => (None, true),
                        (false, _) => (None, false),
                    };
                    let _ = serve_raw(sock, goaway_after, refusing, index, a, bs).await;
                });
            }
        });
        Self {
            addr,
            answered,
            bodies,
            task,
        }
    }
}

async fn serve_raw(
    mut sock: TcpStream,
    goaway_after: Option<usize>,
    refusing: bool,
    index: usize,
    answered: Arc<Mutex<Vec<Vec<u32>>>>,
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
) -> Option<()> {
    let mut pending: std::collections::HashMap<u32, Vec<u8>> = Default::default();
    let mut preface = [0u8; 24];
    sock.read_exact(&mut preface).await.ok()?;
    assert_eq!(&preface[..], PREFACE);
    sock.write_all(&frame(0x4, 0, 0, &[])).await.ok()?;
    let mut streams = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let next = match goaway_after {
            Some(n) if streams.len() < n => {
                tokio::time::timeout_at(deadline, read_frame(&mut sock))
                    .await
                    .unwrap_or_default()
            }
            Some(_) => None,
            None => read_frame(&mut sock).await,
        };
        let Some((kind, flags, stream, payload)) = next else {
            if goaway_after.is_none() || streams.is_empty() {
                return None;
            }
            // Every expected request is here: answer the first stream and refuse the rest.
            let first = streams[0];
            sock.write_all(&ok_headers(first)).await.ok()?;
            answered.lock().unwrap()[index].push(first);
            let mut payload = first.to_be_bytes().to_vec();
            payload.extend_from_slice(&0u32.to_be_bytes()); // NO_ERROR
            sock.write_all(&frame(0x7, 0, 0, &payload)).await.ok()?;
            // Read on (and drop) until the client closes, so it reads the GOAWAY cleanly.
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                while read_frame(&mut sock).await.is_some() {}
            })
            .await;
            return Some(());
        };
        match kind {
            // SETTINGS without ACK: acknowledge.
            0x4 if flags & 0x1 == 0 => sock.write_all(&frame(0x4, 0x1, 0, &[])).await.ok()?,
            // PING: answer it.
            0x6 if flags & 0x1 == 0 => sock.write_all(&frame(0x6, 0x1, 0, &payload)).await.ok()?,
            // HEADERS: a request; DATA: its body. Answered once the request ended.
            0x1 | 0x0 => {
                if refusing {
                    if kind == 0x1 {
                        // RST_STREAM, error code 7 (REFUSED_STREAM); its DATA is dropped.
                        sock.write_all(&frame(0x3, 0, stream, &7u32.to_be_bytes()))
                            .await
                            .ok()?;
                    }
                    continue;
                }
                if kind == 0x1 {
                    streams.push(stream);
                    pending.insert(stream, Vec::new());
                } else if let Some(b) = pending.get_mut(&stream) {
                    b.extend_from_slice(&payload);
                }
                if goaway_after.is_none() && flags & 0x1 != 0 {
                    let body = pending.remove(&stream).unwrap_or_default();
                    sock.write_all(&ok_headers(stream)).await.ok()?;
                    answered.lock().unwrap()[index].push(stream);
                    bodies.lock().unwrap().push(body);
                }
            }
            _ => {}
        }
    }
}

/// An HTTP/2 (h2c prior knowledge) client connection to `addr`.
pub async fn h2_client(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let sock = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .handshake(TokioIo::new(sock))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

/// An HTTP/2 server that completes the handshake, then never answers anything again (no
/// response, no PING acknowledgement): a peer that hangs with its socket open.
pub async fn silent_backend() -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut preface = [0u8; 24];
                if sock.read_exact(&mut preface).await.is_err() {
                    return;
                }
                let _ = sock.write_all(&frame(0x4, 0, 0, &[])).await;
                while let Some((kind, flags, _, _)) = read_frame(&mut sock).await {
                    if kind == 0x4 && flags & 0x1 == 0 {
                        let _ = sock.write_all(&frame(0x4, 0x1, 0, &[])).await;
                    }
                }
            });
        }
    });
    (addr, task)
}
