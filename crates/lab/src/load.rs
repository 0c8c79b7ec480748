//! Open-loop constant-rate load: request i leaves at t0 + i/R whatever is outstanding.
//!
//! A dedicated OS thread runs its own single-threaded event loop: a `timerfd` wakes it at each
//! due time and the request starts right there, on the loop that also reads the responses. A
//! slow target delays answers, never departures; the tokio timer's 1 ms granularity and the
//! wake-up of another thread do not show up as send lag.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::time::Instant;

mod clock;
mod pollers;
mod stats;

pub use stats::{LoadStats, LAG_P99_LIMIT_MS};

/// How the generator uses connections.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadMode {
    /// Open loop; reuse idle connections from a shared pool, open more when none is idle.
    Pooled,
    /// Open loop; a fresh connection (and `Connection: close`) for every request.
    NewConnection,
    /// `count` pollers, each on one keep-alive connection, idling a uniform draw in
    /// `idle_min..=idle_max` between a response and its next request (the keep-alive race).
    Pollers {
        /// Number of pollers.
        count: usize,
        /// Shortest idle time.
        idle_min: Duration,
        /// Longest idle time.
        idle_max: Duration,
    },
}

/// What to send, how fast, for how long.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// `http://host:port/path`.
    pub url: Uri,
    /// GET, POST, ...
    pub method: Method,
    /// Requests per second (open-loop modes).
    pub rate: f64,
    /// How long to send.
    pub duration: Duration,
    /// Connection use.
    pub mode: LoadMode,
    /// Per-request timeout, from send to the end of the body.
    pub timeout: Duration,
    /// Header fields sent with every request, after `Host`.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// Why a request got no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientError {
    /// The connect was refused (RST to the SYN).
    Refused,
    /// The connection was reset.
    Reset,
    /// The connection closed before a full response.
    Closed,
    /// No full response within the timeout.
    Timeout,
    /// Anything else (address, protocol).
    Other,
}

/// One request as the client saw it.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRecord {
    /// Sequence number in schedule order.
    pub seq: u64,
    /// When it was due, from the start of the run.
    pub scheduled: Duration,
    /// How late it actually left.
    pub send_lag: Duration,
    /// From leaving to the end of the body (or the error).
    pub latency: Duration,
    /// Response status, if any.
    pub status: Option<u16>,
    /// Error, if no response.
    pub error: Option<ClientError>,
    /// The backend that answered (`x-backend`).
    pub backend: Option<String>,
    /// The `upkeep-error` cause header of a generated response.
    pub cause: Option<String>,
    /// Whether the request went on a reused connection.
    pub reused: bool,
}

impl RequestRecord {
    /// An error is a missing response or any 5xx.
    pub fn is_error(&self) -> bool {
        self.error.is_some() || self.status.is_some_and(|s| s >= 500)
    }
}

/// The result of a load run.
#[derive(Debug)]
pub struct LoadResult {
    /// Wall-clock time of t0, to line records up with logs.
    pub started: SystemTime,
    /// Every request, in schedule order.
    pub records: Vec<RequestRecord>,
}

/// A load run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The URL has no host or port we can connect to.
    #[error("load URL {0} needs http://HOST:PORT")]
    Url(String),
    /// The sending thread or its event loop could not run.
    #[error("load sender: {0}")]
    Sender(std::io::Error),
    /// Rate or duration out of range.
    #[error("rate must be > 0 and duration > 0 (got {rate}/s for {duration:?})")]
    Range {
        /// Given rate.
        rate: f64,
        /// Given duration.
        duration: Duration,
    },
}

/// Due times of an open-loop run: i/R for every i with i/R < duration.
pub fn schedule(rate: f64, duration: Duration) -> impl Iterator<Item = Duration> {
    let count = (rate * duration.as_secs_f64()).ceil() as u64;
    (0..count).map(move |i| Duration::from_secs_f64(i as f64 / rate))
}

/// Sends the load described by `spec`; `progress` draws a bar on a terminal.
pub async fn run(spec: &LoadSpec, progress: bool) -> Result<LoadResult, LoadError> {
    run_from(spec, progress, Instant::now() + Duration::from_millis(5)).await
}

