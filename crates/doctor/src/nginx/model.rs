//! What the rules look at: upstreams with their peers, and each `proxy_pass` with the proxy
//! settings in effect where it is written (nginx's inheritance, including the all-or-nothing
//! inheritance of `proxy_set_header` and `error_page`).

use super::parse::Directive;
use super::rules::parse_size;

/// One `server` line of an upstream.
#[derive(Debug)]
pub struct Peer<'a> {
    /// Host name or address, without the port.
    pub host: String,
    /// Port (80 when not written).
    pub port: u16,
    /// Whether the line has `resolve`.
    pub resolve: bool,
    /// Whether the line has `backup`.
    pub backup: bool,
    /// `max_fails=` when written.
    pub max_fails: Option<u32>,
    /// The `server` directive.
    pub directive: &'a Directive,
}

/// An `upstream` block.
#[derive(Debug)]
pub struct Upstream<'a> {
    /// The upstream's name.
    pub name: String,
    /// Its `server` lines.
    pub peers: Vec<Peer<'a>>,
    /// The `zone` directive and its size, when written.
    pub zone: Option<(&'a Directive, Option<u64>)>,
    /// The `keepalive` directive.
    pub keepalive: Option<&'a Directive>,
    /// The `keepalive_timeout` directive.
    pub keepalive_timeout: Option<&'a Directive>,
    /// Whether the block has its own `resolver` (nginx 1.27.3+).
    pub has_resolver: bool,
}

/// The modules that pass requests to an upstream: `proxy_pass`, `fastcgi_pass`, ...
pub const PASS_MODULES: &[&str] = &["proxy", "fastcgi", "uwsgi", "scgi", "grpc"];

/// A `*_pass` (proxy, fastcgi, uwsgi, scgi, grpc) and the settings in effect for it.
#[derive(Debug)]
pub struct ProxyUse<'a> {
    /// The `*_pass` directive (named for the common case, `proxy_pass`).
    pub proxy_pass: &'a Directive,
    /// Its module: `proxy`, `fastcgi`, `uwsgi`, `scgi` or `grpc`.
    pub module: &'static str,
    /// Index of the upstream it names, when it names one.
    pub upstream: Option<usize>,
    /// `<module>_next_upstream` in effect.
    pub next_upstream: Option<&'a Directive>,
    /// `proxy_http_version` in effect.
    pub http_version: Option<&'a Directive>,
    /// `proxy_set_header` lines in effect.
    pub set_headers: Vec<&'a Directive>,
    /// `error_page` lines in effect.
    pub error_pages: Vec<&'a Directive>,
    /// The name of the named location (`@x`) it is in, if any.
    pub named_location: Option<String>,
    /// Which `server {}` block it is in (a counter), if any.
    pub server: Option<usize>,
}

/// Everything the rules need from one configuration.
#[derive(Debug, Default)]
pub struct Model<'a> {
    /// All http upstream blocks.
    pub upstreams: Vec<Upstream<'a>>,
    /// All `*_pass` uses.
    pub proxy_uses: Vec<ProxyUse<'a>>,
    /// All `resolver` directives (http context).
    pub resolvers: Vec<&'a Directive>,
    /// Whether an `http {}` block was seen (false for a fragment).
    pub has_http: bool,
    /// Whether `http {}` has its own `resolver`.
    pub http_resolver: bool,
}

/// Blocks whose contents are not http directives.
const OPAQUE: &[&str] = &[
    "stream",
    "mail",
    "map",
    "types",
    "geo",
    "split_clients",
    "charset_map",
    "events",
    "match",
];

#[derive(Clone, Default)]
struct Ctx<'a> {
    /// `<module>_next_upstream` per entry of `PASS_MODULES`.
    next_upstream: [Option<&'a Directive>; 5],
    http_version: Option<&'a Directive>,
    set_headers: Vec<&'a Directive>,
    error_pages: Vec<&'a Directive>,
    named: Option<String>,
    server: Option<usize>,
}

impl Model<'_> {
    /// The modules whose `*_pass` sends requests to upstream `i`, `proxy` when none does.
    pub fn modules_of(&self, i: usize) -> Vec<&'static str> {
        let mut m: Vec<&'static str> = Vec::new();
        for u in self.proxy_uses.iter().filter(|u| u.upstream == Some(i)) {
            if !m.contains(&u.module) {
                m.push(u.module);
            }
        }
        if m.is_empty() {
            m.push("proxy");
        }
        m
    }
}

impl<'a> Model<'a> {
    /// Builds the model from a loaded tree.
    pub fn build(tree: &'a [Directive]) -> Self {
        let mut m = Model::default();
        m.collect_upstreams(tree);
        let mut servers = 0;
        m.walk(tree, Ctx::default(), &mut servers);
        m
    }

