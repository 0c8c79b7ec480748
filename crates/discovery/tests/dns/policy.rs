//! The discovery policy on the wire: a fake DNS on loopback switches modes under a live
//! watch, and the published addresses obey the invariants in docs/discovery.md.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use upkeep_discovery::{Outcome, Policy, StaleGrace};
use upkeep_fakedns::{Mode, Zone};

use crate::support::*;

async fn negative_keeps_last_known_good(mode: Mode, label: &str, answer: &str) {
    let mut rig = rig(
        Mode::Fixed(two()),
        policy(StaleGrace::WhileHealthy),
        healthy(),
    )
    .await;
    resolved(&mut rig, &two()).await;
    rig.dns.set_mode(NAME, mode);
    let state = wait_for(&mut rig.rx, label, |s| s.last_outcome.label() == label).await;
    assert_eq!(*state.addrs, *two(), "kept on the first negative answer");
    assert!(state.stale_since.is_some());
    hold_for(&mut rig.rx, Duration::from_millis(1500), |s| {
        assert_eq!(*s.addrs, *two(), "addresses kept: {s:?}");
        assert!(s.stale_since.is_some() && s.dropped_reason.is_none());
    })
    .await;
    // Re-asked at min_refresh (200 ms), not at the TTL or slower.
    let asked = a_queries_answered(&rig.dns, NAME, answer);
    assert!(asked >= 4, "{asked} {answer} answers in 1.5 s");
    assert!(rig
        .seen
        .all()
        .iter()
        .all(|s| !s.new.is_empty() || s.old.is_empty()));
}

#[tokio::test]
async fn nxdomain_keeps_last_known_good_addresses() {
    negative_keeps_last_known_good(Mode::NxDomain, "nxdomain", "NXDOMAIN").await;
}

#[tokio::test]
async fn nodata_keeps_last_known_good_addresses() {
    negative_keeps_last_known_good(Mode::NoData, "nodata", "NODATA").await;
}

#[tokio::test]
async fn servfail_keeps_addresses_and_retries_with_backoff() {
    let mut rig = rig(
        Mode::Fixed(two()),
        policy(StaleGrace::For(Duration::ZERO)),
        healthy(),
    )
    .await;
    resolved(&mut rig, &two()).await;
    rig.dns.set_mode(NAME, Mode::ServFail);
    wait_for(&mut rig.rx, "servfail", |s| {
        s.last_outcome == Outcome::ServFail
    })
    .await;
    // Even a zero grace does not apply: a failure is not a negative answer.
    hold_for(&mut rig.rx, Duration::from_millis(2500), |s| {
        assert_eq!(*s.addrs, *two(), "{s:?}");
        assert!(s.stale_since.is_none());
    })
    .await;
    let fails = rig.seen.with_label("servfail");
    let gaps: Vec<f64> = fails
        .windows(2)
        .map(|w| (w[1].at - w[0].at).as_secs_f64())
        .collect();
    // Backoff 150, 300, 600 ms (-20 % jitter at most). A gap is the sleep plus the next
    // lookup's time, so lower bounds hold even on a loaded machine; each one is above the
    // previous backoff's upper bound (+20 %), which is what growth means.
    assert!(gaps.len() >= 3, "{gaps:?}");
    assert!(gaps[0] >= 0.12 && gaps[0] < 0.5, "first retry: {gaps:?}");
    assert!(gaps[1] >= 0.24, "second retry: {gaps:?}");
    assert!(gaps[2] >= 0.48, "third retry: {gaps:?}");
    // A fixed 150 ms retry would have asked about 16 times.
    assert!(
        fails.len() <= 6,
        "retries are backed off: {} in 2.5 s",
        fails.len()
    );
}

#[tokio::test]
async fn silence_keeps_addresses() {
    let mut rig = rig(
        Mode::Fixed(two()),
        policy(StaleGrace::For(Duration::ZERO)),
        healthy(),
    )
    .await;
    resolved(&mut rig, &two()).await;
    rig.dns.set_mode(NAME, Mode::Silent);
    wait_for(&mut rig.rx, "timeout", |s| {
        s.last_outcome == Outcome::Timeout
    })
    .await;
    hold_for(&mut rig.rx, Duration::from_millis(2000), |s| {
        assert_eq!(*s.addrs, *two(), "{s:?}");
    })
    .await;
    assert!(rig.seen.with_label("timeout").len() >= 2);
    // DNS comes back: the loop notices within its (short) backoff.
    rig.dns.set_mode(NAME, Mode::Fixed(vec![ip("127.0.0.4")]));
    wait_for(&mut rig.rx, "recovery", |s| *s.addrs == [ip("127.0.0.4")]).await;
}

#[tokio::test]
async fn alternate_answers_swap_without_empty_intermediate() {
    let zone = Zone::new().with(NAME, Mode::Alternate(two()), 0);
    let p = Policy {
        min_refresh: Duration::from_millis(100),
        ..policy(StaleGrace::WhileHealthy)
    };
    let mut rig = rig_with(zone, NAME, p, healthy(), Duration::from_secs(1)).await;
    wait_for(&mut rig.rx, "first answer", |s| s.resolved_ever).await;
    let mut states = 0;
    hold_for(&mut rig.rx, Duration::from_millis(2000), |s| {
        assert_eq!(s.addrs.len(), 1, "one address, never none: {s:?}");
    })
    .await;
    let seen = rig.seen.all();
    for s in &seen {
        assert_eq!(s.new.len(), 1, "{s:?}");
        if s.old != s.new {
            states += 1;
        }
    }
    assert!(states >= 8, "{states} swaps in 2 s");
    assert!(seen.iter().any(|s| s.new == [two()[0]]));
    assert!(seen.iter().any(|s| s.new == [two()[1]]));
}

