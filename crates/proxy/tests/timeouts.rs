//! Slow clients and slow upstreams are bounded.

mod support;

use std::time::{Duration, Instant};

use support::{one_group, upkeep};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use upkeep_test_support::{get, TestBackend};

fn with_listener_settings(cfg: String, settings: &str) -> String {
    cfg.replacen(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n",
        &format!("[[listener]]\nlisten = \"127.0.0.1:0\"\n{settings}\n"),
        1,
    )
}

/// Reads until EOF or `limit`; returns when the server closed, if it did.
async fn closed_after(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(limit.saturating_sub(start.elapsed()), s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn a_request_head_trickled_slowly_is_cut_at_the_header_read_timeout() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&with_listener_settings(
        one_group(&[b.addr()], ""),
        "header_read_timeout = \"300ms\"",
    ))
    .await;
    let mut s = TcpStream::connect(up.listeners[0]).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").await.unwrap();
    let closed = closed_after(&mut s, Duration::from_secs(3)).await;
    let t = closed.expect("a slowloris head must be cut");
    assert!(
        t >= Duration::from_millis(250) && t < Duration::from_millis(1500),
        "closed after {t:?}"
    );
    assert!(b.seen().is_empty());
}

#[tokio::test]
async fn an_idle_keepalive_connection_is_closed_after_the_idle_timeout_not_before() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&with_listener_settings(
        one_group(&[b.addr()], ""),
        "idle_timeout = \"600ms\"\nheader_read_timeout = \"5s\"",
    ))
    .await;
    let mut s = TcpStream::connect(up.listeners[0]).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
    assert!(
        head.contains("keep-alive: timeout=0"),
        "the idle timeout is announced (whole seconds): {head}"
    );
    let closed = closed_after(&mut s, Duration::from_secs(5))
        .await
        .expect("idle connection closed");
    assert!(
        closed >= Duration::from_millis(500),
        "closed too early: {closed:?}"
    );
    assert!(
        closed < Duration::from_millis(2000),
        "closed too late: {closed:?}"
    );
}

#[tokio::test]
async fn a_slow_upstream_gets_504_upstream_timeout_at_the_try_timeout() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[b.addr()], "try_timeout = \"300ms\"")).await;
    let start = Instant::now();
    let r = get(up.listeners[0], "x", "/sleep/3000").await;
    assert_eq!(r.status, 504);
    assert_eq!(r.header("upkeep-error"), Some("upstream_timeout"));
    assert!(start.elapsed() < Duration::from_millis(2000));
    // One peer: the timed-out GET has no other peer to go to, so one attempt reached it.
    assert_eq!(b.seen().len(), 1);
}
