//! Worker threads and bounded channels around the sans-IO core.
//!
//! ```text
//! transport ─ingest─▶ batcher ─▶ verifier × N ─▶ authorizer ─▶ decryptor ─▶ orderer ─▶ projector ─▶ committer
//!  (tokio mpsc)        (seq)     (batch verify)  (G at cut,     (opens with   (Engine:   (fold, roots,  (RocksDB batch,
//!                                                 replica)       keyring)      verdicts,  convergence   fsync, then
//!                                                                              DAG,       checks, cell  events, gossip)
//!                                                                              cascade)   writes)
//! ```
//!
//! Every channel is bounded and carries batches. When a stage falls behind,
//! the channels before it fill, the batcher stops taking from the ingest
//! channel, the transport's stream tasks stop reading, and QUIC flow control
//! pushes back on senders: memory stays bounded under any load.
//!
//! The threads only move work. The engine decides everything; the
//! authorizer and decryptor compute, ahead of it, pure functions of an op
//! (its verdict at its cut from a replica of the governance index that holds
//! only accepted ops; its payload opened with a self-certifying key), which
//! the engine uses on the op's first judgement. The cascade runs inside the
//! orderer, through the same judging code. The fold of the applied data ops
//! (SPEC §8), which no verdict depends on, runs after the orderer on the
//! projector thread (`core::Projector`), commit by commit, so that a long
//! cascade's folds and root checks overlap with the judging of its next
//! part. Verifier batches may finish out
//! of order; the authorizer restores the ingest order so that a causally
//! ordered stream stays causally ordered (no needless pending buffering).

mod gate;
mod verified;

use crate::clock::now_ms;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use metrics::{counter, gauge, histogram};

use crate::core::governance::Governance;
use crate::core::{authorize_at, Commit, Engine, Outcome, Prepared, Projector, ScopeStatus, VerifiedOp, Write};
use crate::protocol::crypto::open_payload;
use crate::protocol::{Hash, KeyDelivery, Op, OpKind};
use crate::store::Store;

/// Where a message came from: a transport connection id, 0 for local.
pub type Origin = u64;

/// One message for the pipeline, decoded by the transport.
#[derive(Debug)]
pub enum Work {
    /// `host`: the origin (`net::fair::origin_of`) it came in from over
    /// the server, whose turn the node weighs by what its ops come to.
    Op { id: Hash, op: Op, bytes: Vec<u8>, origin: Origin, host: Option<std::net::IpAddr> },
    Key(KeyDelivery),
    /// A frame that did not decode (already counted by the transport); it
    /// is passed on so that the engine's counts match `import`'s.
    Malformed,
    /// A peer's heartbeat heads, to find what we lack (see `net::sync`).
    Heads { peer: std::net::SocketAddr, scope: Hash, heads: Vec<Hash>, root: Hash },
}

struct Item {
    work: Work,
    valid: bool,
    pre: Prepared,
}

struct Batch {
    seq: u64,
    items: Vec<Item>,
    received: Instant,
}

impl Batch {
    /// What the batch holds, for the orderer's byte budget: each op's
    /// encoding, decoded form (about as large) and plaintext.
    fn bytes(&self) -> u64 {
        self.items
            .iter()
            .map(|i| match &i.work {
                Work::Op { bytes, .. } => 2 * bytes.len() as u64 + i.pre.opened.as_ref().map_or(0, |o| o.as_ref().map_or(0, |p| p.len() as u64)) + 64,
                _ => 256,
            })
            .sum()
    }
}

/// Batches queued for the orderer: long, so that verification goes on
/// through a cascade (thousands of ops, tens of ms of verifier work),
/// and bounded in bytes by `ORDER_QUEUE_BYTES_MAX`.
const ORDER_QUEUE_BATCHES: usize = 128;
const ORDER_QUEUE_BYTES_MAX: u64 = 32 << 20;

#[derive(Clone, Debug)]
pub struct PipelineConfig {
    pub verifier_threads: usize,
    /// Ops per signature batch at most (the batcher takes what is queued,
    /// lingering up to `BATCH_LINGER` while it has fewer than
    /// `BATCH_LINGER_UNTIL`). Past ~190 points the
    /// multiscalar multiplication switches from Straus to Pippenger, ~20%
    /// less per signature (`cargo bench --bench verify`: 36k/s at 64, 44k/s
    /// at 256 with distinct keys; in the node, causal, 7-23% less verifier
    /// CPU than at 64, half-rate p99 unchanged), and Pippenger's windows
    /// widen with the batch: with four keys (`batch_four_keys`, session 11)
    /// 200k/s at 256, 215k/s at 512, 222k/s at 1024. 512 takes most of
    /// that while a batch with a forgery in it, bisected, still re-verifies
    /// only 512 ops (~2.4 ms of a verifier at most).
    pub verify_batch_max: usize,
    /// Batches queued between two stages. 4: enough to keep every stage
    /// busy across a verifier's batch, small enough to bound memory at
    /// ~4 × 512 × frame size per channel.
    pub stage_queue_batches: usize,
    /// Ops the orderer folds into one commit at most (group commit): the
    /// WAL sync (~90 µs) is shared by them. Also the woken ops a cascade
    /// judges per commit (`Engine::set_cascade_budget`).
    pub commit_ops_max: usize,
    /// Sync the WAL on every commit (durable); off trades the last commits
    /// on a power loss for speed (a process crash loses nothing either way).
    pub sync: bool,
    /// How often the orderer wakes to expire key waits when idle.
    pub tick_ms: u64,
    /// Hand the encodings of applied ops to `on_durable` (for gossip); off
    /// when the node has no peers, which saves a copy of every op.
    pub applied_bytes: bool,
    /// Where the orderer sets each host's items per turn in the server's
    /// fair ingest (see `host_turn`); none outside the node.
    pub origin_turns: Option<Arc<crate::net::fair::OriginTurns>>,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            verifier_threads: 2,
            verify_batch_max: 512,
            stage_queue_batches: 4,
            commit_ops_max: 4096,
            sync: true,
            tick_ms: 100,
            applied_bytes: true,
            origin_turns: None,
        }
    }
}

