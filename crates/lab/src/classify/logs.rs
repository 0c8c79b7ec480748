//! Reads the targets' logs into timed lines with a status and/or a cause. Targets are launched
//! with `TZ=UTC`, so their local times are UTC.

/// One log line: when (epoch seconds), the status it logged, the cause it names.
#[derive(Debug, Clone, PartialEq)]
pub struct LogLine {
    /// Epoch seconds (whole seconds for nginx's error log).
    pub at: f64,
    /// Response status, for access-log lines.
    pub status: Option<u16>,
    /// Cause, when the line names one.
    pub cause: Option<String>,
}

/// Days from 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn epoch(y: i64, mo: i64, d: i64, h: i64, mi: i64, s: f64) -> f64 {
    (days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60) as f64 + s
}

/// nginx access log in the lab's format: `$msec $status "$upstream_addr" "$upstream_status" $request_time`.
pub fn parse_nginx_access(text: &str, upstream_name: &str) -> Vec<LogLine> {
    text.lines()
        .filter_map(|line| {
            let mut quoted = line.split('"');
            let head = quoted.next()?;
            let addr = quoted.next()?.trim();
            let _ = quoted.next();
            let ustatus = quoted.next()?.trim();
            let mut head = head.split_whitespace();
            let at: f64 = head.next()?.parse().ok()?;
            let status: u16 = head.next()?.parse().ok()?;
            let cause = if status < 500 {
                None
            } else if addr == upstream_name {
                // nginx tried no peer at all: the list was empty or every peer was marked failed.
                Some("no_live_upstreams".to_owned())
            } else if ustatus.split([',', ' ']).any(|s| s == "504") {
                Some("upstream_timeout".to_owned())
            } else if ustatus
                .split([',', ' ', ':'])
                .rfind(|s| !s.is_empty())
                .is_some_and(|s| s == status.to_string() && status != 502)
            {
                Some(format!("upstream_status_{status}"))
            } else {
                None
            };
            Some(LogLine {
                at,
                status: Some(status),
                cause,
            })
        })
        .collect()
}

/// nginx error log: `YYYY/MM/DD HH:MM:SS [level] pid#tid: *cid message`.
pub fn parse_nginx_error(text: &str) -> Vec<LogLine> {
    text.lines()
        .filter_map(|line| {
            let date = line.get(0..19)?;
            let num = |r: std::ops::Range<usize>| date.get(r)?.parse::<i64>().ok();
            let at = epoch(
                num(0..4)?,
                num(5..7)?,
                num(8..10)?,
                num(11..13)?,
                num(14..16)?,
                num(17..19)? as f64,
            );
            let cause = nginx_signature(line)?;
            Some(LogLine {
                at,
                status: None,
                cause: Some(cause.to_owned()),
            })
        })
        .collect()
}

fn nginx_signature(line: &str) -> Option<&'static str> {
    let sigs = [
        ("no live upstreams", "no_live_upstreams"),
        ("(3: Host not found)", "dns_not_found"),
        ("(110: Operation timed out)", "dns_timeout"),
        ("could not be resolved", "dns_failed"),
        ("connect() failed (111", "connect_failed"),
        (
            "upstream prematurely closed connection",
            "upstream_closed_early",
        ),
        ("Connection reset by peer", "upstream_reset"),
        ("upstream timed out", "upstream_timeout"),
    ];
    sigs.iter().find(|(s, _)| line.contains(s)).map(|(_, c)| *c)
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// HAProxy `option httplog` lines (raw format on stdout).
pub fn parse_haproxy(text: &str) -> Vec<LogLine> {
    text.lines()
        .filter_map(|line| {
            let t: Vec<&str> = line.split_whitespace().collect();
            let date = t.get(1)?.trim_start_matches('[').trim_end_matches(']');
            // 30/Nov/2026:08:20:10.123
            let (day, rest) = date.split_once('/')?;
            let (mon, rest) = rest.split_once('/')?;
            let (year, clock) = rest.split_once(':')?;
            let mut c = clock.split(':');
            let (h, mi, s) = (c.next()?, c.next()?, c.next()?);
            let mo = MONTHS.iter().position(|m| *m == mon)? as i64 + 1;
            let accepted = epoch(
                year.parse().ok()?,
                mo,
                day.parse().ok()?,
                h.parse().ok()?,
                mi.parse().ok()?,
                s.parse().ok()?,
            );
            let total_ms: f64 = t
                .get(4)?
                .rsplit('/')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            let server = t.get(3)?;
            let status: u16 = t.get(5)?.parse().ok()?;
            let state = t.get(9)?;
            let cause = if status < 500 {
                None
            } else if server.contains("<NOSRV>") {
                Some("no_server".to_owned())
            } else {
                Some(
                    match state.get(0..2)? {
                        "SC" => "connect_failed",
                        "sC" => "connect_timeout",
                        "SH" => "upstream_reset",
                        "sH" => "upstream_timeout",
                        "SD" => "upstream_reset_mid_body",
                        "sD" => "upstream_timeout",
                        "--" => {
                            return Some(LogLine {
                                at: accepted + total_ms.max(0.0) / 1000.0,
                                status: Some(status),
                                cause: Some(format!("upstream_status_{status}")),
                            })
                        }
                        other => {
                            return Some(LogLine {
                                at: accepted + total_ms.max(0.0) / 1000.0,
                                status: Some(status),
                                cause: Some(format!("haproxy_{other}")),
                            })
                        }
                    }
                    .to_owned(),
                )
            };
            Some(LogLine {
                at: accepted + total_ms.max(0.0) / 1000.0,
                status: Some(status),
                cause,
            })
        })
        .collect()
}
