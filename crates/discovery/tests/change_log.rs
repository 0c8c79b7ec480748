//! Every address change is one log line, with the answer that caused it.
//!
//! This is the only test in its binary: it installs the process-wide subscriber, so no
//! other test thread can race it for tracing's per-callsite interest cache.

use std::collections::VecDeque;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use upkeep_discovery::{
    watch_name_with, AssumeHealthy, Lookup, NoObserver, Outcome, Policy, StaleGrace,
};

const S: Duration = Duration::from_secs(1);

/// Answers from a script; the last step repeats.
struct Scripted(Mutex<VecDeque<Outcome>>);

impl Lookup for Scripted {
    fn lookup<'a>(&'a self, _name: &'a str) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>> {
        let mut steps = self.0.lock().unwrap();
        let next = if steps.len() > 1 {
            steps.pop_front().unwrap()
        } else {
            steps.front().cloned().expect("script is not empty")
        };
        Box::pin(async move { next })
    }
}

fn records(ips: &[&str]) -> Outcome {
    Outcome::Records {
        addrs: ips.iter().map(|s| s.parse::<IpAddr>().unwrap()).collect(),
        ttl: S,
    }
}

/// Collects formatted log output.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn every_address_change_is_one_log_line() {
    let buf = LogBuf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("first subscriber");
    let src = Arc::new(Scripted(Mutex::new(
        vec![
            records(&["127.0.0.2"]),
            records(&["127.0.0.2"]),
            records(&["127.0.0.3"]),
            Outcome::ServFail,
            Outcome::NxDomain,
            Outcome::NxDomain,
        ]
        .into(),
    )));
    let policy = Policy {
        min_refresh: S,
        max_refresh: 60 * S,
        stale_grace: StaleGrace::For(Duration::from_millis(1500)),
        error_backoff: S,
    };
    let (_rx, _task) = watch_name_with(
        src,
        "app.upkeep.test".into(),
        policy,
        Arc::new(AssumeHealthy(true)),
        Arc::new(NoObserver),
    );
    tokio::time::sleep(10 * S).await;
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("dns addresses changed"))
        .collect();
    // [] -> [.2], [.2] -> [.3], [.3] -> [] when the grace ends; nothing for the rest.
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].contains("dns.name=app.upkeep.test"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("old=[]") && lines[0].contains("new=[127.0.0.2]"));
    assert!(lines[1].contains("dns.rcode=\"NOERROR\""), "{}", lines[1]);
    assert!(lines[1].contains("old=[127.0.0.2]") && lines[1].contains("new=[127.0.0.3]"));
    assert!(
        lines[2].contains("NXDOMAIN") && lines[2].contains("nxdomain_grace_expired"),
        "{}",
        lines[2]
    );
}
