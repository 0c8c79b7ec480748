//! Process-wide state: the current config, routes and groups (swapped whole on reload), and
//! the lifecycle flags the probes read.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;

use crate::access_log::AccessLogger;
use crate::config::{AccessLog, Config, DnsConfig};
use crate::metrics::{Metrics, PerThread};
use crate::route::RouteTable;
use crate::server::listeners::Listeners;
use crate::upstream::{names, Group};

/// One consistent view of the config; requests load it once and keep it to the end.
pub struct State {
    /// The config it was built from.
    pub config: Arc<Config>,
    /// Compiled routes.
    pub routes: RouteTable,
    /// Groups by name (looked up per request; the names are the config's: `fxhash`).
    pub groups: HashMap<String, Arc<Group>, crate::fxhash::FxBuild>,
}

/// The current state as one serving thread holds it: a request keeps its thread's `Here`
/// (`Shared::state_here`) to the end, so the reference count it raises and lowers is on a
/// line of that thread's, not the one count of the `State` every thread would write.
pub struct Here(Arc<State>);

impl std::ops::Deref for Here {
    type Target = State;

    fn deref(&self) -> &State {
        &self.0
    }
}

/// What a reload did to the groups, for its log line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GroupChanges {
    /// Unchanged: the same group object goes on.
    pub kept: Vec<String>,
    /// Settings changed: rebuilt from the old group's addresses, peers and pool.
    pub rebuilt: Vec<String>,
    /// New in this config.
    pub added: Vec<String>,
    /// Gone from this config.
    pub removed: Vec<String>,
}

impl State {
    /// Builds state for `config` from `prev`: a group whose settings (and DNS settings, for a
    /// group of names) are unchanged is kept as it is; a changed one is carried over (see
    /// `Group::carry_over`), so no reload ever empties a group.
    pub fn build(
        config: Arc<Config>,
        prev: Option<&State>,
        shared: &Shared,
    ) -> Result<(State, GroupChanges), String> {
        let resolver = shared.resolver(&config.dns)?;
        let dns_same = prev.is_some_and(|p| p.config.dns == config.dns);
        let kube_same = prev.is_some_and(|p| p.config.kubernetes == config.kubernetes);
        let mut changes = GroupChanges::default();
        let mut groups = HashMap::default();
        for (name, gcfg) in &config.groups {
            let old = prev.and_then(|p| p.groups.get(name));
            let has_names = gcfg
                .endpoints
                .iter()
                .any(|e| matches!(e.source, crate::config::EndpointSource::Name { .. }));
            let has_kube = gcfg
                .endpoints
                .iter()
                .any(|e| matches!(e.source, crate::config::EndpointSource::Kubernetes { .. }));
            let group = match old {
                Some(g)
                    if g.config() == gcfg
                        && (dns_same || !has_names)
                        && (kube_same || !has_kube) =>
                {
                    changes.kept.push(name.clone());
                    g.clone()
                }
                _ => {
                    let g = match old {
                        Some(old) => {
                            changes.rebuilt.push(name.clone());
                            Group::carry_over(
                                name.clone(),
                                gcfg.clone(),
                                shared.metrics.clone(),
                                old,
                            )
                        }
                        None => {
                            if prev.is_some() {
                                changes.added.push(name.clone());
                            }
                            Group::new(name.clone(), gcfg.clone(), shared.metrics.clone())
                        }
                    };
                    names::start(&g, resolver.clone(), shared.metrics.clone());
                    crate::upstream::kubernetes::start(
                        &g,
                        &config.kubernetes,
                        shared.metrics.clone(),
                    );
                    crate::upstream::active::start(&g);
                    g
                }
            };
            groups.insert(name.clone(), group);
        }
        if let Some(p) = prev {
            changes.removed = p
                .groups
                .keys()
                .filter(|n| !groups.contains_key(*n))
                .cloned()
                .collect();
            changes.removed.sort();
        }
        Ok((
            State {
                routes: RouteTable::new(&config.routes).counted_in(&shared.metrics),
                config,
                groups,
            },
            changes,
        ))
    }
}

