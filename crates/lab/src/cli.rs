//! `upkeep lab ...` and `upkeep demo`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;

use crate::backend::{Backend, DepState, Fault};
use crate::catalog::CATALOG;
use crate::control;
use crate::load::{self, LoadMode, LoadSpec, LoadStats};
use crate::report::{self, RunReport};
use crate::scenario::run::{run_one, RunOptions};
use crate::scenario::Scenario;
use crate::target::{Binaries, TargetKind};

/// Arguments of `upkeep lab`.
#[derive(Debug, clap::Args)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Debug, clap::Subcommand)]
enum LabCommand {
    /// Authoritative fake DNS (UDP and TCP) with per-name modes, switchable over HTTP.
    Dns(DnsArgs),
    /// Fake Kubernetes API server: EndpointSlice list and watch, faults switchable over HTTP.
    Kube(KubeArgs),
    /// An HTTP/1.1 backend whose faults switch at run time over HTTP.
    Backend(BackendArgs),
    /// Open-loop constant-rate load (no coordinated omission).
    Load(LoadArgs),
    /// Run scenarios against targets and report side by side.
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
struct DnsArgs {
    /// UDP and TCP address to answer on.
    #[arg(long)]
    listen: SocketAddr,
    /// Zone file (TOML).
    #[arg(long)]
    zone: PathBuf,
    /// HTTP control address: /queries, /mode?name=&mode=&addrs=, /ttl?name=&ttl=.
    #[arg(long)]
    control: Option<SocketAddr>,
}

#[derive(Debug, clap::Args)]
struct KubeArgs {
    /// Address the API server listens on (plain HTTP: a kubeconfig `server: http://ADDR`).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Answer 401 to API requests without `Authorization: Bearer TOKEN`.
    #[arg(long)]
    token: Option<String>,
    /// HTTP control address: /endpoints, /terminate, /empty, /delete, /fault, /cut, /gone.
    #[arg(long)]
    control: Option<SocketAddr>,
    /// A Service and its ready endpoints: `NAMESPACE/NAME=IP:PORT,IP:PORT` (repeat).
    #[arg(long, value_name = "NS/NAME=ADDRS")]
    service: Vec<String>,
    /// Interval of BOOKMARK events on watches that allow them.
    #[arg(long, value_parser = crate::duration::parse, default_value = "1s")]
    bookmark_every: std::time::Duration,
}

#[derive(Debug, clap::Args)]
struct BackendArgs {
    /// Address to listen on.
    #[arg(long)]
    listen: SocketAddr,
    /// Name put in bodies and the `x-backend` header.
    #[arg(long, default_value = "backend")]
    name: String,
    /// Starting fault: none, refuse, reset, stall, slow:DURATION, status:CODE.
    #[arg(long, default_value = "none")]
    fault: Fault,
    /// Close idle keep-alive connections after this long (Node: 5s; "6s" mimics its timing).
    #[arg(long, value_parser = parse_duration)]
    idle_close: Option<Duration>,
    /// Announce `Keep-Alive: timeout=N`.
    #[arg(long)]
    keepalive_hint: Option<u32>,
    /// HTTP control address: /fault?set=, /keepalive?idle_close=&hint=, /deps?core=&optional=.
    #[arg(long)]
    control: Option<SocketAddr>,
}

#[derive(Debug, clap::Args)]
struct LoadArgs {
    /// http://HOST:PORT/PATH
    url: String,
    /// Requests per second.
    #[arg(long, default_value_t = 500.0)]
    rate: f64,
    /// How long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// pooled, new-connection or pollers.
    #[arg(long, default_value = "pooled")]
    mode: String,
    /// Pollers (mode pollers).
    #[arg(long, default_value_t = 10)]
    pollers: usize,
    /// Shortest idle between a poller's requests.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    idle_min: Duration,
    /// Longest idle between a poller's requests.
    #[arg(long, default_value = "6s", value_parser = parse_duration)]
    idle_max: Duration,
    /// Request method.
    #[arg(long, default_value = "GET")]
    method: String,
    /// A header field sent with every request, `Name: value` (repeatable, as curl's -H).
    #[arg(long = "header", short = 'H', value_name = "NAME: VALUE", value_parser = parse_header)]
    headers: Vec<(http::header::HeaderName, http::header::HeaderValue)>,
    /// Per-request timeout.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    timeout: Duration,
    /// Write every request record as a JSON line here.
    #[arg(long)]
    records: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Scenario files.
    scenarios: Vec<PathBuf>,
    /// Run the built-in catalog.
    #[arg(long)]
    all: bool,
    /// Targets, comma-separated.
    #[arg(long, default_value = "upkeep,nginx,haproxy", value_delimiter = ',')]
    target: Vec<String>,
    /// table, json or markdown.
    #[arg(long, default_value = "table")]
    format: String,
    /// Where timelines (SVG) go.
    #[arg(long, default_value = "lab-out")]
    out: PathBuf,
    /// nginx binary (default: the installed one).
    #[arg(long)]
    nginx: Option<PathBuf>,
    /// HAProxy binary (default: the installed one).
    #[arg(long)]
    haproxy: Option<PathBuf>,
    /// Override every scenario's rate.
    #[arg(long)]
    rate: Option<f64>,
    /// Scenarios run at once (each runs its targets at once).
    #[arg(long, default_value_t = 1)]
    parallel: usize,
}

/// Arguments of `upkeep demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where timelines (SVG) go.
    #[arg(long, default_value = "lab-out")]
    out: PathBuf,
    /// table, json or markdown.
    #[arg(long, default_value = "table")]
    format: String,
    /// Requests per second for every scenario.
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    /// Scenarios run at once.
    #[arg(long, default_value_t = 2)]
    parallel: usize,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::duration::parse(s).map_err(|e| e.to_string())
}

