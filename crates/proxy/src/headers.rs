//! Header rewriting: hop-by-hop removal (RFC 9110 §7.6.1) and forwarding headers.

use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::config::Forwarded;

const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Removes hop-by-hop headers, including every header named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in HOP_BY_HOP.iter() {
        headers.remove(n);
    }
    headers.remove(header::UPGRADE);
}

/// Appends forwarding headers for a request from `client` that arrived over `proto`.
pub fn add_forwarded(
    headers: &mut HeaderMap,
    mode: Forwarded,
    client: SocketAddr,
    proto: &str,
    host: Option<&str>,
) {
    match mode {
        Forwarded::None => {}
        Forwarded::XForwarded => {
            let ip = client.ip().to_string();
            let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
                Some(prev) if !prev.is_empty() => format!("{prev}, {ip}"),
                _ => ip,
            };
            if let Ok(v) = HeaderValue::from_str(&xff) {
                headers.insert("x-forwarded-for", v);
            }
            headers.insert(
                "x-forwarded-proto",
                HeaderValue::from_static(if proto == "https" { "https" } else { "http" }),
            );
            if let Some(h) = host.and_then(|h| HeaderValue::from_str(h).ok()) {
                headers.insert("x-forwarded-host", h);
            }
        }
        Forwarded::Forwarded => {
            let node = match client {
                SocketAddr::V4(a) => a.ip().to_string(),
                SocketAddr::V6(a) => format!("\"[{}]\"", a.ip()),
            };
            let mut elem = format!("for={node};proto={proto}");
            if let Some(h) = host {
                elem.push_str(&format!(";host=\"{}\"", h.replace('"', "")));
            }
            let value = match headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
                Some(prev) if !prev.is_empty() => format!("{prev}, {elem}"),
                _ => elem,
            };
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(header::FORWARDED, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_standard_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, X-Secret".parse().unwrap());
        h.append(header::CONNECTION, "x-other".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("x-other", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert(header::TE, "trailers".parse().unwrap());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        h.insert("proxy-authorization", "x".parse().unwrap());
        h.insert("x-kept", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn appends_forwarding_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "10.0.0.1".parse().unwrap());
        add_forwarded(
            &mut h,
            Forwarded::XForwarded,
            "127.0.0.5:999".parse().unwrap(),
            "http",
            Some("a.test"),
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.5");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "a.test");
        let mut h = HeaderMap::new();
        add_forwarded(
            &mut h,
            Forwarded::Forwarded,
            "[::1]:9".parse().unwrap(),
            "https",
            Some("a.test"),
        );
        assert_eq!(h["forwarded"], "for=\"[::1]\";proto=https;host=\"a.test\"");
    }
}
