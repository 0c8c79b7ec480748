//! Header rewriting: hop-by-hop removal (RFC 9110 §7.6.1) and forwarding headers (rules C1,
//! F1, F2 of `normalize/rules.md`).

use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::config::Forwarded;

/// `Keep-Alive` (RFC 9112 appendix C.2.2; hop-by-hop).
pub const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

fn is_hop_by_hop(name: &HeaderName) -> bool {
    // Comparing a standard name is comparing an enum tag; no hashing.
    name == header::CONNECTION
        || name == KEEP_ALIVE
        || name == PROXY_CONNECTION
        || name == header::PROXY_AUTHENTICATE
        || name == header::PROXY_AUTHORIZATION
        || name == header::TE
        || name == header::TRAILER
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
}

/// Headers that `Connection` may not nominate for removal: a client could otherwise have the
/// routing host or a front proxy's forwarding headers deleted on their way upstream.
fn is_protected(name: &HeaderName) -> bool {
    name == header::HOST || name == header::FORWARDED || name.as_str().starts_with("x-forwarded-")
}

/// Removes hop-by-hop headers, including every header named in `Connection` (except the
/// protected ones: `Host`, `X-Forwarded-*`, `Forwarded`).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip_hop_by_hop_keeping(headers, |_| false);
}

/// Like [`strip_hop_by_hop`], and `Connection` may not nominate the headers `keep` names
/// either (those a route writes, rule C1).
pub fn strip_hop_by_hop_keeping(headers: &mut HeaderMap, keep: impl Fn(&HeaderName) -> bool) {
    // One pass over the names finds what to remove; most messages carry none or only
    // `Connection`, so the per-name removals (each a hash and a probe) are rarely paid.
    let mut remove: Vec<HeaderName> = headers
        .keys()
        .filter(|n| is_hop_by_hop(n))
        .cloned()
        .collect();
    if remove.is_empty() {
        return;
    }
    remove.extend(
        headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            // `keep-alive` is itself hop-by-hop: found by the pass above if present.
            .filter(|n| !n.eq_ignore_ascii_case("keep-alive"))
            .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
            .filter(|n| !is_protected(n) && !keep(n)),
    );
    for n in remove {
        headers.remove(n);
    }
}

/// The client's address as a header value, made once per connection.
pub fn client_ip_value(client: SocketAddr) -> HeaderValue {
    HeaderValue::from_str(&client.ip().to_string()).unwrap_or(HeaderValue::from_static("unknown"))
}

