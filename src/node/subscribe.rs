//! `dagfold subscribe`: a client of the event subscription (docs/PROTOCOL.md).
//!
//! The node serves a scope's events only to a client that proves a
//! member's key (SPEC §10): the client presents the identity of a key file
//! (`--identity`), and with `--node KEY@ADDR` aborts unless the node proves
//! KEY. A refusal ends the command; a lost connection is retried.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use crate::net::PeerAddr;
use crate::protocol::node::*;

/// Why `dagfold subscribe` gave up (a lost connection it retries instead).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubscribeError {
    #[error("--scope takes 64 hex characters, got {0:?}")]
    Scope(String),
    /// No runtime could be made.
    #[error(transparent)]
    Runtime(#[from] std::io::Error),
    /// No endpoint to dial from.
    #[error(transparent)]
    Endpoint(#[from] crate::net::server::NetError),
    /// The identity key file could not be read or made.
    #[error(transparent)]
    Identity(#[from] KeyFileError),
    /// The node refused the subscription (SPEC §10).
    #[error("the node refused the subscription: the key {0} is not a member of the scope (or none was presented: --identity)")]
    Refused(String),
}

/// Why an identity key file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{0}: not an identity key file (64 hex characters: an Ed25519 seed)")]
    Format(String),
    #[error("{0} is open to other users; it holds a secret key (chmod 600 it)")]
    NotPrivate(String),
    #[error("identity certificate: {0}")]
    Cert(#[from] crate::net::tls::TlsError),
}

/// The Ed25519 seed kept in `path` (64 hex characters), made from the OS's
/// randomness and written owner-only (0600) if the file does not exist: a
/// client's identity (`dagfold subscribe`, the load generator).
pub fn load_or_create_key_file(path: &Path) -> Result<[u8; 32], KeyFileError> {
    let io = |source| KeyFileError::Io { path: path.display().to_string(), source };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(path).map_err(io)?.permissions().mode();
                if mode & 0o077 != 0 {
                    return Err(KeyFileError::NotPrivate(path.display().to_string()));
                }
            }
            crate::protocol::parse_hash_hex(text.trim()).ok_or_else(|| KeyFileError::Format(path.display().to_string()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use rand::RngCore;
            let mut seed = [0u8; 32];
            rand::rngs::OsRng.fill_bytes(&mut seed);
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut f = options.open(path).map_err(io)?;
            writeln!(f, "{}", hex::encode(seed)).map_err(io)?;
            f.sync_all().map_err(io)?;
            Ok(seed)
        }
        Err(e) => Err(io(e)),
    }
}


/// Why one attempt ended before its events did: printed, then retried.
#[derive(Debug, thiserror::Error)]
enum Interrupted {
    #[error(transparent)]
    Connect(#[from] crate::net::client::ConnectError),
    #[error(transparent)]
    Open(#[from] crate::net::ConnectionError),
    #[error(transparent)]
    Write(#[from] crate::net::FrameWriteError),
    #[error(transparent)]
    Read(#[from] crate::net::FrameError),
    #[error("unexpected frame on the subscription")]
    UnexpectedFrame,
}

/// Prints the events of `scope_hex` from `node`, presenting the identity in
/// the key file `identity` (anonymous without one: the node then refuses).
pub fn run(
    node: PeerAddr,
    identity: Option<&Path>,
    scope_hex: &str,
    from: u64,
    max_events: Option<u64>,
    idle_exit_ms: Option<u64>,
) -> Result<(), SubscribeError> {
    let scope = crate::protocol::parse_hash_hex(scope_hex).ok_or_else(|| SubscribeError::Scope(scope_hex.to_owned()))?;
    let seed = identity.map(load_or_create_key_file).transpose()?;
    let cert = seed.as_ref().map(crate::net::identity_cert).transpose().map_err(KeyFileError::from)?;
    let me = seed.map(|s| hex::encode(crate::protocol::sig::public_key_from_seed(&s))).unwrap_or_else(|| "(none)".to_owned());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let cfg = crate::net::ServerConfig::default();
        let bind = if node.addr.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
        let endpoint = crate::net::client::client_endpoint_as(bind.parse().unwrap(), &cfg, cert.as_ref())?;
        let mut next = from.max(1);
        let mut printed = 0u64;
        let mut backoff = 100u64;
        let idle = idle_exit_ms.map(Duration::from_millis);
        let mut last_event = std::time::Instant::now();
        loop {
            if max_events.is_some_and(|m| printed >= m) {
                return Ok(());
            }
            if idle.is_some_and(|d| last_event.elapsed() >= d) {
                return Ok(());
            }
            let attempt = async {
                let conn = crate::net::connect_peer(&endpoint, &cfg, cert.as_ref(), &node).await?;
                let (mut w, mut r) = crate::net::open_bi(&conn).await?;
                w.write(&NodeMessage::Subscribe(Subscribe { scope, from_seq: next }).encode()).await?;
                loop {
                    let read = match idle {
                        Some(d) => match tokio::time::timeout(d.saturating_sub(last_event.elapsed()), r.read()).await {
                            Ok(x) => x,
                            Err(_) => return Ok::<bool, Interrupted>(true),
                        },
                        None => r.read().await,
                    };
                    let Some(frame) = read? else { return Ok(false) };
                    match NodeMessage::decode(&frame) {
                        Some(NodeMessage::Event(e)) if e.seq >= next => {
                            next = e.seq + 1;
                            printed += 1;
                            last_event = std::time::Instant::now();
                            let line = serde_json::json!({
                                "scope": hex::encode(e.scope), "seq": e.seq, "op": hex::encode(e.op),
                                "kind": e.kind, "data": hex::encode(&e.data),
                            });
                            let mut out = std::io::stdout().lock();
                            let _ = writeln!(out, "{line}");
                            let _ = out.flush();
                            if max_events.is_some_and(|m| printed >= m) {
                                return Ok(true);
                            }
                        }
                        Some(NodeMessage::Event(_)) => {}
                        Some(NodeMessage::Lagged(l)) => {
                            eprintln!("dagfold: lagged; resubscribing from {}", l.next_seq);
                            next = l.next_seq;
                            return Ok(false);
                        }
                        _ => return Err(Interrupted::UnexpectedFrame),
                    }
                }
            };
            match attempt.await {
                Ok(true) => return Ok(()),
                Ok(false) => backoff = 100,
                Err(Interrupted::Read(crate::net::FrameError::Reset(code)))
                    if code.into_inner() == u64::from(crate::net::ERR_UNAUTHORIZED) =>
                {
                    return Err(SubscribeError::Refused(me));
                }
                Err(e) => {
                    eprintln!("dagfold: subscription interrupted ({e}); retrying from {next}");
                    backoff = (backoff * 2).min(5_000);
                }
            }
            tokio::time::sleep(Duration::from_millis(backoff)).await;
        }
    })
}
