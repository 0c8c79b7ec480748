//! The upstream's response body, delimited as its head says: `Content-Length` bytes passed on
//! as read (slices of the read buffer, no copy), `chunked` validated as strictly as request
//! bodies are downstream (`crate::listener::framing`) with its data passed on and its
//! trailers parsed, or everything until the upstream closes. No I/O here, so the fuzz target
//! and the tests drive it with any byte split.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

use super::head::{has_bare_lf, Framing};

/// The longest chunk-size line (with its extensions).
const MAX_CHUNK_LINE: usize = 1024;
/// The largest trailer section.
const MAX_TRAILERS: usize = 16 * 1024;
/// The most trailer fields.
const MAX_TRAILER_FIELDS: usize = 64;

/// Why a response body was cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid upstream response body: {0}")]
pub struct BadBody(pub &'static str);

/// One piece of a decoded body.
#[derive(Debug, PartialEq)]
pub enum Piece {
    /// Body bytes.
    Data(Bytes),
    /// The trailer section of a chunked body.
    Trailers(HeaderMap),
    /// The body is complete.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Length(u64),
    ChunkLine,
    ChunkData(u64),
    /// The CRLF after a chunk's data; how many of its two bytes were seen.
    ChunkCrlf(u8),
    Trailers,
    Close,
    /// `End` was returned.
    Done,
    /// Trailers were returned; `End` comes next.
    Ending,
}

/// Decodes one response body from the bytes read after its head.
#[derive(Debug)]
pub struct Decoder {
    state: State,
}

impl Decoder {
    /// A decoder for a body framed as `framing` says.
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Ending,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkLine,
            Framing::Close => State::Close,
        };
        Self { state }
    }

    /// `End` has been returned: every byte of the body was read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The body has ended, or ends without reading more (bodyless, all bytes read).
    pub fn at_end(&self) -> bool {
        matches!(self.state, State::Done | State::Ending)
    }

    /// The next piece from `buf` (consumed as it goes); `Ok(None)` when more input is needed.
    /// Bytes after the body's end stay in `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Piece>, BadBody> {
        loop {
            match self.state {
                State::Done => return Ok(Some(Piece::End)),
                State::Ending => {
                    self.state = State::Done;
                    return Ok(Some(Piece::End));
                }
                State::Close => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    return Ok(Some(Piece::Data(buf.split().freeze())));
                }
                State::Length(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = left.min(buf.len() as u64);
                    let data = buf.split_to(n as usize).freeze();
                    self.state = if n == left {
                        State::Ending
                    } else {
                        State::Length(left - n)
                    };
                    return Ok(Some(Piece::Data(data)));
                }
                State::ChunkData(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = left.min(buf.len() as u64);
                    let data = buf.split_to(n as usize).freeze();
                    self.state = if n == left {
                        State::ChunkCrlf(0)
                    } else {
                        State::ChunkData(left - n)
                    };
                    return Ok(Some(Piece::Data(data)));
                }
                State::ChunkCrlf(seen) => {
                    let Some(&b) = buf.first() else {
                        return Ok(None);
                    };
                    let want = if seen == 0 { b'\r' } else { b'\n' };
                    if b != want {
                        return Err(BadBody("chunk data not followed by CRLF"));
                    }
                    buf.advance(1);
                    self.state = if seen == 0 {
                        State::ChunkCrlf(1)
                    } else {
                        State::ChunkLine
                    };
                }
                State::ChunkLine => {
                    let Some(lf) = buf.iter().position(|&b| b == b'\n') else {
                        if buf.len() > MAX_CHUNK_LINE {
                            return Err(BadBody("chunk-size line too long"));
                        }
                        return Ok(None);
                    };
                    // The line with its LF is at most `MAX_CHUNK_LINE` bytes, as the framing
                    // check counts it downstream.
                    if lf >= MAX_CHUNK_LINE {
                        return Err(BadBody("chunk-size line too long"));
                    }
                    if lf == 0 || buf[lf - 1] != b'\r' {
                        return Err(BadBody("chunked line not ended by CRLF"));
                    }
                    let size = chunk_size(&buf[..lf - 1])?;
                    buf.advance(lf + 1);
                    self.state = if size == 0 {
                        State::Trailers
                    } else {
                        State::ChunkData(size)
                    };
                }
                State::Trailers => {
                    if buf.starts_with(b"\r\n") {
                        buf.advance(2);
                        self.state = State::Done;
                        return Ok(Some(Piece::End));
                    }
                    if buf.len() < 2 {
                        // A bare LF is refused as soon as it is seen, as the framing check
                        // refuses it downstream.
                        if buf.first() == Some(&b'\n') {
                            return Err(BadBody("malformed trailer section"));
                        }
                        return Ok(None);
                    }
                    // Looked for within the limit only, so that any split of the input gives
                    // the same verdict.
                    let window = &buf[..buf.len().min(MAX_TRAILERS + 1)];
                    let Some(end) = find(window, b"\r\n\r\n") else {
                        if has_bare_lf(window) {
                            return Err(BadBody("malformed trailer section"));
                        }
                        if buf.len() > MAX_TRAILERS {
                            return Err(BadBody("trailer section too large"));
                        }
                        return Ok(None);
                    };
                    let len = end + 4;
                    let trailers = parse_trailers(&buf[..len])?;
                    if len > MAX_TRAILERS {
                        return Err(BadBody("trailer section too large"));
                    }
                    buf.advance(len);
                    self.state = State::Ending;
                    return Ok(Some(Piece::Trailers(trailers)));
                }
            }
        }
    }

    /// The upstream closed the connection: the end of a close-delimited body, and a
    /// truncation of any other that has not ended.
    pub fn eof(&mut self) -> Result<Piece, BadBody> {
        match self.state {
            State::Close | State::Done | State::Ending => {
                self.state = State::Done;
                Ok(Piece::End)
            }
            _ => Err(BadBody("the upstream closed before the end of the body")),
        }
    }

    /// Bytes still expected for a length-delimited body (for the downstream size hint).
    pub fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done | State::Ending => Some(0),
            _ => None,
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A chunk-size line (RFC 9112 §7.1): hex digits, optional extensions, no control bytes.
fn chunk_size(line: &[u8]) -> Result<u64, BadBody> {
    let hex_end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    if hex_end == 0 || hex_end > 15 {
        return Err(BadBody("invalid chunk size"));
    }
    let rest = &line[hex_end..];
    if !rest.is_empty() && (rest[0] != b';' || rest.iter().any(|&b| b < 0x20 && b != b'\t')) {
        return Err(BadBody("invalid chunk size"));
    }
    Ok(line[..hex_end].iter().fold(0u64, |n, &d| {
        n * 16 + u64::from((d as char).to_digit(16).unwrap_or(0))
    }))
}

