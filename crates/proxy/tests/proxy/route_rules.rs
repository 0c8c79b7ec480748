//! Route rules end to end: header rules both ways with placeholders, strip_prefix and
//! rewrite, redirect and fixed-response routes, max_body_bytes (Content-Length and chunked),
//! per-route timeouts, and config errors with their positions. Headers are asserted exactly
//! as they arrive on the wire, at the backend and at the client.

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use upkeep_proxy::access_log::AccessLogger;
use upkeep_proxy::config::AccessLog;
use upkeep_proxy::server::start_with;
use upkeep_test_support::TestBackend;

use crate::support::raw::{exchange, RawBackend, OK};
use crate::support::{metric, upkeep};

fn config(backend: std::net::SocketAddr, routes: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n{routes}\n[groups.app]\nendpoints = [\"{backend}\"]\n"
    )
}

fn head_of(resp: &str) -> &str {
    resp.split_once("\r\n\r\n").map_or(resp, |(h, _)| h)
}

/// Every value of `name` in a raw response head, one per line.
fn values(head: &str, name: &str) -> Vec<String> {
    head.lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_owned())
        .collect()
}

#[tokio::test]
async fn header_rules_set_add_and_remove_both_ways_with_placeholders() {
    let b = RawBackend::start(
        b"HTTP/1.1 200 OK\r\nServer: raw/1\r\nX-Served-By: backend\r\nX-Frame-Options: SAMEORIGIN\r\nContent-Length: 2\r\n\r\nok",
    )
    .await;
    let routes = r#"
[[route]]
group = "app"
request_headers = { set = { "X-Client" = "{client_ip}", "x-origin" = "{scheme}://{host}", "x-trace" = "id={request_id}" }, add = { "x-tag" = "route" }, remove = ["x-secret"] }
response_headers = { set = { "x-frame-options" = "DENY" }, add = { "x-served-by" = "upkeep {host}" }, remove = ["server"] }
"#;
    let up = upkeep(&config(b.addr(), routes)).await;
    // The client nominates a header the route adds in `Connection`: the nomination is
    // ignored, so its own value stays beside the route's.
    let resp = exchange(
        up.listeners[0],
        b"GET /r HTTP/1.1\r\nHost: Rules.Test:8080\r\nX-Request-Id: abc-123\r\nX-Secret: hunter2\r\nX-Tag: client\r\nX-Client: forged\r\nConnection: close, x-tag\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    let seen = &b.seen()[0];
    assert_eq!(seen.value("x-client"), "127.0.0.1", "{}", seen.head);
    assert_eq!(seen.value("x-origin"), "http://rules.test");
    assert_eq!(seen.value("x-trace"), "id=abc-123");
    assert_eq!(seen.value("x-request-id"), "abc-123");
    assert_eq!(
        seen.values("x-tag"),
        vec!["client", "route"],
        "{}",
        seen.head
    );
    assert!(seen.values("x-secret").is_empty(), "{}", seen.head);
    assert_eq!(seen.value("host"), "Rules.Test:8080");

    let head = head_of(&resp);
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{resp}");
    assert_eq!(values(head, "x-frame-options"), vec!["DENY"], "{head}");
    assert_eq!(
        values(head, "x-served-by"),
        vec!["backend", "upkeep rules.test"],
        "{head}"
    );
    assert!(values(head, "server").is_empty(), "{head}");
}

#[tokio::test]
async fn strip_prefix_and_rewrite_change_the_forwarded_path_and_keep_the_query() {
    let b = RawBackend::start(OK).await;
    let routes = r#"
[[route]]
path = "/api"
group = "app"
strip_prefix = true
[[route]]
path = "/old/"
group = "app"
rewrite = { from = "^/old/([a-z]+)/(.*)$", to = "/new/$2/$1" }
[[route]]
path = "/v1/"
group = "app"
strip_prefix = true
rewrite = { from = "^/(.*)$", to = "/internal/$1" }
"#;
    let up = upkeep(&config(b.addr(), routes)).await;
    let l = up.listeners[0];
    for (sent, forwarded) in [
        ("/api/users?q=1", "GET /users?q=1 HTTP/1.1"),
        ("/api", "GET / HTTP/1.1"),
        ("/old/abc/x/y?z=2", "GET /new/x/y/abc?z=2 HTTP/1.1"),
        ("/old/ABC", "GET /old/ABC HTTP/1.1"),
        ("/v1/items", "GET /internal/items HTTP/1.1"),
    ] {
        let req = format!("GET {sent} HTTP/1.1\r\nHost: p.test\r\nConnection: close\r\n\r\n");
        let resp = exchange(l, req.as_bytes(), Duration::from_secs(3)).await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{sent}: {resp}");
        let seen = b.seen();
        assert_eq!(seen.last().unwrap().request_line(), forwarded, "{sent}");
    }
}

#[tokio::test]
async fn redirect_and_respond_routes_answer_without_a_group_and_reach_no_backend() {
    let b = RawBackend::start(OK).await;
    let routes = r#"
[[route]]
host = "plain.test"
redirect = { to = "https://{host}{path}", status = 301 }
[[route]]
path = "/moved"
strip_prefix = true
redirect = { to = "https://new.test{path}" }
[[route]]
path = "/healthz"
respond = { status = 200, body = "up\n" }
response_headers = { set = { "cache-control" = "no-store" } }
[[route]]
path = "/gone"
respond = { status = 410 }
[[route]]
group = "app"
"#;
    let up = upkeep(&config(b.addr(), routes)).await;
    let l = up.listeners[0];
    let get = |target: &str, host: &str| {
        format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
    };

    let resp = exchange(
        l,
        get("/a/b?c=1", "Plain.Test:80").as_bytes(),
        Duration::from_secs(3),
    )
    .await;
    let head = head_of(&resp);
    assert!(head.starts_with("HTTP/1.1 301 Moved Permanently"), "{resp}");
    assert_eq!(values(head, "location"), vec!["https://plain.test/a/b?c=1"]);
    assert_eq!(values(head, "content-length"), vec!["0"], "{head}");

    let resp = exchange(
        l,
        get("/moved/x?y", "o.test").as_bytes(),
        Duration::from_secs(3),
    )
    .await;
    let head = head_of(&resp);
    assert!(
        head.starts_with("HTTP/1.1 308 Permanent Redirect"),
        "{resp}"
    );
    assert_eq!(values(head, "location"), vec!["https://new.test/x?y"]);

    let resp = exchange(
        l,
        get("/healthz", "o.test").as_bytes(),
        Duration::from_secs(3),
    )
    .await;
    let head = head_of(&resp);
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{resp}");
    assert!(resp.ends_with("\r\n\r\nup\n"), "{resp}");
    assert_eq!(
        values(head, "content-type"),
        vec!["text/plain; charset=utf-8"]
    );
    assert_eq!(values(head, "cache-control"), vec!["no-store"]);
    assert!(values(head, "upkeep-error").is_empty(), "{head}");

    let resp = exchange(l, get("/gone", "o.test").as_bytes(), Duration::from_secs(3)).await;
    assert!(resp.starts_with("HTTP/1.1 410 Gone"), "{resp}");

    assert!(b.seen().is_empty(), "no backend was asked: {:?}", b.seen());
    let resp = exchange(
        l,
        get("/other", "o.test").as_bytes(),
        Duration::from_secs(3),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert_eq!(b.seen().len(), 1);
    // Counted as upkeep's own answers, not the upstream's.
    assert_eq!(
        metric(&up, "upkeep_responses_total{origin=\"proxy\",class=\"3xx\"").await,
        2.0
    );
}

#[tokio::test]
async fn max_body_bytes_refuses_a_long_content_length_at_once_and_cuts_a_chunked_body() {
    let b = RawBackend::start(OK).await;
    let routes = "[[route]]\ngroup = \"app\"\nmax_body_bytes = 1000\n";
    let dir = std::env::temp_dir().join(format!("upkeep-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("body-limit.log");
    let _ = std::fs::remove_file(&log);
    let cfg = upkeep_proxy::config::parse(Path::new("t.toml"), &config(b.addr(), routes)).unwrap();
    let up = start_with(
        cfg,
        None,
        AccessLogger::start(&AccessLog::File(log.clone())).unwrap(),
    )
    .await
    .unwrap();
    let l = up.listeners[0];

    // Under the limit: forwarded whole.
    let mut req =
        b"POST /ok HTTP/1.1\r\nHost: b.test\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n"
            .to_vec();
    req.extend(vec![b'a'; 1000]);
    let resp = exchange(l, &req, Duration::from_secs(3)).await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert_eq!(b.seen()[0].body.len(), 1000);

    // A declared length over the limit: 413 before a body byte is read; no backend sees it.
    let started = Instant::now();
    let resp = exchange(
        l,
        b"POST /big HTTP/1.1\r\nHost: b.test\r\nContent-Length: 1001\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered without waiting for the body"
    );
    let head = head_of(&resp);
    assert!(head.starts_with("HTTP/1.1 413 Payload Too Large"), "{resp}");
    assert_eq!(values(head, "upkeep-error"), vec!["body_too_large"]);
    assert_eq!(b.seen().len(), 1);

    // A chunked body that passes the limit as it streams: the backend gets at most the
    // limit, its request cut; the client gets 413.
    let mut s = TcpStream::connect(l).await.unwrap();
    s.write_all(
        b"POST /stream HTTP/1.1\r\nHost: b.test\r\nTransfer-Encoding: chunked\r\n\r\n258\r\n",
    )
    .await
    .unwrap();
    s.write_all(&[b'x'; 600]).await.unwrap();
    s.write_all(b"\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(b"258\r\n").await.unwrap();
    s.write_all(&[b'y'; 600]).await.unwrap();
    s.write_all(b"\r\n").await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut out)).await;
    let resp = String::from_utf8_lossy(&out);
    let head = head_of(&resp);
    assert!(head.starts_with("HTTP/1.1 413 Payload Too Large"), "{resp}");
    assert_eq!(values(head, "upkeep-error"), vec!["body_too_large"]);
    let deadline = Instant::now() + Duration::from_secs(3);
    while b.seen().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = b.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(!seen[1].complete, "the backend's request was cut");
    assert!(seen[1].body.len() <= 1000, "{}", seen[1].body.len());
    assert!(seen[1].body.iter().all(|c| *c == b'x'));

    assert_eq!(
        metric(
            &up,
            "upkeep_responses_total{origin=\"proxy\",class=\"4xx\",cause=\"body_too_large\"}"
        )
        .await,
        2.0
    );
    let shared = up.shared.clone();
    assert!(shared.access_log.flush(Duration::from_secs(2)));
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("\"cause\":\"body_too_large\""))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines.iter().all(|l| l.contains("\"status\":413")), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn max_body_bytes_cuts_an_http2_body_as_it_streams() {
    use bytes::Bytes;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let b = RawBackend::start(OK).await;
    let routes = "[[route]]\ngroup = \"app\"\nmax_body_bytes = 1000\n";
    let up = upkeep(&config(b.addr(), routes)).await;
    let stream = TcpStream::connect(up.listeners[0]).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    // No length is declared: the limit is met as the DATA frames arrive.
    let frames = futures_util::stream::iter(
        [600usize, 600]
            .map(|n| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![b'z'; n])))),
    );
    let req = http::Request::post("http://h2.test/up")
        .body(StreamBody::new(frames))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(resp.headers()["upkeep-error"], "body_too_large");
    for seen in b.seen() {
        assert!(
            !seen.complete || seen.body.len() <= 1000,
            "no complete oversize body upstream: {} bytes",
            seen.body.len()
        );
    }
}

