//! One request as logged, and its line in each format: JSON (every field named) or nginx's
//! `combined` followed by `$upstream_status`, which existing log tooling reads.
//!
//! Lines are put together here rather than by a serializer, into one buffer reused from line
//! to line, with the time's second formatted once per second: a line costs about a tenth of
//! what `serde_json` made of it (docs/performance-history.md, "The access log"). Strings that need
//! JSON escaping, and numbers with a fraction, still go through `serde_json`, and a test
//! holds every line byte for byte to what `serde_json` writes for the same record.

use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::AccessLogFormat;

/// The textual fields of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// Method.
    Method,
    /// Host header or authority.
    Host,
    /// Path and query.
    Path,
    /// The request id, as sent upstream in `x-request-id`.
    RequestId,
    /// `User-Agent`.
    UserAgent,
    /// `Referer`.
    Referer,
    /// The matched route, as written (`host/path`, `/path`).
    Route,
    /// The route's group.
    Group,
}

const FIELDS: usize = 8;

/// The textual fields of one record in one buffer: one allocation per request, not one per
/// field.
#[derive(Debug, Default)]
pub struct Text {
    buf: String,
    /// Where each field lies in `buf`; `None` for a field not set.
    spans: [Option<(u32, u32)>; FIELDS],
}

impl Text {
    /// Room for `bytes` of text.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            buf: String::with_capacity(bytes),
            spans: [None; FIELDS],
        }
    }

    /// Sets `field` to `s` (set twice, the last value counts).
    pub fn set(&mut self, field: Field, s: &str) {
        let start = self.buf.len();
        self.buf.push_str(s);
        self.spans[field as usize] = Some((offset(start), offset(self.buf.len())));
    }

    /// Sets `field` from bytes as received; invalid UTF-8 becomes U+FFFD.
    pub fn set_lossy(&mut self, field: Field, bytes: &[u8]) {
        match std::str::from_utf8(bytes) {
            Ok(s) => self.set(field, s),
            Err(_) => self.set(field, &String::from_utf8_lossy(bytes)),
        }
    }

    /// The value of `field`, if set.
    pub fn get(&self, field: Field) -> Option<&str> {
        self.spans[field as usize].map(|(a, b)| &self.buf[a as usize..b as usize])
    }

    /// The value of `field`, empty if not set.
    fn or_empty(&self, field: Field) -> &str {
        self.get(field).unwrap_or("")
    }
}

fn offset(n: usize) -> u32 {
    u32::try_from(n).expect("a log record's text is far under 4 GiB")
}

/// One request as logged.
#[derive(Debug)]
pub struct Record {
    /// Start time, RFC 3339 UTC.
    pub time: SystemTime,
    /// Client address.
    pub client: IpAddr,
    /// Method, host, path, request id, user agent, referer, route and group.
    pub text: Text,
    /// HTTP version downstream.
    pub proto: &'static str,
    /// Status sent.
    pub status: u16,
    /// Until the response body ended.
    pub duration_ms: f64,
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
    pub format: AccessLogFormat,
}

/// Writes records as lines, keeping what repeats from one line to the next: the line's
/// buffer and the current second, formatted.
#[derive(Default)]
pub struct Lines {
    line: Vec<u8>,
    clock: Clock,
}

impl Lines {
    /// Writes `r` as one line, newline included, with one write to `out`.
    pub fn write(&mut self, r: &Record, out: &mut impl Write) -> io::Result<()> {
        self.line.clear();
        match r.format {
            AccessLogFormat::Json => json(&mut self.line, &mut self.clock, r),
            AccessLogFormat::Combined => combined(&mut self.line, &mut self.clock, r),
        }
        out.write_all(&self.line)
    }
}

