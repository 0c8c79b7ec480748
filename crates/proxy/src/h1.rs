//! upkeep's own HTTP/1 client codec for the proxied path, on `httparse` (docs/http1.md).
//!
//! For HTTP/1.1 upstreams (plain or TLS) the request task owns the pooled connection while
//! it uses it: it writes the request, reads the response head (`head`, which is also the
//! strict response framing check) and streams the body (`body`) to the downstream side; the
//! connection goes back to the pool when the body has ended and the response allows reuse.
//! hyper stays for HTTP/2 upstreams, `Expect: 100-continue` requests and upgrades.
//!
//! `server` is the downstream twin: HTTP/1 requests read, handled and answered by upkeep's
//! own code, with a hand-over to hyper for what it does not serve.

pub mod body;
pub mod client;
pub(crate) mod fields;
pub mod head;
pub(crate) mod names;
pub(crate) mod server;

use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use tokio::io::AsyncWrite;

pub use client::Wire;
/// For the fuzz target `h1_server_request` and its corpus replay.
#[doc(hidden)]
pub use server::request_invariants as server_request_invariants;

use crate::error::BoxError;
use crate::pool::{Conn, Handle};
use client::{Read, Reading};

/// The connection type the pool keeps for the codec.
pub(crate) type OwnWire = Wire<crate::pool::OwnIo>;

/// Several buffers of at most this many bytes in all go out as one plain write.
pub(crate) const GATHER: usize = 2048;

thread_local! {
    /// Where [`poll_write_gathered`] puts small buffers together, one per serving thread.
    static GATHERED: RefCell<[u8; GATHER]> = const { RefCell::new([0; GATHER]) };
}

/// Writes `n` in base `radix` (10 or 16), as ASCII digits.
pub(crate) fn put_num(out: &mut BytesMut, n: u64, radix: u64) {
    let mut digits = [0u8; 20];
    out.put_slice(num(n, radix, &mut digits));
}

/// `n` in base `radix` (10 or 16), as ASCII digits at the end of `digits`.
pub(crate) fn num(mut n: u64, radix: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[(n % radix) as usize];
        n /= radix;
        if n == 0 {
            break;
        }
    }
    &digits[i..]
}

/// Writes the size line of a chunk of `n` bytes (`{n:x}\r\n`, RFC 9112 §7.1), as both
/// HTTP/1 writers frame a chunked body.
pub(crate) fn put_chunk_size(out: &mut BytesMut, n: usize) {
    put_num(out, n as u64, 16);
    out.put_slice(b"\r\n");
}

/// Fills `slices` for one vectored write from a message's writer: `head`, the bytes still to
/// go of the head in the writer's own buffer (none: left out), then as many of `queued` as
/// fit. Returns how many are set. (Filled in place: an array of slices returned by value
/// cost about 240 instructions a request, `bench/instructions.sh`.)
#[inline]
pub(crate) fn write_slices<'a>(
    slices: &mut [IoSlice<'a>; 16],
    head: &'a [u8],
    queued: impl Iterator<Item = &'a Bytes>,
) -> usize {
    let mut k = 0;
    if !head.is_empty() {
        slices[0] = IoSlice::new(head);
        k = 1;
    }
    for (s, b) in slices[k..].iter_mut().zip(queued) {
        *s = IoSlice::new(b);
        k += 1;
    }
    k
}

