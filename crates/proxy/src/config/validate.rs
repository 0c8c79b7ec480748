//! Surface -> model, collecting every problem with its position instead of stopping at the first.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::model::*;
use super::surface::{self, S};
use super::{parse_duration, Locator, Problem};

mod admin;
mod kubernetes;
mod route_rules;

pub(super) struct Ctx<'a> {
    pub(super) loc: &'a Locator,
    pub(super) problems: Vec<Problem>,
    /// Accepted but worth a change (deprecated keys); never refuse a config.
    pub(super) warnings: Vec<Problem>,
    /// Parts of the file could not be read: skip the checks that such holes would trip.
    pub(super) partial: bool,
}

impl Ctx<'_> {
    fn err(&mut self, span: std::ops::Range<usize>, msg: impl Into<String>) {
        self.problems.push(self.loc.problem(span, msg));
    }

    fn warn(&mut self, span: std::ops::Range<usize>, msg: impl Into<String>) {
        self.warnings.push(self.loc.problem(span, msg));
    }

    /// A duration where zero means something (off, at once).
    fn duration<T: AsRef<str>>(&mut self, value: &Option<S<T>>, default: Duration) -> Duration {
        match value {
            None => default,
            Some(v) => match parse_duration(v.get_ref().as_ref()) {
                Ok(d) => d,
                Err(e) => {
                    self.err(v.span(), e);
                    default
                }
            },
        }
    }

    /// A duration that must be more than zero: a zero wait would spin, panic or fail everything.
    fn positive<T: AsRef<str>>(
        &mut self,
        value: &Option<S<T>>,
        default: Duration,
        what: &str,
    ) -> Duration {
        let d = self.duration(value, default);
        match value {
            Some(v) if d.is_zero() && parse_duration(v.get_ref().as_ref()).is_ok() => {
                self.err(
                    v.span(),
                    format!(
                        "{what} must be more than zero, e.g. \"{}\"",
                        humantime_short(default)
                    ),
                );
                default
            }
            _ => d,
        }
    }

    /// Refuses `a > b` for two durations that must come in that order.
    fn not_after(
        &mut self,
        span: Option<std::ops::Range<usize>>,
        (a_name, a): (&str, Duration),
        (b_name, b): (&str, Duration),
    ) {
        if a > b {
            self.err(
                span.unwrap_or(0..0),
                format!(
                    "{a_name} ({}) is longer than {b_name} ({}), which would always end it first",
                    humantime_short(a),
                    humantime_short(b)
                ),
            );
        }
    }

    fn int(&mut self, value: &Option<S<i64>>, default: u64, min: i64, max: i64, what: &str) -> u64 {
        match value {
            None => default,
            Some(v) if (min..=max).contains(v.get_ref()) => *v.get_ref() as u64,
            Some(v) => {
                self.err(
                    v.span(),
                    format!(
                        "{what} must be between {min} and {max}, got {}",
                        v.get_ref()
                    ),
                );
                default
            }
        }
    }

    fn socket_addr(&mut self, value: &S<String>, what: &str) -> Option<SocketAddr> {
        match value.get_ref().parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                self.err(
                    value.span(),
                    format!("{what} {:?} is not an IP:PORT address", value.get_ref()),
                );
                None
            }
        }
    }
}

/// Parses an endpoint as written on the command line or in a file:
/// `http://host:port`, `host:port`, `1.2.3.4:80`, `[::1]:8080`.
pub fn parse_endpoint(text: &str) -> Result<EndpointSource, String> {
    match parse_endpoint_scheme(text)? {
        (source, false) => Ok(source),
        (_, true) => Err(format!(
            "{text:?}: https upstreams are set in a config file ([groups.NAME] endpoints)"
        )),
    }
}

/// Like [`parse_endpoint`], also accepting `https://host[:port]` (default port 443); the flag
/// says whether the endpoint is spoken to over TLS.
pub(super) fn parse_endpoint_scheme(text: &str) -> Result<(EndpointSource, bool), String> {
    let (rest, https) = if let Some(r) = text.strip_prefix("http://") {
        (r, false)
    } else if let Some(r) = text.strip_prefix("https://") {
        (r, true)
    } else if text.contains("://") {
        return Err(format!(
            "{text:?}: only http:// and https:// upstreams are supported"
        ));
    } else {
        (text, false)
    };
    let default_port = if https { 443 } else { 80 };
    endpoint_source(text, rest, default_port).map(|s| (s, https))
}

