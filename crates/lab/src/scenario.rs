//! Scenario files (`scenarios/*.toml`): backends, fake DNS names, what the target proxies to,
//! the load, the fault timeline and optional kubelet-like probes.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::backend::{DepState, Fault};
use crate::duration::serde_str;

pub mod probe;
pub mod run;

/// A scenario, as read from its file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, used in reports and file names.
    pub name: String,
    /// One line on what it shows and which incident (docs/incidents.md) it reproduces.
    pub description: String,
    /// How long the load runs.
    #[serde(with = "serde_str")]
    pub duration: Duration,
    /// Requests per second (open-loop modes).
    #[serde(default = "default_rate")]
    pub rate: f64,
    /// `pooled`, `new_connection` or `pollers`.
    #[serde(default)]
    pub mode: ModeSpec,
    /// Request method.
    #[serde(default = "default_method")]
    pub method: String,
    /// Request path.
    #[serde(default = "default_path")]
    pub path: String,
    /// Client timeout per request.
    #[serde(default = "default_timeout", with = "serde_str")]
    pub timeout: Duration,
    /// Pollers, for `mode = "pollers"`.
    pub pollers: Option<PollersSpec>,
    /// Whether a correct proxy has a path with no client errors (what the CI asserts).
    #[serde(default = "yes")]
    pub healthy_path: bool,
    /// The backends.
    #[serde(rename = "backend")]
    pub backends: Vec<BackendSpec>,
    /// Names served by the fake DNS.
    #[serde(default, rename = "dns_name")]
    pub dns_names: Vec<DnsNameSpec>,
    /// What the target proxies to.
    pub upstream: UpstreamSpec,
    /// The fault timeline.
    #[serde(default, rename = "fault")]
    pub faults: Vec<FaultSpec>,
    /// Kubelet-like probes against the target's admin endpoints.
    pub probes: Option<ProbesSpec>,
    /// A Service on the fake Kubernetes API server whose EndpointSlices the target watches.
    pub kubernetes: Option<KubeSpec>,
}

/// A Service on the fake Kubernetes API server (`upkeep lab kube`); the target's main group
/// discovers its peers from the Service's EndpointSlices.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeSpec {
    /// `namespace/name`.
    pub service: String,
    /// Backends that are ready endpoints at the start.
    pub backends: Vec<String>,
}

fn default_rate() -> f64 {
    200.0
}
fn default_method() -> String {
    "GET".into()
}
fn default_path() -> String {
    "/".into()
}
fn default_timeout() -> Duration {
    Duration::from_secs(3)
}
fn yes() -> bool {
    true
}

/// Connection use of the load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeSpec {
    /// Open loop over a pool of keep-alive connections.
    #[default]
    Pooled,
    /// Open loop, one connection per request.
    NewConnection,
    /// Keep-alive pollers with idle times.
    Pollers,
}

/// Keep-alive pollers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollersSpec {
    /// How many.
    pub count: usize,
    /// Shortest idle between a response and the next request.
    #[serde(with = "serde_str")]
    pub idle_min: Duration,
    /// Longest idle.
    #[serde(with = "serde_str")]
    pub idle_max: Duration,
}

/// One backend. All backends of a run share one port, each on its own loopback address,
/// so that a DNS answer (an IP) plus the upstream port reaches exactly one of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSpec {
    /// Name, also the body it answers.
    pub name: String,
    /// Loopback address (127.0.0.0/8).
    pub ip: Ipv4Addr,
    /// Close idle keep-alive connections after this long.
    #[serde(default, with = "serde_str::option")]
    pub idle_close: Option<Duration>,
    /// Announce `Keep-Alive: timeout=N`.
    pub keepalive_hint: Option<u32>,
}

/// One fake DNS name.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsNameSpec {
    /// Fully qualified name, e.g. `app.upkeep.test`.
    pub name: String,
    /// `fixed` or `alternate` (the starting mode; faults switch it).
    pub mode: String,
    /// Backends whose addresses the answers carry.
    #[serde(default)]
    pub backends: Vec<String>,
    /// TTL of the answers.
    #[serde(default = "default_ttl")]
    pub ttl: u32,
}

fn default_ttl() -> u32 {
    5
}

/// What the target proxies to.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSpec {
    /// Server lines of the main group: a backend name (static address) or a DNS name
    /// (none when a `[kubernetes]` Service gives the peers).
    #[serde(default)]
    pub servers: Vec<String>,
    /// Backends of an optional group (routed under `/search`), for the probe cascade.
    #[serde(default)]
    pub optional: Vec<String>,
}

