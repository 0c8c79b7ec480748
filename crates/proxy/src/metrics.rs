//! Prometheus metrics, named `upkeep_<subsystem>_<noun>_<unit|total>` with enum-valued labels.
//!
//! Labels stay bounded: `route` and `group` come from the config, `peer` only from the peers a
//! group has now (those families are read from the live peer set at scrape time, so a peer
//! that went away takes its series with it). See docs/observability.md.

mod exposition;
mod kubernetes;
mod peers;
mod upgrade;

pub use exposition::{scrape, Format};
pub use peers::PeerStats;
pub use upgrade::UpgradeMetrics;

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of `upkeep_responses_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    /// `proxy` (made by upkeep) or `upstream` (passed through).
    pub origin: &'static str,
    /// `2xx` .. `5xx`.
    pub class: &'static str,
    /// Cause code for proxy responses, empty for upstream ones.
    pub cause: &'static str,
}

/// A single enum-valued label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabel {
    /// The event.
    pub event: &'static str,
}

/// Outcome label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// The outcome.
    pub outcome: &'static str,
}

/// Reason label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The reason.
    pub reason: &'static str,
}

/// Which timeout fired.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TimeoutLabel {
    /// `header_read`, `client_body`, `send` or `read`.
    pub timeout: &'static str,
}

/// Group label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    /// The group name.
    pub group: String,
}

/// Labels of `upkeep_route_responses_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The matched route, as written (`host/path`, `/path`).
    pub route: Arc<str>,
    /// The route's group.
    pub group: Arc<str>,
    /// `2xx` .. `5xx`.
    pub class: &'static str,
}

/// Labels of `upkeep_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The upkeep version.
    pub version: &'static str,
}

/// Every metric upkeep exports.
pub struct Metrics {
    registry: Registry,
    /// Responses sent downstream per matched route.
    pub route_responses: Family<RouteLabels, Counter>,
    /// Always 1, with the version as a label.
    pub build_info: Family<BuildLabels, Gauge>,
    /// Requests received downstream.
    pub requests: Counter,
    /// Responses sent downstream.
    pub responses: Family<ResponseLabels, Counter>,
    /// Time to response headers.
    pub latency: Histogram,
    /// Open downstream connections.
    pub downstream_open: Gauge,
    /// Upstream connection events: new, reused, stale_discarded, expired, h2_refused_replay,
    /// evicted.
    pub pool_events: Family<EventLabel, Counter>,
    /// Idle pooled upstream connections.
    pub pool_idle: Gauge,
    /// Requests replayed on a fresh connection after a reused one turned out closed.
    pub pool_stale_replays: Counter,
    /// DNS lookups by outcome.
    pub dns_lookups: Family<OutcomeLabel, Counter>,
    /// Peer address-set changes made by discovery.
    pub dns_changes: Counter,
    /// EndpointSlice lists, watch events and bookmarks by kind.
    pub kube_events: Family<EventLabel, Counter>,
    /// Failed Kubernetes API requests and broken watches, by class.
    pub kube_errors: Family<ReasonLabel, Counter>,
    /// Peer set changes made by EndpointSlice discovery.
    pub kube_changes: Counter,
    /// Peer ejections by passive health.
    pub peer_ejections: Counter,
    /// Retries by reason.
    pub retries: Family<ReasonLabel, Counter>,
    /// Retries refused by the budget.
    pub retry_budget_exhausted: Counter,
    /// 1 while a group's tier routes in panic mode.
    pub panic_mode: Family<GroupLabel, Gauge>,
    /// 1 while an optional group has no usable peer.
    pub degraded: Family<GroupLabel, Gauge>,
    /// 1 once an optional group has been degraded longer than `degraded_alert_after`.
    pub degraded_alert: Family<GroupLabel, Gauge>,
    /// 1 while the process drains.
    pub draining: Gauge,
    /// Connections and bodies cut by a timeout, by which one.
    pub timeouts: Family<TimeoutLabel, Counter>,
    /// Downstream connections refused over `max_connections`.
    pub connections_refused: Counter,
    /// Access-log lines dropped because the writer was too far behind.
    pub access_log_dropped: Counter,
    /// Upgraded (WebSocket) connections.
    pub upgraded: UpgradeMetrics,
    /// The series of `responses` and `pool_events` that nearly every request counts, looked
    /// up once (a clone shares the value) instead of hashing labels per request.
    hot: HotSeries,
}

