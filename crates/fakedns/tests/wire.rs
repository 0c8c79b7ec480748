//! The fake server on the wire: raw DNS messages over real UDP and TCP on loopback.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::timeout;
use upkeep_fakedns::{FakeDns, Mode, Transport, Zone};

/// Long enough for a loopback answer on a loaded machine, short enough to keep tests quick.
const ANSWER_WAIT: Duration = Duration::from_secs(3);
/// How long silence is observed before calling it silence.
const SILENCE_WAIT: Duration = Duration::from_millis(400);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn query_bytes(name: &str, rtype: RecordType, id: u16) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = id;
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    m.to_vec().unwrap()
}

/// Sends one query; `None` when no answer came within `wait`.
async fn ask(
    server: SocketAddr,
    transport: Transport,
    name: &str,
    rtype: RecordType,
    wait: Duration,
) -> Option<Message> {
    let id = rand_id();
    let bytes = query_bytes(name, rtype, id);
    let reply = match transport {
        Transport::Udp => {
            let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            sock.send_to(&bytes, server).await.unwrap();
            let mut buf = vec![0u8; 4096];
            let (n, _) = timeout(wait, sock.recv_from(&mut buf)).await.ok()?.unwrap();
            buf.truncate(n);
            buf
        }
        Transport::Tcp => {
            let mut conn = TcpStream::connect(server).await.unwrap();
            conn.write_all(&(bytes.len() as u16).to_be_bytes())
                .await
                .unwrap();
            conn.write_all(&bytes).await.unwrap();
            let mut len = [0u8; 2];
            timeout(wait, conn.read_exact(&mut len))
                .await
                .ok()?
                .unwrap();
            let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
            conn.read_exact(&mut buf).await.unwrap();
            buf
        }
    };
    let msg = Message::from_vec(&reply).unwrap();
    assert_eq!(msg.metadata.id, id, "answer id matches the query");
    Some(msg)
}

fn rand_id() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(4242);
    NEXT.fetch_add(7, Ordering::Relaxed)
}

fn addrs_of(msg: &Message) -> Vec<IpAddr> {
    msg.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

fn has_soa(msg: &Message) -> bool {
    msg.authorities
        .iter()
        .any(|r| matches!(r.data, RData::SOA(_)))
}

async fn start(zone: Zone) -> FakeDns {
    FakeDns::start("127.0.0.1:0".parse().unwrap(), zone)
        .await
        .unwrap()
}

fn every_mode_zone() -> Zone {
    Zone::new()
        .with(
            "fixed.upkeep.test",
            Mode::Fixed(vec![ip("127.0.0.2"), ip("127.0.0.3"), ip("::2")]),
            7,
        )
        .with(
            "alt.upkeep.test",
            Mode::Alternate(vec![ip("127.0.0.2"), ip("127.0.0.3")]),
            1,
        )
        .with("nx.upkeep.test", Mode::NxDomain, 4)
        .with("empty.upkeep.test", Mode::NoData, 4)
        .with("fail.upkeep.test", Mode::ServFail, 4)
        .with("no.upkeep.test", Mode::Refused, 4)
        .with("quiet.upkeep.test", Mode::Silent, 4)
}

async fn each_mode_answers_on(transport: Transport) {
    let dns = start(every_mode_zone()).await;
    let at = dns.local_addr();
    assert_ne!(at.port(), 0);

    let m = ask(
        at,
        transport,
        "fixed.upkeep.test.",
        RecordType::A,
        ANSWER_WAIT,
    )
    .await
    .expect("fixed answers");
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.metadata.authoritative);
    assert_eq!(addrs_of(&m), vec![ip("127.0.0.2"), ip("127.0.0.3")]);
    assert!(m.answers.iter().all(|r| r.ttl == 7));

    let m = ask(
        at,
        transport,
        "fixed.upkeep.test.",
        RecordType::AAAA,
        ANSWER_WAIT,
    )
    .await
    .expect("fixed answers AAAA");
    assert_eq!(addrs_of(&m), vec![ip("::2")]);

    let m = ask(
        at,
        transport,
        "alt.upkeep.test.",
        RecordType::A,
        ANSWER_WAIT,
    )
    .await
    .expect("alternate answers");
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addrs_of(&m).len(), 1);
    // No IPv6 address configured: AAAA is NODATA, not NXDOMAIN.
    let m = ask(
        at,
        transport,
        "alt.upkeep.test.",
        RecordType::AAAA,
        ANSWER_WAIT,
    )
    .await
    .expect("alternate answers AAAA");
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty() && has_soa(&m));

    let m = ask(at, transport, "nx.upkeep.test.", RecordType::A, ANSWER_WAIT)
        .await
        .expect("nxdomain answers");
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert!(m.answers.is_empty() && has_soa(&m));

    let m = ask(
        at,
        transport,
        "empty.upkeep.test.",
        RecordType::A,
        ANSWER_WAIT,
    )
    .await
    .expect("nodata answers");
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty(), "NODATA has no answer");
    assert!(has_soa(&m), "NODATA carries an SOA for negative caching");
    let soa_ttl = m.authorities.iter().map(|r| r.ttl).next();
    assert_eq!(soa_ttl, Some(4));

    let m = ask(
        at,
        transport,
        "fail.upkeep.test.",
        RecordType::A,
        ANSWER_WAIT,
    )
    .await
    .expect("servfail answers");
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);

    let m = ask(at, transport, "no.upkeep.test.", RecordType::A, ANSWER_WAIT)
        .await
        .expect("refused answers");
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);

    let m = ask(
        at,
        transport,
        "quiet.upkeep.test.",
        RecordType::A,
        SILENCE_WAIT,
    )
    .await;
    assert!(m.is_none(), "silent mode must not answer: {m:?}");

    let m = ask(
        at,
        transport,
        "unknown.upkeep.test.",
        RecordType::A,
        ANSWER_WAIT,
    )
    .await
    .expect("unknown name answers");
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);

    let log = dns.queries();
    assert_eq!(log.len(), 10);
    assert!(log.iter().all(|q| q.transport == transport));
    dns.shutdown().await;
}

