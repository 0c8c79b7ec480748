//! The validated, immutable config model. Every default lives here, with the reason for it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

pub use super::upstream_tls::UpstreamTls;
use crate::limits::default_max_connections;

/// Downstream idle keep-alive timeout: longer than common load balancers' idle timeouts
/// (AWS ALB 60 s, GCP 600 s), so the hop in front closes first and never races us.
pub const DEFAULT_DOWNSTREAM_IDLE: Duration = Duration::from_secs(620);
/// Time a client has to send a complete request head (slowloris bound).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client may leave a request body without sending bytes (nginx `client_body_timeout`).
pub const DEFAULT_CLIENT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Time a client may go without accepting a byte of the response (nginx `send_timeout`).
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Time an upstream may stay silent inside a response body (nginx `proxy_read_timeout`).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Time an upgraded connection (WebSocket) may carry no byte either way: long, since such
/// connections idle between messages by design (nginx's `proxy_read_timeout` is often raised
/// to about this for them).
pub const DEFAULT_UPGRADE_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// Largest request head accepted; larger gets 431.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// Upstream pool idle timeout: shorter than Node's 5 s keep-alive, the most common backend default.
pub const DEFAULT_POOL_IDLE: Duration = Duration::from_secs(4);
/// Safety margin under the server's `Keep-Alive: timeout=N` hint (undici's rule).
pub const KEEPALIVE_HINT_MARGIN: Duration = Duration::from_secs(1);

/// The whole config. It serializes as the TOML surface (`upkeep check --print`), so every
/// field is named and written as in a config file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Config {
    /// Admin listener (probes, metrics, upstreams view).
    pub admin: AdminConfig,
    /// Name resolution.
    pub dns: DnsConfig,
    /// Shutdown behaviour.
    pub lifecycle: Lifecycle,
    /// Downstream listeners.
    #[serde(rename = "listener")]
    pub listeners: Vec<ListenerConfig>,
    /// Routes, in file order; matching picks the most specific.
    #[serde(rename = "route")]
    pub routes: Vec<RouteConfig>,
    /// Upstream groups by name.
    pub groups: BTreeMap<String, GroupConfig>,
    /// Where access-log lines go.
    pub access_log: AccessLog,
    /// How access-log lines are written.
    pub access_log_format: AccessLogFormat,
    /// How EndpointSlice discovery reaches the API server.
    pub kubernetes: KubernetesConfig,
}

impl Config {
    /// Makes every group send HTTP/1.1 requests with hyper's client, as before upkeep's own
    /// codec (docs/http1.md): only for the test that runs one corpus through both
    /// (`crates/proxy/tests/proxy/differential.rs`). No config key reaches it.
    #[doc(hidden)]
    pub fn use_hyper_http1_client(&mut self) {
        for g in self.groups.values_mut() {
            g.pool.hyper_http1 = true;
        }
    }
}

/// `[kubernetes]`: the API server EndpointSlice discovery watches.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KubernetesConfig {
    /// A kubeconfig file; unset: the in-cluster service account when
    /// `KUBERNETES_SERVICE_HOST` is set, else `KUBECONFIG` or `~/.kube/config`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// Longest wait for one list, watch start or Service read; a slower API server counts as
    /// failed (peers unchanged) and is retried with backoff.
    #[serde(with = "secs")]
    pub request_timeout: Duration,
    /// Where the in-cluster service account's `token` and `ca.crt` are read from.
    pub service_account_dir: PathBuf,
    /// How long the API server keeps one watch open (`timeoutSeconds`, whole seconds); the
    /// client's read timeout is derived above it.
    #[serde(with = "secs")]
    pub watch_timeout: Duration,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            request_timeout: Duration::from_secs(10),
            service_account_dir: PathBuf::from(upkeep_kubernetes::SERVICE_ACCOUNT_DIR),
            watch_timeout: Duration::from_secs(290),
        }
    }
}

/// Access-log destination.
#[derive(Clone, Debug, PartialEq)]
pub enum AccessLog {
    /// JSON lines on stdout.
    Stdout,
    /// JSON lines appended to a file.
    File(PathBuf),
    /// No access log.
    Off,
}

/// Access-log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessLogFormat {
    /// One JSON object a line, every field named.
    #[default]
    Json,
    /// nginx's `combined` format followed by `$upstream_status`.
    Combined,
}

/// The admin listeners: control (probes, metrics, upstreams, reload) and, optionally, a
/// probe-only one for kubelet.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AdminConfig {
    /// Control listener; loopback by default, since it can reload the proxy.
    pub listen: SocketAddr,
    /// Probe-only listener (`/livez`, `/readyz`, `/startupz`, GET), when set.
    pub probes: Option<SocketAddr>,
    /// File holding the bearer token `POST /reload` requires; required off loopback.
    pub token_file: Option<PathBuf>,
    /// Time an admin client has to send a complete request head.
    #[serde(with = "secs")]
    pub header_read_timeout: Duration,
    /// Open connections per admin listener; more are answered 503 and closed at once.
    pub max_connections: usize,
}

