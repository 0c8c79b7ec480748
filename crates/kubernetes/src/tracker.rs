//! The last-known-good policy for one Service port: what the list/watch loop learns is turned
//! into the peers a group uses, published on a `watch` channel. An API server that fails never
//! changes them; a set that becomes empty while the Service exists empties them only after
//! `stale_grace`, as NXDOMAIN does for a name.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;
use upkeep_discovery::{Policy, StaleGrace};

use crate::slices::{split, Endpoint, PortSel, ServiceRef};

/// Tells whether last-known-good peers still pass health ([`StaleGrace::WhileHealthy`]).
pub trait StaleCheck: Send + Sync + 'static {
    /// Whether any of `addrs` is healthy now.
    fn still_healthy(&self, addrs: &[SocketAddr]) -> bool;
}

/// Counts what the loop sees (metrics).
pub trait Observer: Send + Sync + 'static {
    /// A successful list, watch event or bookmark: `list`, `added`, `modified`, `deleted`,
    /// `bookmark`, `gone` (410, a re-list follows).
    fn on_event(&self, event: &'static str);
    /// A failed request or broken watch: `unreachable`, `timeout`, `server_error`,
    /// `client_error`, `watch_cut`, `tls` (certificate not trusted, handshake failed),
    /// `config`.
    fn on_error(&self, error: &'static str);
    /// The peers changed (one log line is written by the tracker).
    fn on_change(&self, state: &ServiceState);
}

/// An observer that counts nothing.
pub struct NoObserver;

impl Observer for NoObserver {
    fn on_event(&self, _: &'static str) {}
    fn on_error(&self, _: &'static str) {}
    fn on_change(&self, _: &ServiceState) {}
}

/// What discovery knows about one Service port.
#[derive(Clone, Debug)]
pub struct ServiceState {
    /// The Service.
    pub service: ServiceRef,
    /// The port.
    pub port: PortSel,
    /// Addresses that get new requests.
    pub peers: Arc<[SocketAddr]>,
    /// Serving, terminating addresses that get no new requests.
    pub draining: Vec<SocketAddr>,
    /// Zone of each address, where the slices give one.
    pub zones: BTreeMap<SocketAddr, String>,
    /// A list has succeeded at least once.
    pub synced_ever: bool,
    /// The resourceVersion of the last list, event or bookmark.
    pub resource_version: Option<String>,
    /// When the last list, event or bookmark arrived.
    pub last_sync: Option<SystemTime>,
    /// When the last request ended, successful or not.
    pub last_at: Option<SystemTime>,
    /// `synced`, or the error class of the last failure.
    pub last_outcome: &'static str,
    /// The last failure's message, until the next success.
    pub last_error: Option<String>,
    /// Since when the slices have no usable endpoint while peers are kept.
    pub stale_since: Option<SystemTime>,
    /// Why the peers were last dropped.
    pub dropped_reason: Option<&'static str>,
}

impl ServiceState {
    /// The state before anything is known.
    pub fn new(service: ServiceRef, port: PortSel) -> Self {
        Self {
            service,
            port,
            peers: Arc::from(Vec::new()),
            draining: Vec::new(),
            zones: BTreeMap::new(),
            synced_ever: false,
            resource_version: None,
            last_sync: None,
            last_at: None,
            last_outcome: "pending",
            last_error: None,
            stale_since: None,
            dropped_reason: None,
        }
    }
}

/// Applies the policy and publishes each new state.
pub(crate) struct Tracker {
    pub(crate) state: ServiceState,
    tx: watch::Sender<ServiceState>,
    pub(crate) policy: Policy,
    stale: Arc<dyn StaleCheck>,
    pub(crate) observer: Arc<dyn Observer>,
    /// Monotonic twin of `state.stale_since`, and when to check health next.
    empty_since: Option<Instant>,
    next_health_check: Option<Instant>,
}

impl Tracker {
    pub(crate) fn new(
        state: ServiceState,
        policy: Policy,
        stale: Arc<dyn StaleCheck>,
        observer: Arc<dyn Observer>,
    ) -> (Self, watch::Receiver<ServiceState>) {
        let (tx, rx) = watch::channel(state.clone());
        let empty_since = state.stale_since.map(|_| Instant::now());
        (
            Self {
                state,
                tx,
                policy,
                stale,
                observer,
                empty_since,
                next_health_check: None,
            },
            rx,
        )
    }

    /// When the grace needs looking at again, if peers are kept on an empty set.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let since = self.empty_since?;
        Some(match self.policy.stale_grace {
            StaleGrace::For(g) => since + g,
            StaleGrace::WhileHealthy => self
                .next_health_check
                .unwrap_or(since + self.policy.min_refresh),
        })
    }

    /// The grace deadline passed: drop the kept peers if their time is up.
    pub(crate) fn tick(&mut self) {
        let Some(since) = self.empty_since else {
            return;
        };
        let now = Instant::now();
        let expired = match self.policy.stale_grace {
            StaleGrace::For(g) => now >= since + g,
            StaleGrace::WhileHealthy => {
                self.next_health_check = Some(now + self.policy.min_refresh);
                !self.stale.still_healthy(&self.state.peers)
            }
        };
        if expired {
            let reason = match self.policy.stale_grace {
                StaleGrace::For(_) => "empty_grace_expired",
                StaleGrace::WhileHealthy => "empty_peers_unhealthy",
            };
            self.drop_peers(reason);
        }
    }

    fn drop_peers(&mut self, reason: &'static str) {
        let old = self.state.peers.clone();
        self.state.peers = Arc::from(Vec::new());
        self.state.stale_since = None;
        self.state.dropped_reason = Some(reason);
        self.empty_since = None;
        self.next_health_check = None;
        self.publish(&old, Some(reason));
    }

    /// A complete, current endpoint set (after a list or a watch event).
    pub(crate) fn synced(&mut self, eps: &[Endpoint], rv: Option<String>, service_gone: bool) {
        let old = self.state.peers.clone();
        let sp = split(eps);
        self.state.zones = eps
            .iter()
            .filter_map(|e| e.zone.clone().map(|z| (e.addr, z)))
            .collect();
        self.state.draining = sp.draining;
        self.note_sync(rv);
        self.state.synced_ever = true;
        let mut dropped = None;
        if !sp.peers.is_empty() {
            self.state.peers = Arc::from(sp.peers);
            self.state.stale_since = None;
            self.state.dropped_reason = None;
            self.empty_since = None;
            self.next_health_check = None;
        } else if service_gone {
            // Deleted on purpose: nothing to wait for.
            self.state.peers = Arc::from(Vec::new());
            self.state.stale_since = None;
            self.empty_since = None;
            self.state.dropped_reason = Some("service_deleted");
            dropped = Some("service_deleted");
        } else if !old.is_empty() && self.empty_since.is_none() {
            self.empty_since = Some(Instant::now());
            self.state.stale_since = Some(SystemTime::now());
            self.next_health_check = None;
            tracing::warn!(
                kubernetes.service = %self.state.service,
                kept = ?old,
                "EndpointSlices have no usable endpoint: keeping the last known peers for stale_grace"
            );
            if let StaleGrace::For(g) = self.policy.stale_grace {
                if g.is_zero() {
                    self.drop_peers("empty_grace_expired");
                    return;
                }
            }
        }
        self.publish(&old, dropped);
    }

    /// A bookmark: the watch is alive and at `rv`.
    pub(crate) fn progress(&mut self, rv: String) {
        let old = self.state.peers.clone();
        self.note_sync(Some(rv));
        self.publish(&old, None);
    }

    fn note_sync(&mut self, rv: Option<String>) {
        if let Some(rv) = rv.filter(|r| !r.is_empty()) {
            self.state.resource_version = Some(rv);
        }
        let now = SystemTime::now();
        self.state.last_sync = Some(now);
        self.state.last_at = Some(now);
        self.state.last_outcome = "synced";
        self.state.last_error = None;
    }

    /// A failed request: peers stay as they are.
    pub(crate) fn failed(&mut self, class: &'static str, message: String) {
        self.observer.on_error(class);
        tracing::warn!(
            kubernetes.service = %self.state.service,
            kubernetes.error = class,
            error = %message,
            peers = self.state.peers.len(),
            "Kubernetes API request failed; peers unchanged"
        );
        let old = self.state.peers.clone();
        self.state.last_at = Some(SystemTime::now());
        self.state.last_outcome = class;
        self.state.last_error = Some(message);
        self.publish(&old, None);
    }

    fn publish(&mut self, old: &[SocketAddr], dropped: Option<&'static str>) {
        if *old != *self.state.peers {
            tracing::info!(
                kubernetes.service = %self.state.service,
                kubernetes.resource_version = self.state.resource_version.as_deref().unwrap_or("-"),
                old = ?old,
                new = ?self.state.peers,
                draining = ?self.state.draining,
                dropped = dropped.unwrap_or("-"),
                "peer set changed"
            );
            self.observer.on_change(&self.state);
        }
        self.tx.send_replace(self.state.clone());
    }

    /// The delay after the failure that follows `prev` (None: the first), with jitter.
    pub(crate) fn backoff(&self, prev: Option<Duration>) -> Duration {
        self.policy.next_backoff(prev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Healthy(bool);
    impl StaleCheck for Healthy {
        fn still_healthy(&self, _: &[SocketAddr]) -> bool {
            self.0
        }
    }

    fn ep(a: &str) -> Endpoint {
        Endpoint {
            addr: a.parse().unwrap(),
            ready: true,
            serving: true,
            terminating: false,
            zone: None,
        }
    }

    fn tracker(grace: StaleGrace, healthy: bool) -> (Tracker, watch::Receiver<ServiceState>) {
        let policy = Policy {
            stale_grace: grace,
            ..Policy::default()
        };
        let svc = ServiceRef {
            namespace: "ns".into(),
            name: "app".into(),
        };
        Tracker::new(
            ServiceState::new(svc, PortSel::Only),
            policy,
            Arc::new(Healthy(healthy)),
            Arc::new(NoObserver),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn api_failures_never_change_the_peers() {
        let (mut t, rx) = tracker(StaleGrace::For(Duration::from_secs(5)), true);
        t.synced(&[ep("10.0.0.1:80")], Some("7".into()), false);
        for class in ["unreachable", "timeout", "server_error", "watch_cut"] {
            t.failed(class, "x".into());
            assert_eq!(&*rx.borrow().peers, &["10.0.0.1:80".parse().unwrap()]);
            assert_eq!(rx.borrow().last_outcome, class);
        }
        assert_eq!(rx.borrow().resource_version.as_deref(), Some("7"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_empty_set_empties_the_peers_only_after_stale_grace() {
        let (mut t, rx) = tracker(StaleGrace::For(Duration::from_secs(5)), true);
        t.synced(&[ep("10.0.0.1:80")], None, false);
        t.synced(&[], None, false);
        assert_eq!(rx.borrow().peers.len(), 1, "kept during the grace");
        assert!(rx.borrow().stale_since.is_some());
        let d = t.deadline().unwrap();
        tokio::time::advance(Duration::from_secs(4)).await;
        t.tick();
        assert_eq!(rx.borrow().peers.len(), 1);
        tokio::time::sleep_until(d).await;
        t.tick();
        assert!(rx.borrow().peers.is_empty());
        assert_eq!(rx.borrow().dropped_reason, Some("empty_grace_expired"));
    }

    #[tokio::test(start_paused = true)]
    async fn endpoints_back_within_the_grace_end_it() {
        let (mut t, rx) = tracker(StaleGrace::For(Duration::from_secs(5)), true);
        t.synced(&[ep("10.0.0.1:80")], None, false);
        t.synced(&[], None, false);
        t.synced(&[ep("10.0.0.2:80")], None, false);
        assert!(t.deadline().is_none());
        assert_eq!(&*rx.borrow().peers, &["10.0.0.2:80".parse().unwrap()]);
    }

    #[tokio::test(start_paused = true)]
    async fn while_healthy_keeps_peers_until_they_fail_health() {
        let (mut t, rx) = tracker(StaleGrace::WhileHealthy, true);
        t.synced(&[ep("10.0.0.1:80")], None, false);
        t.synced(&[], None, false);
        tokio::time::advance(Duration::from_secs(60)).await;
        t.tick();
        assert_eq!(rx.borrow().peers.len(), 1);
        t.stale = Arc::new(Healthy(false));
        t.tick();
        assert!(rx.borrow().peers.is_empty());
        assert_eq!(rx.borrow().dropped_reason, Some("empty_peers_unhealthy"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleted_service_empties_the_peers_at_once() {
        let (mut t, rx) = tracker(StaleGrace::For(Duration::from_secs(5)), true);
        t.synced(&[ep("10.0.0.1:80")], None, false);
        t.synced(&[], None, true);
        assert!(rx.borrow().peers.is_empty());
        assert_eq!(rx.borrow().dropped_reason, Some("service_deleted"));
    }
}