/// A committed, durable batch, for the node's side effects.
pub struct Durable {
    pub events: Vec<crate::core::EventOut>,
    /// Applied ops: id, scope, encoding, origin (0 if woken by a cascade).
    pub applied: Vec<(Hash, Hash, Vec<u8>, Origin)>,
}

/// What the pipeline shares with the rest of the node.
pub struct Shared {
    /// SPEC §11 status of every scope with an applied genesis, as durable.
    pub status: RwLock<BTreeMap<Hash, ScopeStatus>>,
    /// Set once a store write failed: the node accepts nothing more.
    pub refusing: AtomicBool,
    pub refusing_reason: Mutex<Option<String>>,
    pub applied_total: AtomicU64,
    pub buffered_ops: AtomicU64,
    pub buffered_bytes: AtomicU64,
    /// Ids buffered ops wait for and nobody has sent yet (sync asks for them).
    pub wanted: Mutex<Vec<Hash>>,
    /// Heads of peers that we lack, per scope (sync asks for them).
    pub lacking: Mutex<Vec<(std::net::SocketAddr, Hash, Vec<Hash>)>>,
    pub divergences_heartbeat: AtomicU64,
    /// One past the number of the last commit written (0: none yet).
    pub durable_commits: AtomicU64,
}

/// A commit on its way from the orderer to the projector: the statuses'
/// roots are the projector's to fill, and the heartbeat roots to compare.
struct ToProject {
    commit: Commit,
    statuses: Vec<ScopeStatus>,
    origins: Vec<Origin>,
    received: Instant,
    heartbeats: Vec<HeartbeatCheck>,
}

/// A peer's heartbeat with the same heads as ours: its root is compared
/// with ours once the first `at` folds of its commit are folded.
struct HeartbeatCheck {
    at: usize,
    peer: std::net::SocketAddr,
    scope: Hash,
    root: Hash,
}

type ToCommit = (Commit, Vec<ScopeStatus>, Vec<Origin>, Instant);

pub struct Pipeline {
    pub shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}


