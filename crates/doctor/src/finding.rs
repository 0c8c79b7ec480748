//! What the doctor reports: findings with rule, severity, position, problem, consequence and fix.

mod json;
mod sarif;
mod text;

pub use json::render_json;
pub use sarif::render_sarif;
pub use text::render_text;

use serde::Serialize;
use std::fmt;

/// How bad a finding is; ordered so that `Info < Warning < Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; not a fault on its own.
    Info,
    /// A trap that turns a transient fault into errors.
    Warning,
    /// A trap already armed, or a setting that cannot work as written.
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

/// Where a finding points: a file (or URL) and, when known, a 1-based line and column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Location {
    /// File path as given on the command line (or the URL for live checks).
    pub file: String,
    /// 1-based line, when the finding has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// 1-based column, when the finding has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
}

impl Location {
    /// A location with line and column.
    pub fn at(file: impl Into<String>, line: u32, column: u32) -> Self {
        Location {
            file: file.into(),
            line: Some(line),
            column: Some(column),
        }
    }

    /// A location without a position inside it (a URL, a whole file).
    pub fn whole(file: impl Into<String>) -> Self {
        Location {
            file: file.into(),
            line: None,
            column: None,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(col) = self.column {
                write!(f, ":{col}")?;
            }
        }
        Ok(())
    }
}

/// One problem found, with everything a reader needs to act on it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// Stable rule id, e.g. `resolve-duplicate-host`.
    pub rule: &'static str,
    /// How bad it is.
    pub severity: Severity,
    /// Where the evidence is.
    pub location: Location,
    /// One sentence: what is wrong.
    pub problem: String,
    /// What it costs, with the measured figure where one exists.
    pub consequence: String,
    /// The fix, as a snippet to paste.
    pub fix: String,
    /// Rule-specific facts (episode times, measured values) for machines.
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub details: serde_json::Map<String, serde_json::Value>,
}

impl Finding {
    /// A finding with no extra details.
    pub fn new(
        rule: &'static str,
        severity: Severity,
        location: Location,
        problem: impl Into<String>,
        consequence: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Finding {
            rule,
            severity,
            location,
            problem: problem.into(),
            consequence: consequence.into(),
            fix: fix.into(),
            details: serde_json::Map::new(),
        }
    }

    /// Adds one machine-readable detail.
    pub fn with_detail(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.details.insert(key.to_owned(), value.into());
        self
    }
}

/// A rule the doctor knows: id, default severity and a one-line description (for SARIF).
#[derive(Debug, Clone, Copy)]
pub struct RuleInfo {
    /// Stable id.
    pub id: &'static str,
    /// One-line description of the trap.
    pub description: &'static str,
}

/// Every rule id the doctor can report, in a stable order.
pub const RULES: &[RuleInfo] = &[
    RuleInfo { id: "resolve-duplicate-host", description: "Two resolve lines for one host count as two peers: the single-peer guard is off and one failure ejects all." },
    RuleInfo { id: "resolve-single-name", description: "An upstream whose peers all come from one resolved name is emptied by one NXDOMAIN." },
    RuleInfo { id: "resolver-valid-long", description: "Resolver set-up that lengthens or causes outages: long valid=, resolve without resolver or zone." },
    RuleInfo { id: "zone-too-small", description: "The upstream's shared zone is small for the peers its resolve lines can add." },
    RuleInfo { id: "error-page-retry-shim", description: "An error_page 502 retry into the same upstream cannot help: the empty peer list is a state." },
    RuleInfo { id: "next-upstream-disabled", description: "proxy_next_upstream off where the upstream has several peers: no failover per request." },
    RuleInfo { id: "upstream-keepalive-incomplete", description: "Upstream keepalive without HTTP/1.1 and a cleared Connection header is never used." },
    RuleInfo { id: "include-missing", description: "An include names a file that is not there; the rest of the config is still checked." },
    RuleInfo { id: "upstream-keepalive-timeout-long", description: "Upstream keepalive_timeout longer than a typical backend keep-alive invites the reuse race." },
    RuleInfo { id: "nxdomain-outage", description: "NXDOMAIN emptied an upstream: no live upstreams until the next re-query." },
    RuleInfo { id: "nxdomain-no-outage", description: "A name answered NXDOMAIN and no no-live-upstreams followed in the log." },
    RuleInfo { id: "max-fails-amplification", description: "A few peer failures ejected every peer for fail_timeout although no new failure followed." },
    RuleInfo { id: "upstream-down", description: "Every peer kept failing through the no-live-upstreams span: the backend itself was down." },
    RuleInfo { id: "zone-memory-exhausted", description: "The upstream zone ran out of memory while adding resolved peers." },
    RuleInfo { id: "dns-timeout-harmless", description: "DNS timeouts or server failures alone: nginx kept the peers." },
    RuleInfo { id: "keepalive-race", description: "Upstream closed a reused keep-alive connection as nginx wrote to it." },
    RuleInfo { id: "no-live-upstreams", description: "No live upstreams with no cause in the same log." },
    RuleInfo { id: "probe-same-endpoint", description: "Liveness and readiness probes share one endpoint." },
    RuleInfo { id: "liveness-external-deps", description: "The liveness probe checks external dependencies." },
    RuleInfo { id: "initial-delay-without-startup-probe", description: "Liveness waits on an initialDelaySeconds guess instead of a startupProbe." },
    RuleInfo { id: "probe-timeout-ge-period", description: "A probe's timeout is not shorter than its period." },
    RuleInfo { id: "no-drain", description: "Pods stop without a drain: no preStop, or a grace period shorter than it." },
    RuleInfo { id: "keepalive-order", description: "The receiver's keep-alive does not outlast the reuser's idle timeout." },
];

/// Looks up a rule's description by id.
pub fn rule_info(id: &str) -> Option<&'static RuleInfo> {
    RULES.iter().find(|r| r.id == id)
}
