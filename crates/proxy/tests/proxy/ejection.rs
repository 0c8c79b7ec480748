//! Ejection backoff on the wire: a data centre that blips now and then and is back in
//! between is never kept out by its own history of blips while the other one stalls
//! (bench/soak.sh's fault cycle, scaled down).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::Method;
use tokio::net::TcpListener;
use upkeep_test_support::load::open_loop;
use upkeep_test_support::{free_port, get, TestBackend};

use crate::support::{self, metric, upkeep};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The state `/upstreams` shows for the peer at `addr` of group `app`.
async fn peer_state(admin: SocketAddr, addr: SocketAddr) -> String {
    let v: serde_json::Value =
        serde_json::from_str(&get(admin, "a", "/upstreams").await.text()).unwrap();
    v["groups"]["app"]["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["addr"] == addr.to_string())
        .map(|p| p["state"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no peer {addr} in {v}"))
}

/// Stalls `backend` for `time`: its address accepts connections and never answers. Then
/// it serves again, while the stalled connections stay open until upkeep's per-try timeout
/// gives up on them (closing them all at once would reset every stalled request together,
/// a burst of retries that the retry budget is there to refuse).
async fn stall(backend: &TestBackend, time: Duration) -> tokio::task::JoinHandle<()> {
    backend.refuse();
    let l = loop {
        match TcpListener::bind(backend.addr()).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    };
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        let until = tokio::time::Instant::now() + time;
        while let Ok(Ok((s, _))) = tokio::time::timeout_at(until, l.accept()).await {
            held.push(s);
        }
        drop(l);
        tokio::time::sleep(Duration::from_secs(1)).await;
    });
    tokio::time::sleep(time).await;
    backend.resume().await;
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_rst_blips_never_keep_a_recovered_dc_ejected_while_the_other_stalls() {
    let port = free_port();
    let dc1 = TestBackend::start_on(SocketAddr::new(ip("127.0.0.2"), port), "dc1").await;
    let dc2 = TestBackend::start_on(SocketAddr::new(ip("127.0.0.3"), port), "dc2").await;
    // Scaled from the soak's 2 s / 30 s: ejections of 100 ms doubling up to 6.4 s.
    let up = upkeep(&support::one_group(
        &[dc1.addr(), dc2.addr()],
        "try_timeout = \"300ms\"\n[groups.app.health]\nbase_ejection = \"100ms\"\nmax_ejection = \"6400ms\"",
    ))
    .await;
    let target = up.listeners[0];
    let load = tokio::spawn(open_loop(
        target,
        Method::GET,
        "/",
        100,
        Duration::from_millis(8_500),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut seen_during_stalls = Vec::new();
    // Five cycles of 1.6 s: dc1 refuses connections for 200 ms (RST blip), is back for 400
    // ms, then dc2 stalls for 600 ms while dc1 must carry everything. A backoff that only
    // grows would eject dc1 for 100 ms, 200, 400, 800, 1600 ms ... and from the third cycle
    // on dc1 would still be out when dc2 stalls.
    for _ in 0..5 {
        dc1.refuse();
        tokio::time::sleep(Duration::from_millis(200)).await;
        dc1.resume().await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        seen_during_stalls.push(peer_state(up.admin, dc1.addr()).await);
        stall(&dc2, Duration::from_millis(600)).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let run = load.await.unwrap();
    assert!(
        seen_during_stalls.iter().all(|s| s == "healthy"),
        "dc1 was kept out while dc2 stalled: {seen_during_stalls:?}"
    );
    // There was always a healthy path: dc2 during dc1's blips, dc1 during dc2's stalls.
    assert!(run.errors().is_empty(), "{}", run.summary());
    // Both faults were seen and acted on (dc1's blips and dc2's stalls eject).
    assert!(metric(&up, "upkeep_peer_ejections_total").await >= 10.0);
}
