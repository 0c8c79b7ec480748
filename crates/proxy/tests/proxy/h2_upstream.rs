//! HTTP/2 upstreams (`protocol = "http2"` and `"auto"`): one connection shared by concurrent
//! requests, GOAWAY-refused streams sent again on a fresh connection, `grpc-timeout` as a
//! deadline, trailers, ALPN over TLS, and failures classified like HTTP/1.1 ones.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use upkeep_test_support::{get, send, TestBackend};

use crate::support::h2::{h2_client, GoawayBackend, H2Backend};
use crate::support::py::{json_client, PyServer};
use crate::support::{self, metric, one_group, upkeep};

const HTTP2: &str = "protocol = \"http2\"\n";

#[tokio::test]
async fn concurrent_requests_share_one_http2_upstream_connection() {
    let b = H2Backend::start().await;
    let up = upkeep(&one_group(&[b.addr], HTTP2)).await;
    let listener = up.listeners[0];
    let mut tasks = Vec::new();
    for i in 0..20 {
        tasks.push(tokio::spawn(async move {
            get(listener, "h2.test", &format!("/sleep/400?i={i}")).await
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(r.text(), "h2 /sleep/400");
    }
    assert_eq!(
        b.stats.connections.load(Ordering::SeqCst),
        1,
        "20 concurrent requests, one upstream connection"
    );
    let max = b.stats.max_in_flight.load(Ordering::SeqCst);
    assert!(
        max >= 10,
        "requests ran concurrently on it: at most {max} at once"
    );
    let heads = b.stats.heads.lock().unwrap();
    let (_, uri, headers) = &heads[0];
    assert_eq!(uri.authority().map(|a| a.as_str()), Some("h2.test"));
    assert_eq!(uri.scheme_str(), Some("http"));
    assert!(headers.get("host").is_none(), "Host travels as :authority");
    // The fields upkeep adds travel too: the id it made, and the forwarding fields.
    for (_, _, headers) in heads.iter() {
        let ids: Vec<_> = headers.get_all("x-request-id").iter().collect();
        assert_eq!(ids.len(), 1, "{headers:?}");
        assert_eq!(ids[0].len(), 32, "{headers:?}");
        assert_eq!(headers["x-forwarded-for"], "127.0.0.1", "{headers:?}");
    }
}

#[tokio::test]
async fn streams_refused_by_goaway_are_sent_again_on_a_new_connection_whatever_the_method() {
    let b = GoawayBackend::start(6).await;
    let up = upkeep(&one_group(&[b.addr], HTTP2)).await;
    let listener = up.listeners[0];
    let mut tasks = Vec::new();
    for i in 0..6 {
        let method = if i % 2 == 0 { "POST" } else { "PATCH" };
        tasks.push(tokio::spawn(async move {
            let req = Request::builder()
                .method(method)
                .uri(format!("/r{i}"))
                .header("host", "h2.test")
                .body(Full::new(Bytes::from(format!("body-{i}"))))
                .unwrap();
            send(listener, req).await
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "request {i}: {:?} {}", r.headers, r.text());
    }
    let answered = b.answered.lock().unwrap().clone();
    assert_eq!(answered.len(), 2, "a second connection: {answered:?}");
    assert_eq!(
        answered[0],
        vec![1],
        "the first connection processed stream 1 only"
    );
    assert_eq!(
        answered[1].len(),
        5,
        "the five refused streams, sent again: {answered:?}"
    );
    // Each with its whole body, once.
    let mut bodies: Vec<String> = b
        .bodies
        .lock()
        .unwrap()
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), 5, "{bodies:?}");
    assert!(
        bodies
            .iter()
            .all(|b| (0..6).any(|i| *b == format!("body-{i}"))),
        "{bodies:?}"
    );
    assert_eq!(
        metric(
            &up,
            "upkeep_pool_connections_total{event=\"h2_refused_replay\"}"
        )
        .await,
        5.0
    );
    assert_eq!(
        metric(&up, "upkeep_responses_total{origin=\"proxy\"").await,
        0.0,
        "no request failed"
    );
}

#[tokio::test]
async fn grpc_timeout_is_enforced_with_deadline_exceeded() {
    let b = H2Backend::start().await;
    let up = upkeep(&one_group(&[b.addr], HTTP2)).await;
    let mut client = h2_client(up.listeners[0]).await;
    let req = Request::post("http://grpc.test/sleep/3000")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "300m")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
        .unwrap();
    let start = Instant::now();
    let resp = client.send_request(req).await.unwrap();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(280) && took < Duration::from_millis(2500),
        "answered at the call's deadline, not the backend's pace: {took:?}"
    );
    assert_eq!(resp.status(), 200);
    let h = resp.headers();
    assert_eq!(h["content-type"], "application/grpc");
    assert_eq!(h["grpc-status"], "4", "DEADLINE_EXCEEDED");
    assert_eq!(h["grpc-message"], "upkeep: upstream_timeout");
    assert_eq!(h["upkeep-error"], "upstream_timeout");
    // The backend got the call with its deadline and `te: trailers`.
    let heads = b.stats.heads.lock().unwrap();
    assert_eq!(heads[0].2["grpc-timeout"], "300m");
    assert_eq!(heads[0].2["te"], "trailers");
}

#[tokio::test]
async fn http2_upstream_trailers_reach_an_http2_client() {
    let b = H2Backend::start().await;
    let up = upkeep(&one_group(&[b.addr], HTTP2)).await;
    let mut client = h2_client(up.listeners[0]).await;
    let req = Request::get("http://h2.test/t")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = client.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers arrive");
    assert_eq!(trailers["x-sum"], "42");
    assert_eq!(&collected.to_bytes()[..], b"h2 /t");
}

/// An HTTP/1.1 backend that answers with a chunked body and a declared trailer, and keeps the
/// request heads it read.
async fn h1_trailer_backend() -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let heads: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let h = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let h = h.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = s.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = buf.drain(..end + 4).collect();
                        h.lock()
                            .unwrap()
                            .push(String::from_utf8_lossy(&head).to_lowercase());
                        let resp = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-sum\r\n\r\n2\r\nok\r\n0\r\nx-sum: 42\r\n\r\n";
                        if s.write_all(resp).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, heads)
}

