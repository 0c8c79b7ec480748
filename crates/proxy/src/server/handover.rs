//! The wire format of a binary upgrade: the old process sends every listening socket, each
//! named by its kind and configured address, over a Unix socket (SCM_RIGHTS); the new one
//! takes them as it binds, and answers `ready` or why not.
//!
//! Like HAProxy's `-x` (the new process asks the old one for its sockets) and Pingora's
//! `transfer_fd`, the sockets are the same kernel sockets, not new SO_REUSEPORT members: a
//! connection queued on one is accepted by whichever process accepts next, so none is
//! refused or dropped while the old process stops accepting. Unix only.

use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::bind::Socks;

/// The environment variable that tells a new process where to fetch its sockets.
pub(crate) const SOCKET_ENV: &str = "UPKEEP_UPGRADE_SOCKET";

/// The most descriptors one message may carry (Linux's SCM_MAX_FD).
pub(crate) const MAX_FDS: usize = 253;

const MAGIC: &str = "upkeep-handover 1";

/// What a handed-over socket is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One worker's copy of a downstream listener.
    Listener,
    /// The claim on a downstream listener's address.
    Lock,
    /// The admin control listener.
    AdminControl,
    /// The admin probe listener.
    AdminProbes,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Listener => "listener",
            Kind::Lock => "lock",
            Kind::AdminControl => "admin",
            Kind::AdminProbes => "probes",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        [
            Kind::Listener,
            Kind::Lock,
            Kind::AdminControl,
            Kind::AdminProbes,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// One socket to hand over: its kind, its address as configured (port 0 included), and a
/// duplicate of its descriptor.
pub(crate) struct Handed {
    pub(crate) kind: Kind,
    pub(crate) addr: SocketAddr,
    pub(crate) fd: OwnedFd,
}

/// Why the sockets could not be handed over or received.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// The socket between the processes failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// More sockets than one message can carry.
    #[error("{0} sockets to hand over, at most {MAX_FDS} can be")]
    TooMany(usize),
    /// The other side does not speak this format.
    #[error("malformed handover message: {0}")]
    Malformed(String),
}

/// Sends every socket in one message: a length-prefixed text header naming each descriptor,
/// with the descriptors attached.
pub(crate) fn send(stream: &UnixStream, socks: &[Handed]) -> Result<(), HandoverError> {
    if socks.len() > MAX_FDS {
        return Err(HandoverError::TooMany(socks.len()));
    }
    let mut header = format!("{MAGIC}\n");
    for s in socks {
        header.push_str(&format!("{} {}\n", s.kind.as_str(), s.addr));
    }
    let mut data = (header.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(header.as_bytes());
    let fds: Vec<BorrowedFd<'_>> = socks.iter().map(|s| s.fd.as_fd()).collect();
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(HandoverError::TooMany(fds.len()));
    }
    let sent = sendmsg(
        stream,
        &[IoSlice::new(&data)],
        &mut control,
        SendFlags::empty(),
    )
    .map_err(std::io::Error::from)?;
    // The descriptors travelled with the first byte; the rest of the header is plain data.
    std::io::Write::write_all(&mut &*stream, &data[sent..])?;
    Ok(())
}

/// Receives the sockets sent by `send`.
pub(crate) fn receive(stream: &UnixStream) -> Result<Inherited, HandoverError> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = msg {
            fds.extend(it);
        }
    }
    let mut data = buf[..got.bytes].to_vec();
    while data.len() < 4 {
        read_more(stream, &mut data)?;
    }
    let len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
    if len > buf.len() {
        return Err(HandoverError::Malformed(format!("header of {len} bytes")));
    }
    while data.len() < 4 + len {
        read_more(stream, &mut data)?;
    }
    let header = std::str::from_utf8(&data[4..4 + len])
        .map_err(|_| HandoverError::Malformed("header is not UTF-8".into()))?;
    let mut lines = header.lines();
    if lines.next() != Some(MAGIC) {
        return Err(HandoverError::Malformed("unknown format".into()));
    }
    let names: Vec<(Kind, SocketAddr)> = lines
        .map(|l| {
            let (k, a) = l
                .split_once(' ')
                .ok_or_else(|| HandoverError::Malformed(l.into()))?;
            let kind = Kind::parse(k).ok_or_else(|| HandoverError::Malformed(l.into()))?;
            let addr = a.parse().map_err(|_| HandoverError::Malformed(l.into()))?;
            Ok((kind, addr))
        })
        .collect::<Result<_, HandoverError>>()?;
    if names.len() != fds.len() {
        return Err(HandoverError::Malformed(format!(
            "{} sockets named, {} received",
            names.len(),
            fds.len()
        )));
    }
    let list = names
        .into_iter()
        .zip(fds)
        .map(|((kind, addr), fd)| Handed { kind, addr, fd })
        .collect();
    Ok(Inherited {
        list: Mutex::new(list),
    })
}

