//! Python test servers and clients (`websockets`, hypercorn, http.server scripts under
//! `tests/`): a server prints its port on its first stdout line and then one JSON line per
//! event it reports; a client (Python or Node) prints its result as its last stdout line.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Whether python3 can import `modules` (`import` syntax, comma-separated). Outside CI a
/// missing one skips the test that asks; under CI, which installs them (`.ci/run`), it fails.
pub fn have(modules: &str) -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 modules {modules} are installed by .ci/run"
        );
        eprintln!("skipped: python3 cannot import {modules}");
    }
    ok
}

/// A Python server script; killed on drop. `lines` collects its JSON lines.
pub struct PyServer {
    _child: Child,
    pub addr: SocketAddr,
    pub lines: Arc<Mutex<Vec<Value>>>,
}

impl PyServer {
    /// Starts `python3 script args...` and waits (bounded) for the port it prints.
    pub async fn start(script: &str, args: &[&str]) -> PyServer {
        let mut child = Command::new("python3")
            .arg(script)
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 starts");
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let port: u16 = tokio::time::timeout(Duration::from_secs(10), out.next_line())
            .await
            .unwrap_or_else(|_| panic!("{script} prints its port"))
            .unwrap()
            .expect("a port line")
            .trim()
            .parse()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        tokio::spawn(async move {
            while let Ok(Some(l)) = out.next_line().await {
                if let Ok(v) = serde_json::from_str(&l) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        PyServer {
            _child: child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            lines,
        }
    }

    /// Waits (bounded, 5 s) until the server has reported `n` lines; returns them all.
    pub async fn ended(&self, n: usize) -> Vec<Value> {
        for _ in 0..100 {
            if self.lines.lock().unwrap().len() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.lines.lock().unwrap().clone()
    }

    /// The first line `matches` accepts (bounded wait, 5 s).
    pub async fn find(&self, matches: impl Fn(&Value) -> bool) -> Option<Value> {
        for _ in 0..100 {
            if let Some(v) = self.lines.lock().unwrap().iter().find(|v| matches(v)) {
                return Some(v.clone());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

/// Runs `python3 script args...` (bounded, 30 s); its last stdout line, parsed as JSON.
pub async fn json_client(script: &str, args: &[&str]) -> Value {
    let mut cmd = Command::new("python3");
    cmd.arg(script).args(args);
    last_json_line(cmd, Duration::from_secs(30)).await
}

/// Runs a client (bounded by `within`, killed past it); its last stdout line, parsed as JSON.
pub async fn last_json_line(mut cmd: Command, within: Duration) -> Value {
    let out = tokio::time::timeout(within, cmd.kill_on_drop(true).output())
        .await
        .expect("client finished in time")
        .expect("client runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|_| {
        panic!(
            "client output: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Whether Node.js is here; outside CI a missing one skips the test, under CI it fails.
pub fn have_node() -> bool {
    let ok = std::process::Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "node is installed by .ci/run"
        );
        eprintln!("skipped: node is not installed");
    }
    ok
}

/// Node's http2 client (`tests/upgrade/h2_ws_client.js`) opening a WebSocket with an
/// extended CONNECT to `addr`, in clear text or over TLS trusting `ca`; what it saw.
pub async fn node_h2_ws_client(
    addr: SocketAddr,
    path: &str,
    ca: Option<&std::path::Path>,
) -> Value {
    let mut cmd = Command::new("node");
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/upgrade/h2_ws_client.js"
    ))
    .arg(addr.port().to_string())
    .arg(path);
    if let Some(ca) = ca {
        cmd.arg(ca);
    }
    last_json_line(cmd, Duration::from_secs(20)).await
}