/// Writes forwarding headers for a request from `client` (whose address as a header value
/// is `client_ip`, from [`client_ip_value`]) that arrived over `proto`. From a `trusted`
/// client (a proxy in `trusted_proxies`) the chain is appended to; from anyone else every
/// incoming forwarding header is dropped first, so a client cannot forge its origin.
pub fn add_forwarded(
    headers: &mut HeaderMap,
    mode: Forwarded,
    trusted: bool,
    client: SocketAddr,
    client_ip: &HeaderValue,
    proto: &str,
    host: Option<&str>,
) {
    if !trusted {
        // Most requests carry none of these: one look at the few names a request has costs
        // less than four hashed lookups, and the removals are paid only when one is there.
        let forged = headers
            .keys()
            .any(|n| n == header::FORWARDED || n.as_str().starts_with("x-forwarded-"));
        if forged {
            headers.remove(&X_FORWARDED_FOR);
            headers.remove(&X_FORWARDED_PROTO);
            headers.remove(&X_FORWARDED_HOST);
            headers.remove(header::FORWARDED);
        }
    }
    match mode {
        Forwarded::None => {}
        Forwarded::XForwarded => {
            // From an untrusted client there is no previous value any more: nothing to look up.
            let prev = if trusted {
                headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok())
            } else {
                None
            };
            let xff = match prev {
                Some(prev) if !prev.is_empty() => {
                    let ip = client_ip.to_str().unwrap_or_default();
                    HeaderValue::from_str(&format!("{prev}, {ip}")).ok()
                }
                _ => Some(client_ip.clone()),
            };
            if let Some(v) = xff {
                headers.insert(X_FORWARDED_FOR, v);
            }
            // A trusted proxy's `-Proto` and `-Host` describe the original request: kept.
            if trusted && headers.contains_key(&X_FORWARDED_PROTO) {
                if !headers.contains_key(&X_FORWARDED_HOST) {
                    if let Some(h) = host.and_then(|h| HeaderValue::from_str(h).ok()) {
                        headers.insert(X_FORWARDED_HOST, h);
                    }
                }
                return;
            }
            headers.insert(
                X_FORWARDED_PROTO,
                HeaderValue::from_static(if proto == "https" { "https" } else { "http" }),
            );
            // The request's own Host value when that is the host (a shared copy, no parsing).
            let same_host = headers
                .get(header::HOST)
                .filter(|v| host.is_some_and(|h| v.as_bytes() == h.as_bytes()))
                .cloned();
            if let Some(h) = same_host.or_else(|| host.and_then(|h| HeaderValue::from_str(h).ok()))
            {
                headers.insert(X_FORWARDED_HOST, h);
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
    fn connection_cannot_nominate_host_or_forwarding_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            "Host, X-Forwarded-For, x-forwarded-proto, Forwarded, X-Real"
                .parse()
                .unwrap(),
        );
        h.insert(header::HOST, "a.test".parse().unwrap());
        h.insert("x-forwarded-for", "10.0.0.1".parse().unwrap());
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        h.insert("forwarded", "for=10.0.0.1".parse().unwrap());
        h.insert("x-real", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        for kept in ["host", "x-forwarded-for", "x-forwarded-proto", "forwarded"] {
            assert!(h.contains_key(kept), "{kept} was removed");
        }
        assert!(!h.contains_key("x-real"));
        assert!(!h.contains_key("connection"));
    }

    #[test]
    fn forwarding_headers_from_an_untrusted_client_are_replaced() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "6.6.6.6".parse().unwrap());
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        h.insert("x-forwarded-host", "evil.test".parse().unwrap());
        h.insert("forwarded", "for=6.6.6.6".parse().unwrap());
        let client = "127.0.0.5:999".parse().unwrap();
        add_forwarded(
            &mut h,
            Forwarded::XForwarded,
            false,
            client,
            &client_ip_value(client),
            "http",
            Some("a.test"),
        );
        assert_eq!(h["x-forwarded-for"], "127.0.0.5");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "a.test");
        assert!(!h.contains_key("forwarded"));
    }

    #[test]
    fn appends_forwarding_headers_from_a_trusted_proxy() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "10.0.0.1".parse().unwrap());
        let client = "127.0.0.5:999".parse().unwrap();
        add_forwarded(
            &mut h,
            Forwarded::XForwarded,
            true,
            client,
            &client_ip_value(client),
            "http",
            Some("a.test"),
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.5");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "a.test");
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        let client = "127.0.0.5:999".parse().unwrap();
        add_forwarded(
            &mut h,
            Forwarded::XForwarded,
            true,
            client,
            &client_ip_value(client),
            "http",
            Some("a.test"),
        );
        assert_eq!(
            h["x-forwarded-proto"], "https",
            "a trusted proxy's proto is kept"
        );
        let mut h = HeaderMap::new();
        h.insert("forwarded", "for=10.0.0.1".parse().unwrap());
        let client = "[::1]:9".parse().unwrap();
        add_forwarded(
            &mut h,
            Forwarded::Forwarded,
            true,
            client,
            &client_ip_value(client),
            "https",
            Some("a.test"),
        );
        assert_eq!(
            h["forwarded"],
            "for=10.0.0.1, for=\"[::1]\";proto=https;host=\"a.test\""
        );
    }
}