/// `Name: value` (the value's surrounding spaces trimmed).
fn parse_header(s: &str) -> Result<(http::header::HeaderName, http::header::HeaderValue), String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected `Name: value`"))?;
    let name = http::header::HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|e| format!("{name:?}: {e}"))?;
    let value =
        http::header::HeaderValue::from_str(value.trim()).map_err(|e| format!("{value:?}: {e}"))?;
    Ok((name, value))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        // Requests are handed in from the scheduler thread through the global queue; looking
        // there more often than the default keeps the send lag down under load.
        .global_queue_interval(4)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Runs `upkeep lab ...`.
pub fn run(args: LabArgs) -> anyhow::Result<ExitCode> {
    let rt = runtime()?;
    match args.command {
        LabCommand::Dns(a) => rt.block_on(dns(a)),
        LabCommand::Kube(a) => rt.block_on(kube(a)),
        LabCommand::Backend(a) => rt.block_on(backend(a)),
        LabCommand::Load(a) => rt.block_on(load_cmd(a)),
        LabCommand::Run(a) => rt.block_on(run_cmd(a)),
    }
}

/// Runs `upkeep demo`.
pub fn run_demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let rt = runtime()?;
    rt.block_on(async {
        let scenarios = builtin()?;
        let bins = Binaries::discover(None, None);
        let kinds = [TargetKind::Upkeep, TargetKind::Nginx, TargetKind::Haproxy];
        eprintln!(
            "upkeep demo: {} scenarios x {} targets at {} req/s, {} at a time",
            scenarios.len(),
            kinds.len(),
            args.rate,
            args.parallel
        );
        let opts = RunOptions {
            bins,
            out_dir: Some(prepare_out(&args.out)?),
            rate: Some(args.rate),
            progress: false,
            loopback_net: None,
        };
        let rows = run_all(&scenarios, &kinds, &opts, args.parallel).await;
        print_rows(&rows, &args.format)?;
        if args.format == "table" {
            println!();
            print!("{}", report::headline::totals(&rows));
            println!();
            print!("{}", report::headline::LEGEND);
            println!();
            print!("{}", report::headline::headline(&rows));
        }
        match report::picture::write(&args.out, &rows) {
            Ok(w) => match w.png {
                Ok(png) => eprintln!("picture: {} and {}", png.display(), w.svg.display()),
                Err(e) => eprintln!("picture: {} (no PNG: {e})", w.svg.display()),
            },
            Err(e) => eprintln!("no picture: {e}"),
        }
        eprintln!("timelines per run: {}", args.out.display());
        Ok(ExitCode::SUCCESS)
    })
}

fn builtin() -> anyhow::Result<Vec<Scenario>> {
    CATALOG
        .iter()
        .map(|(file, text)| Scenario::parse(text, file).map_err(anyhow::Error::from))
        .collect()
}

fn prepare_out(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir.to_owned())
}

async fn wait_for_stop() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

