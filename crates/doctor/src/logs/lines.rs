//! Streaming line reading with bounded memory, for plain or gzip input.

use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

/// Read buffer size; a line longer than this is cut to this length.
pub const BUF_BYTES: usize = 1 << 20;

/// Opens a file for reading, decompressing it when it starts with the gzip magic bytes.
pub fn open(path: &Path) -> io::Result<Box<dyn Read>> {
    let mut f = File::open(path)?;
    let mut magic = [0u8; 2];
    let n = read_full(&mut f, &mut magic)?;
    f.seek(SeekFrom::Start(0))?;
    if n == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(MultiGzDecoder::new(io::BufReader::new(f))))
    } else {
        Ok(Box::new(f))
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A read error and the number of lines read before it.
#[derive(Debug, thiserror::Error)]
#[error("after line {line}: {source}")]
pub struct ReadError {
    /// Lines read completely before the error.
    pub line: u64,
    /// The underlying error (I/O, or corrupt gzip data).
    #[source]
    pub source: io::Error,
}

/// Calls `f` with each line (without its newline) and its 1-based number.
///
/// Memory stays at one buffer whatever the input size; a line longer than the buffer is
/// passed cut to the buffer's length and the rest of it is skipped.
pub fn for_each_line<R: Read>(mut r: R, mut f: impl FnMut(u64, &[u8])) -> Result<u64, ReadError> {
    let mut buf = vec![0u8; BUF_BYTES];
    let (mut end, mut line_no, mut skipping) = (0usize, 0u64, false);
    loop {
        let n = match r.read(&mut buf[end..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(ReadError {
                    line: line_no,
                    source,
                })
            }
        };
        if n == 0 {
            if end > 0 && !skipping {
                line_no += 1;
                f(line_no, trim_cr(&buf[..end]));
            }
            return Ok(line_no);
        }
        end += n;
        let mut pos = 0;
        for nl in memchr::memchr_iter(b'\n', &buf[..end]) {
            if skipping {
                skipping = false;
            } else {
                line_no += 1;
                f(line_no, trim_cr(&buf[pos..nl]));
            }
            pos = nl + 1;
        }
        if pos == 0 && end == buf.len() {
            if !skipping {
                line_no += 1;
                f(line_no, &buf[..end]);
                skipping = true;
            }
            end = 0;
        } else {
            buf.copy_within(pos..end, 0);
            end -= pos;
        }
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(input: &[u8]) -> Vec<(u64, Vec<u8>)> {
        let mut v = Vec::new();
        for_each_line(input, |n, l| v.push((n, l.to_vec()))).unwrap();
        v
    }

    #[test]
    fn splits_lines_and_keeps_the_last_without_newline() {
        let v = collect(b"a\r\nbb\n\nc");
        let lines: Vec<_> = v.iter().map(|(n, l)| (*n, l.as_slice())).collect();
        assert_eq!(lines, [(1, &b"a"[..]), (2, b"bb"), (3, b""), (4, b"c")]);
    }

    #[test]
    fn an_overlong_line_is_cut_and_counted_once() {
        let mut input = vec![b'x'; BUF_BYTES * 2 + 10];
        input.extend_from_slice(b"\nnext\n");
        let v = collect(&input);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].1.len(), BUF_BYTES);
        assert_eq!((v[1].0, v[1].1.as_slice()), (2, &b"next"[..]));
    }
}
