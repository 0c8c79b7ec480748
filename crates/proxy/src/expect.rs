//! `Expect: 100-continue` forwarded (RFC 9110 §10.1.1): the upstream decides whether the
//! client uploads its body.
//!
//! hyper's HTTP/1 server sends `100 Continue` by itself the first time a request body is
//! polled, and has no other way to send one. So upkeep does not poll the client's body until
//! the upstream has answered `100` (seen through hyper's client `on_informational`): the
//! request goes upstream with its `Expect` header and a body behind a [`Gate`]; the
//! upstream's `100` opens the gate, the body is polled, hyper sends the client its `100`, and
//! the upload flows through. (An HTTP/2 peer's `100`, which hyper's client does not report,
//! is seen on a connection opened for the request alone: `pool::h2_continue`.) A final
//! answer first (`417`, `413`, `401`) is relayed as it is
//! and the body is never read; the upstream connection is then closed once that answer has
//! been relayed, since the upstream still expects the body on it. An upstream that says
//! nothing within [`EXPECT_WAIT`] gets the body anyway, as RFC 9110 asks of a client.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use http::{header, HeaderMap, Request, Response, StatusCode};
use tokio::time::{Instant, Sleep};

use crate::body::{OnDone, ReqBody, RespBody};
use crate::error::{BoxError, Cut};

/// How long the body waits for the upstream's `100` before it is sent anyway (curl waits 1 s).
pub const EXPECT_WAIT: Duration = Duration::from_secs(1);

const WAITING: u8 = 0;
const OPEN: u8 = 1;
const REFUSED: u8 = 2;
const ABORTED: u8 = 3;

/// The upstream answered before asking for the body; it was never sent.
#[derive(Debug, thiserror::Error)]
#[error("the upstream answered before asking for the request body (Expect: 100-continue)")]
pub struct NotAsked;

/// Whether the client's body may go upstream yet.
#[derive(Default)]
pub struct Gate {
    state: AtomicU8,
    waker: AtomicWaker,
}

impl Gate {
    fn set(&self, from: u8, to: u8) -> bool {
        let moved = self
            .state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if moved {
            self.waker.wake();
        }
        moved
    }
}

