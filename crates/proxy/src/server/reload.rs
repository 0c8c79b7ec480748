//! Reload: re-read the config file and apply all of it, or none of it.
//!
//! Everything that can fail is prepared first (the file validated, certificates read, new
//! addresses bound, the access log opened); only then is anything changed, and the groups
//! and routes are swapped in one step. The log line (and the answer to `POST /reload`) says
//! what changed.

use std::net::SocketAddr;

use super::listeners::ListenerChanges;
use crate::config::{self, AccessLog};
use crate::state::{GroupChanges, Shared};

/// What one reload changed.
#[derive(Debug, Default)]
pub struct ReloadReport {
    /// Groups kept, rebuilt, added, removed.
    pub groups: GroupChanges,
    /// Listeners bound, closed, updated, certificates reloaded.
    pub listeners: ListenerChanges,
    /// Where the access log now goes (reopened by every reload).
    pub access_log: String,
    /// Settings that a reload cannot change, with why.
    pub not_applied: Vec<String>,
}

impl std::fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn line(f: &mut std::fmt::Formatter<'_>, what: &str, v: &[String]) -> std::fmt::Result {
            if v.is_empty() {
                return Ok(());
            }
            writeln!(f, "{what}: {}", v.join(", "))
        }
        let addrs = |v: &[SocketAddr]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        line(f, "groups kept", &self.groups.kept)?;
        line(f, "groups rebuilt", &self.groups.rebuilt)?;
        line(f, "groups added", &self.groups.added)?;
        line(f, "groups removed", &self.groups.removed)?;
        line(f, "listeners bound", &addrs(&self.listeners.bound))?;
        line(f, "listeners closed", &addrs(&self.listeners.closed))?;
        line(f, "listeners updated", &addrs(&self.listeners.updated))?;
        line(
            f,
            "certificates reloaded",
            &addrs(&self.listeners.certs_reloaded),
        )?;
        writeln!(f, "access log reopened: {}", self.access_log)?;
        line(f, "not applied", &self.not_applied)
    }
}

fn describe(dest: &AccessLog) -> String {
    match dest {
        AccessLog::Off => "off".into(),
        AccessLog::Stdout => "stdout".into(),
        AccessLog::File(p) => p.display().to_string(),
    }
}

/// Re-reads the config file and applies it; on any problem nothing changes and every
/// problem is returned.
pub fn reload(shared: &std::sync::Arc<Shared>) -> Result<ReloadReport, String> {
    let Some(path) = &shared.config_path else {
        return Err("started from flags, there is no config file to reload".into());
    };
    let mut cfg = config::load(path).map_err(|e| e.to_string())?;
    let cur = shared.state.load_full();
    let mut report = ReloadReport::default();
    if let Some(dest) = shared.pinned_access_log() {
        cfg.access_log = dest;
    }
    if cfg.admin != cur.config.admin {
        report.not_applied.push(format!(
            "[admin] listen {} (the admin listener keeps {}; a restart or an upgrade applies it)",
            cfg.admin.listen, cur.config.admin.listen
        ));
        cfg.admin = cur.config.admin.clone();
    }
    let plan = match shared.listeners() {
        Some(l) => Some(l.plan(&cfg.listeners).map_err(|p| p.join("\n"))?),
        None => None,
    };
    shared
        .access_log
        .reopen(&cfg.access_log)
        .map_err(|e| format!("access log {}: {e}", describe(&cfg.access_log)))?;
    report.access_log = describe(&cfg.access_log);
    report.groups = shared.apply(cfg)?;
    if let (Some(l), Some(plan)) = (shared.listeners(), plan) {
        report.listeners = l.commit(plan, shared);
    }
    tracing::info!(
        path = %path.display(),
        groups.kept = ?report.groups.kept,
        groups.rebuilt = ?report.groups.rebuilt,
        groups.added = ?report.groups.added,
        groups.removed = ?report.groups.removed,
        listeners.bound = ?report.listeners.bound,
        listeners.closed = ?report.listeners.closed,
        listeners.updated = ?report.listeners.updated,
        certs.reloaded = ?report.listeners.certs_reloaded,
        access_log = %report.access_log,
        not_applied = ?report.not_applied,
        "config reloaded"
    );
    Ok(report)
}
