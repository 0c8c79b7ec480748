//! A `100 Continue` from an HTTP/2 peer, seen as it passes under hyper, on a connection
//! opened for one request with `Expect: 100-continue` (`crate::expect`).
//!
//! hyper's HTTP/2 client reads informational responses and drops them (it reports them only
//! on HTTP/1.1), so the request's body would wait out `expect::EXPECT_WAIT` although the peer
//! asked for it at once. On a connection that carries that one request, the peer's first
//! response header block is on stream 1, and its first field is `:status` (RFC 9113 §8.3.2:
//! pseudo-header fields come first). No header block came before it on the connection, so
//! the HPACK dynamic table is empty (RFC 7541 §2.3.2) and `:status: 100` can only be a
//! literal field whose name is a static `:status` entry (indexes 8-14) and whose value is
//! `100`, plain or Huffman-coded; the static table has no `100` to index. That one field is
//! all that is decoded here; h2, under hyper, decodes the whole block as always.

/// Frame header length (RFC 9113 §4.1).
const HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Bytes read before the first response header block that are kept to find it; past this
/// (a peer sending much else first) the request falls back to the wait.
const MAX_SCAN: usize = 16 * 1024;
/// `100` Huffman-coded (RFC 7541 Appendix B: '1' 00001, '0' 00000, '0' 00000, EOS padding).
const HUFFMAN_100: [u8; 2] = [0x08, 0x01];

/// What is called when the peer's first answer on stream 1 is `100`.
pub(crate) type OnContinue = Box<dyn FnOnce() + Send + Sync>;

/// Looks at a connection's read bytes until stream 1's first header block
/// (`h2_settings::SettingsWatch` passes them on).
pub(crate) struct ContinueScan {
    /// The bytes read so far, while still looking.
    seen: Vec<u8>,
    on_continue: Option<OnContinue>,
}

impl ContinueScan {
    pub(crate) fn new(on_continue: OnContinue) -> Self {
        Self {
            seen: Vec::new(),
            on_continue: Some(on_continue),
        }
    }

    /// Still looking.
    pub(crate) fn active(&self) -> bool {
        self.on_continue.is_some()
    }

    /// The peer closed: nothing more to look for.
    pub(crate) fn closed(&mut self) {
        self.on_continue = None;
        self.seen = Vec::new();
    }

    /// Bytes just read from the peer.
    pub(crate) fn look(&mut self, data: &[u8]) {
        if !self.active() {
            return;
        }
        self.seen.extend_from_slice(data);
        match first_status_is_100(&self.seen) {
            None if self.seen.len() <= MAX_SCAN => {}
            found => {
                let call = self.on_continue.take();
                self.seen = Vec::new();
                if let (Some(true), Some(f)) = (found, call) {
                    f();
                }
            }
        }
    }
}

/// Whether the first header block on stream 1 in `buf` (a server's byte stream from its
/// preface on) starts with `:status: 100`; `None` while more bytes are needed.
pub(crate) fn first_status_is_100(buf: &[u8]) -> Option<bool> {
    let mut at = 0;
    loop {
        let head = buf.get(at..at + HEADER)?;
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let payload_at = at + HEADER;
        if kind == HEADERS && stream == 1 {
            // The field sits after the pad length and priority fields, within the first bytes.
            let want = len.min(32);
            let payload = buf.get(payload_at..payload_at + want)?;
            return Some(status_field_is_100(payload, flags, len));
        }
        at = payload_at + len;
    }
}

