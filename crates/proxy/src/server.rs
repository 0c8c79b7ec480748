//! Start-up, signals, reload and graceful shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use crate::access_log::AccessLogger;
use crate::config::{AccessLog, Config};
use crate::metrics::{GroupLabel, Metrics};
use crate::state::{Shared, State};

mod bind;
pub(crate) mod listeners;
mod reload;

pub use bind::BindError;
pub use listeners::ListenerChanges;
use listeners::Listeners;
pub use reload::{reload, ReloadReport};

/// Why upkeep could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listen address could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Which listener.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A downstream listener could not be started (`address in use: ADDR`, a certificate).
    #[error("{0}")]
    Listener(String),
    /// The state could not be built (e.g. no system resolver).
    #[error("{0}")]
    State(String),
    /// The access log could not be opened.
    #[error("access log: {0}")]
    AccessLog(std::io::Error),
}

/// Control messages for a running server.
#[derive(Debug, Clone, Copy)]
pub enum Control {
    /// Re-read the config file.
    Reload,
    /// Reopen the access log (logrotate moved it).
    ReopenLog,
    /// Drain and exit.
    Terminate,
}

/// A running upkeep.
pub struct Running {
    /// Bound downstream addresses, in config order.
    pub listeners: Vec<SocketAddr>,
    /// Bound admin (control) address.
    pub admin: SocketAddr,
    /// Bound probe-only address, when `[admin] probes` is set.
    pub probes: Option<SocketAddr>,
    /// Shared state.
    pub shared: Arc<Shared>,
    control: mpsc::UnboundedSender<Control>,
    task: JoinHandle<()>,
}

impl Running {
    /// Sends a control message.
    pub fn control(&self, c: Control) {
        let _ = self.control.send(c);
    }

