//! The admin listeners: a probe port that answers GET probes only, a control port whose
//! `POST /reload` needs the bearer token, and admin connections that are bounded in number
//! and in how long they may take to send a request head.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use upkeep_proxy::access_log::AccessLogger;
use upkeep_proxy::server::{start_with, Running};
use upkeep_test_support::{get, raw_exchange, TestBackend};

use crate::support;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("upkeep-admin-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Starts upkeep from a config file (so that reload has a file to re-read).
async fn upkeep_from_file(path: &Path) -> Running {
    upkeep_test_support::init_tracing();
    let cfg = upkeep_proxy::config::load(path).unwrap_or_else(|e| panic!("test config: {e}"));
    start_with(cfg, Some(path.to_owned()), AccessLogger::off())
        .await
        .expect("upkeep starts")
}

fn config(backend: SocketAddr, admin: &str) -> String {
    format!(
        "[admin]\n{admin}\n[[listener]]\nlisten = \"127.0.0.1:0\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{backend}\"]\n"
    )
}

async fn reload(addr: SocketAddr, auth: Option<&str>) -> String {
    let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    raw_exchange(
        addr,
        format!("POST /reload HTTP/1.1\r\nHost: a\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
        Duration::from_secs(5),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_without_the_token_on_a_non_loopback_control_listener_gets_401() {
    let backend = TestBackend::start("b").await;
    let dir = temp_dir("token");
    let token = dir.join("token");
    std::fs::write(&token, "0123456789abcdef\n").unwrap();
    let file = dir.join("upkeep.toml");
    // Bound on every address, reached over loopback: the traffic stays on this machine.
    std::fs::write(
        &file,
        config(
            backend.addr(),
            &format!(
                "listen = \"0.0.0.0:0\"\ntoken_file = \"{}\"",
                token.display()
            ),
        ),
    )
    .unwrap();
    let up = upkeep_from_file(&file).await;
    let control = SocketAddr::from(([127, 0, 0, 1], up.admin.port()));

    let r = reload(control, None).await;
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
    assert!(r.contains("www-authenticate: Bearer"), "{r}");
    let r = reload(control, Some("Bearer 0123456789abcdeF")).await;
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
    let r = reload(control, Some("Basic MDEyMzQ1Njc4OWFiY2RlZg==")).await;
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
    let r = reload(control, Some("Bearer 0123456789abcdef")).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("\r\n\r\nreloaded\n"), "{r}");

    // A rotated token applies at once: the file is read on each reload request.
    std::fs::write(&token, "fedcba9876543210\n").unwrap();
    let r = reload(control, Some("Bearer 0123456789abcdef")).await;
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
    let r = reload(control, Some("Bearer fedcba9876543210")).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");

    // The other control endpoints stay readable without the token.
    assert_eq!(get(control, "a", "/upstreams").await.status, 200);
    assert_eq!(get(control, "a", "/metrics").await.status, 200);
}

#[test]
fn a_non_loopback_control_listener_without_a_token_is_refused_at_its_position() {
    let text = "[admin]\nprobes = \"0.0.0.0:9902\"\nlisten = \"0.0.0.0:9901\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"127.0.0.1:1\"]\n";
    let err = upkeep_proxy::config::parse(Path::new("k.toml"), text).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("k.toml:3:10: admin listen 0.0.0.0:9901 is not loopback"),
        "{msg}"
    );
    assert!(msg.contains("token_file"), "{msg}");
    // Any loopback address is fine without a token; so is a missing [admin] listen.
    for listen in ["127.0.0.1:9901", "127.0.0.2:9901", "[::1]:9901"] {
        let ok = text.replace("0.0.0.0:9901", listen);
        upkeep_proxy::config::parse(Path::new("k.toml"), &ok)
            .unwrap_or_else(|e| panic!("{listen}: {e}"));
    }
    let ok = text.replace("listen = \"0.0.0.0:9901\"\n", "");
    upkeep_proxy::config::parse(Path::new("k.toml"), &ok).unwrap();
    // A token file that cannot be read is named, at its position.
    let bad = text.replace(
        "listen = \"0.0.0.0:9901\"",
        "listen = \"0.0.0.0:9901\"\ntoken_file = \"/nonexistent/upkeep-token\"",
    );
    let msg = upkeep_proxy::config::parse(Path::new("k.toml"), &bad)
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("k.toml:4:14: admin token_file /nonexistent/upkeep-token cannot be read"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_port_answers_get_probes_only() {
    let backend = TestBackend::start("b").await;
    let up = support::upkeep(&config(
        backend.addr(),
        "listen = \"127.0.0.1:0\"\nprobes = \"127.0.0.1:0\"",
    ))
    .await;
    let probes = up.probes.expect("probe listener bound");
    assert_ne!(probes, up.admin);
    for path in ["/livez", "/readyz", "/startupz"] {
        let r = get(probes, "kubelet", path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.text(), "ok\n");
        let r = get(probes, "kubelet", &format!("{path}?verbose")).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert!(r.text().contains(" check passed"), "{}", r.text());
    }
    // The control endpoints do not exist here.
    for path in ["/metrics", "/upstreams", "/reload"] {
        assert_eq!(get(probes, "kubelet", path).await.status, 404, "{path}");
    }
    // Anything but GET (and HEAD) is 405, on probe paths and control paths alike.
    for (method, path) in [
        ("POST", "/reload"),
        ("POST", "/livez"),
        ("PUT", "/readyz"),
        ("DELETE", "/startupz"),
        ("PATCH", "/metrics"),
    ] {
        let r = raw_exchange(
            probes,
            format!("{method} {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
            Duration::from_secs(5),
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 405"), "{method} {path}: {r}");
        assert!(r.contains("allow: GET, HEAD"), "{r}");
    }
    let r = raw_exchange(
        probes,
        b"HEAD /readyz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    // The control listener still serves everything, probes included.
    assert_eq!(get(up.admin, "a", "/readyz").await.status, 200);
    assert_eq!(get(up.admin, "a", "/metrics").await.status, 200);
}

/// Reads until EOF or `limit`; returns what came and how long it took.
async fn read_to_close(s: &mut TcpStream, limit: Duration) -> (String, Duration) {
    let start = Instant::now();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(limit, s.read_to_end(&mut out)).await;
    (String::from_utf8_lossy(&out).into_owned(), start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_admin_connection_is_closed_at_the_admin_header_read_timeout() {
    let backend = TestBackend::start("b").await;
    let up = support::upkeep(&config(
        backend.addr(),
        "listen = \"127.0.0.1:0\"\nprobes = \"127.0.0.1:0\"\nheader_read_timeout = \"300ms\"",
    ))
    .await;
    for addr in [up.admin, up.probes.unwrap()] {
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let (_, took) = read_to_close(&mut silent, Duration::from_secs(5)).await;
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(3),
            "{addr}: closed after {took:?}"
        );
        // Half a request head is no better than none.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut slow, b"GET /livez HTTP/1.1\r\nHo")
            .await
            .unwrap();
        let (_, took) = read_to_close(&mut slow, Duration::from_secs(5)).await;
        assert!(
            took < Duration::from_secs(3),
            "{addr}: closed after {took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_connections_over_the_limit_get_503_and_the_probe_port_has_its_own_limit() {
    let backend = TestBackend::start("b").await;
    let up = support::upkeep(&config(
        backend.addr(),
        "listen = \"127.0.0.1:0\"\nprobes = \"127.0.0.1:0\"\nmax_connections = 4\nheader_read_timeout = \"2s\"",
    ))
    .await;
    let probes = up.probes.unwrap();
    // Four silent clients fill the control listener.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(up.admin).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut fifth = TcpStream::connect(up.admin).await.unwrap();
    let (r, took) = read_to_close(&mut fifth, Duration::from_secs(5)).await;
    assert!(r.starts_with("HTTP/1.1 503"), "{r:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // The probe listener's slots are its own: kubelet still gets answers.
    for _ in 0..3 {
        assert_eq!(get(probes, "kubelet", "/livez").await.status, 200);
    }
    // Once the holders go, the control listener answers again.
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(get(up.admin, "a", "/readyz").await.status, 200);
}
