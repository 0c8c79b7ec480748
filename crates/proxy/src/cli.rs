//! `upkeep serve`, `upkeep check`, `upkeep reload`, `upkeep upgrade`.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::config::{self, Config};

/// Arguments of `upkeep serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Config file (TOML). Without it, the quick-start flags below build the config.
    #[arg(long, short = 'c', value_name = "FILE", conflicts_with_all = ["listen", "to", "dns_server"])]
    pub config: Option<PathBuf>,
    /// Quick start: address to listen on.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Quick start: upstream `http://HOST:PORT` (repeat for several peers of one group).
    #[arg(long, value_name = "URL")]
    pub to: Vec<String>,
    /// Admin listener (probes, metrics, /upstreams, /reload).
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
    /// Quick start: send DNS lookups to this server (UDP and TCP) instead of the system's.
    #[arg(long, value_name = "IP:PORT")]
    pub dns_server: Vec<SocketAddr>,
    /// Access log: `-` (stdout), `off`, or a file path.
    #[arg(long, value_name = "DEST")]
    pub access_log: Option<String>,
    /// Access-log line format: `json` (one object a line) or `combined` (nginx's, then
    /// `$upstream_status`). Overrides the config's `access_log_format`.
    #[arg(long, value_name = "FORMAT", value_parser = ["json", "combined"])]
    pub access_log_format: Option<String>,
    /// Serving threads, each with its own single-threaded runtime and its own copy of every
    /// listener (SO_REUSEPORT); a thread that accepts more than its share of connections
    /// hands new ones to the least busy. Default: one per CPU.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Which CPU each serving thread runs on: `auto` holds one thread to each CPU this process
    /// may run on when there are as many threads as CPUs (otherwise none); `off` leaves them
    /// to the scheduler; a list (`0,2,4-7`) names one CPU per thread.
    #[arg(long, value_name = "auto|off|LIST", default_value = "auto")]
    pub cpu_affinity: crate::server::affinity::CpuAffinity,
    /// Diagnostics level on stderr: error, warn, info, debug, trace (release builds have no
    /// trace-level diagnostics: trace shows debug, with a warning).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Diagnostics format on stderr.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

/// Arguments of `upkeep check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Config file to validate.
    pub file: PathBuf,
    /// Print the effective config (every default filled in) as TOML that `upkeep check`
    /// accepts again, when valid.
    #[arg(long)]
    pub print: bool,
}

/// Arguments of `upkeep reload` and `upkeep upgrade`: where the running upkeep's admin
/// listener is, and its token.
#[derive(Debug, clap::Args)]
pub struct ReloadArgs {
    /// Admin address of the running upkeep.
    #[arg(long, default_value = "127.0.0.1:9901")]
    pub admin: SocketAddr,
    /// File holding the bearer token (`[admin] token_file` of the running upkeep).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

fn init_tracing(level: &str, format: &str) {
    let (level, trace_compiled_out) = without_trace(level);
    let filter = tracing_subscriber::EnvFilter::try_new(format!(
        "{level},hyper=warn,h2=warn,hickory_proto=warn,hickory_resolver=warn"
    ))
    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        b.json().try_init()
    } else {
        b.try_init()
    };
    if trace_compiled_out {
        tracing::warn!("--log-level trace: this build has no trace-level diagnostics (they are compiled out of release builds); showing debug");
    }
}

/// `level` with `trace` read as `debug` when this build has no trace level (release builds:
/// the workspace's `tracing` is built with `release_max_level_debug`), and whether it was.
fn without_trace(level: &str) -> (String, bool) {
    let compiled_out =
        tracing::level_filters::STATIC_MAX_LEVEL < tracing::level_filters::LevelFilter::TRACE;
    let read = trace_as_debug(level);
    let changed = compiled_out && read != level;
    (if changed { read } else { level.to_owned() }, changed)
}

/// Every `trace` level in a filter (`trace`, `info,upkeep_proxy=TRACE`) made `debug`; a name
/// that only contains the word (`my_tracer`) is left alone.
fn trace_as_debug(level: &str) -> String {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let mut out = String::with_capacity(level.len());
    let mut token = String::new();
    for c in level.chars().chain(std::iter::once(',')) {
        if word(c) {
            token.push(c);
            continue;
        }
        out.push_str(if token.eq_ignore_ascii_case("trace") {
            "debug"
        } else {
            &token
        });
        token.clear();
        out.push(c);
    }
    out.pop();
    out
}

/// Builds the quick-start config: one listener, one required group of `--to` peers, every
/// other setting at its file default, except no drain delay (nothing sits in front to notice).
pub fn quick_start(
    listen: SocketAddr,
    to: &[String],
    admin: Option<SocketAddr>,
    dns: &[SocketAddr],
) -> Result<Config, String> {
    if to.is_empty() {
        return Err("give --config FILE, or --to http://HOST:PORT (with --listen ADDR)".into());
    }
    let mut endpoints = Vec::new();
    for t in to {
        let source = config::parse_endpoint(t).map_err(|e| format!("--to {e}"))?;
        let ep = config::Endpoint {
            source,
            tier: 0,
            https: false,
        };
        if !endpoints.contains(&ep) {
            endpoints.push(ep);
        }
    }
    let mut groups = std::collections::BTreeMap::new();
    groups.insert(
        "default".to_owned(),
        config::GroupConfig::with_endpoints(endpoints),
    );
    let mut admin_cfg = config::AdminConfig::default();
    if let Some(a) = admin {
        admin_cfg.listen = a;
    }
    if admin_cfg.listen == listen {
        return Err(format!(
            "--admin {} is the same address as --listen",
            admin_cfg.listen
        ));
    }
    admin_cfg.check_exposure()?;
    Ok(Config {
        admin: admin_cfg,
        dns: config::DnsConfig {
            servers: dns.to_vec(),
            ..Default::default()
        },
        lifecycle: config::Lifecycle {
            drain_delay: Duration::ZERO,
            ..Default::default()
        },
        listeners: vec![config::ListenerConfig::plain(listen)],
        routes: vec![config::RouteConfig {
            host: config::HostMatch::Any,
            path: "/".into(),
            group: Some("default".into()),
            allow_encoded_separators: false,
            rules: Default::default(),
        }],
        groups,
        access_log: config::AccessLog::Stdout,
        access_log_format: config::AccessLogFormat::default(),
        kubernetes: config::KubernetesConfig::default(),
    })
}

