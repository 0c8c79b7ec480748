//! Start-up, signals, reload, binary upgrade and graceful shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use crate::access_log::AccessLogger;
use crate::config::{AccessLog, Config};
use crate::metrics::{GroupLabel, Metrics};
use crate::state::{Shared, State};

pub mod affinity;
mod bind;
mod handover;
pub(crate) mod listeners;
mod reload;
mod upgrade;

pub use bind::BindError;
pub use handover::HandoverError;
pub(crate) use handover::{Handed, Inherited, Kind as HandoverKind};
pub use listeners::ListenerChanges;
use listeners::Listeners;
pub use reload::{reload, ReloadReport};
pub use upgrade::UpgradeError;

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
    /// Start the binary anew and hand it the listening sockets; drain once it is ready.
    Upgrade,
}

/// What the control task is asked to do.
enum Msg {
    Control(Control),
    /// An upgrade whose outcome someone waits for (`POST /upgrade`).
    Upgrade(oneshot::Sender<Result<String, String>>),
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
    control: mpsc::UnboundedSender<Msg>,
    task: JoinHandle<()>,
}

impl Running {
    /// Sends a control message.
    pub fn control(&self, c: Control) {
        let _ = self.control.send(Msg::Control(c));
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
    start_inner(config, config_path, access_log, &vec![None; workers], None).await
}

/// `start_workers` with one serving thread per entry of `cpus`, each held to its CPU when it
/// names one (`affinity::plan`), taking the sockets handed over by an upgraded process first.
async fn start_inner(
    config: Config,
    config_path: Option<PathBuf>,
    access_log: AccessLogger,
    cpus: &[Option<usize>],
    inherited: Option<Arc<Inherited>>,
) -> Result<Running, StartError> {
    let workers = cpus.len();
    crate::boundary::install_panic_hook();
    let metrics = Metrics::with_access_log_dropped(access_log.dropped_counter());
    let config = Arc::new(config);
    let admin_listener = crate::admin::bind_or_take(&config.admin, inherited.as_deref())
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
    let set = Arc::new(Listeners::new(
        workers.max(1),
        senders,
        conns.clone(),
        inherited.clone(),
        &metrics,
    ));
    let bound = set
        .bind_all(&config.listeners)
        .map_err(StartError::Listener)?;
    let shared = Shared::new(metrics, access_log, config_path, config.clone());
    let (state, _) = State::build(config.clone(), None, &shared).map_err(StartError::State)?;
    shared.set_state(Arc::new(state));
    if inherited.is_some() {
        // Taking over from an upgraded process: accept nothing (downstream or admin) on the
        // shared sockets until this process can really serve; meanwhile the old one does.
        ready_to_serve(&shared)
            .await
            .map_err(|why| StartError::State(format!("upgrade: not ready: {why}")))?;
    }

    let probes = admin_listener.probes_addr();
    let admin = admin_listener
        .control_addr()
        .map_err(|source| StartError::Bind {
            addr: config.admin.listen,
            what: "admin",
            source,
        })?;
    for (i, (rx, &cpu)) in receivers.into_iter().zip(cpus).enumerate() {
        let (shared, conns) = (shared.clone(), conns.clone());
        std::thread::Builder::new()
            .name(format!("upkeep-worker-{}", i + 1))
            .spawn(move || listeners::serve_worker(i + 1, cpu, rx, shared, conns))
            .map_err(|e| StartError::State(format!("starting worker threads: {e}")))?;
    }
    for (socks, live) in bound {
        set.start(socks, live, &shared);
    }
    let listeners = set.local_addrs();
    shared.set_listeners(set.clone());
    shared.set_listeners_bound();
    if let Some(unused) = inherited.as_ref().map(|i| i.unused()) {
        if !unused.is_empty() {
            tracing::info!(closed = ?unused, "upgrade: sockets the new config no longer listens on are closed");
        }
    }
    // Kept for an upgrade: the admin listeners are handed over with the downstream ones.
    let admin_handover = admin_listener.handover().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "admin sockets cannot be duplicated: an upgrade re-binds them");
        Vec::new()
    });
    let (control, mut rx) = mpsc::unbounded_channel();
    let reload_shared = shared.clone();
    let upgrade_tx = control.clone();
    let admin_conns = TaskTracker::new();
    let admin_task = admin_listener.serve_with(
        shared.clone(),
        Arc::new(move || reload(&reload_shared).map(|r| r.to_string())),
        Some(Arc::new(move || {
            let tx = upgrade_tx.clone();
            Box::pin(async move {
                let (reply, answer) = oneshot::channel();
                tx.send(Msg::Upgrade(reply))
                    .map_err(|_| "shutting down".to_owned())?;
                answer
                    .await
                    .unwrap_or_else(|_| Err("shutting down".to_owned()))
            })
        })),
        admin_conns.clone(),
    );
    let monitor = tokio::spawn(degraded_monitor(shared.clone()));
    tracing::info!(listeners = ?listeners, admin = %admin, probes = ?probes, pid = std::process::id(), "upkeep serving");

    let task_shared = shared.clone();
    let task = tokio::spawn(async move {
        let mut handed_over = false;
        while let Some(msg) = rx.recv().await {
            let c = match msg {
                Msg::Control(Control::Upgrade) => {
                    let outcome = upgrade_now(&set, &admin_handover).await;
                    handed_over = outcome.is_ok();
                    if handed_over {
                        break;
                    }
                    continue;
                }
                Msg::Upgrade(reply) => {
                    let outcome = upgrade_now(&set, &admin_handover).await;
                    handed_over = outcome.is_ok();
                    let _ = reply.send(
                        outcome
                            .map(|pid| {
                                format!(
                                    "new process: pid {pid}, serving\nold process: pid {}, stopped accepting, draining\n",
                                    std::process::id()
                                )
                            })
                            .map_err(|e| e.to_string()),
                    );
                    if handed_over {
                        break;
                    }
                    continue;
                }
                Msg::Control(c) => c,
            };
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
                Control::Upgrade => unreachable!("handled above"),
            }
        }
        let lc = task_shared.state.load().config.lifecycle.clone();
        task_shared.set_draining();
        if handed_over {
            // The new process accepts on the same sockets (admin included): stop at once,
            // nothing in front has to notice a readiness change first.
            admin_task.abort();
            tracing::info!("upgraded: stopped accepting; in-flight requests finish here");
        } else {
            tracing::info!(
                drain_delay_ms = lc.drain_delay.as_millis() as u64,
                "draining: readiness fails, still serving"
            );
            tokio::time::sleep(lc.drain_delay).await;
        }
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
        // The answer to `POST /upgrade` (and any other admin answer under way) goes out
        // before exit.
        admin_conns.close();
        let _ = tokio::time::timeout(Duration::from_secs(2), admin_conns.wait()).await;
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

/// Starts the new binary with every listening socket; on success it serves and this
/// process drains. Logged either way.
async fn upgrade_now(set: &Listeners, admin: &[Handed]) -> Result<u32, UpgradeError> {
    let mut socks = set.handover().map_err(UpgradeError::Socket)?;
    for h in admin {
        socks.push(Handed {
            kind: h.kind,
            addr: h.addr,
            fd: h.fd.try_clone().map_err(UpgradeError::Socket)?,
        });
    }
    let outcome =
        tokio::task::spawn_blocking(move || upgrade::start_new(socks, upgrade::READY_TIMEOUT))
            .await
            .unwrap_or(Err(UpgradeError::Busy("the upgrade task failed")));
    match &outcome {
        Ok(pid) => tracing::info!(
            new.pid = pid,
            old.pid = std::process::id(),
            "upgrade: new process ready; this one stops accepting and drains"
        ),
        Err(e) => tracing::error!(error = %e, "upgrade failed; this process keeps serving"),
    }
    outcome
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

/// Runs until SIGTERM/SIGINT (drain), with SIGHUP reloading, SIGUSR1 reopening the access
/// log and SIGUSR2 upgrading the binary, with one serving thread per entry of `cpus` (see
/// `start_inner`). `pinned_access_log` (from the command line) wins over the file's, reloads
/// included. Started by an upgrade, it takes the old process's sockets and tells it when it
/// is ready.
pub async fn run(
    config: Config,
    config_path: Option<PathBuf>,
    cpus: Vec<Option<usize>>,
    pinned_access_log: Option<AccessLog>,
) -> Result<(), StartError> {
    use tokio::signal::unix::{signal, SignalKind};
    let handover = match std::env::var_os(handover::SOCKET_ENV) {
        Some(path) => Some(
            upgrade::inherit(std::path::Path::new(&path))
                .map_err(|e| StartError::State(format!("upgrade: receiving the sockets: {e}")))?,
        ),
        None => None,
    };
    let (answer_to, inherited) = match handover {
        Some((stream, inherited)) => (Some(stream), Some(Arc::new(inherited))),
        None => (None, None),
    };
    let started = async {
        let access_log = AccessLogger::start(&config.access_log).map_err(StartError::AccessLog)?;
        start_inner(config, config_path, access_log, &cpus, inherited).await
    }
    .await;
    let mut running = match (started, &answer_to) {
        (Ok(r), _) => r,
        (Err(e), Some(stream)) => {
            tracing::error!(reason = %e, "upgrade: cannot serve; the old process keeps serving");
            upgrade::answer(stream, Err(e.to_string()));
            return Err(e);
        }
        (Err(e), None) => return Err(e),
    };
    if let Some(dest) = pinned_access_log {
        running.shared.pin_access_log(dest);
    }
    // Handlers before the answer: a signal sent right after the upgrade reaches this one.
    let mut usr2 = signal(SignalKind::user_defined2()).expect("installing SIGUSR2 handler");
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing SIGINT handler");
    let mut hup = signal(SignalKind::hangup()).expect("installing SIGHUP handler");
    let mut usr1 = signal(SignalKind::user_defined1()).expect("installing SIGUSR1 handler");
    if let Some(stream) = answer_to {
        upgrade::answer(&stream, Ok(()));
        tracing::info!("upgrade: serving on the handed-over sockets");
    }
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => running.control(Control::Reload),
            _ = usr1.recv() => running.control(Control::ReopenLog),
            _ = usr2.recv() => running.control(Control::Upgrade),
            // Upgraded: the control task has drained this process and ended.
            _ = &mut running.task => return Ok(()),
        }
    }
    tracing::info!("termination signal received");
    running.control(Control::Terminate);
    running.wait().await;
    Ok(())
}

/// Waits (bounded) until this process can take over: first lookups done and every required
/// group with a usable peer, as `/startupz` and `/readyz` would say. A new process that
/// would answer `no_peers` is not ready, and the old one keeps serving.
async fn ready_to_serve(shared: &Shared) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + upgrade::READY_TIMEOUT - Duration::from_secs(5);
    loop {
        let state = shared.state.load();
        let waiting: Vec<String> = state
            .groups
            .iter()
            .filter_map(|(name, g)| {
                if !g.discovery_settled() {
                    Some(format!("group {name}: first lookups pending"))
                } else if g.config().required {
                    g.unusable_reason()
                        .map(|r| format!("group {name}: no_peers ({})", r.as_str()))
                } else {
                    None
                }
            })
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(waiting.join(", "));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
