//! A peer (one address) and its passive health: consecutive failures eject it for a time that
//! doubles with repeated ejections; one success brings it back at once, and while it then
//! stays back the doubling winds down again (Envoy's outlier detection decrements its
//! ejection multiplier the same way), so a peer that blips now and then is never kept out
//! for a time its own history of blips built up.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
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
    /// Set when a failure is counted, cleared when a success resets the count: while it is
    /// clear, a success on a healthy peer has nothing to reset and takes no lock (every
    /// serving thread records one per request).
    failing: AtomicBool,
    health: Mutex<Health>,
    stats: PeerStats,
}

#[derive(Debug, Default)]
struct Health {
    consecutive_failures: u32,
    /// Ejections so far (shown in `/upstreams`).
    ejections: u32,
    /// The backoff step: the next ejection lasts `base_ejection` x 2^level (capped).
    level: u32,
    ejected_until: Option<Instant>,
    last_ejected_at: Option<Instant>,
    /// When a success (a request or an active check) last ended an ejection: the backoff
    /// winds down from then on.
    restored_at: Option<Instant>,
    active_down: bool,
    active_streak: u32,
}

/// One request in flight on a peer; the count goes down when this is dropped. It borrows the
/// peer: a reference count taken and given back per request would be two more writes to the
/// peer's shared memory.
#[derive(Debug)]
pub struct ActiveGuard<'a>(&'a Peer);

impl Drop for ActiveGuard<'_> {
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
    /// Ejections so far.
    pub ejections: u32,
    /// Requests in flight.
    pub active_requests: usize,
    /// Idle pooled connections.
    pub idle_connections: usize,
}

impl Health {
    /// A success ends the ejection (if any) now; the backoff winds down from here.
    fn end_ejection_by_success(&mut self) {
        self.consecutive_failures = 0;
        if self.ejected_until.take().is_some() {
            self.restored_at = Some(Instant::now());
        }
    }
}

/// How long an ejection at backoff step `level` lasts: `base_ejection` x 2^level, capped.
fn ejection_time(cfg: &HealthConfig, level: u32) -> Duration {
    let factor = 1u32.checked_shl(level.min(16)).unwrap_or(u32::MAX);
    cfg.base_ejection
        .saturating_mul(factor)
        .min(cfg.max_ejection)
}

/// Lowers the backoff step for the time the peer has been back since a success ended its
/// last ejection: each stretch back as long as the ejection one step down takes that step
/// off (after a 16 s ejection: 16 s back -> the next is 16 s, not 30; 8 s more -> 8 s; ...),
/// so a peer back for about twice its last ejection starts over at `base_ejection`. A peer whose last ejection is
/// older than 4 x `max_ejection` starts over too, whether or not traffic proved it back.
fn unwind_backoff(h: &mut Health, cfg: &HealthConfig, now: Instant) {
    if h.last_ejected_at
        .is_some_and(|t| now.duration_since(t) > cfg.max_ejection * 4)
    {
        h.level = 0;
    }
    // Only a success proves the peer was back; an ejection that merely ran out (a failed
    // trial next) keeps its step, so a peer that stays broken still backs off.
    let Some(back) = h.restored_at.take() else {
        return;
    };
    let mut healthy_for = now.saturating_duration_since(back);
    while h.level > 0 {
        let step = ejection_time(cfg, h.level - 1);
        if healthy_for < step {
            break;
        }
        healthy_for -= step;
        h.level -= 1;
    }
}

