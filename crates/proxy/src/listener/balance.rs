//! Evens out the kernel's spread of new downstream connections over the serving threads.
//!
//! Each worker accepts from its own SO_REUSEPORT copy of a listener, and the kernel picks the
//! copy by a hash of the connection's addresses, blind to how busy each worker is: 64
//! connections over two workers often split 36/28 or worse, and two connections land on the
//! same worker half of the time. Where a few long-lived connections carry the load (HTTP/2
//! and gRPC clients, a load balancer's pooled connections), that leaves threads idle while
//! one is saturated. A worker that accepts a connection while it serves more than the least
//! busy worker (beyond a tolerance that grows with the count) hands it, before reading a byte
//! of it, to that worker, as Envoy's exact connection balancer does. The counts are per
//! worker and touched once per connection, never per request.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::limit::ConnSlot;
use super::Signals;
use crate::config::ListenerConfig;

/// A connection one worker accepted and hands to another, with what serving it needs.
pub struct Moved {
    /// The accepted socket, taken off the accepting worker's runtime (non-blocking).
    pub(super) stream: std::net::TcpStream,
    pub(super) remote: SocketAddr,
    pub(super) cfg: Arc<ListenerConfig>,
    pub(super) tls: Option<tokio_rustls::TlsAcceptor>,
    pub(super) signals: Signals,
    pub(super) slot: ConnSlot,
    pub(super) on: OnWorker,
}

/// Hands a connection to one worker; gives it back when that worker is gone.
pub type Deliver = Box<dyn Fn(Moved) -> Result<(), Moved> + Send + Sync>;

/// One open-connection count per serving thread, and a way to reach each thread.
pub struct Balance {
    /// Connections each worker serves (index: worker id - 1): the gauges of
    /// `upkeep_worker_connections_open`, written once per connection.
    open: Vec<Gauge>,
    deliver: Vec<Deliver>,
    /// `upkeep_worker_connections_moved_total`.
    moved: Counter,
}

/// A connection counted against one worker until dropped.
pub struct OnWorker {
    balance: Arc<Balance>,
    index: usize,
}

impl Drop for OnWorker {
    fn drop(&mut self) {
        self.balance.open[self.index].dec();
    }
}

/// How far the busiest worker may run ahead of the least busy before a connection is moved:
/// one connection in `TOLERANCE` of the least busy one's count (none below `TOLERANCE`
/// connections, where one connection more is a large share of a thread's load: two HTTP/2
/// clients are always served by two threads). Moving costs the connection a hand-over between
/// threads (two `epoll_ctl` and a wake-up), so among many connections a split off by a few
/// is left alone.
const TOLERANCE: i64 = 8;

impl Balance {
    /// A balance over the workers `deliver` reaches (worker id `i + 1` through `deliver[i]`),
    /// counting in `open` (one gauge per worker, same order) and `moved`.
    pub fn new(deliver: Vec<Deliver>, open: Vec<Gauge>, moved: Counter) -> Arc<Self> {
        assert_eq!(deliver.len(), open.len(), "one gauge per worker");
        Arc::new(Self {
            open,
            deliver,
            moved,
        })
    }

    /// Counts a connection against worker `id` (1-based; an id out of range counts against
    /// the nearest worker).
    pub fn open_on(self: &Arc<Self>, id: usize) -> OnWorker {
        let index = id.saturating_sub(1).min(self.open.len() - 1);
        self.open[index].inc();
        OnWorker {
            balance: self.clone(),
            index,
        }
    }

    /// The worker (1-based id) that should serve a connection worker `me` just accepted:
    /// `me` itself unless another serves fewer connections, by more than the tolerance.
    pub fn pick(&self, me: usize) -> usize {
        let Some(mine) = me.checked_sub(1).and_then(|i| self.open.get(i)) else {
            return me;
        };
        let mine = mine.get();
        let (mut best, mut least) = (me, mine);
        for (i, n) in self.open.iter().enumerate() {
            let n = n.get();
            if n < least {
                (best, least) = (i + 1, n);
            }
        }
        if mine > least + least / TOLERANCE {
            best
        } else {
            me
        }
    }

    /// Hands `m` to worker `to` (1-based); gives it back when that worker no longer takes
    /// connections (shutting down).
    pub fn deliver(&self, to: usize, m: Moved) -> Result<(), Moved> {
        match to.checked_sub(1).and_then(|i| self.deliver.get(i)) {
            Some(d) => d(m).inspect(|()| {
                self.moved.inc();
            }),
            None => Err(m),
        }
    }

    /// Open connections per worker (index: worker id - 1).
    pub fn open_counts(&self) -> Vec<i64> {
        self.open.iter().map(Gauge::get).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balance(workers: usize) -> Arc<Balance> {
        Balance::new(
            (0..workers).map(|_| Box::new(Err) as Deliver).collect(),
            (0..workers).map(|_| Gauge::default()).collect(),
            Counter::default(),
        )
    }

    #[test]
    fn below_eight_connections_the_least_busy_worker_gets_the_next_one() {
        let b = balance(3);
        assert_eq!(b.pick(1), 1, "all even: kept where accepted");
        let _a = b.open_on(1);
        assert_eq!(b.pick(1), 2, "one ahead of an idle worker");
        let _b = b.open_on(2);
        assert_eq!(b.pick(2), 3);
        let _c = b.open_on(3);
        assert_eq!(b.pick(3), 3);
        let held: Vec<_> = (0..3).map(|_| b.open_on(1)).collect();
        assert_eq!(b.open_counts(), vec![4, 1, 1]);
        assert_eq!(b.pick(1), 2, "the first of the least busy");
        drop(held);
        assert_eq!(
            b.open_counts(),
            vec![1, 1, 1],
            "a closed connection is no longer counted"
        );
        assert_eq!(b.pick(1), 1);
    }

    #[test]
    fn among_many_connections_a_worker_may_run_one_in_eight_ahead() {
        let b = balance(2);
        let _one: Vec<_> = (0..18).map(|_| b.open_on(1)).collect();
        let _two: Vec<_> = (0..16).map(|_| b.open_on(2)).collect();
        assert_eq!(b.pick(1), 1, "18 against 16 is within 16 / 8");
        let _more = b.open_on(1);
        assert_eq!(b.pick(1), 2, "19 against 16 is not");
        assert_eq!(b.pick(2), 2);
    }

    #[test]
    fn a_thread_that_is_not_a_known_worker_serves_what_it_accepted() {
        let b = balance(2);
        let _busy = (b.open_on(1), b.open_on(1), b.open_on(1));
        assert_eq!(b.pick(0), 0, "not a worker thread");
        assert_eq!(b.pick(7), 7, "an id past the workers");
    }
}
