//! The model of a route's rules: nginx's common `location` work (headers, prefix strip,
//! rewrite, redirect, fixed response, body limit, timeouts), validated in
//! `validate/route_rules.rs` and applied by `crate::rules`. It serializes back as the
//! surface, so `upkeep check --print` round-trips it.

use std::time::Duration;

use http::header::HeaderName;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

/// What a route does besides choosing a group. Every part is off by default.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RouteRules {
    /// Headers changed on the request before it goes upstream.
    #[serde(skip_serializing_if = "HeaderRules::is_empty")]
    pub request_headers: HeaderRules,
    /// Headers changed on the response (the upstream's, or the route's own answer).
    #[serde(skip_serializing_if = "HeaderRules::is_empty")]
    pub response_headers: HeaderRules,
    /// The route's path prefix is taken off the forwarded path.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub strip_prefix: bool,
    /// The forwarded path is rewritten by a regular expression.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<Rewrite>,
    /// The route answers with a redirect instead of forwarding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Redirect>,
    /// The route answers with a fixed response instead of forwarding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub respond: Option<Respond>,
    /// Largest request body; larger gets 413 `body_too_large`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<u64>,
    /// Per-try timeout for this route, instead of the group's.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "opt_duration"
    )]
    pub try_timeout: Option<Duration>,
    /// Overall deadline for this route, instead of the group's.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "opt_duration"
    )]
    pub deadline: Option<Duration>,
}

impl RouteRules {
    /// The route answers by itself (redirect or fixed response) and has no group.
    pub fn answers_itself(&self) -> bool {
        self.redirect.is_some() || self.respond.is_some()
    }

    /// Whether any rule expands request values (header rules, redirect, respond).
    pub fn uses_request_values(&self) -> bool {
        !self.request_headers.is_empty()
            || !self.response_headers.is_empty()
            || self.answers_itself()
    }
}

fn opt_duration<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&super::print::duration(*d)),
        None => s.serialize_none(),
    }
}

/// `set` (replace), `add` (append) and `remove` for one direction, applied in the order
/// remove, set, add.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeaderRules {
    /// Headers replaced (or created) with a value.
    pub set: Vec<(HeaderName, Template)>,
    /// Headers appended to whatever is there.
    pub add: Vec<(HeaderName, Template)>,
    /// Headers removed.
    pub remove: Vec<HeaderName>,
}

impl HeaderRules {
    /// No rule at all.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }

    /// Whether these rules write `name` (set or add): such a header may not be nominated
    /// for removal by `Connection`.
    pub fn writes(&self, name: &HeaderName) -> bool {
        self.set.iter().chain(&self.add).any(|(n, _)| n == name)
    }
}

impl Serialize for HeaderRules {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Pairs<'a>(&'a [(HeaderName, Template)]);
        impl Serialize for Pairs<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(self.0.len()))?;
                for (n, t) in self.0 {
                    m.serialize_entry(n.as_str(), &t.text)?;
                }
                m.end()
            }
        }
        struct Names<'a>(&'a [HeaderName]);
        impl Serialize for Names<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut q = s.serialize_seq(Some(self.0.len()))?;
                for n in self.0 {
                    q.serialize_element(n.as_str())?;
                }
                q.end()
            }
        }
        let mut m = s.serialize_map(None)?;
        if !self.set.is_empty() {
            m.serialize_entry("set", &Pairs(&self.set))?;
        }
        if !self.add.is_empty() {
            m.serialize_entry("add", &Pairs(&self.add))?;
        }
        if !self.remove.is_empty() {
            m.serialize_entry("remove", &Names(&self.remove))?;
        }
        m.end()
    }
}

/// A value with placeholders (`{client_ip}`, `{host}`, `{scheme}`, `{request_id}`, and
/// `{path}` in redirects), parsed once when the config is read.
#[derive(Clone, Debug)]
pub struct Template {
    /// As written.
    pub text: String,
    /// Literal text and placeholders, in order.
    pub parts: Vec<Part>,
}

impl PartialEq for Template {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

/// A piece of a [`Template`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Text copied as it is.
    Literal(String),
    /// A value of the request.
    Var(Var),
}

