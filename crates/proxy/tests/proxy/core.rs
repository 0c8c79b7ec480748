//! Routing, header rewriting, pooling and probes, end to end over loopback.

use std::time::Duration;

use upkeep_test_support::{get, TestBackend};

use crate::support::{metric, metric_becomes, one_group, upkeep};

#[tokio::test]
async fn routes_by_host_and_longest_prefix_and_refuses_unrouted_with_no_route() {
    let (a, b, c) = (
        TestBackend::start("a").await,
        TestBackend::start("b").await,
        TestBackend::start("c").await,
    );
    let cfg = format!(
        r#"
[admin]
listen = "127.0.0.1:0"
[[listener]]
listen = "127.0.0.1:0"
[[route]]
host = "*.example.test"
group = "a"
[[route]]
host = "api.example.test"
path = "/v2"
group = "b"
[[route]]
host = "plain.test"
path = "/"
group = "c"
[groups.a]
endpoints = ["{}"]
[groups.b]
endpoints = ["{}"]
[groups.c]
endpoints = ["{}"]
"#,
        a.addr(),
        b.addr(),
        c.addr()
    );
    let up = upkeep(&cfg).await;
    let l = up.listeners[0];
    assert_eq!(get(l, "www.example.test", "/x").await.text(), "a /x\n");
    assert_eq!(
        get(l, "api.example.test", "/v2/items?q=1").await.text(),
        "b /v2/items?q=1\n"
    );
    assert_eq!(get(l, "api.example.test", "/v1").await.text(), "a /v1\n");
    assert_eq!(get(l, "PLAIN.test:8080", "/").await.text(), "c /\n");
    let r = get(l, "other.test", "/").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.header("upkeep-error"), Some("no_route"));
    assert_eq!(a.seen().len() + b.seen().len() + c.seen().len(), 4);
}

#[tokio::test]
async fn hop_by_hop_headers_are_stripped_and_forwarding_headers_appended() {
    let b = TestBackend::start("b").await;
    // The client is a trusted proxy here, so its X-Forwarded-For is appended to.
    let cfg = one_group(&[b.addr()], "").replacen(
        "listen = \"127.0.0.1:0\"\n\n[[route]]",
        "listen = \"127.0.0.1:0\"\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n[[route]]",
        1,
    );
    let up = upkeep(&cfg).await;
    let raw = "GET /h HTTP/1.1\r\nHost: svc.test\r\nConnection: keep-alive, X-Private\r\nX-Private: secret\r\nKeep-Alive: timeout=9\r\nTE: trailers\r\nProxy-Authorization: Basic x\r\nUpgrade: websocket\r\nX-Forwarded-For: 10.1.1.1\r\nX-Kept: yes\r\n\r\n";
    let resp = upkeep_test_support::raw_exchange(
        up.listeners[0],
        raw.as_bytes(),
        Duration::from_millis(500),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let seen = b.seen();
    let h = &seen[0].headers;
    for gone in ["x-private", "keep-alive", "proxy-authorization", "upgrade"] {
        assert!(!h.contains_key(gone), "{gone} reached the upstream: {h:?}");
    }
    // The upstream connection's own Connection header is upkeep's, not the client's list.
    assert!(h.get("connection").is_none_or(|v| !v
        .to_str()
        .unwrap()
        .to_ascii_lowercase()
        .contains("x-private")));
    assert_eq!(h["x-kept"], "yes");
    // The client takes trailers: said again upstream (docs/protocols.md, trailers).
    assert_eq!(h["te"], "trailers");
    assert_eq!(h["host"], "svc.test");
    assert_eq!(h["x-forwarded-for"], "10.1.1.1, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-host"], "svc.test");
    // Downstream: the long idle timeout is announced so clients close first.
    assert!(
        resp.to_ascii_lowercase()
            .contains("keep-alive: timeout=620"),
        "{resp}"
    );
}

#[tokio::test]
async fn upstream_connections_are_reused_and_counted_in_metrics() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[b.addr()], "")).await;
    for _ in 0..10 {
        assert_eq!(get(up.listeners[0], "x", "/").await.status, 200);
    }
    assert_eq!(
        b.connections(),
        1,
        "ten sequential requests should share one upstream connection"
    );
    assert_eq!(
        metric(&up, "upkeep_pool_connections_total{event=\"new\"}").await,
        1.0
    );
    assert_eq!(
        metric(&up, "upkeep_pool_connections_total{event=\"reused\"}").await,
        9.0
    );
    // The one connection went back to the pool after the last response (checked in as its
    // body ended, which may be just after the client has it): one idle connection, counted
    // down at each of the nine check-outs and up at each of the ten check-ins.
    metric_becomes(&up, "upkeep_pool_idle_connections ", 1.0).await;
    assert!(
        metric(
            &up,
            "upkeep_responses_total{origin=\"upstream\",class=\"2xx\""
        )
        .await
            >= 10.0
    );
}

#[tokio::test]
async fn probes_answer_and_verbose_lists_each_check() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[b.addr()], "")).await;
    let r = get(up.admin, "admin", "/livez").await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "ok\n".to_owned()));
    let r = get(up.admin, "admin", "/readyz?verbose").await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("[+]group:app ok"), "{}", r.text());
    assert!(r.text().contains("readyz check passed"), "{}", r.text());
    let r = get(up.admin, "admin", "/startupz?verbose").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(up.admin, "admin", "/upstreams").await;
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["groups"]["app"]["peers"][0]["state"], "healthy");
}

#[tokio::test]
async fn connect_failure_is_a_502_with_its_cause() {
    // A port that was bound and released: connects get RST.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let up = upkeep(&one_group(
        &[dead],
        "[groups.app.retry]\nconnect_retry_window = \"0\"",
    ))
    .await;
    let r = get(up.listeners[0], "x", "/").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.header("upkeep-error"), Some("connect_failed"));
}
