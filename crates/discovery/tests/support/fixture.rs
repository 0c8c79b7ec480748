//! Shared pieces of the on-the-wire tests: a fake DNS, a resolver aimed at it, an observer
//! that timestamps every lookup, and bounded waits.

#![allow(dead_code)]

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use upkeep_discovery::{
    watch_name, AssumeHealthy, NameState, Observer, Outcome, Policy, Resolver, StaleCheck,
    StaleGrace,
};
use upkeep_fakedns::{FakeDns, Mode, Zone};

pub const NAME: &str = "app.upkeep.test";
/// Upper bound for any wait on the wire; a healthy run takes a fraction of it.
pub const DEADLINE: Duration = Duration::from_secs(10);

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn two() -> Vec<IpAddr> {
    vec![ip("127.0.0.2"), ip("127.0.0.3")]
}

/// One lookup as the observer saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub outcome: Outcome,
    pub old: Vec<IpAddr>,
    pub new: Vec<IpAddr>,
}

#[derive(Default)]
pub struct Recorder(pub Mutex<Vec<Seen>>);

impl Observer for Recorder {
    fn on_lookup(&self, _name: &str, outcome: &Outcome, old: &[IpAddr], new: &[IpAddr]) {
        self.0.lock().unwrap().push(Seen {
            at: Instant::now(),
            outcome: outcome.clone(),
            old: old.to_vec(),
            new: new.to_vec(),
        });
    }
}

impl Recorder {
    pub fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    /// Lookups whose outcome has this label.
    pub fn with_label(&self, label: &str) -> Vec<Seen> {
        self.all()
            .into_iter()
            .filter(|s| s.outcome.label() == label)
            .collect()
    }
}

/// A health answer the test can flip.
pub struct Health(pub AtomicBool);

impl StaleCheck for Health {
    fn still_healthy(&self, _addrs: &[IpAddr]) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

pub fn policy(grace: StaleGrace) -> Policy {
    Policy {
        min_refresh: Duration::from_millis(200),
        max_refresh: Duration::from_secs(300),
        stale_grace: grace,
        error_backoff: Duration::from_millis(150),
    }
}

pub struct Rig {
    pub dns: FakeDns,
    pub resolver: Arc<Resolver>,
    pub rx: watch::Receiver<NameState>,
    pub task: JoinHandle<()>,
    pub seen: Arc<Recorder>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn fake_dns(zone: Zone) -> FakeDns {
    FakeDns::start("127.0.0.1:0".parse().unwrap(), zone)
        .await
        .expect("fake DNS starts on loopback")
}

/// A fake DNS serving `NAME` with `mode` (TTL 1 s) and a watch on it.
pub async fn rig(mode: Mode, policy: Policy, stale: Arc<dyn StaleCheck>) -> Rig {
    rig_with(
        Zone::new().with(NAME, mode, 1),
        NAME,
        policy,
        stale,
        Duration::from_millis(300),
    )
    .await
}

pub async fn rig_with(
    zone: Zone,
    name: &str,
    policy: Policy,
    stale: Arc<dyn StaleCheck>,
    timeout: Duration,
) -> Rig {
    let dns = fake_dns(zone).await;
    let resolver = Arc::new(Resolver::with_servers(&[dns.local_addr()], timeout));
    let seen = Arc::new(Recorder::default());
    let (rx, task) = watch_name(
        resolver.clone(),
        name.to_owned(),
        policy,
        stale,
        seen.clone(),
    );
    Rig {
        dns,
        resolver,
        rx,
        task,
        seen,
    }
}

pub fn healthy() -> Arc<dyn StaleCheck> {
    Arc::new(AssumeHealthy(true))
}

/// Waits (bounded) until the state satisfies `pred`; returns that state.
pub async fn wait_for(
    rx: &mut watch::Receiver<NameState>,
    what: &str,
    pred: impl Fn(&NameState) -> bool,
) -> NameState {
    let result = tokio::time::timeout(DEADLINE, async {
        loop {
            if pred(&rx.borrow_and_update()) {
                return rx.borrow().clone();
            }
            rx.changed().await.expect("watch loop alive");
        }
    })
    .await;
    match result {
        Ok(state) => state,
        Err(_) => panic!("timed out waiting for {what}; state: {:?}", *rx.borrow()),
    }
}

/// Follows the state for `how_long`, asserting `check` on every state published.
pub async fn hold_for(
    rx: &mut watch::Receiver<NameState>,
    how_long: Duration,
    check: impl Fn(&NameState),
) {
    check(&rx.borrow_and_update());
    let _ = tokio::time::timeout(how_long, async {
        while rx.changed().await.is_ok() {
            check(&rx.borrow_and_update());
        }
    })
    .await;
}

/// Waits until the rig has resolved `NAME` to `addrs`.
pub async fn resolved(rig: &mut Rig, addrs: &[IpAddr]) {
    wait_for(&mut rig.rx, "first resolution", |s| *s.addrs == *addrs).await;
}

/// Number of A queries the fake DNS answered with `answer` for `name`.
pub fn a_queries_answered(dns: &FakeDns, name: &str, answer: &str) -> usize {
    dns.queries()
        .iter()
        .filter(|q| q.name == name && q.qtype == "A" && q.answer == answer)
        .count()
}
