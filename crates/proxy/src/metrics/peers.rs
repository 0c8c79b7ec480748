//! Per-group and per-peer families, read from the live peer sets when scraped: a peer that a
//! DNS change or a reload removed takes its series with it, so the `peer` label stays bounded
//! by the peers that exist now.

use std::fmt::Write;
use std::sync::Arc;

use super::sharded::Cells;
use super::CLASSES;
use crate::upstream::Group;

/// Counters one peer carries for `/metrics`, kept per serving thread (`sharded`): slots 0-4
/// are responses by status class (`1xx` first), slot 5 the failed attempts counted against
/// the peer's health.
#[derive(Debug)]
pub struct PeerStats(Cells);

const FAILURES: usize = CLASSES.len();

impl Default for PeerStats {
    fn default() -> Self {
        Self(Cells::new(FAILURES + 1))
    }
}

impl PeerStats {
    /// Counts a response the peer sent.
    #[inline]
    pub fn response(&self, status: http::StatusCode) {
        self.0.add(super::class_of(status), 1);
    }

    /// Counts a failed attempt.
    pub fn failure(&self) {
        self.0.add(FAILURES, 1);
    }

    /// Responses of class index `class` (0: `1xx`), over every thread.
    fn responses(&self, class: usize) -> u64 {
        self.0.sum(class)
    }

    /// Failed attempts, over every thread.
    fn failures(&self) -> u64 {
        self.0.sum(FAILURES)
    }
}

/// A label value escaped for the text formats (both escape `\`, `"` and newline alike).
pub(super) struct Esc<'a>(pub(super) &'a str);

impl std::fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '"' => f.write_str("\\\"")?,
                '\n' => f.write_str("\\n")?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Appends the per-group and per-peer families, in OpenMetrics text, sorted by group.
pub(super) fn encode<'a>(
    out: &mut String,
    groups: impl Iterator<Item = (&'a String, &'a Arc<Group>)>,
) {
    let mut groups: Vec<_> = groups.collect();
    groups.sort_by(|a, b| a.0.cmp(b.0));
    let now = tokio::time::Instant::now();
    let mut peers = Vec::new();
    for (name, g) in &groups {
        for p in g.peers().all() {
            let state = p.view(now, 0).state;
            peers.push((Esc(name.as_str()), p.clone(), state));
        }
    }

    family(
        out,
        "group_peers",
        "gauge",
        "Peers of a group by state (healthy, ejected, down).",
    );
    for (name, _) in &groups {
        for state in ["healthy", "ejected", "down"] {
            let n = peers
                .iter()
                .filter(|(g, _, s)| g.0 == name.as_str() && *s == state)
                .count();
            let _ = writeln!(
                out,
                "upkeep_group_peers{{group=\"{}\",state=\"{state}\"}} {n}",
                Esc(name)
            );
        }
    }
    family(
        out,
        "peer_up",
        "gauge",
        "1 while a peer takes new requests, 0 while ejected or down by active checks.",
    );
    for (g, p, state) in &peers {
        let up = u8::from(*state == "healthy");
        let _ = writeln!(
            out,
            "upkeep_peer_up{{group=\"{g}\",peer=\"{}\"}} {up}",
            p.addr()
        );
    }
    family(
        out,
        "peer_requests_in_flight",
        "gauge",
        "Requests in flight to a peer.",
    );
    for (g, p, _) in &peers {
        let _ = writeln!(
            out,
            "upkeep_peer_requests_in_flight{{group=\"{g}\",peer=\"{}\"}} {}",
            p.addr(),
            p.active()
        );
    }
    family(
        out,
        "peer_responses",
        "counter",
        "Responses received from a peer by status class.",
    );
    for (g, p, _) in &peers {
        for (i, class) in CLASSES.iter().enumerate() {
            let _ = writeln!(
                out,
                "upkeep_peer_responses_total{{group=\"{g}\",peer=\"{}\",class=\"{class}\"}} {}",
                p.addr(),
                p.stats().responses(i)
            );
        }
    }
    family(
        out,
        "peer_failures",
        "counter",
        "Failed attempts counted against a peer's health.",
    );
    for (g, p, _) in &peers {
        let _ = writeln!(
            out,
            "upkeep_peer_failures_total{{group=\"{g}\",peer=\"{}\"}} {}",
            p.addr(),
            p.stats().failures()
        );
    }
}

pub(super) fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(
        out,
        "# HELP upkeep_{name} {help}\n# TYPE upkeep_{name} {kind}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(Esc("a\"b\\c\nd").to_string(), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn responses_count_by_class() {
        let s = PeerStats::default();
        for code in [101, 200, 204, 302, 404, 502, 503] {
            s.response(http::StatusCode::from_u16(code).unwrap());
        }
        s.failure();
        let counts: Vec<u64> = (0..CLASSES.len()).map(|i| s.responses(i)).collect();
        assert_eq!(counts, vec![1, 2, 1, 1, 2]);
        assert_eq!(s.failures(), 1);
    }
}
