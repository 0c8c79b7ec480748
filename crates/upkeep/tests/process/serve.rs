//! `upkeep serve`, `check` and `reload` as a user runs them: the real binary, real signals.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use upkeep_test_support::{get, TestBackend};

use crate::support::{self, loopbacks, wait_ready, write, Proc, BIN};

fn temp_dir(name: &str) -> PathBuf {
    support::temp_dir("serve", name)
}

fn config(listen: SocketAddr, admin: SocketAddr, backend: SocketAddr, lifecycle: &str) -> String {
    format!(
        "access_log = \"off\"\n[admin]\nlisten = \"{admin}\"\n[lifecycle]\n{lifecycle}\n[[listener]]\nlisten = \"{listen}\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{backend}\"]\n"
    )
}

fn addrs() -> (SocketAddr, SocketAddr) {
    let [listen, admin] = loopbacks();
    (listen, admin)
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} failed");
}

#[test]
fn check_reports_every_problem_with_file_line_and_column() {
    let dir = temp_dir("check");
    let file = dir.join("bad.toml");
    write(
        &file,
        "[[listener]]\nlisten = \"127.0.0.1:99999\"\n\n[[route]]\ngroup = \"nope\"\n\n[groups.app]\nendpoints = [\"http://ok.test:80\", \"bad name:1\"]\nconnect_timeout = \"fast\"\n",
    );
    let out = Command::new(BIN).arg("check").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let f = file.display().to_string();
    for pos in [":2:10:", ":5:9:", ":8:35:", ":9:19:"] {
        assert!(
            err.contains(&format!("{f}{pos}")),
            "missing {pos} in:\n{err}"
        );
    }
    assert!(err.contains("4 problem(s)"), "{err}");

    let good = dir.join("good.toml");
    write(&good, "[[listener]]\nlisten = \"127.0.0.1:8080\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"127.0.0.1:9000\"]\n");
    let out = Command::new(BIN)
        .arg("check")
        .arg("--print")
        .arg(&good)
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8_lossy(&out.stdout);
    // Effective config as TOML: defaults filled in.
    assert!(
        printed.contains("[groups.app.pool]\nidle_timeout = \"4s\""),
        "{printed}"
    );
    assert!(
        printed.contains("[[listener]]\nlisten = \"127.0.0.1:8080\"\nidle_timeout = \"620s\""),
        "{printed}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_while_readyz_fails_and_new_connections_are_refused() {
    let backend = TestBackend::start("b").await;
    let (listen, admin) = addrs();
    let dir = temp_dir("drain");
    let file = dir.join("up.toml");
    write(
        &file,
        &config(
            listen,
            admin,
            backend.addr(),
            "drain_delay = \"700ms\"\nshutdown_timeout = \"10s\"",
        ),
    );
    let mut child = Proc(
        Command::new(BIN)
            .arg("serve")
            .arg("--config")
            .arg(&file)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(admin).await;

    let in_flight = tokio::spawn(async move { get(listen, "x", "/sleep/2000").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    signal(&child.0, "-TERM");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        get(admin, "admin", "/readyz").await.status,
        503,
        "readiness must fail at once"
    );
    // Still serving during the drain delay.
    assert_eq!(get(listen, "x", "/during").await.status, 200);
    while sent.elapsed() < Duration::from_millis(1000) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        tokio::net::TcpStream::connect(listen).await.is_err(),
        "new connections must be refused after the drain delay"
    );
    let resp = in_flight.await.unwrap();
    assert_eq!(resp.status, 200, "the in-flight request was cut");
    assert_eq!(resp.text(), "b slept 2000\n");
    let status = tokio::task::spawn_blocking(move || child.0.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_with_a_bad_file_keeps_serving_the_old_routes() {
    let (a, b) = (TestBackend::start("a").await, TestBackend::start("b").await);
    let (listen, admin) = addrs();
    let dir = temp_dir("reload");
    let file = dir.join("up.toml");
    write(
        &file,
        &config(listen, admin, a.addr(), "drain_delay = \"0s\""),
    );
    let child = Proc(
        Command::new(BIN)
            .arg("serve")
            .arg("--config")
            .arg(&file)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(admin).await;
    assert_eq!(get(listen, "x", "/").await.text(), "a /\n");

    write(&file, "[[listener]]\nlisten = \"nonsense\"\n");
    let admin_arg = admin.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args(["reload", "--admin", &admin_arg])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("up.toml:2:10:"), "{err}");
    assert_eq!(
        get(listen, "x", "/").await.text(),
        "a /\n",
        "old routes must stay"
    );

    // A good file, by SIGHUP this time.
    write(
        &file,
        &config(listen, admin, b.addr(), "drain_delay = \"0s\""),
    );
    signal(&child.0, "-HUP");
    let start = Instant::now();
    loop {
        if get(listen, "x", "/").await.text() == "b /\n" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "reload by SIGHUP did not apply"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_proxies_and_a_taken_admin_port_is_a_clear_error() {
    let backend = TestBackend::start("b").await;
    let (listen, admin) = addrs();
    let child = Proc(
        Command::new(BIN)
            .args([
                "serve",
                "--listen",
                &listen.to_string(),
                "--to",
                &format!("http://{}", backend.addr()),
            ])
            .args(["--admin", &admin.to_string(), "--access-log", "off"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(admin).await;
    assert_eq!(get(listen, "x", "/q").await.text(), "b /q\n");

    // Same admin port again: refused with a message naming the address.
    let (listen2, _) = addrs();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args([
                "serve",
                "--listen",
                &listen2.to_string(),
                "--to",
                "http://127.0.0.1:9",
                "--admin",
                &admin.to_string(),
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot listen on {admin} (admin)")),
        "{err}"
    );
    drop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_it_makes_is_warned_on_stderr_with_its_cause_and_the_target_as_received() {
    let peer = upkeep_test_support::refusing();
    let (listen, admin) = addrs();
    let dir = temp_dir("warned");
    let file = dir.join("up.toml");
    write(&file, &config(listen, admin, peer.addr, ""));
    let stderr = dir.join("stderr.log");
    let child = Proc(
        Command::new(BIN)
            .arg("serve")
            .arg("--config")
            .arg(&file)
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_ready(admin).await;
    let resp = get(listen, "x", "/a/b?c=1").await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    // The warning is written as the response goes: wait for it, 10 s at most.
    let start = Instant::now();
    let line = loop {
        let text = std::fs::read_to_string(&stderr).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains("request failed")) {
            break l.to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no warning on stderr: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("path=/a/b?c=1"), "{line}");
    assert!(line.contains("cause=\"connect_failed\""), "{line}");
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}
