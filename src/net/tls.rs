//! TLS for the QUIC endpoint (SPEC §10: identities in the handshake).
//!
//! A node's certificate is self-signed X.509 whose subject public key is its
//! Ed25519 identity key ([`identity_cert`]); no other field of it means
//! anything. A node asks every client for such a certificate and accepts
//! any, or none (the client is then anonymous): [`peer_key`] gives the key a
//! connection's peer proved. A client accepts any server key, unless it
//! dials a known key (`KEY@ADDR`), when the handshake aborts unless the
//! server proves that key.
//!
//! What "proved" means here does not rest on parsing X.509: the key taken
//! from the certificate is the one that must verify the TLS 1.3
//! `CertificateVerify` signature (Ed25519 only), checked with ed25519-dalek
//! on the transcript rustls hands over. A certificate that names some other
//! key in any other field proves nothing: the Ed25519 key encoding must
//! occur in it exactly once.
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
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// An Ed25519 public key, as in the protocol (`PublicKey`).
pub type Ed25519Key = [u8; 32];

/// The one application protocol a dagfold endpoint speaks.
pub const ALPN: &[u8] = b"dagfold/1";

/// The name clients put in the TLS SNI and the server's certificate carries.
/// Not checked (see the module doc), but it must be a valid DNS name.
pub const SERVER_NAME: &str = "dagfold";

/// The stateless-reset key's file inside the TLS directory.
pub const RESET_KEY_FILE: &str = "reset-key.bin";

/// Why the TLS material or configuration could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("rustls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("quic: {0}")]
    Quic(#[from] NoInitialCipherSuite),
}

/// A certificate and its private key: an identity to present.
#[derive(Debug)]
pub struct NodeCert {
    pub cert: CertificateDer<'static>,
    pub key: PrivatePkcs8KeyDer<'static>,
}

/// The crypto provider every config here is built with.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
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
    let tmp = path.with_extension("tmp");
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

/// The DER of a PKCS#8 v1 private key for Ed25519 (RFC 8410): this fixed
/// prefix, then the 32-byte seed.
const ED25519_PKCS8_PREFIX: [u8; 16] = [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

/// The DER of an Ed25519 `SubjectPublicKeyInfo` (RFC 8410): this fixed
/// prefix, then the 32-byte key.
const ED25519_SPKI_PREFIX: [u8; 12] = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

/// A self-signed certificate over the Ed25519 key of `seed` (the node's
/// identity, or a client's): what the handshake proves (SPEC §10). Made
/// afresh at each start; only the key in it is ever read.
pub fn identity_cert(seed: &[u8; 32]) -> Result<NodeCert, TlsError> {
    let mut der = ED25519_PKCS8_PREFIX.to_vec();
    der.extend_from_slice(seed);
    let key = PrivatePkcs8KeyDer::from(der);
    let pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&key, &rcgen::PKCS_ED25519)?;
    let cert = rcgen::CertificateParams::new(vec![SERVER_NAME.to_owned()])?.self_signed(&pair)?;
    Ok(NodeCert { cert: cert.der().clone(), key })
}

/// The Ed25519 key a certificate carries: its SPKI encoding must occur in
/// the DER exactly once (so no other field can pose as it). `None` for any
/// other certificate. This alone proves nothing; [`check_handshake`] does.
pub fn ed25519_key_of_cert(der: &[u8]) -> Option<Ed25519Key> {
    let p = ED25519_SPKI_PREFIX.len();
    let mut found = None;
    for at in 0..der.len().saturating_sub(p + 31) {
        if der[at..at + p] == ED25519_SPKI_PREFIX {
            if found.is_some() {
                return None;
            }
            found = Some(der[at + p..at + p + 32].try_into().expect("32 bytes"));
        }
    }
    found
}

/// The key a connection's peer proved in the handshake (its certificate's
/// Ed25519 key, whose signature over the transcript was checked), or `None`
/// for an anonymous client.
pub fn peer_key(conn: &quinn::Connection) -> Option<Ed25519Key> {
    let certs = conn.peer_identity()?.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    ed25519_key_of_cert(certs.first()?)
}

