//! The request boundary: a panic while a request is handled is caught here and becomes a
//! `500` with cause `internal` (rescue), one log line with the panic's message and place, and
//! a count, instead of a dropped connection and a trace on stderr per request. Under
//! `upkeep serve` the same hook takes every other panic too (health checks, discovery, accept
//! loops, connection tasks): one log line through tracing with its message and place, and a
//! count in `upkeep_panics_total{task="background"}`, never a raw trace per occurrence.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Once};
use std::task::{Context, Poll};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

thread_local! {
    /// How many request boundaries are being polled on this thread right now.
    static INSIDE: Cell<u32> = const { Cell::new(0) };
    /// What the panic hook saw of the last panic inside a boundary (message and place).
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Which code panicked: `request` (caught at the boundary) or `background`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct PanicLabel {
    /// `request` or `background`.
    pub task: &'static str,
}

/// Panics seen by the hook: process-wide, like the hook itself.
static PANICS: LazyLock<Family<PanicLabel, Counter>> = LazyLock::new(Family::default);

/// Whether panics outside a request boundary go to the log (set by `upkeep serve`).
static LOG_OUTSIDE: AtomicBool = AtomicBool::new(false);

/// `upkeep_panics_total`, for the metrics registry.
pub fn panics() -> Family<PanicLabel, Counter> {
    PANICS.clone()
}

/// Installs (once per process) a panic hook that keeps panics inside a request boundary off
/// stderr, so each is logged once, by the boundary, with its cause. Every other panic goes to
/// the hook that was there before, unless [`log_panics_outside_requests`] was called.
pub fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let place = info
                .location()
                .map(|l| format!(" at {}:{}:{}", l.file(), l.line(), l.column()))
                .unwrap_or_default();
            let text = format!("{}{place}", message(info.payload()));
            let inside = INSIDE.with(Cell::get) > 0;
            PANICS
                .get_or_create(&PanicLabel {
                    task: if inside { "request" } else { "background" },
                })
                .inc();
            if inside {
                LAST.with(|l| *l.borrow_mut() = Some(text));
            } else if LOG_OUTSIDE.load(Ordering::Relaxed) && logging() {
                let thread = std::thread::current();
                tracing::error!(
                    panic = %text,
                    thread = thread.name().unwrap_or("-"),
                    "a task outside the request path panicked; it ended, the process serves on"
                );
            } else {
                previous(info);
            }
        }));
    });
}

/// Sends every panic outside a request boundary to the log (one line: message, place,
/// thread) instead of stderr's raw trace, for a server whose log is its record. Panics
/// before a subscriber is set still reach stderr, so none is lost.
pub fn log_panics_outside_requests() {
    install_panic_hook();
    LOG_OUTSIDE.store(true, Ordering::Relaxed);
}

/// Whether a tracing subscriber would take the line.
fn logging() -> bool {
    tracing::dispatcher::get_default(|d| !d.is::<tracing::subscriber::NoSubscriber>())
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

    /// A log destination for one test.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn background_count() -> u64 {
        PANICS
            .get_or_create(&PanicLabel { task: "background" })
            .get()
    }

    #[test]
    fn a_panic_outside_a_request_is_one_log_line_with_its_cause_and_a_count() {
        log_panics_outside_requests();
        let log = Captured::default();
        let before = background_count();
        let writer = log.clone();
        // A background task on its own thread, as discovery and checks run on the runtime.
        let joined = std::thread::Builder::new()
            .name("health-check".into())
            .spawn(move || {
                let subscriber = tracing_subscriber::fmt()
                    .with_ansi(false)
                    .with_writer(move || writer.clone())
                    .finish();
                tracing::subscriber::with_default(subscriber, || {
                    // A zero interval reaching a division: what a zero duration did before
                    // the config refused it.
                    let interval_secs = std::hint::black_box(0u64);
                    60 / interval_secs
                })
            })
            .unwrap()
            .join();
        assert!(joined.is_err(), "the task panicked");
        let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "one line per panic: {text}");
        assert!(lines[0].contains("ERROR"), "{text}");
        assert!(lines[0].contains("divide by zero"), "the cause: {text}");
        assert!(lines[0].contains("boundary.rs:"), "the place: {text}");
        assert!(lines[0].contains("health-check"), "the thread: {text}");
        assert!(background_count() > before, "counted");
        assert!(crate::metrics::Metrics::new()
            .encode()
            .contains("upkeep_panics_total{task=\"background\"}"));
    }
}
