//! gRPC over the proxy: recognising a gRPC request, its `grpc-timeout`, and the status a
//! failure upkeep generates is given (`rescue` builds the response).
//!
//! gRPC clients read the outcome of a call from `grpc-status`, not from the HTTP status, and
//! take an HTTP error as an opaque `UNKNOWN` or `INTERNAL`; answered as gRPC, a client sees
//! `UNAVAILABLE` (retry elsewhere) or `DEADLINE_EXCEEDED` and upkeep's cause in the message.

use std::time::Duration;

use http::{HeaderMap, HeaderValue};

use crate::error::Cause;

/// `grpc-timeout` (the call's deadline, as sent by the client).
pub const GRPC_TIMEOUT: &str = "grpc-timeout";
/// `grpc-status` (the call's outcome).
pub const GRPC_STATUS: &str = "grpc-status";
/// `grpc-message` (the outcome's text, percent-encoded).
pub const GRPC_MESSAGE: &str = "grpc-message";

/// gRPC status codes upkeep answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// 4: the deadline passed before an answer.
    DeadlineExceeded = 4,
    /// 8: the request was larger than the route takes.
    ResourceExhausted = 8,
    /// 12: no route for the method.
    Unimplemented = 12,
    /// 13: upkeep failed, or the request was malformed.
    Internal = 13,
    /// 14: no upstream could answer; retrying may work.
    Unavailable = 14,
}

/// Whether the request is gRPC (`content-type: application/grpc`, `application/grpc+proto`, ...).
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| is_grpc_content_type(v.as_bytes()))
}

/// Whether a `Content-Type` value is gRPC's (`application/grpc`, `+proto`, `;...`).
pub fn is_grpc_content_type(v: &[u8]) -> bool {
    v.len() >= 16
        && v[..16].eq_ignore_ascii_case(b"application/grpc")
        && matches!(v.get(16), None | Some(b'+' | b';'))
}

/// The deadline in `grpc-timeout` (`1*8DIGIT` and a unit: `H M S m u n`), if present and valid.
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(GRPC_TIMEOUT)?.as_bytes();
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b"H" => Duration::from_secs(n * 3600),
        b"M" => Duration::from_secs(n * 60),
        b"S" => Duration::from_secs(n),
        b"m" => Duration::from_millis(n),
        b"u" => Duration::from_micros(n),
        b"n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The gRPC status for a failure upkeep generated, after the HTTP-to-gRPC mapping of the gRPC
/// spec (`doc/http-grpc-status-mapping.md`), with timeouts as `DEADLINE_EXCEEDED`.
pub fn code(cause: Cause) -> Code {
    match cause {
        Cause::UpstreamTimeout | Cause::ClientTimeout => Code::DeadlineExceeded,
        Cause::NoRoute => Code::Unimplemented,
        Cause::BodyTooLarge => Code::ResourceExhausted,
        Cause::BadRequest | Cause::HeaderTooLarge | Cause::UriTooLong | Cause::Internal => {
            Code::Internal
        }
        Cause::NoPeers
        | Cause::ConnectFailed
        | Cause::UpstreamReset
        | Cause::RetryBudget
        | Cause::Overloaded
        | Cause::UpstreamTls
        | Cause::UpstreamNoUpgrade => Code::Unavailable,
    }
}

/// The trailers that end a call cut at its deadline after its response head was sent:
/// `grpc-status: 4` with upkeep's cause, as in a Trailers-Only answer.
pub fn deadline_trailers() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert(GRPC_STATUS, HeaderValue::from_static("4"));
    t.insert(
        GRPC_MESSAGE,
        HeaderValue::from_static("upkeep: call_deadline"),
    );
    t.insert(
        crate::rescue::CAUSE_HEADER,
        HeaderValue::from_static("call_deadline"),
    );
    t
}

/// How long a gRPC call may take as a whole: the shorter of its `grpc-timeout` and its
/// route's `deadline`.
pub fn call_limit(headers: &HeaderMap, route_deadline: Option<Duration>) -> Option<Duration> {
    match (timeout(headers), route_deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Percent-encodes a `grpc-message` value (everything outside printable ASCII, and `%`).
pub fn encode_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types_are_recognised() {
        let mut h = HeaderMap::new();
        assert!(!is_grpc(&h));
        for (v, want) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC;charset=x", true),
            ("application/grpc-web", false),
            ("application/json", false),
        ] {
            h.insert("content-type", v.parse().unwrap());
            assert_eq!(is_grpc(&h), want, "{v}");
        }
    }

    #[test]
    fn grpc_timeout_units_are_read_and_bad_values_ignored() {
        let mut h = HeaderMap::new();
        for (v, want) in [
            ("1H", Some(Duration::from_secs(3600))),
            ("2M", Some(Duration::from_secs(120))),
            ("3S", Some(Duration::from_secs(3))),
            ("250m", Some(Duration::from_millis(250))),
            ("7u", Some(Duration::from_micros(7))),
            ("99999999n", Some(Duration::from_nanos(99_999_999))),
            ("123456789S", None),
            ("S", None),
            ("5x", None),
            ("-5S", None),
            ("", None),
        ] {
            h.insert(GRPC_TIMEOUT, v.parse().unwrap());
            assert_eq!(timeout(&h), want, "{v:?}");
        }
    }

    #[test]
    fn call_limit_is_the_shorter_of_grpc_timeout_and_the_route_deadline() {
        let ms = Duration::from_millis;
        let mut h = HeaderMap::new();
        assert_eq!(call_limit(&h, None), None);
        assert_eq!(call_limit(&h, Some(ms(900))), Some(ms(900)));
        h.insert(GRPC_TIMEOUT, "700m".parse().unwrap());
        assert_eq!(call_limit(&h, None), Some(ms(700)));
        assert_eq!(call_limit(&h, Some(ms(500))), Some(ms(500)));
        assert_eq!(call_limit(&h, Some(ms(900))), Some(ms(700)));
    }

    #[test]
    fn timeouts_map_to_deadline_exceeded_and_upstream_failures_to_unavailable() {
        assert_eq!(code(Cause::UpstreamTimeout), Code::DeadlineExceeded);
        assert_eq!(code(Cause::NoPeers), Code::Unavailable);
        assert_eq!(code(Cause::ConnectFailed), Code::Unavailable);
        assert_eq!(code(Cause::UpstreamReset), Code::Unavailable);
        assert_eq!(code(Cause::NoRoute), Code::Unimplemented);
        assert_eq!(encode_message("a b%\n"), "a b%25%0A");
    }
}
