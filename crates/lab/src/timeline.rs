//! The fault timeline: applies each step at its time (or aligned to the target's next DNS
//! query) and undoes it after its duration, recording when each fault really held.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use upkeep_fakedns::{FakeDns, Mode};

use crate::backend::{Backend, DepState, Fault};
use crate::scenario::{FaultSpec, Scenario};

/// A fault as it was applied, in seconds from the start of the load.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FaultEvent {
    /// What was done, e.g. `dc1 refuse` or `app.upkeep.test nxdomain`.
    pub label: String,
    /// When it took effect.
    pub start_s: f64,
    /// When it was undone (`None`: held to the end).
    pub end_s: Option<f64>,
}

/// Everything the timeline can act on.
#[derive(Clone)]
pub struct Handles {
    /// Backends by name.
    pub backends: BTreeMap<String, Arc<Backend>>,
    /// The fake DNS, if any.
    pub dns: Option<Arc<FakeDns>>,
    /// The target's PID, for signals.
    pub target_pid: Option<u32>,
    /// Which proxy the target is, for `signal = "stop"` (its own graceful stop).
    pub target_kind: Option<crate::target::TargetKind>,
    /// The target's reload and upgrade, for `signal = "reload"` and `"upgrade"`.
    pub target: Option<crate::target::Control>,
    /// The fake Kubernetes API server and the backends' port, if the scenario has a Service.
    pub kube: Option<(crate::kube::FakeKube, u16)>,
}

/// A running timeline.
pub struct Timeline {
    tasks: Vec<JoinHandle<()>>,
    events: Arc<Mutex<Vec<FaultEvent>>>,
}

/// The fake DNS mode named `mode` answering with `addrs`.
pub fn dns_mode(mode: &str, addrs: Vec<IpAddr>) -> Mode {
    // Scenario validation refuses unknown modes, so the fallback is never taken in a run.
    Mode::from_keyword(mode, addrs.clone()).unwrap_or(Mode::Fixed(addrs))
}

/// The addresses a scenario's DNS name answers with in its starting mode.
pub fn name_addrs(scenario: &Scenario, name: &str) -> Vec<IpAddr> {
    let Some(n) = scenario.dns_names.iter().find(|n| n.name == name) else {
        return Vec::new();
    };
    n.backends
        .iter()
        .filter_map(|b| scenario.backends.iter().find(|s| &s.name == b))
        .map(|b| IpAddr::V4(b.ip))
        .collect()
}

impl Timeline {
    /// Starts every step of `scenario`'s timeline relative to `t0`.
    pub fn start(scenario: &Scenario, handles: Handles, t0: Instant) -> Timeline {
        let events = Arc::new(Mutex::new(Vec::new()));
        let tasks = scenario
            .faults
            .iter()
            .map(|f| {
                let f = f.clone();
                let handles = handles.clone();
                let events = events.clone();
                let scenario = scenario.clone();
                tokio::spawn(async move { step(&scenario, &f, &handles, t0, &events).await })
            })
            .collect();
        Timeline { tasks, events }
    }

    /// Stops steps still waiting and returns what was applied, in start order.
    pub fn finish(self) -> Vec<FaultEvent> {
        for t in &self.tasks {
            t.abort();
        }
        let mut events = self
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        events.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        events
    }
}

async fn step(
    scenario: &Scenario,
    f: &FaultSpec,
    h: &Handles,
    t0: Instant,
    events: &Mutex<Vec<FaultEvent>>,
) {
    // Subscribe first so a query that lands while we sleep toward `at` is still seen.
    let mut queries = match (&f.after_query, &h.dns) {
        (Some(_), Some(dns)) => Some(dns.subscribe()),
        _ => None,
    };
    tokio::time::sleep_until(t0 + f.at.unwrap_or_default()).await;
    if let (Some(name), Some(rx)) = (&f.after_query, queries.as_mut()) {
        let not_before = std::time::SystemTime::now();
        loop {
            match rx.recv().await {
                Ok(q) if q.name == *name && q.at >= not_before => break,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            }
        }
        tokio::time::sleep(f.delay.unwrap_or_default()).await;
    }
    let start_s = t0.elapsed().as_secs_f64();
    // An upgrade waits (bounded) for the new process, to follow its pid.
    let label = match (f.signal.as_deref(), &h.target) {
        (Some("upgrade"), Some(t)) => t.upgrade().await,
        _ => apply(scenario, f, h, false),
    };
    let index = {
        let mut ev = events.lock().unwrap_or_else(|e| e.into_inner());
        ev.push(FaultEvent {
            label,
            start_s,
            end_s: None,
        });
        ev.len() - 1
    };
    if let Some(lasts) = f.lasts {
        tokio::time::sleep(lasts).await;
        apply(scenario, f, h, true);
        let end = t0.elapsed().as_secs_f64();
        events.lock().unwrap_or_else(|e| e.into_inner())[index].end_s = Some(end);
    }
}

