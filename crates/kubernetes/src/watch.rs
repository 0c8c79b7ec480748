//! List then watch one Service's EndpointSlices: resume from the last resourceVersion after a
//! broken watch (with backoff), re-list after 410 Gone, time out a slow API server, and hand
//! every outcome to the tracker, which alone decides what the peers become.
//!
//! kube-runtime's `watcher` does list/watch/re-list too, but hides the list's and the
//! bookmarks' resourceVersion (which `/upstreams` shows) and re-lists after every clean end
//! of a watch; this loop is small enough to own.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;
use upkeep_discovery::Policy;

use crate::slices::{endpoints, PortSel, ServiceRef};
use crate::tracker::{Observer, ServiceState, StaleCheck, Tracker};

/// How the loop reaches the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiSettings {
    /// A kubeconfig file; `None`: `KUBECONFIG`, `~/.kube/config`, then the in-cluster
    /// service account.
    pub kubeconfig: Option<PathBuf>,
    /// Longest wait for a list, a watch to start, or a Service read.
    pub request_timeout: Duration,
    /// A watch silent for this long (no event, no bookmark) is taken as broken.
    pub watch_idle_timeout: Duration,
    /// `timeoutSeconds` asked of each watch; the server ends it then and it is resumed.
    pub watch_timeout_secs: u32,
}

impl Default for ApiSettings {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            request_timeout: Duration::from_secs(10),
            watch_idle_timeout: Duration::from_secs(330),
            watch_timeout_secs: 290,
        }
    }
}

/// Starts watching `start.service`'s endpoints on `start.port`. The receiver sees every
/// state; the task runs until aborted.
pub fn watch_service(
    settings: ApiSettings,
    start: ServiceState,
    policy: Policy,
    stale: Arc<dyn StaleCheck>,
    observer: Arc<dyn Observer>,
) -> (watch::Receiver<ServiceState>, tokio::task::JoinHandle<()>) {
    let (tracker, rx) = Tracker::new(start, policy, stale, observer);
    let task = tokio::spawn(run(settings, tracker));
    (rx, task)
}

/// Why one step failed: the error class (a metric label) and its message.
type Failure = (&'static str, String);

async fn run(settings: ApiSettings, mut t: Tracker) {
    let mut backoff: Option<Duration> = None;
    let client = loop {
        match connect(&settings).await {
            Ok(c) => break c,
            Err(e) => {
                t.failed("config", e);
                backoff = Some(t.backoff(backoff));
                pause(&mut t, backoff.unwrap()).await;
            }
        }
    };
    let svc = t.state.service.clone();
    let port = t.state.port.clone();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &svc.namespace);
    let services: Api<Service> = Api::namespaced(client, &svc.namespace);
    let selector = format!("kubernetes.io/service-name={}", svc.name);
    let lp = ListParams::default().labels(&selector);
    let wp = WatchParams::default()
        .labels(&selector)
        .timeout(settings.watch_timeout_secs);
    let limit = settings.request_timeout;
    loop {
        // List: the complete set, applied in one swap.
        let listed = match guarded(&mut t, limit, slices.list(&lp)).await {
            Ok(l) => l,
            Err((class, msg)) => {
                t.failed(class, msg);
                backoff = Some(t.backoff(backoff));
                pause(&mut t, backoff.unwrap()).await;
                continue;
            }
        };
        let mut rv = listed.metadata.resource_version.clone().unwrap_or_default();
        let mut known: BTreeMap<String, EndpointSlice> = listed
            .items
            .into_iter()
            .map(|s| (s.metadata.name.clone().unwrap_or_default(), s))
            .collect();
        t.observer.on_event("list");
        apply(
            &mut t,
            &services,
            &svc,
            &port,
            &known,
            Some(rv.clone()),
            limit,
        )
        .await;
        backoff = None;
        // Watch from the list's resourceVersion, resuming from the last one seen.
        'watch: loop {
            let started = Instant::now();
            let stream = match guarded(&mut t, limit, slices.watch(&wp, &rv)).await {
                Ok(s) => s,
                Err((class, msg)) => {
                    let gone = class == "gone";
                    t.failed(class, msg);
                    if gone {
                        break 'watch;
                    }
                    backoff = Some(t.backoff(backoff));
                    pause(&mut t, backoff.unwrap()).await;
                    continue 'watch;
                }
            };
            let mut stream = std::pin::pin!(stream);
            loop {
                let next = guarded(&mut t, settings.watch_idle_timeout, async {
                    Ok::<_, kube::Error>(stream.next().await)
                })
                .await;
                let ev = match next {
                    Ok(Some(Ok(ev))) => ev,
                    Ok(Some(Err(e))) => {
                        t.failed("watch_cut", e.to_string());
                        backoff = Some(t.backoff(backoff));
                        pause(&mut t, backoff.unwrap()).await;
                        continue 'watch;
                    }
                    Ok(None) => {
                        // The server ended the watch (its timeoutSeconds): resume at once,
                        // unless it keeps ending them at once.
                        if started.elapsed() < Duration::from_secs(1) {
                            backoff = Some(t.backoff(backoff));
                            pause(&mut t, backoff.unwrap()).await;
                        }
                        continue 'watch;
                    }
                    Err((class, msg)) => {
                        let class = if class == "timeout" {
                            "watch_cut"
                        } else {
                            class
                        };
                        t.failed(class, msg);
                        backoff = Some(t.backoff(backoff));
                        pause(&mut t, backoff.unwrap()).await;
                        continue 'watch;
                    }
                };
                backoff = None;
                match ev {
                    WatchEvent::Added(s) | WatchEvent::Modified(s) => {
                        let added = !known.contains_key(s.metadata.name.as_deref().unwrap_or(""));
                        t.observer
                            .on_event(if added { "added" } else { "modified" });
                        rv = s.metadata.resource_version.clone().unwrap_or(rv);
                        known.insert(s.metadata.name.clone().unwrap_or_default(), s);
                        apply(
                            &mut t,
                            &services,
                            &svc,
                            &port,
                            &known,
                            Some(rv.clone()),
                            limit,
                        )
                        .await;
                    }
                    WatchEvent::Deleted(s) => {
                        t.observer.on_event("deleted");
                        rv = s.metadata.resource_version.clone().unwrap_or(rv);
                        known.remove(s.metadata.name.as_deref().unwrap_or(""));
                        apply(
                            &mut t,
                            &services,
                            &svc,
                            &port,
                            &known,
                            Some(rv.clone()),
                            limit,
                        )
                        .await;
                    }
                    WatchEvent::Bookmark(b) => {
                        t.observer.on_event("bookmark");
                        rv = b.metadata.resource_version;
                        t.progress(rv.clone());
                    }
                    WatchEvent::Error(status) if status.code == 410 => {
                        // History compacted past our resourceVersion: only a re-list can
                        // tell what changed. The peers stay until it answers.
                        t.observer.on_event("gone");
                        tracing::info!(kubernetes.service = %svc, kubernetes.resource_version = %rv, "watch expired (410 Gone): re-listing");
                        break 'watch;
                    }
                    WatchEvent::Error(status) => {
                        t.failed(
                            status_class(status.code),
                            format!("watch error {}: {}", status.code, status.message),
                        );
                        backoff = Some(t.backoff(backoff));
                        pause(&mut t, backoff.unwrap()).await;
                        continue 'watch;
                    }
                }
            }
        }
    }
}

