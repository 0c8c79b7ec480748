//! Binding listen sockets: one process per address, while the `--workers` copies of one
//! process share it.
//!
//! The copies are bound with SO_REUSEPORT so the kernel spreads connections over the
//! workers. SO_REUSEPORT would also let a second `upkeep serve` (same user) join the group
//! and silently take half of the connections, so every address is first probed with a
//! socket that does not set it: that bind fails while any other socket listens there.
//!
//! That probe alone leaves a window: two processes that probe at the same instant both see
//! a free address, then both join the SO_REUSEPORT group. So an address is first claimed
//! with a lock that only one process can hold: on Linux a Unix socket bound to an abstract
//! name derived from the address (the kernel releases it when the process exits, however it
//! exits; a binary upgrade hands it over with the listening sockets).

use std::net::SocketAddr;
use std::os::fd::OwnedFd;

use socket2::{Domain, Socket, Type};

/// The sockets of one listen address: one per worker, and the claim on the address.
#[derive(Debug)]
pub(crate) struct Socks {
    /// The listening sockets (SO_REUSEPORT copies of one address).
    pub(crate) copies: Vec<std::net::TcpListener>,
    /// The lock that claims the address for this process (none for port 0, which the
    /// kernel gives to one socket only, and off Linux).
    pub(crate) lock: Option<OwnedFd>,
}

/// Why an address could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Another process (or another listener of this config) already listens there.
    #[error("address in use: {0}")]
    InUse(SocketAddr),
    /// Any other failure.
    #[error("cannot listen on {addr}: {source}")]
    Io {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Binds `n` listening sockets to `addr` (the first picks the port when it is 0), after
/// claiming it and checking that no other socket listens on it.
pub(crate) fn bind_copies(addr: SocketAddr, n: usize) -> Result<Socks, BindError> {
    let io = |source| BindError::Io { addr, source };
    let mut lock = None;
    if addr.port() != 0 {
        lock = claim(addr)?;
        probe(addr)?;
    }
    let mut at = addr;
    let mut out = Vec::with_capacity(n);
    for i in 0..n.max(1) {
        let s = socket(at, n > 1).map_err(io)?;
        if let Err(e) = s.bind(&at.into()) {
            return Err(in_use_or(addr, e));
        }
        s.listen(1024).map_err(io)?;
        if i == 0 {
            at = s.local_addr().map_err(io)?.as_socket().unwrap_or(at);
        }
        out.push(s.into());
    }
    Ok(Socks { copies: out, lock })
}

/// Claims `addr` for this process: exactly one of several processes started at the same
/// instant gets it.
#[cfg(target_os = "linux")]
fn claim(addr: SocketAddr) -> Result<Option<OwnedFd>, BindError> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("upkeep-listen/{addr}");
    let io = |source| BindError::Io { addr, source };
    let lock_addr =
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).map_err(io)?;
    match std::os::unix::net::UnixDatagram::bind_addr(&lock_addr) {
        Ok(s) => Ok(Some(s.into())),
        Err(e) => Err(in_use_or(addr, e)),
    }
}

/// Off Linux there are no abstract names: the probe alone guards the address.
#[cfg(not(target_os = "linux"))]
fn claim(_addr: SocketAddr) -> Result<Option<OwnedFd>, BindError> {
    Ok(None)
}

fn socket(addr: SocketAddr, reuse_port: bool) -> std::io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Binds (without listening) a socket that does not set SO_REUSEPORT: it fails when any
/// socket, ours or another process's, is bound there and listening.
fn probe(addr: SocketAddr) -> Result<(), BindError> {
    let s = socket(addr, false).map_err(|source| BindError::Io { addr, source })?;
    s.bind(&addr.into()).map_err(|e| in_use_or(addr, e))
}

fn in_use_or(addr: SocketAddr, e: std::io::Error) -> BindError {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        BindError::InUse(addr)
    } else {
        BindError::Io { addr, source: e }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_share_an_address_that_nobody_else_can_take() {
        let first = bind_copies("127.0.0.1:0".parse().unwrap(), 2)
            .unwrap()
            .copies;
        let addr = first[0].local_addr().unwrap();
        assert_eq!(first[1].local_addr().unwrap(), addr);
        match bind_copies(addr, 2) {
            Err(BindError::InUse(a)) => assert_eq!(a, addr),
            other => panic!("a second set of copies must be refused: {other:?}"),
        }
        assert!(matches!(bind_copies(addr, 1), Err(BindError::InUse(_))));
        drop(first);
    }

    /// Why the claim exists: two starts that both probe before either listens both see a
    /// free address, and both join the SO_REUSEPORT group.
    #[test]
    fn the_probe_alone_lets_two_interleaved_starts_share_an_address() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        probe(addr).unwrap();
        probe(addr).unwrap();
        let listen = || {
            let s = socket(addr, true).unwrap();
            s.bind(&addr.into()).unwrap();
            s.listen(16).unwrap();
            s
        };
        let (_a, _b) = (listen(), listen());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_claimed_address_is_refused_before_anything_listens_there() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        // The claim alone (nothing bound or listening yet) refuses a second process.
        let held = claim(addr).unwrap().expect("a claim on Linux");
        assert!(matches!(bind_copies(addr, 2), Err(BindError::InUse(a)) if a == addr));
        drop(held);
        let socks = bind_copies(addr, 2).unwrap();
        assert_eq!(socks.copies.len(), 2);
        assert!(socks.lock.is_some());
    }
}
