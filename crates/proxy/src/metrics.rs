//! Prometheus metrics, named `upkeep_<subsystem>_<noun>_<unit|total>` with enum-valued labels.
//!
//! Labels stay bounded: `route` and `group` come from the config, `peer` only from the peers a
//! group has now (those families are read from the live peer set at scrape time, so a peer
//! that went away takes its series with it). See docs/observability.md.

mod exposition;
mod kubernetes;
mod peers;
mod sharded;
mod upgrade;

pub use exposition::{scrape, Format};
pub use peers::PeerStats;
pub(crate) use sharded::{claim as claim_shard, Cells, PerThread};
pub use sharded::{
    RouteFamily, RouteSeries, ShardedCounter, ShardedGauge, ShardedHistogram, SlotFamily,
};
pub use upgrade::UpgradeMetrics;

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
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

/// Serving thread label (`--workers`: 1 to N).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabel {
    /// The serving thread's number, as in its name `upkeep-worker-N`.
    pub worker: u32,
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

/// Status classes in the order of a class index (`(status / 100) - 1`).
pub(crate) const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// `origin` values of `upkeep_responses_total`.
const ORIGINS: [&str; 2] = ["upstream", "proxy"];

/// Cause codes (error.rs `Cause::as_str`), the empty cause first: the `cause` values of
/// `upkeep_responses_total` that have a per-thread slot. Any other value still counts, in a
/// shared series.
const CAUSES: [&str; 15] = [
    "",
    "no_route",
    "no_peers",
    "connect_failed",
    "upstream_reset",
    "upstream_timeout",
    "retry_budget",
    "overloaded",
    "bad_request",
    "header_too_large",
    "uri_too_long",
    "internal",
    "upstream_tls",
    "client_timeout",
    "body_too_large",
];

/// `event` values of `upkeep_pool_connections_total`, `new` and `reused` first.
const POOL_EVENTS: [&str; 6] = [
    "new",
    "reused",
    "stale_discarded",
    "expired",
    "h2_refused_replay",
    "evicted",
];

/// Every metric upkeep exports. The families every request updates (requests, responses,
/// latency, route responses, pool events, per-peer responses) are counted per serving
/// thread and summed when scraped (`sharded`); the rest are prometheus-client's.
pub struct Metrics {
    registry: Registry,
    /// Responses sent downstream per matched route.
    pub route_responses: RouteFamily,
    /// Always 1, with the version as a label.
    pub build_info: Family<BuildLabels, Gauge>,
    /// Requests received downstream.
    pub requests: ShardedCounter,
    /// Responses sent downstream.
    pub responses: SlotFamily<ResponseLabels>,
    /// Time to response headers.
    pub latency: ShardedHistogram,
    /// Open downstream connections.
    pub downstream_open: Gauge,
    /// Upstream connection events: new, reused, stale_discarded, expired, h2_refused_replay,
    /// evicted.
    pub pool_events: SlotFamily<EventLabel>,
    /// Idle pooled upstream connections.
    pub pool_idle: ShardedGauge,
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
    /// Open downstream connections per serving thread (two threads or more).
    pub worker_connections: Family<WorkerLabel, Gauge>,
    /// Downstream connections handed by the serving thread that accepted them to a less
    /// busy one.
    pub connections_moved: Counter,
    /// Access-log lines dropped because the writer was too far behind.
    pub access_log_dropped: Counter,
    /// Upgraded (WebSocket) connections.
    pub upgraded: UpgradeMetrics,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Arc<Self> {
        Self::with_access_log_dropped(Counter::default())
    }

