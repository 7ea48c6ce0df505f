//! TLS for the QUIC endpoint (SPEC §10).
//!
//! A node's certificate is self-signed and persisted so it stays the same
//! across restarts. Clients accept any server certificate: ops and keys are
//! end-to-end authenticated, so the transport only has to be confidential and
//! in order, not to say who the peer is. The handshake signature is still
//! checked, so a connection is at least to whoever holds the presented key.
//!
//! The endpoint's stateless-reset key (RFC 9000 §10.3) is persisted beside
//! the certificate: a node restarted after a crash answers packets of the
//! connections its previous run held with a stateless reset that those
//! peers accept, so they drop the dead connection and redial at once
//! instead of waiting out the idle timeout (30 s) for each restart.
//!
//! The ring crypto provider is passed explicitly into every rustls builder,
//! so nothing depends on (or installs) a process-wide default provider.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use quinn::crypto::rustls::{NoInitialCipherSuite, QuicClientConfig, QuicServerConfig};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The one application protocol a dagfold endpoint speaks.
pub const ALPN: &[u8] = b"dagfold/1";

/// The name clients put in the TLS SNI and the server's certificate carries.
/// Not checked (see the module doc), but it must be a valid DNS name.
pub const SERVER_NAME: &str = "dagfold";

/// File names inside the TLS directory.
pub const CERT_FILE: &str = "cert.der";
pub const KEY_FILE: &str = "key.der";
pub const RESET_KEY_FILE: &str = "reset-key.bin";

/// Why the TLS material or configuration could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// `cert.der` exists but `key.der` does not: not a state this module
    /// leaves (the key is written first), so an operator should look.
    #[error("{0} exists without its key; remove it to make a new certificate")]
    KeyMissing(PathBuf),
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("rustls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("quic: {0}")]
    Quic(#[from] NoInitialCipherSuite),
}

/// A node's certificate and its private key.
#[derive(Debug)]
pub struct NodeCert {
    pub cert: CertificateDer<'static>,
    pub key: PrivatePkcs8KeyDer<'static>,
}

/// The crypto provider every config here is built with.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads `cert.der` and `key.der` from `dir`, or on first use makes a
/// self-signed certificate and persists it there (creating `dir`).
///
/// Each file is written to a temporary name, synced, then renamed, and the
/// key goes first: `cert.der` present means both are complete. A crash
/// between the two renames leaves only the key, and the next call makes a
/// fresh pair.
pub fn load_or_create_cert(dir: &Path) -> Result<NodeCert, TlsError> {
    let cert_path = dir.join(CERT_FILE);
    let key_path = dir.join(KEY_FILE);
    match fs::read(&cert_path) {
        Ok(cert) => {
            let key = fs::read(&key_path).map_err(|source| {
                if source.kind() == io::ErrorKind::NotFound {
                    TlsError::KeyMissing(cert_path.clone())
                } else {
                    TlsError::Io { path: key_path.clone(), source }
                }
            })?;
            Ok(NodeCert { cert: CertificateDer::from(cert), key: PrivatePkcs8KeyDer::from(key) })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dir).map_err(|source| TlsError::Io { path: dir.to_owned(), source })?;
            let made = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_owned()])?;
            let cert = made.cert.der().clone();
            let key = made.key_pair.serialize_der();
            write_atomically(&key_path, &key, true)?;
            write_atomically(&cert_path, &cert, false)?;
            sync_dir(dir)?;
            Ok(NodeCert { cert, key: PrivatePkcs8KeyDer::from(key) })
        }
        Err(source) => Err(TlsError::Io { path: cert_path, source }),
    }
}

/// The HMAC-SHA256 key from which the endpoint derives the stateless-reset
/// token of each connection id it issues (quinn's `EndpointConfig`).
pub struct ResetKey([u8; 32]);

