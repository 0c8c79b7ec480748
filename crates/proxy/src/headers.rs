//! Header rewriting: hop-by-hop removal (RFC 9110 §7.6.1) and forwarding headers (rules C1,
//! F1, F2 of `normalize/rules.md`).

use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::config::Forwarded;

/// `Keep-Alive` (RFC 9112 appendix C.2.2; hop-by-hop).
pub const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The hop-by-hop fields upkeep removes (RFC 9110 §7.6.1, with `Keep-Alive` and
/// `Proxy-Connection`). The response head passed on as received leaves out each of them
/// without a map (`h1::head::kind`); a test there checks it knows every name here.
pub(crate) const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

pub(crate) fn is_hop_by_hop(name: &HeaderName) -> bool {
    // Comparing a standard name is comparing an enum tag; no hashing.
    HOP_BY_HOP.iter().any(|h| h == name)
}

/// The names of fields whose value is new on every request, besides `x-request-id`: the
/// trace and span ids of W3C Trace Context, Zipkin (B3), Jaeger and Sentry, and the ids the
/// AWS and Google Cloud load balancers add.
static NEVER_REPEATS: [HeaderName; 8] = [
    HeaderName::from_static("traceparent"),
    HeaderName::from_static("b3"),
    HeaderName::from_static("x-b3-traceid"),
    HeaderName::from_static("x-b3-spanid"),
    HeaderName::from_static("uber-trace-id"),
    HeaderName::from_static("sentry-trace"),
    HeaderName::from_static("x-amzn-trace-id"),
    HeaderName::from_static("x-cloud-trace-context"),
];

/// Whether a field named `name` carries a value that never repeats: the request id upkeep
/// makes or passes on (`x-request-id`) and a trace context's ids ([`NEVER_REPEATS`]). Over
/// HTTP/2 such a value goes as a literal never indexed (RFC 7541 §6.2.3): indexed, each
/// request would put a new entry into both ends' HPACK tables, pushing out the entries that
/// do repeat (the forwarding fields, `server`, `content-type`) and making the encoder compare
/// the value with every earlier id still in its table. A standard name is told apart by its
/// enum tag, a custom one by its length first.
pub(crate) fn never_repeats(name: &HeaderName) -> bool {
    *name == crate::request_id::X_REQUEST_ID_NAME || NEVER_REPEATS.iter().any(|n| n == name)
}

/// Marks the values of `h`'s fields that never repeat ([`never_repeats`]) as sensitive: the
/// h2 crate's HPACK encoder sends a sensitive value as a literal never indexed. HTTP/1 has no
/// such thing, and ignores the mark.
pub(crate) fn mark_never_indexed(h: &mut HeaderMap) {
    for (name, value) in h.iter_mut() {
        if never_repeats(name) {
            value.set_sensitive(true);
        }
    }
}

/// Whether `h` has any hop-by-hop field (RFC 9110 §7.6.1): one look at each name, no
/// hashing, so that stripping them costs nothing when there are none (the common case).
pub fn has_hop_by_hop(h: &HeaderMap) -> bool {
    h.keys().any(is_hop_by_hop)
}

/// Fields upkeep adds to a request on its way upstream (a new `x-request-id`, the forwarding
/// headers) that the request did not carry, kept beside its map instead of inserted into it
/// (a hash of the name and a probe each, and a map decoded from HTTP/2 grows for them).
/// upkeep's own HTTP/1 codec writes them after the map's fields; every other path puts them
/// in the map first, at its end, so both send the same fields in the same order.
///
/// Compact, because it is part of every request in flight (`proxy::Ready`) and written into
/// memory that has gone cold since the previous request: the names are known, so only which
/// fields are there is kept; `x-forwarded-for` from an untrusted client is the connection's
/// address alone, copied in; `x-forwarded-proto` is one of two words. 120 bytes where a list
/// of three names and values was 256, and only one value, the host or `Forwarded`, to drop.
#[derive(Clone, Debug, Default)]
pub struct Added {
    /// `TE: trailers` (the client takes trailers), sent first: where the map's insert put it.
    te: bool,
    /// `Host` with `last`'s value, the `x-forwarded-host` made from the same authority: a
    /// request from HTTP/2 names its host in `:authority` only (rule H4 of
    /// `normalize/rules.md`). Set by [`Added::set_host_as_forwarded`].
    host: bool,
    /// A new `x-request-id`.
    id: Option<crate::request_id::Id>,
    /// `x-forwarded-for`: the client's address alone.
    client: Option<AddrText>,
    /// `x-forwarded-proto`.
    proto: Option<Proto>,
    /// Which field `last` is.
    last_name: Last,
    /// `x-forwarded-host` or `forwarded` (`last_name`), sent last.
    last: Option<HeaderValue>,
}

/// A client's address as text, inline (an IP address is at most 39 characters as
/// `std::net::IpAddr` writes it).
#[derive(Clone, Copy, Debug)]
struct AddrText {
    len: u8,
    text: [u8; 39],
}

impl AddrText {
    /// `value`'s bytes, if they fit.
    fn of(value: &HeaderValue) -> Option<Self> {
        let b = value.as_bytes();
        let mut text = [0; 39];
        text.get_mut(..b.len())?.copy_from_slice(b);
        Some(Self {
            len: b.len() as u8,
            text,
        })
    }

    fn as_bytes(&self) -> &[u8] {
        &self.text[..usize::from(self.len)]
    }
}

/// A value of `x-forwarded-proto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Http,
    Https,
}

