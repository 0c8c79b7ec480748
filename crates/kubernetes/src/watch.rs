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
    /// A kubeconfig file; `None`: the in-cluster service account when
    /// `KUBERNETES_SERVICE_HOST` is set, else `KUBECONFIG` or `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// Where the in-cluster service account's `token` and `ca.crt` are mounted.
    pub service_account_dir: PathBuf,
    /// Longest wait for a list, a watch to start, or a Service read.
    pub request_timeout: Duration,
    /// `timeoutSeconds` asked of each watch; the server ends it then and it is resumed.
    pub watch_timeout_secs: u32,
}

/// The standard mount point of a pod's service account.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

impl Default for ApiSettings {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            service_account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
            request_timeout: Duration::from_secs(10),
            watch_timeout_secs: 290,
        }
    }
}

impl ApiSettings {
    /// A watch silent for this long (no event, no bookmark, not ended by the server at its
    /// `timeoutSeconds`) is taken as broken: the watch timeout plus a margin for a slow
    /// server, at least the request timeout and at most 40 s.
    pub fn watch_idle_timeout(&self) -> Duration {
        let watch = Duration::from_secs(self.watch_timeout_secs.into());
        let margin = (watch / 8).clamp(
            self.request_timeout.min(Duration::from_secs(40)),
            Duration::from_secs(40),
        );
        watch + margin
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

/// How long the watch must be quiet before the slices it changed are applied together.
const SETTLE: Duration = Duration::from_millis(100);
/// The longest a change waits for a quiet stream.
const SETTLE_MAX: Duration = Duration::from_secs(1);

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
    // The controller writes a Service's slices one by one (a rolling update empties one and
    // fills another); applying each alone would expose the partial union in between. Events
    // are applied once the stream has been quiet for SETTLE (at most SETTLE_MAX after the first).
    let mut pending: Option<(Instant, Instant)>;
    loop {
        pending = None;
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
        macro_rules! flush {
            () => {
                if pending.take().is_some() {
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
            };
        }
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
                let settle_at =
                    pending.map(|(first, last)| (last + SETTLE).min(first + SETTLE_MAX));
                let wait = match settle_at {
                    Some(at) => at.saturating_duration_since(Instant::now()),
                    None => settings.watch_idle_timeout(),
                };
                let next = guarded(&mut t, wait, async {
                    Ok::<_, kube::Error>(stream.next().await)
                })
                .await;
                if settle_at.is_some_and(|at| Instant::now() >= at) && next.is_err() {
                    flush!();
                    continue;
                }
                let ev = match next {
                    Ok(Some(Ok(ev))) => ev,
                    Ok(Some(Err(e))) => {
                        flush!();
                        t.failed("watch_cut", e.to_string());
                        backoff = Some(t.backoff(backoff));
                        pause(&mut t, backoff.unwrap()).await;
                        continue 'watch;
                    }
                    Ok(None) => {
                        flush!();
                        // The server ended the watch (its timeoutSeconds): resume at once,
                        // unless it keeps ending them at once.
                        if started.elapsed() < Duration::from_secs(1) {
                            backoff = Some(t.backoff(backoff));
                            pause(&mut t, backoff.unwrap()).await;
                        }
                        continue 'watch;
                    }
                    Err((class, msg)) => {
                        flush!();
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
                        let now = Instant::now();
                        pending = Some((pending.map_or(now, |p| p.0), now));
                    }
                    WatchEvent::Deleted(s) => {
                        t.observer.on_event("deleted");
                        rv = s.metadata.resource_version.clone().unwrap_or(rv);
                        known.remove(s.metadata.name.as_deref().unwrap_or(""));
                        let now = Instant::now();
                        pending = Some((pending.map_or(now, |p| p.0), now));
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
                        flush!();
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

/// Builds the client from the kubeconfig; without one, from the pod's service account
/// (in a cluster), else from `KUBECONFIG` or `~/.kube/config` as `kubectl` would.
async fn connect(settings: &ApiSettings) -> Result<Client, String> {
    let opts = kube::config::KubeConfigOptions::default();
    let config = match &settings.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None => match in_cluster(&settings.service_account_dir)? {
            Some(kc) => kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|e| {
                    format!(
                        "in-cluster service account {}: {e}",
                        settings.service_account_dir.display()
                    )
                })?,
            None => kube::Config::from_kubeconfig(&opts).await.map_err(|e| {
                format!("no Kubernetes config (not in a cluster: KUBERNETES_SERVICE_HOST is unset; KUBECONFIG or ~/.kube/config): {e}")
            })?,
        },
    };
    let mut config = config;
    // kube-rs would retry 429/503/504 inside one request, past request_timeout; the loop's
    // own backoff (error_backoff) retries instead, and counts each failure.
    config.default_retry = false;
    // A watch answers nothing between events for up to timeoutSeconds; any read that
    // waits longer than the watch's own idle limit is a dead connection.
    config.read_timeout = Some(settings.watch_idle_timeout());
    Client::try_from(config).map_err(|e| format!("Kubernetes client: {e}"))
}

/// The in-cluster config as a kubeconfig (so the token file is re-read as it is rotated):
/// `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, with `token` and `ca.crt`
/// from `dir`. `None` outside a cluster (no `KUBERNETES_SERVICE_HOST`).
fn in_cluster(dir: &std::path::Path) -> Result<Option<kube::config::Kubeconfig>, String> {
    let Some(host) = std::env::var("KUBERNETES_SERVICE_HOST")
        .ok()
        .filter(|h| !h.is_empty())
    else {
        return Ok(None);
    };
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let (token, ca) = (dir.join("token"), dir.join("ca.crt"));
    for f in [&token, &ca] {
        if let Err(e) = std::fs::metadata(f) {
            return Err(format!("in-cluster service account: {}: {e}", f.display()));
        }
    }
    let kc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "in-cluster", "cluster": {
            "server": format!("https://{host}:{port}"),
            "certificate-authority": ca.to_string_lossy(),
        }}],
        "users": [{"name": "service-account", "user": {"tokenFile": token.to_string_lossy()}}],
        "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "service-account"}}],
        "current-context": "in-cluster",
    });
    kube::config::Kubeconfig::from_yaml(&kc.to_string())
        .map(Some)
        .map_err(|e| format!("in-cluster service account {}: {e}", dir.display()))
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
    // The whole chain: kube's own text ("client error (Connect)") hides a TLS or DNS cause.
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        let more = s.to_string();
        if !msg.contains(&more) {
            msg = format!("{msg}: {more}");
        }
        src = s.source();
    }
    if let kube::Error::Api(s) = e {
        return (status_class(s.code), msg);
    }
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if s.downcast_ref::<rustls::Error>().is_some() {
            return ("tls", msg);
        }
        let tls_in_io = s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .is_some_and(|i| i.is::<rustls::Error>());
        if tls_in_io {
            return ("tls", msg);
        }
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
    let debug = format!("{e:?}");
    // The TLS error can sit behind connector layers that box it away from the source
    // chain; rustls's own variant names still say what failed.
    if [
        "InvalidCertificate",
        "AlertReceived",
        "PeerIncompatible",
        "InvalidCertificateData",
    ]
    .iter()
    .any(|v| debug.contains(v))
    {
        return ("tls", msg);
    }
    let lower = debug.to_ascii_lowercase();
    if lower.contains("connect") {
        ("unreachable", msg)
    } else if matches!(e, kube::Error::ReadEvents(_) | kube::Error::HyperError(_)) {
        ("watch_cut", msg)
    } else {
        ("error", msg)
    }
}
