//! Every catalog scenario against upkeep (0 errors where a healthy path exists), and the rig's
//! own check: nginx's row of the one-host RST scenario must show errors.
//!
//! Runs at a reduced rate so the whole file stays within a few minutes on two cores, and
//! several runs at a time, each on a loopback net of its own (127.N.0.0/16).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use upkeep_lab::catalog::CATALOG;
use upkeep_lab::report::RunReport;
use upkeep_lab::scenario::run::{run_one, RunOptions};
use upkeep_lab::scenario::Scenario;
use upkeep_lab::target::{Binaries, TargetKind};

/// Requests per second in CI (the catalog's default is 200).
const CI_RATE: f64 = 100.0;

fn scenario(name: &str) -> Scenario {
    let file = format!("{name}.toml");
    let (_, text) = CATALOG
        .iter()
        .find(|(f, _)| *f == file)
        .unwrap_or_else(|| panic!("{file} is not in the catalog"));
    Scenario::parse(text, &file).unwrap()
}

/// The next run's loopback net: every run of this process gets a net of its own, so runs in
/// parallel share no backend, listener, DNS or API server address.
static NEXT_NET: AtomicU8 = AtomicU8::new(1);

fn options() -> RunOptions {
    let mut bins = Binaries::discover(None, None);
    bins.upkeep = Some(PathBuf::from(env!("CARGO_BIN_EXE_upkeep")));
    let net = NEXT_NET.fetch_add(1, Ordering::Relaxed);
    assert!(net < 255, "more runs than loopback nets");
    RunOptions {
        bins,
        out_dir: None,
        rate: Some(CI_RATE),
        progress: false,
        loopback_net: Some(net),
    }
}

/// A few scenarios at a time (the test harness runs as many tests as there are cores): at
/// 100 req/s a run keeps a core far from busy, but more debug-built proxies under load than
/// that would turn CPU starvation into per-try timeouts and blame the proxy for it.
static RUNS_AT_ONCE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(3);

async fn run(name: &str, kind: TargetKind) -> RunReport {
    run_scenario(scenario(name), kind).await
}

async fn run_scenario(s: Scenario, kind: TargetKind) -> RunReport {
    let _turn = RUNS_AT_ONCE.acquire().await.expect("never closed");
    let report = run_one(&s, kind, &options()).await;
    eprintln!(
        "{}",
        upkeep_lab::report::table(std::slice::from_ref(&report))
    );
    report
}

async fn assert_upkeep_clean(name: &str) {
    assert_clean(name, run(name, TargetKind::Upkeep).await);
}

/// A copy of the catalog scenario whose long fault lasts only `fault_for` (the load runs 2 s
/// before it and 2 s after), for the faults the catalog holds for tens of seconds.
fn shortened(name: &str, fault_for: Duration) -> Scenario {
    let mut s = scenario(name);
    for f in &mut s.faults {
        f.at = Some(Duration::from_secs(2));
        if f.lasts.is_some() {
            f.lasts = Some(fault_for);
        }
    }
    s.duration = fault_for + Duration::from_secs(4);
    s
}

fn assert_clean(name: &str, r: RunReport) {
    assert!(!r.skipped, "upkeep did not run {name}: {:?}", r.skip_reason);
    assert!(r.requests > 0, "{name}: no requests were sent");
    assert!(
        r.healthy_path,
        "{name} has no healthy path; assert something else"
    );
    assert_eq!(
        r.errors, 0,
        "{name}: upkeep had errors: {:?} by status {:?}",
        r.errors_by_cause, r.errors_by_status
    );
    assert_eq!(r.probe_restarts.unwrap_or(0), 0, "{name}: restarts");
    assert_eq!(r.probe_traffic_cuts.unwrap_or(0), 0, "{name}: traffic cuts");
}

