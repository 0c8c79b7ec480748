//! `upkeep lab dns`: the fake DNS server with an HTTP control endpoint and a query log.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use upkeep_fakedns::{FakeDns, Mode, QueryRecord, Zone};

use crate::control::{self, Handler};

/// A query log line (JSON).
#[derive(Debug, Serialize)]
pub struct QueryLine<'a> {
    /// Epoch seconds.
    pub time: f64,
    /// Name.
    pub name: &'a str,
    /// Type.
    pub qtype: &'a str,
    /// Client address.
    pub client: String,
    /// `udp` or `tcp`.
    pub transport: &'a str,
    /// What was answered.
    pub answer: &'a str,
}

/// The JSON line of a query.
pub fn query_line(q: &QueryRecord) -> String {
    serde_json::to_string(&QueryLine {
        time: crate::classify::epoch_s(q.at),
        name: &q.name,
        qtype: &q.qtype,
        client: q.client.to_string(),
        transport: q.transport.as_str(),
        answer: &q.answer,
    })
    .unwrap_or_default()
}

/// A `lab dns` that could not start.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// Zone file.
    #[error("{path}: {message}")]
    Zone {
        /// File.
        path: String,
        /// Message with position.
        message: String,
    },
    /// Sockets.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Parses `mode` (`fixed`, `alternate`, ...) with comma-separated `addrs`.
pub fn parse_mode(mode: &str, addrs: &str) -> Result<Mode, String> {
    let ips: Result<Vec<IpAddr>, _> = addrs
        .split(',')
        .filter(|a| !a.is_empty())
        .map(str::parse)
        .collect();
    let ips = ips.map_err(|e| format!("bad address list {addrs:?}: {e}"))?;
    Mode::from_keyword(mode, ips).ok_or_else(|| format!("unknown mode {mode:?}"))
}

/// Starts the server from a zone file and, if asked, its control endpoint.
pub async fn start(
    listen: SocketAddr,
    zone_path: &Path,
    control_addr: Option<SocketAddr>,
) -> Result<(Arc<FakeDns>, Option<SocketAddr>), DnsError> {
    let text = std::fs::read_to_string(zone_path)?;
    let zone = Zone::from_toml_str(&text).map_err(|e| DnsError::Zone {
        path: zone_path.display().to_string(),
        message: e.to_string(),
    })?;
    let dns = Arc::new(FakeDns::start(listen, zone).await?);
    let control = match control_addr {
        None => None,
        Some(addr) => Some(control::serve(addr, handler(dns.clone())).await?),
    };
    Ok((dns, control))
}

fn handler(dns: Arc<FakeDns>) -> Handler {
    Arc::new(move |path, q| match path {
        "/queries" => {
            let lines: Vec<String> = dns.queries().iter().map(query_line).collect();
            (200, lines.join("\n") + "\n")
        }
        "/mode" => {
            let (Some(name), Some(mode)) = (q.get("name"), q.get("mode")) else {
                return (400, "need name= and mode=\n".into());
            };
            match parse_mode(mode, q.get("addrs").map_or("", String::as_str)) {
                Ok(m) => {
                    dns.set_mode(name, m);
                    (200, format!("{name} -> {mode}\n"))
                }
                Err(e) => (400, e + "\n"),
            }
        }
        "/ttl" => match (q.get("name"), q.get("ttl").and_then(|t| t.parse().ok())) {
            (Some(name), Some(ttl)) => {
                dns.set_ttl(name, ttl);
                (200, format!("{name} ttl {ttl}\n"))
            }
            _ => (400, "need name= and ttl=SECONDS\n".into()),
        },
        _ => (
            404,
            "paths: /queries, /mode?name=&mode=&addrs=, /ttl?name=&ttl=\n".into(),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_with_addresses() {
        assert_eq!(
            parse_mode("alternate", "127.0.0.11,127.0.0.12").unwrap(),
            Mode::Alternate(vec![
                "127.0.0.11".parse().unwrap(),
                "127.0.0.12".parse().unwrap()
            ])
        );
        assert_eq!(parse_mode("nxdomain", "").unwrap(), Mode::NxDomain);
        assert!(parse_mode("fixed", "not-an-ip").is_err());
        assert!(parse_mode("sometimes", "").is_err());
    }
}