/// `/sleep/` with its own short timeouts, `/wait` with the group's.
const TIMEOUT_ROUTES: &str = r#"
[[route]]
path = "/sleep/"
group = "app"
try_timeout = "200ms"
deadline = "300ms"
[[route]]
path = "/wait"
group = "app"
strip_prefix = true
"#;

#[tokio::test]
async fn a_routes_timeouts_override_its_groups() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&config(b.addr(), TIMEOUT_ROUTES)).await;
    let l = up.listeners[0];
    let started = Instant::now();
    let r = upkeep_test_support::get(l, "t.test", "/sleep/2000").await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.header("upkeep-error"), Some("upstream_timeout"));
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    // The group's own 30 s try timeout still applies on another route: a 500 ms answer is
    // waited for.
    let started = Instant::now();
    let r = upkeep_test_support::get(l, "t.test", "/wait/sleep/500").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(started.elapsed() >= Duration::from_millis(450));
}

/// One upstream connection serves a route with the group's 30 s try timeout, then one with
/// 200 ms: the connection's kept timer is moved earlier for the second try.
#[tokio::test]
async fn a_shorter_try_timeout_applies_on_a_connection_a_longer_one_used_before() {
    let b = TestBackend::start("b").await;
    let up = upkeep(&config(b.addr(), TIMEOUT_ROUTES)).await;
    let l = up.listeners[0];
    let r = upkeep_test_support::get(l, "t.test", "/wait/one").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let started = Instant::now();
    let r = upkeep_test_support::get(l, "t.test", "/sleep/2000").await;
    let took = started.elapsed();
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.header("upkeep-error"), Some("upstream_timeout"));
    assert!(
        took >= Duration::from_millis(180) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    assert_eq!(b.connections(), 1, "both requests went on one connection");
}

