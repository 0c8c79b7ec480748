//! upkeep's own HTTP/1 server side (docs/http1.md), on the wire: HTTP/1.0 clients answered
//! `HTTP/1.1` with the keep-alive rules of RFC 9112 appendix C.2.2, pipelined requests in
//! order, and a request the own server hands to hyper in the middle of a connection.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use upkeep_test_support::TestBackend;

use crate::support::{curl, one_group, upkeep};

/// Reads from `s` until `text` has been seen `times` times (or 5 s pass).
async fn read_until_count(s: &mut TcpStream, text: &str, times: usize) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        while String::from_utf8_lossy(&out).matches(text).count() < times {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the peer closed `s` within 3 s (a read returns 0).
async fn closes(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    matches!(
        tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test]
async fn curl_http10_gets_an_http11_status_line_and_keeps_its_connection_only_when_it_asks() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[b.addr()], "")).await;
    let url = format!("http://{}/one", up.listeners[0]);

    // Plain HTTP/1.0: answered HTTP/1.1, told `close`, and the connection is not reused.
    let (body, trace) = curl(&["-sv", "--http1.0", &url, &url]).await;
    assert_eq!(body, "b /one\nb /one\n", "{trace}");
    assert_eq!(trace.matches("< HTTP/1.1 200 OK").count(), 2, "{trace}");
    assert!(!trace.contains("< HTTP/1.0"), "{trace}");
    assert_eq!(trace.matches("< connection: close").count(), 2, "{trace}");
    assert_eq!(trace.matches("Connected to").count(), 2, "{trace}");

    // HTTP/1.0 with `Connection: keep-alive`: told `keep-alive`, one connection for both.
    let (body, trace) = curl(&[
        "-sv",
        "--http1.0",
        "-H",
        "Connection: keep-alive",
        &url,
        &url,
    ])
    .await;
    assert_eq!(body, "b /one\nb /one\n", "{trace}");
    assert_eq!(trace.matches("< HTTP/1.1 200 OK").count(), 2, "{trace}");
    assert_eq!(
        trace.matches("< connection: keep-alive").count(),
        2,
        "{trace}"
    );
    assert_eq!(trace.matches("Connected to").count(), 1, "{trace}");
    assert!(trace.contains("Re-using existing connection"), "{trace}");
}

#[tokio::test]
async fn a_raw_http10_client_is_answered_http11_and_closed_unless_it_asked_to_keep_alive() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[b.addr()], "")).await;
    let l = up.listeners[0];

    let mut s = TcpStream::connect(l).await.unwrap();
    s.write_all(b"GET /old HTTP/1.0\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let resp = read_until_count(&mut s, "b /old\n", 1).await;
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    assert!(resp.contains("\r\nconnection: close\r\n"), "{resp}");
    assert!(!resp.contains("keep-alive"), "{resp}");
    assert!(resp.contains("\r\ncontent-length: 7\r\n"), "{resp}");
    assert!(
        closes(&mut s).await,
        "the connection closes after the answer"
    );

    let mut s = TcpStream::connect(l).await.unwrap();
    for i in 1..=2 {
        s.write_all(b"GET /ka HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")
            .await
            .unwrap();
        let resp = read_until_count(&mut s, "b /ka\n", 1).await;
        assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{i}: {resp}");
        assert!(
            resp.contains("\r\nconnection: keep-alive\r\n"),
            "{i}: {resp}"
        );
        assert!(
            resp.contains("\r\nkeep-alive: timeout=620\r\n"),
            "{i}: {resp}"
        );
    }
    assert_eq!(b.seen().len(), 3);
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[b.addr()], "")).await;
    let mut s = TcpStream::connect(up.listeners[0]).await.unwrap();
    // The first is the slowest: answers still come in the order asked.
    s.write_all(
        b"GET /sleep/200 HTTP/1.1\r\nHost: a\r\n\r\n\
          GET /sleep/10 HTTP/1.1\r\nHost: a\r\n\r\n\
          HEAD /three HTTP/1.1\r\nHost: a\r\n\r\n\
          GET /four HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await
    .unwrap();
    let resp = read_until_count(&mut s, "b /four\n", 1).await;
    assert_eq!(resp.matches("HTTP/1.1 200 OK\r\n").count(), 4, "{resp}");
    let first = resp.find("b slept 200\n").expect("first answer");
    let second = resp.find("b slept 10\n").expect("second answer");
    let fourth = resp.find("b /four\n").expect("fourth answer");
    assert!(first < second && second < fourth, "{resp}");
    assert!(
        !resp.contains("b /three"),
        "HEAD is answered without a body: {resp}"
    );
    let paths: Vec<String> = b.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/sleep/200", "/sleep/10", "/three", "/four"]);
}

