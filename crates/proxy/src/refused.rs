//! Requests refused before any handler ran: the framing check, the HTTP/1 parser's own 400,
//! 414 and 431. Each gets one access-log line and one count in
//! `upkeep_responses_total{origin="proxy",cause=...}`, like every response upkeep makes.

use std::net::SocketAddr;
use std::time::SystemTime;

use crate::access_log::{Field, Record, Text};
use crate::error::Cause;
use crate::metrics::class;
use crate::state::Shared;

/// Why hyper's HTTP/1 server refused a request, from its error and what the framing check
/// noted on the connection (`refusal`: its reason, or `uri_too_long`); `None` when the error
/// was no refusal (a reset, a timeout, a closed connection).
pub fn classify(
    e: &hyper::Error,
    refusal: Option<&'static str>,
) -> Option<(Cause, Option<&'static str>)> {
    if e.is_parse_too_large() {
        Some(if refusal == Some(URI_TOO_LONG) {
            (Cause::UriTooLong, None)
        } else {
            (Cause::HeaderTooLarge, None)
        })
    } else if e.is_parse() {
        Some((
            Cause::BadRequest,
            Some(refusal.unwrap_or("unparsable_request")),
        ))
    } else {
        None
    }
}

/// What a client that sent part of a request head and then went silent for
/// `header_read_timeout` gets before the close: the response `rescue` makes for
/// `client_timeout`, written by the listener itself (hyper has seen none of the head).
pub const HEAD_TIMEOUT_RESPONSE: &[u8] = b"HTTP/1.1 408 Request Timeout\r\n\
upkeep-error: client_timeout\r\n\
content-type: text/plain; charset=utf-8\r\n\
cache-control: no-store\r\n\
connection: close\r\n\
content-length: 23\r\n\
\r\n\
upkeep: client_timeout\n";

/// The framing check's note for a target hyper answers 414.
pub const URI_TOO_LONG: &str = "uri_too_long";

/// Logs and counts one refused request.
pub fn record(
    shared: &Shared,
    remote: SocketAddr,
    proto: &'static str,
    cause: Cause,
    reason: Option<&'static str>,
) {
    let status = cause.status();
    shared
        .metrics
        .response("proxy", class(status), cause.as_str());
    tracing::debug!(client.addr = %remote, status = status.as_u16(), cause = cause.as_str(), reason = reason.unwrap_or("-"), "request refused before routing");
    if shared.access_log.is_on() {
        // No head was read, so there is no id to keep: one is made, as for any request.
        let request_id = crate::request_id::ensure(&mut http::HeaderMap::new());
        let mut text = Text::default();
        text.set_lossy(Field::RequestId, request_id.as_bytes());
        shared.access_log.log(Record {
            time: SystemTime::now(),
            client: remote.ip(),
            text,
            proto,
            status: status.as_u16(),
            duration_ms: 0.0,
            peer: None,
            attempts: 0,
            upstream_status: None,
            upstream_header_ms: None,
            bytes_in: 0,
            bytes_out: 0,
            origin: "proxy",
            cause: Some(cause.as_str()),
            reason,
            incomplete: false,
            format: shared.state.load().config.access_log_format,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_timeout_response_is_the_rescue_response_for_client_timeout() {
        let mut headers = [httparse::EMPTY_HEADER; 8];
        let mut resp = httparse::Response::new(&mut headers);
        let httparse::Status::Complete(n) = resp.parse(HEAD_TIMEOUT_RESPONSE).unwrap() else {
            panic!("incomplete head")
        };
        assert_eq!(resp.code, Some(Cause::ClientTimeout.status().as_u16()));
        let generated = crate::rescue::generated(Cause::ClientTimeout, None);
        let header = |name: &str| {
            resp.headers
                .iter()
                .find(|h| h.name == name)
                .map(|h| std::str::from_utf8(h.value).unwrap())
        };
        for (name, value) in generated.headers() {
            assert_eq!(header(name.as_str()), value.to_str().ok(), "{name}");
        }
        let body = &HEAD_TIMEOUT_RESPONSE[n..];
        assert_eq!(body, b"upkeep: client_timeout\n");
        assert_eq!(
            header("content-length"),
            Some(body.len().to_string().as_str())
        );
    }
}
