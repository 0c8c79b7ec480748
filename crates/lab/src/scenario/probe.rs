//! A kubelet-like prober: startup first, then liveness and readiness on their periods,
//! counting restarts (liveness failures past threshold) and traffic cuts (ready -> not ready).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::{ProbeSpec, ProbesSpec};

/// One HTTP/1.1 GET on a fresh connection; the status, or `None` on any failure or timeout.
pub async fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Option<u16> {
    tokio::time::timeout(timeout, async {
        let stream = TcpStream::connect(addr).await.ok()?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::get(path)
            .header(http::header::HOST, addr.to_string())
            .header(http::header::CONNECTION, "close")
            .body(Empty::<Bytes>::new())
            .ok()?;
        let resp = sender.send_request(req).await.ok()?;
        let status = resp.status().as_u16();
        let _ = resp.into_body().collect().await;
        Some(status)
    })
    .await
    .ok()
    .flatten()
}

/// What the prober saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeOutcome {
    /// Liveness failed `failure_threshold` times in a row (the kubelet would restart).
    pub restarts: u64,
    /// Readiness went from ready to not ready (the endpoint leaves the Service).
    pub traffic_cuts: u64,
    /// Startup never succeeded within its budget.
    pub startup_failed: bool,
}

/// A running prober.
pub struct Prober {
    task: JoinHandle<()>,
    restarts: Arc<AtomicU64>,
    cuts: Arc<AtomicU64>,
    startup_failed: Arc<AtomicBool>,
}

impl Prober {
    /// Starts probing `admin`.
    pub fn start(admin: SocketAddr, spec: ProbesSpec) -> Prober {
        let restarts = Arc::new(AtomicU64::new(0));
        let cuts = Arc::new(AtomicU64::new(0));
        let startup_failed = Arc::new(AtomicBool::new(false));
        let (r, c, s) = (restarts.clone(), cuts.clone(), startup_failed.clone());
        let task = tokio::spawn(async move {
            if !startup(admin, &spec.startup).await {
                s.store(true, Ordering::Relaxed);
                return;
            }
            let live = tokio::spawn(liveness(admin, spec.liveness.clone(), r));
            let ready = tokio::spawn(readiness(admin, spec.readiness.clone(), c));
            let _ = tokio::join!(live, ready);
        });
        Prober {
            task,
            restarts,
            cuts,
            startup_failed,
        }
    }

    /// Stops probing and returns the counts.
    pub fn finish(self) -> ProbeOutcome {
        self.task.abort();
        ProbeOutcome {
            restarts: self.restarts.load(Ordering::Relaxed),
            traffic_cuts: self.cuts.load(Ordering::Relaxed),
            startup_failed: self.startup_failed.load(Ordering::Relaxed),
        }
    }
}

fn ok(status: Option<u16>) -> bool {
    status.is_some_and(|s| (200..400).contains(&s))
}

async fn startup(admin: SocketAddr, spec: &ProbeSpec) -> bool {
    for _ in 0..spec.failure_threshold.max(1) {
        if ok(http_get(admin, &spec.path, spec.timeout).await) {
            return true;
        }
        tokio::time::sleep(spec.period).await;
    }
    false
}

async fn liveness(admin: SocketAddr, spec: ProbeSpec, restarts: Arc<AtomicU64>) {
    let mut failures = 0;
    let mut tick = tokio::time::interval(spec.period);
    loop {
        tick.tick().await;
        if ok(http_get(admin, &spec.path, spec.timeout).await) {
            failures = 0;
        } else {
            failures += 1;
            if failures >= spec.failure_threshold {
                restarts.fetch_add(1, Ordering::Relaxed);
                failures = 0;
            }
        }
    }
}

async fn readiness(admin: SocketAddr, spec: ProbeSpec, cuts: Arc<AtomicU64>) {
    let mut failures = 0;
    let mut ready = false;
    let mut tick = tokio::time::interval(spec.period);
    loop {
        tick.tick().await;
        if ok(http_get(admin, &spec.path, spec.timeout).await) {
            failures = 0;
            ready = true;
        } else {
            failures += 1;
            if failures >= spec.failure_threshold && ready {
                ready = false;
                cuts.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
