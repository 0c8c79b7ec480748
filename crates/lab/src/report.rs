//! Per scenario x target results: the figures, and their table, JSON, Markdown and SVG forms.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use crate::classify::Classified;
use crate::load::RequestRecord;
use crate::timeline::FaultEvent;

pub mod headline;
pub mod incidents;
pub mod picture;
pub mod svg;
#[cfg(test)]
mod synthetic;

/// The result of one scenario against one target (or why it was skipped).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunReport {
    /// Scenario name.
    pub scenario: String,
    /// `upkeep`, `nginx` or `haproxy`.
    pub target: String,
    /// Target label, naming a substitute pattern if one was used.
    pub label: String,
    /// The config pattern the target ran, in a few words (`upstream resolve`).
    pub pattern: String,
    /// Whether a correct proxy has an error-free path here.
    pub healthy_path: bool,
    /// How long the load ran, seconds.
    pub duration_s: f64,
    /// Responses per 100 ms: (2xx-4xx, 5xx, no response); drawn, not serialized.
    #[serde(skip)]
    pub buckets: Vec<(u32, u32, u32)>,
    /// Requests sent.
    pub requests: u64,
    /// Requests with no response or a 5xx.
    pub errors: u64,
    /// Errors by status (`refused`, `reset`, `timeout`... for no response).
    pub errors_by_status: BTreeMap<String, u64>,
    /// Errors by `cause (context)`.
    pub errors_by_cause: BTreeMap<String, u64>,
    /// First..last error of the longest run of consecutive errors, seconds.
    pub longest_outage_s: f64,
    /// From a fault's start to the last error put down to it, seconds (0: none).
    pub failover_s: Option<f64>,
    /// Median latency.
    pub p50_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
    /// Largest latency.
    pub max_ms: f64,
    /// 99th percentile send lag of the load generator.
    pub lag_p99_ms: f64,
    /// Faults as applied.
    pub faults: Vec<FaultEvent>,
    /// DNS queries the target made.
    pub dns_queries: u64,
    /// Simulated container restarts (liveness failures past threshold), probe scenarios.
    pub probe_restarts: Option<u64>,
    /// Times readiness went from ready to not ready (traffic cut), probe scenarios.
    pub probe_traffic_cuts: Option<u64>,
    /// Not run.
    pub skipped: bool,
    /// Why not.
    pub skip_reason: Option<String>,
    /// Where the timeline was written.
    pub timeline: Option<String>,
}

impl RunReport {
    /// A skipped row.
    pub fn skipped(scenario: &str, target: &str, reason: String) -> RunReport {
        RunReport {
            scenario: scenario.into(),
            target: target.into(),
            label: target.into(),
            skipped: true,
            skip_reason: Some(reason),
            ..RunReport::default()
        }
    }

    /// Whether the load generator fell behind its own schedule here (send-lag p99 at or above
    /// 1 ms), so that the row measured the generator's shortage of CPU as well as the target.
    pub fn lagged(&self) -> bool {
        !self.skipped && self.lag_p99_ms >= crate::load::LAG_P99_LIMIT_MS
    }

    /// Whether the row meets its scenario's bar (no errors, restarts or cuts on a healthy path).
    pub fn clean(&self) -> bool {
        self.errors == 0
            && self.probe_restarts.unwrap_or(0) == 0
            && self.probe_traffic_cuts.unwrap_or(0) == 0
    }
}

/// Rounds seconds to the millisecond, which is all the schedule resolves.
fn ms_round(s: f64) -> f64 {
    (s * 1000.0).round() / 1000.0
}

/// First..last error of the longest run of consecutive failed requests, in seconds.
pub fn longest_outage(records: &[RequestRecord]) -> f64 {
    let mut best = 0.0f64;
    let mut run_start: Option<f64> = None;
    for r in records {
        let t = r.scheduled.as_secs_f64();
        if r.is_error() {
            let start = *run_start.get_or_insert(t);
            best = best.max(t - start);
        } else {
            run_start = None;
        }
    }
    ms_round(best)
}

