//! TLS for downstream listeners (rustls), with ALPN h2 and http/1.1.
//!
//! One server config per listener, built at start and at each reload, is shared by every
//! serving thread (through the listener's `Live`), so a session set up on one thread resumes
//! on any other: stateless session tickets (TLS 1.2 ticket extension and TLS 1.3
//! NewSessionTicket, keys rotated every 6 hours by rustls's ticketer) and the session-ID cache
//! belong to that one config. The server's cipher-suite order wins over the client's.
//! A reload makes a new config with new ticket keys: no session from before it is resumed,
//! so a rotated certificate is never skipped by a resumption.

use std::io::BufReader;
use std::sync::Arc;

use tokio_rustls::rustls::{self, pki_types::CertificateDer, pki_types::PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsConfig;

/// Builds an acceptor from PEM files, with session tickets and server cipher preference.
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
    // The provider's order (AES-256-GCM, AES-128-GCM, ChaCha20-Poly1305 per version), not
    // the client's.
    sc.ignore_client_order = true;
    sc.ticketer =
        rustls::crypto::ring::Ticketer::new().map_err(|e| format!("session tickets: {e}"))?;
    Ok(TlsAcceptor::from(Arc::new(sc)))
}
