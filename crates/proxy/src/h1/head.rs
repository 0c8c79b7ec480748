//! The upstream's response head, parsed once with `httparse`; the parse is also the strict
//! framing check (the response twin of `crate::listener::framing`). A head that could be
//! framed two ways is refused, never passed on: repeated or malformed `Content-Length`, a
//! `Transfer-Encoding` other than a single `chunked`, obsolete line folding, bare LF line
//! ends, header names with spaces, an over-size head. The rules are in docs/http1.md.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode, Version};

/// The largest response head read (status line and headers).
pub const MAX_HEAD: usize = 64 * 1024;
/// The most header fields in a response head (hyper's limit too).
pub const MAX_HEADERS: usize = 100;

/// Why a response was refused; the text goes to the log, the reason code to the access log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid upstream response: {0}")]
pub struct BadResponse(pub &'static str);

/// How the response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body: HEAD, 204, 304, or `Content-Length: 0`.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

/// A final (non-1xx) response head.
#[derive(Debug)]
pub struct Head {
    /// The status.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The header fields as sent; `Content-Length` is dropped under `chunked`, and from a 204.
    pub headers: HeaderMap,
    /// How the body is delimited.
    pub framing: Framing,
    /// The upstream allows another request on this connection after this response.
    pub keep_alive: bool,
}

/// The outcome of parsing what has been read so far.
#[derive(Debug)]
pub enum Parsed {
    /// More bytes are needed.
    Partial,
    /// A 1xx head of `len` bytes (it has no body; a final head follows, unless 101).
    Informational(StatusCode, usize),
    /// A final head of `len` bytes; the body starts right after it.
    Final(Head, usize),
}

/// Header fields of the head being parsed: name (`None`: invalid, refused in field order),
/// and where its value lies in the head.
pub type Fields = Vec<(Option<HeaderName>, usize, usize)>;

/// Parses a response head at the start of `buf`; `head_request` says the request was HEAD
/// (whose response never has a body, whatever its headers say). A complete head is taken off
/// `buf` (a 1xx as well), so what stays is the body, or the next head.
pub fn parse(buf: &mut BytesMut, head_request: bool) -> Result<Parsed, BadResponse> {
    parse_with(buf, head_request, &mut Fields::new())
}

/// [`parse`], with `fields` as scratch space kept by the connection (no allocation per
/// response).
pub fn parse_with(
    buf: &mut BytesMut,
    head_request: bool,
    fields: &mut Fields,
) -> Result<Parsed, BadResponse> {
    fields.clear();
    let base = buf.as_ptr() as usize;
    // Uninitialised slots: zeroing 100 of them per response costs more than the parse. One
    // parse: the names are read and the values' places noted, so that once the head is
    // split off, the values share its bytes (no copy per field).
    let (len, code, minor) = {
        let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut resp,
            &buf[..],
            &mut slots,
        ) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                if buf.len() > MAX_HEAD {
                    return Err(BadResponse("response head too large"));
                }
                return Ok(Parsed::Partial);
            }
            Err(e) => return Err(BadResponse(parse_error(e))),
        };
        let code = resp.code.unwrap_or(0);
        if len <= MAX_HEAD && !(100..200).contains(&code) {
            for h in resp.headers.iter() {
                let name = super::names::header_name(h.name.as_bytes()).ok();
                let start = h.value.as_ptr() as usize - base;
                fields.push((name, start, start + h.value.len()));
            }
        }
        (len, code, resp.version)
    };
    if len > MAX_HEAD {
        return Err(BadResponse("response head too large"));
    }
    // httparse takes a bare LF as a line end; a hop that does not would frame it otherwise.
    if has_bare_lf(&buf[..len]) {
        return Err(BadResponse("bare LF line ending"));
    }
    let status = StatusCode::from_u16(code).map_err(|_| BadResponse("invalid status code"))?;
    if status.is_informational() {
        buf.advance(len);
        return Ok(Parsed::Informational(status, len));
    }
    let version = match minor {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    };
    let raw: Bytes = buf.split_to(len).freeze();
    // Room for what the proxy adds on the way downstream (`keep-alive`, `connection`), so
    // that the map is not rehashed into a larger table per response.
    let mut headers = crate::headers::map_with_capacity(fields.len() + 2);
    let mut lengths = 0usize;
    let mut length: Option<u64> = None;
    let mut codings = 0usize;
    let mut close = false;
    for (name, start, end) in fields.drain(..) {
        let name = name.ok_or(BadResponse("invalid header name"))?;
        let value_bytes = &raw[start..end];
        // The values share the head's buffer: no copy per header.
        let value = HeaderValue::from_maybe_shared(raw.slice(start..end))
            .map_err(|_| BadResponse("invalid header value"))?;
        if name == header::CONTENT_LENGTH {
            lengths += 1;
            length = Some(content_length(value_bytes)?);
        } else if name == header::TRANSFER_ENCODING {
            codings += 1;
            if !trim_ows(value_bytes).eq_ignore_ascii_case(b"chunked") {
                return Err(BadResponse("Transfer-Encoding other than a single chunked"));
            }
        } else if name == header::CONNECTION {
            for token in value_bytes.split(|b| *b == b',') {
                close |= trim_ows(token).eq_ignore_ascii_case(b"close");
            }
        }
        headers.append(name, value);
    }
    if lengths > 1 {
        return Err(BadResponse("repeated Content-Length"));
    }
    if codings > 1 {
        return Err(BadResponse("repeated Transfer-Encoding"));
    }
    if codings == 1 && version == Version::HTTP_10 {
        return Err(BadResponse("Transfer-Encoding in an HTTP/1.0 response"));
    }
    let bodyless =
        head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    let framing = if bodyless {
        if status == StatusCode::NO_CONTENT {
            // A 204 has no content, whatever it declares (RFC 9110 §15.3.5).
            headers.remove(header::CONTENT_LENGTH);
            headers.remove(header::TRANSFER_ENCODING);
        }
        Framing::Empty
    } else if codings == 1 {
        // Transfer-Encoding overrides Content-Length (RFC 9112 §6.3 rule 3): the length goes.
        headers.remove(header::CONTENT_LENGTH);
        Framing::Chunked
    } else {
        match length {
            Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        }
    };
    // upkeep reuses only HTTP/1.1 connections that did not say close, as before this codec
    // (an HTTP/1.0 `keep-alive` is not trusted); a close-delimited body ends the connection.
    let keep_alive = version == Version::HTTP_11 && !close && framing != Framing::Close;
    Ok(Parsed::Final(
        Head {
            status,
            version,
            headers,
            framing,
            keep_alive,
        },
        len,
    ))
}

