//! Error log episodes on fixtures: each class on its positive log, and not on logs without
//! its signature; access-log 502 counts; gzip input; unreadable input errors.

use std::io::Write;
use std::path::{Path, PathBuf};
use upkeep_doctor::finding::{Finding, Severity};
use upkeep_doctor::logs::{analyze, LogError};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/logs")
        .join(name)
}

fn run(names: &[&str], access: &[&str]) -> Vec<Finding> {
    let e: Vec<PathBuf> = names.iter().map(|n| fixture(n)).collect();
    let a: Vec<PathBuf> = access.iter().map(|n| fixture(n)).collect();
    let e: Vec<&Path> = e.iter().map(PathBuf::as_path).collect();
    let a: Vec<&Path> = a.iter().map(PathBuf::as_path).collect();
    analyze(&e, &a).unwrap_or_else(|e| panic!("{e}"))
}

fn rules(f: &[Finding]) -> Vec<&str> {
    f.iter().map(|f| f.rule).collect()
}

fn detail<'a>(f: &'a Finding, key: &str) -> &'a serde_json::Value {
    f.details
        .get(key)
        .unwrap_or_else(|| panic!("no {key} in {f:#?}"))
}

/// A temporary directory removed on drop, unique per test.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("upkeep-doctor-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn nxdomain_outage_is_one_episode_with_span_count_upstream_and_host() {
    let f = run(&["nxdomain.log"], &[]);
    assert_eq!(rules(&f), ["nxdomain-outage"]);
    let ep = &f[0];
    assert_eq!(ep.severity, Severity::Error);
    assert_eq!(ep.location.line, Some(3));
    assert_eq!(detail(ep, "start"), "2026/11/30 08:10:30");
    assert_eq!(detail(ep, "end"), "2026/11/30 08:10:36");
    assert_eq!(detail(ep, "duration_s"), 6);
    assert_eq!(detail(ep, "lines"), 21);
    assert_eq!(detail(ep, "upstream"), "be");
    assert_eq!(detail(ep, "host"), "app.example.com");
    assert!(ep.consequence.contains("3,005"));
}

#[test]
fn nxdomain_outage_counts_client_502s_from_the_access_log() {
    let f = run(&["nxdomain.log"], &["access.log"]);
    assert_eq!(detail(&f[0], "client_502"), 35);
    assert!(f[0].consequence.contains("35 client-visible 502(s)"));
}

#[test]
fn nxdomain_without_no_live_is_not_an_outage() {
    let f = run(&["nxdomain-no-outage.log"], &[]);
    assert_eq!(rules(&f), ["nxdomain-no-outage"]);
    assert_eq!(detail(&f[0], "host"), "dc1.example.com");
}

#[test]
fn max_fails_amplification_after_connect_failures_without_dns_error() {
    let f = run(&["max-fails.log"], &[]);
    assert_eq!(rules(&f), ["max-fails-amplification"]);
    assert_eq!(detail(&f[0], "duration_s"), 10);
    assert_eq!(detail(&f[0], "peer_failures"), 2);
    assert!(f[0].consequence.contains("10.4 s"));
}

#[test]
fn no_live_without_failures_is_not_called_max_fails() {
    let f = run(&["no-live-unexplained.log"], &[]);
    assert_eq!(rules(&f), ["no-live-upstreams"]);
}

#[test]
fn unrelated_and_client_side_lines_give_no_episode() {
    let f = run(&["quiet.log"], &[]);
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn zone_memory_exhausted_names_the_upstream() {
    let f = run(&["zone-memory.log"], &[]);
    assert_eq!(rules(&f), ["zone-memory-exhausted"]);
    assert_eq!(detail(&f[0], "upstream"), "be");
    assert_eq!(detail(&f[0], "lines"), 2);
}

#[test]
fn dns_timeouts_alone_are_harmless_info() {
    let f = run(&["dns-timeout.log"], &[]);
    assert_eq!(rules(&f), ["dns-timeout-harmless"]);
    assert_eq!(f[0].severity, Severity::Info);
    assert_eq!(detail(&f[0], "lines"), 3);
    // An NXDOMAIN is not harmless.
    let f = run(&["nxdomain.log"], &[]);
    assert!(!rules(&f).contains(&"dns-timeout-harmless"));
}

#[test]
fn keepalive_race_groups_premature_closes_read_resets_and_write_failures() {
    let f = run(&["keepalive-race.log"], &[]);
    assert_eq!(rules(&f), ["keepalive-race"]);
    assert_eq!(detail(&f[0], "lines"), 3);
    assert_eq!(detail(&f[0], "upstream"), "10.0.0.7:3000");
}

#[test]
fn several_logs_give_episodes_in_time_order() {
    let f = run(
        &["keepalive-race.log", "nxdomain.log", "max-fails.log"],
        &[],
    );
    assert_eq!(
        rules(&f),
        [
            "nxdomain-outage",
            "max-fails-amplification",
            "keepalive-race"
        ]
    );
}

#[test]
fn gzip_logs_give_the_same_episodes() {
    let dir = TempDir::new("gz");
    let gz = dir.0.join("error.log.1.gz");
    let plain = std::fs::read(fixture("nxdomain.log")).unwrap();
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::fast(),
    );
    enc.write_all(&plain).unwrap();
    enc.finish().unwrap();
    let f = analyze(&[gz.as_path()], &[]).unwrap();
    let mut want = run(&["nxdomain.log"], &[]);
    want[0].location.file = gz.display().to_string();
    assert_eq!(f, want);
}