impl Pipeline {
    /// Starts the stage threads. `ingest` is fed by the transport; the
    /// committer hands every durable batch to `on_durable`. Dropping every
    /// sender of `ingest` drains the pipeline and stops the threads.
    pub fn start<S: Store + 'static>(
        cfg: PipelineConfig,
        mut engine: Engine,
        store: S,
        ingest: tokio::sync::mpsc::Receiver<Work>,
        on_durable: Box<dyn FnMut(Durable) + Send>,
    ) -> Pipeline {
        assert!(cfg.verifier_threads >= 1 && cfg.verify_batch_max >= 1);
        engine.set_cascade_budget(cfg.commit_ops_max as u64);
        // Replicas fed by the orderer from what the engine accepted.
        let gov_replica = Arc::new(RwLock::new(Governance::default()));
        let keyring: Arc<RwLock<HashMap<Hash, [u8; 32]>>> = Arc::new(RwLock::new(HashMap::new()));
        // Seed the replicas from the engine as restored from disk.
        {
            let mut g = gov_replica.write().unwrap();
            for (id, node) in engine.governance_nodes() {
                g.insert(id, node);
            }
            let mut k = keyring.write().unwrap();
            for key in engine.keys() {
                k.insert(crate::protocol::crypto::key_id_of(&key), key);
            }
        }
        let shared = Arc::new(Shared {
            status: RwLock::new(BTreeMap::new()),
            refusing: AtomicBool::new(false),
            refusing_reason: Mutex::new(None),
            applied_total: AtomicU64::new(engine.applied_total()),
            buffered_ops: AtomicU64::new(0),
            buffered_bytes: AtomicU64::new(0),
            wanted: Mutex::new(Vec::new()),
            lacking: Mutex::new(Vec::new()),
            divergences_heartbeat: AtomicU64::new(0),
            durable_commits: AtomicU64::new(0),
        });
        {
            let mut st = shared.status.write().unwrap();
            for id in engine.scope_ids() {
                if let Some(s) = engine.status(&id) {
                    st.insert(id, s);
                }
            }
        }
        // From here the engine leaves its folds to the projector thread.
        let projection = engine.take_projector();
        let q = cfg.stage_queue_batches;
        let (verify_tx, verify_rx) = bounded::<Batch>(q);
        let (auth_tx, auth_rx) = bounded::<Batch>(q);
        let (dec_tx, dec_rx) = bounded::<Batch>(q);
        let (order_tx, order_rx) = bounded::<Batch>(ORDER_QUEUE_BATCHES.max(q));
        let order_gate = Arc::new(gate::ByteGate::new(ORDER_QUEUE_BYTES_MAX));
        // Group commit: while the committer syncs commit N, the orderer
        // builds N+1 and hands it over as soon as a slot is free. Two
        // slots, so that one commit can wait while N is written: out of
        // order the work swings between the stages (parking is light for
        // the orderer and heavy for the committer, a cascade the reverse),
        // and with one slot the orderer waited 0.65–0.87 s per 200k
        // shuffled ops, with two 0.43–0.67 s (ARCHITECTURE.md).
        // The projector sits between them, with as many slots on either
        // side: a commit is folded while the one before it is written.
        let (project_tx, project_rx) = bounded::<ToProject>(COMMIT_SLOTS);
        let (commit_tx, commit_rx) = bounded::<ToCommit>(COMMIT_SLOTS);
        // Queue depths, sampled by the orderer for the metrics.
        let probes: Vec<(&'static str, Receiver<Batch>)> =
            vec![("verify", verify_rx.clone()), ("authorize", auth_rx.clone()), ("decrypt", dec_rx.clone()), ("order", order_rx.clone())];
        let mut threads = Vec::new();
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(f).expect("spawning a pipeline thread")
        };

        let batch_max = cfg.verify_batch_max;
        threads.push(spawn("dagfold-batcher", Box::new(move || batcher(ingest, verify_tx, batch_max))));
        let verified = Arc::new(verified::VerifiedCache::new(verified::VERIFIED_SLOTS));
        for i in 0..cfg.verifier_threads {
            let (rx, tx, cache) = (verify_rx.clone(), auth_tx.clone(), verified.clone());
            threads.push(spawn(&format!("dagfold-verifier-{i}"), Box::new(move || verifier(rx, tx, &cache))));
        }
        drop((verify_rx, auth_tx));
        let g = gov_replica.clone();
        threads.push(spawn("dagfold-authorizer", Box::new(move || authorizer(auth_rx, dec_tx, g))));
        let k = keyring.clone();
        let gate_in = order_gate.clone();
        threads.push(spawn("dagfold-decryptor", Box::new(move || decryptor(dec_rx, order_tx, k, &gate_in))));
        let sh = shared.clone();
        let commit_ops_max = cfg.commit_ops_max;
        let tick_ms = cfg.tick_ms;
        let turns = cfg.origin_turns.clone();
        threads.push(spawn(
            "dagfold-orderer",
            Box::new(move || {
                let o = OrdererIo { gov: gov_replica, keyring, probes, turns, gate: order_gate.clone() };
                orderer(&mut engine, order_rx, project_tx, sh, o, commit_ops_max, tick_ms);
                order_gate.close();
            }),
        ));
        let sh = shared.clone();
        threads.push(spawn("dagfold-projector", Box::new(move || projector(projection, project_rx, commit_tx, sh))));
        let sh = shared.clone();
        let (sync, applied_bytes) = (cfg.sync, cfg.applied_bytes);
        threads.push(spawn(
            "dagfold-committer",
            Box::new(move || committer(store, commit_rx, sh, sync, applied_bytes, on_durable)),
        ));
        Pipeline { shared, threads }
    }

    /// Waits for every stage to drain and stop (after the ingest closed).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// How long a batch smaller than `BATCH_LINGER_UNTIL` waits for more
/// items, in steps of `BATCH_LINGER_STEP`.
const BATCH_LINGER: Duration = Duration::from_micros(1000);
const BATCH_LINGER_STEP: Duration = Duration::from_micros(200);
const BATCH_LINGER_UNTIL: usize = 64;

fn batcher(mut ingest: tokio::sync::mpsc::Receiver<Work>, out: Sender<Batch>, batch_max: usize) {
    let mut seq = 0u64;
    while let Some(first) = ingest.blocking_recv() {
        let received = Instant::now();
        let mut items = vec![Item { work: first, valid: false, pre: Prepared::default() }];
        loop {
            while items.len() < batch_max {
                match ingest.try_recv() {
                    Ok(w) => items.push(Item { work: w, valid: false, pre: Prepared::default() }),
                    Err(_) => break,
                }
            }
            // A small batch lingers a little for more: per signature a
            // batch of 20 costs about twice one of 200, and under a
            // moderate load that doubled the verifiers' CPU.
            if items.len() >= BATCH_LINGER_UNTIL.min(batch_max) || received.elapsed() >= BATCH_LINGER {
                break;
            }
            std::thread::sleep(BATCH_LINGER_STEP);
        }
        histogram!("dagfold_batch_ops").record(items.len() as f64);
        if out.send(Batch { seq, items, received }).is_err() {
            return;
        }
        seq += 1;
    }
}

