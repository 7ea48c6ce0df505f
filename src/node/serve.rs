//! The node's answers over QUIC: the sink of inbound frames (core messages
//! to the pipeline, node messages to their handlers), who may see what, the
//! sync server and event subscriptions.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use super::feed::Feed;
use super::{Incoming, NodeShared};
use crate::core::{Cf, Decoded};
use crate::net::{Inbound, IngestClosed, ItemSink, Reply};
use crate::pipeline::Work;
use crate::protocol::node::*;
use crate::protocol::{Hash, PublicKey};

/// Whether a client that proved `key` may be served what reveals `scope`
/// (its events, sync, heartbeats; SPEC §10): a member (any role) in `G` at
/// the node's current governance heads, or a peer configured by key. The
/// error is the reason of the refusal, as counted.
/// The decision is `peering::may_see`'s.
pub fn may_see(shared: &NodeShared, key: Option<&PublicKey>, scope: &Hash) -> Result<(), &'static str> {
    crate::peering::may_see(
        key,
        |k| shared.peer_keys.contains(k),
        |k| shared.pipeline.status.read().unwrap().get(scope).map(|s| s.is_member(k)),
    )
}

/// Refuses a request on its stream (`ERR_UNAUTHORIZED`), counted by what was
/// asked and why.
async fn refuse(reply: &Reply, request: &'static str, reason: &'static str) {
    metrics::counter!("dagfold_requests_refused_total", "request" => request, "reason" => reason).increment(1);
    reply.refuse(crate::net::ERR_UNAUTHORIZED).await;
}

/// Sync requests collected at once over all peers: each reads up to
/// `SYNC_OPS_MAX` ops from the store; a peer asking in a tight loop waits
/// for a permit instead of taking the node's disk. A permit is held only
/// through the store walk, never while the reply is sent: a peer that reads
/// slowly holds its own reply, not the node's permits.
pub const SYNC_SERVED_CONCURRENT_MAX: usize = 2;

static SYNC_PERMITS: Semaphore = Semaphore::const_new(SYNC_SERVED_CONCURRENT_MAX);

/// Per connection (`net::Inbound::conn_id`, never reused), its sync
/// requests waiting or served, and the gate that lets one of them be served
/// at a time: one client cannot take both permits, and what its replies
/// hold while they are sent is one reply's (`SYNC_REPLY_BYTES_MAX`). A
/// connection has at most `streams_per_connection_max` requests here. One
/// node serves per process, like `SYNC_PERMITS`.
static SYNC_TURNS: Mutex<BTreeMap<u64, (Arc<Semaphore>, u32)>> = Mutex::new(BTreeMap::new());

/// A sync request's claim on its connection's turn, counted while it waits
/// or is served; the connection's entry goes with its last claim.
struct SyncClaim {
    conn: u64,
    gate: Arc<Semaphore>,
}

impl SyncClaim {
    fn new(conn: u64) -> SyncClaim {
        let mut turns = SYNC_TURNS.lock().expect("sync turns lock");
        let (gate, claims) = turns.entry(conn).or_insert_with(|| (Arc::new(Semaphore::new(1)), 0));
        *claims += 1;
        SyncClaim { conn, gate: gate.clone() }
    }
}

impl Drop for SyncClaim {
    fn drop(&mut self) {
        let mut turns = SYNC_TURNS.lock().expect("sync turns lock");
        let (_, claims) = turns.get_mut(&self.conn).expect("a claim is counted");
        *claims -= 1;
        if *claims == 0 {
            turns.remove(&self.conn);
        }
    }
}

/// Index of the configured peer a connection comes from, plus one (0: not
/// a peer): the one whose key it proved, else (a peer configured by
/// address alone) the one at its address. By key first: a peer behind a
/// NAT or a relay connects from another address than the one it is dialed
/// at.
pub fn origin_of(shared: &NodeShared, addr: &std::net::SocketAddr, key: Option<&crate::protocol::PublicKey>) -> u64 {
    let by_key = key.and_then(|k| shared.peers.iter().position(|p| p.key.as_ref() == Some(k)));
    by_key.or_else(|| shared.peers.iter().position(|p| p.key.is_none() && p.addr == *addr)).map(|i| i as u64 + 1).unwrap_or(0)
}