/// One step of the fault timeline.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// When, from the start of the load.
    #[serde(default, with = "serde_str::option")]
    pub at: Option<Duration>,
    /// Or: wait (after `at`, if given) for the target's next query for this name...
    pub after_query: Option<String>,
    /// ...and then this long.
    #[serde(default, with = "serde_str::option")]
    pub delay: Option<Duration>,
    /// Undo the step after this long.
    #[serde(default, rename = "for", with = "serde_str::option")]
    pub lasts: Option<Duration>,
    /// Backend to switch.
    pub backend: Option<String>,
    /// Backend fault (`refuse`, `reset`, `stall`, `slow:200ms`, `status:503`).
    pub set: Option<String>,
    /// Backend dependency states, `core` and `optional`.
    pub core: Option<String>,
    /// See `core`.
    pub optional: Option<String>,
    /// DNS name to switch.
    pub dns: Option<String>,
    /// DNS mode (`fixed`, `alternate`, `nxdomain`, `nodata`, `servfail`, `refused`, `silent`).
    pub mode: Option<String>,
    /// Send this signal to the target: `stop` (its own graceful stop: SIGTERM to upkeep,
    /// SIGQUIT to nginx, SIGUSR1 to HAProxy), `reload` (the upstream timeout changed on
    /// disk, then the proxy's own reload), `upgrade` (the proxy's own binary upgrade), or
    /// `TERM`, `QUIT`, `INT`, `HUP`.
    pub signal: Option<String>,
    /// Fake Kubernetes API server step: `unreachable`, `5xx` (both undone by `for`), `cut`
    /// (watches end), `gone` (history compacted: resuming gets 410), `endpoints` (set the
    /// Service's `ready` and `terminating` backends), `empty`.
    pub kube: Option<String>,
    /// Backends that are ready endpoints after a `kube = "endpoints"` step.
    pub ready: Option<Vec<String>>,
    /// Backends that are terminating (serving) endpoints after a `kube = "endpoints"` step.
    pub terminating: Option<Vec<String>>,
}

/// The fake API server steps a `[[fault]]` may take.
pub const KUBE_STEPS: &[&str] = &["unreachable", "5xx", "cut", "gone", "endpoints", "empty"];

/// Kubelet-like probes with the incident's periods and thresholds (scaled by the file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbesSpec {
    /// Startup probe (`/startupz` on upkeep).
    pub startup: ProbeSpec,
    /// Liveness probe (`/livez`).
    pub liveness: ProbeSpec,
    /// Readiness probe (`/readyz`).
    pub readiness: ProbeSpec,
}

/// One probe.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSpec {
    /// Admin path.
    pub path: String,
    /// Period.
    #[serde(with = "serde_str")]
    pub period: Duration,
    /// Timeout.
    #[serde(with = "serde_str")]
    pub timeout: Duration,
    /// Consecutive failures that count.
    pub failure_threshold: u32,
}