struct HotSeries {
    upstream_2xx: Counter,
    reused: Counter,
    new: Counter,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Arc<Self> {
        Self::with_access_log_dropped(Counter::default())
    }

    /// Like `new`, exporting the access logger's own drop counter (the logger starts first).
    pub fn with_access_log_dropped(access_log_dropped: Counter) -> Arc<Self> {
        let mut r = Registry::with_prefix("upkeep");
        let responses: Family<ResponseLabels, Counter> = Family::default();
        let pool_events: Family<EventLabel, Counter> = Family::default();
        // One statement per series: a lookup's guard lives to the end of its statement, and a
        // second lookup that inserts into the same family would wait for it forever.
        let upstream_2xx = responses
            .get_or_create(&ResponseLabels {
                origin: "upstream",
                class: "2xx",
                cause: "",
            })
            .clone();
        let reused = pool_events
            .get_or_create(&EventLabel { event: "reused" })
            .clone();
        let new = pool_events
            .get_or_create(&EventLabel { event: "new" })
            .clone();
        let hot = HotSeries {
            upstream_2xx,
            reused,
            new,
        };
        let build_info: Family<BuildLabels, Gauge> = Family::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        let m = Metrics {
            route_responses: Family::default(),
            build_info,
            requests: Counter::default(),
            responses,
            latency: Histogram::new(exponential_buckets(0.0005, 2.0, 18)),
            downstream_open: Gauge::default(),
            pool_events,
            pool_idle: Gauge::default(),
            pool_stale_replays: Counter::default(),
            dns_lookups: Family::default(),
            dns_changes: Counter::default(),
            kube_events: Family::default(),
            kube_errors: Family::default(),
            kube_changes: Counter::default(),
            peer_ejections: Counter::default(),
            retries: Family::default(),
            retry_budget_exhausted: Counter::default(),
            panic_mode: Family::default(),
            degraded: Family::default(),
            degraded_alert: Family::default(),
            draining: Gauge::default(),
            timeouts: Family::default(),
            connections_refused: Counter::default(),
            access_log_dropped,
            upgraded: UpgradeMetrics::default(),
            registry: Registry::default(),
            hot,
        };

        r.register(
            "requests",
            "Requests received downstream",
            m.requests.clone(),
        );
        r.register(
            "responses",
            "Responses sent downstream by origin, class and cause",
            m.responses.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from request to response headers",
            m.latency.clone(),
        );
        r.register(
            "downstream_connections_open",
            "Open downstream connections",
            m.downstream_open.clone(),
        );
        r.register(
            "pool_connections",
            "Upstream connection events (new, reused, stale_discarded, expired, h2_refused_replay, evicted)",
            m.pool_events.clone(),
        );
        r.register(
            "pool_idle_connections",
            "Idle pooled upstream connections",
            m.pool_idle.clone(),
        );
        r.register(
            "pool_stale_replays",
            "Requests replayed on a fresh connection after a reused one was found closed",
            m.pool_stale_replays.clone(),
        );
        r.register(
            "dns_lookups",
            "DNS lookups by outcome",
            m.dns_lookups.clone(),
        );
        r.register(
            "dns_peer_set_changes",
            "Changes of a name's address set",
            m.dns_changes.clone(),
        );
        r.register(
            "peer_ejections",
            "Peers ejected by passive health",
            m.peer_ejections.clone(),
        );
        r.register("retries", "Retries by reason", m.retries.clone());
        r.register(
            "retry_budget_exhausted",
            "Retries refused by the retry budget",
            m.retry_budget_exhausted.clone(),
        );
        r.register(
            "group_panic_mode",
            "1 while a group routes to all peers of a tier (panic threshold)",
            m.panic_mode.clone(),
        );
        r.register(
            "group_degraded",
            "1 while an optional group has no usable peer",
            m.degraded.clone(),
        );
        r.register(
            "group_degraded_alert",
            "1 once an optional group has been degraded longer than degraded_alert_after",
            m.degraded_alert.clone(),
        );
        r.register(
            "draining",
            "1 while the process drains after SIGTERM",
            m.draining.clone(),
        );
        r.register(
            "route_responses",
            "Responses sent downstream by matched route, its group and status class",
            m.route_responses.clone(),
        );
        r.register(
            "build_info",
            "Always 1; the upkeep version is a label",
            m.build_info.clone(),
        );
        r.register(
            "panics",
            "Panics caught: in a request (answered 500 internal) or in a background task",
            crate::boundary::panics(),
        );
        r.register(
            "timeouts",
            "Connections and bodies cut by a timeout (header_read, client_body, send, read)",
            m.timeouts.clone(),
        );
        r.register(
            "downstream_connections_refused",
            "Downstream connections refused over max_connections (answered 503 overloaded or GOAWAY)",
            m.connections_refused.clone(),
        );
        r.register(
            "access_log_dropped",
            "Access-log lines dropped because the writer was too far behind",
            m.access_log_dropped.clone(),
        );
        m.upgraded.register(&mut r);
        kubernetes::register(&mut r, &m);
        Arc::new(Metrics { registry: r, ..m })
    }

