//! The demo's closing summary: totals per target, a legend for every column, and the headline
//! table with one line per incident class (docs/incidents.md) and a column per target.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::incidents::{IncidentClass, CLASSES};
use super::RunReport;

/// Targets in headline order: the peers first, upkeep last.
pub(crate) const TARGETS: [&str; 3] = ["nginx", "haproxy", "upkeep"];

/// What every column of the side-by-side table and of the headline means.
pub const LEGEND: &str = "\
columns:
  scenario    the catalog scenario (scenarios/NAME.toml, docs/lab.md)
  target      proxy and version; a substitute config pattern in parentheses
  reqs        requests the open-loop load sent
  errors      requests answered with a 5xx or not answered at all
  outage_s    longest outage: first to last error of the longest run of consecutive errors, s
  failover_s  from a fault's start to the last error put down to it, s (-: no fault)
  p99_ms      99th percentile latency, ms
  lag_p99_ms  how late the load generator sent requests against its schedule (p99), ms;
              at 1 ms or more the row gets a warning: it measured the generator too
  causes      errors by cause and when (during a fault, after it ended, ...); restarts and
              cuts: simulated kubelet restarts and readiness traffic cuts (probe scenarios)
";

/// The target's name with its version, from the label of a row that ran (`nginx 1.22.1`).
pub(crate) fn versioned(rows: &[RunReport], target: &str) -> String {
    let ran = rows.iter().find(|r| r.target == target && !r.skipped);
    match ran {
        Some(_) if target == "upkeep" => format!("upkeep {}", env!("CARGO_PKG_VERSION")),
        Some(r) => r.label.split(" (").next().unwrap_or(&r.label).to_owned(),
        None => target.to_owned(),
    }
}

/// Totals per target over every row.
pub fn totals(rows: &[RunReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<20} {:>8} {:>8} {:>9} {:>7}  longest outage",
        "totals per target", "rows run", "skipped", "requests", "errors"
    );
    for t in TARGETS {
        let mine: Vec<&RunReport> = rows.iter().filter(|r| r.target == t).collect();
        if mine.is_empty() {
            continue;
        }
        let ran: Vec<&&RunReport> = mine.iter().filter(|r| !r.skipped).collect();
        let worst = ran
            .iter()
            .max_by(|a, b| a.longest_outage_s.total_cmp(&b.longest_outage_s));
        let lagged = ran.iter().filter(|r| r.lagged()).count();
        let _ = writeln!(
            out,
            "{:<20} {:>8} {:>8} {:>9} {:>7}  {}{}",
            versioned(rows, t),
            ran.len(),
            mine.len() - ran.len(),
            ran.iter().map(|r| r.requests).sum::<u64>(),
            ran.iter().map(|r| r.errors).sum::<u64>(),
            worst.map_or("-".into(), |w| format!(
                "{:.2} s ({})",
                w.longest_outage_s, w.scenario
            )),
            if lagged > 0 {
                format!("; generator lagged in {lagged} rows")
            } else {
                String::new()
            }
        );
    }
    out
}

/// One headline cell: errors / longest outage over the class's rows of one target, the
/// config pattern, probe outcomes, and `!` when the generator lagged in any of them.
fn cell(rows: &[RunReport], class: &IncidentClass, target: &str) -> String {
    let mine: Vec<&RunReport> = rows
        .iter()
        .filter(|r| r.target == target && class.scenarios.contains(&r.scenario.as_str()))
        .collect();
    let ran: Vec<&&RunReport> = mine.iter().filter(|r| !r.skipped).collect();
    if ran.is_empty() {
        return match mine.first().and_then(|r| r.skip_reason.as_deref()) {
            Some(reason) => format!("not run: {}", reason.split(" (").next().unwrap_or(reason)),
            None => "-".into(),
        };
    }
    let errors: u64 = ran.iter().map(|r| r.errors).sum();
    let outage = ran.iter().map(|r| r.longest_outage_s).fold(0.0, f64::max);
    let mut text = format!("{errors} / {outage:.2} s");
    if ran.iter().any(|r| r.probe_restarts.is_some()) {
        let restarts: u64 = ran.iter().filter_map(|r| r.probe_restarts).sum();
        let cuts: u64 = ran.iter().filter_map(|r| r.probe_traffic_cuts).sum();
        let _ = write!(text, ", {restarts} restarts, {cuts} cuts");
    }
    let patterns: BTreeSet<&str> = ran
        .iter()
        .map(|r| r.pattern.as_str())
        .filter(|p| !p.is_empty())
        .collect();
    if !patterns.is_empty() {
        let _ = write!(
            text,
            " ({})",
            patterns.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    if ran.iter().any(|r| r.lagged()) {
        text.push_str(" !");
    }
    text
}

/// The headline: one line per incident class, errors / longest outage per target.
pub fn headline(rows: &[RunReport]) -> String {
    let targets: Vec<&str> = TARGETS
        .into_iter()
        .filter(|t| rows.iter().any(|r| r.target == *t))
        .collect();
    let mut lines: Vec<Vec<String>> = vec![std::iter::once("incident".to_owned())
        .chain(targets.iter().map(|t| versioned(rows, t)))
        .collect()];
    for class in CLASSES {
        if !rows
            .iter()
            .any(|r| class.scenarios.contains(&r.scenario.as_str()))
        {
            continue;
        }
        lines.push(
            std::iter::once(class.title.to_owned())
                .chain(targets.iter().map(|t| cell(rows, class, t)))
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..=targets.len())
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out =
        String::from("headline: errors / longest outage per incident class (docs/incidents.md)\n");
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", cells.join("   ").trim_end());
    }
    out.push_str(
        "  errors: requests answered with a 5xx or not at all; longest outage: first to last\n  error of the longest run of consecutive errors; (...): the config pattern the target ran;\n  restarts, cuts: simulated kubelet restarts and readiness traffic cuts\n",
    );
    if lines.iter().skip(1).flatten().any(|c| c.ends_with(" !")) {
        out.push_str(
            "  !: the load generator lagged 1 ms or more (p99) in a row behind this cell; see the warning under that row\n",
        );
    }
    out.push_str(
        "  for reference, nginx 1.28 with upstream `resolve` at 500 req/s (docs/incidents.md):\n  NXDOMAIN for 6 s: 3,005 errors / 6.0 s; two lines for one host, 2 s RST: 5,210 errors / 10.4 s\n",
    );
    out
}

#[cfg(test)]
mod tests;
