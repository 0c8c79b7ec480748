//! Config templates. Every target gets the same timeouts and retry policy where it can
//! express them (connect 1 s, per try 2 s, up to 3 tries), so rows compare proxies, not tuning.

use std::fmt::Write;
use std::path::Path;

use super::{Prepared, Rig};
use crate::scenario::Scenario;

/// nginx gained `server ... resolve` in open-source upstreams in 1.27.3.
const NGINX_RESOLVE_SINCE: (u32, u32, u32) = (1, 27, 3);

/// Group endpoints as `addr:port` strings (backend IPs, or DNS names as written).
fn endpoints(servers: &[String], rig: &Rig) -> Vec<String> {
    servers
        .iter()
        .map(|s| match rig.backend_ips.get(s) {
            Some(ip) => format!("{ip}:{}", rig.backend_port),
            None => format!("{s}:{}", rig.backend_port),
        })
        .collect()
}

fn quoted_list(items: &[String]) -> String {
    let inner: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
    format!("[{}]", inner.join(", "))
}

/// The skip of a proxy that cannot take its peers from a Kubernetes Service.
pub(super) fn no_endpointslices(proxy: &str, scenario: &Scenario) -> Option<Prepared> {
    scenario.kubernetes.as_ref().map(|_| {
        Prepared::Skip(format!(
            "{proxy} cannot read EndpointSlices (it has no Kubernetes API discovery)"
        ))
    })
}

pub(super) fn upkeep(scenario: &Scenario, rig: &Rig) -> Prepared {
    let mut c = String::new();
    let _ = writeln!(c, "[admin]\nlisten = \"{}\"\n", rig.admin);
    if let Some(dns) = rig.dns {
        let _ = writeln!(c, "[dns]\nservers = [\"{dns}\"]\ntimeout = \"1s\"\n");
    }
    if let Some(kc) = &rig.kubeconfig {
        let _ = writeln!(
            c,
            "[kubernetes]\nkubeconfig = \"{}\"\nrequest_timeout = \"1s\"\n",
            kc.display()
        );
    }
    let _ = writeln!(
        c,
        "[lifecycle]\ndrain_delay = \"5s\"\nshutdown_timeout = \"10s\"\n"
    );
    let _ = writeln!(c, "[[listener]]\nlisten = \"{}\"\n", rig.listen);
    let _ = writeln!(c, "[[route]]\npath = \"/\"\ngroup = \"app\"\n");
    if !scenario.upstream.optional.is_empty() {
        let _ = writeln!(c, "[[route]]\npath = \"/search\"\ngroup = \"search\"\n");
    }
    match &scenario.kubernetes {
        Some(k) => {
            let _ = writeln!(
                c,
                "[groups.app]\nrequired = true\nendpoints = [{{ kubernetes = \"{}\", port = \"http\" }}]\nconnect_timeout = \"1s\"\ntry_timeout = \"2s\"\ndeadline = \"5s\"\n",
                k.service
            );
            let _ = writeln!(
                c,
                "[groups.app.retry]\nattempts = 3\nconnect_retry_window = \"3s\"\n\n[groups.app.discovery]\nerror_backoff = \"200ms\"\nmax_refresh = \"2s\"\n"
            );
        }
        None => group(
            &mut c,
            "app",
            true,
            &endpoints(&scenario.upstream.servers, rig),
        ),
    }
    if !scenario.upstream.optional.is_empty() {
        group(
            &mut c,
            "search",
            false,
            &endpoints(&scenario.upstream.optional, rig),
        );
    }
    let mut pattern = if scenario.kubernetes.is_some() {
        "EndpointSlice endpoints".to_owned()
    } else if scenario.dns_servers().is_empty() {
        "static endpoints".to_owned()
    } else {
        "DNS endpoints".to_owned()
    };
    if !scenario.upstream.optional.is_empty() {
        pattern.push_str(", optional group");
    }
    Prepared::Ready {
        label: "upkeep".into(),
        pattern,
        config: c,
    }
}

fn group(c: &mut String, name: &str, required: bool, endpoints: &[String]) {
    let _ = writeln!(
        c,
        "[groups.{name}]\nrequired = {required}\nendpoints = {}\nconnect_timeout = \"1s\"\ntry_timeout = \"2s\"\ndeadline = \"5s\"\n",
        quoted_list(endpoints)
    );
    let _ = writeln!(
        c,
        "[groups.{name}.retry]\nattempts = 3\nconnect_retry_window = \"3s\"\n"
    );
}

/// `(major, minor, patch)` from `nginx -v`.
fn nginx_version(bin: &Path) -> Option<(u32, u32, u32)> {
    let out = std::process::Command::new(bin).arg("-v").output().ok()?;
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    parse_nginx_version(&text)
}

