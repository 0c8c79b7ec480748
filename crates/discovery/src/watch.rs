//! The re-resolve loop of one name: asks on the TTL, keeps last-known-good addresses
//! through failures and negative answers, and publishes each new state whole.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::outcome::Outcome;
use crate::policy::{jitter, Policy, StaleGrace};
use crate::resolver::{ip_literal, Lookup, Resolver};

/// Told by the proxy whether last-known-good addresses still pass health (for
/// [`StaleGrace::WhileHealthy`]).
pub trait StaleCheck: Send + Sync + 'static {
    /// True while the given (stale) addresses still pass health checks. Called from the
    /// re-resolve loop on every negative answer, so it must answer from memory, not do I/O.
    fn still_healthy(&self, addrs: &[IpAddr]) -> bool;
}

/// Receives every lookup result (for metrics and the /upstreams view).
pub trait Observer: Send + Sync + 'static {
    /// Called after every lookup with the addresses before and after it.
    fn on_lookup(&self, name: &str, outcome: &Outcome, old: &[IpAddr], new: &[IpAddr]);
}

/// A [`StaleCheck`] that always answers the same (e.g. `true` when there are no health checks).
#[derive(Clone, Copy, Debug)]
pub struct AssumeHealthy(pub bool);

impl StaleCheck for AssumeHealthy {
    fn still_healthy(&self, _addrs: &[IpAddr]) -> bool {
        self.0
    }
}

/// An [`Observer`] that does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoObserver;

impl Observer for NoObserver {
    fn on_lookup(&self, _: &str, _: &Outcome, _: &[IpAddr], _: &[IpAddr]) {}
}

/// What is known about one name right now.
#[derive(Clone, Debug)]
pub struct NameState {
    /// The name as configured.
    pub name: String,
    /// The addresses to use: sorted, no duplicates; empty when never resolved or dropped.
    pub addrs: Arc<[IpAddr]>,
    /// Whether any lookup ever gave addresses.
    pub resolved_ever: bool,
    /// The last lookup's outcome (`Error("not resolved yet")` before the first one ends).
    pub last_outcome: Outcome,
    /// When the last lookup ended.
    pub last_at: Option<SystemTime>,
    /// Since when the addresses are kept against a negative answer (NXDOMAIN/NODATA).
    pub stale_since: Option<SystemTime>,
    /// Why the addresses were dropped, e.g. `"nxdomain_grace_expired"`.
    pub dropped_reason: Option<&'static str>,
}

impl NameState {
    /// A name no lookup has answered yet.
    pub fn new(name: String) -> Self {
        NameState {
            name,
            addrs: Arc::from(Vec::new()),
            resolved_ever: false,
            last_outcome: Outcome::Error("not resolved yet".to_owned()),
            last_at: None,
            stale_since: None,
            dropped_reason: None,
        }
    }
}

/// Spawns the re-resolve loop for one name; the receiver always holds the current state.
///
/// The receiver is notified after every lookup; `addrs` is the same `Arc` until the
/// address set changes, so `Arc::ptr_eq` tells a change of addresses from a new lookup.
pub fn watch_name(
    resolver: Arc<Resolver>,
    name: String,
    policy: Policy,
    stale: Arc<dyn StaleCheck>,
    observer: Arc<dyn Observer>,
) -> (watch::Receiver<NameState>, JoinHandle<()>) {
    watch_name_with(resolver, name, policy, stale, observer)
}

/// [`watch_name`] over any [`Lookup`] source. The loop ends when every receiver is gone.
pub fn watch_name_with(
    source: Arc<dyn Lookup>,
    name: String,
    policy: Policy,
    stale: Arc<dyn StaleCheck>,
    observer: Arc<dyn Observer>,
) -> (watch::Receiver<NameState>, JoinHandle<()>) {
    watch_name_from(source, NameState::new(name), policy, stale, observer)
}

/// [`watch_name_with`] starting from a known state instead of "never resolved": the
/// addresses, negative-answer grace and history of a loop this one replaces (a config
/// reload). The carried-over addresses are last-known-good: failures keep them, a negative answer
/// keeps them for the grace left, only records replace them.
pub fn watch_name_from(
    source: Arc<dyn Lookup>,
    carried: NameState,
    policy: Policy,
    stale: Arc<dyn StaleCheck>,
    observer: Arc<dyn Observer>,
) -> (watch::Receiver<NameState>, JoinHandle<()>) {
    let name = carried.name.clone();
    let mut initial = carried;
    if let Some(ip) = ip_literal(&name) {
        // A literal needs no DNS and never changes.
        initial.addrs = Arc::from(vec![ip]);
        initial.resolved_ever = true;
        initial.last_outcome = Outcome::Records {
            addrs: vec![ip],
            ttl: Duration::MAX,
        };
        initial.last_at = Some(SystemTime::now());
        log_change(&name, &initial.last_outcome, &[], &initial.addrs, None);
        let (tx, rx) = watch::channel(initial);
        // Holding the sender keeps `changed()` pending instead of failing, as for a name.
        let task = tokio::spawn(async move { tx.closed().await });
        return (rx, task);
    }
    // A carried-over state already inside a negative-answer grace keeps the time it has used up.
    let negative_since = initial.stale_since.map(|t| {
        let used = SystemTime::now().duration_since(t).unwrap_or_default();
        Instant::now()
            .checked_sub(used)
            .unwrap_or_else(Instant::now)
    });
    let (tx, rx) = watch::channel(initial.clone());
    let mut looper = Looper {
        source,
        policy,
        stale,
        observer,
        state: initial,
        backoff: None,
        negative_since,
    };
    let task = tokio::spawn(async move {
        loop {
            let delay = looper.step().await;
            tx.send_replace(looper.state.clone());
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = tx.closed() => break,
            }
        }
    });
    (rx, task)
}

