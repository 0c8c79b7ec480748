//! Header names as parsed, remembered per serving thread. `HeaderName::from_bytes` matches a
//! name against the standard ones and, for any other (`x-request-id`, `x-backend`, ...),
//! copies it into a new allocation: every message of every exchange paid that for the same
//! few names. A small table per thread, indexed by the name's length and ends, gives back the
//! name made last time for the same bytes (a clone: an enum tag, or a shared reference).

use std::cell::RefCell;

use http::header::{HeaderName, InvalidHeaderName};

/// Slots in the table; a name that collides replaces the one there.
const SLOTS: usize = 64;

/// Longest name kept: longer ones are rare and made anew each time.
const LONGEST: usize = 48;

/// Each slot: the bytes as received, and the name made of them.
type Seen = [Option<(Box<[u8]>, HeaderName)>; SLOTS];

thread_local! {
    static SEEN: RefCell<Seen> = const { RefCell::new([const { None }; SLOTS]) };
}

fn slot(raw: &[u8]) -> usize {
    let (first, last) = (raw[0], raw[raw.len() - 1]);
    // Case is folded out so that `Content-Type` and `content-type` share a slot.
    let h = raw.len() * 31 + usize::from(first | 0x20) * 7 + usize::from(last | 0x20);
    h % SLOTS
}

/// `HeaderName::from_bytes(raw)`, answered from this thread's table when the same bytes were
/// seen before.
pub fn header_name(raw: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    if raw.is_empty() || raw.len() > LONGEST {
        return HeaderName::from_bytes(raw);
    }
    let i = slot(raw);
    SEEN.with(|seen| {
        let mut seen = seen.borrow_mut();
        if let Some((bytes, name)) = &seen[i] {
            if **bytes == *raw {
                return Ok(name.clone());
            }
        }
        let name = HeaderName::from_bytes(raw)?;
        seen[i] = Some((raw.into(), name.clone()));
        Ok(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_name_is_the_name_from_bytes_would_make() {
        let names: &[&[u8]] = &[
            b"content-type",
            b"Content-Type",
            b"CONTENT-LENGTH",
            b"x-request-id",
            b"X-Backend",
            b"x-backend",
            b"a",
            b"Set-Cookie",
            b"x-very-long-name-that-is-longer-than-the-longest-kept-one",
            b"x-a",
            b"x-b",
            b"y-a",
        ];
        // Three rounds: made, remembered, and remembered after collisions replaced slots.
        for _ in 0..3 {
            for raw in names {
                let ours = header_name(raw).unwrap();
                assert_eq!(ours, HeaderName::from_bytes(raw).unwrap());
                assert_eq!(ours.as_str(), String::from_utf8_lossy(raw).to_lowercase());
            }
        }
    }

    #[test]
    fn an_invalid_name_is_refused_every_time() {
        for raw in [&b""[..], b"bad name", b"x:y", b"\x01", b"caf\xc3\xa9"] {
            assert!(header_name(raw).is_err(), "{raw:?}");
            assert!(header_name(raw).is_err(), "{raw:?}");
        }
    }
}