/// Admin request-head timeout: kubelet and Prometheus send a head at once, so a client
/// that has not within this long is holding a slot, not asking.
pub const DEFAULT_ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Admin connections per listener: probes and scrapes need a handful, and a small bound
/// keeps a flood on one admin listener from taking descriptors the other needs.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9901)),
            probes: None,
            token_file: None,
            header_read_timeout: DEFAULT_ADMIN_HEADER_READ_TIMEOUT,
            max_connections: DEFAULT_ADMIN_MAX_CONNECTIONS,
        }
    }
}

impl AdminConfig {
    /// Refuses a control listener reachable from other hosts without a reload token.
    pub fn check_exposure(&self) -> Result<(), String> {
        if is_loopback(self.listen.ip()) || self.token_file.is_some() {
            return Ok(());
        }
        Err(format!(
            "admin listen {} is not loopback, so anyone who reaches it could POST /reload: \
             set [admin] token_file (a bearer token), or listen on 127.0.0.1 and give kubelet \
             [admin] probes",
            self.listen
        ))
    }
}

/// Loopback as the kernel routes it: all of 127.0.0.0/8 and ::1 (also IPv4-mapped).
pub fn is_loopback(ip: std::net::IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// Name resolution settings.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DnsConfig {
    /// Name servers (UDP and TCP); empty means the system's.
    pub servers: Vec<SocketAddr>,
    /// Per-query timeout.
    #[serde(with = "secs")]
    pub timeout: Duration,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            servers: Vec::new(),
            timeout: Duration::from_secs(1),
        }
    }
}

/// Shutdown behaviour on SIGTERM.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Lifecycle {
    /// Keep serving this long after readiness flips to 503, so the balancer in front notices.
    #[serde(with = "secs")]
    pub drain_delay: Duration,
    /// Longest wait for in-flight requests once accepting stops.
    #[serde(with = "secs")]
    pub shutdown_timeout: Duration,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self {
            drain_delay: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// How forwarding headers are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Forwarded {
    /// `X-Forwarded-For`, `-Proto`, `-Host`, appended.
    #[serde(rename = "x-forwarded")]
    XForwarded,
    /// RFC 7239 `Forwarded`, appended.
    Forwarded,
    /// Neither.
    None,
}

/// A downstream listener.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ListenerConfig {
    /// Address to bind.
    pub listen: SocketAddr,
    /// TLS certificate and key (PEM); plain TCP when absent.
    pub tls: Option<TlsConfig>,
    /// Idle keep-alive timeout, announced as `Keep-Alive: timeout=N`.
    #[serde(with = "secs")]
    pub idle_timeout: Duration,
    /// Time to receive a complete request head; on a new connection it also bounds the wait
    /// for the first byte, the TLS handshake and the HTTP/2 preface.
    #[serde(with = "secs")]
    pub header_read_timeout: Duration,
    /// Longest silence inside a request body (408 `client_timeout`).
    #[serde(with = "secs")]
    pub client_body_timeout: Duration,
    /// Longest time the client may go without accepting a byte of the response.
    #[serde(with = "secs")]
    pub send_timeout: Duration,
    /// Largest request head (HTTP/1) or header list (HTTP/2).
    pub max_header_bytes: usize,
    /// Most open connections; over it a new one gets 503 `overloaded` (HTTP/1) or a GOAWAY (h2).
    pub max_connections: usize,
    /// Forwarding headers.
    pub forwarded: Forwarded,
    /// Clients whose forwarding headers are appended to; from anyone else they are replaced.
    pub trusted_proxies: Vec<Cidr>,
}

/// An address block, `10.0.0.0/8` or `::1/128`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: std::net::IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `ip/len` or a bare `ip` (a single address).
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (ip, len) = match s.split_once('/') {
            Some((ip, len)) => (ip, Some(len)),
            None => (s, None),
        };
        let net: std::net::IpAddr = ip
            .parse()
            .map_err(|_| format!("{s:?} is not an address block such as \"10.0.0.0/8\""))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match len {
            None => max,
            Some(l) => match l.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("{s:?}: prefix length must be 0 to {max}")),
            },
        };
        Ok(Cidr { net, prefix })
    }

    /// Whether `ip` is inside the block (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr;
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}/{}", self.net, self.prefix))
    }
}

impl ListenerConfig {
    /// A plain listener with every default.
    pub fn plain(listen: SocketAddr) -> Self {
        Self {
            listen,
            tls: None,
            idle_timeout: DEFAULT_DOWNSTREAM_IDLE,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            client_body_timeout: DEFAULT_CLIENT_BODY_TIMEOUT,
            send_timeout: DEFAULT_SEND_TIMEOUT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_connections: default_max_connections(),
            forwarded: Forwarded::XForwarded,
            trusted_proxies: Vec::new(),
        }
    }
}

