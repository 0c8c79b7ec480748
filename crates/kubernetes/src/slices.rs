//! The model: which addresses an EndpointSlice set gives for one Service port, with the
//! conditions and zone of each.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::discovery::v1::EndpointSlice;

/// A Service, `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceRef {
    /// Namespace.
    pub namespace: String,
    /// Service name.
    pub name: String,
}

impl std::fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Which port of the Service's endpoints to use.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortSel {
    /// The Service port of this name (the EndpointSlice port name).
    Name(String),
    /// The endpoint port of this number.
    Number(u16),
    /// The only port the slices list.
    Only,
}

impl std::fmt::Display for PortSel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortSel::Name(n) => f.write_str(n),
            PortSel::Number(p) => write!(f, "{p}"),
            PortSel::Only => f.write_str("(only port)"),
        }
    }
}

/// One endpoint address of a Service port, with its EndpointSlice conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Address and port.
    pub addr: SocketAddr,
    /// Ready for new requests (`conditions.ready`; unset means ready).
    pub ready: bool,
    /// Able to serve (`conditions.serving`; unset means as `ready`).
    pub serving: bool,
    /// Shutting down (`conditions.terminating`; unset means not).
    pub terminating: bool,
    /// The zone the endpoint runs in, kept for zone-aware balancing later.
    pub zone: Option<String>,
}

/// The endpoints of `port` across `slices`, one per address (a ready one wins when two
/// slices list the same address, as they may during an update).
pub fn endpoints<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    port: &PortSel,
) -> Vec<Endpoint> {
    let mut out: BTreeMap<SocketAddr, Endpoint> = BTreeMap::new();
    for s in slices {
        if s.address_type != "IPv4" && s.address_type != "IPv6" {
            continue;
        }
        let Some(number) = slice_port(s, port) else {
            continue;
        };
        for e in &s.endpoints {
            let c = e.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            for a in &e.addresses {
                let Ok(ip) = a.parse::<IpAddr>() else {
                    continue;
                };
                let ep = Endpoint {
                    addr: SocketAddr::new(ip, number),
                    ready,
                    serving,
                    terminating,
                    zone: e.zone.clone(),
                };
                match out.get(&ep.addr) {
                    Some(old) if old.ready || !ep.ready => {}
                    _ => {
                        out.insert(ep.addr, ep);
                    }
                }
            }
        }
    }
    out.into_values().collect()
}

/// The port number `sel` names in one slice (TCP only), if the slice has it.
fn slice_port(s: &EndpointSlice, sel: &PortSel) -> Option<u16> {
    let ports = s.ports.as_deref().unwrap_or(&[]);
    let tcp = ports
        .iter()
        .filter(|p| p.protocol.as_deref().is_none_or(|p| p == "TCP"));
    let found = match sel {
        PortSel::Name(n) => tcp
            .filter(|p| p.name.as_deref().unwrap_or("") == n)
            .find_map(|p| p.port),
        PortSel::Number(want) => tcp
            .filter_map(|p| p.port)
            .find(|p| i64::from(*p) == i64::from(*want)),
        PortSel::Only => {
            let all: Vec<_> = tcp.filter_map(|p| p.port).collect();
            match all.as_slice() {
                [one] => Some(*one),
                _ => None,
            }
        }
    };
    found
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
}

/// What a set of endpoints means for new requests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Endpoints that get new requests: the ready ones; when none is ready, the serving
    /// terminating ones (as kube-proxy does), so a rollout that terminates every old pod
    /// before a new one is ready does not turn into an outage.
    pub peers: Vec<SocketAddr>,
    /// Serving and terminating endpoints that get no new requests while ready ones exist
    /// (their requests in flight finish on their own connections).
    pub draining: Vec<SocketAddr>,
}

/// Splits endpoints into peers and draining ones.
pub fn split(eps: &[Endpoint]) -> Split {
    let ready: Vec<SocketAddr> = eps.iter().filter(|e| e.ready).map(|e| e.addr).collect();
    let serving_term: Vec<SocketAddr> = eps
        .iter()
        .filter(|e| !e.ready && e.serving && e.terminating)
        .map(|e| e.addr)
        .collect();
    if ready.is_empty() {
        Split {
            peers: serving_term,
            draining: Vec::new(),
        }
    } else {
        Split {
            peers: ready,
            draining: serving_term,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// An address and its `ready`, `serving`, `terminating` conditions.
    type Conds = (&'static str, Option<bool>, Option<bool>, Option<bool>);

    use k8s_openapi::api::discovery::v1::{
        Endpoint as KEndpoint, EndpointConditions, EndpointPort,
    };

    fn slice(ports: &[(&str, i32)], eps: &[Conds]) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| EndpointPort {
                        name: Some((*n).into()),
                        port: Some(*p),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            endpoints: eps
                .iter()
                .map(|(a, r, s, t)| KEndpoint {
                    addresses: vec![(*a).into()],
                    conditions: Some(EndpointConditions {
                        ready: *r,
                        serving: *s,
                        terminating: *t,
                    }),
                    zone: Some("z1".into()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn named_port_picks_its_number_and_unset_conditions_mean_ready() {
        let s = slice(
            &[("http", 8080), ("metrics", 9090)],
            &[("10.0.0.1", None, None, None)],
        );
        let eps = endpoints([&s], &PortSel::Name("http".into()));
        assert_eq!(eps.len(), 1);
        assert_eq!(eps[0].addr, "10.0.0.1:8080".parse().unwrap());
        assert!(eps[0].ready && eps[0].serving && !eps[0].terminating);
        assert_eq!(eps[0].zone.as_deref(), Some("z1"));
        assert!(endpoints([&s], &PortSel::Name("grpc".into())).is_empty());
        assert!(
            endpoints([&s], &PortSel::Only).is_empty(),
            "two ports: none is the only one"
        );
        assert_eq!(endpoints([&s], &PortSel::Number(9090))[0].addr.port(), 9090);
    }

    #[test]
    fn serving_terminating_endpoints_drain_while_ready_ones_exist() {
        let s = slice(
            &[("http", 80)],
            &[
                ("10.0.0.1", Some(true), Some(true), Some(false)),
                ("10.0.0.2", Some(false), Some(true), Some(true)),
                ("10.0.0.3", Some(false), Some(false), Some(true)),
                ("10.0.0.4", Some(false), Some(false), Some(false)),
            ],
        );
        let sp = split(&endpoints([&s], &PortSel::Name("http".into())));
        assert_eq!(sp.peers, vec!["10.0.0.1:80".parse().unwrap()]);
        assert_eq!(sp.draining, vec!["10.0.0.2:80".parse().unwrap()]);
    }

    #[test]
    fn only_serving_terminating_endpoints_still_take_requests() {
        let s = slice(
            &[("http", 80)],
            &[("10.0.0.2", Some(false), Some(true), Some(true))],
        );
        let sp = split(&endpoints([&s], &PortSel::Only));
        assert_eq!(sp.peers, vec!["10.0.0.2:80".parse().unwrap()]);
        assert!(sp.draining.is_empty());
    }

    #[test]
    fn an_address_in_two_slices_is_one_endpoint_and_ready_wins() {
        let a = slice(
            &[("http", 80)],
            &[("10.0.0.1", Some(false), Some(true), Some(true))],
        );
        let b = slice(
            &[("http", 80)],
            &[("10.0.0.1", Some(true), Some(true), Some(false))],
        );
        let eps = endpoints([&a, &b], &PortSel::Only);
        assert_eq!(eps.len(), 1);
        assert!(eps[0].ready);
    }
}