    /// Waits until the server has shut down.
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// Binds every listener and starts serving with `workers` dedicated serving threads (see
/// `start_workers`).
pub async fn start(
    config: Config,
    config_path: Option<PathBuf>,
    workers: usize,
) -> Result<Running, StartError> {
    let access_log = AccessLogger::start(&config.access_log).map_err(StartError::AccessLog)?;
    start_workers(config, config_path, access_log, workers).await
}

/// Like `start`, serving on the current runtime, with a given access logger.
pub async fn start_with(
    config: Config,
    config_path: Option<PathBuf>,
    access_log: AccessLogger,
) -> Result<Running, StartError> {
    start_workers(config, config_path, access_log, 0).await
}

/// Binds every listener and starts serving. With `workers` = 0, connections are served on
/// the current runtime. With `workers` = N, each listener is bound N times with
/// SO_REUSEPORT and each copy is served by its own thread running a single-threaded runtime
/// (the kernel spreads connections; a request never hops threads, and each worker reuses
/// only its own pooled connections). Discovery, checks and the admin listener stay on the
/// current runtime. An address another process listens on is refused (`address in use`).
pub async fn start_workers(
    config: Config,
    config_path: Option<PathBuf>,
    access_log: AccessLogger,
    workers: usize,
) -> Result<Running, StartError> {
    crate::boundary::install_panic_hook();
    let metrics = Metrics::with_access_log_dropped(access_log.dropped_counter());
    let config = Arc::new(config);
    let admin_listener = crate::admin::bind(&config.admin)
        .await
        .map_err(|(addr, source)| StartError::Bind {
            addr,
            what: "admin",
            source,
        })?;
    let conns = TaskTracker::new();
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..workers {
        let (tx, rx) = mpsc::unbounded_channel();
        senders.push(tx);
        receivers.push(rx);
    }
    let set = Arc::new(Listeners::new(workers.max(1), senders, conns.clone()));
    let bound = set
        .bind_all(&config.listeners)
        .map_err(StartError::Listener)?;
    let shared = Shared::new(metrics, access_log, config_path, config.clone());
    let (state, _) = State::build(config.clone(), None, &shared).map_err(StartError::State)?;
    shared.state.store(Arc::new(state));

    let probes = admin_listener.probes_addr();
    let admin = admin_listener
        .control_addr()
        .map_err(|source| StartError::Bind {
            addr: config.admin.listen,
            what: "admin",
            source,
        })?;
    for (i, rx) in receivers.into_iter().enumerate() {
        let (shared, conns) = (shared.clone(), conns.clone());
        std::thread::Builder::new()
            .name(format!("upkeep-worker-{}", i + 1))
            .spawn(move || listeners::serve_worker(i + 1, rx, shared, conns))
            .map_err(|e| StartError::State(format!("starting worker threads: {e}")))?;
    }
    for (socks, live) in bound {
        set.start(socks, live, &shared);
    }
    let listeners = set.local_addrs();
    shared.set_listeners(set.clone());
    shared.set_listeners_bound();
    let reload_shared = shared.clone();
    let admin_task = admin_listener.serve(
        shared.clone(),
        Arc::new(move || reload(&reload_shared).map(|r| r.to_string())),
    );
    let monitor = tokio::spawn(degraded_monitor(shared.clone()));
    tracing::info!(listeners = ?listeners, admin = %admin, probes = ?probes, "upkeep serving");

    let (control, mut rx) = mpsc::unbounded_channel();
    let task_shared = shared.clone();
    let task = tokio::spawn(async move {
        while let Some(c) = rx.recv().await {
            match c {
                Control::Reload => {
                    if let Err(e) = reload(&task_shared) {
                        for line in e.lines() {
                            tracing::error!("{line}");
                        }
                        tracing::error!("reload refused; the running config stays");
                    }
                }
                Control::ReopenLog => {
                    let dest = task_shared.state.load().config.access_log.clone();
                    match task_shared.access_log.reopen(&dest) {
                        Ok(()) => tracing::info!("access log reopened"),
                        Err(e) => {
                            tracing::error!(error = %e, "access log could not be reopened; writing on to the old file")
                        }
                    }
                }
                Control::Terminate => break,
            }
        }
        let lc = task_shared.state.load().config.lifecycle.clone();
        task_shared.set_draining();
        tracing::info!(
            drain_delay_ms = lc.drain_delay.as_millis() as u64,
            "draining: readiness fails, still serving"
        );
        tokio::time::sleep(lc.drain_delay).await;
        set.stop_all().await;
        conns.close();
        if tokio::time::timeout(lc.shutdown_timeout, conns.wait())
            .await
            .is_err()
        {
            tracing::warn!("shutdown timeout reached with requests still in flight");
        }
        admin_task.abort();
        monitor.abort();
        // Every request has finished, so its line is queued: write them all before exiting.
        let log = task_shared.access_log.clone();
        let flushed = tokio::task::spawn_blocking(move || log.flush(Duration::from_secs(10)))
            .await
            .unwrap_or(false);
        if !flushed {
            tracing::warn!("access log: lines still queued at exit could not be written in 10 s");
        }
        tracing::info!("shut down");
    });
    Ok(Running {
        listeners,
        admin,
        probes,
        shared,
        control,
        task,
    })
}

/// Keeps the degraded gauges of optional groups fresh, and warns once a degradation has
/// lasted longer than `degraded_alert_after`, so a long one is never silent.
async fn degraded_monitor(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut alerted = std::collections::HashSet::new();
    loop {
        tick.tick().await;
        let state = shared.state.load();
        for (name, g) in &state.groups {
            let label = GroupLabel {
                group: name.clone(),
            };
            let degraded = g.degraded_for();
            shared
                .metrics
                .degraded
                .get_or_create(&label)
                .set(degraded.is_some() as i64);
            let alert = degraded.is_some_and(|d| d >= g.config().degraded_alert_after);
            shared
                .metrics
                .degraded_alert
                .get_or_create(&label)
                .set(alert as i64);
            if alert && alerted.insert(name.clone()) {
                tracing::warn!(group = %name, required = g.config().required, "group has had no usable peer for longer than degraded_alert_after");
            } else if !alert {
                alerted.remove(name);
            }
        }
    }
}

/// Runs until SIGTERM/SIGINT (drain), with SIGHUP reloading and SIGUSR1 reopening the
/// access log. `pinned_access_log` (from the command line) wins over the file's, reloads
/// included.
pub async fn run(
    config: Config,
    config_path: Option<PathBuf>,
    workers: usize,
    pinned_access_log: Option<AccessLog>,
) -> Result<(), StartError> {
    use tokio::signal::unix::{signal, SignalKind};
    let running = start(config, config_path, workers).await?;
    if let Some(dest) = pinned_access_log {
        running.shared.pin_access_log(dest);
    }
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing SIGINT handler");
    let mut hup = signal(SignalKind::hangup()).expect("installing SIGHUP handler");
    let mut usr1 = signal(SignalKind::user_defined1()).expect("installing SIGUSR1 handler");
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => running.control(Control::Reload),
            _ = usr1.recv() => running.control(Control::ReopenLog),
        }
    }
    tracing::info!("termination signal received");
    running.control(Control::Terminate);
    running.wait().await;
    Ok(())
}
