//! A downstream request head, parsed once with `httparse`: the parse is also the strict
//! framing check. A head the own server does not serve (`Expect`, `Upgrade`, `CONNECT`) or
//! would have to refuse is left where it is and handed over, with the bytes after it, to
//! the hyper path behind `crate::listener::Framer`, which answers it as before (400, 414,
//! 431): the rules live in one place, and every refusal is logged and counted as before.
//!
//! A head the request path would forward unchanged keeps its fields as received
//! (`crate::h1::fields`): no `HeaderMap` is made of it.

use std::mem::MaybeUninit;
use std::ops::Range;

use bytes::BytesMut;
use http::header::HeaderValue;
use http::{HeaderMap, Method, Request, Uri, Version};

use crate::body::down::{DownBody, OwnBody};
use crate::h1::body::{Decoder, Piece};
use crate::h1::fields::RawFields;
use crate::h1::head::{trim_ows, Framing};
use crate::headers::Present;
use crate::proxy::DownRequest;

/// hyper's limit on header fields in a request; more is answered 431 on the hyper path.
const MAX_HEADERS: usize = 100;
/// Header fields upkeep may add to a request before it goes upstream.
const ADDED_UPSTREAM: usize = 6;
/// hyper answers 414 for a longer request target.
const MAX_TARGET: usize = u16::MAX as usize - 1;

/// What the start of the read buffer holds.
pub(crate) enum Parsed {
    /// Not a complete head yet.
    Partial,
    /// A complete head, taken off the buffer.
    Request(Head),
    /// A head for the hyper path (to refuse, or with `Expect`, `Upgrade`...): the buffer
    /// is left untouched.
    HandOver,
}

/// A request the own server serves, with what the response writer needs to know of it.
pub(crate) struct Head {
    /// The request, and its fields as received when the head qualifies
    /// (`crate::h1::fields`; its map is then empty); its body is attached by the server
    /// (`body` says how it is framed). Boxed as `crate::proxy::handle_with` takes it.
    pub request: Box<DownRequest>,
    /// Which of the fields the request path reads it carries (of the kept lines when the
    /// fields are kept as received).
    pub present: Present,
    /// The client may send another request on this connection after the response.
    pub keep_alive: bool,
    /// An HTTP/1.0 client: no chunked response body, keep-alive only when asked.
    pub http10: bool,
    /// A `HEAD` request: the response has no body.
    pub head_method: bool,
    /// How the request body is framed; `None`: it has none.
    pub body: Option<Framing>,
}

/// One header field of the head being parsed: where its name and value lie in the head, and
/// what it is to the request path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Field {
    name: (usize, usize),
    value: (usize, usize),
    present: Present,
}

/// Header fields of the head being parsed (scratch space).
pub(crate) type Fields = Vec<Field>;

thread_local! {
    /// The thread's scratch space for [`parse`] (`crate::spare::with_scratch`).
    static FIELDS: std::cell::Cell<Fields> = const { std::cell::Cell::new(Vec::new()) };
}

/// Parses the head at the start of `buf`, with the thread's scratch space.
#[inline]
pub(crate) fn parse(buf: &mut BytesMut, max_head: usize) -> Parsed {
    crate::spare::with_scratch(&FIELDS, |fields| parse_with(buf, fields, max_head, true))
}