static PROTO_HTTP: HeaderValue = HeaderValue::from_static("http");
static PROTO_HTTPS: HeaderValue = HeaderValue::from_static("https");

impl Proto {
    fn value(self) -> &'static HeaderValue {
        match self {
            Self::Http => &PROTO_HTTP,
            Self::Https => &PROTO_HTTPS,
        }
    }
}

/// How [`Added`] keeps a field's value.
enum Kept<'a> {
    /// As a header value, shared when the field goes into a map.
    Value(&'a HeaderValue),
    /// As bytes (a request id, a client's address), made into a value for a map.
    Bytes(&'a [u8]),
}

/// The name of [`Added`]'s last field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Last {
    #[default]
    XForwardedHost,
    Forwarded,
}

static X_FORWARDED_FOR_NAME: HeaderName = X_FORWARDED_FOR;
static X_FORWARDED_PROTO_NAME: HeaderName = X_FORWARDED_PROTO;
static X_FORWARDED_HOST_NAME: HeaderName = X_FORWARDED_HOST;
static FORWARDED_NAME: HeaderName = header::FORWARDED;

impl Last {
    fn name(self) -> &'static HeaderName {
        match self {
            Self::XForwardedHost => &X_FORWARDED_HOST_NAME,
            Self::Forwarded => &FORWARDED_NAME,
        }
    }
}

static TE_TRAILERS: HeaderValue = HeaderValue::from_static("trailers");

impl Added {
    /// Adds `TE: trailers`, before the other fields. The caller knows the map holds no `TE`
    /// (the request carried none): one of each goes out.
    pub(crate) fn set_te(&mut self) {
        self.te = true;
    }

    /// Adds `Host: value` after `TE` when the `x-forwarded-host` added is `value` (the map
    /// holds no `Host`): no value of its own and no insert. False, and nothing added, when it
    /// is not (another forwarding mode, or a trusted proxy's `x-forwarded-host` kept).
    pub(crate) fn set_host_as_forwarded(&mut self, value: &HeaderValue) -> bool {
        self.host = self.last_name == Last::XForwardedHost
            && self
                .last
                .as_ref()
                .is_some_and(|v| v.as_bytes() == value.as_bytes());
        self.host
    }

    /// Adds a new `x-request-id`, before the forwarding fields.
    pub(crate) fn set_id(&mut self, id: crate::request_id::Id) {
        self.id = Some(id);
    }

    /// The fields, in the order they go out: each name with its value as kept.
    fn fields(&self) -> impl Iterator<Item = (&HeaderName, Kept<'_>)> {
        let te = self.te.then_some((&header::TE, Kept::Value(&TE_TRAILERS)));
        let host = self
            .last
            .as_ref()
            .filter(|_| self.host)
            .map(|v| (&header::HOST, Kept::Value(v)));
        let id = self.id.as_ref().map(|id| {
            (
                &crate::request_id::X_REQUEST_ID_NAME,
                Kept::Bytes(id.as_bytes()),
            )
        });
        let client = self
            .client
            .as_ref()
            .map(|a| (&X_FORWARDED_FOR_NAME, Kept::Bytes(a.as_bytes())));
        let proto = self
            .proto
            .map(|p| (&X_FORWARDED_PROTO_NAME, Kept::Value(p.value())));
        let last = self
            .last
            .as_ref()
            .map(|v| (self.last_name.name(), Kept::Value(v)));
        te.into_iter()
            .chain(host)
            .chain(id)
            .chain(client)
            .chain(proto)
            .chain(last)
    }

