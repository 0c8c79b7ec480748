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
