//! The resolver against a real (fake) DNS on loopback: every answer maps to its outcome.

use std::time::{Duration, Instant};

use upkeep_discovery::{Outcome, Resolver};
use upkeep_fakedns::{Mode, Transport, Zone};

use crate::support::*;

#[tokio::test]
async fn lookup_maps_each_mode_to_its_outcome() {
    let zone = Zone::new()
        .with(
            "fixed.upkeep.test",
            Mode::Fixed(vec![ip("127.0.0.2"), ip("::2")]),
            7,
        )
        .with("nx.upkeep.test", Mode::NxDomain, 1)
        .with("empty.upkeep.test", Mode::NoData, 1)
        .with("fail.upkeep.test", Mode::ServFail, 1)
        .with("no.upkeep.test", Mode::Refused, 1)
        .with("quiet.upkeep.test", Mode::Silent, 1);
    let dns = fake_dns(zone).await;
    let timeout = Duration::from_millis(400);
    let r = Resolver::with_servers(&[dns.local_addr()], timeout);

    assert_eq!(
        r.lookup("fixed.upkeep.test").await,
        Outcome::Records {
            addrs: vec![ip("127.0.0.2"), ip("::2")],
            ttl: Duration::from_secs(7)
        }
    );
    assert_eq!(r.lookup("nx.upkeep.test").await, Outcome::NxDomain);
    assert_eq!(r.lookup("unknown.upkeep.test").await, Outcome::NxDomain);
    assert_eq!(r.lookup("empty.upkeep.test").await, Outcome::NoData);
    assert_eq!(r.lookup("fail.upkeep.test").await, Outcome::ServFail);
    assert_eq!(r.lookup("no.upkeep.test").await, Outcome::Refused);
    let started = Instant::now();
    assert_eq!(r.lookup("quiet.upkeep.test").await, Outcome::Timeout);
    let took = started.elapsed();
    assert!(
        took >= timeout && took < timeout * 3,
        "silence costs the timeout, not more: {took:?}"
    );
}

#[tokio::test]
async fn no_cache_every_lookup_reaches_the_server() {
    let dns = fake_dns(Zone::new().with(NAME, Mode::Alternate(two()), 3600)).await;
    let r = Resolver::with_servers(&[dns.local_addr()], Duration::from_secs(2));
    let mut got = Vec::new();
    for _ in 0..4 {
        match r.lookup(NAME).await {
            Outcome::Records { addrs, .. } => got.extend(addrs),
            other => panic!("expected records, got {other:?}"),
        }
    }
    // A cached answer would repeat the first address for an hour.
    assert_eq!(got, vec![two()[0], two()[1], two()[0], two()[1]]);
    assert_eq!(a_queries_answered(&dns, NAME, "127.0.0.2"), 2);
}

#[tokio::test]
async fn lookup_over_tcp_works() {
    let dns = fake_dns(Zone::new().with(NAME, Mode::Fixed(two()), 5)).await;
    let r = Resolver::with_servers_tcp_only(&[dns.local_addr()], Duration::from_secs(2));
    assert_eq!(
        r.lookup(NAME).await,
        Outcome::Records {
            addrs: two(),
            ttl: Duration::from_secs(5)
        }
    );
    let log = dns.queries();
    assert!(!log.is_empty());
    assert!(
        log.iter().all(|q| q.transport == Transport::Tcp),
        "every query went over TCP: {log:?}"
    );
}

#[tokio::test]
async fn truncated_udp_answer_is_retried_over_tcp() {
    let many: Vec<_> = (1..=60u8)
        .map(|i| std::net::IpAddr::from([127, 0, 1, i]))
        .collect();
    let dns = fake_dns(Zone::new().with(NAME, Mode::Fixed(many.clone()), 5)).await;
    let r = Resolver::with_servers(&[dns.local_addr()], Duration::from_secs(2));
    match r.lookup(NAME).await {
        Outcome::Records { addrs, .. } => assert_eq!(addrs, many),
        other => panic!("expected 60 records, got {other:?}"),
    }
    let a: Vec<Transport> = dns
        .queries()
        .iter()
        .filter(|q| q.qtype == "A")
        .map(|q| q.transport)
        .collect();
    assert_eq!(a, vec![Transport::Udp, Transport::Tcp]);
}

#[tokio::test]
async fn names_with_trailing_dot_and_any_case_resolve() {
    let dns = fake_dns(Zone::new().with(NAME, Mode::Fixed(two()), 5)).await;
    let r = Resolver::with_servers(&[dns.local_addr()], Duration::from_secs(2));
    for name in ["app.upkeep.test.", "APP.Upkeep.Test"] {
        assert!(
            matches!(r.lookup(name).await, Outcome::Records { ref addrs, .. } if *addrs == two()),
            "{name}"
        );
    }
}

#[tokio::test]
async fn unreachable_server_is_a_failure_not_a_negative_answer() {
    // A bound UDP socket that never answers and a closed TCP port: nothing is learnt.
    let dns = fake_dns(Zone::new()).await;
    let addr = dns.local_addr();
    dns.shutdown().await;
    let r = Resolver::with_servers(&[addr], Duration::from_millis(300));
    let outcome = r.lookup(NAME).await;
    assert!(outcome.is_failure(), "{outcome:?}");
}
