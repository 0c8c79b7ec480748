//! Durations written as "5s", "250ms", "1m", "1h30m".

use std::time::Duration;

/// Parses "250ms", "5s", "2m", "1h", and sums like "1m30s"; a bare "0" is zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("expected a duration like \"5s\" or \"250ms\", found an empty string".into());
    }
    if text.starts_with('-') {
        return Err(format!(
            "{text:?} is not a duration: it cannot be negative; write e.g. \"5s\""
        ));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!(
                "{text:?} is not a duration: expected a number; write e.g. \"5s\" or \"250ms\""
            ));
        }
        let number: f64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{text:?} is not a duration: bad number; write e.g. \"1.5s\""))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let seconds = match unit {
            "ms" => number / 1000.0,
            "s" => number,
            "m" => number * 60.0,
            "h" => number * 3600.0,
            "" => {
                return Err(format!(
                    "{text:?} is not a duration: missing unit (ms, s, m, h); write e.g. \"{text}s\""
                ))
            }
            other => {
                return Err(format!(
                    "{text:?} is not a duration: unknown unit {other:?} (ms, s, m, h)"
                ))
            }
        };
        if !seconds.is_finite() || seconds > 1e9 {
            return Err(format!("{text:?} is not a duration: too large"));
        }
        total += Duration::from_secs_f64(seconds);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn rejects_missing_or_unknown_units() {
        assert!(parse_duration("5").unwrap_err().contains("missing unit"));
        assert!(parse_duration("5d").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-5s").unwrap_err().contains("negative"));
    }
}
