//! Probe and drain rules for one workload.

use super::live;
use super::order::{same_ns, selects};
use super::yaml::Node;
use super::{pod_template, K8sError, Object};
use crate::finding::{Finding, Severity};
use std::time::Duration;

/// Kubernetes' defaults for probes.
const DEFAULT_TIMEOUT: f64 = 1.0;
const DEFAULT_PERIOD: f64 = 10.0;
/// Kubernetes' default `terminationGracePeriodSeconds`.
const DEFAULT_GRACE: f64 = 30.0;
/// Kinds whose pods serve requests for a long time behind a Service and so need a drain
/// (DaemonSets run node agents, Jobs run to completion).
const SERVING: &[&str] = &[
    "Deployment",
    "StatefulSet",
    "ReplicaSet",
    "ReplicationController",
    "Pod",
];
/// Ports that serve HTTP in the usual images, when neither port nor probe says so by name.
const HTTP_PORTS: &[f64] = &[
    80.0, 443.0, 3000.0, 5000.0, 8000.0, 8080.0, 8081.0, 8443.0, 8888.0,
];
/// Image names of datastores and brokers: clients reconnect, there is no HTTP request to cut.
const DATASTORES: &[&str] = &[
    "redis",
    "etcd",
    "postgres",
    "postgresql",
    "mysql",
    "mariadb",
    "mongo",
    "mongodb",
    "cassandra",
    "zookeeper",
    "kafka",
    "elasticsearch",
    "opensearch",
    "rabbitmq",
    "memcached",
    "consul",
    "nats",
    "couchdb",
    "cockroach",
    "cockroachdb",
    "valkey",
    "keydb",
    "rethinkdb",
    "influxdb",
    "clickhouse",
    "minio",
];
/// Image names of monitoring and log agents: scrapers retry, no client request is cut.
const AGENTS: &[&str] = &[
    "exporter",
    "kube-state-metrics",
    "prometheus",
    "alertmanager",
    "fluent",
    "otel",
    "opentelemetry-collector",
    "datadog",
    "grafana-agent",
    "alloy",
    "promtail",
    "telegraf",
    "metrics-server",
    "fluentd",
    "fluent-bit",
];
/// The opt-out: the container drains by itself on SIGTERM (keeps serving while the
/// endpoints update, then closes), so it needs no preStop sleep.
pub const DRAIN_ANNOTATION: &str = "upkeep/drain";
/// The value of [`DRAIN_ANNOTATION`] that opts out.
pub const DRAIN_ON_SIGTERM: &str = "on-sigterm";

struct Probe<'a> {
    node: &'a Node,
    path: Option<&'a Node>,
    port: Option<&'a str>,
    timeout: (f64, Option<&'a Node>),
    period: (f64, Option<&'a Node>),
}

fn probe(node: &Node) -> Probe<'_> {
    let http = node.get("httpGet");
    let num = |k: &str, d: f64| {
        let n = node.get(k);
        (n.and_then(Node::as_f64).unwrap_or(d), n)
    };
    Probe {
        node,
        path: http.and_then(|h| h.get("path")),
        port: http.and_then(|h| h.get("port")).and_then(Node::as_str),
        timeout: num("timeoutSeconds", DEFAULT_TIMEOUT),
        period: num("periodSeconds", DEFAULT_PERIOD),
    }
}

/// The probe's own port for a fix snippet, quoted when YAML would misread it.
fn yaml_port(port: Option<&str>) -> String {
    match port {
        Some(p) if p.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') => p.to_owned(),
        Some(p) => serde_json::Value::String(p.to_owned()).to_string(),
        None => "http".to_owned(),
    }
}

/// Whether a path reads like an aggregate health check rather than a bare liveness check.
pub fn looks_aggregate(path: &str) -> bool {
    let p = path
        .split('?')
        .next()
        .unwrap_or("")
        .trim_end_matches('/')
        .to_ascii_lowercase();
    let last = p.rsplit('/').next().unwrap_or("");
    matches!(
        last,
        "health" | "healthcheck" | "health-check" | "health_check" | "status" | "check"
    ) || p.ends_with("/actuator/health")
}

