//! The loop's timing and keep/drop rules on paused tokio time, with a scripted source.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::*;

/// Answers from a script (the last step repeats) and notes when it was asked.
struct Scripted {
    steps: Mutex<VecDeque<Outcome>>,
    calls: Mutex<Vec<Instant>>,
}

impl Scripted {
    fn new(steps: Vec<Outcome>) -> Arc<Self> {
        Arc::new(Scripted {
            steps: Mutex::new(steps.into()),
            calls: Mutex::new(Vec::new()),
        })
    }

    fn set(&self, steps: Vec<Outcome>) {
        *self.steps.lock().unwrap() = steps.into();
    }

    /// Seconds (as f64) between successive calls.
    /// Seconds between lookups. A jittered delay lies in [0.8, 1.2) of its base, and tokio's
    /// timer rounds a sleep up to its next millisecond, so a gap reaches up to 1.2 of its base
    /// plus [`TICK`].
    fn gaps(&self) -> Vec<f64> {
        let calls = self.calls.lock().unwrap();
        calls
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64())
            .collect()
    }

    fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

/// tokio's timer resolution: a sleep ends at the first millisecond tick at or after its
/// deadline.
const TICK: f64 = 0.001;

impl Lookup for Scripted {
    fn lookup<'a>(&'a self, _name: &'a str) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>> {
        self.calls.lock().unwrap().push(Instant::now());
        let mut steps = self.steps.lock().unwrap();
        let next = if steps.len() > 1 {
            steps.pop_front().unwrap()
        } else {
            steps.front().cloned().expect("script is not empty")
        };
        Box::pin(async move { next })
    }
}

/// One observer call: outcome label, old and new addresses.
type Call = (String, Vec<IpAddr>, Vec<IpAddr>);

#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<Call>>,
}

impl Observer for Recorder {
    fn on_lookup(&self, _name: &str, outcome: &Outcome, old: &[IpAddr], new: &[IpAddr]) {
        self.calls
            .lock()
            .unwrap()
            .push((outcome.label().to_owned(), old.to_vec(), new.to_vec()));
    }
}

struct Toggle(AtomicBool);

