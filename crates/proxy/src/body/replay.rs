//! A request body that can be sent again: what has been handed to the upstream is kept (up to
//! `REPLAY_LIMIT` bytes) so that a stream an HTTP/2 peer refused unprocessed (GOAWAY,
//! `REFUSED_STREAM`) is sent again with its body on a fresh connection.
//!
//! The body stays shared between the attempts: each attempt gets a handle of its own
//! generation, and a handle of an earlier generation (still held by the refused stream's
//! sending task) yields nothing more, so no frame goes to two streams.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};

use super::{ReqBody, SendProgress};
use crate::error::BoxError;

/// Bytes of body kept for a replay by default (`pool.http2_replay_buffer_bytes`).
pub const REPLAY_LIMIT: usize = 64 * 1024;

enum Kept {
    Data(Bytes),
    Trailers(HeaderMap),
}

struct State {
    inner: ReqBody,
    kept: Vec<Kept>,
    kept_bytes: usize,
    /// Most bytes kept.
    limit: usize,
    /// More than `limit` went out: no replay.
    overflow: bool,
    /// The generation whose handle may read.
    generation: u64,
    /// How many kept frames the current handle has replayed.
    pos: usize,
    done: bool,
}

/// One attempt's handle on a shared, replayable body.
pub struct Replay {
    state: Arc<Mutex<State>>,
    generation: u64,
}

impl Replay {
    /// Wraps a body that has not been sent yet, keeping up to `limit` bytes of it.
    pub fn new(inner: ReqBody, limit: usize) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                inner,
                kept: Vec::new(),
                kept_bytes: 0,
                limit,
                overflow: false,
                generation: 0,
                pos: 0,
                done: false,
            })),
            generation: 0,
        }
    }

    /// More body went out than is kept: it cannot be sent again.
    pub fn overflowed(&self) -> bool {
        self.state.lock().unwrap().overflow
    }

    /// A handle for the next attempt, which starts from the first byte; `None` when more than
    /// the limit in bytes has already gone out. Earlier handles stop reading.
    pub fn rewind(&self) -> Option<Self> {
        let mut st = self.state.lock().unwrap();
        if st.overflow {
            return None;
        }
        st.generation += 1;
        st.pos = 0;
        Some(Self {
            state: self.state.clone(),
            generation: st.generation,
        })
    }

    /// How the sending is going.
    pub fn progress(&self) -> Option<Arc<SendProgress>> {
        self.state.lock().unwrap().inner.progress()
    }

    pub(super) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut st = self.state.lock().unwrap();
        if st.generation != self.generation {
            return Poll::Ready(None);
        }
        if st.pos < st.kept.len() {
            let frame = match &st.kept[st.pos] {
                Kept::Data(d) => Frame::data(d.clone()),
                Kept::Trailers(t) => Frame::trailers(t.clone()),
            };
            st.pos += 1;
            return Poll::Ready(Some(Ok(frame)));
        }
        if st.done {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut st.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) if !st.overflow => {
                let kept = match (frame.data_ref(), frame.trailers_ref()) {
                    (Some(d), _) => Some((Kept::Data(d.clone()), d.len())),
                    (_, Some(t)) => Some((Kept::Trailers(t.clone()), 0)),
                    _ => None,
                };
                if let Some((k, n)) = kept {
                    st.kept_bytes += n;
                    if st.kept_bytes > st.limit {
                        st.overflow = true;
                        st.kept = Vec::new();
                    } else {
                        st.kept.push(k);
                    }
                    st.pos = st.kept.len();
                }
            }
            Poll::Ready(None) => st.done = true,
            _ => {}
        }
        polled
    }

    pub(super) fn is_end_stream(&self) -> bool {
        let st = self.state.lock().unwrap();
        st.generation != self.generation
            || (st.pos >= st.kept.len() && (st.done || st.inner.is_end_stream()))
    }
}