/// [`parse`]; `as_received`: keep the fields as received when the head qualifies (`false`
/// makes a map of every head, as the comparison of the two ways does).
pub(crate) fn parse_with(
    buf: &mut BytesMut,
    fields: &mut Fields,
    max_head: usize,
    as_received: bool,
) -> Parsed {
    fields.clear();
    let base = buf.as_ptr() as usize;
    let (len, method, target, minor) = {
        let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
            &mut req,
            &buf[..],
            &mut slots,
        ) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() <= max_head => return Parsed::Partial,
            // Over-size, or malformed: hyper answers 431 or 400, as it always has.
            _ => return Parsed::HandOver,
        };
        if len > max_head {
            return Parsed::HandOver;
        }
        let (Some(m), Some(path), Some(minor)) = (req.method, req.path, req.version) else {
            return Parsed::HandOver;
        };
        if path.len() > MAX_TARGET {
            return Parsed::HandOver;
        }
        let Ok(method) = Method::from_bytes(m.as_bytes()) else {
            return Parsed::HandOver;
        };
        if method == Method::CONNECT {
            return Parsed::HandOver;
        }
        for h in req.headers.iter() {
            let name = h.name.as_ptr() as usize - base;
            let value = h.value.as_ptr() as usize - base;
            fields.push(Field {
                name: (name, name + h.name.len()),
                value: (value, value + h.value.len()),
                present: Present::of_name(h.name.as_bytes()),
            });
        }
        let target_start = path.as_ptr() as usize - base;
        (len, method, target_start..target_start + path.len(), minor)
    };
    // One look at each field: the framing check's rules, the connection's fate, and whether
    // the fields can go on as received.
    let mut present = Present::default();
    let (mut hosts, mut lengths, mut cookies, mut ids) = (0, 0, 0, 0);
    let mut length = 0u64;
    let mut chunked = false;
    let (mut close, mut keep) = (false, false);
    let mut raw = as_received && minor == 1;
    for f in fields.iter() {
        let p = f.present;
        let value = &buf[f.value.0..f.value.1];
        present = present.with(p);
        if p == Present::default() {
        } else if p.has(Present::CONTENT_LENGTH) {
            // 1*DIGIT and nothing else: no sign, list, hex or inner space.
            let v = trim_ows(value);
            if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
                return Parsed::HandOver;
            }
            length = v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            lengths += 1;
        } else if p.has(Present::HOST) {
            hosts += 1;
        } else if p.has(Present::TRANSFER_ENCODING) {
            // One `chunked`, on HTTP/1.1, nothing else (RFC 9112 §6.1).
            if chunked || minor != 1 || !trim_ows(value).eq_ignore_ascii_case(b"chunked") {
                return Parsed::HandOver;
            }
            chunked = true;
            raw = false;
        } else if p.has(Present::UPGRADE) || p.has(Present::EXPECT) {
            return Parsed::HandOver;
        } else if p.has(Present::CONNECTION) {
            for t in value.split(|&b| b == b',') {
                let t = trim_ows(t);
                let (c, k) = (
                    t.eq_ignore_ascii_case(b"close"),
                    t.eq_ignore_ascii_case(b"keep-alive"),
                );
                close |= c;
                keep |= k;
                // A field it names is removed on the map's path.
                raw &= c || k || t.is_empty();
            }
        } else if p.has(Present::COOKIE) {
            cookies += 1;
        } else if p.has(Present::X_REQUEST_ID) {
            // Kept when it is the only one and valid; replaced on the map's path otherwise.
            ids += 1;
            raw &= ids == 1 && crate::request_id::is_valid(value);
        } else if p.has(Present::CONTENT_TYPE) {
            raw &= !crate::grpc::is_grpc_content_type(value);
        } else {
            // Forwarding fields (rewritten), other hop-by-hop fields (removed).
            raw = false;
        }
    }
    let present = present.cookie_crumbs(cookies);
    raw &= cookies <= 1;
    // The framing check's rules: one Host, and one at all on HTTP/1.1.
    if hosts > 1 || (hosts == 0 && minor == 1) {
        return Parsed::HandOver;
    }
    if lengths > 1 || (lengths == 1 && chunked) {
        return Parsed::HandOver;
    }
    let body = if chunked {
        Some(Framing::Chunked)
    } else {
        (length > 0).then_some(Framing::Length(length))
    };
    if body == Some(Framing::Chunked) && !chunks_valid(&buf[len..]) {
        // The framing check refuses the request whole, before any upstream sees its head.
        return Parsed::HandOver;
    }
    let http10 = minor == 0;
    // The fields, kept as received or in a map (`None`: the request's own empty map stays,
    // not replaced by another one and dropped).
    let made = if raw && canonical_lines(&buf[..len], fields) {
        as_received_fields(buf, len, target, fields, lengths.eq(&1).then_some(length))
            .map(|(uri, f)| (uri, None, Some(f)))
    } else {
        in_a_map(buf, len, target, fields).map(|(uri, map)| (uri, Some(map), None))
    };
    let Some((uri, headers, raw_fields)) = made else {
        return Parsed::HandOver;
    };
    let kept = raw_fields.is_some();
    let mut request = Box::new(DownRequest {
        req: Request::new(DownBody::Own(OwnBody::empty())),
        fields: raw_fields,
    });
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = if http10 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    if let Some(map) = headers {
        *request.headers_mut() = map;
    }
    let head_method = request.method() == Method::HEAD;
    Parsed::Request(Head {
        request,
        // The `Connection` line is not among the fields kept as received.
        present: if kept {
            present.without(Present::CONNECTION.with(Present::HOP_BY_HOP))
        } else {
            present
        },
        // As hyper decides: HTTP/1.1 keeps the connection unless told `close`; HTTP/1.0
        // only when asked with `keep-alive`.
        keep_alive: !close && (!http10 || keep),
        http10,
        head_method,
        body,
    })
}