impl StaleCheck for Toggle {
    fn still_healthy(&self, _addrs: &[IpAddr]) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

const S: Duration = Duration::from_secs(1);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn records(ips: &[&str], ttl: Duration) -> Outcome {
    Outcome::Records {
        addrs: ips.iter().map(|s| ip(s)).collect(),
        ttl,
    }
}

fn policy(grace: StaleGrace) -> Policy {
    Policy {
        min_refresh: S,
        max_refresh: 60 * S,
        stale_grace: grace,
        error_backoff: S,
    }
}

fn start(
    source: Arc<Scripted>,
    policy: Policy,
    stale: Arc<dyn StaleCheck>,
) -> (watch::Receiver<NameState>, JoinHandle<()>, Arc<Recorder>) {
    let rec = Arc::new(Recorder::default());
    let (rx, task) = watch_name_with(source, "app.upkeep.test".into(), policy, stale, rec.clone());
    (rx, task, rec)
}

fn addrs(rx: &watch::Receiver<NameState>) -> Vec<IpAddr> {
    rx.borrow().addrs.to_vec()
}

#[tokio::test(start_paused = true)]
async fn refresh_follows_ttl_clamped_to_min_and_max() {
    let src = Scripted::new(vec![
        records(&["127.0.0.2"], Duration::ZERO),
        records(&["127.0.0.2"], 5 * S),
        records(&["127.0.0.2"], 3600 * S),
        records(&["127.0.0.2"], 3600 * S),
    ]);
    let (_rx, _task, _) = start(
        src.clone(),
        policy(StaleGrace::WhileHealthy),
        Arc::new(AssumeHealthy(true)),
    );
    tokio::time::sleep(200 * S).await;
    // TTL 0 -> min 1 s; TTL 5 -> 5 s; TTL 3600 -> max 60 s.
    let gaps = src.gaps();
    assert_eq!(&gaps[..4], &[1.0, 5.0, 60.0, 60.0], "{gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn failures_keep_addresses_and_back_off_with_jitter() {
    let src = Scripted::new(vec![records(&["127.0.0.2"], 2 * S), Outcome::ServFail]);
    let (rx, _task, rec) = start(
        src.clone(),
        policy(StaleGrace::WhileHealthy),
        Arc::new(AssumeHealthy(false)),
    );
    tokio::time::sleep(120 * S).await;
    assert_eq!(addrs(&rx), vec![ip("127.0.0.2")]);
    assert_eq!(rx.borrow().last_outcome, Outcome::ServFail);
    let gaps = src.gaps();
    // First gap is the TTL; then 1, 2, 4, 8, 16, 30, 30 s, each within +-20 %.
    assert_eq!(gaps[0], 2.0);
    let expected = [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0];
    for (got, want) in gaps[1..].iter().zip(expected) {
        assert!(
            *got >= want * 0.8 - 1e-9 && *got < want * 1.2 + TICK,
            "gap {got} for backoff {want}: {gaps:?}"
        );
    }
    assert!(rec
        .calls
        .lock()
        .unwrap()
        .iter()
        .skip(1)
        .all(|(label, old, new)| label == "servfail" && old == new && !new.is_empty()));
}

#[tokio::test(start_paused = true)]
async fn backoff_resets_after_an_answer() {
    let src = Scripted::new(vec![
        Outcome::Timeout,
        Outcome::Timeout,
        Outcome::Timeout,
        records(&["127.0.0.2"], 10 * S),
        Outcome::Timeout,
        Outcome::Timeout,
    ]);
    let (_rx, _task, _) = start(
        src.clone(),
        policy(StaleGrace::WhileHealthy),
        Arc::new(AssumeHealthy(true)),
    );
    tokio::time::sleep(40 * S).await;
    let gaps = src.gaps();
    // 1, 2, 4 (backoff), then 10 (TTL), then back to 1.
    assert!(gaps[2] >= 3.2 && gaps[2] < 4.8 + TICK, "{gaps:?}");
    assert_eq!(gaps[3], 10.0, "{gaps:?}");
    assert!(gaps[4] >= 0.8 && gaps[4] < 1.2 + TICK, "{gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn grace_for_drops_when_it_ends_not_before() {
    let src = Scripted::new(vec![
        records(&["127.0.0.3", "127.0.0.2"], S),
        Outcome::NxDomain,
    ]);
    let (rx, _task, _) = start(
        src.clone(),
        policy(StaleGrace::For(Duration::from_millis(4500))),
        Arc::new(AssumeHealthy(true)),
    );
    // First NXDOMAIN at t=1 s; grace ends at t=5.5 s.
    tokio::time::sleep(Duration::from_millis(5400)).await;
    assert_eq!(addrs(&rx), vec![ip("127.0.0.2"), ip("127.0.0.3")]);
    assert!(rx.borrow().stale_since.is_some());
    assert_eq!(rx.borrow().last_outcome, Outcome::NxDomain);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let state = rx.borrow().clone();
    assert!(state.addrs.is_empty(), "{state:?}");
    assert_eq!(state.dropped_reason, Some("nxdomain_grace_expired"));
    assert!(state.resolved_ever);
    // Negative answers keep being re-asked at min_refresh.
    let before = src.count();
    tokio::time::sleep(3 * S).await;
    assert_eq!(src.count() - before, 3);
}

#[tokio::test(start_paused = true)]
async fn while_healthy_keeps_until_health_fails() {
    let health = Arc::new(Toggle(AtomicBool::new(true)));
    let src = Scripted::new(vec![records(&["127.0.0.2"], S), Outcome::NoData]);
    let (rx, _task, rec) = start(
        src.clone(),
        policy(StaleGrace::WhileHealthy),
        health.clone(),
    );
    tokio::time::sleep(30 * S).await;
    assert_eq!(
        addrs(&rx),
        vec![ip("127.0.0.2")],
        "healthy stale peers are kept"
    );
    health.0.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let state = rx.borrow().clone();
    assert!(state.addrs.is_empty());
    assert_eq!(state.dropped_reason, Some("nodata_peers_unhealthy"));
    // The observer saw two changes: the first records, then the drop on NODATA.
    let calls = rec.calls.lock().unwrap();
    let changes: Vec<_> = calls.iter().filter(|(_, old, new)| old != new).collect();
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert_eq!(changes[0].0, "records");
    assert_eq!(
        (
            changes[1].0.as_str(),
            changes[1].1.len(),
            changes[1].2.len()
        ),
        ("nodata", 1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn records_after_negative_answers_clear_the_stale_mark() {
    let src = Scripted::new(vec![
        records(&["127.0.0.2"], S),
        Outcome::NxDomain,
        Outcome::NxDomain,
        records(&["127.0.0.4"], S),
    ]);
    let (rx, _task, _) = start(
        src.clone(),
        policy(StaleGrace::For(60 * S)),
        Arc::new(AssumeHealthy(true)),
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(rx.borrow().stale_since.is_some());
    tokio::time::sleep(S).await;
    let state = rx.borrow().clone();
    assert_eq!(state.addrs.to_vec(), vec![ip("127.0.0.4")]);
    assert_eq!(state.stale_since, None);
    assert_eq!(state.dropped_reason, None);
}

#[tokio::test(start_paused = true)]
async fn never_resolved_stays_empty_and_keeps_asking() {
    let src = Scripted::new(vec![Outcome::NxDomain]);
    let (rx, _task, _) = start(
        src.clone(),
        policy(StaleGrace::For(S)),
        Arc::new(AssumeHealthy(true)),
    );
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    let state = rx.borrow().clone();
    assert!(state.addrs.is_empty() && !state.resolved_ever);
    assert_eq!(state.dropped_reason, None, "nothing was dropped");
    assert_eq!(src.count(), 11);
    src.set(vec![records(&["127.0.0.2"], 5 * S)]);
    tokio::time::sleep(S).await;
    assert_eq!(addrs(&rx), vec![ip("127.0.0.2")]);
    assert!(rx.borrow().resolved_ever);
}

#[tokio::test(start_paused = true)]
async fn ip_literal_is_its_own_address_without_lookup() {
    let src = Scripted::new(vec![Outcome::NxDomain]);
    let (rx, _task) = watch_name_with(
        src.clone(),
        "127.0.0.9".into(),
        Policy::default(),
        Arc::new(AssumeHealthy(true)),
        Arc::new(NoObserver),
    );
    tokio::time::sleep(10 * S).await;
    assert_eq!(addrs(&rx), vec![ip("127.0.0.9")]);
    assert!(rx.borrow().resolved_ever);
    assert_eq!(src.count(), 0);
}

#[tokio::test(start_paused = true)]
async fn loop_ends_when_every_receiver_is_dropped() {
    let src = Scripted::new(vec![records(&["127.0.0.2"], 100 * S)]);
    let (rx, task, _) = start(
        src.clone(),
        policy(StaleGrace::WhileHealthy),
        Arc::new(AssumeHealthy(true)),
    );
    tokio::time::sleep(S).await;
    drop(rx);
    tokio::time::timeout(S, task)
        .await
        .expect("loop ends without waiting for the next refresh")
        .unwrap();
    assert_eq!(src.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_aaaa_lookup_keeps_the_ipv6_addresses_that_a_answers_cannot_replace() {
    let src = Scripted::new(vec![
        records(&["127.0.0.2", "::2"], S),
        // A changed, AAAA timed out: the v4 set is replaced, the v6 address stays.
        Outcome::Partial {
            addrs: vec![ip("127.0.0.3")],
            ttl: S,
            unknown: crate::outcome::Family::V6,
        },
        // And the other way round.
        Outcome::Partial {
            addrs: vec![ip("::3")],
            ttl: S,
            unknown: crate::outcome::Family::V4,
        },
    ]);
    let (rx, _task, _) = start(
        src.clone(),
        policy(StaleGrace::WhileHealthy),
        Arc::new(AssumeHealthy(true)),
    );
    tokio::time::sleep(S / 2).await;
    assert_eq!(addrs(&rx), vec![ip("127.0.0.2"), ip("::2")]);
    tokio::time::sleep(S).await;
    assert_eq!(addrs(&rx), vec![ip("127.0.0.3"), ip("::2")]);
    tokio::time::sleep(S).await;
    assert_eq!(addrs(&rx), vec![ip("127.0.0.3"), ip("::3")]);
}

fn carried(ips: &[&str]) -> NameState {
    let mut s = NameState::new("app.upkeep.test".into());
    s.addrs = Arc::from(ips.iter().map(|s| ip(s)).collect::<Vec<_>>());
    s.resolved_ever = true;
    s.last_outcome = records(ips, S);
    s.last_at = Some(SystemTime::now());
    s
}

#[tokio::test(start_paused = true)]
async fn a_carried_over_loop_keeps_its_addresses_through_failures_and_replaces_them_on_records() {
    let src = Scripted::new(vec![Outcome::Timeout, Outcome::ServFail, Outcome::Timeout]);
    let (rx, _task) = watch_name_from(
        src.clone(),
        carried(&["127.0.0.2"]),
        policy(StaleGrace::WhileHealthy),
        Arc::new(AssumeHealthy(true)),
        Arc::new(NoObserver),
    );
    assert_eq!(
        addrs(&rx),
        vec![ip("127.0.0.2")],
        "the carried addresses before any lookup"
    );
    tokio::time::sleep(10 * S).await;
    assert!(src.count() >= 3);
    assert_eq!(
        addrs(&rx),
        vec![ip("127.0.0.2")],
        "failures keep the carried addresses"
    );
    assert!(rx.borrow().resolved_ever);
    src.set(vec![records(&["127.0.0.3"], S)]);
    tokio::time::sleep(40 * S).await;
    assert_eq!(addrs(&rx), vec![ip("127.0.0.3")]);
}

#[tokio::test(start_paused = true)]
async fn a_carried_over_loop_drops_its_addresses_when_the_grace_runs_out() {
    let src = Scripted::new(vec![Outcome::NxDomain]);
    let (rx, _task) = watch_name_from(
        src.clone(),
        carried(&["127.0.0.2"]),
        policy(StaleGrace::For(3 * S)),
        Arc::new(AssumeHealthy(true)),
        Arc::new(NoObserver),
    );
    tokio::time::sleep(S / 2).await;
    assert_eq!(addrs(&rx), vec![ip("127.0.0.2")], "kept inside the grace");
    tokio::time::sleep(4 * S).await;
    assert!(addrs(&rx).is_empty(), "dropped after the grace");
    assert_eq!(rx.borrow().dropped_reason, Some("nxdomain_grace_expired"));
}
