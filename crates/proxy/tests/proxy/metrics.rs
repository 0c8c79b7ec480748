//! Counters and histograms kept per serving thread and summed when scraped
//! (docs/observability.md, "Per-thread counters"): what two serving threads counted shows up
//! whole in one scrape, series by series, in both exposition formats.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use upkeep_proxy::access_log::AccessLogger;
use upkeep_proxy::server::{start_workers, Running};
use upkeep_test_support::TestBackend;

/// Connections made one after another; each sends `REQUESTS` requests.
const CONNECTIONS: usize = 24;

/// upkeep with `workers` serving threads, as `upkeep serve --workers N` runs it.
async fn upkeep_workers(toml: &str, workers: usize) -> Running {
    upkeep_test_support::init_tracing();
    let cfg = upkeep_proxy::config::parse(Path::new("test.toml"), toml)
        .unwrap_or_else(|e| panic!("test config: {e}"));
    start_workers(cfg, None, AccessLogger::off(), workers)
        .await
        .expect("upkeep starts")
}

/// One keep-alive connection sending the requests of `RESPONSES` in turn.
async fn one_connection(addr: SocketAddr) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    for (host, path, status) in [
        ("m.test", "/", 200),
        ("m.test", "/status/404", 404),
        ("other.test", "/", 404),
    ] {
        sender.ready().await.unwrap();
        let req = Request::get(path)
            .header("host", host)
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), status, "{host}{path}");
        resp.into_body().collect().await.unwrap();
    }
}

/// Samples of a scrape: series (name and labels, as written) -> value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect()
}

async fn scrape(admin: SocketAddr, accept: &str) -> String {
    let stream = TcpStream::connect(admin).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/metrics")
        .header("host", "admin")
        .header("accept", accept)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_served_by_two_serving_threads_are_all_counted_in_one_scrape() {
    let b = TestBackend::start("b").await;
    let up = upkeep_workers(
        &format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n\
             [[route]]\nhost = \"m.test\"\npath = \"/\"\ngroup = \"app\"\n\n\
             [[route]]\nhost = \"m.test\"\npath = \"/status/\"\ngroup = \"app\"\n\n\
             [groups.app]\nendpoints = [\"{}\"]\n",
            b.addr()
        ),
        2,
    )
    .await;
    // One connection at a time: a serving thread reuses its own pooled upstream connection
    // for every request it forwards, so each thread that served opens exactly one, and the
    // backend's connection count tells how many threads served.
    for _ in 0..CONNECTIONS {
        one_connection(up.listeners[0]).await;
    }
    let threads = b.connections();
    assert!(
        threads >= 2,
        "the kernel gave all {CONNECTIONS} connections to one serving thread ({threads} upstream connection opened)"
    );

    let text = scrape(up.admin, "text/plain").await;
    let s = samples(&text);
    let v = |series: &str| {
        *s.get(series)
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    let n = CONNECTIONS as f64;
    let peer = b.addr();
    for (series, want) in [
        ("upkeep_requests_total".to_owned(), 3.0 * n),
        (
            r#"upkeep_responses_total{origin="upstream",class="2xx",cause=""}"#.to_owned(),
            n,
        ),
        (
            r#"upkeep_responses_total{origin="upstream",class="4xx",cause=""}"#.to_owned(),
            n,
        ),
        (
            r#"upkeep_responses_total{origin="proxy",class="4xx",cause="no_route"}"#.to_owned(),
            n,
        ),
        (
            r#"upkeep_route_responses_total{route="m.test/",group="app",class="2xx"}"#.to_owned(),
            n,
        ),
        (
            r#"upkeep_route_responses_total{route="m.test/status/",group="app",class="4xx"}"#
                .to_owned(),
            n,
        ),
        (
            format!(r#"upkeep_peer_responses_total{{group="app",peer="{peer}",class="2xx"}}"#),
            n,
        ),
        (
            format!(r#"upkeep_peer_responses_total{{group="app",peer="{peer}",class="4xx"}}"#),
            n,
        ),
        (
            r#"upkeep_pool_connections_total{event="new"}"#.to_owned(),
            threads as f64,
        ),
        (
            r#"upkeep_pool_connections_total{event="reused"}"#.to_owned(),
            2.0 * n - threads as f64,
        ),
        ("upkeep_request_duration_seconds_count".to_owned(), 3.0 * n),
        (
            r#"upkeep_request_duration_seconds_bucket{le="+Inf"}"#.to_owned(),
            3.0 * n,
        ),
    ] {
        assert_eq!(v(&series), want, "{series}");
    }

    // The sum agrees with the buckets: each observation lies between its bucket's lower and
    // upper bound, so the sum does too, summed over the buckets.
    let mut buckets: Vec<(f64, f64)> = s
        .iter()
        .filter_map(|(k, n)| {
            let le = k
                .strip_prefix("upkeep_request_duration_seconds_bucket{le=\"")?
                .strip_suffix("\"}")?;
            Some((le.parse::<f64>().unwrap_or(f64::INFINITY), *n))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut low, mut high, mut below, mut lower_bound) = (0.0, 0.0, 0.0, 0.0);
    for (le, cumulative) in &buckets {
        let here = cumulative - below;
        assert!(here >= 0.0, "buckets are cumulative: {buckets:?}");
        if here > 0.0 {
            low += here * lower_bound;
            high += here * le;
        }
        below = *cumulative;
        lower_bound = *le;
    }
    let sum = v("upkeep_request_duration_seconds_sum");
    assert!(
        sum > 0.0 && sum >= low * 0.999 && sum <= high * 1.001,
        "sum {sum} outside [{low}, {high}] from the buckets {buckets:?}"
    );

    // OpenMetrics carries the same samples of the per-thread families (the admin side counts
    // in none of them; gauges such as open connections may move between the two scrapes).
    let om = scrape(up.admin, "application/openmetrics-text; version=1.0.0").await;
    assert!(om.ends_with("# EOF\n"));
    let per_thread = |samples: &BTreeMap<String, f64>| -> BTreeSet<String> {
        samples
            .iter()
            .filter(|(k, _)| {
                [
                    "upkeep_requests_total",
                    "upkeep_responses_total",
                    "upkeep_route_responses_total",
                    "upkeep_request_duration_seconds_",
                    "upkeep_pool_connections_total",
                    "upkeep_peer_responses_total",
                    "upkeep_peer_failures_total",
                ]
                .iter()
                .any(|f| k.starts_with(f))
            })
            .map(|(k, n)| format!("{k} {n}"))
            .collect()
    };
    let text_samples = per_thread(&s);
    assert!(text_samples.len() >= 30, "{text_samples:?}");
    assert_eq!(per_thread(&samples(&om)), text_samples);
}