/// Writes some of `bufs` to `io`, as `writev` would, with the fewest bytes moved around:
/// one buffer goes out as a plain write (`send(2)`), and several that fit in [`GATHER`]
/// bytes (a response head and a small body) are copied together and written as one.
/// Measured on loopback TCP, a `writev(2)` of two buffers costs the kernel about 100 ns
/// more than a `send(2)` of the same bytes, and one of a single buffer about 70 ns more
/// (docs/performance-history.md, "One send a message"); the copy of a few hundred bytes costs less.
/// Over TLS the write makes one record instead of one per buffer. Every stream upkeep writes
/// a proxied message to goes through it: the own server's wire, and the upstream and
/// downstream streams hyper writes to (`pool::io::SharedIo`, `listener::Guarded`).
pub(crate) fn poll_write_gathered<W: AsyncWrite + Unpin + ?Sized>(
    mut io: Pin<&mut W>,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    let total = match bufs {
        [one] => return io.poll_write(cx, one),
        _ => bufs.iter().map(|b| b.len()).sum::<usize>(),
    };
    if total > GATHER || bufs.is_empty() {
        return io.poll_write_vectored(cx, bufs);
    }
    let gathered = GATHERED.try_with(|g| {
        let mut g = g.borrow_mut();
        let mut at = 0;
        for b in bufs {
            g[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
        io.as_mut().poll_write(cx, &g[..at])
    });
    // The thread is ending (its local is gone): as given.
    gathered.unwrap_or_else(|_| io.poll_write_vectored(cx, bufs))
}

/// A response body being read from the connection it arrived on; the connection goes back
/// to the pool at the body's end, when the response allows it.
pub(crate) struct Streaming {
    conn: Option<Conn>,
    reading: Reading,
    pool: Arc<Handle>,
    /// Zero: not reused.
    idle: Duration,
    /// The end was returned.
    ended: bool,
    /// The response head as received (`head::RawHead`), until the writer takes it.
    raw_head: Option<head::RawHead>,
}

impl Streaming {
    /// Streams the body that `reading` reads from `conn`.
    pub(crate) fn new(conn: Conn, reading: Reading, pool: Arc<Handle>, idle: Duration) -> Self {
        Self {
            conn: Some(conn),
            reading,
            pool,
            idle,
            ended: false,
            raw_head: None,
        }
    }

    /// Keeps the response head as received, for upkeep's own HTTP/1 server to write.
    pub(crate) fn set_raw_head(&mut self, raw: Option<head::RawHead>) {
        self.raw_head = raw;
    }

    /// The response head as received, if it was kept that way.
    pub(crate) fn take_raw_head(&mut self) -> Option<head::RawHead> {
        self.raw_head.take()
    }

    /// The body has ended (or failed): nothing more comes.
    pub(crate) fn is_end_stream(&self) -> bool {
        self.ended || (self.conn.is_some() && self.reading.at_end())
    }

    /// Bytes still expected, when the length is known.
    pub(crate) fn remaining(&self) -> Option<u64> {
        self.reading.remaining()
    }

    /// Drops the connection (a cut body): never reused.
    pub(crate) fn abandon(&mut self) {
        self.conn = None;
    }

    /// The next frame; `None` at the end, when the connection has been checked in.
    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(conn) = self.conn.as_mut() else {
            return Poll::Ready(None);
        };
        let Some(wire) = conn.wire_mut() else {
            return Poll::Ready(None);
        };
        match self.reading.poll_read(wire, cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Read::Frame(f))) => Poll::Ready(Some(Ok(f))),
            Poll::Ready(Ok(Read::End { reusable })) => {
                self.ended = true;
                let conn = self.conn.take();
                if let (true, false, Some(conn)) = (reusable, self.idle.is_zero(), conn) {
                    self.pool.check_in(conn, self.idle);
                }
                Poll::Ready(None)
            }
            Poll::Ready(Err(e)) => {
                self.conn = None;
                Poll::Ready(Some(Err(Box::new(e))))
            }
        }
    }

    /// At drop: a body that ended without a read left (bodyless, or all read) still returns
    /// its connection, as hyper's did.
    pub(crate) fn finish_on_drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let reusable = conn
            .wire_mut()
            .is_some_and(|w| self.reading.ended_cleanly(w));
        if reusable && !self.idle.is_zero() {
            self.pool.check_in(conn, self.idle);
        }
    }
}

/// A test stream that notes every write (vectored or not, and its bytes), taking at most
/// `take` bytes a write; reads never come.
#[cfg(test)]
#[derive(Clone)]
pub(crate) struct Recorder {
    take: usize,
    writes: Arc<std::sync::Mutex<Vec<Written>>>,
}

/// One write a [`Recorder`] took: whether it was vectored, and its bytes.
#[cfg(test)]
pub(crate) type Written = (bool, Vec<u8>);

#[cfg(test)]
impl Recorder {
    /// Takes every byte offered.
    pub(crate) fn new() -> Self {
        Self::taking(usize::MAX)
    }

    /// Takes at most `take` bytes a write.
    pub(crate) fn taking(take: usize) -> Self {
        Self {
            take,
            writes: Default::default(),
        }
    }

    /// The writes so far.
    pub(crate) fn writes(&self) -> Vec<Written> {
        self.writes.lock().unwrap().clone()
    }

    fn took(&self, vectored: bool, mut bytes: Vec<u8>) -> usize {
        bytes.truncate(self.take);
        let n = bytes.len();
        self.writes.lock().unwrap().push((vectored, bytes));
        n
    }
}

#[cfg(test)]
impl tokio::io::AsyncRead for Recorder {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Pending
    }
}

#[cfg(test)]
impl AsyncWrite for Recorder {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(self.took(false, buf.to_vec())))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(
            self.took(true, bufs.iter().flat_map(|b| b.iter().copied()).collect())
        ))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod gather_tests {
    use super::*;

    fn gathered(rec: &mut Recorder, bufs: &[&[u8]]) -> usize {
        let slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        match poll_write_gathered(Pin::new(rec), &mut cx, &slices) {
            Poll::Ready(Ok(n)) => n,
            other => panic!("not written: {other:?}"),
        }
    }

    #[test]
    fn one_buffer_is_one_plain_write() {
        let mut rec = Recorder::new();
        assert_eq!(gathered(&mut rec, &[b"head"]), 4);
        assert_eq!(rec.writes(), vec![(false, b"head".to_vec())]);
    }

    #[test]
    fn small_buffers_are_put_together_into_one_plain_write() {
        let mut rec = Recorder::new();
        assert_eq!(gathered(&mut rec, &[b"head\r\n\r\n", b"", b"ok"]), 10);
        assert_eq!(rec.writes(), vec![(false, b"head\r\n\r\nok".to_vec())]);
    }

    #[test]
    fn buffers_over_the_limit_go_out_as_given() {
        let mut rec = Recorder::new();
        let big = vec![b'x'; GATHER];
        assert_eq!(gathered(&mut rec, &[b"h", &big]), GATHER + 1);
        let writes = rec.writes();
        assert_eq!(writes.len(), 1);
        assert!(writes[0].0, "vectored");
        assert_eq!(writes[0].1.len(), GATHER + 1);
    }

    #[test]
    fn a_short_write_counts_what_went_as_writev_would() {
        // The socket takes 6 of 10 bytes: the caller is told 6, the first buffer and two
        // bytes of the second, and sends the rest itself.
        let mut rec = Recorder::taking(6);
        assert_eq!(gathered(&mut rec, &[b"abcd", b"efghij"]), 6);
        assert_eq!(rec.writes(), vec![(false, b"abcdef".to_vec())]);
    }
}