/// One raw HTTP/1.1 exchange; reads until the end of a chunked body (with its trailers).
async fn raw_exchange(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let n = s.read(&mut chunk).await.unwrap();
            out.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&out);
            if n == 0 || (text.contains("\r\n0\r\n") && text.ends_with("\r\n\r\n")) {
                return;
            }
        }
    })
    .await
    .expect("response in time");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn http1_trailers_pass_only_when_the_client_sent_te_trailers() {
    let (b, heads) = h1_trailer_backend().await;
    let up = upkeep(&one_group(&[b], "")).await;
    let asked = raw_exchange(
        up.listeners[0],
        "GET /a HTTP/1.1\r\nhost: t.test\r\nte: trailers\r\nconnection: te\r\n\r\n",
    )
    .await;
    let lower = asked.to_lowercase();
    assert!(lower.contains("\r\ntrailer: x-sum\r\n"), "{asked}");
    assert!(lower.ends_with("\r\n0\r\nx-sum: 42\r\n\r\n"), "{asked}");
    let not_asked = raw_exchange(up.listeners[0], "GET /b HTTP/1.1\r\nhost: t.test\r\n\r\n").await;
    let lower = not_asked.to_lowercase();
    assert!(!lower.contains("trailer:"), "{not_asked}");
    assert!(!lower.contains("x-sum"), "{not_asked}");
    assert!(lower.ends_with("\r\n0\r\n\r\n"), "{not_asked}");
    let heads = heads.lock().unwrap();
    assert!(heads[0].contains("\r\nte: trailers\r\n"), "{}", heads[0]);
    assert!(!heads[1].contains("\r\nte:"), "{}", heads[1]);
}

