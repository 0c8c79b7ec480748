//! Timestamps of nginx logs, as seconds since the epoch of their local wall clock.

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn num(b: &[u8]) -> Option<i64> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
}

fn secs(y: i64, mo: i64, d: i64, h: i64, mi: i64, s: i64) -> Option<i64> {
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s)
}

/// Parses the error log prefix `2026/11/30 08:10:38`.
pub fn parse_error_time(b: &[u8]) -> Option<i64> {
    let b = b.get(..19)?;
    if b[4] != b'/' || b[7] != b'/' || b[10] != b' ' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    secs(
        num(&b[0..4])?,
        num(&b[5..7])?,
        num(&b[8..10])?,
        num(&b[11..13])?,
        num(&b[14..16])?,
        num(&b[17..19])?,
    )
}

/// Parses the access log time `30/Nov/2026:08:10:38 +0000` (the offset is ignored).
pub fn parse_access_time(b: &[u8]) -> Option<i64> {
    let b = b.get(..20)?;
    const MONTHS: [&[u8]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let mo = MONTHS.iter().position(|m| *m == &b[3..6])? as i64 + 1;
    if b[2] != b'/' || b[6] != b'/' || b[11] != b':' || b[14] != b':' || b[17] != b':' {
        return None;
    }
    secs(
        num(&b[7..11])?,
        mo,
        num(&b[0..2])?,
        num(&b[12..14])?,
        num(&b[15..17])?,
        num(&b[18..20])?,
    )
}

/// Formats seconds since the epoch back as `2026/11/30 08:10:38`.
pub fn format_time(t: i64) -> String {
    let days = t.div_euclid(86_400);
    let rem = t.rem_euclid(86_400);
    // Inverse of days_from_civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}/{m:02}/{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_and_access_times_agree_and_round_trip() {
        let e = parse_error_time(b"2026/11/30 08:10:38 [error]").unwrap();
        let a = parse_access_time(b"30/Nov/2026:08:10:38 +0000").unwrap();
        assert_eq!(e, a);
        assert_eq!(format_time(e), "2026/11/30 08:10:38");
        assert_eq!(parse_error_time(b"1970/01/01 00:00:01"), Some(1));
        assert_eq!(parse_error_time(b"2026/13/30 08:10:38"), None);
        assert_eq!(parse_error_time(b"short"), None);
    }
}