/// Whether `section` (trailer fields and the empty line that ends them) is one the decoder
/// takes: the framing check (`crate::listener::framing`) asks the same of request trailers.
pub(crate) fn trailers_valid(section: &[u8]) -> bool {
    section.len() <= MAX_TRAILERS && parse_trailers(section).is_ok()
}

/// A trailer section ending in CRLF CRLF, strictly (no bare LF, no folding).
fn parse_trailers(section: &[u8]) -> Result<HeaderMap, BadBody> {
    const BAD: BadBody = BadBody("malformed trailer section");
    if has_bare_lf(section) {
        return Err(BAD);
    }
    let mut slots = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
    let (_, fields) = match httparse::parse_headers(section, &mut slots) {
        Ok(httparse::Status::Complete(r)) => r,
        _ => return Err(BAD),
    };
    let mut map = HeaderMap::with_capacity(fields.len());
    for f in fields {
        let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| BAD)?;
        let value = HeaderValue::from_bytes(f.value).map_err(|_| BAD)?;
        map.append(name, value);
    }
    Ok(map)
}

/// The decoder's invariants on any input, for the fuzz target (`fuzz/`) and the corpus
/// replay test: the first byte picks the framing, the rest is the body; it never panics, and
/// fed whole or byte by byte it gives the same verdict, the same data and the same leftover.
pub fn decoder_invariants(data: &[u8]) {
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    let framing = match pick % 4 {
        0 => Framing::Chunked,
        1 => Framing::Length(u64::from(pick / 4)),
        2 => Framing::Close,
        _ => Framing::Empty,
    };
    let whole = run(framing, &[input]);
    if input.len() <= 4096 {
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        let split = run(framing, &bytes);
        assert_eq!(
            whole, split,
            "the verdict depends on how the input is split"
        );
    }
    if let Outcome {
        verdict: Ok(true),
        data,
        ..
    } = &whole
    {
        // Data of a complete body never outgrows its input.
        assert!(data.len() <= input.len());
    }
}

#[derive(Debug, PartialEq)]
struct Outcome {
    /// Ok(true): ended; Ok(false): wants more; Err: refused.
    verdict: Result<bool, BadBody>,
    data: Vec<u8>,
    trailers: Option<HeaderMap>,
    left: Vec<u8>,
}

