//! The running server: sockets, shared state, the query log.

mod answer;
mod handler;

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use hickory_server::Server;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{broadcast, oneshot};
use tokio::task::JoinHandle;

use crate::zone::{normalize, Entry, Mode, Zone, DEFAULT_TTL};
use answer::{Family, Reply, Slot};

/// How long an idle TCP connection stays open. Long, so that silent mode can hold a TCP
/// client for the whole of its own timeout.
const TCP_IDLE: Duration = Duration::from_secs(60);
/// Responses buffered per TCP connection (the value hickory's own tests use).
const TCP_RESPONSE_BUFFER: usize = 32;
/// Query records kept for subscribers that fall behind.
const EVENT_BUFFER: usize = 1024;
/// Attempts to find a port free for both UDP and TCP when asked for port 0.
const BIND_ATTEMPTS: usize = 32;

/// The transport a query arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// UDP datagram.
    Udp,
    /// TCP connection (length-prefixed messages).
    Tcp,
}

impl Transport {
    /// `"udp"` or `"tcp"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}

/// One query the server received and what it answered.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct QueryRecord {
    /// When the query arrived.
    pub at: SystemTime,
    /// Queried name, lower case, without trailing dot.
    pub name: String,
    /// Query type as text: `"A"`, `"AAAA"`, `"SOA"`, ...
    pub qtype: String,
    /// Address of the client.
    pub client: SocketAddr,
    /// Transport of the query.
    pub transport: Transport,
    /// The answer: comma-separated addresses, `"NXDOMAIN"`, `"NODATA"`, `"SERVFAIL"`,
    /// `"REFUSED"`, `"(silent)"` or `"FORMERR"`.
    pub answer: String,
}

/// State shared between the handle and the request handler.
struct Shared {
    names: Mutex<BTreeMap<String, Slot>>,
    log: Mutex<Vec<QueryRecord>>,
    events: broadcast::Sender<QueryRecord>,
}

impl Shared {
    /// Picks the reply for one query and records it.
    fn answer(
        &self,
        name: &str,
        family: Family,
        qtype: String,
        client: SocketAddr,
        transport: Transport,
    ) -> (Reply, u32) {
        let (reply, ttl) = match lock(&self.names).get_mut(name) {
            Some(slot) => slot.answer(family),
            None => answer::unknown_name(),
        };
        self.record(QueryRecord {
            at: SystemTime::now(),
            name: name.to_owned(),
            qtype,
            client,
            transport,
            answer: reply.describe(),
        });
        (reply, ttl)
    }

    fn record(&self, record: QueryRecord) {
        lock(&self.log).push(record.clone());
        // No subscriber is not an error.
        let _ = self.events.send(record);
    }
}

/// A poisoned lock only means another thread panicked mid-update of plain data; the
/// data is still usable, and a test server must not cascade one panic into all.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running fake DNS server; dropping it or calling [`FakeDns::shutdown`] stops it.
pub struct FakeDns {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl FakeDns {
    /// Starts serving `zone` on `addr` over UDP and TCP (same port; port 0 picks one).
    pub async fn start(addr: SocketAddr, zone: Zone) -> io::Result<FakeDns> {
        let (udp, tcp) = bind_pair(addr).await?;
        let local_addr = udp.local_addr()?;
        let names = zone
            .into_entries()
            .into_iter()
            .map(|(name, entry)| (name, Slot::new(entry)))
            .collect();
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let shared = Arc::new(Shared {
            names: Mutex::new(names),
            log: Mutex::new(Vec::new()),
            events,
        });
        let mut server = Server::new(handler::Handler::new(shared.clone()));
        server.register_socket(udp);
        server.register_listener(tcp, TCP_IDLE, TCP_RESPONSE_BUFFER);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            // Resolves on an explicit stop and when the handle is dropped.
            let _ = stopped.await;
            if let Err(error) = server.shutdown_gracefully().await {
                tracing::warn!(%error, "fake DNS server stopped with an error");
            }
        });
        tracing::debug!(dns.listen = %local_addr, "fake DNS server started");
        Ok(FakeDns {
            local_addr,
            shared,
            stop,
            task,
        })
    }

    /// The address served, the same for UDP and TCP.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Switches `name` to `mode` from the next query on (adds the name if needed).
    pub fn set_mode(&self, name: &str, mode: Mode) {
        let mut names = lock(&self.shared.names);
        match names.get_mut(&normalize(name)) {
            Some(slot) => slot.entry.mode = mode,
            None => {
                names.insert(
                    normalize(name),
                    Slot::new(Entry {
                        mode,
                        ttl: DEFAULT_TTL,
                    }),
                );
            }
        }
    }

    /// Sets the TTL of `name` from the next query on; an unknown name is added as NXDOMAIN,
    /// which answers the same as before but remembers the TTL for a later `set_mode`.
    pub fn set_ttl(&self, name: &str, ttl: u32) {
        let mut names = lock(&self.shared.names);
        match names.get_mut(&normalize(name)) {
            Some(slot) => slot.entry.ttl = ttl,
            None => {
                names.insert(
                    normalize(name),
                    Slot::new(Entry {
                        mode: Mode::NxDomain,
                        ttl,
                    }),
                );
            }
        }
    }

    /// The current mode and TTL of `name`, if it is in the zone.
    pub fn entry(&self, name: &str) -> Option<Entry> {
        lock(&self.shared.names)
            .get(&normalize(name))
            .map(|slot| slot.entry.clone())
    }

    /// Every query received so far, oldest first.
    pub fn queries(&self) -> Vec<QueryRecord> {
        lock(&self.shared.log).clone()
    }

    /// A stream of queries from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<QueryRecord> {
        self.shared.events.subscribe()
    }

    /// Stops serving and waits until the sockets are closed.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

impl std::fmt::Debug for FakeDns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeDns")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

/// Binds UDP and TCP on the same port. With port 0 the UDP port is chosen first and TCP
/// tries the same number; when that is taken for TCP, another pair is tried.
async fn bind_pair(addr: SocketAddr) -> io::Result<(UdpSocket, TcpListener)> {
    if addr.port() != 0 {
        let udp = UdpSocket::bind(addr).await?;
        let tcp = TcpListener::bind(addr).await?;
        return Ok((udp, tcp));
    }
    let mut last = None;
    for _ in 0..BIND_ATTEMPTS {
        let udp = UdpSocket::bind(addr).await?;
        match TcpListener::bind(udp.local_addr()?).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrInUse)))
}
