//! Episode verdicts: what happened, what it cost in the seeds, and what to do next.

use super::time::format_time;
use super::{Class, Episode};
use crate::finding::{Finding, Location, Severity};

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
    let (severity, problem, consequence, fix) = match ep.class {
        Class::NxdomainOutage => (
            Severity::Error,
            format!("NXDOMAIN for {host} emptied upstream \"{up}\": \"no live upstreams\" {span}."),
            "nginx deletes every peer on NXDOMAIN and answers 502 without connecting until the next successful re-query (every valid + 1 s): 6 s of NXDOMAIN with valid=5s cost a 6.0 s outage and 3,005 502s in the seed.".to_owned(),
            "# find why the name answered NXDOMAIN (a GSLB with no healthy DC?), then\n# one fixed name per DC, failover per request by retry:\nserver dc1.internal:8080 resolve max_fails=2 fail_timeout=5s;\nserver dc2.internal:8080 resolve max_fails=2 fail_timeout=5s;\nproxy_next_upstream error timeout;".to_owned(),
        ),
        Class::NxdomainNoOutage => (
            Severity::Warning,
            format!("{host} answered NXDOMAIN {span}; no \"no live upstreams\" followed, so other peers carried the traffic this time."),
            "Where every peer of an upstream comes from this one name, a single NXDOMAIN empties it: a 6.0 s outage and 3,005 502s in the seed.".to_owned(),
            "# check with: upkeep doctor nginx /etc/nginx/nginx.conf   (rule resolve-single-name)".to_owned(),
        ),
        Class::MaxFailsAmplification => (
            Severity::Error,
            format!("{} peer failure(s), then \"no live upstreams\" on \"{up}\" {span}, with no DNS error: max_fails ejected every peer for fail_timeout.", ep.peer_failures),
            "A short backend blip becomes an outage as long as fail_timeout (default 10 s): 2 s of refused connections cost a 10.4 s outage and 5,210 502s in the seed, against 1,047 502s without the amplification.".to_owned(),
            "# look for several resolve lines of one host (upkeep doctor nginx, rule resolve-duplicate-host);\n# short term, on every resolve line:\nserver app.example.com:8080 resolve max_fails=0;".to_owned(),
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
            "Timeouts, SERVFAIL and silence keep the last peers: DNS silent for 10 s cost 0 errors in the seed. Nothing was lost.".to_owned(),
            "# nothing to change in nginx; check the resolver's health".to_owned(),
        ),
        Class::KeepaliveRace => (
            Severity::Warning,
            format!("upstream {up} closed connections that nginx was reusing {span}."),
            "The backend's keep-alive timeout is shorter than nginx's upstream keepalive_timeout (default 60 s; Node closes idle sockets at 5 s), so a request written into a closing socket fails: 502s on reused connections only.".to_owned(),
            "# the side that reuses must close first; in the upstream:\nkeepalive_timeout 4s;\n# measure the backend: upkeep doctor keepalive http://BACKEND:PORT/".to_owned(),
        ),
        Class::NoLiveUpstreams => (
            Severity::Warning,
            format!("\"no live upstreams\" on \"{up}\" {span}, with no DNS error or peer failure just before it in these logs."),
            "Every request in this span got a 502 without nginx trying a peer.".to_owned(),
            "# read the lines before the first one (other logs, rotated files), and check\n# max_fails/fail_timeout and resolve lines with: upkeep doctor nginx".to_owned(),
        ),
    };
    let consequence = match ep.client_502 {
        Some(n) => format!("{consequence} Access log: {n} client-visible 502(s) in this span."),
        None => consequence,
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
    if ep.class == Class::MaxFailsAmplification {
        f = f.with_detail("peer_failures", ep.peer_failures);
    }
    if let Some(n) = ep.client_502 {
        f = f.with_detail("client_502", n);
    }
    f
}