fn parse_error(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::TooManyHeaders => "too many header fields",
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending or obsolete line folding",
        httparse::Error::Version => "unsupported HTTP version",
        httparse::Error::Status => "invalid status line",
        _ => "malformed response head",
    }
}

/// A `Content-Length` value: 1*DIGIT, nothing else (no sign, no list, no hex, no inner space).
fn content_length(v: &[u8]) -> Result<u64, BadResponse> {
    let v = trim_ows(v);
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return Err(BadResponse("invalid Content-Length"));
    }
    Ok(v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// Whether a line in `head` ends in LF without CR before it.
pub(crate) fn has_bare_lf(head: &[u8]) -> bool {
    // Only the LFs are looked at (found many bytes at a time): a byte-at-a-time scan of
    // every head was about 0.5k instructions per response.
    memchr::memchr_iter(b'\n', head).any(|i| i == 0 || head[i - 1] != b'\r')
}

/// `v` without the optional whitespace (SP, HTAB) around it (RFC 9110 §5.6.3).
pub(crate) fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &v[start..end]
}

/// Reads `Keep-Alive: timeout=N` (the same rule as `crate::pool::keepalive_hint`).
pub fn keepalive_hint(headers: &HeaderMap) -> Option<std::time::Duration> {
    crate::pool::keepalive_hint(headers)
}