/// PEM files for TLS.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TlsConfig {
    /// Certificate chain.
    #[serde(serialize_with = "super::print::path")]
    pub cert: PathBuf,
    /// Private key.
    #[serde(serialize_with = "super::print::path")]
    pub key: PathBuf,
}

/// Host match of a route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostMatch {
    /// Any host.
    Any,
    /// Exactly this host (lower case, no port).
    Exact(String),
    /// Any host ending in this suffix (`*.example.com` keeps `.example.com`).
    Suffix(String),
}

/// A route: host + path prefix -> group (or the route's own answer), with its rules.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RouteConfig {
    /// Host match.
    pub host: HostMatch,
    /// Path prefix.
    pub path: String,
    /// Target group; `None` exactly when the route answers itself (`redirect`, `respond`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Paths with `%2e`, `%2f`, `%5c` or a raw backslash are routed here (kept encoded)
    /// instead of refused with 400.
    pub allow_encoded_separators: bool,
    /// Headers, path, answer, body limit and timeouts of the route.
    #[serde(flatten)]
    pub rules: super::route_rules::RouteRules,
}

/// Peer selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Round robin over usable peers.
    RoundRobin,
    /// Power of two random choices by active requests.
    P2c,
}

/// Where an endpoint's addresses come from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EndpointSource {
    /// A fixed address.
    Static(SocketAddr),
    /// A DNS name (A/AAAA) and port, re-resolved.
    Name {
        /// Host name.
        host: String,
        /// Port.
        port: u16,
    },
    /// A Kubernetes Service's EndpointSlices, watched through the API server.
    Kubernetes {
        /// `namespace/name`.
        service: upkeep_kubernetes::ServiceRef,
        /// The port of its endpoints.
        port: upkeep_kubernetes::PortSel,
    },
}

/// One endpoint line of a group.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Address source.
    pub source: EndpointSource,
    /// Priority tier; tier N+1 is used only when tier N has no usable peer.
    pub tier: u8,
    /// Written `https://`: spoken to over TLS (the group's `tls` settings).
    pub https: bool,
}

/// An upstream group.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GroupConfig {
    /// Required groups fail `/readyz` when unusable; optional ones show as degraded.
    pub required: bool,
    /// Peer selection.
    pub balance: Balance,
    /// Endpoints.
    pub endpoints: Vec<Endpoint>,
    /// TCP connect timeout per attempt.
    #[serde(with = "secs")]
    pub connect_timeout: Duration,
    /// Per-try timeout, from the moment the request body has been sent to response headers.
    #[serde(with = "secs")]
    pub try_timeout: Duration,
    /// Longest silence from the upstream inside a response body; the client's connection is
    /// then closed (nginx `proxy_read_timeout`).
    #[serde(with = "secs")]
    pub read_timeout: Duration,
    /// Longest time an upgraded connection (WebSocket) carries no byte either way.
    #[serde(with = "secs")]
    pub upgrade_idle_timeout: Duration,
    /// Overall deadline for a request including retries, up to response headers.
    #[serde(with = "secs")]
    pub deadline: Duration,
    /// An optional group degraded longer than this logs a warning and sets a gauge.
    #[serde(with = "secs")]
    pub degraded_alert_after: Duration,
    /// HTTP version spoken to the peers.
    pub protocol: super::UpstreamProtocol,
    /// Connection pool.
    pub pool: PoolConfig,
    /// DNS discovery policy.
    pub discovery: DiscoveryConfig,
    /// Passive and active health.
    pub health: HealthConfig,
    /// Retries.
    pub retry: RetryConfig,
    /// TLS to the group's `https://` endpoints; `None` for `http://`.
    pub tls: Option<UpstreamTls>,
}

impl GroupConfig {
    /// A required group over these endpoints with every default.
    pub fn with_endpoints(endpoints: Vec<Endpoint>) -> Self {
        Self {
            required: true,
            balance: Balance::RoundRobin,
            endpoints,
            connect_timeout: Duration::from_secs(1),
            try_timeout: Duration::from_secs(30),
            read_timeout: DEFAULT_READ_TIMEOUT,
            upgrade_idle_timeout: DEFAULT_UPGRADE_IDLE_TIMEOUT,
            deadline: Duration::from_secs(60),
            degraded_alert_after: Duration::from_secs(300),
            protocol: super::UpstreamProtocol::Http1,
            pool: PoolConfig::default(),
            discovery: DiscoveryConfig::default(),
            health: HealthConfig::default(),
            retry: RetryConfig::default(),
            tls: None,
        }
    }
}