fn run(framing: Framing, parts: &[&[u8]]) -> Outcome {
    let mut d = Decoder::new(framing);
    let mut buf = BytesMut::new();
    let mut out = Outcome {
        verdict: Ok(false),
        data: Vec::new(),
        trailers: None,
        left: Vec::new(),
    };
    // A last empty part: a body that ends without input (empty, length 0) ends either way.
    let last: &[u8] = &[];
    'feed: for part in parts.iter().chain(std::iter::once(&last)) {
        buf.extend_from_slice(part);
        loop {
            match d.decode(&mut buf) {
                Err(e) => {
                    out.verdict = Err(e);
                    break 'feed;
                }
                Ok(None) => break,
                Ok(Some(Piece::Data(b))) => {
                    assert!(!b.is_empty(), "an empty data piece");
                    out.data.extend_from_slice(&b);
                }
                Ok(Some(Piece::Trailers(t))) => out.trailers = Some(t),
                Ok(Some(Piece::End)) => {
                    out.verdict = Ok(true);
                    break 'feed;
                }
            }
        }
    }
    out.left = buf.to_vec();
    if out.verdict != Ok(false) {
        // After the end, bytes belong to what follows; after a refusal, nothing is read on.
        out.left.clear();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(framing: Framing, input: &[u8]) -> (Result<bool, BadBody>, Vec<u8>) {
        let o = run(framing, &[input]);
        (o.verdict, o.data)
    }

    #[test]
    fn a_length_body_ends_at_its_length_and_leaves_the_rest() {
        let mut d = Decoder::new(Framing::Length(5));
        let mut buf = BytesMut::from(&b"helloHTTP/1.1"[..]);
        assert_eq!(
            d.decode(&mut buf),
            Ok(Some(Piece::Data(Bytes::from_static(b"hello"))))
        );
        assert_eq!(d.decode(&mut buf), Ok(Some(Piece::End)));
        assert!(d.is_done());
        assert_eq!(&buf[..], b"HTTP/1.1");
    }

    #[test]
    fn a_short_length_body_is_a_truncation_at_eof() {
        let mut d = Decoder::new(Framing::Length(5));
        let mut buf = BytesMut::from(&b"hel"[..]);
        assert!(matches!(d.decode(&mut buf), Ok(Some(Piece::Data(_)))));
        assert_eq!(d.decode(&mut buf), Ok(None));
        assert!(d.eof().is_err());
    }

    #[test]
    fn a_close_delimited_body_ends_at_eof() {
        let mut d = Decoder::new(Framing::Close);
        let mut buf = BytesMut::from(&b"abc"[..]);
        assert_eq!(
            d.decode(&mut buf),
            Ok(Some(Piece::Data(Bytes::from_static(b"abc"))))
        );
        assert_eq!(d.decode(&mut buf), Ok(None));
        assert_eq!(d.eof(), Ok(Piece::End));
    }

    #[test]
    fn chunked_data_extensions_and_trailers_are_decoded() {
        let input = b"5;name=value\r\nhello\r\n1\r\n!\r\n0\r\nX-Sum: 1\r\n\r\nNEXT";
        let o = run(Framing::Chunked, &[input]);
        assert_eq!(o.verdict, Ok(true));
        assert_eq!(o.data, b"hello!");
        assert_eq!(o.trailers.unwrap()["x-sum"], "1");
        let mut d = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&input[..]);
        while d.decode(&mut buf).unwrap() != Some(Piece::End) {}
        assert_eq!(&buf[..], b"NEXT", "bytes after the body stay unread");
    }

    #[test]
    fn byte_by_byte_gives_the_same_result() {
        let input = b"a\r\n0123456789\r\n0\r\n\r\n";
        let parts: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(
            run(Framing::Chunked, &[input]),
            run(Framing::Chunked, &parts)
        );
    }

    #[test]
    fn malformed_chunked_bodies_are_refused() {
        let cases: [(&[u8], &str); 9] = [
            (b"zz\r\n", "invalid chunk size"),
            (b"-1\r\n", "invalid chunk size"),
            (b"0x5\r\nhello\r\n0\r\n\r\n", "invalid chunk size"),
            (b" 5\r\nhello\r\n0\r\n\r\n", "invalid chunk size"),
            (b"5\nhello\r\n0\r\n\r\n", "chunked line not ended by CRLF"),
            (b"5\r\nhelloXX0\r\n\r\n", "chunk data not followed by CRLF"),
            (b"1000000000000000\r\n", "invalid chunk size"),
            (b"5;a\x01b\r\nhello\r\n0\r\n\r\n", "invalid chunk size"),
            (b"0\r\nX: a\nY: b\r\n\r\n", "malformed trailer section"),
        ];
        for (input, why) in cases {
            assert_eq!(
                decode_all(Framing::Chunked, input).0,
                Err(BadBody(why)),
                "{input:?}"
            );
        }
        let long = [b"1".repeat(2000), b"\r\n".to_vec()].concat();
        assert_eq!(
            decode_all(Framing::Chunked, &long).0,
            Err(BadBody("chunk-size line too long"))
        );
        let long_ext = [b"1;".to_vec(), b"a".repeat(2000)].concat();
        assert_eq!(
            decode_all(Framing::Chunked, &long_ext).0,
            Err(BadBody("chunk-size line too long"))
        );
    }

    #[test]
    fn a_chunked_body_without_its_last_chunk_is_truncated_at_eof() {
        let mut d = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&b"5\r\nhello\r\n"[..]);
        while d.decode(&mut buf).unwrap().is_some() {}
        assert!(d.eof().is_err());
    }

    #[test]
    fn the_invariants_hold_on_sample_inputs() {
        for input in [
            &b"\x00a\r\n0123456789\r\n0\r\nT: x\r\n\r\n"[..],
            b"\x05hello world",
            b"\x02anything",
            b"\x03",
            b"\x00\r\n",
            b"",
        ] {
            decoder_invariants(input);
        }
    }
}
