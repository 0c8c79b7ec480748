//! upkeep's own lifecycle never costs a request: reload, log reopening, a second instance,
//! shutdown. The real binary, real signals, real DNS (the fake server) and real TLS.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http::Method;
use upkeep_test_support::fakedns::{FakeDns, Mode, Zone};
use upkeep_test_support::load::open_loop;
use upkeep_test_support::{get, TestBackend};

use crate::support::{loopback, loopbacks, wait_ready, Proc, BIN};

const NAME: &str = "app.upkeep.test";

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

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
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
    let [listen, admin] = loopbacks();
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
        let [listen, admin] = loopbacks();
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
    let [listen, admin] = loopbacks();
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
    // Done once the process says so: the new file exists a moment before the writer has
    // written out the lines queued for the old one and switched (a request answered in that
    // moment is rightly logged to the old file, queued before the switch).
    let stderr = dir.path("stderr");
    let start = Instant::now();
    while !std::fs::read_to_string(&stderr)
        .unwrap_or_default()
        .contains("access log reopened")
    {
        assert!(start.elapsed() < Duration::from_secs(5), "not reopened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(log.exists(), "reopened, yet no new file");
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
    let [listen, admin] = loopbacks();
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

/// A process this test did not spawn itself (the new binary of an upgrade), stopped by pid.
struct Pid(u32);

impl Pid {
    /// Running (an exited process that nobody has reaped yet counts as gone).
    fn alive(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.0))
            .ok()
            .and_then(|st| {
                st.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().to_owned())
            })
            .is_some_and(|rest| !rest.starts_with('Z'))
    }
}

impl Drop for Pid {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.to_string()])
            .stderr(Stdio::null())
            .status();
        let start = Instant::now();
        while self.alive() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The new process's pid, from the old one's line saying it is ready.
async fn upgraded_pid(diag: &Path) -> u32 {
    let text = wait_log(diag, "upgrade: new process ready").await;
    let line = text
        .lines()
        .find(|l| l.contains("upgrade: new process ready"))
        .unwrap();
    let at = line.find("new.pid=").unwrap() + "new.pid=".len();
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn upgrade_config(
    listen: SocketAddr,
    admin: SocketAddr,
    backend: SocketAddr,
    extra_admin: &str,
) -> String {
    format!(
        "access_log = \"off\"\n[admin]\nlisten = \"{admin}\"\n{extra_admin}[lifecycle]\ndrain_delay = \"0s\"\n[[listener]]\nlisten = \"{listen}\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{backend}\"]\n"
    )
}

/// Runs `upkeep upgrade --admin ADDR [--token-file F]`; its exit status and output.
async fn upkeep_upgrade(admin: SocketAddr, token: Option<&Path>) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["upgrade", "--admin", &admin.to_string()]);
    if let Some(t) = token {
        cmd.arg("--token-file").arg(t);
    }
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

