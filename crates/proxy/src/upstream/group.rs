//! An upstream group: peers keyed by address across endpoints and tiers, replaced atomically
//! when discovery changes a name's addresses, picked with a panic threshold.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use rand::Rng;
use tokio::time::Instant;
use upkeep_discovery::{NameState, Outcome};

use super::peer::{FailureEffect, Peer};
use crate::config::{Balance, EndpointSource, GroupConfig};
use crate::error::NoPeersReason;
use crate::metrics::{Cells, GroupLabel, Metrics, PerThread};
use crate::pool::{Handle, Pool};

/// The current peers of a group, by tier.
#[derive(Debug, Default)]
pub struct PeerSet {
    tiers: Vec<Vec<Arc<Peer>>>,
    by_addr: HashMap<SocketAddr, Arc<Peer>>,
    /// Some name endpoint has never resolved and no peer exists at all.
    never_resolved: bool,
}

impl PeerSet {
    /// Every peer.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Peer>> {
        self.tiers.iter().flatten()
    }

    /// Number of peers.
    pub fn len(&self) -> usize {
        self.by_addr.len()
    }

    /// No peers.
    pub fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }

    /// Whether `addr` is a peer.
    pub fn contains(&self, addr: &SocketAddr) -> bool {
        self.by_addr.contains_key(addr)
    }
}

/// The addresses one endpoint currently contributes.
#[derive(Clone, Debug, Default)]
pub struct EndpointAddrs {
    /// Addresses (for a name: its resolved IPs with the endpoint's port).
    pub addrs: Vec<SocketAddr>,
    /// A name that has never resolved.
    pub never_resolved: bool,
}

/// An upstream group.
pub struct Group {
    name: String,
    cfg: GroupConfig,
    peers: ArcSwap<PeerSet>,
    endpoint_addrs: Mutex<Vec<EndpointAddrs>>,
    rr: AtomicUsize,
    pool: Arc<Pool>,
    /// Each serving thread's handle on `pool` (`Group::pool_here`).
    pool_here: PerThread<Arc<Handle>>,
    metrics: Arc<Metrics>,
    /// Requests in flight (slot 0), counted per thread shard: every request writes it, only
    /// a retry reads the sum.
    active_requests: Cells,
    active_retries: AtomicUsize,
    pub(crate) tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    degraded_since: Mutex<Option<Instant>>,
    panic: std::sync::atomic::AtomicBool,
    /// Connect-retry-window coordination: one prober at a time, the rest wait for it.
    window_probing: std::sync::atomic::AtomicBool,
    window_waiters: AtomicUsize,
    window_recovered: tokio::sync::Notify,
    /// Held from the panic-threshold check to the ejection, so failures recorded at once on
    /// several threads cannot each see room for one more ejection and together break it.
    eject_lock: Mutex<()>,
    /// Whether every peer has been failing to connect, and since when (fail fast).
    pub(super) down: super::down::DownState,
    /// What discovery last said about each name endpoint (by endpoint index); before the
    /// first lookup ends, the state carried over from the group this one replaced.
    name_states: Mutex<BTreeMap<usize, NameState>>,
    /// What EndpointSlice discovery last said about each `kubernetes` endpoint (by index).
    kube_states: Mutex<BTreeMap<usize, upkeep_kubernetes::ServiceState>>,
}

/// The group's pool: plain, or TLS for `https://` groups (warning loudly when verification
/// is off).
fn make_pool(name: &str, cfg: &GroupConfig, metrics: &Arc<Metrics>) -> Arc<Pool> {
    if cfg.tls.as_ref().is_some_and(|t| !t.verify) {
        tracing::warn!(group = %name, "TLS certificate verification is OFF for this group (verify = false): anyone on the path can impersonate its upstreams");
    }
    let tls = cfg
        .tls
        .as_ref()
        .map(|t| t.client.with_alpn(cfg.protocol.alpn()));
    Pool::for_protocol(cfg.pool.clone(), tls, cfg.protocol, metrics.clone())
}

impl Drop for Group {
    fn drop(&mut self) {
        for t in self.tasks.get_mut().unwrap().drain(..) {
            t.abort();
        }
    }
}

