//! `keepalive-order`: the hop that reuses connections (a load balancer) must give up on an
//! idle connection before the app that receives them closes it.

use super::yaml::Node;
use super::{pod_template, Object};
use crate::finding::{Finding, Severity};

/// AWS ALB's default idle timeout, used for an ALB Ingress that does not set one.
const ALB_DEFAULT_IDLE: f64 = 60.0;
const ALB_ATTRS: &str = "alb.ingress.kubernetes.io/load-balancer-attributes";
const ELB_IDLE: &str = "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout";

/// A reusing hop in front of services.
struct Lb<'a> {
    obj: Object<'a>,
    idle: f64,
    evidence: &'a Node,
    what: String,
    services: Vec<&'a str>,
}

/// An app's own keep-alive, as configured.
struct AppIdle<'a> {
    secs: f64,
    node: &'a Node,
    how: String,
    /// `command` or `args`, when read from a flag there.
    list: Option<&'static str>,
}

/// The container's `command` or `args` list as written, with the keep-alive flag's value
/// set to `want`, as a YAML flow sequence.
fn list_with_value(c: &Node, list: &str, flag: &str, want: f64) -> String {
    let items = c.get(list).map(Node::items).unwrap_or_default();
    let mut words: Vec<String> = Vec::new();
    let mut replace_next = false;
    for item in items {
        let w = item.as_str().unwrap_or("");
        let out = if replace_next {
            replace_next = false;
            format!("{want}")
        } else if w == flag {
            replace_next = true;
            w.to_owned()
        } else if w.starts_with(&format!("{flag}=")) {
            format!("{flag}={want}")
        } else {
            w.to_owned()
        };
        words.push(serde_json::Value::String(out).to_string());
    }
    format!("{list}: [{}]", words.join(", "))
}

fn annotation<'a>(o: &Object<'a>, key: &str) -> Option<&'a Node> {
    o.root.path(&["metadata", "annotations"])?.get(key)
}

pub(super) fn same_ns(a: &Object<'_>, b: &Object<'_>) -> bool {
    a.namespace().unwrap_or("default") == b.namespace().unwrap_or("default")
}

fn lbs<'a>(objects: &[Object<'a>]) -> Vec<Lb<'a>> {
    let mut out = Vec::new();
    for o in objects {
        match o.kind() {
            "Ingress" => {
                let attrs = annotation(o, ALB_ATTRS);
                let idle = attrs.and_then(Node::as_str).and_then(|v| {
                    v.split(',')
                        .filter_map(|kv| kv.trim().strip_prefix("idle_timeout.timeout_seconds="))
                        .find_map(|s| s.trim().parse::<f64>().ok())
                });
                let class = annotation(o, "kubernetes.io/ingress.class")
                    .or_else(|| o.root.path(&["spec", "ingressClassName"]));
                let is_alb = class.and_then(Node::as_str) == Some("alb") || attrs.is_some();
                let (idle, evidence, what) = match (idle, attrs, class) {
                    (Some(i), Some(n), _) => (i, n, format!("ALB idle timeout {i} s")),
                    (None, _, Some(c)) if is_alb => (
                        ALB_DEFAULT_IDLE,
                        c,
                        format!("ALB default idle timeout {ALB_DEFAULT_IDLE} s"),
                    ),
                    _ => continue,
                };
                let mut services = Vec::new();
                let mut backend = |b: Option<&'a Node>| {
                    if let Some(name) = b
                        .and_then(|b| {
                            b.path(&["service", "name"])
                                .or_else(|| b.get("serviceName"))
                        })
                        .and_then(Node::as_str)
                    {
                        services.push(name);
                    }
                };
                backend(o.root.path(&["spec", "defaultBackend"]));
                backend(o.root.path(&["spec", "backend"]));
                for rule in o
                    .root
                    .path(&["spec", "rules"])
                    .map(Node::items)
                    .unwrap_or_default()
                {
                    for p in rule
                        .path(&["http", "paths"])
                        .map(Node::items)
                        .unwrap_or_default()
                    {
                        backend(p.get("backend"));
                    }
                }
                out.push(Lb {
                    obj: *o,
                    idle,
                    evidence,
                    what,
                    services,
                });
            }
            "Service" => {
                let Some(n) = annotation(o, ELB_IDLE) else {
                    continue;
                };
                let Some(idle) = n.as_f64() else { continue };
                out.push(Lb {
                    obj: *o,
                    idle,
                    evidence: n,
                    what: format!("load balancer idle timeout {idle} s"),
                    services: vec![o.name()],
                });
            }
            _ => {}
        }
    }
    out
}

