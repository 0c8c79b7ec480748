use super::*;
use crate::scenario::Scenario;
use std::time::Duration;

const TEXT: &str = r#"
name = "t"
description = "t"
duration = "10s"
[[backend]]
name = "dc1"
ip = "127.0.0.1"
[upstream]
servers = ["dc1"]
[[fault]]
at = "3s"
backend = "dc1"
set = "refuse"
for = "2s"
"#;

#[tokio::test(start_paused = true)]
async fn a_timed_fault_holds_from_at_until_for_has_passed() {
    let scenario = Scenario::parse(TEXT, "t.toml").unwrap();
    let b = Arc::new(
        Backend::start("127.0.0.1:0".parse().unwrap(), "dc1")
            .await
            .unwrap(),
    );
    let handles = Handles {
        backends: [("dc1".to_owned(), b.clone())].into_iter().collect(),
        dns: None,
        target_pid: None,
        kube: None,
        target_kind: None,
        target: None,
    };
    let t0 = Instant::now();
    let tl = Timeline::start(&scenario, handles, t0);
    tokio::time::sleep(Duration::from_millis(2900)).await;
    assert_eq!(b.fault(), Fault::None);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(b.fault(), Fault::Refuse);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(b.fault(), Fault::None);
    let events = tl.finish();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].label, "dc1 refuse");
    assert!((events[0].start_s - 3.0).abs() < 0.01, "{events:?}");
    assert!((events[0].end_s.unwrap() - 5.0).abs() < 0.01, "{events:?}");
}

/// A process that writes the name of the first signal it gets (of TERM, QUIT, USR1, INT,
/// HUP) to `out` and exits. Started through `env --default-signal`: a shell cannot trap a
/// signal that was ignored when it started, and a test run started as a background job of a
/// non-interactive shell inherits SIGINT and SIGQUIT ignored.
fn signal_recorder(out: &std::path::Path) -> std::process::Child {
    let out = out.display();
    let script = format!(
        "for s in TERM QUIT USR1 INT HUP; do trap \"echo $s > {out}; exit 0\" $s; done; \
         echo ready > {out}.ready; while :; do sleep 0.02; done"
    );
    std::process::Command::new("env")
        .args(["--default-signal", "sh", "-c"])
        .arg(script)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn a_stop_step_sends_each_proxy_the_signal_its_own_package_stops_it_with() {
    use crate::target::TargetKind;
    let text = r#"
name = "t"
description = "t"
duration = "2s"
[[backend]]
name = "dc1"
ip = "127.0.0.1"
[upstream]
servers = ["dc1"]
[[fault]]
at = "0s"
signal = "stop"
"#;
    let scenario = Scenario::parse(text, "t.toml").unwrap();
    for (kind, expected) in [
        (TargetKind::Upkeep, "TERM"),
        (TargetKind::Nginx, "QUIT"),
        (TargetKind::Haproxy, "USR1"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("got");
        let mut child = signal_recorder(&out);
        let ready = out.with_extension("ready");
        for _ in 0..750 {
            if ready.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(ready.exists(), "the recorder did not start");
        let handles = Handles {
            backends: BTreeMap::new(),
            dns: None,
            target_pid: Some(child.id()),
            kube: None,
            target_kind: Some(kind),
            target: None,
        };
        let tl = Timeline::start(&scenario, handles, Instant::now());
        let mut exited = false;
        // Up to 15 s: on a loaded machine the shell may run its trap late.
        for _ in 0..750 {
            if child.try_wait().unwrap().is_some() {
                exited = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let events = tl.finish();
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(exited, "{kind:?}: the target got no signal it stops on");
        let got = std::fs::read_to_string(&out).unwrap();
        assert_eq!(got.trim(), expected, "{kind:?}");
        assert_eq!(
            events[0].label,
            format!("graceful stop (SIG{expected}) to target")
        );
    }
}