fn parse_nginx_version(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.split("nginx/").nth(1)?.split_whitespace().next()?;
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

pub(super) fn nginx(bin: &Path, scenario: &Scenario, rig: &Rig, dir: &Path) -> Prepared {
    let Some(version) = nginx_version(bin) else {
        return Prepared::Skip(format!("could not read the version of {}", bin.display()));
    };
    nginx_for_version(version, scenario, rig, dir)
}

/// The nginx config for `version`: real `server ... resolve` lines from 1.27.3 on; before it,
/// names resolved once at start when no fault touches DNS, the per-request resolve pattern
/// for one name, and a skip when several server lines need re-resolving.
fn nginx_for_version(
    version: (u32, u32, u32),
    scenario: &Scenario,
    rig: &Rig,
    dir: &Path,
) -> Prepared {
    if let Some(skip) = no_endpointslices("nginx", scenario) {
        return skip;
    }
    if scenario.probes.is_some() {
        return Prepared::Skip(
            "nginx has no admin endpoints (/livez, /readyz, /startupz) for probes to ask".into(),
        );
    }
    if scenario
        .faults
        .iter()
        .any(|f| f.signal.as_deref() == Some("upgrade"))
    {
        // Measured: nginx logs "the changing binary signal is ignored" and keeps its binary.
        return Prepared::Skip(
            "nginx in the foreground (daemon off, as the lab and containers run it) ignores USR2: its binary upgrade needs a daemonized master".into(),
        );
    }
    let vtext = format!("{}.{}.{}", version.0, version.1, version.2);
    let names = scenario.dns_servers();
    let has_resolve = version >= NGINX_RESOLVE_SINCE;
    let d = dir.display();
    let mut c = String::new();
    // Running as root, workers would otherwise switch to `nobody` and lose the temp dir.
    if nix::unistd::geteuid().is_root() {
        let _ = writeln!(c, "user root;");
    }
    let _ = writeln!(
        c,
        "daemon off;\nmaster_process on;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\nevents {{ worker_connections 4096; }}\nhttp {{"
    );
    let _ = writeln!(
        c,
        "  log_format lab '$msec $status \"$upstream_addr\" \"$upstream_status\" $request_time';\n  access_log {d}/access.log lab;"
    );
    for t in ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"] {
        let _ = writeln!(c, "  {t}_temp_path {d}/{t}_temp;");
    }
    if let Some(dns) = rig.dns {
        let _ = writeln!(
            c,
            "  resolver {dns} valid=5s ipv6=off;\n  resolver_timeout 1s;"
        );
    }
    let common = "      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_connect_timeout 1s;\n      proxy_read_timeout 2s;\n      proxy_next_upstream error timeout;";
    let mut label = format!("nginx {vtext}");
    let mut pattern = if names.is_empty() {
        "static upstream".to_owned()
    } else {
        "upstream resolve".to_owned()
    };
    let pass;
    if names.is_empty() || has_resolve {
        let _ = writeln!(c, "  upstream be {{");
        if !names.is_empty() {
            let _ = writeln!(c, "    zone be 64k;");
        }
        for s in &scenario.upstream.servers {
            let line = match rig.backend_ips.get(s) {
                Some(ip) => format!("{ip}:{}", rig.backend_port),
                None => format!("{s}:{} resolve", rig.backend_port),
            };
            let _ = writeln!(c, "    server {line};");
        }
        let _ = writeln!(c, "    keepalive 32;\n  }}");
        pass = "      proxy_pass http://be;".to_owned();
    } else if let Some(fixed) = fixed_addrs(scenario, &names) {
        // Without `resolve`, nginx resolves a server name once, at start: do just that.
        label = format!("nginx {vtext} (names resolved once at start)");
        pattern = "names resolved once at start".into();
        let _ = writeln!(c, "  upstream be {{");
        for (s, ip) in scenario.upstream.servers.iter().zip(&fixed) {
            let ip = rig.backend_ips.get(s).copied().or(*ip);
            if let Some(ip) = ip {
                let _ = writeln!(c, "    server {ip}:{};", rig.backend_port);
            }
        }
        let _ = writeln!(c, "    keepalive 32;\n  }}");
        pass = "      proxy_pass http://be;".to_owned();
    } else {
        let distinct: std::collections::BTreeSet<&str> = names.iter().copied().collect();
        if distinct.len() > 1 || names.len() != scenario.upstream.servers.len() {
            return Prepared::Skip(format!(
                "needs upstream `resolve` for several server lines (nginx >= 1.27.3); this nginx is {vtext}"
            ));
        }
        // nginx < 1.27.3: the long-standing per-request resolve pattern, labelled as such.
        label = format!("nginx {vtext} (dynamic-resolve pattern)");
        pattern = "per-request resolve (set $up)".into();
        pass = format!(
            "      set $up {};\n      proxy_pass http://$up:{};",
            names[0], rig.backend_port
        );
    }
    let _ = writeln!(
        c,
        "  server {{\n    listen {};\n    location / {{\n{pass}\n{common}\n    }}\n  }}\n}}",
        rig.listen
    );
    Prepared::Ready {
        label,
        pattern,
        config: c,
    }
}