/// The app's keep-alive from env (`KEEP_ALIVE_TIMEOUT`, milliseconds, as Next.js reads it)
/// or from server flags (uvicorn `--timeout-keep-alive`, gunicorn `--keep-alive`, seconds).
fn app_idle(c: &Node) -> Option<AppIdle<'_>> {
    for e in c.get("env").map(Node::items).unwrap_or_default() {
        if e.get("name").and_then(Node::as_str) == Some("KEEP_ALIVE_TIMEOUT") {
            let v = e.get("value")?;
            return Some(AppIdle {
                secs: v.as_f64()? / 1000.0,
                node: v,
                how: "KEEP_ALIVE_TIMEOUT (ms)".to_owned(),
                list: None,
            });
        }
    }
    let words: Vec<(&'static str, &Node)> = ["command", "args"]
        .iter()
        .flat_map(|k| {
            c.get(k)
                .map(Node::items)
                .unwrap_or_default()
                .iter()
                .map(move |n| (*k, n))
        })
        .collect();
    for (i, (list, w)) in words.iter().enumerate() {
        let Some(s) = w.as_str() else { continue };
        for flag in ["--timeout-keep-alive", "--keep-alive", "--keepalive"] {
            let value = if let Some(v) = s.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
                Some(v.to_owned())
            } else if s == flag {
                words
                    .get(i + 1)
                    .and_then(|(_, n)| n.as_str())
                    .map(str::to_owned)
            } else {
                None
            };
            if let Some(secs) = value.and_then(|v| v.parse::<f64>().ok()) {
                return Some(AppIdle {
                    secs,
                    node: w,
                    how: flag.to_owned(),
                    list: Some(*list),
                });
            }
        }
    }
    None
}

pub(super) fn selects(selector: &Node, labels: Option<&Node>) -> bool {
    let pairs = selector.entries();
    !pairs.is_empty()
        && pairs.iter().all(|(k, v)| {
            labels
                .and_then(|l| l.get(k.as_str().unwrap_or("")))
                .and_then(Node::as_str)
                == v.as_str()
        })
}

/// Runs `keepalive-order` across all objects.
pub fn check(objects: &[Object<'_>], out: &mut Vec<Finding>) {
    for lb in lbs(objects) {
        for svc in objects.iter().filter(|o| {
            o.kind() == "Service" && lb.services.contains(&o.name()) && same_ns(o, &lb.obj)
        }) {
            let Some(selector) = svc.root.path(&["spec", "selector"]) else {
                continue;
            };
            for w in objects.iter().filter(|w| same_ns(w, svc)) {
                let Some((meta, spec)) = pod_template(w) else {
                    continue;
                };
                if !selects(selector, meta.and_then(|m| m.get("labels"))) {
                    continue;
                }
                for c in spec.get("containers").map(Node::items).unwrap_or_default() {
                    let Some(app) = app_idle(c) else { continue };
                    let margin = (lb.idle * 0.1).max(5.0);
                    if app.secs >= lb.idle + margin {
                        continue;
                    }
                    let severity = if app.secs <= lb.idle {
                        Severity::Error
                    } else {
                        Severity::Warning
                    };
                    let cname = c.get("name").and_then(Node::as_str).unwrap_or("?");
                    let want = (lb.idle + margin).max(lb.idle * 1.2).ceil();
                    out.push(
                        Finding::new(
                            "keepalive-order",
                            severity,
                            w.at(app.node),
                            format!(
                                "container \"{cname}\" of {}{} keeps idle connections {} s ({}), not longer than the {} of {} ({}:{}) by a margin.",
                                w.label(), w.from_template(), app.secs, app.how, lb.what, lb.obj.label(), lb.obj.file, lb.evidence.line
                            ),
                            "The app closes an idle connection while the load balancer still believes it good and writes the next request into it: random 502s, every one on a reused connection. The side that decides reuse must close first (load balancer 300 s -> app 360 s; 305 s is too tight).",
                            match app.list {
                                None => format!("env:\n  - name: KEEP_ALIVE_TIMEOUT\n    value: \"{}\"   # ms, above the balancer's {} s", want as u64 * 1000, lb.idle),
                                Some(list) => format!("{}   # {} in s, above the balancer's {} s", list_with_value(c, list, &app.how, want), app.how, lb.idle),
                            },
                        )
                        .with_detail("lb_idle_s", lb.idle)
                        .with_detail("app_keepalive_s", app.secs),
                    );
                }
            }
        }
    }
}