/// The request values a template may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Var {
    /// The client's IP address (nginx `$remote_addr`).
    ClientIp,
    /// The host the request named, lower case, without port (nginx `$host`).
    Host,
    /// `http` or `https`, as the request arrived (nginx `$scheme`).
    Scheme,
    /// The request id (nginx `$request_id`).
    RequestId,
    /// The path after `strip_prefix` and `rewrite`, with the query (nginx `$request_uri`).
    Path,
}

impl Var {
    fn of(name: &str) -> Option<Var> {
        Some(match name {
            "client_ip" => Var::ClientIp,
            "host" => Var::Host,
            "scheme" => Var::Scheme,
            "request_id" => Var::RequestId,
            "path" => Var::Path,
            _ => return None,
        })
    }
}

impl Template {
    /// Parses `text`; `{path}` only where `with_path`. `{{` and `}}` are literal braces.
    pub fn parse(text: &str, with_path: bool) -> Result<Template, String> {
        let allowed = if with_path {
            "{client_ip}, {host}, {scheme}, {request_id}, {path}"
        } else {
            "{client_ip}, {host}, {scheme}, {request_id}"
        };
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut rest = text;
        while let Some(i) = rest.find(['{', '}']) {
            lit.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            if rest[i..].starts_with("{{") || rest[i..].starts_with("}}") {
                lit.push_str(&rest[i..i + 1]);
                rest = &after[1..];
                continue;
            }
            if rest[i..].starts_with('}') {
                return Err(format!(
                    "{text:?}: a lone '}}' (write '}}}}' for a literal brace)"
                ));
            }
            let Some(end) = after.find('}') else {
                return Err(format!(
                    "{text:?}: '{{' without '}}' (write '{{{{' for a literal brace)"
                ));
            };
            let name = &after[..end];
            let var = Var::of(name)
                .filter(|v| with_path || *v != Var::Path)
                .ok_or_else(|| {
                    format!("{text:?}: unknown placeholder {{{name}}}; known: {allowed}")
                })?;
            if !lit.is_empty() {
                parts.push(Part::Literal(std::mem::take(&mut lit)));
            }
            parts.push(Part::Var(var));
            rest = &after[end + 1..];
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            parts.push(Part::Literal(lit));
        }
        Ok(Template {
            text: text.to_owned(),
            parts,
        })
    }
}

/// `rewrite = { from = "regex", to = "..." }`: the first match of `from` in the path is
/// replaced by `to`, where `$1` / `${name}` are captures.
#[derive(Clone, Debug, Serialize)]
pub struct Rewrite {
    /// The pattern.
    #[serde(serialize_with = "regex_text")]
    pub from: regex::Regex,
    /// The replacement.
    pub to: String,
}

fn regex_text<S: Serializer>(r: &regex::Regex, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(r.as_str())
}

impl PartialEq for Rewrite {
    fn eq(&self, other: &Self) -> bool {
        self.from.as_str() == other.from.as_str() && self.to == other.to
    }
}

/// `redirect = { to = "https://{host}{path}", status = 308 }`.
#[derive(Clone, Debug, PartialEq)]
pub struct Redirect {
    /// The `Location`, with placeholders.
    pub to: Template,
    /// 301, 302, 303, 307 or 308.
    pub status: u16,
}

impl Serialize for Redirect {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("to", &self.to.text)?;
        m.serialize_entry("status", &self.status)?;
        m.end()
    }
}

/// Redirect status when none is given: permanent, and the method is kept (unlike 301).
pub const DEFAULT_REDIRECT_STATUS: u16 = 308;

/// `respond = { status = 200, body = "..." }`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Respond {
    /// The status.
    pub status: u16,
    /// The body, sent as `text/plain; charset=utf-8` unless `response_headers` sets a type.
    pub body: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_placeholders_and_escaped_braces() {
        let t = Template::parse("for={client_ip};{{id}}={request_id}", false).unwrap();
        assert_eq!(
            t.parts,
            vec![
                Part::Literal("for=".into()),
                Part::Var(Var::ClientIp),
                Part::Literal(";{id}=".into()),
                Part::Var(Var::RequestId),
            ]
        );
        assert!(Template::parse("https://{host}{path}", true).is_ok());
        let e = Template::parse("{path}", false).unwrap_err();
        assert!(e.contains("unknown placeholder {path}"), "{e}");
        assert!(Template::parse("{nope}", true).is_err());
        assert!(Template::parse("{host", true).is_err());
        assert!(Template::parse("a}b", true).is_err());
    }
}
