//! The fake API server's objects: Services and their EndpointSlices (one slice per port, as
//! the EndpointSlice controller splits them), a resourceVersion that every change bumps, and
//! the event history watches resume from, compacted on demand to provoke 410 Gone.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::{json, Value};

/// One endpoint of a Service, with its EndpointSlice conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Address and port.
    pub addr: SocketAddr,
    /// `conditions.ready`.
    pub ready: bool,
    /// `conditions.serving`.
    pub serving: bool,
    /// `conditions.terminating`.
    pub terminating: bool,
    /// `zone`.
    pub zone: Option<String>,
}

impl Endpoint {
    /// A ready endpoint.
    pub fn ready(addr: SocketAddr) -> Self {
        Self {
            addr,
            ready: true,
            serving: true,
            terminating: false,
            zone: None,
        }
    }

    /// A terminating endpoint that still serves (a pod in its grace period).
    pub fn terminating(addr: SocketAddr) -> Self {
        Self {
            addr,
            ready: false,
            serving: true,
            terminating: true,
            zone: None,
        }
    }
}

/// A watch event as the API server streams it.
#[derive(Clone, Debug)]
pub struct Event {
    /// The resourceVersion it happened at.
    pub rv: u64,
    /// Namespace of the object.
    pub namespace: String,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    /// The EndpointSlice.
    pub object: Value,
}

#[derive(Debug, Default)]
struct Service {
    port_name: String,
    endpoints: Vec<Endpoint>,
    /// Slices by port, with the resourceVersion each was last written at.
    slices: BTreeMap<u16, u64>,
}

/// Every object of the fake API server.
#[derive(Debug)]
pub struct Store {
    rv: u64,
    oldest: u64,
    services: BTreeMap<(String, String), Service>,
    history: Vec<Event>,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            rv: 1,
            oldest: 1,
            services: BTreeMap::new(),
            history: Vec::new(),
        }
    }
}

/// Why a watch cannot resume.
#[derive(Debug, PartialEq, Eq)]
pub struct Expired {
    /// The oldest resourceVersion still held.
    pub oldest: u64,
}

impl Store {
    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Whether the Service exists.
    pub fn has_service(&self, ns: &str, name: &str) -> bool {
        self.services
            .contains_key(&(ns.to_owned(), name.to_owned()))
    }

    /// Sets a Service's endpoints (creating it), emitting one event per changed slice.
    pub fn set_endpoints(
        &mut self,
        ns: &str,
        name: &str,
        port_name: &str,
        eps: Vec<Endpoint>,
    ) -> Vec<Event> {
        let key = (ns.to_owned(), name.to_owned());
        let svc = self.services.entry(key).or_default();
        svc.port_name = port_name.to_owned();
        svc.endpoints = eps;
        self.sync(ns, name, false)
    }

    /// Deletes a Service and its slices.
    pub fn delete_service(&mut self, ns: &str, name: &str) -> Vec<Event> {
        let events = self.sync(ns, name, true);
        self.services.remove(&(ns.to_owned(), name.to_owned()));
        events
    }

    /// Marks the given endpoints of a Service terminating (ready false, serving true).
    pub fn terminate(&mut self, ns: &str, name: &str, addrs: &[SocketAddr]) -> Vec<Event> {
        let Some(svc) = self.services.get_mut(&(ns.to_owned(), name.to_owned())) else {
            return Vec::new();
        };
        for e in &mut svc.endpoints {
            if addrs.contains(&e.addr) {
                *e = Endpoint {
                    zone: e.zone.take(),
                    ..Endpoint::terminating(e.addr)
                };
            }
        }
        self.sync(ns, name, false)
    }

    /// Drops the history, so that a watch resuming from before now gets 410 Gone.
    pub fn compact(&mut self) {
        self.rv += 1;
        self.oldest = self.rv;
        self.history.clear();
    }

