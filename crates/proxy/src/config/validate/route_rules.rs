//! A route's rules, surface -> model: header names and templates, rewrite pattern, redirect
//! and fixed-response statuses, body limit, timeouts, and exactly one of `group`, `redirect`,
//! `respond`.

use std::collections::BTreeMap;
use std::ops::Range;

use http::header::{self, HeaderName};

use super::super::model::GroupConfig;
use super::super::route_rules::*;
use super::super::surface::{self, S};
use super::{span_of, Ctx};

/// Headers that frame a message or belong to one hop: a rule that wrote or removed them
/// would break the framing or the connection, never do what was meant.
fn is_reserved(name: &HeaderName) -> bool {
    [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::CONTENT_LENGTH,
        header::PROXY_AUTHENTICATE,
    ]
    .contains(name)
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// Validates the rules of route `r`; `groups` are the validated groups (for timeouts).
pub(super) fn route_rules(
    cx: &mut Ctx<'_>,
    r: &S<surface::Route>,
    groups: &BTreeMap<String, GroupConfig>,
) -> RouteRules {
    let span = r.span();
    let r = r.get_ref();
    let mut m = RouteRules::default();

    // Exactly one target: a group to forward to, or the route's own answer.
    let targets: Vec<(&str, Range<usize>)> = [
        ("group", span_of(&r.group)),
        ("redirect", span_of(&r.redirect)),
        ("respond", span_of(&r.respond)),
    ]
    .into_iter()
    .filter_map(|(k, s)| s.map(|s| (k, s)))
    .collect();
    match targets.as_slice() {
        [] if !cx.partial => cx.err(
            span.clone(),
            "a route needs exactly one of group, redirect or respond, e.g. group = \"app\"",
        ),
        [_, second, ..] => cx.err(
            second.1.clone(),
            format!(
                "a route takes exactly one of group, redirect or respond; this one has {}",
                targets
                    .iter()
                    .map(|t| t.0)
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
        ),
        _ => {}
    }
    let answers_itself = r.group.is_none() && (r.redirect.is_some() || r.respond.is_some());

    if let Some(h) = &r.request_headers {
        m.request_headers = header_rules(cx, h.get_ref(), "request_headers");
    }
    if let Some(h) = &r.response_headers {
        m.response_headers = header_rules(cx, h.get_ref(), "response_headers");
    }
    m.strip_prefix = r.strip_prefix.as_ref().is_some_and(|s| *s.get_ref());
    if let Some(rw) = &r.rewrite {
        let rw = rw.get_ref();
        match regex::Regex::new(rw.from.get_ref()) {
            Ok(from) => {
                m.rewrite = Some(Rewrite {
                    from,
                    to: rw.to.get_ref().clone(),
                })
            }
            Err(e) => {
                // The regex crate's message draws the pattern over several lines; its last
                // line says what is wrong, which is what a one-line problem can carry.
                let text = e.to_string();
                let why = text.lines().last().unwrap_or_default();
                let why = why.strip_prefix("error: ").unwrap_or(why);
                cx.err(
                    rw.from.span(),
                    format!(
                        "rewrite from {:?} is not a regular expression: {why}",
                        rw.from.get_ref()
                    ),
                )
            }
        }
        if !rw.to.get_ref().starts_with(['/', '$']) {
            cx.err(
                rw.to.span(),
                format!(
                    "rewrite to {:?} must start with '/' (or a capture such as $1)",
                    rw.to.get_ref()
                ),
            );
        }
    }
    if let Some(rd) = &r.redirect {
        let rd = rd.get_ref();
        let status = match &rd.status {
            None => DEFAULT_REDIRECT_STATUS,
            Some(s) if [301, 302, 303, 307, 308].contains(s.get_ref()) => *s.get_ref() as u16,
            Some(s) => {
                cx.err(
                    s.span(),
                    format!(
                        "redirect status {} is not a redirect: use 301, 302, 303, 307 or 308",
                        s.get_ref()
                    ),
                );
                DEFAULT_REDIRECT_STATUS
            }
        };
        match Template::parse(rd.to.get_ref(), true) {
            Ok(to) => {
                check_literal_value(cx, &to, rd.to.span(), "redirect to");
                m.redirect = Some(Redirect { to, status });
            }
            Err(e) => cx.err(rd.to.span(), format!("redirect to: {e}")),
        }
    }
    if let Some(rs) = &r.respond {
        let rs = rs.get_ref();
        let status = match &rs.status {
            None => 200,
            Some(s) if (200..=599).contains(s.get_ref()) => *s.get_ref() as u16,
            Some(s) => {
                cx.err(
                    s.span(),
                    format!(
                        "respond status must be between 200 and 599, got {}",
                        s.get_ref()
                    ),
                );
                200
            }
        };
        let body = rs
            .body
            .as_ref()
            .map(|b| b.get_ref().clone())
            .unwrap_or_default();
        if matches!(status, 204 | 304) && !body.is_empty() {
            let at = rs.body.as_ref().map_or(span.clone(), |b| b.span());
            cx.err(at, format!("a {status} response has no body"));
        }
        m.respond = Some(Respond { status, body });
    }
    if r.max_body_bytes.is_some() {
        m.max_body_bytes = Some(cx.int(&r.max_body_bytes, 0, 1, i64::MAX, "max_body_bytes"));
    }
    if r.try_timeout.is_some() {
        m.try_timeout = Some(cx.positive(&r.try_timeout, Default::default(), "try_timeout"));
    }
    if r.deadline.is_some() {
        m.deadline = Some(cx.positive(&r.deadline, Default::default(), "deadline"));
    }

    if answers_itself {
        // Keys that only mean something when a request is forwarded.
        let what = if r.redirect.is_some() {
            "redirect"
        } else {
            "respond"
        };
        let mut useless: Vec<(&str, Option<Range<usize>>)> = vec![
            ("request_headers", span_of(&r.request_headers)),
            ("max_body_bytes", span_of(&r.max_body_bytes)),
            ("try_timeout", span_of(&r.try_timeout)),
            ("deadline", span_of(&r.deadline)),
        ];
        if r.respond.is_some() {
            useless.push(("strip_prefix", span_of(&r.strip_prefix)));
            useless.push(("rewrite", span_of(&r.rewrite)));
        }
        for (key, at) in useless {
            if let Some(at) = at {
                cx.err(
                    at,
                    format!("{key} has no effect on a route that answers with {what} (it forwards nothing)"),
                );
            }
        }
    } else if let Some(g) = r.group.as_ref().and_then(|g| groups.get(g.get_ref())) {
        if m.try_timeout.is_some() || m.deadline.is_some() {
            cx.not_after(
                span_of(&r.try_timeout).or(span_of(&r.deadline)),
                ("try_timeout", m.try_timeout.unwrap_or(g.try_timeout)),
                ("deadline", m.deadline.unwrap_or(g.deadline)),
            );
        }
    }
    m
}

fn header_rules(cx: &mut Ctx<'_>, h: &surface::HeaderRules, key: &str) -> HeaderRules {
    let mut m = HeaderRules::default();
    let mut seen: Vec<HeaderName> = Vec::new();
    let mut name = |cx: &mut Ctx<'_>, n: &S<String>, verb: &str| -> Option<HeaderName> {
        let Ok(name) = HeaderName::from_bytes(n.get_ref().as_bytes()) else {
            cx.err(
                n.span(),
                format!("{key}.{verb}: {:?} is not a header name", n.get_ref()),
            );
            return None;
        };
        if is_reserved(&name) {
            cx.err(
                n.span(),
                format!(
                    "{key}.{verb}: {name} frames the message or belongs to one hop; upkeep manages it"
                ),
            );
            return None;
        }
        if verb == "remove" && name == header::HOST {
            cx.err(
                n.span(),
                format!("{key}.remove: host is always sent upstream; set it instead"),
            );
            return None;
        }
        if seen.contains(&name) {
            cx.err(
                n.span(),
                format!("{key}: {name} appears twice (names are case-insensitive); give each header one rule"),
            );
            return None;
        }
        seen.push(name.clone());
        Some(name)
    };
    for n in &h.remove {
        if let Some(n) = name(cx, n, "remove") {
            m.remove.push(n);
        }
    }
    for (verb, pairs) in [("set", &h.set), ("add", &h.add)] {
        for (n, v) in pairs {
            let Some(n) = name(cx, n, verb) else { continue };
            match Template::parse(v.get_ref(), false) {
                Ok(t) => {
                    check_literal_value(cx, &t, v.span(), &format!("{key}.{verb}.{n}"));
                    if verb == "set" {
                        m.set.push((n, t));
                    } else {
                        m.add.push((n, t));
                    }
                }
                Err(e) => cx.err(v.span(), format!("{key}.{verb}.{n}: {e}")),
            }
        }
    }
    m
}

/// The literal parts of a template must be valid in a header field (no CR, LF or NUL);
/// placeholders always expand to such text.
fn check_literal_value(cx: &mut Ctx<'_>, t: &Template, span: Range<usize>, what: &str) {
    let bad = t.parts.iter().any(|p| match p {
        Part::Literal(l) => l.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f),
        Part::Var(_) => false,
    });
    if bad {
        cx.err(
            span,
            format!("{what}: a header value cannot hold control characters such as a line break"),
        );
    }
}
