//! A request's header fields as received, for the requests upkeep's own HTTP/1 server reads
//! and its own HTTP/1 client sends (docs/http1.md, "Request fields passed on as received").
//!
//! No `HeaderMap` is made of such a request's fields: per field that was a name looked up, a
//! value checked again, a hash and an insert, then a lookup of `Host`, and a walk of the map
//! to write the fields upstream, and its memory to clear. The lines go upstream as they
//! came, in one copy, after the request line upkeep writes and before the fields it adds.
//!
//! Only a head the request path would forward unchanged qualifies
//! (`crate::h1::server::request`): HTTP/1.1; no hop-by-hop field but a `Connection` that names
//! only `close` or `keep-alive` (its line is left out, as the map's path removes it); no
//! forwarding field (`Forwarded`, `X-Forwarded-*`: upkeep rewrites them), no repeated `Cookie`
//! (joined on the map's path), at most one valid `X-Request-Id` (kept), no gRPC
//! `Content-Type`; and every line in the form the map's path writes, `name: value` with one
//! space and a CRLF, so that the bytes upstream are the same whichever path a request takes
//! (names are lowercased in place, as `HeaderName` spells them). Every other head is made
//! into a map as before.
//!
//! While a request carries its fields this way, its `http::Request`'s map holds none of them:
//! the request path reads them here (`Host`, the access log's fields) or makes the map
//! first ([`RawFields::fill`]: a route's request header rules or template values, a client
//! other than upkeep's own, such as hyper's for HTTP/2 upstreams).

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};

/// The header fields of a request as received (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct RawFields {
    /// `name: value\r\n` lines, names lowercased, in the order received; no `Connection`.
    lines: Bytes,
    /// The `Host` value (one is there on HTTP/1.1).
    host: Option<HeaderValue>,
    /// The `Content-Length` value, when the request declares one.
    length: Option<u64>,
    /// How many lines.
    count: usize,
}

/// A field of a request's raw lines that `http` refuses as a name or value; the lines are
/// checked as `httparse` reads them, which takes the same bytes `http` does, so this is not
/// expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a header field that `http` refuses")]
pub(crate) struct InvalidField;

impl RawFields {
    /// Fields made of `lines` (in the form described above, checked by the caller).
    pub(crate) fn new(
        lines: Bytes,
        host: Option<HeaderValue>,
        length: Option<u64>,
        count: usize,
    ) -> Self {
        debug_assert!(lines.is_empty() || lines.ends_with(b"\r\n"));
        Self {
            lines,
            host,
            length,
            count,
        }
    }

    /// The lines, for the writer.
    pub(crate) fn lines(&self) -> &[u8] {
        &self.lines
    }

    /// The `Host` value.
    pub(crate) fn host(&self) -> Option<&HeaderValue> {
        self.host.as_ref()
    }

    /// The declared `Content-Length`.
    pub(crate) fn length(&self) -> Option<u64> {
        self.length
    }

    /// Each field's name (lower case) and value, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.lines
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| {
                let line = &l[..l.len() - 1];
                let colon = line.iter().position(|&b| b == b':')?;
                Some((&line[..colon], &line[colon + 2..]))
            })
    }

    /// Appends the fields to `map`, in order: the request's map as its path would have made
    /// it, for the steps that need one. The values share the lines' buffer.
    pub(crate) fn fill(&self, map: &mut HeaderMap) -> Result<(), InvalidField> {
        map.reserve(self.count);
        for (name, value) in self.iter() {
            let name = super::names::header_name(name).map_err(|_| InvalidField)?;
            let value = HeaderValue::from_maybe_shared(self.lines.slice_ref(value))
                .map_err(|_| InvalidField)?;
            map.append(name, value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_read_back_as_fields_and_fill_a_map_in_order() {
        let lines = Bytes::from_static(
            b"host: a.test\r\nx-multi: 1\r\naccept: */*\r\nx-multi: 2\r\nx-empty-ish: :\r\n",
        );
        let f = RawFields::new(lines, None, None, 5);
        let seen: Vec<_> = f.iter().collect();
        assert_eq!(
            seen,
            [
                (&b"host"[..], &b"a.test"[..]),
                (b"x-multi", b"1"),
                (b"accept", b"*/*"),
                (b"x-multi", b"2"),
                (b"x-empty-ish", b":"),
            ]
        );
        let mut map = HeaderMap::new();
        f.fill(&mut map).unwrap();
        assert_eq!(map.len(), 5);
        let multi: Vec<_> = map.get_all("x-multi").iter().collect();
        assert_eq!(multi, ["1", "2"]);
        assert_eq!(map["host"], "a.test");
        assert_eq!(map["x-empty-ish"], ":");
    }
}
