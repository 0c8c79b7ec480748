//! Binding listen sockets: one process per address, while the `--workers` copies of one
//! process share it.
//!
//! The copies are bound with SO_REUSEPORT so the kernel spreads connections over the
//! workers. SO_REUSEPORT would also let a second `upkeep serve` (same user) join the group
//! and silently take half of the connections, so every address is first probed with a
//! socket that does not set it: that bind fails while any other socket listens there.

use std::net::SocketAddr;

use socket2::{Domain, Socket, Type};

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
/// checking that no other socket listens on it.
pub fn bind_copies(addr: SocketAddr, n: usize) -> Result<Vec<std::net::TcpListener>, BindError> {
    let io = |source| BindError::Io { addr, source };
    if addr.port() != 0 {
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
    Ok(out)
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
        let first = bind_copies("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let addr = first[0].local_addr().unwrap();
        assert_eq!(first[1].local_addr().unwrap(), addr);
        match bind_copies(addr, 2) {
            Err(BindError::InUse(a)) => assert_eq!(a, addr),
            other => panic!("a second set of copies must be refused: {other:?}"),
        }
        assert!(matches!(bind_copies(addr, 1), Err(BindError::InUse(_))));
        drop(first);
    }
}