/// curl over HTTP/1.1 in front of an HTTP/2 upstream whose answer ends with `x-sum: 42`, a
/// trailer it never declared (HTTP/2 has no need to): with `TE: trailers` curl gets it in the
/// chunked trailer section, without it the body ends with no trailer section.
#[tokio::test]
async fn http2_upstream_undeclared_trailers_reach_an_http11_client_that_sent_te_trailers() {
    let b = H2Backend::start().await;
    let up = upkeep(&one_group(&[b.addr], HTTP2)).await;
    let run = |te: bool| {
        let mut c = tokio::process::Command::new("curl");
        c.args(["-sS", "--raw", "-i", "--http1.1", "--max-time", "10"]);
        if te {
            c.args(["-H", "TE: trailers"]);
        }
        c.arg(format!("http://{}/t", up.listeners[0]))
            .kill_on_drop(true)
            .output()
    };
    let with = run(true).await.expect("curl runs");
    let with = String::from_utf8_lossy(&with.stdout).to_ascii_lowercase();
    assert!(with.starts_with("http/1.1 200"), "{with}");
    assert!(with.contains("transfer-encoding: chunked"), "{with}");
    assert!(with.ends_with("\r\n0\r\nx-sum: 42\r\n\r\n"), "{with}");
    let without = run(false).await.expect("curl runs");
    let without = String::from_utf8_lossy(&without.stdout).to_ascii_lowercase();
    assert!(without.starts_with("http/1.1 200"), "{without}");
    assert!(without.ends_with("\r\n0\r\n\r\n"), "{without}");
    assert!(!without.contains("x-sum"), "{without}");
}

#[tokio::test]
async fn http2_upstream_failures_are_classified_like_http1_ones() {
    // Nothing listens: connect_failed.
    let (_held, gone) = support::refusing_addr();
    let up = upkeep(&one_group(&[gone], HTTP2)).await;
    let r = get(up.listeners[0], "h2.test", "/").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.header("upkeep-error"), Some("connect_failed"));
    // An HTTP/1.1-only server behind `protocol = "http2"`: the h2 session fails, classified.
    let h1 = TestBackend::start("h1").await;
    let up = upkeep(&one_group(&[h1.addr()], HTTP2)).await;
    let r = get(up.listeners[0], "h2.test", "/").await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.header("upkeep-error"), Some("upstream_reset"));
}

#[test]
fn protocol_values_and_auto_without_tls_are_config_errors() {
    let bad = upkeep_proxy::config::parse(
        std::path::Path::new("test.toml"),
        &one_group(&["127.0.0.1:9".parse().unwrap()], "protocol = \"h3\"\n"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        bad.contains("expected \"http1\", \"http2\" or \"auto\""),
        "{bad}"
    );
    assert!(bad.contains("test.toml:"), "{bad}");
    let auto = upkeep_proxy::config::parse(
        std::path::Path::new("test.toml"),
        &one_group(&["127.0.0.1:9".parse().unwrap()], "protocol = \"auto\"\n"),
    )
    .unwrap_err()
    .to_string();
    assert!(auto.contains("needs https:// endpoints"), "{auto}");
}

/// A TLS backend (hyper-util's auto server) offering `alpn`; answers its HTTP version.
async fn tls_backend(alpn: &[&[u8]], dir: &std::path::Path) -> SocketAddr {
    let cert = rcgen::generate_simple_self_signed(vec!["upstream.test".to_owned()]).unwrap();
    std::fs::write(dir.join("ca.pem"), cert.cert.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc =
                    hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            Bytes::from(format!("{:?}", req.version())),
                        )))
                    });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                .await;
            });
        }
    });
    addr
}

fn tls_group(addr: SocketAddr, dir: &std::path::Path, protocol: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[route]]\ngroup = \"app\"\n\n\
         [groups.app]\nendpoints = [\"https://{addr}\"]\nprotocol = \"{protocol}\"\n\n\
         [groups.app.tls]\nserver_name = \"upstream.test\"\nca = \"{}\"\n",
        dir.join("ca.pem").display()
    )
}

