//! The effective config as TOML that `upkeep check` accepts again (`upkeep check --print`).
//!
//! The model serializes as the surface: field names are the config keys, and the few values
//! the model keeps in another shape (host patterns, endpoints, access-log destination,
//! stale grace) are written back the way a person writes them. Paths become absolute, so the
//! printed file means the same wherever it is saved.

use std::path::Path;
use std::time::Duration;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use super::model::{AccessLog, Config, Endpoint, EndpointSource, HostMatch, StaleGrace};

/// Why the config could not be printed.
#[derive(Debug, thiserror::Error)]
#[error("printing the config as TOML: {0}")]
pub struct PrintError(#[from] toml::ser::Error);

/// The config as TOML, every default filled in.
pub fn to_toml(cfg: &Config) -> Result<String, PrintError> {
    Ok(toml::to_string(cfg)?)
}

/// A duration as the config writes it: whole seconds as `"5s"`, else milliseconds.
pub(super) fn duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        // Below a millisecond: decimal milliseconds, which the parser reads back.
        format!("{}ms", d.as_nanos() as f64 / 1e6)
    }
}

/// A path made absolute: a relative one is anchored where the original file was read.
pub(super) fn path<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_owned());
    s.serialize_str(&abs.to_string_lossy())
}

impl Serialize for AccessLog {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AccessLog::Stdout => s.serialize_str("stdout"),
            AccessLog::Off => s.serialize_str("off"),
            AccessLog::File(p) => path(p, s),
        }
    }
}

impl Serialize for HostMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            HostMatch::Any => s.serialize_str("*"),
            HostMatch::Exact(h) => s.serialize_str(h),
            HostMatch::Suffix(suffix) => s.serialize_str(&format!("*{suffix}")),
        }
    }
}

impl std::fmt::Display for EndpointSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndpointSource::Static(a) => write!(f, "{a}"),
            EndpointSource::Name { host, port } => write!(f, "{host}:{port}"),
            EndpointSource::Kubernetes { service, port } => {
                write!(f, "kubernetes:{service}:{port}")
            }
        }
    }
}

impl Serialize for EndpointSource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Serialize for Endpoint {
    /// `"host:port"` in tier 0, `{ addr = "host:port", tier = N }` otherwise; `https://`
    /// in front for TLS endpoints.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if let EndpointSource::Kubernetes { service, port } = &self.source {
            let mut m = s.serialize_map(None)?;
            m.serialize_entry("kubernetes", &service.to_string())?;
            match port {
                upkeep_kubernetes::PortSel::Name(n) => m.serialize_entry("port", n)?,
                upkeep_kubernetes::PortSel::Number(n) => m.serialize_entry("port", n)?,
                upkeep_kubernetes::PortSel::Only => {}
            }
            if self.tier != 0 {
                m.serialize_entry("tier", &self.tier)?;
            }
            return m.end();
        }
        let addr = if self.https {
            format!("https://{}", self.source)
        } else {
            self.source.to_string()
        };
        if self.tier == 0 {
            return s.serialize_str(&addr);
        }
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("addr", &addr)?;
        m.serialize_entry("tier", &self.tier)?;
        m.end()
    }
}

impl Serialize for StaleGrace {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            StaleGrace::WhileHealthy => s.serialize_str("while_healthy"),
            StaleGrace::For(d) => s.serialize_str(&duration(*d)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::PathBuf;

    fn examples() -> Vec<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no examples in {}", dir.display());
        files
    }

    #[test]
    fn durations_print_as_the_parser_reads_them() {
        for d in [
            Duration::ZERO,
            Duration::from_secs(620),
            Duration::from_millis(250),
            Duration::from_millis(1500),
            Duration::from_micros(500),
        ] {
            let text = duration(d);
            assert_eq!(super::super::parse_duration(&text), Ok(d), "{text}");
        }
    }

    #[test]
    fn every_example_prints_as_toml_that_parses_back_to_the_same_config() {
        for file in examples() {
            let cfg = super::super::load(&file).unwrap_or_else(|e| panic!("{e}"));
            let text = to_toml(&cfg).unwrap();
            // Parsed as if saved elsewhere: absolute paths keep their meaning.
            let again = super::super::parse(Path::new("/nonexistent/printed.toml"), &text)
                .unwrap_or_else(|e| panic!("{}:\n{e}\n--- printed:\n{text}", file.display()));
            assert_eq!(again, cfg, "{}:\n{text}", file.display());
            assert_eq!(to_toml(&again).unwrap(), text, "{}", file.display());
        }
    }

    #[test]
    fn non_default_values_round_trip() {
        let text = r#"
access_log = "off"
access_log_format = "combined"
[dns]
servers = ["127.0.0.1:53", "[::1]:5353"]
[[listener]]
listen = "[::1]:8080"
forwarded = "none"
body_timeout = "1.5ms"
[[route]]
host = "*.example.com"
path = "/api"
group = "g"
[[route]]
host = "Shop.Example.com"
group = "g"
[groups.g]
required = false
balance = "p2c"
endpoints = ["a.internal:81", { addr = "10.0.0.1:80", tier = 2 }, "[::1]:9"]
[groups.g.discovery]
stale_grace = "90s"
[groups.g.health.active]
path = "/health"
"#;
        let cfg = super::super::parse(Path::new("t.toml"), text).unwrap();
        let printed = to_toml(&cfg).unwrap();
        let again = super::super::parse(Path::new("t.toml"), &printed)
            .unwrap_or_else(|e| panic!("{e}\n{printed}"));
        assert_eq!(again, cfg, "{printed}");
        for line in [
            "host = \"*.example.com\"",
            "host = \"shop.example.com\"",
            "forwarded = \"none\"",
            "access_log_format = \"combined\"",
            "stale_grace = \"90s\"",
        ] {
            assert!(printed.contains(line), "{line} missing:\n{printed}");
        }
    }
}
