//! The fake API server on the wire: list, watch from a resourceVersion, bookmarks, 410 Gone,
//! and each fault switched over the control endpoint.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::*;

const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/apps/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dweb";

async fn started() -> (FakeKube, SocketAddr) {
    let (kube, control) = start(
        "127.0.0.1:0".parse().unwrap(),
        Some("127.0.0.1:0".parse().unwrap()),
        Duration::from_millis(200),
        Security::default(),
    )
    .await
    .unwrap();
    (kube, control.unwrap())
}

/// One HTTP/1.1 request with Connection: close; returns (status, body).
async fn request(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

fn addrs(slice: &Value) -> Vec<(String, bool, bool, bool)> {
    slice["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let c = &e["conditions"];
            (
                e["addresses"][0].as_str().unwrap().to_owned(),
                c["ready"].as_bool().unwrap(),
                c["serving"].as_bool().unwrap(),
                c["terminating"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// A watch: reads chunked JSON lines as they come.
struct Watch {
    lines: BufReader<TcpStream>,
}

impl Watch {
    async fn open(addr: SocketAddr, rv: &str) -> Watch {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let path = format!(
            "{SLICES}&watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=30"
        );
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: k\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut lines = BufReader::new(s);
        let mut head = String::new();
        loop {
            let mut l = String::new();
            lines.read_line(&mut l).await.unwrap();
            head.push_str(&l);
            if l == "\r\n" {
                break;
            }
        }
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        Watch { lines }
    }

    /// The next event, skipping chunk-size lines; None when the stream ends.
    async fn next(&mut self) -> Option<Value> {
        loop {
            let mut l = String::new();
            let n = tokio::time::timeout(Duration::from_secs(5), self.lines.read_line(&mut l))
                .await
                .expect("an event within 5 s")
                .ok()?;
            if n == 0 {
                return None;
            }
            if l.trim_start().starts_with('{') {
                return Some(serde_json::from_str(l.trim()).unwrap());
            }
            if l.trim() == "0" {
                return None;
            }
        }
    }

    async fn next_not_bookmark(&mut self) -> Option<Value> {
        loop {
            let e = self.next().await?;
            if e["type"] != "BOOKMARK" {
                return Some(e);
            }
        }
    }
}

#[tokio::test]
async fn list_then_watch_from_its_resource_version_sees_each_change_once() {
    let (kube, control) = started().await;
    let api = kube.local_addr();
    let (s, _) = request(
        control,
        "/endpoints?service=apps/web&ready=127.0.0.11:8080,127.0.0.12:8080&zone=a",
    )
    .await;
    assert_eq!(s, 200);
    let (s, body) = request(api, SLICES).await;
    assert_eq!(s, 200);
    let list: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["kind"], "EndpointSliceList");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["ports"][0]["name"], "http");
    assert_eq!(items[0]["ports"][0]["port"], 8080);
    assert_eq!(items[0]["endpoints"][0]["zone"], "a");
    assert_eq!(
        addrs(&items[0]),
        vec![
            ("127.0.0.11".into(), true, true, false),
            ("127.0.0.12".into(), true, true, false)
        ]
    );
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    let mut w = Watch::open(api, &rv).await;
    // A rolling update: the old endpoint terminates (still serving), a new one is ready.
    request(control, "/terminate?service=apps/web&addrs=127.0.0.11:8080").await;
    let e = w.next_not_bookmark().await.unwrap();
    assert_eq!(e["type"], "MODIFIED");
    assert_eq!(
        addrs(&e["object"])[0],
        ("127.0.0.11".into(), false, true, true)
    );
    request(
        control,
        "/endpoints?service=apps/web&ready=127.0.0.12:8080,127.0.0.13:8080",
    )
    .await;
    let e = w.next_not_bookmark().await.unwrap();
    assert_eq!(addrs(&e["object"]).len(), 2);
    assert_eq!(addrs(&e["object"])[1].0, "127.0.0.13");
    // Bookmarks carry the latest resourceVersion.
    let b = loop {
        let e = w.next().await.unwrap();
        if e["type"] == "BOOKMARK" {
            break e;
        }
    };
    let latest = e["object"]["metadata"]["resourceVersion"].as_str().unwrap();
    assert_eq!(b["object"]["metadata"]["resourceVersion"], latest);
    // Emptied: the slice stays, with no endpoints; the Service still exists.
    request(control, "/empty?service=apps/web").await;
    let e = w.next_not_bookmark().await.unwrap();
    assert_eq!(e["type"], "MODIFIED");
    assert!(addrs(&e["object"]).is_empty());
    assert_eq!(
        request(api, "/api/v1/namespaces/apps/services/web").await.0,
        200
    );
    request(control, "/delete?service=apps/web").await;
    assert_eq!(w.next_not_bookmark().await.unwrap()["type"], "DELETED");
    assert_eq!(
        request(api, "/api/v1/namespaces/apps/services/web").await.0,
        404
    );
}

#[tokio::test]
async fn a_cut_watch_resumes_and_after_gone_resuming_gets_410() {
    let (kube, control) = started().await;
    let api = kube.local_addr();
    request(control, "/endpoints?service=apps/web&ready=127.0.0.11:8080").await;
    let list: Value = serde_json::from_str(&request(api, SLICES).await.1).unwrap();
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut w = Watch::open(api, &rv).await;
    request(control, "/cut").await;
    assert!(w.next_not_bookmark().await.is_none(), "the stream ends");
    // Resuming from the same resourceVersion misses nothing.
    request(control, "/endpoints?service=apps/web&ready=127.0.0.12:8080").await;
    let mut w = Watch::open(api, &rv).await;
    assert_eq!(
        addrs(&w.next_not_bookmark().await.unwrap()["object"])[0].0,
        "127.0.0.12"
    );
    // After compaction, resuming from before it is 410 Gone, as an ERROR event.
    request(control, "/gone").await;
    assert!(w.next_not_bookmark().await.is_none());
    let mut w = Watch::open(api, &rv).await;
    let e = w.next().await.unwrap();
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["code"], 410);
    assert_eq!(e["object"]["reason"], "Expired");
    // A re-list gives the state and a resourceVersion to watch from.
    let list: Value = serde_json::from_str(&request(api, SLICES).await.1).unwrap();
    let rv2 = list["metadata"]["resourceVersion"].as_str().unwrap();
    assert_ne!(rv2, rv);
    request(control, "/endpoints?service=apps/web&ready=127.0.0.13:8080").await;
    let mut w = Watch::open(api, rv2).await;
    assert_eq!(
        addrs(&w.next_not_bookmark().await.unwrap()["object"])[0].0,
        "127.0.0.13"
    );
}

#[tokio::test]
async fn faults_unreachable_5xx_and_slow_then_recovery() {
    let (kube, control) = started().await;
    let api = kube.local_addr();
    request(control, "/endpoints?service=apps/web&ready=127.0.0.11:8080").await;
    assert_eq!(request(control, "/fault?set=5xx").await.0, 200);
    let (s, body) = request(api, SLICES).await;
    assert_eq!(s, 503);
    assert!(body.contains("\"kind\":\"Status\""), "{body}");
    request(control, "/fault?set=unreachable").await;
    let refused = TcpStream::connect(api).await;
    assert!(refused.is_err(), "connections are refused");
    request(control, "/fault?set=slow&delay=300ms").await;
    let t = std::time::Instant::now();
    assert_eq!(request(api, SLICES).await.0, 200);
    assert!(t.elapsed() >= Duration::from_millis(300));
    request(control, "/fault?set=none").await;
    assert_eq!(request(api, SLICES).await.0, 200);
    let (_, log) = request(control, "/requests").await;
    assert!(log.contains(" 503\n") && log.contains(" 200\n"), "{log}");
}
