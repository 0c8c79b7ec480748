//! Message normalisation between the two sides: what changes when a request or a response
//! crosses from one HTTP version or framing to another (rules V1, H4, K1, T1 of
//! `normalize/rules.md`).

use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderValue};
use http::Version;

/// The version every response goes downstream with (rule V1), whatever the upstream spoke:
/// an HTTP/1.0 upstream's status line would tell the client that this hop cannot keep a
/// connection alive or chunk a body, and every request would cost it a new connection.
pub const DOWNSTREAM_VERSION: Version = Version::HTTP_11;

/// `Host` for a request that named no host (rule H4): an HTTP/1.0 client may send none, but
/// the request goes upstream as HTTP/1.1, which requires one (RFC 9112 §3.2). The address the
/// client connected to is what it addressed.
pub fn default_host(local: SocketAddr) -> HeaderValue {
    let text = match local {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    };
    HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("localhost"))
}

/// Whether a request's `Connection` field asks for `keep-alive` (how an HTTP/1.0 client
/// asks to keep its connection, RFC 9112 appendix C.2.2).
pub fn asks_keep_alive(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("keep-alive"))
}

/// Joins cookie crumbs into one `Cookie` field (rule K1): an HTTP/2 client may split its
/// cookies over several `cookie` fields (RFC 9113 §8.2.3), and they must be joined with
/// `"; "` before an HTTP/1.1 hop, where a second `Cookie` line is not allowed (RFC 6265 §5.4).
pub fn join_cookie_crumbs(headers: &mut HeaderMap) {
    let mut crumbs = headers.get_all(header::COOKIE).iter();
    if crumbs.next().is_none() || crumbs.next().is_none() {
        return;
    }
    let mut joined: Vec<u8> = Vec::new();
    for v in headers.get_all(header::COOKIE) {
        if v.is_empty() {
            continue;
        }
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(v.as_bytes());
    }
    // Each crumb was a valid field value, so their join with "; " is one too.
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, v);
    }
}

/// Drops `Content-Length` from a message that also has `Transfer-Encoding` (rule T1): the
/// transfer coding decides the framing (RFC 9112 §6.3), so the length is wrong or
/// meaningless, and passed on beside a re-framed body it would tell the next hop a lie.
/// Call before hop-by-hop removal takes `Transfer-Encoding` away.
pub fn drop_length_under_transfer_coding(headers: &mut HeaderMap) {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_host_is_the_address_the_client_connected_to() {
        assert_eq!(
            default_host("127.0.0.1:8080".parse().unwrap()),
            "127.0.0.1:8080"
        );
        assert_eq!(default_host("[::1]:81".parse().unwrap()), "[::1]:81");
    }

    #[test]
    fn cookie_crumbs_are_joined_in_order() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("a=1"));
        h.append(header::COOKIE, HeaderValue::from_static("b=2"));
        h.append(header::COOKIE, HeaderValue::from_static("c=3; d=4"));
        join_cookie_crumbs(&mut h);
        let all: Vec<_> = h.get_all(header::COOKIE).iter().collect();
        assert_eq!(all, vec!["a=1; b=2; c=3; d=4"]);
        let mut one = HeaderMap::new();
        one.append(header::COOKIE, HeaderValue::from_static("a=1"));
        join_cookie_crumbs(&mut one);
        assert_eq!(one[header::COOKIE], "a=1");
    }

    #[test]
    fn a_transfer_coding_drops_the_length() {
        let mut h = HeaderMap::new();
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        drop_length_under_transfer_coding(&mut h);
        assert!(!h.contains_key(header::CONTENT_LENGTH));
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        drop_length_under_transfer_coding(&mut h);
        assert_eq!(h[header::CONTENT_LENGTH], "10");
    }
}
