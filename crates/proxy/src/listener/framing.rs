//! A strict HTTP/1 framing check that sits under hyper on downstream connections.
//!
//! hyper accepts some ambiguous framings (it quietly drops `Content-Length` when
//! `Transfer-Encoding` is present, and merges repeated equal `Content-Length`s). A proxy must
//! refuse those, because the hop behind or in front may frame the same bytes differently
//! (request smuggling). The check follows message boundaries (heads, fixed bodies, chunked
//! bodies) and holds each head back until it is validated; a violation turns the stream into
//! bytes hyper cannot parse, so hyper answers 400 and closes, and the request never exists.
//!
//! After an HTTP/1.1 request that asks for an upgrade (an `Upgrade` header, as hyper decides)
//! the check holds every later byte until the handler says how it ended: switched (the `101`
//! was relayed: the rest is the upgraded protocol's, passed through unchecked) or refused
//! (the bytes are the next HTTP request, checked as usual). See `crate::upgrade`.

use crate::h1::head::trim_ows;
use bytes::BytesMut;

/// Bytes handed to hyper in place of a refused message: not a valid request line, so hyper
/// answers 400 and closes the connection.
pub const POISON: &[u8] = b"\x01invalid\r\n\r\n";

const MAX_CHUNK_LINE: usize = 1024;
/// hyper's HTTP/1 parser answers 414 for a request target longer than this.
const MAX_TARGET: usize = u16::MAX as usize - 1;
const MAX_TRAILERS: usize = 16 * 1024;

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub &'static str);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Body(u64),
    ChunkLine,
    ChunkData(u64),
    ChunkCrlf(u8),
    Trailer,
    /// Not checked any more: an over-size head (hyper answers 431), after a refusal, or
    /// after a switch of protocols.
    Passthrough,
    /// After a request that asked for an upgrade: input is held until the outcome is known.
    AwaitUpgrade,
}

/// The framing state of one downstream HTTP/1 connection.
#[derive(Debug)]
pub struct Framer {
    state: State,
    pending: Vec<u8>,
    /// The trailer section read so far, checked whole at its end.
    trailers: Vec<u8>,
    max_head: usize,
    /// Where, in the output of the current `feed`, the message being checked starts.
    msg_start: Option<usize>,
    /// A head with a request target too long for hyper went through (it answers 414).
    long_target: bool,
    /// The message being checked asked for an upgrade: once it ends, wait for the outcome.
    upgrade_after: bool,
}

impl Framer {
    /// A checker for heads of at most `max_head` bytes.
    pub fn new(max_head: usize) -> Self {
        Self {
            state: State::Head,
            pending: Vec::new(),
            trailers: Vec::new(),
            max_head,
            msg_start: None,
            long_target: false,
            upgrade_after: false,
        }
    }

    /// A request that asked for an upgrade has been passed on whole, and what follows it is
    /// held until [`Framer::upgrade_decided`].
    pub fn awaiting_upgrade(&self) -> bool {
        self.state == State::AwaitUpgrade
    }

    /// The largest request head it passes on.
    pub fn max_head(&self) -> usize {
        self.max_head
    }

    /// Bytes held back (an incomplete head or line, or input after an upgrade request).
    pub fn held(&self) -> usize {
        self.pending.len()
    }

    /// The upgrade request's outcome: `switched` passes every held and later byte through
    /// unchecked; otherwise the held bytes are checked as the next request.
    pub fn upgrade_decided(&mut self, switched: bool, out: &mut BytesMut) -> Result<(), Refused> {
        if self.state != State::AwaitUpgrade {
            return Ok(());
        }
        let held = std::mem::take(&mut self.pending);
        self.msg_start = None;
        if switched {
            self.state = State::Passthrough;
            out.extend_from_slice(&held);
            Ok(())
        } else {
            self.state = State::Head;
            self.feed_inner(&held, out)
        }
    }

    /// The state after a message ends.
    fn end_of_message(&mut self) -> State {
        if std::mem::take(&mut self.upgrade_after) {
            State::AwaitUpgrade
        } else {
            State::Head
        }
    }

    /// A request target longer than hyper takes has been passed on (hyper answers 414).
    pub fn long_target(&self) -> bool {
        self.long_target
    }

