//! Process-wide state: the current config, routes and groups (swapped whole on reload), and
//! the lifecycle flags the probes read.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::access_log::AccessLogger;
use crate::config::{Config, DnsConfig};
use crate::metrics::Metrics;
use crate::route::RouteTable;
use crate::upstream::{names, Group};

/// One consistent view of the config; requests load it once and keep it to the end.
pub struct State {
    /// The config it was built from.
    pub config: Arc<Config>,
    /// Compiled routes.
    pub routes: RouteTable,
    /// Groups by name.
    pub groups: HashMap<String, Arc<Group>>,
}

impl State {
    /// Builds state for `config`, keeping every group of `prev` whose config is unchanged
    /// (its peers, health and pool survive the reload).
    pub fn build(
        config: Arc<Config>,
        prev: Option<&State>,
        shared: &Shared,
    ) -> Result<State, String> {
        let resolver = shared.resolver(&config.dns)?;
        let mut groups = HashMap::new();
        for (name, gcfg) in &config.groups {
            let kept = prev
                .and_then(|p| p.groups.get(name))
                .filter(|g| g.config() == gcfg);
            let group = match kept {
                Some(g) => g.clone(),
                None => {
                    let g = Group::new(name.clone(), gcfg.clone(), shared.metrics.clone());
                    names::start(&g, resolver.clone(), shared.metrics.clone());
                    crate::upstream::active::start(&g);
                    g
                }
            };
            groups.insert(name.clone(), group);
        }
        Ok(State {
            routes: RouteTable::new(&config.routes),
            config,
            groups,
        })
    }
}

/// Everything the listeners, handlers and admin endpoints share.
pub struct Shared {
    /// The current state.
    pub state: ArcSwap<State>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Access log.
    pub access_log: AccessLogger,
    /// Config file, when serving from one (reload re-reads it).
    pub config_path: Option<PathBuf>,
    draining: AtomicBool,
    listeners_bound: AtomicBool,
    resolver: std::sync::Mutex<Option<(DnsConfig, Arc<upkeep_discovery::Resolver>)>>,
}

impl Shared {
    /// Shared state before the first config is built.
    pub fn new(
        metrics: Arc<Metrics>,
        access_log: AccessLogger,
        config_path: Option<PathBuf>,
        config: Arc<Config>,
    ) -> Arc<Self> {
        let empty = State {
            routes: RouteTable::new(&[]),
            groups: HashMap::new(),
            config,
        };
        Arc::new(Self {
            state: ArcSwap::from_pointee(empty),
            metrics,
            access_log,
            config_path,
            draining: AtomicBool::new(false),
            listeners_bound: AtomicBool::new(false),
            resolver: std::sync::Mutex::new(None),
        })
    }

    /// The resolver for `dns`, reused while the DNS settings stay the same.
    pub fn resolver(&self, dns: &DnsConfig) -> Result<Arc<upkeep_discovery::Resolver>, String> {
        let mut cur = self.resolver.lock().unwrap();
        if let Some((c, r)) = cur.as_ref() {
            if c == dns {
                return Ok(r.clone());
            }
        }
        let r = if dns.servers.is_empty() {
            Arc::new(
                upkeep_discovery::Resolver::system(dns.timeout)
                    .map_err(|e| format!("system resolver: {e}"))?,
            )
        } else {
            Arc::new(upkeep_discovery::Resolver::with_servers(
                &dns.servers,
                dns.timeout,
            ))
        };
        *cur = Some((dns.clone(), r.clone()));
        Ok(r)
    }

    /// Readiness is failing on purpose: SIGTERM was received.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Starts draining.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
        self.metrics.draining.set(1);
    }

    /// Every listener is bound.
    pub fn listeners_bound(&self) -> bool {
        self.listeners_bound.load(Ordering::Relaxed)
    }

    /// Marks every listener bound.
    pub fn set_listeners_bound(&self) {
        self.listeners_bound.store(true, Ordering::Relaxed);
    }

    /// Applies a new config (validated already); the old state stays if building fails.
    pub fn apply(&self, config: Config) -> Result<(), String> {
        let prev = self.state.load_full();
        let next = State::build(Arc::new(config), Some(&prev), self)?;
        self.state.store(Arc::new(next));
        Ok(())
    }
}