/// Applies (or, with `undo`, reverts) one step; returns its label.
fn apply(scenario: &Scenario, f: &FaultSpec, h: &Handles, undo: bool) -> String {
    if let Some(name) = &f.backend {
        let mut label = name.clone();
        if let Some(b) = h.backends.get(name) {
            if let Some(set) = &f.set {
                let fault = if undo {
                    Fault::None
                } else {
                    set.parse().unwrap_or_default()
                };
                b.set_fault(fault);
                label.push_str(&format!(" {set}"));
            }
            if f.core.is_some() || f.optional.is_some() {
                let dep = |d: &Option<String>| {
                    if undo {
                        DepState::Up
                    } else {
                        d.as_deref()
                            .and_then(|d| d.parse().ok())
                            .unwrap_or_default()
                    }
                };
                b.set_deps(dep(&f.core), dep(&f.optional));
                label.push_str(" deps");
            }
        }
        return label;
    }
    if let (Some(name), Some(dns)) = (&f.dns, &h.dns) {
        let mode = f.mode.as_deref().unwrap_or("fixed");
        let addrs = name_addrs(scenario, name);
        let m = if undo {
            let start = scenario
                .dns_names
                .iter()
                .find(|n| &n.name == name)
                .map(|n| n.mode.as_str())
                .unwrap_or("fixed");
            dns_mode(start, addrs)
        } else {
            dns_mode(mode, addrs)
        };
        dns.set_mode(name, m);
        return format!("{name} {mode}");
    }
    if let (Some(step), Some((kube, port))) = (&f.kube, &h.kube) {
        return kube_step(scenario, f, step, kube, *port, undo);
    }
    if let Some(sig) = &f.signal {
        match (sig.as_str(), &h.target, undo) {
            ("reload", Some(t), false) => return t.reload(),
            ("reload" | "upgrade", _, _) => return format!("{sig} of target"),
            _ => {}
        }
        let s = match sig.as_str() {
            "stop" => h.target_kind.map_or(Signal::SIGTERM, |k| k.graceful_stop()),
            "QUIT" => Signal::SIGQUIT,
            "INT" => Signal::SIGINT,
            "HUP" => Signal::SIGHUP,
            _ => Signal::SIGTERM,
        };
        if !undo {
            if let Some(pid) = h.target_pid {
                let _ = kill(Pid::from_raw(pid as i32), s);
            }
        }
        return if sig == "stop" {
            format!("graceful stop ({s}) to target")
        } else {
            format!("{s} to target")
        };
    }
    "no-op".into()
}

#[cfg(test)]
mod tests;

/// The endpoints of `names` (backends) on the backends' port.
fn backend_addrs(scenario: &Scenario, names: &[String], port: u16) -> Vec<std::net::SocketAddr> {
    names
        .iter()
        .filter_map(|n| scenario.backends.iter().find(|b| &b.name == n))
        .map(|b| std::net::SocketAddr::new(IpAddr::V4(b.ip), port))
        .collect()
}

/// Sets the Service's endpoints: `ready` ones, then `terminating` (serving) ones.
pub fn kube_endpoints(
    scenario: &Scenario,
    kube: &crate::kube::FakeKube,
    port: u16,
    ready: &[String],
    terminating: &[String],
) {
    let Some((ns, name)) = scenario
        .kubernetes
        .as_ref()
        .and_then(|k| k.service.split_once('/'))
    else {
        return;
    };
    let eps = backend_addrs(scenario, ready, port)
        .into_iter()
        .map(crate::kube::Endpoint::ready)
        .chain(
            backend_addrs(scenario, terminating, port)
                .into_iter()
                .map(crate::kube::Endpoint::terminating),
        )
        .collect();
    kube.update(|s| s.set_endpoints(ns, name, "http", eps));
}

/// One fake API server step (or its undo); returns its label.
fn kube_step(
    scenario: &Scenario,
    f: &FaultSpec,
    step: &str,
    kube: &crate::kube::FakeKube,
    port: u16,
    undo: bool,
) -> String {
    use crate::kube::Fault as K;
    let start = scenario
        .kubernetes
        .as_ref()
        .map(|k| k.backends.clone())
        .unwrap_or_default();
    match (step, undo) {
        ("unreachable", false) => {
            let _ = kube.set_fault(K::Unreachable);
        }
        ("5xx", false) => {
            let _ = kube.set_fault(K::Error);
            // Open watches end, so every request after this one meets the fault.
            kube.cut();
        }
        ("unreachable" | "5xx", true) => {
            let _ = kube.set_fault(K::None);
        }
        ("cut", false) => kube.cut(),
        ("gone", false) => kube.gone(),
        ("endpoints", false) => kube_endpoints(
            scenario,
            kube,
            port,
            f.ready.as_deref().unwrap_or(&[]),
            f.terminating.as_deref().unwrap_or(&[]),
        ),
        ("empty", false) => kube_endpoints(scenario, kube, port, &[], &[]),
        ("endpoints" | "empty", true) => kube_endpoints(scenario, kube, port, &start, &[]),
        _ => {}
    }
    let mut label = format!("API server {step}");
    if step == "endpoints" {
        let list = |v: &Option<Vec<String>>| v.as_deref().unwrap_or(&[]).join(",");
        label = format!(
            "endpoints ready [{}] terminating [{}]",
            list(&f.ready),
            list(&f.terminating)
        );
    }
    label
}
