//! Runs one scenario against one target: backends, fake DNS, the target from its template,
//! warm-up, load and fault timeline together, then stop everything by handle and report.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use upkeep_fakedns::{FakeDns, Zone};

use super::probe::{http_get, Prober};
use super::{ModeSpec, Scenario};
use crate::backend::Backend;
use crate::classify::{self, DnsAnswer, LogLine};
use crate::load::{self, LoadMode, LoadSpec, LoadStats};
use crate::report::{self, RunReport};
use crate::target::{self, Binaries, Prepared, Rig, Running, TargetKind};
use crate::timeline::{self, Handles, Timeline};

/// How runs are carried out.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Target binaries.
    pub bins: Binaries,
    /// Where timelines (SVG) go; `None`: not drawn.
    pub out_dir: Option<PathBuf>,
    /// Override of the scenario's rate.
    pub rate: Option<f64>,
    /// Draw a progress bar on a terminal.
    pub progress: bool,
    /// Run on loopback net `127.N.0.0/16` (backends moved there, the target's listeners,
    /// fake DNS and API server on `127.N.0.1`) so that runs in parallel share no address;
    /// `None`: the scenario's own addresses and `127.0.0.1`.
    pub loopback_net: Option<u8>,
}

/// A rig that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Backends, DNS or temp dir.
    #[error("setting up {what}")]
    Setup {
        /// Which part.
        what: String,
        /// Cause.
        source: std::io::Error,
    },
}

fn setup(what: &str) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Setup {
        what: what.to_owned(),
        source,
    }
}

/// Backends of one run, all on one port.
async fn start_backends(
    scenario: &Scenario,
) -> Result<(u16, BTreeMap<String, Arc<Backend>>), RunError> {
    let mut last_err = None;
    'attempt: for _ in 0..20 {
        let mut port = 0;
        let mut map = BTreeMap::new();
        for spec in &scenario.backends {
            let addr = SocketAddr::new(IpAddr::V4(spec.ip), port);
            match Backend::start(addr, &spec.name).await {
                Ok(b) => {
                    port = b.local_addr().port();
                    b.set_keepalive(spec.idle_close, spec.keepalive_hint);
                    map.insert(spec.name.clone(), Arc::new(b));
                }
                Err(e) => {
                    // The port picked for the first backend is taken on another address: retry.
                    last_err = Some(e);
                    continue 'attempt;
                }
            }
        }
        return Ok((port, map));
    }
    Err(setup("backends")(
        last_err.unwrap_or_else(|| std::io::Error::other("no port")),
    ))
}

/// Runs `scenario` against `kind`.
pub async fn run_one(scenario: &Scenario, kind: TargetKind, opts: &RunOptions) -> RunReport {
    match run_inner(scenario, kind, opts).await {
        Ok(r) => r,
        Err(e) => {
            let cause = std::error::Error::source(&e).map_or(String::new(), |s| format!(": {s}"));
            RunReport::skipped(
                &scenario.name,
                kind.name(),
                format!("rig failed: {e}{cause}"),
            )
        }
    }
}

