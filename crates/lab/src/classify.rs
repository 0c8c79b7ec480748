//! Classifies every failed request by cause, from the client record, the target's logs, the
//! DNS log and the fault timeline.
//!
//! The cause says what failed (`no_live_upstreams`, `connect_failed`, `upkeep:no_peers`,
//! `target_refused`...); the context says when (during which fault, after which fault ended,
//! or after which DNS answer), which is how an amplified outage shows: errors long after the
//! fault that caused them ended.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::load::{ClientError, RequestRecord};
use crate::timeline::FaultEvent;

mod logs;

pub use logs::{parse_haproxy, parse_nginx_access, parse_nginx_error, LogLine};

/// Errors this long after a fault ended are still put down to it.
const AFTERMATH: Duration = Duration::from_secs(15);

/// A DNS answer as the classifier needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsAnswer {
    /// Seconds from the start of the load.
    pub t_s: f64,
    /// Queried name.
    pub name: String,
    /// The answer (`NXDOMAIN`, `NODATA`, `SERVFAIL`, addresses...).
    pub answer: String,
}

/// One failed request with its cause and context.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Classified {
    /// Sequence number of the request.
    pub seq: u64,
    /// When it was due, seconds from the start.
    pub t_s: f64,
    /// What failed.
    pub cause: String,
    /// When: `during dc1 refuse`, `after dc1 refuse ended`, `dns answered NXDOMAIN`, `no fault`.
    pub context: String,
}

/// Seconds since the epoch of a wall-clock time.
pub fn epoch_s(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The cause of one failed request.
///
/// `logs` are the target's log lines (any order) with epoch times; `started` is the load's t0.
pub fn cause_of(record: &RequestRecord, started_epoch: f64, logs: &[LogLine]) -> String {
    if let Some(e) = record.error {
        return match e {
            ClientError::Refused => "target_refused",
            ClientError::Reset => "target_reset",
            ClientError::Closed => "target_closed",
            ClientError::Timeout => "client_timeout",
            ClientError::Other => "client_other",
        }
        .to_owned();
    }
    if let Some(cause) = &record.cause {
        return format!("upkeep:{cause}");
    }
    let status = record.status.unwrap_or(0);
    let sent = started_epoch + (record.scheduled + record.send_lag).as_secs_f64();
    let done = sent + record.latency.as_secs_f64();
    // The log line of this request: same status, logged closest to when it ended.
    let best = logs
        .iter()
        .filter(|l| l.status == Some(status))
        .filter(|l| l.at >= sent - 1.0 && l.at <= done + 1.0)
        .min_by(|a, b| (a.at - done).abs().total_cmp(&(b.at - done).abs()));
    if let Some(line) = best {
        if let Some(cause) = &line.cause {
            return cause.clone();
        }
    }
    // nginx's error log has whole seconds and no status: take its signature in that window.
    let signature = logs
        .iter()
        .filter(|l| l.status.is_none() && l.cause.is_some())
        .filter(|l| l.at >= sent.floor() - 1.0 && l.at <= done.ceil())
        .min_by(|a, b| (a.at - done).abs().total_cmp(&(b.at - done).abs()));
    match signature.and_then(|l| l.cause.clone()) {
        Some(c) => c,
        None => format!("status_{status}"),
    }
}

/// When a request failed relative to the faults and DNS answers.
pub fn context_of(t_s: f64, faults: &[FaultEvent], dns: &[DnsAnswer]) -> String {
    let active: Vec<&str> = faults
        .iter()
        .filter(|f| f.start_s <= t_s && f.end_s.is_none_or(|e| t_s < e))
        .map(|f| f.label.as_str())
        .collect();
    if !active.is_empty() {
        return format!("during {}", active.join(" + "));
    }
    if let Some(f) = faults
        .iter()
        .filter(|f| {
            f.end_s
                .is_some_and(|e| e <= t_s && t_s - e <= AFTERMATH.as_secs_f64())
        })
        .max_by(|a, b| a.end_s.unwrap_or(0.0).total_cmp(&b.end_s.unwrap_or(0.0)))
    {
        return format!("after {} ended", f.label);
    }
    if let Some(a) = dns
        .iter()
        .filter(|a| a.t_s <= t_s)
        .max_by(|a, b| a.t_s.total_cmp(&b.t_s))
    {
        if matches!(
            a.answer.as_str(),
            "NXDOMAIN" | "NODATA" | "SERVFAIL" | "REFUSED"
        ) {
            return format!("dns answered {}", a.answer);
        }
    }
    "no fault".into()
}

/// Classifies every failed request of a run.
pub fn classify(
    records: &[RequestRecord],
    started: SystemTime,
    logs: &[LogLine],
    faults: &[FaultEvent],
    dns: &[DnsAnswer],
) -> Vec<Classified> {
    let started_epoch = epoch_s(started);
    records
        .iter()
        .filter(|r| r.is_error())
        .map(|r| {
            let t_s = r.scheduled.as_secs_f64();
            Classified {
                seq: r.seq,
                t_s,
                cause: cause_of(r, started_epoch, logs),
                context: context_of(t_s, faults, dns),
            }
        })
        .collect()
}

/// Counts by `cause (context)`.
pub fn tally(classified: &[Classified]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for c in classified {
        *out.entry(format!("{} ({})", c.cause, c.context))
            .or_insert(0) += 1;
    }
    out
}

#[cfg(test)]
mod tests;