fn verifier(rx: Receiver<Batch>, tx: Sender<Batch>, cache: &verified::VerifiedCache) {
    lower_priority(VERIFIER_NICE);
    // 1 when `R` points are decompressed with AVX-512 IFMA (the CPU has it
    // and the self-test against dalek passed), 0 on dalek's serial path.
    gauge!("dagfold_verify_ifma_decompression").set(if crate::protocol::decompress::accelerated() { 1.0 } else { 0.0 });
    let verified_total = counter!("dagfold_verified_total");
    let skipped_total = counter!("dagfold_verify_known_copies_total");
    for mut batch in rx {
        let t = Instant::now();
        note_age("verify", batch.received);
        let ops: Vec<(&Hash, &Op)> = batch
            .items
            .iter()
            .filter_map(|i| match &i.work {
                Work::Op { id, op, .. } => Some((id, op)),
                _ => None,
            })
            .collect();
        // Copies of ops verified before are valid as they are (verified.rs).
        let known = cache.known_valid(ops.iter().map(|(id, op)| (*id, &op.signature)));
        let sigs: Vec<([u8; 32], [u8; 32], [u8; 64])> = ops
            .iter()
            .zip(&known)
            .filter(|(_, k)| !**k)
            .map(|((id, op), _)| (op.author, **id, op.signature))
            .collect();
        let mut checked = crate::protocol::sig::verify_batch(&sigs).into_iter();
        let valid: Vec<bool> = known.iter().map(|&k| k || checked.next().expect("one verdict per op checked")).collect();
        cache.record(
            ops.iter().zip(known.iter().zip(&valid)).filter(|(_, (k, v))| !**k && **v).map(|((id, op), _)| (*id, &op.signature)),
        );
        drop(ops);
        let mut valid_of_op = valid.iter();
        for i in &mut batch.items {
            if matches!(i.work, Work::Op { .. }) {
                i.valid = *valid_of_op.next().expect("one per op");
            }
        }
        histogram!("dagfold_stage_seconds", "stage" => "verify").record(t.elapsed().as_secs_f64());
        verified_total.increment(sigs.len() as u64);
        skipped_total.increment((known.len() - sigs.len()) as u64);
        if tx.send(batch).is_err() {
            return;
        }
    }
}

/// How long after the batcher closed it a batch (for the projector and
/// the committer: the oldest batch of a commit) reached a stage: where the
/// end-to-end time goes (`dagfold_end_to_end_seconds` is the last step).
fn note_age(at: &'static str, received: Instant) {
    histogram!("dagfold_batch_age_seconds", "at" => at).record(received.elapsed().as_secs_f64());
}

/// Sets the calling thread's niceness; should it fail, the thread runs as
/// before.
fn lower_priority(nice: i32) {
    if !crate::niceness::lower_this_thread(nice) && cfg!(target_os = "linux") {
        eprintln!("dagfold: could not lower the priority of {:?}", std::thread::current().name());
    }
}

fn authorizer(rx: Receiver<Batch>, tx: Sender<Batch>, gov: Arc<RwLock<Governance>>) {
    // Restores ingest order; holds at most the batches in flight.
    let mut next = 0u64;
    let mut held: BTreeMap<u64, Batch> = BTreeMap::new();
    for batch in rx {
        held.insert(batch.seq, batch);
        while let Some(mut batch) = held.remove(&next) {
            next += 1;
            let t = Instant::now();
            note_age("authorize", batch.received);
            let mut g = gov.write().expect("governance replica lock");
            for i in &mut batch.items {
                let Work::Op { op, .. } = &i.work else { continue };
                if !i.valid || op.kind() == OpKind::Genesis {
                    continue;
                }
                let cut = op.cut_ids();
                if cut.iter().all(|c| g.get(c).is_some()) {
                    // A cut of another plane or scope is judged wrong_plane by
                    // the engine before this result is ever read.
                    i.pre.auth = Some(authorize_at(&g.state_at(cut), op));
                }
            }
            drop(g);
            histogram!("dagfold_stage_seconds", "stage" => "authorize").record(t.elapsed().as_secs_f64());
            if tx.send(batch).is_err() {
                return;
            }
        }
    }
}

fn decryptor(rx: Receiver<Batch>, tx: Sender<Batch>, keyring: Arc<RwLock<HashMap<Hash, [u8; 32]>>>, gate: &gate::ByteGate) {
    for mut batch in rx {
        let t = Instant::now();
        note_age("decrypt", batch.received);
        {
            let keys = keyring.read().expect("keyring lock");
            for i in &mut batch.items {
                let Work::Op { op, .. } = &i.work else { continue };
                // Only ops authorized ahead: others may never need opening.
                if !i.valid || i.pre.auth != Some(crate::core::PreAuth::Ok) {
                    continue;
                }
                if let Some(key) = keys.get(&op.key_id) {
                    i.pre.opened = Some(open_payload(key, &op.nonce, &op.scope, op.plane, &op.payload));
                }
            }
        }
        histogram!("dagfold_stage_seconds", "stage" => "decrypt").record(t.elapsed().as_secs_f64());
        if !gate.acquire(batch.bytes()) || tx.send(batch).is_err() {
            return;
        }
    }
}

