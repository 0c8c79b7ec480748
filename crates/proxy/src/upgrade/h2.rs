//! WebSocket over HTTP/2 (RFC 8441): an extended CONNECT with `:protocol = websocket` from
//! the client becomes an HTTP/1.1 `GET` with `Upgrade: websocket` to the upstream; the
//! upstream's `101` becomes a `200` on the stream, and the stream carries the bytes.
//!
//! The two handshakes differ in one pair of headers: HTTP/1.1 needs `Sec-WebSocket-Key` and
//! checks `Sec-WebSocket-Accept` (RFC 6455 §4), HTTP/2 uses neither (RFC 8441 §5). upkeep
//! makes the key upstream and drops the accept downstream.

use http::{header, HeaderMap, HeaderValue, Method};
use hyper::upgrade::OnUpgrade;

use super::Wanted;

const SEC_WEBSOCKET_KEY: &str = "sec-websocket-key";
const SEC_WEBSOCKET_ACCEPT: &str = "sec-websocket-accept";

/// An extended CONNECT (a `:protocol` on a CONNECT) and its pending stream upgrade.
pub(super) fn wanted(method: &Method, extensions: &mut http::Extensions) -> Option<Wanted> {
    if method != Method::CONNECT {
        return None;
    }
    let protocol = extensions.get::<hyper::ext::Protocol>()?;
    let protocol = HeaderValue::from_str(protocol.as_str()).ok()?;
    // hyper's pending upgrade, or the stream of upkeep's own HTTP/2 server.
    let downstream = match extensions.remove::<OnUpgrade>() {
        Some(on) => super::tunnel::Downstream::Hyper(on),
        None => super::tunnel::Downstream::H2(extensions.remove::<crate::h2server::H2Pending>()?),
    };
    Some(Wanted {
        protocol,
        downstream,
        h2: true,
    })
}

/// The method and `Upgrade` value for the HTTP/1.1 request, with a fresh WebSocket key.
pub(super) fn to_http1(headers: &mut HeaderMap, protocol: &HeaderValue) -> (Method, HeaderValue) {
    if protocol.as_bytes().eq_ignore_ascii_case(b"websocket") {
        let key: [u8; 16] = rand::random();
        if let Ok(v) = HeaderValue::from_str(&base64(&key)) {
            headers.insert(SEC_WEBSOCKET_KEY, v);
        }
    }
    (Method::GET, protocol.clone())
}

/// Drops what only HTTP/1.1's handshake uses from the upstream's `101` headers.
pub(super) fn from_http1(headers: &mut HeaderMap) {
    headers.remove(SEC_WEBSOCKET_ACCEPT);
    headers.remove(header::UPGRADE);
}

/// Standard base64 with padding (RFC 4648 §4), for the 16-byte key.
pub(super) fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want, "{input:?}");
        }
        assert_eq!(base64(&[0u8; 16]).len(), 24);
    }
}
