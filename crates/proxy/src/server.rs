//! Start-up, signals, reload and graceful shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use crate::access_log::AccessLogger;
use crate::config::{self, Config};
use crate::listener::{accept_loop, Signals};
use crate::metrics::{GroupLabel, Metrics};
use crate::state::{Shared, State};

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

/// Re-reads the config file and applies it; on any problem the old config stays.
pub fn reload(shared: &Shared) -> Result<(), String> {
    let Some(path) = &shared.config_path else {
        return Err("started from flags, there is no config file to reload".into());
    };
    let cfg = config::load(path).map_err(|e| e.to_string())?;
    let cur = shared.state.load();
    let old: Vec<_> = cur.config.listeners.iter().map(|l| l.listen).collect();
    let new: Vec<_> = cfg.listeners.iter().map(|l| l.listen).collect();
    if old != new {
        tracing::warn!(
            ?old,
            ?new,
            "listener addresses changed; they apply after a restart"
        );
    }
    shared.apply(cfg)?;
    tracing::info!(path = %path.display(), "config reloaded");
    Ok(())
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
/// current runtime.
pub async fn start_workers(
    config: Config,
    config_path: Option<PathBuf>,
    access_log: AccessLogger,
    workers: usize,
) -> Result<Running, StartError> {
    crate::boundary::install_panic_hook();
    let metrics = Metrics::new();
    let config = Arc::new(config);
    let admin_listener = crate::admin::bind(&config.admin)
        .await
        .map_err(|(addr, source)| StartError::Bind {
            addr,
            what: "admin",
            source,
        })?;
    let copies = workers.max(1);
    let mut bound: Vec<(
        Vec<std::net::TcpListener>,
        Arc<crate::config::ListenerConfig>,
    )> = Vec::new();
    for l in &config.listeners {
        let socks = bind_copies(l.listen, copies).map_err(|source| StartError::Bind {
            addr: l.listen,
            what: "listener",
            source,
        })?;
        bound.push((socks, Arc::new(l.clone())));
    }
    let shared = Shared::new(metrics, access_log, config_path, config.clone());
    let state = State::build(config.clone(), None, &shared).map_err(StartError::State)?;
    shared.state.store(Arc::new(state));

    let probes = admin_listener.probes_addr();
    let admin = admin_listener
        .control_addr()
        .map_err(|source| StartError::Bind {
            addr: config.admin.listen,
            what: "admin",
            source,
        })?;
    let listeners: Vec<SocketAddr> = bound
        .iter()
        .filter_map(|(l, _)| l[0].local_addr().ok())
        .collect();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (close_tx, close_rx) = watch::channel(false);
    let signals = Signals {
        stop_accepting: stop_rx,
        close_idle: close_rx,
    };
    let tracker = TaskTracker::new();
    let mut accept_done: Vec<tokio::sync::oneshot::Receiver<()>> = Vec::new();
    if workers == 0 {
        for (mut socks, cfg) in bound {
            let tl = TcpListener::from_std(socks.remove(0)).map_err(|source| StartError::Bind {
                addr: cfg.listen,
                what: "listener",
                source,
            })?;
            let (tx, rx) = tokio::sync::oneshot::channel();
            accept_done.push(rx);
            let (shared, signals, tracker) = (shared.clone(), signals.clone(), tracker.clone());
            tokio::spawn(async move {
                accept_loop(tl, cfg, shared, signals, tracker).await;
                let _ = tx.send(());
            });
        }
    } else {
        let mut per_worker: Vec<Vec<_>> = (0..workers).map(|_| Vec::new()).collect();
        for (socks, cfg) in bound {
            for (i, sock) in socks.into_iter().enumerate() {
                per_worker[i].push((sock, cfg.clone()));
            }
        }
        for (i, mine) in per_worker.into_iter().enumerate() {
            let (tx, rx) = tokio::sync::oneshot::channel();
            accept_done.push(rx);
            let (shared, signals, tracker) = (shared.clone(), signals.clone(), tracker.clone());
            std::thread::Builder::new()
                .name(format!("upkeep-worker-{}", i + 1))
                .spawn(move || serve_worker(i + 1, mine, shared, signals, tracker, tx))
                .map_err(|e| StartError::State(format!("starting worker threads: {e}")))?;
        }
    }
    shared.set_listeners_bound();
    let reload_shared = shared.clone();
    let admin_task = admin_listener.serve(shared.clone(), Arc::new(move || reload(&reload_shared)));
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
        let _ = stop_tx.send(true);
        for done in accept_done {
            let _ = done.await;
        }
        let _ = close_tx.send(true);
        tracker.close();
        if tokio::time::timeout(lc.shutdown_timeout, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("shutdown timeout reached with requests still in flight");
        }
        admin_task.abort();
        monitor.abort();
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

/// Binds `n` sockets to `addr` with SO_REUSEPORT (the first one picks the port when it is 0).
fn bind_copies(addr: SocketAddr, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    use socket2::{Domain, Socket, Type};
    let mut addr = addr;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        s.set_reuse_address(true)?;
        if n > 1 {
            s.set_reuse_port(true)?;
        }
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        s.listen(1024)?;
        if i == 0 {
            addr = s.local_addr()?.as_socket().unwrap_or(addr);
        }
        out.push(s.into());
    }
    Ok(out)
}

/// One serving worker: a single-threaded runtime that accepts and serves its copies of the
/// listeners, and lives until every tracked connection has finished.
fn serve_worker(
    id: usize,
    listeners: Vec<(std::net::TcpListener, Arc<crate::config::ListenerConfig>)>,
    shared: Arc<Shared>,
    signals: Signals,
    tracker: TaskTracker,
    done: tokio::sync::oneshot::Sender<()>,
) {
    crate::pool::set_worker(id);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "worker runtime failed to start");
            return;
        }
    };
    rt.block_on(async move {
        let mut loops = Vec::new();
        for (sock, cfg) in listeners {
            match TcpListener::from_std(sock) {
                Ok(l) => loops.push(tokio::spawn(accept_loop(
                    l,
                    cfg,
                    shared.clone(),
                    signals.clone(),
                    tracker.clone(),
                ))),
                Err(e) => tracing::error!(error = %e, "listener could not join the worker runtime"),
            }
        }
        for l in loops {
            let _ = l.await;
        }
        let _ = done.send(());
        // Connections accepted here are driven by this runtime: keep it until they end.
        tracker.wait().await;
    });
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

/// Runs until SIGTERM/SIGINT (drain) with SIGHUP reloading.
pub async fn run(
    config: Config,
    config_path: Option<PathBuf>,
    workers: usize,
) -> Result<(), StartError> {
    use tokio::signal::unix::{signal, SignalKind};
    let running = start(config, config_path, workers).await?;
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing SIGINT handler");
    let mut hup = signal(SignalKind::hangup()).expect("installing SIGHUP handler");
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => running.control(Control::Reload),
        }
    }
    tracing::info!("termination signal received");
    running.control(Control::Terminate);
    running.wait().await;
    Ok(())
}
