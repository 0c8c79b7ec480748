//! Wires DNS discovery into a group: one re-resolve loop per name endpoint, each change of a
//! name's addresses swapped into the group's peer set.

use std::net::IpAddr;
use std::sync::{Arc, Weak};

use serde_json::json;
use upkeep_discovery::{NameState, Observer, Outcome, Resolver, StaleCheck};

use super::Group;
use crate::config::EndpointSource;
use crate::metrics::{Metrics, OutcomeLabel};

struct GroupStale {
    group: Weak<Group>,
    port: u16,
}

impl StaleCheck for GroupStale {
    fn still_healthy(&self, addrs: &[IpAddr]) -> bool {
        let Some(g) = self.group.upgrade() else {
            return false;
        };
        let set = g.peers();
        let now = tokio::time::Instant::now();
        let healthy = set
            .all()
            .filter(|p| p.addr().port() == self.port && addrs.contains(&p.addr().ip()))
            .any(|p| p.is_healthy(now));
        healthy
    }
}

struct Counting {
    metrics: Arc<Metrics>,
    group: String,
}

impl Observer for Counting {
    fn on_lookup(&self, name: &str, outcome: &Outcome, old: &[IpAddr], new: &[IpAddr]) {
        self.metrics
            .dns_lookups
            .get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            })
            .inc();
        if old != new {
            self.metrics.dns_changes.inc();
            tracing::info!(
                group = %self.group,
                dns.name = name,
                dns.outcome = outcome.label(),
                dns.rcode = outcome.rcode().unwrap_or("-"),
                old = ?old,
                new = ?new,
                "peer set changed"
            );
        }
    }
}

/// Starts discovery for every name endpoint of `group`, each from the state the group
/// carried over from the one it replaced, if any (see `Group::carry_over`).
pub fn start(group: &Arc<Group>, resolver: Arc<Resolver>, metrics: Arc<Metrics>) {
    for (index, ep) in group.config().endpoints.iter().enumerate() {
        let EndpointSource::Name { host, port } = &ep.source else {
            continue;
        };
        let stale = Arc::new(GroupStale {
            group: Arc::downgrade(group),
            port: *port,
        });
        let observer = Arc::new(Counting {
            metrics: metrics.clone(),
            group: group.name().to_owned(),
        });
        let carried = group
            .carried_name_state(index)
            .unwrap_or_else(|| NameState::new(host.clone()));
        let (rx, handle) = upkeep_discovery::watch_name_from(
            resolver.clone(),
            carried,
            super::discovery_policy(group),
            stale,
            observer,
        );
        super::follow(group, handle, rx, move |g, state| apply(g, index, &state));
    }
}

fn apply(group: &Group, index: usize, st: &NameState) {
    group.set_endpoint_addrs(index, &st.addrs, !st.resolved_ever);
    // Before a lookup has finished, first discovery is still pending (see /startupz).
    group.set_name_state(index, st.clone());
}

/// The `/upstreams` view of one name.
pub fn view(st: &NameState) -> serde_json::Value {
    let since = |t: Option<std::time::SystemTime>| t.map(crate::access_log::rfc3339);
    let note = match &st.last_outcome {
        upkeep_discovery::Outcome::Error(e) => Some(e.as_str()),
        _ => None,
    };
    json!({
        "name": st.name,
        "addrs": st.addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "resolved_ever": st.resolved_ever,
        "last_outcome": st.last_outcome.label(),
        "last_rcode": st.last_outcome.rcode(),
        "last_error": note,
        "last_at": since(st.last_at),
        "stale_since": since(st.stale_since),
        "dropped_reason": st.dropped_reason,
    })
}