impl Group {
    /// A group whose static endpoints are peers at once; name endpoints start unresolved.
    pub fn new(name: String, cfg: GroupConfig, metrics: Arc<Metrics>) -> Arc<Self> {
        let endpoint_addrs = cfg
            .endpoints
            .iter()
            .map(|e| match &e.source {
                EndpointSource::Static(a) => EndpointAddrs {
                    addrs: vec![*a],
                    never_resolved: false,
                },
                EndpointSource::Name { .. } | EndpointSource::Kubernetes { .. } => EndpointAddrs {
                    addrs: Vec::new(),
                    never_resolved: true,
                },
            })
            .collect();
        let pool = make_pool(&name, &cfg, &metrics);
        let g = Arc::new(Self {
            name,
            cfg,
            peers: ArcSwap::from_pointee(PeerSet::default()),
            endpoint_addrs: Mutex::new(endpoint_addrs),
            rr: AtomicUsize::new(0),
            pool_here: Handle::per_thread(&pool),
            pool,
            metrics,
            active_requests: Cells::new(1),
            active_retries: AtomicUsize::new(0),
            tasks: Mutex::new(Vec::new()),
            degraded_since: Mutex::new(None),
            panic: std::sync::atomic::AtomicBool::new(false),
            window_probing: std::sync::atomic::AtomicBool::new(false),
            window_waiters: AtomicUsize::new(0),
            window_recovered: tokio::sync::Notify::new(),
            eject_lock: Mutex::new(()),
            down: super::down::DownState::default(),
            name_states: Mutex::new(BTreeMap::new()),
            kube_states: Mutex::new(BTreeMap::new()),
        });
        g.rebuild();
        g
    }

    /// The group that replaces `prev` on a reload that changed its settings: it starts from
    /// `prev`'s addresses, peers (health, ejections), pool and panic state wherever its
    /// endpoints are unchanged, so a reload never empties it. A name the new config adds in
    /// place of removed ones serves the removed names' addresses until its own first answer
    /// (last-known-good across the reload). Only what the new config removes goes away.
    pub fn carry_over(
        name: String,
        cfg: GroupConfig,
        metrics: Arc<Metrics>,
        prev: &Group,
    ) -> Arc<Self> {
        let old_eps = prev.endpoint_addrs.lock().unwrap().clone();
        let old_states = prev.name_states.lock().unwrap().clone();
        let old_kube = prev.kube_states.lock().unwrap().clone();
        let mut kube_carried = BTreeMap::new();
        let same = |a: &EndpointSource| prev.cfg.endpoints.iter().position(|e| &e.source == a);
        // Names the new config no longer lists: their addresses serve the names it adds until those answer.
        let removed: Vec<usize> = (0..prev.cfg.endpoints.len())
            .filter(|&j| {
                matches!(prev.cfg.endpoints[j].source, EndpointSource::Name { .. })
                    && !cfg
                        .endpoints
                        .iter()
                        .any(|e| e.source == prev.cfg.endpoints[j].source)
            })
            .collect();
        let mut endpoint_addrs = Vec::with_capacity(cfg.endpoints.len());
        let mut carried = BTreeMap::new();
        for (i, ep) in cfg.endpoints.iter().enumerate() {
            match &ep.source {
                EndpointSource::Static(a) => endpoint_addrs.push(EndpointAddrs {
                    addrs: vec![*a],
                    never_resolved: false,
                }),
                EndpointSource::Name { host, port } => match same(&ep.source) {
                    Some(j) => {
                        endpoint_addrs.push(old_eps[j].clone());
                        if let Some(st) = old_states.get(&j) {
                            carried.insert(i, st.clone());
                        }
                    }
                    None => {
                        let (ips, from) = removed_addrs(prev, &old_states, &removed, *port);
                        if !ips.is_empty() {
                            let mut st = NameState::new(host.clone());
                            st.addrs = Arc::from(ips.clone());
                            st.resolved_ever = true;
                            st.last_outcome = Outcome::Error(format!(
                                "not resolved yet; serving the addresses of {} until the first answer",
                                from.join(", ")
                            ));
                            carried.insert(i, st);
                        }
                        endpoint_addrs.push(EndpointAddrs {
                            addrs: ips.iter().map(|ip| SocketAddr::new(*ip, *port)).collect(),
                            never_resolved: ips.is_empty(),
                        });
                    }
                },
                // The same Service keeps its peers and watch state across the reload.
                EndpointSource::Kubernetes { .. } => match same(&ep.source) {
                    Some(j) => {
                        endpoint_addrs.push(old_eps[j].clone());
                        if let Some(st) = old_kube.get(&j) {
                            kube_carried.insert(i, st.clone());
                        }
                    }
                    None => endpoint_addrs.push(EndpointAddrs {
                        addrs: Vec::new(),
                        never_resolved: true,
                    }),
                },
            }
        }
        let pool = if prev.cfg.pool == cfg.pool
            && prev.cfg.tls == cfg.tls
            && prev.cfg.protocol == cfg.protocol
        {
            prev.pool.clone()
        } else {
            make_pool(&name, &cfg, &metrics)
        };
        let g = Arc::new(Self {
            name,
            cfg,
            // The old set, so that `rebuild` keeps each peer (and its health) by address.
            peers: ArcSwap::new(prev.peers()),
            endpoint_addrs: Mutex::new(endpoint_addrs),
            rr: AtomicUsize::new(prev.rr.load(Ordering::Relaxed)),
            pool_here: Handle::per_thread(&pool),
            pool,
            metrics,
            active_requests: Cells::new(1),
            active_retries: AtomicUsize::new(0),
            tasks: Mutex::new(Vec::new()),
            degraded_since: Mutex::new(*prev.degraded_since.lock().unwrap()),
            panic: std::sync::atomic::AtomicBool::new(prev.panic.load(Ordering::Relaxed)),
            window_probing: std::sync::atomic::AtomicBool::new(false),
            window_waiters: AtomicUsize::new(0),
            window_recovered: tokio::sync::Notify::new(),
            eject_lock: Mutex::new(()),
            down: super::down::DownState::default(),
            name_states: Mutex::new(carried),
            kube_states: Mutex::new(kube_carried),
        });
        g.rebuild();
        g
    }

