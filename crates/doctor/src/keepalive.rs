//! `doctor keepalive URL`: time when a live server closes an idle keep-alive connection.
//!
//! A raw TCP socket, one request, then nothing: the wait for the server's FIN (or RST) is
//! bounded, and the `Keep-Alive: timeout=N` hint is read but not trusted (Node 20 announces
//! 5 s and closes at 6 s).

use crate::finding::{Finding, Location, Severity};
use crate::http::{exchange, parse_url, UrlError};
use std::io::{ErrorKind, Read};
use std::time::{Duration, Instant};

/// A measurement that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum KeepaliveError {
    /// The URL is not usable.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// Connecting or the request failed.
    #[error("{url}: {source}")]
    Io {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// How the idle connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// The server closed it (FIN) after this long idle.
    Fin(Duration),
    /// The server reset it (RST) after this long idle.
    Reset(Duration),
    /// Still open when the wait ended.
    StillOpen(Duration),
}

/// What the server said and did.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// The URL measured.
    pub url: String,
    /// Status of the response.
    pub status: u16,
    /// `timeout=` of the `Keep-Alive` header, in seconds.
    pub hint: Option<f64>,
    /// Whether the response said `Connection: close`.
    pub connection_close: bool,
    /// How the idle connection ended.
    pub close: Close,
}

/// Sends one request to `url` and waits up to `max_wait` for the server to close the idle socket.
pub fn measure(url: &str, max_wait: Duration) -> Result<Measurement, KeepaliveError> {
    let target = parse_url(url)?;
    let io = |source| KeepaliveError::Io {
        url: url.to_owned(),
        source,
    };
    let mut s = target.connect(Duration::from_secs(5)).map_err(io)?;
    let r = exchange(
        &mut s,
        &target.request(&target.path),
        Instant::now() + Duration::from_secs(30),
    )
    .map_err(io)?;
    let hint = r.header("keep-alive").and_then(|v| {
        v.split(',')
            .filter_map(|p| p.trim().strip_prefix("timeout="))
            .find_map(|t| t.trim().parse::<f64>().ok())
    });
    let connection_close = r
        .header("connection")
        .is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let close = if r.closed {
        Close::Fin(Duration::ZERO)
    } else {
        wait_for_close(&mut s, r.done_at, max_wait).map_err(io)?
    };
    Ok(Measurement {
        url: url.to_owned(),
        status: r.status,
        hint,
        connection_close,
        close,
    })
}

fn wait_for_close(
    s: &mut std::net::TcpStream,
    idle_since: Instant,
    max_wait: Duration,
) -> std::io::Result<Close> {
    let deadline = idle_since + max_wait;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Close::StillOpen(max_wait));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf) {
            Ok(0) => return Ok(Close::Fin(idle_since.elapsed())),
            // Stray bytes (a late body) do not end the idle wait.
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                return Ok(Close::Reset(idle_since.elapsed()))
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The margin the receiver must outlast the reuser by: 10%, at least 5 s.
pub fn margin(lb_idle: Duration) -> Duration {
    (lb_idle / 10).max(Duration::from_secs(5))
}

/// Judges the hop in front: a reuser idle for `lb_idle` must be outlasted by the server.
pub fn verdict(m: &Measurement, lb_idle: Duration) -> Finding {
    let lb = lb_idle.as_secs_f64();
    let need = lb_idle + margin(lb_idle);
    let hint = match m.hint {
        Some(h) => format!("announces Keep-Alive: timeout={h}"),
        None => "sends no Keep-Alive hint".to_owned(),
    };
    let fix = format!(
        "# make the server outlast the hop in front, e.g. Node:\nserver.keepAliveTimeout = {};  // ms\n# or make the hop in front close first: its idle timeout well below {} s",
        need.as_millis(),
        match m.close {
            Close::Fin(d) | Close::Reset(d) => format!("{:.1}", d.as_secs_f64()),
            Close::StillOpen(d) => format!("{:.1}", d.as_secs_f64()),
        }
    );
    let race = "The hop in front writes the next request into a socket the server is closing: random 502s, every one on a reused connection; the side that decides reuse must close first (load balancer 300 s -> server 360 s).";
    let (severity, problem, consequence) = match m.close {
        Close::Fin(d) | Close::Reset(d) => {
            let how = if matches!(m.close, Close::Reset(_)) {
                "reset"
            } else {
                "closed"
            };
            let secs = d.as_secs_f64();
            let problem = format!(
                "{} {hint} and {how} the idle connection after {secs:.1} s{}; the hop in front keeps idle connections for {lb} s.",
                m.url,
                if m.connection_close { " (Connection: close)" } else { "" }
            );
            if d <= lb_idle {
                (Severity::Error, problem, race.to_owned())
            } else if d < need {
                (Severity::Warning, problem, format!("Only {:.1} s of margin: clocks and timers drift, so the race is rare but real. {race}", secs - lb))
            } else {
                (
                    Severity::Info,
                    problem,
                    "The server outlasts the hop in front with margin: no reuse race on this hop."
                        .to_owned(),
                )
            }
        }
        Close::StillOpen(d) => {
            let secs = d.as_secs_f64();
            let problem = format!("{} {hint} and was still open at {secs:.1} s.", m.url);
            if d >= need {
                (Severity::Info, problem, format!("Longer than the hop in front ({lb} s) with margin: no reuse race on this hop."))
            } else {
                (Severity::Info, problem, format!("Cannot conclude for a hop idle for {lb} s: wait longer (--max-wait above {:.0}s).", need.as_secs_f64()))
            }
        }
    };
    let mut f = Finding::new(
        "keepalive-order",
        severity,
        Location::whole(m.url.clone()),
        problem,
        consequence,
        fix,
    )
    .with_detail("status", m.status)
    .with_detail("lb_idle_s", lb);
    if let Some(h) = m.hint {
        f = f.with_detail("hint_s", h);
    }
    match m.close {
        Close::Fin(d) => f.with_detail("closed_after_s", d.as_secs_f64()),
        Close::Reset(d) => f.with_detail("reset_after_s", d.as_secs_f64()),
        Close::StillOpen(d) => f.with_detail("still_open_at_s", d.as_secs_f64()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(close: Close) -> Measurement {
        Measurement {
            url: "http://127.0.0.1:1/".to_owned(),
            status: 200,
            hint: Some(5.0),
            connection_close: false,
            close,
        }
    }

    #[test]
    fn verdict_follows_the_receiver_must_outlast_the_reuser_rule() {
        let lb = Duration::from_secs(300);
        let secs = Duration::from_secs;
        assert_eq!(
            verdict(&m(Close::Fin(secs(5))), lb).severity,
            Severity::Error
        );
        assert_eq!(
            verdict(&m(Close::Reset(secs(300))), lb).severity,
            Severity::Error
        );
        // 305 s behind a 300 s balancer is too tight; 360 s is fine.
        assert_eq!(
            verdict(&m(Close::Fin(secs(305))), lb).severity,
            Severity::Warning
        );
        assert_eq!(
            verdict(&m(Close::Fin(secs(360))), lb).severity,
            Severity::Info
        );
        let open = verdict(&m(Close::StillOpen(secs(400))), lb);
        assert!(
            open.consequence.contains("no reuse race"),
            "{}",
            open.consequence
        );
        let short = verdict(&m(Close::StillOpen(secs(30))), lb);
        assert!(
            short.consequence.contains("Cannot conclude"),
            "{}",
            short.consequence
        );
    }
}
