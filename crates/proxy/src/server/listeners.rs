//! The downstream listeners of a running upkeep: bound at start; on a reload the added ones
//! are bound, the removed ones stop accepting and drain (as nginx does), and the kept ones
//! take the new settings and certificate for new connections; all stop at shutdown.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::task::TaskTracker;

use super::bind::{bind_copies, BindError, Socks};
use super::handover::{Handed, Inherited, Kind};
use crate::config::ListenerConfig;
use crate::listener::{
    accept_loop, serve_moved, tls_acceptor, Balance, Deliver, Live, Moved, Signals,
};
use crate::metrics::{Metrics, WorkerLabel};
use crate::state::Shared;

/// One listen address: its sockets (one per worker), current settings, and signals.
struct Entry {
    /// The address as configured (port 0 in tests).
    listen: SocketAddr,
    local: SocketAddr,
    live: Arc<ArcSwap<Live>>,
    stop: watch::Sender<bool>,
    close: watch::Sender<bool>,
    /// The accept loops of this address.
    accepting: TaskTracker,
    /// Duplicates of the listening sockets, to hand to a new binary on upgrade.
    handover: Vec<OwnedFd>,
    /// The claim on the address (see `bind`), held as long as the address is served.
    lock: Option<OwnedFd>,
}

/// What a worker thread is sent: an accept loop to run, or a connection another worker
/// accepted and hands over (`listener::Balance`).
pub(crate) enum Job {
    Listen {
        sock: std::net::TcpListener,
        live: Arc<ArcSwap<Live>>,
        signals: Signals,
        accepting: TaskTracker,
        balance: Option<Arc<Balance>>,
    },
    Conn(Moved),
}

/// What a reload will change, prepared (sockets bound, certificates read) before anything
/// is changed, so a failure leaves the running listeners untouched.
pub(crate) struct Plan {
    update: Vec<(SocketAddr, Live, bool)>,
    add: Vec<(Socks, Live)>,
    remove: Vec<SocketAddr>,
}

/// What a reload changed.
#[derive(Debug, Default)]
pub struct ListenerChanges {
    /// Newly bound.
    pub bound: Vec<SocketAddr>,
    /// Stopped accepting; their connections drain.
    pub closed: Vec<SocketAddr>,
    /// Kept, with changed settings for new connections.
    pub updated: Vec<SocketAddr>,
    /// Kept, with the certificate and key read again.
    pub certs_reloaded: Vec<SocketAddr>,
}

/// Every listener of the process.
pub(crate) struct Listeners {
    copies: usize,
    workers: Mutex<Vec<mpsc::UnboundedSender<Job>>>,
    /// With two workers or more: the open connections of each, to even out the kernel's
    /// spread.
    balance: Option<Arc<Balance>>,
    conns: TaskTracker,
    list: Mutex<Vec<Entry>>,
    /// Sockets handed over by the process this one upgraded, taken before binding anew.
    inherited: Option<Arc<Inherited>>,
}

/// Reads a listener's certificate and key (when it has TLS) into its settings.
pub(crate) fn live(cfg: &ListenerConfig) -> Result<Live, String> {
    let tls = match &cfg.tls {
        Some(t) => Some(tls_acceptor(t).map_err(|e| format!("listener {}: {e}", cfg.listen))?),
        None => None,
    };
    Ok(Live {
        cfg: Arc::new(cfg.clone()),
        tls,
    })
}

impl Listeners {
    /// A set with `copies` sockets per address, served by `workers` threads (none: on the
    /// current runtime); connections are tracked by `conns`.
    pub(crate) fn new(
        copies: usize,
        workers: Vec<mpsc::UnboundedSender<Job>>,
        conns: TaskTracker,
        inherited: Option<Arc<Inherited>>,
        metrics: &Metrics,
    ) -> Self {
        // Weak: a worker's channel closes when `stop_all` drops the senders, whatever the
        // balance holds.
        let balance = (workers.len() > 1).then(|| {
            Balance::new(
                workers
                    .iter()
                    .map(|w| {
                        let w = w.downgrade();
                        Box::new(move |m| match w.upgrade() {
                            Some(w) => w.send(Job::Conn(m)).map_err(|e| match e.0 {
                                Job::Conn(m) => m,
                                Job::Listen { .. } => unreachable!("sent a connection"),
                            }),
                            None => Err(m),
                        }) as Deliver
                    })
                    .collect(),
                (1..=workers.len())
                    .map(|i| {
                        let worker = u32::try_from(i).unwrap_or(u32::MAX);
                        metrics
                            .worker_connections
                            .get_or_create(&WorkerLabel { worker })
                            .clone()
                    })
                    .collect(),
                metrics.connections_moved.clone(),
            )
        });
        Self {
            copies,
            workers: Mutex::new(workers),
            balance,
            conns,
            list: Mutex::new(Vec::new()),
            inherited,
        }
    }

