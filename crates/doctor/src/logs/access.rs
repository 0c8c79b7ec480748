//! Access logs in the combined format, optionally followed by `$upstream_status`.

use super::time::parse_access_time;

/// One access log entry, as far as the doctor needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessEntry {
    /// Local wall-clock time, seconds since the epoch (the offset is ignored, as error logs have none).
    pub time: i64,
    /// The status sent to the client.
    pub status: u16,
    /// The location key of its request line (see `location_of_request`).
    pub location: Option<String>,
    /// The last field when it looks like `$upstream_status` (`502`, `502, 502`, `-`).
    pub upstream_status: Option<String>,
}

/// Parses `... [30/Nov/2026:08:10:38 +0000] "GET / HTTP/1.1" 502 ... [upstream_status]`.
pub fn parse_access(line: &[u8]) -> Option<AccessEntry> {
    let open = memchr::memchr(b'[', line)?;
    let close = open + memchr::memchr(b']', &line[open..])?;
    let time = parse_access_time(&line[open + 1..close])?;
    let rest = &line[close + 1..];
    let q1 = memchr::memchr(b'"', rest)?;
    let q2 = q1 + 1 + memchr::memchr(b'"', &rest[q1 + 1..])?;
    let location = super::location_of_request(&rest[q1 + 1..q2]);
    let after = rest.get(q2 + 1..)?.trim_ascii_start();
    let digits = after.get(..3)?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let status = (digits[0] - b'0') as u16 * 100
        + (digits[1] - b'0') as u16 * 10
        + (digits[2] - b'0') as u16;
    let upstream_status = last_field(line).filter(|f| {
        f == "-"
            || f.split([',', ':', ' '])
                .filter(|p| !p.is_empty())
                .all(|p| p.len() == 3 && p.bytes().all(|b| b.is_ascii_digit()))
    });
    Some(AccessEntry {
        time,
        status,
        location,
        upstream_status,
    })
}

/// The last field: a quoted string, or the last space-separated word.
fn last_field(line: &[u8]) -> Option<String> {
    let line = line.trim_ascii_end();
    let field = if let Some(body) = line.strip_suffix(b"\"") {
        let start = memchr::memrchr(b'"', body)?;
        &body[start + 1..]
    } else {
        let start = memchr::memrchr(b' ', line).map_or(0, |i| i + 1);
        &line[start..]
    };
    Some(String::from_utf8_lossy(field).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_with_upstream_status() {
        let l = br#"127.0.0.1 - - [30/Nov/2026:08:10:38 +0000] "GET /a HTTP/1.1" 502 157 "-" "vegeta" "502, 502""#;
        let e = parse_access(l).unwrap();
        assert_eq!(e.status, 502);
        assert_eq!(e.upstream_status.as_deref(), Some("502, 502"));
        let plain =
            br#"127.0.0.1 - - [30/Nov/2026:08:10:38 +0000] "GET /a HTTP/1.1" 200 7 "-" "curl/8""#;
        let e = parse_access(plain).unwrap();
        assert_eq!((e.status, e.upstream_status), (200, None));
        assert_eq!(e.location.as_deref(), Some("/a"));
        assert!(parse_access(b"garbage").is_none());
    }
}
