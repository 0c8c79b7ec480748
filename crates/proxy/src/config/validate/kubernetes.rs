//! `{ kubernetes = "namespace/service", port = "http" }` endpoints and the `[kubernetes]` table.

use super::super::model::{EndpointSource, KubernetesConfig};
use super::super::surface::{self, PortValue};
use super::Ctx;
use upkeep_kubernetes::{PortSel, ServiceRef};

/// A DNS-1123 label, as Kubernetes requires of namespaces and Service names.
fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Validates a table endpoint with a `kubernetes` key; `None` after recording a problem.
pub(super) fn endpoint(
    cx: &mut Ctx<'_>,
    span: std::ops::Range<usize>,
    t: &surface::EndpointTable,
) -> Option<EndpointSource> {
    let k = t.kubernetes.as_ref()?;
    if t.addr.is_some() {
        cx.err(span, "an endpoint has either addr or kubernetes, not both");
        return None;
    }
    let service = match k.split_once('/') {
        Some((ns, name)) if dns_label(ns) && dns_label(name) => ServiceRef {
            namespace: ns.to_owned(),
            name: name.to_owned(),
        },
        _ => {
            cx.err(
                span,
                format!("kubernetes {k:?}: expected \"namespace/service\" (lowercase DNS labels)"),
            );
            return None;
        }
    };
    let port = match t.port.as_ref() {
        None => PortSel::Only,
        Some(p) => match p {
            PortValue::Name(n) if !n.is_empty() && n.len() <= 63 && dns_label(n) => {
                PortSel::Name(n.clone())
            }
            PortValue::Number(n) if (1..=65535).contains(n) => PortSel::Number(*n as u16),
            PortValue::Name(n) => {
                cx.err(
                    span,
                    format!("port {n:?}: expected a Service port name (lowercase letters, digits, '-') or a number"),
                );
                return None;
            }
            PortValue::Number(n) => {
                cx.err(span, format!("port must be between 1 and 65535, got {n}"));
                return None;
            }
        },
    };
    Some(EndpointSource::Kubernetes { service, port })
}