    /// The sockets of `addr`: handed over by the old process on an upgrade, else bound.
    fn bind(&self, addr: SocketAddr) -> Result<Socks, BindError> {
        if let Some(got) = self.inherited.as_ref().and_then(|i| i.take_listener(addr)) {
            return got.map_err(|source| BindError::Io { addr, source });
        }
        bind_copies(addr, self.copies)
    }

    /// Duplicates of every listening socket and claim, named by configured address, for a
    /// binary upgrade.
    pub(crate) fn handover(&self) -> std::io::Result<Vec<Handed>> {
        let list = self.list.lock().unwrap();
        let mut out = Vec::new();
        for e in list.iter() {
            for fd in &e.handover {
                out.push(Handed {
                    kind: Kind::Listener,
                    addr: e.listen,
                    fd: fd.try_clone()?,
                });
            }
            if let Some(fd) = &e.lock {
                out.push(Handed {
                    kind: Kind::Lock,
                    addr: e.listen,
                    fd: fd.try_clone()?,
                });
            }
        }
        Ok(out)
    }

    /// Binds every listener of `cfgs` (start-up); nothing is served until `start`.
    pub(crate) fn bind_all(&self, cfgs: &[ListenerConfig]) -> Result<Vec<(Socks, Live)>, String> {
        let mut out = Vec::new();
        for c in cfgs {
            let l = live(c)?;
            let socks = self.bind(c.listen).map_err(|e| e.to_string())?;
            out.push((socks, l));
        }
        Ok(out)
    }

    /// Starts serving already-bound sockets for one address.
    pub(crate) fn start(&self, socks: Socks, live: Live, shared: &Arc<Shared>) {
        let Socks {
            copies: socks,
            lock,
        } = socks;
        // A socket whose duplicate fails is served but not handed over; an upgrade then
        // re-binds that address in the new process.
        let handover = socks
            .iter()
            .filter_map(|s| s.try_clone().ok().map(OwnedFd::from))
            .collect();
        let listen = live.cfg.listen;
        let local = socks
            .first()
            .and_then(|s| s.local_addr().ok())
            .unwrap_or(listen);
        let (stop, stop_rx) = watch::channel(false);
        let (close, close_rx) = watch::channel(false);
        let signals = Signals {
            stop_accepting: stop_rx,
            close_idle: close_rx,
        };
        let live = Arc::new(ArcSwap::from_pointee(live));
        let accepting = TaskTracker::new();
        let workers = self.workers.lock().unwrap().clone();
        for (i, sock) in socks.into_iter().enumerate() {
            if workers.is_empty() {
                match TcpListener::from_std(sock) {
                    Ok(l) => {
                        tokio::spawn(accepting.track_future(accept_loop(
                            l,
                            live.clone(),
                            shared.clone(),
                            signals.clone(),
                            self.conns.clone(),
                            None,
                        )));
                    }
                    Err(e) => {
                        tracing::error!(listener = %listen, error = %e, "listener could not join the runtime")
                    }
                }
            } else {
                let job = Job::Listen {
                    sock,
                    live: live.clone(),
                    signals: signals.clone(),
                    accepting: accepting.clone(),
                    balance: self.balance.clone(),
                };
                let _ = workers[i % workers.len()].send(job);
            }
        }
        self.list.lock().unwrap().push(Entry {
            listen,
            local,
            live,
            stop,
            close,
            accepting,
            handover,
            lock,
        });
    }

    /// The bound addresses, in config order.
    pub(crate) fn local_addrs(&self) -> Vec<SocketAddr> {
        self.list.lock().unwrap().iter().map(|e| e.local).collect()
    }