/// The 1,000 req/s tests one at a time: two at once on two shared cores starve the test's own
/// backend, and its connect timeouts would be blamed on the upgrade.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Open-loop load at 1,000 req/s (each request on a new connection) for 3 s, with an
/// upgrade at 1 s: every request gets its 200, none is refused.
async fn upgrade_under_load(by_admin: bool) {
    let _turn = HEAVY.lock().await;
    let backend = TestBackend::start("a").await;
    let dir = Dir::new(if by_admin {
        "upgrade-admin"
    } else {
        "upgrade-usr2"
    });
    let [listen, admin] = loopbacks();
    let (file, diag, token) = (dir.path("up.toml"), dir.path("stderr"), dir.path("token"));
    std::fs::write(&token, "s3cret\n").unwrap();
    let extra = format!("token_file = \"{}\"\n", token.display());
    // Slack for a starved test backend (shared cores); the upgrade itself adds no wait.
    let config = upgrade_config(listen, admin, backend.addr(), &extra)
        + "connect_timeout = \"5s\"\ntry_timeout = \"10s\"\n";
    std::fs::write(&file, config).unwrap();
    let mut up = Proc::serve(&file, &diag, &["--workers", "2"]);
    let old_pid = up.0.id();
    wait_ready(admin).await;

    let load = tokio::spawn(open_loop(
        listen,
        Method::GET,
        "/",
        1000,
        Duration::from_secs(3),
    ));
    // In flight on the old process across the upgrade: its drain lets it finish.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let slow = tokio::spawn(async move { get(listen, "x", "/sleep/1500").await.status });
    tokio::time::sleep(Duration::from_millis(200)).await;
    if by_admin {
        let refused = upkeep_upgrade(admin, None).await;
        assert!(!refused.status.success(), "no token must be refused");
        let out = upkeep_upgrade(admin, Some(&token)).await;
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{said}");
        assert!(
            said.contains("upgraded") && said.contains("new process: pid"),
            "{said}"
        );
    } else {
        up.signal("-USR2");
    }
    let new = Pid(upgraded_pid(&diag).await);
    if !slow.is_finished() {
        assert!(
            up.0.try_wait().unwrap().is_none(),
            "the old process exited with a request in flight"
        );
    }
    assert_eq!(slow.await.unwrap(), 200, "the request in flight was cut");
    let run = load.await.unwrap();
    assert_eq!(run.outcomes.len(), 3000);
    let why: Vec<&str> = run
        .errors()
        .iter()
        .take(5)
        .map(|o| o.body.as_str())
        .collect();
    assert!(run.errors().is_empty(), "{}: {why:?}", run.summary());
    assert_ne!(new.0, old_pid);
    // The old process drains and exits; the new one serves on the same address.
    assert!(up.exit().await.success());
    assert!(new.alive());
    for i in 0..20 {
        assert_eq!(get(listen, "x", &format!("/after/{i}")).await.status, 200);
    }
    assert_eq!(get(admin, "admin", "/readyz").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_by_sigusr2_under_1000_rps_refuses_no_connection_and_the_old_process_exits() {
    upgrade_under_load(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upkeep_upgrade_with_the_admin_token_under_1000_rps_refuses_no_connection() {
    upgrade_under_load(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_whose_new_binary_cannot_start_leaves_the_old_process_serving() {
    let backend = TestBackend::start("a").await;
    let dir = Dir::new("upgrade-fails");
    let [listen, admin] = loopbacks();
    let (file, diag) = (dir.path("up.toml"), dir.path("stderr"));
    std::fs::write(&file, upgrade_config(listen, admin, backend.addr(), "")).unwrap();
    let mut up = Proc::serve(&file, &diag, &["--workers", "2"]);
    wait_ready(admin).await;
    // The config on disk became invalid: the new binary refuses it and exits.
    std::fs::write(&file, "[[listener]]\nlisten = \"nowhere\"\n").unwrap();
    let out = upkeep_upgrade(admin, None).await;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("upgrade failed, this process keeps serving")
            && said.contains("exited before it was ready"),
        "{said}"
    );
    let text = wait_log(&diag, "upgrade failed; this process keeps serving").await;
    assert!(
        text.contains("up.toml:2:"),
        "the new binary's own error: {text}"
    );
    assert!(
        up.0.try_wait().unwrap().is_none(),
        "the old process must keep running"
    );
    for i in 0..20 {
        assert_eq!(get(listen, "x", &format!("/{i}")).await.status, 200);
    }
    assert_eq!(get(admin, "admin", "/readyz").await.status, 200);
}

/// How long a silent connection to `addr` stays open (bounded by `max`).
async fn silent_connection_lifetime(addr: SocketAddr, max: Duration) -> Duration {
    use tokio::io::AsyncReadExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 512];
    loop {
        match tokio::time::timeout(max.saturating_sub(start.elapsed()), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return start.elapsed(),
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_a_changed_header_read_timeout_to_new_connections() {
    let backend = TestBackend::start("a").await;
    let dir = Dir::new("reload-timeout");
    let [listen, admin] = loopbacks();
    let (file, diag) = (dir.path("up.toml"), dir.path("stderr"));
    let config = |t: &str| {
        upgrade_config(listen, admin, backend.addr(), "")
            + &format!("[[listener]]\nlisten = \"{listen}\"\nheader_read_timeout = \"{t}\"\n")
    };
    // One listener block: the timeout line goes into it.
    let config = |t: &str| {
        config(t).replacen(
            &format!("[[listener]]\nlisten = \"{listen}\"\n[[route]]"),
            "[[route]]",
            1,
        )
    };
    std::fs::write(&file, config("4s")).unwrap();
    let up = Proc::serve(&file, &diag, &["--workers", "2"]);
    wait_ready(admin).await;
    let before = silent_connection_lifetime(listen, Duration::from_millis(1500)).await;
    assert!(
        before >= Duration::from_millis(1500),
        "closed after {before:?}"
    );

    std::fs::write(&file, config("300ms")).unwrap();
    up.signal("-HUP");
    let text = wait_log(&diag, "config reloaded").await;
    assert!(
        text.contains(&format!("listeners.updated=[{listen}]")),
        "{text}"
    );
    let after = silent_connection_lifetime(listen, Duration::from_secs(3)).await;
    assert!(
        after >= Duration::from_millis(250) && after < Duration::from_millis(1500),
        "a new connection must get the reloaded 300ms: closed after {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serves_started_at_the_same_instant_on_one_address_exactly_one_wins() {
    let backend = TestBackend::start("a").await;
    let dir = Dir::new("double-start");
    for round in 0..5 {
        let [listen, admin0, admin1] = loopbacks();
        let files: Vec<PathBuf> = [admin0, admin1]
            .into_iter()
            .enumerate()
            .map(|(i, admin)| {
                let f = dir.path(&format!("up-{round}-{i}.toml"));
                let log = dir.path(&format!("a-{round}-{i}.log"));
                std::fs::write(&f, plain_config(listen, admin, backend.addr(), &log)).unwrap();
                f
            })
            .collect();
        // Both spawned at one instant, from two threads released together.
        let gate = std::sync::Arc::new(std::sync::Barrier::new(2));
        let spawned: Vec<_> = files
            .into_iter()
            .map(|f| {
                let gate = gate.clone();
                std::thread::spawn(move || {
                    let mut cmd = Command::new(BIN);
                    cmd.args(["serve", "--workers", "2", "--config"])
                        .arg(&f)
                        .stdout(Stdio::null())
                        .stderr(Stdio::piped());
                    gate.wait();
                    Proc(cmd.spawn().unwrap())
                })
            })
            .collect();
        let mut procs: Vec<Proc> = spawned.into_iter().map(|t| t.join().unwrap()).collect();
        // The loser exits within a few seconds; the winner keeps serving.
        let start = Instant::now();
        let mut exited = Vec::new();
        while start.elapsed() < Duration::from_secs(5) {
            exited = procs
                .iter_mut()
                .enumerate()
                .filter_map(|(i, p)| p.0.try_wait().unwrap().map(|s| (i, s)))
                .collect();
            if !exited.is_empty() {
                // Give a second loser (the race this test is about) its chance to show.
                tokio::time::sleep(Duration::from_millis(500)).await;
                exited = procs
                    .iter_mut()
                    .enumerate()
                    .filter_map(|(i, p)| p.0.try_wait().unwrap().map(|s| (i, s)))
                    .collect();
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            exited.len(),
            1,
            "round {round}: exactly one must exit: {exited:?}"
        );
        let (loser, status) = exited[0];
        assert!(!status.success());
        let mut err = String::new();
        std::io::Read::read_to_string(procs[loser].0.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert!(
            err.contains(&format!("address in use: {listen}")),
            "round {round}: {err}"
        );
        for i in 0..10 {
            assert_eq!(get(listen, "x", &format!("/{i}")).await.status, 200);
        }
    }
}
