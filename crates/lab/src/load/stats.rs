//! Summary figures of a load run, from HDR histograms of the per-request records.

use hdrhistogram::Histogram;
use serde::Serialize;

use super::RequestRecord;

/// Requests, errors, latency and send-lag percentiles of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoadStats {
    /// Requests sent.
    pub requests: u64,
    /// Requests with no response or a 5xx.
    pub errors: u64,
    /// Median latency.
    pub p50_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
    /// Largest latency.
    pub max_ms: f64,
    /// 99th percentile send lag (how late requests left).
    pub lag_p99_ms: f64,
    /// Largest send lag.
    pub lag_max_ms: f64,
}

/// Send-lag p99 from which the generator counts as behind its own schedule.
pub const LAG_P99_LIMIT_MS: f64 = 1.0;

impl LoadStats {
    /// Whether requests left late often enough (send-lag p99 >= 1 ms) that the run measured
    /// the generator's own shortage of CPU as well as the target.
    pub fn behind_schedule(&self) -> bool {
        self.lag_p99_ms >= LAG_P99_LIMIT_MS
    }

    /// Computes the figures of `records`.
    pub fn of(records: &[RequestRecord]) -> LoadStats {
        let mut lat = histogram();
        let mut lag = histogram();
        for r in records {
            let _ = lat.record(micros(r.latency));
            let _ = lag.record(micros(r.send_lag));
        }
        let ms = |v: u64| v as f64 / 1000.0;
        LoadStats {
            requests: records.len() as u64,
            errors: records.iter().filter(|r| r.is_error()).count() as u64,
            p50_ms: ms(lat.value_at_quantile(0.50)),
            p99_ms: ms(lat.value_at_quantile(0.99)),
            max_ms: ms(lat.max()),
            lag_p99_ms: ms(lag.value_at_quantile(0.99)),
            lag_max_ms: ms(lag.max()),
        }
    }
}

fn histogram() -> Histogram<u64> {
    // 1 us .. 10 min at 3 significant digits; the bounds are constants, so this cannot fail.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

fn micros(d: std::time::Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, 600_000_000)
}
