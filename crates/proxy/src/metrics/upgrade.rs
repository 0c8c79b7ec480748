//! Metrics of upgraded connections (WebSocket and other `101 Switching Protocols` tunnels).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Direction of tunnelled bytes, named as the access log's `bytes_in` / `bytes_out`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    /// `in` (client to upstream) or `out` (upstream to client).
    pub direction: &'static str,
}

/// How an upgraded connection ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndLabel {
    /// `closed` (both sides closed), `idle_timeout`, `shutdown` or `error`.
    pub end: &'static str,
}

/// Upgraded connections: open now, ended by how, bytes by direction.
#[derive(Default)]
pub struct UpgradeMetrics {
    /// Upgraded connections open now.
    pub open: Gauge,
    /// Upgraded connections that ended, by how.
    pub ended: Family<EndLabel, Counter>,
    /// Bytes carried by upgraded connections, by direction.
    pub bytes: Family<DirectionLabel, Counter>,
}

impl UpgradeMetrics {
    /// Registers the families in `r` (the `upkeep_` registry).
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "upgraded_connections_open",
            "Upgraded connections (WebSocket, 101 Switching Protocols) open now",
            self.open.clone(),
        );
        r.register(
            "upgraded_connections",
            "Upgraded connections that ended, by how (closed, idle_timeout, shutdown, error)",
            self.ended.clone(),
        );
        r.register(
            "upgraded_bytes",
            "Bytes carried by upgraded connections (in: client to upstream, out: upstream to client)",
            self.bytes.clone(),
        );
    }

    /// The counter of one direction, looked up once per connection.
    pub fn bytes_of(&self, direction: &'static str) -> Counter {
        self.bytes
            .get_or_create(&DirectionLabel { direction })
            .clone()
    }

    /// Counts a connection that ended.
    pub fn ended(&self, end: &'static str) {
        self.ended.get_or_create(&EndLabel { end }).inc();
    }
}
