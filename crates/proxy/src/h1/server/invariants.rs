//! The own server's request reading on any input, for the fuzz target `h1_server_request`
//! (`fuzz/`) and the corpus replay test: the head parse (`request`) and the request body
//! decoder as the connection task drives them, without I/O.

use bytes::BytesMut;
use http::HeaderMap;

use super::request::{self, Fields, Parsed};
use crate::h1::body::{Decoder, Piece};
use crate::h1::head::Framing;
use crate::listener::Framer;

/// `max_header_bytes` of the simulated listener (the framing check uses the same).
const MAX_HEAD: usize = 8192;

/// What the server made of one request.
#[derive(Debug, PartialEq)]
enum Event {
    /// A head it serves, starting at byte `at` of the input.
    Request {
        at: usize,
        method: String,
        target: String,
        http10: bool,
        headers: Vec<(String, Vec<u8>)>,
        keep_alive: bool,
        body: Option<Framing>,
    },
    /// The whole body of the request before it: its data and trailers.
    Body {
        data: Vec<u8>,
        trailers: Vec<(String, Vec<u8>)>,
    },
}

/// How the input left the server.
#[derive(Debug, PartialEq)]
enum End {
    /// It waits for more of a head or a body.
    Partial,
    /// The connection closes after the last response; bytes from `at` on are not read.
    Closed { at: usize },
    /// Handed to hyper at byte `at`, and the framing check passes what follows (hyper
    /// answers it: `Expect`, `Upgrade`, `CONNECT`, 414, 431, a target or field value `http`
    /// refuses).
    HandOver { at: usize },
    /// Refused from byte `at` on (the start of the refused request): handed over and refused
    /// by the framing check (400), or its chunked body turned out malformed after its head
    /// was served.
    Refused { at: usize },
}

/// Reads `data` as one connection receiving it in `parts`; the body is read to its end, as
/// a handler that forwards it does.
fn serve(data: &[u8], parts: &mut dyn Iterator<Item = &[u8]>) -> (Vec<Event>, End) {
    struct Reading {
        decoder: Decoder,
        head_at: usize,
        keep_alive: bool,
        data: Vec<u8>,
        trailers: Vec<(String, Vec<u8>)>,
    }
    let mut buf = BytesMut::new();
    let mut fields = Fields::new();
    let mut events = Vec::new();
    let mut body: Option<Reading> = None;
    let mut fed = 0;
    for part in parts {
        buf.extend_from_slice(part);
        fed += part.len();
        loop {
            let at = fed - buf.len();
            if let Some(r) = &mut body {
                match r.decoder.decode(&mut buf) {
                    Ok(None) => break,
                    Ok(Some(Piece::Data(d))) => r.data.extend_from_slice(&d),
                    Ok(Some(Piece::Trailers(t))) => r.trailers = fields_of(&t),
                    Ok(Some(Piece::End)) => {
                        let r = body.take().expect("a body is being read");
                        events.push(Event::Body {
                            data: r.data,
                            trailers: r.trailers,
                        });
                        if !r.keep_alive {
                            return (
                                events,
                                End::Closed {
                                    at: fed - buf.len(),
                                },
                            );
                        }
                    }
                    Err(_) => {
                        // The head went upstream; the request fails with its body.
                        events.pop();
                        return (events, End::Refused { at: r.head_at });
                    }
                }
                continue;
            }
            if buf.is_empty() {
                break;
            }
            match request::parse_with(&mut buf, &mut fields, MAX_HEAD, true) {
                Parsed::Partial => break,
                Parsed::HandOver => {
                    let end = if framing_accepts(&data[at..]) {
                        End::HandOver { at }
                    } else {
                        End::Refused { at }
                    };
                    return (events, end);
                }
                Parsed::Request(h) => {
                    let req = &h.request;
                    events.push(Event::Request {
                        at,
                        method: req.method().to_string(),
                        target: req.uri().to_string(),
                        http10: h.http10,
                        headers: fields_of(&map_of(&h)),
                        keep_alive: h.keep_alive,
                        body: h.body,
                    });
                    match h.body {
                        Some(framing) => {
                            body = Some(Reading {
                                decoder: Decoder::new(framing),
                                head_at: at,
                                keep_alive: h.keep_alive,
                                data: Vec::new(),
                                trailers: Vec::new(),
                            });
                        }
                        None if !h.keep_alive => {
                            return (
                                events,
                                End::Closed {
                                    at: fed - buf.len(),
                                },
                            );
                        }
                        None => {}
                    }
                }
            }
        }
    }
    (events, End::Partial)
}

