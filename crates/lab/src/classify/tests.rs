use super::*;

fn record(seq: u64, at_ms: u64, status: Option<u16>, error: Option<ClientError>) -> RequestRecord {
    RequestRecord {
        seq,
        scheduled: Duration::from_millis(at_ms),
        send_lag: Duration::ZERO,
        latency: Duration::from_millis(2),
        status,
        error,
        backend: None,
        cause: None,
        reused: false,
    }
}

const T0: f64 = 1_800_000_000.0;

#[test]
fn client_errors_are_named_by_kind() {
    let r = record(1, 0, None, Some(ClientError::Refused));
    assert_eq!(cause_of(&r, T0, &[]), "target_refused");
    let r = record(1, 0, None, Some(ClientError::Timeout));
    assert_eq!(cause_of(&r, T0, &[]), "client_timeout");
}

#[test]
fn upkeep_cause_header_wins() {
    let mut r = record(1, 0, Some(502), None);
    r.cause = Some("no_peers".into());
    assert_eq!(cause_of(&r, T0, &[]), "upkeep:no_peers");
}

#[test]
fn nginx_502_with_the_group_name_as_upstream_addr_is_no_live_upstreams() {
    let access = format!(
        "{:.3} 502 \"be\" \"-\" 0.000\n{:.3} 200 \"127.0.0.11:8080\" \"200\" 0.001\n",
        T0 + 1.002,
        T0 + 1.004
    );
    let logs = parse_nginx_access(&access, "be");
    let r = record(1, 1000, Some(502), None);
    assert_eq!(cause_of(&r, T0, &logs), "no_live_upstreams");
}

#[test]
fn nginx_error_log_signature_explains_a_plain_502() {
    // 1_800_000_000 is 2027-01-15 08:00:00 UTC.
    let error = "2027/01/15 08:00:03 [error] 7#7: *9 connect() failed (111: Connection refused) while connecting to upstream\n";
    let logs = parse_nginx_error(error);
    assert_eq!(logs.len(), 1);
    assert_eq!(logs[0].at, T0 + 3.0);
    let access = format!("{:.3} 502 \"127.0.0.11:8080\" \"502\" 0.000\n", T0 + 3.402);
    let mut all = parse_nginx_access(&access, "be");
    all.extend(logs);
    let r = record(1, 3400, Some(502), None);
    assert_eq!(cause_of(&r, T0, &all), "connect_failed");
}

#[test]
fn nginx_dns_not_found_is_recognised() {
    let logs = parse_nginx_error("2027/01/15 08:00:05 [error] 7#7: *1 app.upkeep.test could not be resolved (3: Host not found), client: 127.0.0.1\n");
    assert_eq!(logs[0].cause.as_deref(), Some("dns_not_found"));
}

#[test]
fn haproxy_termination_states_map_to_causes() {
    let log = "127.0.0.1:5555 [15/Jan/2027:08:00:02.100] fe be/s0 0/0/-1/-1/3 503 217 - - SC-- 1/1/0/0/3 0/0 \"GET / HTTP/1.1\"\n127.0.0.1:5556 [15/Jan/2027:08:00:02.200] fe be/<NOSRV> 0/-1/-1/-1/0 503 217 - - SC-- 1/1/0/0/0 0/0 \"GET / HTTP/1.1\"\n";
    let logs = parse_haproxy(log);
    assert_eq!(logs.len(), 2);
    assert_eq!(logs[0].cause.as_deref(), Some("connect_failed"));
    assert!((logs[0].at - (T0 + 2.103)).abs() < 1e-6);
    assert_eq!(logs[1].cause.as_deref(), Some("no_server"));
}

#[test]
fn an_unexplained_5xx_is_named_by_status() {
    let r = record(1, 0, Some(503), None);
    assert_eq!(cause_of(&r, T0, &[]), "status_503");
}

#[test]
fn errors_after_a_fault_ended_are_its_aftermath() {
    let faults = vec![FaultEvent {
        label: "dc1 refuse".into(),
        start_s: 3.0,
        end_s: Some(5.0),
    }];
    assert_eq!(context_of(4.0, &faults, &[]), "during dc1 refuse");
    assert_eq!(context_of(9.0, &faults, &[]), "after dc1 refuse ended");
    assert_eq!(context_of(1.0, &faults, &[]), "no fault");
}

#[test]
fn errors_after_an_nxdomain_answer_say_so() {
    let dns = vec![
        DnsAnswer {
            t_s: 1.0,
            name: "app".into(),
            answer: "127.0.0.11".into(),
        },
        DnsAnswer {
            t_s: 6.0,
            name: "app".into(),
            answer: "NXDOMAIN".into(),
        },
    ];
    assert_eq!(context_of(7.0, &[], &dns), "dns answered NXDOMAIN");
    assert_eq!(context_of(2.0, &[], &dns), "no fault");
}

#[test]
fn classify_skips_successes_and_tally_counts_by_cause_and_context() {
    let records = vec![
        record(0, 0, Some(200), None),
        record(1, 100, None, Some(ClientError::Refused)),
        record(2, 200, None, Some(ClientError::Refused)),
        record(3, 300, Some(404), None),
    ];
    let c = classify(&records, UNIX_EPOCH, &[], &[], &[]);
    assert_eq!(c.len(), 2);
    let t = tally(&c);
    assert_eq!(t.get("target_refused (no fault)"), Some(&2));
}

#[test]
fn overlapping_faults_are_all_named() {
    let faults = vec![
        FaultEvent {
            label: "dc1 slow:150ms".into(),
            start_s: 3.0,
            end_s: None,
        },
        FaultEvent {
            label: "SIGTERM to target".into(),
            start_s: 3.0,
            end_s: None,
        },
    ];
    assert_eq!(
        context_of(4.0, &faults, &[]),
        "during dc1 slow:150ms + SIGTERM to target"
    );
}
