//! The byte stream between an upgraded client connection and its upstream connection: both
//! directions copied as they come, counted, closed when both sides have closed, when neither
//! carried a byte for `upgrade_idle_timeout`, or `shutdown_timeout` after shutdown began.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::body::OnDone;
use crate::error::{BoxError, Cut};
use crate::metrics::{GaugeGuard, Metrics};
use crate::pool::Conn;

/// Time the two sides have to complete their handover once the `101` is out.
const HANDOVER: Duration = Duration::from_secs(10);
/// How long before `shutdown_timeout` ends an open tunnel is closed, so that its access-log
/// line is written before the process exits.
const SHUTDOWN_MARGIN: Duration = Duration::from_millis(100);

/// Where the client's side of a tunnel comes from: hyper's HTTP/1 connection after the
/// `101`, or an HTTP/2 stream of upkeep's server after the `200` (RFC 8441).
pub(crate) enum Downstream {
    /// hyper hands the connection over.
    Hyper(OnUpgrade),
    /// The stream's task hands the stream over.
    H2(crate::h2server::H2Pending),
}

/// The client's side, handed over.
enum DownIo {
    Hyper(Upgraded),
    H2(crate::h2server::H2Upgraded),
}

/// An upgraded connection waiting to run.
pub struct Tunnel {
    downstream: Downstream,
    upstream: OnUpgrade,
    /// Holds the upstream connection's place under `max_connections_per_peer`.
    _conn: Conn,
    idle: Duration,
    shutdown_timeout: Duration,
    metrics: Arc<Metrics>,
    bytes_in: Arc<AtomicU64>,
    h2: bool,
    closing: Option<watch::Receiver<bool>>,
    done: Option<Box<dyn OnDone>>,
}

/// How a tunnel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Closed,
    Idle,
    Shutdown,
    Error,
}

impl End {
    fn as_str(self) -> &'static str {
        match self {
            End::Closed => "closed",
            End::Idle => "idle_timeout",
            End::Shutdown => "shutdown",
            End::Error => "error",
        }
    }
}

impl Tunnel {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        downstream: Downstream,
        upstream: OnUpgrade,
        conn: Conn,
        idle: Duration,
        shutdown_timeout: Duration,
        metrics: Arc<Metrics>,
        bytes_in: Arc<AtomicU64>,
        h2: bool,
    ) -> Self {
        Self {
            downstream,
            upstream,
            _conn: conn,
            idle,
            shutdown_timeout,
            metrics,
            bytes_in,
            h2,
            closing: None,
            done: None,
        }
    }

    pub(super) fn set_done(&mut self, done: Box<dyn OnDone>) {
        self.done = Some(done);
    }

    pub(super) fn watch_shutdown(&mut self, closing: watch::Receiver<bool>) {
        self.closing = Some(closing);
    }

    pub(super) fn is_h2(&self) -> bool {
        self.h2
    }

    /// Runs the tunnel to its end, then writes the request's log line with the bytes carried.
    pub async fn run(mut self) {
        let _open = GaugeGuard::new(&self.metrics.upgraded.open);
        let bytes_out = AtomicU64::new(0);
        let handover = async {
            let down = match &mut self.downstream {
                Downstream::Hyper(on) => DownIo::Hyper(on.await?),
                Downstream::H2(pending) => DownIo::H2(pending.upgraded().await?),
            };
            let up = (&mut self.upstream).await?;
            Ok::<_, BoxError>((down, up))
        };
        let end = match tokio::time::timeout(HANDOVER, handover).await {
            Ok(Ok((DownIo::Hyper(down), up))) => {
                self.carry(TokioIo::new(down), up, &bytes_out).await
            }
            Ok(Ok((DownIo::H2(down), up))) => self.carry(down, up, &bytes_out).await,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "upgrade: handover failed");
                End::Error
            }
            Err(_) => End::Error,
        };
        self.metrics.upgraded.ended(end.as_str());
        if end == End::Idle {
            self.metrics
                .timeouts
                .get_or_create(&crate::metrics::TimeoutLabel {
                    timeout: "upgrade_idle",
                })
                .inc();
        }
        tracing::debug!(
            end = end.as_str(),
            bytes_in = self.bytes_in.load(Ordering::Relaxed),
            bytes_out = bytes_out.load(Ordering::Relaxed),
            "upgraded connection ended"
        );
        if let Some(done) = self.done.take() {
            let cut = match end {
                End::Idle => Some(Cut::UpgradeIdleTimeout),
                End::Shutdown => Some(Cut::Shutdown),
                _ => None,
            };
            done.done(bytes_out.load(Ordering::Relaxed), end == End::Closed, cut);
        }
    }

    async fn carry<D>(&mut self, down: D, up: Upgraded, bytes_out: &AtomicU64) -> End
    where
        D: AsyncRead + AsyncWrite,
    {
        let epoch = Instant::now();
        let last = AtomicU64::new(0);
        let (mut dr, mut dw) = tokio::io::split(down);
        let (mut ur, mut uw) = tokio::io::split(TokioIo::new(up));
        let metrics_in = self.metrics.upgraded.bytes_of("in");
        let metrics_out = self.metrics.upgraded.bytes_of("out");
        let to_upstream = pump(&mut dr, &mut uw, &self.bytes_in, &metrics_in, &last, epoch);
        let to_client = pump(&mut ur, &mut dw, bytes_out, &metrics_out, &last, epoch);
        let both = async { tokio::try_join!(to_upstream, to_client) };
        tokio::pin!(both);
        let mut closing = self.closing.clone();
        let grace = self.shutdown_timeout.saturating_sub(SHUTDOWN_MARGIN);
        let shutdown = async move {
            let began = match closing.as_mut() {
                Some(c) => c.wait_for(|s| *s).await.is_ok(),
                None => false,
            };
            if began {
                tokio::time::sleep(grace).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::pin!(shutdown);
        loop {
            let quiet_since = epoch + Duration::from_millis(last.load(Ordering::Relaxed));
            tokio::select! {
                r = &mut both => {
                    return match r {
                        Ok(_) => End::Closed,
                        Err(e) => {
                            tracing::debug!(error = %e, "upgraded connection failed");
                            End::Error
                        }
                    };
                }
                _ = tokio::time::sleep_until(quiet_since + self.idle) => {
                    let quiet_since = epoch + Duration::from_millis(last.load(Ordering::Relaxed));
                    if Instant::now() >= quiet_since + self.idle {
                        return End::Idle;
                    }
                }
                _ = &mut shutdown => return End::Shutdown,
            }
        }
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        // Never run (the 101 could not be written): the request still gets its log line.
        if let Some(done) = self.done.take() {
            done.done(0, false, None);
        }
    }
}

/// Copies `from` to `to` until `from` ends, then half-closes `to`. Every chunk counts in
/// `bytes` and `metric` and moves the idle clock (`last`, milliseconds since `epoch`).
async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    bytes: &AtomicU64,
    metric: &Counter,
    last: &AtomicU64,
    epoch: Instant,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            // The other side may still talk: pass the half-close on and let it finish.
            let _ = to.shutdown().await;
            return Ok(());
        }
        last.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        to.write_all(&buf[..n]).await?;
        to.flush().await?;
        bytes.fetch_add(n as u64, Ordering::Relaxed);
        metric.inc_by(n as u64);
        last.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}
