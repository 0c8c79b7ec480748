//! The upstream's response head, parsed once with `httparse`; the parse is also the strict
//! framing check (the response twin of `crate::listener::framing`). A head that could be
//! framed two ways is refused, never passed on: repeated or malformed `Content-Length`, a
//! `Transfer-Encoding` other than a single `chunked`, obsolete line folding, bare LF line
//! ends, header names with spaces, an over-size head. The rules are in docs/http1.md.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::HeaderValue;
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
    /// `None` when the head is passed on as received (`raw`): no map is made, nor one to drop.
    pub headers: Option<HeaderMap>,
    /// How the body is delimited.
    pub framing: Framing,
    /// The upstream allows another request on this connection after this response.
    pub keep_alive: bool,
    /// The fields as received, when the caller asked for them that way and the head allows it
    /// (see [`RawHead`]); `headers` is then empty.
    pub raw: Option<RawHead>,
    /// No hop-by-hop field is left to remove: the head has none but `Transfer-Encoding`,
    /// `Keep-Alive` and a `Connection` that names only `keep-alive` or `close`, and those are
    /// not in `headers` (nor a `Content-Length` beside `Transfer-Encoding`), which therefore
    /// goes downstream as it is. Otherwise `headers` holds every field received and the
    /// proxy removes the hop-by-hop ones by their names.
    pub hop_free: bool,
    /// The upstream's `Keep-Alive: timeout=N` (its first `Keep-Alive` field).
    pub keepalive_hint: Option<std::time::Duration>,
}

impl Head {
    /// The header fields in a map; an empty one when the head is passed on as received.
    pub fn map(&self) -> &HeaderMap {
        static EMPTY: std::sync::LazyLock<HeaderMap> = std::sync::LazyLock::new(HeaderMap::new);
        self.headers.as_ref().unwrap_or(&EMPTY)
    }
}

/// A response head passed on as received, for upkeep's own HTTP/1 server: no `HeaderMap` is
/// made of it (per field: a name looked up, a value checked again, a hash and an insert; then
/// read back out to be written). Only a head whose every field either goes downstream
/// unchanged or is one the writer makes anew qualifies: no `Trailer`, `TE`, `Upgrade`,
/// `Proxy-*` field, and a `Connection` that names only `keep-alive` or `close` (one naming
/// other fields would remove them). Any other head, and any response to HEAD, is made into
/// a map as before.
#[derive(Debug)]
pub struct RawHead {
    /// The fields that go downstream unchanged, as received except that their names are
    /// lowercased (as `HeaderName` spells them): whole `name: value` lines with their CRLF,
    /// in the order received. No framing field (`Content-Length`, `Transfer-Encoding`), and
    /// no `Connection` or `Keep-Alive` (hop-by-hop: the writer says its own).
    pub fields: Bytes,
    /// A `Date` field is among them.
    pub date: bool,
    /// The `Content-Length` value, when one stands (not under `chunked`, not on a 204).
    pub length: Option<u64>,
    /// `Transfer-Encoding: chunked` stands (not on a 204).
    pub chunked: bool,
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

/// What a response field is to the parser and the writer; found from the name's bytes,
/// without making a `HeaderName`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Passed on as it is.
    Plain,
    /// `Date`: passed on, and the writer adds none.
    Date,
    /// `Content-Length`.
    ContentLength,
    /// `Transfer-Encoding`.
    TransferEncoding,
    /// `Connection`.
    Connection,
    /// `Keep-Alive`.
    KeepAlive,
    /// Another hop-by-hop field (`Trailer`, `TE`, `Upgrade`, `Proxy-Connection`,
    /// `Proxy-Authenticate`, `Proxy-Authorization`): the head is made into a map.
    OtherHop,
}

