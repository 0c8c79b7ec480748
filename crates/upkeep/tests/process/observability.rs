//! Metrics, access log, request ids and `check --print` as a user meets them: the real binary,
//! curl as the client, promtool as the metrics linter, and the doctor reading the access log.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use upkeep_test_support::{answers_ok, refusing, TestBackend};

use crate::support::{self, loopbacks, write, Proc, BIN};

fn temp_dir(name: &str) -> PathBuf {
    support::temp_dir("obs", name)
}

fn addrs() -> (SocketAddr, SocketAddr) {
    let [listen, admin] = loopbacks();
    (listen, admin)
}

/// Starts `upkeep serve` on `config` and waits until it is ready.
async fn serve(dir: &Path, config: &str, admin: SocketAddr) -> Proc {
    let file = dir.join("upkeep.toml");
    write(&file, config);
    let child = Proc(
        Command::new(BIN)
            .arg("serve")
            .arg("--config")
            .arg(&file)
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if answers_ok(admin, "admin", "/readyz").await {
            return child;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("upkeep did not become ready");
}

/// Runs curl with `args`; returns (headers, body).
async fn curl(args: &[&str]) -> (String, String) {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "5", "-D", "-"])
        .args(args)
        .output()
        .await
        .expect("curl runs");
    assert!(out.status.success(), "curl {args:?}: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.to_ascii_lowercase(), body.to_owned())
}

/// Waits until the access log has `n` lines (the writer drains in batches).
async fn log_lines(path: &Path, n: usize) -> Vec<String> {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.len() >= n || start.elapsed() > Duration::from_secs(5) {
            assert_eq!(lines.len(), n, "access log:\n{text}");
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn base_config(listen: SocketAddr, admin: SocketAddr, top: &str, groups: &str) -> String {
    format!(
        "{top}\n[admin]\nlisten = \"{admin}\"\n[lifecycle]\ndrain_delay = \"0s\"\n[[listener]]\nlisten = \"{listen}\"\n{groups}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_prometheus_text_or_openmetrics_by_accept_with_build_route_and_peer_series()
{
    let backend = TestBackend::start("b").await;
    let (listen, admin) = addrs();
    let dir = temp_dir("negotiate");
    let groups = format!(
        "[[route]]\ngroup = \"app\"\n[[route]]\npath = \"/status\"\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{}\"]\n",
        backend.addr()
    );
    let _up = serve(
        &dir,
        &base_config(listen, admin, "access_log = \"off\"", &groups),
        admin,
    )
    .await;
    for path in ["/a", "/b", "/status/404"] {
        curl(&[&format!("http://{listen}{path}")]).await;
    }
    let url = format!("http://{admin}/metrics");

    let (head, text) = curl(&["-H", "Accept: text/plain;version=0.0.4", &url]).await;
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert!(
        text.contains("# TYPE upkeep_requests_total counter\n"),
        "{text}"
    );
    assert!(!text.contains("# EOF"), "{text}");
    let (head, om) = curl(&["-H", "Accept: application/openmetrics-text", &url]).await;
    assert!(
        head.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(om.contains("# TYPE upkeep_requests counter\n"), "{om}");
    assert!(om.ends_with("# EOF\n"), "{om}");
    // Without Accept: the Prometheus text format.
    let (head, _) = curl(&[&url]).await;
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");

    let version = env!("CARGO_PKG_VERSION");
    let peer = backend.addr();
    for body in [&text, &om] {
        for series in [
            format!("upkeep_build_info{{version=\"{version}\"}} 1\n"),
            "upkeep_requests_total 3\n".to_owned(),
            "upkeep_route_responses_total{route=\"/\",group=\"app\",class=\"2xx\"} 2\n".to_owned(),
            "upkeep_route_responses_total{route=\"/status\",group=\"app\",class=\"4xx\"} 1\n"
                .to_owned(),
            format!(
                "upkeep_peer_responses_total{{group=\"app\",peer=\"{peer}\",class=\"2xx\"}} 2\n"
            ),
            format!(
                "upkeep_peer_responses_total{{group=\"app\",peer=\"{peer}\",class=\"4xx\"}} 1\n"
            ),
            format!("upkeep_peer_up{{group=\"app\",peer=\"{peer}\"}} 1\n"),
            "upkeep_group_peers{group=\"app\",state=\"healthy\"} 1\n".to_owned(),
        ] {
            assert!(body.contains(&series), "missing {series:?} in:\n{body}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_check_metrics_is_clean_on_a_scrape_after_traffic() {
    if Command::new("promtool").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is missing; CI installs Debian's prometheus package"
        );
        eprintln!("skipped: promtool is not installed (Debian package prometheus)");
        return;
    }
    let backend = TestBackend::start("b").await;
    let (listen, admin) = addrs();
    let dir = temp_dir("promtool");
    // A second group whose only peer refuses connections: proxy-made 502s, an ejection,
    // retries, every family with samples.
    let peer = refusing();
    let closed = peer.addr;
    let groups = format!(
        "[[route]]\ngroup = \"app\"\n[[route]]\nhost = \"down.test\"\ngroup = \"down\"\n\
         [groups.app]\nendpoints = [\"{}\"]\n\
         [groups.down]\nrequired = false\nendpoints = [\"{closed}\"]\n[groups.down.retry]\nconnect_retry_window = \"0s\"\n",
        backend.addr()
    );
    let _up = serve(
        &dir,
        &base_config(listen, admin, "access_log = \"off\"", &groups),
        admin,
    )
    .await;
    for path in ["/", "/status/404", "/status/503", "/bytes/100"] {
        curl(&[&format!("http://{listen}{path}")]).await;
    }
    for _ in 0..4 {
        curl(&["-H", "Host: down.test", &format!("http://{listen}/")]).await;
    }
    let (_, text) = curl(&[&format!("http://{admin}/metrics")]).await;
    assert!(
        text.contains("upkeep_responses_total{origin=\"proxy\",class=\"5xx\""),
        "{text}"
    );

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {:?}\n{said}\n--- scrape:\n{text}",
        out.status
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_access_log_has_client_user_agent_referer_request_id_route_group_and_upstream_fields()
{
    let backend = TestBackend::start("b").await;
    let (listen, admin) = addrs();
    let dir = temp_dir("json-log");
    let log = dir.join("access.log");
    let top = format!("access_log = \"{}\"", log.display());
    let groups = format!(
        "[[route]]\nhost = \"shop.test\"\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{}\"]\n",
        backend.addr()
    );
    let _up = serve(&dir, &base_config(listen, admin, &top, &groups), admin).await;

    curl(&[
        "-H",
        "Host: shop.test",
        "-A",
        "obs-test/1.0 (\"quoted\")",
        "-e",
        "https://ref.test/page",
        "-H",
        "X-Request-Id: client-id-42",
        &format!("http://{listen}/cart/items?x=1"),
    ])
    .await;
    // Without an id, or with one that is not well formed: upkeep makes one.
    curl(&["-H", "Host: shop.test", &format!("http://{listen}/cart")]).await;
    curl(&[
        "-H",
        "Host: shop.test",
        "-H",
        "X-Request-Id: bad id with spaces",
        &format!("http://{listen}/status/503"),
    ])
    .await;

    let lines = log_lines(&log, 3).await;
    let recs: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let r = &recs[0];
    assert_eq!(r["client"], "127.0.0.1", "{r}");
    assert_eq!(r["user_agent"], "obs-test/1.0 (\"quoted\")", "{r}");
    assert_eq!(r["referer"], "https://ref.test/page", "{r}");
    assert_eq!(r["request_id"], "client-id-42", "{r}");
    assert_eq!(r["route"], "shop.test/", "{r}");
    assert_eq!(r["group"], "app", "{r}");
    assert_eq!(r["upstream_status"], 200, "{r}");
    assert!(
        r["upstream_header_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{r}"
    );
    assert!(r["duration_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{r}");
    assert_eq!(r["peer"], backend.addr().to_string(), "{r}");
    assert_eq!(
        recs[1]["user_agent"]
            .as_str()
            .map(|s| s.starts_with("curl/")),
        Some(true)
    );
    assert_eq!(recs[1]["referer"], serde_json::Value::Null);
    assert_eq!(recs[2]["status"], 503);
    assert_eq!(recs[2]["upstream_status"], 503);

    // The upstream saw the same ids as the log.
    let seen = backend.seen();
    assert_eq!(seen.len(), 3);
    for (s, rec) in seen.iter().zip(&recs) {
        let sent: Vec<_> = s.headers.get_all("x-request-id").iter().collect();
        assert_eq!(sent.len(), 1, "{:?}", s.headers);
        assert_eq!(
            sent[0].to_str().unwrap(),
            rec["request_id"].as_str().unwrap()
        );
    }
    for rec in &recs[1..] {
        let id = rec["request_id"].as_str().unwrap();
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "made id {id:?}"
        );
    }
    assert_ne!(recs[1]["request_id"], recs[2]["request_id"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combined_access_log_is_read_back_by_doctor_logs_access_log() {
    let backend = TestBackend::start("b").await;
    let (listen, admin) = addrs();
    let dir = temp_dir("combined");
    let log = dir.join("access.log");
    let top = format!(
        "access_log = \"{}\"\naccess_log_format = \"combined\"",
        log.display()
    );
    let peer = refusing();
    let closed = peer.addr;
    let groups = format!(
        "[[route]]\ngroup = \"app\"\n[[route]]\npath = \"/down\"\ngroup = \"down\"\n\
         [groups.app]\nendpoints = [\"{}\"]\n\
         [groups.down]\nrequired = false\nendpoints = [\"{closed}\"]\n[groups.down.retry]\nconnect_retry_window = \"0s\"\n",
        backend.addr()
    );
    let _up = serve(&dir, &base_config(listen, admin, &top, &groups), admin).await;
    let started = std::time::SystemTime::now();
    curl(&["-A", "obs/1", &format!("http://{listen}/ok")]).await;
    for _ in 0..3 {
        let (head, _) = curl(&[&format!("http://{listen}/down")]).await;
        assert!(head.starts_with("http/1.1 502"), "{head}");
    }
    let lines = log_lines(&log, 4).await;
    assert!(
        lines[0].starts_with("127.0.0.1 - - [")
            && lines[0].ends_with("\"GET /ok HTTP/1.1\" 200 6 \"-\" \"obs/1\" 200"),
        "{}",
        lines[0]
    );
    assert!(lines[1].ends_with(" -"), "{}", lines[1]);

    // An nginx error log whose "no live upstreams" episode spans the requests above; the
    // doctor counts the access log's 502s into it.
    let secs =
        |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let stamp = |s: u64| {
        let t = std::time::UNIX_EPOCH + Duration::from_secs(s);
        let iso = humantime_iso(t);
        format!(
            "{}/{}/{} {}",
            &iso[0..4],
            &iso[5..7],
            &iso[8..10],
            &iso[11..19]
        )
    };
    let (from, to) = (
        secs(started).saturating_sub(1),
        secs(std::time::SystemTime::now()) + 1,
    );
    let mut error_log = String::new();
    for s in from..=to {
        error_log.push_str(&format!(
            "{} [error] 7#7: *{s} no live upstreams while connecting to upstream, client: 127.0.0.1, server: _, request: \"GET /down HTTP/1.1\", upstream: \"http://down/down\", host: \"{listen}\"\n",
            stamp(s)
        ));
    }
    let err_path = dir.join("error.log");
    write(&err_path, &error_log);
    let out = Command::new(BIN)
        .args(["doctor", "logs", "--format", "json", "--fail-on", "error"])
        .arg(&err_path)
        .arg("--access-log")
        .arg(&log)
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let counts: Vec<u64> = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["details"]["client_502"].as_u64())
        .collect();
    assert_eq!(counts, vec![3], "{doc:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `2026-11-30T08:10:38Z` without a date library.
fn humantime_iso(t: std::time::SystemTime) -> String {
    let s = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rem) = (s.div_euclid(86_400), s.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[test]
fn check_print_round_trips_every_example() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let dir = temp_dir("print");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&examples)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let print = |file: &Path| {
        let out = Command::new(BIN)
            .args(["check", "--print"])
            .arg(file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    for file in files {
        let first = print(&file);
        // Saved somewhere else: the printed file must mean the same there.
        let saved = dir.join(file.file_name().unwrap());
        write(&saved, &first);
        let second = print(&saved);
        assert_eq!(first, second, "{}", file.display());
        assert!(first.contains("[[listener]]"), "{first}");
        assert!(first.contains("access_log_format = \"json\""), "{first}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