#[tokio::test]
async fn a_request_with_a_body_after_a_bodiless_one_on_the_same_connection_is_answered() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[b.addr()], "")).await;
    let mut s = TcpStream::connect(up.listeners[0]).await.unwrap();
    s.write_all(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let resp = read_until_count(&mut s, "b /first\n", 1).await;
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");

    // Then a body, and behind it (pipelined) a chunked one and a bodiless one.
    s.write_all(
        b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\
          POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
          GET /last HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await
    .unwrap();
    let resp = read_until_count(&mut s, "b /last\n", 1).await;
    assert_eq!(resp.matches("HTTP/1.1 200 OK\r\n").count(), 3, "{resp}");
    let five = resp.find("\r\n\r\n5\n").expect("the first upload's length");
    let three = resp
        .find("\r\n\r\n3\n")
        .expect("the second upload's length");
    assert!(five < three, "{resp}");
    let seen = b.seen();
    assert_eq!(seen.len(), 4);
    assert_eq!((seen[1].body_len, seen[2].body_len), (5, 3));
    assert_eq!(seen[3].path, "/last");
}

#[tokio::test]
async fn an_expect_request_handed_to_hyper_after_a_bodiless_one_on_the_same_connection_is_answered()
{
    let b = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[b.addr()], "")).await;
    let mut s = TcpStream::connect(up.listeners[0]).await.unwrap();
    s.write_all(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let resp = read_until_count(&mut s, "b /first\n", 1).await;
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");

    // `Expect: 100-continue` goes to the hyper path (crate::expect) with the connection:
    // the client waits for the `100` the upstream asks for, then sends its body.
    s.write_all(
        b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let cont = read_until_count(&mut s, "\r\n\r\n", 1).await;
    assert!(cont.starts_with("HTTP/1.1 100 Continue\r\n"), "{cont}");
    s.write_all(b"helloGET /after HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let resp = read_until_count(&mut s, "b /after\n", 1).await;
    assert_eq!(resp.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{resp}");
    // hyper writes the rest of the connection from the response's map: the upstream's
    // fields are all in it (no head kept as received for the own server's writer).
    assert_eq!(
        resp.matches("content-type: text/plain\r\n").count(),
        2,
        "{resp}"
    );
    assert!(resp.contains("\r\n\r\n5\n"), "{resp}");
    let seen = b.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!((seen[1].path.as_str(), seen[1].body_len), ("/upload", 5));
    assert_eq!(seen[2].path, "/after");
}

/// The header lines of an upstream request head, without the request line.
fn header_lines(head: &str) -> Vec<String> {
    head.split("\r\n").skip(1).map(str::to_owned).collect()
}

#[tokio::test]
async fn request_fields_kept_as_received_reach_the_upstream_as_the_maps_path_sends_them() {
    use crate::support::raw::RawBackend;
    let b = RawBackend::start(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    // `/plain` forwards the fields as received; `/mapped` has a request header rule (one that
    // changes nothing here), so its request is made into a map first.
    let cfg = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\npath = \"/plain\"\ngroup = \"app\"\n\n\
         [[route]]\npath = \"/mapped\"\ngroup = \"app\"\nrequest_headers = {{ remove = [\"x-never\"] }}\n\n\
         [groups.app]\nendpoints = [\"{}\"]\n",
        b.addr()
    );
    let up = upkeep(&cfg).await;
    let mut s = TcpStream::connect(up.listeners[0]).await.unwrap();
    for path in ["/plain", "/mapped"] {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: kept.test\r\nX-Multi: 1\r\nConnection: keep-alive\r\n\
             User-Agent: Kept/1\r\nX-Multi: 2\r\nContent-Length: 3\r\nX-Request-Id: id-{path}\r\n\r\nabc"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let resp = read_until_count(&mut s, "\r\n\r\nok", 1).await;
        assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    }
    let seen = b.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|r| r.body == b"abc" && r.complete));
    let plain = header_lines(&seen[0].head);
    // In the order received, names lowercased, `Connection` gone; then upkeep's own fields.
    assert_eq!(
        plain,
        [
            "host: kept.test",
            "x-multi: 1",
            "user-agent: Kept/1",
            "x-multi: 2",
            "content-length: 3",
            "x-request-id: id-/plain",
            "x-forwarded-for: 127.0.0.1",
            "x-forwarded-proto: http",
            "x-forwarded-host: kept.test",
        ],
        "{}",
        seen[0].head
    );
    // The map's path sends the same lines (a map groups one name's lines together).
    let by_name = |lines: &[String], id: &str| {
        let mut l: Vec<String> = lines.iter().map(|l| l.replace(id, "ID")).collect();
        l.sort_by_key(|l| l.split(':').next().unwrap_or("").to_owned());
        l
    };
    let mapped = header_lines(&seen[1].head);
    assert_eq!(
        by_name(&plain, "id-/plain"),
        by_name(&mapped, "id-/mapped"),
        "{}",
        seen[1].head
    );
    assert_ne!(plain, mapped, "the map's path groups the repeated field");
}

/// A backend that answers one request with a chunked body of `chunks` chunks, chunk `i`
/// being `i` bytes of one letter, each written on its own after a pause (so that upkeep reads
/// them one by one and writes a chunk of its own for each).
async fn trickling_backend(chunks: usize) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            if s.read(&mut b).await.unwrap() == 0 {
                return;
            }
            head.push(b[0]);
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        for i in 1..=chunks {
            let letter = b'a' + (i % 26) as u8;
            let mut chunk = format!("{i:x}\r\n").into_bytes();
            chunk.extend(std::iter::repeat_n(letter, i));
            chunk.extend_from_slice(b"\r\n");
            s.write_all(&chunk).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        s.write_all(b"0\r\n\r\n").await.unwrap();
    });
    addr
}

