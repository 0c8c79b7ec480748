//! gRPC end to end: grpcio's own client and server (Python, `tests/py/`) with upkeep between
//! them, h2c on both sides. Unary and the three streaming kinds, a failing call's status and
//! trailing metadata, upkeep's own failures as gRPC errors (UNAVAILABLE, DEADLINE_EXCEEDED).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::support::{one_group, upkeep};

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name)
}

/// Whether grpcio is importable; outside CI a machine without it skips (CI installs it).
fn grpcio() -> bool {
    crate::support::py::have("grpc")
}

/// The grpcio echo server; stopped (stdin closed, then killed) on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
    /// What the server prints after its port, line by line.
    lines: std::sync::mpsc::Receiver<String>,
}

impl Server {
    fn start() -> Self {
        let mut child = Command::new("python3")
            .arg(script("grpc_echo_server.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 starts");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let port: u16 = line.trim().parse().expect("the server prints its port");
        let (tx, lines) = std::sync::mpsc::channel();
        // Ends with the server's stdout.
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            lines,
        }
    }

    /// The next line the server prints within `within`.
    fn next_line(&self, within: std::time::Duration) -> Option<String> {
        self.lines.recv_timeout(within).ok()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one client case against `addr`; what the client saw.
async fn call(addr: SocketAddr, case: &str) -> Value {
    let out = tokio::process::Command::new("python3")
        .arg(script("grpc_echo_client.py"))
        .arg(addr.to_string())
        .arg(case)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(20), out)
        .await
        .expect("client ends in time")
        .unwrap();
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("client prints JSON")
}

/// upkeep in front of the grpcio server, speaking HTTP/2 to it.
async fn through_upkeep(extra: &str) -> Option<(Server, upkeep_proxy::server::Running)> {
    if !grpcio() {
        return None;
    }
    let server = Server::start();
    let up = upkeep(&one_group(
        &[server.addr],
        &format!("protocol = \"http2\"\n{extra}"),
    ))
    .await;
    Some((server, up))
}

#[tokio::test]
async fn grpc_unary_call_passes_with_its_trailing_metadata() {
    let Some((_s, up)) = through_upkeep("").await else {
        return;
    };
    let r = call(up.listeners[0], "unary").await;
    assert_eq!(r["code"], "OK", "{r}");
    assert_eq!(r["result"]["reply"], "echo:hi");
    assert_eq!(r["result"]["trailing"]["x-trailer"], "done");
}

#[tokio::test]
async fn grpc_server_streaming_passes_every_message() {
    let Some((_s, up)) = through_upkeep("").await else {
        return;
    };
    let r = call(up.listeners[0], "server_stream").await;
    assert_eq!(r["code"], "OK", "{r}");
    let got: Vec<&str> = r["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let want: Vec<String> = (0..50).map(|i| format!("msg-{i}")).collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn grpc_client_streaming_passes_every_message() {
    let Some((_s, up)) = through_upkeep("").await else {
        return;
    };
    let r = call(up.listeners[0], "client_stream").await;
    assert_eq!(r["code"], "OK", "{r}");
    // 100 messages of 1..=100 bytes.
    assert_eq!(r["result"], "100:5050");
}

#[tokio::test]
async fn grpc_bidirectional_streaming_is_interactive_through_upkeep() {
    let Some((_s, up)) = through_upkeep("").await else {
        return;
    };
    let r = call(up.listeners[0], "bidi").await;
    assert_eq!(r["code"], "OK", "{r}");
    let got: Vec<&str> = r["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let want: Vec<String> = (0..20).map(|i| format!("re:m{i}")).collect();
    assert_eq!(
        got, want,
        "each answer arrived before the next message was sent"
    );
}

#[tokio::test]
async fn grpc_failing_call_keeps_its_status_message_and_trailing_metadata() {
    let Some((_s, up)) = through_upkeep("").await else {
        return;
    };
    let r = call(up.listeners[0], "fail").await;
    assert_eq!(r["code"], "FAILED_PRECONDITION", "{r}");
    assert_eq!(r["details"], "nope");
    assert_eq!(r["trailing"]["x-why"], "because");
    assert!(
        r["trailing"].get("upkeep-error").is_none(),
        "the backend's failure is passed through, not upkeep's: {r}"
    );
}

#[tokio::test]
async fn grpc_call_slower_than_try_timeout_gets_deadline_exceeded_from_upkeep() {
    let Some((_s, up)) = through_upkeep("try_timeout = \"400ms\"\n").await else {
        return;
    };
    let start = std::time::Instant::now();
    let r = call(up.listeners[0], "slow").await;
    assert_eq!(r["code"], "DEADLINE_EXCEEDED", "{r}");
    assert_eq!(r["details"], "upkeep: upstream_timeout");
    assert_eq!(r["trailing"]["upkeep-error"], "upstream_timeout");
    assert!(
        start.elapsed() < std::time::Duration::from_millis(2900),
        "answered before the backend's 3 s"
    );
}

#[tokio::test]
async fn grpc_call_with_no_peer_up_gets_unavailable_with_the_cause() {
    if !grpcio() {
        return;
    }
    let (_held, gone) = crate::support::refusing_addr();
    let up = upkeep(&one_group(&[gone], "protocol = \"http2\"\n")).await;
    let r = call(up.listeners[0], "unary").await;
    assert_eq!(r["code"], "UNAVAILABLE", "{r}");
    assert_eq!(r["details"], "upkeep: connect_failed");
    assert_eq!(r["trailing"]["upkeep-error"], "connect_failed");
}

#[tokio::test]
async fn grpc_stream_outlasting_the_route_deadline_ends_deadline_exceeded_and_cancels_upstream() {
    if !grpcio() {
        return;
    }
    let s = Server::start();
    let up = upkeep(&format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\ngroup = \"app\"\ntry_timeout = \"500ms\"\ndeadline = \"800ms\"\n\n\
         [groups.app]\nendpoints = [\"{}\"]\nprotocol = \"http2\"\n",
        s.addr
    ))
    .await;
    let start = std::time::Instant::now();
    // The backend streams 100 messages 100 ms apart (10 s); the client's own deadline is 10 s.
    let r = call(up.listeners[0], "slow_stream").await;
    assert_eq!(r["code"], "DEADLINE_EXCEEDED", "{r}");
    assert_eq!(r["details"], "upkeep: call_deadline", "{r}");
    assert_eq!(r["trailing"]["upkeep-error"], "call_deadline", "{r}");
    let n = r["messages"].as_array().unwrap().len();
    assert!(
        (2..=9).contains(&n),
        "the stream was under way when the deadline cut it: {n} messages"
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    let line = s
        .next_line(std::time::Duration::from_secs(6))
        .expect("the backend saw its call cancelled");
    assert!(line.starts_with("cancelled SlowStream after"), "{line}");
}

#[tokio::test]
async fn grpc_timeout_bounds_a_streaming_call_after_its_response_head() {
    let Some((s, up)) = through_upkeep("").await else {
        return;
    };
    if Command::new("nghttp").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "nghttp is installed by .ci/run"
        );
        return;
    }
    // nghttp sends `grpc-timeout` without enforcing it (grpcio's client would end the call
    // itself at the same moment), and prints every frame it receives.
    let body = std::env::temp_dir().join(format!(
        "upkeep-grpc-timeout-{}-{}",
        std::process::id(),
        up.listeners[0].port()
    ));
    let mut frame = vec![0u8, 0, 0, 0, 3];
    frame.extend_from_slice(b"100");
    std::fs::write(&body, frame).unwrap();
    let start = std::time::Instant::now();
    let out = tokio::process::Command::new("nghttp")
        .args(["-v", "-d"])
        .arg(&body)
        .args([
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "-H",
            "grpc-timeout: 700m",
        ])
        .arg(format!("http://{}/echo.Echo/SlowStream", up.listeners[0]))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(15), out)
        .await
        .expect("nghttp ends")
        .unwrap();
    let _ = std::fs::remove_file(&body);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(":status: 200"), "{text}");
    let head_at = text.find(":status: 200").unwrap();
    let trailer_at = text
        .find("grpc-status: 4")
        .unwrap_or_else(|| panic!("DEADLINE_EXCEEDED in trailers: {text}"));
    assert!(trailer_at > head_at, "after the response head: {text}");
    assert!(
        text.contains("grpc-message: upkeep: call_deadline"),
        "{text}"
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    let line = s
        .next_line(std::time::Duration::from_secs(6))
        .expect("the backend saw its call cancelled");
    assert!(line.starts_with("cancelled SlowStream after"), "{line}");
}