/// The request's fields in a map: its own, or those kept as received.
fn map_of(h: &request::Head) -> HeaderMap {
    match &h.request.fields {
        Some(f) => {
            assert!(
                h.request.headers().is_empty(),
                "fields both kept and mapped"
            );
            let mut map = HeaderMap::new();
            f.fill(&mut map).expect("kept fields make a map");
            map
        }
        None => h.request.headers().clone(),
    }
}

/// The first head of `data` parsed keeping its fields as received where it qualifies, and
/// parsed into a map: the same verdict, the same request, what stays in the buffer the same,
/// and the same fields, but for the `Connection` line the kept ones leave out (the map's path
/// removes it before the request goes upstream). What the request path reads of them
/// (`Present`) agrees with the fields it reads.
fn kept_fields_agree_with_the_map(data: &[u8]) {
    let (mut a, mut b) = (BytesMut::from(data), BytesMut::from(data));
    let (mut fa, mut fb) = (Fields::new(), Fields::new());
    let kept = request::parse_with(&mut a, &mut fa, MAX_HEAD, true);
    let mapped = request::parse_with(&mut b, &mut fb, MAX_HEAD, false);
    assert_eq!(a, b, "the buffers differ after the two parses");
    let (kept, mapped) = match (kept, mapped) {
        (Parsed::Request(k), Parsed::Request(m)) => (k, m),
        (Parsed::Partial, Parsed::Partial) | (Parsed::HandOver, Parsed::HandOver) => return,
        _ => panic!("the two parses give different verdicts"),
    };
    assert!(mapped.request.fields.is_none());
    assert_eq!(
        mapped.present,
        crate::headers::Present::of(mapped.request.headers())
    );
    let (rk, rm) = (&kept.request, &mapped.request);
    assert_eq!(
        (rk.method(), rk.uri(), rk.version()),
        (rm.method(), rm.uri(), rm.version())
    );
    assert_eq!(
        (kept.keep_alive, kept.http10, kept.head_method, kept.body),
        (
            mapped.keep_alive,
            mapped.http10,
            mapped.head_method,
            mapped.body
        )
    );
    let mut want = mapped.request.headers().clone();
    if let Some(f) = &kept.request.fields {
        want.remove(http::header::CONNECTION);
        assert_eq!(
            f.host(),
            want.get(http::header::HOST),
            "the kept Host is not the field's"
        );
        let length = want
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.trim().parse().ok());
        assert_eq!(f.length(), length);
    }
    let got = map_of(&kept);
    // By name (a map's removal moves its last field into the gap); one name's values stay
    // in their order.
    let by_name = |map: &HeaderMap| {
        let mut f = fields_of(map);
        f.sort_by(|a, b| a.0.cmp(&b.0));
        f
    };
    assert_eq!(
        by_name(&got),
        by_name(&want),
        "the kept fields are not the map's"
    );
    assert_eq!(kept.present, crate::headers::Present::of(&got));
}

fn fields_of(map: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    map.iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}

/// Whether the framing check passes `data` (fed whole) without refusing it.
fn framing_accepts(data: &[u8]) -> bool {
    let mut out = BytesMut::new();
    Framer::new(MAX_HEAD).feed(data, &mut out).is_ok()
}