    /// The state discovery of endpoint `index` starts from (carried over by a reload).
    pub fn carried_name_state(&self, index: usize) -> Option<NameState> {
        self.name_states.lock().unwrap().get(&index).cloned()
    }

    /// Whether the group is routing to all peers of a tier (panic threshold) right now.
    pub fn in_panic(&self) -> bool {
        self.panic.load(Ordering::Relaxed)
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The group's config.
    pub fn config(&self) -> &GroupConfig {
        &self.cfg
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// This thread's handle on the pool, to hold past the request's own borrow of the group.
    pub(crate) fn pool_here(&self) -> Arc<Handle> {
        self.pool_here.here().clone()
    }

    /// The current peer set.
    pub fn peers(&self) -> Arc<PeerSet> {
        self.peers.load_full()
    }

    /// Replaces the addresses of endpoint `index` (discovery) and swaps in a new peer set.
    pub fn set_endpoint_addrs(&self, index: usize, ips: &[IpAddr], never_resolved: bool) {
        let port = match self.cfg.endpoints.get(index).map(|e| &e.source) {
            Some(EndpointSource::Name { port, .. }) => *port,
            _ => return,
        };
        {
            let mut eps = self.endpoint_addrs.lock().unwrap();
            eps[index] = EndpointAddrs {
                addrs: ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect(),
                never_resolved,
            };
        }
        self.rebuild();
    }

    /// Replaces the addresses of `kubernetes` endpoint `index` (ports come from the slices)
    /// and swaps in a new peer set.
    pub fn set_endpoint_socket_addrs(
        &self,
        index: usize,
        addrs: &[SocketAddr],
        never_resolved: bool,
    ) {
        {
            let mut eps = self.endpoint_addrs.lock().unwrap();
            match eps.get_mut(index) {
                Some(e) => {
                    *e = EndpointAddrs {
                        addrs: addrs.to_vec(),
                        never_resolved,
                    }
                }
                None => return,
            }
        }
        self.rebuild();
    }

    /// Records what EndpointSlice discovery last said about endpoint `index`.
    pub fn set_kube_state(&self, index: usize, state: upkeep_kubernetes::ServiceState) {
        self.kube_states.lock().unwrap().insert(index, state);
    }

    /// What EndpointSlice discovery last said about each `kubernetes` endpoint.
    pub fn kube_states(&self) -> Vec<upkeep_kubernetes::ServiceState> {
        self.kube_states.lock().unwrap().values().cloned().collect()
    }

    /// The state EndpointSlice discovery of endpoint `index` starts from (carried over).
    pub fn carried_kube_state(&self, index: usize) -> Option<upkeep_kubernetes::ServiceState> {
        self.kube_states.lock().unwrap().get(&index).cloned()
    }

    /// Records what discovery last said about endpoint `index` (for `/upstreams` and for
    /// the group that replaces this one on a reload).
    pub fn set_name_state(&self, index: usize, state: NameState) {
        self.name_states.lock().unwrap().insert(index, state);
    }

    /// Every name endpoint has had at least one DNS answer (or failure), in this group or in
    /// the one it replaced.
    pub fn discovery_settled(&self) -> bool {
        let states = self.name_states.lock().unwrap();
        let kube = self.kube_states.lock().unwrap();
        self.cfg
            .endpoints
            .iter()
            .enumerate()
            .all(|(i, e)| match e.source {
                EndpointSource::Name { .. } => states.get(&i).is_some_and(|s| s.last_at.is_some()),
                EndpointSource::Kubernetes { .. } => {
                    kube.get(&i).is_some_and(|s| s.last_at.is_some())
                }
                EndpointSource::Static(_) => true,
            })
    }

    /// The `/upstreams` view of this group.
    pub fn view(&self) -> serde_json::Value {
        let now = Instant::now();
        let set = self.peers();
        let peers: Vec<_> = set
            .all()
            .map(|p| p.view(now, self.pool.idle_count(p.addr())))
            .collect();
        let names: Vec<_> = self
            .name_states
            .lock()
            .unwrap()
            .values()
            .filter(|s| s.last_at.is_some() || s.resolved_ever)
            .map(super::names::view)
            .collect();
        let kubernetes: Vec<_> = self
            .kube_states
            .lock()
            .unwrap()
            .values()
            .map(super::kubernetes::view)
            .collect();
        serde_json::json!({
            "required": self.cfg.required,
            "usable": self.is_usable(),
            "unusable_reason": self.unusable_reason().map(|r| r.as_str()),
            "names": names,
            "kubernetes": kubernetes,
            "peers": peers,
        })
    }

    /// Rebuilds the peer set from every endpoint's addresses, keeping the health state of
    /// peers whose address stays; readers see the old set or the new one, never a gap.
    fn rebuild(&self) {
        let eps = self.endpoint_addrs.lock().unwrap();
        let old = self.peers.load();
        let mut tiers: Vec<Vec<Arc<Peer>>> = Vec::new();
        let mut by_addr: HashMap<SocketAddr, Arc<Peer>> = HashMap::new();
        // Lowest tier first, so an address listed in two tiers lands in the better one.
        let mut order: Vec<usize> = (0..eps.len()).collect();
        order.sort_by_key(|&i| self.cfg.endpoints[i].tier);
        for i in order {
            let tier = self.cfg.endpoints[i].tier;
            for addr in &eps[i].addrs {
                if by_addr.contains_key(addr) {
                    continue;
                }
                let peer = match old.by_addr.get(addr) {
                    Some(p) if p.tier() == tier => p.clone(),
                    _ => Arc::new(Peer::new(*addr, tier)),
                };
                by_addr.insert(*addr, peer.clone());
                let t = tier as usize;
                if tiers.len() <= t {
                    tiers.resize_with(t + 1, Vec::new);
                }
                tiers[t].push(peer);
            }
        }
        tiers.retain(|t| !t.is_empty());
        let never_resolved = by_addr.is_empty() && eps.iter().any(|e| e.never_resolved);
        self.peers.store(Arc::new(PeerSet {
            tiers,
            by_addr,
            never_resolved,
        }));
    }

    fn min_healthy(&self, total: usize) -> usize {
        let pct = self.cfg.health.min_healthy_percent as usize;
        (total * pct).div_ceil(100).max(1).min(total)
    }

    /// Picks a peer not in `tried`: the first tier with a healthy untried peer; when no peer
    /// is healthy anywhere, panic mode over the first tier (all its peers), as Envoy does.
    pub fn pick(&self, tried: &[SocketAddr]) -> Result<Arc<Peer>, NoPeersReason> {
        self.pick_at(tried, Instant::now())
    }

    /// [`pick`](Self::pick) with the clock already read (`now`), by a caller that has.
    pub fn pick_at(&self, tried: &[SocketAddr], now: Instant) -> Result<Arc<Peer>, NoPeersReason> {
        let set = self.peers.load();
        if set.is_empty() {
            return Err(if set.never_resolved {
                NoPeersReason::NeverResolved
            } else {
                NoPeersReason::EmptyGroup
            });
        }
        let mut any_healthy = false;
        for tier in &set.tiers {
            let healthy = tier.iter().filter(|p| p.is_healthy(now));
            // On the stack for up to 16 peers: no allocation per request.
            let mut candidates: smallvec::SmallVec<[&Arc<Peer>; 16]> = smallvec::SmallVec::new();
            for p in healthy {
                any_healthy = true;
                if !tried.contains(&p.addr()) {
                    candidates.push(p);
                }
            }
            if let Some(p) = self.choose(&candidates) {
                self.set_panic(false);
                return Ok(p);
            }
        }
        // Nothing healthy and untried. If nothing is healthy at all, route to everything
        // rather than fail: a peer marked down may still answer (the panic threshold).
        let untried: Vec<&Arc<Peer>> = set
            .tiers
            .iter()
            .flatten()
            .filter(|p| !tried.contains(&p.addr()))
            .collect();
        if !any_healthy {
            self.set_panic(true);
            return self.choose(&untried).ok_or(NoPeersReason::AllTried);
        }
        Err(if untried.is_empty() {
            NoPeersReason::AllTried
        } else {
            NoPeersReason::AllEjected
        })
    }

    fn choose(&self, candidates: &[&Arc<Peer>]) -> Option<Arc<Peer>> {
        match candidates.len() {
            0 => None,
            1 => Some(candidates[0].clone()),
            n => match self.cfg.balance {
                Balance::RoundRobin => {
                    let i = self.rr.fetch_add(1, Ordering::Relaxed) % n;
                    Some(candidates[i].clone())
                }
                Balance::P2c => {
                    let mut rng = rand::rng();
                    let a = rng.random_range(0..n);
                    let mut b = rng.random_range(0..n - 1);
                    if b >= a {
                        b += 1;
                    }
                    let (pa, pb) = (candidates[a], candidates[b]);
                    Some(if pb.active() < pa.active() {
                        pb.clone()
                    } else {
                        pa.clone()
                    })
                }
            },
        }
    }

    fn set_panic(&self, on: bool) {
        // The gauge is touched only on a change, keeping the request path cheap. Read before
        // it is written: every request of every serving thread passes here, and a write per
        // request (even of the same value) would move the flag's cache line between cores.
        if self.panic.load(Ordering::Relaxed) != on && self.panic.swap(on, Ordering::Relaxed) != on
        {
            self.metrics
                .panic_mode
                .get_or_create(&GroupLabel {
                    group: self.name.clone(),
                })
                .set(on as i64);
            if on {
                tracing::warn!(group = %self.name, "no healthy peer: routing to all peers (panic mode)");
            }
        }
    }

    /// Records a success on `peer` of a request sent at `sent_at`.
    pub fn record_success(&self, peer: &Peer, sent_at: Instant) {
        peer.record_success(sent_at);
        self.record_connected(peer.addr());
    }

    /// Records a failure on `peer`; ejects it unless that would leave the group with fewer
    /// healthy peers than the panic threshold allows.
    pub fn record_failure(&self, peer: &Peer, weight: u32) -> FailureEffect {
        let set = self.peers.load();
        let _check_and_eject = self.eject_lock.lock().unwrap();
        let now = Instant::now();
        let effect = peer.record_failure(&self.cfg.health, weight, now, || {
            let healthy = set.all().filter(|p| p.is_healthy(now)).count();
            healthy > self.min_healthy(set.len())
        });
        match effect {
            FailureEffect::Ejected(t) => {
                self.metrics.peer_ejections.inc();
                tracing::warn!(group = %self.name, peer.addr = %peer.addr(), ejected_ms = t.as_millis() as u64, "peer ejected");
            }
            FailureEffect::KeptByPanicGuard => {
                tracing::debug!(group = %self.name, peer.addr = %peer.addr(), "failure threshold reached; kept by the panic threshold");
            }
            FailureEffect::Counted => {}
        }
        effect
    }

    /// Whether at least one peer can take traffic now (for readiness).
    pub fn is_usable(&self) -> bool {
        let set = self.peers.load();
        !set.is_empty()
    }

    /// Why the group is not usable, if it is not.
    pub fn unusable_reason(&self) -> Option<NoPeersReason> {
        let set = self.peers.load();
        if set.is_empty() {
            Some(if set.never_resolved {
                NoPeersReason::NeverResolved
            } else {
                NoPeersReason::EmptyGroup
            })
        } else {
            None
        }
    }

    /// Waits inside the connect retry window until this request should try to connect again.
    /// One request at a time is the prober: it waits a jittered 50-100 ms and tries. The
    /// others wait for a success (or re-check every 250 ms), so a blip of N held requests
    /// costs about 15 connect attempts a second, not 15 x N.
    pub async fn connect_window_wait(&self, until: Instant) {
        loop {
            let now = Instant::now();
            if now >= until {
                return;
            }
            if !self.window_probing.swap(true, Ordering::AcqRel) {
                // Released on drop too, so a cancelled prober never stalls the others.
                struct Probing<'a>(&'a std::sync::atomic::AtomicBool);
                impl Drop for Probing<'_> {
                    fn drop(&mut self) {
                        self.0.store(false, Ordering::Release);
                    }
                }
                let _probing = Probing(&self.window_probing);
                tokio::time::sleep(jitter(
                    std::time::Duration::from_millis(50),
                    std::time::Duration::from_millis(100),
                ))
                .await;
                return;
            }
            // A guard, so a request dropped while it waits (client gone) is no waiter any more.
            struct Waiting<'a>(&'a AtomicUsize);
            impl Drop for Waiting<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::AcqRel);
                }
            }
            self.window_waiters.fetch_add(1, Ordering::AcqRel);
            let waiting = Waiting(&self.window_waiters);
            let woken = tokio::time::timeout_at(
                until.min(now + std::time::Duration::from_millis(250)),
                self.window_recovered.notified(),
            )
            .await;
            drop(waiting);
            if woken.is_ok() {
                // Spread the herd over 50 ms: hundreds of SYNs at one instant overflow the
                // peer's SYN backlog, and a dropped SYN costs a 1 s retransmit.
                tokio::time::sleep(jitter(
                    std::time::Duration::ZERO,
                    std::time::Duration::from_millis(50),
                ))
                .await;
                return;
            }
        }
    }

    /// A request succeeded: requests waiting in the connect retry window go now.
    pub fn connect_window_recovered(&self) {
        if self.window_waiters.load(Ordering::Acquire) > 0 {
            self.window_recovered.notify_waiters();
        }
    }

    /// Counts a request in flight for the retry budget; the guard ends it.
    pub fn start_request(&self) -> RequestGuard<'_> {
        self.active_requests.add(0, 1);
        RequestGuard { group: self }
    }

    /// Degraded-state tracking for optional groups: returns how long it has been unusable.
    pub fn degraded_for(&self) -> Option<std::time::Duration> {
        let usable = self.is_usable();
        let mut since = self.degraded_since.lock().unwrap();
        if usable {
            *since = None;
            return None;
        }
        let start = *since.get_or_insert_with(Instant::now);
        Some(start.elapsed())
    }
}

