//! HTTP/2 (prior knowledge) and TLS (ALPN h2 and http/1.1) end to end.

use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, pki_types::ServerName};
use upkeep_test_support::TestBackend;

use crate::support::{one_group, upkeep};

#[tokio::test]
async fn h2c_prior_knowledge_is_proxied_to_http1_upstream() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[b.addr()], "")).await;
    let stream = TcpStream::connect(up.listeners[0]).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    // The second names another host: the `Host` made from `:authority` is not the last one's.
    let hosts = ["h2.test", "other.test", "h2.test"];
    for (i, host) in hosts.iter().enumerate() {
        let mut req = Request::get(format!("http://{host}/p{i}"));
        if i == 2 {
            // The one field HTTP/2 lets a client send of those HTTP/1.1 calls hop-by-hop.
            req = req.header("te", "trailers");
        }
        let req = req.body(Empty::<Bytes>::new()).unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.version(), http::Version::HTTP_2);
        assert!(
            resp.headers().get("keep-alive").is_none(),
            "no connection-specific headers on HTTP/2"
        );
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], format!("b /p{i}\n").as_bytes());
    }
    let seen = b.seen();
    assert_eq!(seen.len(), 3);
    // An HTTP/2 client takes trailers: the HTTP/1.1 upstream is told so, once, whether the
    // client said it or not. `:authority` becomes one `Host` and one `X-Forwarded-Host`.
    for (s, host) in seen.iter().zip(hosts) {
        for name in ["host", "x-forwarded-host"] {
            let values: Vec<&str> = s
                .headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect();
            assert_eq!(values, [host], "{name} of {}", s.path);
        }
        let te: Vec<&str> = s
            .headers
            .get_all("te")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(te, ["trailers"], "{}", s.path);
    }
}

/// What upkeep sends an HTTP/2 client of a response's `Date` and `Content-Length`, on the
/// wire with curl: a date is added only when the upstream sent none, the upstream's own is
/// passed on, and the length a response declares stays as it is; connection-specific fields
/// (here one that names `Date`, so the upstream's date goes with it) never reach the client.
#[tokio::test]
async fn an_http2_client_gets_a_date_and_the_length_each_once() {
    let responses = vec![
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
        b"HTTP/1.1 200 OK\r\nDate: Mon, 01 Jan 2001 00:00:00 GMT\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
        b"HTTP/1.1 200 OK\r\nDate: Mon, 01 Jan 2001 00:00:00 GMT\r\nConnection: date\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec(),
    ];
    let addr = crate::response_framing::backend(Arc::new(responses)).await;
    let up = upkeep(&one_group(&[addr], "")).await;
    let fetch = |n: usize| {
        let url = format!("http://{}/{n}", up.listeners[0]);
        async move {
            let out = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                tokio::process::Command::new("curl")
                    .args(["-sS", "--http2-prior-knowledge", "-D", "-", &url])
                    .kill_on_drop(true)
                    .output(),
            )
            .await
            .expect("curl finishes")
            .expect("curl runs");
            String::from_utf8_lossy(&out.stdout).to_ascii_lowercase()
        }
    };
    let count = |resp: &str, name: &str| {
        resp.lines()
            .filter(|l| l.starts_with(&format!("{name}:")))
            .count()
    };
    let upstream_date = "date: mon, 01 jan 2001 00:00:00 gmt";
    for n in 0..4 {
        let resp = fetch(n).await;
        assert!(resp.starts_with("http/2 200"), "case {n}: {resp}");
        assert!(resp.ends_with("hello"), "case {n}: {resp}");
        assert_eq!(count(&resp, "date"), 1, "case {n}: one date: {resp}");
        assert_eq!(
            resp.contains(upstream_date),
            n == 1,
            "case {n}: the upstream's date, and only when it is end to end: {resp}"
        );
        assert!(!resp.contains("connection:"), "case {n}: {resp}");
        if n < 3 {
            assert_eq!(count(&resp, "content-length"), 1, "case {n}: {resp}");
            assert!(resp.contains("content-length: 5\r\n"), "case {n}: {resp}");
        }
    }
}