/// The kind of the field named `name` (case-insensitive).
pub fn kind(name: &[u8]) -> Kind {
    let is = |s: &[u8]| name.eq_ignore_ascii_case(s);
    // The length picks at most two candidates: one comparison for most names.
    match name.len() {
        2 if is(b"te") => Kind::OtherHop,
        4 if is(b"date") => Kind::Date,
        7 if is(b"trailer") || is(b"upgrade") => Kind::OtherHop,
        10 if is(b"connection") => Kind::Connection,
        10 if is(b"keep-alive") => Kind::KeepAlive,
        14 if is(b"content-length") => Kind::ContentLength,
        16 if is(b"proxy-connection") => Kind::OtherHop,
        17 if is(b"transfer-encoding") => Kind::TransferEncoding,
        18 if is(b"proxy-authenticate") => Kind::OtherHop,
        19 if is(b"proxy-authorization") => Kind::OtherHop,
        _ => Kind::Plain,
    }
}

/// One header field of the head being parsed: where its name and value lie in the head, and
/// its kind.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    name: (usize, usize),
    value: (usize, usize),
    kind: Kind,
}

/// Header fields of the head being parsed (scratch space).
pub type Fields = Vec<Field>;

thread_local! {
    /// The thread's scratch space for [`parse_scratch`] (`crate::spare::with_scratch`).
    static FIELDS: std::cell::Cell<Fields> = const { std::cell::Cell::new(Vec::new()) };
}

/// [`parse_with`], with the thread's scratch space.
#[inline]
pub fn parse_scratch(
    buf: &mut BytesMut,
    head_request: bool,
    raw: bool,
) -> Result<Parsed, BadResponse> {
    crate::spare::with_scratch(&FIELDS, |fields| parse_with(buf, head_request, fields, raw))
}

/// Parses a response head at the start of `buf`; `head_request` says the request was HEAD
/// (whose response never has a body, whatever its headers say). A complete head is taken off
/// `buf` (a 1xx as well), so what stays is the body, or the next head.
pub fn parse(buf: &mut BytesMut, head_request: bool) -> Result<Parsed, BadResponse> {
    parse_with(buf, head_request, &mut Fields::new(), false)
}