struct Looper {
    source: Arc<dyn Lookup>,
    policy: Policy,
    stale: Arc<dyn StaleCheck>,
    observer: Arc<dyn Observer>,
    state: NameState,
    /// Current error backoff; None after any answer.
    backoff: Option<Duration>,
    /// When the current run of negative answers began, while addresses are kept.
    negative_since: Option<Instant>,
}

impl Looper {
    /// Takes an answer's addresses (sorted, without repeats; swapped only when they differ
    /// from `old`) and marks the name resolved and fresh.
    fn take_answer(&mut self, mut new: Vec<IpAddr>, old: &[IpAddr]) {
        new.sort_unstable();
        new.dedup();
        if *new != *old {
            self.state.addrs = Arc::from(new);
        }
        self.state.resolved_ever = true;
        self.state.stale_since = None;
        self.state.dropped_reason = None;
    }

    /// Does one lookup, updates the state, and says how long to wait for the next.
    async fn step(&mut self) -> Duration {
        let outcome = self.source.lookup(&self.state.name).await;
        let now = Instant::now();
        let old = self.state.addrs.clone();
        let mut dropped = None;
        let delay = match &outcome {
            Outcome::Records { addrs, ttl } => {
                self.backoff = None;
                self.negative_since = None;
                self.take_answer(addrs.clone(), &old);
                self.policy.refresh_after(*ttl)
            }
            Outcome::Partial {
                addrs,
                ttl,
                unknown,
            } => {
                // The family that failed is unknown, not empty: its addresses stay. The next
                // lookup comes at the TTL or the first error backoff, whichever is sooner,
                // to learn that family again.
                self.negative_since = None;
                let mut new = addrs.clone();
                new.extend(old.iter().filter(|ip| unknown.has(ip)));
                self.take_answer(new, &old);
                self.policy
                    .refresh_after(*ttl)
                    .min(jitter(self.policy.next_backoff(None)))
            }
            Outcome::NxDomain | Outcome::NoData => {
                self.backoff = None;
                let mut delay = self.policy.min_refresh;
                if !old.is_empty() {
                    let since = *self.negative_since.get_or_insert(now);
                    if self.state.stale_since.is_none() {
                        self.state.stale_since = Some(SystemTime::now());
                    }
                    let expired = match self.policy.stale_grace {
                        StaleGrace::For(grace) => {
                            let left = grace.saturating_sub(now - since);
                            // Wake when the grace ends rather than up to min_refresh later.
                            delay = delay.min(left.max(Duration::from_millis(1)));
                            left.is_zero()
                        }
                        StaleGrace::WhileHealthy => !self.stale.still_healthy(&old),
                    };
                    if expired {
                        let reason = drop_reason(&outcome, self.policy.stale_grace);
                        self.state.addrs = Arc::from(Vec::new());
                        self.state.stale_since = None;
                        self.state.dropped_reason = Some(reason);
                        self.negative_since = None;
                        dropped = Some(reason);
                    }
                }
                delay
            }
            _ => {
                // Failures tell nothing about the name: keep everything, retry sooner than
                // the TTL but back off so a sick server is not hammered.
                let next = self.policy.next_backoff(self.backoff);
                self.backoff = Some(next);
                jitter(next)
            }
        };
        self.state.last_outcome = outcome;
        self.state.last_at = Some(SystemTime::now());
        let new = self.state.addrs.clone();
        self.observer
            .on_lookup(&self.state.name, &self.state.last_outcome, &old, &new);
        if *old != *new {
            log_change(
                &self.state.name,
                &self.state.last_outcome,
                &old,
                &new,
                dropped,
            );
        } else {
            tracing::debug!(
                dns.name = %self.state.name,
                dns.outcome = self.state.last_outcome.label(),
                dns.rcode = self.state.last_outcome.rcode().unwrap_or("-"),
                next_in_ms = delay.as_millis() as u64,
                "dns lookup, addresses unchanged"
            );
        }
        delay
    }
}

fn drop_reason(outcome: &Outcome, grace: StaleGrace) -> &'static str {
    match (outcome, grace) {
        (Outcome::NxDomain, StaleGrace::For(_)) => "nxdomain_grace_expired",
        (Outcome::NxDomain, StaleGrace::WhileHealthy) => "nxdomain_peers_unhealthy",
        (_, StaleGrace::For(_)) => "nodata_grace_expired",
        (_, StaleGrace::WhileHealthy) => "nodata_peers_unhealthy",
    }
}

/// The one log line for a change of a name's address set.
fn log_change(
    name: &str,
    outcome: &Outcome,
    old: &[IpAddr],
    new: &[IpAddr],
    dropped: Option<&'static str>,
) {
    tracing::info!(
        dns.name = %name,
        dns.outcome = outcome.label(),
        dns.rcode = outcome.rcode().unwrap_or("-"),
        old = %join(old),
        new = %join(new),
        dropped_reason = dropped.unwrap_or("-"),
        "dns addresses changed"
    );
}

fn join(addrs: &[IpAddr]) -> String {
    let parts: Vec<String> = addrs.iter().map(IpAddr::to_string).collect();
    format!("[{}]", parts.join(","))
}

#[cfg(test)]
mod tests;
