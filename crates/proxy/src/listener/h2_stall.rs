//! `send_timeout` for HTTP/2 streams. A client that stops granting flow-control window
//! stalls a stream without ever blocking a socket write, so the connection's send timer
//! never sees it: the stream's task (`crate::h2server`) simply stops asking the response body
//! for more. Each stream's task
//! is therefore spawned through [`StreamExec`], which knows when its body last handed over
//! data that has not been taken since; after `send_timeout` of that the task is dropped,
//! and h2 resets the stream (CANCEL) while the connection and its other streams go on.
//!
//! The measure is per chunk: a stream is cut when its last chunk (at most the upstream's
//! read size) has not been taken within `send_timeout`, so a client that grants a window
//! slower than one chunk per `send_timeout` is treated as stalled.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use crate::state::Shared;

thread_local! {
    /// The stamp of the stream whose task is being polled on this thread, for its body to
    /// set: when the body last handed over data not taken since (the connection clock's
    /// milliseconds + 1, `super::coarse_ms`; 0 while nothing waits). Moved in before each
    /// poll of the task and back out after it: no allocation or shared count per stream.
    static CURRENT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Spawns the tasks of one HTTP/2 connection's streams with the stall timer.
#[derive(Clone)]
pub struct StreamExec {
    send_timeout: Duration,
    shared: Arc<Shared>,
}

impl StreamExec {
    /// For a connection whose listener has `send_timeout`.
    pub fn new(send_timeout: Duration, shared: Arc<Shared>) -> Self {
        Self {
            send_timeout,
            shared,
        }
    }

    /// Spawns a stream's task. Boxed on purpose: `tokio::spawn` moves its future by value
    /// through several calls; behind a box each move is a pointer, not the stream's state of
    /// some KB (measured: without the box, memcpy doubled to 12.6k instructions a request).
    /// The caller makes the box in place (`Box::write` into `Box::new_uninit`), which also
    /// saves the one copy that `Box::pin(fut)` would make.
    pub fn spawn<F>(&self, fut: Pin<Box<F>>)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(Watched {
            inner: fut,
            waiting_since: 0,
            limit: self.send_timeout,
            timer: None,
            shared: self.shared.clone(),
        });
    }
}

/// One stream's task under the stall timer.
struct Watched<F> {
    inner: Pin<Box<F>>,
    /// The stream's stamp (see `CURRENT`).
    waiting_since: u64,
    limit: Duration,
    timer: Option<(u64, Pin<Box<Sleep>>)>,
    shared: Arc<Shared>,
}

impl<F: Future<Output = ()>> Future for Watched<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let previous = CURRENT.replace(Some(this.waiting_since));
        let r = this.inner.as_mut().poll(cx);
        this.waiting_since = CURRENT.replace(previous).unwrap_or(0);
        if r.is_ready() {
            return Poll::Ready(());
        }
        let since = this.waiting_since;
        if since == 0 {
            this.timer = None;
            return Poll::Pending;
        }
        let limit_ms = u64::try_from(this.limit.as_millis()).unwrap_or(u64::MAX);
        let left_ms = (since - 1)
            .saturating_add(limit_ms)
            .saturating_sub(super::coarse_ms());
        match &mut this.timer {
            Some((at, t)) if *at == since => {
                if t.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
            _ => {
                let mut t = Box::pin(tokio::time::sleep(Duration::from_millis(left_ms)));
                let fired = t.as_mut().poll(cx).is_ready();
                this.timer = Some((since, t));
                if !fired {
                    return Poll::Pending;
                }
            }
        }
        // Dropping the task drops the stream's handle: h2 resets it, the upstream side is
        // released, and the connection's other streams go on.
        tracing::debug!(
            send_timeout_ms = this.limit.as_millis() as u64,
            "HTTP/2 stream: the client granted no window for send_timeout; reset"
        );
        this.shared
            .metrics
            .timeouts
            .get_or_create(&crate::metrics::TimeoutLabel { timeout: "send" })
            .inc();
        Poll::Ready(())
    }
}

pin_project_lite::pin_project! {
    /// A response body on an HTTP/2 stream: stamps its stream when it hands over data (the
    /// next poll only comes once the client has window for more) and clears the stamp when
    /// polled again.
    pub struct StallWatch<B> {
        #[pin]
        inner: B,
    }
}

impl<B> StallWatch<B> {
    /// Wraps `inner`.
    pub fn new(inner: B) -> Self {
        Self { inner }
    }
}

impl<B: Body<Data = Bytes>> Body for StallWatch<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let r = self.project().inner.poll_frame(cx);
        if CURRENT.get().is_some() {
            let handed_data = matches!(&r, Poll::Ready(Some(Ok(f))) if f.is_data());
            CURRENT.set(Some(if handed_data {
                super::coarse_ms() + 1
            } else {
                0
            }));
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
