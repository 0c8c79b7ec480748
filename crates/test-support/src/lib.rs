//! Helpers for upkeep's tests: loopback backends on port 0 that record what they saw,
//! raw-socket clients, and trace setup.
#![forbid(unsafe_code)]

mod backend;
mod client;
pub mod load;

pub use backend::{KeepAlive, Seen, TestBackend};
pub use client::{answers_ok, get, get_counting, raw_exchange, send, try_get, try_send, Reply};
pub use upkeep_fakedns as fakedns;

/// Installs a test-friendly tracing subscriber once (RUST_LOG decides the level).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Resident set size of this process in bytes (Linux).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// A loopback port that was free a moment ago (for processes that need an address up front).
pub fn free_port() -> u16 {
    let [p] = free_ports();
    p
}

/// `N` distinct loopback ports that were free a moment ago: all bound at once, then released
/// (two [`free_port`] calls in a row can return the same port).
///
/// Picked at random below the kernel's ephemeral range when it leaves room for them, not
/// with port 0. A port the kernel hands out for port 0 comes from that range, which every
/// test's own listeners on port 0 (and the source ports of its connections) draw from too,
/// and it hands a released port out again readily: a parallel test could listen on the port
/// before the process it was picked for binds it, and that process's readiness wait then
/// reached the other test's server.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let mut held: Vec<std::net::TcpListener> = Vec::with_capacity(N);
    if let Some(end) = ephemeral_start().filter(|&p| p >= PICKED_FROM + 1_000) {
        let span = u64::from(end - PICKED_FROM);
        for _ in 0..64 * N {
            if held.len() == N {
                break;
            }
            let port = PICKED_FROM + (random() % span) as u16;
            // A port in use (here, by another test, or by anything on the machine) fails to
            // bind and is passed over.
            if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                held.push(l);
            }
        }
    }
    while held.len() < N {
        held.push(std::net::TcpListener::bind("127.0.0.1:0").expect("bind"));
    }
    std::array::from_fn(|i| held[i].local_addr().expect("addr").port())
}

/// The lowest port [`free_ports`] picks: above the registered ports most services use.
const PICKED_FROM: u16 = 10_000;

/// The first port of the kernel's ephemeral range (Linux), if it can be read.
fn ephemeral_start() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

/// A number that differs from call to call and from process to process (no crate needed
/// for a port pick: std's hasher is keyed at random per process, and a counter moves it on).
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.finish()
}

/// A loopback address that refuses every connection for as long as this value lives: a
/// socket bound to it that never listens, so a SYN is answered with a reset and no other
/// test can take the port (a port from [`free_port`] is free again at once, and a parallel
/// test that happens to listen on it turns "refused" into a hang).
pub struct Refusing {
    /// The address.
    pub addr: std::net::SocketAddr,
    _bound: socket2::Socket,
}

/// Opens a refusing address on 127.0.0.1.
pub fn refusing() -> Refusing {
    let (s, addr) = bound_loopback();
    Refusing { addr, _bound: s }
}

/// A TCP socket bound to a free port on 127.0.0.1, not listening yet, and its address.
fn bound_loopback() -> (socket2::Socket, std::net::SocketAddr) {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    s.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind");
    let addr = s.local_addr().unwrap().as_socket().unwrap();
    (s, addr)
}

/// A loopback address that accepts no connection: a listener that never accepts, its
/// backlog filled, so further SYNs go unanswered and connects time out (a blackholed peer).
pub struct Blackhole {
    /// The address.
    pub addr: std::net::SocketAddr,
    _listener: socket2::Socket,
    _fill: Vec<std::net::TcpStream>,
}

/// Opens a blackholed address on 127.0.0.1.
pub fn blackhole() -> Blackhole {
    let (s, addr) = bound_loopback();
    s.listen(0).expect("listen");
    let mut fill = Vec::new();
    for _ in 0..16 {
        match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200)) {
            Ok(c) => fill.push(c),
            Err(_) => break,
        }
    }
    Blackhole {
        addr,
        _listener: s,
        _fill: fill,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refusing_address_resets_connects_and_keeps_its_port() {
        let peer = super::refusing();
        let err = std::net::TcpStream::connect(peer.addr).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(std::net::TcpListener::bind(peer.addr).is_err());
    }

    #[test]
    fn picked_ports_are_distinct_and_below_the_ephemeral_range() {
        let ports = super::free_ports::<64>();
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        let start = super::ephemeral_start().expect("Linux names its ephemeral range");
        if start >= super::PICKED_FROM + 1_000 {
            let outside: Vec<u16> = ports
                .iter()
                .copied()
                .filter(|p| !(super::PICKED_FROM..start).contains(p))
                .collect();
            assert!(
                outside.is_empty(),
                "picked from the ephemeral range: {outside:?}"
            );
        }
        // Picked at random, not in a run.
        let again = super::free_ports::<64>();
        assert_ne!(ports, again);
    }
}