/// Everything the listeners, handlers and admin endpoints share.
pub struct Shared {
    /// The current state. Replaced only through `set_state`, which also replaces the
    /// per-thread handles requests take (`state_here`).
    pub state: ArcSwap<State>,
    /// The current state once per thread shard, for requests.
    here: PerThread<ArcSwap<Here>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Access log.
    pub access_log: AccessLogger,
    /// Config file, when serving from one (reload re-reads it).
    pub config_path: Option<PathBuf>,
    draining: AtomicBool,
    listeners_bound: AtomicBool,
    resolver: std::sync::Mutex<Option<(DnsConfig, Arc<upkeep_discovery::Resolver>)>>,
    listeners: OnceLock<Arc<Listeners>>,
    /// An access log given on the command line: it wins over the file's, reloads included.
    pinned_access_log: std::sync::Mutex<Option<AccessLog>>,
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
            groups: HashMap::default(),
            config,
        };
        let empty = Arc::new(empty);
        Arc::new(Self {
            here: PerThread::new(|| ArcSwap::from_pointee(Here(empty.clone()))),
            state: ArcSwap::new(empty),
            metrics,
            access_log,
            config_path,
            draining: AtomicBool::new(false),
            listeners_bound: AtomicBool::new(false),
            resolver: std::sync::Mutex::new(None),
            listeners: OnceLock::new(),
            pinned_access_log: std::sync::Mutex::new(None),
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

    /// The downstream listeners, once started.
    pub(crate) fn listeners(&self) -> Option<&Arc<Listeners>> {
        self.listeners.get()
    }

    pub(crate) fn set_listeners(&self, l: Arc<Listeners>) {
        let _ = self.listeners.set(l);
    }

    /// Keeps `dest` as the access log across reloads (it was given on the command line).
    pub fn pin_access_log(&self, dest: AccessLog) {
        *self.pinned_access_log.lock().unwrap() = Some(dest);
    }

    /// The access log given on the command line, if any.
    pub fn pinned_access_log(&self) -> Option<AccessLog> {
        self.pinned_access_log.lock().unwrap().clone()
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

    /// Replaces the state: for the admin's and the lifecycle's readers (`state`) and for every
    /// serving thread's requests (`state_here`). A request that started before keeps the
    /// state it took.
    pub fn set_state(&self, state: Arc<State>) {
        self.state.store(state.clone());
        for slot in self.here.all() {
            slot.store(Arc::new(Here(state.clone())));
        }
    }

    /// The current state for one request, held to its end: its thread's handle, whose count
    /// of references no other serving thread writes.
    #[inline]
    pub fn state_here(&self) -> Arc<Here> {
        self.here.here().load_full()
    }

    /// Applies a new config (validated already) in one swap: a request sees the old state
    /// or the new one, never a half-built one. The old state stays if building fails.
    pub fn apply(&self, config: Config) -> Result<GroupChanges, String> {
        let prev = self.state.load_full();
        let (next, changes) = State::build(Arc::new(config), Some(&prev), self)?;
        for name in &changes.rebuilt {
            // The replacement carries the panic state over: its gauge says so from the swap.
            if let Some(g) = next.groups.get(name) {
                self.metrics
                    .panic_mode
                    .get_or_create(&crate::metrics::GroupLabel {
                        group: name.clone(),
                    })
                    .set(g.in_panic() as i64);
            }
        }
        self.set_state(Arc::new(next));
        for name in &changes.removed {
            self.metrics.forget_group(name);
        }
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(port: u16) -> Arc<Config> {
        let text = format!(
            "[[listener]]\nlisten = \"127.0.0.1:{port}\"\n\n[[route]]\ngroup = \"g\"\n\n\
             [groups.g]\nendpoints = [\"127.0.0.1:9\"]\n"
        );
        Arc::new(crate::config::parse(Path::new("upkeep.toml"), &text).unwrap())
    }

    fn state(config: Arc<Config>) -> Arc<State> {
        Arc::new(State {
            routes: RouteTable::new(&[]),
            groups: HashMap::default(),
            config,
        })
    }

    #[test]
    fn every_thread_sees_a_new_state_at_once_and_the_old_one_is_let_go() {
        let shared = Shared::new(Metrics::new(), AccessLogger::off(), None, config(1));
        let old = state(config(2));
        shared.set_state(old.clone());
        // Each thread takes the state through its own shard's handle.
        let seen = |shared: &Shared| {
            std::thread::scope(|s| {
                let all: Vec<_> = (0..8)
                    .map(|_| s.spawn(|| shared.state_here().config.listeners[0].listen))
                    .collect();
                all.into_iter()
                    .map(|t| t.join().unwrap())
                    .collect::<Vec<_>>()
            })
        };
        assert!(seen(&shared).iter().all(|a| a.port() == 2));
        // A request that started before keeps the state it took.
        let held = shared.state_here();
        shared.set_state(state(config(3)));
        assert!(seen(&shared).iter().all(|a| a.port() == 3));
        assert_eq!(shared.state_here().config.listeners[0].listen.port(), 3);
        assert_eq!(held.config.listeners[0].listen.port(), 2);
        // Once that request ends, nothing but this test holds the old state: no idle thread
        // keeps it (and its groups' tasks) alive.
        drop(held);
        assert_eq!(Arc::strong_count(&old), 1);
    }
}