#[tokio::test]
async fn each_mode_answers_over_udp() {
    each_mode_answers_on(Transport::Udp).await;
}

#[tokio::test]
async fn each_mode_answers_over_tcp() {
    each_mode_answers_on(Transport::Tcp).await;
}

#[tokio::test]
async fn silent_mode_holds_tcp_connection_open_without_answer() {
    let dns = start(every_mode_zone()).await;
    let mut conn = TcpStream::connect(dns.local_addr()).await.unwrap();
    let bytes = query_bytes("quiet.upkeep.test.", RecordType::A, 9);
    conn.write_all(&(bytes.len() as u16).to_be_bytes())
        .await
        .unwrap();
    conn.write_all(&bytes).await.unwrap();
    let mut buf = [0u8; 2];
    // Neither data nor EOF: a read that is still pending after the wait.
    let read = timeout(SILENCE_WAIT, conn.read(&mut buf)).await;
    assert!(
        read.is_err(),
        "connection must stay open and silent: {read:?}"
    );
    let log = dns.queries();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].answer, "(silent)");
    assert_eq!(log[0].transport, Transport::Tcp);
}

#[tokio::test]
async fn alternate_rotates_one_address_per_query() {
    let dns = start(every_mode_zone()).await;
    let mut seen = Vec::new();
    for i in 0..6 {
        let transport = if i % 2 == 0 {
            Transport::Udp
        } else {
            Transport::Tcp
        };
        let m = ask(
            dns.local_addr(),
            transport,
            "alt.upkeep.test.",
            RecordType::A,
            ANSWER_WAIT,
        )
        .await
        .unwrap();
        let got = addrs_of(&m);
        assert_eq!(got.len(), 1, "one record per answer");
        seen.push(got[0]);
    }
    let a = ip("127.0.0.2");
    let b = ip("127.0.0.3");
    assert_eq!(seen, vec![a, b, a, b, a, b]);
}

#[tokio::test]
async fn names_are_case_insensitive_on_the_wire() {
    let dns = start(every_mode_zone()).await;
    let m = ask(
        dns.local_addr(),
        Transport::Udp,
        "FIXED.Upkeep.TEST.",
        RecordType::A,
        ANSWER_WAIT,
    )
    .await
    .unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addrs_of(&m).len(), 2);
    // The answer's owner name echoes the question as asked (0x20 randomisation safe).
    assert_eq!(m.answers[0].name.to_string(), "FIXED.Upkeep.TEST.");
    assert_eq!(dns.queries()[0].name, "fixed.upkeep.test");
}

