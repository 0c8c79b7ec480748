//! A loopback backend on raw TCP: records each request head exactly as it arrived (every
//! header line, in order, with its case) and the body bytes it got, and answers with a
//! canned response (or one chosen per request). For tests that assert what is on the wire,
//! not what a parser made of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One request as it arrived.
#[derive(Clone, Debug)]
pub struct RawSeen {
    /// The request line and header lines, without the blank line.
    pub head: String,
    /// Body bytes received (de-chunked when chunked).
    pub body: Vec<u8>,
    /// The body ended as its framing said (false when the connection was cut inside it).
    pub complete: bool,
    /// Every byte of the request exactly as it arrived: head, blank line, body with its
    /// chunk framing and trailer section.
    pub wire: Vec<u8>,
}

/// What the backend answers to one request.
pub struct Reply {
    /// The raw response bytes.
    pub bytes: Vec<u8>,
    /// Close the connection after them.
    pub close: bool,
}

/// Chooses the reply to each request.
pub type Answer = Arc<dyn Fn(&RawSeen) -> Reply + Send + Sync>;

impl RawSeen {
    /// The request line.
    pub fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or("")
    }

    /// Every value of header `name` (any case), one per line it was sent on.
    pub fn values(&self, name: &str) -> Vec<String> {
        self.head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
            .collect()
    }

    /// The one value of header `name`; panics when it is missing or repeated.
    pub fn value(&self, name: &str) -> String {
        let v = self.values(name);
        assert_eq!(v.len(), 1, "{name} in\n{}", self.head);
        v[0].clone()
    }
}

/// A running raw backend; stops when dropped.
pub struct RawBackend {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<RawSeen>>>,
    task: JoinHandle<()>,
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A response that keeps the connection: `200`, body `ok`.
pub const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

impl RawBackend {
    /// Starts on 127.0.0.1:0, answering every request with `response`.
    pub async fn start(response: &'static [u8]) -> Self {
        Self::answering(Arc::new(move |_: &RawSeen| Reply {
            bytes: response.to_vec(),
            close: false,
        }))
        .await
    }

    /// Starts on 127.0.0.1:0, answering each request with what `answer` gives for it.
    pub async fn answering(answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(serve(sock, s.clone(), answer.clone()));
            }
        });
        Self { addr, seen, task }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests so far.
    pub fn seen(&self) -> Vec<RawSeen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(mut sock: TcpStream, seen: Arc<Mutex<Vec<RawSeen>>>, answer: Answer) {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let Some(end) = read_until(&mut sock, &mut buf, b"\r\n\r\n").await else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let mut wire: Vec<u8> = buf.drain(..end + 4).collect();
        let lower = head.to_ascii_lowercase();
        let length = lower.lines().find_map(|l| {
            l.strip_prefix("content-length:")
                .and_then(|v| v.trim().parse::<usize>().ok())
        });
        let chunked = lower
            .lines()
            .any(|l| l.starts_with("transfer-encoding:") && l.contains("chunked"));
        let (body, complete) = if chunked {
            read_chunked(&mut sock, &mut buf, &mut wire).await
        } else {
            let want = length.unwrap_or(0);
            while buf.len() < want {
                if !read_more(&mut sock, &mut buf).await {
                    break;
                }
            }
            let n = want.min(buf.len());
            let body: Vec<u8> = buf.drain(..n).collect();
            wire.extend_from_slice(&body);
            (body, n == want)
        };
        let request = RawSeen {
            head,
            body,
            complete,
            wire,
        };
        let reply = answer(&request);
        seen.lock().unwrap().push(request);
        if !complete || sock.write_all(&reply.bytes).await.is_err() {
            return;
        }
        if reply.close {
            let _ = sock.shutdown().await;
            return;
        }
    }
}

async fn read_more(sock: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 8192];
    match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut chunk)).await {
        Ok(Ok(n)) if n > 0 => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
        _ => false,
    }
}

async fn read_until(sock: &mut TcpStream, buf: &mut Vec<u8>, pat: &[u8]) -> Option<usize> {
    loop {
        if let Some(i) = buf.windows(pat.len()).position(|w| w == pat) {
            return Some(i);
        }
        if !read_more(sock, buf).await {
            return None;
        }
    }
}

async fn read_chunked(
    sock: &mut TcpStream,
    buf: &mut Vec<u8>,
    wire: &mut Vec<u8>,
) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    loop {
        let Some(end) = read_until(sock, buf, b"\r\n").await else {
            return (body, false);
        };
        let line = String::from_utf8_lossy(&buf[..end]).into_owned();
        wire.extend(buf.drain(..end + 2));
        let Ok(size) = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
        else {
            return (body, false);
        };
        if size == 0 {
            // Trailer lines, if any, up to the blank line that ends the body.
            loop {
                let Some(end) = read_until(sock, buf, b"\r\n").await else {
                    return (body, false);
                };
                wire.extend(buf.drain(..end + 2));
                if end == 0 {
                    return (body, true);
                }
            }
        }
        while buf.len() < size + 2 {
            if !read_more(sock, buf).await {
                body.extend_from_slice(&buf[..buf.len().min(size)]);
                return (body, false);
            }
        }
        let data: Vec<u8> = buf.drain(..size).collect();
        wire.extend_from_slice(&data);
        body.extend(data);
        wire.extend(buf.drain(..2));
    }
}

/// Sends `bytes` on a new connection and reads until the peer closes or `wait` passes.
pub async fn exchange(addr: SocketAddr, bytes: &[u8], wait: Duration) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}