/// Runs the probe and drain rules on one object (workloads only).
pub fn check_object(
    o: &Object<'_>,
    live_base: Option<&str>,
    out: &mut Vec<Finding>,
) -> Result<(), K8sError> {
    let Some((_, spec)) = pod_template(o) else {
        return Ok(());
    };
    for c in spec.get("containers").map(Node::items).unwrap_or_default() {
        let cname = c.get("name").and_then(Node::as_str).unwrap_or("?");
        let who = format!(
            "container \"{cname}\" of {}{}",
            o.label(),
            o.from_template()
        );
        let liveness = c.get("livenessProbe").map(probe);
        let readiness = c.get("readinessProbe").map(probe);
        let startup = c.get("startupProbe").map(probe);
        same_endpoint(o, &who, liveness.as_ref(), readiness.as_ref(), out);
        if let Some(l) = &liveness {
            external_deps(o, &who, l, live_base, out)?;
            if startup.is_none() {
                initial_delay(o, &who, l, out);
            }
        }
        for (kind, p) in [
            ("liveness", &liveness),
            ("readiness", &readiness),
            ("startup", &startup),
        ] {
            if let Some(p) = p {
                timeout_ge_period(o, &who, kind, p, out);
            }
        }
    }
    Ok(())
}

/// Runs `no-drain` on every workload that serves HTTP behind a Service of the same input.
pub fn check_drain(objects: &[Object<'_>], out: &mut Vec<Finding>) {
    for o in objects {
        if !SERVING.contains(&o.kind()) {
            continue;
        }
        let Some((meta, spec)) = pod_template(o) else {
            continue;
        };
        let opted_out = [o.root.get("metadata"), meta].iter().flatten().any(|m| {
            m.path(&["annotations", DRAIN_ANNOTATION])
                .and_then(Node::as_str)
                == Some(DRAIN_ON_SIGTERM)
        });
        let labels = meta.and_then(|m| m.get("labels"));
        let behind_service = objects.iter().any(|svc| {
            svc.kind() == "Service"
                && same_ns(svc, o)
                && svc
                    .root
                    .path(&["spec", "selector"])
                    .is_some_and(|sel| selects(sel, labels))
        });
        if opted_out || !behind_service {
            continue;
        }
        let grace = spec.get("terminationGracePeriodSeconds");
        for c in spec.get("containers").map(Node::items).unwrap_or_default() {
            if !serves_http(c) {
                continue;
            }
            let cname = c.get("name").and_then(Node::as_str).unwrap_or("?");
            let who = format!(
                "container \"{cname}\" of {}{}",
                o.label(),
                o.from_template()
            );
            drain(o, &who, c, grace, out);
        }
    }
}

/// Whether a container serves HTTP: an httpGet probe, a port named for HTTP or gRPC, or a
/// usual HTTP port number (metrics ports aside); never a datastore or agent image.
fn serves_http(c: &Node) -> bool {
    let image = c.get("image").and_then(Node::as_str).unwrap_or("");
    let name = image
        .rsplit('/')
        .next()
        .unwrap_or("")
        .split([':', '@'])
        .next()
        .unwrap_or("");
    // Whole words of the image name, so "hotel" is not taken for "otel".
    let mut words = name.split(['-', '_', '.']);
    let known = |d: &&str| {
        if d.contains('-') {
            name.contains(*d)
        } else {
            name.split(['-', '_', '.']).any(|w| w == *d)
        }
    };
    if DATASTORES.iter().chain(AGENTS).any(known) || words.any(|w| w.ends_with("exporter")) {
        return false;
    }
    let http_probe = ["readinessProbe", "livenessProbe", "startupProbe"]
        .iter()
        .any(|p| c.path(&[*p, "httpGet"]).is_some());
    let http_port = c
        .get("ports")
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .any(|p| {
            let pname = p.get("name").and_then(Node::as_str).unwrap_or("");
            ["http", "web", "grpc", "h2c"]
                .iter()
                .any(|w| pname.starts_with(w))
                || p.get("containerPort")
                    .and_then(Node::as_f64)
                    .is_some_and(|n| HTTP_PORTS.contains(&n))
        });
    http_probe || http_port
}

fn same_endpoint(
    o: &Object<'_>,
    who: &str,
    l: Option<&Probe<'_>>,
    r: Option<&Probe<'_>>,
    out: &mut Vec<Finding>,
) {
    let (Some(l), Some(r)) = (l, r) else { return };
    let (Some(lp), Some(rp)) = (l.path, r.path) else {
        return;
    };
    if lp.as_str() != rp.as_str() || l.port != r.port {
        return;
    }
    let path = lp.as_str().unwrap_or("");
    out.push(Finding::new(
        "probe-same-endpoint",
        Severity::Warning,
        o.at(lp),
        format!("{who} uses {path} for both liveness and readiness."),
        "When that endpoint fails for a reason a restart cannot fix (a slow or down dependency), readiness pulls the pod from the load balancer and liveness restarts it, over and over: one optional search engine down made the whole service 503 and restarted healthy pods (docs/incidents.md#probe-cascade).",
        format!("livenessProbe:\n  httpGet: {{ path: /livez, port: {port} }}    # process alive, no external I/O\nreadinessProbe:\n  httpGet: {{ path: /readyz, port: {port} }}   # core dependencies only", port = yaml_port(l.port)),
    ));
}

fn external_deps(
    o: &Object<'_>,
    who: &str,
    l: &Probe<'_>,
    live_base: Option<&str>,
    out: &mut Vec<Finding>,
) -> Result<(), K8sError> {
    let Some(path_node) = l.path else {
        return Ok(());
    };
    let path = path_node.as_str().unwrap_or("");
    let fix = format!("livenessProbe:\n  httpGet: {{ path: /livez, port: {} }}   # answers from memory, no database, cache or search calls", yaml_port(l.port));
    if looks_aggregate(path) {
        out.push(Finding::new(
            "liveness-external-deps",
            Severity::Warning,
            o.at(path_node),
            format!("{who} points liveness at {path}, which reads like an aggregate health check of dependencies."),
            "A dependency that is slow or down fails liveness and Kubernetes restarts a process that was fine (after failureThreshold x period, 3 x 10 s by default), which cannot fix the dependency (docs/incidents.md#probe-cascade).",
            fix.clone(),
        ));
    }
    let Some(base) = live_base else { return Ok(()) };
    let m = live::fetch(
        base,
        path,
        Duration::from_secs_f64((l.timeout.0 * 3.0).clamp(2.0, 30.0)),
    )?;
    let secs = m.elapsed.as_secs_f64();
    let timeout = l.timeout.0;
    let url = format!("{}{}", base.trim_end_matches('/'), path);
    if secs >= timeout / 2.0 {
        let severity = if secs >= timeout {
            Severity::Error
        } else {
            Severity::Warning
        };
        out.push(
            Finding::new(
                "liveness-external-deps",
                severity,
                o.at(path_node),
                format!("{who}: {url} took {secs:.2} s against timeoutSeconds {timeout}."),
                "A liveness endpoint this slow fails or nearly fails on a busy moment, and each failure counts towards a restart.",
                fix.clone(),
            )
            .with_detail("measured_s", secs)
            .with_detail("timeout_s", timeout),
        );
    }
    if !m.dependencies.is_empty() {
        out.push(
            Finding::new(
                "liveness-external-deps",
                Severity::Warning,
                o.at(path_node),
                format!("{who}: {url} reports dependency checks ({}).", m.dependencies.join(", ")),
                "Liveness then fails when one of those is down, and the restart fixes nothing: one optional search engine took a whole service down this way (docs/incidents.md#probe-cascade).",
                fix,
            )
            .with_detail("dependencies", m.dependencies.clone()),
        );
    }
    Ok(())
}

fn initial_delay(o: &Object<'_>, who: &str, l: &Probe<'_>, out: &mut Vec<Finding>) {
    let Some(n) = l.node.get("initialDelaySeconds") else {
        return;
    };
    let Some(delay) = n.as_f64().filter(|d| *d > 0.0) else {
        return;
    };
    out.push(Finding::new(
        "initial-delay-without-startup-probe",
        Severity::Warning,
        o.at(n),
        format!("{who} guesses start-up time with liveness initialDelaySeconds: {delay} and has no startupProbe."),
        "A boot slower than the guess gets the pod killed before it is up (a restart loop); a faster one waits for nothing. A startupProbe holds liveness and readiness until boot is done.",
        format!("startupProbe:\n  httpGet: {{ path: /livez, port: {} }}\n  periodSeconds: 5\n  failureThreshold: 30   # up to 150 s of boot\n# and drop initialDelaySeconds from livenessProbe", yaml_port(l.port)),
    ));
}

fn timeout_ge_period(o: &Object<'_>, who: &str, kind: &str, p: &Probe<'_>, out: &mut Vec<Finding>) {
    let (timeout, tn) = p.timeout;
    let (period, pn) = p.period;
    if timeout < period {
        return;
    }
    let at = tn.or(pn).unwrap_or(p.node);
    out.push(Finding::new(
        "probe-timeout-ge-period",
        Severity::Warning,
        o.at(at),
        format!("{who}: {kind} probe timeoutSeconds {timeout} is not shorter than periodSeconds {period}."),
        "A slow check is still running when the next one is due, so one slow moment counts as several failures and the threshold is reached sooner than it reads.",
        format!("{kind}Probe:\n  periodSeconds: {}\n  timeoutSeconds: {}", period.max(timeout * 2.0), timeout),
    ));
}

/// Seconds of `sleep` a preStop hook waits, from `sleep: {seconds: N}` or `exec: sleep N`.
fn pre_stop_sleep(pre_stop: &Node) -> Option<f64> {
    if let Some(s) = pre_stop.path(&["sleep", "seconds"]).and_then(Node::as_f64) {
        return Some(s);
    }
    let cmd = pre_stop.path(&["exec", "command"])?;
    let words: Vec<&str> = cmd
        .items()
        .iter()
        .filter_map(Node::as_str)
        .flat_map(str::split_whitespace)
        .collect();
    let i = words.iter().position(|w| w.ends_with("sleep"))?;
    words.get(i + 1)?.trim_end_matches([';', 's']).parse().ok()
}

fn drain(o: &Object<'_>, who: &str, c: &Node, grace: Option<&Node>, out: &mut Vec<Finding>) {
    let grace_secs = grace.and_then(Node::as_f64).unwrap_or(DEFAULT_GRACE);
    match c.path(&["lifecycle", "preStop"]) {
        None => out.push(Finding::new(
            "no-drain",
            Severity::Warning,
            o.at(c.get("name").unwrap_or(c)),
            format!("{who} has no preStop hook, so SIGTERM arrives while load balancers still send it traffic."),
            "Endpoints are removed from kube-proxy and load balancers at the same moment the container is told to stop; requests routed in those seconds hit a process that is closing: 502/503s on every rollout.",
            "lifecycle:\n  preStop:\n    sleep: { seconds: 10 }   # Kubernetes 1.30+; before: exec: { command: [\"sleep\", \"10\"] }\n# and in the pod spec, terminationGracePeriodSeconds above 10 + the longest request;\n# or, when the server itself keeps serving for a while on SIGTERM, annotate the pod:\n# metadata: { annotations: { upkeep/drain: on-sigterm } }",
        )),
        Some(ps) => {
            let Some(sleep) = pre_stop_sleep(ps) else { return };
            if grace_secs > sleep {
                return;
            }
            out.push(Finding::new(
                "no-drain",
                Severity::Warning,
                o.at(grace.unwrap_or(ps)),
                format!("{who}: preStop sleeps {sleep} s but terminationGracePeriodSeconds is {grace_secs} s."),
                "The grace period counts the preStop time too, so the container is killed before it finishes in-flight requests.",
                format!("terminationGracePeriodSeconds: {}", (sleep + 30.0).ceil()),
            ));
        }
    }
}
