//! What one error log line says: its event, the failure kind, and the fields episodes keep.

use memchr::memmem::Finder;

/// The kinds of event the analyzer groups into episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Event {
    NoLive,
    Nxdomain,
    DnsHarmless,
    /// A connect or timeout failure of a peer.
    PeerFail(FailKind),
    /// A reused connection closed or reset under nginx (or a peer failure, when nginx
    /// disables the peer right after it).
    Race(FailKind),
    /// `upstream server temporarily disabled`: max_fails counted a peer out.
    Disabled,
    ZoneMemory,
}

/// How a peer failed, as a bit so an episode can hold a set of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FailKind {
    Refused = 1,
    Reset = 2,
    Timeout = 4,
    Closed = 8,
    Other = 16,
}

/// Words for a set of failure kinds, e.g. "connection refused, reset".
pub(super) fn kinds_text(bits: u8) -> String {
    let words: Vec<&str> = [
        (FailKind::Refused, "connection refused"),
        (FailKind::Reset, "connection reset"),
        (FailKind::Timeout, "timeout"),
        (FailKind::Closed, "connection closed early"),
        (FailKind::Other, "other connect error"),
    ]
    .iter()
    .filter(|(k, _)| bits & *k as u8 != 0)
    .map(|(_, w)| *w)
    .collect();
    words.join(", ")
}

pub(super) struct Matchers {
    no_live: Finder<'static>,
    pub(super) resolved: Finder<'static>,
    connect: Finder<'static>,
    refused: Finder<'static>,
    timed_out: Finder<'static>,
    upstream_timed_out: Finder<'static>,
    premature: Finder<'static>,
    reset: Finder<'static>,
    send_reset: Finder<'static>,
    send_pipe: Finder<'static>,
    disabled: Finder<'static>,
    memory: Finder<'static>,
    upstream_field: Finder<'static>,
    request_field: Finder<'static>,
}

impl Matchers {
    pub(super) fn new() -> Self {
        Matchers {
            no_live: Finder::new("no live upstreams"),
            resolved: Finder::new(" could not be resolved ("),
            connect: Finder::new("connect() failed"),
            refused: Finder::new("(111: Connection refused)"),
            timed_out: Finder::new("timed out"),
            upstream_timed_out: Finder::new("upstream timed out"),
            // Only before the response header: a close while streaming a body (long polls,
            // downloads) is not a reused connection that was already closing.
            premature: Finder::new(
                "upstream prematurely closed connection while reading response header from upstream",
            ),
            reset: Finder::new(
                "(104: Connection reset by peer) while reading response header from upstream",
            ),
            send_reset: Finder::new(
                "(104: Connection reset by peer) while sending request to upstream",
            ),
            send_pipe: Finder::new("(32: Broken pipe) while sending request to upstream"),
            disabled: Finder::new("upstream server temporarily disabled"),
            memory: Finder::new("memory exhausted"),
            upstream_field: Finder::new(", upstream: \""),
            request_field: Finder::new(", request: \""),
        }
    }

    pub(super) fn classify(&self, line: &[u8]) -> Option<Event> {
        if self.no_live.find(line).is_some() {
            Some(Event::NoLive)
        } else if self.disabled.find(line).is_some() {
            Some(Event::Disabled)
        } else if let Some(i) = self.resolved.find(line) {
            let code = &line[i + self.resolved.needle().len()..];
            Some(if code.starts_with(b"3:") {
                Event::Nxdomain
            } else {
                Event::DnsHarmless
            })
        } else if self.connect.find(line).is_some() {
            Some(Event::PeerFail(if self.refused.find(line).is_some() {
                FailKind::Refused
            } else if self.timed_out.find(line).is_some() {
                FailKind::Timeout
            } else {
                FailKind::Other
            }))
        } else if self.premature.find(line).is_some() {
            Some(Event::Race(FailKind::Closed))
        } else if self.reset.find(line).is_some()
            || self.send_reset.find(line).is_some()
            || self.send_pipe.find(line).is_some()
        {
            Some(Event::Race(FailKind::Reset))
        } else if self.upstream_timed_out.find(line).is_some() {
            Some(Event::PeerFail(FailKind::Timeout))
        } else if self.memory.find(line).is_some() {
            Some(Event::ZoneMemory)
        } else {
            None
        }
    }

    /// The upstream name (or peer address) from `upstream: "http://NAME/..."`.
    pub(super) fn upstream(&self, line: &[u8]) -> Option<String> {
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

    /// The location key of the line's `request: "GET /api/x HTTP/1.1"`.
    pub(super) fn location(&self, line: &[u8]) -> Option<String> {
        let i = self.request_field.find(line)? + self.request_field.needle().len();
        let rest = &line[i..];
        let end = memchr::memchr(b'"', rest).unwrap_or(rest.len());
        location_of_request(&rest[..end])
    }
}

/// The location key of a request line: the path up to its second `/`, without the query
/// (`GET /api/v1/x?y HTTP/1.1` -> `/api`). Requests of one nginx `location` share it in the
/// common layouts (`/`, `/api/`, `\.php$`), so 502s are counted where they happened.
pub fn location_of_request(request: &[u8]) -> Option<String> {
    let mut words = request.split(|&b| b == b' ');
    let _method = words.next()?;
    let target = words.next()?;
    let path = target.split(|&b| b == b'?').next()?;
    if path.first() != Some(&b'/') {
        return None;
    }
    let end = memchr::memchr(b'/', &path[1..]).map_or(path.len(), |i| i + 1);
    Some(String::from_utf8_lossy(&path[..end]).into_owned())
}

/// The name before ` could not be resolved (`.
pub(super) fn resolved_name(line: &[u8], at: usize) -> String {
    let head = &line[..at];
    let start = head.iter().rposition(|&b| b == b' ').map_or(0, |i| i + 1);
    String::from_utf8_lossy(&head[start..]).into_owned()
}

/// The upstream name in `... upstream "be" ...` (zone memory lines).
pub(super) fn quoted_upstream(line: &[u8]) -> Option<String> {
    let i = memchr::memmem::find(line, b"upstream \"")? + 10;
    let end = memchr::memchr(b'"', &line[i..])?;
    Some(String::from_utf8_lossy(&line[i..i + end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_keys_cut_at_the_second_slash_and_drop_the_query() {
        let k = |s: &str| location_of_request(s.as_bytes());
        assert_eq!(k("GET /api/v1/x?y=1 HTTP/1.1").as_deref(), Some("/api"));
        assert_eq!(k("GET /api HTTP/1.1").as_deref(), Some("/api"));
        assert_eq!(k("GET / HTTP/1.1").as_deref(), Some("/"));
        assert_eq!(
            k("GET /index.php?a HTTP/1.1").as_deref(),
            Some("/index.php")
        );
        assert_eq!(k("garbage"), None);
    }

    #[test]
    fn failure_lines_are_classified_by_kind() {
        let m = Matchers::new();
        let c = |s: &str| m.classify(s.as_bytes());
        assert_eq!(
            c("x connect() failed (111: Connection refused) while connecting to upstream"),
            Some(Event::PeerFail(FailKind::Refused))
        );
        assert_eq!(
            c("x upstream timed out (110: Connection timed out) while reading response header from upstream, client: 1, upstream: \"http://a/\""),
            Some(Event::PeerFail(FailKind::Timeout))
        );
        assert_eq!(
            c("x [warn] 1#1: *5 upstream server temporarily disabled while connecting to upstream"),
            Some(Event::Disabled)
        );
        assert_eq!(kinds_text(3), "connection refused, connection reset");
    }
}