#[test]
fn rule_errors_are_reported_together_with_their_positions() {
    let text = r#"[[listener]]
listen = "127.0.0.1:8080"
[[route]]
path = "/none"
strip_prefix = true
[[route]]
group = "app"
redirect = { to = "https://x{path}" }
[[route]]
group = "app"
request_headers = { set = { "x-a" = "{nope}", "bad name" = "v" }, remove = ["transfer-encoding", "host"] }
rewrite = { from = "([a-", to = "/x" }
max_body_bytes = 0
try_timeout = "20s"
deadline = "10s"
[[route]]
path = "/r"
redirect = { to = "/x", status = 200 }
max_body_bytes = 10
[[route]]
path = "/s"
respond = { status = 204, body = "no" }
[groups.app]
endpoints = ["127.0.0.1:9000"]
"#;
    let err = upkeep_proxy::config::parse(Path::new("t.toml"), text).unwrap_err();
    let got: Vec<String> = err.problems.iter().map(|p| p.to_string()).collect();
    let expect = [
        ("t.toml:3:1:", "exactly one of group, redirect or respond"),
        ("t.toml:8:12:", "this one has group and redirect"),
        ("t.toml:11:", "bad name"),
        ("t.toml:11:", "unknown placeholder {nope}"),
        ("t.toml:11:", "transfer-encoding frames the message"),
        ("t.toml:11:", "host is always sent upstream"),
        (
            "t.toml:12:20:",
            "is not a regular expression: unclosed character class",
        ),
        ("t.toml:13:18:", "max_body_bytes must be between 1"),
        (
            "t.toml:14:15:",
            "try_timeout (20s) is longer than deadline (10s)",
        ),
        ("t.toml:18:34:", "redirect status 200 is not a redirect"),
        (
            "t.toml:19:18:",
            "max_body_bytes has no effect on a route that answers with redirect",
        ),
        ("t.toml:22:34:", "a 204 response has no body"),
    ];
    for (at, what) in expect {
        assert!(
            got.iter().any(|p| p.starts_with(at) && p.contains(what)),
            "{at} {what}\n{got:#?}"
        );
    }
    assert_eq!(got.len(), expect.len(), "{got:#?}");
}

