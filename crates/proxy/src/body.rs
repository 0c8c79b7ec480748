//! Request and response bodies: streamed frame by frame, never buffered whole.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::error::BoxError;
use crate::pool::Checkin;

/// The body sent upstream: empty, or the client's body with its first frame already read
/// (so a malformed first chunk is refused before any upstream sees the request).
pub enum ReqBody {
    /// No body.
    Empty,
    /// The client's body.
    Stream {
        /// The frame read ahead, if any.
        first: Option<Frame<Bytes>>,
        /// The rest.
        rest: Incoming,
        /// Body bytes passed on so far (for the access log).
        seen: std::sync::Arc<std::sync::atomic::AtomicU64>,
    },
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ReqBody::Empty => Poll::Ready(None),
            ReqBody::Stream { first, rest, seen } => {
                let frame = match first.take() {
                    Some(f) => Some(Ok(f)),
                    None => ready!(Pin::new(rest).poll_frame(cx)),
                };
                if let Some(d) = frame
                    .as_ref()
                    .and_then(|f| f.as_ref().ok())
                    .and_then(|f| f.data_ref())
                {
                    seen.fetch_add(d.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Empty => true,
            ReqBody::Stream { first, rest, .. } => first.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Empty => SizeHint::with_exact(0),
            ReqBody::Stream { first, rest, .. } => {
                let h = rest.size_hint();
                let n = first
                    .as_ref()
                    .and_then(|f| f.data_ref())
                    .map_or(0, |d| d.len() as u64);
                let mut out = SizeHint::new();
                // Upper before lower: SizeHint asserts lower <= upper on every set.
                if let Some(u) = h.upper() {
                    out.set_upper(u + n);
                }
                out.set_lower(h.lower() + n);
                out
            }
        }
    }
}

/// Called once when a response body ends or is dropped, with the bytes sent and whether it completed.
pub trait OnDone: Send + 'static {
    /// The body is finished (or abandoned).
    fn done(self: Box<Self>, bytes: u64, complete: bool);
}

/// The body sent downstream.
pub struct RespBody {
    inner: Inner,
    bytes: u64,
    complete: bool,
    on_done: Option<Box<dyn OnDone>>,
}

enum Inner {
    Full(Option<Bytes>),
    Upstream {
        body: Incoming,
        checkin: Option<Checkin>,
    },
}

impl RespBody {
    /// A body made by upkeep itself.
    pub fn full(data: impl Into<Bytes>) -> Self {
        Self::new(Inner::Full(Some(data.into())))
    }

    /// An empty body.
    pub fn empty() -> Self {
        Self::new(Inner::Full(None))
    }

    /// An upstream body; at its end the connection goes back to the pool.
    pub(crate) fn upstream(body: Incoming, checkin: Option<Checkin>) -> Self {
        Self::new(Inner::Upstream { body, checkin })
    }

    fn new(inner: Inner) -> Self {
        Self {
            inner,
            bytes: 0,
            complete: false,
            on_done: None,
        }
    }

    /// Registers what happens when the body is finished.
    pub fn on_done(&mut self, f: Box<dyn OnDone>) {
        self.on_done = Some(f);
    }
}

impl Drop for RespBody {
    fn drop(&mut self) {
        // hyper stops polling once a length-delimited body is fully sent, so "ended" is
        // also "nothing left to read".
        let ended = match &self.inner {
            Inner::Full(d) => d.is_none(),
            Inner::Upstream { body, .. } => body.is_end_stream(),
        };
        self.complete |= ended;
        if let Inner::Upstream { body, checkin } = &mut self.inner {
            if body.is_end_stream() {
                if let Some(c) = checkin.take() {
                    c.finish_later();
                }
            }
        }
        if let Some(f) = self.on_done.take() {
            f.done(self.bytes, self.complete);
        }
    }
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let res = match &mut this.inner {
            Inner::Full(data) => data.take().map(|d| Ok(Frame::data(d))),
            Inner::Upstream { body, checkin } => {
                match ready!(Pin::new(&mut *body).poll_frame(cx)) {
                    Some(Ok(f)) => Some(Ok(f)),
                    Some(Err(e)) => {
                        checkin.take();
                        Some(Err(e.into()))
                    }
                    None => {
                        if let Some(c) = checkin.take() {
                            c.finish(cx);
                        }
                        None
                    }
                }
            }
        };
        match &res {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    this.bytes += d.len() as u64;
                }
            }
            None => this.complete = true,
            Some(Err(_)) => {}
        }
        Poll::Ready(res)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full(d) => d.is_none(),
            // Polled to the end even when empty, so the connection returns to the pool.
            Inner::Upstream { body, checkin } => checkin.is_none() && body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full(Some(d)) => SizeHint::with_exact(d.len() as u64),
            Inner::Full(None) => SizeHint::with_exact(0),
            Inner::Upstream { body, .. } => body.size_hint(),
        }
    }
}