/// Runs the proxy.
pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    init_tracing(&args.log_level, &args.log_format);
    crate::boundary::log_panics_outside_requests();
    // Before the config is read: the default `max_connections` derives from this limit.
    let nofile = crate::limits::raise_nofile();
    tracing::debug!(nofile, "file-descriptor limit");
    let mut cfg = match &args.config {
        Some(path) => match config::load(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{e}");
                return Ok(ExitCode::from(2));
            }
        },
        None => {
            let listen = args
                .listen
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
            quick_start(listen, &args.to, args.admin, &args.dns_server)
                .map_err(anyhow::Error::msg)?
        }
    };
    if let (Some(a), Some(_)) = (args.admin, &args.config) {
        cfg.admin.listen = a;
        cfg.admin.check_exposure().map_err(anyhow::Error::msg)?;
    }
    if let Some(dest) = &args.access_log {
        cfg.access_log = match dest.as_str() {
            "-" | "stdout" => config::AccessLog::Stdout,
            "off" => config::AccessLog::Off,
            p => config::AccessLog::File(PathBuf::from(p)),
        };
    }
    match args.access_log_format.as_deref() {
        Some("combined") => cfg.access_log_format = config::AccessLogFormat::Combined,
        Some(_) => cfg.access_log_format = config::AccessLogFormat::Json,
        None => {}
    }
    let workers = match args.workers {
        Some(0) => anyhow::bail!("--workers must be at least 1"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let cpus = match crate::server::affinity::plan(&args.cpu_affinity, workers) {
        Ok(plan) => {
            tracing::info!("{}", plan.why);
            plan.cpus
        }
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(2));
        }
    };
    // The control runtime (signals, discovery, checks, admin) is small; serving threads are
    // separate (see server::start_workers).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let pinned = args.access_log.is_some().then(|| cfg.access_log.clone());
    rt.block_on(crate::server::run(cfg, args.config.clone(), cpus, pinned))?;
    Ok(ExitCode::SUCCESS)
}

/// Validates a config file.
pub fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    match config::load_with_warnings(&args.file) {
        Ok((cfg, warnings)) => {
            for w in &warnings {
                eprintln!("{w} (warning)");
            }
            if args.print {
                print!("{}", config::to_toml(&cfg)?);
            }
            eprintln!("{}: ok", args.file.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            eprintln!("{}: {} problem(s)", args.file.display(), e.problems.len());
            Ok(ExitCode::from(1))
        }
    }
}

/// Arguments of `upkeep upgrade` (the same as `upkeep reload`'s).
pub type UpgradeArgs = ReloadArgs;

/// Asks a running upkeep to reload.
pub fn reload(args: ReloadArgs) -> anyhow::Result<ExitCode> {
    post(&args, "/reload", Duration::from_secs(30))
}

/// Asks a running upkeep to start its binary anew and hand it the listening sockets
/// (Unix only); exits non-zero when the old process kept serving.
pub fn upgrade(args: UpgradeArgs) -> anyhow::Result<ExitCode> {
    // The old process waits up to 30 s for the new one; leave room for its answer.
    post(&args, "/upgrade", Duration::from_secs(45))
}

/// `POST path` to the admin listener with the bearer token; prints the answer's body and
/// exits 0 on 200.
fn post(args: &ReloadArgs, path: &str, wait: Duration) -> anyhow::Result<ExitCode> {
    let mut s = std::net::TcpStream::connect_timeout(&args.admin, Duration::from_secs(3))
        .with_context(|| format!("connecting to the admin listener at {}", args.admin))?;
    s.set_read_timeout(Some(wait))?;
    let auth = match &args.token_file {
        Some(f) => {
            let token = std::fs::read_to_string(f)
                .with_context(|| format!("reading the token file {}", f.display()))?;
            format!("Authorization: Bearer {}\r\n", token.trim())
        }
        None => String::new(),
    };
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n",
        args.admin
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let ok = resp.starts_with("HTTP/1.1 200");
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    eprint!("{body}");
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_level_reads_as_debug_and_nothing_else_changes() {
        for (given, read) in [
            ("trace", "debug"),
            ("TRACE", "debug"),
            ("info,upkeep_proxy=trace", "info,upkeep_proxy=debug"),
            ("warn,my_tracer=info", "warn,my_tracer=info"),
            ("info", "info"),
            ("debug,hyper=Trace", "debug,hyper=debug"),
        ] {
            assert_eq!(trace_as_debug(given), read, "{given}");
        }
    }
}
