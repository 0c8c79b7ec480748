//! EndpointSlice discovery as a user meets it: the real `upkeep serve` with
//! `endpoints = [{ kubernetes = "apps/app", port = "http" }]`, pointed by a kubeconfig at the
//! real `upkeep lab kube` (list and watch over loopback HTTP), each API-server fault switched
//! over the lab's control address while the test-support load runs. Peers are read from
//! `/upstreams`; every request under load must succeed.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http::Method;
use serde_json::Value;
use upkeep_test_support::{get, load, TestBackend};

use crate::support::{self, loopback, write, Proc, BIN};

fn temp_dir(name: &str) -> PathBuf {
    support::temp_dir("eps", name)
}

/// `upkeep lab kube` with Service `apps/app` on `ready`, its API and control addresses.
struct Lab {
    _proc: Proc,
    api: SocketAddr,
    control: SocketAddr,
}

impl Lab {
    fn start(ready: &[SocketAddr]) -> Lab {
        let list: Vec<String> = ready.iter().map(|a| a.to_string()).collect();
        let mut child = Command::new(BIN)
            .args(["lab", "kube", "--listen", "127.0.0.1:0"])
            .args(["--control", "127.0.0.1:0", "--bookmark-every", "300ms"])
            .arg("--service")
            .arg(format!("apps/app={}", list.join(",")))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the two address lines, then keeps draining so the pipe never fills.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let proc = Proc(child);
        let (mut api, mut control) = (None, None);
        let addr_in = |l: &str| -> Option<SocketAddr> {
            let rest = l.split("http://").nth(1)?;
            rest.split(['/', ' ']).next()?.parse().ok()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while api.is_none() || control.is_none() {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("lab kube prints its addresses");
            if line.starts_with("fake Kubernetes API server") {
                api = addr_in(&line);
            } else if line.starts_with("control on") {
                control = addr_in(&line);
            }
        }
        Lab {
            _proc: proc,
            api: api.unwrap(),
            control: control.unwrap(),
        }
    }

    async fn ctl(&self, path: &str) -> String {
        let r = get(self.control, "lab", path).await;
        assert_eq!(r.status, 200, "lab control {path}: {}", r.text());
        r.text()
    }

    async fn requests(&self) -> Vec<String> {
        self.ctl("/requests")
            .await
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig.yaml");
        write(
            &path,
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: http://{}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: lab\n    namespace: apps\ncurrent-context: lab\nusers:\n- name: lab\n  user: {{}}\n",
                self.api
            ),
        );
        path
    }
}

struct Upkeep {
    _proc: Proc,
    listen: SocketAddr,
    admin: SocketAddr,
}

