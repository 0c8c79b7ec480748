//! One request as logged, and its line in each format: JSON (every field named) or nginx's
//! `combined` followed by `$upstream_status`, which existing log tooling reads.

use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::SystemTime;

use serde::{Serialize, Serializer};

use crate::config::AccessLogFormat;

/// One request as logged.
#[derive(Debug, Serialize)]
pub struct Record {
    /// Start time, RFC 3339 UTC.
    #[serde(serialize_with = "rfc3339")]
    pub time: SystemTime,
    /// Client address.
    pub client: IpAddr,
    /// Method.
    pub method: String,
    /// Host header or authority.
    pub host: String,
    /// Path and query.
    pub path: String,
    /// HTTP version downstream.
    pub proto: &'static str,
    /// Status sent.
    pub status: u16,
    /// Until the response body ended.
    pub duration_ms: f64,
    /// The request id, as sent upstream in `x-request-id`.
    pub request_id: String,
    /// `User-Agent`.
    pub user_agent: Option<String>,
    /// `Referer`.
    pub referer: Option<String>,
    /// The matched route, as written (`host/path`, `/path`).
    pub route: Option<String>,
    /// The route's group.
    pub group: Option<String>,
    /// The upstream peer of the last attempt.
    pub peer: Option<SocketAddr>,
    /// Upstream attempts made.
    pub attempts: u32,
    /// Status the upstream answered (none when upkeep made the response).
    pub upstream_status: Option<u16>,
    /// From the request's start to the upstream's response head, retries included.
    pub upstream_header_ms: Option<f64>,
    /// Request body bytes.
    pub bytes_in: u64,
    /// Response body bytes.
    pub bytes_out: u64,
    /// `proxy` or `upstream`.
    pub origin: &'static str,
    /// Cause code for responses upkeep generated.
    pub cause: Option<&'static str>,
    /// Detail for the cause (the no_peers reason).
    pub reason: Option<&'static str>,
    /// The response body did not complete (client gone or upstream cut).
    pub incomplete: bool,
    /// The line format; chosen per record so a reload that changes it applies at once.
    #[serde(skip)]
    pub format: AccessLogFormat,
}

impl Record {
    /// Writes the record as one line, newline included.
    pub fn write_line(&self, out: &mut impl Write) -> io::Result<()> {
        match self.format {
            AccessLogFormat::Json => {
                serde_json::to_writer(&mut *out, self)?;
                out.write_all(b"\n")
            }
            AccessLogFormat::Combined => self.write_combined(out),
        }
    }

    /// `$remote_addr - - [$time_local] "$request" $status $body_bytes_sent "$http_referer"
    /// "$http_user_agent" $upstream_status`, with nginx's escaping.
    fn write_combined(&self, out: &mut impl Write) -> io::Result<()> {
        let mut line = Vec::with_capacity(256);
        let _ = write!(line, "{} - - [{}] \"", self.client, time_local(self.time));
        escape(&mut line, &self.method);
        line.push(b' ');
        escape(&mut line, &self.path);
        line.push(b' ');
        line.extend_from_slice(self.proto.as_bytes());
        let _ = write!(line, "\" {} {} \"", self.status, self.bytes_out);
        escape(&mut line, self.referer.as_deref().unwrap_or("-"));
        line.extend_from_slice(b"\" \"");
        escape(&mut line, self.user_agent.as_deref().unwrap_or("-"));
        line.extend_from_slice(b"\" ");
        match self.upstream_status {
            Some(s) => {
                let _ = write!(line, "{s}");
            }
            None => line.push(b'-'),
        }
        line.push(b'\n');
        out.write_all(&line)
    }
}

fn rfc3339<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*t))
}

/// `30/Nov/2026:08:10:38 +0000`: nginx's `$time_local`, in UTC.
fn time_local(t: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    // `2026-11-30T08:10:38Z`
    let iso = humantime::format_rfc3339_seconds(t).to_string();
    let month = iso[5..7]
        .parse::<usize>()
        .map_or("Jan", |m| MONTHS[(m - 1) % 12]);
    format!(
        "{}/{month}/{}:{} +0000",
        &iso[8..10],
        &iso[0..4],
        &iso[11..19]
    )
}

/// nginx's default escaping: `"`, `\`, control and non-ASCII bytes as `\xHH`.
fn escape(out: &mut Vec<u8>, s: &str) {
    for &b in s.as_bytes() {
        if b == b'"' || b == b'\\' || !(0x20..0x7f).contains(&b) {
            let _ = write!(out, "\\x{b:02X}");
        } else {
            out.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::{Duration, UNIX_EPOCH};

    fn record(format: AccessLogFormat) -> Record {
        Record {
            time: UNIX_EPOCH + Duration::from_millis(1_796_027_438_250),
            client: "192.0.2.7".parse().unwrap(),
            method: "GET".into(),
            host: "shop.test".into(),
            path: "/a?q=\"x\"".into(),
            proto: "HTTP/1.1",
            status: 502,
            duration_ms: 1.5,
            request_id: "r-1".into(),
            user_agent: Some("curl/8 \u{e9}".into()),
            referer: None,
            route: Some("/".into()),
            group: Some("app".into()),
            peer: Some("127.0.0.1:9001".parse().unwrap()),
            attempts: 2,
            upstream_status: Some(502),
            upstream_header_ms: Some(1.25),
            bytes_in: 0,
            bytes_out: 157,
            origin: "upstream",
            cause: None,
            reason: None,
            incomplete: false,
            format,
        }
    }

    fn line(r: &Record) -> String {
        let mut out = Vec::new();
        r.write_line(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn combined_is_nginx_combined_then_upstream_status() {
        assert_eq!(
            line(&record(AccessLogFormat::Combined)),
            "192.0.2.7 - - [30/Nov/2026:08:30:38 +0000] \"GET /a?q=\\x22x\\x22 HTTP/1.1\" 502 157 \"-\" \"curl/8 \\xC3\\xA9\" 502\n"
        );
        let mut r = record(AccessLogFormat::Combined);
        r.upstream_status = None;
        assert!(line(&r).ends_with("\" -\n"), "{}", line(&r));
    }

    #[test]
    fn json_names_every_field() {
        let l = line(&record(AccessLogFormat::Json));
        assert!(l.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["time"], "2026-11-30T08:30:38.250Z");
        assert_eq!(v["client"], "192.0.2.7");
        assert_eq!(v["request_id"], "r-1");
        assert_eq!(v["user_agent"], "curl/8 \u{e9}");
        assert_eq!(v["referer"], serde_json::Value::Null);
        assert_eq!(
            (v["route"].as_str(), v["group"].as_str()),
            (Some("/"), Some("app"))
        );
        assert_eq!(v["upstream_status"], 502);
        assert_eq!(v["upstream_header_ms"], 1.25);
        assert!(v.get("format").is_none());
    }
}
