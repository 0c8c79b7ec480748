//! upkeep's own lifecycle never costs a request: reload, log reopening, a second instance,
//! shutdown. The real binary, real signals, real DNS (the fake server) and real TLS.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http::Method;
use upkeep_test_support::fakedns::{FakeDns, Mode, Zone};
use upkeep_test_support::load::open_loop;
use upkeep_test_support::{free_port, get, TestBackend};

const BIN: &str = env!("CARGO_BIN_EXE_upkeep");
const NAME: &str = "app.upkeep.test";

/// A running `upkeep serve`, killed if the test ends early.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn serve(config: &Path, stderr: &Path, extra: &[&str]) -> Proc {
        Proc(
            Command::new(BIN)
                .arg("serve")
                .arg("--config")
                .arg(config)
                .args(extra)
                .stderr(std::fs::File::create(stderr).unwrap())
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// Waits (bounded) for the process to exit.
    async fn exit(mut self) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.0.try_wait().unwrap() {
                return s;
            }
            assert!(start.elapsed() < Duration::from_secs(15), "did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d =
            std::env::temp_dir().join(format!("upkeep-lifecycle-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn wait_ready(admin: SocketAddr) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if tokio::net::TcpStream::connect(admin).await.is_ok()
            && get(admin, "admin", "/readyz").await.status == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("upkeep did not become ready");
}

fn log_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Waits until `file` (the diagnostics) contains `needle`.
async fn wait_log(file: &Path, needle: &str) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no {needle:?} in:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn dns_config(
    listen: SocketAddr,
    admin: SocketAddr,
    dns: SocketAddr,
    port: u16,
    try_timeout: &str,
) -> String {
    format!(
        "access_log = \"off\"\n[admin]\nlisten = \"{admin}\"\n[lifecycle]\ndrain_delay = \"0s\"\n[dns]\nservers = [\"{dns}\"]\ntimeout = \"300ms\"\n[[listener]]\nlisten = \"{listen}\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{NAME}:{port}\"]\ntry_timeout = \"{try_timeout}\"\n[groups.app.discovery]\nmin_refresh = \"500ms\"\nerror_backoff = \"200ms\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_changing_a_dns_groups_try_timeout_while_dns_is_silent_costs_no_request() {
    let backend = TestBackend::start("a").await;
    let port = backend.addr().port();
    let dns = FakeDns::start(
        "127.0.0.1:0".parse().unwrap(),
        Zone::new().with(NAME, Mode::Fixed(vec![ip("127.0.0.1")]), 1),
    )
    .await
    .unwrap();
    let (listen, admin) = (loopback(), loopback());
    let dir = Dir::new("dns-silent");
    let (file, diag) = (dir.path("up.toml"), dir.path("stderr"));
    std::fs::write(
        &file,
        dns_config(listen, admin, dns.local_addr(), port, "5s"),
    )
    .unwrap();
    let up = Proc::serve(&file, &diag, &["--workers", "2"]);
    wait_ready(admin).await;

    // DNS goes silent; upkeep keeps its last known good addresses.
    dns.set_mode(NAME, Mode::Silent);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let load = tokio::spawn(open_loop(
        listen,
        Method::GET,
        "/",
        200,
        Duration::from_secs(3),
    ));
    let probes = tokio::spawn(async move {
        let mut statuses = Vec::new();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            statuses.push(get(admin, "admin", "/readyz").await.status);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        statuses
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    std::fs::write(
        &file,
        dns_config(listen, admin, dns.local_addr(), port, "6s"),
    )
    .unwrap();
    up.signal("-HUP");
    let text = wait_log(&diag, "config reloaded").await;
    assert!(
        text.contains("groups.rebuilt=[\"app\"]"),
        "the group must be rebuilt, not kept:\n{text}"
    );
    let run = load.await.unwrap();
    let statuses = probes.await.unwrap();
    assert!(run.errors().is_empty(), "{}", run.summary());
    assert!(run.outcomes.len() >= 590, "{}", run.summary());
    assert!(
        statuses.iter().all(|s| *s == 200),
        "/readyz must stay 200: {statuses:?}"
    );
    drop(up);
}

fn plain_config(listen: SocketAddr, admin: SocketAddr, backend: SocketAddr, log: &Path) -> String {
    format!(
        "access_log = \"{}\"\n[admin]\nlisten = \"{admin}\"\n[lifecycle]\ndrain_delay = \"0s\"\n[[listener]]\nlisten = \"{listen}\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{backend}\"]\n",
        log.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_requests_then_sigterm_gives_n_access_log_lines() {
    let backend = TestBackend::start("a").await;
    let dir = Dir::new("log-exit");
    for round in 0..3 {
        let (listen, admin) = (loopback(), loopback());
        let (file, log) = (
            dir.path("up.toml"),
            dir.path(&format!("access-{round}.log")),
        );
        std::fs::write(&file, plain_config(listen, admin, backend.addr(), &log)).unwrap();
        let up = Proc::serve(&file, &dir.path("stderr"), &[]);
        wait_ready(admin).await;
        let n = 5 + round * 20;
        for i in 0..n {
            assert_eq!(get(listen, "x", &format!("/{i}")).await.status, 200);
        }
        up.signal("-TERM");
        assert!(up.exit().await.success());
        let lines = log_lines(&log);
        assert_eq!(lines.len(), n, "round {round}: {lines:?}");
        assert!(lines[n - 1].contains(&format!("\"path\":\"/{}\"", n - 1)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_reopens_the_access_log_after_a_rotation_without_losing_a_line() {
    let backend = TestBackend::start("a").await;
    let dir = Dir::new("log-reopen");
    let (listen, admin) = (loopback(), loopback());
    let (file, log, rotated) = (
        dir.path("up.toml"),
        dir.path("access.log"),
        dir.path("access.log.1"),
    );
    std::fs::write(&file, plain_config(listen, admin, backend.addr(), &log)).unwrap();
    let up = Proc::serve(&file, &dir.path("stderr"), &[]);
    wait_ready(admin).await;
    for i in 0..10 {
        assert_eq!(get(listen, "x", &format!("/before/{i}")).await.status, 200);
    }
    // logrotate: move the file away, then tell the process.
    std::fs::rename(&log, &rotated).unwrap();
    up.signal("-USR1");
    let start = Instant::now();
    while !log.exists() {
        assert!(start.elapsed() < Duration::from_secs(5), "not reopened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 0..7 {
        assert_eq!(get(listen, "x", &format!("/after/{i}")).await.status, 200);
    }
    up.signal("-TERM");
    assert!(up.exit().await.success());
    let (old, new) = (log_lines(&rotated), log_lines(&log));
    assert_eq!(old.len(), 10, "{old:?}");
    assert_eq!(new.len(), 7, "{new:?}");
    assert!(old.iter().all(|l| l.contains("/before/")));
    assert!(new.iter().all(|l| l.contains("/after/")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_on_an_address_in_use_fails_at_start() {
    let backend = TestBackend::start("a").await;
    let dir = Dir::new("second");
    let (listen, admin) = (loopback(), loopback());
    let file = dir.path("up.toml");
    std::fs::write(
        &file,
        plain_config(listen, admin, backend.addr(), &dir.path("a.log")),
    )
    .unwrap();
    // Two workers: the first instance's own copies share the address.
    let first = Proc::serve(&file, &dir.path("stderr"), &["--workers", "2"]);
    wait_ready(admin).await;

    let admin2 = loopback();
    let file2 = dir.path("second.toml");
    std::fs::write(
        &file2,
        plain_config(listen, admin2, backend.addr(), &dir.path("b.log")),
    )
    .unwrap();
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args(["serve", "--workers", "2", "--config"])
            .arg(&file2)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "must fail at once"
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("address in use: {listen}")), "{err}");
    // The first keeps every connection.
    for i in 0..20 {
        assert_eq!(get(listen, "x", &format!("/{i}")).await.status, 200);
    }
    drop(first);
}