/// Where the transport hands each decoded frame, from its fair dispatcher
/// (`net::fair`), one origin's turn after another: ops, keys and heartbeat
/// heads go straight into the pipeline's ingest channel, node requests to
/// their handlers.
///
/// The fair dispatcher is the one step between the origins' queues and the
/// pipeline, so it does the relabelling here rather than through a second
/// queue and task: `INGEST_QUEUE_ITEMS` is the one bounded queue. While it is
/// full, `deliver` waits, the dispatcher holds the queued frames' byte
/// reservations, the stream tasks stop reading and QUIC flow control pushes
/// back on the peers.
pub struct InboundSink(pub Arc<NodeShared>);

impl ItemSink<Inbound<Incoming>> for InboundSink {
    async fn deliver(&self, inb: Inbound<Incoming>) -> Result<(), IngestClosed> {
        let shared = &self.0;
        match inb.item {
            Incoming::Core(Decoded::Op { id, op, bytes }) => {
                let origin = origin_of(shared, &inb.remote, inb.peer_key.as_ref());
                let host = Some(crate::net::fair::origin_of(inb.remote));
                shared.ingest.send(Work::Op { id, op, bytes, conn: origin, host }).await.map_err(|_| IngestClosed)?;
            }
            Incoming::Core(Decoded::Key(kd)) => {
                shared.ingest.send(Work::Key { kd, host: Some(crate::net::fair::origin_of(inb.remote)) }).await.map_err(|_| IngestClosed)?;
            }
            Incoming::Node(NodeMessage::Heartbeat(hb)) => {
                metrics::counter!("dagfold_heartbeats_received_total").increment(1);
                // The heads are noted for the configured peer that proved
                // its key (its address may not be where it listens: a NAT,
                // a relay), and that peer's link asks for them. Only the
                // scopes its key may see are heard: anything else would
                // let anyone have the node note heads to ask for, and
                // learn which scopes it holds.
                let origin = origin_of(shared, &inb.remote, inb.peer_key.as_ref());
                let heard = crate::peering::heard_scopes(
                    hb,
                    |scope| may_see(shared, inb.peer_key.as_ref(), scope),
                    |reason| metrics::counter!("dagfold_requests_refused_total", "request" => "heartbeat", "reason" => reason).increment(1),
                );
                for s in heard {
                    let w = Work::Heads { peer: inb.remote, origin, scope: s.scope, heads: s.heads, root: s.root };
                    shared.ingest.send(w).await.map_err(|_| IngestClosed)?;
                }
            }
            Incoming::Node(NodeMessage::SyncRequest(req)) => {
                if let Some(reply) = inb.reply {
                    tokio::spawn(serve_sync(shared.clone(), req, inb.conn_id, inb.peer_key, reply));
                }
            }
            Incoming::Node(NodeMessage::Subscribe(sub)) => {
                if let Some(reply) = inb.reply {
                    tokio::spawn(serve_subscription(shared.clone(), sub, inb.conn_id, inb.peer_key, reply));
                }
            }
            Incoming::Node(NodeMessage::KeysRequest(req)) => {
                if let Some(reply) = inb.reply {
                    tokio::spawn(serve_keys(shared.clone(), req, inb.peer_key, reply));
                }
            }
            Incoming::Node(_) => {
                metrics::counter!("dagfold_node_messages_unexpected_total").increment(1);
            }
        }
        Ok(())
    }
}

async fn serve_sync(shared: Arc<NodeShared>, req: SyncRequest, conn_id: u64, peer_key: Option<PublicKey>, reply: Reply) {
    // A request names its scope, or ZERO for ids of any scope (missing
    // parents): then each op is served only if its scope may be seen.
    let max = match crate::peering::sync_served(&req, peer_key.as_ref(), |scope| may_see(&shared, peer_key.as_ref(), scope)) {
        Ok(max) => max,
        Err(reason) => return refuse(&reply, "sync", reason).await,
    };
    // One request of a connection served at a time; a requester that went
    // away while waiting for its turn or a permit gets no work.
    let claim = SyncClaim::new(conn_id);
    let _turn = tokio::select! {
        t = claim.gate.acquire() => t.expect("a connection's gate is never closed"),
        _ = reply.closed() => return,
    };
    let permit = tokio::select! {
        p = SYNC_PERMITS.acquire() => p,
        _ = reply.closed() => return,
    };
    let Ok(permit) = permit else { return };
    metrics::counter!("dagfold_sync_requests_served_total").increment(1);
    let reader = shared.reader.clone();
    let sh = shared.clone();
    let visible = move |scope: &Hash| may_see(&sh, peer_key.as_ref(), scope).is_ok();
    // A read that fails (a damaged table) serves nothing of that op, and
    // says so: the op is not taken for one the node lacks.
    let get = move |id: &Hash| match reader.op(id) {
        Ok(op) => op,
        Err(e) => {
            metrics::counter!("dagfold_sync_read_errors_total").increment(1);
            eprintln!("dagfold: a sync reply left out op {}: {e}", hex::encode(id));
            None
        }
    };
    let walk = std::time::Instant::now();
    let ops = match tokio::task::spawn_blocking(move || crate::peering::collect_sync(get, &req.want, &req.have, max, &visible)).await {
        Ok(ops) => ops,
        Err(_) => return,
    };
    metrics::histogram!("dagfold_sync_walk_seconds").record(walk.elapsed().as_secs_f64());
    // Sent without the permit: a reader that does not read has its stream
    // reset by the reply writer (`REPLY_FRAME_WRITE_TIMEOUT_MS`), and one
    // that reads slowly holds only this reply and its connection's turn.
    drop(permit);
    let sent = ops.len() as u32;
    for bytes in ops {
        let mut frame = Vec::with_capacity(bytes.len() + 1);
        frame.push(crate::protocol::MESSAGE_OP);
        frame.extend_from_slice(&bytes);
        if reply.send(frame).await.is_err() {
            return;
        }
    }
    metrics::counter!("dagfold_sync_ops_served_total").increment(sent as u64);
    let _ = reply.send(NodeMessage::SyncDone(SyncDone { sent }).encode()).await;
}

