//! The header read timeout of `upkeep serve` as a process, over raw sockets: part of a
//! request head and then silence gets `408 client_timeout` (access-logged and counted like
//! every refused request) before the close; a socket that sent nothing is closed without a
//! word, and counted as a timeout.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use upkeep_test_support::{get, TestBackend};

use crate::support::{loopbacks, wait_ready, BIN};

struct Proc(Child, PathBuf);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// Starts the binary with `header_read_timeout = "400ms"` and a JSON access log in a file.
async fn start(name: &str, backend: SocketAddr) -> (Proc, SocketAddr, SocketAddr, PathBuf) {
    let [listen, admin] = loopbacks();
    let dir = std::env::temp_dir().join(format!("upkeep-head-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let file = dir.join("up.toml");
    let text = format!(
        "access_log = \"{}\"\n[admin]\nlisten = \"{admin}\"\n[[listener]]\nlisten = \"{listen}\"\nheader_read_timeout = \"400ms\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{backend}\"]\n",
        log.display()
    );
    std::fs::File::create(&file)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let child = Command::new(BIN)
        .args(["serve", "--workers", "2", "--config"])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let proc = Proc(child, dir);
    wait_ready(admin).await;
    (proc, listen, admin, log)
}

/// Everything the server sends until it closes (at most 5 s), and when it closed.
async fn read_to_close(s: &mut TcpStream) -> (String, Duration) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Err(_) => panic!(
                "not closed within 5 s; got {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), start.elapsed())
}

async fn metric(admin: SocketAddr, name: &str) -> f64 {
    get(admin, "admin", "/metrics")
        .await
        .text()
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The access log's lines whose status is `status`, waiting up to 3 s for one to appear.
async fn log_lines_with_status(log: &Path, status: u64) -> Vec<serde_json::Value> {
    let start = Instant::now();
    loop {
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|v: &serde_json::Value| v["status"] == status)
            .collect();
        if !lines.is_empty() || start.elapsed() > Duration::from_secs(3) {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_head_then_silence_gets_408_client_timeout_logged_and_counted() {
    let b = TestBackend::start("b").await;
    let (_proc, listen, admin, log) = start("partial", b.addr()).await;
    let mut s = TcpStream::connect(listen).await.unwrap();
    s.write_all(b"GET /slow HTTP/1.1\r\nHost: a\r\nUser-")
        .await
        .unwrap();
    let (text, t) = read_to_close(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 408 "), "{text:?}");
    assert!(text.contains("upkeep-error: client_timeout"), "{text:?}");
    assert!(text.contains("connection: close"), "{text:?}");
    assert!(
        t >= Duration::from_millis(350) && t < Duration::from_millis(2500),
        "answered after {t:?}"
    );
    assert!(b.seen().is_empty(), "nothing reaches the backend");
    assert_eq!(
        metric(
            admin,
            "upkeep_responses_total{origin=\"proxy\",class=\"4xx\",cause=\"client_timeout\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        metric(admin, "upkeep_timeouts_total{timeout=\"header_read\"}").await,
        1.0
    );
    let lines = log_lines_with_status(&log, 408).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["cause"], "client_timeout");
    assert_eq!(lines[0]["origin"], "proxy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_head_on_a_kept_alive_connection_that_stalls_gets_408() {
    let b = TestBackend::start("b").await;
    let (_proc, listen, admin, log) = start("keepalive", b.addr()).await;
    let mut s = TcpStream::connect(listen).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    // Idle for longer than the header read timeout between requests: that is the idle
    // timeout's business, not a refusal.
    tokio::time::sleep(Duration::from_millis(600)).await;
    s.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
    let (text, _) = read_to_close(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 408 "), "{text:?}");
    assert_eq!(log_lines_with_status(&log, 408).await.len(), 1);
    assert_eq!(
        metric(admin, "upkeep_timeouts_total{timeout=\"header_read\"}").await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_that_sent_nothing_is_closed_silently_but_counted() {
    let b = TestBackend::start("b").await;
    let (_proc, listen, admin, log) = start("silent", b.addr()).await;
    let mut s = TcpStream::connect(listen).await.unwrap();
    let (text, t) = read_to_close(&mut s).await;
    assert_eq!(text, "", "nothing is written to a socket that sent nothing");
    assert!(
        t >= Duration::from_millis(350) && t < Duration::from_millis(2500),
        "closed after {t:?}"
    );
    assert_eq!(
        metric(admin, "upkeep_timeouts_total{timeout=\"header_read\"}").await,
        1.0
    );
    assert_eq!(
        metric(
            admin,
            "upkeep_responses_total{origin=\"proxy\",class=\"4xx\",cause=\"client_timeout\"}"
        )
        .await,
        0.0
    );
    assert!(log_lines_with_status(&log, 408).await.is_empty());
}