    /// Like `new`, exporting the access logger's own drop counter (the logger starts first).
    pub fn with_access_log_dropped(access_log_dropped: Counter) -> Arc<Self> {
        let mut r = Registry::with_prefix("upkeep");
        let mut response_labels = Vec::new();
        for origin in ORIGINS {
            for class in CLASSES {
                for cause in CAUSES {
                    response_labels.push(ResponseLabels {
                        origin,
                        class,
                        cause,
                    });
                }
            }
        }
        // The series nearly every request counts are shown from the start, at zero.
        let responses = SlotFamily::new(response_labels, |l| {
            l.origin == "upstream" && l.class == "2xx" && l.cause.is_empty()
        });
        let pool_events = SlotFamily::new(
            POOL_EVENTS
                .iter()
                .map(|&event| EventLabel { event })
                .collect(),
            |l| matches!(l.event, "new" | "reused"),
        );
        let build_info: Family<BuildLabels, Gauge> = Family::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        let m = Metrics {
            route_responses: RouteFamily::default(),
            build_info,
            requests: ShardedCounter::default(),
            responses,
            latency: ShardedHistogram::new(exponential_buckets(0.0005, 2.0, 18)),
            downstream_open: Gauge::default(),
            pool_events,
            pool_idle: ShardedGauge::default(),
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
            worker_connections: Family::default(),
            connections_moved: Counter::default(),
            access_log_dropped,
            upgraded: UpgradeMetrics::default(),
            registry: Registry::default(),
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
            "worker_connections_open",
            "Open downstream connections per serving thread (--workers of 2 or more)",
            m.worker_connections.clone(),
        );
        r.register(
            "worker_connections_moved",
            "Downstream connections handed by the serving thread that accepted them to a less busy one",
            m.connections_moved.clone(),
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
    #[inline]
    pub fn pool_event(&self, event: &'static str) {
        match POOL_EVENTS.iter().position(|e| *e == event) {
            Some(slot) => self.pool_events.inc_slot(slot),
            None => self.pool_events.inc_other(&EventLabel { event }),
        }
    }

    /// The route series of `route` in `group`, counted per thread; route tables look it up
    /// once when built (`RouteTable::counted_in`).
    pub fn route_series(&self, route: &Arc<str>, group: &Arc<str>) -> RouteSeries {
        self.route_responses.series(route, group)
    }

    /// Counts a response sent downstream for a matched route.
    #[inline]
    pub fn route_response(&self, route: &crate::route::RouteName, class: &'static str) {
        match class_index(class) {
            Some(i) => route.series.inc(i),
            None => self.route_responses.inc_other(&RouteLabels {
                route: route.route.clone(),
                group: route.group.clone(),
                class,
            }),
        }
    }

    /// Counts a response sent downstream.
    #[inline]
    pub fn response(&self, origin: &'static str, class: &'static str, cause: &'static str) {
        match response_slot(origin, class, cause) {
            Some(slot) => self.responses.inc_slot(slot),
            None => self.responses.inc_other(&ResponseLabels {
                origin,
                class,
                cause,
            }),
        }
    }
}

/// The index of `1xx`..`5xx` in `CLASSES`.
#[inline]
fn class_index(class: &str) -> Option<usize> {
    match class.as_bytes() {
        [d @ b'1'..=b'5', b'x', b'x'] => Some(usize::from(d - b'1')),
        _ => None,
    }
}

/// The slot of a `responses` label set in the table `Metrics::with_access_log_dropped` builds
/// (origin, then class, then cause).
#[inline]
fn response_slot(origin: &str, class: &str, cause: &str) -> Option<usize> {
    let o = ORIGINS.iter().position(|o| *o == origin)?;
    let k = class_index(class)?;
    let c = if cause.is_empty() {
        0
    } else {
        CAUSES.iter().position(|c| *c == cause)?
    };
    Some((o * CLASSES.len() + k) * CAUSES.len() + c)
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
    CLASSES[class_of(status)]
}

/// The index in `CLASSES` of a status's class (below 200: `1xx`, from 500: `5xx`).
pub(crate) fn class_of(status: http::StatusCode) -> usize {
    (status.as_u16() / 100).clamp(1, 5) as usize - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::histogram::Histogram;

    /// The per-thread families encode exactly as the prometheus-client families they replace
    /// (same descriptors, series and values; a `Family` lists its series in hash order, so
    /// lines are compared sorted).
    #[test]
    fn per_thread_families_encode_as_prometheus_client_families() {
        let sharded = Metrics::new();
        let mut r = Registry::with_prefix("upkeep");
        let requests = Counter::<u64>::default();
        let responses: Family<ResponseLabels, Counter> = Family::default();
        let latency = Histogram::new(exponential_buckets(0.0005, 2.0, 18));
        let pool: Family<EventLabel, Counter> = Family::default();
        let routes: Family<RouteLabels, Counter> = Family::default();
        r.register("requests", "Requests received downstream", requests.clone());
        r.register(
            "responses",
            "Responses sent downstream by origin, class and cause",
            responses.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from request to response headers",
            latency.clone(),
        );
        r.register(
            "pool_connections",
            "Upstream connection events (new, reused, stale_discarded, expired, h2_refused_replay, evicted)",
            pool.clone(),
        );
        r.register(
            "route_responses",
            "Responses sent downstream by matched route, its group and status class",
            routes.clone(),
        );
        let name = crate::route::RouteName {
            route: "a.test/x".into(),
            group: "g".into(),
            series: RouteSeries::default(),
        };
        let name = crate::route::RouteName {
            series: sharded.route_series(&name.route, &name.group),
            ..name
        };
        // The series shown at zero from the start.
        let _ = responses.get_or_create(&ResponseLabels {
            origin: "upstream",
            class: "2xx",
            cause: "",
        });
        for event in ["new", "reused"] {
            let _ = pool.get_or_create(&EventLabel { event });
        }
        // Whole nanoseconds that are sums of powers of two, so that both sums are exact.
        let seconds = [0.001953125, 0.25, 0.5, 2.0, 1024.0, 0.0078125];
        let events = [
            "reused",
            "reused",
            "new",
            "expired",
            "made_up_event",
            "evicted",
        ];
        let answers = [
            ("upstream", "2xx", ""),
            ("upstream", "5xx", ""),
            ("proxy", "5xx", "connect_failed"),
            ("proxy", "3xx", ""),
            ("proxy", "5xx", "a_cause_without_a_slot"),
            ("upstream", "2xx", ""),
        ];
        for ((secs, event), (origin, class, cause)) in seconds.iter().zip(events).zip(answers) {
            requests.inc();
            sharded.requests.inc();
            latency.observe(*secs);
            sharded.latency.observe(*secs);
            pool.get_or_create(&EventLabel { event }).inc();
            sharded.pool_event(event);
            responses
                .get_or_create(&ResponseLabels {
                    origin,
                    class,
                    cause,
                })
                .inc();
            sharded.response(origin, class, cause);
            routes
                .get_or_create(&RouteLabels {
                    route: name.route.clone(),
                    group: name.group.clone(),
                    class,
                })
                .inc();
            sharded.route_response(&name, class);
        }
        let mut want = String::new();
        prometheus_client::encoding::text::encode_registry(&mut want, &r).unwrap();
        let got = sharded.encode();
        let families = [
            "upkeep_requests",
            "upkeep_responses",
            "upkeep_request_duration_seconds",
            "upkeep_pool_connections",
            "upkeep_route_responses",
        ];
        let pick = |text: &str| {
            let mut lines: Vec<String> = text
                .lines()
                .filter(|l| {
                    let name = l
                        .trim_start_matches("# HELP ")
                        .trim_start_matches("# TYPE ")
                        .split(['{', ' '])
                        .next()
                        .unwrap_or("");
                    families.iter().any(|f| {
                        name == *f
                            || name.strip_prefix(f).is_some_and(|s| {
                                ["_total", "_sum", "_count", "_bucket"].contains(&s)
                            })
                    })
                })
                .map(str::to_owned)
                .collect();
            lines.sort();
            lines
        };
        assert_eq!(pick(&got), pick(&want));
        // HELP and TYPE of 5 families, 1 request count, 5 response series, the histogram's
        // sum, count and 19 buckets, 5 pool events, 3 route series.
        assert_eq!(pick(&want).len(), 10 + 1 + 5 + 21 + 5 + 3);
    }

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
