//! Optional mutual TLS for the fleet's internal traffic (raft between members, nodes to
//! members), as etcd does for its peers: every process holds a certificate signed by the
//! fleet's own CA, members accept only clients that present one, and clients accept only members
//! whose certificate names the address they dialled (an IP address SAN, since members are named
//! by `ip:port`). The cluster token is still checked inside: TLS keeps it off the wire and keeps
//! strangers out before a single HTTP byte is read.
//!
//! TLS 1.3 only, with rustls on the `ring` provider. Files are PEM; a certificate file may hold
//! a chain (leaf first).
//!
//! **Non-goals.** Revocation lists and hot reload: rotating certificates is a rolling restart
//! (SECURITY.md).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
pub use tokio_rustls::TlsAcceptor;

/// Where one process's TLS material lives. `{name}` in `cert` and `key` is replaced by the
/// process's member name or node id, so one `cluster.toml` serves every process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The fleet's CA: peers must chain to it.
    pub ca: PathBuf,
}

/// Why TLS could not be set up; names the file and never prints key material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("TLS setup: {0}")]
    Setup(String),
}

/// A process's TLS configuration, both roles: serving (members) and calling (everyone).
#[derive(Clone)]
pub struct Tls {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls(<mutual, TLS 1.3>)")
    }
}

/// Any stream a connection can run on: plain TCP or TLS over it.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl TlsFiles {
    /// The files of the process named `name`.
    pub fn for_process(&self, name: &str) -> TlsFiles {
        let named = |path: &Path| PathBuf::from(path.to_string_lossy().replace("{name}", name));
        TlsFiles { cert: named(&self.cert), key: named(&self.key), ca: self.ca.clone() }
    }

    /// Reads and checks the files.
    pub fn load(&self) -> Result<Tls, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path)
                .map_err(|e| TlsError::File { path: path.display().to_string(), reason: format!("cannot read: {e}") })
        };
        let bad = |path: &Path, what: &str| TlsError::File {
            path: path.display().to_string(),
            reason: format!("holds no usable {what} in PEM"),
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(&self.cert)?)
            .collect::<Result<_, _>>()
            .map_err(|_| bad(&self.cert, "certificate"))?;
        if chain.is_empty() {
            return Err(bad(&self.cert, "certificate"));
        }
        let key = PrivateKeyDer::from_pem_slice(&read(&self.key)?).map_err(|_| bad(&self.key, "private key"))?;
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&read(&self.ca)?) {
            roots.add(ca.map_err(|_| bad(&self.ca, "CA certificate"))?).map_err(|_| bad(&self.ca, "CA certificate"))?;
        }
        if roots.is_empty() {
            return Err(bad(&self.ca, "CA certificate"));
        }
        Tls::new(chain, key, roots)
    }
}

impl Tls {
    /// Mutual TLS 1.3: serve with `chain`, require clients chaining to `roots`; call with `chain`,
    /// accept servers chaining to `roots`.
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        roots: RootCertStore,
    ) -> Result<Tls, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let setup = |e: rustls::Error| TlsError::Setup(e.to_string());
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| TlsError::Setup(e.to_string()))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(setup)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(setup)?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(setup)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(setup)?;
        Ok(Tls { server: Arc::new(server), client: Arc::new(client) })
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server.clone())
    }

    /// Opens TLS on `stream` to the member at `addr` (`ip:port`), whose certificate must name
    /// that IP address.
    pub async fn connect(&self, addr: &str, stream: TcpStream) -> io::Result<Box<dyn Io>> {
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host).trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
        let connector = tokio_rustls::TlsConnector::from(self.client.clone());
        Ok(Box::new(connector.connect(name, stream).await?))
    }
}