    /// Prepares a reload to `cfgs`: binds the new addresses and reads every certificate.
    pub(crate) fn plan(&self, cfgs: &[ListenerConfig]) -> Result<Plan, Vec<String>> {
        let list = self.list.lock().unwrap();
        let mut problems = Vec::new();
        let mut plan = Plan {
            update: Vec::new(),
            add: Vec::new(),
            remove: list
                .iter()
                .filter(|e| !cfgs.iter().any(|c| c.listen == e.listen))
                .map(|e| e.listen)
                .collect(),
        };
        for c in cfgs {
            let l = match live(c) {
                Ok(l) => l,
                Err(e) => {
                    problems.push(e);
                    continue;
                }
            };
            match list.iter().find(|e| e.listen == c.listen) {
                Some(e) => {
                    let changed = *e.live.load().cfg != *c;
                    plan.update.push((c.listen, l, changed));
                }
                None => match self.bind(c.listen) {
                    Ok(socks) => plan.add.push((socks, l)),
                    Err(e @ BindError::InUse(_)) => problems.push(format!("listener {e}")),
                    Err(e) => problems.push(format!("listener: {e}")),
                },
            }
        }
        if problems.is_empty() {
            Ok(plan)
        } else {
            Err(problems)
        }
    }

    /// Carries a prepared reload out.
    pub(crate) fn commit(&self, plan: Plan, shared: &Arc<Shared>) -> ListenerChanges {
        let mut ch = ListenerChanges::default();
        {
            let list = self.list.lock().unwrap();
            for (listen, l, changed) in plan.update {
                if let Some(e) = list.iter().find(|e| e.listen == listen) {
                    if l.tls.is_some() {
                        ch.certs_reloaded.push(e.local);
                    }
                    if changed {
                        ch.updated.push(e.local);
                    }
                    e.live.store(Arc::new(l));
                }
            }
        }
        for listen in plan.remove {
            let gone = {
                let mut list = self.list.lock().unwrap();
                let i = list.iter().position(|e| e.listen == listen);
                i.map(|i| list.remove(i))
            };
            if let Some(e) = gone {
                ch.closed.push(e.local);
                tokio::spawn(drain(e));
            }
        }
        for (socks, l) in plan.add {
            if let Some(a) = socks.copies.first().and_then(|s| s.local_addr().ok()) {
                ch.bound.push(a);
            }
            self.start(socks, l, shared);
        }
        ch
    }

    /// Stops accepting on every listener and waits until the accept loops have ended; then
    /// tells every connection to close once idle. No more listener can be added.
    pub(crate) async fn stop_all(&self) {
        let entries: Vec<Entry> = self.list.lock().unwrap().drain(..).collect();
        self.workers.lock().unwrap().clear();
        for e in &entries {
            let _ = e.stop.send(true);
            e.accepting.close();
        }
        for e in &entries {
            e.accepting.wait().await;
        }
        for e in &entries {
            let _ = e.close.send(true);
        }
    }
}

/// A listener a reload removed: stop accepting, then close its connections once idle.
async fn drain(e: Entry) {
    let _ = e.stop.send(true);
    e.accepting.close();
    e.accepting.wait().await;
    let _ = e.close.send(true);
    tracing::info!(listener = %e.local, "listener removed by reload: stopped accepting, connections drain");
}

/// One serving worker: a single-threaded runtime that runs the accept loops sent to it, and
/// lives until every tracked connection has finished; held to `cpu` when it names one.
pub(crate) fn serve_worker(
    id: usize,
    cpu: Option<usize>,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    shared: Arc<Shared>,
    conns: TaskTracker,
) {
    if let Some(cpu) = cpu {
        if let Err(e) = super::affinity::pin_current_thread(cpu) {
            tracing::warn!(worker = id, cpu, error = %e, "serving thread could not be pinned to its CPU; it runs unpinned");
        }
    }
    crate::pool::set_worker(id);
    // Its counts go into a shard of its own while it lives (`metrics::claim_shard`).
    let _shard = crate::metrics::claim_shard();
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
        let mine = TaskTracker::new();
        while let Some(job) = jobs.recv().await {
            match job {
                Job::Listen {
                    sock,
                    live,
                    signals,
                    accepting,
                    balance,
                } => match TcpListener::from_std(sock) {
                    Ok(l) => {
                        mine.spawn(accepting.track_future(accept_loop(
                            l,
                            live,
                            shared.clone(),
                            signals,
                            conns.clone(),
                            balance,
                        )));
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "listener could not join the worker runtime")
                    }
                },
                Job::Conn(m) => serve_moved(m, &shared, &conns),
            }
        }
        mine.close();
        mine.wait().await;
        // Connections accepted here are driven by this runtime: keep it until they end.
        conns.wait().await;
    });
}
