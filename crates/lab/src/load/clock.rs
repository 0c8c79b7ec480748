//! A timer with the kernel's resolution for the open-loop schedule.
//!
//! tokio's timer wheel rounds deadlines to whole milliseconds, which at 5,000 req/s is five
//! requests' worth of lateness; a `timerfd` fires within the kernel's timer slack (about
//! 50 us) and wakes the same event loop that reads the responses, so no thread hand-off sits
//! between the due time and the request leaving.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Instant;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

struct Fd(TimerFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// A one-shot monotonic timer registered with the current tokio runtime.
pub(super) struct PreciseTimer {
    fd: AsyncFd<Fd>,
}

impl PreciseTimer {
    /// Needs a tokio runtime with IO enabled.
    pub(super) fn new() -> io::Result<PreciseTimer> {
        let timer = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        // `with_interest` is deprecated because a caller could close the descriptor while it
        // is registered (tokio#8587); here the `TimerFd` is owned by the `AsyncFd` and closed
        // only when it drops, after deregistration, which is the safe use.
        #[allow(deprecated)]
        let fd = AsyncFd::with_interest(Fd(timer), Interest::READABLE)?;
        Ok(PreciseTimer { fd })
    }

    /// Returns at `at`; if that has passed, after one turn of the event loop, so that a
    /// sender running behind still lets responses in (and their connections back into the
    /// pool) between requests instead of opening a new connection for each.
    pub(super) async fn sleep_until(&self, at: Instant) -> io::Result<()> {
        let now = Instant::now();
        if at <= now {
            tokio::task::yield_now().await;
            return Ok(());
        }
        // A zero expiration would disarm the timer; `at > now` keeps it positive.
        self.fd.get_ref().0.set(
            Expiration::OneShot(TimeSpec::from_duration(at - now)),
            TimerSetTimeFlags::empty(),
        )?;
        loop {
            let mut ready = self.fd.readable().await?;
            // Reading the expiration count clears the readiness; EAGAIN means a stale wake.
            if let Ok(done) = ready.try_io(|fd| fd.get_ref().0.wait().map_err(io::Error::from)) {
                return done;
            }
        }
    }
}

/// Lets the calling (sending) thread run as soon as its timer fires, ahead of the proxies and
/// backends it measures: real-time FIFO where allowed (root or CAP_SYS_NICE), else nice -10,
/// else as it is. On two cores shared with a target, a thread of ordinary priority can wait
/// tens of milliseconds for a CPU after its timer fired (docs/lab.md has the figures), and
/// that wait is the generator's, not the target's. The thread sleeps between requests and is
/// busy only while catching up, so it takes little CPU from the target; the kernel's
/// real-time throttling caps it anyway.
pub(super) fn raise_priority() -> &'static str {
    use thread_priority::{
        set_current_thread_priority, set_thread_priority_and_policy, thread_native_id,
        RealtimeThreadSchedulePolicy, ThreadPriority, ThreadPriorityValue, ThreadSchedulePolicy,
    };
    let value = |v: u8| ThreadPriorityValue::try_from(v).map(ThreadPriority::Crossplatform);
    let fifo = ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo);
    if let Ok(p) = value(10) {
        if set_thread_priority_and_policy(thread_native_id(), p, fifo).is_ok() {
            return "real-time";
        }
    }
    // 75 of 0..=99 maps to nice -10 under the normal policy.
    if let Ok(p) = value(75) {
        if set_current_thread_priority(p).is_ok() {
            return "nice -10";
        }
    }
    "unchanged"
}