/// Whether every field line of the complete head `head` is in the form the map's path
/// writes: `name: value` (one space, a value that is not empty), then CRLF, and the blank
/// line a CRLF. Each line runs from its name to the next one's (httparse refuses folded
/// lines and takes no LF inside a line); the last ends before the blank line. Any other
/// spacing, and a bare LF at any line end, makes a map (which writes the canonical form).
fn canonical_lines(head: &[u8], fields: &[Field]) -> bool {
    let end = head.len() - 2;
    head[end] == b'\r'
        && fields.iter().enumerate().all(|(i, f)| {
            let next = fields.get(i + 1).map_or(end, |g| g.name.0);
            f.value.0 == f.name.1 + 2
                && head[f.name.1 + 1] == b' '
                && f.value.1 > f.value.0
                && next == f.value.1 + 2
                && head[f.value.1] == b'\r'
        })
}

/// Takes the head of `len` bytes off `buf` keeping its fields as received: names lowercased
/// and `Connection` lines left out, in place (only the lines after a dropped one move). `None`
/// leaves `buf` as it was, for the hand-over (a target `http` refuses).
fn as_received_fields(
    buf: &mut BytesMut,
    len: usize,
    target: Range<usize>,
    fields: &[Field],
    length: Option<u64>,
) -> Option<(Uri, RawFields)> {
    let first = fields.first().map_or(len - 2, |f| f.name.0);
    let mut lines = buf.split_to(len);
    let line = lines.split_to(first).freeze();
    let Ok(uri) = Uri::from_maybe_shared(line.slice(target)) else {
        // Nothing of it changed yet: the head goes back whole.
        put_back(&[&line, &lines], buf);
        return None;
    };
    let mut out = 0;
    let mut host = None;
    let mut count = 0;
    for (i, f) in fields.iter().enumerate() {
        let start = f.name.0 - first;
        let end = fields.get(i + 1).map_or(len - 2, |g| g.name.0) - first;
        if f.present.has(Present::CONNECTION) {
            continue;
        }
        crate::h1::head::lowercase_name(&mut lines[start..f.name.1 - first]);
        if out != start {
            lines.copy_within(start..end, out);
        }
        if f.present.has(Present::HOST) {
            let at = out + (f.value.0 - f.name.0);
            host = Some(at..at + (f.value.1 - f.value.0));
        }
        out += end - start;
        count += 1;
    }
    lines.truncate(out);
    let lines = lines.freeze();
    // `httparse` takes the bytes in a value that `http` does: this cannot fail.
    let host = host.and_then(|r| HeaderValue::from_maybe_shared(lines.slice(r)).ok());
    Some((uri, RawFields::new(lines, host, length, count)))
}

