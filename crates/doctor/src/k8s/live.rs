//! `--live`: measure a liveness endpoint's latency and read what its body reports.

use crate::http::{exchange, parse_url, UrlError};
use std::time::{Duration, Instant};

/// A live liveness check that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The base URL is not usable.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The request failed.
    #[error("{url}: {source}")]
    Io {
        /// The URL requested.
        url: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What a liveness endpoint answered.
#[derive(Debug, Clone)]
pub struct LiveCheck {
    /// Time from sending the request to the end of the response.
    pub elapsed: Duration,
    /// HTTP status.
    pub status: u16,
    /// Names of dependency checks its JSON body reports.
    pub dependencies: Vec<String>,
}

/// GETs `base` + `path`, waiting at most `limit`.
pub fn fetch(base: &str, path: &str, limit: Duration) -> Result<LiveCheck, LiveError> {
    let url = format!("{}{}", base.trim_end_matches('/'), path);
    let target = parse_url(&url)?;
    let io = |source| LiveError::Io {
        url: url.clone(),
        source,
    };
    let start = Instant::now();
    let mut s = target.connect(limit).map_err(io)?;
    let r = exchange(&mut s, &target.request(&target.path), start + limit).map_err(io)?;
    Ok(LiveCheck {
        elapsed: r.done_at - start,
        status: r.status,
        dependencies: dependencies(&r.body),
    })
}

/// Keys under which health libraries list dependency checks (Terminus, Spring, and others).
const GROUPS: &[&str] = &[
    "info",
    "error",
    "details",
    "components",
    "checks",
    "dependencies",
];

/// Dependency names a health body reports, e.g. `{"info":{"mysql":{"status":"up"}}}`.
pub fn dependencies(body: &[u8]) -> Vec<String> {
    let Ok(serde_json::Value::Object(root)) = serde_json::from_slice::<serde_json::Value>(body)
    else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for (k, v) in &root {
        match v {
            serde_json::Value::Object(group) if GROUPS.contains(&k.as_str()) => {
                names.extend(group.keys().cloned());
            }
            serde_json::Value::Array(items) if GROUPS.contains(&k.as_str()) => {
                names.extend(
                    items
                        .iter()
                        .filter_map(|i| i.get("name")?.as_str().map(str::to_owned)),
                );
            }
            serde_json::Value::Object(o) if o.contains_key("status") => names.push(k.clone()),
            _ => {}
        }
    }
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependency_names_come_from_common_health_bodies() {
        let terminus = br#"{"status":"error","info":{"mysql":{"status":"up"}},"error":{"opensearch":{"status":"down"}},"details":{"mysql":{"status":"up"},"opensearch":{"status":"down"}}}"#;
        assert_eq!(dependencies(terminus), ["mysql", "opensearch"]);
        let spring =
            br#"{"status":"UP","components":{"db":{"status":"UP"},"redis":{"status":"UP"}}}"#;
        assert_eq!(dependencies(spring), ["db", "redis"]);
        assert!(dependencies(br#"{"status":"ok"}"#).is_empty());
        assert!(dependencies(b"ok").is_empty());
    }
}
