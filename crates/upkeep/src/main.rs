//! The `upkeep` command: serve, check, reload, upgrade, lab, demo, doctor.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// jemalloc rather than the system allocator: fewer instructions per request (about 2 % of an
/// HTTP/1 request and 6 % of an HTTP/2 one, much of the system allocator's cost there being
/// its large-block path and consolidation) and less memory per idle connection
/// (docs/performance-history.md, "The allocator"). Built with larger thread caches for a few
/// hundred requests in flight a thread (`JEMALLOC_SYS_WITH_MALLOC_CONF` in .cargo/config.toml;
/// tests/process/allocator.rs checks the built binary).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The version `--version` prints: a binary built by `bench/pgo.sh` says it is the
/// profile-guided build (the script sets `UPKEEP_PGO` while compiling it), so a benchmark's
/// header and a deployed binary tell which build they are.
const VERSION: &str = match option_env!("UPKEEP_PGO") {
    Some(_) => concat!(env!("CARGO_PKG_VERSION"), " (profile-guided build)"),
    None => env!("CARGO_PKG_VERSION"),
};

/// HTTP reverse proxy and load balancer that never turns a transient fault into an outage.
#[derive(Debug, Parser)]
#[command(name = "upkeep", version = VERSION, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the proxy, from a config file or from quick-start flags.
    Serve(upkeep_proxy::cli::ServeArgs),
    /// Validate a config file like `nginx -t`; every problem with file:line:column.
    Check(upkeep_proxy::cli::CheckArgs),
    /// Ask a running upkeep (through its admin listener) to re-read its config file.
    Reload(upkeep_proxy::cli::ReloadArgs),
    /// Ask a running upkeep to start its binary anew and hand over its listening sockets
    /// (like nginx's SIGUSR2, which upkeep also takes); non-zero exit if the old one kept serving.
    Upgrade(upkeep_proxy::cli::UpgradeArgs),
    /// The fault lab: fake DNS, fault backends, open-loop load, scenarios.
    Lab(upkeep_lab::cli::LabArgs),
    /// Run the scenario catalog briefly against upkeep and every installed peer proxy.
    Demo(upkeep_lab::cli::DemoArgs),
    /// Find the traps behind transient 502s in nginx configs, error logs, Kubernetes manifests, live servers.
    Doctor(upkeep_doctor::cli::DoctorArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => upkeep_proxy::cli::serve(args),
        Command::Check(args) => upkeep_proxy::cli::check(args),
        Command::Reload(args) => upkeep_proxy::cli::reload(args),
        Command::Upgrade(args) => upkeep_proxy::cli::upgrade(args),
        Command::Lab(args) => upkeep_lab::cli::run(args),
        Command::Demo(args) => upkeep_lab::cli::run_demo(args),
        Command::Doctor(args) => upkeep_doctor::cli::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("upkeep: {err:#}");
            ExitCode::from(2)
        }
    }
}