/// When every DNS name among the servers answers one fixed address and no fault touches it,
/// the address of each server line (`None` for backends named directly).
fn fixed_addrs(scenario: &Scenario, names: &[&str]) -> Option<Vec<Option<std::net::Ipv4Addr>>> {
    let touched = |n: &str| scenario.faults.iter().any(|f| f.dns.as_deref() == Some(n));
    let mut out = Vec::new();
    for s in &scenario.upstream.servers {
        if !names.contains(&s.as_str()) {
            out.push(None);
            continue;
        }
        let spec = scenario.dns_names.iter().find(|n| &n.name == s)?;
        if spec.mode != "fixed" || spec.backends.len() != 1 || touched(s) {
            return None;
        }
        let ip = scenario
            .backends
            .iter()
            .find(|b| b.name == spec.backends[0])?
            .ip;
        out.push(Some(ip));
    }
    Some(out)
}

pub(super) fn haproxy(bin: &Path, scenario: &Scenario, rig: &Rig) -> Prepared {
    if let Some(skip) = no_endpointslices("haproxy", scenario) {
        return skip;
    }
    if scenario.probes.is_some() {
        return Prepared::Skip(
            "HAProxy has no admin endpoints (/livez, /readyz, /startupz) for probes to ask".into(),
        );
    }
    let version = std::process::Command::new(bin)
        .arg("-v")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .map(|v| v.split('-').next().unwrap_or(v).to_owned())
        })
        .unwrap_or_else(|| "?".into());
    let mut c = String::new();
    let _ = writeln!(
        c,
        "global\n  log stdout format raw local0 info\n  maxconn 4096\n\ndefaults\n  mode http\n  log global\n  option httplog\n  timeout connect 1s\n  timeout client 30s\n  timeout server 2s\n  retries 3\n  option redispatch 1\n"
    );
    if let Some(dns) = rig.dns {
        // `hold` values stay at HAProxy's defaults, as most deployments leave them.
        let _ = writeln!(
            c,
            "resolvers fake\n  nameserver dns1 {dns}\n  accepted_payload_size 1232\n  timeout resolve 1s\n  timeout retry 1s\n"
        );
    }
    let _ = writeln!(
        c,
        "frontend fe\n  bind {}\n  default_backend be\n\nbackend be\n  balance roundrobin",
        rig.listen
    );
    for (i, s) in scenario.upstream.servers.iter().enumerate() {
        match rig.backend_ips.get(s) {
            Some(ip) => {
                let _ = writeln!(c, "  server s{i} {ip}:{}", rig.backend_port);
            }
            None => {
                let _ = writeln!(
                    c,
                    "  server s{i} {s}:{} resolvers fake init-addr none resolve-prefer ipv4",
                    rig.backend_port
                );
            }
        }
    }
    let pattern = if scenario.dns_servers().is_empty() {
        "static servers"
    } else {
        "resolvers, default hold"
    };
    Prepared::Ready {
        label: format!("haproxy {version}"),
        pattern: pattern.into(),
        config: c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nginx_versions() {
        assert_eq!(
            parse_nginx_version("nginx version: nginx/1.22.1\n"),
            Some((1, 22, 1))
        );
        assert_eq!(
            parse_nginx_version("nginx/1.27.3 (Ubuntu)"),
            Some((1, 27, 3))
        );
        assert_eq!(parse_nginx_version("openresty"), None);
        assert!((1, 22, 1) < NGINX_RESOLVE_SINCE && (1, 28, 0) >= NGINX_RESOLVE_SINCE);
    }

    fn catalog(name: &str) -> Scenario {
        let (file, text) = crate::catalog::CATALOG
            .iter()
            .find(|(f, _)| Path::new(f).file_stem().is_some_and(|stem| stem == name))
            .unwrap_or_else(|| panic!("no catalog scenario {name}"));
        Scenario::parse(text, file).unwrap()
    }

    fn rig(scenario: &Scenario) -> Rig {
        Rig {
            listen: "127.0.0.1:18000".parse().unwrap(),
            admin: "127.0.0.1:18001".parse().unwrap(),
            backend_port: 18080,
            backend_ips: scenario
                .backends
                .iter()
                .map(|b| (b.name.clone(), b.ip))
                .collect(),
            dns: (!scenario.dns_servers().is_empty()).then(|| "127.0.0.1:15353".parse().unwrap()),
            kubeconfig: None,
        }
    }

    fn render(version: (u32, u32, u32), name: &str) -> Prepared {
        let s = catalog(name);
        nginx_for_version(version, &s, &rig(&s), Path::new("/nonexistent"))
    }

    fn config(p: Prepared) -> (String, String) {
        match p {
            Prepared::Ready { label, config, .. } => (label, config),
            other => panic!("expected a config, got {other:?}"),
        }
    }

    #[test]
    fn nginx_with_resolve_gets_real_resolve_server_lines_for_dns_names() {
        let (label, c) = config(render((1, 27, 3), "two-lines-one-host-rst"));
        assert_eq!(label, "nginx 1.27.3");
        assert!(c.contains("resolver 127.0.0.1:15353"), "{c}");
        // `resolve` needs the upstream's state in shared memory.
        assert!(c.contains("zone be 64k;"), "{c}");
        let resolve_lines = c
            .lines()
            .filter(|l| l.trim_end().ends_with(" resolve;"))
            .count();
        assert_eq!(resolve_lines, 2, "{c}");
        assert!(c.contains("proxy_pass http://be;"), "{c}");
        assert!(!c.contains("set $up"), "{c}");
    }

    /// Renders every catalog scenario for an installed proxy and has the proxy's own config
    /// check accept it; a proxy CI installs may be missing only outside CI.
    fn assert_installed_accepts_catalog(
        proxy: &str,
        bin: Option<std::path::PathBuf>,
        render: impl Fn(&Path, &Scenario, &Path) -> Prepared,
        check: impl Fn(&mut std::process::Command, &Path, &Path),
    ) {
        let Some(bin) = bin else {
            assert!(
                std::env::var_os("CI").is_none(),
                "{proxy} is installed by .ci/run"
            );
            eprintln!("skipped: {proxy} is not installed (the CI installs Debian's package)");
            return;
        };
        let mut checked = 0;
        for (file, text) in crate::catalog::CATALOG {
            let s = Scenario::parse(text, file).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let Prepared::Ready { config, .. } = render(&bin, &s, dir.path()) else {
                continue;
            };
            let conf = dir.path().join("proxy.conf");
            std::fs::write(&conf, &config).unwrap();
            let mut cmd = std::process::Command::new(&bin);
            check(&mut cmd, &conf, dir.path());
            let out = cmd.output().unwrap();
            assert!(
                out.status.success(),
                "{proxy} refused the config of {file}:\n{}{}\n{config}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
        assert!(checked >= 10, "only {checked} catalog configs were checked");
    }

    #[test]
    fn the_installed_nginx_accepts_every_catalog_config_it_is_given() {
        assert_installed_accepts_catalog(
            "nginx",
            super::super::Binaries::discover(None, None).nginx,
            |bin, s, dir| {
                let version = nginx_version(bin).expect("nginx -v");
                nginx_for_version(version, s, &rig(s), dir)
            },
            |cmd, conf, dir| {
                cmd.arg("-t").arg("-p").arg(dir).arg("-c").arg(conf);
                cmd.arg("-e").arg(dir.join("error.log"));
            },
        );
    }

    #[test]
    fn the_installed_haproxy_accepts_every_catalog_config_it_is_given() {
        assert_installed_accepts_catalog(
            "haproxy",
            super::super::Binaries::discover(None, None).haproxy,
            |bin, s, _| haproxy(bin, s, &rig(s)),
            |cmd, conf, _| {
                cmd.arg("-c").arg("-f").arg(conf);
            },
        );
    }

    #[test]
    fn older_nginx_gets_the_labelled_substitute_or_a_skip_never_a_fake() {
        // One name whose answers a fault changes: the per-request resolve pattern, labelled.
        let (label, c) = config(render((1, 22, 1), "dns-nxdomain-6s"));
        assert_eq!(label, "nginx 1.22.1 (dynamic-resolve pattern)");
        assert!(c.contains("set $up "), "{c}");
        assert!(!c.contains(" resolve;"), "{c}");
        // Names that never change: resolved once at start, as nginx 1.22 does, labelled.
        let (label, c) = config(render((1, 22, 1), "two-lines-one-host-rst"));
        assert_eq!(label, "nginx 1.22.1 (names resolved once at start)");
        assert!(!c.contains(" resolve;"), "{c}");
        // Backends by address need no DNS at all: plain upstream, plain label.
        let (label, _) = config(render((1, 22, 1), "one-host-rst"));
        assert_eq!(label, "nginx 1.22.1");
        // Admin-endpoint probes are something no nginx has.
        assert!(matches!(
            render((1, 27, 3), "probe-cascade"),
            Prepared::Skip(_)
        ));
    }
}