    fn collect_upstreams(&mut self, dirs: &'a [Directive]) {
        for d in dirs {
            match d.name.as_str() {
                "upstream" if d.block.is_some() => self.upstreams.push(upstream(d)),
                "resolver" => self.resolvers.push(d),
                n if OPAQUE.contains(&n) => {}
                "http" => {
                    self.has_http = true;
                    self.http_resolver |= d.children().iter().any(|c| c.name == "resolver");
                    self.collect_upstreams(d.children());
                }
                _ => self.collect_upstreams(d.children()),
            }
        }
    }

    fn walk(&mut self, dirs: &'a [Directive], parent: Ctx<'a>, servers: &mut usize) {
        let mut ctx = parent;
        let mut headers_here = Vec::new();
        let mut pages_here = Vec::new();
        for d in dirs {
            if let Some(i) = d
                .name
                .strip_suffix("_next_upstream")
                .and_then(|m| PASS_MODULES.iter().position(|p| *p == m))
            {
                ctx.next_upstream[i] = Some(d);
            }
            match d.name.as_str() {
                "proxy_http_version" => ctx.http_version = Some(d),
                "proxy_set_header" => headers_here.push(d),
                "error_page" => pages_here.push(d),
                _ => {}
            }
        }
        if !headers_here.is_empty() {
            ctx.set_headers = headers_here;
        }
        if !pages_here.is_empty() {
            ctx.error_pages = pages_here;
        }
        for d in dirs {
            let pass = d
                .name
                .strip_suffix("_pass")
                .and_then(|m| PASS_MODULES.iter().position(|p| *p == m));
            match d.name.as_str() {
                _ if pass.is_some() && d.block.is_none() => {
                    let i = pass.unwrap_or_default();
                    let upstream = d.arg(0).and_then(|t| self.upstream_index(t));
                    self.proxy_uses.push(ProxyUse {
                        proxy_pass: d,
                        module: PASS_MODULES[i],
                        upstream,
                        next_upstream: ctx.next_upstream[i],
                        http_version: ctx.http_version,
                        set_headers: ctx.set_headers.clone(),
                        error_pages: ctx.error_pages.clone(),
                        named_location: ctx.named.clone(),
                        server: ctx.server,
                    });
                }
                "upstream" => {}
                n if OPAQUE.contains(&n) => {}
                "server" if d.block.is_some() => {
                    *servers += 1;
                    let mut inner = ctx.clone();
                    inner.server = Some(*servers);
                    inner.named = None;
                    self.walk(d.children(), inner, servers);
                }
                "location" => {
                    let mut inner = ctx.clone();
                    if let Some(name) = d.arg(0).filter(|a| a.starts_with('@')) {
                        inner.named = Some(name.to_owned());
                    }
                    self.walk(d.children(), inner, servers);
                }
                _ if d.block.is_some() => self.walk(d.children(), ctx.clone(), servers),
                _ => {}
            }
        }
    }

    /// The upstream a `*_pass` target names: `[scheme://]name[/uri]` with no port and no
    /// variables (a port or a variable never refers to an `upstream {}` block).
    fn upstream_index(&self, target: &str) -> Option<usize> {
        let rest = target.split_once("://").map_or(target, |(_, r)| r);
        let host = rest.split('/').next()?;
        if host.contains([':', '$']) {
            return None;
        }
        self.upstreams.iter().position(|u| u.name == host)
    }
}

fn upstream(d: &Directive) -> Upstream<'_> {
    let mut up = Upstream {
        name: d.arg(0).unwrap_or_default().to_owned(),
        peers: Vec::new(),
        zone: None,
        keepalive: None,
        keepalive_timeout: None,
        has_resolver: false,
    };
    for c in d.children() {
        match c.name.as_str() {
            "server" => {
                if let Some(p) = peer(c) {
                    up.peers.push(p);
                }
            }
            "zone" => up.zone = Some((c, c.arg(1).and_then(parse_size))),
            "keepalive" => up.keepalive = Some(c),
            "keepalive_timeout" => up.keepalive_timeout = Some(c),
            "resolver" => up.has_resolver = true,
            _ => {}
        }
    }
    up
}

fn peer(d: &Directive) -> Option<Peer<'_>> {
    let addr = d.arg(0)?;
    if addr.starts_with("unix:") {
        return None;
    }
    let (host, port) = split_host_port(addr);
    let mut p = Peer {
        host: host.to_ascii_lowercase(),
        port,
        resolve: false,
        backup: false,
        max_fails: None,
        directive: d,
    };
    for a in &d.args[1..] {
        match a.value.as_str() {
            "resolve" => p.resolve = true,
            "backup" => p.backup = true,
            v => {
                if let Some(n) = v.strip_prefix("max_fails=") {
                    p.max_fails = n.parse().ok();
                }
            }
        }
    }
    Some(p)
}

fn split_host_port(addr: &str) -> (&str, u16) {
    if let Some(rest) = addr.strip_prefix('[') {
        if let Some((host, tail)) = rest.split_once(']') {
            let port = tail
                .strip_prefix(':')
                .and_then(|p| p.parse().ok())
                .unwrap_or(80);
            return (host, port);
        }
    }
    match addr.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, p.parse().unwrap_or(80)),
        _ => (addr, 80),
    }
}
