//! How the sending of a request body is going, for the per-try timer: `try_timeout` counts
//! from the moment the upstream side holds the body (the last frame handed over), never while
//! upkeep waits for the client, which `client_body_timeout` bounds instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Shared between the request body (which stamps it) and the attempt (which reads it).
pub struct SendProgress {
    epoch: Instant,
    /// When a frame was last handed to the upstream side (or the attempt started), in ms.
    handed_ms: AtomicU64,
    /// When the current wait for the client began, in ms + 1; 0 when not waiting.
    client_wait_since: AtomicU64,
    /// Time spent waiting for the client in earlier waits, in ms.
    client_waited_ms: AtomicU64,
}

impl Default for SendProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl SendProgress {
    /// Starts with the upstream side holding the body.
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
            handed_ms: AtomicU64::new(0),
            client_wait_since: AtomicU64::new(0),
            client_waited_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// An attempt starts: the upstream side holds the body from now.
    pub fn restart(&self) {
        self.handed_over();
    }

    /// The body asked the client for more and is waiting.
    pub(crate) fn waiting_for_client(&self) {
        if self.client_wait_since.load(Ordering::Relaxed) == 0 {
            self.client_wait_since
                .store(self.now_ms() + 1, Ordering::Relaxed);
        }
    }

    /// A frame (or the end) went to the upstream side.
    pub(crate) fn handed_over(&self) {
        let now = self.now_ms();
        let since = self.client_wait_since.swap(0, Ordering::Relaxed);
        if since != 0 {
            self.client_waited_ms
                .fetch_add(now.saturating_sub(since - 1), Ordering::Relaxed);
        }
        self.handed_ms.store(now, Ordering::Relaxed);
    }

    /// When `try_timeout` runs out if nothing changes; `None` while the client is awaited.
    pub fn try_due(&self, try_timeout: Duration) -> Option<Instant> {
        if self.client_wait_since.load(Ordering::Relaxed) != 0 {
            return None;
        }
        let handed = Duration::from_millis(self.handed_ms.load(Ordering::Relaxed));
        Some(self.epoch + handed + try_timeout)
    }

    /// Total time spent waiting for the client so far (not counted against the deadline).
    pub fn client_waited(&self) -> Duration {
        let mut ms = self.client_waited_ms.load(Ordering::Relaxed);
        let since = self.client_wait_since.load(Ordering::Relaxed);
        if since != 0 {
            ms += self.now_ms().saturating_sub(since - 1);
        }
        Duration::from_millis(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_try_timer_stops_while_the_client_is_awaited() {
        let p = SendProgress::new();
        let t = Duration::from_secs(1);
        let start = Instant::now();
        assert_eq!(p.try_due(t), Some(start + t));
        p.waiting_for_client();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(p.try_due(t), None, "the client is awaited: no try timer");
        assert_eq!(p.client_waited(), Duration::from_secs(5));
        p.handed_over();
        assert_eq!(p.try_due(t), Some(start + Duration::from_secs(5) + t));
        assert_eq!(p.client_waited(), Duration::from_secs(5));
    }
}
