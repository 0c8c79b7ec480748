//! The nginx config rules: the traps of docs/incidents.md found in a parsed configuration.

use super::model::{Model, ProxyUse, Upstream};
use super::parse::{Arg, Directive};
use crate::finding::{Finding, Location, Severity};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// A resolver `valid=` above this many seconds is reported.
const VALID_LIMIT_SECS: f64 = 10.0;
/// An upstream `keepalive_timeout` above this is longer than Node's 5 s default allows.
const UPSTREAM_IDLE_LIMIT_SECS: f64 = 4.0;
/// nginx refuses zones below 8 pages; this much goes to the slab pool itself.
const ZONE_BASE_BYTES: u64 = 32 * 1024;
/// Addresses one resolved name is assumed to return at most.
const ADDRS_PER_NAME: u64 = 8;
/// Slab bytes one resolved peer takes: the peer, its sockaddr, name and server strings.
const BYTES_PER_PEER: u64 = 512;

fn loc_d(d: &Directive) -> Location {
    Location::at(d.file.to_string(), d.pos.line, d.pos.column)
}

fn loc_a(d: &Directive, a: &Arg) -> Location {
    Location::at(d.file.to_string(), a.pos.line, a.pos.column)
}

/// Runs every rule over a loaded configuration.
pub fn check(tree: &[Directive]) -> Vec<Finding> {
    let model = Model::build(tree);
    let mut out = Vec::new();
    for (i, up) in model.upstreams.iter().enumerate() {
        duplicate_host(up, &mut out);
        single_name(&model, i, up, &mut out);
        resolve_setup(&model, up, &mut out);
        zone_size(up, &mut out);
        keepalive_timeout(up, &mut out);
    }
    for r in &model.resolvers {
        resolver_valid(r, &mut out);
    }
    let mut seen = HashSet::new();
    for u in &model.proxy_uses {
        let Some(up) = u.upstream.and_then(|i| model.upstreams.get(i)) else {
            continue;
        };
        next_upstream_off(u, up, &mut seen, &mut out);
        keepalive_incomplete(u, up, &mut seen, &mut out);
        retry_shim(&model, u, &mut seen, &mut out);
    }
    out.sort_by(|a, b| {
        (&a.location.file, a.location.line, a.location.column, a.rule).cmp(&(
            &b.location.file,
            b.location.line,
            b.location.column,
            b.rule,
        ))
    });
    one_per_position(tree, out)
}

/// Collects, for each `(file, line)`, the `include` sites that read it.
fn include_sites(dirs: &[Directive], out: &mut HashMap<(String, u32), BTreeSet<String>>) {
    for d in dirs {
        if let Some(site) = &d.included_at {
            out.entry((d.file.to_string(), d.pos.line))
                .or_default()
                .insert(site.to_string());
        }
        include_sites(d.children(), out);
    }
}

/// A file included several times yields its directives several times: keep one finding per
/// rule and position, and name the includes that read it.
fn one_per_position(tree: &[Directive], findings: Vec<Finding>) -> Vec<Finding> {
    let mut sites = HashMap::new();
    include_sites(tree, &mut sites);
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for mut f in findings {
        let key = (
            f.rule,
            f.location.file.clone(),
            f.location.line,
            f.location.column,
            f.problem.clone(),
        );
        if !seen.insert(key) {
            continue;
        }
        let at = sites.get(&(f.location.file.clone(), f.location.line.unwrap_or(0)));
        if let Some(at) = at {
            if at.len() > 1 {
                let list: Vec<&str> = at.iter().map(String::as_str).collect();
                f.problem = format!(
                    "{} (this file is included {} times: {})",
                    f.problem,
                    at.len(),
                    list.join(", ")
                );
            }
            f = f.with_detail("included_from", at.iter().cloned().collect::<Vec<String>>());
        }
        out.push(f);
    }
    out
}