/// Errors by status, naming client-side failures by kind.
pub fn by_status(records: &[RequestRecord]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for r in records.iter().filter(|r| r.is_error()) {
        let key = match (r.status, r.error) {
            (Some(s), _) => s.to_string(),
            (None, Some(e)) => serde_json::to_value(e)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_else(|| "error".into()),
            (None, None) => "error".into(),
        };
        *out.entry(key).or_insert(0) += 1;
    }
    out
}

/// Longest time from a fault's start to the last error put down to it.
pub fn failover(classified: &[Classified], faults: &[FaultEvent]) -> Option<f64> {
    if faults.is_empty() {
        return None;
    }
    let mut worst = 0.0f64;
    for f in faults {
        let after = format!("after {} ended", f.label);
        for c in classified {
            let during = c
                .context
                .strip_prefix("during ")
                .is_some_and(|d| d.split(" + ").any(|l| l == f.label));
            if during || c.context == after {
                worst = worst.max(c.t_s - f.start_s);
            }
        }
    }
    Some(ms_round(worst))
}

fn outcome(r: &RunReport) -> String {
    if r.skipped {
        return format!("skipped: {}", r.skip_reason.as_deref().unwrap_or(""));
    }
    let mut parts = Vec::new();
    if let Some(n) = r.probe_restarts {
        parts.push(format!("restarts {n}"));
    }
    if let Some(n) = r.probe_traffic_cuts {
        parts.push(format!("cuts {n}"));
    }
    let causes: Vec<String> = r
        .errors_by_cause
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    parts.extend(causes);
    parts.join("; ")
}

/// The warning printed under a row whose load generator fell behind its schedule.
pub fn lag_warning(r: &RunReport) -> String {
    format!(
        "warning: the load generator ran {:.1} ms (p99) behind its schedule in this row, so its figures include the generator's own shortage of CPU; rerun with fewer --parallel or a lower --rate",
        r.lag_p99_ms
    )
}

/// The side-by-side terminal table; a row where the generator lagged gets a warning under it.
pub fn table(rows: &[RunReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:<48} {:>6} {:>6} {:>8} {:>10} {:>8} {:>10}  causes",
        "scenario", "target", "reqs", "errors", "outage_s", "failover_s", "p99_ms", "lag_p99_ms"
    );
    for r in rows {
        if r.skipped {
            let _ = writeln!(out, "{:<24} {:<48} {}", r.scenario, r.label, outcome(r));
            continue;
        }
        let _ = writeln!(
            out,
            "{:<24} {:<48} {:>6} {:>6} {:>8.2} {:>10} {:>8.1} {:>10.2}  {}",
            r.scenario,
            r.label,
            r.requests,
            r.errors,
            r.longest_outage_s,
            r.failover_s.map_or("-".into(), |f| format!("{f:.2}")),
            r.p99_ms,
            r.lag_p99_ms,
            outcome(r)
        );
        if r.lagged() {
            let _ = writeln!(out, "  {}", lag_warning(r));
        }
    }
    out
}

/// A Markdown table of the same rows.
pub fn markdown(rows: &[RunReport]) -> String {
    let mut out = String::from(
        "| scenario | target | requests | errors | longest outage (s) | failover (s) | p50 / p99 / max (ms) | causes |\n|---|---|---:|---:|---:|---:|---|---|\n",
    );
    for r in rows {
        if r.skipped {
            let _ = writeln!(
                out,
                "| {} | {} | | | | | | {} |",
                r.scenario,
                r.label,
                outcome(r)
            );
            continue;
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.2} | {} | {:.1} / {:.1} / {:.1} | {} |",
            r.scenario,
            r.label,
            r.requests,
            r.errors,
            r.longest_outage_s,
            r.failover_s.map_or("-".into(), |f| format!("{f:.2}")),
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            outcome(r)
        );
        if r.lagged() {
            let _ = writeln!(out, "| | {} | | | | | | |", lag_warning(r));
        }
    }
    out
}

/// One JSON object per scenario x target, as an array.
pub fn json(rows: &[RunReport]) -> String {
    serde_json::to_string_pretty(rows).unwrap_or_else(|_| "[]".into())
}

#[cfg(test)]
mod tests;