    /// The fields, in the order they go out: names and values' bytes.
    pub fn iter(&self) -> impl Iterator<Item = (&HeaderName, &[u8])> {
        self.fields().map(|(n, v)| match v {
            Kept::Value(v) => (n, v.as_bytes()),
            Kept::Bytes(b) => (n, b),
        })
    }

    /// The fields as names and values, in the order they go out: a value kept as one is
    /// shared, one kept as bytes made.
    fn values(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        self.fields().filter_map(|(n, v)| {
            let v = match v {
                Kept::Value(v) => v.clone(),
                Kept::Bytes(b) => HeaderValue::from_bytes(b).ok()?,
            };
            Some((n.clone(), v))
        })
    }

    /// Moves the fields into `headers`, replacing any of the same name.
    pub fn move_into(&mut self, headers: &mut HeaderMap) {
        for (n, v) in self.values() {
            headers.insert(n, v);
        }
        *self = Self::default();
    }
}

/// Header maps kept aside per serving thread for the next message (`crate::spare`): every
/// proxied request builds two (its own and its response's), and a new one is two allocations
/// and an index table to fill, freed again one exchange later. At most 32, each with room for
/// at most 64 fields.
const SPARE_MAPS: crate::spare::Bound = crate::spare::Bound {
    count: 32,
    largest: 64,
};

thread_local! {
    static SPARE_MAP_LIST: std::cell::RefCell<Vec<HeaderMap>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty header map with room for `fields` fields: one kept aside by [`recycle_map`] on
/// this thread, or a new one.
pub fn map_with_capacity(fields: usize) -> HeaderMap {
    match crate::spare::take(&SPARE_MAP_LIST) {
        Some(mut m) => {
            if m.capacity() < fields {
                m.reserve(fields);
            }
            m
        }
        None => HeaderMap::with_capacity(fields),
    }
}

/// Keeps `map`'s memory aside for [`map_with_capacity`] on this thread (its fields are
/// dropped); a large map, or one more than the thread keeps, is freed.
pub fn recycle_map(mut map: HeaderMap) {
    let capacity = map.capacity();
    if capacity == 0 || capacity > SPARE_MAPS.largest {
        return;
    }
    map.clear();
    crate::spare::keep(&SPARE_MAP_LIST, map, capacity, &SPARE_MAPS);
}

/// Which of the fields the request path reads a message carries, found in one pass over its
/// fields. Each rewrite step would otherwise look its names up (a hash of the name and a probe
/// each, about 25 per proxied request); a message has few fields, and comparing a standard
/// name is comparing an enum tag, so one look at each field costs less and the steps skip the
/// lookups of fields that are not there. Taken before the rewriting and valid for the fields as
/// received: a step that adds or removes one of these fields keeps that in mind itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Present(u16);

impl Present {
    pub const HOST: Self = Self(1);
    pub const CONNECTION: Self = Self(1 << 1);
    pub const UPGRADE: Self = Self(1 << 2);
    pub const TE: Self = Self(1 << 3);
    pub const TRAILER: Self = Self(1 << 4);
    pub const TRANSFER_ENCODING: Self = Self(1 << 5);
    pub const CONTENT_TYPE: Self = Self(1 << 6);
    /// More than one `Cookie` field (crumbs to join).
    pub const COOKIES: Self = Self(1 << 7);
    pub const EXPECT: Self = Self(1 << 8);
    pub const X_REQUEST_ID: Self = Self(1 << 9);
    pub const KEEP_ALIVE: Self = Self(1 << 10);
    /// Any hop-by-hop field (RFC 9110 §7.6.1), the ones above included.
    pub const HOP_BY_HOP: Self = Self(1 << 11);
    /// `Forwarded` or any `X-Forwarded-*`.
    pub const FORWARDING: Self = Self(1 << 12);
    /// A `Cookie` field (one or more).
    pub(crate) const COOKIE: Self = Self(1 << 13);
    pub const CONTENT_LENGTH: Self = Self(1 << 14);

    /// One pass over `headers`' fields.
    pub fn of(headers: &HeaderMap) -> Self {
        let mut p = Self::default();
        for name in headers.keys() {
            p.0 |= Self::classify(name).0;
        }
        if p.has(Self::COOKIE) && headers.get_all(header::COOKIE).iter().nth(1).is_some() {
            p.0 |= Self::COOKIES.0;
        }
        p
    }

    fn classify(name: &HeaderName) -> Self {
        Self::of_name(name.as_str().as_bytes())
    }

    /// What a field named `name` (any case) is to the request path: one classification for
    /// maps (`HeaderName`s spell names in lower case) and for heads read by upkeep's own
    /// HTTP/1 server, which looks at the names' bytes without making `HeaderName`s. The
    /// length picks at most two candidates: one comparison for most names.
    pub fn of_name(name: &[u8]) -> Self {
        let is = |s: &[u8]| name.eq_ignore_ascii_case(s);
        let hop = Self::HOP_BY_HOP.0;
        let bits = match name.len() {
            2 if is(b"te") => Self::TE.0 | hop,
            4 if is(b"host") => Self::HOST.0,
            6 if is(b"cookie") => Self::COOKIE.0,
            6 if is(b"expect") => Self::EXPECT.0,
            7 if is(b"upgrade") => Self::UPGRADE.0 | hop,
            7 if is(b"trailer") => Self::TRAILER.0 | hop,
            9 if is(b"forwarded") => Self::FORWARDING.0,
            10 if is(b"connection") => Self::CONNECTION.0 | hop,
            10 if is(b"keep-alive") => Self::KEEP_ALIVE.0 | hop,
            12 if is(b"content-type") => Self::CONTENT_TYPE.0,
            12 if is(b"x-request-id") => Self::X_REQUEST_ID.0,
            14 if is(b"content-length") => Self::CONTENT_LENGTH.0,
            16 if is(b"proxy-connection") => hop,
            17 if is(b"transfer-encoding") => Self::TRANSFER_ENCODING.0 | hop,
            18 if is(b"proxy-authenticate") => hop,
            19 if is(b"proxy-authorization") => hop,
            n if n >= 12 && name[..12].eq_ignore_ascii_case(b"x-forwarded-") => Self::FORWARDING.0,
            _ => 0,
        };
        Self(bits)
    }

    /// `self` with the fields of `other` too.
    #[must_use]
    pub fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// `self` without the fields of `other`.
    #[must_use]
    pub fn without(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }

    /// More than one `Cookie` field, for a caller that counted them (see [`Present::of`]).
    pub(crate) fn cookie_crumbs(self, cookies: usize) -> Self {
        if cookies > 1 {
            self.with(Self::COOKIES)
        } else {
            self
        }
    }

    /// Whether the message carries `field` (one of the constants above).
    pub fn has(self, field: Self) -> bool {
        self.0 & field.0 != 0
    }
}

/// Headers that `Connection` may not nominate for removal: a client could otherwise have the
/// routing host or a front proxy's forwarding headers deleted on their way upstream.
fn is_protected(name: &HeaderName) -> bool {
    name == header::HOST || name == header::FORWARDED || name.as_str().starts_with("x-forwarded-")
}

/// Removes hop-by-hop headers, including every header named in `Connection` (except the
/// protected ones: `Host`, `X-Forwarded-*`, `Forwarded`).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip_hop_by_hop_keeping(headers, |_| false);
}