/// One request's claim on the retry budget. Both guards borrow the group: a reference count
/// taken and given back per request would be two more writes to memory every serving thread
/// shares.
pub struct RequestGuard<'a> {
    group: &'a Group,
}

/// One retry attempt in flight; releases its place in the budget when dropped.
pub struct RetryPermit<'a> {
    group: &'a Group,
}

impl<'a> RequestGuard<'a> {
    /// Takes a place for one retry attempt: retries in flight may be at most
    /// `budget_percent` of active requests, but `budget_min` are always allowed (Envoy's
    /// retry budget). The place is held until the attempt ends.
    pub fn try_retry(&mut self) -> Option<RetryPermit<'a>> {
        let g = self.group;
        // A guard may end on another thread than it started: a sum read while its count is
        // on its way from one shard to the other may wrap below zero, and counts as none.
        let active = usize::try_from(g.active_requests.sum(0) as i64).unwrap_or(0);
        let allowed = (active * g.cfg.retry.budget_percent as usize / 100)
            .max(g.cfg.retry.budget_min as usize);
        let prev = g.active_retries.fetch_add(1, Ordering::Relaxed);
        if prev >= allowed {
            g.active_retries.fetch_sub(1, Ordering::Relaxed);
            g.metrics.retry_budget_exhausted.inc();
            return None;
        }
        Some(RetryPermit { group: g })
    }
}