/// The key deliveries this node made to the requester's proven key
/// (API.md: a member offline at rotation time gets its key when it comes
/// back). Only ever its own: a delivery names its recipient.
async fn serve_keys(shared: Arc<NodeShared>, req: KeysRequest, peer_key: Option<PublicKey>, reply: Reply) {
    let Some(key) = peer_key else { return refuse(&reply, "keys", "anonymous").await };
    let prefix = [crate::core::META_DELIVERY_PREFIX, &key[..]].concat();
    let after = (req.after_scope != crate::protocol::ZERO || req.after_key_id != crate::protocol::ZERO)
        .then(|| [&req.after_scope[..], &req.after_key_id[..]].concat());
    let reader = shared.reader.clone();
    let found = tokio::task::spawn_blocking(move || reader.records_after(Cf::Meta, &prefix, after.as_deref(), KEYS_REPLY_MAX as usize)).await;
    let Ok(Ok(found)) = found else { return };
    metrics::counter!("dagfold_keys_requests_served_total").increment(1);
    let sent = found.len() as u32;
    for (_, v) in found {
        let mut frame = Vec::with_capacity(v.len() + 1);
        frame.push(crate::protocol::MESSAGE_KEY);
        frame.extend_from_slice(&v);
        if reply.send(frame).await.is_err() {
            return;
        }
    }
    let _ = reply.send(NodeMessage::SyncDone(SyncDone { sent }).encode()).await;
}

async fn serve_subscription(shared: Arc<NodeShared>, sub: Subscribe, conn_id: u64, peer_key: Option<PublicKey>, reply: Reply) {
    if let Err(reason) = may_see(&shared, peer_key.as_ref(), &sub.scope) {
        return refuse(&reply, "subscribe", reason).await;
    }
    let key = peer_key.expect("may_see refuses the anonymous");
    // Over the node's, the connection's or the key's bound: told to come
    // back from where it asked, like a subscriber that lagged.
    let mut feed = match Feed::open(&shared.hub, &shared.reader, sub.scope, Some(key), conn_id, sub.from_seq) {
        Ok(feed) => feed,
        Err(reason) => {
            metrics::counter!("dagfold_subscriptions_refused_total", "reason" => reason).increment(1);
            let _ = reply.send(NodeMessage::Lagged(Lagged { scope: sub.scope, next_seq: sub.from_seq }).encode()).await;
            return;
        }
    };
    loop {
        let ev = tokio::select! {
            ev = feed.next() => ev,
            // The client went away: the feed's drop releases the
            // subscription now.
            _ = reply.closed() => return,
        };
        let Some(ev) = ev else {
            // The hub dropped us: the key lost the scope (a removal was
            // applied), or we fell behind: say where to resume.
            if let Err(reason) = may_see(&shared, Some(&key), &sub.scope) {
                return refuse(&reply, "subscribe", reason).await;
            }
            let _ = reply.send(NodeMessage::Lagged(Lagged { scope: sub.scope, next_seq: feed.next_seq() }).encode()).await;
            return;
        };
        if reply.send(NodeMessage::Event(Arc::unwrap_or_clone(ev)).encode()).await.is_err() {
            return;
        }
    }
}