fn endpoint_source(text: &str, rest: &str, default_port: u16) -> Result<EndpointSource, String> {
    let rest = rest.trim_end_matches('/');
    if rest.contains('/') {
        return Err(format!(
            "{text:?}: an endpoint is host:port, without a path"
        ));
    }
    if let Ok(addr) = rest.parse::<SocketAddr>() {
        return Ok(EndpointSource::Static(addr));
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => {
            let port = p
                .parse::<u16>()
                .map_err(|_| format!("{text:?}: bad port {p:?}"))?;
            (h, port)
        }
        None => (rest, default_port),
    };
    if let Ok(ip) = host
        .trim_matches(|c| c == '[' || c == ']')
        .parse::<std::net::IpAddr>()
    {
        return Ok(EndpointSource::Static(SocketAddr::new(ip, port)));
    }
    let valid = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !valid {
        return Err(format!(
            "{text:?}: {host:?} is neither an IP address nor a valid host name"
        ));
    }
    Ok(EndpointSource::Name {
        host: host.to_ascii_lowercase(),
        port,
    })
}

/// A duration written back the way a config file would.
fn humantime_short(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

fn span_of<T>(v: &Option<S<T>>) -> Option<std::ops::Range<usize>> {
    v.as_ref().map(|v| v.span())
}

/// Validates `file`, adding to the problems already in `cx` (those of the surface).
pub(super) fn validate(file: surface::File, cx: &mut Ctx<'_>) -> Option<Config> {
    let loc = cx.loc;

    let admin = admin::admin(cx, file.admin.as_ref());
    let kubernetes = kubernetes::section(cx, file.kubernetes.as_ref());

    let mut dns = DnsConfig::default();
    if let Some(d) = &file.dns {
        for s in &d.servers {
            if let Some(a) = cx.socket_addr(s, "dns server") {
                dns.servers.push(a);
            }
        }
        dns.timeout = cx.positive(&d.timeout, dns.timeout, "dns timeout");
    }

    let mut lifecycle = Lifecycle::default();
    if let Some(l) = &file.lifecycle {
        lifecycle.drain_delay = cx.duration(&l.drain_delay, lifecycle.drain_delay);
        lifecycle.shutdown_timeout = cx.duration(&l.shutdown_timeout, lifecycle.shutdown_timeout);
    }

    let mut listeners = Vec::new();
    let mut seen_listen = HashSet::new();
    for l in &file.listener {
        // A bad address still gets the rest of its table checked, so every problem shows at once.
        let addr = cx
            .socket_addr(&l.listen, "listener")
            .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        if addr.port() != 0 && !seen_listen.insert(addr) {
            cx.err(
                l.listen.span(),
                format!("listener {addr} is declared twice"),
            );
        }
        let mut m = ListenerConfig::plain(addr);
        m.idle_timeout = cx.positive(&l.idle_timeout, m.idle_timeout, "idle_timeout");
        m.header_read_timeout = cx.positive(
            &l.header_read_timeout,
            m.header_read_timeout,
            "header_read_timeout",
        );
        if let Some(old) = &l.body_timeout {
            if l.client_body_timeout.is_some() {
                cx.err(
                    old.span(),
                    "body_timeout is the old name of client_body_timeout; give only one",
                );
            } else {
                cx.warn(
                    old.span(),
                    "body_timeout is deprecated; write client_body_timeout (same meaning)",
                );
            }
        }
        let body = l.client_body_timeout.as_ref().or(l.body_timeout.as_ref());
        m.client_body_timeout = cx.positive(
            &body.map(|b| S::new(b.span(), b.get_ref().as_ref().to_owned())),
            m.client_body_timeout,
            "client_body_timeout",
        );
        m.send_timeout = cx.positive(&l.send_timeout, m.send_timeout, "send_timeout");
        m.max_header_bytes = cx.int(
            &l.max_header_bytes,
            m.max_header_bytes as u64,
            8192,
            1 << 20,
            "max_header_bytes",
        ) as usize;
        m.max_connections = cx.int(
            &l.max_connections,
            m.max_connections as u64,
            1,
            10_000_000,
            "max_connections",
        ) as usize;
        if let Some(f) = &l.forwarded {
            m.forwarded = match f.get_ref().as_str() {
                "x-forwarded" => Forwarded::XForwarded,
                "forwarded" => Forwarded::Forwarded,
                "none" => Forwarded::None,
                other => {
                    cx.err(f.span(), format!("forwarded {other:?}: expected \"x-forwarded\", \"forwarded\" or \"none\""));
                    m.forwarded
                }
            };
        }
        for c in l.trusted_proxies.iter().flatten() {
            match Cidr::parse(c.get_ref()) {
                Ok(c) => m.trusted_proxies.push(c),
                Err(e) => cx.err(c.span(), format!("trusted_proxies: {e}")),
            }
        }
        if let Some(t) = &l.tls {
            let base = loc.base_dir();
            let cert = base.join(t.cert.get_ref());
            let key = base.join(t.key.get_ref());
            if !cert.is_file() {
                cx.err(
                    t.cert.span(),
                    format!("tls cert {} does not exist", cert.display()),
                );
            }
            if !key.is_file() {
                cx.err(
                    t.key.span(),
                    format!("tls key {} does not exist", key.display()),
                );
            }
            m.tls = Some(TlsConfig { cert, key });
        }
        listeners.push(m);
    }
    if file.listener.is_empty() && !cx.partial {
        cx.err(
            0..0,
            "no [[listener]]: add one, e.g. [[listener]] listen = \"127.0.0.1:8080\"",
        );
    }
    if admin.listen.port() != 0 && listeners.iter().any(|l| l.listen == admin.listen) {
        let span = file
            .admin
            .as_ref()
            .and_then(|a| a.listen.as_ref())
            .map_or(0..0, |l| l.span());
        cx.err(
            span,
            format!("admin listen {} is also a listener", admin.listen),
        );
    }
    if let Some(p) = admin.probes {
        if p.port() != 0 && listeners.iter().any(|l| l.listen == p) {
            let span = file
                .admin
                .as_ref()
                .and_then(|a| a.probes.as_ref())
                .map_or(0..0, |l| l.span());
            cx.err(span, format!("admin probes {p} is also a listener"));
        }
    }

    let mut groups = BTreeMap::new();
    for (name, g) in &file.groups {
        if let Some(m) = group(cx, name, g) {
            groups.insert(name.get_ref().clone(), m);
        }
    }

    let mut routes = Vec::new();
    for spanned in &file.route {
        let rules = route_rules::route_rules(cx, spanned, &groups);
        let r = spanned.get_ref();
        let host = match &r.host {
            None => HostMatch::Any,
            Some(h) => {
                let v = h.get_ref().to_ascii_lowercase();
                if v == "*" {
                    HostMatch::Any
                } else if let Some(suffix) = v.strip_prefix('*') {
                    if !suffix.starts_with('.') || suffix.len() < 2 {
                        cx.err(
                            h.span(),
                            format!("host {v:?}: a wildcard is written \"*.example.com\""),
                        );
                    }
                    HostMatch::Suffix(suffix.to_owned())
                } else if v.is_empty() || v.contains(['/', ' ', '*']) {
                    cx.err(h.span(), format!("host {v:?} is not a host name"));
                    HostMatch::Any
                } else {
                    HostMatch::Exact(v)
                }
            }
        };
        let path = match &r.path {
            None => "/".to_owned(),
            Some(p) if p.get_ref().starts_with('/') => p.get_ref().clone(),
            Some(p) => {
                cx.err(
                    p.span(),
                    format!("path {:?} must start with '/'", p.get_ref()),
                );
                "/".to_owned()
            }
        };
        if let Some(g) = &r.group {
            if !cx.partial && !file.groups.keys().any(|k| k.get_ref() == g.get_ref()) {
                cx.err(
                    g.span(),
                    format!(
                        "route names group {:?}, which is not defined under [groups]",
                        g.get_ref()
                    ),
                );
            }
        }
        routes.push(RouteConfig {
            host,
            path,
            group: r.group.as_ref().map(|g| g.get_ref().clone()),
            allow_encoded_separators: r.allow_encoded_separators.unwrap_or(false),
            rules,
        });
    }
    if file.route.is_empty() && !cx.partial {
        cx.err(
            0..0,
            "no [[route]]: add one, e.g. [[route]] group = \"app\"",
        );
    }

    let access_log = match &file.access_log {
        None => AccessLog::Stdout,
        Some(v) => match v.get_ref().as_str() {
            "-" | "stdout" => AccessLog::Stdout,
            "off" => AccessLog::Off,
            p => AccessLog::File(loc.base_dir().join(PathBuf::from(p))),
        },
    };
    let access_log_format = match &file.access_log_format {
        None => AccessLogFormat::default(),
        Some(v) => match v.get_ref().as_str() {
            "json" => AccessLogFormat::Json,
            "combined" => AccessLogFormat::Combined,
            other => {
                cx.err(
                    v.span(),
                    format!("access_log_format {other:?}: expected \"json\" or \"combined\""),
                );
                AccessLogFormat::default()
            }
        },
    };

    Some(Config {
        admin,
        dns,
        lifecycle,
        listeners,
        routes,
        groups,
        access_log,
        access_log_format,
        kubernetes,
    })
}

fn group(cx: &mut Ctx<'_>, name: &S<String>, g: &surface::Group) -> Option<GroupConfig> {
    let mut endpoints = Vec::new();
    let mut seen = HashSet::new();
    let mut schemes = Vec::new();
    for e in g.endpoints.get_ref() {
        let (text, tier) = match e.get_ref() {
            surface::Endpoint::Plain(s) => (s.as_str(), 0),
            surface::Endpoint::Table(t) => (t.addr.as_deref().unwrap_or(""), t.tier),
        };
        if !(0..=7).contains(&tier) {
            cx.err(
                e.span(),
                format!("tier must be between 0 and 7, got {tier}"),
            );
            continue;
        }
        if let surface::Endpoint::Table(t) = e.get_ref() {
            if t.kubernetes.is_some() {
                if let Some(source) = kubernetes::endpoint(cx, e.span(), t) {
                    if !seen.insert(source.clone()) {
                        cx.err(
                            e.span(),
                            format!(
                                "endpoint {source} is listed twice in group {:?}",
                                name.get_ref()
                            ),
                        );
                    }
                    endpoints.push(Endpoint {
                        source,
                        tier: tier as u8,
                        https: false,
                    });
                }
                continue;
            }
            if t.addr.is_none() {
                cx.err(e.span(), "an endpoint table needs addr (\"host:port\") or kubernetes (\"namespace/service\")");
                continue;
            }
            if t.port.is_some() {
                cx.err(
                    e.span(),
                    "port goes with kubernetes endpoints; write it in addr (\"host:port\")",
                );
                continue;
            }
        }
        match parse_endpoint_scheme(text) {
            Ok((source, https)) => {
                schemes.push((e.span(), https, source.clone()));
                let ep = Endpoint {
                    source,
                    tier: tier as u8,
                    https,
                };
                if !seen.insert(ep.source.clone()) {
                    // Two lines for one host are harmless here (peers are keyed by address),
                    // but almost always a copy-paste slip, so say so.
                    cx.err(
                        e.span(),
                        format!(
                            "endpoint {text:?} is listed twice in group {:?}",
                            name.get_ref()
                        ),
                    );
                }
                endpoints.push(ep);
            }
            Err(msg) => cx.err(e.span(), msg),
        }
    }
    if g.endpoints.get_ref().is_empty() {
        cx.err(
            g.endpoints.span(),
            format!("group {:?} has no endpoints", name.get_ref()),
        );
    }
    let mut m = GroupConfig::with_endpoints(endpoints);
    m.required = g.required.unwrap_or(true);
    let base = cx.loc.base_dir();
    match super::upstream_tls::validate(name, g.tls.as_ref(), &schemes, &base) {
        Ok(tls) => m.tls = tls,
        Err(problems) => {
            for (span, msg) in problems {
                cx.err(span, msg);
            }
        }
    }
    let https = !schemes.is_empty() && schemes.iter().all(|(_, h, _)| *h);
    match super::protocol::validate(g.protocol.as_ref(), https) {
        Ok(p) => m.protocol = p,
        Err((span, msg)) => cx.err(span, msg),
    }
    if let Some(b) = &g.balance {
        m.balance = match b.get_ref().as_str() {
            "round_robin" => Balance::RoundRobin,
            "p2c" => Balance::P2c,
            other => {
                cx.err(
                    b.span(),
                    format!("balance {other:?}: expected \"round_robin\" or \"p2c\""),
                );
                m.balance
            }
        };
    }
    m.connect_timeout = cx.positive(&g.connect_timeout, m.connect_timeout, "connect_timeout");
    m.try_timeout = cx.positive(&g.try_timeout, m.try_timeout, "try_timeout");
    m.read_timeout = cx.positive(&g.read_timeout, m.read_timeout, "read_timeout");
    m.upgrade_idle_timeout = cx.positive(
        &g.upgrade_idle_timeout,
        m.upgrade_idle_timeout,
        "upgrade_idle_timeout",
    );
    m.deadline = cx.positive(&g.deadline, m.deadline, "deadline");
    let deadline_span = span_of(&g.deadline);
    cx.not_after(
        span_of(&g.try_timeout).or(deadline_span.clone()),
        ("try_timeout", m.try_timeout),
        ("deadline", m.deadline),
    );
    cx.not_after(
        span_of(&g.connect_timeout).or(deadline_span.clone()),
        ("connect_timeout", m.connect_timeout),
        ("deadline", m.deadline),
    );
    m.degraded_alert_after = cx.duration(&g.degraded_alert_after, m.degraded_alert_after);
    if let Some(p) = &g.pool {
        m.pool.idle_timeout = cx.duration(&p.idle_timeout, m.pool.idle_timeout);
        m.pool.max_idle_per_peer = cx.int(
            &p.max_idle_per_peer,
            m.pool.max_idle_per_peer as u64,
            0,
            100_000,
            "max_idle_per_peer",
        ) as usize;
        m.pool.idle_peak_window = cx.positive(
            &p.idle_peak_window,
            m.pool.idle_peak_window,
            "idle_peak_window",
        );
        m.pool.max_age = cx.duration(&p.max_age, m.pool.max_age);
        m.pool.http2_keepalive_interval = cx.positive(
            &p.http2_keepalive_interval,
            m.pool.http2_keepalive_interval,
            "http2_keepalive_interval",
        );
        m.pool.http2_keepalive_timeout = cx.positive(
            &p.http2_keepalive_timeout,
            m.pool.http2_keepalive_timeout,
            "http2_keepalive_timeout",
        );
        m.pool.http2_replay_buffer_bytes = cx.int(
            &p.http2_replay_buffer_bytes,
            m.pool.http2_replay_buffer_bytes as u64,
            0,
            64 * 1024 * 1024,
            "http2_replay_buffer_bytes",
        ) as usize;
        m.pool.max_connections_per_peer = p.max_connections_per_peer.as_ref().map(|_| {
            cx.int(
                &p.max_connections_per_peer,
                0,
                1,
                10_000_000,
                "max_connections_per_peer",
            ) as usize
        });
    }
    if let Some(d) = &g.discovery {
        m.discovery.min_refresh =
            cx.positive(&d.min_refresh, m.discovery.min_refresh, "min_refresh");
        m.discovery.max_refresh =
            cx.positive(&d.max_refresh, m.discovery.max_refresh, "max_refresh");
        if let (Some(span), true) = (
            d.max_refresh
                .as_ref()
                .or(d.min_refresh.as_ref())
                .map(|s| s.span()),
            m.discovery.min_refresh > m.discovery.max_refresh,
        ) {
            cx.err(span, "min_refresh must not exceed max_refresh");
        }
        m.discovery.error_backoff =
            cx.positive(&d.error_backoff, m.discovery.error_backoff, "error_backoff");
        if let Some(s) = &d.stale_grace {
            m.discovery.stale_grace = if s.get_ref() == "while_healthy" {
                StaleGrace::WhileHealthy
            } else {
                match parse_duration(s.get_ref()) {
                    Ok(d) => StaleGrace::For(d),
                    Err(e) => {
                        cx.err(
                            s.span(),
                            format!("stale_grace: \"while_healthy\" or a duration; {e}"),
                        );
                        m.discovery.stale_grace
                    }
                }
            };
        }
    }
    if let Some(h) = &g.health {
        m.health.consecutive_failures = cx.int(
            &h.consecutive_failures,
            m.health.consecutive_failures.into(),
            1,
            1000,
            "consecutive_failures",
        ) as u32;
        m.health.base_ejection =
            cx.positive(&h.base_ejection, m.health.base_ejection, "base_ejection");
        m.health.max_ejection = cx.positive(&h.max_ejection, m.health.max_ejection, "max_ejection");
        cx.not_after(
            span_of(&h.base_ejection).or(span_of(&h.max_ejection)),
            ("base_ejection", m.health.base_ejection),
            ("max_ejection", m.health.max_ejection),
        );
        m.health.min_healthy_percent = cx.int(
            &h.min_healthy_percent,
            m.health.min_healthy_percent.into(),
            0,
            100,
            "min_healthy_percent",
        ) as u8;
        if let Some(a) = &h.active {
            let path = match &a.path {
                None => "/".to_owned(),
                Some(p) if p.get_ref().starts_with('/') => p.get_ref().clone(),
                Some(p) => {
                    cx.err(p.span(), "active check path must start with '/'");
                    "/".to_owned()
                }
            };
            m.health.active = Some(ActiveCheck {
                path,
                interval: cx.positive(&a.interval, Duration::from_secs(1), "interval"),
                timeout: cx.positive(&a.timeout, Duration::from_millis(500), "timeout"),
                rise: cx.int(&a.rise, 1, 1, 100, "rise") as u32,
                fall: cx.int(&a.fall, 2, 1, 100, "fall") as u32,
            });
        }
    }
    if let Some(r) = &g.retry {
        m.retry.attempts = cx.int(&r.attempts, m.retry.attempts.into(), 1, 10, "attempts") as u32;
        m.retry.budget_percent = cx.int(
            &r.budget_percent,
            m.retry.budget_percent.into(),
            0,
            100,
            "budget_percent",
        ) as u8;
        m.retry.budget_min = cx.int(
            &r.budget_min,
            m.retry.budget_min.into(),
            0,
            10_000,
            "budget_min",
        ) as u32;
        m.retry.connect_retry_window =
            cx.duration(&r.connect_retry_window, m.retry.connect_retry_window);
        cx.not_after(
            span_of(&r.connect_retry_window),
            ("connect_retry_window", m.retry.connect_retry_window),
            ("deadline", m.deadline),
        );
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn endpoint_forms() {
        assert_eq!(
            parse_endpoint("http://127.0.0.1:8080").unwrap(),
            EndpointSource::Static("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            parse_endpoint("[::1]:81").unwrap(),
            EndpointSource::Static("[::1]:81".parse().unwrap())
        );
        assert_eq!(
            parse_endpoint("http://App.Example.test:9000/").unwrap(),
            EndpointSource::Name {
                host: "app.example.test".into(),
                port: 9000
            }
        );
        assert_eq!(
            parse_endpoint("svc.internal").unwrap(),
            EndpointSource::Name {
                host: "svc.internal".into(),
                port: 80
            }
        );
        assert!(parse_endpoint("https://x:1").is_err());
        assert_eq!(
            parse_endpoint_scheme("https://x.test").unwrap(),
            (
                EndpointSource::Name {
                    host: "x.test".into(),
                    port: 443
                },
                true
            )
        );
        assert!(parse_endpoint("ftp://x:1").is_err());
        assert!(parse_endpoint("x:99999").is_err());
        assert!(parse_endpoint("bad host:1").is_err());
        assert!(parse_endpoint("http://x:1/path").is_err());
    }

    #[test]
    fn reports_every_problem_with_its_position() {
        let text = r#"
[[listener]]
listen = "127.0.0.1:nope"
idle_timeout = "5 parsecs"

[[route]]
group = "missing"

[groups.app]
endpoints = ["bad host:1"]
connect_timeout = "1"
"#;
        let err = super::super::parse(Path::new("t.toml"), text).unwrap_err();
        let lines: Vec<(usize, usize)> = err.problems.iter().map(|p| (p.line, p.column)).collect();
        assert_eq!(err.problems.len(), 5, "{err}");
        assert_eq!(
            lines,
            vec![(3, 10), (4, 16), (7, 9), (10, 14), (11, 19)],
            "{err}"
        );
        assert!(
            err.to_string().starts_with("t.toml:3:10: listener"),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_is_refused_with_position() {
        let err = super::super::parse(
            Path::new("t.toml"),
            "[admin]\nlisten = \"127.0.0.1:1\"\nlistn = 1\n",
        )
        .unwrap_err();
        assert_eq!(err.problems.len(), 1);
        assert_eq!(err.problems[0].line, 3, "{err}");
        assert!(err.problems[0].message.contains("listn"), "{err}");
    }

    const BASE: &str = "[[listener]]\nlisten = \"127.0.0.1:8080\"\n[[route]]\ngroup = \"app\"\n[groups.app]\nendpoints = [\"127.0.0.1:9000\"]\n";

    fn problems(text: &str) -> Vec<String> {
        match super::super::parse(Path::new("t.toml"), text) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn zero_durations_that_would_spin_or_panic_are_refused() {
        let text = format!(
            "{BASE}connect_timeout = \"0\"\n[groups.app.health.active]\ninterval = \"0\"\n"
        )
        .replace(
            "listen = \"127.0.0.1:8080\"\n",
            "listen = \"127.0.0.1:8080\"\nheader_read_timeout = \"0s\"\nsend_timeout = \"0ms\"\n",
        );
        let p = problems(&text);
        assert_eq!(p.len(), 4, "{p:#?}");
        for (key, line) in [
            ("header_read_timeout", 3),
            ("send_timeout", 4),
            ("connect_timeout", 9),
            ("interval", 11),
        ] {
            assert!(
                p.iter().any(|m| m.starts_with(&format!("t.toml:{line}:"))
                    && m.contains(&format!("{key} must be more than zero"))),
                "{key}: {p:#?}"
            );
        }
    }

    #[test]
    fn contradictory_timeouts_are_refused() {
        let p = problems(&format!(
            "{BASE}try_timeout = \"30s\"\ndeadline = \"10s\"\n[groups.app.retry]\nconnect_retry_window = \"20s\"\n"
        ));
        assert_eq!(p.len(), 2, "{p:#?}");
        assert!(
            p[0].contains("t.toml:7:15: try_timeout (30s) is longer than deadline (10s)"),
            "{p:#?}"
        );
        assert!(
            p[1].contains("connect_retry_window (20s) is longer than deadline (10s)"),
            "{p:#?}"
        );
    }

    #[test]
    fn type_errors_do_not_hide_other_problems_and_speak_the_configs_words() {
        let text = "[[listener]]\nlisten = \"127.0.0.1:8080\"\nmax_header_bytes = \"big\"\nlistn = 1\n\n[[route]]\ngroup = \"app\"\n\n[groups.app]\nrequired = \"yes\"\nendpoints = [\"127.0.0.1:9000\"]\ntry_timeout = 5\nconnect_timeout = \"fast\"\n";
        let p = problems(text);
        assert_eq!(p.len(), 5, "{p:#?}");
        assert!(
            p[0].starts_with("t.toml:3:20: expected a whole number, found string"),
            "{p:#?}"
        );
        assert!(
            p[1].starts_with("t.toml:4:1: unknown field `listn`"),
            "{p:#?}"
        );
        assert!(
            p[2].starts_with("t.toml:10:12: expected true or false"),
            "{p:#?}"
        );
        assert!(
            p[3].starts_with("t.toml:12:15: expected a duration like \"5s\""),
            "{p:#?}"
        );
        assert!(
            p[4].starts_with("t.toml:13:19: \"fast\" is not a duration"),
            "{p:#?}"
        );
    }

    #[test]
    fn body_timeout_is_a_deprecated_alias_of_client_body_timeout() {
        let text = BASE.replace(
            "listen = \"127.0.0.1:8080\"\n",
            "listen = \"127.0.0.1:8080\"\nbody_timeout = \"7s\"\n",
        );
        let (cfg, warnings) =
            super::super::parse_with_warnings(Path::new("t.toml"), &text).unwrap();
        assert_eq!(cfg.listeners[0].client_body_timeout, Duration::from_secs(7));
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0]
                .to_string()
                .starts_with("t.toml:3:16: body_timeout is deprecated"),
            "{}",
            warnings[0]
        );
        let both = text.replace("body_timeout", "client_body_timeout = \"1s\"\nbody_timeout");
        assert_eq!(problems(&both).len(), 1, "{:#?}", problems(&both));
    }

    #[test]
    fn defaults_follow_nginx() {
        let cfg = super::super::parse(Path::new("t.toml"), BASE).unwrap();
        let l = &cfg.listeners[0];
        assert_eq!(l.header_read_timeout, Duration::from_secs(10));
        assert_eq!(l.client_body_timeout, Duration::from_secs(60));
        assert_eq!(l.send_timeout, Duration::from_secs(60));
        assert!(l.max_connections >= 64);
        assert_eq!(cfg.groups["app"].read_timeout, Duration::from_secs(60));
    }
}
