//! Shared helpers for the proxy's integration tests (`tests/proxy/` and `tests/streaming.rs`).
#![allow(dead_code)]

pub mod h2;
pub mod py;
pub mod raw;

use std::path::Path;

use upkeep_proxy::access_log::AccessLogger;
use upkeep_proxy::server::{start_with, Running};

/// Starts upkeep in-process from config text (use `127.0.0.1:0` addresses).
pub async fn upkeep(toml: &str) -> Running {
    upkeep_test_support::init_tracing();
    let cfg = upkeep_proxy::config::parse(Path::new("test.toml"), toml)
        .unwrap_or_else(|e| panic!("test config: {e}"));
    start_with(cfg, None, AccessLogger::off())
        .await
        .expect("upkeep starts")
}

/// Like `upkeep`, sending HTTP/1.1 upstream requests with hyper's client instead of upkeep's
/// own codec (the differential test runs one corpus through both).
pub async fn upkeep_hyper_http1(toml: &str) -> Running {
    upkeep_test_support::init_tracing();
    let mut cfg = upkeep_proxy::config::parse(Path::new("test.toml"), toml)
        .unwrap_or_else(|e| panic!("test config: {e}"));
    cfg.use_hyper_http1_client();
    start_with(cfg, None, AccessLogger::off())
        .await
        .expect("upkeep starts")
}

/// `curl ARGS..`, bounded (10 s): what it printed on stdout and on stderr.
pub async fn curl(args: &[&str]) -> (String, String) {
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio::process::Command::new("curl")
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("curl finishes")
    .expect("curl runs");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A loopback address that refuses connections while the returned socket lives: the socket
/// holds the port, bound and never listening (without `SO_REUSEADDR`), so no listener of a
/// test running beside can take it, as one could a port bound and closed again.
pub fn refusing_addr() -> (tokio::net::TcpSocket, std::net::SocketAddr) {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(([127, 0, 0, 1], 0).into()).unwrap();
    let addr = s.local_addr().unwrap();
    (s, addr)
}

/// A config with one listener, an admin listener, and one group `app` over `addrs`.
pub fn one_group(addrs: &[std::net::SocketAddr], extra: &str) -> String {
    let eps: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[route]]\ngroup = \"app\"\n\n[groups.app]\nendpoints = [{}]\n{extra}\n",
        eps.join(", ")
    )
}

/// `cfg` with `settings` added to its first listener (`[[listener]]` on `127.0.0.1:0`).
pub fn with_listener_settings(cfg: String, settings: &str) -> String {
    cfg.replacen(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n",
        &format!("[[listener]]\nlisten = \"127.0.0.1:0\"\n{settings}\n"),
        1,
    )
}

/// upkeep in front of `backend` alone, with `settings` on its listener.
pub async fn upkeep_listener(backend: std::net::SocketAddr, settings: &str) -> Running {
    upkeep(&with_listener_settings(one_group(&[backend], ""), settings)).await
}

/// Reads a metric's value from `/metrics` text: the first sample whose line starts with `prefix`.
pub async fn metric(running: &Running, prefix: &str) -> f64 {
    let m = upkeep_test_support::get(running.admin, "admin", "/metrics")
        .await
        .text();
    m.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until `series` reads `want` (see `metric`) and returns how long that took; fails the
/// test if it has not after 8 s.
pub async fn metric_becomes(running: &Running, series: &str, want: f64) -> std::time::Duration {
    let start = std::time::Instant::now();
    loop {
        let now = metric(running, series).await;
        if now == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(8),
            "{series} never became {want} (now {now})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A temporary directory for one test's files, removed on drop.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// `upkeep-NAME-PID` under the system's temporary directory, empty.
    pub fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("upkeep-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }

    /// A file's path in the directory.
    pub fn path(&self, f: &str) -> std::path::PathBuf {
        self.0.join(f)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
