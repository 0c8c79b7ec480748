//! nginx error logs: lines grouped into episodes, each classified per the seeds' cheat sheet.
//!
//! One pass, streaming: memory grows with the number of episodes and upstream names, never
//! with the number of lines.

pub mod access;
pub mod lines;
pub mod time;
mod verdict;

pub use verdict::to_finding;

use crate::finding::Finding;
use memchr::memmem::Finder;
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

/// Counts client-visible 502s from access logs into the episodes whose span holds them.
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
                .filter(|ep| e.time <= ep.end + 1)
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

/// What an episode was, per the seeds' cheat sheet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// NXDOMAIN emptied the peer list.
    NxdomainOutage,
    /// NXDOMAIN seen, but no "no live upstreams" followed.
    NxdomainNoOutage,
    /// Connect failures, then every peer ejected for fail_timeout.
    MaxFailsAmplification,
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
    /// Peer failures (connect errors, timeouts) seen just before it.
    pub peer_failures: u64,
    /// Client-visible 502s in its time span, when an access log was read.
    pub client_502: Option<u64>,
}

impl Episode {
    /// Seconds from first to last line (logs have one-second resolution).
    pub fn duration(&self) -> i64 {
        self.end - self.start
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    NoLive,
    Nxdomain,
    DnsHarmless,
    PeerFail,
    Race,
    ZoneMemory,
}

struct Matchers {
    no_live: Finder<'static>,
    resolved: Finder<'static>,
    connect: Finder<'static>,
    timed_out: Finder<'static>,
    premature: Finder<'static>,
    reset: Finder<'static>,
    send_reset: Finder<'static>,
    send_pipe: Finder<'static>,
    memory: Finder<'static>,
    upstream_field: Finder<'static>,
}

impl Matchers {
    fn new() -> Self {
        Matchers {
            no_live: Finder::new("no live upstreams"),
            resolved: Finder::new(" could not be resolved ("),
            connect: Finder::new("connect() failed"),
            timed_out: Finder::new("upstream timed out"),
            premature: Finder::new("upstream prematurely closed connection"),
            reset: Finder::new(
                "(104: Connection reset by peer) while reading response header from upstream",
            ),
            send_reset: Finder::new(
                "(104: Connection reset by peer) while sending request to upstream",
            ),
            send_pipe: Finder::new("(32: Broken pipe) while sending request to upstream"),
            memory: Finder::new("memory exhausted"),
            upstream_field: Finder::new(", upstream: \""),
        }
    }

    fn classify(&self, line: &[u8]) -> Option<Event> {
        if self.no_live.find(line).is_some() {
            Some(Event::NoLive)
        } else if let Some(i) = self.resolved.find(line) {
            let code = &line[i + self.resolved.needle().len()..];
            Some(if code.starts_with(b"3:") {
                Event::Nxdomain
            } else {
                Event::DnsHarmless
            })
        } else if self.connect.find(line).is_some() || self.timed_out.find(line).is_some() {
            Some(Event::PeerFail)
        } else if self.premature.find(line).is_some()
            || self.reset.find(line).is_some()
            || self.send_reset.find(line).is_some()
            || self.send_pipe.find(line).is_some()
        {
            Some(Event::Race)
        } else if self.memory.find(line).is_some() {
            Some(Event::ZoneMemory)
        } else {
            None
        }
    }

