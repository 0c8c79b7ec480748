//! Upgrades to an HTTP/2 peer (RFC 8441): the upgrade goes upstream as an extended CONNECT
//! (`:method CONNECT`, `:protocol websocket`) on a stream of the peer's shared connection,
//! when the peer's SETTINGS announced `SETTINGS_ENABLE_CONNECT_PROTOCOL`. The peer's `200`
//! opens the stream as the tunnel.
//!
//! An HTTP/1.1 client's handshake carries `Sec-WebSocket-Key` and expects
//! `Sec-WebSocket-Accept` in the `101` (RFC 6455 §4); HTTP/2's carries neither (RFC 8441 §5).
//! upkeep drops the key upstream and answers the accept itself, computed from the client's
//! key as the server would have.

use http::{header, HeaderMap, HeaderValue, Method, Request, Uri, Version};

use crate::body::ReqBody;

const SEC_WEBSOCKET_KEY: &str = "sec-websocket-key";
const SEC_WEBSOCKET_ACCEPT: &str = "sec-websocket-accept";
/// RFC 6455 §1.3: appended to the key before hashing.
const WEBSOCKET_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The extended CONNECT for an upgrade to `protocol` (an HTTP/1.1 `Upgrade` value, or the
/// `:protocol` of an HTTP/2 client's own extended CONNECT). Returns the request and, when an
/// HTTP/1.1 client's WebSocket key was dropped, the `Sec-WebSocket-Accept` its `101` needs.
pub(super) fn extended_connect(
    uri: Uri,
    mut headers: HeaderMap,
    protocol: &HeaderValue,
    https: bool,
) -> (Request<ReqBody>, Option<HeaderValue>) {
    let accept = headers
        .remove(SEC_WEBSOCKET_KEY)
        .and_then(|key| accept_for(key.as_bytes()));
    // Whatever the HTTP/1.1 handshake had of its own is not HTTP/2's (RFC 9113 §8.2.2).
    headers.remove(header::CONNECTION);
    headers.remove(header::UPGRADE);
    headers.remove(header::CONTENT_LENGTH);
    let mut req = Request::new(ReqBody::Empty);
    *req.method_mut() = Method::CONNECT;
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_2;
    *req.headers_mut() = headers;
    let name = protocol.to_str().unwrap_or("websocket").trim();
    req.extensions_mut().insert(hyper::ext::Protocol::from(
        name.to_ascii_lowercase().as_str(),
    ));
    (crate::pool::h2::with_authority(req, https), accept)
}

/// The headers of the `101` an HTTP/1.1 client gets for the peer's `200` (hop-by-hop fields
/// already removed): `Upgrade`, `Connection: upgrade`, and the accept for its key.
pub(super) fn to_http1_switch(
    headers: &mut HeaderMap,
    protocol: HeaderValue,
    accept: Option<HeaderValue>,
) {
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, protocol);
    if let Some(a) = accept {
        headers.insert(SEC_WEBSOCKET_ACCEPT, a);
    }
}

/// `Sec-WebSocket-Accept` for a key: base64(SHA-1(key ++ GUID)) (RFC 6455 §4.2.2).
fn accept_for(key: &[u8]) -> Option<HeaderValue> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(trim(key));
    ctx.update(WEBSOCKET_GUID);
    HeaderValue::from_str(&super::h2::base64(ctx.finish().as_ref())).ok()
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &v[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_matches_the_rfc_6455_example() {
        // RFC 6455 §1.3.
        let a = accept_for(b"dGhlIHNhbXBsZSBub25jZQ==").unwrap();
        assert_eq!(a, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn the_key_goes_and_the_protocol_becomes_a_pseudo_header() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("chat.test:8080"));
        h.insert(
            SEC_WEBSOCKET_KEY,
            HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="),
        );
        h.insert("sec-websocket-version", HeaderValue::from_static("13"));
        let (req, accept) = extended_connect(
            Uri::from_static("/chat?x=1"),
            h,
            &HeaderValue::from_static("WebSocket"),
            false,
        );
        assert_eq!(req.method(), Method::CONNECT);
        assert_eq!(req.uri().to_string(), "http://chat.test:8080/chat?x=1");
        assert!(!req.headers().contains_key(SEC_WEBSOCKET_KEY));
        assert!(!req.headers().contains_key(header::HOST));
        assert_eq!(req.headers()["sec-websocket-version"], "13");
        assert_eq!(
            req.extensions()
                .get::<hyper::ext::Protocol>()
                .unwrap()
                .as_str(),
            "websocket"
        );
        assert_eq!(accept.unwrap(), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }
}
