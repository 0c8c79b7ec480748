//! What the pool knows about one peer across every serving thread: its open and idle
//! HTTP/1 connections and the recent peak of busy ones, which sizes its idle lists.
//!
//! Idle lists stay per serving thread (a connection is reused by the thread whose runtime
//! drives it), but their limits are per peer: `max_idle_per_peer` counts every thread's
//! idle connections together, and below it a peer keeps only as many idle connections as
//! it recently had busy at once (the peak over `idle_peak_window`). A burst is absorbed
//! without churn (at 256 concurrent requests, 256 connections stay open instead of being
//! closed above a fixed idle limit and opened again), and the connections it left behind are
//! closed once the peak has decayed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// The peak window is kept as this many slots, each the busy maximum of its share of the
/// window; the oldest is dropped as time moves on.
const SLOTS: usize = 8;

/// One peer's connection counts, shared by every serving thread.
#[derive(Debug)]
pub(super) struct PeerLoad {
    /// HTTP/1 connections open (busy and idle) and HTTP/2 connections, for
    /// `max_connections_per_peer`.
    open: AtomicUsize,
    /// Idle HTTP/1 connections, every thread's lists together.
    idle: AtomicUsize,
    /// Busy maxima, one slot per `SLOTS`th of the window; `at` is the current one.
    peaks: [AtomicUsize; SLOTS],
    at: AtomicUsize,
}

impl PeerLoad {
    fn new() -> Self {
        Self {
            open: AtomicUsize::new(0),
            idle: AtomicUsize::new(0),
            peaks: std::array::from_fn(|_| AtomicUsize::new(0)),
            at: AtomicUsize::new(0),
        }
    }

    /// Idle connections of this peer, every thread's together.
    pub(super) fn idle(&self) -> usize {
        self.idle.load(Ordering::Relaxed)
    }

    /// Open connections of this peer.
    pub(super) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    fn busy(&self) -> usize {
        self.open().saturating_sub(self.idle())
    }

    /// Notes the number of busy connections now (after a checkout or a connect).
    pub(super) fn note_busy(&self) {
        let busy = self.busy();
        let slot = &self.peaks[self.at.load(Ordering::Relaxed) % SLOTS];
        // A plain load first: the common case changes nothing and keeps the line shared.
        if busy > slot.load(Ordering::Relaxed) {
            slot.fetch_max(busy, Ordering::Relaxed);
        }
    }

    /// The most connections busy at once over the window.
    pub(super) fn peak(&self) -> usize {
        self.peaks
            .iter()
            .map(|p| p.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
            .max(self.busy())
    }

    /// Idle connections this peer may keep now: its recent peak, at most `cap`.
    pub(super) fn idle_limit(&self, cap: usize) -> usize {
        self.peak().min(cap)
    }

    /// Takes an idle place if one is left under `limit`; the caller must `idle_left` later.
    pub(super) fn try_idle(&self, limit: usize) -> bool {
        self.idle
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// An idle connection was taken or closed.
    pub(super) fn idle_left(&self) {
        self.idle.fetch_sub(1, Ordering::Relaxed);
    }

    /// Moves the window on by `n` slots: the oldest ones are forgotten, each new one starts
    /// from the connections busy now.
    fn advance(&self, n: usize) {
        let busy = self.busy();
        for _ in 0..n.min(SLOTS) {
            let next = (self.at.load(Ordering::Relaxed) + 1) % SLOTS;
            self.peaks[next].store(busy, Ordering::Relaxed);
            self.at.store(next, Ordering::Relaxed);
        }
    }
}

/// One open connection counted against its peer until dropped.
#[derive(Debug)]
pub(super) struct OpenGuard(Arc<PeerLoad>);

impl OpenGuard {
    /// The peer's counts.
    pub(super) fn load(&self) -> &Arc<PeerLoad> {
        &self.0
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The counts of every peer the pool has connections to.
#[derive(Debug)]
pub(super) struct Loads {
    peers: Mutex<HashMap<SocketAddr, Arc<PeerLoad>>>,
    /// Length of one slot of the peak window.
    slot: Duration,
    moved: Mutex<Instant>,
}

impl Loads {
    /// Counts whose peak covers `window`.
    pub(super) fn new(window: Duration) -> Self {
        Self {
            peers: Mutex::default(),
            slot: (window / SLOTS as u32).max(Duration::from_millis(1)),
            moved: Mutex::new(Instant::now()),
        }
    }

    /// How often the window must move on for its slots to stay current.
    pub(super) fn slot(&self) -> Duration {
        self.slot
    }

    /// `peer`'s counts.
    pub(super) fn get(&self, peer: SocketAddr) -> Arc<PeerLoad> {
        self.peers
            .lock()
            .unwrap()
            .entry(peer)
            .or_insert_with(|| Arc::new(PeerLoad::new()))
            .clone()
    }

    /// Counts a new connection to `peer`, refused when `max` are already open.
    pub(super) fn open(&self, peer: SocketAddr, max: Option<usize>) -> Result<OpenGuard, usize> {
        let load = self.get(peer);
        let max_open = max.unwrap_or(usize::MAX);
        load.open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max_open).then_some(n + 1)
            })
            .map_err(|_| max_open)?;
        load.note_busy();
        Ok(OpenGuard(load))
    }

    /// Open connections to `peer`.
    pub(super) fn open_count(&self, peer: SocketAddr) -> usize {
        self.peers
            .lock()
            .unwrap()
            .get(&peer)
            .map_or(0, |l| l.open())
    }

    /// Idle connections to `peer`.
    pub(super) fn idle_count(&self, peer: SocketAddr) -> usize {
        self.peers
            .lock()
            .unwrap()
            .get(&peer)
            .map_or(0, |l| l.idle())
    }

    /// Moves every peak window on to now, forgets peers nothing refers to any more, and
    /// returns how many idle connections each remaining peer has over its limit.
    pub(super) fn tick(&self, cap: usize) -> Vec<(SocketAddr, usize)> {
        let n = {
            let mut moved = self.moved.lock().unwrap();
            let elapsed = moved.elapsed();
            let n = (elapsed.as_nanos() / self.slot.as_nanos()) as usize;
            *moved += self.slot * n as u32;
            n
        };
        let mut peers = self.peers.lock().unwrap();
        // Only the map holds it: no connection, idle list or guard counts on it.
        peers.retain(|_, l| Arc::strong_count(l) > 1 || l.open() > 0);
        let mut over = Vec::new();
        for (addr, load) in peers.iter() {
            if n > 0 {
                load.advance(n);
            }
            let excess = load.idle().saturating_sub(load.idle_limit(cap));
            if excess > 0 {
                over.push((*addr, excess));
            }
        }
        over
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_covers_the_window_and_then_decays() {
        let load = PeerLoad::new();
        load.open.store(10, Ordering::Relaxed);
        load.note_busy();
        load.open.store(1, Ordering::Relaxed);
        assert_eq!(load.peak(), 10);
        load.advance(SLOTS - 1);
        assert_eq!(load.peak(), 10, "still inside the window");
        load.advance(1);
        assert_eq!(load.peak(), 1, "the burst left the window");
        assert_eq!(load.idle_limit(64), 1);
    }

    #[test]
    fn idle_places_stop_at_the_limit() {
        let load = PeerLoad::new();
        assert!(load.try_idle(2));
        assert!(load.try_idle(2));
        assert!(!load.try_idle(2));
        load.idle_left();
        assert!(load.try_idle(2));
        assert_eq!(load.idle(), 2);
    }
}