#[tokio::test]
async fn never_resolved_name_is_empty_and_retried() {
    let mut rig = rig_with(
        Zone::new(),
        NAME,
        policy(StaleGrace::WhileHealthy),
        healthy(),
        Duration::from_millis(300),
    )
    .await;
    hold_for(&mut rig.rx, Duration::from_millis(1200), |s| {
        assert!(s.addrs.is_empty() && !s.resolved_ever, "{s:?}");
        assert!(s.dropped_reason.is_none());
    })
    .await;
    assert_eq!(rig.rx.borrow().last_outcome, Outcome::NxDomain);
    let asked = a_queries_answered(&rig.dns, NAME, "NXDOMAIN");
    assert!(asked >= 3, "retried at min_refresh: {asked} in 1.2 s");
    rig.dns.set_mode(NAME, Mode::Fixed(two()));
    resolved(&mut rig, &two()).await;
    assert!(rig.rx.borrow().resolved_ever);
}

#[tokio::test]
async fn stale_grace_expiry_drops_addresses() {
    let grace = Duration::from_millis(1000);
    let mut rig = rig(
        Mode::Fixed(two()),
        policy(StaleGrace::For(grace)),
        healthy(),
    )
    .await;
    resolved(&mut rig, &two()).await;
    rig.dns.set_mode(NAME, Mode::NxDomain);
    wait_for(&mut rig.rx, "nxdomain", |s| {
        s.last_outcome == Outcome::NxDomain
    })
    .await;
    let first_negative = Instant::now();
    let state = wait_for(&mut rig.rx, "drop", |s| s.addrs.is_empty()).await;
    let kept_for = first_negative.elapsed();
    assert_eq!(state.dropped_reason, Some("nxdomain_grace_expired"));
    assert!(state.resolved_ever && state.stale_since.is_none());
    assert!(
        kept_for >= grace - Duration::from_millis(50) && kept_for < grace * 2,
        "kept {kept_for:?} for a grace of {grace:?}"
    );
    let drops: Vec<_> = rig
        .seen
        .all()
        .into_iter()
        .filter(|s| !s.old.is_empty() && s.new.is_empty())
        .collect();
    assert_eq!(drops.len(), 1);
    assert_eq!(drops[0].outcome, Outcome::NxDomain);
}

#[tokio::test]
async fn stale_peers_failing_health_are_dropped() {
    let health = Arc::new(Health(AtomicBool::new(true)));
    let mut rig = rig(
        Mode::Fixed(two()),
        policy(StaleGrace::WhileHealthy),
        health.clone(),
    )
    .await;
    resolved(&mut rig, &two()).await;
    rig.dns.set_mode(NAME, Mode::NoData);
    wait_for(&mut rig.rx, "nodata", |s| s.last_outcome == Outcome::NoData).await;
    hold_for(&mut rig.rx, Duration::from_millis(800), |s| {
        assert_eq!(*s.addrs, *two(), "healthy stale peers are kept: {s:?}");
    })
    .await;
    health.0.store(false, Ordering::SeqCst);
    let flipped = Instant::now();
    let state = wait_for(&mut rig.rx, "drop", |s| s.addrs.is_empty()).await;
    assert_eq!(state.dropped_reason, Some("nodata_peers_unhealthy"));
    assert!(
        flipped.elapsed() < Duration::from_secs(2),
        "dropped at the next re-query"
    );
}

#[tokio::test]
async fn ttl_is_clamped_to_min_and_max_refresh() {
    // TTL 0 is raised to min_refresh.
    let zone = Zone::new().with(NAME, Mode::Fixed(two()), 0);
    let p = Policy {
        min_refresh: Duration::from_millis(300),
        max_refresh: Duration::from_secs(300),
        ..policy(StaleGrace::WhileHealthy)
    };
    let rig_min = rig_with(zone, NAME, p, healthy(), Duration::from_secs(1)).await;
    // TTL one hour is lowered to max_refresh.
    let zone = Zone::new().with(NAME, Mode::Fixed(two()), 3600);
    let p = Policy {
        min_refresh: Duration::from_millis(100),
        max_refresh: Duration::from_millis(400),
        ..policy(StaleGrace::WhileHealthy)
    };
    let rig_max = rig_with(zone, NAME, p, healthy(), Duration::from_secs(1)).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;

    for (rig, want_ms) in [(&rig_min, 300.0), (&rig_max, 400.0)] {
        let seen = rig.seen.with_label("records");
        let gaps: Vec<f64> = seen
            .windows(2)
            .map(|w| (w[1].at - w[0].at).as_secs_f64() * 1000.0)
            .collect();
        assert!(gaps.len() >= 3, "{gaps:?}");
        for g in &gaps {
            // Lower bound: never sooner than the clamp. Upper bound: far below the TTL
            // (3600 s) in the max case, and no skipped period in the min case.
            assert!(
                *g >= want_ms - 5.0 && *g < want_ms * 2.0,
                "gap {g} ms, want {want_ms} ms: {gaps:?}"
            );
        }
    }
}