async fn dns(a: DnsArgs) -> anyhow::Result<ExitCode> {
    let (dns, control) = crate::dns::start(a.listen, &a.zone, a.control).await?;
    eprintln!("fake DNS on {} (UDP and TCP)", dns.local_addr());
    if let Some(c) = control {
        eprintln!("control on http://{c}/ (/queries, /mode, /ttl)");
    }
    let mut rx = dns.subscribe();
    tokio::select! {
        _ = wait_for_stop() => {}
        _ = async {
            while let Ok(q) = rx.recv().await {
                println!("{}", crate::dns::query_line(&q));
            }
        } => {}
    }
    Ok(ExitCode::SUCCESS)
}

async fn kube(a: KubeArgs) -> anyhow::Result<ExitCode> {
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => Some(crate::kube::Security::tls_from_pem(c, k)?),
        _ => None,
    };
    let security = crate::kube::Security {
        tls,
        token: a.token.clone(),
    };
    let (kube, control) =
        crate::kube::start(a.listen, a.control, a.bookmark_every, security).await?;
    for spec in &a.service {
        let parsed = spec.split_once('=').and_then(|(svc, addrs)| {
            let (ns, name) = svc.split_once('/')?;
            let eps: Option<Vec<_>> = addrs
                .split(',')
                .filter(|x| !x.is_empty())
                .map(|x| x.parse().ok().map(crate::kube::Endpoint::ready))
                .collect();
            Some((ns, name, eps?))
        });
        let Some((ns, name, eps)) = parsed else {
            anyhow::bail!("--service {spec:?}: expected NAMESPACE/NAME=IP:PORT,IP:PORT");
        };
        kube.update(|s| s.set_endpoints(ns, name, "http", eps));
    }
    eprintln!("fake Kubernetes API server on {}", kube.url());
    if let Some(c) = control {
        eprintln!("control on http://{c}/ (/endpoints, /terminate, /empty, /delete, /fault, /cut, /gone, /requests)");
    }
    wait_for_stop().await;
    Ok(ExitCode::SUCCESS)
}

async fn backend(a: BackendArgs) -> anyhow::Result<ExitCode> {
    let b = Arc::new(Backend::start(a.listen, &a.name).await?);
    b.set_fault(a.fault);
    b.set_keepalive(a.idle_close, a.keepalive_hint);
    eprintln!("backend {} on {}", a.name, b.local_addr());
    if let Some(addr) = a.control {
        let bc = b.clone();
        let handler: control::Handler = Arc::new(move |path, q| backend_control(&bc, path, q));
        let c = control::serve(addr, handler).await?;
        eprintln!("control on http://{c}/ (/fault, /keepalive, /deps)");
    }
    wait_for_stop().await;
    Ok(ExitCode::SUCCESS)
}

fn backend_control(
    b: &Backend,
    path: &str,
    q: &std::collections::BTreeMap<String, String>,
) -> (u16, String) {
    match path {
        "/fault" => match q.get("set").map(|s| s.parse::<Fault>()) {
            Some(Ok(f)) => {
                b.set_fault(f.clone());
                (200, format!("fault {f}\n"))
            }
            Some(Err(e)) => (400, format!("{e}\n")),
            None => (200, format!("fault {}\n", b.fault())),
        },
        "/keepalive" => {
            let idle = match q.get("idle_close").map(|s| crate::duration::parse(s)) {
                Some(Ok(d)) => Some(d),
                Some(Err(e)) => return (400, format!("{e}\n")),
                None => None,
            };
            let hint = q.get("hint").and_then(|h| h.parse().ok());
            b.set_keepalive(idle, hint);
            (200, format!("idle_close {idle:?} hint {hint:?}\n"))
        }
        "/deps" => {
            let dep = |k: &str| q.get(k).map_or(Ok(DepState::Up), |v| v.parse::<DepState>());
            match (dep("core"), dep("optional")) {
                (Ok(c), Ok(o)) => {
                    b.set_deps(c, o);
                    (200, format!("core {c} optional {o}\n"))
                }
                (Err(e), _) | (_, Err(e)) => (400, format!("{e}\n")),
            }
        }
        _ => (
            404,
            "paths: /fault?set=, /keepalive?idle_close=&hint=, /deps?core=&optional=\n".into(),
        ),
    }
}

