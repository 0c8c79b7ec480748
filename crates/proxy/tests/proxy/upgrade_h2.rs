//! WebSocket to HTTP/2 upstream groups (RFC 8441 extended CONNECT upstream), on the wire:
//! hypercorn serving an ASGI echo app (`tests/upgrade/h2_ws_server.py`) over h2c, TLS with
//! ALPN h2, and HTTP/1.1; the Python `websockets` client and Node's http2 client in front.
//! Covers docs/protocols.md "HTTP/2 upstreams", "Upgrades".

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use upkeep_proxy::access_log::AccessLogger;
use upkeep_proxy::config::AccessLog;
use upkeep_proxy::server::{start_with, Running};

use crate::support;
use crate::support::py::PyServer;
use crate::support::TempDir;

/// A temporary directory for one test's files.
fn upgrade_dir(name: &str) -> TempDir {
    TempDir::new(&format!("upgrade-h2-{name}"))
}
use crate::support::raw;

const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/upgrade");

/// Whether python3 with `websockets` and `hypercorn` is here (`support::py::have`).
async fn have_python_packages() -> bool {
    support::py::have("websockets.asyncio.client, hypercorn.asyncio")
}

/// hypercorn with the echo app: one JSON line per WebSocket it saw end.
async fn hypercorn(args: &[&str]) -> PyServer {
    PyServer::start(&format!("{SCRIPTS}/h2_ws_server.py"), args).await
}

/// Runs the `websockets` client (`ws_client.py`); its last stdout line, parsed.
async fn ws_client(args: &[&str]) -> Value {
    support::py::json_client(&format!("{SCRIPTS}/ws_client.py"), args).await
}

/// Starts upkeep in-process from `config`, with its access log in `log`.
async fn upkeep(config: &str, log: &Path) -> Running {
    upkeep_test_support::init_tracing();
    let toml = format!("access_log = \"{}\"\n{config}", log.display());
    let cfg = upkeep_proxy::config::parse(Path::new("test.toml"), &toml)
        .unwrap_or_else(|e| panic!("test config: {e}"));
    let logger = AccessLogger::start(&AccessLog::File(log.to_owned())).unwrap();
    start_with(cfg, None, logger).await.expect("upkeep starts")
}