async fn run_inner(
    scenario: &Scenario,
    kind: TargetKind,
    opts: &RunOptions,
) -> Result<RunReport, RunError> {
    let moved;
    let (scenario, host) = match opts.loopback_net {
        Some(net) => {
            moved = scenario.on_loopback_net(net);
            (&moved, Ipv4Addr::new(127, net, 0, 1))
        }
        None => (scenario, Ipv4Addr::LOCALHOST),
    };
    let dir = tempfile::Builder::new()
        .prefix(&format!("upkeep-lab-{}-{}-", scenario.name, kind.name()))
        .tempdir()
        .map_err(setup("temp dir"))?;
    let (backend_port, backends) = start_backends(scenario).await?;
    let dns = if scenario.dns_names.is_empty() {
        None
    } else {
        let mut zone = Zone::new();
        for n in &scenario.dns_names {
            let mode = timeline::dns_mode(&n.mode, timeline::name_addrs(scenario, &n.name));
            zone = zone.with(&n.name, mode, n.ttl);
        }
        let d = FakeDns::start(SocketAddr::from((host, 0)), zone)
            .await
            .map_err(setup("fake DNS"))?;
        Some(Arc::new(d))
    };
    let kube = match &scenario.kubernetes {
        None => None,
        Some(k) => {
            let fake =
                crate::kube::FakeKube::start(SocketAddr::from((host, 0)), Duration::from_secs(1))
                    .await
                    .map_err(setup("fake Kubernetes API server"))?;
            timeline::kube_endpoints(scenario, &fake, backend_port, &k.backends, &[]);
            let path = dir.path().join("kubeconfig.yaml");
            std::fs::write(&path, crate::kube::kubeconfig(fake.local_addr()))
                .map_err(setup("kubeconfig"))?;
            Some((fake, path))
        }
    };
    let [listen, admin] = target::free_ports_on(host).map_err(setup("port"))?;
    let rig = Rig {
        listen: SocketAddr::from((host, listen)),
        admin: SocketAddr::from((host, admin)),
        backend_port,
        backend_ips: scenario
            .backends
            .iter()
            .map(|b| (b.name.clone(), b.ip))
            .collect(),
        dns: dns.as_ref().map(|d| d.local_addr()),
        kubeconfig: kube.as_ref().map(|(_, p)| p.clone()),
    };
    let prepared = target::prepare(kind, &opts.bins, scenario, &rig, dir.path());
    let (label, pattern, config) = match prepared {
        Prepared::Skip(reason) => {
            if let Some(d) = dns {
                shutdown_dns(d).await;
            }
            return Ok(RunReport::skipped(&scenario.name, kind.name(), reason));
        }
        Prepared::Ready {
            label,
            pattern,
            config,
        } => (label, pattern, config),
    };
    let running = match Running::start_with(
        kind,
        &opts.bins,
        label.clone(),
        &config,
        &rig,
        dir.path(),
        scenario.reloads_or_upgrades(),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => {
            if let Some(d) = dns {
                shutdown_dns(d).await;
            }
            let mut r = RunReport::skipped(&scenario.name, kind.name(), e.to_string());
            r.label = label;
            r.pattern = pattern;
            return Ok(r);
        }
    };
    // Warm up: the first discovery and connections happen before the clock starts.
    let warm_deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < warm_deadline {
        if http_get(rig.listen, &scenario.path, Duration::from_millis(500)).await == Some(200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spec = load_spec(scenario, &rig, opts);
    let t0 = Instant::now() + Duration::from_millis(20);
    let handles = Handles {
        backends: backends.clone(),
        dns: dns.clone(),
        target_pid: running.pid(),
        target_kind: Some(kind),
        target: running.control(),
        kube: kube.as_ref().map(|(k, _)| (k.clone(), backend_port)),
    };
    let timeline = Timeline::start(scenario, handles, t0);
    let prober = scenario.probes.clone().map(|p| Prober::start(rig.admin, p));
    let result = load::run_from(&spec, opts.progress, t0).await;
    let faults = timeline.finish();
    let probes = prober.map(Prober::finish);
    let logs = running.stop().await;
    for b in backends.values() {
        b.set_fault(crate::backend::Fault::None);
    }
    drop(backends);
    let result = match result {
        Ok(r) => r,
        Err(e) => {
            if let Some(d) = dns {
                shutdown_dns(d).await;
            }
            return Ok(RunReport::skipped(
                &scenario.name,
                kind.name(),
                e.to_string(),
            ));
        }
    };
    let started = classify::epoch_s(result.started);
    let queries = match dns {
        Some(d) => {
            let q = d.queries();
            shutdown_dns(d).await;
            q
        }
        None => Vec::new(),
    };
    // AAAA queries answer NODATA in every scenario (the backends are IPv4); only A tells.
    let answers: Vec<DnsAnswer> = queries
        .iter()
        .filter(|q| q.qtype == "A")
        .map(|q| DnsAnswer {
            t_s: classify::epoch_s(q.at) - started,
            name: q.name.clone(),
            answer: q.answer.clone(),
        })
        .filter(|a| a.t_s >= 0.0)
        .collect();
    let log_lines: Vec<LogLine> = match kind {
        TargetKind::Upkeep => Vec::new(),
        TargetKind::Nginx => {
            let mut l = classify::parse_nginx_access(&logs.access_log, "be");
            l.extend(classify::parse_nginx_error(&logs.error_log));
            l
        }
        TargetKind::Haproxy => classify::parse_haproxy(&logs.access_log),
    };
    let classified = classify::classify(
        &result.records,
        result.started,
        &log_lines,
        &faults,
        &answers,
    );
    let stats = LoadStats::of(&result.records);
    let duration_s = scenario.duration.as_secs_f64();
    let timeline_path = opts.out_dir.as_ref().and_then(|d| {
        let p = d.join(format!("{}-{}.svg", scenario.name, kind.name()));
        let title = format!("{} - {label}", scenario.name);
        let qs: Vec<f64> = answers.iter().map(|a| a.t_s).collect();
        match report::svg::write(&p, &title, &result.records, &faults, &qs, duration_s) {
            Ok(()) => Some(p.display().to_string()),
            Err(e) => {
                tracing::warn!(%e, "timeline not written");
                None
            }
        }
    });
    Ok(RunReport {
        scenario: scenario.name.clone(),
        target: kind.name().into(),
        label,
        pattern,
        healthy_path: scenario.healthy_path,
        duration_s,
        buckets: report::svg::buckets(&result.records, duration_s),
        requests: stats.requests,
        errors: stats.errors,
        errors_by_status: report::by_status(&result.records),
        errors_by_cause: classify::tally(&classified),
        longest_outage_s: report::longest_outage(&result.records),
        failover_s: report::failover(&classified, &faults),
        p50_ms: stats.p50_ms,
        p99_ms: stats.p99_ms,
        max_ms: stats.max_ms,
        lag_p99_ms: stats.lag_p99_ms,
        faults,
        dns_queries: answers.len() as u64,
        probe_restarts: probes.map(|p| p.restarts + u64::from(p.startup_failed)),
        probe_traffic_cuts: probes.map(|p| p.traffic_cuts),
        skipped: false,
        skip_reason: None,
        timeline: timeline_path,
    })
}

fn load_spec(scenario: &Scenario, rig: &Rig, opts: &RunOptions) -> LoadSpec {
    let mode = match (scenario.mode, &scenario.pollers) {
        (ModeSpec::Pollers, Some(p)) => LoadMode::Pollers {
            count: p.count,
            idle_min: p.idle_min,
            idle_max: p.idle_max,
        },
        (ModeSpec::NewConnection, _) => LoadMode::NewConnection,
        _ => LoadMode::Pooled,
    };
    LoadSpec {
        url: format!("http://{}{}", rig.listen, scenario.path)
            .parse()
            .unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1/")),
        method: http::Method::from_bytes(scenario.method.as_bytes()).unwrap_or(http::Method::GET),
        rate: opts.rate.unwrap_or(scenario.rate),
        duration: scenario.duration,
        mode,
        timeout: scenario.timeout,
        headers: Vec::new(),
    }
}

/// Shuts the fake DNS down once the aborted timeline tasks have let go of it.
async fn shutdown_dns(mut dns: Arc<FakeDns>) {
    for _ in 0..100 {
        match Arc::try_unwrap(dns) {
            Ok(d) => return d.shutdown().await,
            Err(shared) => dns = shared,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tracing::warn!("fake DNS still shared after the run; left to the runtime");
}