#[tokio::test]
async fn auto_follows_alpn_and_http2_over_tls_speaks_h2() {
    let dir = std::env::temp_dir().join(format!("upkeep-h2alpn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let both = dir.join("both");
    let h1only = dir.join("h1");
    std::fs::create_dir_all(&both).unwrap();
    std::fs::create_dir_all(&h1only).unwrap();
    let b2 = tls_backend(&[b"h2", b"http/1.1"], &both).await;
    let b1 = tls_backend(&[b"http/1.1"], &h1only).await;
    for (addr, d, protocol, want) in [
        (b2, &both, "auto", "HTTP/2.0"),
        (b2, &both, "http2", "HTTP/2.0"),
        (b2, &both, "http1", "HTTP/1.1"),
        (b1, &h1only, "auto", "HTTP/1.1"),
    ] {
        let up = upkeep(&tls_group(addr, d, protocol)).await;
        for _ in 0..2 {
            let r = get(up.listeners[0], "a.test", "/").await;
            assert_eq!(r.status, 200, "{protocol}: {}", r.text());
            assert_eq!(r.text(), want, "protocol = {protocol:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_peer_that_stops_answering_pings_is_dropped_before_try_timeout() {
    let (addr, _task) = support::h2::silent_backend().await;
    let up = upkeep(&one_group(
        &[addr],
        "protocol = \"http2\"\ntry_timeout = \"8s\"\n\n[groups.app.pool]\nhttp2_keepalive_interval = \"200ms\"\nhttp2_keepalive_timeout = \"300ms\"\n",
    ))
    .await;
    let start = Instant::now();
    let r = get(up.listeners[0], "h2.test", "/hangs").await;
    let took = start.elapsed();
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.header("upkeep-error"), Some("upstream_reset"));
    assert!(
        took < Duration::from_secs(4),
        "the unanswered PING ended it, not try_timeout: {took:?}"
    );
}

#[tokio::test]
async fn a_stream_refused_with_refused_stream_is_sent_again_with_its_body() {
    let b = GoawayBackend::start_refusing().await;
    let up = upkeep(&one_group(&[b.addr], HTTP2)).await;
    let req = Request::post("/orders")
        .header("host", "h2.test")
        .body(Full::new(Bytes::from_static(b"one order")))
        .unwrap();
    let r = send(up.listeners[0], req).await;
    assert_eq!(r.status, 200, "{:?} {}", r.headers, r.text());
    let answered = b.answered.lock().unwrap().clone();
    assert_eq!(answered.len(), 2, "{answered:?}");
    assert!(
        answered[0].is_empty(),
        "the first connection answered nothing"
    );
    assert_eq!(answered[1].len(), 1);
    assert_eq!(
        b.bodies.lock().unwrap().clone(),
        vec![b"one order".to_vec()]
    );
    assert_eq!(
        metric(
            &up,
            "upkeep_pool_connections_total{event=\"h2_refused_replay\"}"
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn streams_refused_by_goaway_with_bodies_over_the_replay_buffer_fail_with_upstream_reset() {
    let b = GoawayBackend::start(2).await;
    // Bodies of 6 bytes, 4 kept: a refused stream cannot be sent again.
    let up = upkeep(&one_group(
        &[b.addr],
        &format!("{HTTP2}[groups.app.pool]\nhttp2_replay_buffer_bytes = 4\n"),
    ))
    .await;
    let listener = up.listeners[0];
    let mut tasks = Vec::new();
    for i in 0..2 {
        tasks.push(tokio::spawn(async move {
            let req = Request::builder()
                .method("POST")
                .uri(format!("/r{i}"))
                .header("host", "h2.test")
                .body(Full::new(Bytes::from(format!("body-{i}"))))
                .unwrap();
            send(listener, req).await
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        statuses.push((r.status, r.headers.get("upkeep-error").cloned()));
    }
    statuses.sort_by_key(|s| s.0);
    assert_eq!(statuses[0].0, 200, "stream 1 was processed: {statuses:?}");
    assert_eq!(statuses[1].0, 502, "{statuses:?}");
    assert_eq!(
        statuses[1].1.as_ref().map(|v| v.to_str().unwrap()),
        Some("upstream_reset"),
        "{statuses:?}"
    );
    assert_eq!(
        metric(
            &up,
            "upkeep_pool_connections_total{event=\"h2_refused_replay\"}"
        )
        .await,
        0.0
    );
}

const HPACK_PROBE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/hpack_probe.py");

/// The names `hpack_probe.py` saw sent as literals never indexed, sorted.
fn never_indexed(seen: &serde_json::Value) -> Vec<&str> {
    seen["never_indexed"]
        .as_array()
        .unwrap_or_else(|| panic!("{seen}"))
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect()
}

/// Values that never repeat (the request id upkeep makes or passes on, a trace context's
/// `traceparent`) travel over HTTP/2 as literals never indexed (RFC 7541 §6.2.3), so that they
/// do not churn both ends' HPACK tables: to an HTTP/2 upstream, from curl over HTTP/1.1 and
/// from an HTTP/2 client, and in an upstream's echo to an HTTP/2 client, from an HTTP/2 and
/// from an HTTP/1.1 upstream. The fields that repeat stay indexable. Read with the `h2`
/// library, which keeps each field's representation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_and_trace_contexts_travel_never_indexed_and_other_fields_stay_indexable() {
    if !support::py::have("h2.connection") {
        return;
    }
    let h2_backend = PyServer::start(HPACK_PROBE, &["h2-server"]).await;
    let h1_backend = PyServer::start(HPACK_PROBE, &["h1-server"]).await;
    let to_h2 = upkeep(&one_group(&[h2_backend.addr], HTTP2)).await;
    let to_h1 = upkeep(&one_group(&[h1_backend.addr], "")).await;
    let trace = "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    // curl over HTTP/1.1, without an id (upkeep makes one) and with one (passed on).
    let url = format!("http://{}/curl-new-id", to_h2.listeners[0]);
    let amzn = "x-amzn-trace-id: Root=1-67891233-abcdef012345678912345678";
    let (body, err) = support::curl(&["-sS", "--http1.1", "-H", trace, "-H", amzn, &url]).await;
    assert_eq!(body, "ok", "{err}");
    let seen = h2_backend
        .find(|l| l["path"] == "/curl-new-id")
        .await
        .expect("the backend saw the request");
    assert_eq!(seen["request_id"].as_str().unwrap().len(), 32, "{seen}");
    assert_eq!(
        never_indexed(&seen),
        ["traceparent", "x-amzn-trace-id", "x-request-id"],
        "{seen}"
    );
    let url = format!("http://{}/curl-own-id", to_h2.listeners[0]);
    let (body, err) = support::curl(&["-sS", "-H", "x-request-id: given-1", &url]).await;
    assert_eq!(body, "ok", "{err}");
    let seen = h2_backend
        .find(|l| l["path"] == "/curl-own-id")
        .await
        .unwrap();
    assert_eq!(seen["request_id"], "given-1", "{seen}");
    assert_eq!(never_indexed(&seen), ["x-request-id"], "{seen}");

    // An HTTP/2 client: three requests on one connection, to each kind of upstream; to a
    // "no-id" path the upstream echoes the trace context alone.
    let (name, value) = trace.split_once(": ").unwrap();
    let field = format!("{name}={value}");
    for (up, path) in [
        (&to_h2, "/h2c-to-h2"),
        (&to_h1, "/h2c-to-h1"),
        (&to_h2, "/h2c-to-h2-no-id"),
        (&to_h1, "/h2c-to-h1-no-id"),
    ] {
        let port = up.listeners[0].port().to_string();
        let got = json_client(HPACK_PROBE, &["client", &port, path, "3", &field]).await;
        let got = got.as_array().unwrap_or_else(|| panic!("{got}"));
        assert_eq!(got.len(), 3);
        let with_id = !path.ends_with("no-id");
        let mut ids = std::collections::HashSet::new();
        for r in got {
            assert_eq!(r["status"], 200, "{path}: {r}");
            let expected: &[&str] = if with_id {
                assert!(
                    ids.insert(r["request_id"].as_str().unwrap().to_owned()),
                    "{r}"
                );
                &["traceparent", "x-request-id"]
            } else {
                assert!(r["request_id"].is_null(), "{r}");
                &["traceparent"]
            };
            assert_eq!(
                never_indexed(r),
                expected,
                "{path}: the echoed values come never indexed, `x-plain` indexable: {r}"
            );
        }
    }
    let from_h2c = h2_backend
        .find(|l| l["path"] == "/h2c-to-h2")
        .await
        .unwrap();
    assert_eq!(
        never_indexed(&from_h2c),
        ["traceparent", "x-request-id"],
        "{from_h2c}"
    );
}

/// upkeep with two serving threads in front of `backend` over HTTP/2, `extra` in its group.
async fn two_threads_h2(backend: SocketAddr, extra: &str) -> upkeep_proxy::server::Running {
    let toml = one_group(&[backend], &format!("{HTTP2}{extra}"));
    let cfg = upkeep_proxy::config::parse(std::path::Path::new("test.toml"), &toml)
        .unwrap_or_else(|e| panic!("test config: {e}"));
    upkeep_proxy::server::start_workers(cfg, None, upkeep_proxy::access_log::AccessLogger::off(), 2)
        .await
        .expect("upkeep starts")
}

/// Holds `n` HTTP/1.1 client connections open at once (the serving threads even them out, so
/// both get some), then sends one request on each, all at once; every answer must be the
/// backend's. Returns how many connections each serving thread held (both some).
async fn one_request_on_each_of(up: &upkeep_proxy::server::Running, n: usize) -> [f64; 2] {
    let listener = up.listeners[0];
    let mut senders = Vec::new();
    for _ in 0..n {
        let io = hyper_util::rt::TokioIo::new(TcpStream::connect(listener).await.unwrap());
        let (s, conn) =
            hyper::client::conn::http1::handshake::<_, http_body_util::Empty<Bytes>>(io)
                .await
                .unwrap();
        tokio::spawn(conn);
        senders.push(s);
    }
    // The hand-overs between threads are done once both count what they serve.
    let mut held = [0.0; 2];
    for _ in 0..100 {
        held = [
            metric(up, "upkeep_worker_connections_open{worker=\"1\"}").await,
            metric(up, "upkeep_worker_connections_open{worker=\"2\"}").await,
        ];
        if held[0] + held[1] == n as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        held[0] > 0.0 && held[1] > 0.0,
        "both threads served some: {held:?}"
    );
    let tasks: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            tokio::spawn(async move {
                let req = Request::get(format!("/sleep/200?i={i}"))
                    .header("host", "h2.test")
                    .body(http_body_util::Empty::<Bytes>::new())
                    .unwrap();
                let resp = tokio::time::timeout(Duration::from_secs(10), s.send_request(req))
                    .await
                    .expect("answered within 10 s")
                    .unwrap();
                let status = resp.status();
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                (status, body)
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, 200, "request {i}: {body:?}");
        assert_eq!(&body[..], b"h2 /sleep/200", "request {i}");
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_serving_thread_has_its_own_http2_connection_and_shares_another_at_the_limit() {
    // Every serving thread drives its own connection to the peer: its requests never wait on
    // the other thread.
    let b = H2Backend::start().await;
    let up = two_threads_h2(b.addr, "").await;
    let held = one_request_on_each_of(&up, 16).await;
    assert_eq!(
        b.stats.connections.load(Ordering::SeqCst),
        2,
        "one upstream connection per serving thread ({held:?} client connections)"
    );

    // Allowed one connection to the peer, the thread that has none sends its requests on the
    // other's rather than refusing them.
    let b = H2Backend::start().await;
    let up = two_threads_h2(b.addr, "[groups.app.pool]\nmax_connections_per_peer = 1\n").await;
    let held = one_request_on_each_of(&up, 16).await;
    assert_eq!(
        b.stats.connections.load(Ordering::SeqCst),
        1,
        "one upstream connection for both threads ({held:?} client connections)"
    );
}
