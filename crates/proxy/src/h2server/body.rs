//! A request body read from an HTTP/2 stream: DATA frames as they come, each one's
//! flow-control capacity released as it is handed on (so the client's window reopens as the
//! upstream takes the body, never faster), then the client's trailers.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};

/// The client's body on one stream.
pub struct H2Body {
    recv: Option<h2::RecvStream>,
    /// What `Content-Length` says is still to come, if it was sent.
    remaining: Option<u64>,
    data_done: bool,
    /// Told to the stream's task: the first read (`Expect`), the end.
    progress: Option<Arc<Progress>>,
    /// `Expect: 100-continue`: the first read asks the stream's task for the `100`.
    expects: bool,
}

/// What the stream's task learns from its request body (`h2server::stream`).
#[derive(Default)]
pub(super) struct Progress {
    wanted: AtomicBool,
    waker: AtomicWaker,
    ended: AtomicBool,
}

impl Progress {
    fn want(&self) {
        self.wanted.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// True once, when an `Expect` body was first read: the `100` is due.
    pub(super) fn poll_wanted(&self, cx: &mut Context<'_>) -> bool {
        self.waker.register(cx.waker());
        self.wanted.swap(false, Ordering::AcqRel)
    }

    /// The body was read to its end (or the client cancelled it).
    pub(super) fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }
}

impl H2Body {
    /// The body of a stream whose head declared `content_length` (if any); `progress`, when
    /// the stream's task follows the body (one that has yet to come).
    pub(super) fn new(
        recv: h2::RecvStream,
        content_length: Option<u64>,
        progress: Option<Arc<Progress>>,
        expects: bool,
    ) -> Self {
        Self {
            recv: Some(recv),
            remaining: content_length,
            data_done: false,
            progress,
            expects,
        }
    }

    fn end(&mut self) {
        self.recv = None;
        if let Some(p) = &self.progress {
            p.ended.store(true, Ordering::Release);
        }
    }

    /// No body (an extended CONNECT, whose stream becomes the tunnel).
    pub(super) fn empty() -> Self {
        Self {
            recv: None,
            remaining: Some(0),
            data_done: true,
            progress: None,
            expects: false,
        }
    }
}

/// A reset the client sent with NO_ERROR or CANCEL after its whole body reads as the end,
/// as hyper's server read it (a client that has its answer may cancel the rest).
fn is_quiet_end(e: &h2::Error) -> bool {
    matches!(
        e.reason(),
        Some(h2::Reason::NO_ERROR) | Some(h2::Reason::CANCEL)
    ) && e.is_reset()
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = &mut *self;
        if std::mem::take(&mut this.expects) {
            if let Some(p) = &this.progress {
                p.want();
            }
        }
        let Some(recv) = &mut this.recv else {
            return Poll::Ready(None);
        };
        if !this.data_done {
            match ready!(recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = recv.flow_control().release_capacity(data.len());
                    if let Some(r) = &mut this.remaining {
                        *r = r.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) if is_quiet_end(&e) => {
                    this.end();
                    return Poll::Ready(None);
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.data_done = true,
            }
        }
        match ready!(recv.poll_trailers(cx)) {
            Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Ok(None) => {
                this.end();
                Poll::Ready(None)
            }
            Err(e) if is_quiet_end(&e) => {
                this.end();
                Poll::Ready(None)
            }
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.as_ref().is_none_or(h2::RecvStream::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(n) if !self.data_done => SizeHint::with_exact(n),
            _ if self.is_end_stream() => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}
