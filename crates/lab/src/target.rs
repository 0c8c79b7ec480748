//! Targets: upkeep, nginx or HAProxy, each launched from a config template in a temp dir with
//! its own pid and log files on loopback ports, and stopped by PID.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::scenario::Scenario;

mod control;
mod templates;

pub use control::Control;

/// Which proxy a run aims at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TargetKind {
    /// upkeep itself.
    Upkeep,
    /// nginx.
    Nginx,
    /// HAProxy.
    Haproxy,
}

impl TargetKind {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Upkeep => "upkeep",
            TargetKind::Nginx => "nginx",
            TargetKind::Haproxy => "haproxy",
        }
    }

    /// The signal that stops this proxy gracefully, the way its own package stops it: upkeep
    /// drains on SIGTERM; nginx's graceful shutdown is SIGQUIT (SIGTERM is its fast shutdown,
    /// which cuts requests in flight; Debian's unit sends QUIT); HAProxy's soft-stop is SIGUSR1
    /// (stop listening, finish what is in flight).
    pub fn graceful_stop(self) -> Signal {
        match self {
            TargetKind::Upkeep => Signal::SIGTERM,
            TargetKind::Nginx => Signal::SIGQUIT,
            TargetKind::Haproxy => Signal::SIGUSR1,
        }
    }

    /// Parses `upkeep`, `nginx` or `haproxy`.
    pub fn parse(s: &str) -> Option<TargetKind> {
        match s.trim() {
            "upkeep" => Some(TargetKind::Upkeep),
            "nginx" => Some(TargetKind::Nginx),
            "haproxy" => Some(TargetKind::Haproxy),
            _ => None,
        }
    }
}

/// Binaries to launch; `None` means not installed.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The upkeep binary.
    pub upkeep: Option<PathBuf>,
    /// nginx.
    pub nginx: Option<PathBuf>,
    /// HAProxy.
    pub haproxy: Option<PathBuf>,
}

impl Binaries {
    /// This executable as upkeep; nginx and HAProxy from the given paths or the usual places.
    pub fn discover(nginx: Option<PathBuf>, haproxy: Option<PathBuf>) -> Binaries {
        let find = |name: &str| {
            ["/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"]
                .iter()
                .map(|d| Path::new(d).join(name))
                .find(|p| p.is_file())
        };
        Binaries {
            upkeep: std::env::current_exe().ok(),
            nginx: nginx.or_else(|| find("nginx")),
            haproxy: haproxy.or_else(|| find("haproxy")),
        }
    }

    fn get(&self, kind: TargetKind) -> Option<&PathBuf> {
        match kind {
            TargetKind::Upkeep => self.upkeep.as_ref(),
            TargetKind::Nginx => self.nginx.as_ref(),
            TargetKind::Haproxy => self.haproxy.as_ref(),
        }
    }
}

/// Addresses of one run's rig, for filling a template.
#[derive(Debug, Clone)]
pub struct Rig {
    /// Where the target listens.
    pub listen: SocketAddr,
    /// Where upkeep's admin listener goes.
    pub admin: SocketAddr,
    /// The port every backend listens on.
    pub backend_port: u16,
    /// Backend name to its loopback address.
    pub backend_ips: BTreeMap<String, Ipv4Addr>,
    /// The fake DNS, when the scenario has names.
    pub dns: Option<SocketAddr>,
    /// A kubeconfig for the fake Kubernetes API server, when the scenario has a Service.
    pub kubeconfig: Option<PathBuf>,
}

/// A config ready to launch, or why the target cannot run the scenario.
#[derive(Debug)]
pub enum Prepared {
    /// Launch with this label (which names a substitute pattern, if any).
    Ready {
        /// Label for the report, e.g. `nginx 1.22.1 (dynamic-resolve pattern)`.
        label: String,
        /// The config pattern the target runs, in a few words (`upstream resolve`).
        pattern: String,
        /// Config file name and contents.
        config: String,
    },
    /// The target cannot express the scenario.
    Skip(String),
}

/// A target process that failed to start.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// Temp dir or config file.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The process exited or never listened.
    #[error("{target} did not start: {detail}")]
    Start {
        /// Target name.
        target: &'static str,
        /// Last lines of its logs.
        detail: String,
    },
}