/// Builds the client from the kubeconfig, or from the environment as `kubectl` would.
async fn connect(settings: &ApiSettings) -> Result<Client, String> {
    let config = match &settings.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no Kubernetes config (KUBECONFIG, ~/.kube/config or in-cluster service account): {e}"))?,
    };
    let mut config = config;
    // kube-rs would retry 429/503/504 inside one request, past request_timeout; the loop's
    // own backoff (error_backoff) retries instead, and counts each failure.
    config.default_retry = false;
    Client::try_from(config).map_err(|e| format!("Kubernetes client: {e}"))
}

/// Applies the current slices; when they have no usable endpoint, asks whether the Service
/// still exists (a deleted one needs no grace; a failed read counts as existing).
async fn apply(
    t: &mut Tracker,
    services: &Api<Service>,
    svc: &ServiceRef,
    port: &PortSel,
    known: &BTreeMap<String, EndpointSlice>,
    rv: Option<String>,
    limit: Duration,
) {
    let eps = endpoints(known.values(), port);
    let usable = crate::slices::split(&eps);
    let gone = if usable.peers.is_empty() && !t.state.peers.is_empty() {
        matches!(
            guarded(t, limit, services.get_opt(&svc.name)).await,
            Ok(None)
        )
    } else {
        false
    };
    t.synced(&eps, rv, gone);
}

/// Runs `f` with a timeout, keeping the tracker's grace deadline while it waits.
async fn guarded<T>(
    t: &mut Tracker,
    limit: Duration,
    f: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, Failure> {
    let mut f = std::pin::pin!(tokio::time::timeout(limit, f));
    loop {
        let deadline = t.deadline();
        tokio::select! {
            r = &mut f => return match r {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(classify(&e)),
                Err(_) => Err(("timeout", format!("no answer within {limit:?}"))),
            },
            _ = sleep_until(deadline) => t.tick(),
        }
    }
}

/// Waits `d` (jittered), keeping the grace deadline.
async fn pause(t: &mut Tracker, d: Duration) {
    use rand::Rng;
    let d = d.mul_f64(rand::rng().random_range(0.8..1.2));
    let end = Instant::now() + d;
    loop {
        let deadline = t.deadline().filter(|x| *x < end);
        tokio::select! {
            _ = tokio::time::sleep_until(end) => return,
            _ = sleep_until(deadline) => t.tick(),
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn status_class(code: u16) -> &'static str {
    match code {
        410 => "gone",
        500..=599 => "server_error",
        _ => "client_error",
    }
}

/// The error class of a failed request: API status, or what the connection did.
fn classify(e: &kube::Error) -> Failure {
    let msg = e.to_string();
    if let kube::Error::Api(s) = e {
        return (status_class(s.code), msg);
    }
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            match io.kind() {
                TimedOut => return ("timeout", msg),
                ConnectionRefused | ConnectionReset | ConnectionAborted | NotConnected
                | HostUnreachable | NetworkUnreachable | AddrNotAvailable => {
                    return ("unreachable", msg)
                }
                _ => {}
            }
        }
        src = s.source();
    }
    let lower = format!("{e:?}").to_ascii_lowercase();
    if lower.contains("connect") {
        ("unreachable", msg)
    } else if matches!(e, kube::Error::ReadEvents(_) | kube::Error::HyperError(_)) {
        ("watch_cut", msg)
    } else {
        ("error", msg)
    }
}
