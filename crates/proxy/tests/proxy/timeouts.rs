//! Slow clients and slow upstreams are bounded.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::StreamBody;
use hyper::body::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use upkeep_proxy::access_log::AccessLogger;
use upkeep_proxy::server::start_with;
use upkeep_test_support::{get, send, TestBackend};

use crate::support::{
    metric, metric_becomes, one_group, upkeep, upkeep_listener, with_listener_settings,
};

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
    let up = upkeep_listener(b.addr(), "header_read_timeout = \"300ms\"").await;
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
    let up = upkeep_listener(
        b.addr(),
        "idle_timeout = \"600ms\"\nheader_read_timeout = \"5s\"",
    )
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

/// Sends one request on `s` and reads its whole (small) response.
async fn one_request(s: &mut TcpStream) {
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK\r\n"));
}

/// The connection's timer is left at an earlier idle deadline when a request comes: the
/// idle time still counts from the last request, and a head begun later is still cut at the
/// (shorter) header read timeout.
#[tokio::test]
async fn the_idle_clock_restarts_with_each_request_and_a_later_head_gets_its_own_timeout() {
    let b = TestBackend::start("b").await;
    let up = upkeep_listener(
        b.addr(),
        "idle_timeout = \"1500ms\"\nheader_read_timeout = \"300ms\"",
    )
    .await;
    let mut s = TcpStream::connect(up.listeners[0]).await.unwrap();
    one_request(&mut s).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    one_request(&mut s).await;
    let closed = closed_after(&mut s, Duration::from_secs(5))
        .await
        .expect("idle connection closed");
    assert!(
        closed >= Duration::from_millis(1400) && closed < Duration::from_millis(3000),
        "closed {closed:?} after the second request (idle timeout 1.5 s)"
    );

    let mut s = TcpStream::connect(up.listeners[0]).await.unwrap();
    one_request(&mut s).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").await.unwrap();
    let closed = closed_after(&mut s, Duration::from_secs(5))
        .await
        .expect("a slow head is cut");
    assert!(
        closed >= Duration::from_millis(250) && closed < Duration::from_millis(1000),
        "a head begun on a kept connection was cut {closed:?} after it began (header read timeout 300 ms, idle deadline 1.4 s away)"
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

/// The per-try timer is kept with the upstream connection from one request to the next:
/// after it went off while the connection sat idle, and after it was moved to a later
/// deadline, it still times out a slow try at that try's own deadline, never earlier.
#[tokio::test]
async fn a_reused_connection_times_out_each_try_at_its_own_deadline() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[b.addr()], "try_timeout = \"300ms\"")).await;
    assert_eq!(get(up.listeners[0], "x", "/").await.status, 200);
    // The first try's timer goes off while the connection is idle in the pool.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(get(up.listeners[0], "x", "/").await.status, 200);
    // 200 ms into this try's 300 ms, the next try moves the timer 300 ms on from now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    let r = get(up.listeners[0], "x", "/sleep/3000").await;
    let took = start.elapsed();
    assert_eq!(r.status, 504);
    assert_eq!(r.header("upkeep-error"), Some("upstream_timeout"));
    assert!(
        took >= Duration::from_millis(280),
        "timed out early: {took:?}"
    );
    assert!(
        took < Duration::from_millis(2000),
        "timed out late: {took:?}"
    );
    assert_eq!(
        b.connections(),
        1,
        "the three requests shared one connection"
    );
    // The timed-out connection is gone; a fresh one answers.
    assert_eq!(get(up.listeners[0], "x", "/").await.status, 200);
    assert_eq!(b.connections(), 2);
}

