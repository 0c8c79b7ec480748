//! Request normalisation before routing: the `Host` / `:authority` syntax check and the path
//! that routes match and upstreams receive. The rules, with their RFC sections, are the table
//! in `normalize/rules.md`; every row has a test below.
#![doc = include_str!("normalize/rules.md")]

use std::borrow::Cow;

pub mod message;

/// Why a request's host or path was refused (400, cause `bad_request`, this as the reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// `Host` / `:authority` is not `reg-name / IP-literal / IPv4address [ ":" port ]`.
    #[error("invalid_host")]
    Host,
    /// `Host` and `:authority` name different hosts (RFC 9113 §8.3.1).
    #[error("host_mismatch")]
    HostMismatch,
    /// The path has a malformed percent-encoding.
    #[error("invalid_path")]
    Path,
    /// `%2e`, `%2f` or `%5c` (or a raw `\`) in the path, and the route does not allow them.
    #[error("encoded_separator")]
    EncodedSeparator,
}

impl Invalid {
    /// The reason as written in the `upkeep-error` header and the access log.
    pub fn as_str(self) -> &'static str {
        match self {
            Invalid::Host => "invalid_host",
            Invalid::HostMismatch => "host_mismatch",
            Invalid::Path => "invalid_path",
            Invalid::EncodedSeparator => "encoded_separator",
        }
    }
}

/// Checks an authority as sent in `Host` or `:authority` (RFC 9110 §7.2, RFC 3986 §3.2.2-3):
/// `IP-literal` (IPv6 only) or `IPv4address` or `reg-name`, then an optional `:port` of at
/// most 5 digits and at most 65535. Returns the host part without the port; an empty value
/// (allowed by RFC 9112 §3.2 when the target has no authority) gives `Ok("")`.
pub fn check_authority(value: &str) -> Result<&str, Invalid> {
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        ip_literal(value, rest)?
    } else {
        // A byte scan from the end: `rsplit_once(':')`'s searcher cost more than the check.
        match value.bytes().rposition(|b| b == b':') {
            Some(i) => (&value[..i], Some(&value[i + 1..])),
            None => (value, None),
        }
    };
    if let Some(p) = port {
        // RFC 3986 allows an empty port ("host:"); a value is 1-5 digits that fit in 16 bits.
        if !p.is_empty() && port_number(p.as_bytes()).is_none_or(|n| n > 65535) {
            return Err(Invalid::Host);
        }
        if host.is_empty() {
            return Err(Invalid::Host);
        }
    }
    if !host.starts_with('[') && !is_reg_name(host) {
        return Err(Invalid::Host);
    }
    Ok(host)
}

/// `[v6]` and the optional `:port` after it, from `value` = `[` + `rest`.
fn ip_literal<'v>(value: &'v str, rest: &str) -> Result<(&'v str, Option<&'v str>), Invalid> {
    let end = rest.find(']').ok_or(Invalid::Host)?;
    if rest[..end].parse::<std::net::Ipv6Addr>().is_err() {
        return Err(Invalid::Host);
    }
    let after = &value[end + 2..];
    let port = match after.strip_prefix(':') {
        Some(p) => Some(p),
        None if after.is_empty() => None,
        None => return Err(Invalid::Host),
    };
    Ok((&value[..end + 2], port))
}

/// The value of 1-5 ASCII digits; `None` for anything else.
fn port_number(p: &[u8]) -> Option<u32> {
    if p.len() > 5 {
        return None;
    }
    p.iter().try_fold(0u32, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u32::from(b - b'0'))
    })
}

/// `reg-name = *( unreserved / pct-encoded / sub-delims )`; an IPv4 address is one too.
fn is_reg_name(h: &str) -> bool {
    let b = h.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                if i + 2 >= b.len() {
                    return false;
                }
                if !(b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit()) {
                    return false;
                }
                i += 3;
                continue;
            }
            c if REG_NAME[usize::from(c)] => {}
            _ => return false,
        }
        i += 1;
    }
    true
}

/// The bytes a `reg-name` takes as they are (unreserved and sub-delims), one look per byte.
static REG_NAME: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 256 {
        table[c] = is_unreserved(c as u8) || is_sub_delim(c as u8);
        c += 1;
    }
    table
};

const fn is_unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

const fn is_sub_delim(c: u8) -> bool {
    matches!(
        c,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'='
    )
}

