//! Keep-alive pollers: each reuses one connection and idles between requests, which is what
//! exposes the race between a reusing side's pool and a server's idle close.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rand::Rng;
use tokio::time::Instant;

use super::{timed_exchange, LoadResult, LoadSpec, RequestRecord, Target};

pub(super) async fn run(
    spec: &LoadSpec,
    target: Target,
    count: usize,
    idle_min: Duration,
    idle_max: Duration,
    t0: Instant,
) -> LoadResult {
    let started = SystemTime::now() + t0.saturating_duration_since(Instant::now());
    tokio::time::sleep_until(t0).await;
    let spec = Arc::new(spec.clone());
    let target = Arc::new(target);
    let mut tasks = Vec::new();
    for _ in 0..count.max(1) {
        let spec = spec.clone();
        let target = target.clone();
        tasks.push(tokio::spawn(async move {
            // All pollers start together and keep roughly in step: the proxy in front then
            // holds one pooled upstream connection per poller, each idle for about one
            // poller idle time, so every round reuses connections right at the backend's
            // close time (spread pollers would keep one connection warm and hide the race).
            poll_loop(&spec, &target, t0, idle_min, idle_max).await
        }));
    }
    let mut records = Vec::new();
    for t in tasks {
        if let Ok(mut r) = t.await {
            records.append(&mut r);
        }
    }
    records.sort_by_key(|r| r.scheduled);
    for (i, r) in records.iter_mut().enumerate() {
        r.seq = i as u64;
    }
    LoadResult { started, records }
}

async fn poll_loop(
    spec: &LoadSpec,
    target: &Target,
    t0: Instant,
    idle_min: Duration,
    idle_max: Duration,
) -> Vec<RequestRecord> {
    let mut out = Vec::new();
    let mut conn = None;
    while t0.elapsed() < spec.duration {
        let due = t0.elapsed();
        // A sane client drops a connection it already saw closed; only a close that crosses
        // the request on the wire is left, which is the race itself.
        let reusable = conn
            .take()
            .filter(|s: &hyper::client::conn::http1::SendRequest<_>| !s.is_closed());
        let (record, kept) =
            timed_exchange(spec, target, reusable, false, 0, due, Duration::ZERO).await;
        conn = kept;
        out.push(record);
        let idle = if idle_max > idle_min {
            rand::rng().random_range(idle_min..=idle_max)
        } else {
            idle_min
        };
        tokio::time::sleep(idle).await;
    }
    out
}
