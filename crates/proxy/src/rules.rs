//! Route rules on the request path: the forwarded path (`strip_prefix`, `rewrite`), the
//! route's own answer (`redirect`, `respond`), header rules both ways, and the body limit.
//! The rules are validated once in `config/validate/route_rules.rs`; nothing here can fail a
//! request except the body limit.

use std::borrow::Cow;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use crate::body::RespBody;
use crate::config::{HeaderRules, Part, RouteConfig, RouteRules, Template, Var};

/// The request values templates expand to.
pub struct Vars<'a> {
    /// The client's IP address.
    pub client_ip: &'a str,
    /// The host the request named, lower case, without port.
    pub host: &'a str,
    /// `http` or `https`.
    pub scheme: &'a str,
    /// The request id.
    pub request_id: &'a str,
    /// The forwarded path with its query.
    pub path: &'a str,
}

impl Vars<'_> {
    fn expand(&self, t: &Template) -> String {
        let mut out = String::new();
        for p in &t.parts {
            match p {
                Part::Literal(l) => out.push_str(l),
                Part::Var(Var::ClientIp) => out.push_str(self.client_ip),
                Part::Var(Var::Host) => out.push_str(self.host),
                Part::Var(Var::Scheme) => out.push_str(self.scheme),
                Part::Var(Var::RequestId) => out.push_str(self.request_id),
                Part::Var(Var::Path) => out.push_str(self.path),
            }
        }
        out
    }

    fn value(&self, t: &Template) -> Option<HeaderValue> {
        HeaderValue::from_str(&self.expand(t)).ok()
    }
}

/// The path to forward (no query): the route's prefix taken off (`strip_prefix`), then
/// `rewrite`'s first match replaced. `None` when the route changes neither, so the common
/// request builds no new string.
pub fn forwarded_path(route: &RouteConfig, path: &str) -> Option<String> {
    let rules = &route.rules;
    if !rules.strip_prefix && rules.rewrite.is_none() {
        return None;
    }
    let mut p: Cow<'_, str> = Cow::Borrowed(path);
    if rules.strip_prefix {
        let rest = path.strip_prefix(route.path.as_str()).unwrap_or(path);
        p = if rest.starts_with('/') {
            Cow::Borrowed(rest)
        } else {
            // `/api` matched `/api` or `/api?q`; a prefix `/api/` matched `/api/x`.
            Cow::Owned(format!("/{rest}"))
        };
    }
    if let Some(rw) = &rules.rewrite {
        let replaced = rw.from.replace(&p, rw.to.as_str()).into_owned();
        p = if replaced.starts_with('/') {
            Cow::Owned(replaced)
        } else {
            Cow::Owned(format!("/{replaced}"))
        };
    }
    Some(p.into_owned())
}

/// The route's own answer, for a route with `redirect` or `respond`.
pub fn answer(rules: &RouteRules, vars: &Vars<'_>) -> Option<Response<RespBody>> {
    let mut resp = if let Some(rd) = &rules.redirect {
        let mut r = Response::new(RespBody::empty());
        *r.status_mut() = StatusCode::from_u16(rd.status).unwrap_or(StatusCode::PERMANENT_REDIRECT);
        if let Some(v) = vars.value(&rd.to) {
            r.headers_mut().insert(header::LOCATION, v);
        }
        r
    } else if let Some(rs) = &rules.respond {
        let mut r = Response::new(if rs.body.is_empty() {
            RespBody::empty()
        } else {
            RespBody::full(rs.body.clone())
        });
        *r.status_mut() = StatusCode::from_u16(rs.status).unwrap_or(StatusCode::OK);
        if !rs.body.is_empty() {
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
        }
        r
    } else {
        return None;
    };
    apply_headers(&rules.response_headers, resp.headers_mut(), vars);
    Some(resp)
}

/// Applies header rules: remove, then set, then add.
pub fn apply_headers(rules: &HeaderRules, headers: &mut HeaderMap, vars: &Vars<'_>) {
    if rules.is_empty() {
        return;
    }
    for n in &rules.remove {
        headers.remove(n);
    }
    for (n, t) in &rules.set {
        if let Some(v) = vars.value(t) {
            headers.insert(n.clone(), v);
        }
    }
    for (n, t) in &rules.add {
        if let Some(v) = vars.value(t) {
            headers.append(n.clone(), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HostMatch, Rewrite};

    fn route(path: &str, strip: bool, rewrite: Option<(&str, &str)>) -> RouteConfig {
        RouteConfig {
            host: HostMatch::Any,
            path: path.into(),
            group: Some("g".into()),
            allow_encoded_separators: false,
            rules: RouteRules {
                strip_prefix: strip,
                rewrite: rewrite.map(|(f, t)| Rewrite {
                    from: regex::Regex::new(f).unwrap(),
                    to: t.into(),
                }),
                ..Default::default()
            },
        }
    }

    #[test]
    fn strip_prefix_keeps_a_leading_slash() {
        let r = route("/api", true, None);
        assert_eq!(forwarded_path(&r, "/api/users").as_deref(), Some("/users"));
        assert_eq!(forwarded_path(&r, "/api").as_deref(), Some("/"));
        let r = route("/api/", true, None);
        assert_eq!(forwarded_path(&r, "/api/users").as_deref(), Some("/users"));
        assert_eq!(forwarded_path(&route("/api", false, None), "/api/x"), None);
    }

    #[test]
    fn rewrite_replaces_the_first_match_with_captures() {
        let r = route("/", false, Some(("^/old/(.*)$", "/new/$1")));
        assert_eq!(forwarded_path(&r, "/old/a/b").as_deref(), Some("/new/a/b"));
        assert_eq!(forwarded_path(&r, "/other").as_deref(), Some("/other"));
        let r = route("/v1", true, Some(("^/(\\w+)", "/items/$1")));
        assert_eq!(forwarded_path(&r, "/v1/abc").as_deref(), Some("/items/abc"));
    }
}
