//! TLS to upstreams (rustls with ring): the client config of a group's `[groups.X.tls]` table
//! and the handshake on a fresh TCP connection. ALPN offers what the group's `protocol` speaks
//! (http/1.1 by default).

use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Why a group's TLS settings could not be turned into a client config.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// A PEM file could not be read or parsed.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// A PEM file held no certificate.
    #[error("{0}: no certificate found")]
    NoCert(PathBuf),
    /// A PEM file held no private key.
    #[error("{0}: no private key found")]
    NoKey(PathBuf),
    /// The system store gave no usable root certificate.
    #[error("no usable root certificate in the system store; set ca = \"file.pem\"")]
    NoSystemRoots,
    /// The name is neither a DNS name nor an IP address.
    #[error("server_name {0:?} is not a valid DNS name or IP address")]
    ServerName(String),
    /// rustls refused the combination (e.g. a key that does not match the certificate).
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
}

/// What a client config is built from (paths already resolved).
pub struct TlsOptions<'a> {
    /// SNI and the name the certificate must carry.
    pub server_name: &'a str,
    /// CA bundle; `None`: the system store.
    pub ca: Option<&'a Path>,
    /// Client certificate chain and key for mTLS.
    pub client_auth: Option<(&'a Path, &'a Path)>,
    /// Verify the server's certificate.
    pub verify: bool,
}

/// A ready rustls client config and the server name to present.
#[derive(Clone)]
pub struct ClientTls {
    connector: TlsConnector,
    server_name: ServerName<'static>,
    /// A digest of the settings and of the PEM files' contents, so that a reload keeps the
    /// group (its health and pool) unless a file actually changed.
    digest: u64,
}

impl ClientTls {
    /// Builds the client config: roots, optional client certificate, ALPN http/1.1.
    pub fn new(opts: &TlsOptions<'_>) -> Result<Self, TlsSetupError> {
        let server_name = ServerName::try_from(opts.server_name.to_owned())
            .map_err(|_| TlsSetupError::ServerName(opts.server_name.to_owned()))?;
        let mut digest = DefaultHasher::new();
        (opts.server_name, opts.verify).hash(&mut digest);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = if opts.verify {
            let roots = match opts.ca {
                Some(ca) => {
                    let mut roots = RootCertStore::empty();
                    for cert in certs(ca, &mut digest)? {
                        roots.add(cert)?;
                    }
                    roots
                }
                None => system_roots()?,
            };
            builder.with_root_certificates(roots)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
        };
        let mut config = match opts.client_auth {
            Some((cert, key)) => builder
                .with_client_auth_cert(certs(cert, &mut digest)?, private_key(key, &mut digest)?)?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
            digest: digest.finish(),
        })
    }

    /// The same settings offering `alpn` (the group's `protocol`) in the handshake.
    pub fn with_alpn(&self, alpn: Vec<Vec<u8>>) -> Self {
        let mut config = (**self.connector.config()).clone();
        config.alpn_protocols = alpn;
        Self {
            connector: TlsConnector::from(Arc::new(config)),
            server_name: self.server_name.clone(),
            digest: self.digest,
        }
    }

    /// The TLS handshake on a connected stream; rustls errors arrive as `InvalidData`.
    pub async fn handshake(&self, stream: TcpStream) -> io::Result<TlsStream<TcpStream>> {
        self.connector
            .connect(self.server_name.clone(), stream)
            .await
    }
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ClientTls {
    /// Equal when built from the same settings and the same file contents.
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

fn read(path: &Path, digest: &mut DefaultHasher) -> Result<Vec<u8>, TlsSetupError> {
    let bytes = std::fs::read(path).map_err(|source| TlsSetupError::Read {
        path: path.to_owned(),
        source,
    })?;
    bytes.hash(digest);
    Ok(bytes)
}

fn certs(
    path: &Path,
    digest: &mut DefaultHasher,
) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let certs: Vec<_> = rustls_pemfile::certs(&mut &read(path, digest)?[..])
        .collect::<Result<_, _>>()
        .map_err(|source| TlsSetupError::Read {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsSetupError::NoCert(path.to_owned()));
    }
    Ok(certs)
}

fn private_key(
    path: &Path,
    digest: &mut DefaultHasher,
) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    rustls_pemfile::private_key(&mut &read(path, digest)?[..])
        .map_err(|source| TlsSetupError::Read {
            path: path.to_owned(),
            source,
        })?
        .ok_or_else(|| TlsSetupError::NoKey(path.to_owned()))
}

fn system_roots() -> Result<RootCertStore, TlsSetupError> {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::debug!(error = %e, "system root store: skipped an entry");
    }
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(TlsSetupError::NoSystemRoots);
    }
    Ok(roots)
}

/// `verify = false`: any certificate is accepted, but the handshake signatures are still checked
/// so that the session keys belong to whoever holds the presented certificate.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
