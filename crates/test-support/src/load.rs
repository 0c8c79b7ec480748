//! A small open-loop load for behaviour tests: request i leaves at t0 + i/rate whatever is
//! outstanding, each on its own connection, and every outcome is kept.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// One request's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Scheduled send time since the start.
    pub at: Duration,
    /// When the request actually left, since the start: later than `at` when the machine
    /// lags, so tests that compare with the moment of a fault use this one.
    pub sent: Duration,
    /// Status, or `None` on a transport error.
    pub status: Option<u16>,
    /// The `upkeep-error` cause, if any.
    pub cause: Option<String>,
    /// Latency to the end of the body.
    pub latency: Duration,
    /// The body (first bytes), to tell backends apart.
    pub body: String,
}

/// All outcomes of a run.
#[derive(Debug, Clone)]
pub struct Run {
    /// When the load started: `at` and `sent` count from here.
    pub start: Instant,
    /// Outcomes in schedule order.
    pub outcomes: Vec<Outcome>,
}

impl Run {
    /// Requests that did not get a 2xx.
    pub fn errors(&self) -> Vec<&Outcome> {
        self.outcomes
            .iter()
            .filter(|o| !o.status.is_some_and(|s| (200..300).contains(&s)))
            .collect()
    }

    /// The q-quantile latency (0..=1).
    pub fn latency_quantile(&self, q: f64) -> Duration {
        let mut l: Vec<Duration> = self.outcomes.iter().map(|o| o.latency).collect();
        l.sort();
        if l.is_empty() {
            return Duration::ZERO;
        }
        l[((l.len() - 1) as f64 * q).round() as usize]
    }

    /// A short summary for assertion messages.
    pub fn summary(&self) -> String {
        let errs = self.errors();
        format!(
            "{} requests, {} errors {:?}, p50 {:?}, p99 {:?}, max {:?}",
            self.outcomes.len(),
            errs.len(),
            errs.iter()
                .take(5)
                .map(|o| (o.at, o.status, o.cause.clone()))
                .collect::<Vec<_>>(),
            self.latency_quantile(0.5),
            self.latency_quantile(0.99),
            self.latency_quantile(1.0)
        )
    }
}

/// Sends `rate` requests a second for `duration` to `target`.
pub async fn open_loop(
    target: SocketAddr,
    method: Method,
    path: &str,
    rate: u32,
    duration: Duration,
) -> Run {
    let n = (duration.as_secs_f64() * rate as f64) as u32;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        let at = Duration::from_secs_f64(i as f64 / rate as f64);
        tokio::time::sleep_until(start + at).await;
        let (method, path) = (method.clone(), path.to_owned());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let (status, cause, body) = match one(target, method, &path).await {
                Ok(r) => r,
                Err(e) => (None, None, e),
            };
            Outcome {
                at,
                sent: t - start,
                status,
                cause,
                latency: t.elapsed(),
                body,
            }
        }));
    }
    let mut outcomes = Vec::with_capacity(tasks.len());
    for t in tasks {
        outcomes.push(t.await.expect("load task"));
    }
    Run { start, outcomes }
}

async fn one(
    target: SocketAddr,
    method: Method,
    path: &str,
) -> Result<(Option<u16>, Option<String>, String), String> {
    let run = async {
        let stream = TcpStream::connect(target)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let body = if method == Method::POST {
            Bytes::from_static(b"payload")
        } else {
            Bytes::new()
        };
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "load.test")
            .body(Full::new(body))
            .unwrap();
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let cause = resp
            .headers()
            .get("upkeep-error")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((
            Some(status),
            cause,
            String::from_utf8_lossy(&body[..body.len().min(64)]).into_owned(),
        ))
    };
    match tokio::time::timeout(Duration::from_secs(30), run).await {
        Ok(r) => r,
        Err(_) => Err("timed out".into()),
    }
}