/// The JSON line: every field named, in a fixed order, absent values as `null`.
fn json(line: &mut Vec<u8>, clock: &mut Clock, r: &Record) {
    let ms = clock.set(r.time);
    line.extend_from_slice(b"{\"time\":\"");
    line.extend_from_slice(&clock.iso);
    line.push(b'.');
    three_digits(line, ms);
    line.extend_from_slice(b"Z\",\"client\":\"");
    ip(line, r.client);
    line.push(b'"');
    let t = &r.text;
    field(line, b",\"method\":", t.or_empty(Field::Method));
    field(line, b",\"host\":", t.or_empty(Field::Host));
    field(line, b",\"path\":", t.or_empty(Field::Path));
    field(line, b",\"proto\":", r.proto);
    field(line, b",\"status\":", u64::from(r.status));
    field(line, b",\"duration_ms\":", r.duration_ms);
    field(line, b",\"request_id\":", t.or_empty(Field::RequestId));
    field(line, b",\"user_agent\":", t.get(Field::UserAgent));
    field(line, b",\"referer\":", t.get(Field::Referer));
    field(line, b",\"route\":", t.get(Field::Route));
    field(line, b",\"group\":", t.get(Field::Group));
    field(line, b",\"peer\":", r.peer);
    field(line, b",\"attempts\":", u64::from(r.attempts));
    field(
        line,
        b",\"upstream_status\":",
        r.upstream_status.map(u64::from),
    );
    field(line, b",\"upstream_header_ms\":", r.upstream_header_ms);
    field(line, b",\"bytes_in\":", r.bytes_in);
    field(line, b",\"bytes_out\":", r.bytes_out);
    field(line, b",\"origin\":", r.origin);
    field(line, b",\"cause\":", r.cause);
    field(line, b",\"reason\":", r.reason);
    line.extend_from_slice(if r.incomplete {
        b",\"incomplete\":true}\n"
    } else {
        b",\"incomplete\":false}\n"
    });
}

/// `key` (its comma, name and colon, as written) followed by `value`.
fn field(line: &mut Vec<u8>, key: &[u8], value: impl JsonValue) {
    line.extend_from_slice(key);
    value.write(line);
}

/// A value of a JSON line, written as `serde_json` writes it.
trait JsonValue {
    fn write(self, line: &mut Vec<u8>);
}

impl JsonValue for &str {
    fn write(self, line: &mut Vec<u8>) {
        json_str(line, self);
    }
}

impl JsonValue for u64 {
    fn write(self, line: &mut Vec<u8>) {
        json_int(line, self);
    }
}

impl JsonValue for f64 {
    fn write(self, line: &mut Vec<u8>) {
        json_float(line, self);
    }
}

/// A peer, as a string.
impl JsonValue for SocketAddr {
    fn write(self, line: &mut Vec<u8>) {
        line.push(b'"');
        socket_addr(line, self);
        line.push(b'"');
    }
}

/// Absent: `null`.
impl<T: JsonValue> JsonValue for Option<T> {
    fn write(self, line: &mut Vec<u8>) {
        match self {
            Some(v) => v.write(line),
            None => line.extend_from_slice(b"null"),
        }
    }
}

/// An address as `Display` writes it; IPv4 without the formatting machinery.
fn ip(line: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            let mut buf = itoa::Buffer::new();
            for (i, o) in [a, b, c, d].into_iter().enumerate() {
                if i > 0 {
                    line.push(b'.');
                }
                line.extend_from_slice(buf.format(o).as_bytes());
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(line, "{v6}");
        }
    }
}

/// A socket address as `Display` writes it.
fn socket_addr(line: &mut Vec<u8>, addr: SocketAddr) {
    match addr {
        SocketAddr::V4(v4) => {
            ip(line, IpAddr::V4(*v4.ip()));
            line.push(b':');
            json_int(line, v4.port());
        }
        SocketAddr::V6(v6) => {
            let _ = write!(line, "{v6}");
        }
    }
}

