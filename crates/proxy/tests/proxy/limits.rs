//! Resource limits: connections per listener, connections per peer.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use upkeep_test_support::{get, raw_exchange, TestBackend};

use crate::support::{metric, one_group, upkeep, upkeep_listener};

#[tokio::test]
async fn over_max_connections_http1_gets_503_overloaded_and_h2_a_goaway() {
    let b = TestBackend::start("b").await;
    let up = upkeep_listener(
        b.addr(),
        "max_connections = 2\nheader_read_timeout = \"5s\"",
    )
    .await;
    let addr = up.listeners[0];
    // Two connections hold the listener's whole allowance.
    let held1 = TcpStream::connect(addr).await.unwrap();
    let held2 = TcpStream::connect(addr).await.unwrap();
    let start = Instant::now();
    while metric(&up, "upkeep_downstream_connections_open").await < 2.0 {
        assert!(start.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let text = raw_exchange(
        addr,
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("upkeep-error: overloaded"), "{text}");

    let mut h2 = TcpStream::connect(addr).await.unwrap();
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let mut frames = Vec::new();
    let mut buf = [0u8; 256];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(3), h2.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        frames.extend_from_slice(&buf[..n]);
    }
    assert!(frames.len() >= 9 + 17, "{frames:?}");
    assert_eq!(frames[3], 0x4, "the server preface (SETTINGS) comes first");
    let goaway = &frames[9..];
    assert_eq!(goaway[3], 0x7, "then a GOAWAY: {frames:?}");
    assert_eq!(&goaway[9..13], &[0, 0, 0, 0], "no stream was processed");

    assert_eq!(
        metric(&up, "upkeep_downstream_connections_refused_total").await,
        2.0
    );
    assert_eq!(
        metric(
            &up,
            "upkeep_responses_total{origin=\"proxy\",class=\"5xx\",cause=\"overloaded\"}"
        )
        .await,
        1.0
    );
    assert!(
        b.seen().is_empty(),
        "nothing over the limit reached a backend"
    );

    // A freed slot is usable again.
    drop(held1);
    let start = Instant::now();
    loop {
        let r = get(addr, "a", "/again").await;
        if r.status == 200 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", r.status);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(held2);
}

#[tokio::test]
async fn a_peer_at_max_connections_per_peer_is_passed_over_for_another() {
    let (a, b) = (TestBackend::start("a").await, TestBackend::start("b").await);
    let up = upkeep(&one_group(
        &[a.addr(), b.addr()],
        "[groups.app.pool]\nmax_connections_per_peer = 1",
    ))
    .await;
    let addr = up.listeners[0];
    // Round robin: the slow request holds a's only connection, the next goes to b, and the
    // third, whose turn is a's, goes to b's pooled connection instead of opening a second on a.
    let slow = tokio::spawn(async move { get(addr, "x", "/sleep/800").await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(get(addr, "x", "/second").await.status, 200);
    let third = get(addr, "x", "/third").await;
    assert_eq!(third.status, 200);
    assert_eq!(slow.await.unwrap().status, 200);
    let paths = |t: &TestBackend| t.seen().iter().map(|s| s.path.clone()).collect::<Vec<_>>();
    assert_eq!(paths(&a), vec!["/sleep/800"]);
    assert_eq!(paths(&b), vec!["/second", "/third"]);
    assert_eq!(a.connections(), 1, "a never had a second connection");
    assert_eq!(metric(&up, "upkeep_peer_ejections_total").await, 0.0);
}

#[tokio::test]
async fn with_every_peer_at_max_connections_per_peer_a_request_gets_503_overloaded() {
    let a = TestBackend::start("a").await;
    let up = upkeep(&one_group(
        &[a.addr()],
        "[groups.app.pool]\nmax_connections_per_peer = 1",
    ))
    .await;
    let addr = up.listeners[0];
    let slow = tokio::spawn(async move { get(addr, "x", "/sleep/600").await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let r = get(addr, "x", "/over").await;
    assert_eq!(r.status, 503);
    assert_eq!(
        r.header("upkeep-error"),
        Some("overloaded; reason=max_connections_per_peer")
    );
    assert_eq!(slow.await.unwrap().status, 200);
    assert_eq!(metric(&up, "upkeep_peer_ejections_total").await, 0.0);
    assert_eq!(get(addr, "x", "/after").await.status, 200);
}
