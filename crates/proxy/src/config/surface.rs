//! The TOML surface, as written by people; validated into the model.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

pub(crate) type S<T> = Spanned<T>;

/// A duration as written (`"5s"`); any other TOML type is refused in the config's own words.
#[derive(Debug)]
pub(crate) struct Dur(pub String);

impl AsRef<str> for Dur {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration like \"5s\" or \"250ms\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Dur, E> {
                Ok(Dur(v.to_owned()))
            }
        }
        d.deserialize_str(V)
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    pub admin: Option<Admin>,
    pub dns: Option<Dns>,
    pub lifecycle: Option<Lifecycle>,
    #[serde(default)]
    pub listener: Vec<Listener>,
    #[serde(default)]
    pub route: Vec<S<Route>>,
    #[serde(default)]
    pub groups: BTreeMap<S<String>, Group>,
    pub access_log: Option<S<String>>,
    pub access_log_format: Option<S<String>>,
    pub kubernetes: Option<Kubernetes>,
}

/// `[kubernetes]`: how EndpointSlice discovery reaches the API server.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Kubernetes {
    pub kubeconfig: Option<S<String>>,
    pub request_timeout: Option<S<Dur>>,
    pub service_account_dir: Option<S<String>>,
    pub watch_timeout: Option<S<Dur>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Admin {
    pub listen: Option<S<String>>,
    pub probes: Option<S<String>>,
    pub token_file: Option<S<String>>,
    pub header_read_timeout: Option<S<String>>,
    pub max_connections: Option<S<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Dns {
    #[serde(default)]
    pub servers: Vec<S<String>>,
    pub timeout: Option<S<Dur>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Lifecycle {
    pub drain_delay: Option<S<Dur>>,
    pub shutdown_timeout: Option<S<Dur>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Listener {
    pub listen: S<String>,
    pub tls: Option<Tls>,
    pub idle_timeout: Option<S<Dur>>,
    pub header_read_timeout: Option<S<Dur>>,
    /// Deprecated alias of `client_body_timeout`.
    pub body_timeout: Option<S<Dur>>,
    pub client_body_timeout: Option<S<Dur>>,
    pub send_timeout: Option<S<Dur>>,
    pub max_header_bytes: Option<S<i64>>,
    pub max_connections: Option<S<i64>>,
    pub forwarded: Option<S<String>>,
    pub trusted_proxies: Option<Vec<S<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Tls {
    pub cert: S<String>,
    pub key: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Route {
    pub host: Option<S<String>>,
    pub path: Option<S<String>>,
    pub group: Option<S<String>>,
    pub allow_encoded_separators: Option<bool>,
    pub request_headers: Option<S<HeaderRules>>,
    pub response_headers: Option<S<HeaderRules>>,
    pub strip_prefix: Option<S<bool>>,
    pub rewrite: Option<S<Rewrite>>,
    pub redirect: Option<S<Redirect>>,
    pub respond: Option<S<Respond>>,
    pub max_body_bytes: Option<S<i64>>,
    pub try_timeout: Option<S<Dur>>,
    pub deadline: Option<S<Dur>>,
}

/// `request_headers` / `response_headers` of a route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HeaderRules {
    #[serde(default)]
    pub set: BTreeMap<S<String>, S<String>>,
    #[serde(default)]
    pub add: BTreeMap<S<String>, S<String>>,
    #[serde(default)]
    pub remove: Vec<S<String>>,
}

/// `rewrite = { from = "regex", to = "..." }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Rewrite {
    pub from: S<String>,
    pub to: S<String>,
}

/// `redirect = { to = "...", status = 308 }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Redirect {
    pub to: S<String>,
    pub status: Option<S<i64>>,
}

/// `respond = { status = 200, body = "..." }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Respond {
    pub status: Option<S<i64>>,
    pub body: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Group {
    pub required: Option<bool>,
    pub balance: Option<S<String>>,
    pub endpoints: S<Vec<S<Endpoint>>>,
    pub connect_timeout: Option<S<Dur>>,
    pub try_timeout: Option<S<Dur>>,
    pub read_timeout: Option<S<Dur>>,
    pub upgrade_idle_timeout: Option<S<Dur>>,
    pub deadline: Option<S<Dur>>,
    pub degraded_alert_after: Option<S<Dur>>,
    pub pool: Option<Pool>,
    pub discovery: Option<Discovery>,
    pub health: Option<Health>,
    pub retry: Option<Retry>,
    pub tls: Option<GroupTls>,
    pub protocol: Option<S<String>>,
}

/// `[groups.X.tls]`: how upkeep speaks TLS to the group's `https://` endpoints.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GroupTls {
    pub server_name: Option<S<String>>,
    pub ca: Option<S<String>>,
    pub cert: Option<S<String>>,
    pub key: Option<S<String>>,
    pub verify: Option<S<bool>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Endpoint {
    Plain(String),
    Table(EndpointTable),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndpointTable {
    pub addr: Option<String>,
    /// `namespace/service`: the Service's EndpointSlices. (No spans inside an untagged
    /// enum: problems point at the whole endpoint.)
    pub kubernetes: Option<String>,
    /// The Service port (name or number) of a `kubernetes` endpoint.
    pub port: Option<PortValue>,
    #[serde(default)]
    pub tier: i64,
}

/// A port written as a name or a number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum PortValue {
    Name(String),
    Number(i64),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Pool {
    pub idle_timeout: Option<S<Dur>>,
    pub max_idle_per_peer: Option<S<i64>>,
    pub idle_peak_window: Option<S<Dur>>,
    pub max_age: Option<S<Dur>>,
    pub max_connections_per_peer: Option<S<i64>>,
    pub http2_keepalive_interval: Option<S<Dur>>,
    pub http2_keepalive_timeout: Option<S<Dur>>,
    pub http2_replay_buffer_bytes: Option<S<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Discovery {
    pub min_refresh: Option<S<Dur>>,
    pub max_refresh: Option<S<Dur>>,
    pub stale_grace: Option<S<String>>,
    pub error_backoff: Option<S<Dur>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Health {
    pub consecutive_failures: Option<S<i64>>,
    pub base_ejection: Option<S<Dur>>,
    pub max_ejection: Option<S<Dur>>,
    pub min_healthy_percent: Option<S<i64>>,
    pub active: Option<Active>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Active {
    pub path: Option<S<String>>,
    pub interval: Option<S<Dur>>,
    pub timeout: Option<S<Dur>>,
    pub rise: Option<S<i64>>,
    pub fall: Option<S<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Retry {
    pub attempts: Option<S<i64>>,
    pub budget_percent: Option<S<i64>>,
    pub budget_min: Option<S<i64>>,
    pub connect_retry_window: Option<S<Dur>>,
}