macro_rules! upkeep_has_no_errors {
    ($($(#[$meta:meta])* $test:ident => $name:literal),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $(#[$meta])*
        async fn $test() {
            assert_upkeep_clean($name).await;
        }
    )*};
}

upkeep_has_no_errors! {
    upkeep_has_no_errors_when_dns_alternates_per_query => "dns-alternate",
    upkeep_has_no_errors_through_6s_of_nxdomain => "dns-nxdomain-6s",
    upkeep_has_no_errors_through_6s_of_nodata => "dns-nodata-6s",
    upkeep_has_no_errors_through_10s_of_servfail => "dns-servfail-10s",
    upkeep_has_no_errors_through_10s_of_dns_silence => "dns-silent-10s",
    upkeep_has_no_errors_with_two_names_for_one_host_and_2s_of_rst => "two-lines-one-host-rst",
    upkeep_has_no_errors_with_one_host_and_2s_of_rst => "one-host-rst",
    upkeep_has_no_errors_when_one_of_two_dcs_refuses_for_5s => "two-dc-one-refusing-5s",
    upkeep_has_no_errors_when_one_dc_is_blackholed => "one-dc-blackholed",
    upkeep_has_no_errors_in_the_keepalive_race_with_get => "keepalive-race-get",
    upkeep_has_no_errors_in_the_keepalive_race_with_post => "keepalive-race-post",
    upkeep_has_no_restarts_or_cuts_while_an_optional_group_is_down => "probe-cascade",
    upkeep_cuts_no_request_when_drained_with_sigterm => "drain",
    upkeep_has_no_errors_when_a_reload_changes_a_timeout_while_dns_is_silent => "reload-under-dns-failure",
    upkeep_has_no_errors_through_a_rolling_update_seen_in_endpointslices => "k8s-rolling-update",
    upkeep_has_no_errors_when_the_watch_is_cut_and_relisted_after_410 => "k8s-watch-gone",
}

/// A binary upgrade under load refuses no connection; the run follows the new process (its
/// fault line names both pids) and stops it at the end: none outlives the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upkeep_refuses_no_connection_across_a_binary_upgrade() {
    let r = run("upgrade", TargetKind::Upkeep).await;
    let label = r
        .faults
        .iter()
        .map(|f| f.label.clone())
        .find(|l| l.starts_with("upgrade:"))
        .unwrap_or_else(|| panic!("the run recorded no upgrade step: {:?}", r.faults));
    let new: u32 = label
        .rsplit_once("-> ")
        .and_then(|(_, p)| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("the run did not follow the new process: {label}"));
    assert_clean("upgrade", r);
    // Gone, or a zombie its new parent has not reaped yet.
    let running = std::fs::read_to_string(format!("/proc/{new}/stat")).is_ok_and(|st| {
        st.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    });
    assert!(!running, "the upgraded process {new} outlived the run");
}

macro_rules! upkeep_has_no_errors_shortened {
    ($($test:ident => $name:literal for $secs:literal s),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let s = shortened($name, Duration::from_secs($secs));
            assert_clean($name, run_scenario(s, TargetKind::Upkeep).await);
        }
    )*};
}

upkeep_has_no_errors_shortened! {
    upkeep_has_no_errors_while_the_api_server_is_down => "k8s-api-down-30s" for 6 s,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_and_haproxy_rows_of_endpointslice_scenarios_are_skipped_with_the_reason() {
    for kind in [TargetKind::Nginx, TargetKind::Haproxy] {
        let r = run("k8s-watch-gone", kind).await;
        assert!(r.skipped, "{} ran an EndpointSlice scenario", kind.name());
        let reason = r.skip_reason.unwrap_or_default();
        assert!(
            reason.contains("cannot read EndpointSlices"),
            "{}: {reason}",
            kind.name()
        );
    }
}

#[test]
fn every_catalog_scenario_has_a_test_here() {
    let here = include_str!("lab_scenarios.rs");
    for (file, _) in CATALOG {
        let name = file.trim_end_matches(".toml");
        assert!(
            here.contains(&format!("=> \"{name}\"")) || here.contains(&format!("run(\"{name}\"")),
            "{name} has no test"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rig_sees_nginx_fail_during_one_host_rst() {
    if Binaries::discover(None, None).nginx.is_none() {
        // .ci/run installs nginx; there a missing nginx is a failure, not a skip.
        assert!(
            std::env::var_os("CI").is_none(),
            "nginx is installed by .ci/run"
        );
        eprintln!("skipped: nginx is not installed (the CI installs Debian's package)");
        return;
    }
    let r = run("one-host-rst", TargetKind::Nginx).await;
    assert!(!r.skipped, "nginx did not run: {:?}", r.skip_reason);
    assert!(
        r.errors > 0,
        "the rig saw no nginx error while its only backend refused"
    );
    assert!(
        r.errors_by_cause
            .keys()
            .any(|k| k.contains("during dc1 refuse")),
        "errors not put down to the fault: {:?}",
        r.errors_by_cause
    );
}

/// nginx in the foreground ignores USR2 ("the changing binary signal is ignored"), so the
/// `upgrade` scenario reports its row skipped with that reason rather than a row that did
/// not upgrade anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_scenario_reports_why_nginx_cannot_run_it() {
    if Binaries::discover(None, None).nginx.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "nginx is installed by .ci/run"
        );
        eprintln!("skipped: nginx is not installed (the CI installs Debian's package)");
        return;
    }
    let r = run("upgrade", TargetKind::Nginx).await;
    assert!(r.skipped, "nginx must not get a row that upgraded nothing");
    let why = r.skip_reason.unwrap_or_default();
    assert!(why.contains("ignores USR2"), "{why}");
}