/// Upstream connection pool.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolConfig {
    /// Idle timeout; lowered to the server's `Keep-Alive: timeout=N` minus 1 s.
    #[serde(with = "secs")]
    pub idle_timeout: Duration,
    /// Most idle connections kept per peer, every serving thread's together.
    pub max_idle_per_peer: usize,
    /// Below `max_idle_per_peer`, a peer keeps as many idle connections as it had busy at
    /// once within this window.
    #[serde(with = "secs")]
    pub idle_peak_window: Duration,
    /// A connection older than this is not reused.
    #[serde(with = "secs")]
    pub max_age: Duration,
    /// Most open connections (busy and idle) per peer; a peer at the limit is skipped.
    pub max_connections_per_peer: Option<usize>,
    /// HTTP/2: a PING this often on every connection, busy or idle.
    #[serde(with = "secs")]
    pub http2_keepalive_interval: Duration,
    /// HTTP/2: a PING unanswered this long closes the connection.
    #[serde(with = "secs")]
    pub http2_keepalive_timeout: Duration,
    /// HTTP/2: most request body bytes kept to send a stream again that the peer refused
    /// unprocessed (GOAWAY, REFUSED_STREAM); a longer body is sent once.
    pub http2_replay_buffer_bytes: usize,
    /// Sends HTTP/1.1 requests with hyper's client instead of upkeep's codec: only for the
    /// differential test of the two (`Config::use_hyper_http1_client`); no config key sets it.
    #[doc(hidden)]
    #[serde(skip)]
    pub hyper_http1: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            idle_timeout: DEFAULT_POOL_IDLE,
            max_idle_per_peer: 1024,
            idle_peak_window: Duration::from_secs(10),
            max_age: Duration::from_secs(300),
            max_connections_per_peer: None,
            http2_keepalive_interval: Duration::from_secs(20),
            http2_keepalive_timeout: Duration::from_secs(10),
            http2_replay_buffer_bytes: crate::body::REPLAY_LIMIT,
            hyper_http1: false,
        }
    }
}

/// How long NXDOMAIN/NODATA keep the last known good addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleGrace {
    /// As long as those peers keep passing health.
    WhileHealthy,
    /// For a fixed time.
    For(Duration),
}

/// DNS discovery policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiscoveryConfig {
    /// Shortest re-resolve interval (a lower TTL is raised to this).
    #[serde(with = "secs")]
    pub min_refresh: Duration,
    /// Longest re-resolve interval (a higher TTL is lowered to this).
    #[serde(with = "secs")]
    pub max_refresh: Duration,
    /// Last-known-good retention on NXDOMAIN/NODATA.
    pub stale_grace: StaleGrace,
    /// First retry delay after SERVFAIL/REFUSED/timeout; doubles with jitter.
    #[serde(with = "secs")]
    pub error_backoff: Duration,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            min_refresh: Duration::from_secs(1),
            max_refresh: Duration::from_secs(300),
            stale_grace: StaleGrace::WhileHealthy,
            error_backoff: Duration::from_secs(1),
        }
    }
}

/// Passive (and optional active) health.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HealthConfig {
    /// Consecutive failures that eject a peer.
    pub consecutive_failures: u32,
    /// First ejection time; doubles with each repeated ejection.
    #[serde(with = "secs")]
    pub base_ejection: Duration,
    /// Ejection time cap.
    #[serde(with = "secs")]
    pub max_ejection: Duration,
    /// A tier never ejects below this share of its peers (at least one): the panic threshold.
    pub min_healthy_percent: u8,
    /// Optional active checks.
    pub active: Option<ActiveCheck>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 3,
            base_ejection: Duration::from_secs(2),
            max_ejection: Duration::from_secs(30),
            min_healthy_percent: 50,
            active: None,
        }
    }
}

/// Active HTTP health check.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ActiveCheck {
    /// Path to GET.
    pub path: String,
    /// Time between checks.
    #[serde(with = "secs")]
    pub interval: Duration,
    /// Check timeout.
    #[serde(with = "secs")]
    pub timeout: Duration,
    /// Successes that bring a peer back.
    pub rise: u32,
    /// Failures that take a peer out.
    pub fall: u32,
}

/// Retries.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RetryConfig {
    /// Most attempts per request, the first included.
    pub attempts: u32,
    /// Retries in flight may be at most this share of active requests.
    pub budget_percent: u8,
    /// ... but this many are always allowed.
    pub budget_min: u32,
    /// When every peer refuses connections, keep retrying for this long (0 = off).
    #[serde(with = "secs")]
    pub connect_retry_window: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            attempts: 3,
            budget_percent: 20,
            budget_min: 3,
            connect_retry_window: Duration::from_secs(3),
        }
    }
}

/// Durations are written as a config file writes them: `"5s"`, `"250ms"`.
pub(super) mod secs {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::super::print::duration(*d))
    }
}
