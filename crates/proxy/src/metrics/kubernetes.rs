//! EndpointSlice discovery families: counters registered once, and per Service gauges read
//! from the groups when scraped (a Service a reload removed takes its series with it).

use std::fmt::Write;
use std::sync::Arc;

use prometheus_client::registry::Registry;

use super::peers::{family, Esc};
use super::Metrics;
use crate::upstream::Group;

/// Registers the counters of `m`.
pub(super) fn register(r: &mut Registry, m: &Metrics) {
    r.register(
        "kubernetes_events",
        "EndpointSlice lists, watch events and bookmarks (list, added, modified, deleted, bookmark, gone)",
        m.kube_events.clone(),
    );
    r.register(
        "kubernetes_errors",
        "Failed Kubernetes API requests and broken watches (unreachable, timeout, server_error, client_error, watch_cut, tls, config); peers unchanged",
        m.kube_errors.clone(),
    );
    r.register(
        "kubernetes_peer_set_changes",
        "Changes of a Service's peer set made by EndpointSlice discovery",
        m.kube_changes.clone(),
    );
}

/// Appends the per Service gauges, sorted by group.
pub(super) fn encode(out: &mut String, groups: &[(&String, &Arc<Group>)]) {
    let mut rows = Vec::new();
    for (name, g) in groups {
        for st in g.kube_states() {
            rows.push((name.to_string(), st));
        }
    }
    if rows.is_empty() {
        return;
    }
    rows.sort_by(|a, b| (&a.0, &a.1.service).cmp(&(&b.0, &b.1.service)));
    family(
        out,
        "kubernetes_last_sync_timestamp_seconds",
        "gauge",
        "When the last EndpointSlice list, watch event or bookmark arrived (Unix time).",
    );
    for (g, st) in &rows {
        let t = st
            .last_sync
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        let _ = writeln!(
            out,
            "upkeep_kubernetes_last_sync_timestamp_seconds{{group=\"{}\",service=\"{}\"}} {t:.3}",
            Esc(g),
            Esc(&st.service.to_string())
        );
    }
    family(
        out,
        "kubernetes_resource_version",
        "gauge",
        "The resourceVersion discovery is at (when the API server's is a number).",
    );
    for (g, st) in &rows {
        if let Some(rv) = st
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
        {
            let _ = writeln!(
                out,
                "upkeep_kubernetes_resource_version{{group=\"{}\",service=\"{}\"}} {rv}",
                Esc(g),
                Esc(&st.service.to_string())
            );
        }
    }
    family(
        out,
        "kubernetes_endpoints",
        "gauge",
        "Endpoints of a Service by state (peer: takes new requests; draining: serving and terminating).",
    );
    for (g, st) in &rows {
        for (state, n) in [("peer", st.peers.len()), ("draining", st.draining.len())] {
            let _ = writeln!(
                out,
                "upkeep_kubernetes_endpoints{{group=\"{}\",service=\"{}\",state=\"{state}\"}} {n}",
                Esc(g),
                Esc(&st.service.to_string())
            );
        }
    }
}