#[allow(clippy::too_many_arguments)]
/// What the orderer updates beside the engine: the stages' replicas, the
/// queue probes for metrics, and the server's turns per host.
struct OrdererIo {
    gov: Arc<RwLock<Governance>>,
    keyring: Arc<RwLock<HashMap<Hash, [u8; 32]>>>,
    probes: Vec<(&'static str, Receiver<Batch>)>,
    turns: Option<Arc<crate::net::fair::OriginTurns>>,
    /// The byte budget of the orderer's input queue.
    gate: Arc<gate::ByteGate>,
}

/// What a host's ops came to, recently: the share of them applied (or
/// waiting for their key), as a moving average over commits, starting at
/// 1. Its turn in the server's fair ingest shrinks with it, so that under
/// contention a host whose ops are pending for ever, evicted, dropped or
/// duplicates gets less of the node than one whose ops apply. It only
/// matters when several hosts have work waiting: a host alone keeps the
/// whole node, whatever its score.
fn host_turn(score: f32) -> usize {
    let span = (crate::net::fair::TURN_ITEMS - crate::net::fair::TURN_ITEMS_MIN) as f32;
    crate::net::fair::TURN_ITEMS_MIN + (span * score.clamp(0.0, 1.0)).round() as usize
}

/// Weight of one commit's share in a host's score.
const HOST_SCORE_ALPHA: f32 = 0.2;

/// Hosts scored at once; beyond, those back near 1 (the default) are
/// forgotten first.
const HOSTS_SCORED_MAX: usize = 4096;

fn orderer(
    engine: &mut Engine,
    rx: Receiver<Batch>,
    commit_tx: Sender<ToProject>,
    shared: Arc<Shared>,
    io: OrdererIo,
    commit_ops_max: usize,
    tick_ms: u64,
) {
    let OrdererIo { gov, keyring, probes, turns, gate } = io;
    let mut hosts: crate::core::IdMap<std::net::IpAddr, (u32, u32)> = Default::default();
    let mut scores: crate::core::IdMap<std::net::IpAddr, f32> = Default::default();
    let mut origins: HashMap<Hash, Origin> = HashMap::new();
    let mut status_pending: std::collections::BTreeSet<Hash> = std::collections::BTreeSet::new();
    let mut last_status = Instant::now();
    let mut last_wanted = Instant::now();
    // Stale from the start: a restored engine may hold pending ops whose
    // missing ids nothing else will ask peers for.
    let mut wanted_stale = true;
    let mut last_received = Instant::now();
    let mut open = true;
    let waited_commit = WaitCounter::new("commit");
    let waited_input = WaitCounter::new("input");
    let mut heartbeats: Vec<HeartbeatCheck> = Vec::new();
    while open || engine.cascade_remaining() {
        // Group commit: keep folding batches into this commit while the
        // previous one still waits for the committer (a slot is taken), up
        // to `commit_ops_max` applied ops (`COMMIT_ITEMS_FACTOR`); hand it
        // over as soon as none waits.
        let mut items_in_commit = 0usize;
        let mut t = Instant::now();
        let cascaded = engine.cascade_remaining();
        if cascaded {
            // A long cascade goes in parts of `commit_ops_max` woken ops, one
            // commit each, so the committer writes one part while the
            // orderer judges the next; new batches wait until it is done
            // (the rest of the batch that started it was handled with it,
            // each item adding to the same work list, which order does not
            // change: a verdict depends only on the op and what is applied).
            engine.continue_cascade(now_ms());
        }
        while !engine.cascade_remaining() {
            // Idle, wait for input up to a tick; with work in hand (folded
            // items, or the last part of a cascade just judged), only
            // briefly, so that it is committed at once when nothing comes.
            let idle = items_in_commit == 0 && !cascaded;
            let wait = if idle { Duration::from_millis(tick_ms) } else { Duration::from_micros(200) };
            let t_recv = Instant::now();
            let got = rx.recv_timeout(wait);
            waited_input.increment(t_recv.elapsed());
            if idle {
                // The step's time (the "order" stage) starts with its work.
                t = Instant::now();
            }
            match got {
                Ok(batch) => {
                    note_age("order", batch.received);
                    gate.release(batch.bytes());
                    last_received = last_received.min(batch.received);
                    items_in_commit += batch.items.len();
                    for item in batch.items {
                        handle_item(engine, item, &shared, &mut origins, &mut hosts, &mut heartbeats);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    open = false;
                    break;
                }
            }
            if items_in_commit == 0
                || engine.applied_in_commit() >= commit_ops_max
                || items_in_commit >= COMMIT_ITEMS_FACTOR * commit_ops_max
                || commit_tx.is_empty()
            {
                break;
            }
        }
        flush_verdicts();
        engine.handle_tick(now_ms());
        // Ops applied by durable commits may leave the in-memory index.
        let durable = shared.durable_commits.load(Ordering::Acquire);
        if durable > 0 {
            engine.note_durable(durable - 1);
        }
        let commit = engine.take_commit();
        if let Some(turns) = &turns {
            for (h, (useful, total)) in hosts.drain() {
                let s = scores.entry(h).or_insert(1.0);
                *s += HOST_SCORE_ALPHA * (useful as f32 / total as f32 - *s);
                turns.set(h, host_turn(*s));
            }
            if scores.len() > HOSTS_SCORED_MAX {
                scores.retain(|_, s| *s < 0.95);
                if scores.len() > HOSTS_SCORED_MAX {
                    scores.clear();
                }
            }
        } else {
            hosts.clear();
        }
        status_pending.extend(engine.take_touched_scopes());
        // Statuses (and so the scope roots) are computed when the input is
        // drained, and under load at most every STATUS_INTERVAL: the root
        // rehash then shares the upper levels of the tree across commits. A
        // data op entering its in-memory key wait writes nothing but still
        // changes the status.
        let want_status =
            !status_pending.is_empty() && (rx.is_empty() || last_status.elapsed() >= STATUS_INTERVAL);
        // The ids to ask peers for: `wanted` prunes the ids waited on that
        // were unknown (up to one per buffered op under an orphan flood).
        // Syncs read it once a heartbeat (≥ 200 ms apart), so it is
        // refreshed at most every WANTED_INTERVAL, idle ticks included.
        wanted_stale |= !commit.is_empty() || !commit.applied.is_empty() || want_status;
        if wanted_stale && last_wanted.elapsed() >= WANTED_INTERVAL {
            last_wanted = Instant::now();
            wanted_stale = false;
            *shared.wanted.lock().unwrap() = engine.wanted(crate::protocol::node::SYNC_IDS_MAX);
        }
        if commit.is_empty() && commit.applied.is_empty() && !want_status && heartbeats.is_empty() {
            last_received = Instant::now();
            continue;
        }
        histogram!("dagfold_stage_seconds", "stage" => "order").record(t.elapsed().as_secs_f64());
        // Feed the replicas before the next batch reaches the authorizer.
        if !commit.gov_applied.is_empty() {
            let mut g = gov.write().expect("governance replica lock");
            for (id, node) in &commit.gov_applied {
                g.insert(*id, node.clone());
            }
        }
        if !commit.keys_added.is_empty() {
            let mut k = keyring.write().expect("keyring lock");
            for key in &commit.keys_added {
                k.insert(crate::protocol::crypto::key_id_of(key), *key);
            }
        }
        let statuses: Vec<ScopeStatus> = if want_status {
            last_status = Instant::now();
            let v: Vec<ScopeStatus> = std::mem::take(&mut status_pending).iter().filter_map(|s| engine.status(s)).collect();
            histogram!("dagfold_stage_seconds", "stage" => "status").record(last_status.elapsed().as_secs_f64());
            v
        } else {
            Vec::new()
        };
        let applied_origins: Vec<Origin> =
            commit.applied.iter().map(|(id, _)| origins.remove(id).unwrap_or(0)).collect();
        origins.clear();
        let (bo, bb) = engine.buffered_total();
        shared.buffered_ops.store(bo, Ordering::Relaxed);
        shared.buffered_bytes.store(bb, Ordering::Relaxed);
        gauge!("dagfold_buffered_ops").set(bo as f64);
        gauge!("dagfold_buffered_bytes").set(bb as f64);
        publish_engine_stats(engine);
        for (stage, rx) in &probes {
            gauge!("dagfold_queue_batches", "stage" => *stage).set(rx.len() as f64);
        }
        gauge!("dagfold_queue_batches", "stage" => "project").set(commit_tx.len() as f64);
        gauge!("dagfold_order_queue_bytes").set(gate.held() as f64);
        // Both slots taken: the projector (or, behind it, the committer) is
        // behind, and the time spent here is the orderer waiting for it.
        let t_send = Instant::now();
        let heartbeats = std::mem::take(&mut heartbeats);
        if commit_tx.send(ToProject { commit, statuses, origins: applied_origins, received: last_received, heartbeats }).is_err() {
            return;
        }
        waited_commit.increment(t_send.elapsed());
        last_received = Instant::now();
    }
}

/// A commit closes at `commit_ops_max` applied ops, or at this many times
/// as many received items when most of them park, are duplicates or drop.
/// In order, every item applies and the commit size is unchanged; out of
/// order, a bigger commit releases more of the ops it parked, whose pending
/// put and delete then cancel (`Engine::take_commit`) instead of both going
/// to the WAL.
const COMMIT_ITEMS_FACTOR: usize = 4;

/// Commits built and not yet taken by the committer, at most (see `start`).
const COMMIT_SLOTS: usize = 2;

/// Niceness of the verifier threads. The orderer and the committer are each
/// one thread, and every op passes through both in turn: when the two cores
/// are contended, time given to them is throughput, while the verifiers
/// work ahead of the orderer (its queue is full under load) and lose nothing
/// by waiting. A verifier is the first to yield the core, never starved:
/// CFS still gives it about a tenth of a core against a busy thread, and all
/// of whatever is idle. Shuffled, 200k ops, this alone, three pairs: node
/// CPU 1.55–1.66 → 1.71–1.78 cores of 2 (ARCHITECTURE.md).
const VERIFIER_NICE: i32 = 10;

/// The longest a busy node lets its published status lag behind its
/// durable state. Computing roots once per commit cost ~18 SHA-256 per
/// changed cell at 40k cells; at most every 20 ms, ~12.
const STATUS_INTERVAL: Duration = Duration::from_millis(20);

/// How stale the ids wanted from peers may get (see the orderer).
const WANTED_INTERVAL: Duration = Duration::from_millis(100);

fn handle_item(
    engine: &mut Engine,
    item: Item,
    shared: &Shared,
    origins: &mut HashMap<Hash, Origin>,
    hosts: &mut crate::core::IdMap<std::net::IpAddr, (u32, u32)>,
    heartbeats: &mut Vec<HeartbeatCheck>,
) {
    if shared.refusing.load(Ordering::Relaxed) {
        counter!("dagfold_refused_while_failed_total").increment(1);
        return;
    }
    let now = now_ms();
    let outcome = match item.work {
        Work::Malformed => engine.note_malformed(),
        Work::Key(kd) => {
            engine.stats.frames += 1;
            engine.handle_key(&kd, now)
        }
        Work::Op { id, op, bytes, origin, host } => {
            let outcome = engine.handle_checked(VerifiedOp { id, op, bytes, pre: item.pre }, item.valid, now);
            if origin != 0 {
                origins.insert(id, origin);
            }
            if let Some(h) = host {
                let useful = matches!(
                    outcome,
                    Outcome::Applied | Outcome::NotYet(crate::core::BufKind::KeyWait | crate::core::BufKind::DataKeyWait)
                );
                let e = hosts.entry(h).or_default();
                e.0 += u32::from(useful);
                e.1 += 1;
            }
            outcome
        }
        Work::Heads { peer, scope, heads, root } => {
            let lacking: Vec<Hash> =
                heads.iter().filter(|h| engine.op_state(h) == crate::core::OpState::Unknown).copied().collect();
            if !lacking.is_empty() {
                shared.lacking.lock().unwrap().push((peer, scope, lacking));
            } else if let Some(st) = engine.status(&scope) {
                let mut theirs = heads.clone();
                theirs.sort();
                let mut ours: Vec<Hash> = st.data_heads.iter().chain(&st.governance_heads).copied().collect();
                ours.sort();
                if ours == theirs && heartbeats.len() < HEARTBEAT_CHECKS_MAX {
                    // Our root at this point is the projector's to compare.
                    heartbeats.push(HeartbeatCheck { at: engine.folds_in_commit(), peer, scope, root });
                }
            }
            return;
        }
    };
    let label = match outcome {
        Outcome::Malformed => "malformed",
        Outcome::BadSignature => "bad_signature",
        Outcome::Duplicate => "duplicate",
        Outcome::GenesisRefused => "genesis_refused",
        Outcome::Applied => "applied",
        Outcome::Dropped(r) => r.name(),
        Outcome::NotYet(crate::core::BufKind::Pending) => "pending",
        Outcome::NotYet(crate::core::BufKind::KeyWait) => "key_waiting",
        Outcome::NotYet(crate::core::BufKind::DataKeyWait) => "data_key_waiting",
        Outcome::KeyAccepted => "key_accepted",
        Outcome::KeyIgnored => "key_ignored",
    };
    VERDICTS.with_borrow_mut(|v| v.entry(label).or_insert_with(|| (counter!("dagfold_received_total", "verdict" => label), 0)).1 += 1);
}

thread_local! {
    /// `dagfold_received_total` by verdict: one registry lookup per label,
    /// not per op (it hashes the key and its labels: 6% of the orderer in a
    /// long cascade), and counted here, added to the registry's atomics
    /// once per orderer round (`flush_verdicts`).
    static VERDICTS: std::cell::RefCell<crate::core::IdMap<&'static str, (metrics::Counter, u64)>> =
        Default::default();
}

fn flush_verdicts() {
    VERDICTS.with_borrow_mut(|v| {
        for (c, n) in v.values_mut() {
            if *n > 0 {
                c.increment(std::mem::take(n));
            }
        }
    });
}

/// `dagfold_orderer_waited_microseconds_total{on}`: how long the orderer
/// waited for input (`input`, idle time included) or for a free commit slot
/// (`commit`: the committer was behind). Microseconds, as the registry's
/// counters are integers.
struct WaitCounter(metrics::Counter);

impl WaitCounter {
    fn new(on: &'static str) -> WaitCounter {
        WaitCounter(counter!("dagfold_orderer_waited_microseconds_total", "on" => on))
    }

    fn increment(&self, d: Duration) {
        self.0.increment(d.as_micros() as u64);
    }
}

fn publish_engine_stats(engine: &mut Engine) {
    let s = &engine.stats;
    gauge!("dagfold_engine_applied_total").set(s.applied as f64);
    gauge!("dagfold_engine_evicted_total").set(s.evicted as f64);
    gauge!("dagfold_engine_key_timeouts_total").set(s.key_timeouts as f64);
    gauge!("dagfold_engine_root_checks_total").set(s.root_checks as f64);
    gauge!("dagfold_engine_cascade_released_total").set(s.cascade_released as f64);
    gauge!("dagfold_engine_malformed_total").set(s.malformed as f64);
    gauge!("dagfold_engine_bad_signature_total").set(s.bad_signature as f64);
    gauge!("dagfold_engine_duplicates_total").set(s.duplicates as f64);
    for r in crate::core::Reason::ALL {
        gauge!("dagfold_engine_dropped_total", "reason" => r.name()).set(s.dropped[r.code() as usize] as f64);
    }
    gauge!("dagfold_engine_cold_evicted_total").set(s.cold_evicted as f64);
    gauge!("dagfold_engine_cold_reads_total").set(s.cold_reads as f64);
    gauge!("dagfold_engine_cold_hits_total").set(s.cold_hits as f64);
    let (indexed, filter_bytes) = engine.index_sizes();
    gauge!("dagfold_engine_index_entries").set(indexed as f64);
    gauge!("dagfold_engine_cold_filter_bytes").set(filter_bytes as f64);
    let (hits, misses) = engine.governance_cache_stats();
    gauge!("dagfold_governance_cache_hits_total").set(hits as f64);
    gauge!("dagfold_governance_cache_misses_total").set(misses as f64);
    let age_ms = engine.oldest_buffered_since_ms().map(|t| now_ms().saturating_sub(t)).unwrap_or(0);
    gauge!("dagfold_buffered_oldest_age_seconds").set(age_ms as f64 / 1000.0);
}

/// Heartbeat root comparisons one commit carries at most (a heartbeat is
/// per peer and scope, ≥ 200 ms apart; past this, a flood of them is
/// compared no more until the next commit).
const HEARTBEAT_CHECKS_MAX: usize = 1024;

/// The fold of each commit's applied data ops (`core::Projector`), in
/// commit order: the cells it changed and the scope records join the
/// commit's writes, the statuses get their roots, the convergence checks
/// and the heartbeat comparisons are made; then the commit goes on to the
/// committer.
fn projector(mut projector: Projector, rx: Receiver<ToProject>, tx: Sender<ToCommit>, shared: Arc<Shared>) {
    let waited = counter!("dagfold_projector_waited_microseconds_total", "on" => "commit");
    for m in rx {
        let ToProject { mut commit, mut statuses, origins, received, heartbeats } = m;
        let t = Instant::now();
        note_age("project", received);
        let folds = std::mem::take(&mut commit.folds);
        let mut heartbeats = heartbeats.into_iter().peekable();
        for (i, fold) in folds.into_iter().enumerate() {
            while let Some(h) = heartbeats.next_if(|h| h.at <= i) {
                compare_heartbeat(&mut projector, &h, &shared);
            }
            projector.fold(fold);
        }
        for h in heartbeats {
            compare_heartbeat(&mut projector, &h, &shared);
        }
        projector.finish_commit(&mut commit);
        for st in &mut statuses {
            st.root = projector.root(&st.scope);
        }
        gauge!("dagfold_engine_divergences_total").set(projector.stats.divergences as f64);
        gauge!("dagfold_queue_batches", "stage" => "commit").set(tx.len() as f64);
        histogram!("dagfold_stage_seconds", "stage" => "project").record(t.elapsed().as_secs_f64());
        let t_send = Instant::now();
        if tx.send((commit, statuses, origins, received)).is_err() {
            return;
        }
        waited.increment(t_send.elapsed().as_micros() as u64);
    }
}

/// SPEC §8 repaired through sync: a peer with our heads and another root.
fn compare_heartbeat(projector: &mut Projector, h: &HeartbeatCheck, shared: &Shared) {
    let ours = projector.root(&h.scope);
    if ours != h.root {
        shared.divergences_heartbeat.fetch_add(1, Ordering::Relaxed);
        counter!("dagfold_divergences_total", "source" => "heartbeat").increment(1);
        eprintln!(
            "dagfold: divergence with {} in scope {}: same heads, roots {} (ours) and {} (theirs)",
            h.peer,
            hex::encode(h.scope),
            hex::encode(ours),
            hex::encode(h.root)
        );
    }
}

fn committer<S: Store>(
    mut store: S,
    rx: Receiver<ToCommit>,
    shared: Arc<Shared>,
    sync: bool,
    applied_bytes: bool,
    mut on_durable: Box<dyn FnMut(Durable) + Send>,
) {
    for (commit, statuses, origins, received) in rx {
        if shared.refusing.load(Ordering::Relaxed) {
            continue;
        }
        let t = Instant::now();
        note_age("commit", received);
        if commit.writes.is_empty() {
            // Nothing to make durable (an in-memory key wait): publish only.
        } else if let Err(e) = store.write(&commit.writes, sync) {
            eprintln!("dagfold: store write failed; the node accepts nothing more until restarted: {e}");
            counter!("dagfold_store_write_failures_total").increment(1);
            gauge!("dagfold_store_refusing").set(1.0);
            *shared.refusing_reason.lock().unwrap() = Some(e.to_string());
            shared.refusing.store(true, Ordering::SeqCst);
            continue;
        }
        // Readable in the store from here (and durable, when syncing): the
        // orderer may now answer for its ops from the store.
        shared.durable_commits.store(commit.number + 1, Ordering::Release);
        histogram!("dagfold_commit_seconds").record(t.elapsed().as_secs_f64());
        histogram!("dagfold_commit_writes").record(commit.writes.len() as f64);
        histogram!("dagfold_commit_applied_ops").record(commit.applied.len() as f64);
        histogram!("dagfold_end_to_end_seconds").record(received.elapsed().as_secs_f64());
        counter!("dagfold_applied_total").increment(commit.applied.len() as u64);
        shared.applied_total.fetch_add(commit.applied.len() as u64, Ordering::Relaxed);
        {
            let mut st = shared.status.write().unwrap();
            for s in statuses {
                st.insert(s.scope, s);
            }
        }
        // The encodings of applied ops are in the batch just written, or
        // (a pending op's, written when it was buffered) beside it.
        let mut bytes: HashMap<&[u8], &Vec<u8>> = HashMap::new();
        if applied_bytes {
            for w in &commit.writes {
                if let Write::Put(crate::core::Cf::Ops, k, v) = w {
                    bytes.insert(k.as_slice(), v);
                }
            }
            for (id, v) in &commit.released {
                bytes.insert(id.as_slice(), v);
            }
        }
        let applied = commit
            .applied
            .iter()
            .zip(origins)
            .map(|((id, scope), origin)| (*id, *scope, bytes.get(id.as_slice()).map(|v| (*v).clone()).unwrap_or_default(), origin))
            .collect();
        on_durable(Durable { events: commit.events, applied });
    }
}