impl ResetKey {
    fn tag(&self, data: &[u8]) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let (mut ipad, mut opad) = ([0x36u8; 64], [0x5cu8; 64]);
        for (i, k) in self.0.iter().enumerate() {
            ipad[i] ^= k;
            opad[i] ^= k;
        }
        let inner = Sha256::new().chain_update(ipad).chain_update(data).finalize();
        Sha256::new().chain_update(opad).chain_update(inner).finalize().into()
    }
}

impl quinn::crypto::HmacKey for ResetKey {
    fn sign(&self, data: &[u8], signature_out: &mut [u8]) {
        let tag = self.tag(data);
        let n = signature_out.len().min(tag.len());
        signature_out[..n].copy_from_slice(&tag[..n]);
    }

    fn signature_len(&self) -> usize {
        32
    }

    fn verify(&self, data: &[u8], signature: &[u8]) -> Result<(), quinn::crypto::CryptoError> {
        let tag = self.tag(data);
        let same = signature.len() == tag.len() && signature.iter().zip(tag).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        same.then_some(()).ok_or(quinn::crypto::CryptoError)
    }
}

/// Loads the stateless-reset key from `dir`, or makes and persists one
/// (written like the certificate's key: temporary name, sync, rename).
pub fn load_or_create_reset_key(dir: &Path) -> Result<ResetKey, TlsError> {
    let path = dir.join(RESET_KEY_FILE);
    match fs::read(&path) {
        Ok(bytes) if bytes.len() == 32 => Ok(ResetKey(bytes.try_into().expect("32 bytes"))),
        Ok(_) | Err(_) => {
            // Missing (first run, or a node from before the key was kept)
            // or unreadable as a key: a fresh one only costs the resets of
            // connections from before.
            use rand::RngCore;
            let mut key = [0u8; 32];
            rand::rngs::OsRng.fill_bytes(&mut key);
            fs::create_dir_all(dir).map_err(|source| TlsError::Io { path: dir.to_owned(), source })?;
            write_atomically(&path, &key, true)?;
            sync_dir(dir)?;
            Ok(ResetKey(key))
        }
    }
}

fn write_atomically(path: &Path, bytes: &[u8], secret: bool) -> Result<(), TlsError> {
    let tmp = path.with_extension("der.tmp");
    let io_err = |source| TlsError::Io { path: tmp.clone(), source };
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if secret {
        owner_only(&mut options);
    }
    let mut file = options.open(&tmp).map_err(io_err)?;
    file.write_all(bytes).map_err(io_err)?;
    file.sync_all().map_err(io_err)?;
    drop(file);
    fs::rename(&tmp, path).map_err(|source| TlsError::Io { path: path.to_owned(), source })
}

/// The private key is readable by its owner only.
#[cfg(unix)]
fn owner_only(options: &mut fs::OpenOptions) {
    use std::os::unix::fs::OpenOptionsExt;
    options.mode(0o600);
}

#[cfg(not(unix))]
fn owner_only(_options: &mut fs::OpenOptions) {}

/// Makes the renames durable.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<(), TlsError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| TlsError::Io { path: dir.to_owned(), source })
}

/// Directories cannot be opened for syncing here; the renames are as durable
/// as the platform makes them.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<(), TlsError> {
    Ok(())
}

/// A quinn server config presenting `cert`, TLS 1.3 only, ALPN `dagfold/1`.
/// The caller sets the transport config and connection limits on it.
pub fn server_config(cert: &NodeCert) -> Result<quinn::ServerConfig, TlsError> {
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.clone()], PrivateKeyDer::Pkcs8(cert.key.clone_key()))?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    // No 0-RTT: replayable early data buys nothing for long-lived peer links.
    tls.max_early_data_size = 0;
    Ok(quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls)?)))
}

/// A quinn client config that accepts any server certificate (see the
/// module doc), TLS 1.3 only, ALPN `dagfold/1`.
pub fn client_config() -> Result<quinn::ClientConfig, TlsError> {
    let provider = provider();
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCert { provider }))
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?)))
}

/// Accepts any certificate chain, but checks that the server signed the
/// handshake with the key of the certificate it presented.
#[derive(Debug)]
struct AcceptAnyServerCert {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AcceptAnyServerCert {
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
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
