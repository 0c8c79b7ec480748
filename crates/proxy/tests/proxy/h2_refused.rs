//! HTTP/2 streams refused below the handler (over `max_concurrent_streams`, a malformed head
//! such as an invalid `:authority`) are access-logged and counted like HTTP/1 refusals. The
//! client speaks raw frames: well-behaved h2 clients cannot be made to send these.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use upkeep_proxy::access_log::AccessLogger;
use upkeep_proxy::config::AccessLog;
use upkeep_proxy::server::{start_with, Running};
use upkeep_test_support::TestBackend;

use crate::support::{self, metric};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn temp_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("upkeep-h2-refused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join(name);
    let _ = std::fs::remove_file(&f);
    f
}

async fn upkeep_logging(toml: &str, log: &Path) -> Running {
    upkeep_test_support::init_tracing();
    let cfg = upkeep_proxy::config::parse(Path::new("test.toml"), toml).expect("test config");
    let logger = AccessLogger::start(&AccessLog::File(log.to_owned())).unwrap();
    start_with(cfg, None, logger).await.expect("upkeep starts")
}

fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], ty, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A header block of HPACK literals without indexing (new names), no Huffman coding.
fn block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (name, value) in fields {
        b.push(0x00);
        b.push(name.len() as u8);
        b.extend_from_slice(name.as_bytes());
        b.push(value.len() as u8);
        b.extend_from_slice(value.as_bytes());
    }
    b
}

fn request(method: &str, authority: &str) -> Vec<u8> {
    block(&[
        (":method", method),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", authority),
    ])
}

/// Connects, exchanges prefaces and settings (acknowledging the server's, so its
/// `max_concurrent_streams` is in force).
async fn connect(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(PREFACE).await.unwrap();
    s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    loop {
        let (ty, flags, _, _) = read_frame(&mut s).await;
        if ty == SETTINGS && flags & 0x1 == 0 {
            s.write_all(&frame(SETTINGS, 0x1, 0, &[])).await.unwrap();
            return s;
        }
    }
}

async fn read_frame(s: &mut TcpStream) -> (u8, u8, u32, Vec<u8>) {
    let mut head = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut head))
        .await
        .expect("a frame within 5 s")
        .expect("connection open");
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.unwrap();
    (head[3], head[4], stream, payload)
}

/// Reads frames until one of type `ty` on `stream`; returns its payload.
async fn wait_for(s: &mut TcpStream, ty: u8, stream: u32) -> Vec<u8> {
    loop {
        let (t, _, id, payload) = read_frame(s).await;
        if t == ty && id == stream {
            return payload;
        }
    }
}

