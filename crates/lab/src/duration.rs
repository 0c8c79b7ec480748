//! Durations written as `"5s"`, `"250ms"`, `"1.5s"`, `"2m"`.

use std::time::Duration;

/// A duration string that could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {text:?}: expected a number with a unit (ms, s, m), e.g. \"250ms\"")]
pub struct DurationError {
    /// The text that was given.
    pub text: String,
}

/// Parses `"250ms"`, `"5s"`, `"1.5s"` or `"2m"`.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        text: text.to_owned(),
    };
    let t = text.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        return Err(err());
    };
    let value: f64 = num.trim().parse().map_err(|_| err())?;
    if !value.is_finite() || value < 0.0 {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(value * scale))
}

/// Formats a duration the way [`parse`] reads it.
pub fn format(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Serde adapter for `"5s"`-style durations.
pub mod serde_str {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    /// Reads a duration string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse(&s).map_err(serde::de::Error::custom)
    }

    /// Reads an optional duration string.
    pub mod option {
        use serde::{Deserialize, Deserializer};
        use std::time::Duration;

        /// Reads an optional duration string.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            match Option::<String>::deserialize(d)? {
                None => Ok(None),
                Some(s) => crate::duration::parse(&s)
                    .map(Some)
                    .map_err(serde::de::Error::custom),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("2m").unwrap(), Duration::from_secs(120));
    }

    #[test]
    fn rejects_missing_unit_and_garbage() {
        assert!(parse("5").is_err());
        assert!(parse("fast").is_err());
        assert!(parse("-1s").is_err());
    }
}
