//! The admin listeners under pressure, with the real binary: probes keep answering while
//! the proxy listeners are saturated, and an accept that fails for lack of descriptors backs
//! off instead of spinning.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use upkeep_test_support::get;

use crate::support::{self, loopbacks, Proc, BIN};

fn temp_dir(name: &str) -> PathBuf {
    support::temp_dir("admin", name)
}

/// A backend that accepts and never answers: every proxied request stays in flight.
async fn stalled_backend() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    addr
}

struct Upkeep {
    proc: Proc,
    listen: SocketAddr,
    probes: SocketAddr,
    stderr: PathBuf,
}

/// Starts `upkeep serve` with one serving thread, under `ulimit -n` when given.
async fn start(name: &str, backend: SocketAddr, admin_extra: &str, nofile: Option<u32>) -> Upkeep {
    let dir = temp_dir(name);
    let [listen, control, probes] = loopbacks();
    let cfg = dir.join("upkeep.toml");
    std::fs::write(
        &cfg,
        format!(
            "access_log = \"off\"\n[admin]\nlisten = \"{control}\"\nprobes = \"{probes}\"\n{admin_extra}\n[[listener]]\nlisten = \"{listen}\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{backend}\"]\ntry_timeout = \"30s\"\ndeadline = \"30s\"\n"
        ),
    )
    .unwrap();
    let stderr = dir.join("stderr.log");
    let serve = format!("exec {BIN} serve --workers 1 --config {}", cfg.display());
    let script = match nofile {
        Some(n) => format!("ulimit -n {n} && {serve}"),
        None => serve,
    };
    let child = Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let up = Upkeep {
        proc: Proc(child),
        listen,
        probes,
        stderr,
    };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if upkeep_test_support::answers_ok(probes, "kubelet", "/readyz").await {
            return up;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "upkeep did not become ready: {}",
        std::fs::read_to_string(&up.stderr).unwrap_or_default()
    );
}

/// CPU time (user + system) the process has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_keep_answering_while_the_proxy_listeners_are_saturated() {
    let backend = stalled_backend().await;
    let up = start("saturated", backend, "", None).await;
    // 300 requests in flight on a backend that never answers, and 300 clients that connect
    // and send nothing: the serving thread holds 900 sockets.
    let mut held = Vec::new();
    for i in 0..600 {
        let mut s = TcpStream::connect(up.listen).await.unwrap();
        if i % 2 == 0 {
            s.write_all(b"GET /slow HTTP/1.1\r\nHost: app\r\n\r\n")
                .await
                .unwrap();
        }
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // New requests keep arriving at the saturated listener while kubelet probes.
    let listen = up.listen;
    let flood = tokio::spawn(async move {
        let mut more = Vec::new();
        loop {
            if let Ok(mut s) = TcpStream::connect(listen).await {
                let _ = s
                    .write_all(b"GET /more HTTP/1.1\r\nHost: app\r\n\r\n")
                    .await;
                more.push(s);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        for path in ["/livez", "/readyz", "/startupz"] {
            let t = Instant::now();
            let r = tokio::time::timeout(Duration::from_secs(2), get(up.probes, "kubelet", path))
                .await
                .unwrap_or_else(|_| panic!("{path} did not answer within 2 s"));
            assert_eq!(r.status, 200, "{path}: {}", r.text());
            slowest = slowest.max(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    flood.abort();
    // kubelet's default timeoutSeconds is 1; a loaded CI machine gets the slack.
    assert!(
        slowest < Duration::from_secs(1),
        "slowest probe {slowest:?}"
    );
    drop(held);
    drop(up.proc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_accept_backs_off_when_descriptors_run_out_and_recovers() {
    let backend = stalled_backend().await;
    let up = start(
        "nofile",
        backend,
        "header_read_timeout = \"8s\"\nmax_connections = 200",
        Some(64),
    )
    .await;
    let pid = up.proc.0.id();
    let free = 64usize.saturating_sub(open_fds(pid));
    // More silent clients than the process has descriptors left: accepts start failing.
    let mut held = Vec::new();
    for _ in 0..free + 20 {
        held.push(TcpStream::connect(up.probes).await.unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&up.stderr)
        .unwrap()
        .contains("admin accept failed; backing off")
    {
        assert!(
            Instant::now() < deadline,
            "accept never failed: {} fds open",
            open_fds(pid)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // While accepts keep failing, the process sleeps between attempts instead of spinning
    // (a spinning accept loop burns a whole core: ~100 ticks a second).
    let before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let used = cpu_ticks(pid) - before;
    assert!(
        used < 30,
        "{used} clock ticks of CPU in 1.5 s with descriptors exhausted"
    );
    // The clients go; within the longest back-off the probe port answers again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout(Duration::from_secs(2), get(up.probes, "kubelet", "/livez"))
            .await
        {
            Ok(r) if r.status == 200 => break,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            _ => panic!("probes did not recover"),
        }
    }
    let log = std::fs::read_to_string(&up.stderr).unwrap();
    assert!(log.contains("admin accepting again"), "{log}");
}