impl Drop for RetryPermit<'_> {
    fn drop(&mut self) {
        self.group.active_retries.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for RequestGuard<'_> {
    fn drop(&mut self) {
        self.group.active_requests.sub(0, 1);
    }
}

/// The addresses of the `removed` name endpoints of `prev` (those with `port` first), and
/// the names they came from.
fn removed_addrs(
    prev: &Group,
    states: &BTreeMap<usize, NameState>,
    removed: &[usize],
    port: u16,
) -> (Vec<IpAddr>, Vec<String>) {
    let port_of = |j: usize| match &prev.cfg.endpoints[j].source {
        EndpointSource::Name { port, .. } => *port,
        EndpointSource::Static(a) => a.port(),
        EndpointSource::Kubernetes { .. } => 0,
    };
    let same_port: Vec<usize> = removed
        .iter()
        .copied()
        .filter(|&j| port_of(j) == port)
        .collect();
    let pick = if same_port.is_empty() {
        removed.to_vec()
    } else {
        same_port
    };
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut from = Vec::new();
    for j in pick {
        if let Some(st) = states.get(&j).filter(|s| !s.addrs.is_empty()) {
            ips.extend(st.addrs.iter().copied());
            from.push(st.name.clone());
        }
    }
    ips.sort_unstable();
    ips.dedup();
    (ips, from)
}

