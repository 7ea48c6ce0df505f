//! Links to configured peers: gossip of applied ops (never back to where an
//! op came from), the heads heartbeat, and the sync client that pulls what
//! a peer's heads show we lack, or what our buffered ops wait for.
//!
//! One task per peer, one connection each (redialed with exponential
//! backoff), one long unidirectional stream for gossip and heartbeats so a
//! causal order stays causal at the peer; a sync is a bidirectional stream
//! per request, at most one in flight per peer, at most every
//! `SYNC_INTERVAL_MS`, so a missing-parent storm cannot flood a peer.
//!
//! What to send and when is decided by `peering` (sans-IO, and run by the
//! seeded simulator too): this file dials, holds the streams and timers,
//! and moves bytes.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::NodeShared;
use crate::net::{Dialer, Link, PeerAddr};
use crate::pipeline::Work;
use crate::protocol::node::*;
use crate::protocol::{Hash, ZERO};

/// Applied ops queued for gossip per node before new ones are dropped (the
/// heartbeat and sync repair what gossip drops): ~2.5 MB of 300-byte ops.
pub const GOSSIP_QUEUE_OPS: usize = 8192;
/// Gossip frames queued for a peer written to its stream in one write at
/// most (a commit's applied ops arrive together: one stream write and one
/// wake of the connection for them, not one per op).
const GOSSIP_WRITE_FRAMES_MAX: usize = 256;
pub use crate::peering::{HEARTBEAT_PAGES_PER_BEAT_MAX, KEYS_ASK_INTERVAL_MS, LACKING_NOTES_MAX, SYNC_INTERVAL_MS};
/// A sync exchange that takes longer is abandoned.
pub const SYNC_TIMEOUT_MS: u64 = 10_000;
/// Redial backoff bounds.
pub const REDIAL_MS_MIN: u64 = 100;
pub const REDIAL_MS_MAX: u64 = 5_000;

pub struct Gossip {
    /// `Message::Op` or `Message::Key` (a key delivery this node made).
    pub tag: u8,
    pub bytes: Vec<u8>,
    pub origin: u64,
    /// The op's scope: a peer is sent only the ops of scopes it may see.
    pub scope: Hash,
}

pub async fn run_peers(
    shared: Arc<NodeShared>,
    dialer: Dialer,
    mut gossip: mpsc::Receiver<Gossip>,
    shutdown: watch::Receiver<bool>,
) {
    let mut queues = Vec::new();
    for (i, addr) in shared.peers.clone().into_iter().enumerate() {
        let (tx, rx) = mpsc::channel::<(Hash, Vec<u8>)>(GOSSIP_QUEUE_OPS);
        queues.push(tx);
        tokio::spawn(peer_task(i as u64 + 1, addr, rx, shared.clone(), dialer.clone(), shutdown.clone()));
    }
    let (sent, dropped) = (metrics::counter!("dagfold_gossip_sent_total"), metrics::counter!("dagfold_gossip_dropped_total"));
    while let Some(g) = gossip.recv().await {
        if g.bytes.is_empty() {
            continue;
        }
        let mut frame = Vec::with_capacity(g.bytes.len() + 1);
        frame.push(g.tag);
        frame.extend_from_slice(&g.bytes);
        for (i, q) in queues.iter().enumerate() {
            if !crate::peering::gossip_to(g.origin, i as u64 + 1) {
                continue;
            }
            if q.try_send((g.scope, frame.clone())).is_err() {
                dropped.increment(1);
            } else {
                sent.increment(1);
            }
        }
    }
}

/// One beat's heartbeat frames to a peer that proved `peer_key`: the
/// scopes it may see (SPEC §10: all for a peer configured by key, else
/// those it is a member of), paged by `peering::heartbeat_pages`.
fn heartbeat_frames(shared: &NodeShared, peer_key: Option<&crate::protocol::PublicKey>, cursor: &mut Option<Hash>) -> Vec<Vec<u8>> {
    let Some(key) = peer_key else { return Vec::new() };
    let everything = shared.peer_keys.contains(key);
    let st = shared.pipeline.status.read().unwrap();
    let pages = crate::peering::heartbeat_pages(&st, |s| everything || s.is_member(key), cursor);
    pages.into_iter().map(|hb| NodeMessage::Heartbeat(hb).encode()).collect()
}