#[tokio::test]
async fn run_time_switch_takes_effect_on_next_query() {
    let dns = start(every_mode_zone()).await;
    let at = dns.local_addr();
    let name = "fixed.upkeep.test.";
    let m = ask(at, Transport::Udp, name, RecordType::A, ANSWER_WAIT)
        .await
        .unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);

    dns.set_mode("Fixed.Upkeep.Test", Mode::NxDomain);
    let m = ask(at, Transport::Udp, name, RecordType::A, ANSWER_WAIT)
        .await
        .unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);

    dns.set_mode(name, Mode::Fixed(vec![ip("127.0.0.9")]));
    dns.set_ttl(name, 30);
    let m = ask(at, Transport::Tcp, name, RecordType::A, ANSWER_WAIT)
        .await
        .unwrap();
    assert_eq!(addrs_of(&m), vec![ip("127.0.0.9")]);
    assert_eq!(m.answers[0].ttl, 30);

    // A name added at run time.
    dns.set_mode("new.upkeep.test", Mode::ServFail);
    let m = ask(
        at,
        Transport::Udp,
        "new.upkeep.test.",
        RecordType::A,
        ANSWER_WAIT,
    )
    .await
    .unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
}

#[tokio::test]
async fn query_log_and_subscription_record_every_query() {
    let dns = start(every_mode_zone()).await;
    let mut events = dns.subscribe();
    let at = dns.local_addr();
    ask(
        at,
        Transport::Udp,
        "nx.upkeep.test.",
        RecordType::AAAA,
        ANSWER_WAIT,
    )
    .await
    .unwrap();
    ask(
        at,
        Transport::Tcp,
        "fixed.upkeep.test.",
        RecordType::A,
        ANSWER_WAIT,
    )
    .await
    .unwrap();
    let log = dns.queries();
    assert_eq!(log.len(), 2);
    assert_eq!(
        (
            log[0].name.as_str(),
            log[0].qtype.as_str(),
            log[0].transport,
            log[0].answer.as_str()
        ),
        ("nx.upkeep.test", "AAAA", Transport::Udp, "NXDOMAIN")
    );
    assert_eq!(
        (
            log[1].name.as_str(),
            log[1].qtype.as_str(),
            log[1].transport,
            log[1].answer.as_str()
        ),
        (
            "fixed.upkeep.test",
            "A",
            Transport::Tcp,
            "127.0.0.2,127.0.0.3"
        )
    );
    assert!(log.iter().all(|q| q.client.ip() == ip("127.0.0.1")));
    assert!(log[0].at <= log[1].at);
    let first = timeout(ANSWER_WAIT, events.recv()).await.unwrap().unwrap();
    let second = timeout(ANSWER_WAIT, events.recv()).await.unwrap().unwrap();
    assert_eq!(vec![first, second], log);
}

#[tokio::test]
async fn large_answer_is_truncated_on_udp_and_whole_on_tcp() {
    let many: Vec<IpAddr> = (1..=60u8).map(|i| IpAddr::from([127, 0, 1, i])).collect();
    let dns = start(Zone::new().with("big.upkeep.test", Mode::Fixed(many.clone()), 5)).await;
    let at = dns.local_addr();
    let m = ask(
        at,
        Transport::Udp,
        "big.upkeep.test.",
        RecordType::A,
        ANSWER_WAIT,
    )
    .await
    .unwrap();
    assert!(m.metadata.truncation, "60 A records exceed 512 bytes");
    let m = ask(
        at,
        Transport::Tcp,
        "big.upkeep.test.",
        RecordType::A,
        ANSWER_WAIT,
    )
    .await
    .unwrap();
    assert!(!m.metadata.truncation);
    assert_eq!(addrs_of(&m), many);
}

#[tokio::test]
async fn shutdown_closes_the_tcp_listener() {
    let dns = start(every_mode_zone()).await;
    let at = dns.local_addr();
    dns.shutdown().await;
    let conn = TcpStream::connect(at).await;
    assert!(conn.is_err(), "listener closed after shutdown");
}

#[tokio::test]
async fn zone_file_serves_what_it_says() {
    let zone = Zone::from_toml_str(
        r#"
[names."app.upkeep.test"]
mode = "alternate"
addrs = ["127.0.0.2", "127.0.0.3"]
ttl = 2
"#,
    )
    .unwrap();
    let dns = start(zone).await;
    let m = ask(
        dns.local_addr(),
        Transport::Udp,
        "app.upkeep.test.",
        RecordType::A,
        ANSWER_WAIT,
    )
    .await
    .unwrap();
    assert_eq!(addrs_of(&m), vec![ip("127.0.0.2")]);
    assert_eq!(m.answers[0].ttl, 2);
}