/// Like [`run`], with request 0 due at `t0` (to share a clock with a fault timeline).
pub async fn run_from(
    spec: &LoadSpec,
    progress: bool,
    t0: Instant,
) -> Result<LoadResult, LoadError> {
    let target = Target::from_uri(&spec.url)?;
    if let LoadMode::Pollers {
        count,
        idle_min,
        idle_max,
    } = spec.mode
    {
        return Ok(pollers::run(spec, target, count, idle_min, idle_max, t0).await);
    }
    if spec.rate.is_nan() || spec.rate <= 0.0 || spec.duration.is_zero() {
        return Err(LoadError::Range {
            rate: spec.rate,
            duration: spec.duration,
        });
    }
    let total = (spec.rate * spec.duration.as_secs_f64()).ceil() as u64;
    let bar = progress_bar(total, progress);
    let started = SystemTime::now() + t0.saturating_duration_since(Instant::now());
    let done = Arc::new(AtomicU64::new(0));
    let (spec_owned, counter) = (spec.clone(), done.clone());
    let sender = std::thread::Builder::new()
        .name("upkeep-load".into())
        .spawn(move || send_open_loop(spec_owned, target, t0.into_std(), counter))
        .map_err(LoadError::Sender)?;
    // Wait for the sender without waking per request: records stay on the sending thread
    // (a cross-thread hand-off per record costs a wake-up each), progress is an atomic.
    let mut join = tokio::task::spawn_blocking(move || sender.join());
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let joined = loop {
        tokio::select! {
            joined = &mut join => break joined,
            _ = tick.tick() => {
                if let Some(bar) = &bar {
                    bar.set_position(done.load(Ordering::Relaxed));
                }
            }
        }
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let lost = || LoadError::Sender(std::io::Error::other("load thread panicked"));
    let mut records = joined
        .map_err(|_| lost())?
        .map_err(|_| lost())?
        .map_err(LoadError::Sender)?;
    records.sort_by_key(|r| r.seq);
    Ok(LoadResult { started, records })
}

/// Sends the open-loop schedule from one thread with its own event loop: a precise timer
/// wakes the loop at each due time, the request is started on the spot, and the same loop
/// reads the responses. Departures never wait for another thread to be scheduled.
fn send_open_loop(
    spec: LoadSpec,
    target: Target,
    t0: std::time::Instant,
    done: Arc<AtomicU64>,
) -> std::io::Result<Vec<RequestRecord>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let priority = clock::raise_priority();
    tracing::debug!(priority, "load sender thread priority");
    rt.block_on(async move {
        let timer = clock::PreciseTimer::new()?;
        let spec = Arc::new(spec);
        let target = Arc::new(target);
        let pool = Arc::new(Pool::default());
        let t0 = Instant::from_std(t0);
        let mut in_flight = tokio::task::JoinSet::new();
        let mut records = Vec::new();
        for (seq, due) in schedule(spec.rate, spec.duration).enumerate() {
            timer.sleep_until((t0 + due).into_std()).await?;
            let (spec, target, pool) = (spec.clone(), target.clone(), pool.clone());
            in_flight.spawn(async move { one(&spec, &target, &pool, seq as u64, t0, due).await });
            while let Some(Ok(record)) = in_flight.try_join_next() {
                records.push(record);
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
        while let Some(joined) = in_flight.join_next().await {
            if let Ok(record) = joined {
                records.push(record);
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(records)
    })
}

fn progress_bar(total: u64, wanted: bool) -> Option<indicatif::ProgressBar> {
    if !wanted || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} requests")
    {
        bar.set_style(style);
    }
    Some(bar)
}

/// Where requests go.
#[derive(Debug, Clone)]
struct Target {
    connect: String,
    authority: String,
    path: String,
}

impl Target {
    fn from_uri(uri: &Uri) -> Result<Target, LoadError> {
        let bad = || LoadError::Url(uri.to_string());
        let authority = uri.authority().ok_or_else(bad)?;
        let port = authority.port_u16().unwrap_or(80);
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let connect = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let path = uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".into());
        Ok(Target {
            connect,
            authority: authority.as_str().to_owned(),
            path,
        })
    }
}

/// Idle keep-alive connections shared by open-loop requests.
#[derive(Debug, Default)]
struct Pool {
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Pool {
    fn take(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(sender) = idle.pop() {
            if sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    fn put(&self, sender: SendRequest<Full<Bytes>>) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(sender);
    }
}

async fn one(
    spec: &LoadSpec,
    target: &Target,
    pool: &Pool,
    seq: u64,
    t0: Instant,
    due: Duration,
) -> RequestRecord {
    let sent = Instant::now();
    let send_lag = sent.saturating_duration_since(t0 + due);
    let fresh = spec.mode == LoadMode::NewConnection;
    let reusable = if fresh { None } else { pool.take() };
    let (record, sender) = timed_exchange(spec, target, reusable, fresh, seq, due, send_lag).await;
    if let Some(sender) = sender {
        pool.put(sender);
    }
    record
}

/// Sends one request on `reusable` (or a new connection), bounded by the spec's timeout,
/// and records it; returns the connection when it may be used again.
async fn timed_exchange(
    spec: &LoadSpec,
    target: &Target,
    reusable: Option<SendRequest<Full<Bytes>>>,
    close: bool,
    seq: u64,
    due: Duration,
    send_lag: Duration,
) -> (RequestRecord, Option<SendRequest<Full<Bytes>>>) {
    let sent = Instant::now();
    let reused = reusable.is_some();
    let outcome = tokio::time::timeout(spec.timeout, async {
        let sender = match reusable {
            Some(s) => s,
            None => connect(&target.connect).await?,
        };
        exchange(sender, spec, target, close).await
    })
    .await;
    let mut record = RequestRecord {
        seq,
        scheduled: due,
        send_lag,
        latency: sent.elapsed(),
        status: None,
        error: None,
        backend: None,
        cause: None,
        reused,
    };
    let mut kept = None;
    match outcome {
        Err(_) => record.error = Some(ClientError::Timeout),
        Ok(Err(e)) => record.error = Some(e),
        Ok(Ok((reply, sender))) => {
            record.status = Some(reply.status);
            record.backend = reply.backend;
            record.cause = reply.cause;
            kept = sender;
        }
    }
    (record, kept)
}

/// What the client keeps from a response.
#[derive(Debug)]
struct Reply {
    status: u16,
    backend: Option<String>,
    cause: Option<String>,
}

async fn connect(addr: &str) -> Result<SendRequest<Full<Bytes>>, ClientError> {
    let stream = TcpStream::connect(addr).await.map_err(|e| io_kind(&e))?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| hyper_kind(&e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

async fn exchange(
    mut sender: SendRequest<Full<Bytes>>,
    spec: &LoadSpec,
    target: &Target,
    close: bool,
) -> Result<(Reply, Option<SendRequest<Full<Bytes>>>), ClientError> {
    let body = if spec.method == Method::POST {
        Bytes::from_static(b"{\"probe\":true}")
    } else {
        Bytes::new()
    };
    let mut req = Request::builder()
        .method(spec.method.clone())
        .uri(target.path.as_str())
        .header(http::header::HOST, target.authority.as_str());
    for (name, value) in &spec.headers {
        req = req.header(name, value);
    }
    if close {
        req = req.header(http::header::CONNECTION, "close");
    }
    let req = req.body(Full::new(body)).map_err(|_| ClientError::Other)?;
    sender.ready().await.map_err(|e| hyper_kind(&e))?;
    let resp = sender.send_request(req).await.map_err(|e| hyper_kind(&e))?;
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let reply = Reply {
        status: resp.status().as_u16(),
        backend: header("x-backend"),
        cause: header("upkeep-error"),
    };
    let closing = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
    resp.into_body()
        .collect()
        .await
        .map_err(|e| hyper_kind(&e))?;
    let keep = (!close && !closing).then_some(sender);
    Ok((reply, keep))
}

fn io_kind(e: &std::io::Error) -> ClientError {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionRefused => ClientError::Refused,
        ConnectionReset | ConnectionAborted | BrokenPipe => ClientError::Reset,
        UnexpectedEof => ClientError::Closed,
        TimedOut => ClientError::Timeout,
        _ => ClientError::Other,
    }
}

fn hyper_kind(e: &hyper::Error) -> ClientError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io_kind(io);
        }
        source = s.source();
    }
    if e.is_incomplete_message() || e.is_closed() || e.is_canceled() {
        ClientError::Closed
    } else if e.is_timeout() {
        ClientError::Timeout
    } else {
        ClientError::Other
    }
}

#[cfg(test)]
mod tests;