/// TLS 1.3 `CertificateVerify` with Ed25519: the signature over the
/// transcript must verify under the key the certificate carries. This is
/// the proof of identity; nothing else about the certificate is checked.
fn check_handshake(message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
    if dss.scheme != SignatureScheme::ED25519 {
        return Err(rustls::Error::PeerIncompatible(rustls::PeerIncompatible::NoSignatureSchemesInCommon));
    }
    let key = ed25519_key_of_cert(cert.as_ref()).ok_or(rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(&key).map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let sig: [u8; 64] = dss.signature().try_into().map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadSignature))?;
    key.verify_strict(message, &ed25519_dalek::Signature::from_bytes(&sig))
        .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadSignature))?;
    Ok(HandshakeSignatureValid::assertion())
}

/// A quinn server config presenting `cert`, TLS 1.3 only, ALPN `dagfold/1`,
/// asking the client for an identity certificate and taking it or none.
/// The caller sets the transport config and connection limits on it.
pub fn server_config(cert: &NodeCert) -> Result<quinn::ServerConfig, TlsError> {
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(AnyIdentityClient))
        .with_single_cert(vec![cert.cert.clone()], PrivateKeyDer::Pkcs8(cert.key.clone_key()))?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    // No 0-RTT: replayable early data buys nothing for long-lived peer links.
    tls.max_early_data_size = 0;
    Ok(quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls)?)))
}

/// A quinn client config, TLS 1.3 only, ALPN `dagfold/1`: it presents
/// `identity` (else the client is anonymous) and accepts the server only if
/// it proves `expect` (any key when `None`).
pub fn client_config(identity: Option<&NodeCert>, expect: Option<Ed25519Key>) -> Result<quinn::ClientConfig, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ServerIdentity { expect }));
    let mut tls = match identity {
        Some(c) => builder.with_client_auth_cert(vec![c.cert.clone()], PrivateKeyDer::Pkcs8(c.key.clone_key()))?,
        None => builder.with_no_client_auth(),
    };
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?)))
}

/// The client's check of the server: an Ed25519 identity certificate, the
/// expected key if one was given, and the handshake signed by that key.
#[derive(Debug)]
struct ServerIdentity {
    expect: Option<Ed25519Key>,
}

impl ServerCertVerifier for ServerIdentity {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let key = ed25519_key_of_cert(end_entity.as_ref()).ok_or(rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        match self.expect {
            Some(k) if k != key => Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForName)),
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(rustls::PeerIncompatible::Tls12NotOffered))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        check_handshake(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

/// The server's check of a client: a certificate is asked for, not
/// required; one given must be an Ed25519 identity that signed the
/// handshake.
#[derive(Debug)]
struct AnyIdentityClient;

impl ClientCertVerifier for AnyIdentityClient {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        ed25519_key_of_cert(end_entity.as_ref()).ok_or(rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(rustls::PeerIncompatible::Tls12NotOffered))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        check_handshake(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_certificate_carries_its_key_once() {
        let seed = [7u8; 32];
        let cert = identity_cert(&seed).expect("cert");
        let public = crate::protocol::sig::public_key_from_seed(&seed);
        assert_eq!(ed25519_key_of_cert(cert.cert.as_ref()), Some(public));
    }

    #[test]
    fn a_certificate_naming_the_key_twice_names_none() {
        let cert = identity_cert(&[7u8; 32]).expect("cert");
        let mut der = cert.cert.as_ref().to_vec();
        let at = der.windows(ED25519_SPKI_PREFIX.len()).position(|w| w == ED25519_SPKI_PREFIX).expect("spki");
        let spki = der[at..at + 44].to_vec();
        der.extend_from_slice(&spki);
        assert_eq!(ed25519_key_of_cert(&der), None);
        assert_eq!(ed25519_key_of_cert(b"not a certificate"), None);
    }
}
