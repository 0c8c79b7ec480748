//! nginx error logs: lines grouped into episodes, each classified by its own evidence.
//!
//! One pass, streaming: memory grows with the number of episodes, upstream names and peers,
//! never with the number of lines.

pub mod access;
pub mod lines;
mod matchers;
pub mod time;
mod verdict;

pub use matchers::location_of_request;
pub use verdict::to_finding;

use crate::finding::Finding;
use matchers::{quoted_upstream, resolved_name, Event, Matchers};
use std::collections::{HashMap, VecDeque};
use std::path::Path;

/// A log that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The file could not be opened.
    #[error("{file}: cannot open: {source}")]
    Open {
        /// The file.
        file: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Reading failed part way (I/O error or corrupt gzip).
    #[error("{file}: {source}")]
    Read {
        /// The file.
        file: String,
        /// Why, with the line reached.
        #[source]
        source: lines::ReadError,
    },
}

/// Reads error logs (and optional access logs) and returns one finding per episode.
pub fn analyze(error_logs: &[&Path], access_logs: &[&Path]) -> Result<Vec<Finding>, LogError> {
    let mut a = Analyzer::new();
    for p in error_logs {
        a.read_file(p)?;
    }
    let mut episodes = a.finish();
    if !access_logs.is_empty() {
        count_502s(access_logs, &mut episodes)?;
    }
    Ok(episodes.iter().map(to_finding).collect())
}

/// Counts client-visible 502s from access logs into the episodes whose span holds them, and
/// only for requests of the locations the episode's own lines name.
pub fn count_502s(access_logs: &[&Path], episodes: &mut [Episode]) -> Result<(), LogError> {
    for ep in episodes.iter_mut() {
        ep.client_502 = Some(0);
    }
    for p in access_logs {
        let file = p.display().to_string();
        let reader = lines::open(p).map_err(|source| LogError::Open {
            file: file.clone(),
            source,
        })?;
        lines::for_each_line(reader, |_, line| {
            let Some(e) = access::parse_access(line) else {
                return;
            };
            if e.status != 502 {
                return;
            }
            let upto = episodes.partition_point(|ep| ep.start <= e.time);
            // The end is inclusive of its whole second.
            for ep in episodes[..upto]
                .iter_mut()
                .filter(|ep| e.time <= ep.end + 1 && ep.holds_location(e.location.as_deref()))
            {
                if let Some(n) = ep.client_502.as_mut() {
                    *n += 1;
                }
            }
        })
        .map_err(|source| LogError::Read { file, source })?;
    }
    Ok(())
}

/// Lines of one kind further apart than this start a new episode.
const NO_LIVE_GAP_SECS: i64 = 5;
/// Gap for slower signals (DNS, races, zone memory).
const SLOW_GAP_SECS: i64 = 60;
/// An NXDOMAIN this recent explains the start of a "no live upstreams" episode.
const NXDOMAIN_WINDOW_SECS: i64 = 10;
/// Peer failures this recent explain it as max_fails ejection (default fail_timeout 10 s).
const FAIL_WINDOW_SECS: i64 = 10;
/// A reset or early close followed this soon by `temporarily disabled` for the same peer was
/// a peer failure that max_fails counted, not a keep-alive race.
const DISABLE_FOLLOWS_SECS: i64 = 1;
/// Distinct locations kept per episode; past this its 502s are counted in every location.
const MAX_LOCATIONS: usize = 32;

/// What an episode was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// NXDOMAIN emptied the peer list.
    NxdomainOutage,
    /// NXDOMAIN seen, but no "no live upstreams" followed.
    NxdomainNoOutage,
    /// Peer failures, then every peer ejected for fail_timeout while the backend was back.
    MaxFailsAmplification,
    /// Peers kept failing through the "no live upstreams" span: the backend was down.
    UpstreamDown,
    /// The upstream zone ran out of memory.
    ZoneMemoryExhausted,
    /// DNS timeouts or server failures alone.
    DnsTimeoutHarmless,
    /// Reused keep-alive connections closed under nginx.
    KeepaliveRace,
    /// No live upstreams without a cause in this log.
    NoLiveUpstreams,
}

