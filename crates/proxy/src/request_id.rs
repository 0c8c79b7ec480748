//! Request ids: every request carries one in `x-request-id`, kept from the client when it is
//! well formed, made here otherwise; it is sent upstream and written in the access log, so
//! one request can be followed across hops.

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};

/// The header that carries the id.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// [`X_REQUEST_ID`] in one place, for callers that hand out a reference to it.
pub(crate) static X_REQUEST_ID_NAME: HeaderName = X_REQUEST_ID;

/// Longest id kept from a client; longer ones are replaced (they would bloat every log line).
const MAX_LEN: usize = 128;

/// Makes sure `headers` holds exactly one valid `x-request-id` and returns it.
pub fn ensure(headers: &mut HeaderMap) -> HeaderValue {
    ensure_present(headers);
    headers
        .get(&X_REQUEST_ID)
        .cloned()
        .expect("ensure_present inserted one")
}

/// Makes sure `headers` holds exactly one valid `x-request-id`, without taking a copy of it
/// (the request path needs one only for the access log).
pub fn ensure_present(headers: &mut HeaderMap) {
    let mut values = headers.get_all(&X_REQUEST_ID).iter();
    if let (Some(v), None) = (values.next(), values.next()) {
        if is_valid(v.as_bytes()) {
            return;
        }
    }
    headers.insert(X_REQUEST_ID, generate());
}

/// Printable and safe in any log format: letters, digits and `-_.:+/=@`, at most 128 bytes.
pub(crate) fn is_valid(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_LEN
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:+/=@".contains(b))
}

/// 128 random bits as 32 lower-case hex digits, like nginx's `$request_id`.
pub fn generate() -> HeaderValue {
    Id::new().value()
}

/// The two lower-case hex digits of each byte value.
static HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [HEX[i >> 4], HEX[i & 0xf]];
        i += 1;
    }
    t
};

/// A request id upkeep made, kept as its digits: the request path writes it upstream and in
/// the access log as bytes, and makes a `HeaderValue` of it (a check of each byte and a copy
/// into an allocation) only for a client that takes a map.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Id([u8; 32]);

impl Id {
    /// A new id: 128 random bits as 32 lower-case hex digits.
    pub fn new() -> Self {
        let n: u128 = rand::random();
        let mut buf = [0u8; 32];
        // A byte (two digits) at a time from a table of the 256 pairs: shifting a u128 per
        // digit cost more than the rest, and a digit at a time twice the table's look.
        for (pair, byte) in buf.chunks_exact_mut(2).zip(n.to_be_bytes()) {
            pair.copy_from_slice(&HEX_PAIRS[usize::from(byte)]);
        }
        Self(buf)
    }

    /// The digits.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The id as a header value.
    pub fn value(&self) -> HeaderValue {
        HeaderValue::from_bytes(&self.0).expect("hex digits are a valid header value")
    }
}

impl Default for Id {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_id_is_kept() {
        let mut h = HeaderMap::new();
        h.insert(X_REQUEST_ID, HeaderValue::from_static("abc-123_x.y:z"));
        assert_eq!(ensure(&mut h), "abc-123_x.y:z");
        assert_eq!(h.get_all(&X_REQUEST_ID).iter().count(), 1);
    }

    #[test]
    fn a_missing_invalid_or_repeated_id_is_replaced_by_a_new_one() {
        let long = "a".repeat(129);
        for given in [
            vec![],
            vec!["has space"],
            vec!["quote\""],
            vec![""],
            vec![long.as_str()],
            vec!["one", "two"],
        ] {
            let mut h = HeaderMap::new();
            for g in &given {
                h.append(X_REQUEST_ID, HeaderValue::from_str(g).unwrap());
            }
            let id = ensure(&mut h);
            assert_eq!(id.len(), 32, "{given:?}");
            assert!(id.as_bytes().iter().all(u8::is_ascii_hexdigit));
            let all: Vec<_> = h.get_all(&X_REQUEST_ID).iter().collect();
            assert_eq!(all, vec![&id], "{given:?}");
        }
    }

    #[test]
    fn a_made_id_is_its_random_number_in_hex() {
        // The digits of a made id read back as 128 bits that, over many ids, set every bit
        // position both ways (no digit stuck or dropped).
        let (mut ones, mut zeros) = (0u128, 0u128);
        for _ in 0..64 {
            let id = generate();
            let n = u128::from_str_radix(id.to_str().unwrap(), 16).unwrap();
            assert_eq!(format!("{n:032x}"), id.to_str().unwrap());
            ones |= n;
            zeros |= !n;
        }
        assert_eq!((ones, zeros), (u128::MAX, u128::MAX));
    }

    #[test]
    fn made_ids_differ() {
        let a = ensure(&mut HeaderMap::new());
        let b = ensure(&mut HeaderMap::new());
        assert_ne!(a, b);
    }
}
