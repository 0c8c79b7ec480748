//! The fake API server's objects: Services and their EndpointSlices (one slice per port and
//! slice group, as the EndpointSlice controller splits a large or rolling Service), a resourceVersion that every change bumps, and
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
    /// The slice it is in: `""` is `NAME-PORT`, `g` is `NAME-PORT-g`.
    pub slice: String,
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
            slice: String::new(),
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
            slice: String::new(),
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
    /// Slices by port and group, with the resourceVersion each was last written at.
    slices: BTreeMap<(u16, String), u64>,
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

    /// Sets the endpoints of one slice group of a Service (creating it), leaving the others'
    /// endpoints as they are; one event per slice, as the controller writes them one by one.
    pub fn set_slice(
        &mut self,
        ns: &str,
        name: &str,
        port_name: &str,
        group: &str,
        eps: Vec<Endpoint>,
    ) -> Vec<Event> {
        let key = (ns.to_owned(), name.to_owned());
        let svc = self.services.entry(key).or_default();
        svc.port_name = port_name.to_owned();
        svc.endpoints.retain(|e| e.slice != group);
        svc.endpoints.extend(eps.into_iter().map(|e| Endpoint {
            slice: group.to_owned(),
            ..e
        }));
        self.sync(ns, name, false)
    }

    /// Moves endpoints from slice group `from` to `to` the way a controller does it: `from` is
    /// written first (without them), then `to` (with them), two separate events.
    pub fn move_endpoints(
        &mut self,
        ns: &str,
        name: &str,
        from: &str,
        to: &str,
        addrs: &[SocketAddr],
    ) -> Vec<Event> {
        let Some(svc) = self.services.get(&(ns.to_owned(), name.to_owned())) else {
            return Vec::new();
        };
        let port_name = svc.port_name.clone();
        let group = |g: &str| -> Vec<Endpoint> {
            svc.endpoints
                .iter()
                .filter(|e| e.slice == g)
                .cloned()
                .collect()
        };
        let (mut src, mut dst) = (group(from), group(to));
        let moved: Vec<Endpoint> = src
            .iter()
            .filter(|e| addrs.contains(&e.addr))
            .cloned()
            .collect();
        src.retain(|e| !addrs.contains(&e.addr));
        dst.extend(moved);
        let mut events = self.set_slice(ns, name, &port_name, from, src);
        events.extend(self.set_slice(ns, name, &port_name, to, dst));
        events
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
            for (key, rv) in &svc.slices {
                out.push(slice(ns, name, svc, key, *rv));
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
        let mut keys: Vec<(u16, String)> = if deleting {
            Vec::new()
        } else {
            svc.endpoints
                .iter()
                .map(|e| (e.addr.port(), e.slice.clone()))
                .collect()
        };
        keys.sort_unstable();
        keys.dedup();
        let mut events = Vec::new();
        let old: Vec<(u16, String)> = svc.slices.keys().cloned().collect();
        // A Service whose endpoints are all gone keeps one empty slice, as the controller does.
        if keys.is_empty() && !deleting {
            if let Some(k) = old.first() {
                keys.push(k.clone());
            }
        }
        for key in old.iter().filter(|k| !keys.contains(k)) {
            self.rv += 1;
            let object = slice(ns, name, svc, key, self.rv);
            svc.slices.remove(key);
            events.push(Event {
                rv: self.rv,
                namespace: ns.to_owned(),
                kind: "DELETED",
                object,
            });
        }
        for key in keys {
            self.rv += 1;
            let object = slice(ns, name, svc, &key, self.rv);
            let kind = if svc.slices.insert(key, self.rv).is_some() {
                "MODIFIED"
            } else {
                "ADDED"
            };
            events.push(Event {
                rv: self.rv,
                namespace: ns.to_owned(),
                kind,
                object,
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

/// The EndpointSlice JSON for one port and group of a Service, as the API server sends it.
fn slice(ns: &str, name: &str, svc: &Service, key: &(u16, String), rv: u64) -> Value {
    let (port, group) = (key.0, key.1.as_str());
    let endpoints: Vec<Value> = svc
        .endpoints
        .iter()
        .filter(|e| e.addr.port() == port && e.slice == group)
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
        .any(|e| e.addr.is_ipv6() && e.addr.port() == port && e.slice == group);
    let slice_name = if group.is_empty() {
        format!("{name}-{port}")
    } else {
        format!("{name}-{port}-{group}")
    };
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name,
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
