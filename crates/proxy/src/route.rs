//! Routing: host (exact or `*.suffix`) + longest path prefix -> group.

use std::sync::Arc;

use crate::config::{HostMatch, RouteConfig};
use crate::metrics::{Metrics, RouteSeries};

/// Compiled routes.
#[derive(Debug, Clone)]
pub struct RouteTable {
    routes: Vec<RouteConfig>,
    /// `names[i]` names `routes[i]`, made once; a request borrows it.
    names: Vec<RouteName>,
}

/// How a matched route is named in metrics and the access log.
#[derive(Debug, Clone)]
pub struct RouteName {
    /// The route as written: `host/path`, `*.suffix/path`, or `/path` for any host.
    pub route: Arc<str>,
    /// Its group.
    pub group: Arc<str>,
    /// Its `upkeep_route_responses_total` counts (per thread), bound by `counted_in`.
    pub series: RouteSeries,
}

impl RouteName {
    /// The name of `r`.
    pub fn of(r: &RouteConfig) -> Self {
        let route = match &r.host {
            HostMatch::Any => r.path.clone(),
            HostMatch::Exact(h) => format!("{h}{}", r.path),
            HostMatch::Suffix(s) => format!("*{s}{}", r.path),
        };
        Self {
            route: route.into(),
            // A route that answers itself has no group: an empty label.
            group: r.group.as_deref().unwrap_or("").into(),
            series: RouteSeries::default(),
        }
    }
}

impl RouteTable {
    /// Compiles routes; order: exact hosts, then longer suffixes, then any; longest prefix first.
    pub fn new(routes: &[RouteConfig]) -> Self {
        let mut routes = routes.to_vec();
        routes.sort_by_key(|r| {
            let host_rank = match &r.host {
                HostMatch::Exact(_) => 0usize,
                HostMatch::Suffix(s) => 1000 - s.len().min(999),
                HostMatch::Any => 2000,
            };
            (host_rank, std::cmp::Reverse(r.path.len()))
        });
        let names = routes.iter().map(RouteName::of).collect();
        Self { routes, names }
    }

    /// Counts each route's responses in `metrics`, in the series a route of the same name
    /// and group had before (a reload keeps counting where the old table stopped).
    pub fn counted_in(mut self, metrics: &Metrics) -> Self {
        for n in &mut self.names {
            n.series = metrics.route_series(&n.route, &n.group);
        }
        self
    }

    /// The group for a host (any case, port ignored) and path; `None` also for a route that
    /// answers itself.
    pub fn find(&self, host: Option<&str>, path: &str) -> Option<&str> {
        self.find_route(host, path)
            .and_then(|(r, _)| r.group.as_deref())
    }

    /// The route for a host (any case, port ignored) and a normalised path, with its name.
    pub fn find_route(&self, host: Option<&str>, path: &str) -> Option<(&RouteConfig, &RouteName)> {
        // Compared without case rather than lower-cased into a new string per request.
        let host = host.map(strip_port);
        self.routes.iter().zip(&self.names).find(|(r, _)| {
            let host_ok = match (&r.host, host) {
                (HostMatch::Any, _) => true,
                (HostMatch::Exact(e), Some(h)) => e.eq_ignore_ascii_case(h),
                (HostMatch::Suffix(s), Some(h)) => {
                    h.len() > s.len()
                        && h.as_bytes()[h.len() - s.len()..].eq_ignore_ascii_case(s.as_bytes())
                }
                _ => false,
            };
            host_ok && prefix_matches(&r.path, path)
        })
    }
}

/// `host:port` -> `host`, `[v6]:port` -> `[v6]`. Any input gives a slice of itself: hosts
/// are validated before routing, but this must not be the place that panics if one is not.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    // A byte scan from the end: `rsplit_once(':')`'s searcher cost more than the routing.
    match host.bytes().rposition(|b| b == b':') {
        Some(i) if host.as_bytes()[i + 1..].iter().all(u8::is_ascii_digit) => &host[..i],
        _ => host,
    }
}