#[tokio::test]
async fn a_chunked_response_of_many_reads_reaches_curl_whole_and_chunked() {
    // 300 chunks: more size lines than one buffer of them holds, so it is refilled and reused.
    let chunks = 300;
    let backend = trickling_backend(chunks).await;
    let up = upkeep(&one_group(&[backend], "")).await;
    let url = format!("http://{}/trickle", up.listeners[0]);
    let (out, err) = curl(&["-sS", "--raw", "-D", "-", &url]).await;
    let (head, raw) = out.split_once("\r\n\r\n").expect("a head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{err}");
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    // Decode upkeep's own chunk framing: every size line right, then the last chunk.
    let (mut rest, mut body, mut seen) = (raw.as_bytes(), Vec::new(), 0);
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a size line");
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16)
            .expect("a hex size");
        rest = &rest[line_end + 2..];
        if size == 0 {
            assert_eq!(rest, b"\r\n", "the body ends after the last chunk");
            break;
        }
        body.extend_from_slice(&rest[..size]);
        assert_eq!(&rest[size..size + 2], b"\r\n", "CRLF after chunk data");
        rest = &rest[size + 2..];
        seen += 1;
    }
    let want: Vec<u8> = (1..=chunks)
        .flat_map(|i| std::iter::repeat_n(b'a' + (i % 26) as u8, i))
        .collect();
    assert_eq!(body.len(), want.len());
    assert!(body == want, "the body arrives whole and in order");
    // Read one by one (2 ms apart), they go out as about as many chunks: more size lines than
    // one buffer of them holds (about 100).
    assert!(seen > chunks / 2, "{seen} chunks");
}
