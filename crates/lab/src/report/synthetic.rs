//! A small synthetic report (every incident class against nginx, HAProxy and upkeep) for
//! testing the headline and the picture without running the lab.

use super::RunReport;
use crate::timeline::FaultEvent;

/// One row; `errors_at` lists (from_s, to_s, status-or-none) spans of failed requests at
/// 100 req/s, the rest answered 200.
pub(crate) fn row(
    scenario: &str,
    target: &str,
    label: &str,
    pattern: &str,
    duration_s: f64,
    errors_at: &[(f64, f64, bool)],
) -> RunReport {
    let n = (duration_s / 0.1).round() as usize;
    let mut buckets = vec![(10u32, 0u32, 0u32); n];
    let mut errors = 0;
    let mut outage: f64 = 0.0;
    for &(from, to, five_xx) in errors_at {
        for (i, b) in buckets.iter_mut().enumerate() {
            let t = i as f64 * 0.1;
            if t >= from - 1e-9 && t < to - 1e-9 {
                *b = if five_xx { (0, 10, 0) } else { (0, 0, 10) };
                errors += 10;
            }
        }
        outage = outage.max(to - from - 0.01);
    }
    RunReport {
        scenario: scenario.into(),
        target: target.into(),
        label: label.into(),
        pattern: pattern.into(),
        healthy_path: true,
        duration_s,
        buckets,
        requests: (n * 10) as u64,
        errors,
        longest_outage_s: (outage * 100.0).round() / 100.0,
        p50_ms: 1.0,
        p99_ms: 3.0,
        max_ms: 9.0,
        lag_p99_ms: 0.2,
        faults: vec![FaultEvent {
            label: "dc1 refuse".into(),
            start_s: 3.0,
            end_s: Some(5.0),
        }],
        ..RunReport::default()
    }
}

/// Every class x target: nginx fails the NXDOMAIN (5xx, 1.5-2.0 s) and the two-lines
/// scenario (5xx, 3.0-13.5 s); HAProxy loses a few race requests (no response) in the POST
/// run and lagged there; the probe cascade runs only on upkeep.
pub(crate) fn report() -> Vec<RunReport> {
    let ng = "nginx 1.22.1 (dynamic-resolve pattern)";
    let ng2 = "nginx 1.22.1 (names resolved once at start)";
    let mut rows = vec![
        row(
            "dns-nxdomain-6s",
            "nginx",
            ng,
            "per-request resolve (set $up)",
            14.0,
            &[(1.5, 2.0, true)],
        ),
        row(
            "dns-nxdomain-6s",
            "haproxy",
            "haproxy 2.6.12",
            "resolvers, default hold",
            14.0,
            &[],
        ),
        row(
            "dns-nxdomain-6s",
            "upkeep",
            "upkeep",
            "DNS endpoints",
            14.0,
            &[],
        ),
        row(
            "two-lines-one-host-rst",
            "nginx",
            ng2,
            "names resolved once at start",
            16.0,
            &[(3.0, 13.5, true)],
        ),
        row(
            "two-lines-one-host-rst",
            "haproxy",
            "haproxy 2.6.12",
            "resolvers, default hold",
            16.0,
            &[],
        ),
        row(
            "two-lines-one-host-rst",
            "upkeep",
            "upkeep",
            "DNS endpoints",
            16.0,
            &[],
        ),
        row(
            "keepalive-race-get",
            "nginx",
            "nginx 1.22.1",
            "static upstream",
            13.0,
            &[],
        ),
        row(
            "keepalive-race-get",
            "haproxy",
            "haproxy 2.6.12",
            "static servers",
            13.0,
            &[],
        ),
        row(
            "keepalive-race-get",
            "upkeep",
            "upkeep",
            "static endpoints",
            13.0,
            &[],
        ),
        row(
            "keepalive-race-post",
            "nginx",
            "nginx 1.22.1",
            "static upstream",
            13.0,
            &[],
        ),
        row(
            "keepalive-race-post",
            "haproxy",
            "haproxy 2.6.12",
            "static servers",
            13.0,
            &[(6.0, 6.1, false)],
        ),
        row(
            "keepalive-race-post",
            "upkeep",
            "upkeep",
            "static endpoints",
            13.0,
            &[],
        ),
        RunReport::skipped(
            "probe-cascade",
            "nginx",
            "nginx has no admin endpoints (/livez, /readyz, /startupz) for probes to ask".into(),
        ),
        RunReport::skipped(
            "probe-cascade",
            "haproxy",
            "HAProxy has no admin endpoints (/livez, /readyz, /startupz) for probes to ask".into(),
        ),
        row(
            "probe-cascade",
            "upkeep",
            "upkeep",
            "static endpoints, optional group",
            12.0,
            &[],
        ),
        row("drain", "upkeep", "upkeep", "static endpoints", 5.0, &[]),
    ];
    rows[10].lag_p99_ms = 38.5;
    rows[14].probe_restarts = Some(0);
    rows[14].probe_traffic_cuts = Some(0);
    for r in rows
        .iter_mut()
        .filter(|r| r.scenario.starts_with("keepalive"))
    {
        r.faults.clear();
    }
    rows
}