fn status_field_is_100(payload: &[u8], flags: u8, len: usize) -> bool {
    let mut p = 0;
    let mut end = len.min(payload.len());
    if flags & PADDED != 0 {
        let Some(&pad) = payload.first() else {
            return false;
        };
        p += 1;
        end = end.min(len.saturating_sub(usize::from(pad)));
    }
    if flags & PRIORITY != 0 {
        p += 5;
    }
    let block = payload.get(p..end).unwrap_or_default();
    let mut i = 0;
    // Dynamic table size updates may open a block (RFC 7541 §4.2).
    while block.get(i).is_some_and(|b| b & 0xe0 == 0x20) {
        let Some(next) = integer(block, i, 5) else {
            return false;
        };
        i = next.1;
    }
    let Some(&first) = block.get(i) else {
        return false;
    };
    let prefix = match first {
        // Indexed field: the static table's `:status` entries are 200-500.
        b if b & 0x80 != 0 => return false,
        // With incremental indexing.
        b if b & 0xc0 == 0x40 => 6,
        // Without indexing, never indexed.
        b if b & 0xf0 == 0x00 || b & 0xf0 == 0x10 => 4,
        _ => return false,
    };
    let Some((index, at)) = integer(block, i, prefix) else {
        return false;
    };
    if !(8..=14).contains(&index) {
        return false;
    }
    let Some(&vh) = block.get(at) else {
        return false;
    };
    let Some((vlen, vat)) = integer(block, at, 7) else {
        return false;
    };
    let Some(value) = block.get(vat..vat + vlen) else {
        return false;
    };
    if vh & 0x80 != 0 {
        value == HUFFMAN_100
    } else {
        value == b"100"
    }
}

/// An HPACK integer with an `n`-bit prefix starting at `block[i]` (RFC 7541 §5.1): its value
/// and the index after it.
fn integer(block: &[u8], i: usize, n: u32) -> Option<(usize, usize)> {
    let max = (1usize << n) - 1;
    let mut value = usize::from(*block.get(i)?) & max;
    let mut at = i + 1;
    if value < max {
        return Some((value, at));
    }
    let mut shift = 0;
    loop {
        let b = *block.get(at)?;
        at += 1;
        value += usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 || shift > 21 {
            return Some((value, at));
        }
        shift += 7;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn preface() -> Vec<u8> {
        // SETTINGS (empty), then WINDOW_UPDATE on the connection.
        let mut b = frame(0x4, 0, 0, &[]);
        b.extend(frame(0x8, 0, 0, &[0, 0, 0x10, 0]));
        b
    }

    #[test]
    fn a_literal_status_100_plain_or_huffman_is_seen_after_the_preface() {
        for block in [
            // Literal with incremental indexing, name index 8, plain "100".
            &[0x48, 0x03, b'1', b'0', b'0'][..],
            // Without indexing, name index 8, Huffman "100".
            &[0x08, 0x82, 0x08, 0x01][..],
            // Never indexed, name index 9, after a table size update to 4096 (0x3f 0xe1 0x1f).
            &[0x3f, 0xe1, 0x1f, 0x19, 0x03, b'1', b'0', b'0'][..],
        ] {
            let mut b = preface();
            b.extend(frame(HEADERS, 0x4, 1, block));
            assert_eq!(first_status_is_100(&b), Some(true), "{block:x?}");
            // Split anywhere before the field ends: more bytes are wanted.
            assert_eq!(first_status_is_100(&b[..b.len() - block.len()]), None);
        }
    }

    #[test]
    fn a_final_status_or_another_stream_is_not_a_continue() {
        // Indexed :status 200 (static index 8).
        let mut b = preface();
        b.extend(frame(HEADERS, 0x5, 1, &[0x88]));
        assert_eq!(first_status_is_100(&b), Some(false));
        // A literal 103 is not a 100.
        let mut b = preface();
        b.extend(frame(HEADERS, 0x4, 1, &[0x48, 0x03, b'1', b'0', b'3']));
        assert_eq!(first_status_is_100(&b), Some(false));
        // Padded and with priority: the field is found behind them.
        let mut b = preface();
        let mut payload = vec![2, 0, 0, 0, 0, 16];
        payload.extend_from_slice(&[0x48, 0x03, b'1', b'0', b'0', 0, 0]);
        b.extend(frame(HEADERS, 0x4 | PADDED | PRIORITY, 1, &payload));
        assert_eq!(first_status_is_100(&b), Some(true));
        // Headers on stream 3 only: still looking for stream 1's.
        let mut b = preface();
        b.extend(frame(HEADERS, 0x4, 3, &[0x48, 0x03, b'1', b'0', b'0']));
        assert_eq!(first_status_is_100(&b), None);
    }
}