async fn peer_task(
    origin: u64,
    peer: PeerAddr,
    mut queue: mpsc::Receiver<(Hash, Vec<u8>)>,
    shared: Arc<NodeShared>,
    dialer: Dialer,
    shutdown: watch::Receiver<bool>,
) {
    let mut backoff = REDIAL_MS_MIN;
    while !*shutdown.borrow() {
        let link = match dialer.dial(&peer).await {
            Ok(c) => c,
            Err(e) => {
                metrics::counter!("dagfold_peer_dial_failures_total").increment(1);
                if backoff >= REDIAL_MS_MAX {
                    eprintln!("dagfold: peer {peer} unreachable: {e}");
                }
                tokio::time::sleep(Duration::from_millis(backoff)).await;
                backoff = (backoff * 2).min(REDIAL_MS_MAX);
                continue;
            }
        };
        backoff = REDIAL_MS_MIN;
        metrics::gauge!("dagfold_peers_connected").increment(1.0);
        let _ = serve_link(origin, &link, &mut queue, &shared).await;
        metrics::gauge!("dagfold_peers_connected").decrement(1.0);
        tokio::time::sleep(Duration::from_millis(backoff)).await;
    }
}

async fn serve_link(
    origin: u64,
    link: &Link,
    queue: &mut mpsc::Receiver<(Hash, Vec<u8>)>,
    shared: &Arc<NodeShared>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut send = link.open_uni().await?;
    let peer_key = link.peer_key();
    let mut cursor = None;
    // The link's timers, in ms since it came up: all due at once (the
    // first heartbeat and key ask are on connection).
    let start = tokio::time::Instant::now();
    let mut timers = crate::peering::LinkTimers::new(0, shared.cfg.heartbeat_ms.max(1));
    // The gossip queued when the link task runs, written together.
    let mut burst: Vec<(Hash, Vec<u8>)> = Vec::with_capacity(GOSSIP_WRITE_FRAMES_MAX);
    loop {
        let wake = start + Duration::from_millis(timers.next_deadline_ms());
        tokio::select! {
            n = queue.recv_many(&mut burst, GOSSIP_WRITE_FRAMES_MAX) => {
                if n == 0 {
                    return Ok(());
                }
                // A peer dialed by address alone gets only the ops of the
                // scopes its key is a member of (SPEC §10).
                let frames: Vec<&[u8]> = burst
                    .iter()
                    .filter(|(scope, _)| super::serve::may_see(shared, peer_key.as_ref(), scope).is_ok())
                    .map(|(_, f)| f.as_slice())
                    .collect();
                if !frames.is_empty() {
                    send.write_many(&frames).await?;
                }
                burst.clear();
            }
            _ = tokio::time::sleep_until(wake) => {
                let now_ms = start.elapsed().as_millis() as u64;
                let due = timers.poll(now_ms, || waiting_for_keys(shared));
                if due.beat {
                    for frame in heartbeat_frames(shared, peer_key.as_ref(), &mut cursor) {
                        send.write(&frame).await?;
                    }
                }
                if due.sync {
                    // The round reads the store (`sync_requests`): off the
                    // runtime's thread, as the answers' walks are.
                    let sh = shared.clone();
                    let reqs = tokio::task::spawn_blocking(move || sync_requests(origin, &sh)).await.unwrap_or_default();
                    for req in reqs {
                        let fut = sync_once(origin, link, req, shared);
                        match tokio::time::timeout(Duration::from_millis(SYNC_TIMEOUT_MS), fut).await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => return Err(e),
                            Err(_) => metrics::counter!("dagfold_sync_timeouts_total").increment(1),
                        }
                    }
                }
                if due.keys {
                    let fut = ask_keys(link, shared);
                    match tokio::time::timeout(Duration::from_millis(SYNC_TIMEOUT_MS), fut).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return Err(e),
                        Err(_) => metrics::counter!("dagfold_sync_timeouts_total").increment(1),
                    }
                }
            }
            _ = link.closed() => return Ok(()),
        }
    }
}