/// A scenario that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read (the OS error is the source, printed once by the caller).
    #[error("reading scenario {path}")]
    Io {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// TOML syntax or an unknown/missing field (the message carries line and column).
    #[error("{path}: {message}")]
    Parse {
        /// File.
        path: String,
        /// Message with position.
        message: String,
    },
    /// A reference or value that does not fit.
    #[error("{path}: {message}")]
    Invalid {
        /// File.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Scenario::parse(&text, &path.display().to_string())
    }

    /// Parses and validates scenario text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            path: origin.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let problems = scenario.problems();
        if problems.is_empty() {
            Ok(scenario)
        } else {
            Err(ScenarioError::Invalid {
                path: origin.to_owned(),
                message: problems.join("; "),
            })
        }
    }

    /// Names in `upstream.servers` that are DNS names rather than backends.
    pub fn dns_servers(&self) -> Vec<&str> {
        self.upstream
            .servers
            .iter()
            .filter(|s| !self.backends.iter().any(|b| &b.name == *s))
            .map(String::as_str)
            .collect()
    }

    /// Whether the timeline reloads or upgrades the target (HAProxy then runs with its
    /// master process).
    pub fn reloads_or_upgrades(&self) -> bool {
        self.faults
            .iter()
            .any(|f| matches!(f.signal.as_deref(), Some("reload" | "upgrade")))
    }

    /// Whether the timeline signals the target.
    pub fn signals_target(&self) -> bool {
        self.faults.iter().any(|f| f.signal.is_some())
    }

    /// This scenario with every backend moved from `127.a.b.c` to `127.net.b.c`: runs in
    /// parallel on distinct nets share no address, so one run's backend that refuses (its
    /// port released) can never have that port taken by another run's backend.
    pub fn on_loopback_net(&self, net: u8) -> Scenario {
        let mut s = self.clone();
        for b in &mut s.backends {
            let [_, _, c, d] = b.ip.octets();
            b.ip = Ipv4Addr::new(127, net, c, d);
        }
        s
    }

    fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let backends: BTreeSet<&str> = self.backends.iter().map(|b| b.name.as_str()).collect();
        let names: BTreeSet<&str> = self.dns_names.iter().map(|n| n.name.as_str()).collect();
        if self.backends.is_empty() {
            out.push("at least one [[backend]] is needed".to_owned());
        }
        if !(self.rate > 0.0 && self.rate <= 100_000.0) {
            out.push(format!("rate {} is outside 0..=100000", self.rate));
        }
        if self.mode == ModeSpec::Pollers && self.pollers.is_none() {
            out.push("mode = \"pollers\" needs a [pollers] table".to_owned());
        }
        if http::Method::from_bytes(self.method.as_bytes()).is_err() {
            out.push(format!("method {:?} is not an HTTP method", self.method));
        }
        for b in &self.backends {
            if !b.ip.is_loopback() {
                out.push(format!("backend {} ip {} is not loopback", b.name, b.ip));
            }
        }
        for n in &self.dns_names {
            if !matches!(n.mode.as_str(), "fixed" | "alternate") {
                out.push(format!("dns_name {} starts in {:?}; use fixed or alternate and switch with a [[fault]]", n.name, n.mode));
            }
            for b in &n.backends {
                if !backends.contains(b.as_str()) {
                    out.push(format!("dns_name {} names unknown backend {b}", n.name));
                }
            }
        }
        match &self.kubernetes {
            None if self.upstream.servers.is_empty() => {
                out.push("upstream needs servers, or a [kubernetes] service".to_owned())
            }
            None => {}
            Some(k) => {
                if k.service
                    .split_once('/')
                    .is_none_or(|(ns, n)| ns.is_empty() || n.is_empty())
                {
                    out.push(format!(
                        "kubernetes service {:?} is not namespace/name",
                        k.service
                    ));
                }
                for b in &k.backends {
                    if !backends.contains(b.as_str()) {
                        out.push(format!("kubernetes names unknown backend {b}"));
                    }
                }
            }
        }
        for s in self.upstream.servers.iter().chain(&self.upstream.optional) {
            if !backends.contains(s.as_str()) && !names.contains(s.as_str()) {
                out.push(format!(
                    "upstream server {s} is neither a backend nor a dns_name"
                ));
            }
        }
        for (i, f) in self.faults.iter().enumerate() {
            let n = i + 1;
            if f.at.is_none() && f.after_query.is_none() {
                out.push(format!("fault #{n} needs `at` or `after_query`"));
            }
            if let Some(q) = &f.after_query {
                if !names.contains(q.as_str()) {
                    out.push(format!("fault #{n} waits for unknown dns_name {q}"));
                }
            }
            let kinds = [
                f.backend.is_some(),
                f.dns.is_some(),
                f.signal.is_some(),
                f.kube.is_some(),
            ];
            if kinds.iter().filter(|k| **k).count() != 1 {
                out.push(format!(
                    "fault #{n} needs exactly one of backend, dns, signal, kube"
                ));
            }
            if let Some(k) = &f.kube {
                if self.kubernetes.is_none() {
                    out.push(format!("fault #{n}: kube needs a [kubernetes] service"));
                }
                if !KUBE_STEPS.contains(&k.as_str()) {
                    out.push(format!(
                        "fault #{n}: unknown kube step {k:?} (one of {KUBE_STEPS:?})"
                    ));
                }
                for b in f.ready.iter().chain(&f.terminating).flatten() {
                    if !backends.contains(b.as_str()) {
                        out.push(format!("fault #{n} names unknown backend {b}"));
                    }
                }
            }
            if let Some(b) = &f.backend {
                if !backends.contains(b.as_str()) {
                    out.push(format!("fault #{n} names unknown backend {b}"));
                }
                if let Some(set) = &f.set {
                    if let Err(e) = set.parse::<Fault>() {
                        out.push(format!("fault #{n}: {e}"));
                    }
                }
                for dep in [&f.core, &f.optional].into_iter().flatten() {
                    if let Err(e) = dep.parse::<DepState>() {
                        out.push(format!("fault #{n}: {e}"));
                    }
                }
                if f.set.is_none() && f.core.is_none() && f.optional.is_none() {
                    out.push(format!(
                        "fault #{n} on a backend needs set, core or optional"
                    ));
                }
            }
            if let Some(d) = &f.dns {
                if !names.contains(d.as_str()) {
                    out.push(format!("fault #{n} names unknown dns_name {d}"));
                }
                match f.mode.as_deref() {
                    Some(m) if upkeep_fakedns::Mode::KEYWORDS.contains(&m) => {}
                    other => out.push(format!("fault #{n}: unknown dns mode {other:?}")),
                }
            }
            if let Some(s) = &f.signal {
                if !matches!(
                    s.as_str(),
                    "stop" | "reload" | "upgrade" | "TERM" | "QUIT" | "INT" | "HUP"
                ) {
                    out.push(format!("fault #{n}: unsupported signal {s}"));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