fn tls_files(dir: &std::path::Path) -> rustls::pki_types::CertificateDer<'static> {
    let cert = rcgen::generate_simple_self_signed(vec!["upkeep.test".to_owned()]).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), cert.signing_key.serialize_pem()).unwrap();
    cert.cert.der().clone()
}

async fn tls_connect(
    addr: std::net::SocketAddr,
    ca: &rustls::pki_types::CertificateDer<'static>,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from("upkeep.test").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
    tls
}

#[tokio::test]
async fn tls_listener_serves_http2_and_http1_by_alpn() {
    let b = TestBackend::start("b").await;
    let dir = std::env::temp_dir().join(format!("upkeep-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = tls_files(&dir);
    let cfg = one_group(&[b.addr()], "").replace(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n",
        &format!(
            "[[listener]]\nlisten = \"127.0.0.1:0\"\ntls = {{ cert = \"{}\", key = \"{}\" }}\n",
            dir.join("cert.pem").display(),
            dir.join("key.pem").display()
        ),
    );
    let up = upkeep(&cfg).await;

    let tls = tls_connect(up.listeners[0], &ca, b"h2").await;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let resp = sender
        .send_request(
            Request::get("https://upkeep.test/two")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(
        resp.into_body().collect().await.unwrap().to_bytes(),
        Bytes::from("b /two\n")
    );

    let tls = tls_connect(up.listeners[0], &ca, b"http/1.1").await;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/one")
        .header("host", "upkeep.test")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_11);
    assert_eq!(
        resp.into_body().collect().await.unwrap().to_bytes(),
        Bytes::from("b /one\n")
    );

    let seen = b.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].headers["x-forwarded-proto"], "https");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Over TLS (ALPN http/1.1) the header read timeout runs from accept too: a client that
/// completes the handshake and sends nothing is closed at it without a word (not held for
/// `idle_timeout`), and one that sends part of a head gets `408 client_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_silent_client_is_closed_and_a_partial_head_gets_408_at_header_read_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let b = TestBackend::start("b").await;
    let dir = std::env::temp_dir().join(format!("upkeep-tls-head-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = tls_files(&dir);
    let cfg = one_group(&[b.addr()], "").replace(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n",
        &format!(
            "[[listener]]\nlisten = \"127.0.0.1:0\"\nheader_read_timeout = \"400ms\"\ntls = {{ cert = \"{}\", key = \"{}\" }}\n",
            dir.join("cert.pem").display(),
            dir.join("key.pem").display()
        ),
    );
    let up = upkeep(&cfg).await;
    async fn to_close(
        tls: &mut tokio_rustls::client::TlsStream<TcpStream>,
    ) -> (String, std::time::Duration) {
        let start = std::time::Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(std::time::Duration::from_secs(5), tls.read(&mut buf)).await
            {
                Err(_) => panic!("not closed within 5 s"),
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            }
        }
        (String::from_utf8_lossy(&got).into_owned(), start.elapsed())
    }
    let mut silent = tls_connect(up.listeners[0], &ca, b"http/1.1").await;
    let (text, t) = to_close(&mut silent).await;
    assert_eq!(text, "");
    assert!(t < std::time::Duration::from_secs(3), "closed after {t:?}");

    let mut partial = tls_connect(up.listeners[0], &ca, b"http/1.1").await;
    partial
        .write_all(b"GET / HTTP/1.1\r\nHost: upkeep.test\r\n")
        .await
        .unwrap();
    partial.flush().await.unwrap();
    let (text, _) = to_close(&mut partial).await;
    assert!(text.starts_with("HTTP/1.1 408 "), "{text:?}");
    assert!(text.contains("upkeep-error: client_timeout"), "{text:?}");
    assert!(b.seen().is_empty());
}