/// Whether any op of any scope waits for a key (SPEC §11's `key_waiting`,
/// `data_key_waiting`).
fn waiting_for_keys(shared: &NodeShared) -> bool {
    shared.pipeline.status.read().unwrap().values().any(|s| s.key_waiting + s.data_key_waiting > 0)
}

/// Asks the peer for every key delivery it made to this node, page by page
/// (`docs/PROTOCOL.md`, "Key deliveries"), into the pipeline: a delivery
/// already held is ignored there.
async fn ask_keys(link: &Link, shared: &Arc<NodeShared>) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (mut after_scope, mut after_key_id) = (ZERO, ZERO);
    loop {
        let (mut w, mut r) = link.open_bi().await?;
        w.write(&NodeMessage::KeysRequest(KeysRequest { after_scope, after_key_id }).encode()).await?;
        let _ = w.finish();
        let mut got = 0u32;
        while let Some(frame) = r.read().await? {
            let Ok(crate::core::Decoded::Key(kd)) = crate::core::decode_frame(&frame) else { break };
            got += 1;
            (after_scope, after_key_id) = (kd.scope, kd.key_id);
            if shared.ingest.send(Work::Key { kd, host: None }).await.is_err() {
                return Ok(());
            }
        }
        metrics::counter!("dagfold_keys_received_on_request_total").increment(got as u64);
        if got < KEYS_REPLY_MAX {
            return Ok(());
        }
    }
}

/// What to ask the configured peer `origin` for now
/// (`peering::sync_requests`): heads its heartbeat showed we lack, then the
/// ids our buffered ops wait for.
fn sync_requests(origin: u64, shared: &NodeShared) -> Vec<SyncRequest> {
    let lacking = {
        let mut notes = shared.pipeline.lacking.lock().unwrap();
        let taken = notes.take_for(origin);
        metrics::gauge!("dagfold_lacking_notes").set(notes.len() as f64);
        taken
    };
    let ours = |scope: &Hash| -> Vec<Hash> {
        let st = shared.pipeline.status.read().unwrap();
        st.get(scope).map(|s| s.governance_heads.iter().chain(&s.data_heads).copied().collect()).unwrap_or_default()
    };
    let wanted = shared.pipeline.wanted.lock().unwrap().clone();
    // Applied since the note: stored (a point read per noted head, at most
    // `LACKING_NOTES_MAX` notes of `HEARTBEAT_HEADS_MAX`; the newest ops,
    // mostly in the memtable).
    let known = |id: &Hash| shared.reader.get(crate::core::Cf::Ops, id).ok().flatten().is_some();
    crate::peering::sync_requests(lacking, known, ours, wanted)
}

async fn sync_once(
    origin: u64,
    link: &Link,
    req: SyncRequest,
    shared: &Arc<NodeShared>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    metrics::counter!("dagfold_sync_requests_sent_total").increment(1);
    let (mut w, mut r) = link.open_bi().await?;
    w.write(&NodeMessage::SyncRequest(req).encode()).await?;
    let _ = w.finish();
    let mut received = 0u64;
    while let Some(frame) = r.read().await? {
        match crate::core::decode_frame(&frame) {
            Ok(crate::core::Decoded::Op { id, op, bytes }) => {
                received += 1;
                // A reply to our own request: not weighed (it does not go
                // through the server's ingest).
                if shared.ingest.send(Work::Op { id, op, bytes, conn: origin, host: None }).await.is_err() {
                    break;
                }
            }
            _ => {
                if let Some(NodeMessage::SyncDone(_)) = NodeMessage::decode(&frame) {
                    break;
                }
                metrics::counter!("dagfold_sync_unexpected_frames_total").increment(1);
                break;
            }
        }
    }
    metrics::counter!("dagfold_sync_ops_received_total").increment(received);
    Ok(())
}