impl Class {
    /// The rule id reported for this class.
    pub fn rule(self) -> &'static str {
        match self {
            Class::NxdomainOutage => "nxdomain-outage",
            Class::NxdomainNoOutage => "nxdomain-no-outage",
            Class::MaxFailsAmplification => "max-fails-amplification",
            Class::UpstreamDown => "upstream-down",
            Class::ZoneMemoryExhausted => "zone-memory-exhausted",
            Class::DnsTimeoutHarmless => "dns-timeout-harmless",
            Class::KeepaliveRace => "keepalive-race",
            Class::NoLiveUpstreams => "no-live-upstreams",
        }
    }
}

/// A run of related log lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Episode {
    /// What it was.
    pub class: Class,
    /// The file it was read from.
    pub file: String,
    /// Line number of its first line.
    pub first_line: u64,
    /// Time of its first line (local wall clock, seconds since the epoch).
    pub start: i64,
    /// Time of its last line.
    pub end: i64,
    /// Lines in it.
    pub lines: u64,
    /// The upstream (or peer, for races) it concerns.
    pub upstream: Option<String>,
    /// The DNS name it concerns.
    pub host: Option<String>,
    /// Peer failures (refused, reset, timeout) seen just before it.
    pub peer_failures: u64,
    /// `upstream server temporarily disabled` lines just before it.
    pub disabled: u64,
    /// Peer failures while it lasted: retries after fail_timeout that failed again.
    pub failures_during: u64,
    /// A peer address named by the failure lines.
    pub peer: Option<String>,
    /// Location keys of its requests (see [`location_of_request`]).
    pub locations: Vec<String>,
    /// Whether its 502s are counted in every location (none named, or too many).
    pub all_locations: bool,
    /// Client-visible 502s in its time span and locations, when an access log was read.
    pub client_502: Option<u64>,
    /// The kinds of peer failure, as bits of `FailKind`.
    failure_kinds: u8,
}

impl Episode {
    /// Seconds from first to last line (logs have one-second resolution).
    pub fn duration(&self) -> i64 {
        self.end - self.start
    }

    /// The kinds of peer failure seen, in words ("connection refused, connection reset").
    pub fn failure_text(&self) -> String {
        matchers::kinds_text(self.failure_kinds)
    }

    fn add_location(&mut self, loc: Option<String>) {
        let Some(loc) = loc else { return };
        if self.all_locations || self.locations.contains(&loc) {
            return;
        }
        if self.locations.len() >= MAX_LOCATIONS {
            self.all_locations = true;
            self.locations.clear();
        } else {
            self.locations.push(loc);
        }
    }

    /// Whether an access log request of `loc` belongs to this episode.
    fn holds_location(&self, loc: Option<&str>) -> bool {
        self.counts_all_locations() || loc.is_some_and(|l| self.locations.iter().any(|k| k == l))
    }

    /// Whether 502s are counted in every location, because the lines named none or too many.
    pub fn counts_all_locations(&self) -> bool {
        self.all_locations || self.locations.is_empty()
    }
}

/// Peer failures, as one entry per second and peer.
#[derive(Debug, Clone)]
struct Fail {
    t: i64,
    n: u64,
    kinds: u8,
    peer: Option<String>,
}

/// Streams error log lines and builds episodes.
pub struct Analyzer {
    m: Matchers,
    s: State,
}

#[derive(Default)]
struct State {
    open: HashMap<(u8, String), Episode>,
    done: Vec<Episode>,
    recent_nxdomain: Option<(i64, String)>,
    recent_fails: VecDeque<Fail>,
    recent_disabled: VecDeque<(i64, Option<String>)>,
    nxdomain_hit: HashMap<String, Vec<i64>>,
    /// Reset or early-close lines per peer, held until it is clear whether max_fails
    /// counted them (a `temporarily disabled` line follows) or they were races.
    pending_race: HashMap<String, Episode>,
}

impl Default for Analyzer {
    fn default() -> Self {
        Self::new()
    }
}

const TAG_NO_LIVE: u8 = 0;
const TAG_NXDOMAIN: u8 = 1;
const TAG_DNS: u8 = 2;
const TAG_RACE: u8 = 3;
const TAG_ZONE: u8 = 4;

impl Analyzer {
    /// A new, empty analyzer.
    pub fn new() -> Self {
        Analyzer {
            m: Matchers::new(),
            s: State::default(),
        }
    }

    /// Reads one error log (plain or gzip) to its end; returns the number of lines.
    pub fn read_file(&mut self, path: &Path) -> Result<u64, LogError> {
        let file = path.display().to_string();
        let reader = lines::open(path).map_err(|source| LogError::Open {
            file: file.clone(),
            source,
        })?;
        lines::for_each_line(reader, |no, line| self.line(&file, no, line))
            .map_err(|source| LogError::Read { file, source })
    }