/// Like [`strip_hop_by_hop`], and `Connection` may not nominate the headers `keep` names
/// either (those a route writes, rule C1).
pub fn strip_hop_by_hop_keeping(headers: &mut HeaderMap, keep: impl Fn(&HeaderName) -> bool) {
    // One pass over the names finds what to remove; most messages carry none or only
    // `Connection`, so the per-name removals (each a hash and a probe) are rarely paid.
    let mut remove: Vec<HeaderName> = headers
        .keys()
        .filter(|n| is_hop_by_hop(n))
        .cloned()
        .collect();
    if remove.is_empty() {
        return;
    }
    remove.extend(
        headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            // `keep-alive` is itself hop-by-hop: found by the pass above if present.
            .filter(|n| !n.eq_ignore_ascii_case("keep-alive"))
            .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
            .filter(|n| !is_protected(n) && !keep(n)),
    );
    for n in remove {
        headers.remove(n);
    }
}

thread_local! {
    static LAST_AUTHORITY: std::cell::RefCell<Option<HeaderValue>> = const { std::cell::RefCell::new(None) };
}

/// A target's authority (checked already) as a header value, for the `Host` and
/// `x-forwarded-host` of a request that has no `Host` field: a shared copy of the one made
/// last on this thread when it is the same (an HTTP/2 client names its host in every
/// stream's `:authority`), else a new one, checked and copied.
pub fn authority_value(authority: &str) -> Option<HeaderValue> {
    LAST_AUTHORITY.with(|last| {
        let mut last = last.borrow_mut();
        if let Some(v) = last.as_ref() {
            if v.as_bytes() == authority.as_bytes() {
                return Some(v.clone());
            }
        }
        let v = HeaderValue::from_str(authority).ok()?;
        *last = Some(v.clone());
        Some(v)
    })
}