/// Waits (bounded) until the access log has `n` lines.
async fn wait_log(path: &Path, n: usize) -> Vec<Value> {
    let read = || -> Vec<Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    for _ in 0..100 {
        let lines = read();
        if lines.len() >= n {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    read()
}

/// A self-signed certificate for `upstream.test`, written as cert.pem / key.pem in `dir`.
fn upstream_cert(dir: &TempDir) {
    let cert = rcgen::generate_simple_self_signed(vec!["upstream.test".to_owned()]).unwrap();
    std::fs::write(dir.path("cert.pem"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path("key.pem"), cert.signing_key.serialize_pem()).unwrap();
}

fn tls_group(addr: SocketAddr, dir: &TempDir, protocol: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[route]]\ngroup = \"app\"\n\n\
         [groups.app]\nendpoints = [\"https://{addr}\"]\nprotocol = \"{protocol}\"\n\n\
         [groups.app.tls]\nserver_name = \"upstream.test\"\nca = \"{}\"\n",
        dir.path("cert.pem").display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_websocket_to_an_http2_group_goes_as_extended_connect_1000_messages_each_way() {
    if !have_python_packages().await {
        return;
    }
    let dir = upgrade_dir("h2c");
    let server = hypercorn(&[]).await;
    let log = dir.path("access.log");
    let up = upkeep(
        &support::one_group(&[server.addr], "protocol = \"http2\"\n"),
        &log,
    )
    .await;
    let url = format!("ws://{}/chat", up.listeners[0]);

    let r = ws_client(&[&url, "echo", "500"]).await;
    assert_eq!(r["ok"], true, "every echo came back in order: {r}");
    assert_eq!(r["messages"], 1000);
    // The server's close frame (code and reason) reached the client through the stream.
    assert_eq!(
        r["server_close"],
        serde_json::json!({"code": 4001, "reason": "server says bye"})
    );
    // The server saw both WebSockets over HTTP/2, and the client's close code on the first.
    let seen = server.ended(2).await;
    assert!(
        seen.iter().all(|v| v["http_version"] == "2"),
        "extended CONNECT upstream: {seen:?}"
    );
    let chat = seen
        .iter()
        .find(|v| v["echoed"] == 1000)
        .unwrap_or_else(|| panic!("{seen:?}"));
    assert_eq!(chat["code"], 4002, "{chat}");
    assert_eq!(chat["reason"], "client says bye");
    assert_eq!(chat["path"], "/chat");

    // Logged and counted as any upgraded connection: status 101, bytes both ways.
    let payload = r["payload_bytes"].as_u64().unwrap() as f64;
    let lines = wait_log(&log, 2).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    for l in &lines {
        assert_eq!(l["status"], 101, "{l}");
        assert_eq!(l["proto"], "HTTP/1.1", "{l}");
        assert_eq!(l["cause"], Value::Null, "{l}");
    }
    let logged = |k: &str| lines.iter().map(|l| l[k].as_u64().unwrap()).sum::<u64>() as f64;
    let (bytes_in, bytes_out) = (logged("bytes_in"), logged("bytes_out"));
    assert!(
        bytes_in >= payload + 6.0 * 1000.0,
        "{bytes_in} in, {payload}"
    );
    assert!(bytes_out >= payload + 2.0 * 1000.0, "{bytes_out} out");
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

    // A refusal (hypercorn answers 403 to /refuse) is relayed as it is.
    let r = ws_client(&[&format!("ws://{}/refuse", up.listeners[0]), "refused"]).await;
    assert_eq!(r["status"], 403, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_websocket_to_an_http2_group_is_extended_connect_on_both_sides() {
    if !have_python_packages().await || !support::py::have_node() {
        return;
    }
    let dir = upgrade_dir("h2h2");
    let server = hypercorn(&[]).await;
    let log = dir.path("access.log");
    let up = upkeep(
        &support::one_group(&[server.addr], "protocol = \"http2\"\n"),
        &log,
    )
    .await;
    let r = support::py::node_h2_ws_client(up.listeners[0], "/both-h2", None).await;
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(
        r["accept"],
        Value::Null,
        "no Sec-WebSocket-Accept over HTTP/2: {r}"
    );
    assert_eq!(r["echo"], "hello over h2", "{r}");
    assert_eq!(r["close_code"], 4003, "{r}");
    let seen = server.ended(1).await;
    assert_eq!(seen[0]["http_version"], "2", "{seen:?}");
    assert_eq!(seen[0]["code"], 4003, "{seen:?}");
    let lines = wait_log(&log, 1).await;
    assert_eq!(lines[0]["status"], 200, "{lines:?}");
    assert_eq!(lines[0]["proto"], "HTTP/2", "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_to_an_h2c_peer_without_extended_connect_is_502_upstream_no_upgrade() {
    if !have_python_packages().await {
        return;
    }
    let dir = upgrade_dir("nosetting");
    let server = hypercorn(&["--no-connect-protocol"]).await;
    let log = dir.path("access.log");
    let up = upkeep(
        &support::one_group(&[server.addr], "protocol = \"http2\"\n"),
        &log,
    )
    .await;
    let head = raw::exchange(
        up.listeners[0],
        b"GET /chat HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        Duration::from_secs(2),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 502 "), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("upkeep-error: upstream_no_upgrade"),
        "{head}"
    );
    let lines = wait_log(&log, 1).await;
    assert_eq!(lines[0]["cause"], "upstream_no_upgrade", "{lines:?}");
    assert_eq!(
        support::metric(
            &up,
            "upkeep_responses_total{origin=\"proxy\",class=\"5xx\",cause=\"upstream_no_upgrade\"}"
        )
        .await,
        1.0
    );
    // No WebSocket reached the peer.
    assert!(server.lines.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_group_over_tls_upgrades_over_http1_when_the_peer_has_no_extended_connect() {
    if !have_python_packages().await {
        return;
    }
    let dir = upgrade_dir("auto");
    upstream_cert(&dir);
    let (cert, key) = (dir.path("cert.pem"), dir.path("key.pem"));
    let tls = ["--tls", cert.to_str().unwrap(), key.to_str().unwrap()];
    // Without the setting: a fresh HTTP/1.1 connection (ALPN http/1.1) carries the upgrade.
    let plain = hypercorn(&[&["--no-connect-protocol"][..], &tls[..]].concat()).await;
    let up = upkeep(
        &tls_group(plain.addr, &dir, "auto"),
        &dir.path("access.log"),
    )
    .await;
    let r = ws_client(&[&format!("ws://{}/auto", up.listeners[0]), "echo", "100"]).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["server_close"]["code"], 4001, "{r}");
    let seen = plain.ended(2).await;
    assert!(
        seen.iter().all(|v| v["http_version"] == "1.1"),
        "over HTTP/1.1: {seen:?}"
    );
    assert!(seen.iter().any(|v| v["code"] == 4002), "{seen:?}");
    drop(up);

    // With it: the shared HTTP/2 connection (ALPN h2) carries an extended CONNECT.
    let h2 = hypercorn(&tls).await;
    let up = upkeep(&tls_group(h2.addr, &dir, "auto"), &dir.path("access2.log")).await;
    let r = ws_client(&[&format!("ws://{}/auto-h2", up.listeners[0]), "echo", "100"]).await;
    assert_eq!(r["ok"], true, "{r}");
    let seen = h2.ended(2).await;
    assert!(
        seen.iter().all(|v| v["http_version"] == "2"),
        "over HTTP/2: {seen:?}"
    );
}
