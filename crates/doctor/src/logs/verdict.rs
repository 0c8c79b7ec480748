//! Episode verdicts: what happened, what it costs (with the figures of docs/incidents.md),
//! and what to do next.

use super::time::format_time;
use super::{Class, Episode};
use crate::finding::{Finding, Location, Severity};

/// The 502s an access log counted for an episode, in words.
fn client_502_text(ep: &Episode, n: u64) -> String {
    let r#where = if ep.counts_all_locations() {
        "in every location".to_owned()
    } else {
        format!("under {}", ep.locations.join(", "))
    };
    format!("Access log: {n} client-visible 502(s) in this span {where}.")
}

/// Turns an episode into a finding with its verdict and next step.
pub fn to_finding(ep: &Episode) -> Finding {
    let span = format!(
        "from {} to {} ({} s, {} line(s))",
        format_time(ep.start),
        format_time(ep.end),
        ep.duration(),
        ep.lines
    );
    let up = ep.upstream.as_deref().unwrap_or("?");
    let host = ep.host.as_deref().unwrap_or("?");
    let kinds = match ep.failure_text() {
        k if k.is_empty() => String::new(),
        k => format!(" ({k})"),
    };
    let peer_note = ep
        .peer
        .as_deref()
        .map(|p| format!(" (peer {p} in this log)"))
        .unwrap_or_default();
    let mut counted = true;
    let (severity, problem, consequence, fix) = match ep.class {
        Class::NxdomainOutage => (
            Severity::Error,
            format!("NXDOMAIN for {host} emptied upstream \"{up}\": \"no live upstreams\" {span}."),
            "nginx deletes every peer on NXDOMAIN and answers 502 without connecting until the next successful re-query (every valid + 1 s): 6 s of NXDOMAIN with valid=5s cost a 6.0 s outage and 3,005 502s (docs/incidents.md#nxdomain).".to_owned(),
            format!("# find why {host} answered NXDOMAIN (a name with no healthy target?), then make\n# the upstream independent of that one name; the config check shows the fix in your names:\n# upkeep doctor nginx /etc/nginx/nginx.conf   (rule resolve-single-name)"),
        ),
        Class::NxdomainNoOutage => {
            counted = false;
            let base = format!("{host} answered NXDOMAIN {span}; no \"no live upstreams\" followed in these logs");
            let risk = "Where every peer of an upstream comes from this one name, one NXDOMAIN empties it: a 6.0 s outage and 3,005 502s (docs/incidents.md#nxdomain).";
            let (problem, consequence) = match ep.client_502 {
                None => (
                    format!("{base}."),
                    format!("{risk} Give --access-log to see whether clients got 502s in this span."),
                ),
                Some(0) => (
                    format!("{base}, and no client got a 502 in this span: other peers carried the traffic."),
                    risk.to_owned(),
                ),
                Some(n) => (
                    format!("{base}, but {n} client request(s) got a 502 in this span."),
                    format!("{risk} {}", client_502_text(ep, n)),
                ),
            };
            (
                Severity::Warning,
                problem,
                consequence,
                "# check the config for an upstream that depends on this name alone:\n# upkeep doctor nginx /etc/nginx/nginx.conf   (rule resolve-single-name)".to_owned(),
            )
        }
        Class::MaxFailsAmplification => (
            Severity::Error,
            format!(
                "{} peer failure(s){kinds}{}, then \"no live upstreams\" on \"{up}\" {span}, with no new failure during it: max_fails counted the peers out for fail_timeout.",
                ep.peer_failures,
                match ep.disabled {
                    0 => String::new(),
                    n => format!(" and {n} \"upstream server temporarily disabled\" line(s)"),
                }
            ),
            "A short failure becomes an outage as long as fail_timeout (default 10 s), every request in it a 502 without nginx trying a peer. It is worst when one host is written as two server lines, which turns off nginx's single-peer guard: a 2 s blip became a 10.4 s outage and 5,210 502s (docs/incidents.md#single-peer-guard).".to_owned(),
            format!(
                "# in upstream {up}{peer_note}: let one failure not eject the peer,\n# on its server line(s) as written in your config, add max_fails=0:\nserver {} max_fails=0;\n# and check for one host on two server lines: upkeep doctor nginx FILE (rule resolve-duplicate-host)",
                ep.peer.as_deref().unwrap_or("HOST:PORT")
            ),
        ),
        Class::UpstreamDown => (
            Severity::Error,
            format!(
                "upstream \"{up}\" kept failing{kinds} {span}: {} failure(s) before it and {} more while nginx answered \"no live upstreams\" between its retries.",
                ep.peer_failures, ep.failures_during
            ),
            format!("The backend{peer_note} was down for about {} s and nginx had no other working peer; the retries after fail_timeout failed too, so max_fails did not lengthen this outage.", ep.duration()),
            format!("# find why the backend failed in this span (its own logs, restarts, deploys);\n# for failover nginx needs a peer outside it, in upstream {up}:\n#     server STANDBY_HOST:PORT backup;"),
        ),
        Class::ZoneMemoryExhausted => (
            Severity::Error,
            format!("upstream \"{up}\" ran out of zone memory {span}."),
            "nginx could not add the resolved addresses, so the upstream runs on a stale or partial peer list.".to_owned(),
            format!("upstream {up} {{\n    zone {up} 256k;   # larger than now\n    ...\n}}"),
        ),
        Class::DnsTimeoutHarmless => (
            Severity::Info,
            format!("DNS for {host} timed out or failed {span}; nginx kept its peers."),
            "Timeouts, SERVFAIL and silence keep the last peers: nginx goes on using them, so nothing was lost (docs/incidents.md#nxdomain tells these apart from NXDOMAIN).".to_owned(),
            "# nothing to change in nginx; check the resolver's health".to_owned(),
        ),
        Class::KeepaliveRace => (
            Severity::Warning,
            format!("upstream {up} closed connections that nginx was reusing{kinds} {span}, and nginx did not count it as down."),
            "The backend's keep-alive timeout is shorter than nginx's upstream keepalive_timeout (default 60 s; Node closes idle sockets at 5 s), so a request written into a closing socket fails: 502s on reused connections only (docs/incidents.md#keepalive-race).".to_owned(),
            format!("# the side that reuses must close first; in the upstream:\nkeepalive_timeout 4s;\n# measure the backend: upkeep doctor keepalive http://{up}/"),
        ),
        Class::NoLiveUpstreams => (
            Severity::Warning,
            format!("\"no live upstreams\" on \"{up}\" {span}, with no DNS error, peer failure or \"temporarily disabled\" line before it in these logs."),
            "Every request in this span got a 502 without nginx trying a peer.".to_owned(),
            "# read the lines before the first one (other logs, rotated files), and check\n# max_fails/fail_timeout and resolve lines with: upkeep doctor nginx FILE".to_owned(),
        ),
    };
    let consequence = match ep.client_502 {
        Some(n) if counted => format!("{consequence} {}", client_502_text(ep, n)),
        _ => consequence,
    };
    let mut f = Finding::new(
        ep.class.rule(),
        severity,
        Location {
            file: ep.file.clone(),
            line: Some(u32::try_from(ep.first_line).unwrap_or(u32::MAX)),
            column: None,
        },
        problem,
        consequence,
        fix,
    )
    .with_detail("start", format_time(ep.start))
    .with_detail("end", format_time(ep.end))
    .with_detail("duration_s", ep.duration())
    .with_detail("lines", ep.lines);
    if let Some(u) = &ep.upstream {
        f = f.with_detail("upstream", u.clone());
    }
    if let Some(h) = &ep.host {
        f = f.with_detail("host", h.clone());
    }
    if matches!(ep.class, Class::MaxFailsAmplification | Class::UpstreamDown) {
        f = f
            .with_detail("peer_failures", ep.peer_failures)
            .with_detail("disabled_lines", ep.disabled);
        if let Some(p) = &ep.peer {
            f = f.with_detail("peer", p.clone());
        }
    }
    if ep.class == Class::UpstreamDown {
        f = f.with_detail("failures_during", ep.failures_during);
    }
    if let Some(n) = ep.client_502 {
        f = f.with_detail("client_502", n);
        if !ep.counts_all_locations() {
            f = f.with_detail("locations", ep.locations.clone());
        }
    }
    f
}