/// The parser's invariants on any input, for the fuzz target (`fuzz/`) and the corpus replay
/// test: it never panics; every prefix of the input is either still partial or gets the
/// verdict of the whole; a final head leaves exactly the bytes after it.
pub fn parse_invariants(data: &[u8]) {
    let head_request = data.first().is_some_and(|b| b & 1 == 1);
    let verdict = |input: &[u8]| -> String {
        let mut buf = BytesMut::from(input);
        match parse(&mut buf, head_request) {
            Ok(Parsed::Partial) => "partial".to_owned(),
            Ok(Parsed::Informational(s, n)) => {
                assert_eq!(buf.len(), input.len() - n);
                format!("1xx {s} {n}")
            }
            Ok(Parsed::Final(h, n)) => {
                assert_eq!(buf.len(), input.len() - n);
                assert!(n <= MAX_HEAD);
                format!(
                    "final {} {:?} {:?} {} {n}",
                    h.status, h.version, h.framing, h.keep_alive
                )
            }
            Err(e) => format!("refused {e}"),
        }
    };
    let whole = verdict(data);
    let step = (data.len() / 64).max(1);
    for k in (0..data.len()).step_by(step) {
        let v = verdict(&data[..k]);
        assert!(
            v == "partial" || v == whole,
            "prefix {k} says {v}, the whole says {whole}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_lf_is_found_wherever_it_is_as_a_plain_scan_finds_it() {
        let plain = |h: &[u8]| {
            h.iter()
                .enumerate()
                .any(|(i, &b)| b == b'\n' && (i == 0 || h[i - 1] != b'\r'))
        };
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Long-Header-Name: a value long enough\r\n\r\n";
        assert!(!has_bare_lf(head));
        for i in 0..head.len() {
            for b in [b'\n', b'\r', b'x'] {
                let mut h = head.to_vec();
                h[i] = b;
                assert_eq!(has_bare_lf(&h), plain(&h), "byte {i} set to {b}");
            }
        }
        assert!(has_bare_lf(b"\nHTTP/1.1 200 OK\r\n"));
        assert!(!has_bare_lf(b""));
    }

    fn final_head(raw: &str, head_request: bool) -> Result<(Head, usize), BadResponse> {
        match parse(&mut BytesMut::from(raw.as_bytes()), head_request)? {
            Parsed::Final(h, n) => Ok((h, n)),
            other => panic!("not a final head: {other:?}"),
        }
    }

    fn refused(raw: &str) -> &'static str {
        match parse(&mut BytesMut::from(raw.as_bytes()), false) {
            Err(BadResponse(why)) => why,
            Ok(p) => panic!("accepted {raw:?}: {p:?}"),
        }
    }

    #[test]
    fn a_plain_response_is_framed_by_its_length() {
        let raw = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello";
        let mut buf = BytesMut::from(raw.as_bytes());
        let Parsed::Final(_, _) = parse(&mut buf, false).unwrap() else {
            panic!("not final")
        };
        assert_eq!(&buf[..], b"hello", "the body stays");
        let (h, n) = final_head(raw, false).unwrap();
        assert_eq!(n, raw.len() - 5);
        assert_eq!(h.status, StatusCode::OK);
        assert_eq!(h.framing, Framing::Length(5));
        assert!(h.keep_alive);
        assert_eq!(h.headers["x-a"], "b");
    }

    #[test]
    fn a_partial_head_asks_for_more() {
        let p = parse(
            &mut BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Le"[..]),
            false,
        )
        .unwrap();
        assert!(matches!(p, Parsed::Partial));
    }

    #[test]
    fn chunked_overrides_and_drops_content_length() {
        let raw = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n";
        let (h, _) = final_head(raw, false).unwrap();
        assert_eq!(h.framing, Framing::Chunked);
        assert!(!h.headers.contains_key(header::CONTENT_LENGTH));
    }

    #[test]
    fn bodyless_responses_have_no_body_whatever_they_declare() {
        let (h, _) = final_head("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", true).unwrap();
        assert_eq!(h.framing, Framing::Empty);
        assert_eq!(
            h.headers[header::CONTENT_LENGTH],
            "10",
            "HEAD keeps its length"
        );
        let (h, _) = final_head(
            "HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(h.framing, Framing::Empty);
        assert!(!h.headers.contains_key(header::CONTENT_LENGTH));
        let (h, _) = final_head("HTTP/1.1 304 Not Modified\r\n\r\n", false).unwrap();
        assert_eq!(h.framing, Framing::Empty);
    }

    #[test]
    fn no_length_means_close_delimited_and_not_reused() {
        let (h, _) = final_head("HTTP/1.1 200 OK\r\n\r\n", false).unwrap();
        assert_eq!(h.framing, Framing::Close);
        assert!(!h.keep_alive);
    }

    #[test]
    fn close_and_http10_are_not_reused() {
        let (h, _) = final_head(
            "HTTP/1.1 200 OK\r\nConnection: x, close\r\nContent-Length: 0\r\n\r\n",
            false,
        )
        .unwrap();
        assert!(!h.keep_alive);
        let (h, _) = final_head(
            "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
            false,
        )
        .unwrap();
        assert!(!h.keep_alive);
        assert_eq!(h.version, Version::HTTP_10);
    }

    #[test]
    fn informational_heads_are_told_apart() {
        let mut buf = BytesMut::from(&b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1"[..]);
        let p = parse(&mut buf, false).unwrap();
        assert!(matches!(p, Parsed::Informational(s, 25) if s == StatusCode::CONTINUE));
        assert_eq!(&buf[..], b"HTTP/1.1", "the 1xx head is taken off");
    }

    #[test]
    fn ambiguous_heads_are_refused() {
        let cases = [
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "repeated Content-Length"),
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", "repeated Content-Length"),
            ("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n", "invalid Content-Length"),
            ("HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n", "invalid Content-Length"),
            ("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "invalid Content-Length"),
            ("HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n", "invalid Content-Length"),
            ("HTTP/1.1 200 OK\r\nContent-Length: 1 0\r\n\r\n", "invalid Content-Length"),
            ("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", "invalid Content-Length"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, identity\r\n\r\n", "Transfer-Encoding other than a single chunked"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "Transfer-Encoding other than a single chunked"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", "repeated Transfer-Encoding"),
            ("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "Transfer-Encoding in an HTTP/1.0 response"),
            ("HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n", "invalid header name"),
            ("HTTP/1.1 200 OK\nContent-Length: 0\n\n", "bare LF line ending"),
            ("HTTP/1.1 200 OK\r\nContent-Length: 0\n\r\n", "bare LF line ending"),
            ("HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", "invalid header name"),
            ("HTTP/1.1 200 OK\r\nContent-Length : 0\r\n\r\n", "invalid header name"),
            ("HTTP/2.0 200 OK\r\n\r\n", "unsupported HTTP version"),
            ("HTTP/1.1 2000 OK\r\n\r\n", "invalid status line"),
            ("HTTP/1.1 099 Low\r\n\r\n", "invalid status code"),
        ];
        for (raw, why) in cases {
            assert_eq!(refused(raw), why, "{raw:?}");
        }
    }

    #[test]
    fn an_over_size_head_is_refused() {
        let raw = format!("HTTP/1.1 200 OK\r\nX-Filler: {}", "a".repeat(MAX_HEAD));
        // Partial (no end yet) and too long: refused without waiting for more.
        assert_eq!(refused(&raw), "response head too large");
    }

    #[test]
    fn the_keepalive_hint_is_read() {
        let (h, _) = final_head(
            "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(
            keepalive_hint(&h.headers),
            Some(std::time::Duration::from_secs(5))
        );
    }
}
