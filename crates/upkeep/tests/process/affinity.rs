//! `upkeep serve --cpu-affinity`: which CPUs the serving threads may run on, read back from
//! the kernel (`/proc/PID/task/TID/status`) while the real binary serves, started under
//! `taskset` to give it a known set of CPUs.

use std::net::SocketAddr;
use std::process::{Command, Stdio};

use upkeep_test_support::{get, TestBackend};

use crate::support::{loopbacks, wait_ready, Proc, BIN};

/// `0-2,5` → [0, 1, 2, 5].
fn expand(list: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in list.trim().split(',') {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

/// The CPUs a thread (or, with `task` = `pid`, the process) may run on.
fn allowed(pid: u32, task: &str) -> Vec<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{task}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    expand(line)
}

/// Each thread of `pid` by name, with the CPUs it may run on.
fn threads(pid: u32) -> Vec<(String, Vec<usize>)> {
    let mut out: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| {
            let tid = t.unwrap().file_name().into_string().unwrap();
            let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap();
            (comm.trim().to_owned(), allowed(pid, &tid))
        })
        .collect();
    out.sort();
    out
}

/// The first two CPUs this test may run on; `None` (after saying so) on a one-CPU machine
/// outside CI (CI machines have two).
fn two_cpus() -> Option<[usize; 2]> {
    let mine = allowed(std::process::id(), &std::process::id().to_string());
    if mine.len() < 2 {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI machines have two CPUs"
        );
        eprintln!("skipped: this machine lets the test run on one CPU only ({mine:?})");
        return None;
    }
    Some([mine[0], mine[1]])
}

/// `upkeep serve` under `taskset -c CPUS` with `args`, proxying to `backend`; ready when it
/// returns.
async fn serve(cpus: &str, args: &[&str], backend: SocketAddr) -> (Proc, SocketAddr) {
    let [listen, admin] = loopbacks();
    let child = Proc(
        Command::new("taskset")
            .args(["-c", cpus, BIN, "serve", "--listen", &listen.to_string()])
            .args(["--to", &format!("http://{backend}")])
            .args(["--admin", &admin.to_string(), "--access-log", "off"])
            .args(args)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(admin).await;
    (child, listen)
}

/// The serving threads' CPU sets, worker 1 first.
fn workers(pid: u32) -> Vec<Vec<usize>> {
    threads(pid)
        .into_iter()
        .filter(|(name, _)| name.starts_with("upkeep-worker-"))
        .map(|(_, cpus)| cpus)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_holds_each_serving_thread_to_its_own_cpu_when_there_are_as_many_as_cpus() {
    let Some([a, b]) = two_cpus() else { return };
    let backend = TestBackend::start("b").await;
    let both = format!("{a},{b}");

    // Two CPUs, two serving threads: one each, in order.
    let (child, listen) = serve(&both, &["--workers", "2"], backend.addr()).await;
    assert_eq!(get(listen, "x", "/q").await.text(), "b /q\n");
    let pid = child.0.id();
    assert_eq!(workers(pid), vec![vec![a], vec![b]]);
    // Only the serving threads: the control thread keeps both.
    assert_eq!(allowed(pid, &pid.to_string()), vec![a, b]);
    drop(child);

    // One serving thread on two CPUs: auto does not pick one for it.
    let (child, listen) = serve(&both, &["--workers", "1"], backend.addr()).await;
    assert_eq!(get(listen, "x", "/q").await.text(), "b /q\n");
    assert_eq!(workers(child.0.id()), vec![vec![a, b]]);
    drop(child);

    // off: left to the scheduler.
    let args = ["--workers", "2", "--cpu-affinity", "off"];
    let (child, _) = serve(&both, &args, backend.addr()).await;
    assert_eq!(workers(child.0.id()), vec![vec![a, b], vec![a, b]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_names_the_cpu_of_each_serving_thread_and_a_cpu_it_may_not_use_is_refused() {
    let Some([a, b]) = two_cpus() else { return };
    let backend = TestBackend::start("b").await;

    let (child, listen) = serve(
        &format!("{a},{b}"),
        &["--workers", "2", "--cpu-affinity", &format!("{b},{a}")],
        backend.addr(),
    )
    .await;
    assert_eq!(get(listen, "x", "/q").await.text(), "b /q\n");
    assert_eq!(workers(child.0.id()), vec![vec![b], vec![a]]);
    drop(child);

    // Given CPU `a` only, a list naming `b` is refused before anything is bound.
    let [listen, admin] = loopbacks();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("taskset")
            .args([
                "-c",
                &a.to_string(),
                BIN,
                "serve",
                "--listen",
                &listen.to_string(),
            ])
            .args(["--to", "http://127.0.0.1:9", "--admin", &admin.to_string()])
            .args(["--workers", "2", "--cpu-affinity", &format!("{a},{b}")])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "--cpu-affinity names CPU {b}, which this process may not run on (allowed: {a})"
        )),
        "{err}"
    );
}
