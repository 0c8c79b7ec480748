//! HTTP/2 streams refused below the handler. The h2 codec resets a stream itself when it
//! is over `max_concurrent_streams` (REFUSED_STREAM) or its head is malformed, an invalid
//! `:authority` among them (PROTOCOL_ERROR); upkeep's server never sees those streams. The
//! server's outgoing frames are watched for such resets, so each is access-logged and
//! counted like an HTTP/1 refusal. Only frame headers are read; payloads are skipped by
//! length, except the four bytes of a RST_STREAM's error code.

use crate::error::Cause;

const FRAME_HEADER: usize = 9;
const RST_STREAM: u8 = 0x3;
const PROTOCOL_ERROR: u32 = 0x1;
const REFUSED_STREAM: u32 = 0x7;

/// What a refused stream is logged as, by the reset's error code; `None` for resets that
/// are no refusal (a cancelled or finished stream).
pub fn refusal(code: u32) -> Option<(Cause, &'static str)> {
    match code {
        REFUSED_STREAM => Some((Cause::Overloaded, "refused_stream")),
        PROTOCOL_ERROR => Some((Cause::BadRequest, "malformed_stream")),
        _ => None,
    }
}

/// Follows the frames of the server's side of one HTTP/2 connection.
#[derive(Debug, Default)]
pub struct ResetWatch {
    head: [u8; FRAME_HEADER],
    head_len: usize,
    /// Payload bytes of the current frame still to pass.
    payload_left: usize,
    /// The current frame is a RST_STREAM: its error code so far.
    rst: Option<([u8; 4], usize)>,
}

impl ResetWatch {
    /// Takes bytes the server wrote, in order; calls `reset` with the error code of every
    /// RST_STREAM frame among them.
    pub fn feed(&mut self, mut data: &[u8], mut reset: impl FnMut(u32)) {
        while !data.is_empty() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(data.len());
                if let Some((code, have)) = &mut self.rst {
                    let take = (4 - *have).min(n);
                    code[*have..*have + take].copy_from_slice(&data[..take]);
                    *have += take;
                    if *have == 4 {
                        reset(u32::from_be_bytes(*code));
                        self.rst = None;
                    }
                }
                self.payload_left -= n;
                data = &data[n..];
                continue;
            }
            let n = (FRAME_HEADER - self.head_len).min(data.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&data[..n]);
            self.head_len += n;
            data = &data[n..];
            if self.head_len == FRAME_HEADER {
                self.head_len = 0;
                let len = u32::from_be_bytes([0, self.head[0], self.head[1], self.head[2]]);
                self.payload_left = len as usize;
                self.rst = (self.head[3] == RST_STREAM && len == 4).then_some(([0; 4], 0));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ty: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], ty, 0];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn resets_are_found_in_any_split_of_the_byte_stream() {
        let mut bytes = frame(0x4, 0, &[0; 12]); // SETTINGS
        bytes.extend(frame(0x1, 1, &[0x88; 30])); // HEADERS
        bytes.extend(frame(0x0, 1, &[3; 1000])); // DATA holding RST-like bytes
        bytes.extend(frame(RST_STREAM, 3, &REFUSED_STREAM.to_be_bytes()));
        bytes.extend(frame(RST_STREAM, 5, &PROTOCOL_ERROR.to_be_bytes()));
        bytes.extend(frame(RST_STREAM, 7, &0x8u32.to_be_bytes())); // CANCEL
        for chunk in [1, 2, 5, 9, 13, 4096] {
            let mut w = ResetWatch::default();
            let mut codes = Vec::new();
            for piece in bytes.chunks(chunk) {
                w.feed(piece, |c| codes.push(c));
            }
            assert_eq!(
                codes,
                vec![REFUSED_STREAM, PROTOCOL_ERROR, 0x8],
                "chunks of {chunk}"
            );
        }
        assert_eq!(refusal(REFUSED_STREAM).unwrap().0, Cause::Overloaded);
        assert_eq!(refusal(PROTOCOL_ERROR).unwrap().0, Cause::BadRequest);
        assert_eq!(refusal(0x8), None);
    }
}