/// Starts upkeep with its access log in a file; returns the log's path too.
async fn upkeep_logged(toml: &str, name: &str) -> (upkeep_proxy::server::Running, PathBuf) {
    upkeep_test_support::init_tracing();
    let log =
        std::env::temp_dir().join(format!("upkeep-timeouts-{name}-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let cfg = upkeep_proxy::config::parse(Path::new("test.toml"), toml).unwrap();
    let logger = AccessLogger::start(&upkeep_proxy::config::AccessLog::File(log.clone())).unwrap();
    let up = start_with(cfg, None, logger).await.unwrap();
    (up, log)
}

/// Waits until the access log has a line containing `needle`; returns that line.
async fn log_line(log: &Path, needle: &str) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains(needle)) {
            return l.to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no access-log line with {needle}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A loopback backend that answers every request with a head announcing `len` body bytes,
/// sends `sent` of them, then stalls with the connection open.
async fn stalling_backend(len: usize, sent: usize) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = vec![0u8; 8192];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(&vec![b'x'; sent]).await;
            held.push(s);
        }
    });
    addr
}

#[tokio::test]
async fn a_silent_socket_is_closed_at_the_header_read_timeout_not_the_idle_timeout() {
    let b = TestBackend::start("b").await;
    // The idle timeout stays at its default (620 s): only the header read timeout may close.
    let up = upkeep_listener(b.addr(), "header_read_timeout = \"300ms\"").await;
    let mut s = TcpStream::connect(up.listeners[0]).await.unwrap();
    let t = closed_after(&mut s, Duration::from_secs(3))
        .await
        .expect("a socket that sends nothing must be closed");
    assert!(
        t >= Duration::from_millis(250) && t < Duration::from_millis(1500),
        "closed after {t:?}"
    );
    assert_eq!(
        metric(&up, "upkeep_timeouts_total{timeout=\"header_read\"}").await,
        1.0
    );
    metric_becomes(&up, "upkeep_downstream_connections_open", 0.0).await;
}

#[tokio::test]
async fn half_an_http2_preface_is_closed_at_the_header_read_timeout() {
    let b = TestBackend::start("b").await;
    let up = upkeep_listener(b.addr(), "header_read_timeout = \"300ms\"").await;
    let mut s = TcpStream::connect(up.listeners[0]).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let t = closed_after(&mut s, Duration::from_secs(3))
        .await
        .expect("half a preface must be closed");
    assert!(
        t >= Duration::from_millis(250) && t < Duration::from_millis(1500),
        "closed after {t:?}"
    );
}

