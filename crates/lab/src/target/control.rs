//! Lifecycle actions on a running target, each the proxy's own way: a reload that changes
//! the upstream timeout (upkeep SIGHUP, `nginx -s reload` = SIGHUP to the master, HAProxy's
//! master-worker reload = SIGUSR2 to the master), and a binary upgrade (upkeep SIGUSR2;
//! nginx USR2, then QUIT to the old master once the new one has written its pid file;
//! HAProxy's master re-executes its binary on SIGUSR2). The pid that serves after an upgrade
//! is followed, so the run stops the right process.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::TargetKind;

/// A handle on a running target's process and files, shared by the run and its timeline.
#[derive(Debug, Clone)]
pub struct Control {
    kind: TargetKind,
    dir: PathBuf,
    pid: Arc<AtomicU32>,
}

/// The upstream timeout a reload changes, in each proxy's config words (templates.rs writes
/// the first of each pair).
fn timeout_change(kind: TargetKind) -> (&'static str, &'static str, &'static str) {
    match kind {
        TargetKind::Upkeep => (
            "upkeep.toml",
            "try_timeout = \"2s\"",
            "try_timeout = \"3s\"",
        ),
        TargetKind::Nginx => (
            "nginx.conf",
            "proxy_read_timeout 2s;",
            "proxy_read_timeout 3s;",
        ),
        TargetKind::Haproxy => ("haproxy.cfg", "timeout server 2s", "timeout server 3s"),
    }
}

fn send(pid: u32, sig: Signal) -> bool {
    kill(Pid::from_raw(pid as i32), sig).is_ok()
}

/// Whether a process with this pid runs (an exited one not yet reaped counts as gone).
pub(super) fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(st) => st
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        // No /proc: ask the kernel.
        Err(_) => kill(Pid::from_raw(pid as i32), None).is_ok(),
    }
}

impl Control {
    pub(super) fn new(kind: TargetKind, dir: PathBuf, pid: u32) -> Control {
        Control {
            kind,
            dir,
            pid: Arc::new(AtomicU32::new(pid)),
        }
    }

    /// The pid that serves now.
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::Relaxed)
    }

    /// Rewrites the config with a longer upstream timeout and reloads it; returns what was
    /// done, for the timeline.
    pub fn reload(&self) -> String {
        let (file, from, to) = timeout_change(self.kind);
        let path = self.dir.join(file);
        let changed = std::fs::read_to_string(&path)
            .ok()
            .filter(|t| t.contains(from))
            .map(|t| std::fs::write(&path, t.replace(from, to)).is_ok())
            .unwrap_or(false);
        let (sig, how) = match self.kind {
            TargetKind::Upkeep => (Signal::SIGHUP, "SIGHUP"),
            TargetKind::Nginx => (Signal::SIGHUP, "nginx -s reload (SIGHUP)"),
            TargetKind::Haproxy => (Signal::SIGUSR2, "master reload (SIGUSR2)"),
        };
        send(self.pid(), sig);
        if changed {
            format!("reload: {from} -> {to}, {how}")
        } else {
            format!("reload (config unchanged: no {from}), {how}")
        }
    }

    /// Upgrades the binary the proxy's own way and follows the new pid (bounded: 10 s).
    pub async fn upgrade(&self) -> String {
        let old = self.pid();
        match self.kind {
            TargetKind::Upkeep => {
                send(old, Signal::SIGUSR2);
                let config = self.dir.join("upkeep.toml");
                match wait_for(|| upkeep_serving(&config, old)).await {
                    Some(new) => {
                        self.pid.store(new, Ordering::Relaxed);
                        format!("upgrade: SIGUSR2, pid {old} -> {new}")
                    }
                    None => "upgrade: SIGUSR2, no new process seen".into(),
                }
            }
            TargetKind::Nginx => {
                send(old, Signal::SIGUSR2);
                let pid_file = self.dir.join("nginx.pid");
                let new = wait_for(|| {
                    std::fs::read_to_string(&pid_file)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok())
                        .filter(|p| *p != old && alive(*p))
                })
                .await;
                match new {
                    Some(new) => {
                        // The new master and its workers accept on the inherited sockets; the
                        // old master stops its workers gracefully.
                        send(old, Signal::SIGQUIT);
                        self.pid.store(new, Ordering::Relaxed);
                        format!("upgrade: USR2, then QUIT to the old master, pid {old} -> {new}")
                    }
                    None => "upgrade: USR2, no new master seen".into(),
                }
            }
            TargetKind::Haproxy => {
                send(old, Signal::SIGUSR2);
                "upgrade: master reload (SIGUSR2: the master re-executes its binary)".into()
            }
        }
    }
}

async fn wait_for(mut found: impl FnMut() -> Option<u32>) -> Option<u32> {
    for _ in 0..200 {
        if let Some(p) = found() {
            return Some(p);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Another live `upkeep serve --config CONFIG` than `old` (Linux's /proc). Found by its
/// command line, not as a child of `old`: the old process may hand over and exit before a
/// scan sees the new one, which then belongs to init.
fn upkeep_serving(config: &Path, old: u32) -> Option<u32> {
    serving_with(config).into_iter().find(|p| *p != old)
}

/// Live processes whose command line names `config` (each run writes its config in a temp
/// dir of its own, so only that run's target processes do).
pub(super) fn serving_with(config: &Path) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let want = config.as_os_str().as_encoded_bytes();
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            (cmdline.split(|b| *b == 0).any(|arg| arg == want) && alive(pid)).then_some(pid)
        })
        .collect()
}