    /// Part of a request head has arrived and is held back (for the header read timeout).
    pub fn head_in_progress(&self) -> bool {
        self.state == State::Head && !self.pending.is_empty()
    }

    /// Consumes `input`, appending what may go to hyper to `out`; bytes of an incomplete
    /// head or chunk line are held back.
    pub fn feed(&mut self, input: &[u8], out: &mut BytesMut) -> Result<(), Refused> {
        self.msg_start = None;
        self.feed_inner(input, out)
    }

    fn feed_inner(&mut self, mut input: &[u8], out: &mut BytesMut) -> Result<(), Refused> {
        while !input.is_empty() {
            match self.state {
                State::Passthrough => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                State::AwaitUpgrade => {
                    self.pending.extend_from_slice(input);
                    return Ok(());
                }
                State::Head => {
                    self.pending.extend_from_slice(input);
                    input = &[];
                    match parse_head(&self.pending)? {
                        HeadStatus::Partial => {
                            if self.pending.len() > self.max_head {
                                // hyper enforces the same limit and answers 431.
                                out.extend_from_slice(&self.pending);
                                self.pending.clear();
                                self.state = State::Passthrough;
                            }
                            return Ok(());
                        }
                        HeadStatus::Complete(n, body, target_len, upgrade) => {
                            self.long_target |= target_len > MAX_TARGET;
                            self.msg_start = Some(out.len());
                            out.extend_from_slice(&self.pending[..n]);
                            let rest = self.pending.split_off(n);
                            self.pending.clear();
                            self.upgrade_after = upgrade;
                            self.state = match body {
                                BodyKind::None => self.end_of_message(),
                                BodyKind::Length(len) => State::Body(len),
                                BodyKind::Chunked => State::ChunkLine,
                            };
                            if !rest.is_empty() {
                                return self.feed_inner(&rest, out);
                            }
                        }
                    }
                }
                State::Body(left) => {
                    let n = (left.min(input.len() as u64)) as usize;
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = if left == n as u64 {
                        self.end_of_message()
                    } else {
                        State::Body(left - n as u64)
                    };
                }
                State::ChunkLine | State::Trailer => {
                    // A trailer field line is bounded by the section's limit only, as in the
                    // body decoder (`crate::h1::body`).
                    let (limit, too_long) = if self.state == State::ChunkLine {
                        (MAX_CHUNK_LINE, "chunk-size line too long")
                    } else {
                        (MAX_TRAILERS, "trailer section too large")
                    };
                    let Some(nl) = input.iter().position(|&b| b == b'\n') else {
                        self.pending.extend_from_slice(input);
                        if self.pending.len() > limit {
                            return Err(Refused(too_long));
                        }
                        return Ok(());
                    };
                    self.pending.extend_from_slice(&input[..=nl]);
                    input = &input[nl + 1..];
                    let line = std::mem::take(&mut self.pending);
                    if line.len() > limit {
                        return Err(Refused(too_long));
                    }
                    if !line.ends_with(b"\r\n") {
                        return Err(Refused("chunked line not ended by CRLF"));
                    }
                    out.extend_from_slice(&line);
                    if self.state == State::ChunkLine {
                        let size = chunk_size(&line[..line.len() - 2])?;
                        self.state = if size == 0 {
                            self.trailers.clear();
                            State::Trailer
                        } else {
                            State::ChunkData(size)
                        };
                    } else if line.len() == 2 {
                        // The rules of the body decoder the own server reads request bodies
                        // with (field syntax, names and values `http` takes, at most 64
                        // fields, 16 KiB with the empty line), so both refuse the same bodies.
                        if !self.trailers.is_empty() {
                            self.trailers.extend_from_slice(b"\r\n");
                            if !crate::h1::body::trailers_valid(&self.trailers) {
                                return Err(Refused("malformed trailer section"));
                            }
                            self.trailers = Vec::new();
                        }
                        self.state = self.end_of_message();
                    } else {
                        self.trailers.extend_from_slice(&line);
                        if self.trailers.len() + 2 > MAX_TRAILERS {
                            return Err(Refused("trailer section too large"));
                        }
                    }
                }
                State::ChunkData(left) => {
                    let n = (left.min(input.len() as u64)) as usize;
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = if left == n as u64 {
                        State::ChunkCrlf(0)
                    } else {
                        State::ChunkData(left - n as u64)
                    };
                }
                State::ChunkCrlf(seen) => {
                    let want = if seen == 0 { b'\r' } else { b'\n' };
                    if input[0] != want {
                        return Err(Refused("chunk data not followed by CRLF"));
                    }
                    out.extend_from_slice(&input[..1]);
                    input = &input[1..];
                    self.state = if seen == 0 {
                        State::ChunkCrlf(1)
                    } else {
                        State::ChunkLine
                    };
                }
            }
        }
        Ok(())
    }

