//! Bodies stream both ways in bounded memory.

mod support;

use std::convert::Infallible;

use bytes::Bytes;
use futures_util::stream;
use http::Request;
use http_body_util::StreamBody;
use hyper::body::Frame;
use support::{one_group, upkeep};
use upkeep_test_support::{get_counting, rss_bytes, send, TestBackend};

const SIZE: u64 = 100 * 1024 * 1024;
const RSS_LIMIT: u64 = 32 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_megabytes_stream_up_and_down_in_bounded_memory() {
    let backend = TestBackend::start("b").await;
    let up = upkeep(&one_group(&[backend.addr()], "")).await;
    // Warm up allocator pools so the measurement sees growth, not first-use noise.
    let _ = upkeep_test_support::get(up.listeners[0], "x", "/bytes/1048576").await;
    let before = rss_bytes();

    let (status, received) = get_counting(up.listeners[0], &format!("/bytes/{SIZE}")).await;
    assert_eq!(status, 200);
    assert_eq!(received, SIZE);

    let chunk = Bytes::from(vec![b'u'; 64 * 1024]);
    let n = SIZE / chunk.len() as u64;
    let body = StreamBody::new(stream::iter(
        (0..n).map(move |_| Ok::<_, Infallible>(Frame::data(chunk.clone()))),
    ));
    let req = Request::post("/upload")
        .header("host", "x")
        .body(body)
        .unwrap();
    let upload = send(up.listeners[0], req).await;
    assert_eq!(upload.status, 200);
    assert_eq!(upload.text(), format!("{SIZE}\n"));
    let after = rss_bytes();
    // Client, proxy and backend share this process and all stream: growth is what they kept.
    let growth = after.saturating_sub(before);
    assert!(
        growth < RSS_LIMIT,
        "RSS grew by {} MiB",
        growth / (1024 * 1024)
    );
    let seen = backend.seen();
    assert_eq!(seen.last().unwrap().body_len, SIZE);
}