#[test]
fn missing_and_corrupt_logs_are_errors_naming_file_and_line() {
    let missing = fixture("does-not-exist.log");
    let e = analyze(&[missing.as_path()], &[]).unwrap_err();
    assert!(matches!(e, LogError::Open { .. }));
    assert!(e.to_string().contains("does-not-exist.log"), "{e}");

    let dir = TempDir::new("corrupt");
    let bad = dir.0.join("error.log.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&std::fs::read(fixture("nxdomain.log")).unwrap())
        .unwrap();
    let mut bytes = enc.finish().unwrap();
    let mid = bytes.len() / 2;
    bytes.truncate(mid);
    std::fs::write(&bad, &bytes).unwrap();
    let e = analyze(&[bad.as_path()], &[]).unwrap_err();
    let LogError::Read { file, source } = &e else {
        panic!("{e:?}")
    };
    assert!(file.ends_with("error.log.gz"));
    assert!(
        e.to_string()
            .contains(&format!("after line {}", source.line)),
        "{e}"
    );
}

#[test]
fn truncated_and_garbled_lines_never_panic() {
    // Every prefix of every fixture line, fed as a line of its own.
    let mut a = upkeep_doctor::logs::Analyzer::new();
    for name in [
        "nxdomain.log",
        "max-fails.log",
        "keepalive-race.log",
        "zone-memory.log",
        "dns-timeout.log",
    ] {
        let text = std::fs::read(fixture(name)).unwrap();
        for (no, line) in text.split(|&b| b == b'\n').enumerate() {
            for end in 0..=line.len() {
                a.line("t.log", no as u64 + 1, &line[..end]);
            }
        }
    }
    let _ = a.finish();
    for end in 0..=200 {
        let line = br#"127.0.0.1 - - [30/Nov/2026:08:10:38 +0000] "GET /a HTTP/1.1" 502 157 "-" "vegeta" "502, 502""#;
        let _ = upkeep_doctor::logs::access::parse_access(&line[..end.min(line.len())]);
    }
}

#[test]
fn resets_followed_by_temporarily_disabled_are_max_fails_not_a_keepalive_race() {
    let f = run(&["reset-disabled.log"], &[]);
    assert_eq!(rules(&f), ["max-fails-amplification"], "{f:#?}");
    let ep = &f[0];
    assert_eq!(ep.location.line, Some(6));
    assert_eq!(detail(ep, "upstream"), "backend");
    assert_eq!(detail(ep, "peer_failures"), 2);
    assert_eq!(detail(ep, "disabled_lines"), 2);
    assert_eq!(detail(ep, "duration_s"), 10);
    assert_eq!(detail(ep, "peer"), "10.0.0.5:8080");
    assert!(ep.problem.contains("connection reset"), "{}", ep.problem);
    assert!(
        ep.fix.contains("server 10.0.0.5:8080 max_fails=0;"),
        "{}",
        ep.fix
    );
    assert!(!ep.fix.contains("resolve "), "{}", ep.fix);
    assert!(
        ep.consequence
            .contains("docs/incidents.md#single-peer-guard"),
        "{}",
        ep.consequence
    );
}

#[test]
fn a_backend_down_through_the_whole_span_is_upstream_down_not_amplification() {
    let f = run(&["long-outage.log"], &[]);
    assert_eq!(rules(&f), ["upstream-down"], "{f:#?}");
    let ep = &f[0];
    assert_eq!(ep.severity, Severity::Error);
    assert_eq!(detail(ep, "duration_s"), 20);
    assert_eq!(detail(ep, "peer_failures"), 2);
    assert_eq!(detail(ep, "failures_during"), 4);
    assert!(ep.problem.contains("connection refused"), "{}", ep.problem);
    for text in [&ep.problem, &ep.consequence, &ep.fix] {
        assert!(!text.contains("blip"), "{text}");
        assert!(!text.contains("resolve"), "{text}");
    }
}

#[test]
fn client_502s_are_counted_for_the_episodes_own_location_only() {
    let f = run(&["two-locations.log"], &["two-locations.access.log"]);
    assert_eq!(rules(&f), ["max-fails-amplification"], "{f:#?}");
    // Six 502s under /api in the span; three /media 502s of another location and one
    // /api 502 after the span are not this episode's.
    assert_eq!(detail(&f[0], "client_502"), 6);
    assert_eq!(detail(&f[0], "locations"), &serde_json::json!(["/api"]));
    assert!(
        f[0].consequence
            .contains("6 client-visible 502(s) in this span under /api"),
        "{}",
        f[0].consequence
    );
}

#[test]
fn nxdomain_without_outage_never_claims_other_peers_carried_502s() {
    let f = run(&["nxdomain-no-outage.log"], &["nxdomain-502.access.log"]);
    assert_eq!(rules(&f), ["nxdomain-no-outage"]);
    assert_eq!(detail(&f[0], "client_502"), 2);
    assert!(!f[0].problem.contains("carried"), "{}", f[0].problem);
    assert!(
        f[0].problem.contains("2 client request(s) got a 502"),
        "{}",
        f[0].problem
    );
    // Without an access log nothing is claimed either way; with one and no 502, it is.
    let f = run(&["nxdomain-no-outage.log"], &[]);
    assert!(!f[0].problem.contains("carried"), "{}", f[0].problem);
    let f = run(&["nxdomain-no-outage.log"], &["two-locations.access.log"]);
    assert_eq!(detail(&f[0], "client_502"), 0);
    assert!(
        f[0].problem.contains("other peers carried the traffic"),
        "{}",
        f[0].problem
    );
}
