//! Wires EndpointSlice discovery into a group: one list/watch loop per `kubernetes`
//! endpoint, each new peer set swapped into the group through the same rebuild DNS changes
//! use. Draining (serving, terminating) endpoints are simply not peers: nothing picks them
//! for a new request, while requests in flight hold their peer and connection to the end.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use serde_json::json;
use upkeep_kubernetes::{ApiSettings, Observer, ServiceState, StaleCheck};

use super::Group;
use crate::config::{EndpointSource, KubernetesConfig};
use crate::metrics::{EventLabel, Metrics, ReasonLabel};

struct GroupStale {
    group: Weak<Group>,
}

impl StaleCheck for GroupStale {
    fn still_healthy(&self, addrs: &[SocketAddr]) -> bool {
        let Some(g) = self.group.upgrade() else {
            return false;
        };
        let set = g.peers();
        let now = tokio::time::Instant::now();
        let healthy = set
            .all()
            .filter(|p| addrs.contains(&p.addr()))
            .any(|p| p.is_healthy(now));
        healthy
    }
}

struct Counting {
    metrics: Arc<Metrics>,
}

impl Observer for Counting {
    fn on_event(&self, event: &'static str) {
        self.metrics
            .kube_events
            .get_or_create(&EventLabel { event })
            .inc();
    }
    fn on_error(&self, error: &'static str) {
        self.metrics
            .kube_errors
            .get_or_create(&ReasonLabel { reason: error })
            .inc();
    }
    fn on_change(&self, _: &ServiceState) {
        self.metrics.kube_changes.inc();
    }
}

/// Starts EndpointSlice discovery for every `kubernetes` endpoint of `group`, each from the
/// state the group carried over from the one it replaced, if any.
pub fn start(group: &Arc<Group>, k8s: &KubernetesConfig, metrics: Arc<Metrics>) {
    for (index, ep) in group.config().endpoints.iter().enumerate() {
        let EndpointSource::Kubernetes { service, port } = &ep.source else {
            continue;
        };
        let settings = ApiSettings {
            kubeconfig: k8s.kubeconfig.clone(),
            service_account_dir: k8s.service_account_dir.clone(),
            request_timeout: k8s.request_timeout,
            watch_timeout_secs: u32::try_from(k8s.watch_timeout.as_secs()).unwrap_or(u32::MAX),
        };
        let carried = group
            .carried_kube_state(index)
            .unwrap_or_else(|| ServiceState::new(service.clone(), port.clone()));
        let (rx, handle) = upkeep_kubernetes::watch_service(
            settings,
            carried,
            super::discovery_policy(group),
            Arc::new(GroupStale {
                group: Arc::downgrade(group),
            }),
            Arc::new(Counting {
                metrics: metrics.clone(),
            }),
        );
        // Bookmarks and failures publish too; only a change of peers rebuilds the set.
        let mut applied: Option<(Arc<[SocketAddr]>, bool)> = None;
        super::follow(group, handle, rx, move |g, state: ServiceState| {
            let now = (state.peers.clone(), state.synced_ever);
            if applied.as_ref() != Some(&now) {
                g.set_endpoint_socket_addrs(index, &now.0, !now.1);
                applied = Some(now);
            }
            g.set_kube_state(index, state);
        });
    }
}

/// The `/upstreams` view of one Service.
pub fn view(st: &ServiceState) -> serde_json::Value {
    let at = |t: Option<std::time::SystemTime>| t.map(crate::access_log::rfc3339);
    let zones: serde_json::Map<String, serde_json::Value> = st
        .zones
        .iter()
        .map(|(a, z)| (a.to_string(), json!(z)))
        .collect();
    json!({
        "source": "kubernetes",
        "service": st.service.to_string(),
        "port": st.port.to_string(),
        "peers": st.peers.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "draining": st.draining.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "zones": zones,
        "synced_ever": st.synced_ever,
        "resource_version": st.resource_version,
        "last_sync": at(st.last_sync),
        "last_at": at(st.last_at),
        "last_outcome": st.last_outcome,
        "last_error": st.last_error,
        "stale_since": at(st.stale_since),
        "dropped_reason": st.dropped_reason,
    })
}
