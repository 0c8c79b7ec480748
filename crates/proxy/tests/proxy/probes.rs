//! Readiness follows required groups only; optional groups degrade visibly; active checks
//! take a failing peer out and bring it back.

use std::time::Duration;

use upkeep_test_support::fakedns::{FakeDns, Mode, Zone};
use upkeep_test_support::{get, TestBackend};

use crate::support::{self, metric, upkeep};

async fn two_groups(
    search_required: bool,
) -> (upkeep_proxy::server::Running, TestBackend, FakeDns) {
    let core = TestBackend::start("core").await;
    // The search name never resolves: the optional dependency is down from the start.
    let dns = FakeDns::start(
        "127.0.0.1:0".parse().unwrap(),
        Zone::new().with("search.upkeep.test", Mode::NxDomain, 1),
    )
    .await
    .unwrap();
    let cfg = format!(
        r#"
[admin]
listen = "127.0.0.1:0"
[dns]
servers = ["{dns}"]
timeout = "300ms"
[[listener]]
listen = "127.0.0.1:0"
[[route]]
path = "/search"
group = "search"
[[route]]
group = "core"
[groups.core]
endpoints = ["{core}"]
[groups.search]
required = {search_required}
endpoints = ["search.upkeep.test:9200"]
degraded_alert_after = "1s"
"#,
        dns = dns.local_addr(),
        core = core.addr()
    );
    (upkeep(&cfg).await, core, dns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optional_group_down_is_degraded_and_never_fails_readiness() {
    let (up, _core, _dns) = two_groups(false).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = get(up.admin, "a", "/readyz?verbose").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text()
            .contains("[+]group:search ok: degraded, optional: no_peers (never_resolved)"),
        "{}",
        r.text()
    );
    let r = get(up.listeners[0], "x", "/search?q=1").await;
    assert_eq!(r.status, 503);
    assert_eq!(
        r.header("upkeep-error"),
        Some("no_peers; reason=never_resolved")
    );
    assert_eq!(get(up.listeners[0], "x", "/").await.status, 200);
    assert_eq!(
        metric(&up, "upkeep_group_degraded{group=\"search\"}").await,
        1.0
    );
    // Degraded longer than degraded_alert_after (1 s): the alert gauge is set by the monitor's
    // next one-second tick, so within about 2 s of the degradation; allow a loaded machine 6 s.
    let alert = "upkeep_group_degraded_alert{group=\"search\"}";
    let until = tokio::time::Instant::now() + Duration::from_secs(6);
    while metric(&up, alert).await != 1.0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(&up, alert).await, 1.0);
    assert_eq!(
        metric(&up, "upkeep_group_degraded{group=\"core\"}").await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_group_without_peers_fails_readiness_with_its_reason() {
    let (up, _core, _dns) = two_groups(true).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = get(up.admin, "a", "/readyz").await;
    assert_eq!(r.status, 503);
    assert!(
        r.text()
            .contains("[-]group:search failed: no_peers (never_resolved)"),
        "{}",
        r.text()
    );
    // Liveness does not care.
    assert_eq!(get(up.admin, "a", "/livez").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_waits_for_the_first_lookup_of_every_name() {
    // A silent DNS: the first lookup of the name is still pending (timeout 300 ms, then backoff).
    let dns = FakeDns::start(
        "127.0.0.1:0".parse().unwrap(),
        Zone::new().with("slow.upkeep.test", Mode::Silent, 1),
    )
    .await
    .unwrap();
    let cfg = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n[dns]\nservers = [\"{}\"]\ntimeout = \"2s\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n[[route]]\ngroup = \"g\"\n[groups.g]\nendpoints = [\"slow.upkeep.test:80\"]\n",
        dns.local_addr()
    );
    let up = upkeep(&cfg).await;
    let r = get(up.admin, "a", "/startupz?verbose").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.text()
            .contains("[-]discovery failed: first lookups pending"),
        "{}",
        r.text()
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let r = get(up.admin, "a", "/startupz?verbose").await;
    assert_eq!(
        r.status,
        200,
        "after the first (timed out) lookup: {}",
        r.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_checks_take_a_failing_peer_out_and_bring_it_back() {
    let (a, b) = (TestBackend::start("a").await, TestBackend::start("b").await);
    let cfg = support::one_group(
        &[a.addr(), b.addr()],
        "[groups.app.health.active]\npath = \"/status/200\"\ninterval = \"100ms\"\ntimeout = \"200ms\"\nrise = 1\nfall = 2",
    );
    let up = upkeep(&cfg).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.refuse();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let view: serde_json::Value =
        serde_json::from_slice(&get(up.admin, "a", "/upstreams").await.body).unwrap();
    let states: Vec<_> = view["groups"]["app"]["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["addr"].as_str().unwrap().to_owned(),
                p["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        states.contains(&(a.addr().to_string(), "down".into())),
        "{states:?}"
    );
    for _ in 0..5 {
        assert_eq!(
            get(up.listeners[0], "x", "/").await.text(),
            "b /\n",
            "a down peer gets no traffic"
        );
    }
    a.resume().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let view: serde_json::Value =
        serde_json::from_slice(&get(up.admin, "a", "/upstreams").await.body).unwrap();
    assert!(
        view["groups"]["app"]["peers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["state"] == "healthy"),
        "{view}"
    );
}