#[test]
fn rules_print_back_as_toml_that_parses_to_the_same_config() {
    let text = r#"[[listener]]
listen = "127.0.0.1:8080"
[[route]]
path = "/api"
group = "app"
strip_prefix = true
rewrite = { from = "^/(.*)$", to = "/v2/$1" }
request_headers = { set = { "x-client" = "{client_ip}" }, add = { "x-via" = "upkeep" }, remove = ["cookie"] }
response_headers = { set = { "strict-transport-security" = "max-age=63072000" } }
max_body_bytes = 1048576
try_timeout = "5s"
deadline = "10s"
[[route]]
host = "old.test"
redirect = { to = "https://new.test{path}", status = 301 }
[[route]]
path = "/ping"
respond = { body = "pong" }
[groups.app]
endpoints = ["127.0.0.1:9000"]
"#;
    let cfg = upkeep_proxy::config::parse(Path::new("t.toml"), text).unwrap();
    let printed = upkeep_proxy::config::to_toml(&cfg).unwrap();
    let again = upkeep_proxy::config::parse(Path::new("t.toml"), &printed)
        .unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(again, cfg, "{printed}");
    for key in [
        "strip_prefix = true",
        "max_body_bytes = 1048576",
        "try_timeout = \"5s\"",
        "from = \"^/(.*)$\"",
        "x-client = \"{client_ip}\"",
        "status = 301",
        "body = \"pong\"",
    ] {
        assert!(printed.contains(key), "{key} missing:\n{printed}");
    }
}