impl Peer {
    /// A healthy peer.
    pub fn new(addr: SocketAddr, tier: u8) -> Self {
        Self {
            addr,
            tier,
            active: AtomicUsize::new(0),
            unhealthy: AtomicBool::new(false),
            failing: AtomicBool::new(false),
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
    pub(crate) fn start_request(&self) -> ActiveGuard<'_> {
        self.active.fetch_add(1, Ordering::Relaxed);
        ActiveGuard(self)
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
            if !self.failing.load(Ordering::Relaxed) {
                return;
            }
            let mut h = self.health.lock().unwrap();
            h.consecutive_failures = 0;
            self.failing.store(false, Ordering::Relaxed);
            return;
        }
        let mut h = self.health.lock().unwrap();
        if h.last_ejected_at.is_some_and(|t| t > sent_at) {
            return;
        }
        h.consecutive_failures = 0;
        self.failing.store(false, Ordering::Relaxed);
        if h.ejected_until.take().is_some() {
            h.restored_at = Some(Instant::now());
        }
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
            // Under the lock, so a success that takes it next sees the flag.
            self.failing.store(true, Ordering::Relaxed);
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
        unwind_backoff(&mut h, cfg, now);
        let time = ejection_time(cfg, h.level);
        // The step stops growing at the cap, so winding down from it never takes longer
        // than from the first capped ejection.
        if time < cfg.max_ejection {
            h.level += 1;
        }
        h.ejections = h.ejections.saturating_add(1);
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
                    h.end_ejection_by_success();
                }
            }
        }
        if ok && !h.active_down {
            h.end_ejection_by_success();
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
    async fn a_success_resets_the_consecutive_failures_and_later_ones_count_again() {
        let p = Peer::new("127.0.0.1:1".parse().unwrap(), 0);
        let c = cfg();
        let now = Instant::now();
        for _ in 0..3 {
            p.record_success(now);
            assert!(matches!(
                p.record_failure(&c, 1, now, || true),
                FailureEffect::Counted
            ));
            assert!(matches!(
                p.record_failure(&c, 1, now, || true),
                FailureEffect::Counted
            ));
        }
        // Two failures after the last success, a third one ejects.
        assert!(matches!(
            p.record_failure(&c, 1, now, || true),
            FailureEffect::Ejected(_)
        ));
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

    /// Ejects `p` (three failures now) and returns the ejection time.
    fn eject(p: &Peer) -> Duration {
        let now = Instant::now();
        let effects: Vec<_> = (0..3)
            .map(|_| p.record_failure(&cfg(), 1, now, || true))
            .collect();
        effects
            .iter()
            .find_map(|e| match e {
                FailureEffect::Ejected(t) => Some(*t),
                _ => None,
            })
            .unwrap_or_else(|| panic!("expected an ejection, got {effects:?}"))
    }

    #[tokio::test(start_paused = true)]
    async fn repeated_blips_with_recovery_between_start_each_ejection_at_base() {
        // bench/soak.sh's RST blip: refused for 2 s every 50 s. The first ejection (2 s) runs
        // out while the blip lasts, so the trial fails and the second lasts 4 s; then a trial
        // succeeds and the peer serves for 44 s until the next blip.
        let p = Peer::new("127.0.0.1:1".parse().unwrap(), 0);
        for blip in 0..6 {
            let first = eject(&p);
            assert_eq!(
                first,
                Duration::from_secs(2),
                "blip {blip} started above base"
            );
            tokio::time::advance(first).await;
            assert_eq!(eject(&p), Duration::from_secs(4), "a failed trial doubles");
            tokio::time::advance(Duration::from_secs(4)).await;
            p.record_success(Instant::now());
            assert!(p.is_healthy(Instant::now()));
            tokio::time::advance(Duration::from_secs(44)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_backoff_winds_down_one_step_per_stretch_back() {
        let p = Peer::new("127.0.0.1:1".parse().unwrap(), 0);
        // Four ejections in a row, each ending with a failed trial: 2, 4, 8, 16 s.
        for want in [2, 4, 8, 16] {
            let t = eject(&p);
            assert_eq!(t, Duration::from_secs(want));
            tokio::time::advance(t).await;
        }
        // Back (a trial succeeded) for as long as the last ejection: one step off, the next
        // ejection is 16 s again, not 30.
        p.record_success(Instant::now());
        tokio::time::advance(Duration::from_secs(16)).await;
        assert_eq!(eject(&p), Duration::from_secs(16));
        tokio::time::advance(Duration::from_secs(16)).await;
        // Back for 16 + 8 s: two steps off (16 -> 8).
        p.record_success(Instant::now());
        tokio::time::advance(Duration::from_secs(24)).await;
        assert_eq!(eject(&p), Duration::from_secs(8));
        tokio::time::advance(Duration::from_secs(8)).await;
        // Back for 8 + 4 + 2 s: base again.
        p.record_success(Instant::now());
        tokio::time::advance(Duration::from_secs(14)).await;
        assert_eq!(eject(&p), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_ejection_that_only_ran_out_keeps_its_step() {
        let p = Peer::new("127.0.0.1:1".parse().unwrap(), 0);
        assert_eq!(eject(&p), Duration::from_secs(2));
        // No success proved it back: 20 s later (no traffic) it still backs off.
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(eject(&p), Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn an_active_check_success_starts_the_wind_down_too() {
        let p = Peer::new("127.0.0.1:1".parse().unwrap(), 0);
        for want in [2, 4, 8] {
            let t = eject(&p);
            assert_eq!(t, Duration::from_secs(want));
            tokio::time::advance(t).await;
        }
        assert_eq!(eject(&p), Duration::from_secs(16));
        assert!(!p.record_check(true, 1, 2));
        assert!(p.is_healthy(Instant::now()));
        // 16 + 8 + 4 + 2 s: a peer back for about twice its last ejection starts over at base.
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(eject(&p), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn the_step_stops_at_the_cap() {
        let p = Peer::new("127.0.0.1:1".parse().unwrap(), 0);
        for _ in 0..20 {
            let t = eject(&p);
            tokio::time::advance(t).await;
        }
        assert_eq!(eject(&p), Duration::from_secs(30));
        tokio::time::advance(Duration::from_secs(30)).await;
        // The step stayed at the cap: back for 20 s takes one step off (16 s), not 20 - 16.
        p.record_success(Instant::now());
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(eject(&p), Duration::from_secs(16));
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
        let p = Peer::new("127.0.0.1:1".parse().unwrap(), 0);
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
