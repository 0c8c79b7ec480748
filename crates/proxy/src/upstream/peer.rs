//! A peer (one address) and its passive health: consecutive failures eject it for a time that
//! doubles with repeated ejections; one success brings it back at once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::config::HealthConfig;
use crate::metrics::PeerStats;

/// One upstream address. Peers are keyed by address: two names or lines that resolve to the
/// same address are one peer, so nothing is counted twice.
#[derive(Debug)]
pub struct Peer {
    addr: SocketAddr,
    tier: u8,
    active: AtomicUsize,
    /// Fast-path copy of "ejected or checked down"; the mutex holds the truth.
    unhealthy: AtomicBool,
    health: Mutex<Health>,
    stats: PeerStats,
}

#[derive(Debug, Default)]
struct Health {
    consecutive_failures: u32,
    ejections: u32,
    ejected_until: Option<Instant>,
    last_ejected_at: Option<Instant>,
    active_down: bool,
    active_streak: u32,
}

/// One request in flight on a peer; the count goes down when this is dropped.
#[derive(Debug)]
pub struct ActiveGuard(Arc<Peer>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a failure did to the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureEffect {
    /// Counted, below the threshold.
    Counted,
    /// The peer was ejected for this long.
    Ejected(Duration),
    /// The threshold was reached, but ejecting would break the panic threshold.
    KeptByPanicGuard,
}

/// A peer's health as shown in `/upstreams`.
#[derive(Clone, Debug, Serialize)]
pub struct PeerView {
    /// Address.
    pub addr: SocketAddr,
    /// Tier.
    pub tier: u8,
    /// healthy, ejected, or down (active check).
    pub state: &'static str,
    /// Milliseconds left of the current ejection.
    pub ejected_for_ms: Option<u64>,
    /// Consecutive failures.
    pub consecutive_failures: u32,
    /// Ejections so far (drives the backoff).
    pub ejections: u32,
    /// Requests in flight.
    pub active_requests: usize,
    /// Idle pooled connections.
    pub idle_connections: usize,
}

impl Peer {
    /// A healthy peer.
    pub fn new(addr: SocketAddr, tier: u8) -> Self {
        Self {
            addr,
            tier,
            active: AtomicUsize::new(0),
            unhealthy: AtomicBool::new(false),
            health: Mutex::default(),
            stats: PeerStats::default(),
        }
    }

    /// Its counters for `/metrics`.
    pub fn stats(&self) -> &PeerStats {
        &self.stats
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its tier.
    pub fn tier(&self) -> u8 {
        self.tier
    }

    /// Requests in flight.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Counts a request in flight on this peer until the guard is dropped, so a request
    /// whose client went away (its future dropped mid-wait) never leaves the count high.
    pub(crate) fn start_request(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::Relaxed);
        ActiveGuard(self.clone())
    }

    /// Usable for new requests now: not ejected (or the ejection ran out: a trial), not down.
    pub fn is_healthy(&self, now: Instant) -> bool {
        if !self.unhealthy.load(Ordering::Relaxed) {
            return true;
        }
        let h = self.health.lock().unwrap();
        !h.active_down && h.ejected_until.is_none_or(|t| now >= t)
    }

    /// A request sent at `sent_at` succeeded: failures reset, an ejection ends at once. A
    /// success of a request sent before the current ejection began says nothing about the
    /// peer since then, so it leaves that ejection alone.
    pub fn record_success(&self, sent_at: Instant) {
        if !self.unhealthy.load(Ordering::Relaxed) {
            let mut h = self.health.lock().unwrap();
            h.consecutive_failures = 0;
            return;
        }
        let mut h = self.health.lock().unwrap();
        if h.last_ejected_at.is_some_and(|t| t > sent_at) {
            return;
        }
        h.consecutive_failures = 0;
        h.ejected_until = None;
        self.unhealthy.store(h.active_down, Ordering::Relaxed);
    }

    /// A request failed because of this peer. `weight` is how many failures it counts for
    /// (a connect timeout counts as the whole threshold). `may_eject` is the group's panic guard.
    pub fn record_failure(
        &self,
        cfg: &HealthConfig,
        weight: u32,
        now: Instant,
        may_eject: impl FnOnce() -> bool,
    ) -> FailureEffect {
        self.stats.failure();
        {
            let mut h = self.health.lock().unwrap();
            h.consecutive_failures = h.consecutive_failures.saturating_add(weight);
            let currently_ejected = h.ejected_until.is_some_and(|t| now < t);
            if currently_ejected || h.consecutive_failures < cfg.consecutive_failures {
                return FailureEffect::Counted;
            }
        }
        // Asked without holding this peer's lock: the guard looks at every peer, this one too.
        if !may_eject() {
            return FailureEffect::KeptByPanicGuard;
        }
        let mut h = self.health.lock().unwrap();
        if h.ejected_until.is_some_and(|t| now < t) {
            return FailureEffect::Counted;
        }
        // A peer that stayed healthy for a long while starts its backoff over.
        if h.last_ejected_at
            .is_some_and(|t| now.duration_since(t) > cfg.max_ejection * 4)
        {
            h.ejections = 0;
        }
        let factor = 1u32.checked_shl(h.ejections.min(16)).unwrap_or(u32::MAX);
        let time = cfg
            .base_ejection
            .saturating_mul(factor)
            .min(cfg.max_ejection);
        h.ejections += 1;
        h.ejected_until = Some(now + time);
        h.last_ejected_at = Some(now);
        self.unhealthy.store(true, Ordering::Relaxed);
        FailureEffect::Ejected(time)
    }

    /// Applies one active check result with rise/fall thresholds; returns the new "down" state.
    pub fn record_check(&self, ok: bool, rise: u32, fall: u32) -> bool {
        let mut h = self.health.lock().unwrap();
        if ok != h.active_down {
            h.active_streak = 0;
        } else {
            h.active_streak += 1;
            let needed = if ok { rise } else { fall };
            if h.active_streak >= needed {
                h.active_down = !ok;
                h.active_streak = 0;
                if ok {
                    // Seen working: an ejection ends now, not when its timer does.
                    h.ejected_until = None;
                    h.consecutive_failures = 0;
                }
            }
        }
        if ok && !h.active_down {
            h.ejected_until = None;
            h.consecutive_failures = 0;
        }
        let unhealthy = h.active_down || h.ejected_until.is_some();
        self.unhealthy.store(unhealthy, Ordering::Relaxed);
        h.active_down
    }

    /// The `/upstreams` view.
    pub fn view(&self, now: Instant, idle_connections: usize) -> PeerView {
        let h = self.health.lock().unwrap();
        let ejected_for = h
            .ejected_until
            .filter(|t| now < *t)
            .map(|t| t.duration_since(now));
        let state = if h.active_down {
            "down"
        } else if ejected_for.is_some() {
            "ejected"
        } else {
            "healthy"
        };
        PeerView {
            addr: self.addr,
            tier: self.tier,
            state,
            ejected_for_ms: ejected_for.map(|d| d.as_millis() as u64),
            consecutive_failures: h.consecutive_failures,
            ejections: h.ejections,
            active_requests: self.active(),
            idle_connections,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> HealthConfig {
        HealthConfig {
            consecutive_failures: 3,
            base_ejection: Duration::from_secs(2),
            max_ejection: Duration::from_secs(30),
            min_healthy_percent: 50,
            active: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ejection_time_doubles_with_repeats_and_is_capped() {
        let p = Peer::new("127.0.0.1:1".parse().unwrap(), 0);
        let c = cfg();
        let mut times = Vec::new();
        for _ in 0..6 {
            let now = Instant::now();
            let effects: Vec<_> = (0..3)
                .map(|_| p.record_failure(&c, 1, now, || true))
                .collect();
            let t = effects
                .iter()
                .find_map(|e| {
                    if let FailureEffect::Ejected(t) = e {
                        Some(*t)
                    } else {
                        None
                    }
                })
                .unwrap_or_else(|| panic!("expected an ejection, got {effects:?}"));
            times.push(t.as_secs());
            assert!(!p.is_healthy(Instant::now()));
            tokio::time::advance(t).await;
            assert!(
                p.is_healthy(Instant::now()),
                "a trial is allowed once the ejection runs out"
            );
        }
        assert_eq!(times, vec![2, 4, 8, 16, 30, 30]);
    }

    #[tokio::test(start_paused = true)]
    async fn one_success_ends_an_ejection_before_its_timer() {
        let p = Peer::new("127.0.0.1:1".parse().unwrap(), 0);
        let now = Instant::now();
        p.record_failure(&cfg(), 3, now, || true);
        assert!(!p.is_healthy(now));
        p.record_success(Instant::now());
        assert!(p.is_healthy(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_of_a_request_sent_before_the_ejection_does_not_end_it() {
        let p = Peer::new("127.0.0.1:1".parse().unwrap(), 0);
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(10)).await;
        p.record_failure(&cfg(), 3, Instant::now(), || true);
        assert!(!p.is_healthy(Instant::now()));
        // The slow request answered after the ejection, but it left before it.
        p.record_success(sent);
        assert!(
            !p.is_healthy(Instant::now()),
            "a stale success ended the ejection"
        );
        // One sent after the ejection (a trial) does end it.
        p.record_success(Instant::now());
        assert!(p.is_healthy(Instant::now()));
    }

    #[test]
    fn the_in_flight_count_is_a_guard() {
        let p = Arc::new(Peer::new("127.0.0.1:1".parse().unwrap(), 0));
        let a = p.start_request();
        let b = p.start_request();
        assert_eq!(p.active(), 2);
        drop(a);
        // A dropped request future drops its guard too.
        let fut = async move {
            let _b = b;
            std::future::pending::<()>().await;
        };
        drop(fut);
        assert_eq!(p.active(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn panic_guard_refusal_keeps_the_peer_in_rotation() {
        let p = Peer::new("127.0.0.1:1".parse().unwrap(), 0);
        let now = Instant::now();
        assert_eq!(
            p.record_failure(&cfg(), 3, now, || false),
            FailureEffect::KeptByPanicGuard
        );
        assert!(p.is_healthy(now));
    }

    #[tokio::test(start_paused = true)]
    async fn active_check_success_brings_an_ejected_peer_back() {
        let p = Peer::new("127.0.0.1:1".parse().unwrap(), 0);
        let now = Instant::now();
        p.record_failure(&cfg(), 3, now, || true);
        assert!(!p.is_healthy(now));
        assert!(!p.record_check(true, 1, 2));
        assert!(p.is_healthy(now));
        assert!(!p.record_check(false, 1, 2));
        assert!(p.record_check(false, 1, 2), "down after `fall` failures");
        assert!(!p.is_healthy(now));
        assert!(!p.record_check(true, 1, 2), "up after `rise` successes");
        assert!(p.is_healthy(now));
    }
}
