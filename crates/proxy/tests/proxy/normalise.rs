//! Version and header normalisation between the two sides (rules V1, H4, K1, T1 of
//! `normalize/rules.md`), asserted on the wire with real clients and servers.

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::Command;

use crate::support::raw::{exchange, RawBackend, OK};
use crate::support::{curl, one_group, upkeep};

/// Python's own HTTP/1.0 server (`python3 -m http.server`) on a port of its choosing,
/// serving `dir`; stopped when the handle drops.
async fn python_http10_server(dir: &std::path::Path) -> (tokio::process::Child, u16) {
    let mut child = Command::new("python3")
        .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1"])
        .arg("--directory")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
        .await
        .expect("python server announces its port")
        .unwrap()
        .unwrap();
    // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
    let port = first
        .split_whitespace()
        .skip_while(|w| *w != "port")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {first:?}"));
    (child, port)
}

#[tokio::test]
async fn an_http10_backend_is_answered_as_http11_and_curl_keeps_its_connection() {
    let dir = tempfile_dir("http10");
    std::fs::write(dir.join("hello.txt"), "hello from 1.0\n").unwrap();
    let (_python, port) = python_http10_server(&dir).await;
    let backend = format!("127.0.0.1:{port}");

    // The backend itself speaks HTTP/1.0 and closes after each response.
    let (_, direct) = curl(&["-sv", &format!("http://{backend}/hello.txt")]).await;
    assert!(direct.contains("< HTTP/1.0 200"), "{direct}");

    let up = upkeep(&one_group(&[backend.parse().unwrap()], "")).await;
    let url = format!("http://{}/hello.txt", up.listeners[0]);
    let (body, trace) = curl(&["-sv", &url, &url]).await;
    assert_eq!(body, "hello from 1.0\nhello from 1.0\n", "{trace}");
    assert_eq!(
        trace.matches("< HTTP/1.1 200 OK").count(),
        2,
        "both answers are HTTP/1.1:\n{trace}"
    );
    assert!(!trace.contains("HTTP/1.0"), "{trace}");
    assert!(
        trace.contains("Re-using existing connection"),
        "curl keeps its connection for the second request:\n{trace}"
    );
    assert_eq!(
        trace.matches("Connected to").count(),
        1,
        "one connection for two requests:\n{trace}"
    );
    assert!(trace.contains("< keep-alive: timeout=620"), "{trace}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_http10_client_without_host_is_sent_upstream_with_the_listeners_address_as_host() {
    let b = RawBackend::start(OK).await;
    let up = upkeep(&one_group(&[b.addr()], "")).await;
    let l = up.listeners[0];
    let resp = exchange(l, b"GET /old HTTP/1.0\r\n\r\n", Duration::from_secs(3)).await;
    // An HTTP/1.0 client is answered `HTTP/1.1` (RFC 9110 §6.2: a server sends its own
    // version), and the connection closes after the response, so no keep-alive hint is sent.
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    assert!(resp.contains("\r\nconnection: close\r\n"), "{resp}");
    assert!(!resp.to_ascii_lowercase().contains("keep-alive"), "{resp}");
    assert!(resp.ends_with("\r\n\r\nok"), "{resp}");
    let seen = b.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].request_line(), "GET /old HTTP/1.1");
    assert_eq!(seen[0].value("host"), l.to_string(), "{}", seen[0].head);

    // A Host the client sent is forwarded as sent.
    let resp = exchange(
        l,
        b"GET /new HTTP/1.0\r\nHost: named.test:8080\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    assert_eq!(b.seen()[1].value("host"), "named.test:8080");

    // One that asks to keep its connection keeps it, and is told for how long.
    let mut s = TcpStream::connect(l).await.unwrap();
    for i in 0..2 {
        s.write_all(b"GET /ka HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        let resp = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
        assert!(resp.starts_with("http/1.1 200 ok\r\n"), "{i}: {resp}");
        assert!(
            resp.contains("\r\nconnection: keep-alive\r\n"),
            "{i}: {resp}"
        );
        assert!(
            resp.contains("\r\nkeep-alive: timeout=620\r\n"),
            "{i}: {resp}"
        );
    }
}

#[tokio::test]
async fn cookie_crumbs_from_an_http2_client_reach_an_http11_backend_as_one_cookie_line() {
    let b = RawBackend::start(OK).await;
    let up = upkeep(&one_group(&[b.addr()], "")).await;
    let stream = TcpStream::connect(up.listeners[0]).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get("http://crumbs.test/c")
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .header("cookie", "c=3; d=4")
        .header("x-after", "kept")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        &resp.into_body().collect().await.unwrap().to_bytes()[..],
        b"ok"
    );
    let seen = b.seen();
    assert_eq!(seen[0].request_line(), "GET /c HTTP/1.1");
    assert_eq!(
        seen[0].values("cookie"),
        vec!["a=1; b=2; c=3; d=4"],
        "{}",
        seen[0].head
    );
    assert_eq!(seen[0].value("x-after"), "kept");
}

#[tokio::test]
async fn an_upstream_response_with_transfer_encoding_and_content_length_loses_the_length() {
    let b = RawBackend::start(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nX-Up: 1\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await;
    let up = upkeep(&one_group(&[b.addr()], "")).await;
    let resp = exchange(
        up.listeners[0],
        b"GET /te HTTP/1.1\r\nHost: te.test\r\nConnection: close\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    let (head, body) = resp.split_once("\r\n\r\n").expect("a response head");
    let lower = head.to_ascii_lowercase();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{resp}");
    assert!(!lower.contains("content-length"), "{resp}");
    assert!(lower.contains("transfer-encoding: chunked"), "{resp}");
    assert!(lower.contains("x-up: 1"), "{resp}");
    assert!(
        body.contains("hello") && body.contains(" world") && body.ends_with("0\r\n\r\n"),
        "the whole chunked body arrives: {resp}"
    );

    // curl reads the same response to its end, at its real length.
    let url = format!("http://{}/te", up.listeners[0]);
    let (out, trace) = curl(&["-sv", &url]).await;
    assert_eq!(out, "hello world", "{trace}");
    assert!(
        !trace.to_ascii_lowercase().contains("< content-length"),
        "{trace}"
    );
}

fn tempfile_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "upkeep-normalise-{tag}-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        .into()
}