#[tokio::test]
async fn a_backend_that_stalls_mid_body_is_cut_at_read_timeout_and_logged() {
    let backend = stalling_backend(100_000, 1000).await;
    let cfg = one_group(&[backend], "read_timeout = \"400ms\"");
    let (up, log) = upkeep_logged(&cfg, "read").await;
    let mut s = TcpStream::connect(up.listeners[0]).await.unwrap();
    s.write_all(b"GET /stall HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Err(_) => break None,
            Ok(Ok(0)) | Ok(Err(_)) => break Some(start.elapsed()),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    };
    let t = closed.expect("the client's connection must be closed at read_timeout");
    assert!(
        t >= Duration::from_millis(350) && t < Duration::from_millis(2500),
        "closed after {t:?}"
    );
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let line = log_line(&log, "/stall").await;
    assert!(
        line.contains("\"cause\":\"upstream_read_timeout\""),
        "{line}"
    );
    assert!(line.contains("\"incomplete\":true"), "{line}");
    assert_eq!(
        metric(&up, "upkeep_timeouts_total{timeout=\"read\"}").await,
        1.0
    );
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn a_client_that_stops_reading_is_cut_at_send_timeout() {
    let b = TestBackend::start("b").await;
    let cfg = with_listener_settings(one_group(&[b.addr()], ""), "send_timeout = \"500ms\"");
    let (up, log) = upkeep_logged(&cfg, "send").await;
    // A small receive buffer, so the kernel absorbs little of the response.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut s = sock.connect(up.listeners[0]).await.unwrap();
    s.write_all(b"GET /bytes/1000000000 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    // Never read: upkeep's writes stall once the socket buffers are full.
    let t = metric_becomes(&up, "upkeep_timeouts_total{timeout=\"send\"}", 1.0).await;
    assert!(t >= Duration::from_millis(450), "cut after {t:?}");
    metric_becomes(&up, "upkeep_downstream_connections_open", 0.0).await;
    let line = log_line(&log, "/bytes/1000000000").await;
    assert!(line.contains("\"cause\":\"client_send_timeout\""), "{line}");
    assert!(line.contains("\"incomplete\":true"), "{line}");
    drop(s);
    let _ = std::fs::remove_file(&log);
}

/// A request body sent as `chunks` chunks of `size` bytes, one every `every`.
fn paced_body(
    chunks: usize,
    size: usize,
    every: Duration,
) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, std::convert::Infallible>>> {
    let s = futures_util::stream::unfold(0usize, move |i| async move {
        if i == chunks {
            return None;
        }
        tokio::time::sleep(every).await;
        Some((Ok(Frame::data(Bytes::from(vec![b'u'; size]))), i + 1))
    });
    StreamBody::new(s)
}

#[tokio::test]
async fn an_upload_lasting_several_try_timeouts_at_a_steady_rate_succeeds() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&with_listener_settings(
        one_group(
            &[b.addr()],
            "connect_timeout = \"200ms\"\ntry_timeout = \"300ms\"\ndeadline = \"600ms\"",
        ),
        "client_body_timeout = \"1s\"",
    ))
    .await;
    let start = Instant::now();
    // 20 chunks 100 ms apart: 2 s of upload, more than six try timeouts and three deadlines.
    let req = Request::post("/upload")
        .header("host", "a")
        .body(paced_body(20, 1000, Duration::from_millis(100)))
        .unwrap();
    let r = send(up.listeners[0], req).await;
    assert_eq!(r.status, 200, "{:?} {}", r.header("upkeep-error"), r.text());
    assert_eq!(r.text(), "20000\n");
    assert!(start.elapsed() >= Duration::from_millis(1900));
}

#[tokio::test]
async fn a_stalled_upload_gets_408_client_timeout_and_never_ejects_the_peer() {
    let (a, b) = (TestBackend::start("a").await, TestBackend::start("b").await);
    // Two peers, so that one of them could be ejected (the panic threshold keeps half).
    let up = upkeep(&with_listener_settings(
        one_group(
            &[a.addr(), b.addr()],
            "[groups.app.health]\nconsecutive_failures = 2",
        ),
        "client_body_timeout = \"300ms\"",
    ))
    .await;
    // Round robin: each peer meets twice what it takes to eject a failing peer.
    for _ in 0..4 {
        let mut s = TcpStream::connect(up.listeners[0]).await.unwrap();
        s.write_all(
            b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\nfirst bytes",
        )
        .await
        .unwrap();
        let start = Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 408"), "{text}");
        assert!(text.contains("upkeep-error: client_timeout"), "{text}");
        let t = start.elapsed();
        assert!(
            t >= Duration::from_millis(250) && t < Duration::from_millis(2500),
            "answered after {t:?}"
        );
    }
    assert_eq!(metric(&up, "upkeep_peer_ejections_total").await, 0.0);
    assert_eq!(
        metric(&up, "upkeep_timeouts_total{timeout=\"client_body\"}").await,
        4.0
    );
    for _ in 0..2 {
        assert_eq!(get(up.listeners[0], "a", "/after").await.status, 200);
    }
    let after = |t: &TestBackend| t.seen().iter().filter(|s| s.path == "/after").count();
    assert_eq!((after(&a), after(&b)), (1, 1), "both peers still serve");
    assert_eq!(
        metric(
            &up,
            "upkeep_responses_total{origin=\"proxy\",class=\"4xx\",cause=\"client_timeout\"}"
        )
        .await,
        4.0
    );
}
