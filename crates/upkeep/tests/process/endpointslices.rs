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

use crate::support::{loopbacks, write, Proc, BIN};

/// A fresh directory for one test's files.
fn temp_dir(name: &str) -> PathBuf {
    crate::support::temp_dir("eps", name)
}

/// `upkeep lab kube` with Service `apps/app` on `ready`, its API and control addresses.
struct Lab {
    _proc: Proc,
    api: SocketAddr,
    control: SocketAddr,
}

impl Lab {
    fn start(ready: &[SocketAddr]) -> Lab {
        Self::start_with(ready, &[])
    }

    /// With extra `upkeep lab kube` arguments (`--tls-cert`, `--tls-key`, `--token`).
    fn start_with(ready: &[SocketAddr], extra: &[&std::ffi::OsStr]) -> Lab {
        let list: Vec<String> = ready.iter().map(|a| a.to_string()).collect();
        let mut child = Command::new(BIN)
            .args(["lab", "kube", "--listen", "127.0.0.1:0"])
            .args(["--control", "127.0.0.1:0", "--bookmark-every", "300ms"])
            .args(extra)
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
            let rest = l.split("://").nth(1)?;
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
    proc: Proc,
    listen: SocketAddr,
    admin: SocketAddr,
    /// The config file, rewritten by tests that reload.
    file: PathBuf,
}

/// Starts `upkeep serve` against `lab`, with `extra` appended to group `app`'s discovery
/// table, and waits until it is ready (first list done, peers there).
async fn upkeep(name: &str, lab: &Lab, discovery: &str) -> Upkeep {
    let dir = temp_dir(name);
    let kubeconfig = lab.kubeconfig(&dir);
    let section = format!("kubeconfig = \"{}\"", kubeconfig.display());
    upkeep_with(&dir, &section, &[], discovery).await
}

/// upkeep's config with `kube` as the `[kubernetes]` table (after `request_timeout`).
fn config_text(listen: SocketAddr, admin: SocketAddr, kube: &str, discovery: &str) -> String {
    format!(
        r#"access_log = "off"
[admin]
listen = "{admin}"
[kubernetes]
request_timeout = "500ms"
{kube}
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
"#
    )
}

/// Starts `upkeep serve` in `dir` with `kube` as its `[kubernetes]` table and `env` set (none
/// of the caller's Kubernetes environment leaks in), and waits until it is ready.
async fn upkeep_with(dir: &Path, kube: &str, env: &[(&str, String)], discovery: &str) -> Upkeep {
    let [listen, admin] = loopbacks();
    let file = dir.join("upkeep.toml");
    write(&file, &config_text(listen, admin, kube, discovery));
    let child = Proc(
        Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&file)
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env("HOME", dir)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if upkeep_test_support::answers_ok(admin, "admin", "/readyz").await {
            return Upkeep {
                proc: child,
                listen,
                admin,
                file,
            };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("upkeep did not become ready");
}

impl Upkeep {
    /// Rewrites the config's `[kubernetes]` table and reloads (SIGHUP to this process).
    async fn reload_kubernetes(&self, kube: &str, discovery: &str) {
        write(
            &self.file,
            &config_text(self.listen, self.admin, kube, discovery),
        );
        let st = Command::new("kill")
            .args(["-HUP", &self.proc.0.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }

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

const TOKEN: &str = "lab-service-account-token";

/// A self-signed CA (`CN=name`) as a PEM string and its issuer.
fn ca(name: &str) -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap()
}

/// `upkeep lab kube` over HTTPS with a certificate for 127.0.0.1 from a fresh CA, requiring
/// [`TOKEN`]; returns the lab and the CA's PEM.
fn https_lab(ready: &[SocketAddr], dir: &Path) -> (Lab, String) {
    let issuer = ca("upkeep lab kube CA");
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "127.0.0.1");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (cert_file, key_file) = (dir.join("server.pem"), dir.join("server.key"));
    write(&cert_file, &cert.pem());
    write(&key_file, &key.serialize_pem());
    let lab = Lab::start_with(
        ready,
        &[
            "--tls-cert".as_ref(),
            cert_file.as_os_str(),
            "--tls-key".as_ref(),
            key_file.as_os_str(),
            "--token".as_ref(),
            TOKEN.as_ref(),
        ],
    );
    (lab, issuer.pem())
}

/// A service-account directory as kubelet mounts it: `token` and `ca.crt`.
fn service_account(dir: &Path, name: &str, ca_pem: &str, token: &str) -> PathBuf {
    let sa = dir.join(name);
    std::fs::create_dir_all(&sa).unwrap();
    write(&sa.join("token"), token);
    write(&sa.join("ca.crt"), ca_pem);
    sa
}

/// The environment kubelet gives a pod for the API server `lab`.
fn in_cluster_env(lab: &Lab) -> Vec<(&'static str, String)> {
    vec![
        ("KUBERNETES_SERVICE_HOST", lab.api.ip().to_string()),
        ("KUBERNETES_SERVICE_PORT", lab.api.port().to_string()),
    ]
}

fn sa_section(sa: &Path) -> String {
    format!("service_account_dir = \"{}\"", sa.display())
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The value of an unlabelled counter in `/metrics` text.
fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_service_account_reaches_an_https_api_server_with_its_token_and_ca() {
    let b = backends(2).await;
    let dir = temp_dir("incluster");
    let (lab, ca_pem) = https_lab(&addrs(&b), &dir);
    let sa = service_account(&dir, "sa", &ca_pem, TOKEN);
    let up = upkeep_with(&dir, &sa_section(&sa), &in_cluster_env(&lab), "").await;
    up.wait_peers(&addrs(&b)).await;
    let reqs = lab.requests().await;
    assert!(list_requests(&reqs) >= 1, "{reqs:?}");
    assert!(reqs.iter().all(|r| !r.ends_with(" 401")), "{reqs:?}");
    // The watch runs over TLS too: a change reaches the peers.
    lab.ctl(&format!(
        "/endpoints?service=apps/app&ready={}",
        b[0].addr()
    ))
    .await;
    up.wait_peers(&[b[0].addr()]).await;
    // A token the API server refuses (401): a clear error, the peers unchanged.
    let load = up.load(100, Duration::from_secs(2));
    let bad = service_account(&dir, "sa-bad-token", &ca_pem, "not-the-token");
    up.reload_kubernetes(&sa_section(&bad), "").await;
    let k = up.wait_outcome("client_error").await;
    assert!(
        k["last_error"].as_str().unwrap().contains("Unauthorized"),
        "{k}"
    );
    assert_eq!(up.peers().await, vec![b[0].addr().to_string()]);
    let run = load.await.unwrap();
    assert!(run.errors().is_empty(), "{}", run.summary());
    assert!(lab.requests().await.iter().any(|r| r.ends_with(" 401")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_with_ca_data_and_a_token_reaches_the_https_api_server() {
    let b = backends(2).await;
    let dir = temp_dir("kc-https");
    let (lab, ca_pem) = https_lab(&addrs(&b), &dir);
    let kc = dir.join("kubeconfig.yaml");
    write(
        &kc,
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: https://{}\n    certificate-authority-data: {}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: lab\ncurrent-context: lab\nusers:\n- name: lab\n  user:\n    token: {TOKEN}\n",
            lab.api,
            base64(ca_pem.as_bytes())
        ),
    );
    // In-cluster variables are present but the kubeconfig key wins.
    let env = vec![
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_owned()),
        ("KUBERNETES_SERVICE_PORT", "1".to_owned()),
    ];
    let section = format!("kubeconfig = \"{}\"", kc.display());
    let up = upkeep_with(&dir, &section, &env, "").await;
    up.wait_peers(&addrs(&b)).await;
    assert_eq!(up.kube().await["last_outcome"], "synced");
    let reqs = lab.requests().await;
    assert!(reqs.iter().all(|r| !r.ends_with(" 401")), "{reqs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_api_server_certificate_is_a_clear_error_and_keeps_the_peers() {
    let b = backends(2).await;
    let dir = temp_dir("wrong-ca");
    let (lab, ca_pem) = https_lab(&addrs(&b), &dir);
    let sa = service_account(&dir, "sa", &ca_pem, TOKEN);
    let env = in_cluster_env(&lab);
    let up = upkeep_with(&dir, &sa_section(&sa), &env, "").await;
    up.wait_peers(&addrs(&b)).await;
    let load = up.load(100, Duration::from_secs(2));
    let other = ca("some other CA").pem();
    let wrong = service_account(&dir, "sa-wrong-ca", &other, TOKEN);
    up.reload_kubernetes(&sa_section(&wrong), "").await;
    let k = up.wait_outcome("tls").await;
    let err = k["last_error"].as_str().unwrap();
    assert!(err.contains("certificate"), "{k}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let want: Vec<String> = addrs(&b).iter().map(|a| a.to_string()).collect();
    assert_eq!(up.peers().await, want, "last known good peers kept");
    let run = load.await.unwrap();
    assert!(run.errors().is_empty(), "{}", run.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_healthy_keeps_emptied_slices_peers_until_they_fail_health() {
    let b = backends(2).await;
    let lab = Lab::start(&addrs(&b));
    // Active checks judge health here: passive ejection never takes the last peers (the
    // panic threshold), so only a check can find both down.
    let discovery = "stale_grace = \"while_healthy\"\nmin_refresh = \"200ms\"\n[groups.app.health.active]\npath = \"/\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nfall = 1";
    let up = upkeep("while-healthy", &lab, discovery).await;
    up.wait_peers(&addrs(&b)).await;
    let load = up.load(100, Duration::from_secs(2));
    lab.ctl("/empty?service=apps/app").await;
    let start = Instant::now();
    while !up.kube().await["stale_since"].is_string() {
        assert!(start.elapsed() < Duration::from_secs(3));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Far past any fixed grace of this test: kept while they pass health.
    let run = load.await.unwrap();
    assert!(run.errors().is_empty(), "{}", run.summary());
    assert_eq!(up.peers().await.len(), 2, "{}", up.kube().await);
    // Both stop answering: their checks fail, then the kept set goes.
    for x in &b {
        x.refuse();
    }
    let start = Instant::now();
    loop {
        if up.peers().await.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{}",
            up.kube().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let k = up.kube().await;
    assert_eq!(k["dropped_reason"], "empty_peers_unhealthy", "{k}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_service_empties_the_group_at_once_without_stale_grace() {
    let b = backends(2).await;
    let lab = Lab::start(&addrs(&b));
    let up = upkeep("deleted", &lab, "stale_grace = \"30s\"").await;
    up.wait_peers(&addrs(&b)).await;
    let deleted = Instant::now();
    lab.ctl("/delete?service=apps/app").await;
    up.wait_peers(&[]).await;
    assert!(deleted.elapsed() < Duration::from_secs(5));
    let k = up.kube().await;
    assert_eq!(k["dropped_reason"], "service_deleted", "{k}");
    let reqs = lab.requests().await;
    assert!(
        reqs.iter().any(
            |r| r.starts_with("GET /api/v1/namespaces/apps/services/app") && r.ends_with(" 404")
        ),
        "{reqs:?}"
    );
    let r = get(up.listen, "app", "/").await;
    assert_eq!(r.status, 503);
    assert_eq!(
        r.header("upkeep-error"),
        Some("no_peers; reason=empty_group")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_watch_timeout_re_establishes_the_watch_with_no_peer_change_or_error() {
    let b = backends(2).await;
    let lab = Lab::start(&addrs(&b));
    let dir = temp_dir("watch-timeout");
    let kc = lab.kubeconfig(&dir);
    let section = format!("kubeconfig = \"{}\"\nwatch_timeout = \"1s\"", kc.display());
    let up = upkeep_with(&dir, &section, &[], "").await;
    up.wait_peers(&addrs(&b)).await;
    let before = get(up.admin, "admin", "/metrics").await.text();
    let run = up.load(100, Duration::from_millis(3500)).await.unwrap();
    assert!(run.errors().is_empty(), "{}", run.summary());
    let reqs = lab.requests().await;
    let watches: Vec<&String> = reqs
        .iter()
        .filter(|r| {
            let params: Vec<&str> = r.split(['?', '&', ' ']).collect();
            params.contains(&"watch=true") && params.contains(&"timeoutSeconds=1")
        })
        .collect();
    assert!(watches.len() >= 3, "watches: {reqs:?}");
    assert_eq!(
        list_requests(&reqs),
        1,
        "resumed, never re-listed: {reqs:?}"
    );
    let after = get(up.admin, "admin", "/metrics").await.text();
    let changes = "upkeep_kubernetes_peer_set_changes_total";
    assert_eq!(counter(&before, changes), counter(&after, changes));
    assert!(
        !after.contains("upkeep_kubernetes_errors_total{"),
        "{after}"
    );
    assert_eq!(up.kube().await["last_outcome"], "synced");
    assert_eq!(up.peers().await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_split_across_slices_never_exposes_a_partial_set() {
    let b = backends(4).await;
    let all = addrs(&b[..3]);
    let lab = Lab::start(&all);
    let up = upkeep("slices", &lab, "").await;
    up.wait_peers(&all).await;
    // Three slices: a {b0}, b {b1}, the first {b2}; every address stays in some slice.
    let set = |g: &str, a: &[SocketAddr]| {
        let list: Vec<String> = a.iter().map(|x| x.to_string()).collect();
        format!(
            "/endpoints?service=apps/app&slice={g}&ready={}",
            list.join(",")
        )
    };
    lab.ctl(&set("a", &[b[0].addr()])).await;
    lab.ctl(&set("b", &[b[1].addr()])).await;
    lab.ctl(&set("", &[b[2].addr()])).await;
    // A re-list (410) reads the three slices as one set: the history is compacted past a
    // change made while the API server was away.
    lab.ctl("/fault?set=unreachable").await;
    up.wait_outcome("unreachable").await;
    lab.ctl(&set("b", &[b[1].addr()])).await;
    lab.ctl("/gone").await;
    lab.ctl("/fault?set=none").await;
    let start = Instant::now();
    while list_requests(&lab.requests().await) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?} {}",
            lab.requests().await,
            up.kube().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    up.wait_peers(&all).await;
    let changes = "upkeep_kubernetes_peer_set_changes_total";
    let before = counter(&get(up.admin, "admin", "/metrics").await.text(), changes);
    let load = up.load(100, Duration::from_secs(2));
    // b0 moves a -> b and back, one slice written after the other each time.
    for (from, to) in [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")] {
        lab.ctl(&format!(
            "/move?service=apps/app&from={from}&to={to}&addrs={}",
            b[0].addr()
        ))
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(up.peers().await.len(), 3, "{}", up.kube().await);
    }
    let after = counter(&get(up.admin, "admin", "/metrics").await.text(), changes);
    assert_eq!(after, before, "a move between slices changed the peer set");
    // A rolling update across slices: slice a loses old b0, slice b gains new b3.
    lab.ctl(&set("a", &[])).await;
    lab.ctl(&set("b", &[b[1].addr(), b[3].addr()])).await;
    up.wait_peers(&[b[1].addr(), b[2].addr(), b[3].addr()])
        .await;
    let run = load.await.unwrap();
    assert!(run.errors().is_empty(), "{}", run.summary());
}
