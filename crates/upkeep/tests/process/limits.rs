//! Timeouts and limits of `upkeep serve` as a process: the descriptor limit it raises, the
//! connection limit, the header read timeout on a silent socket.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use upkeep_test_support::{get, raw_exchange, TestBackend};

use crate::support::{loopbacks, wait_ready, Proc, BIN};

fn start(
    name: &str,
    backend: SocketAddr,
    listener: &str,
) -> (Proc, SocketAddr, SocketAddr, PathBuf) {
    let [listen, admin] = loopbacks();
    let dir = std::env::temp_dir().join(format!("upkeep-limits-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("up.toml");
    let text = format!(
        "access_log = \"off\"\n[admin]\nlisten = \"{admin}\"\n[[listener]]\nlisten = \"{listen}\"\n{listener}\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{backend}\"]\n"
    );
    std::fs::File::create(&file)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    // Started with a low soft descriptor limit, so raising it is visible.
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn 512 2>/dev/null; exec {BIN} serve --workers 2 --config {}",
            file.display()
        ))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Proc(child), listen, admin, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_max_connections_the_binary_answers_503_overloaded_while_livez_answers() {
    let b = TestBackend::start("b").await;
    let (child, listen, admin, dir) = start(
        "max",
        b.addr(),
        "max_connections = 2\nheader_read_timeout = \"10s\"",
    );
    wait_ready(admin).await;
    // The soft descriptor limit was raised to the hard one at start.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.0.id())).unwrap();
    let files: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(files[3], files[4], "soft = hard: {limits}");
    assert_ne!(
        files[3], "512",
        "raised from the soft limit it started with"
    );

    // Two silent connections hold the allowance (spread over two serving workers).
    let _held = (
        TcpStream::connect(listen).await.unwrap(),
        TcpStream::connect(listen).await.unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = raw_exchange(
        listen,
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("upkeep-error: overloaded"), "{text}");
    assert_eq!(get(admin, "admin", "/livez").await.status, 200);
    assert!(b.seen().is_empty());
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_closes_a_silent_socket_at_the_header_read_timeout() {
    let b = TestBackend::start("b").await;
    let (child, listen, admin, dir) = start("silent", b.addr(), "header_read_timeout = \"400ms\"");
    wait_ready(admin).await;
    let mut s = TcpStream::connect(listen).await.unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
    let t = start.elapsed();
    assert!(
        matches!(r, Ok(Ok(0)) | Ok(Err(_))),
        "closed, not timed out: {r:?}"
    );
    assert!(
        t >= Duration::from_millis(350) && t < Duration::from_millis(2500),
        "closed after {t:?}"
    );
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}
