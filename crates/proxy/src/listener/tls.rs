//! TLS for downstream listeners (rustls), with ALPN h2 and http/1.1.

use std::io::BufReader;
use std::sync::Arc;

use tokio_rustls::rustls::{self, pki_types::CertificateDer, pki_types::PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsConfig;

/// Builds an acceptor from PEM files.
pub fn acceptor(cfg: &TlsConfig) -> Result<TlsAcceptor, String> {
    let certs: Vec<CertificateDer<'static>> = {
        let f =
            std::fs::File::open(&cfg.cert).map_err(|e| format!("{}: {e}", cfg.cert.display()))?;
        rustls_pemfile::certs(&mut BufReader::new(f))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", cfg.cert.display()))?
    };
    if certs.is_empty() {
        return Err(format!("{}: no certificate found", cfg.cert.display()));
    }
    let key: PrivateKeyDer<'static> = {
        let f = std::fs::File::open(&cfg.key).map_err(|e| format!("{}: {e}", cfg.key.display()))?;
        rustls_pemfile::private_key(&mut BufReader::new(f))
            .map_err(|e| format!("{}: {e}", cfg.key.display()))?
            .ok_or_else(|| format!("{}: no private key found", cfg.key.display()))?
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut sc = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("{}: {e}", cfg.cert.display()))?;
    sc.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(sc)))
}
