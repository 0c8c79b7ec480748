//! A downstream request head, parsed once with `httparse`: the parse is also the strict
//! framing check. A head the own server does not serve (`Expect`, `Upgrade`, `CONNECT`) or
//! would have to refuse is left where it is and handed over, with the bytes after it, to
//! the hyper path behind `crate::listener::Framer`, which answers it as before (400, 414,
//! 431): the rules live in one place, and every refusal is logged and counted as before.

use std::mem::MaybeUninit;

use bytes::BytesMut;
use http::header::{HeaderName, HeaderValue};
use http::{Method, Request, Uri, Version};

use crate::body::down::{DownBody, OwnBody};
use crate::h1::body::{Decoder, Piece};
use crate::h1::head::{trim_ows, Framing};

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
    /// The request; its body is attached by the server (`body` says how it is framed). Boxed
    /// as `crate::proxy::handle_with` takes it.
    pub request: Box<Request<DownBody>>,
    /// The client may send another request on this connection after the response.
    pub keep_alive: bool,
    /// An HTTP/1.0 client: no chunked response body, keep-alive only when asked.
    pub http10: bool,
    /// A `HEAD` request: the response has no body.
    pub head_method: bool,
    /// How the request body is framed; `None`: it has none.
    pub body: Option<Framing>,
}

/// Header fields of the head being parsed: name, and where its value lies in the head.
pub(crate) type Fields = Vec<(HeaderName, usize, usize)>;

/// Parses the head at the start of `buf`; `fields` is scratch space kept by the connection.
pub(crate) fn parse(buf: &mut BytesMut, fields: &mut Fields, max_head: usize) -> Parsed {
    fields.clear();
    let base = buf.as_ptr() as usize;
    let (len, method, target, minor, body) = {
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
        let mut hosts = 0;
        let mut length = 0u64;
        let mut chunked = false;
        for h in req.headers.iter() {
            let Ok(name) = crate::h1::names::header_name(h.name.as_bytes()) else {
                return Parsed::HandOver;
            };
            if name == http::header::CONTENT_LENGTH {
                // 1*DIGIT and nothing else: no sign, list, hex or inner space.
                let v = trim_ows(h.value);
                if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
                    return Parsed::HandOver;
                }
                length = v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            } else if name == http::header::TRANSFER_ENCODING {
                // One `chunked`, on HTTP/1.1, nothing else (RFC 9112 §6.1).
                if chunked || minor != 1 || !trim_ows(h.value).eq_ignore_ascii_case(b"chunked") {
                    return Parsed::HandOver;
                }
                chunked = true;
            } else if name == http::header::UPGRADE || name == http::header::EXPECT {
                return Parsed::HandOver;
            } else if name == http::header::HOST {
                hosts += 1;
            }
            let start = h.value.as_ptr() as usize - base;
            fields.push((name, start, start + h.value.len()));
        }
        // The framing check's rules: one Host, and one at all on HTTP/1.1.
        if hosts > 1 || (hosts == 0 && minor == 1) {
            return Parsed::HandOver;
        }
        let cl = fields
            .iter()
            .filter(|(n, _, _)| *n == http::header::CONTENT_LENGTH)
            .count();
        if cl > 1 || (cl == 1 && chunked) {
            return Parsed::HandOver;
        }
        let target_start = path.as_ptr() as usize - base;
        (
            len,
            method,
            target_start..target_start + path.len(),
            minor,
            if chunked {
                Some(Framing::Chunked)
            } else {
                (length > 0).then_some(Framing::Length(length))
            },
        )
    };
    if body == Some(Framing::Chunked) && !chunks_valid(&buf[len..]) {
        // The framing check refuses the request whole, before any upstream sees its head.
        return Parsed::HandOver;
    }
    let raw = buf.split_to(len).freeze();
    let Ok(uri) = Uri::from_maybe_shared(raw.slice(target.clone())) else {
        // hyper answers 400 for a target it cannot parse: the head goes back for it.
        put_back(&raw, buf);
        return Parsed::HandOver;
    };
    // Room for the fields upkeep adds on the way upstream (`x-request-id`, `x-forwarded-*`
    // or `forwarded`, `host`): a map that fills up is rehashed into a new table, which cost
    // more than the parse itself.
    let mut headers = crate::headers::map_with_capacity(fields.len() + ADDED_UPSTREAM);
    let mut close = false;
    let mut keep = false;
    for (name, s, e) in fields.drain(..) {
        let Ok(value) = HeaderValue::from_maybe_shared(raw.slice(s..e)) else {
            put_back(&raw, buf);
            return Parsed::HandOver;
        };
        if name == http::header::CONNECTION {
            for t in value.as_bytes().split(|&b| b == b',') {
                let t = trim_ows(t);
                close |= t.eq_ignore_ascii_case(b"close");
                keep |= t.eq_ignore_ascii_case(b"keep-alive");
            }
        }
        headers.append(name, value);
    }
    let http10 = minor == 0;
    let mut request = Box::new(Request::new(DownBody::Own(OwnBody::empty())));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = if http10 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    *request.headers_mut() = headers;
    let head_method = request.method() == Method::HEAD;
    Parsed::Request(Head {
        request,
        // As hyper decides: HTTP/1.1 keeps the connection unless told `close`; HTTP/1.0
        // only when asked with `keep-alive`.
        keep_alive: !close && (!http10 || keep),
        http10,
        head_method,
        body,
    })
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
fn put_back(raw: &[u8], buf: &mut BytesMut) {
    let mut back = BytesMut::with_capacity(raw.len() + buf.len());
    back.extend_from_slice(raw);
    back.extend_from_slice(buf);
    *buf = back;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(raw: &[u8]) -> (Parsed, BytesMut) {
        let mut buf = BytesMut::from(raw);
        let mut fields = Fields::new();
        let p = parse(&mut buf, &mut fields, 8192);
        (p, buf)
    }

    #[test]
    fn a_head_is_taken_off_and_what_follows_stays() {
        let (p, rest) = parse_all(b"GET /a?b HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\r\nGET /next");
        let Parsed::Request(h) = p else {
            panic!("not parsed")
        };
        assert_eq!(h.request.uri(), "/a?b");
        assert_eq!(h.request.headers()["x-a"], "1");
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