/// The client's address as a header value, made once per connection.
pub fn client_ip_value(client: SocketAddr) -> HeaderValue {
    HeaderValue::from_str(&client.ip().to_string()).unwrap_or(HeaderValue::from_static("unknown"))
}

/// Writes forwarding headers for a request from `client` (whose address as a header value
/// is `client_ip`, from [`client_ip_value`]) that arrived over `proto`. From a `trusted`
/// client (a proxy in `trusted_proxies`) the chain is appended to; from anyone else every
/// incoming forwarding header is dropped first, so a client cannot forge its origin.
/// `carries_forwarding`: the request came with such a header (`Present::FORWARDING`);
/// `host_field`: its `Host` field, or the value made for it from the target's authority
/// ([`authority_value`]), if any. A field the request does not carry goes to `added`
/// (see [`Added`]); one that replaces a field a trusted proxy sent goes into the map.
#[allow(clippy::too_many_arguments)]
pub fn add_forwarded(
    headers: &mut HeaderMap,
    mode: Forwarded,
    carries_forwarding: bool,
    trusted: bool,
    client: SocketAddr,
    client_ip: &HeaderValue,
    proto: &str,
    host: Option<&str>,
    host_field: Option<&HeaderValue>,
    added: &mut Added,
) {
    if !trusted {
        // Most requests carry none of these (`Present::FORWARDING`): the removals are paid
        // only when one is there.
        if carries_forwarding {
            headers.remove(&X_FORWARDED_FOR);
            headers.remove(&X_FORWARDED_PROTO);
            headers.remove(&X_FORWARDED_HOST);
            headers.remove(header::FORWARDED);
        }
    }
    // A field goes to `added` when the map is known not to hold it (every forwarding field
    // of an untrusted client is gone by then), else into the map.
    match mode {
        Forwarded::None => {}
        Forwarded::XForwarded => {
            // From an untrusted client there is no previous value any more: nothing to look up.
            let prev_field = if trusted {
                headers.get(&X_FORWARDED_FOR)
            } else {
                None
            };
            let had_xff = prev_field.is_some();
            match prev_field.and_then(|v| v.to_str().ok()) {
                Some(prev) if !prev.is_empty() => {
                    let ip = client_ip.to_str().unwrap_or_default();
                    if let Ok(v) = HeaderValue::from_str(&format!("{prev}, {ip}")) {
                        headers.insert(X_FORWARDED_FOR, v);
                    }
                }
                _ => match AddrText::of(client_ip).filter(|_| !had_xff) {
                    Some(a) => added.client = Some(a),
                    None => {
                        headers.insert(X_FORWARDED_FOR, client_ip.clone());
                    }
                },
            }
            // A trusted proxy's `-Proto` and `-Host` describe the original request: kept.
            if trusted && headers.contains_key(&X_FORWARDED_PROTO) {
                if !headers.contains_key(&X_FORWARDED_HOST) {
                    if let Some(h) = host.and_then(|h| HeaderValue::from_str(h).ok()) {
                        added.last_name = Last::XForwardedHost;
                        added.last = Some(h);
                    }
                }
                return;
            }
            added.proto = Some(if proto == "https" {
                Proto::Https
            } else {
                Proto::Http
            });
            // The request's own Host value when that is the host (a shared copy, no parsing).
            let same_host = host_field
                .filter(|v| host.is_some_and(|h| v.as_bytes() == h.as_bytes()))
                .cloned();
            if let Some(h) = same_host.or_else(|| host.and_then(|h| HeaderValue::from_str(h).ok()))
            {
                // A trusted proxy may have sent `-Host` without `-Proto`: replaced.
                if !trusted || !headers.contains_key(&X_FORWARDED_HOST) {
                    added.last_name = Last::XForwardedHost;
                    added.last = Some(h);
                } else {
                    headers.insert(X_FORWARDED_HOST, h);
                }
            }
        }
        Forwarded::Forwarded => {
            let node = match client {
                SocketAddr::V4(a) => a.ip().to_string(),
                SocketAddr::V6(a) => format!("\"[{}]\"", a.ip()),
            };
            let mut elem = format!("for={node};proto={proto}");
            if let Some(h) = host {
                elem.push_str(&format!(";host=\"{}\"", h.replace('"', "")));
            }
            let prev = if trusted {
                headers.get(header::FORWARDED)
            } else {
                None
            };
            let had = prev.is_some();
            let value = match prev.and_then(|v| v.to_str().ok()) {
                Some(prev) if !prev.is_empty() => format!("{prev}, {elem}"),
                _ => elem,
            };
            if let Ok(v) = HeaderValue::from_str(&value) {
                if had {
                    headers.insert(header::FORWARDED, v);
                } else {
                    added.last_name = Last::Forwarded;
                    added.last = Some(v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_standard_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, X-Secret".parse().unwrap());
        h.append(header::CONNECTION, "x-other".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("x-other", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert(header::TE, "trailers".parse().unwrap());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        h.insert("proxy-authorization", "x".parse().unwrap());
        h.insert("x-kept", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn connection_cannot_nominate_host_or_forwarding_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            "Host, X-Forwarded-For, x-forwarded-proto, Forwarded, X-Real"
                .parse()
                .unwrap(),
        );
        h.insert(header::HOST, "a.test".parse().unwrap());
        h.insert("x-forwarded-for", "10.0.0.1".parse().unwrap());
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        h.insert("forwarded", "for=10.0.0.1".parse().unwrap());
        h.insert("x-real", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        for kept in ["host", "x-forwarded-for", "x-forwarded-proto", "forwarded"] {
            assert!(h.contains_key(kept), "{kept} was removed");
        }
        assert!(!h.contains_key("x-real"));
        assert!(!h.contains_key("connection"));
    }

    #[test]
    fn present_agrees_with_lookups_field_by_field() {
        let fields: [(&str, Present); 16] = [
            ("host", Present::HOST),
            ("connection", Present::CONNECTION),
            ("upgrade", Present::UPGRADE),
            ("te", Present::TE),
            ("trailer", Present::TRAILER),
            ("transfer-encoding", Present::TRANSFER_ENCODING),
            ("content-type", Present::CONTENT_TYPE),
            ("expect", Present::EXPECT),
            ("x-request-id", Present::X_REQUEST_ID),
            ("keep-alive", Present::KEEP_ALIVE),
            ("proxy-connection", Present::HOP_BY_HOP),
            ("proxy-authorization", Present::HOP_BY_HOP),
            ("proxy-authenticate", Present::HOP_BY_HOP),
            ("forwarded", Present::FORWARDING),
            ("x-forwarded-for", Present::FORWARDING),
            ("x-forwarded-anything", Present::FORWARDING),
        ];
        let hop = [
            "connection",
            "upgrade",
            "te",
            "trailer",
            "transfer-encoding",
            "keep-alive",
        ];
        assert_eq!(Present::of(&HeaderMap::new()), Present::default());
        for (name, bit) in fields {
            let mut h = HeaderMap::new();
            h.insert("x-other", "1".parse().unwrap());
            h.insert("accept", "*/*".parse().unwrap());
            h.insert(HeaderName::from_static(name), "v".parse().unwrap());
            let p = Present::of(&h);
            assert!(p.has(bit), "{name}");
            assert_eq!(
                p.has(Present::HOP_BY_HOP),
                hop.contains(&name) || bit == Present::HOP_BY_HOP,
                "{name}"
            );
            // Every other field reads as absent.
            for (other, other_bit) in fields {
                if other_bit != bit && other_bit != Present::HOP_BY_HOP {
                    assert!(!p.has(other_bit), "{name} read as {other}");
                }
            }
        }
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, "a=1".parse().unwrap());
        assert!(!Present::of(&h).has(Present::COOKIES), "one cookie field");
        h.append(header::COOKIE, "b=2".parse().unwrap());
        assert!(Present::of(&h).has(Present::COOKIES), "two cookie fields");
    }

    #[test]
    fn te_host_and_a_made_id_go_first_and_the_map_gets_the_same_fields() {
        let id = crate::request_id::Id::new();
        let mut added = Added {
            client: AddrText::of(&HeaderValue::from_static("10.0.0.1")),
            proto: Some(Proto::Https),
            last: Some(HeaderValue::from_static("a.test")),
            ..Added::default()
        };
        added.set_id(id);
        added.set_te();
        assert!(!added.set_host_as_forwarded(&HeaderValue::from_static("b.test")));
        assert!(added.set_host_as_forwarded(&HeaderValue::from_static("a.test")));
        let written: Vec<(String, Vec<u8>)> = added
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.to_vec()))
            .collect();
        assert_eq!(
            written,
            [
                ("te".to_owned(), b"trailers".to_vec()),
                ("host".to_owned(), b"a.test".to_vec()),
                ("x-request-id".to_owned(), id.as_bytes().to_vec()),
                ("x-forwarded-for".to_owned(), b"10.0.0.1".to_vec()),
                ("x-forwarded-proto".to_owned(), b"https".to_vec()),
                ("x-forwarded-host".to_owned(), b"a.test".to_vec()),
            ]
        );
        assert_eq!(id.as_bytes().len(), 32);
        assert!(id
            .as_bytes()
            .iter()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let mut moved = HeaderMap::new();
        added.move_into(&mut moved);
        let mapped: Vec<(String, Vec<u8>)> = moved
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        assert_eq!(
            mapped, written,
            "the map's path sends them in the same order"
        );
        assert_eq!(added.iter().count(), 0, "moved out");
        // Part of every request in flight, written into memory gone cold (the type's doc).
        assert!(std::mem::size_of::<Added>() <= 120);
    }

    #[test]
    fn an_authority_value_is_the_last_ones_when_the_same() {
        let a = authority_value("h.test:8080").unwrap();
        let b = authority_value("h.test:8080").unwrap();
        assert_eq!(
            a.as_bytes().as_ptr(),
            b.as_bytes().as_ptr(),
            "a shared copy"
        );
        assert_eq!(authority_value("i.test").unwrap(), "i.test");
        assert_eq!(authority_value("h.test:8080").unwrap(), "h.test:8080");
        assert!(authority_value("bad\nvalue").is_none());
    }

    #[test]
    fn the_longest_address_is_added_inline_and_a_longer_value_goes_to_the_map() {
        // The longest text `Ipv6Addr` writes: eight groups of four digits.
        let client: SocketAddr = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe]:9"
            .parse()
            .unwrap();
        let ip = client_ip_value(client);
        assert_eq!(ip.len(), 39);
        // An untrusted client's request without a host: what the map and `Added` get.
        let untrusted = |client_ip: &HeaderValue, proto: &str| {
            let (mut h, mut added) = (HeaderMap::new(), Added::default());
            add_forwarded(
                &mut h,
                Forwarded::XForwarded,
                false,
                false,
                client,
                client_ip,
                proto,
                None,
                None,
                &mut added,
            );
            (h, added)
        };
        let (h, added) = untrusted(&ip, "https");
        assert!(h.is_empty(), "{h:?}");
        let written: Vec<_> = added.iter().map(|(n, v)| (n.as_str(), v)).collect();
        assert_eq!(
            written,
            [
                ("x-forwarded-for", ip.as_bytes()),
                ("x-forwarded-proto", &b"https"[..]),
            ]
        );
        // A value no address makes (`client_ip_value` writes an address or `unknown`) still
        // goes out, through the map.
        let long = HeaderValue::from_str(&"1".repeat(40)).unwrap();
        let (h, added) = untrusted(&long, "http");
        assert_eq!(h[&X_FORWARDED_FOR], long);
        assert_eq!(added.iter().count(), 1, "proto only");
    }

    #[test]
    fn a_name_reads_the_same_in_any_case_and_near_misses_read_as_plain() {
        let names = [
            "host",
            "connection",
            "upgrade",
            "te",
            "trailer",
            "transfer-encoding",
            "content-type",
            "cookie",
            "expect",
            "x-request-id",
            "content-length",
            "keep-alive",
            "proxy-connection",
            "proxy-authorization",
            "proxy-authenticate",
            "forwarded",
            "x-forwarded-for",
            "x-forwarded-",
        ];
        for name in names {
            let lower = Present::of_name(name.as_bytes());
            assert_ne!(lower, Present::default(), "{name}");
            let upper = Present::of_name(name.to_ascii_uppercase().as_bytes());
            let mixed: String = name
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if i % 2 == 0 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect();
            assert_eq!(upper, lower, "{name}");
            assert_eq!(Present::of_name(mixed.as_bytes()), lower, "{mixed}");
            // One letter changed, or one more at the end: another field.
            let mut near = name.as_bytes().to_vec();
            near[0] = b'z';
            assert_eq!(Present::of_name(&near), Present::default(), "{name}");
            if !name.starts_with("x-forwarded-") {
                let longer = format!("{name}s");
                assert_eq!(Present::of_name(longer.as_bytes()), Present::default());
            }
        }
        // The one list of hop-by-hop fields reads as such.
        for h in &HOP_BY_HOP {
            assert!(Present::of_name(h.as_str().as_bytes()).has(Present::HOP_BY_HOP));
        }
        for plain in [
            "accept",
            "content-location",
            "user-agent",
            "x-forwarde",
            "date",
        ] {
            assert_eq!(Present::of_name(plain.as_bytes()), Present::default());
        }
    }

    #[test]
    fn a_recycled_map_comes_back_empty_with_room() {
        let mut m = map_with_capacity(8);
        m.insert(header::HOST, "a.test".parse().unwrap());
        m.append("x-a", "1".parse().unwrap());
        let cap = m.capacity();
        recycle_map(m);
        let again = map_with_capacity(4);
        assert!(again.is_empty(), "{again:?}");
        assert_eq!(again.capacity(), cap, "the recycled map, not a new one");
        let larger = map_with_capacity(cap + 40);
        assert!(larger.capacity() >= cap + 40);
        // Too large to keep: not handed out again.
        let mut big = HeaderMap::with_capacity(SPARE_MAPS.largest + 1);
        big.insert(header::HOST, "b.test".parse().unwrap());
        recycle_map(big);
        assert!(map_with_capacity(1).capacity() <= SPARE_MAPS.largest);
    }

    /// `add_forwarded` as the request path calls it, for a request to `a.test`.
    fn forward_for(
        h: &mut HeaderMap,
        mode: Forwarded,
        trusted: bool,
        client: SocketAddr,
        proto: &str,
    ) {
        let present = Present::of(h);
        let host_field = h.get(header::HOST).cloned();
        let mut added = Added::default();
        add_forwarded(
            h,
            mode,
            present.has(Present::FORWARDING),
            trusted,
            client,
            &client_ip_value(client),
            proto,
            Some("a.test"),
            host_field.as_ref(),
            &mut added,
        );
        let kept: Vec<_> = h.keys().cloned().collect();
        for (n, _) in added.iter() {
            assert!(!kept.contains(n), "{n} is both in the map and added");
        }
        added.move_into(h);
    }

    #[test]
    fn forwarding_headers_from_an_untrusted_client_are_replaced() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "6.6.6.6".parse().unwrap());
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        h.insert("x-forwarded-host", "evil.test".parse().unwrap());
        h.insert("forwarded", "for=6.6.6.6".parse().unwrap());
        let client = "127.0.0.5:999".parse().unwrap();
        forward_for(&mut h, Forwarded::XForwarded, false, client, "http");
        assert_eq!(h["x-forwarded-for"], "127.0.0.5");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "a.test");
        assert!(!h.contains_key("forwarded"));
    }

    #[test]
    fn appends_forwarding_headers_from_a_trusted_proxy() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "10.0.0.1".parse().unwrap());
        let client = "127.0.0.5:999".parse().unwrap();
        forward_for(&mut h, Forwarded::XForwarded, true, client, "http");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.5");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "a.test");
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        let client = "127.0.0.5:999".parse().unwrap();
        forward_for(&mut h, Forwarded::XForwarded, true, client, "http");
        assert_eq!(
            h["x-forwarded-proto"], "https",
            "a trusted proxy's proto is kept"
        );
        let mut h = HeaderMap::new();
        h.insert("forwarded", "for=10.0.0.1".parse().unwrap());
        let client = "[::1]:9".parse().unwrap();
        forward_for(&mut h, Forwarded::Forwarded, true, client, "https");
        assert_eq!(
            h["forwarded"],
            "for=10.0.0.1, for=\"[::1]\";proto=https;host=\"a.test\""
        );
    }

    #[test]
    fn values_that_never_repeat_are_marked_never_indexed_and_no_others() {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", "4f2a".parse().unwrap());
        h.append("x-request-id", "4f2b".parse().unwrap());
        h.insert("traceparent", "00-ab-cd-01".parse().unwrap());
        h.insert(
            "x-amzn-trace-id",
            "Root=1-67891233-abcdef012345678912345678".parse().unwrap(),
        );
        h.insert("x-b3-spanid", "a2fb4a1d1a96d312".parse().unwrap());
        h.insert("x-request-ids", "1".parse().unwrap());
        h.insert("b3-", "1".parse().unwrap());
        h.insert("tracestate", "a=1".parse().unwrap());
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        h.insert(header::SERVER, "up".parse().unwrap());
        mark_never_indexed(&mut h);
        for (name, value) in &h {
            let expected = matches!(
                name.as_str(),
                "x-request-id" | "traceparent" | "x-amzn-trace-id" | "x-b3-spanid"
            );
            assert_eq!(value.is_sensitive(), expected, "{name}");
        }
        assert_eq!(h.get_all("x-request-id").iter().count(), 2);
        assert!(h
            .get_all("x-request-id")
            .iter()
            .all(HeaderValue::is_sensitive));
    }
}