/// Validates `[kubernetes]`.
pub(super) fn section(cx: &mut Ctx<'_>, k: Option<&surface::Kubernetes>) -> KubernetesConfig {
    let mut m = KubernetesConfig::default();
    let Some(k) = k else { return m };
    if let Some(p) = &k.kubeconfig {
        // Read at start and on reload, not here: a kubeconfig is often mounted or written
        // after the config is checked.
        m.kubeconfig = Some(cx.loc.base_dir().join(p.get_ref()));
    }
    m.request_timeout = cx.positive(&k.request_timeout, m.request_timeout, "request_timeout");
    if let Some(p) = &k.service_account_dir {
        m.service_account_dir = cx.loc.base_dir().join(p.get_ref());
    }
    let default_watch = m.watch_timeout;
    m.watch_timeout = cx.positive(&k.watch_timeout, default_watch, "watch_timeout");
    if let Some(v) = &k.watch_timeout {
        // timeoutSeconds is whole seconds; an hour is past any API server's own limit.
        let d = m.watch_timeout;
        if d.subsec_nanos() != 0 || d > std::time::Duration::from_secs(3600) {
            cx.err(
                v.span(),
                "watch_timeout must be whole seconds between \"1s\" and \"1h\", e.g. \"290s\"",
            );
            m.watch_timeout = default_watch;
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::super::parse;
    use super::*;

    const HEAD: &str =
        "[[listener]]\nlisten = \"127.0.0.1:8080\"\n[[route]]\ngroup = \"app\"\n[groups.app]\n";

    #[test]
    fn kubernetes_endpoints_mix_with_addresses_and_keep_their_tier() {
        let text = format!(
            "{HEAD}endpoints = [{{ kubernetes = \"apps/web\", port = \"http\" }}, \"127.0.0.1:9000\", {{ kubernetes = \"apps/db\", port = 5432, tier = 1 }}, {{ kubernetes = \"apps/one\" }}]\n[kubernetes]\nkubeconfig = \"kc.yaml\"\nrequest_timeout = \"2s\"\n"
        );
        let cfg = parse(Path::new("/etc/upkeep/t.toml"), &text).unwrap();
        let eps = &cfg.groups["app"].endpoints;
        assert_eq!(
            eps[0].source,
            EndpointSource::Kubernetes {
                service: ServiceRef {
                    namespace: "apps".into(),
                    name: "web".into()
                },
                port: PortSel::Name("http".into())
            }
        );
        assert!(matches!(eps[1].source, EndpointSource::Static(_)));
        assert!(matches!(
            &eps[2].source,
            EndpointSource::Kubernetes {
                port: PortSel::Number(5432),
                ..
            }
        ));
        assert_eq!(eps[2].tier, 1);
        assert!(matches!(
            &eps[3].source,
            EndpointSource::Kubernetes {
                port: PortSel::Only,
                ..
            }
        ));
        assert_eq!(
            cfg.kubernetes.kubeconfig.as_deref(),
            Some(Path::new("/etc/upkeep/kc.yaml"))
        );
        assert_eq!(
            cfg.kubernetes.request_timeout,
            std::time::Duration::from_secs(2)
        );
        // `upkeep check --print` writes the same form back.
        let printed = crate::config::to_toml(&cfg).unwrap();
        let again = parse(Path::new("/etc/upkeep/t.toml"), &printed).unwrap();
        assert_eq!(again.groups["app"].endpoints, cfg.groups["app"].endpoints);
    }

    #[test]
    fn watch_timeout_and_service_account_dir_are_read_and_bad_watch_timeouts_located() {
        let text = format!(
            "{HEAD}endpoints = [{{ kubernetes = \"apps/web\" }}]\n[kubernetes]\nwatch_timeout = \"45s\"\nservice_account_dir = \"sa\"\n"
        );
        let cfg = parse(Path::new("/etc/upkeep/t.toml"), &text).unwrap();
        assert_eq!(
            cfg.kubernetes.watch_timeout,
            std::time::Duration::from_secs(45)
        );
        assert_eq!(
            cfg.kubernetes.service_account_dir,
            Path::new("/etc/upkeep/sa")
        );
        let printed = crate::config::to_toml(&cfg).unwrap();
        let again = parse(Path::new("/etc/upkeep/t.toml"), &printed).unwrap();
        assert_eq!(again.kubernetes, cfg.kubernetes);
        for bad in ["0s", "1500ms", "2h", "soon"] {
            let text = format!(
                "{HEAD}endpoints = [{{ kubernetes = \"apps/web\" }}]\n[kubernetes]\nwatch_timeout = \"{bad}\"\n"
            );
            let err = parse(Path::new("t.toml"), &text).unwrap_err();
            let at: Vec<(usize, usize)> = err.problems.iter().map(|p| (p.line, p.column)).collect();
            assert_eq!(at, vec![(8, 17)], "{bad}: {:?}", err.problems);
        }
    }

    #[test]
    fn bad_kubernetes_endpoints_are_refused_with_their_position() {
        let text = format!(
            "{HEAD}endpoints = [\n  {{ kubernetes = \"web\" }},\n  {{ kubernetes = \"apps/web\", port = \"Http!\" }},\n  {{ kubernetes = \"apps/web\", addr = \"1.2.3.4:80\" }},\n  {{ kubernetes = \"apps/web\", port = 0 }},\n  {{ addr = \"1.2.3.4:80\", port = \"http\" }},\n  {{ tier = 1 }},\n]\n"
        );
        let err = parse(Path::new("t.toml"), &text).unwrap_err();
        let at: Vec<(usize, usize)> = err.problems.iter().map(|p| (p.line, p.column)).collect();
        assert_eq!(
            at,
            vec![(7, 3), (8, 3), (9, 3), (10, 3), (11, 3), (12, 3)],
            "{err}"
        );
        let text = err.to_string();
        for needle in [
            "expected \"namespace/service\"",
            "Service port name",
            "either addr or kubernetes",
            "between 1 and 65535",
            "port goes with kubernetes endpoints",
            "needs addr",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }
}
