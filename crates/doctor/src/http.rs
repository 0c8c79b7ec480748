//! A minimal HTTP/1.1 client over raw TCP, for live checks that must see the socket itself.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// An `http://host[:port][/path]` URL split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// Host as written (name or address; IPv6 without brackets).
    pub host: String,
    /// Port (80 when not written).
    pub port: u16,
    /// Path and query, at least "/".
    pub path: String,
}

/// A URL the live checks cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Only plain http is measured (TLS would hide the socket's own close).
    #[error("{0}: only http:// URLs can be measured (put the check in front of TLS)")]
    Scheme(String),
    /// Host or port missing or malformed.
    #[error("{0}: malformed URL")]
    Malformed(String),
}

/// Parses an `http://` URL.
pub fn parse_url(url: &str) -> Result<HttpUrl, UrlError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| UrlError::Scheme(url.to_owned()))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let bad = || UrlError::Malformed(url.to_owned());
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, tail) = v6.split_once(']').ok_or_else(bad)?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| bad())?,
            None if tail.is_empty() => 80,
            None => return Err(bad()),
        };
        (h, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().map_err(|_| bad())?),
            None => (authority, 80),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok(HttpUrl {
        host: host.to_owned(),
        port,
        path: path.to_owned(),
    })
}

impl HttpUrl {
    /// Connects with a bounded connect time.
    pub fn connect(&self, timeout: Duration) -> io::Result<TcpStream> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for addr in (self.host.as_str(), self.port).to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The bytes of one keep-alive GET for `path`.
    pub fn request(&self, path: &str) -> Vec<u8> {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!(
            "GET {path} HTTP/1.1\r\nHost: {host}:{}\r\nUser-Agent: upkeep-doctor\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n",
            self.port
        )
        .into_bytes()
    }
}

/// A response read off a socket: head, body and when its last byte came.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Header lines (name, value).
    pub headers: Vec<(String, String)>,
    /// The body, when framed by Content-Length or chunked (read up to its end).
    pub body: Vec<u8>,
    /// When the last byte of the response arrived.
    pub done_at: Instant,
    /// Whether the server closed the socket right after (or instead of) framing the body.
    pub closed: bool,
}

impl Response {
    /// The first header value named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Upper bound on a response the doctor reads.
const MAX_RESPONSE: usize = 4 << 20;

/// Sends `req` and reads one response, waiting at most until `deadline`.
pub fn exchange(s: &mut TcpStream, req: &[u8], deadline: Instant) -> io::Result<Response> {
    s.write_all(req)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut closed = false;
    loop {
        if let Some(r) = parse_complete(&buf) {
            return Ok(Response {
                done_at: Instant::now(),
                closed,
                ..r
            });
        }
        if closed {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before a complete response",
            ));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no complete response in time",
            ));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut chunk) {
            Ok(0) => {
                closed = true;
                // A response without framing ends at the close.
                if let Some(r) = parse_head(&buf) {
                    let (mut r, at) = r;
                    r.body = buf[at..].to_vec();
                    return Ok(Response {
                        done_at: Instant::now(),
                        closed,
                        ..r
                    });
                }
            }
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > MAX_RESPONSE {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "response too large",
                    ));
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no complete response in time",
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

fn parse_head(buf: &[u8]) -> Option<(Response, usize)> {
    let end = memchr::memmem::find(buf, b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Some((
        Response {
            status,
            headers,
            body: Vec::new(),
            done_at: Instant::now(),
            closed: false,
        },
        end,
    ))
}

/// A response whose body is complete by its framing.
fn parse_complete(buf: &[u8]) -> Option<Response> {
    let (mut r, at) = parse_head(buf)?;
    let rest = &buf[at..];
    if r.header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        r.body = dechunk(rest)?;
    } else if let Some(len) = r
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        r.body = rest.get(..len)?.to_vec();
    } else if r.status == 204 || r.status == 304 || (100..200).contains(&r.status) {
        r.body = Vec::new();
    } else {
        return None;
    }
    Some(r)
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let nl = memchr::memmem::find(b, b"\r\n")?;
        let size_txt = String::from_utf8_lossy(&b[..nl]);
        let size = usize::from_str_radix(size_txt.split(';').next()?.trim(), 16).ok()?;
        b = &b[nl + 2..];
        if size == 0 {
            // Trailers end with an empty line.
            memchr::memmem::find(b, b"\r\n")?;
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_defaults_and_errors() {
        let u = parse_url("http://127.0.0.1:8080/x?y").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("127.0.0.1", 8080, "/x?y")
        );
        let u = parse_url("http://[::1]").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("::1", 80, "/"));
        assert!(matches!(parse_url("https://a/"), Err(UrlError::Scheme(_))));
        assert!(matches!(
            parse_url("http://a:x/"),
            Err(UrlError::Malformed(_))
        ));
    }

    #[test]
    fn framing_by_length_and_chunks() {
        let r = parse_complete(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
        assert!(parse_complete(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok").is_none());
        let r = parse_complete(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n1\r\n!\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, b"ok!");
    }
}