    /// The slices of one Service (or of every Service of `ns` when `service` is None).
    pub fn list(&self, ns: &str, service: Option<&str>) -> Vec<Value> {
        let mut out = Vec::new();
        for ((n, name), svc) in &self.services {
            if n != ns || service.is_some_and(|s| s != name) {
                continue;
            }
            for (port, rv) in &svc.slices {
                out.push(slice(ns, name, svc, *port, *rv));
            }
        }
        out
    }

    /// Events after `from` for `ns` (and `service`), or Expired when they were compacted.
    pub fn since(&self, from: u64, ns: &str, service: Option<&str>) -> Result<Vec<Event>, Expired> {
        if from + 1 < self.oldest {
            return Err(Expired {
                oldest: self.oldest,
            });
        }
        Ok(self
            .history
            .iter()
            .filter(|e| e.rv > from && matches(e, ns, service))
            .cloned()
            .collect())
    }

    /// The Service object, when it exists.
    pub fn service(&self, ns: &str, name: &str) -> Option<Value> {
        self.services.get(&(ns.to_owned(), name.to_owned())).map(|_| {
            json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": ns, "resourceVersion": self.rv.to_string()},
                "spec": {"clusterIP": "None"},
            })
        })
    }

    /// Rewrites a Service's slices from its endpoints; `deleting` removes them all.
    fn sync(&mut self, ns: &str, name: &str, deleting: bool) -> Vec<Event> {
        let key = (ns.to_owned(), name.to_owned());
        let Some(svc) = self.services.get_mut(&key) else {
            return Vec::new();
        };
        let mut ports: Vec<u16> = if deleting {
            Vec::new()
        } else {
            svc.endpoints.iter().map(|e| e.addr.port()).collect()
        };
        ports.sort_unstable();
        ports.dedup();
        let mut events = Vec::new();
        let old: Vec<u16> = svc.slices.keys().copied().collect();
        // A Service whose endpoints are all gone keeps one empty slice, as the controller does.
        if ports.is_empty() && !deleting {
            if let Some(p) = old.first() {
                ports.push(*p);
            }
        }
        for port in old.iter().filter(|p| !ports.contains(p)) {
            self.rv += 1;
            let object = slice(ns, name, svc, *port, self.rv);
            svc.slices.remove(port);
            events.push(Event {
                rv: self.rv,
                namespace: ns.to_owned(),
                kind: "DELETED",
                object,
            });
        }
        for port in ports {
            self.rv += 1;
            let kind = if svc.slices.insert(port, self.rv).is_some() {
                "MODIFIED"
            } else {
                "ADDED"
            };
            events.push(Event {
                rv: self.rv,
                namespace: ns.to_owned(),
                kind,
                object: slice(ns, name, svc, port, self.rv),
            });
        }
        self.history.extend(events.iter().cloned());
        events
    }
}

fn matches(e: &Event, ns: &str, service: Option<&str>) -> bool {
    e.namespace == ns
        && service.is_none_or(|s| {
            e.object["metadata"]["labels"]["kubernetes.io/service-name"].as_str() == Some(s)
        })
}

/// The EndpointSlice JSON for one port of a Service, as the API server sends it.
fn slice(ns: &str, name: &str, svc: &Service, port: u16, rv: u64) -> Value {
    let endpoints: Vec<Value> = svc
        .endpoints
        .iter()
        .filter(|e| e.addr.port() == port)
        .map(|e| {
            let mut v = json!({
                "addresses": [e.addr.ip().to_string()],
                "conditions": {"ready": e.ready, "serving": e.serving, "terminating": e.terminating},
            });
            if let Some(z) = &e.zone {
                v["zone"] = json!(z);
            }
            v
        })
        .collect();
    let v6 = svc
        .endpoints
        .iter()
        .any(|e| e.addr.is_ipv6() && e.addr.port() == port);
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{name}-{port}"),
            "namespace": ns,
            "resourceVersion": rv.to_string(),
            "labels": {
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": if v6 { "IPv6" } else { "IPv4" },
        "endpoints": endpoints,
        "ports": [{"name": svc.port_name, "port": port, "protocol": "TCP"}],
    })
}