async fn log_lines(log: &Path, want: usize) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    for _ in 0..60 {
        lines = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .collect();
        if lines.len() >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_with_an_invalid_authority_is_refused_logged_and_counted() {
    let b = TestBackend::start("b").await;
    let log = temp_file("authority.log");
    let up = upkeep_logging(&support::one_group(&[b.addr()], ""), &log).await;
    let mut s = connect(up.listeners[0]).await;
    s.write_all(&frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &request("GET", "["),
    ))
    .await
    .unwrap();
    let code = wait_for(&mut s, RST_STREAM, 1).await;
    assert_eq!(code, 1u32.to_be_bytes(), "PROTOCOL_ERROR");
    // The connection serves on: a valid request on the next stream is answered.
    s.write_all(&frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &request("GET", "a.test"),
    ))
    .await
    .unwrap();
    wait_for(&mut s, HEADERS, 3).await;
    assert_eq!(
        b.seen().len(),
        1,
        "only the valid stream reached the upstream"
    );
    let series = "upkeep_responses_total{origin=\"proxy\",class=\"4xx\",cause=\"bad_request\"}";
    let mut refused = 0.0;
    for _ in 0..40 {
        refused = metric(&up, series).await;
        if refused >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(refused, 1.0);
    let lines = log_lines(&log, 2).await;
    let refused: Vec<_> = lines.iter().filter(|l| l["status"] == 400).collect();
    assert_eq!(refused.len(), 1, "{lines:?}");
    assert_eq!(refused[0]["proto"], "HTTP/2");
    assert_eq!(refused[0]["cause"], "bad_request");
    assert_eq!(refused[0]["reason"], "malformed_stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_over_max_concurrent_streams_are_refused_logged_and_counted() {
    let b = TestBackend::start("b").await;
    let log = temp_file("streams.log");
    let cfg = support::one_group(&[b.addr()], "").replacen(
        "listen = \"127.0.0.1:0\"\n\n[[route]]",
        "listen = \"127.0.0.1:0\"\nclient_body_timeout = \"5s\"\n\n[[route]]",
        1,
    );
    let up = upkeep_logging(&cfg, &log).await;
    let mut s = connect(up.listeners[0]).await;
    // 200 streams (the advertised limit) stay open: their request bodies never come. The
    // 201st and 202nd are over the limit.
    let mut burst = Vec::new();
    for i in 0..202u32 {
        burst.extend(frame(
            HEADERS,
            END_HEADERS,
            1 + 2 * i,
            &request("POST", "a.test"),
        ));
    }
    s.write_all(&burst).await.unwrap();
    for id in [401, 403] {
        let code = wait_for(&mut s, RST_STREAM, id).await;
        assert_eq!(code, 7u32.to_be_bytes(), "REFUSED_STREAM on {id}");
    }
    // Logged by the connection's task once it sees the resets go out.
    let series = "upkeep_responses_total{origin=\"proxy\",class=\"5xx\",cause=\"overloaded\"}";
    let mut refused = 0.0;
    for _ in 0..40 {
        refused = metric(&up, series).await;
        if refused >= 2.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(refused, 2.0);
    let lines = log_lines(&log, 2).await;
    let refused: Vec<_> = lines
        .iter()
        .filter(|l| l["reason"] == "refused_stream")
        .collect();
    assert_eq!(refused.len(), 2, "{lines:?}");
    assert_eq!(refused[0]["proto"], "HTTP/2");
    assert_eq!(refused[0]["cause"], "overloaded");
    assert_eq!(refused[0]["status"], 503);
}

/// A real h2 client (hyper's) with a 64 KiB stream window that stops reading a large
/// response: the stream is reset at `send_timeout`, counted, and the connection serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_whose_client_grants_no_window_is_reset_at_send_timeout() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let b = TestBackend::start("b").await;
    let cfg = support::one_group(&[b.addr()], "").replacen(
        "listen = \"127.0.0.1:0\"\n\n[[route]]",
        "listen = \"127.0.0.1:0\"\nsend_timeout = \"500ms\"\n\n[[route]]",
        1,
    );
    let up = support::upkeep(&cfg).await;
    let stream = TcpStream::connect(up.listeners[0]).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(65_535)
        .adaptive_window(false)
        .handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let get = |path: &str| {
        http::Request::get(format!("http://a.test{path}"))
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let start = tokio::time::Instant::now();
    let resp = sender.send_request(get("/bytes/4000000")).await.unwrap();
    assert_eq!(resp.status(), 200);
    // Not read: no window is granted past the first 64 KiB.
    let mut stalled = resp.into_body();
    let mut series = 0.0;
    for _ in 0..60 {
        series = metric(&up, "upkeep_timeouts_total{timeout=\"send\"}").await;
        if series >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cut_after = start.elapsed();
    assert_eq!(series, 1.0, "the stalled stream was not cut within 3 s");
    assert!(
        cut_after >= Duration::from_millis(450),
        "cut after {cut_after:?}, before send_timeout"
    );
    // Reading now: what was sent within the window, then the reset.
    let mut got = 0usize;
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(3), stalled.frame()).await {
            Ok(Some(Ok(f))) => got += f.data_ref().map_or(0, |d| d.len()),
            Ok(Some(Err(e))) => break format!("error: {e}"),
            Ok(None) => break "end".to_owned(),
            Err(_) => break "timeout".to_owned(),
        }
    };
    assert!(
        ended.starts_with("error"),
        "the stream was reset: {ended}, {got} bytes"
    );
    assert!(got < 4_000_000, "{got} bytes");
    // The connection and its other streams go on.
    let resp = sender.send_request(get("/ok")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"b /ok\n");
}
