//! The response twin of the request framing table (`smuggling.rs`): a raw TCP backend sends
//! each ambiguous response shape, and the client sees it refused (502 with its cause) or
//! normalised, never passed through.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use upkeep_test_support::raw_exchange;

use crate::support::{one_group, upkeep};

/// What the client must see.
#[derive(Clone, Copy)]
enum Want {
    /// 502 with `upkeep-error: upstream_reset; reason=invalid_response`; no body byte passes.
    Refused,
    /// This status, this complete body, one framing downstream.
    Normalised(u16, &'static str),
    /// The body was cut: the connection closes with nothing (hyper drops the head it had
    /// not flushed yet) or after a head and a body that never ends as if complete.
    Cut,
}

fn cases() -> Vec<(&'static str, Vec<u8>, Want)> {
    use Want::*;
    let huge = format!(
        "HTTP/1.1 200 OK\r\nX-Big: {}\r\nContent-Length: 5\r\n\r\nhello",
        "a".repeat(70 * 1024)
    );
    vec![
        ("cl_cl_differing", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!".to_vec(), Refused),
        ("cl_cl_same", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello".to_vec(), Refused),
        ("cl_list", b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello".to_vec(), Refused),
        ("cl_inner_space", b"HTTP/1.1 200 OK\r\nContent-Length: 0 5\r\n\r\nhello".to_vec(), Refused),
        ("cl_plus", b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello".to_vec(), Refused),
        ("cl_minus", b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello".to_vec(), Refused),
        ("cl_hex", b"HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\nhello".to_vec(), Refused),
        ("te_chunked_identity", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec(), Refused),
        ("te_gzip", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhello".to_vec(), Refused),
        ("te_repeated", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec(), Refused),
        ("te_in_http10", b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec(), Refused),
        ("obs_fold", b"HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 5\r\n\r\nhello".to_vec(), Refused),
        ("bare_lf", b"HTTP/1.1 200 OK\nContent-Length: 5\n\nhello".to_vec(), Refused),
        ("name_with_space", b"HTTP/1.1 200 OK\r\nX A: 1\r\nContent-Length: 5\r\n\r\nhello".to_vec(), Refused),
        ("space_before_colon", b"HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nhello".to_vec(), Refused),
        ("oversize_head", huge.into_bytes(), Refused),
        ("switching_unasked", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\nhello".to_vec(), Refused),
        ("te_and_cl", b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec(), Normalised(200, "hello")),
        ("chunk_extensions", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;a=b\r\nhe\r\n3;c\r\nllo\r\n0\r\n\r\n".to_vec(), Normalised(200, "hello")),
        ("informational_first", b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello".to_vec(), Normalised(200, "hello")),
        ("no_content_with_body", b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello".to_vec(), Normalised(204, "")),
        ("close_delimited", b"HTTP/1.1 200 OK\r\n\r\nhello".to_vec(), Normalised(200, "hello")),
        ("chunk_size_not_hex", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n".to_vec(), Cut),
        ("chunk_size_overflow", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\nhello\r\n".to_vec(), Cut),
        ("chunk_bare_lf", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n".to_vec(), Cut),
        ("chunk_without_crlf", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloX0\r\n\r\n".to_vec(), Cut),
        ("missing_last_chunk", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec(), Cut),
        ("short_length", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello".to_vec(), Cut),
    ]
}

/// Answers `GET /N` (or `HEAD /N`) with the raw bytes of case N, then closes (also the raw
/// backend of `h2_tls`).
pub(crate) async fn backend(responses: Arc<Vec<Vec<u8>>>) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let responses = responses.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&buf);
                let n: usize = line
                    .split(' ')
                    .nth(1)
                    .and_then(|p| p.trim_start_matches('/').parse().ok())
                    .unwrap_or(usize::MAX);
                if let Some(r) = responses.get(n) {
                    let _ = s.write_all(r).await;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

fn status_of(resp: &str) -> Option<u16> {
    resp.split(' ').nth(1).and_then(|s| s.parse().ok())
}

#[tokio::test]
async fn ambiguous_upstream_responses_are_refused_or_normalised_never_passed_through() {
    let cases = cases();
    assert!(cases.len() >= 25);
    let responses = Arc::new(cases.iter().map(|(_, r, _)| r.clone()).collect::<Vec<_>>());
    let addr = backend(responses).await;
    let up = upkeep(&one_group(&[addr], "try_timeout = \"2s\"\n")).await;
    let mut failures = Vec::new();
    for (i, (name, _, want)) in cases.iter().enumerate() {
        let req = format!("GET /{i} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let resp = raw_exchange(up.listeners[0], req.as_bytes(), Duration::from_secs(3)).await;
        let lower = resp.to_ascii_lowercase();
        let (head, body) = lower.split_once("\r\n\r\n").unwrap_or((&lower, ""));
        let ok = match want {
            Want::Refused => {
                status_of(&resp) == Some(502)
                    && head.contains("upkeep-error: upstream_reset; reason=invalid_response")
                    && !body.contains("hello")
            }
            Want::Normalised(status, text) => {
                let te = head.contains("transfer-encoding: chunked");
                let cl = head.contains("content-length");
                let decoded = if te {
                    dechunk(body)
                } else {
                    Some(body.to_owned())
                };
                status_of(&resp) == Some(*status)
                    && !(te && cl)
                    && decoded.as_deref() == Some(*text)
            }
            Want::Cut => {
                (resp.is_empty() || status_of(&resp) == Some(200))
                    && !body.ends_with("0\r\n\r\n")
                    && !body.contains("helloX")
            }
        };
        if !ok {
            failures.push(format!("{name}: got {resp:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The same table to an HTTP/2 client (curl, h2c): there the response goes through the
/// header map an HTTP/2 stream sends, which a hop-free head (`h1::head`) gets already without
/// its framing and connection fields, and a refusal, a normalised body or a cut stream must
/// come out the same.
#[tokio::test]
async fn ambiguous_upstream_responses_reach_an_http2_client_refused_or_normalised_too() {
    let cases = cases();
    let responses = Arc::new(cases.iter().map(|(_, r, _)| r.clone()).collect::<Vec<_>>());
    let addr = backend(responses).await;
    let up = upkeep(&one_group(&[addr], "try_timeout = \"2s\"\n")).await;
    let mut failures = Vec::new();
    for (i, (name, _, want)) in cases.iter().enumerate() {
        let url = format!("http://{}/{i}", up.listeners[0]);
        let (complete, status, head, body) = curl_h2(&url).await;
        let lengths: Vec<&str> = head
            .lines()
            .filter(|l| l.starts_with("content-length:"))
            .collect();
        let ok = match want {
            Want::Refused => {
                status == Some(502)
                    && head.contains("upkeep-error: upstream_reset; reason=invalid_response")
                    && !body.contains("hello")
            }
            Want::Normalised(want_status, text) => {
                complete
                    && status == Some(*want_status)
                    && body == *text
                    && !head.contains("transfer-encoding")
                    && !head.contains("connection:")
                    && lengths.len() <= 1
                    && lengths.iter().all(|l| {
                        l.trim_start_matches("content-length:").trim() == text.len().to_string()
                    })
            }
            // Never a stream that ends cleanly with a 2xx as if its body were whole.
            Want::Cut => {
                let whole = complete && status.is_some_and(|s| (200..300).contains(&s));
                !whole && !body.contains("hellox")
            }
        };
        if !ok {
            failures.push(format!(
                "{name}: complete={complete} status={status:?} head={head:?} body={body:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `curl -si --http2-prior-knowledge URL`: whether the transfer ended cleanly, the final
/// status, and the final head (lowercased) and body; informational heads are skipped.
async fn curl_h2(url: &str) -> (bool, Option<u16>, String, String) {
    let out = curl_si(&["--http2-prior-knowledge", url]).await;
    let text = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    let mut rest = text.as_str();
    loop {
        let Some((head, body)) = rest.split_once("\r\n\r\n") else {
            return (out.status.success(), None, rest.to_owned(), String::new());
        };
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.trim().parse::<u16>().ok());
        if status.is_some_and(|s| (100..200).contains(&s)) && body.starts_with("http/") {
            rest = body;
            continue;
        }
        return (
            out.status.success(),
            status,
            head.to_owned(),
            body.to_owned(),
        );
    }
}

#[tokio::test]
async fn a_head_response_keeps_its_length_and_has_no_body() {
    let responses = Arc::new(vec![
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n".to_vec()
    ]);
    let addr = backend(responses).await;
    let up = upkeep(&one_group(&[addr], "")).await;
    let resp = raw_exchange(
        up.listeners[0],
        b"HEAD /0 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(status_of(&resp), Some(200), "{resp}");
    assert!(
        resp.to_ascii_lowercase().contains("content-length: 5"),
        "{resp}"
    );
    assert!(
        resp.ends_with("\r\n\r\n"),
        "no body after a HEAD head: {resp:?}"
    );
}

/// The data of a complete chunked body; `None` if it does not end with its last chunk.
fn dechunk(mut s: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (line, rest) = s.split_once("\r\n")?;
        let n = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        if n == 0 {
            return (rest == "\r\n").then_some(out);
        }
        out.push_str(rest.get(..n)?);
        s = rest.get(n..)?.strip_prefix("\r\n")?;
    }
}

/// `curl -si --max-time 5 ARGS..`, itself bounded in time: what it printed and how it ended.
async fn curl_si(args: &[&str]) -> std::process::Output {
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new("curl")
            .args(["-si", "--max-time", "5"])
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("curl finishes")
    .expect("curl runs")
}

/// `curl -si [OPTION..] URL`: the head and body as the client got them.
async fn curl_head_and_body(args: &str) -> (Vec<String>, String) {
    let out = curl_si(&args.split(' ').collect::<Vec<_>>()).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    (
        head.split("\r\n").map(str::to_owned).collect(),
        body.to_owned(),
    )
}

#[tokio::test]
async fn a_response_head_reaches_the_client_as_received_less_its_hop_by_hop_fields() {
    let responses = Arc::new(vec![
        b"HTTP/1.1 200 OK\r\nServer: T\r\nSet-Cookie: a=1\r\nConnection: keep-alive\r\n\
          Keep-Alive: timeout=5\r\nX-Mixed-Case: A  b\r\nDate: Mon, 30 Nov 2026 00:00:00 GMT\r\n\
          Set-Cookie: b=2\r\nContent-Length: 5\r\n\r\nhello"
            .to_vec(),
        // `Connection` names a field: it goes, with the field it names.
        b"HTTP/1.1 200 OK\r\nConnection: X-Secret\r\nX-Secret: 1\r\nX-Kept: 2\r\n\
          Content-Length: 2\r\n\r\nok"
            .to_vec(),
    ]);
    let addr = backend(responses).await;
    let up = upkeep(&one_group(&[addr], "")).await;
    let base = format!("http://{}", up.listeners[0]);

    let (head, body) = curl_head_and_body(&format!("{base}/0")).await;
    assert_eq!(body, "hello");
    assert_eq!(head[0], "HTTP/1.1 200 OK");
    let upstream: Vec<&str> = head[1..]
        .iter()
        .map(String::as_str)
        .filter(|l| !l.starts_with("keep-alive:"))
        .collect();
    assert_eq!(
        upstream,
        [
            "server: T",
            "set-cookie: a=1",
            "x-mixed-case: A  b",
            "date: Mon, 30 Nov 2026 00:00:00 GMT",
            "set-cookie: b=2",
            "content-length: 5",
        ],
        "the upstream's fields in their order, names lowercased, one date: {head:?}"
    );
    let keepalive: Vec<&String> = head
        .iter()
        .filter(|l| l.starts_with("keep-alive:"))
        .collect();
    assert_eq!(keepalive.len(), 1, "upkeep's own keep-alive only: {head:?}");
    assert_ne!(keepalive[0], "keep-alive: timeout=5", "{head:?}");

    // To an HTTP/2 client (the HTTP/2 server sends the response's map): every field of the
    // upstream but the hop-by-hop ones (in the map's order: compared sorted).
    let (head, body) = curl_head_and_body(&format!("--http2-prior-knowledge {base}/0")).await;
    assert_eq!(body, "hello");
    assert_eq!(head[0].trim_end(), "HTTP/2 200");
    let mut fields: Vec<&str> = head[1..].iter().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "content-length: 5",
            "date: Mon, 30 Nov 2026 00:00:00 GMT",
            "server: T",
            "set-cookie: a=1",
            "set-cookie: b=2",
            "x-mixed-case: A  b",
        ],
        "{head:?}"
    );

    let (head, body) = curl_head_and_body(&format!("{base}/1")).await;
    assert_eq!(body, "ok");
    let lower: Vec<String> = head.iter().map(|l| l.to_ascii_lowercase()).collect();
    assert!(lower.iter().any(|l| l == "x-kept: 2"), "{head:?}");
    assert!(
        !lower
            .iter()
            .any(|l| l.starts_with("x-secret") || l.starts_with("connection")),
        "{head:?}"
    );
}
