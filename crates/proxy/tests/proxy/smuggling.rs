//! Malformed and smuggling-shaped requests are answered 400/431 and never reach the upstream.

use std::time::Duration;

use upkeep_test_support::{raw_exchange, TestBackend};

use crate::support::{one_group, upkeep};

/// (name, raw request, expected status)
fn cases() -> Vec<(&'static str, Vec<u8>, u16)> {
    let big = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    vec![
        ("cl_and_te", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(), 400),
        ("te_and_cl", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n".to_vec(), 400),
        ("cl_repeated_different", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd".to_vec(), 400),
        ("cl_repeated_same", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc".to_vec(), 400),
        ("cl_list", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc".to_vec(), 400),
        ("cl_negative", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n".to_vec(), 400),
        ("cl_plus", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc".to_vec(), 400),
        ("cl_hex", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x3\r\n\r\nabc".to_vec(), 400),
        ("te_gzip", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(), 400),
        ("te_chunked_not_final", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n".to_vec(), 400),
        ("te_xchunked", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n".to_vec(), 400),
        ("te_repeated", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(), 400),
        ("te_in_http10", b"POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(), 400),
        ("chunk_size_not_hex", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n".to_vec(), 400),
        ("chunk_size_overflow", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\n".to_vec(), 400),
        ("chunk_without_crlf", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX0\r\n\r\n".to_vec(), 400),
        ("chunk_size_bare_lf", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n".to_vec(), 400),
        ("obs_fold", b"GET / HTTP/1.1\r\nHost: a\r\nX-A: one\r\n two\r\n\r\n".to_vec(), 400),
        ("space_before_colon", b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length : 0\r\n\r\n".to_vec(), 400),
        ("invalid_header_name", b"GET / HTTP/1.1\r\nHost: a\r\nX@Y: 1\r\n\r\n".to_vec(), 400),
        ("nul_in_value", b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\x00b\r\n\r\n".to_vec(), 400),
        ("two_hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".to_vec(), 400),
        ("no_host_http11", b"GET / HTTP/1.1\r\nX-A: 1\r\n\r\n".to_vec(), 400),
        ("bad_request_line", b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(), 400),
        ("oversize_headers", big.into_bytes(), 431),
    ]
}

#[tokio::test]
async fn malformed_and_smuggling_shaped_requests_are_refused_and_never_forwarded() {
    let backend = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[backend.addr()], "")).await;
    let cases = cases();
    assert!(cases.len() >= 20);
    let mut failures = Vec::new();
    for (name, raw, want) in &cases {
        let resp = raw_exchange(up.listeners[0], raw, Duration::from_secs(2)).await;
        let status = resp.split(' ').nth(1).and_then(|s| s.parse::<u16>().ok());
        if status != Some(*want) {
            failures.push(format!(
                "{name}: want {want}, got {:?}",
                resp.lines().next()
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(
        backend.seen().is_empty(),
        "the upstream saw {:?}",
        backend.seen()
    );
    assert_eq!(backend.connections(), 0);
}

#[tokio::test]
async fn a_valid_request_after_a_valid_pipelined_one_is_served() {
    // Control case: the framing check must not refuse what is well-formed.
    let backend = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[backend.addr()], "")).await;
    let raw = b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\n\r\nGET /two HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let resp = raw_exchange(up.listeners[0], raw, Duration::from_secs(2)).await;
    assert_eq!(resp.matches("HTTP/1.1 200").count(), 2, "{resp}");
    let seen = backend.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body_len, 3);
    assert_eq!(seen[1].path, "/two");
}