    /// Removes every series labelled with group `name` (a reload removed the group), so
    /// `/metrics` never shows a group that no longer exists.
    pub fn forget_group(&self, name: &str) {
        let label = GroupLabel {
            group: name.to_owned(),
        };
        self.panic_mode.remove(&label);
        self.degraded.remove(&label);
        self.degraded_alert.remove(&label);
    }

    /// The registry's families in the OpenMetrics text format, with its `# EOF`.
    pub fn encode(&self) -> String {
        let mut out = self.encode_families();
        out.push_str("# EOF\n");
        out
    }

    /// The registry's families in the OpenMetrics text format, without the `# EOF`.
    fn encode_families(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode_registry(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }

    /// Counts a pool event.
    pub fn pool_event(&self, event: &'static str) {
        match event {
            "reused" => self.hot.reused.inc(),
            "new" => self.hot.new.inc(),
            _ => self.pool_events.get_or_create(&EventLabel { event }).inc(),
        };
    }

    /// Counts a response sent downstream for a matched route.
    pub fn route_response(&self, route: &crate::route::RouteName, class: &'static str) {
        self.route_responses
            .get_or_create(&RouteLabels {
                route: route.route.clone(),
                group: route.group.clone(),
                class,
            })
            .inc();
    }

    /// Counts a response sent downstream.
    pub fn response(&self, origin: &'static str, class: &'static str, cause: &'static str) {
        if origin == "upstream" && class == "2xx" && cause.is_empty() {
            self.hot.upstream_2xx.inc();
        } else {
            self.responses
                .get_or_create(&ResponseLabels {
                    origin,
                    class,
                    cause,
                })
                .inc();
        }
    }
}

/// Holds one unit of a gauge (an open connection, a waiter) until dropped, so a task that
/// panics or a future that is dropped can never leave the gauge high.
#[derive(Debug)]
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    /// Adds one to `gauge` until the guard is dropped.
    pub fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// `2xx`..`5xx` for a status.
pub fn class(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(m: &Metrics, series: &str) -> Option<f64> {
        m.encode()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    #[test]
    fn hot_series_count_in_the_exported_families() {
        let m = Metrics::new();
        m.response("upstream", "2xx", "");
        m.response("upstream", "2xx", "");
        m.response("proxy", "5xx", "connect_failed");
        m.pool_event("reused");
        m.pool_event("new");
        m.pool_event("expired");
        let r = "upkeep_responses_total";
        assert_eq!(
            value(
                &m,
                &format!("{r}{{origin=\"upstream\",class=\"2xx\",cause=\"\"}}")
            ),
            Some(2.0)
        );
        assert_eq!(
            value(
                &m,
                &format!("{r}{{origin=\"proxy\",class=\"5xx\",cause=\"connect_failed\"}}")
            ),
            Some(1.0)
        );
        for event in ["reused", "new", "expired"] {
            assert_eq!(
                value(
                    &m,
                    &format!("upkeep_pool_connections_total{{event=\"{event}\"}}")
                ),
                Some(1.0),
                "{event}"
            );
        }
    }
}
