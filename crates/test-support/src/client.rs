//! Clients for tests: a plain HTTP/1.1 request helper and a raw-bytes exchange.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response read whole.
#[derive(Debug)]
pub struct Reply {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Reply {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// GET `path` with `host` on a new connection.
pub async fn get(addr: SocketAddr, host: &str, path: &str) -> Reply {
    try_get(addr, host, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"))
}

/// Sends one request on a new HTTP/1.1 connection and reads the whole response.
pub async fn send<B>(addr: SocketAddr, req: Request<B>) -> Reply
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    try_send(addr, req)
        .await
        .unwrap_or_else(|e| panic!("request to {addr}: {e}"))
}

/// [`get`], with a failure (nothing listening yet, the connection closed) as an error.
pub async fn try_get(addr: SocketAddr, host: &str, path: &str) -> Result<Reply, String> {
    let req = Request::get(path)
        .header("host", host)
        .body(Empty::<Bytes>::new())
        .unwrap();
    try_send(addr, req).await
}

/// Whether `path` on `addr` answers 200 now: for waiting until a server is up. Any failure
/// says no, including a connection that seemed to open with nothing listening (a loopback
/// connect can meet itself when the port it is given is the one it dials).
pub async fn answers_ok(addr: SocketAddr, host: &str, path: &str) -> bool {
    try_get(addr, host, path)
        .await
        .is_ok_and(|r| r.status == StatusCode::OK)
}

/// [`send`], with what failed as an error.
pub async fn try_send<B>(addr: SocketAddr, req: Request<B>) -> Result<Reply, String>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let resp = tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
        .await
        .map_err(|_| "no response in 30 s".to_string())?
        .map_err(|e| format!("response: {e}"))?;
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// Writes raw bytes, then reads until the server closes or `wait` passes; returns what came back.
pub async fn raw_exchange(addr: SocketAddr, bytes: &[u8], wait: Duration) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

/// GET `path` and count the body bytes as they stream, without keeping them.
pub async fn get_counting(addr: SocketAddr, path: &str) -> (StatusCode, u64) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "test")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.expect("response");
    let status = resp.status();
    let mut body = resp.into_body();
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        if let Some(d) = frame.expect("body frame").data_ref() {
            n += d.len() as u64;
        }
    }
    (status, n)
}
