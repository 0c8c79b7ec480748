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

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;

pub use client::Wire;
/// For the fuzz target `h1_server_request` and its corpus replay.
#[doc(hidden)]
pub use server::request_invariants as server_request_invariants;

use crate::error::BoxError;
use crate::pool::{Conn, Pool};
use client::{Read, Reading};

/// The connection type the pool keeps for the codec.
pub(crate) type OwnWire = Wire<crate::pool::OwnIo>;

/// A response body being read from the connection it arrived on; the connection goes back
/// to the pool at the body's end, when the response allows it.
pub(crate) struct Streaming {
    conn: Option<Conn>,
    reading: Reading,
    pool: Arc<Pool>,
    /// Zero: not reused.
    idle: Duration,
    /// The end was returned.
    ended: bool,
    /// The response head as received (`head::RawHead`), until the writer takes it.
    raw_head: Option<head::RawHead>,
}

impl Streaming {
    /// Streams the body that `reading` reads from `conn`.
    pub(crate) fn new(conn: Conn, reading: Reading, pool: Arc<Pool>, idle: Duration) -> Self {
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