/// Whether a path carries an encoded dot, slash or backslash (or a raw backslash): the
/// shapes that a backend may decode into a separator that routing never saw.
pub fn has_encoded_separator(path: &str) -> bool {
    let b = path.as_bytes();
    b.contains(&b'\\')
        || b.windows(3).any(|w| {
            w[0] == b'%'
                && matches!(
                    (w[1], w[2].to_ascii_lowercase()),
                    (b'2', b'e') | (b'2', b'f') | (b'5', b'c')
                )
        })
}

/// Normalises a path (no query) as RFC 3986 §6.2.2 does: percent-encoded unreserved
/// characters are decoded, other percent-encodings get upper-case hex, and dot segments are
/// removed (§5.2.4). `%2e`, `%2f`, `%5c` and a raw `\` are refused unless `allow_encoded`,
/// in which case they stay encoded and are plain characters of their segment. Paths that do
/// not start with `/` (`*` of `OPTIONS *`) are returned as they are.
pub fn normalize_path(path: &str, allow_encoded: bool) -> Result<Cow<'_, str>, Invalid> {
    if !path.starts_with('/') {
        return Ok(Cow::Borrowed(path));
    }
    if !allow_encoded && has_encoded_separator(path) {
        return Err(Invalid::EncodedSeparator);
    }
    let needs_work = path.contains('%') || has_dot_segment(path);
    if !needs_work {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode_unreserved(path)?;
    Ok(Cow::Owned(remove_dot_segments(&decoded)))
}

fn has_dot_segment(path: &str) -> bool {
    // Most paths have no dot at all: one fast scan says so before splitting.
    memchr::memchr(b'.', path.as_bytes()).is_some()
        && path.split('/').any(|s| s == "." || s == "..")
}

/// Decodes `%XX` of unreserved characters; upper-cases the hex of the others.
fn decode_unreserved(path: &str) -> Result<String, Invalid> {
    let b = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).ok_or(Invalid::Path)?;
            let v = std::str::from_utf8(hex)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or(Invalid::Path)?;
            // `.` stays encoded: a decoded `%2e` must not become a dot segment (it is only
            // here when the route allows encoded separators).
            if is_unreserved(v) && v != b'.' {
                out.push(v as char);
            } else {
                out.push('%');
                out.push(hex[0].to_ascii_uppercase() as char);
                out.push(hex[1].to_ascii_uppercase() as char);
            }
            i += 3;
        } else {
            // The path came through `http::Uri`, so it is ASCII.
            out.push(b[i] as char);
            i += 1;
        }
    }
    Ok(out)
}