    /// Marks the stream as refused: nothing more is checked. A refused message whose head is
    /// still in `out` (not yet handed to hyper) is removed whole, so it never exists upstream.
    pub fn poison(&mut self, out: &mut BytesMut) {
        if let Some(start) = self.msg_start.take() {
            out.truncate(start);
        }
        self.pending.clear();
        self.state = State::Passthrough;
        out.extend_from_slice(POISON);
    }
}

enum HeadStatus {
    Partial,
    /// Head length, body framing, request-target length, whether it asks for an upgrade.
    Complete(usize, BodyKind, usize, bool),
}

#[derive(Debug, PartialEq, Eq)]
enum BodyKind {
    None,
    Length(u64),
    Chunked,
}

fn parse_head(buf: &[u8]) -> Result<HeadStatus, Refused> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    let n = match req.parse(buf) {
        Ok(httparse::Status::Partial) => return Ok(HeadStatus::Partial),
        Ok(httparse::Status::Complete(n)) => n,
        Err(httparse::Error::TooManyHeaders) => return Err(Refused("too many header fields")),
        Err(httparse::Error::HeaderName) => return Err(Refused("invalid header name")),
        Err(httparse::Error::HeaderValue) => return Err(Refused("invalid header value")),
        Err(httparse::Error::NewLine) => {
            return Err(Refused("invalid line ending or obsolete line folding"))
        }
        Err(httparse::Error::Version) => return Err(Refused("unsupported HTTP version")),
        Err(httparse::Error::Token) => return Err(Refused("invalid method or request line")),
        Err(_) => return Err(Refused("malformed request head")),
    };
    let http10 = req.version == Some(0);
    let target_len = req.path.map_or(0, str::len);
    let (mut cl, mut te, mut hosts) = (Vec::new(), Vec::new(), 0);
    // As hyper decides: an `Upgrade` header on an HTTP/1.1 request (CONNECT, which hyper
    // also counts, is refused by the handler and never switches).
    let mut upgrade = false;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            cl.push(h.value);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            te.push(h.value);
        } else if h.name.eq_ignore_ascii_case("host") {
            hosts += 1;
        } else if h.name.eq_ignore_ascii_case("upgrade") {
            upgrade = req.version == Some(1);
        }
    }
    if hosts > 1 {
        return Err(Refused("more than one Host header"));
    }
    if hosts == 0 && !http10 {
        return Err(Refused("HTTP/1.1 request without Host"));
    }
    if !cl.is_empty() && !te.is_empty() {
        return Err(Refused("both Content-Length and Transfer-Encoding"));
    }
    if cl.len() > 1 {
        return Err(Refused("repeated Content-Length"));
    }
    if te.len() > 1 {
        return Err(Refused("repeated Transfer-Encoding"));
    }
    if let Some(te) = te.first() {
        if http10 {
            return Err(Refused("Transfer-Encoding in an HTTP/1.0 request"));
        }
        let v = std::str::from_utf8(te).map_err(|_| Refused("invalid Transfer-Encoding"))?;
        if !v.trim_matches([' ', '\t']).eq_ignore_ascii_case("chunked") {
            return Err(Refused("Transfer-Encoding other than a single chunked"));
        }
        return Ok(HeadStatus::Complete(
            n,
            BodyKind::Chunked,
            target_len,
            upgrade,
        ));
    }
    if let Some(v) = cl.first() {
        let v = trim_ows(v);
        if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
            return Err(Refused("invalid Content-Length"));
        }
        let len: u64 = std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(Refused("invalid Content-Length"))?;
        return Ok(HeadStatus::Complete(
            n,
            if len == 0 {
                BodyKind::None
            } else {
                BodyKind::Length(len)
            },
            target_len,
            upgrade,
        ));
    }
    Ok(HeadStatus::Complete(n, BodyKind::None, target_len, upgrade))
}