    /// Feeds one line.
    pub fn line(&mut self, file: &str, no: u64, line: &[u8]) {
        let (m, s) = (&self.m, &mut self.s);
        let Some(event) = m.classify(line) else {
            return;
        };
        let Some(t) = time::parse_error_time(line) else {
            return;
        };
        s.flush_races(t - DISABLE_FOLLOWS_SECS);
        match event {
            Event::NoLive => {
                let up = m.upstream(line).unwrap_or_default();
                let key = (TAG_NO_LIVE, up.clone());
                let loc = m.location(line);
                if let Some(ep) = s.extend(&key, NO_LIVE_GAP_SECS, t) {
                    ep.add_location(loc);
                } else {
                    let mut ep = s.cause_at(t, Episode::new(file, no, t, Some(up), None));
                    ep.add_location(loc);
                    s.open.insert(key, ep);
                }
            }
            Event::Nxdomain | Event::DnsHarmless => {
                let at = m.resolved.find(line).unwrap_or(0);
                let host = resolved_name(line, at);
                let (tag, class) = if event == Event::Nxdomain {
                    s.recent_nxdomain = Some((t, host.clone()));
                    (TAG_NXDOMAIN, Class::NxdomainNoOutage)
                } else {
                    (TAG_DNS, Class::DnsTimeoutHarmless)
                };
                let key = (tag, host.clone());
                if s.extend(&key, SLOW_GAP_SECS, t).is_none() {
                    let mut ep = Episode::new(file, no, t, None, Some(host));
                    ep.class = class;
                    s.open.insert(key, ep);
                }
            }
            Event::PeerFail(kind) => {
                s.fail(Fail {
                    t,
                    n: 1,
                    kinds: kind as u8,
                    peer: m.upstream(line),
                });
            }
            Event::Disabled => {
                let peer = m.upstream(line);
                // The failure that made nginx disable the peer was logged just before.
                if let Some(p) = peer.as_ref().and_then(|p| s.pending_race.remove(p)) {
                    s.fail(Fail {
                        t: p.end,
                        n: p.lines,
                        kinds: p.failure_kinds,
                        peer: p.upstream,
                    });
                }
                s.recent_disabled.push_back((t, peer));
                while s
                    .recent_disabled
                    .front()
                    .is_some_and(|&(d, _)| d < t - FAIL_WINDOW_SECS)
                {
                    s.recent_disabled.pop_front();
                }
            }
            Event::Race(kind) => {
                let peer = m.upstream(line).unwrap_or_default();
                let loc = m.location(line);
                let p = s.pending_race.entry(peer.clone()).or_insert_with(|| {
                    let mut ep = Episode::new(file, no, t, Some(peer), None);
                    ep.class = Class::KeepaliveRace;
                    ep.lines = 0;
                    ep
                });
                p.lines += 1;
                p.end = p.end.max(t);
                p.failure_kinds |= kind as u8;
                p.add_location(loc);
            }
            Event::ZoneMemory => {
                let up = quoted_upstream(line);
                let key = (TAG_ZONE, up.clone().unwrap_or_default());
                if s.extend(&key, SLOW_GAP_SECS, t).is_none() {
                    let mut ep = Episode::new(file, no, t, up, None);
                    ep.class = Class::ZoneMemoryExhausted;
                    s.open.insert(key, ep);
                }
            }
        }
    }

    /// Closes every open episode and returns them all, sorted by start.
    pub fn finish(self) -> Vec<Episode> {
        let mut s = self.s;
        s.flush_races(i64::MAX);
        s.done.extend(s.open.drain().map(|(_, e)| e));
        // An NXDOMAIN that caused an outage is told by the outage's episode.
        let hit = std::mem::take(&mut s.nxdomain_hit);
        s.done.retain(|e| {
            let caused = e
                .host
                .as_ref()
                .and_then(|h| hit.get(h))
                .is_some_and(|ts| ts.iter().any(|&at| at >= e.start && at <= e.end));
            !(e.class == Class::NxdomainNoOutage && caused)
        });
        for e in &mut s.done {
            // Retries after fail_timeout that failed again: the backend was still down, so
            // the span is its outage, not one that max_fails made longer.
            if matches!(
                e.class,
                Class::MaxFailsAmplification | Class::NoLiveUpstreams
            ) && e.failures_during > 0
            {
                e.class = Class::UpstreamDown;
            }
        }
        s.done.sort_by(|a, b| {
            (a.start, &a.file, a.first_line).cmp(&(b.start, &b.file, b.first_line))
        });
        s.done
    }
}