/// Fills the template of `kind` for `scenario`, or says why it cannot.
pub fn prepare(
    kind: TargetKind,
    bins: &Binaries,
    scenario: &Scenario,
    rig: &Rig,
    dir: &Path,
) -> Prepared {
    if kind != TargetKind::Upkeep {
        if let Some(skip) = templates::no_endpointslices(kind.name(), scenario) {
            return skip;
        }
    }
    let Some(bin) = bins.get(kind) else {
        return Prepared::Skip(format!("{} is not installed", kind.name()));
    };
    match kind {
        TargetKind::Upkeep => templates::upkeep(scenario, rig),
        TargetKind::Nginx => templates::nginx(bin, scenario, rig, dir),
        TargetKind::Haproxy => templates::haproxy(bin, scenario, rig),
    }
}

/// A running target.
#[derive(Debug)]
pub struct Running {
    /// Which proxy.
    pub kind: TargetKind,
    /// Its report label.
    pub label: String,
    child: Child,
    dir: PathBuf,
    control: Option<Control>,
}

/// What a stopped target left behind.
#[derive(Debug, Default)]
pub struct TargetLogs {
    /// Error log (nginx), stderr (upkeep), or nothing.
    pub error_log: String,
    /// Access log (upkeep stdout, HAProxy stdout).
    pub access_log: String,
}

impl Running {
    /// Writes the config into `dir`, launches the target and waits until it listens.
    pub async fn start(
        kind: TargetKind,
        bins: &Binaries,
        label: String,
        config: &str,
        rig: &Rig,
        dir: &Path,
    ) -> Result<Running, TargetError> {
        Self::start_with(kind, bins, label, config, rig, dir, false).await
    }