    /// The upstream name from `upstream: "http://NAME/..."`.
    fn upstream(&self, line: &[u8]) -> Option<String> {
        let i = self.upstream_field.find(line)? + self.upstream_field.needle().len();
        let rest = &line[i..];
        // Skip a `scheme://` prefix; what follows is the upstream (or peer) name.
        let rest = rest
            .iter()
            .position(|&b| b == b'/')
            .filter(|&p| rest[..p].ends_with(b":"))
            .and_then(|p| rest.get(p + 2..))
            .unwrap_or(rest);
        let end = rest
            .iter()
            .position(|&b| b == b'/' || b == b'"')
            .unwrap_or(rest.len());
        Some(String::from_utf8_lossy(&rest[..end]).into_owned())
    }
}

/// The name before ` could not be resolved (`.
fn resolved_name(line: &[u8], at: usize) -> String {
    let head = &line[..at];
    let start = head.iter().rposition(|&b| b == b' ').map_or(0, |i| i + 1);
    String::from_utf8_lossy(&head[start..]).into_owned()
}

/// The upstream name in `... upstream "be" ...` (zone memory lines).
fn quoted_upstream(line: &[u8]) -> Option<String> {
    let i = memchr::memmem::find(line, b"upstream \"")? + 10;
    let end = memchr::memchr(b'"', &line[i..])?;
    Some(String::from_utf8_lossy(&line[i..i + end]).into_owned())
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
    recent_fails: VecDeque<i64>,
    nxdomain_hit: HashMap<String, Vec<i64>>,
}

impl Default for Analyzer {
    fn default() -> Self {
        Self::new()
    }
}

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
        match event {
            Event::NoLive => {
                let up = m.upstream(line).unwrap_or_default();
                let key = (0, up.clone());
                if !s.extends(&key, NO_LIVE_GAP_SECS, t) {
                    let (class, fails) = s.cause_at(t);
                    let mut ep = Episode::new(class, file, no, t, Some(up), None);
                    ep.peer_failures = fails;
                    if class == Class::NxdomainOutage {
                        ep.host = s.recent_nxdomain.as_ref().map(|(_, h)| h.clone());
                    }
                    s.start(key, ep);
                }
            }
            Event::Nxdomain | Event::DnsHarmless => {
                let at = m.resolved.find(line).unwrap_or(0);
                let host = resolved_name(line, at);
                let (tag, class) = if event == Event::Nxdomain {
                    s.recent_nxdomain = Some((t, host.clone()));
                    (1, Class::NxdomainNoOutage)
                } else {
                    (2, Class::DnsTimeoutHarmless)
                };
                let key = (tag, host.clone());
                if !s.extends(&key, SLOW_GAP_SECS, t) {
                    s.start(key, Episode::new(class, file, no, t, None, Some(host)));
                }
            }
            Event::PeerFail => {
                s.recent_fails.push_back(t);
                while s
                    .recent_fails
                    .front()
                    .is_some_and(|&f| f < t - FAIL_WINDOW_SECS)
                {
                    s.recent_fails.pop_front();
                }
            }
            Event::Race | Event::ZoneMemory => {
                let (tag, up, class) = if event == Event::Race {
                    (3, m.upstream(line), Class::KeepaliveRace)
                } else {
                    (4, quoted_upstream(line), Class::ZoneMemoryExhausted)
                };
                let key = (tag, up.clone().unwrap_or_default());
                if !s.extends(&key, SLOW_GAP_SECS, t) {
                    s.start(key, Episode::new(class, file, no, t, up, None));
                }
            }
        }
    }

    /// Closes every open episode and returns them all, sorted by start.
    pub fn finish(self) -> Vec<Episode> {
        let mut s = self.s;
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
        s.done.sort_by(|a, b| {
            (a.start, &a.file, a.first_line).cmp(&(b.start, &b.file, b.first_line))
        });
        s.done
    }
}

impl State {
    /// Extends the open episode under `key` if `t` is within `gap` of its end.
    fn extends(&mut self, key: &(u8, String), gap: i64, t: i64) -> bool {
        if let Some(ep) = self.open.get_mut(key) {
            if t - ep.end <= gap {
                ep.end = ep.end.max(t);
                ep.lines += 1;
                return true;
            }
            let old = self.open.remove(key);
            self.done.extend(old);
        }
        false
    }

    fn start(&mut self, key: (u8, String), ep: Episode) {
        self.open.insert(key, ep);
    }

    /// Why a "no live upstreams" episode starting at `t` started.
    fn cause_at(&mut self, t: i64) -> (Class, u64) {
        if let Some((at, host)) = &self.recent_nxdomain {
            if t - at <= NXDOMAIN_WINDOW_SECS {
                self.nxdomain_hit.entry(host.clone()).or_default().push(*at);
                return (Class::NxdomainOutage, 0);
            }
        }
        let fails = self
            .recent_fails
            .iter()
            .filter(|&&f| f >= t - FAIL_WINDOW_SECS)
            .count() as u64;
        if fails > 0 {
            return (Class::MaxFailsAmplification, fails);
        }
        (Class::NoLiveUpstreams, 0)
    }
}

impl Episode {
    fn new(
        class: Class,
        file: &str,
        no: u64,
        t: i64,
        upstream: Option<String>,
        host: Option<String>,
    ) -> Self {
        Episode {
            class,
            file: file.to_owned(),
            first_line: no,
            start: t,
            end: t,
            lines: 1,
            upstream,
            host,
            peer_failures: 0,
            client_502: None,
        }
    }
}
