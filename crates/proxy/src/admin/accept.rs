//! Accepting admin connections so that probes keep answering when the proxy is saturated:
//! a failing accept (descriptors exhausted) backs off instead of spinning the control
//! runtime, a client has `header_read_timeout` to send its request head, and each admin
//! listener holds at most `max_connections`, answering the rest 503 at once.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use super::{route, Reload, Role, Upgrade};
use crate::config::AdminConfig;
use crate::state::Shared;

/// First wait after a failed accept; doubled on each further failure.
const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest wait between accept attempts while they fail: a probe waits at most this long
/// once a descriptor is free again.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Per-listener bounds, fixed when the listeners start.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    header_read_timeout: Duration,
    max_connections: usize,
}

impl From<&AdminConfig> for Limits {
    fn from(c: &AdminConfig) -> Self {
        Self {
            header_read_timeout: c.header_read_timeout,
            max_connections: c.max_connections,
        }
    }
}

/// Accept-error back-off: exponential from `BACKOFF_MIN` to `BACKOFF_MAX`, one log line when
/// a run of failures starts and one when it ends.
struct Backoff {
    next: Duration,
    failures: u64,
}

impl Backoff {
    fn new() -> Self {
        Self {
            next: BACKOFF_MIN,
            failures: 0,
        }
    }

    async fn failed(&mut self, role: Role, error: &std::io::Error) {
        if self.failures == 0 {
            tracing::warn!(admin.listener = role.as_str(), %error, "admin accept failed; backing off");
        }
        self.failures += 1;
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(BACKOFF_MAX);
    }

    fn succeeded(&mut self, role: Role) {
        if self.failures > 0 {
            tracing::info!(
                admin.listener = role.as_str(),
                failures = self.failures,
                "admin accepting again"
            );
        }
        *self = Self::new();
    }
}

/// What the routes that act on the process call, and where connections are tracked.
#[derive(Clone)]
pub(super) struct Hooks {
    pub(super) reload: Reload,
    pub(super) upgrade: Option<Upgrade>,
    pub(super) conns: TaskTracker,
}

/// Serves one admin listener until the task running it is aborted.
pub(super) async fn serve(
    listener: TcpListener,
    role: Role,
    limits: Limits,
    shared: Arc<Shared>,
    hooks: Hooks,
) {
    let tracker = hooks.conns.clone();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut backoff = Backoff::new();
    let mut refused: u64 = 0;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => {
                backoff.succeeded(role);
                s
            }
            Err(e) => {
                backoff.failed(role, &e).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    admin.listener = role.as_str(),
                    max_connections = limits.max_connections,
                    refused,
                    "admin connection limit reached; answering 503"
                );
            }
            refuse(stream);
            continue;
        };
        let (shared, hooks) = (shared.clone(), hooks.clone());
        tracker.spawn(async move {
            let _slot = slot;
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let (shared, hooks) = (shared.clone(), hooks.clone());
                async move {
                    // The one route that waits (for the new process): answered here, so
                    // the others stay plain functions of the request.
                    if role == Role::Control
                        && req.method() == http::Method::POST
                        && req.uri().path() == "/upgrade"
                    {
                        let r = super::upgrade(&req, peer, &shared, hooks.upgrade.as_ref()).await;
                        return Ok::<_, Infallible>(r);
                    }
                    Ok::<_, Infallible>(route(req, role, peer, &shared, &*hooks.reload))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Answers a connection over the limit without reading it: one non-blocking write, then close,
/// so it costs a descriptor for no longer than this call.
fn refuse(stream: TcpStream) {
    let _ = stream.try_write(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 31\r\nConnection: close\r\n\r\nadmin connection limit reached\n",
    );
}