/// [`parse`], with `fields` as scratch space kept by the connection (no allocation per
/// response); `raw`: the head goes to upkeep's own HTTP/1 server, which takes it as received
/// when it qualifies ([`RawHead`]).
pub fn parse_with(
    buf: &mut BytesMut,
    head_request: bool,
    fields: &mut Fields,
    raw: bool,
) -> Result<Parsed, BadResponse> {
    fields.clear();
    let base = buf.as_ptr() as usize;
    // Uninitialised slots: zeroing 100 of them per response costs more than the parse. One
    // parse: the names and values' places are noted, so that once the head is split off,
    // the values share its bytes (no copy per field).
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
                let name = h.name.as_ptr() as usize - base;
                let value = h.value.as_ptr() as usize - base;
                fields.push(Field {
                    name: (name, name + h.name.len()),
                    value: (value, value + h.value.len()),
                    kind: kind(h.name.as_bytes()),
                });
            }
        }
        (len, code, resp.version)
    };
    if len > MAX_HEAD {
        return Err(BadResponse("response head too large"));
    }
    // httparse takes a bare LF as a line end; a hop that does not would frame it otherwise.
    let bare_lf = if (100..200).contains(&code) {
        has_bare_lf(&buf[..len])
    } else {
        bare_lf_at_line_ends(&buf[..len], fields)
    };
    if bare_lf {
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
    // One look at each field: the framing, the connection's fate, and whether the head can
    // go on as received.
    let mut lengths = 0usize;
    let mut length: Option<u64> = None;
    let mut codings = 0usize;
    let mut close = false;
    let mut date = false;
    let mut keepalive_hint = None;
    let mut keepalive_seen = false;
    let mut hop_free = true;
    for f in fields.iter() {
        let value_bytes = &buf[f.value.0..f.value.1];
        match f.kind {
            Kind::Plain => {}
            Kind::Date => date = true,
            Kind::ContentLength => {
                lengths += 1;
                length = Some(content_length(value_bytes)?);
            }
            Kind::TransferEncoding => {
                codings += 1;
                if !trim_ows(value_bytes).eq_ignore_ascii_case(b"chunked") {
                    return Err(BadResponse("Transfer-Encoding other than a single chunked"));
                }
            }
            Kind::Connection => {
                for token in value_bytes.split(|b| *b == b',') {
                    let token = trim_ows(token);
                    if token.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if !token.is_empty() && !token.eq_ignore_ascii_case(b"keep-alive") {
                        // It names a field to remove: the map does that.
                        hop_free = false;
                    }
                }
            }
            Kind::KeepAlive => {
                if !keepalive_seen {
                    keepalive_seen = true;
                    keepalive_hint = crate::pool::keepalive_timeout(value_bytes);
                }
            }
            Kind::OtherHop => hop_free = false,
        }
    }
    let as_received = raw && !head_request && hop_free;
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
    // A 204 has no content, whatever it declares (RFC 9110 §15.3.5); on a response with a
    // body, Transfer-Encoding overrides Content-Length (RFC 9112 §6.3 rule 3): the length
    // goes.
    let no_content = status == StatusCode::NO_CONTENT;
    let drop_length = no_content || codings == 1 && !bodyless;
    let framing = if bodyless {
        Framing::Empty
    } else if codings == 1 {
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
    let mut head = Head {
        status,
        version,
        headers: None,
        framing,
        keep_alive,
        raw: None,
        hop_free,
        keepalive_hint,
    };
    if as_received {
        // The map stays empty and unallocated: on the way to the own server's writer nothing
        // is added to it in the common case (the keep-alive hint is the writer's, a route
        // with response header rules gets a full map); a rare `Connection: close` (draining)
        // allocates then.
        head.raw = Some(RawHead {
            fields: pass_on(buf.split_to(len), fields),
            date,
            length: length.filter(|_| !drop_length),
            chunked: codings == 1 && !no_content,
        });
        return Ok(Parsed::Final(head, len));
    }
    let raw: Bytes = buf.split_to(len).freeze();
    // A head free of other hop-by-hop fields leaves out the ones the proxy would remove from
    // the map (a pass over the names, a list, a hash and a shift each): its `Connection`,
    // `Keep-Alive` and `Transfer-Encoding`, and a `Content-Length` beside the last.
    let skip = |f: &Field| match f.kind {
        Kind::ContentLength => drop_length || hop_free && codings == 1,
        Kind::TransferEncoding => no_content || hop_free,
        Kind::Connection | Kind::KeepAlive => hop_free,
        Kind::Plain | Kind::Date | Kind::OtherHop => false,
    };
    // Room for the fields kept and what the proxy adds on the way downstream (`keep-alive`
    // and `connection` over HTTP/1, `date` or `content-length` over HTTP/2), so that the map
    // is not rehashed into a larger table per response; no more, so that a map kept aside
    // from an earlier message (as small as the fields of an HTTP/2 request) serves.
    let kept = fields.iter().filter(|f| !skip(f)).count();
    let mut headers = crate::headers::map_with_capacity(kept + 2);
    for f in fields.iter() {
        if skip(f) {
            continue;
        }
        let name = super::names::header_name(&raw[f.name.0..f.name.1])
            .map_err(|_| BadResponse("invalid header name"))?;
        // The values share the head's buffer: no copy per header.
        let value = HeaderValue::from_maybe_shared(raw.slice(f.value.0..f.value.1))
            .map_err(|_| BadResponse("invalid header value"))?;
        headers.append(name, value);
    }
    head.headers = Some(headers);
    Ok(Parsed::Final(head, len))
}

/// The lines of `head`'s fields that go downstream unchanged, names lowercased, moved
/// together in place (only those after a dropped line move): the head's own buffer, no copy
/// elsewhere. Each line runs from its name to the next one's (httparse refuses folded
/// lines); the last ends before the blank line.
fn pass_on(mut head: BytesMut, fields: &[Field]) -> Bytes {
    let end_of_fields = head.len() - 2;
    let Some(first) = fields.first() else {
        return Bytes::new();
    };
    let mut out = first.name.0;
    for (i, f) in fields.iter().enumerate() {
        if !matches!(f.kind, Kind::Plain | Kind::Date) {
            continue;
        }
        let end = fields.get(i + 1).map_or(end_of_fields, |next| next.name.0);
        lowercase_name(&mut head[f.name.0..f.name.1]);
        if out != f.name.0 {
            head.copy_within(f.name.0..end, out);
        }
        out += end - f.name.0;
    }
    head.truncate(out);
    head.advance(first.name.0);
    head.freeze()
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

/// [`has_bare_lf`] for a complete head whose `fields` httparse found, looking only where the
/// line ends are: every line but the status line starts right after an LF (each field's
/// line, then the blank line), and httparse allows an LF nowhere else (not in a value, a
/// name or a reason phrase; a folded line is refused), except in empty lines before the
/// status line, which it skips: a head that does not start with its status line is scanned
/// whole. Per response this is a look at one byte per field, where the scan found every LF.
pub(crate) fn bare_lf_at_line_ends(head: &[u8], fields: &[Field]) -> bool {
    let len = head.len();
    if len < 4 || head[0] != b'H' {
        return has_bare_lf(head);
    }
    // The line that ends right before `start` ends in a bare LF.
    let bare_before = |start: usize| start < 2 || head[start - 2] != b'\r';
    // The blank line is the last two bytes (CRLF), or a bare LF.
    head[len - 2] != b'\r' || bare_before(len - 2) || fields.iter().any(|f| bare_before(f.name.0))
}

/// Lowercases a header name in place, eight bytes at a time: a byte-at-a-time pass over a
/// browser's dozen field names cost about 80 instructions a name. A name is a token
/// (`httparse` takes nothing else), so ASCII: eight letters are found in one word without a
/// carry from one byte into the next (a word with a byte at or above 0x80 goes byte by
/// byte). A name's last bytes are its last eight, which may overlap the word before them:
/// lowercasing a byte twice changes nothing.
pub(crate) fn lowercase_name(name: &mut [u8]) {
    let len = name.len();
    if len < 8 {
        name.make_ascii_lowercase();
        return;
    }
    let mut at = 0;
    while at + 8 <= len {
        lowercase_word(&mut name[at..at + 8]);
        at += 8;
    }
    if at < len {
        lowercase_word(&mut name[len - 8..]);
    }
}

fn lowercase_word(w: &mut [u8]) {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = ONES * 0x80;
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(w);
    let v = u64::from_le_bytes(bytes);
    if v & HIGH != 0 {
        w.make_ascii_lowercase();
        return;
    }
    // The high bit of each byte from `A` up, less each byte past `Z`: the capitals.
    let upper =
        (v + ONES * (0x80 - u64::from(b'A'))) & !(v + ONES * (0x7f - u64::from(b'Z'))) & HIGH;
    w.copy_from_slice(&(v | (upper >> 2)).to_le_bytes());
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
    raw_agrees_with_map(data, head_request);
}

/// A head passed on as received says what the map of the same head says: the same verdict,
/// and, when it qualifies, the map's fields (neither has a framing or hop-by-hop one), names
/// lowercased, values as httparse reads them; the framing, `Date` and the keep-alive hint
/// taken aside agree with the map's.
pub fn raw_agrees_with_map(data: &[u8], head_request: bool) {
    let map = parse(&mut BytesMut::from(data), head_request);
    let mut buf = BytesMut::from(data);
    let raw = parse_with(&mut buf, head_request, &mut Fields::new(), true);
    let (m, r) = match (map, raw) {
        (Ok(Parsed::Final(m, n)), Ok(Parsed::Final(r, k))) => {
            assert_eq!(n, k);
            assert_eq!(buf.len(), data.len() - n, "the body stays");
            (m, r)
        }
        (m, r) => {
            assert_eq!(format!("{m:?}"), format!("{r:?}"));
            return;
        }
    };
    assert_eq!(
        (m.status, m.version, m.framing, m.keep_alive),
        (r.status, r.version, r.framing, r.keep_alive)
    );
    let Some(raw) = r.raw else {
        assert_eq!(m.map(), r.map());
        return;
    };
    assert!(!head_request, "a response to HEAD is never passed on");
    assert!(r.headers.is_none(), "no map is made");
    let hop = |n: &str| {
        matches!(
            n,
            "content-length" | "transfer-encoding" | "connection" | "keep-alive"
        )
    };
    let mut want: Vec<(String, Vec<u8>)> = m
        .map()
        .iter()
        .filter(|(n, _)| !hop(n.as_str()))
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    let mut got: Vec<(String, Vec<u8>)> = Vec::new();
    let mut rest = &raw.fields[..];
    while !rest.is_empty() {
        let end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("every line ends in CRLF");
        let line = &rest[..end];
        let colon = line.iter().position(|&b| b == b':').expect("a colon");
        let name = String::from_utf8(line[..colon].to_vec()).expect("a token");
        assert_eq!(name, name.to_ascii_lowercase(), "names are lowercased");
        assert!(!hop(&name), "{name} is not passed on");
        got.push((name, trim_ows(&line[colon + 1..]).to_vec()));
        rest = &rest[end + 2..];
    }
    // The map groups fields by name; the lines keep the order received. Within a name,
    // both keep it.
    want.sort_by(|a, b| a.0.cmp(&b.0));
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(want, got);
    let length = m
        .map()
        .get(http::header::CONTENT_LENGTH)
        .map(|v| content_length(v.as_bytes()).expect("a length the parse took"));
    // A head that qualifies is free of hop-by-hop fields as a map too: the map leaves out
    // what the raw head takes aside (the framing fields, `Connection`, `Keep-Alive`), and
    // keeps a length only where no `chunked` stands beside it.
    assert!(
        m.hop_free,
        "a head passed on as received is hop-free as a map"
    );
    for name in [
        http::header::TRANSFER_ENCODING,
        http::header::CONNECTION,
        http::header::HeaderName::from_static("keep-alive"),
    ] {
        assert!(!m.map().contains_key(&name), "{name} stays out of the map");
    }
    assert_eq!(raw.length.filter(|_| !raw.chunked), length);
    if m.framing == Framing::Chunked {
        assert!(raw.chunked);
    }
    if raw.chunked {
        assert!(matches!(m.framing, Framing::Chunked | Framing::Empty));
    }
    assert_eq!(raw.date, m.map().contains_key(http::header::DATE));
    // The hint both take aside is the one the head's first `Keep-Alive` line gives, as a map
    // of every field would give it (read here without the parser's own bookkeeping).
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut slots);
    resp.parse(data).expect("the parse took this head");
    let hint = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("keep-alive"))
        .and_then(|h| crate::pool::keepalive_timeout(h.value));
    assert_eq!(r.keepalive_hint, hint);
    assert_eq!(m.keepalive_hint, hint);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    #[test]
    fn a_name_is_lowercased_as_byte_by_byte_whatever_its_length_and_bytes() {
        // Every byte value in every place of names up to 40 bytes: letters around `A` and
        // `Z`, the token symbols, and bytes at and above 0x80 (not in names, handled anyway).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..40 {
            for round in 0..400 {
                // Mostly ASCII (the words that take the fast way), some of any byte.
                let top = if round % 4 == 0 { 256 } else { 128 };
                let name: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x % top) as u8
                    })
                    .collect();
                let mut ours = name.clone();
                lowercase_name(&mut ours);
                assert_eq!(ours, name.to_ascii_lowercase(), "{name:?}");
            }
        }
        let mut edges = *b"@AZ[`az{ABCDEFGHIJKLMNOPQRSTUVWXYZ";
        lowercase_name(&mut edges);
        assert_eq!(&edges, b"@az[`az{abcdefghijklmnopqrstuvwxyz");
    }

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
        assert_eq!(h.map()["x-a"], "b");
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
        assert!(!h.map().contains_key(header::CONTENT_LENGTH));
    }

    #[test]
    fn bodyless_responses_have_no_body_whatever_they_declare() {
        let (h, _) = final_head("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", true).unwrap();
        assert_eq!(h.framing, Framing::Empty);
        assert_eq!(
            h.map()[header::CONTENT_LENGTH],
            "10",
            "HEAD keeps its length"
        );
        let (h, _) = final_head(
            "HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(h.framing, Framing::Empty);
        assert!(!h.map().contains_key(header::CONTENT_LENGTH));
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
        assert_eq!(h.keepalive_hint, Some(std::time::Duration::from_secs(5)));
        // Hop-by-hop, and the only such field: left out of the map.
        assert!(h.hop_free);
        assert!(!h.map().contains_key("keep-alive"));
        // Beside a field the proxy removes by name, every field stays in the map (the hint
        // is read the same from it).
        let (h, _) = final_head(
            "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nConnection: x-a\r\nX-A: 1\r\n\
             Content-Length: 0\r\n\r\n",
            false,
        )
        .unwrap();
        assert!(!h.hop_free);
        assert_eq!(
            keepalive_hint(h.map()),
            Some(std::time::Duration::from_secs(5))
        );
        assert_eq!(h.keepalive_hint, keepalive_hint(h.map()));
        for name in ["keep-alive", "connection", "x-a", "content-length"] {
            assert!(h.map().contains_key(name), "{name}");
        }
    }

    #[test]
    fn a_hop_free_map_leaves_out_what_the_proxy_would_remove() {
        // `Connection` naming only `close` or `keep-alive`, `Keep-Alive`, `Transfer-Encoding`
        // and a `Content-Length` beside it: none reaches the map, the framing is kept.
        for (raw, head_request, framing) in [
            (
                "HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nKeep-Alive: timeout=3\r\n\
                 Transfer-Encoding: chunked\r\nContent-Length: 4\r\nX-A: 1\r\n\r\n",
                false,
                Framing::Chunked,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\
                 X-A: 1\r\n\r\n",
                true,
                Framing::Empty,
            ),
        ] {
            let (h, _) = final_head(raw, head_request).unwrap();
            assert!(h.hop_free, "{raw}");
            assert_eq!(h.framing, framing);
            let names: Vec<_> = h.map().keys().map(|n| n.as_str()).collect();
            assert_eq!(names, ["x-a"], "{raw}");
        }
        // Any other hop-by-hop field, or a `Connection` naming one: all stay for the proxy's
        // removal by name (which also removes the fields `Connection` names).
        for raw in [
            "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nTrailer: x-t\r\n\
             Transfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nConnection: x-a\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nUpgrade: h2c\r\nContent-Length: 0\r\n\r\n",
        ] {
            let (h, _) = final_head(raw, false).unwrap();
            assert!(!h.hop_free, "{raw}");
            assert!(h.map().keys().any(crate::headers::is_hop_by_hop), "{raw}");
        }
    }

    fn passed_on(raw: &str, head_request: bool) -> Head {
        let mut buf = BytesMut::from(raw.as_bytes());
        match parse_with(&mut buf, head_request, &mut Fields::new(), true).unwrap() {
            Parsed::Final(h, _) => h,
            other => panic!("not a final head: {other:?}"),
        }
    }

    #[test]
    fn a_plain_head_is_passed_on_without_its_framing_and_hop_by_hop_lines() {
        let raw = "HTTP/1.1 200 OK\r\nServer: T\r\nConnection: keep-alive\r\n\
                   Keep-Alive: timeout=5, max=9\r\nX-Mixed-Case: A  b\r\nContent-Length: 5\r\n\
                   Date: x\r\nset-cookie: a=1\r\nSet-Cookie:b=2\r\n\r\nhello";
        let h = passed_on(raw, false);
        let r = h.raw.expect("passed on");
        assert_eq!(
            std::str::from_utf8(&r.fields).unwrap(),
            "server: T\r\nx-mixed-case: A  b\r\ndate: x\r\nset-cookie: a=1\r\nset-cookie:b=2\r\n"
        );
        assert!(r.date);
        assert_eq!(r.length, Some(5));
        assert!(!r.chunked);
        assert_eq!(h.keepalive_hint, Some(std::time::Duration::from_secs(5)));
        assert!(h.headers.is_none());
        assert!(h.keep_alive);
        assert_eq!(h.framing, Framing::Length(5));
        raw_agrees_with_map(raw.as_bytes(), false);
    }

    #[test]
    fn what_a_head_passed_on_says_of_its_framing_and_connection() {
        let h = passed_on(
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
        );
        let r = h.raw.unwrap();
        assert_eq!((r.length, r.chunked, &r.fields[..]), (None, true, &b""[..]));
        assert_eq!(h.framing, Framing::Chunked);
        let h = passed_on(
            "HTTP/1.1 204 No Content\r\nContent-Length: 4\r\nX-A: 1\r\n\r\n",
            false,
        );
        let r = h.raw.unwrap();
        assert_eq!(
            (r.length, r.chunked, &r.fields[..]),
            (None, false, &b"x-a: 1\r\n"[..])
        );
        let h = passed_on(
            "HTTP/1.1 200 OK\r\nConnection: Keep-Alive, close\r\nContent-Length: 0\r\n\r\n",
            false,
        );
        assert!(!h.keep_alive, "close is read");
        assert!(!h.raw.unwrap().date);
        let h = passed_on("HTTP/1.0 200 OK\r\nX-A: 1\r\n\r\n", false);
        assert_eq!((h.framing, h.keep_alive), (Framing::Close, false));
        assert_eq!(&h.raw.unwrap().fields[..], b"x-a: 1\r\n");
    }

    #[test]
    fn heads_that_need_rewriting_or_answer_head_are_made_into_a_map() {
        let cases = [
            ("HTTP/1.1 200 OK\r\nConnection: X-Secret\r\nX-Secret: 1\r\nContent-Length: 0\r\n\r\n", false),
            ("HTTP/1.1 200 OK\r\nTrailer: X-T\r\nTransfer-Encoding: chunked\r\n\r\n", false),
            ("HTTP/1.1 200 OK\r\nUpgrade: h2c\r\nContent-Length: 0\r\n\r\n", false),
            ("HTTP/1.1 200 OK\r\nTE: trailers\r\nContent-Length: 0\r\n\r\n", false),
            ("HTTP/1.1 200 OK\r\nProxy-Connection: close\r\nContent-Length: 0\r\n\r\n", false),
            ("HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\nContent-Length: 0\r\n\r\n", false),
            ("HTTP/1.1 200 OK\r\nProxy-Authorization: x\r\nContent-Length: 0\r\n\r\n", false),
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\n", true),
        ];
        for (raw, head_request) in cases {
            let h = passed_on(raw, head_request);
            assert!(h.raw.is_none(), "{raw:?}");
            assert!(!h.map().is_empty(), "{raw:?}");
            raw_agrees_with_map(raw.as_bytes(), head_request);
        }
        // Not asked for: never passed on.
        let (h, _) = final_head(
            "HTTP/1.1 200 OK\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n",
            false,
        )
        .unwrap();
        assert!(h.raw.is_none());
        assert_eq!(h.map()["x-a"], "1");
    }

    /// Generated heads: every kind of field in any case, with odd spacing, repeated, in any
    /// order, with and without a body, to HEAD and to GET.
    #[test]
    fn heads_passed_on_agree_with_their_maps_on_generated_heads() {
        const NAMES: &[&str] = &[
            "Content-Length",
            "Transfer-Encoding",
            "Connection",
            "Keep-Alive",
            "Date",
            "Trailer",
            "TE",
            "Upgrade",
            "Proxy-Connection",
            "Set-Cookie",
            "X-A",
            "x-b",
            "SERVER",
            "Content-Type",
            "Cache-Control",
        ];
        const VALUES: &[&str] = &[
            "0",
            "5",
            "chunked",
            "close",
            "keep-alive",
            "Keep-Alive, close",
            "x-a",
            "timeout=7",
            "timeout=\"3\", max=2",
            "a  b",
            "",
            "gzip",
            "x-b, keep-alive",
            "caf\u{e9}",
        ];
        const STATUS: &[&str] = &[
            "200 OK",
            "204 No Content",
            "304 Not Modified",
            "404 Nope",
            "101 Up",
            "103 Hints",
        ];
        // xorshift64: the same heads on every run.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for _ in 0..20_000 {
            let mut head = format!("HTTP/1.{} {}\r\n", next(2), STATUS[next(STATUS.len())]);
            for _ in 0..next(7) {
                let mut name = NAMES[next(NAMES.len())].to_owned();
                if next(3) == 0 {
                    name = name.to_ascii_lowercase();
                }
                let space = [" ", "", "  ", "\t"][next(4)];
                head.push_str(&format!(
                    "{name}:{space}{}{space}\r\n",
                    VALUES[next(VALUES.len())]
                ));
            }
            head.push_str("\r\nbody");
            let data = head.as_bytes();
            raw_agrees_with_map(data, next(4) == 0);
        }
    }

    /// The look at the line ends finds a bare LF exactly where a scan of the whole head does:
    /// every byte of a few heads set to LF, CR, a space or a letter in turn.
    #[test]
    fn a_bare_lf_is_found_at_the_line_ends_as_a_whole_scan_finds_it() {
        let heads: &[&[u8]] = &[
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A:  b  \r\nX-Empty:\r\n\r\nhello",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.0 404 \r\nX-A: 1\r\n\r\n",
            b"\r\nHTTP/1.1 200 OK\r\nX-A: 1\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\nX-A: 1\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
        ];
        let mut checked = 0;
        for head in heads {
            for i in 0..head.len() {
                for b in [b'\n', b'\r', b' ', b'x'] {
                    let mut data = head.to_vec();
                    data[i] = b;
                    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    let mut resp = httparse::Response::new(&mut slots);
                    let Ok(httparse::Status::Complete(len)) = resp.parse(&data) else {
                        continue;
                    };
                    checked += 1;
                    let refused = matches!(
                        parse(&mut BytesMut::from(&data[..]), false),
                        Err(BadResponse("bare LF line ending"))
                    );
                    assert_eq!(
                        refused,
                        has_bare_lf(&data[..len]),
                        "byte {i} of {:?} set to {b}",
                        String::from_utf8_lossy(head)
                    );
                }
            }
        }
        assert!(checked > 250, "only {checked} complete heads");
    }

    /// Every field the map's path strips as hop-by-hop is kept out of a head passed on as
    /// received, however it is spelled: `kind` and `headers::HOP_BY_HOP` cannot drift apart.
    #[test]
    fn every_hop_by_hop_field_is_kept_out_of_a_head_passed_on() {
        for name in &crate::headers::HOP_BY_HOP {
            for spelled in [name.as_str().to_owned(), name.as_str().to_ascii_uppercase()] {
                assert!(
                    !matches!(kind(spelled.as_bytes()), Kind::Plain | Kind::Date),
                    "{spelled} would pass on"
                );
            }
        }
        assert_eq!(kind(b"X-Request-Id"), Kind::Plain);
    }
}