/// The `*_next_upstream` / `*_connect_timeout` lines for the modules that use an upstream.
fn retry_lines(modules: &[&str]) -> String {
    modules
        .iter()
        .map(|m| format!("{m}_next_upstream error timeout;\n{m}_connect_timeout 1s;"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The config's first `resolver` line, if any.
fn first_resolver<'a>(model: &Model<'a>) -> Option<&'a Directive> {
    model.resolvers.first().copied()
}

/// The DNS servers of a `resolver` line.
fn resolver_addrs(r: &Directive) -> Vec<&str> {
    r.args
        .iter()
        .map(|a| a.value.as_str())
        .filter(|v| !v.contains('='))
        .collect()
}

/// The user's own `resolver` arguments with `valid=5s` (replacing or added), other
/// parameters (`ipv6=off`, `status_zone=`) kept.
fn with_short_valid(r: &Directive) -> String {
    let mut words: Vec<&str> = r
        .args
        .iter()
        .map(|a| {
            if a.value.starts_with("valid=") {
                "valid=5s"
            } else {
                a.value.as_str()
            }
        })
        .collect();
    if !words.contains(&"valid=5s") {
        words.push("valid=5s");
    }
    words.join(" ")
}

/// Docker's embedded DNS server, which compose service names resolve through.
const DOCKER_DNS: &str = "127.0.0.11";

fn duplicate_host(up: &Upstream<'_>, out: &mut Vec<Finding>) {
    let mut groups: BTreeMap<(&str, u16), Vec<usize>> = BTreeMap::new();
    for (i, p) in up.peers.iter().enumerate() {
        if p.resolve && !p.backup {
            groups.entry((p.host.as_str(), p.port)).or_default().push(i);
        }
    }
    for ((host, port), lines) in groups {
        if lines.len() < 2 || lines.iter().all(|&i| up.peers[i].max_fails == Some(0)) {
            continue;
        }
        let second = up.peers[lines[1]].directive;
        out.push(Finding::new(
            "resolve-duplicate-host",
            Severity::Error,
            loc_d(second),
            format!(
                "upstream \"{}\" has {} `resolve` lines for {host}:{port}, which nginx counts as {} peers with the same address, so its single-peer guard is off and max_fails (default 1) is armed.",
                up.name, lines.len(), lines.len()
            ),
            "One connect failure marks every copy failed and nginx answers 502 \"no live upstreams\" for fail_timeout even after the backend is back: 2 s of refused connections cost a 10.4 s outage and 5,210 502s, against 1,047 with one line (docs/incidents.md#single-peer-guard).",
            format!(
                "# keep one line per host, or set max_fails=0 on each line:\nserver {host}:{port} resolve max_fails=0;"
            ),
        )
        .with_detail("upstream", up.name.clone())
        .with_detail("lines", lines.len()));
    }
}

fn single_name(model: &Model<'_>, i: usize, up: &Upstream<'_>, out: &mut Vec<Finding>) {
    let primary: Vec<_> = up.peers.iter().filter(|p| !p.backup).collect();
    let Some(first) = primary.first() else {
        return;
    };
    if !primary.iter().all(|p| p.resolve && p.host == first.host) {
        return;
    }
    let (host, port) = (first.host.as_str(), first.port);
    let r = first_resolver(model);
    let resolver = r.map_or_else(|| "DNS_SERVER_IP valid=5s".to_owned(), with_short_valid);
    let docker = r.is_some_and(|r| resolver_addrs(r).contains(&DOCKER_DNS));
    // A single-label name is a service name of a local DNS (Docker's, a cluster's), not a
    // global name with data centres behind it.
    let service_name = !host.contains('.') || docker;
    let fix = if service_name {
        format!(
            "# {host} is a service name of the container DNS: it answers NXDOMAIN while every\n# container of the service is stopped or being recreated, and nginx has no peer until\n# its next query. Re-query often, and keep one replica up while another is replaced:\nresolver {resolver};\nserver {host}:{port} resolve;   # as now\n# compose: deploy: {{ replicas: 2 }}, and recreate the replicas one at a time"
        )
    } else {
        format!(
            "# keep {host}, and add peers that do not come from it (another data centre's name,\n# or a static address), then let each request retry on them:\nserver {host}:{port} resolve;\nserver OTHER_NAME:{port} resolve;\n# in the location:\n{}",
            retry_lines(&model.modules_of(i))
        )
    };
    out.push(Finding::new(
        "resolve-single-name",
        Severity::Warning,
        loc_d(first.directive),
        format!(
            "upstream \"{}\" takes all its peers from the one name {host}, so one NXDOMAIN answer for it empties the upstream.",
            up.name
        ),
        "nginx deletes every peer on NXDOMAIN and answers 502 \"no live upstreams\" without connecting until the next successful re-query: NXDOMAIN for 6 s with valid=5s gave a 6.0 s outage and 3,005 502s (docs/incidents.md#nxdomain).",
        fix,
    )
    .with_detail("upstream", up.name.clone())
    .with_detail("host", first.host.clone()));
}

fn resolve_setup(model: &Model<'_>, up: &Upstream<'_>, out: &mut Vec<Finding>) {
    let Some(first) = up.peers.iter().find(|p| p.resolve) else {
        return;
    };
    let resolve_arg = first
        .directive
        .args
        .iter()
        .find(|a| a.value == "resolve")
        .unwrap_or(&first.directive.args[0]);
    if up.zone.is_none() {
        out.push(Finding::new(
            "resolver-valid-long",
            Severity::Error,
            loc_a(first.directive, resolve_arg),
            format!("upstream \"{}\" uses `resolve` without a `zone`, which nginx rejects at start.", up.name),
            "nginx keeps re-resolved peers in the upstream's shared memory zone; without one the config does not load.",
            format!("upstream {} {{\n    zone {} 64k;\n    ...\n}}", up.name, up.name),
        ));
    }
    // A fragment without `http {}` may get its resolver from a file that was not given.
    if model.has_http && !up.has_resolver && !model.http_resolver {
        let fix = match first_resolver(model) {
            // A resolver elsewhere (a server block) does not serve upstreams: move it up.
            Some(r) => format!("http {{\n    resolver {};   # the one you set in a server block\n    ...\n}}", with_short_valid(r)),
            None => "http {\n    resolver DNS_SERVER_IP valid=5s;   # yours: 127.0.0.11 under Docker, the cluster DNS\n    ...                                 # Service IP on Kubernetes, 127.0.0.53 with systemd-resolved\n}".to_owned(),
        };
        out.push(Finding::new(
            "resolver-valid-long",
            Severity::Error,
            loc_a(first.directive, resolve_arg),
            format!("upstream \"{}\" uses `resolve` but no `resolver` is set in `http` or in the upstream.", up.name),
            "nginx has no DNS server to re-query, so the config does not load (\"no resolver defined to resolve\").",
            fix,
        ));
    }
}

fn resolver_valid(r: &Directive, out: &mut Vec<Finding>) {
    for a in &r.args {
        let Some(v) = a.value.strip_prefix("valid=") else {
            continue;
        };
        let Some(secs) = parse_time(v) else {
            continue;
        };
        if secs > VALID_LIMIT_SECS {
            out.push(Finding::new(
                "resolver-valid-long",
                Severity::Warning,
                loc_a(r, a),
                format!("`resolver ... valid={v}` makes nginx re-query only every {} s.", secs + 1.0),
                "A long valid= misses some short NXDOMAINs but a hit lasts a whole period: valid=30s turned a 6 s NXDOMAIN into a 31 s outage (5.2x), and failover to another data centre's name went from 3.8 s to 12.2 s on average (docs/incidents.md#nxdomain).",
                format!("resolver {};", with_short_valid(r)),
            )
            .with_detail("valid_seconds", secs));
        }
    }
}

fn zone_size(up: &Upstream<'_>, out: &mut Vec<Finding>) {
    let Some((zone, Some(size))) = up.zone else {
        return;
    };
    let names = up.peers.iter().filter(|p| p.resolve).count() as u64;
    if names == 0 {
        return;
    }
    let need = ZONE_BASE_BYTES + names * ADDRS_PER_NAME * BYTES_PER_PEER;
    if size >= need {
        return;
    }
    let arg = zone.args.get(1).unwrap_or(&zone.args[0]);
    out.push(Finding::new(
        "zone-too-small",
        Severity::Warning,
        loc_a(zone, arg),
        format!(
            "zone of upstream \"{}\" is {} KiB for {names} resolved name(s); about {} KiB are needed if each name returns up to {ADDRS_PER_NAME} addresses.",
            up.name,
            size / 1024,
            need.div_ceil(1024)
        ),
        "When a DNS answer does not fit, nginx logs \"cannot add new server to upstream ..., memory exhausted\" and the new addresses are not used.",
        format!("zone {} {}k;", up.name, need.div_ceil(1024).next_power_of_two()),
    ));
}

fn keepalive_timeout(up: &Upstream<'_>, out: &mut Vec<Finding>) {
    let Some(keepalive) = up.keepalive else {
        return;
    };
    let (secs, at) = match up.keepalive_timeout {
        Some(d) => match d.arg(0).and_then(parse_time) {
            Some(s) => (s, d),
            None => return,
        },
        None => (60.0, keepalive),
    };
    if secs <= UPSTREAM_IDLE_LIMIT_SECS {
        return;
    }
    out.push(Finding::new(
        "upstream-keepalive-timeout-long",
        Severity::Info,
        loc_d(at),
        format!(
            "upstream \"{}\" keeps idle connections for {secs} s{}, longer than a typical backend keep-alive (Node's default is 5 s); the doctor cannot see the backend's setting.",
            up.name,
            if up.keepalive_timeout.is_none() { " (the default)" } else { "" }
        ),
        "When the backend closes an idle connection first, nginx can write the next request into the closing socket: a 502 on a reused connection (\"upstream prematurely closed connection\"). The side that reuses must close first.",
        format!(
            "keepalive_timeout 4s;  # below the backend's keep-alive; measure it with:\n# upkeep doctor keepalive http://{}/",
            up.peers
                .first()
                .map_or_else(|| "BACKEND:PORT".to_owned(), |p| {
                if p.host.contains(':') {
                    format!("[{}]:{}", p.host, p.port)
                } else {
                    format!("{}:{}", p.host, p.port)
                }
            })
        ),
    ));
}

fn next_upstream_off(
    u: &ProxyUse<'_>,
    up: &Upstream<'_>,
    seen: &mut HashSet<(usize, &'static str)>,
    out: &mut Vec<Finding>,
) {
    let Some(d) = u.next_upstream else {
        return;
    };
    if d.arg(0) != Some("off") || up.peers.iter().filter(|p| !p.backup).count() < 2 {
        return;
    }
    if !seen.insert((std::ptr::from_ref(d) as usize, "next-upstream-disabled")) {
        return;
    }
    out.push(Finding::new(
        "next-upstream-disabled",
        Severity::Warning,
        loc_d(d),
        format!("`{} off` applies to requests for upstream \"{}\", which has several peers.", d.name, up.name),
        "A failed connect or a reset is returned to the client instead of being retried on another peer: with retries on, a 5 s backend outage cost 0 client errors in 30,000 requests.",
        retry_lines(&[u.module]),
    ));
}

fn keepalive_incomplete(
    u: &ProxyUse<'_>,
    up: &Upstream<'_>,
    seen: &mut HashSet<(usize, &'static str)>,
    out: &mut Vec<Finding>,
) {
    // Only proxy_pass speaks HTTP/1.x to the upstream; the other modules keep connections
    // their own way (fastcgi_keep_conn, HTTP/2 for grpc).
    if up.keepalive.is_none() || u.module != "proxy" {
        return;
    }
    let http11 = u.http_version.and_then(|d| d.arg(0)) == Some("1.1");
    let cleared = u.set_headers.iter().any(|d| {
        d.arg(0)
            .is_some_and(|h| h.eq_ignore_ascii_case("connection"))
            && d.arg(1).is_some_and(|v| v.is_empty() || v.starts_with('$'))
    });
    if http11 && cleared {
        return;
    }
    if !seen.insert((
        std::ptr::from_ref(u.proxy_pass) as usize,
        "upstream-keepalive-incomplete",
    )) {
        return;
    }
    let missing = match (http11, cleared) {
        (false, false) => "`proxy_http_version 1.1` and a cleared `Connection` header",
        (false, true) => "`proxy_http_version 1.1`",
        _ => "a cleared `Connection` header",
    };
    out.push(Finding::new(
        "upstream-keepalive-incomplete",
        Severity::Warning,
        loc_d(u.proxy_pass),
        format!("upstream \"{}\" has `keepalive` but this proxy_pass lacks {missing}.", up.name),
        "nginx then sends HTTP/1.0 or `Connection: close` and every request opens a new connection: the keepalive pool is never used.",
        "proxy_http_version 1.1;\nproxy_set_header Connection \"\";",
    ));
}

fn retry_shim(
    model: &Model<'_>,
    u: &ProxyUse<'_>,
    seen: &mut HashSet<(usize, &'static str)>,
    out: &mut Vec<Finding>,
) {
    for ep in &u.error_pages {
        let codes_5xx = ep
            .args
            .iter()
            .any(|a| matches!(a.value.as_str(), "502" | "503" | "504"));
        let Some(target) = ep.args.last().map(|a| a.value.as_str()) else {
            continue;
        };
        if !codes_5xx || !target.starts_with('@') {
            continue;
        }
        let retries_same = model.proxy_uses.iter().any(|n| {
            n.named_location.as_deref() == Some(target)
                && n.server == u.server
                && n.upstream == u.upstream
        });
        if !retries_same
            || !seen.insert((std::ptr::from_ref(*ep) as usize, "error-page-retry-shim"))
        {
            continue;
        }
        out.push(Finding::new(
            "error-page-retry-shim",
            Severity::Warning,
            loc_d(ep),
            format!("`error_page ... {target}` retries into the same upstream that just failed."),
            "An empty peer list is a state, not a one-off error: the retry falls into the same state. Measured: 0% fewer 502s with the shim.",
            format!("# drop the shim; let nginx retry another peer within the request:\n{}", retry_lines(&[u.module])),
        ));
    }
}

/// Parses an nginx time (`30s`, `1m30s`, `500ms`, `10`), in seconds.
pub fn parse_time(s: &str) -> Option<f64> {
    if s.is_empty() {
        return None;
    }
    let (mut total, mut num, mut rest) = (0.0, String::new(), s);
    while let Some(c) = rest.chars().next() {
        if c.is_ascii_digit() {
            num.push(c);
            rest = &rest[1..];
            continue;
        }
        let (unit, len) = if rest.starts_with("ms") {
            (0.001, 2)
        } else {
            let u = match c {
                's' => 1.0,
                'm' => 60.0,
                'h' => 3600.0,
                'd' => 86400.0,
                'w' => 604_800.0,
                'M' => 2_592_000.0,
                'y' => 31_536_000.0,
                _ => return None,
            };
            (u, 1)
        };
        total += num.parse::<f64>().ok()? * unit;
        num.clear();
        rest = &rest[len..];
    }
    if !num.is_empty() {
        total += num.parse::<f64>().ok()?;
    }
    Some(total)
}

/// Parses an nginx size (`64k`, `1m`, `4096`), in bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let (digits, mult) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1024),
        b'm' | b'M' => (&s[..s.len() - 1], 1024 * 1024),
        b'g' | b'G' => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_sizes_parse_like_nginx() {
        assert_eq!(parse_time("30s"), Some(30.0));
        assert_eq!(parse_time("1m30s"), Some(90.0));
        assert_eq!(parse_time("500ms"), Some(0.5));
        assert_eq!(parse_time("10"), Some(10.0));
        assert_eq!(parse_time("x"), None);
        assert_eq!(parse_size("64k"), Some(65536));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("k"), None);
    }
}
