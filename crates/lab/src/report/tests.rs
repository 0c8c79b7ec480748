use super::*;
use crate::load::ClientError;
use std::time::Duration;

fn rec(ms: u64, ok: bool) -> RequestRecord {
    RequestRecord {
        seq: ms,
        scheduled: Duration::from_millis(ms),
        send_lag: Duration::ZERO,
        latency: Duration::from_millis(1),
        status: ok.then_some(200),
        error: (!ok).then_some(ClientError::Refused),
        backend: None,
        cause: None,
        reused: false,
    }
}

#[test]
fn longest_outage_spans_first_to_last_error_of_the_longest_run() {
    let records: Vec<_> = [
        (0, true),
        (100, false),
        (200, false),
        (300, true),
        (400, false),
        (500, false),
        (600, false),
        (700, false),
        (800, true),
    ]
    .iter()
    .map(|(t, ok)| rec(*t, *ok))
    .collect();
    assert!((longest_outage(&records) - 0.3).abs() < 1e-9);
    assert_eq!(longest_outage(&[rec(0, true)]), 0.0);
}

#[test]
fn failover_runs_to_the_last_error_put_down_to_a_fault() {
    let faults = vec![FaultEvent {
        label: "dc1 refuse".into(),
        start_s: 3.0,
        end_s: Some(5.0),
    }];
    let c = vec![
        Classified {
            seq: 1,
            t_s: 3.1,
            cause: "x".into(),
            context: "during dc1 refuse".into(),
        },
        Classified {
            seq: 2,
            t_s: 13.4,
            cause: "x".into(),
            context: "after dc1 refuse ended".into(),
        },
    ];
    assert!((failover(&c, &faults).unwrap() - 10.4).abs() < 1e-9);
    assert_eq!(failover(&[], &faults), Some(0.0));
    assert_eq!(failover(&c, &[]), None);
}

#[test]
fn skipped_rows_carry_their_reason_in_every_format() {
    let rows = vec![RunReport::skipped(
        "probe-cascade",
        "nginx",
        "no admin endpoints".into(),
    )];
    assert!(table(&rows).contains("skipped: no admin endpoints"));
    assert!(markdown(&rows).contains("skipped: no admin endpoints"));
    let v: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
    assert_eq!(v[0]["skipped"], true);
    assert_eq!(v[0]["skip_reason"], "no admin endpoints");
    assert_eq!(v[0]["longest_outage_s"], 0.0);
}
