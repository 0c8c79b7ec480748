//! Surface -> model, collecting every problem with its position instead of stopping at the first.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::model::*;
use super::surface::{self, S};
use super::{parse_duration, ConfigError, Locator, Problem};

mod admin;

struct Ctx<'a> {
    loc: &'a Locator,
    problems: Vec<Problem>,
}

impl Ctx<'_> {
    fn err(&mut self, span: std::ops::Range<usize>, msg: impl Into<String>) {
        self.problems.push(self.loc.problem(span, msg));
    }

    fn duration(&mut self, value: &Option<S<String>>, default: Duration) -> Duration {
        match value {
            None => default,
            Some(v) => match parse_duration(v.get_ref()) {
                Ok(d) => d,
                Err(e) => {
                    self.err(v.span(), e);
                    default
                }
            },
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

pub(super) fn validate(file: surface::File, loc: &Locator) -> Result<Config, ConfigError> {
    let mut cx = Ctx {
        loc,
        problems: Vec::new(),
    };

    let admin = admin::admin(&mut cx, file.admin.as_ref());

    let mut dns = DnsConfig::default();
    if let Some(d) = &file.dns {
        for s in &d.servers {
            if let Some(a) = cx.socket_addr(s, "dns server") {
                dns.servers.push(a);
            }
        }
        dns.timeout = cx.duration(&d.timeout, dns.timeout);
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
        m.idle_timeout = cx.duration(&l.idle_timeout, m.idle_timeout);
        m.header_read_timeout = cx.duration(&l.header_read_timeout, m.header_read_timeout);
        m.body_timeout = cx.duration(&l.body_timeout, m.body_timeout);
        m.max_header_bytes = cx.int(
            &l.max_header_bytes,
            m.max_header_bytes as u64,
            8192,
            1 << 20,
            "max_header_bytes",
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
    if file.listener.is_empty() {
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
        if let Some(m) = group(&mut cx, name, g) {
            groups.insert(name.get_ref().clone(), m);
        }
    }

    let mut routes = Vec::new();
    for r in &file.route {
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
        if !file.groups.keys().any(|k| k.get_ref() == r.group.get_ref()) {
            cx.err(
                r.group.span(),
                format!(
                    "route names group {:?}, which is not defined under [groups]",
                    r.group.get_ref()
                ),
            );
        }
        routes.push(RouteConfig {
            host,
            path,
            group: r.group.get_ref().clone(),
            allow_encoded_separators: r.allow_encoded_separators.unwrap_or(false),
        });
    }
    if file.route.is_empty() {
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

    if cx.problems.is_empty() {
        Ok(Config {
            admin,
            dns,
            lifecycle,
            listeners,
            routes,
            groups,
            access_log,
            access_log_format,
        })
    } else {
        cx.problems.sort_by_key(|p| (p.line, p.column));
        Err(ConfigError {
            problems: cx.problems,
        })
    }
}

fn group(cx: &mut Ctx<'_>, name: &S<String>, g: &surface::Group) -> Option<GroupConfig> {
    let mut endpoints = Vec::new();
    let mut seen = HashSet::new();
    let mut schemes = Vec::new();
    for e in g.endpoints.get_ref() {
        let (text, tier) = match e.get_ref() {
            surface::Endpoint::Plain(s) => (s.as_str(), 0),
            surface::Endpoint::Table(t) => (t.addr.as_str(), t.tier),
        };
        if !(0..=7).contains(&tier) {
            cx.err(
                e.span(),
                format!("tier must be between 0 and 7, got {tier}"),
            );
            continue;
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
    m.connect_timeout = cx.duration(&g.connect_timeout, m.connect_timeout);
    m.try_timeout = cx.duration(&g.try_timeout, m.try_timeout);
    m.deadline = cx.duration(&g.deadline, m.deadline);
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
        m.pool.max_age = cx.duration(&p.max_age, m.pool.max_age);
    }
    if let Some(d) = &g.discovery {
        m.discovery.min_refresh = cx.duration(&d.min_refresh, m.discovery.min_refresh);
        m.discovery.max_refresh = cx.duration(&d.max_refresh, m.discovery.max_refresh);
        if let (Some(span), true) = (
            d.max_refresh
                .as_ref()
                .or(d.min_refresh.as_ref())
                .map(|s| s.span()),
            m.discovery.min_refresh > m.discovery.max_refresh,
        ) {
            cx.err(span, "min_refresh must not exceed max_refresh");
        }
        m.discovery.error_backoff = cx.duration(&d.error_backoff, m.discovery.error_backoff);
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
        m.health.base_ejection = cx.duration(&h.base_ejection, m.health.base_ejection);
        m.health.max_ejection = cx.duration(&h.max_ejection, m.health.max_ejection);
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
                interval: cx.duration(&a.interval, Duration::from_secs(1)),
                timeout: cx.duration(&a.timeout, Duration::from_millis(500)),
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
}