async fn load_cmd(a: LoadArgs) -> anyhow::Result<ExitCode> {
    let mode = match a.mode.as_str() {
        "pooled" => LoadMode::Pooled,
        "new-connection" => LoadMode::NewConnection,
        "pollers" => LoadMode::Pollers {
            count: a.pollers,
            idle_min: a.idle_min,
            idle_max: a.idle_max,
        },
        other => anyhow::bail!("unknown --mode {other:?}: pooled, new-connection or pollers"),
    };
    let spec = LoadSpec {
        url: a.url.parse().with_context(|| format!("URL {:?}", a.url))?,
        method: http::Method::from_bytes(a.method.as_bytes())
            .with_context(|| format!("method {:?}", a.method))?,
        rate: a.rate,
        duration: a.duration,
        mode,
        timeout: a.timeout,
        headers: a.headers,
    };
    let result = load::run(&spec, true).await?;
    if let Some(path) = &a.records {
        let mut text = String::new();
        for r in &result.records {
            text.push_str(&serde_json::to_string(r)?);
            text.push('\n');
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let stats = LoadStats::of(&result.records);
    if stats.behind_schedule() && !matches!(spec.mode, LoadMode::Pollers { .. }) {
        eprintln!(
            "warning: send lag p99 {:.3} ms: the generator fell behind its schedule (CPU shared with the target?); late requests started late, so lower the rate or give the generator a core",
            stats.lag_p99_ms
        );
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
    } else {
        println!(
            "requests {}  errors {}  latency p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  send lag p99 {:.3} ms  max {:.3} ms",
            stats.requests, stats.errors, stats.p50_ms, stats.p99_ms, stats.max_ms, stats.lag_p99_ms, stats.lag_max_ms
        );
        for (k, v) in report::by_status(&result.records) {
            println!("  {k}: {v}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_cmd(a: RunArgs) -> anyhow::Result<ExitCode> {
    let mut scenarios = if a.all { builtin()? } else { Vec::new() };
    for p in &a.scenarios {
        scenarios.push(Scenario::load(p)?);
    }
    if scenarios.is_empty() {
        anyhow::bail!("no scenario: give SCENARIO.toml files or --all");
    }
    let mut kinds = Vec::new();
    for t in &a.target {
        kinds.push(
            TargetKind::parse(t)
                .with_context(|| format!("unknown target {t:?}: upkeep, nginx or haproxy"))?,
        );
    }
    let opts = RunOptions {
        bins: Binaries::discover(a.nginx.clone(), a.haproxy.clone()),
        out_dir: Some(prepare_out(&a.out)?),
        rate: a.rate,
        progress: a.parallel <= 1 && kinds.len() == 1,
        loopback_net: None,
    };
    let rows = run_all(&scenarios, &kinds, &opts, a.parallel).await;
    print_rows(&rows, &a.format)?;
    if a.format == "table" {
        println!();
        print!("{}", report::headline::LEGEND);
        eprintln!("timelines: {}", a.out.display());
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_all(
    scenarios: &[Scenario],
    kinds: &[TargetKind],
    opts: &RunOptions,
    parallel: usize,
) -> Vec<RunReport> {
    let per_scenario = futures_util::stream::iter(scenarios.iter().map(|s| async move {
        let runs = kinds.iter().map(|k| run_one(s, *k, opts));
        let rows = futures_util::future::join_all(runs).await;
        for r in &rows {
            let status = if r.skipped {
                "skipped".to_owned()
            } else {
                format!("{} errors", r.errors)
            };
            eprintln!("  {} / {}: {status}", r.scenario, r.label);
        }
        rows
    }))
    .buffered(parallel.max(1))
    .collect::<Vec<_>>()
    .await;
    per_scenario.into_iter().flatten().collect()
}

fn print_rows(rows: &[RunReport], format: &str) -> anyhow::Result<()> {
    match format {
        "table" => print!("{}", report::table(rows)),
        "json" => println!("{}", report::json(rows)),
        "markdown" => print!("{}", report::markdown(rows)),
        other => anyhow::bail!("unknown --format {other:?}: table, json or markdown"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_argument_is_a_name_and_a_trimmed_value() {
        let (n, v) = parse_header("X-Probe:  a b ").unwrap();
        assert_eq!((n.as_str(), v.to_str().unwrap()), ("x-probe", "a b"));
        assert!(parse_header("no colon").is_err());
        assert!(parse_header("bad name: 1").is_err());
    }
}
