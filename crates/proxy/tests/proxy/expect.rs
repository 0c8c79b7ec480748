//! `Expect: 100-continue` is the backend's to answer: curl (HTTP/1.1 and HTTP/2) through
//! upkeep to Python's http.server (`tests/expect/backend.py`), which sends its own `100` or
//! refuses before the upload. See docs/protocols.md "Expect: 100-continue".
//!
//! The refusals are 401 and 413: on a 417 curl sends the request again (and again, when the
//! `Expect` header is its user's), which is curl's reading of 417, not the relay under test.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use crate::support;
use crate::support::py::PyServer;

const BACKEND: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/expect/backend.py");

/// The backend: one JSON line per request it handled.
async fn backend() -> PyServer {
    PyServer::start(BACKEND, &[]).await
}

/// The line of the request to `path` (bounded wait).
async fn seen_by(backend: &PyServer, path: &str) -> Value {
    match backend.find(|v| v["path"] == path).await {
        Some(v) => v,
        None => panic!(
            "the backend saw no request to {path}: {:?}",
            backend.lines.lock().unwrap()
        ),
    }
}

/// curl with `Expect: 100-continue` posting `size` bytes; (stdout, verbose stderr).
async fn curl_post(proto: &str, url: &str, size: usize) -> (String, String) {
    curl_post_with(&[proto], url, size).await
}

