//! `dagfold subscribe`: a client of the event subscription (docs/PROTOCOL.md).

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

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

pub fn run(node: SocketAddr, scope_hex: &str, from: u64, max_events: Option<u64>, idle_exit_ms: Option<u64>) -> Result<(), SubscribeError> {
    let scope = crate::protocol::parse_hash_hex(scope_hex).ok_or_else(|| SubscribeError::Scope(scope_hex.to_owned()))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let cfg = crate::net::ServerConfig::default();
        let endpoint = crate::net::client_endpoint("127.0.0.1:0".parse().unwrap(), &cfg)?;
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
                let conn = crate::net::connect(&endpoint, node).await?;
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
                Err(e) => {
                    eprintln!("dagfold: subscription interrupted ({e}); retrying from {next}");
                    backoff = (backoff * 2).min(5_000);
                }
            }
            tokio::time::sleep(Duration::from_millis(backoff)).await;
        }
    })
}