/// Takes the head of `len` bytes off `buf` and makes a map of its fields. `None` leaves `buf`
/// as it was, for the hand-over (a target or field `http` refuses).
fn in_a_map(
    buf: &mut BytesMut,
    len: usize,
    target: Range<usize>,
    fields: &[Field],
) -> Option<(Uri, HeaderMap)> {
    let raw = buf.split_to(len).freeze();
    let Ok(uri) = Uri::from_maybe_shared(raw.slice(target)) else {
        // hyper answers 400 for a target it cannot parse: the head goes back for it.
        put_back(&[&raw], buf);
        return None;
    };
    // Room for the fields upkeep adds on the way upstream (`x-request-id`, `x-forwarded-*`
    // or `forwarded`, `host`): a map that fills up is rehashed into a new table, which cost
    // more than the parse itself.
    let mut headers = crate::headers::map_with_capacity(fields.len() + ADDED_UPSTREAM);
    for f in fields {
        let name = crate::h1::names::header_name(&raw[f.name.0..f.name.1]);
        let value = HeaderValue::from_maybe_shared(raw.slice(f.value.0..f.value.1));
        let (Ok(name), Ok(value)) = (name, value) else {
            put_back(&[&raw], buf);
            return None;
        };
        headers.append(name, value);
    }
    Some((uri, headers))
}

/// Whether the chunked body bytes already read (`after`, what follows the head) are valid
/// so far, as the body decoder will find them.
fn chunks_valid(after: &[u8]) -> bool {
    if after.is_empty() {
        return true;
    }
    let mut decoder = Decoder::new(Framing::Chunked);
    let mut probe = BytesMut::from(after);
    loop {
        match decoder.decode(&mut probe) {
            Ok(Some(Piece::End) | None) => return true,
            Ok(Some(_)) => {}
            Err(_) => return false,
        }
    }
}

