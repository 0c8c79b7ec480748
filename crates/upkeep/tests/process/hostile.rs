//! Hostile input against the real binary: what a client sees, what stderr and the access
//! log get, and whether the connection gauge comes back down.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use upkeep_test_support::{get, raw_exchange, TestBackend};

use crate::support::{loopbacks, wait_ready, Proc, BIN};

async fn gauge(admin: SocketAddr, name: &str) -> Option<f64> {
    get(admin, "admin", "/metrics")
        .await
        .text()
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_bracket_gets_400_without_a_panic_and_the_connection_gauge_returns_to_zero() {
    let backend = TestBackend::start("b").await;
    let dir = std::env::temp_dir().join(format!("upkeep-hostile-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cfg, log, stderr) = (
        dir.join("upkeep.toml"),
        dir.join("access.log"),
        dir.join("stderr.txt"),
    );
    let _ = std::fs::remove_file(&log);
    let [listen, admin] = loopbacks();
    std::fs::write(
        &cfg,
        format!(
            "access_log = \"{}\"\n[admin]\nlisten = \"{admin}\"\n[[listener]]\nlisten = \"{listen}\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"{}\"]\n",
            log.display(),
            backend.addr()
        ),
    )
    .unwrap();
    let child = Proc(
        Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&stderr).unwrap()))
            .spawn()
            .unwrap(),
    );
    wait_ready(admin).await;

    for _ in 0..5 {
        let resp = raw_exchange(
            listen,
            b"GET / HTTP/1.1\r\nHost: [\r\n\r\n",
            Duration::from_millis(300),
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 400 "), "{resp:?}");
        assert!(
            resp.contains("upkeep-error: bad_request; reason=invalid_host"),
            "{resp}"
        );
    }
    assert_eq!(get(listen, "ok.test", "/after").await.text(), "b /after\n");
    let mut open = None;
    for _ in 0..40 {
        open = gauge(admin, "upkeep_downstream_connections_open").await;
        if open == Some(0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        open,
        Some(0.0),
        "the connection gauge did not come back down"
    );
    assert_eq!(
        gauge(
            admin,
            "upkeep_responses_total{origin=\"proxy\",class=\"4xx\",cause=\"bad_request\"}"
        )
        .await,
        Some(5.0)
    );
    assert_eq!(
        backend.seen().len(),
        1,
        "only the valid request went upstream"
    );

    let mut refused = 0;
    for _ in 0..40 {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        refused = text
            .lines()
            .filter(|l| l.contains("\"status\":400") && l.contains("\"reason\":\"invalid_host\""))
            .count();
        if refused == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(refused, 5, "each refusal is one access-log line");
    drop(child);
    let err = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(!err.contains("panicked"), "{err}");
}
