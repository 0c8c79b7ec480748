//! A hickory resolver with its cache off, so that upkeep's own policy decides when to ask.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RecordType;
use hickory_resolver::TokioResolver;

use crate::outcome::Outcome;

/// Why a resolver could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The system configuration (resolv.conf) could not be read or used.
    #[error("cannot use the system DNS configuration: {0}")]
    System(String),
}

/// Anything that can look a name up; the watch loop is written against this so that its
/// timing can be tested on paused time with a scripted source.
pub trait Lookup: Send + Sync + 'static {
    /// Looks `name` up (A and AAAA together).
    fn lookup<'a>(&'a self, name: &'a str) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;
}

/// Looks names up in DNS (A and AAAA), without caching.
#[derive(Clone, Debug)]
pub struct Resolver {
    inner: TokioResolver,
    timeout: Duration,
    /// With explicit servers there is no search list, so names are made absolute and never
    /// expanded; the system resolver keeps resolv.conf's search and ndots.
    absolute_names: bool,
}

impl Resolver {
    /// Uses the system's nameservers, search list and hosts file (resolv.conf).
    pub fn system(timeout: Duration) -> Result<Resolver, Error> {
        let mut builder =
            TokioResolver::builder_tokio().map_err(|e| Error::System(e.to_string()))?;
        tune(builder.options_mut(), timeout, ResolveHosts::Auto);
        let inner = builder.build().map_err(|e| Error::System(e.to_string()))?;
        Ok(Resolver {
            inner,
            timeout,
            absolute_names: false,
        })
    }

    /// Uses these nameservers, each over UDP first and TCP when an answer is truncated.
    pub fn with_servers(servers: &[SocketAddr], timeout: Duration) -> Resolver {
        Self::build(
            servers,
            timeout,
            &[ConnectionConfig::udp(), ConnectionConfig::tcp()],
        )
    }

    /// Uses these nameservers over TCP only.
    pub fn with_servers_tcp_only(servers: &[SocketAddr], timeout: Duration) -> Resolver {
        Self::build(servers, timeout, &[ConnectionConfig::tcp()])
    }

    fn build(servers: &[SocketAddr], timeout: Duration, conns: &[ConnectionConfig]) -> Resolver {
        let name_servers = servers
            .iter()
            .map(|server| {
                let connections = conns
                    .iter()
                    .cloned()
                    .map(|mut c| {
                        c.port = server.port();
                        c
                    })
                    .collect();
                NameServerConfig::new(server.ip(), true, connections)
            })
            .collect();
        let config = ResolverConfig::from_name_servers(name_servers);
        let mut builder =
            TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
        tune(builder.options_mut(), timeout, ResolveHosts::Never);
        let inner = builder
            .build()
            .expect("a resolver with explicit servers and no TLS builds without I/O");
        Resolver {
            inner,
            timeout,
            absolute_names: true,
        }
    }

    /// Looks `name` up, A and AAAA at once, within the timeout. An IP literal resolves to
    /// itself without DNS.
    pub async fn lookup(&self, name: &str) -> Outcome {
        if let Some(ip) = ip_literal(name) {
            return Outcome::Records {
                addrs: vec![ip],
                ttl: Duration::MAX,
            };
        }
        let query = if self.absolute_names && !name.ends_with('.') {
            format!("{name}.")
        } else {
            name.to_owned()
        };
        // hickory's own timeout is per attempt; these bound each family's lookup, apart, so
        // a silent AAAA never hides an A answer (and vice versa).
        let (v4, v6) = tokio::join!(
            tokio::time::timeout(
                self.timeout,
                self.inner.lookup(query.as_str(), RecordType::A)
            ),
            tokio::time::timeout(
                self.timeout,
                self.inner.lookup(query.as_str(), RecordType::AAAA)
            ),
        );
        let family = |r| match r {
            Ok(r) => Outcome::from_lookup(r),
            Err(_) => Outcome::Timeout,
        };
        Outcome::combine(family(v4), family(v6))
    }
}

impl Lookup for Resolver {
    fn lookup<'a>(&'a self, name: &'a str) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>> {
        Box::pin(Resolver::lookup(self, name))
    }
}

fn tune(opts: &mut ResolverOpts, timeout: Duration, hosts: ResolveHosts) {
    // upkeep owns the refresh policy: every lookup must reach the server.
    opts.cache_size = 0;
    opts.timeout = timeout;
    opts.attempts = 1;
    opts.use_hosts_file = hosts;
}

/// `10.0.0.1`, `::1` or `[::1]` as an address.
pub(crate) fn ip_literal(name: &str) -> Option<IpAddr> {
    let bare = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    bare.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_literals_are_recognised() {
        assert_eq!(ip_literal("127.0.0.2"), Some(IpAddr::from([127, 0, 0, 2])));
        assert_eq!(ip_literal("[::1]"), "::1".parse().ok());
        assert_eq!(ip_literal("::1"), "::1".parse().ok());
        assert_eq!(ip_literal("app.upkeep.test"), None);
        assert_eq!(ip_literal("1.2.3"), None);
    }

    #[tokio::test]
    async fn system_resolver_builds_or_says_why_not() {
        // Hosts without a usable resolv.conf exist (minimal containers): there the
        // constructor must fail with a typed error, never panic.
        match Resolver::system(Duration::from_secs(1)) {
            Ok(r) => assert!(matches!(
                r.lookup("127.0.0.3").await,
                Outcome::Records { .. }
            )),
            Err(e) => assert!(e.to_string().contains("system DNS configuration"), "{e}"),
        }
    }

    #[tokio::test]
    async fn ip_literal_lookup_needs_no_server() {
        // Port 9 on loopback has no DNS server: an answer proves no query was made.
        let r = Resolver::with_servers(&["127.0.0.1:9".parse().unwrap()], Duration::from_secs(1));
        assert_eq!(
            r.lookup("127.0.0.7").await,
            Outcome::Records {
                addrs: vec![IpAddr::from([127, 0, 0, 7])],
                ttl: Duration::MAX
            }
        );
    }
}