/// Puts a head taken off the buffer back in front of what followed it (rare: a head that
/// `httparse` passed and `http` refuses).
fn put_back(head: &[&[u8]], buf: &mut BytesMut) {
    let len = head.iter().map(|p| p.len()).sum::<usize>();
    let mut back = BytesMut::with_capacity(len + buf.len());
    for part in head {
        back.extend_from_slice(part);
    }
    back.extend_from_slice(buf);
    *buf = back;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(raw: &[u8]) -> (Parsed, BytesMut) {
        let mut buf = BytesMut::from(raw);
        let p = parse(&mut buf, 8192);
        (p, buf)
    }

    #[test]
    fn a_head_is_taken_off_and_what_follows_stays() {
        let (p, rest) = parse_all(b"GET /a?b HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\r\nGET /next");
        let Parsed::Request(h) = p else {
            panic!("not parsed")
        };
        assert_eq!(h.request.uri(), "/a?b");
        assert_eq!(h.request.fields.unwrap().lines(), b"host: x\r\nx-a: 1\r\n");
        assert!(h.keep_alive && !h.http10 && h.body.is_none());
        assert_eq!(&rest[..], b"GET /next");
        assert!(matches!(
            parse_all(b"GET / HTTP/1.1\r\nHost: x\r\n").0,
            Parsed::Partial
        ));
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection_field() {
        let ka = |raw: &[u8]| match parse_all(raw).0 {
            Parsed::Request(h) => h.keep_alive,
            _ => panic!("not parsed"),
        };
        assert!(ka(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(!ka(
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        ));
        assert!(!ka(b"GET / HTTP/1.0\r\n\r\n"));
        assert!(ka(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
    }

    fn kept(raw: &[u8]) -> Option<RawFields> {
        crate::h1::server::request_invariants(raw);
        match parse_all(raw).0 {
            Parsed::Request(h) => h.request.fields,
            _ => panic!("not parsed: {:?}", String::from_utf8_lossy(raw)),
        }
    }

    #[test]
    fn a_plain_head_keeps_its_fields_as_received_without_a_map() {
        let raw =
            b"POST /a HTTP/1.1\r\nHost: a.test\r\nConnection: keep-alive\r\nUser-Agent: t/1\r\n\
Content-Length: 3\r\nCookie: c=1\r\nX-Request-Id: abc-1\r\nContent-Type: text/plain\r\n\r\nabc";
        let (p, rest) = parse_all(raw);
        let Parsed::Request(h) = p else {
            panic!("not parsed")
        };
        assert!(h.request.headers().is_empty(), "no map is made");
        let f = h.request.fields.clone().expect("kept as received");
        assert_eq!(
            f.lines(),
            b"host: a.test\r\nuser-agent: t/1\r\ncontent-length: 3\r\ncookie: c=1\r\n\
x-request-id: abc-1\r\ncontent-type: text/plain\r\n",
            "names lowercased, the Connection line left out, the rest as sent"
        );
        assert_eq!(f.host().unwrap(), "a.test");
        assert_eq!(f.length(), Some(3));
        assert!(h.present.has(Present::HOST) && h.present.has(Present::X_REQUEST_ID));
        assert!(!h.present.has(Present::CONNECTION) && !h.present.has(Present::HOP_BY_HOP));
        assert!(h.keep_alive);
        assert_eq!(h.body, Some(Framing::Length(3)));
        assert_eq!(&rest[..], b"abc");
        crate::h1::server::request_invariants(raw);
        // `Connection: close` goes the same way, and ends the connection.
        let close = b"GET / HTTP/1.1\r\nConnection: close\r\nHost: a\r\n\r\n";
        assert_eq!(kept(close).unwrap().lines(), b"host: a\r\n");
        let Parsed::Request(h) = parse_all(close).0 else {
            panic!("not parsed")
        };
        assert!(!h.keep_alive);
    }

    #[test]
    fn heads_the_request_path_rewrites_or_in_another_form_are_made_into_a_map() {
        let cases: &[&[u8]] = &[
            // What the path removes, rewrites or replaces.
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: x-secret\r\nX-Secret: 1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nKeep-Alive: timeout=5\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nProxy-Authorization: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nForwarded: for=10.0.0.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: has space\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: a\r\nX-Request-Id: b\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/grpc\r\n\r\n",
            b"GET / HTTP/1.0\r\nHost: a\r\n\r\n",
            // Another form than `name: value` CRLF.
            b"GET / HTTP/1.1\r\nHost:a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost:  a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a \r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-Empty:\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\nX-A: 1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n\n",
        ];
        for c in cases {
            assert!(
                kept(c).is_none(),
                "kept as received: {:?}",
                String::from_utf8_lossy(c)
            );
        }
    }

    #[test]
    fn a_target_http_refuses_leaves_a_head_that_qualifies_untouched() {
        let raw: &[u8] = b"GET /\xff HTTP/1.1\r\nHost: A\r\n\r\nGET /next";
        let (p, rest) = parse_all(raw);
        assert!(matches!(p, Parsed::HandOver));
        assert_eq!(&rest[..], raw, "the buffer is left as it was");
        crate::h1::server::request_invariants(raw);
    }

    #[test]
    fn bodies_are_framed_and_ambiguous_or_unserved_heads_are_handed_over_untouched() {
        let framing = |raw: &[u8]| match parse_all(raw).0 {
            Parsed::Request(h) => h.body,
            _ => panic!("not parsed"),
        };
        assert_eq!(
            framing(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\n"),
            Some(Framing::Length(12))
        );
        assert_eq!(
            framing(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
            None
        );
        assert_eq!(
            framing(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab"),
            Some(Framing::Chunked)
        );
        let cases: &[&[u8]] = &[
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",
            b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
        ];
        for c in cases {
            let (p, rest) = parse_all(c);
            assert!(
                matches!(p, Parsed::HandOver),
                "served {:?}",
                String::from_utf8_lossy(c)
            );
            assert_eq!(&rest[..], *c, "the buffer is left as it was");
        }
    }
}
