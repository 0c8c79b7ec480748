//! The request boundary: a panic while a request is handled is caught here and becomes a
//! `500` with cause `internal` (rescue), one log line with the panic's message and place, and
//! a count, instead of a dropped connection and a trace on stderr per request.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll};

thread_local! {
    /// How many request boundaries are being polled on this thread right now.
    static INSIDE: Cell<u32> = const { Cell::new(0) };
    /// What the panic hook saw of the last panic inside a boundary (message and place).
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs (once per process) a panic hook that keeps panics inside a request boundary off
/// stderr, so each is logged once, by the boundary, with its cause; every other panic goes to
/// the hook that was there before.
pub fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if INSIDE.with(Cell::get) > 0 {
                let place = info
                    .location()
                    .map(|l| format!(" at {}:{}:{}", l.file(), l.line(), l.column()))
                    .unwrap_or_default();
                let text = format!("{}{place}", message(info.payload()));
                LAST.with(|l| *l.borrow_mut() = Some(text));
            } else {
                previous(info);
            }
        }));
    });
}

fn message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-text payload".to_owned()
    }
}

/// A future that panicked: its message, and where when the hook is installed.
#[derive(Debug)]
pub struct Panicked(pub String);

pin_project_lite::pin_project! {
    /// Runs a future; a panic in any of its polls ends it with [`Panicked`].
    pub struct CatchPanic<F> {
        #[pin]
        inner: F,
    }
}

impl<F> CatchPanic<F> {
    /// Wraps `inner`.
    pub fn new(inner: F) -> Self {
        Self { inner }
    }
}

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, Panicked>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.project().inner;
        INSIDE.with(|c| c.set(c.get() + 1));
        // Unwind safety: after a panic the inner future is never polled again (this returns
        // Ready), and the request state it held is dropped with it.
        let r = catch_unwind(AssertUnwindSafe(|| inner.poll(cx)));
        INSIDE.with(|c| c.set(c.get() - 1));
        match r {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => {
                let seen = LAST.with(|l| l.borrow_mut().take());
                Poll::Ready(Err(Panicked(seen.unwrap_or_else(|| message(&*payload)))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_inside_becomes_an_error_with_its_message_and_place() {
        install_panic_hook();
        let r = CatchPanic::new(async {
            tokio::task::yield_now().await;
            let v: Vec<u8> = Vec::new();
            v[usize::from(v.is_empty())]
        })
        .await;
        let Err(Panicked(msg)) = r else {
            panic!("no panic caught")
        };
        assert!(msg.contains("index out of bounds"), "{msg}");
        assert!(msg.contains("boundary.rs:"), "{msg}");
        assert_eq!(CatchPanic::new(async { 7 }).await.unwrap(), 7);
    }
}