impl State {
    /// Extends the open episode under `key` if `t` is within `gap` of its end.
    fn extend(&mut self, key: &(u8, String), gap: i64, t: i64) -> Option<&mut Episode> {
        let fits = self.open.get(key).is_some_and(|ep| t - ep.end <= gap);
        if !fits {
            if let Some(old) = self.open.remove(key) {
                self.done.push(old);
            }
            return None;
        }
        let ep = self.open.get_mut(key)?;
        ep.end = ep.end.max(t);
        ep.lines += 1;
        Some(ep)
    }

    /// Records peer failures: recent ones explain a coming "no live upstreams"; those inside
    /// an open one show the backend still failing.
    fn fail(&mut self, f: Fail) {
        for ep in self.open.iter_mut().filter_map(|((tag, _), ep)| {
            (*tag == TAG_NO_LIVE && f.t > ep.start && f.t - ep.end <= NO_LIVE_GAP_SECS)
                .then_some(ep)
        }) {
            ep.failures_during += f.n;
            ep.failure_kinds |= f.kinds;
        }
        let t = f.t;
        self.recent_fails.push_back(f);
        while self
            .recent_fails
            .front()
            .is_some_and(|f| f.t < t - FAIL_WINDOW_SECS)
        {
            self.recent_fails.pop_front();
        }
    }

    /// Turns reset/close lines that no `temporarily disabled` followed into race episodes.
    fn flush_races(&mut self, before: i64) {
        if self.pending_race.is_empty() {
            return;
        }
        let due: Vec<String> = self
            .pending_race
            .iter()
            .filter(|(_, p)| p.end < before)
            .map(|(k, _)| k.clone())
            .collect();
        for peer in due {
            let Some(p) = self.pending_race.remove(&peer) else {
                continue;
            };
            let key = (TAG_RACE, peer);
            let fits = self
                .open
                .get(&key)
                .is_some_and(|ep| p.start - ep.end <= SLOW_GAP_SECS);
            if fits {
                if let Some(ep) = self.open.get_mut(&key) {
                    ep.end = ep.end.max(p.end);
                    ep.lines += p.lines;
                    ep.failure_kinds |= p.failure_kinds;
                    for l in p.locations {
                        ep.add_location(Some(l));
                    }
                    ep.all_locations |= p.all_locations;
                }
            } else {
                if let Some(old) = self.open.remove(&key) {
                    self.done.push(old);
                }
                self.open.insert(key, p);
            }
        }
    }

    /// Why a "no live upstreams" episode starting at `t` started.
    fn cause_at(&mut self, t: i64, mut ep: Episode) -> Episode {
        if let Some((at, host)) = &self.recent_nxdomain {
            if t - at <= NXDOMAIN_WINDOW_SECS {
                self.nxdomain_hit.entry(host.clone()).or_default().push(*at);
                ep.class = Class::NxdomainOutage;
                ep.host = Some(host.clone());
                return ep;
            }
        }
        let since = t - FAIL_WINDOW_SECS;
        for f in self.recent_fails.iter().filter(|f| f.t >= since) {
            ep.peer_failures += f.n;
            ep.failure_kinds |= f.kinds;
            if f.peer.is_some() {
                ep.peer.clone_from(&f.peer);
            }
        }
        for (_, peer) in self.recent_disabled.iter().filter(|(d, _)| *d >= since) {
            ep.disabled += 1;
            if ep.peer.is_none() {
                ep.peer.clone_from(peer);
            }
        }
        ep.class = if ep.peer_failures > 0 || ep.disabled > 0 {
            Class::MaxFailsAmplification
        } else {
            Class::NoLiveUpstreams
        };
        ep
    }
}

impl Episode {
    fn new(file: &str, no: u64, t: i64, upstream: Option<String>, host: Option<String>) -> Self {
        Episode {
            class: Class::NoLiveUpstreams,
            file: file.to_owned(),
            first_line: no,
            start: t,
            end: t,
            lines: 1,
            upstream,
            host,
            peer_failures: 0,
            disabled: 0,
            failures_during: 0,
            peer: None,
            locations: Vec::new(),
            all_locations: false,
            client_502: None,
            failure_kinds: 0,
        }
    }
}
