//! WebSocket through upkeep, on the wire with real clients and servers: the Python
//! `websockets` package on both sides (`tests/upgrade/*.py`), Node's HTTP/2 client for
//! RFC 8441. Covers docs/protocols.md "WebSocket and other upgrades".

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use upkeep_proxy::access_log::AccessLogger;
use upkeep_proxy::config::AccessLog;
use upkeep_proxy::server::{start_with, Control, Running};

use crate::support;
use crate::support::py::PyServer;
use crate::support::TempDir;

/// A temporary directory for one upgrade test's files.
fn upgrade_dir(name: &str) -> TempDir {
    TempDir::new(&format!("upgrade-{name}"))
}

const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/upgrade");

/// Whether python3 with `websockets` is here (`support::py::have`).
async fn have_websockets() -> bool {
    support::py::have("websockets.asyncio.client")
}

/// The `websockets` echo server: one JSON line per connection it saw end.
async fn echo_server() -> PyServer {
    PyServer::start(&format!("{SCRIPTS}/ws_echo_server.py"), &[]).await
}

/// Runs the `websockets` client; its last stdout line, parsed.
async fn ws_client(args: &[&str]) -> Value {
    support::py::json_client(&format!("{SCRIPTS}/ws_client.py"), args).await
}

/// Starts upkeep in-process in front of `backend`, with its access log in `log`.
async fn upkeep(backend: SocketAddr, log: &Path, top: &str, group: &str) -> Running {
    upkeep_toml(&support::one_group(&[backend], group), log, top).await
}

/// Starts upkeep in-process from `config`, with its access log in `log` and `top` first.
async fn upkeep_toml(config: &str, log: &Path, top: &str) -> Running {
    upkeep_test_support::init_tracing();
    let toml = format!("access_log = \"{}\"\n{top}\n{config}", log.display());
    let cfg = upkeep_proxy::config::parse(Path::new("test.toml"), &toml)
        .unwrap_or_else(|e| panic!("test config: {e}"));
    let logger = AccessLogger::start(&AccessLog::File(log.to_owned())).unwrap();
    start_with(cfg, None, logger).await.expect("upkeep starts")
}

