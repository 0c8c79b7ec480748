//! Trailers (RFC 9110 §6.5): `TE` and `Trailer` are hop-by-hop and stripped with the others,
//! then put back when trailers are to pass. A client announces that it takes trailers with
//! `TE: trailers` on HTTP/1.1; HTTP/2 carries them always (gRPC's status travels in them).

use http::header::{self, HeaderMap, HeaderValue};
use http::Version;

/// What the downstream request said about trailers, read before hop-by-hop removal.
#[derive(Debug, Default)]
pub struct Wanted {
    /// The client accepts trailers in the response.
    pub accepts: bool,
    /// The request's own `Trailer` declaration (fields its body's trailers will carry).
    declared: Vec<HeaderValue>,
}

/// Whether `TE` lists `trailers` (`TE: trailers, deflate;q=0.5` does).
fn te_lists_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
}

/// Whether a downstream client takes trailers in the response (`Wanted::accepts`, without
/// reading the request's own `Trailer` declaration).
pub fn accepted(headers: &HeaderMap, version: Version) -> bool {
    version == Version::HTTP_2 || te_lists_trailers(headers)
}

impl Wanted {
    /// Reads a downstream request's head.
    pub fn of(headers: &HeaderMap, version: Version) -> Self {
        Self {
            accepts: accepted(headers, version),
            declared: headers.get_all(header::TRAILER).iter().cloned().collect(),
        }
    }

    /// A request without `TE` or `Trailer` fields: `of` without looking them up.
    pub fn none(version: Version) -> Self {
        Self {
            accepts: version == Version::HTTP_2,
            declared: Vec::new(),
        }
    }

    /// Whether `TE: trailers` goes upstream: the client accepts trailers, or `force` (gRPC to
    /// an HTTP/2 upstream, whose servers refuse a call without it).
    pub fn te(&self, force: bool) -> bool {
        self.accepts || force
    }

    /// After hop-by-hop removal: the request's `Trailer` declaration (an HTTP/1.1 upstream
    /// gets the declared fields only).
    pub fn restore_declared(&self, headers: &mut HeaderMap) {
        for v in &self.declared {
            headers.append(header::TRAILER, v.clone());
        }
    }
}

/// A response's `Trailer` declaration, read before hop-by-hop removal.
pub fn declared(headers: &HeaderMap) -> Vec<HeaderValue> {
    headers.get_all(header::TRAILER).iter().cloned().collect()
}

/// An HTTP/2 peer does not declare its trailers ahead: a gRPC answer is declared with the
/// status trailers every gRPC call ends with, so an HTTP/1.1 client with `TE: trailers` knows
/// them from the head. upkeep's own HTTP/1 server sends every trailer field all the same
/// (custom trailing metadata included); hyper's server, which carries the requests handed to
/// it (`Expect`, upgrades), sends only the declared ones.
pub fn declare_grpc(headers: &HeaderMap, declared: &mut Vec<HeaderValue>) {
    if declared.is_empty() && crate::grpc::is_grpc(headers) {
        declared.push(HeaderValue::from_static(
            "grpc-status, grpc-message, grpc-status-details-bin",
        ));
    }
}

/// Puts a response's `Trailer` declaration back when the client takes trailers (and none
/// when it does not: then no trailer field reaches it either).
pub fn restore_response(headers: &mut HeaderMap, declared: Vec<HeaderValue>, accepts: bool) {
    if accepts {
        for v in declared {
            headers.append(header::TRAILER, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn te_trailers_is_found_among_other_codings() {
        let mut h = HeaderMap::new();
        assert!(!Wanted::of(&h, Version::HTTP_11).accepts);
        assert!(Wanted::of(&h, Version::HTTP_2).accepts);
        h.insert(header::TE, "gzip, Trailers;q=1".parse().unwrap());
        assert!(Wanted::of(&h, Version::HTTP_11).accepts);
        h.insert(header::TE, "gzip".parse().unwrap());
        assert!(!Wanted::of(&h, Version::HTTP_11).accepts);
    }

    #[test]
    fn te_and_trailer_come_back_only_when_trailers_pass() {
        let mut h = HeaderMap::new();
        h.insert(header::TE, "trailers, gzip".parse().unwrap());
        h.insert(header::TRAILER, "x-sum".parse().unwrap());
        let w = Wanted::of(&h, Version::HTTP_11);
        let mut out = HeaderMap::new();
        w.restore_declared(&mut out);
        assert!(w.te(false));
        assert_eq!(out[header::TRAILER], "x-sum");
        let w = Wanted::of(&HeaderMap::new(), Version::HTTP_11);
        let mut out = HeaderMap::new();
        w.restore_declared(&mut out);
        assert!(out.is_empty());
        assert!(!w.te(false));
        assert!(w.te(true));
        assert!(Wanted::none(Version::HTTP_2).te(false));
        let mut resp = HeaderMap::new();
        restore_response(&mut resp, vec![HeaderValue::from_static("x-sum")], false);
        assert!(resp.is_empty());
        restore_response(&mut resp, vec![HeaderValue::from_static("x-sum")], true);
        assert_eq!(resp[header::TRAILER], "x-sum");
    }
}