/// RFC 3986 §5.2.4 for an absolute path: `.` segments go, `..` removes the segment before it
/// (never above the root).
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            "." => {
                if i == last {
                    out.push("");
                }
            }
            ".." => {
                out.pop();
                if i == last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    let mut s = String::with_capacity(path.len());
    for seg in &out {
        s.push('/');
        s.push_str(seg);
    }
    if s.is_empty() {
        s.push('/');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_authorities_pass_with_their_host() {
        for (v, host) in [
            ("example.com", "example.com"),
            ("example.com:8080", "example.com"),
            ("example.com:", "example.com"),
            ("127.0.0.1:80", "127.0.0.1"),
            ("[::1]", "[::1]"),
            ("[::1]:8443", "[::1]"),
            ("a_b-c~d.test", "a_b-c~d.test"),
            ("xn--bcher-kva.example", "xn--bcher-kva.example"),
            ("%41.test", "%41.test"),
            ("", ""),
        ] {
            assert_eq!(check_authority(v), Ok(host), "{v:?}");
        }
    }

    #[test]
    fn invalid_authorities_are_refused() {
        for v in [
            "[",
            "[]",
            "[::1",
            "[::1]x",
            "[::1]:x",
            "[not-v6]",
            "a b",
            "a/b",
            "a@b",
            "a:b:c",
            "host:123456",
            "host:70000",
            "host:-1",
            ":80",
            "a\"b",
            "%4",
            "%zz.test",
            "a%",
        ] {
            assert_eq!(check_authority(v), Err(Invalid::Host), "{v:?}");
        }
    }

    /// The authority check as it was written first (`rsplit_once`, `parse`, `matches!` per
    /// byte; the IP-literal part is unchanged and shared): the faster one must agree with it
    /// on every value.
    fn check_authority_reference(value: &str) -> Result<&str, Invalid> {
        let (host, port) = if let Some(rest) = value.strip_prefix('[') {
            ip_literal(value, rest)?
        } else {
            match value.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (value, None),
            }
        };
        if let Some(p) = port {
            if !p.is_empty()
                && (p.len() > 5
                    || !p.bytes().all(|b| b.is_ascii_digit())
                    || p.parse::<u32>().is_ok_and(|n| n > 65535))
            {
                return Err(Invalid::Host);
            }
            if host.is_empty() {
                return Err(Invalid::Host);
            }
        }
        let reg_name = |h: &str| {
            let b = h.as_bytes();
            let mut i = 0;
            while i < b.len() {
                match b[i] {
                    b'%' if i + 2 < b.len()
                        && b[i + 1].is_ascii_hexdigit()
                        && b[i + 2].is_ascii_hexdigit() =>
                    {
                        i += 3;
                        continue;
                    }
                    c if c.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&c) => {}
                    _ => return false,
                }
                i += 1;
            }
            true
        };
        if !host.starts_with('[') && !reg_name(host) {
            return Err(Invalid::Host);
        }
        Ok(host)
    }

    #[test]
    fn authority_check_agrees_with_the_reference_on_generated_values() {
        use rand::{Rng, SeedableRng};
        // Every byte value alone, then many short values from an alphabet weighted towards
        // the characters the grammar cares about.
        for b in 0..=255u8 {
            let v = [b];
            if let Ok(v) = std::str::from_utf8(&v) {
                assert_eq!(check_authority(v), check_authority_reference(v), "{v:?}");
            }
        }
        let alphabet: Vec<char> =
            "::::[[]]%%%0123456789655359999aAfFgzZ.-_~!$&'()*+,;= /@\"\u{e9}\t"
                .chars()
                .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_4a17);
        for _ in 0..200_000 {
            let len = rng.random_range(0..12);
            let v: String = (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            assert_eq!(check_authority(&v), check_authority_reference(&v), "{v:?}");
        }
        for v in [
            "[::1]:65535",
            "[::1]:65536",
            "h:65535",
            "h:65536",
            "h:00080",
            "h:000080",
        ] {
            assert_eq!(check_authority(v), check_authority_reference(v), "{v:?}");
        }
    }

    #[test]
    fn dot_segments_are_removed() {
        for (raw, want) in [
            ("/", "/"),
            ("/a/b", "/a/b"),
            ("/public/../admin", "/admin"),
            ("/public/./x", "/public/x"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/..", "/"),
            ("/../../etc/passwd", "/etc/passwd"),
            ("/a//../b", "/a/b"),
            ("/a/.../b", "/a/.../b"),
            ("/a/..b/c", "/a/..b/c"),
        ] {
            assert_eq!(normalize_path(raw, false).unwrap(), want, "{raw:?}");
        }
    }

    #[test]
    fn unreserved_percent_encodings_are_decoded_and_others_upper_cased() {
        assert_eq!(normalize_path("/%61dmin", false).unwrap(), "/admin");
        assert_eq!(normalize_path("/a%7eb", false).unwrap(), "/a~b");
        assert_eq!(normalize_path("/a%20b%3f", false).unwrap(), "/a%20b%3F");
        assert_eq!(normalize_path("/caf%c3%a9", false).unwrap(), "/caf%C3%A9");
    }

    #[test]
    fn encoded_separators_are_refused_unless_allowed() {
        for raw in [
            "/public/%2e%2e/admin",
            "/public/%2E%2E/admin",
            "/public/.%2e/admin",
            "/a%2fb",
            "/a%2Fb",
            "/a%5cb",
            "/a\\b",
        ] {
            assert_eq!(
                normalize_path(raw, false),
                Err(Invalid::EncodedSeparator),
                "{raw:?}"
            );
        }
        // Allowed: they stay encoded, and an encoded dot is no dot segment.
        assert_eq!(
            normalize_path("/public/%2e%2e/admin", true).unwrap(),
            "/public/%2E%2E/admin"
        );
        assert_eq!(normalize_path("/a%2fb/../c", true).unwrap(), "/c");
    }

    #[test]
    fn malformed_percent_encoding_is_refused() {
        for raw in ["/a%", "/a%4", "/a%zz"] {
            assert_eq!(normalize_path(raw, false), Err(Invalid::Path), "{raw:?}");
        }
    }

    #[test]
    fn asterisk_form_is_left_alone() {
        assert_eq!(normalize_path("*", false).unwrap(), "*");
    }
}