/// Like `curl_post`, with curl options `args` (protocol, TLS).
async fn curl_post_with(args: &[&str], url: &str, size: usize) -> (String, String) {
    let file = std::env::temp_dir().join(format!(
        "upkeep-expect-{}-{size}-{}",
        std::process::id(),
        url.len()
    ));
    std::fs::write(&file, vec![b'x'; size]).unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        Command::new("curl")
            .args(["-sS", "-v"])
            .args(args)
            .args(["-H", "Expect: 100-continue", "--data-binary"])
            .arg(format!("@{}", file.display()))
            .arg(url)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("curl finished in time")
    .expect("curl runs");
    let _ = std::fs::remove_file(&file);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http1_the_backends_100_reaches_curl_and_the_upload_follows() {
    let backend = backend().await;
    let up = support::upkeep(&support::one_group(&[backend.addr], "")).await;
    let url = format!("http://{}/upload", up.listeners[0]);
    let (body, verbose) = curl_post("--http1.1", &url, 200_000).await;
    assert_eq!(body, "got 200000\n", "{verbose}");
    assert!(verbose.contains("< HTTP/1.1 100 Continue"), "{verbose}");
    assert!(
        !verbose.contains("Done waiting for 100-continue"),
        "curl fell back to sending without the 100: {verbose}"
    );
    let seen = seen_by(&backend, "/upload").await;
    assert_eq!(
        seen["expect"], "100-continue",
        "the backend was asked: {seen}"
    );
    assert_eq!(seen["received"], 200_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http1_a_backend_refusal_reaches_curl_before_any_byte_of_the_upload() {
    let backend = backend().await;
    let up = support::upkeep(&support::one_group(&[backend.addr], "")).await;
    for (path, size, status) in [("/refuse", 50_000, 401), ("/too-big", 2_000_000, 413)] {
        let url = format!("http://{}{path}", up.listeners[0]);
        let (body, verbose) = curl_post("--http1.1", &url, size).await;
        assert!(
            verbose.contains(&format!("< HTTP/1.1 {status} ")),
            "{verbose}"
        );
        assert_eq!(body, "not this one\n", "{verbose}");
        assert!(!verbose.contains("100 Continue"), "{verbose}");
        let seen = seen_by(&backend, path).await;
        assert_eq!(seen["status"], status);
        assert_eq!(
            seen["body_after_refusal"], 0,
            "no byte of the body went upstream after the refusal: {seen}"
        );
    }
    // Upstream connections that carried a refusal are not reused: the next upload works.
    let (body, _) = curl_post(
        "--http1.1",
        &format!("http://{}/after", up.listeners[0]),
        10,
    )
    .await;
    assert_eq!(body, "got 10\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_a_backend_refusal_reaches_curl_before_the_upload_and_an_accepted_upload_completes(
) {
    let backend = backend().await;
    let up = support::upkeep(&support::one_group(&[backend.addr], "")).await;
    let url = format!("http://{}/refuse-h2", up.listeners[0]);
    let (body, verbose) = curl_post("--http2-prior-knowledge", &url, 50_000).await;
    // The refusal's head: the stream stays open for curl to end its side after an early
    // answer, so no reset overtakes the answer. (curl ends its stream at the head, and may
    // not print the body that came with it.)
    let _ = body;
    assert!(verbose.contains("< HTTP/2 401"), "{verbose}");
    assert!(!verbose.contains("< HTTP/2 2"), "{verbose}");
    let seen = seen_by(&backend, "/refuse-h2").await;
    assert_eq!(seen["expect"], "100-continue");
    assert_eq!(seen["body_after_refusal"], 0, "{seen}");
    // Accepted: the backend's 100 opens the way upstream and the upload goes through.
    let url = format!("http://{}/upload-h2", up.listeners[0]);
    let (body, verbose) = curl_post("--http2-prior-knowledge", &url, 100_000).await;
    assert_eq!(body, "got 100000\n", "{verbose}");
    assert_eq!(seen_by(&backend, "/upload-h2").await["received"], 100_000);
}

/// upkeep with a TLS listener (certificate for `upkeep.test`) in front of `backend`; the
/// curl options that reach it over TLS with HTTP/2, and its base URL.
async fn tls_upkeep(
    backend: SocketAddr,
    dir: &std::path::Path,
) -> (upkeep_proxy::server::Running, Vec<String>, String) {
    std::fs::create_dir_all(dir).unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["upkeep.test".to_owned()]).unwrap();
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&c, cert.cert.pem()).unwrap();
    std::fs::write(&k, cert.signing_key.serialize_pem()).unwrap();
    let config = support::one_group(&[backend], "").replace(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n",
        &format!(
            "[[listener]]\nlisten = \"127.0.0.1:0\"\ntls = {{ cert = \"{}\", key = \"{}\" }}\n",
            c.display(),
            k.display()
        ),
    );
    let up = support::upkeep(&config).await;
    let port = up.listeners[0].port();
    let args = vec![
        "--http2".to_owned(),
        "--cacert".to_owned(),
        c.display().to_string(),
        "--resolve".to_owned(),
        format!("upkeep.test:{port}:127.0.0.1"),
    ];
    (up, args, format!("https://upkeep.test:{port}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_the_backends_100_reaches_curl_in_clear_text_and_over_tls() {
    let backend = backend().await;
    let dir = std::env::temp_dir().join(format!("upkeep-expect-tls-{}", std::process::id()));
    let plain = support::upkeep(&support::one_group(&[backend.addr], "")).await;
    let (tls, tls_args, base) = tls_upkeep(backend.addr, &dir).await;
    let tls_args: Vec<&str> = tls_args.iter().map(String::as_str).collect();
    let cases = [
        (
            vec!["--http2-prior-knowledge"],
            format!("http://{}/upload-h2c", plain.listeners[0]),
            "/upload-h2c",
        ),
        (
            tls_args.clone(),
            format!("{base}/upload-h2tls"),
            "/upload-h2tls",
        ),
    ];
    for (args, url, path) in cases {
        let (body, verbose) = curl_post_with(&args, &url, 300_000).await;
        assert_eq!(body, "got 300000\n", "{verbose}");
        // The backend's 100, relayed on the stream as an informational HEADERS frame.
        assert!(verbose.contains("< HTTP/2 100"), "{verbose}");
        assert!(
            !verbose.contains("Done waiting for 100-continue"),
            "curl fell back to sending without the 100: {verbose}"
        );
        let seen = seen_by(&backend, path).await;
        assert_eq!(seen["expect"], "100-continue", "{seen}");
        assert_eq!(seen["received"], 300_000);
    }
    drop(tls);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_a_413_before_the_upload_reaches_curl_and_no_byte_goes_upstream() {
    let backend = backend().await;
    let dir = std::env::temp_dir().join(format!("upkeep-expect-tls413-{}", std::process::id()));
    let plain = support::upkeep(&support::one_group(&[backend.addr], "")).await;
    let (tls, tls_args, base) = tls_upkeep(backend.addr, &dir).await;
    let tls_args: Vec<&str> = tls_args.iter().map(String::as_str).collect();
    let cases = [
        (
            vec!["--http2-prior-knowledge"],
            format!("http://{}/too-big-h2c", plain.listeners[0]),
            "/too-big-h2c",
        ),
        (
            tls_args.clone(),
            format!("{base}/too-big-h2tls"),
            "/too-big-h2tls",
        ),
    ];
    for (args, url, path) in cases {
        let (_, verbose) = curl_post_with(&args, &url, 2_000_000).await;
        assert!(verbose.contains("< HTTP/2 413"), "{verbose}");
        assert!(!verbose.contains("< HTTP/2 100"), "{verbose}");
        let seen = seen_by(&backend, path).await;
        assert_eq!(seen["status"], 413);
        assert_eq!(
            seen["body_after_refusal"], 0,
            "no byte of the body went upstream after the refusal: {seen}"
        );
    }
    drop(tls);
    let _ = std::fs::remove_dir_all(&dir);
}

const H2_BACKEND: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/expect/h2_backend.py");

/// curl (HTTP/1.1 and HTTP/2 in front) through upkeep to an HTTP/2 backend (the `h2` library,
/// h2c) that answers `Expect: 100-continue` itself. hyper's HTTP/2 client drops the peer's
/// `100`; the request's own connection lets upkeep see it, so the upload starts at once: curl
/// waits 0.8 s for a `100` before sending anyway, and upkeep's fallback is 1 s, so an upload
/// that waited for the fallback shows as curl's "Done waiting". A refusal reaches curl before
/// any byte of the upload leaves upkeep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to_an_http2_backend_its_100_and_its_refusal_reach_curl_without_the_fallback_wait() {
    if !support::py::have("h2.connection") {
        return;
    }
    let backend = PyServer::start(H2_BACKEND, &[]).await;
    let up = support::upkeep(&support::one_group(&[backend.addr], "protocol = \"http2\"")).await;
    for (proto, path, shows_100) in [
        ("--http1.1", "/upload-h1", "< HTTP/1.1 100 Continue"),
        ("--http2-prior-knowledge", "/upload-h2", "< HTTP/2 100"),
    ] {
        let url = format!("http://{}{path}", up.listeners[0]);
        let (body, verbose) =
            curl_post_with(&[proto, "--expect100-timeout", "0.8"], &url, 100_000).await;
        assert_eq!(body, "got 100000\n", "{verbose}");
        assert!(verbose.contains(shows_100), "{verbose}");
        assert!(
            !verbose.contains("Done waiting for 100-continue"),
            "curl gave up waiting for the backend's 100: {verbose}"
        );
        let seen = seen_by(&backend, path).await;
        assert_eq!(seen["expect"], "100-continue", "{seen}");
        assert_eq!(seen["received"], 100_000, "{seen}");
    }
    let url = format!("http://{}/refuse-h2up", up.listeners[0]);
    let (_, verbose) = curl_post("--http1.1", &url, 50_000).await;
    assert!(verbose.contains("< HTTP/1.1 401 "), "{verbose}");
    assert!(!verbose.contains("100 Continue"), "{verbose}");
    let seen = seen_by(&backend, "/refuse-h2up").await;
    assert_eq!(seen["body_after_refusal"], 0, "{seen}");
}
