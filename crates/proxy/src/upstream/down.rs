//! "This group is known to be down": every peer has failed to connect for longer than the
//! connect retry window. Requests then fail at once (`503 no_peers; reason=all_down`) instead
//! of each waiting out the window, while one probe per peer looks for the group's return; the
//! first connect that succeeds, by a probe or a request, ends it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::group::{jitter, Group, PeerSet};

/// While a group has been known down for less than this, each peer is probed every
/// 50-100 ms, so an outage of that length ends within about 100 ms of the backend's return;
/// after it the probes back off to one a second per peer.
pub const FAST_PROBE_PERIOD: Duration = Duration::from_secs(10);
/// The slowest probe pace per peer.
pub const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Connect-failure tracking of one group.
#[derive(Debug)]
pub struct DownState {
    epoch: Instant,
    /// Milliseconds after `epoch`, plus one, since which every peer has been failing to
    /// connect; 0 while some peer is not. Read on every request, so an atomic.
    all_since_ms: AtomicU64,
    /// The peer set `all_since_ms` was computed over (its address), so a set changed by
    /// discovery (a new peer has not failed yet) is never taken as down.
    set_ptr: AtomicUsize,
    /// Peers failing to connect, and since when; only touched on failures and on the first
    /// success after one.
    failing: Mutex<HashMap<SocketAddr, Instant>>,
    any_failing: AtomicBool,
    probing: AtomicBool,
}

impl Default for DownState {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            all_since_ms: AtomicU64::new(0),
            set_ptr: AtomicUsize::new(0),
            failing: Mutex::new(HashMap::new()),
            any_failing: AtomicBool::new(false),
            probing: AtomicBool::new(false),
        }
    }
}

impl DownState {
    /// A connect to `addr` failed (refused or timed out).
    pub fn connect_failed(&self, addr: SocketAddr, set: &Arc<PeerSet>, now: Instant) {
        let mut failing = self.failing.lock().unwrap();
        failing.entry(addr).or_insert(now);
        failing.retain(|a, _| set.contains(a));
        self.any_failing.store(true, Ordering::Release);
        let all = !set.is_empty() && set.all().all(|p| failing.contains_key(&p.addr()));
        if all && self.all_since_ms.load(Ordering::Acquire) == 0 {
            let since = failing.values().max().copied().unwrap_or(now);
            let ms = since.saturating_duration_since(self.epoch).as_millis() as u64 + 1;
            self.set_ptr
                .store(Arc::as_ptr(set) as usize, Ordering::Release);
            self.all_since_ms.store(ms, Ordering::Release);
        }
    }

    /// `addr` accepted a connection: it is not down, so neither is the group.
    pub fn connected(&self, addr: SocketAddr) -> bool {
        if !self.any_failing.load(Ordering::Acquire) {
            return false;
        }
        let mut failing = self.failing.lock().unwrap();
        let was = failing.remove(&addr).is_some();
        self.any_failing
            .store(!failing.is_empty(), Ordering::Release);
        let was_down = self.all_since_ms.swap(0, Ordering::AcqRel) != 0;
        was || was_down
    }

    /// Since when every peer of `set` has been failing, if they all are.
    fn all_failing_for(&self, set: &Arc<PeerSet>, now: Instant) -> Option<Duration> {
        let ms = self.all_since_ms.load(Ordering::Acquire);
        if ms == 0 || self.set_ptr.load(Ordering::Acquire) != Arc::as_ptr(set) as usize {
            return None;
        }
        let since = self.epoch + Duration::from_millis(ms - 1);
        Some(now.saturating_duration_since(since))
    }
}

impl Group {
    /// Whether the group is known down: every peer has failed to connect for longer than
    /// `connect_retry_window` (never with the window off). Starts the probes when it is.
    pub fn known_down(self: &Arc<Self>) -> bool {
        self.known_down_at(Instant::now())
    }

    /// [`known_down`](Self::known_down) with the clock already read (`now`).
    pub fn known_down_at(self: &Arc<Self>, now: Instant) -> bool {
        let window = self.config().retry.connect_retry_window;
        // Most requests find no peer failing: one load, not the peer set's (a shared count
        // taken and given back).
        if window.is_zero() || self.down.all_since_ms.load(Ordering::Acquire) == 0 {
            return false;
        }
        let set = self.peers();
        let Some(down_for) = self.down.all_failing_for(&set, now) else {
            return false;
        };
        if down_for <= window {
            return false;
        }
        if !self.down.probing.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                group = %self.name(),
                down_ms = down_for.as_millis() as u64,
                "every peer has failed to connect for longer than connect_retry_window: failing fast while probes look for a peer"
            );
            let task = tokio::spawn(probe_until_up(Arc::downgrade(self), down_for));
            self.tasks.lock().unwrap().push(task.abort_handle());
        }
        true
    }

    /// A connect to `peer` failed.
    pub fn record_connect_failure(&self, addr: SocketAddr) {
        let set = self.peers();
        self.down.connect_failed(addr, &set, Instant::now());
    }

    /// A connect to `addr` succeeded (a request or a probe).
    pub fn record_connected(&self, addr: SocketAddr) {
        if self.down.connected(addr) {
            self.connect_window_recovered();
        }
    }
}

/// One probe per peer per round until a connect succeeds: every 50-100 ms while the group
/// has been down for less than [`FAST_PROBE_PERIOD`], then backing off to
/// [`MAX_PROBE_INTERVAL`].
async fn probe_until_up(group: Weak<Group>, mut down_for: Duration) {
    struct Probing(Weak<Group>);
    impl Drop for Probing {
        fn drop(&mut self) {
            if let Some(g) = self.0.upgrade() {
                g.down.probing.store(false, Ordering::Release);
            }
        }
    }
    let _probing = Probing(group.clone());
    let mut slow = Duration::from_millis(100);
    loop {
        let started = Instant::now();
        let delay = if down_for < FAST_PROBE_PERIOD {
            jitter(Duration::from_millis(50), Duration::from_millis(100))
        } else {
            slow = (slow * 2).min(MAX_PROBE_INTERVAL);
            jitter(slow / 2, slow)
        };
        tokio::time::sleep(delay).await;
        let Some(g) = group.upgrade() else { return };
        let set = g.peers();
        if g.down.all_failing_for(&set, Instant::now()).is_none() {
            // Recovered by a request, or the peer set changed: normal service again.
            return;
        }
        let timeout = g.config().connect_timeout;
        let peers: Vec<_> = set.all().cloned().collect();
        drop(g);
        let probes = peers.into_iter().map(|p| async move {
            let sent = Instant::now();
            let ok = matches!(
                tokio::time::timeout(timeout, tokio::net::TcpStream::connect(p.addr())).await,
                Ok(Ok(_))
            );
            (p, sent, ok)
        });
        let results = futures_util::future::join_all(probes).await;
        let Some(g) = group.upgrade() else { return };
        let mut up = false;
        for (p, sent, ok) in results {
            if ok {
                tracing::info!(group = %g.name(), peer.addr = %p.addr(), "probe connected: the group is up again");
                p.record_success(sent);
                g.record_connected(p.addr());
                up = true;
            }
        }
        if up {
            return;
        }
        down_for += started.elapsed();
    }
}