/// `/api` matches `/api`, `/api/x` and `/api?q`, not `/apix`; a prefix ending in `/` matches below it.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    if !path.starts_with(prefix) {
        return false;
    }
    prefix.ends_with('/')
        || path.len() == prefix.len()
        || matches!(path.as_bytes()[prefix.len()], b'/' | b'?')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_stripped_only_when_it_is_digits_after_the_last_colon() {
        for (host, want) in [
            ("example.com", "example.com"),
            ("example.com:8080", "example.com"),
            ("example.com:", "example.com"),
            ("a:b", "a:b"),
            ("a:1:2", "a:1"),
            ("a:80x", "a:80x"),
            (":80", ""),
            ("[::1]:8443", "[::1]"),
            ("[::1]", "[::1]"),
            ("[::1", "[::1"),
            ("h\u{e9}:80", "h\u{e9}"),
            ("", ""),
        ] {
            assert_eq!(strip_port(host), want, "{host:?}");
        }
    }

    fn r(host: HostMatch, path: &str, group: &str) -> RouteConfig {
        RouteConfig {
            host,
            path: path.into(),
            group: Some(group.into()),
            allow_encoded_separators: false,
            rules: Default::default(),
        }
    }

    #[test]
    fn host_and_longest_prefix_win() {
        let t = RouteTable::new(&[
            r(HostMatch::Any, "/", "default"),
            r(HostMatch::Any, "/api", "api"),
            r(HostMatch::Any, "/api/v2", "v2"),
            r(HostMatch::Suffix(".example.com".into()), "/", "wild"),
            r(HostMatch::Exact("shop.example.com".into()), "/", "shop"),
        ]);
        assert_eq!(t.find(None, "/"), Some("default"));
        assert_eq!(t.find(Some("x.test"), "/api"), Some("api"));
        assert_eq!(t.find(Some("x.test"), "/api/v2/items"), Some("v2"));
        assert_eq!(t.find(Some("x.test"), "/apix"), Some("default"));
        assert_eq!(t.find(Some("a.example.com:8080"), "/api"), Some("wild"));
        assert_eq!(t.find(Some("SHOP.example.com"), "/"), Some("shop"));
        assert_eq!(t.find(Some("B.Example.COM"), "/"), Some("wild"));
        assert_eq!(t.find(Some(".EXAMPLE.com"), "/"), Some("default"));
        assert_eq!(t.find(Some("example.com"), "/api"), Some("api"));
    }

    #[test]
    fn no_match_is_none() {
        let t = RouteTable::new(&[r(HostMatch::Exact("a.test".into()), "/only", "g")]);
        assert_eq!(t.find(Some("b.test"), "/only"), None);
        assert_eq!(t.find(Some("a.test"), "/other"), None);
        assert_eq!(t.find(Some("[::1]:80"), "/only"), None);
    }

    #[test]
    fn a_matched_route_is_named_as_written() {
        let t = RouteTable::new(&[
            r(HostMatch::Any, "/search", "search"),
            r(HostMatch::Exact("api.example.com".into()), "/", "api"),
            r(HostMatch::Suffix(".example.com".into()), "/v1", "wild"),
        ]);
        let name = |host, path| {
            t.find_route(Some(host), path)
                .map(|(_, n)| (n.route.to_string(), n.group.to_string()))
        };
        assert_eq!(
            name("x.test", "/search?q=1"),
            Some(("/search".into(), "search".into()))
        );
        assert_eq!(
            name("API.example.com:443", "/"),
            Some(("api.example.com/".into(), "api".into()))
        );
        assert_eq!(
            name("a.example.com", "/v1/x"),
            Some(("*.example.com/v1".into(), "wild".into()))
        );
        assert_eq!(name("x.test", "/"), None);
    }

    #[test]
    fn any_host_text_routes_without_panicking() {
        let t = RouteTable::new(&[r(HostMatch::Exact("[::1]".into()), "/", "v6")]);
        for h in [
            "[", "[]", "[::1", "]", ":", "[:", "[::1]:80", "\u{e9}:1", "",
        ] {
            let _ = t.find(Some(h), "/");
        }
        assert_eq!(t.find(Some("[::1]:80"), "/"), Some("v6"));
    }
}