fn log_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits (bounded) until the access log has `n` lines.
async fn wait_log(path: &Path, n: usize) -> Vec<Value> {
    for _ in 0..100 {
        let lines = log_lines(path);
        if lines.len() >= n {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    log_lines(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_echo_of_1000_messages_each_way_with_close_codes_relayed_and_counted() {
    if !have_websockets().await {
        return;
    }
    let dir = upgrade_dir("echo");
    let server = echo_server().await;
    let log = dir.path("access.log");
    let up = upkeep(server.addr, &log, "", "").await;
    let url = format!("ws://{}/chat", up.listeners[0]);

    let r = ws_client(&[&url, "echo", "500"]).await;
    assert_eq!(r["ok"], true, "every echo came back in order: {r}");
    assert_eq!(r["messages"], 1000);
    // The server's close frame (code and reason) reached the client.
    assert_eq!(
        r["server_close"],
        serde_json::json!({"code": 4001, "reason": "server says bye"})
    );
    // And the client's reached the server, on a connection that echoed 1,000 messages.
    let seen = server.ended(2).await;
    let chat = seen
        .iter()
        .find(|v| v["echoed"] == 1000)
        .unwrap_or_else(|| panic!("{seen:?}"));
    assert_eq!(chat["code"], 4002, "{chat}");
    assert_eq!(chat["reason"], "client says bye");
    assert_eq!(chat["path"], "/chat");
    assert_eq!(chat["upgrade"], "websocket");

    // Counted: two upgraded connections that both closed, their bytes both ways, none open.
    let payload = r["payload_bytes"].as_u64().unwrap() as f64;
    let lines = wait_log(&log, 2).await;
    assert_eq!(
        lines.len(),
        2,
        "one access-log line per upgraded connection"
    );
    for l in &lines {
        assert_eq!(l["status"], 101, "{l}");
        assert_eq!(l["incomplete"], false, "{l}");
        assert_eq!(l["cause"], Value::Null, "{l}");
    }
    let logged = |k: &str| lines.iter().map(|l| l[k].as_u64().unwrap()).sum::<u64>() as f64;
    let (bytes_in, bytes_out) = (logged("bytes_in"), logged("bytes_out"));
    // Client frames carry a 6-byte header at least (masked), server frames 2.
    assert!(
        bytes_in >= payload + 6.0 * 1000.0,
        "{bytes_in} in, {payload} payload"
    );
    assert!(bytes_out >= payload + 2.0 * 1000.0, "{bytes_out} out");
    assert!(bytes_in < payload * 1.2 + 20_000.0 && bytes_out < payload * 1.2 + 20_000.0);
    let metric_in = support::metric(&up, "upkeep_upgraded_bytes_total{direction=\"in\"}").await;
    let metric_out = support::metric(&up, "upkeep_upgraded_bytes_total{direction=\"out\"}").await;
    assert_eq!((metric_in, metric_out), (bytes_in, bytes_out));
    assert_eq!(
        support::metric(&up, "upkeep_upgraded_connections_total{end=\"closed\"}").await,
        2.0
    );
    assert_eq!(
        support::metric(&up, "upkeep_upgraded_connections_open").await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upgrade_is_relayed_as_it_is_and_the_connection_goes_on_as_http() {
    if !have_websockets().await {
        return;
    }
    let dir = upgrade_dir("refused");
    let server = echo_server().await;
    let log = dir.path("access.log");
    let up = upkeep(server.addr, &log, "", "").await;
    let r = ws_client(&[&format!("ws://{}/refuse", up.listeners[0]), "refused"]).await;
    assert_eq!(r["status"], 403, "{r}");
    assert_eq!(r["body"], "upgrade refused here\n");

    // On one connection: the refused upgrade, then a plain request right behind it. The
    // second is checked as HTTP and answered on the same connection.
    let mut s = tokio::net::TcpStream::connect(up.listeners[0])
        .await
        .unwrap();
    s.write_all(
        b"GET /refuse HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n\
          GET /plain HTTP/1.1\r\nHost: a.test\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read_both = async {
        while String::from_utf8_lossy(&got).matches("HTTP/1.1 ").count() < 2
            || !String::from_utf8_lossy(&got).contains("upgrade refused here")
        {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read_both)
        .await
        .expect("two answers in time");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 403 "), "{text}");
    // The websockets server answers a plain GET with 426 Upgrade Required.
    assert!(text.contains("HTTP/1.1 426 "), "{text}");
    assert_eq!(
        support::metric(&up, "upkeep_upgraded_connections_open").await,
        0.0
    );
    assert_eq!(
        support::metric(&up, "upkeep_upgraded_connections_total").await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_upgraded_connection_is_closed_at_upgrade_idle_timeout_and_counted_while_open() {
    if !have_websockets().await {
        return;
    }
    let dir = upgrade_dir("idle");
    let server = echo_server().await;
    let log = dir.path("access.log");
    let up = upkeep(server.addr, &log, "", "upgrade_idle_timeout = \"700ms\"").await;
    let url = format!("ws://{}/idle", up.listeners[0]);
    let client = tokio::spawn(async move { ws_client(&[&url, "hold"]).await });
    // While it is open it is counted.
    let mut open = 0.0;
    for _ in 0..100 {
        open = support::metric(&up, "upkeep_upgraded_connections_open").await;
        if open == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(open, 1.0, "the open upgraded connection is counted");
    let r = client.await.unwrap();
    assert_eq!(r["how"], "closed", "{r}");
    let after = r["after_s"].as_f64().unwrap();
    assert!(
        (0.5..6.0).contains(&after),
        "closed after {after} s of silence"
    );
    let lines = wait_log(&log, 1).await;
    assert_eq!(lines[0]["status"], 101);
    assert_eq!(lines[0]["cause"], "upgrade_idle_timeout", "{}", lines[0]);
    assert_eq!(
        support::metric(
            &up,
            "upkeep_upgraded_connections_total{end=\"idle_timeout\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        support::metric(&up, "upkeep_timeouts_total{timeout=\"upgrade_idle\"}").await,
        1.0
    );
    assert_eq!(
        support::metric(&up, "upkeep_upgraded_connections_open").await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_an_upgraded_connection_after_shutdown_timeout_and_logs_it() {
    if !have_websockets().await {
        return;
    }
    let dir = upgrade_dir("shutdown");
    let server = echo_server().await;
    let log = dir.path("access.log");
    let up = upkeep(
        server.addr,
        &log,
        "[lifecycle]\ndrain_delay = \"0s\"\nshutdown_timeout = \"1500ms\"\n",
        "",
    )
    .await;
    let url = format!("ws://{}/stay", up.listeners[0]);
    let client = tokio::spawn(async move { ws_client(&[&url, "hold"]).await });
    for _ in 0..100 {
        if support::metric(&up, "upkeep_upgraded_connections_open").await == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let began = std::time::Instant::now();
    up.control(Control::Terminate);
    tokio::time::timeout(Duration::from_secs(10), up.wait())
        .await
        .expect("upkeep shuts down");
    let r = client.await.unwrap();
    assert_eq!(r["how"], "closed", "{r}");
    let after = began.elapsed().as_secs_f64();
    assert!(
        (1.2..8.0).contains(&after),
        "closed {after} s after shutdown began (shutdown_timeout 1.5 s)"
    );
    // The line is in the file when upkeep has exited.
    let lines = log_lines(&log);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["status"], 101);
    assert_eq!(lines[0]["cause"], "shutdown");
    assert!(lines[0]["bytes_in"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_over_http2_extended_connect_reaches_an_http1_websocket_server() {
    if !have_websockets().await {
        return;
    }
    if !support::py::have_node() {
        return;
    }
    let dir = upgrade_dir("h2");
    let server = echo_server().await;
    let log = dir.path("access.log");
    let up = upkeep(server.addr, &log, "", "").await;
    let r = support::py::node_h2_ws_client(up.listeners[0], "/over-h2", None).await;
    // RFC 8441 §5: 200 on the stream, no HTTP/1.1 handshake headers.
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(r["accept"], Value::Null, "{r}");
    assert_eq!(r["echo"], "hello over h2", "{r}");
    assert_eq!(r["close_code"], 4003, "{r}");
    assert_eq!(r["close_reason"], "h2 bye");
    // The backend saw an HTTP/1.1 WebSocket handshake and the client's close.
    let seen = server.ended(1).await;
    assert_eq!(seen[0]["path"], "/over-h2", "{seen:?}");
    assert_eq!(seen[0]["upgrade"], "websocket");
    assert_eq!(seen[0]["code"], 4003);
    let lines = wait_log(&log, 1).await;
    assert_eq!(lines[0]["proto"], "HTTP/2", "{}", lines[0]);
    assert_eq!(lines[0]["status"], 200);
    assert!(lines[0]["bytes_in"].as_u64().unwrap() >= 19 + 14);
    // Node resets the stream as it closes the session, so the end may be `closed` or `error`.
    assert_eq!(
        support::metric(&up, "upkeep_upgraded_connections_total").await,
        1.0
    );
    assert_eq!(
        support::metric(&up, "upkeep_upgraded_connections_open").await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_over_tls_with_http1_and_with_http2_as_a_browser_would() {
    if !have_websockets().await || !support::py::have_node() {
        return;
    }
    let dir = upgrade_dir("tls");
    let cert = rcgen::generate_simple_self_signed(vec!["upkeep.test".to_owned()]).unwrap();
    std::fs::write(dir.path("cert.pem"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path("key.pem"), cert.signing_key.serialize_pem()).unwrap();
    let server = echo_server().await;
    let log = dir.path("access.log");
    let config = support::one_group(&[server.addr], "").replace(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n",
        &format!(
            "[[listener]]\nlisten = \"127.0.0.1:0\"\ntls = {{ cert = \"{}\", key = \"{}\" }}\n",
            dir.path("cert.pem").display(),
            dir.path("key.pem").display()
        ),
    );
    let up = upkeep_toml(&config, &log, "").await;
    // wss:// with HTTP/1.1 (the websockets client offers no ALPN).
    let mut cmd = Command::new("python3");
    cmd.arg(format!("{SCRIPTS}/ws_client.py"))
        .args([&format!("wss://{}/secure", up.listeners[0]), "echo", "100"])
        .env("WS_CA", dir.path("cert.pem"));
    let r = support::py::last_json_line(cmd, Duration::from_secs(30)).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["server_close"]["code"], 4001, "{r}");
    // wss:// over HTTP/2 (ALPN h2, extended CONNECT): Node's client, as a browser does it.
    let r =
        support::py::node_h2_ws_client(up.listeners[0], "/secure-h2", Some(&dir.path("cert.pem")))
            .await;
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(r["echo"], "hello over h2", "{r}");
    assert_eq!(r["close_code"], 4003, "{r}");
    let lines = wait_log(&log, 3).await;
    let protos: Vec<&str> = lines.iter().filter_map(|l| l["proto"].as_str()).collect();
    assert!(
        protos.contains(&"HTTP/1.1") && protos.contains(&"HTTP/2"),
        "{protos:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_sent_right_behind_the_upgrade_request_reach_the_backend_after_the_101() {
    if !have_websockets().await {
        return;
    }
    let dir = upgrade_dir("early");
    let server = echo_server().await;
    let up = upkeep(server.addr, &dir.path("access.log"), "", "").await;
    // One write: the handshake and a WebSocket frame (mask key 0, so the payload is as is).
    // The framing check holds the frame until the 101 is relayed, then passes it unchecked.
    let payload = b"early bird";
    let mut bytes =
        b"GET /early HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            .to_vec();
    bytes.extend_from_slice(&[0x81, 0x80 | payload.len() as u8, 0, 0, 0, 0]);
    bytes.extend_from_slice(payload);
    let mut s = tokio::net::TcpStream::connect(up.listeners[0])
        .await
        .unwrap();
    s.write_all(&bytes).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let want_echo = [&[0x81, payload.len() as u8][..], payload].concat();
    let read = async {
        while !got
            .windows(want_echo.len())
            .any(|w| w == want_echo.as_slice())
        {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("the echo in time");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 101 "), "{text}");
    // RFC 6455 §1.3's example key and accept: the backend's handshake reached the client.
    assert!(
        text.to_ascii_lowercase()
            .contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{text}"
    );
    assert!(!text.to_ascii_lowercase().contains("keep-alive:"), "{text}");
    // Close (1000), then the server's close and end of stream.
    s.write_all(&[0x88, 0x82, 0, 0, 0, 0, 0x03, 0xe8])
        .await
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("closed in time")
        .unwrap();
    assert_eq!(&rest[..2], &[0x88, 0x02], "the server's close frame");
    // The server half-closed after its close frame and waits for ours: closing the client
    // side is passed on, and the server sees the connection end.
    drop(s);
    let seen = server.ended(1).await;
    assert_eq!(seen[0]["path"], "/early");
    assert_eq!(seen[0]["echoed"], 1);
    assert_eq!(seen[0]["code"], 1000);
}