/// A random delay in `[lo, hi)`, for jittered backoff.
pub fn jitter(lo: std::time::Duration, hi: std::time::Duration) -> std::time::Duration {
    let (lo, hi) = (lo.as_micros() as u64, hi.as_micros() as u64);
    std::time::Duration::from_micros(if hi > lo {
        rand::rng().random_range(lo..hi)
    } else {
        lo
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Endpoint, HealthConfig};

    fn group(addrs: &[&str], tiers: &[u8]) -> Arc<Group> {
        let eps = addrs
            .iter()
            .zip(tiers)
            .map(|(a, t)| Endpoint {
                source: EndpointSource::Static(a.parse().unwrap()),
                tier: *t,
                https: false,
            })
            .collect();
        let mut cfg = GroupConfig::with_endpoints(eps);
        cfg.health = HealthConfig {
            consecutive_failures: 1,
            ..HealthConfig::default()
        };
        Group::new("g".into(), cfg, Metrics::new())
    }

    #[tokio::test(start_paused = true)]
    async fn panic_threshold_never_ejects_the_last_healthy_half() {
        let g = group(
            &["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"],
            &[0, 0, 0, 0],
        );
        let set = g.peers();
        let peers: Vec<_> = set.all().cloned().collect();
        let effects: Vec<_> = peers.iter().map(|p| g.record_failure(p, 1)).collect();
        let ejected = effects
            .iter()
            .filter(|e| matches!(e, FailureEffect::Ejected(_)))
            .count();
        assert_eq!(ejected, 2, "50% of 4 must stay: {effects:?}");
        let now = Instant::now();
        assert_eq!(peers.iter().filter(|p| p.is_healthy(now)).count(), 2);
    }

    #[test]
    fn concurrent_failures_never_eject_below_the_panic_threshold() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _rt = rt.enter();
        let addrs = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"];
        for round in 0..300 {
            let g = group(&addrs, &[0, 0, 0, 0]);
            let peers: Vec<_> = g.peers().all().cloned().collect();
            let start = std::sync::Barrier::new(peers.len());
            // Every peer fails at the same moment on its own thread, as on serving threads.
            std::thread::scope(|s| {
                for p in &peers {
                    let (g, start) = (&g, &start);
                    s.spawn(move || {
                        start.wait();
                        g.record_failure(p, 1)
                    });
                }
            });
            let now = Instant::now();
            let healthy = peers.iter().filter(|p| p.is_healthy(now)).count();
            assert_eq!(healthy, 2, "round {round}: 50% of 4 must stay healthy");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failed_trial_after_an_ejection_re_ejects_with_a_longer_time() {
        let g = group(&["127.0.0.1:1", "127.0.0.1:2"], &[0, 0]);
        let p = g.peers().all().next().unwrap().clone();
        assert_eq!(
            g.record_failure(&p, 1),
            FailureEffect::Ejected(std::time::Duration::from_secs(2))
        );
        tokio::time::advance(std::time::Duration::from_secs(2)).await;
        assert!(p.is_healthy(Instant::now()), "trial allowed");
        assert_eq!(
            g.record_failure(&p, 1),
            FailureEffect::Ejected(std::time::Duration::from_secs(4))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn single_peer_is_never_ejected() {
        let g = group(&["127.0.0.1:1"], &[0]);
        let p = g.peers().all().next().unwrap().clone();
        for _ in 0..10 {
            assert_eq!(g.record_failure(&p, 1), FailureEffect::KeptByPanicGuard);
        }
        assert!(g.pick(&[]).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn same_address_from_two_endpoints_is_one_peer() {
        let g = group(&["127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:2"], &[0, 0, 1]);
        assert_eq!(g.peers().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn lower_tier_is_used_only_when_the_first_has_no_healthy_peer() {
        let g = group(&["127.0.0.1:1", "127.0.0.1:2"], &[0, 1]);
        for _ in 0..5 {
            assert_eq!(g.pick(&[]).unwrap().addr().port(), 1);
        }
        let first = g.pick(&[]).unwrap();
        assert!(matches!(
            g.record_failure(&first, 1),
            FailureEffect::Ejected(_)
        ));
        assert_eq!(g.pick(&[]).unwrap().addr().port(), 2);
        // A retry after tier 0 failed goes to tier 1 even while tier 0 is healthy.
        first.record_success(Instant::now());
        assert_eq!(
            g.pick(&["127.0.0.1:1".parse().unwrap()])
                .unwrap()
                .addr()
                .port(),
            2
        );
    }

    #[tokio::test(start_paused = true)]
    async fn name_endpoint_that_never_resolved_reports_never_resolved() {
        let cfg = GroupConfig::with_endpoints(vec![Endpoint {
            source: EndpointSource::Name {
                host: "app.upkeep.test".into(),
                port: 80,
            },
            tier: 0,
            https: false,
        }]);
        let g = Group::new("g".into(), cfg, Metrics::new());
        assert_eq!(g.pick(&[]).unwrap_err(), NoPeersReason::NeverResolved);
        g.set_endpoint_addrs(0, &["127.0.0.9".parse().unwrap()], false);
        assert_eq!(g.pick(&[]).unwrap().addr(), "127.0.0.9:80".parse().unwrap());
        g.set_endpoint_addrs(0, &[], false);
        assert_eq!(g.pick(&[]).unwrap_err(), NoPeersReason::EmptyGroup);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_budget_allows_the_floor_then_refuses() {
        let g = group(&["127.0.0.1:1"], &[0]);
        let mut guards: Vec<_> = (0..10).map(|_| g.start_request()).collect();
        let permits: Vec<_> = guards.iter_mut().filter_map(|r| r.try_retry()).collect();
        // 20% of 10 = 2, floor 3.
        assert_eq!(permits.len(), 3);
        // A finished retry gives its place back.
        drop(permits);
        assert!(guards[0].try_retry().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn retry_budget_counts_requests_of_every_thread_and_guards_ended_elsewhere() {
        let g = group(&["127.0.0.1:1"], &[0]);
        // 40 requests, each started on a thread of its own (each thread counts in its own
        // shard), all ended here.
        let mut guards: Vec<_> = std::thread::scope(|s| {
            let started: Vec<_> = (0..40).map(|_| s.spawn(|| g.start_request())).collect();
            started.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let permits: Vec<_> = guards.iter_mut().filter_map(|r| r.try_retry()).collect();
        // 20% of 40 = 8, above the floor of 3.
        assert_eq!(permits.len(), 8);
        drop(permits);
        drop(guards);
        // Every count came back though no guard ended where it started: one request in
        // flight allows the floor again.
        let mut one = g.start_request();
        let permits: Vec<_> = (0..10).filter_map(|_| one.try_retry()).collect();
        assert_eq!(permits.len(), 3);
    }
}