/// Starts `upkeep serve` against `lab`, with `extra` appended to group `app`'s discovery
/// table, and waits until it is ready (first list done, peers there).
async fn upkeep(name: &str, lab: &Lab, discovery: &str) -> Upkeep {
    let dir = temp_dir(name);
    let kubeconfig = lab.kubeconfig(&dir);
    let (listen, admin) = (loopback(), loopback());
    let config = format!(
        r#"access_log = "off"
[admin]
listen = "{admin}"
[kubernetes]
kubeconfig = "{}"
request_timeout = "500ms"
[[listener]]
listen = "{listen}"
[[route]]
group = "app"
[groups.app]
endpoints = [{{ kubernetes = "apps/app", port = "http" }}]
[groups.app.health]
consecutive_failures = 3
[groups.app.discovery]
error_backoff = "100ms"
max_refresh = "1s"
{discovery}
"#,
        kubeconfig.display()
    );
    let file = dir.join("upkeep.toml");
    write(&file, &config);
    let child = Proc(
        Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&file)
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if tokio::net::TcpStream::connect(admin).await.is_ok()
            && get(admin, "admin", "/readyz").await.status == 200
        {
            return Upkeep {
                _proc: child,
                listen,
                admin,
            };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("upkeep did not become ready");
}

impl Upkeep {
    /// The group's `kubernetes` entry of `/upstreams`.
    async fn kube(&self) -> Value {
        let r = get(self.admin, "admin", "/upstreams").await;
        let v: Value = serde_json::from_str(&r.text()).unwrap();
        v["groups"]["app"]["kubernetes"][0].clone()
    }

    /// The group's peers as `/upstreams` lists them, sorted.
    async fn peers(&self) -> Vec<String> {
        let r = get(self.admin, "admin", "/upstreams").await;
        let v: Value = serde_json::from_str(&r.text()).unwrap();
        let mut p: Vec<String> = v["groups"]["app"]["peers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["addr"].as_str().unwrap().to_owned())
            .collect();
        p.sort();
        p
    }

    /// Waits (up to 5 s) until the peers are `want`.
    async fn wait_peers(&self, want: &[SocketAddr]) {
        let mut want: Vec<String> = want.iter().map(|a| a.to_string()).collect();
        want.sort();
        let start = Instant::now();
        loop {
            let now = self.peers().await;
            if now == want {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "peers {now:?}, want {want:?}; kubernetes: {}",
                self.kube().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (up to 5 s) until the `kubernetes` entry's last_outcome is `want`.
    async fn wait_outcome(&self, want: &str) -> Value {
        let start = Instant::now();
        loop {
            let k = self.kube().await;
            if k["last_outcome"] == want {
                return k;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "last_outcome never became {want}: {k}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn load(&self, rate: u32, d: Duration) -> tokio::task::JoinHandle<load::Run> {
        let target = self.listen;
        tokio::spawn(async move { load::open_loop(target, Method::GET, "/", rate, d).await })
    }
}

/// `n` backends on one port, each on its own loopback address, as a Service's pods share a
/// target port: the fake API server then keeps them in one EndpointSlice, as the
/// EndpointSlice controller does.
async fn backends(n: usize) -> Vec<TestBackend> {
    let names = ["b0", "b1", "b2", "b3"];
    'attempt: for _ in 0..20 {
        let first = TestBackend::start(names[0]).await;
        let port = first.addr().port();
        let mut v = vec![first];
        for (i, name) in names.iter().enumerate().take(n).skip(1) {
            let addr = SocketAddr::from(([127, 0, 0, 1 + i as u8], port));
            if std::net::TcpListener::bind(addr).is_err() {
                continue 'attempt;
            }
            v.push(TestBackend::start_on(addr, name).await);
        }
        return v;
    }
    panic!("no port free on 127.0.0.1-4");
}

fn addrs(b: &[TestBackend]) -> Vec<SocketAddr> {
    b.iter().map(TestBackend::addr).collect()
}

fn list_requests(reqs: &[String]) -> usize {
    reqs.iter()
        .filter(|r| r.contains("/endpointslices?") && !r.contains("watch=true"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_endpoints_are_peers_and_upstreams_and_metrics_show_the_source() {
    let b = backends(2).await;
    let lab = Lab::start(&addrs(&b));
    let up = upkeep("source", &lab, "").await;
    up.wait_peers(&addrs(&b)).await;
    let k = up.kube().await;
    assert_eq!(k["source"], "kubernetes");
    assert_eq!(k["service"], "apps/app");
    assert_eq!(k["last_outcome"], "synced");
    assert!(k["last_sync"].is_string(), "{k}");
    let rv: u64 = k["resource_version"].as_str().unwrap().parse().unwrap();
    assert!(rv > 0, "{k}");
    // A change on the API server reaches the peers through the watch.
    let extra = TestBackend::start("b9").await;
    lab.ctl(&format!(
        "/endpoints?service=apps/app&ready={},{},{}",
        b[0].addr(),
        b[1].addr(),
        extra.addr()
    ))
    .await;
    up.wait_peers(&[b[0].addr(), b[1].addr(), extra.addr()])
        .await;
    let m = get(up.admin, "admin", "/metrics").await.text();
    for needle in [
        "upkeep_kubernetes_last_sync_timestamp_seconds{group=\"app\",service=\"apps/app\"}",
        "upkeep_kubernetes_resource_version{group=\"app\",service=\"apps/app\"}",
        "upkeep_kubernetes_endpoints{group=\"app\",service=\"apps/app\",state=\"peer\"} 3",
        "upkeep_kubernetes_events_total{event=\"list\"} 1",
        "upkeep_kubernetes_peer_set_changes_total",
    ] {
        assert!(m.contains(needle), "{needle} missing from /metrics:\n{m}");
    }
    let reqs = lab.requests().await;
    assert!(
        reqs.iter()
            .any(|r| r.contains("watch=true") && r.contains("allowWatchBookmarks=true")),
        "a watch with bookmarks: {reqs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_never_changes_the_peers() {
    let b = backends(2).await;
    let lab = Lab::start(&addrs(&b));
    let up = upkeep("unreachable", &lab, "").await;
    up.wait_peers(&addrs(&b)).await;
    let load = up.load(100, Duration::from_secs(3));
    tokio::time::sleep(Duration::from_millis(300)).await;
    lab.ctl("/fault?set=unreachable").await;
    let k = up.wait_outcome("unreachable").await;
    assert!(k["last_error"].is_string(), "{k}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(up.peers().await.len(), 2, "{}", up.kube().await);
    lab.ctl("/fault?set=none").await;
    let run = load.await.unwrap();
    assert!(run.errors().is_empty(), "{}", run.summary());
    // Back: the watch resumes and follows changes again.
    lab.ctl(&format!(
        "/endpoints?service=apps/app&ready={}",
        b[1].addr()
    ))
    .await;
    up.wait_peers(&[b[1].addr()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_5xx_and_slow_answers_never_change_the_peers() {
    let b = backends(2).await;
    let lab = Lab::start(&addrs(&b));
    let up = upkeep("5xx", &lab, "").await;
    up.wait_peers(&addrs(&b)).await;
    let load = up.load(100, Duration::from_secs(3));
    lab.ctl("/fault?set=5xx").await;
    // The open watch ends; every list and watch after it gets 503.
    lab.ctl("/cut").await;
    up.wait_outcome("server_error").await;
    assert_eq!(up.peers().await.len(), 2);
    // Slower than request_timeout (500ms): a timeout, peers unchanged.
    lab.ctl("/fault?set=slow&delay=2s").await;
    lab.ctl("/cut").await;
    up.wait_outcome("timeout").await;
    assert_eq!(up.peers().await.len(), 2);
    lab.ctl("/fault?set=none").await;
    let run = load.await.unwrap();
    assert!(run.errors().is_empty(), "{}", run.summary());
    let reqs = lab.requests().await;
    assert!(reqs.iter().any(|r| r.ends_with(" 503")), "{reqs:?}");
    lab.ctl(&format!(
        "/endpoints?service=apps/app&ready={}",
        b[0].addr()
    ))
    .await;
    up.wait_peers(&[b[0].addr()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_watch_resumes_from_its_resource_version_without_a_relist() {
    let b = backends(2).await;
    let lab = Lab::start(&addrs(&b));
    let up = upkeep("cut", &lab, "").await;
    up.wait_peers(&addrs(&b)).await;
    let load = up.load(100, Duration::from_secs(2));
    let before = up.kube().await["resource_version"].clone();
    lab.ctl("/cut").await;
    // A change made while no watch is open is delivered by the resumed watch.
    lab.ctl(&format!(
        "/endpoints?service=apps/app&ready={}",
        b[0].addr()
    ))
    .await;
    up.wait_peers(&[b[0].addr()]).await;
    let run = load.await.unwrap();
    assert!(run.errors().is_empty(), "{}", run.summary());
    let reqs = lab.requests().await;
    assert_eq!(list_requests(&reqs), 1, "resumed, not re-listed: {reqs:?}");
    let resumed = format!("resourceVersion={}", before.as_str().unwrap());
    assert!(
        reqs.iter()
            .filter(|r| r.contains("watch=true"))
            .nth(1)
            .is_some_and(|r| r.contains("resourceVersion=")),
        "second watch carries a resourceVersion (at least {resumed}): {reqs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_gone_watch_relists_and_keeps_serving() {
    let b = backends(2).await;
    let lab = Lab::start(&addrs(&b));
    let up = upkeep("gone", &lab, "").await;
    up.wait_peers(&addrs(&b)).await;
    let load = up.load(100, Duration::from_secs(2));
    // While the watch is down, a change, then the history is compacted past it: resuming
    // from the last resourceVersion gets 410 Gone, and only a re-list can see the change.
    lab.ctl("/fault?set=unreachable").await;
    up.wait_outcome("unreachable").await;
    lab.ctl(&format!(
        "/endpoints?service=apps/app&ready={}",
        b[1].addr()
    ))
    .await;
    lab.ctl("/gone").await;
    lab.ctl("/fault?set=none").await;
    up.wait_peers(&[b[1].addr()]).await;
    let run = load.await.unwrap();
    assert!(run.errors().is_empty(), "{}", run.summary());
    let reqs = lab.requests().await;
    assert!(list_requests(&reqs) >= 2, "re-listed after 410: {reqs:?}");
    let m = get(up.admin, "admin", "/metrics").await.text();
    assert!(
        m.contains("upkeep_kubernetes_events_total{event=\"gone\"}")
            || m.contains("upkeep_kubernetes_errors_total{reason=\"gone\"}"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emptied_slices_empty_the_group_only_after_stale_grace() {
    let b = backends(2).await;
    let lab = Lab::start(&addrs(&b));
    let up = upkeep("empty", &lab, "stale_grace = \"2s\"").await;
    up.wait_peers(&addrs(&b)).await;
    let load = up.load(100, Duration::from_millis(1500));
    let emptied = Instant::now();
    lab.ctl("/empty?service=apps/app").await;
    // Kept during the grace, and requests keep succeeding.
    let start = Instant::now();
    loop {
        let k = up.kube().await;
        if k["stale_since"].is_string() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(3), "{k}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let run = load.await.unwrap();
    assert!(run.errors().is_empty(), "{}", run.summary());
    assert!(emptied.elapsed() < Duration::from_secs(2));
    assert_eq!(up.peers().await.len(), 2, "kept during stale_grace");
    // Then emptied, with the reason.
    up.wait_peers(&[]).await;
    assert!(
        emptied.elapsed() >= Duration::from_millis(1900),
        "emptied after {:?}, before the grace",
        emptied.elapsed()
    );
    let k = up.kube().await;
    assert_eq!(k["dropped_reason"], "empty_grace_expired", "{k}");
    let r = get(up.listen, "app", "/").await;
    assert_eq!(r.status, 503);
    assert_eq!(
        r.header("upkeep-error"),
        Some("no_peers; reason=empty_group")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_endpoints_drain_no_new_requests_and_in_flight_ones_finish() {
    let b = backends(2).await;
    let lab = Lab::start(&addrs(&b));
    let up = upkeep("drain", &lab, "").await;
    up.wait_peers(&addrs(&b)).await;
    // Slow requests in flight on both peers.
    let slow: Vec<_> = (0..6)
        .map(|_| {
            let t = up.listen;
            tokio::spawn(async move { get(t, "app", "/sleep/1500").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let on_b0 = b[0]
        .seen()
        .iter()
        .filter(|s| s.path.starts_with("/sleep/"))
        .count();
    assert!(on_b0 > 0, "round robin put some on b0");
    let load = up.load(100, Duration::from_secs(2));
    lab.ctl(&format!(
        "/terminate?service=apps/app&addrs={}",
        b[0].addr()
    ))
    .await;
    up.wait_peers(&[b[1].addr()]).await;
    let k = up.kube().await;
    assert_eq!(
        k["draining"],
        serde_json::json!([b[0].addr().to_string()]),
        "{k}"
    );
    let seen_at_drain = b[0].seen().len();
    let run = load.await.unwrap();
    assert!(run.errors().is_empty(), "{}", run.summary());
    assert_eq!(
        b[0].seen().len(),
        seen_at_drain,
        "a draining endpoint got new requests"
    );
    for s in slow {
        let r = s.await.unwrap();
        assert_eq!(r.status, 200, "in-flight request cut: {}", r.text());
    }
}
