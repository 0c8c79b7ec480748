use super::*;
use crate::backend::{Backend, Fault};

#[test]
fn schedule_spaces_requests_one_over_rate_apart() {
    let due: Vec<_> = schedule(200.0, Duration::from_secs(2)).collect();
    assert_eq!(due.len(), 400);
    assert_eq!(due[0], Duration::ZERO);
    assert_eq!(due[1], Duration::from_millis(5));
    assert_eq!(due[399], Duration::from_millis(1995));
}

#[test]
fn schedule_rounds_a_partial_last_slot_up() {
    assert_eq!(schedule(3.0, Duration::from_millis(500)).count(), 2);
}

fn spec(url: &str, mode: LoadMode, rate: f64, ms: u64) -> LoadSpec {
    LoadSpec {
        url: url.parse().unwrap(),
        method: Method::GET,
        rate,
        duration: Duration::from_millis(ms),
        mode,
        timeout: Duration::from_millis(400),
        headers: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_keeps_sending_while_every_request_is_stuck() {
    let b = Backend::start("127.0.0.1:0".parse().unwrap(), "stuck")
        .await
        .unwrap();
    b.set_fault(Fault::Stall);
    let url = format!("http://{}/", b.local_addr());
    let result = run(&spec(&url, LoadMode::NewConnection, 200.0, 500), false)
        .await
        .unwrap();
    // All 100 requests left on schedule although none was ever answered.
    assert_eq!(result.records.len(), 100);
    assert!(result
        .records
        .iter()
        .all(|r| r.error == Some(ClientError::Timeout)));
    // A loop that waited for answers would send its second request only
    // when the first timed out, 400 ms late. The bound is a quarter of that:
    // it tells the two apart even when the test shares a busy machine with
    // the rest of the suite (a 21 ms p99 was seen there).
    let stats = LoadStats::of(&result.records);
    assert!(
        stats.lag_p99_ms < 100.0,
        "send lag p99 {} ms",
        stats.lag_p99_ms
    );
    assert_eq!(b.accepted(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_mode_reuses_connections_and_names_the_backend() {
    let b = Backend::start("127.0.0.1:0".parse().unwrap(), "dc1")
        .await
        .unwrap();
    let url = format!("http://{}/", b.local_addr());
    let result = run(&spec(&url, LoadMode::Pooled, 100.0, 300), false)
        .await
        .unwrap();
    assert_eq!(result.records.len(), 30);
    assert!(result.records.iter().all(|r| r.status == Some(200)));
    assert!(result
        .records
        .iter()
        .all(|r| r.backend.as_deref() == Some("dc1")));
    assert!(result.records.iter().any(|r| r.reused));
    assert!(b.accepted() < 30, "accepted {} connections", b.accepted());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connects_are_recorded_as_refused() {
    let b = Backend::start("127.0.0.1:0".parse().unwrap(), "dc1")
        .await
        .unwrap();
    let addr = b.local_addr();
    b.shutdown().await;
    let url = format!("http://{addr}/");
    let result = run(&spec(&url, LoadMode::NewConnection, 50.0, 100), false)
        .await
        .unwrap();
    assert!(!result.records.is_empty());
    assert!(result
        .records
        .iter()
        .all(|r| r.error == Some(ClientError::Refused)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollers_reconnect_after_the_server_closed_an_idle_connection() {
    let b = Backend::start("127.0.0.1:0".parse().unwrap(), "node")
        .await
        .unwrap();
    b.set_keepalive(Some(Duration::from_millis(100)), Some(5));
    let url = format!("http://{}/", b.local_addr());
    let mode = LoadMode::Pollers {
        count: 2,
        idle_min: Duration::from_millis(200),
        idle_max: Duration::from_millis(250),
    };
    let result = run(&spec(&url, mode, 1.0, 1000), false).await.unwrap();
    assert!(result.records.len() >= 4);
    assert!(
        result.records.iter().all(|r| r.status == Some(200)),
        "{:?}",
        result.records
    );
    // Each idle outlived the server's close, so no connection was ever reused.
    assert!(result.records.iter().all(|r| !r.reused));
    assert_eq!(b.accepted() as usize, result.records.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollers_reuse_a_connection_the_server_keeps() {
    let b = Backend::start("127.0.0.1:0".parse().unwrap(), "dc1")
        .await
        .unwrap();
    let url = format!("http://{}/", b.local_addr());
    let mode = LoadMode::Pollers {
        count: 1,
        idle_min: Duration::from_millis(50),
        idle_max: Duration::from_millis(50),
    };
    let result = run(&spec(&url, mode, 1.0, 400), false).await.unwrap();
    assert!(result.records.len() >= 3);
    assert!(result
        .records
        .iter()
        .skip(1)
        .all(|r| r.reused && r.status == Some(200)));
    assert_eq!(b.accepted(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn precise_timer_never_fires_early_and_passes_deadlines_already_gone() {
    let timer = clock::PreciseTimer::new().unwrap();
    let start = std::time::Instant::now();
    // Sub-millisecond steps, which tokio's timer wheel would round to whole milliseconds.
    for i in 1..=20u32 {
        let at = start + Duration::from_micros(300) * i;
        tokio::time::timeout(Duration::from_secs(5), timer.sleep_until(at))
            .await
            .expect("the timer fires")
            .unwrap();
        assert!(std::time::Instant::now() >= at, "step {i} fired early");
    }
    let past = std::time::Instant::now() - Duration::from_millis(5);
    tokio::time::timeout(Duration::from_secs(5), timer.sleep_until(past))
        .await
        .expect("a passed deadline returns")
        .unwrap();
}

#[test]
fn a_send_lag_p99_of_a_millisecond_or_more_counts_as_behind_schedule() {
    let record = |lag_us: u64| RequestRecord {
        seq: 0,
        scheduled: Duration::ZERO,
        send_lag: Duration::from_micros(lag_us),
        latency: Duration::from_micros(100),
        status: Some(200),
        error: None,
        backend: None,
        cause: None,
        reused: true,
    };
    // 99 on time and 1 late: p99 is on time.
    let mut records: Vec<_> = (0..99).map(|_| record(200)).collect();
    records.push(record(5_000));
    assert!(!LoadStats::of(&records).behind_schedule());
    // 2 in 100 late by 1.5 ms: p99 is late.
    records.push(record(1_500));
    records.push(record(1_500));
    assert!(LoadStats::of(&records).behind_schedule());
}

#[tokio::test]
async fn every_request_carries_the_header_fields_asked_for() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before a whole head");
            head.extend_from_slice(&buf[..n]);
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        String::from_utf8(head).unwrap()
    });
    let mut s = spec(&url, LoadMode::Pooled, 1.0, 500);
    s.headers = vec![
        ("x-probe".parse().unwrap(), "1".parse().unwrap()),
        ("user-agent".parse().unwrap(), "lab/1".parse().unwrap()),
    ];
    let _ = run(&s, false).await;
    let head = server.await.unwrap().to_ascii_lowercase();
    assert!(head.contains("\r\nx-probe: 1\r\n"), "{head}");
    assert!(head.contains("\r\nuser-agent: lab/1\r\n"), "{head}");
}
