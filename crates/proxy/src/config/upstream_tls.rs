//! `[groups.X.tls]`: TLS to a group's `https://` endpoints, validated into a ready client config.

use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::model::EndpointSource;
use super::surface::{GroupTls, S};
use crate::pool::tls::{ClientTls, TlsOptions};

/// How upkeep speaks TLS to a group's `https://` endpoints.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UpstreamTls {
    /// Name sent as SNI and checked against the certificate.
    pub server_name: String,
    /// CA bundle to verify against; `None`: the system store.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_path")]
    pub ca: Option<PathBuf>,
    /// Client certificate chain for mTLS.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_path")]
    pub cert: Option<PathBuf>,
    /// Client private key for mTLS.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_path")]
    pub key: Option<PathBuf>,
    /// Certificate verification (off only on request, with a warning at start).
    pub verify: bool,
    /// The rustls client config built from the above.
    #[serde(skip)]
    pub client: ClientTls,
}

/// A path printed absolute (`upkeep check --print`).
fn opt_path<S: serde::Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
    match p {
        Some(p) => super::print::path(p, s),
        None => s.serialize_none(),
    }
}

type Problems = Vec<(Range<usize>, String)>;

/// One endpoint line: its span, whether it is `https://`, and its source.
pub(super) type Scheme = (Range<usize>, bool, EndpointSource);

/// Checks the schemes of a group's endpoints against its `tls` table and builds the client
/// config, so that unreadable or malformed PEM files fail `upkeep check`, not the first request.
pub(super) fn validate(
    group: &S<String>,
    table: Option<&GroupTls>,
    schemes: &[Scheme],
    base: &Path,
) -> Result<Option<UpstreamTls>, Problems> {
    let name = group.get_ref();
    let mut problems = Problems::new();
    let https = schemes.iter().filter(|(_, h, _)| *h).count();
    if https == 0 {
        if let Some(t) = table {
            let span = [&t.server_name, &t.ca, &t.cert, &t.key]
                .into_iter()
                .flatten()
                .map(|s| s.span())
                .chain(t.verify.as_ref().map(|v| v.span()))
                .next()
                .unwrap_or(group.span());
            problems.push((
                span,
                format!("[groups.{name}.tls] needs https:// endpoints; group {name:?} has none"),
            ));
            return Err(problems);
        }
        return Ok(None);
    }
    if https < schemes.len() {
        // One TLS policy per group: a plain endpoint among TLS ones is almost always a slip that
        // would send requests in clear text.
        for (span, h, _) in schemes {
            if !h {
                problems.push((
                    span.clone(),
                    format!("group {name:?} mixes http:// and https:// endpoints; put them in separate groups"),
                ));
            }
        }
    }
    let file = |v: &Option<S<String>>, what: &str, problems: &mut Problems| {
        let v = v.as_ref()?;
        let path = base.join(v.get_ref());
        if !path.is_file() {
            problems.push((
                v.span(),
                format!("tls {what} {} does not exist", path.display()),
            ));
        }
        Some((path, v.span()))
    };
    let ca = table.and_then(|t| file(&t.ca, "ca", &mut problems));
    let cert = table.and_then(|t| file(&t.cert, "cert", &mut problems));
    let key = table.and_then(|t| file(&t.key, "key", &mut problems));
    match (&cert, &key) {
        (Some((_, span)), None) => problems.push((span.clone(), "tls cert needs key".into())),
        (None, Some((_, span))) => problems.push((span.clone(), "tls key needs cert".into())),
        _ => {}
    }
    let verify = table.and_then(|t| t.verify.as_ref());
    let server_name = match table.and_then(|t| t.server_name.as_ref()) {
        Some(s) => Some((s.get_ref().clone(), s.span())),
        None => {
            let mut names: Vec<String> = schemes
                .iter()
                .map(|(_, _, source)| match source {
                    EndpointSource::Static(a) => a.ip().to_string(),
                    EndpointSource::Name { host, .. } => host.clone(),
                    EndpointSource::Kubernetes { service, .. } => {
                        format!("{}.{}.svc", service.name, service.namespace)
                    }
                })
                .collect();
            names.sort();
            names.dedup();
            if names.len() > 1 {
                problems.push((
                    group.span(),
                    format!("group {name:?} has https:// endpoints with different names; set [groups.{name}.tls] server_name"),
                ));
            }
            names.into_iter().next().map(|n| (n, group.span()))
        }
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    let Some((server_name, name_span)) = server_name else {
        return Ok(None);
    };
    let opts = TlsOptions {
        server_name: &server_name,
        ca: ca.as_ref().map(|(p, _)| p.as_path()),
        client_auth: cert
            .as_ref()
            .zip(key.as_ref())
            .map(|((c, _), (k, _))| (c.as_path(), k.as_path())),
        verify: verify.is_none_or(|v| *v.get_ref()),
    };
    let verify = opts.verify;
    let client = ClientTls::new(&opts).map_err(|e| {
        let span = match &e {
            crate::pool::tls::TlsSetupError::ServerName(_) => name_span,
            _ => table
                .and_then(|t| t.ca.as_ref().or(t.cert.as_ref()))
                .map(|s| s.span())
                .unwrap_or(group.span()),
        };
        vec![(span, format!("group {name:?}: {e}"))]
    })?;
    Ok(Some(UpstreamTls {
        server_name,
        ca: ca.map(|(p, _)| p),
        cert: cert.map(|(p, _)| p),
        key: key.map(|(p, _)| p),
        verify,
        client,
    }))
}