#[tokio::test]
async fn grpc_status_and_custom_trailers_reach_an_http11_client_that_sent_te_trailers() {
    let Some((_s, up)) = through_upkeep("").await else {
        return;
    };
    // curl speaks HTTP/1.1 to upkeep, upkeep HTTP/2 to grpcio; `--raw` shows the chunked
    // framing with its trailer section.
    let body = std::env::temp_dir().join(format!(
        "upkeep-grpc-h1-{}-{}",
        std::process::id(),
        up.listeners[0].port()
    ));
    let mut frame = vec![0u8, 0, 0, 0, 2];
    frame.extend_from_slice(b"hi");
    std::fs::write(&body, frame).unwrap();
    let run = |te: bool| {
        let mut c = tokio::process::Command::new("curl");
        c.args(["-sS", "--raw", "-i", "--http1.1", "--max-time", "10"])
            .args(["-H", "content-type: application/grpc"]);
        if te {
            c.args(["-H", "TE: trailers"]);
        }
        c.arg("--data-binary")
            .arg(format!("@{}", body.display()))
            .arg(format!("http://{}/echo.Echo/Unary", up.listeners[0]))
            .kill_on_drop(true)
            .output()
    };
    let with = run(true).await.unwrap();
    let without = run(false).await.unwrap();
    let _ = std::fs::remove_file(&body);
    let with = String::from_utf8_lossy(&with.stdout).to_ascii_lowercase();
    let without = String::from_utf8_lossy(&without.stdout).to_ascii_lowercase();
    assert!(with.contains("transfer-encoding: chunked"), "{with}");
    assert!(
        with.contains("trailer: grpc-status, grpc-message, grpc-status-details-bin"),
        "{with}"
    );
    let last_chunk = with.rfind("\r\n0\r\n").expect("a last chunk");
    assert!(
        with[last_chunk..].contains("grpc-status: 0\r\n"),
        "grpc-status in the trailer section: {with}"
    );
    // The call's custom trailing metadata, unknown when the head went out, follows it.
    assert!(
        with[last_chunk..].contains("x-trailer: done\r\n"),
        "custom trailing metadata in the trailer section: {with}"
    );
    assert!(!without.contains("grpc-status"), "{without}");
    assert!(!without.contains("x-trailer"), "{without}");
}