/// The own server's request reading on any input, for the fuzz target `h1_server_request`
/// and the corpus replay test. It never panics, and:
///
/// - whole, in two parts split where the first byte says, or byte by byte (inputs up to
///   4 KiB), the connection serves the same requests (method, target, version, fields,
///   keep-alive, body framing, body data and trailers) and ends the same way: waiting for
///   more, closed after a response, handed to hyper at the same byte, or refused from the
///   same request on;
/// - it agrees with the framing check (`crate::listener::framing`) on the same bytes: the
///   check passes every byte the server served, and a request the server refuses is one
///   the check refuses too;
/// - a head whose fields are kept as received (`crate::h1::fields`) is the request a map of
///   them makes, with the same fields but the `Connection` line.
///
/// One difference is by design and folded into "refused": a chunked body found malformed
/// in the bytes that came with its head gets the request refused whole (handed over, the
/// framing check answers 400) before any upstream sees it, while one found malformed in a
/// later read fails mid-body, after its head went upstream, as on hyper's path behind the
/// framing check. Heads the server hands over that the framing check passes are hyper's to
/// answer (`Expect`, `Upgrade`, `CONNECT`, more than 100 fields, 414, 431, targets and
/// values `http` does not take): they are "handed over", not compared.
pub fn request_invariants(data: &[u8]) {
    kept_fields_agree_with_the_map(data);
    let (events, end) = serve(data, &mut std::iter::once(data));
    let split = data.first().map_or(0, |&b| usize::from(b)) % (data.len() + 1);
    let two = serve(data, &mut [&data[..split], &data[split..]].into_iter());
    assert_eq!(
        (&events, &end),
        (&two.0, &two.1),
        "the verdict depends on a split at {split}"
    );
    if data.len() <= 4096 {
        let bytes = serve(data, &mut data.chunks(1));
        assert_eq!(
            (&events, &end),
            (&bytes.0, &bytes.1),
            "the verdict differs byte by byte"
        );
    }
    // Every byte served (and, waiting, every byte read) passes the framing check.
    let served = match end {
        End::Partial => data.len(),
        End::Closed { at } | End::HandOver { at } | End::Refused { at } => at,
    };
    assert!(
        framing_accepts(&data[..served]),
        "served bytes the framing check refuses: {:?}",
        String::from_utf8_lossy(&data[..served])
    );
    if let End::Refused { .. } = end {
        assert!(
            !framing_accepts(data),
            "refused a request the framing check passes"
        );
    }
    for e in &events {
        if let Event::Body { data: body, .. } = e {
            assert!(body.len() <= data.len(), "a body larger than its input");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipelined_requests_are_served_in_order_and_the_close_stops_reading() {
        let input: &[u8] = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc\
GET /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nT: 1\r\n\r\n\
GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\n";
        let (events, end) = serve(input, &mut input.chunks(1));
        let targets: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::Request { target, .. } => Some(target.as_str()),
                Event::Body { .. } => None,
            })
            .collect();
        assert_eq!(targets, ["/a", "/b", "/c"]);
        assert!(events.contains(&Event::Body {
            data: b"hi".to_vec(),
            trailers: vec![("t".to_owned(), b"1".to_vec())],
        }));
        let never = input.len() - b"GET /never HTTP/1.1\r\n".len();
        assert_eq!(end, End::Closed { at: never });
        request_invariants(input);
    }

    #[test]
    fn a_malformed_chunked_body_is_refused_whether_it_comes_with_its_head_or_later() {
        let input: &[u8] =
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\nPOST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX";
        let at = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".len();
        assert_eq!(
            serve(input, &mut std::iter::once(input)).1,
            End::Refused { at }
        );
        assert_eq!(serve(input, &mut input.chunks(1)).1, End::Refused { at });
        request_invariants(input);
    }

    #[test]
    fn unserved_heads_are_handed_over_and_smuggling_shapes_refused() {
        let up: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n";
        assert_eq!(
            serve(up, &mut std::iter::once(up)).1,
            End::HandOver { at: 0 }
        );
        let te_cl: &[u8] =
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(
            serve(te_cl, &mut std::iter::once(te_cl)).1,
            End::Refused { at: 0 }
        );
        request_invariants(up);
        request_invariants(te_cl);
    }
}