/// Whether JSON needs `s` escaped: a control character, `"` or `\`. Eight bytes at a time.
fn needs_escape(s: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    // A byte of `x` is zero: the classic test, exact in its highest set bit per byte.
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH != 0;
    let has_below_space = |x: u64| x.wrapping_sub(ONES * 0x20) & !x & HIGH != 0;
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let x = u64::from_ne_bytes(c.try_into().expect("eight bytes"));
        if has_below_space(x)
            || has_zero(x ^ (ONES * u64::from(b'"')))
            || has_zero(x ^ (ONES * u64::from(b'\\')))
        {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

/// A JSON string: as is when nothing in it needs escaping (the common case), else as
/// `serde_json` escapes it.
fn json_str(line: &mut Vec<u8>, s: &str) {
    if !needs_escape(s.as_bytes()) {
        line.push(b'"');
        line.extend_from_slice(s.as_bytes());
        line.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *line, s);
    }
}

fn json_int(line: &mut Vec<u8>, n: impl itoa::Integer) {
    line.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// As `serde_json` writes an `f64` (shortest form; `null` when not finite).
fn json_float(line: &mut Vec<u8>, x: f64) {
    let _ = serde_json::to_writer(&mut *line, &x);
}

fn three_digits(line: &mut Vec<u8>, n: u32) {
    line.extend_from_slice(&[
        b'0' + (n / 100 % 10) as u8,
        b'0' + (n / 10 % 10) as u8,
        b'0' + (n % 10) as u8,
    ]);
}

/// `$remote_addr - - [$time_local] "$request" $status $body_bytes_sent "$http_referer"
/// "$http_user_agent" $upstream_status`, with nginx's escaping.
fn combined(line: &mut Vec<u8>, clock: &mut Clock, r: &Record) {
    clock.set(r.time);
    ip(line, r.client);
    line.extend_from_slice(b" - - [");
    line.extend_from_slice(&clock.local);
    line.extend_from_slice(b" +0000] \"");
    escape(line, r.text.or_empty(Field::Method));
    line.push(b' ');
    escape(line, r.text.or_empty(Field::Path));
    line.push(b' ');
    line.extend_from_slice(r.proto.as_bytes());
    line.extend_from_slice(b"\" ");
    json_int(line, r.status);
    line.push(b' ');
    json_int(line, r.bytes_out);
    line.extend_from_slice(b" \"");
    escape(line, r.text.get(Field::Referer).unwrap_or("-"));
    line.extend_from_slice(b"\" \"");
    escape(line, r.text.get(Field::UserAgent).unwrap_or("-"));
    line.extend_from_slice(b"\" ");
    match r.upstream_status {
        Some(s) => json_int(line, s),
        None => line.push(b'-'),
    }
    line.push(b'\n');
}

/// The second last formatted, in both formats' forms, and whether it is set.
#[derive(Default)]
struct Clock {
    second: Option<u64>,
    /// `2026-11-30T08:30:38`
    iso: [u8; 19],
    /// `30/Nov/2026:08:30:38`: nginx's `$time_local` in UTC, without its offset.
    local: [u8; 20],
}

/// The last second RFC 3339 can write (year 9999); later times are written as it.
const LAST_SECOND: u64 = 253_402_300_799;

impl Clock {
    /// Makes `iso` and `local` those of `t`'s second (formatting only when the second
    /// changed) and returns `t`'s milliseconds. A time before 1970 is written as 1970's
    /// first second, one after 9999 as 9999's last, rather than failing the line.
    fn set(&mut self, t: SystemTime) -> u32 {
        let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        let (second, ms) = match since.as_secs() {
            s if s > LAST_SECOND => (LAST_SECOND, 999),
            s => (s, since.subsec_millis()),
        };
        if self.second != Some(second) {
            self.format(second);
        }
        ms
    }

    fn format(&mut self, second: u64) {
        const MONTHS: [&[u8; 3]; 12] = [
            b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
            b"Dec",
        ];
        // `2026-11-30T08:10:38Z`
        let iso =
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(second)).to_string();
        let iso = iso.as_bytes();
        self.iso.copy_from_slice(&iso[..19]);
        let month = usize::from((iso[5] - b'0') * 10 + (iso[6] - b'0'));
        let local = &mut self.local;
        local[0..2].copy_from_slice(&iso[8..10]);
        local[2] = b'/';
        local[3..6].copy_from_slice(MONTHS[(month + 11) % 12]);
        local[6] = b'/';
        local[7..11].copy_from_slice(&iso[0..4]);
        local[11] = b':';
        local[12..20].copy_from_slice(&iso[11..19]);
        self.second = Some(second);
    }
}

/// nginx's default escaping: `"`, `\`, control and non-ASCII bytes as `\xHH`.
fn escape(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in s.as_bytes() {
        if b == b'"' || b == b'\\' || !(0x20..0x7f).contains(&b) {
            out.extend_from_slice(&[
                b'\\',
                b'x',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 15)],
            ]);
        } else {
            out.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde::{Serialize, Serializer};

    fn record(format: AccessLogFormat) -> Record {
        let mut text = Text::default();
        text.set(Field::Method, "GET");
        text.set(Field::Host, "shop.test");
        text.set(Field::Path, "/a?q=\"x\"");
        text.set(Field::RequestId, "r-1");
        text.set(Field::UserAgent, "curl/8 \u{e9}");
        text.set(Field::Route, "/");
        text.set(Field::Group, "app");
        Record {
            time: UNIX_EPOCH + Duration::from_millis(1_796_027_438_250),
            client: "192.0.2.7".parse().unwrap(),
            text,
            proto: "HTTP/1.1",
            status: 502,
            duration_ms: 1.5,
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
        Lines::default().write(r, &mut out).unwrap();
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

    #[test]
    fn text_keeps_each_field_apart_and_replaces_bad_utf8() {
        let mut t = Text::with_capacity(4);
        t.set(Field::Host, "a.test");
        t.set(Field::Path, "");
        t.set_lossy(Field::UserAgent, b"x\xffy");
        t.set(Field::Host, "b.test");
        assert_eq!(t.get(Field::Host), Some("b.test"));
        assert_eq!(t.get(Field::Path), Some(""));
        assert_eq!(t.get(Field::UserAgent), Some("x\u{fffd}y"));
        assert_eq!(t.get(Field::Referer), None);
        assert_eq!(t.or_empty(Field::Method), "");
    }

    /// The record as `serde_json` writes it, fields in the line's order: what every JSON
    /// line is held to.
    #[derive(Serialize)]
    struct AsSerde<'a> {
        #[serde(serialize_with = "rfc3339")]
        time: SystemTime,
        client: IpAddr,
        method: &'a str,
        host: &'a str,
        path: &'a str,
        proto: &'a str,
        status: u16,
        duration_ms: f64,
        request_id: &'a str,
        user_agent: Option<&'a str>,
        referer: Option<&'a str>,
        route: Option<&'a str>,
        group: Option<&'a str>,
        peer: Option<SocketAddr>,
        attempts: u32,
        upstream_status: Option<u16>,
        upstream_header_ms: Option<f64>,
        bytes_in: u64,
        bytes_out: u64,
        origin: &'a str,
        cause: Option<&'a str>,
        reason: Option<&'a str>,
        incomplete: bool,
    }

    fn rfc3339<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_millis(*t))
    }

    impl<'a> AsSerde<'a> {
        fn of(r: &'a Record) -> Self {
            let t = &r.text;
            Self {
                time: r.time,
                client: r.client,
                method: t.or_empty(Field::Method),
                host: t.or_empty(Field::Host),
                path: t.or_empty(Field::Path),
                proto: r.proto,
                status: r.status,
                duration_ms: r.duration_ms,
                request_id: t.or_empty(Field::RequestId),
                user_agent: t.get(Field::UserAgent),
                referer: t.get(Field::Referer),
                route: t.get(Field::Route),
                group: t.get(Field::Group),
                peer: r.peer,
                attempts: r.attempts,
                upstream_status: r.upstream_status,
                upstream_header_ms: r.upstream_header_ms,
                bytes_in: r.bytes_in,
                bytes_out: r.bytes_out,
                origin: r.origin,
                cause: r.cause,
                reason: r.reason,
                incomplete: r.incomplete,
            }
        }
    }

    /// xorshift64*: a fixed, repeatable stream of cases.
    struct Cases(u64);

    impl Cases {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        /// A string of up to 12 characters, drawn from ones that need escaping in one
        /// format or the other and ones that do not.
        fn text(&mut self) -> String {
            const CHARS: &[char] = &[
                'a',
                'Z',
                '0',
                '/',
                ' ',
                '-',
                '"',
                '\\',
                '\n',
                '\t',
                '\u{1}',
                '\u{1f}',
                '\u{7f}',
                '\u{e9}',
                '\u{20ac}',
                '\u{1f600}',
                '\u{fffd}',
                '\'',
                '<',
                '%',
            ];
            let n = self.below(13);
            (0..n)
                .map(|_| CHARS[self.below(CHARS.len() as u64) as usize])
                .collect()
        }

        fn float(&mut self) -> f64 {
            const SPECIAL: &[f64] = &[
                0.0,
                -0.0,
                1.5,
                0.001,
                1e-7,
                123_456.789,
                1e21,
                5e-324,
                f64::MAX,
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
            ];
            match self.below(3) {
                0 => SPECIAL[self.below(SPECIAL.len() as u64) as usize],
                // As the proxy makes them: milliseconds with microsecond precision.
                1 => (self.below(10_000_000_000) as f64).round() / 1e3,
                _ => f64::from_bits(self.next()),
            }
        }
    }

    fn random_record(c: &mut Cases, time: SystemTime) -> Record {
        let mut text = Text::default();
        for f in [
            Field::Method,
            Field::Host,
            Field::Path,
            Field::RequestId,
            Field::UserAgent,
            Field::Referer,
            Field::Route,
            Field::Group,
        ] {
            if c.below(4) != 0 {
                let s = c.text();
                text.set(f, &s);
            }
        }
        let client: IpAddr = if c.below(2) == 0 {
            std::net::Ipv4Addr::from(c.next() as u32).into()
        } else {
            std::net::Ipv6Addr::from(u128::from(c.next()) << 64 | u128::from(c.next())).into()
        };
        let some = |c: &mut Cases| c.below(3) != 0;
        Record {
            time,
            client,
            text,
            proto: ["HTTP/1.0", "HTTP/1.1", "HTTP/2.0"][c.below(3) as usize],
            status: c.below(1000) as u16,
            duration_ms: c.float(),
            peer: some(c).then(|| SocketAddr::new(client, c.next() as u16)),
            attempts: c.next() as u32,
            upstream_status: some(c).then(|| c.next() as u16),
            upstream_header_ms: some(c).then(|| c.float()),
            bytes_in: c.next() >> c.below(64),
            bytes_out: c.next() >> c.below(64),
            origin: ["proxy", "upstream"][c.below(2) as usize],
            cause: some(c).then_some("upstream_reset"),
            reason: some(c).then_some("all \"ejected\""),
            incomplete: c.below(2) == 0,
            format: AccessLogFormat::Json,
        }
    }

    #[test]
    fn every_json_line_is_byte_for_byte_what_serde_json_writes() {
        let mut c = Cases(0x5eed_1e55_u64 * 7919);
        let mut lines = Lines::default();
        let mut time = UNIX_EPOCH + Duration::from_millis(1_796_027_438_250);
        for i in 0..20_000 {
            // Mostly a few milliseconds apart (the formatted second reused, or just passed),
            // sometimes a jump anywhere from 1970 to 9999.
            time = if i % 50 == 0 {
                UNIX_EPOCH + Duration::new(c.below(LAST_SECOND + 1), c.below(1_000_000_000) as u32)
            } else {
                time + Duration::from_nanos(c.below(400_000_000))
            };
            let r = random_record(&mut c, time);
            let mut ours = Vec::new();
            lines.write(&r, &mut ours).unwrap();
            let mut theirs = serde_json::to_vec(&AsSerde::of(&r)).unwrap();
            theirs.push(b'\n');
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs),
                "case {i}"
            );
        }
    }

    /// nginx's `$time_local` in UTC, made from the RFC 3339 form as the line once was.
    fn time_local(second: u64) -> String {
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        let iso =
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(second)).to_string();
        let month = MONTHS[iso[5..7].parse::<usize>().unwrap() - 1];
        format!("{}/{month}/{}:{}", &iso[8..10], &iso[0..4], &iso[11..19])
    }

    #[test]
    fn the_kept_second_is_the_second_of_each_line() {
        let mut c = Cases(42);
        let mut clock = Clock::default();
        let mut second = 1_796_027_438;
        for i in 0..5_000 {
            second = match i % 3 {
                0 => c.below(LAST_SECOND + 1),
                1 => second,
                _ => second + 1,
            }
            .min(LAST_SECOND);
            let nanos = c.below(1_000_000_000) as u32;
            let ms = clock.set(UNIX_EPOCH + Duration::new(second, nanos));
            assert_eq!(ms, nanos / 1_000_000);
            let iso = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(second))
                .to_string();
            assert_eq!(std::str::from_utf8(&clock.iso).unwrap(), &iso[..19]);
            assert_eq!(
                std::str::from_utf8(&clock.local).unwrap(),
                time_local(second)
            );
        }
    }

    #[test]
    fn a_time_rfc3339_cannot_write_is_clamped_not_failed() {
        let mut clock = Clock::default();
        let before = UNIX_EPOCH - Duration::from_secs(5);
        assert_eq!(clock.set(before), 0);
        assert_eq!(&clock.iso, b"1970-01-01T00:00:00");
        let after = UNIX_EPOCH + Duration::from_secs(LAST_SECOND + 86_400);
        assert_eq!(clock.set(after), 999);
        assert_eq!(&clock.iso, b"9999-12-31T23:59:59");
        assert_eq!(&clock.local, b"31/Dec/9999:23:59:59");
    }

    #[test]
    fn needs_escape_finds_every_byte_json_escapes_at_every_position() {
        let naive = |s: &[u8]| s.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\');
        for len in 0..20 {
            for at in 0..len {
                for b in 0..=255u8 {
                    for fill in [b'a', 0xc3, 0x7f, b'!', b'#', b'[', b']'] {
                        let mut s = vec![fill; len];
                        s[at] = b;
                        assert_eq!(needs_escape(&s), naive(&s), "{s:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for a in [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.12.9",
            "::1",
            "2001:db8::7",
            "::ffff:1.2.3.4",
        ] {
            let addr: IpAddr = a.parse().unwrap();
            let mut line = Vec::new();
            ip(&mut line, addr);
            assert_eq!(String::from_utf8(line).unwrap(), addr.to_string());
            for port in [0, 80, 65535] {
                let sa = SocketAddr::new(addr, port);
                let mut line = Vec::new();
                socket_addr(&mut line, sa);
                assert_eq!(String::from_utf8(line).unwrap(), sa.to_string());
            }
        }
    }

    #[test]
    fn combined_escapes_as_nginx_does() {
        let mut out = Vec::new();
        escape(&mut out, "a\"b\\c\u{1}\u{7f}\u{e9} ~");
        assert_eq!(out, b"a\\x22b\\x5Cc\\x01\\x7F\\xC3\\xA9 ~");
    }
}