fn read_more(stream: &UnixStream, data: &mut Vec<u8>) -> Result<(), HandoverError> {
    let mut chunk = [0u8; 4096];
    let n = (&mut &*stream).read(&mut chunk)?;
    if n == 0 {
        return Err(HandoverError::Malformed("message cut short".into()));
    }
    data.extend_from_slice(&chunk[..n]);
    Ok(())
}

/// Sockets received from the old process; each is taken by the listener it belongs to, and
/// what no listener of the new config takes is closed.
#[derive(Default)]
pub(crate) struct Inherited {
    list: Mutex<Vec<Handed>>,
}

impl Inherited {
    /// Takes the sockets of `kind` whose configured address is `addr`.
    pub(crate) fn take(&self, kind: Kind, addr: SocketAddr) -> Vec<OwnedFd> {
        let mut list = self.list.lock().unwrap();
        let (mine, rest): (Vec<Handed>, Vec<Handed>) = std::mem::take(&mut *list)
            .into_iter()
            .partition(|h| h.kind == kind && h.addr == addr);
        *list = rest;
        mine.into_iter().map(|h| h.fd).collect()
    }

    /// Takes a downstream listener's copies and its claim, when they were handed over.
    pub(crate) fn take_listener(&self, addr: SocketAddr) -> Option<std::io::Result<Socks>> {
        let copies = self.take(Kind::Listener, addr);
        if copies.is_empty() {
            return None;
        }
        let lock = self.take(Kind::Lock, addr).into_iter().next();
        let copies = copies
            .into_iter()
            .map(|fd| {
                let l = std::net::TcpListener::from(fd);
                l.set_nonblocking(true)?;
                Ok(l)
            })
            .collect::<std::io::Result<Vec<_>>>();
        Some(copies.map(|copies| Socks { copies, lock }))
    }

    /// Takes an admin listener.
    pub(crate) fn take_admin(
        &self,
        kind: Kind,
        addr: SocketAddr,
    ) -> Option<std::io::Result<std::net::TcpListener>> {
        let fd = self.take(kind, addr).into_iter().next()?;
        let l = std::net::TcpListener::from(fd);
        Some(l.set_nonblocking(true).map(|()| l))
    }

    /// Addresses handed over that the new config does not listen on any more.
    pub(crate) fn unused(&self) -> Vec<String> {
        let list = self.list.lock().unwrap();
        let mut v: Vec<String> = list
            .iter()
            .filter(|h| h.kind != Kind::Lock)
            .map(|h| format!("{} {}", h.kind.as_str(), h.addr))
            .collect();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_cross_a_unix_socket_and_keep_their_connections() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let configured: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        send(
            &a,
            &[Handed {
                kind: Kind::Listener,
                addr: configured,
                fd: l.try_clone().unwrap().into(),
            }],
        )
        .unwrap();
        // A connection queued before the old side lets go is accepted on the other side.
        let client = std::net::TcpStream::connect(addr).unwrap();
        drop(l);
        let got = receive(&b).unwrap();
        assert!(got.take_listener("127.0.0.1:1".parse().unwrap()).is_none());
        let socks = got.take_listener(configured).unwrap().unwrap();
        assert_eq!(socks.copies.len(), 1);
        socks.copies[0].set_nonblocking(false).unwrap();
        let (_, peer) = socks.copies[0].accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        assert!(got.unused().is_empty());
    }
}