/// Whether a request asks for `100 Continue` before its body (HTTP/1.1 and later).
pub fn expects_continue(version: http::Version, headers: &HeaderMap) -> bool {
    version >= http::Version::HTTP_11
        && headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// The side of the gate a request body polls.
pub struct Waiter {
    gate: Arc<Gate>,
    timer: Option<Pin<Box<Sleep>>>,
}

impl Waiter {
    /// A closed gate.
    pub fn new() -> Self {
        Self {
            gate: Arc::default(),
            timer: None,
        }
    }

    /// The gate, for the request's `on_informational` callback and the response.
    pub fn gate(&self) -> Arc<Gate> {
        self.gate.clone()
    }

    /// `Ready(Ok)` once the body may be read; an error once the upstream answered without
    /// asking for it and that answer has been relayed.
    pub fn poll_open(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.gate.waker.register(cx.waker());
        match self.gate.state.load(Ordering::Acquire) {
            OPEN => Poll::Ready(Ok(())),
            ABORTED => Poll::Ready(Err(Box::new(NotAsked))),
            REFUSED => Poll::Pending,
            _ => {
                let timer = self.timer.get_or_insert_with(|| {
                    Box::pin(tokio::time::sleep_until(Instant::now() + EXPECT_WAIT))
                });
                if timer.as_mut().poll(cx).is_ready() && self.gate.set(WAITING, OPEN) {
                    tracing::debug!("no 100 Continue from the upstream in time; sending the body");
                    return Poll::Ready(Ok(()));
                }
                match self.gate.state.load(Ordering::Acquire) {
                    OPEN => Poll::Ready(Ok(())),
                    _ => Poll::Pending,
                }
            }
        }
    }
}

impl Default for Waiter {
    fn default() -> Self {
        Self::new()
    }
}

/// Before a request goes upstream: its gate, with the upstream's `100` wired to open it.
pub fn prepare(req: &mut Request<ReqBody>) -> Option<Arc<Gate>> {
    let gate = req.body().gate()?;
    let g = gate.clone();
    hyper::ext::on_informational(req, move |res| {
        if res.status() == StatusCode::CONTINUE {
            g.set(WAITING, OPEN);
        }
    });
    Some(gate)
}

/// What opens `gate` when an HTTP/2 peer's `100` is seen under hyper (`pool::h2_continue`).
pub(crate) fn on_upstream_continue(gate: Arc<Gate>) -> Box<dyn FnOnce() + Send + Sync> {
    Box::new(move || {
        if gate.set(WAITING, OPEN) {
            tracing::debug!("the HTTP/2 upstream answered 100 Continue; sending the body");
        }
    })
}

/// A relayed answer that refused the body; the connection is closed once it has been sent.
#[derive(Clone)]
struct Refused(Arc<Gate>);

/// The upstream's response head arrived: a final answer while the gate is still closed is a
/// refusal. The body stays unread, and [`on_done`] ends the upstream connection later.
pub fn on_response<B>(gate: Option<&Arc<Gate>>, mut resp: Response<B>) -> Response<B> {
    if let Some(g) = gate {
        if !resp.status().is_informational() && g.set(WAITING, REFUSED) {
            tracing::debug!(
                status = resp.status().as_u16(),
                "the upstream refused the body before it was sent (Expect: 100-continue)"
            );
            resp.extensions_mut().insert(Refused(g.clone()));
        }
    }
    resp
}

/// Wraps the request's end-of-response callback: after a refusal has been relayed whole, the
/// unsent body fails, which closes the upstream connection (never reused).
pub fn on_done(resp: &mut Response<RespBody>, done: Box<dyn OnDone>) -> Box<dyn OnDone> {
    match resp.extensions_mut().remove::<Refused>() {
        Some(Refused(gate)) => Box::new(AbortAfter { gate, inner: done }),
        None => done,
    }
}

struct AbortAfter {
    gate: Arc<Gate>,
    inner: Box<dyn OnDone>,
}

impl OnDone for AbortAfter {
    fn done(self: Box<Self>, bytes: u64, complete: bool, cut: Option<Cut>) {
        self.gate.set(REFUSED, ABORTED);
        self.inner.done(bytes, complete, cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn poll_once(w: &mut Waiter) -> Poll<Result<(), BoxError>> {
        std::future::poll_fn(|cx| Poll::Ready(w.poll_open(cx))).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_upstream_gets_the_body_after_expect_wait() {
        let mut w = Waiter::new();
        assert!(poll_once(&mut w).await.is_pending());
        tokio::time::advance(EXPECT_WAIT - Duration::from_millis(10)).await;
        assert!(poll_once(&mut w).await.is_pending());
        tokio::time::advance(Duration::from_millis(20)).await;
        assert!(matches!(poll_once(&mut w).await, Poll::Ready(Ok(()))));
    }

    #[tokio::test(start_paused = true)]
    async fn the_upstreams_100_opens_at_once_and_a_refusal_fails_the_body_once_relayed() {
        let mut w = Waiter::new();
        assert!(poll_once(&mut w).await.is_pending());
        w.gate().set(WAITING, OPEN);
        assert!(matches!(poll_once(&mut w).await, Poll::Ready(Ok(()))));

        let mut w = Waiter::new();
        assert!(poll_once(&mut w).await.is_pending());
        let resp = on_response(Some(&w.gate()), Response::new(()));
        assert!(resp.extensions().get::<Refused>().is_some());
        // Refused: never read, not even after the fallback wait, until the answer is relayed.
        tokio::time::advance(EXPECT_WAIT * 2).await;
        assert!(poll_once(&mut w).await.is_pending());
        w.gate().set(REFUSED, ABORTED);
        assert!(matches!(poll_once(&mut w).await, Poll::Ready(Err(_))));
    }

    #[test]
    fn only_100_continue_on_http11_and_later_is_an_expectation() {
        let mut h = HeaderMap::new();
        assert!(!expects_continue(http::Version::HTTP_11, &h));
        h.insert(header::EXPECT, "100-Continue".parse().unwrap());
        assert!(expects_continue(http::Version::HTTP_11, &h));
        assert!(expects_continue(http::Version::HTTP_2, &h));
        assert!(!expects_continue(http::Version::HTTP_10, &h));
        h.insert(header::EXPECT, "something-else".parse().unwrap());
        assert!(!expects_continue(http::Version::HTTP_11, &h));
    }
}