/// upkeep's forwarding headers are written after the request's own fields, not inserted into
/// its map (`headers::Added`): each must still reach the backend exactly once, replace what an
/// untrusted client forged, and yield to a route's rules.
#[tokio::test]
async fn forwarding_headers_reach_the_backend_once_and_route_rules_override_them() {
    let b = RawBackend::start(OK).await;
    let routes = r#"
[[route]]
path = "/ruled/"
group = "app"
request_headers = { set = { "x-forwarded-for" = "route" }, remove = ["x-forwarded-host"] }

[[route]]
group = "app"
"#;
    let up = upkeep(&config(b.addr(), routes)).await;
    let forged =
        "X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: evil.test\r\n";
    for path in ["/plain", "/ruled/x"] {
        let req =
            format!("GET {path} HTTP/1.1\r\nHost: fw.test\r\n{forged}Connection: close\r\n\r\n");
        let resp = exchange(up.listeners[0], req.as_bytes(), Duration::from_secs(3)).await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{path}: {resp}");
    }
    let seen = b.seen();
    assert_eq!(seen.len(), 2);
    let plain = &seen[0];
    assert_eq!(
        plain.values("x-forwarded-for"),
        vec!["127.0.0.1"],
        "{}",
        plain.head
    );
    assert_eq!(
        plain.values("x-forwarded-proto"),
        vec!["http"],
        "{}",
        plain.head
    );
    assert_eq!(
        plain.values("x-forwarded-host"),
        vec!["fw.test"],
        "{}",
        plain.head
    );
    let ruled = &seen[1];
    assert_eq!(
        ruled.values("x-forwarded-for"),
        vec!["route"],
        "{}",
        ruled.head
    );
    assert_eq!(
        ruled.values("x-forwarded-proto"),
        vec!["http"],
        "{}",
        ruled.head
    );
    assert!(
        ruled.values("x-forwarded-host").is_empty(),
        "{}",
        ruled.head
    );
}

/// A request that came without an `x-request-id` gets one made by upkeep: it goes upstream
/// once, and `{request_id}` in a route's templates is that id.
#[tokio::test]
async fn a_made_request_id_goes_upstream_once_and_fills_the_placeholder() {
    let b = RawBackend::start(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let routes = r#"
[[route]]
group = "app"
request_headers = { set = { "x-trace" = "id={request_id}" } }
"#;
    let up = upkeep(&config(b.addr(), routes)).await;
    let resp = exchange(
        up.listeners[0],
        b"GET /r HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
    let seen = &b.seen()[0];
    let ids = seen.values("x-request-id");
    assert_eq!(ids.len(), 1, "{}", seen.head);
    assert!(
        ids[0].len() == 32 && ids[0].bytes().all(|c| c.is_ascii_hexdigit()),
        "{}",
        seen.head
    );
    assert_eq!(seen.value("x-trace"), format!("id={}", ids[0]));
}
