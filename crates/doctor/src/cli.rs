//! `upkeep doctor ...`: argument parsing, running a check, printing, and the exit code.

use crate::finding::{render_json, render_sarif, render_text, Finding, Severity};
use crate::{k8s, keepalive, logs, nginx};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `upkeep doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// What to check.
    #[command(subcommand)]
    pub command: DoctorCommand,
}

/// The doctor's checks.
#[derive(Debug, clap::Subcommand)]
pub enum DoctorCommand {
    /// Check an nginx config (follows include).
    Nginx(NginxArgs),
    /// Classify episodes in nginx error logs (plain or gzip).
    Logs(LogsArgs),
    /// Check Kubernetes manifests or Helm-rendered output.
    K8s(K8sArgs),
    /// Measure when a live server closes an idle keep-alive connection.
    Keepalive(KeepaliveArgs),
}

/// Output options shared by every check.
#[derive(Debug, Clone, clap::Args)]
pub struct Output {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Exit 1 when a finding is at or above this severity.
    #[arg(long, value_enum, default_value_t = Severity::Warning)]
    pub fail_on: Severity,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// For people (coloured on a terminal).
    Text,
    /// JSON, one document.
    Json,
    /// SARIF 2.1.0, for code-scanning UIs.
    Sarif,
}

/// `doctor nginx FILE`.
#[derive(Debug, clap::Args)]
pub struct NginxArgs {
    /// The main config file, e.g. /etc/nginx/nginx.conf.
    pub file: PathBuf,
    /// Directory relative includes resolve against (default: the file's directory).
    #[arg(long)]
    pub prefix: Option<PathBuf>,
    /// Read absolute include paths under this directory (a copy of another machine's files).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Output format and gate.
    #[command(flatten)]
    pub output: Output,
}

/// `doctor logs FILE... [--access-log FILE]`.
#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// nginx error logs, plain or gzip.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Access logs (combined format, optionally ending with $upstream_status) to count client 502s.
    #[arg(long = "access-log")]
    pub access_logs: Vec<PathBuf>,
    /// Output format and gate.
    #[command(flatten)]
    pub output: Output,
}

/// `doctor k8s PATH... [--live BASE_URL]`.
#[derive(Debug, clap::Args)]
pub struct K8sArgs {
    /// Manifest files or directories (*.yaml, *.yml).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Measure liveness endpoints against this base URL (e.g. a port-forward).
    #[arg(long)]
    pub live: Option<String>,
    /// Output format and gate.
    #[command(flatten)]
    pub output: Output,
}

/// `doctor keepalive URL`.
#[derive(Debug, clap::Args)]
pub struct KeepaliveArgs {
    /// An http:// URL of the server behind the hop.
    pub url: String,
    /// Idle timeout of the hop in front that reuses connections (AWS ALB default: 60s).
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub lb_idle: Duration,
    /// How long to wait for the server to close the idle connection (default: long enough
    /// to conclude for --lb-idle, i.e. lb-idle + max(10%, 5s) + 1s).
    #[arg(long, value_parser = parse_duration)]
    pub max_wait: Option<Duration>,
    /// Output format and gate.
    #[command(flatten)]
    pub output: Output,
}

impl KeepaliveArgs {
    /// The wait: as given, or just past what a verdict against `--lb-idle` needs.
    pub fn max_wait(&self) -> Duration {
        self.max_wait.unwrap_or_else(|| {
            self.lb_idle + keepalive::margin(self.lb_idle) + Duration::from_secs(1)
        })
    }
}

/// Parses `300s`, `5m`, `250ms`, `1h`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let secs = nginx::rules::parse_time(s.trim())
        .ok_or_else(|| format!("invalid duration {s:?} (use e.g. 300s, 5m, 250ms)"))?;
    Duration::try_from_secs_f64(secs).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// Exit status for findings: 1 when any is at or above `fail_on`, else 0.
pub fn exit_status(findings: &[Finding], fail_on: Severity) -> u8 {
    u8::from(findings.iter().any(|f| f.severity >= fail_on))
}

/// Renders findings in `format`.
pub fn render(findings: &[Finding], format: Format, colour: bool) -> String {
    match format {
        Format::Text => render_text(findings, colour),
        Format::Json => render_json(findings) + "\n",
        Format::Sarif => render_sarif(findings) + "\n",
    }
}

/// Runs `upkeep doctor ...`; exit 0 clean, 1 findings, 2 unreadable input.
pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let (result, output) = match &args.command {
        DoctorCommand::Nginx(a) => (
            nginx::check_file(&a.file, a.prefix.as_deref(), a.root.as_deref())
                .map_err(anyhow::Error::from),
            &a.output,
        ),
        DoctorCommand::Logs(a) => {
            let files: Vec<&Path> = a.files.iter().map(PathBuf::as_path).collect();
            let access: Vec<&Path> = a.access_logs.iter().map(PathBuf::as_path).collect();
            (
                logs::analyze(&files, &access).map_err(anyhow::Error::from),
                &a.output,
            )
        }
        DoctorCommand::K8s(a) => (
            k8s::check_paths(&a.paths, a.live.as_deref()).map_err(anyhow::Error::from),
            &a.output,
        ),
        DoctorCommand::Keepalive(a) => (
            keepalive::measure(&a.url, a.max_wait())
                .map(|m| vec![keepalive::verdict(&m, a.lb_idle)])
                .map_err(anyhow::Error::from),
            &a.output,
        ),
    };
    let findings = match result {
        Ok(f) => f,
        Err(e) => {
            // Each error type already names its cause in its message, so print only the top.
            eprintln!("upkeep doctor: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let colour = output.format == Format::Text && std::io::stdout().is_terminal();
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(render(&findings, output.format, colour).as_bytes())?;
    stdout.flush()?;
    Ok(ExitCode::from(exit_status(&findings, output.fail_on)))
}
