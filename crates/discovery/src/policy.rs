//! When to ask again and how long to keep addresses the DNS no longer gives.

use std::time::Duration;

/// Retry backoff after failures never grows past this, whatever `max_refresh` is, so a
/// DNS outage that ends is noticed within half a minute.
pub const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(30);

/// Re-resolve timing and stale-address policy for one name.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// Shortest time between two lookups, whatever the TTL (default 1 s).
    pub min_refresh: Duration,
    /// Longest time between two successful lookups, whatever the TTL (default 300 s).
    pub max_refresh: Duration,
    /// How long last-known-good addresses survive NXDOMAIN/NODATA (default `WhileHealthy`).
    pub stale_grace: StaleGrace,
    /// First retry delay after a failed lookup; doubles (with jitter) up to
    /// min(`max_refresh`, 30 s) (default 1 s).
    pub error_backoff: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            min_refresh: Duration::from_secs(1),
            max_refresh: Duration::from_secs(300),
            stale_grace: StaleGrace::WhileHealthy,
            error_backoff: Duration::from_secs(1),
        }
    }
}

/// How long addresses are kept after the DNS says the name has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleGrace {
    /// As long as those addresses keep passing health checks.
    WhileHealthy,
    /// For this long after the first negative answer.
    For(Duration),
}

impl Policy {
    /// Delay until the next lookup after records with this TTL.
    pub fn refresh_after(&self, ttl: Duration) -> Duration {
        // max() first so that a min above max (a config mistake) still gives min.
        ttl.min(self.max_refresh).max(self.min_refresh)
    }

    /// The backoff that follows `previous` (None after a success): the first is
    /// `error_backoff`, each next one doubles, capped at min(max_refresh, 30 s).
    pub fn next_backoff(&self, previous: Option<Duration>) -> Duration {
        let cap = self
            .max_refresh
            .min(MAX_ERROR_BACKOFF)
            .max(self.min_refresh);
        match previous {
            None => self.error_backoff.min(cap),
            Some(prev) => prev.saturating_mul(2).min(cap),
        }
    }
}

/// Spreads `delay` over [0.8, 1.2) of itself, so that many proxies that saw the same
/// failure do not retry in lockstep.
pub(crate) fn jitter(delay: Duration) -> Duration {
    use rand::Rng;
    delay.mul_f64(rand::rng().random_range(0.8..1.2))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn defaults_match_the_documentation() {
        let p = Policy::default();
        assert_eq!(p.min_refresh, S);
        assert_eq!(p.max_refresh, 300 * S);
        assert_eq!(p.stale_grace, StaleGrace::WhileHealthy);
        assert_eq!(p.error_backoff, S);
    }

    #[test]
    fn refresh_is_ttl_clamped() {
        let p = Policy {
            min_refresh: 2 * S,
            max_refresh: 60 * S,
            ..Policy::default()
        };
        assert_eq!(p.refresh_after(Duration::ZERO), 2 * S);
        assert_eq!(p.refresh_after(30 * S), 30 * S);
        assert_eq!(p.refresh_after(86_400 * S), 60 * S);
        assert_eq!(p.refresh_after(Duration::MAX), 60 * S);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = Policy::default();
        let mut b = None;
        let mut seen = Vec::new();
        for _ in 0..8 {
            let next = p.next_backoff(b);
            seen.push(next.as_secs());
            b = Some(next);
        }
        assert_eq!(seen, vec![1, 2, 4, 8, 16, 30, 30, 30]);
        let short = Policy {
            max_refresh: 5 * S,
            ..Policy::default()
        };
        assert_eq!(short.next_backoff(Some(4 * S)), 5 * S);
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        for _ in 0..1000 {
            let j = jitter(10 * S);
            assert!(j >= 8 * S && j < 12 * S, "{j:?}");
        }
    }
}