    /// Like `start`; with `master`, HAProxy runs in master-worker mode (`-W`), which its
    /// reload and binary upgrade need.
    pub async fn start_with(
        kind: TargetKind,
        bins: &Binaries,
        label: String,
        config: &str,
        rig: &Rig,
        dir: &Path,
        master: bool,
    ) -> Result<Running, TargetError> {
        let bin = bins.get(kind).ok_or_else(|| TargetError::Start {
            target: kind.name(),
            detail: "not installed".into(),
        })?;
        let io = |what: &str, e| TargetError::Io(what.to_owned(), e);
        let (file, mut cmd) = match kind {
            TargetKind::Upkeep => {
                let mut c = Command::new(bin);
                c.arg("serve").arg("--config").arg(dir.join("upkeep.toml"));
                ("upkeep.toml", c)
            }
            TargetKind::Nginx => {
                let mut c = Command::new(bin);
                c.arg("-p")
                    .arg(dir)
                    .arg("-e")
                    .arg(dir.join("error.log"))
                    .arg("-c")
                    .arg(dir.join("nginx.conf"));
                ("nginx.conf", c)
            }
            TargetKind::Haproxy => {
                let mut c = Command::new(bin);
                if master {
                    c.arg("-W");
                }
                c.arg("-db").arg("-f").arg(dir.join("haproxy.cfg"));
                ("haproxy.cfg", c)
            }
        };
        std::fs::write(dir.join(file), config).map_err(|e| io("write config", e))?;
        let stdout = std::fs::File::create(dir.join("stdout.log")).map_err(|e| io("log", e))?;
        let stderr = std::fs::File::create(dir.join("stderr.log")).map_err(|e| io("log", e))?;
        // Log times in UTC so that the classifier can read them without a time zone database.
        cmd.env("TZ", "UTC")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .current_dir(dir)
            // A panicking lab must not leave its targets behind; this kills by handle.
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| io(&bin.display().to_string(), e))?;
        let control = child.id().map(|p| Control::new(kind, dir.to_owned(), p));
        let mut running = Running {
            kind,
            label,
            child,
            dir: dir.to_owned(),
            control,
        };
        running.wait_listening(rig.listen).await?;
        Ok(running)
    }

    async fn wait_listening(&mut self, addr: SocketAddr) -> Result<(), TargetError> {
        for _ in 0..200 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(TargetError::Start {
                    target: self.kind.name(),
                    detail: format!("exited with {status}: {}", self.log_tail()),
                });
            }
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(TargetError::Start {
            target: self.kind.name(),
            detail: format!("nothing listening on {addr} after 5 s: {}", self.log_tail()),
        })
    }

    fn log_tail(&self) -> String {
        let mut out = String::new();
        for f in ["stderr.log", "error.log", "stdout.log"] {
            if let Ok(text) = std::fs::read_to_string(self.dir.join(f)) {
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
                if !tail.is_empty() {
                    out.push_str(&format!("[{f}] {tail} "));
                }
            }
        }
        out
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends `signal` (`TERM`, `QUIT`, `INT`, `HUP`) to the target's PID.
    pub fn signal(&self, signal: &str) {
        let sig = match signal {
            "QUIT" => Signal::SIGQUIT,
            "INT" => Signal::SIGINT,
            "HUP" => Signal::SIGHUP,
            _ => Signal::SIGTERM,
        };
        if let Some(pid) = self.pid() {
            let _ = kill(Pid::from_raw(pid as i32), sig);
        }
    }

    /// Reload and upgrade actions, and the pid that serves now.
    pub fn control(&self) -> Option<Control> {
        self.control.clone()
    }

    /// Stops the target by PID (its graceful stop, then KILL after 5 s) and collects its logs.
    pub async fn stop(mut self) -> TargetLogs {
        // After a binary upgrade another process serves: stop that one, by its pid.
        let upgraded = self
            .control
            .as_ref()
            .map(Control::pid)
            .filter(|p| Some(*p) != self.child.id());
        if let Some(pid) = upgraded {
            let _ = kill(Pid::from_raw(pid as i32), self.kind.graceful_stop());
            for _ in 0..100 {
                if !control::alive(pid) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if control::alive(pid) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
        if let Ok(None) = self.child.try_wait() {
            if let Some(pid) = self.pid() {
                let _ = kill(Pid::from_raw(pid as i32), self.kind.graceful_stop());
            }
            if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
                .await
                .is_err()
            {
                let _ = self.child.kill().await;
            }
        }
        // A process an upgrade started that the run never learned about (its upgrade step
        // was cut short by the end of the run) still names this run's config: stop it too.
        if self.kind == TargetKind::Upkeep {
            let left = control::serving_with(&self.dir.join("upkeep.toml"));
            for pid in &left {
                let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGTERM);
            }
            for _ in 0..100 {
                if !left.iter().any(|p| control::alive(*p)) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            for pid in left.iter().filter(|p| control::alive(**p)) {
                let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
            }
        }
        let read = |f: &str| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        match self.kind {
            TargetKind::Upkeep => TargetLogs {
                error_log: read("stderr.log"),
                access_log: read("stdout.log"),
            },
            TargetKind::Nginx => TargetLogs {
                error_log: read("error.log"),
                access_log: read("access.log"),
            },
            TargetKind::Haproxy => TargetLogs {
                error_log: read("stderr.log"),
                access_log: read("stdout.log"),
            },
        }
    }
}

/// `N` distinct free ports on the loopback address `ip`: all bound at once, then released.
/// Picked one after another, a port bound and released can be handed out again by the next
/// pick, and a target given it twice refuses to start.
pub fn free_ports_on<const N: usize>(ip: std::net::Ipv4Addr) -> std::io::Result<[u16; N]> {
    let held = (0..N)
        .map(|_| std::net::TcpListener::bind((ip, 0)))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (p, l) in ports.iter_mut().zip(&held) {
        *p = l.local_addr()?.port();
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports picked together are distinct. Picked one after another, bound and released each
    /// time, 300 of them repeated a port in each of five tries: the kernel hands a released
    /// port out again readily.
    #[test]
    fn ports_picked_together_are_distinct() {
        let ports = free_ports_on::<300>(std::net::Ipv4Addr::LOCALHOST).unwrap();
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            ports.len(),
            "a port was handed out twice: {ports:?}"
        );
        assert!(ports.iter().all(|&p| p != 0));
    }
}