fn chunk_size(line: &[u8]) -> Result<u64, Refused> {
    let hex_end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    if hex_end == 0 || hex_end > 15 {
        return Err(Refused("invalid chunk size"));
    }
    let rest = &line[hex_end..];
    if !rest.is_empty() && (rest[0] != b';' || rest.iter().any(|&b| b < 0x20 && b != b'\t')) {
        return Err(Refused("invalid chunk size"));
    }
    let s = std::str::from_utf8(&line[..hex_end]).map_err(|_| Refused("invalid chunk size"))?;
    u64::from_str_radix(s, 16).map_err(|_| Refused("invalid chunk size"))
}

/// The framing check's invariants on any input, for the fuzz target (`fuzz/`) and the
/// corpus replay test: it never panics; fed whole, in two parts split where the first byte
/// says, or byte by byte (inputs up to 4 KiB), it gives the same verdict and, when it
/// accepts, passes on the same bytes, which are a prefix of the input.
pub fn check_invariants(data: &[u8]) {
    fn run(parts: &mut dyn Iterator<Item = &[u8]>) -> (bool, BytesMut) {
        let mut f = Framer::new(8192);
        let mut out = BytesMut::new();
        for part in parts {
            if f.feed(part, &mut out).is_err() {
                f.poison(&mut out);
                return (false, out);
            }
        }
        (true, out)
    }
    let (ok, whole) = run(&mut std::iter::once(data));
    if ok {
        assert!(
            data.starts_with(&whole),
            "passed on bytes that were not sent"
        );
    } else {
        assert!(whole.ends_with(POISON), "a refusal must end in the poison");
    }
    let split = data.first().map_or(0, |&b| usize::from(b)) % (data.len() + 1);
    let (ok2, two) = run(&mut [&data[..split], &data[split..]].into_iter());
    assert_eq!(ok, ok2, "verdict depends on a split at {split}");
    if ok {
        assert_eq!(whole, two, "output depends on a split at {split}");
    }
    if data.len() <= 4096 {
        let (ok3, bytes) = run(&mut data.chunks(1));
        assert_eq!(ok, ok3, "verdict differs byte by byte");
        if ok {
            assert_eq!(whole, bytes, "output differs byte by byte");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(input: &[&[u8]]) -> (Result<(), Refused>, Vec<u8>) {
        let mut f = Framer::new(8192);
        let mut out = BytesMut::new();
        for part in input {
            if let Err(e) = f.feed(part, &mut out) {
                return (Err(e), out.to_vec());
            }
        }
        (Ok(()), out.to_vec())
    }

    #[test]
    fn pipelined_requests_with_bodies_pass_whole() {
        let s: &[u8] = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcGET /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n0\r\nT: 1\r\n\r\nGET /y HTTP/1.1\r\nHost: a\r\n\r\n";
        let (r, out) = run(&[s]);
        assert_eq!(r, Ok(()));
        assert_eq!(out, s);
        // Byte by byte gives the same result.
        let parts: Vec<&[u8]> = s.chunks(1).collect();
        let (r, out) = run(&parts);
        assert_eq!(r, Ok(()));
        assert_eq!(out, s);
    }

    #[test]
    fn incomplete_head_is_held_back() {
        let mut f = Framer::new(8192);
        let mut out = BytesMut::new();
        f.feed(b"GET / HTTP/1.1\r\nHost: a\r\n", &mut out).unwrap();
        assert!(out.is_empty());
        assert!(f.head_in_progress());
        f.feed(b"\r\n", &mut out).unwrap();
        assert_eq!(&out[..], b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(!f.head_in_progress());
    }

    #[test]
    fn bytes_after_an_upgrade_request_are_held_until_the_outcome() {
        let up: &[u8] =
            b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
        // Bytes of the new protocol: not HTTP at all.
        let frame: &[u8] = b"\x81\x85\x00\x00\x00\x00hello";
        let mut f = Framer::new(8192);
        let mut out = BytesMut::new();
        f.feed(&[up, frame].concat(), &mut out).unwrap();
        assert_eq!(&out[..], up, "only the request goes to hyper");
        assert!(f.awaiting_upgrade());
        assert_eq!(f.held(), frame.len());
        out.clear();
        f.upgrade_decided(true, &mut out).unwrap();
        assert_eq!(&out[..], frame);
        out.clear();
        f.feed(b"\x00\xffanything", &mut out).unwrap();
        assert_eq!(
            &out[..],
            b"\x00\xffanything",
            "switched: passed through unchecked"
        );
    }

    #[test]
    fn a_refused_upgrade_checks_what_follows_as_http() {
        let up: &[u8] =
            b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n";
        let next: &[u8] = b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n";
        let mut f = Framer::new(8192);
        let mut out = BytesMut::new();
        f.feed(&[up, next].concat(), &mut out).unwrap();
        assert_eq!(&out[..], up);
        out.clear();
        f.upgrade_decided(false, &mut out).unwrap();
        assert_eq!(&out[..], next);
        assert!(!f.awaiting_upgrade());
        // Held bytes that are not HTTP are refused once the upgrade was refused.
        let mut f = Framer::new(8192);
        let mut out = BytesMut::new();
        f.feed(&[up, b"\x81\x85junk\r\n\r\n"].concat(), &mut out)
            .unwrap();
        assert!(f.upgrade_decided(false, &mut out).is_err());
        // HTTP/1.0 cannot upgrade (hyper ignores its Upgrade header): nothing is held.
        let mut f = Framer::new(8192);
        let mut out = BytesMut::new();
        let old: &[u8] = b"GET / HTTP/1.0\r\nUpgrade: websocket\r\n\r\n";
        f.feed(&[old, next].concat(), &mut out).unwrap();
        assert_eq!(&out[..], [old, next].concat().as_slice());
    }

    #[test]
    fn chunk_lines_and_trailers_follow_the_body_decoders_rules() {
        let chunked = |body: &[u8]| {
            [
                &b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
                body,
            ]
            .concat()
        };
        let line = |n: usize| {
            [
                b"3;".to_vec(),
                vec![b'x'; n - 4],
                b"\r\nabc\r\n0\r\n\r\n".to_vec(),
            ]
            .concat()
        };
        assert!(
            run(&[&chunked(&line(1024))]).0.is_ok(),
            "1024 bytes with CRLF"
        );
        assert!(
            run(&[&chunked(&line(1025))]).0.is_err(),
            "1025 bytes with CRLF"
        );
        let long_field = [
            b"0\r\nX-Long: ".to_vec(),
            vec![b'v'; 2000],
            b"\r\n\r\n".to_vec(),
        ]
        .concat();
        assert!(
            run(&[&chunked(&long_field)]).0.is_ok(),
            "a trailer line over 1 KiB"
        );
        let many: Vec<u8> = (0..65)
            .flat_map(|i| format!("T{i}: v\r\n").into_bytes())
            .collect();
        for bad in [
            &b"0\r\nX@Y: 1\r\n\r\n"[..],
            b"0\r\n: v\r\n\r\n",
            b"0\r\nX-A: a\x00b\r\n\r\n",
            &[&b"0\r\n"[..], &many, b"\r\n"].concat(),
        ] {
            assert!(
                run(&[&chunked(bad)]).0.is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(bad)
            );
            let mut d = crate::h1::body::Decoder::new(crate::h1::head::Framing::Chunked);
            let mut buf = BytesMut::from(bad);
            let refused = loop {
                match d.decode(&mut buf) {
                    Err(_) => break true,
                    Ok(None | Some(crate::h1::body::Piece::End)) => break false,
                    Ok(Some(_)) => {}
                }
            };
            assert!(refused, "the body decoder accepts what the check refuses");
        }
    }

    #[test]
    fn smuggling_shapes_are_refused() {
        let cases: &[&[u8]] = &[
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
        ];
        for c in cases {
            assert!(
                run(&[c]).0.is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(c)
            );
        }
    }
}
