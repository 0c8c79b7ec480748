use super::*;
use std::io::ErrorKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn start(name: &str) -> Backend {
    Backend::start("127.0.0.1:0".parse().unwrap(), name)
        .await
        .unwrap()
}

/// Sends one GET on `stream` and reads until the peer closes or a full small response arrives.
async fn get(stream: &mut TcpStream, path: &str) -> io::Result<String> {
    let req = format!("GET {path} HTTP/1.1\r\nhost: lab\r\n\r\n");
    stream.write_all(req.as_bytes()).await?;
    let mut buf = vec![0u8; 8192];
    let mut out = Vec::new();
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&out);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if body.len() >= len {
                break;
            }
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test]
async fn body_and_header_name_the_backend() {
    let b = start("dc1").await;
    let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
    let resp = get(&mut s, "/").await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("x-backend: dc1"), "{resp}");
    assert!(resp.ends_with("dc1\n"), "{resp}");
    assert_eq!(b.served(), 1);
}

#[tokio::test]
async fn refuse_answers_connects_with_rst_and_reopens_the_same_port() {
    let b = start("dc1").await;
    let addr = b.local_addr();
    b.set_fault(Fault::Refuse);
    let mut refused = false;
    for _ in 0..100 {
        match TcpStream::connect(addr).await {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                refused = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
    assert!(refused, "connects were never refused");
    b.set_fault(Fault::None);
    let mut ok = None;
    for _ in 0..100 {
        if let Ok(mut s) = TcpStream::connect(addr).await {
            ok = Some(get(&mut s, "/").await.unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(ok.expect("port never re-opened").contains("200 OK"));
    assert_eq!(b.local_addr(), addr);
}

#[tokio::test]
async fn reset_mid_response_sends_headers_then_rst() {
    let b = start("dc1").await;
    b.set_fault(Fault::ResetMidResponse);
    let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: lab\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let err = loop {
        match s.read(&mut buf).await {
            Ok(0) => panic!(
                "clean close instead of RST after {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn status_fault_sets_the_status() {
    let b = start("dc2").await;
    b.set_fault(Fault::Status(503));
    let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
    let resp = get(&mut s, "/").await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
}

#[tokio::test]
async fn stall_never_answers() {
    let b = start("dc1").await;
    b.set_fault(Fault::Stall);
    let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
    let r = tokio::time::timeout(Duration::from_millis(300), get(&mut s, "/")).await;
    assert!(r.is_err(), "a stalled backend answered: {r:?}");
}

#[tokio::test]
async fn idle_close_closes_after_the_last_response_and_announces_the_hint() {
    let b = start("node").await;
    b.set_keepalive(Some(Duration::from_millis(300)), Some(5));
    let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
    let resp = get(&mut s, "/").await.unwrap();
    assert!(resp.contains("keep-alive: timeout=5"), "{resp}");
    let done = std::time::Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .expect("connection never closed")
        .unwrap_or(0);
    assert_eq!(n, 0);
    let waited = done.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "closed too early: {waited:?}"
    );
}

#[tokio::test]
async fn readyz_checks_core_only_and_health_checks_all() {
    let b = start("app").await;
    b.set_deps(DepState::Up, DepState::Down);
    let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
    assert!(get(&mut s, "/readyz")
        .await
        .unwrap()
        .starts_with("HTTP/1.1 200"));
    assert!(get(&mut s, "/health")
        .await
        .unwrap()
        .starts_with("HTTP/1.1 503"));
    assert!(get(&mut s, "/livez")
        .await
        .unwrap()
        .starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn refuse_also_closes_open_keepalive_connections() {
    let b = start("dc1").await;
    let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
    assert!(get(&mut s, "/").await.unwrap().contains("200 OK"));
    b.set_fault(Fault::Refuse);
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
        .await
        .expect("open connection survived refuse")
        .unwrap_or(0);
    assert_eq!(n, 0);
}

#[tokio::test(start_paused = true)]
async fn idle_timer_fires_after_the_idle_time_with_nothing_in_flight() {
    let conn = ConnState::default();
    let t = Instant::now();
    idle_timer(&conn, Duration::from_secs(6)).await;
    assert_eq!(t.elapsed(), Duration::from_secs(6));
}

#[tokio::test(start_paused = true)]
async fn idle_timer_waits_while_a_request_is_in_flight() {
    let conn = Arc::new(ConnState::default());
    conn.in_flight.store(1, Ordering::SeqCst);
    let c = conn.clone();
    let ender = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(10)).await;
        c.in_flight.store(0, Ordering::SeqCst);
        c.activity.notify_one();
    });
    let t = Instant::now();
    idle_timer(&conn, Duration::from_secs(6)).await;
    // The clock restarts at the response (t = 10 s), as Node's keepAliveTimeout does.
    assert_eq!(t.elapsed(), Duration::from_secs(16));
    ender.await.unwrap();
}
