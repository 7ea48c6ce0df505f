//! Worker threads and bounded channels around the sans-IO core.
//!
//! ```text
//! transport ─ingest─▶ batcher ─▶ verifier × N ─▶ authorizer ─▶ decryptor ─▶ orderer ─▶ projector × S ─▶ committer
//!  (tokio mpsc)        (seq)     (batch verify)  (G at cut,     (opens with   (Engine:   (fold, roots,  (RocksDB batch,
//!                                                 replica)       keyring)      verdicts,  convergence   fsync, then
//!                                                                              DAG,       checks, cell  events, gossip;
//!                                                                              cascade;   writes; by    a commit's parts
//!                                                                              split by   scope)        joined first)
//!                                                                              scope)
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
//! only accepted ops; its payload opened with a self-certifying key; a key
//! delivery to the node opened with its KEM secret), which the engine uses
//! on the op's first judgement. The cascade runs inside the
//! orderer, through the same judging code. The fold of the applied data ops
//! (SPEC §8), which no verdict depends on, runs after the orderer on the
//! projector thread (`core::Projector`), commit by commit, so that a long
//! cascade's folds and root checks overlap with the judging of its next
//! part; split by scope into shards (`projector_shards` threads), each
//! commit handed to every shard in parts and joined again before it is
//! written as one batch (`shards.rs`). Verifier batches may finish out
//! of order; the authorizer restores the ingest order so that a causally
//! ordered stream stays causally ordered (no needless pending buffering).
//!
//! The node's API writes enter at the orderer (`PipelineState::direct`):
//! a draft taken there goes with its commit to the projector, which
//! computes a data op's root at its point, composes, seals and signs it,
//! and sends the commit's ops back to the orderer in one message
//! (`author.rs`), where the engine judges them like received ops.
//!
//! One file per stage: `batcher.rs`, `verifier.rs`, `authorizer.rs`,
//! `decryptor.rs`, `orderer.rs` (its decisions by time and counts in
//! `policy.rs`), `projector.rs` (its shards' split and join in
//! `shards.rs`), `committer.rs`; authoring's share (`author.rs`); beside
//! them the byte budget
//! of the orderer's queue (`gate.rs`), the cache of signatures found valid
//! (`verified.rs`) and the pipeline's metrics (`metrics.rs`).

mod author;
mod authorizer;
mod batcher;
mod committer;
mod decryptor;
mod gate;
mod metrics;
mod orderer;
mod policy;
mod projector;
mod shards;
mod verified;
mod verifier;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver};

use crate::core::governance::Governance;
use crate::core::{Engine, Prepared, ScopeStatus};
use crate::protocol::{Hash, KeyDelivery, Op};
use crate::store::Store;

#[cfg(feature = "testkit")]
pub use committer::commit_stage;
#[cfg(feature = "testkit")]
pub use shards::fold_stage;
#[cfg(feature = "rocksdb-store")]
pub(crate) use author::{compose, sign};

/// The connection a message came in on: a transport connection id, 0 for
/// local.
pub type ConnId = u64;

/// The group keys by key id that the engine accepted, replicated for the
/// decryptor; the orderer adds each key as the engine accepts it.
type Keyring = Arc<RwLock<crate::core::IdMap<Hash, [u8; 32]>>>;

/// One message for the pipeline, decoded by the transport.
#[derive(Debug)]
pub enum Work {
    /// `conn`: the connection it came in on. `host`: the host it came from
    /// over the server (its IPv4 address or IPv6 /64, `net::fair::origin_of`),
    /// whose turn the node weighs by what its ops come to.
    Op { id: Hash, op: Op, bytes: Vec<u8>, conn: ConnId, host: Option<std::net::IpAddr> },
    /// Ops the node authored for its API (`node::author`), sent to the
    /// orderer directly (`PipelineState::direct`) and judged by the engine
    /// like any other: a governance op or genesis one at a time, by the
    /// API's task that composed it; data ops together, composed and signed
    /// by a projector shard once it computed their roots (`DraftRequest::
    /// Data`), one message per commit. What the stages before the orderer
    /// would compute is known from their making: each signature is the
    /// node's own, made a moment ago over its id (as the verifiers' cache
    /// takes it), and `plain` is the payload it sealed (the decryptor's
    /// result; none for a genesis, which is not sealed); the authorization
    /// at its cut the engine computes. Skipping those four thread
    /// hand-offs and the batcher's linger was ~30% of a write's CPU and
    /// latency (`tools/bench api_writes`, docs/PERFORMANCE.md).
    Own(Vec<OwnOp>),
    /// `host` as for an op: a delivery costs the orderer an X25519 and an
    /// AEAD pass over up to a frame, so it counts in its host's turn too.
    Key { kd: KeyDelivery, host: Option<std::net::IpAddr> },
    /// A key delivery the node made (API.md): judged like any other (one to
    /// the node itself adds the key), then kept in the store and gossiped,
    /// to be served again to its recipient.
    /// `reply`: the commit that keeps it.
    Deliver { kd: KeyDelivery, reply: Option<tokio::sync::oneshot::Sender<u64>> },
    /// A draft given back unused (`author.rs`).
    Undraft { scope: Hash, plane: u8, reply: tokio::sync::oneshot::Sender<()> },
    /// The node's API asks for the state to author ops on (`author.rs`):
    /// the requests of the writes its network runtime took in one round
    /// (`node::author`), in one message.
    Draft(Vec<DraftRequest>),
    /// Accept this scope's genesis whoever authored it (API.md, "Which
    /// scopes a node holds"); answered with the commit that keeps it.
    Follow { scope: Hash, reply: tokio::sync::oneshot::Sender<u64> },
    /// A frame that did not decode (already counted by the transport); it
    /// is passed on so that the engine's counts match `import`'s.
    Malformed,
    /// A peer's heartbeat heads, to find what we lack (`docs/PROTOCOL.md`, "Gossip and heartbeat"; the node asks for it by sync, `node::peers`).
    /// `origin` is the configured peer it came from (`node::serve::origin_of`,
    /// 0: none), whose link asks; `peer` the address it came from.
    Heads { peer: std::net::SocketAddr, origin: u64, scope: Hash, heads: Vec<Hash>, root: Hash },
}

/// Where the outcome of an authored op goes: a drop at once, an applied
/// op once its commit is durable (`PipelineState::answers`); a data write
/// whose draft was refused (unknown scope, no right) gets the refusal.
pub type AuthoredReply = tokio::sync::oneshot::Sender<Result<Authored, crate::core::DraftRefused>>;

/// An op the node authored, signed (`Work::Own`).
#[derive(Debug)]
pub struct OwnOp {
    pub id: Hash,
    pub op: Op,
    pub bytes: Vec<u8>,
    pub plain: Option<Vec<u8>>,
    pub reply: AuthoredReply,
}

/// What the receive path made of an op the node authored.
#[derive(Debug)]
pub struct Authored {
    pub id: Hash,
    /// The scope root a data op carries.
    pub root: Option<Hash>,
    pub outcome: crate::core::Outcome,
    /// The commit that holds it, durable when an applied op is answered.
    pub commit: u64,
    /// The scope's last event sequence number before it was judged: an op
    /// applied with events has the next ones (it is applied before the
    /// cascade it wakes).
    pub event_seq: u64,
}

/// A request for the state to author an op on (`core::Draft`).
#[derive(Debug)]
pub enum DraftRequest {
    /// A governance op: the draft goes back to the API's task, which
    /// composes the op against the members and keys it shows.
    Governance { scope: Hash, reply: tokio::sync::oneshot::Sender<Result<Drafted, crate::core::DraftRefused>> },
    /// A data op, composed without a further trip through the API's task:
    /// the projector computes its `root_hash` at the point of the commit
    /// where the draft was taken (`actions` folded onto the scope then),
    /// sets it as the first 32 bytes of `plain` (the payload's encoding),
    /// seals and signs it, and sends it back to the orderer (`Work::Own`),
    /// whose verdict goes to `reply`.
    Data { scope: Hash, actions: Vec<crate::protocol::Action>, plain: Vec<u8>, reply: AuthoredReply },
}

impl DraftRequest {
    pub fn scope(&self) -> &Hash {
        match self {
            DraftRequest::Governance { scope, .. } | DraftRequest::Data { scope, .. } => scope,
        }
    }

    pub fn plane(&self) -> u8 {
        match self {
            DraftRequest::Governance { .. } => crate::protocol::PLANE_GOVERNANCE,
            DraftRequest::Data { .. } => crate::protocol::PLANE_DATA,
        }
    }

    /// Answers the request with a refusal.
    pub(crate) fn refuse(self, e: crate::core::DraftRefused) {
        match self {
            DraftRequest::Governance { reply, .. } => {
                let _ = reply.send(Err(e));
            }
            DraftRequest::Data { reply, .. } => {
                let _ = reply.send(Err(e));
            }
        }
    }

    /// What it holds, for the orderer's byte budget.
    fn bytes(&self) -> u64 {
        match self {
            DraftRequest::Governance { .. } => 256,
            DraftRequest::Data { actions, plain, .. } => {
                actions.iter().map(|a| a.bytes_len() as u64).sum::<u64>() + plain.len() as u64 + 256
            }
        }
    }
}

/// A governance draft with its `hlc` (the orderer's wall clock or later).
#[derive(Debug)]
pub struct Drafted {
    pub draft: crate::core::Draft,
    pub hlc: u64,
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
                Work::Op { bytes, .. } => 2 * bytes.len() as u64 + i.pre.payload_bytes() as u64 + 64,
                // A delivery's sealed key can be a frame's worth (1 MiB).
                Work::Key { kd, .. } | Work::Deliver { kd, .. } => kd.sealed.len() as u64 + 256,
                Work::Draft(r) => r.iter().map(DraftRequest::bytes).sum(),
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

/// Requests of the node's API queued for the orderer (`PipelineState::
/// direct`): at most one per write in progress (`node::author::
/// WRITES_IN_PROGRESS_MAX`), with room to spare; past it the API says busy.
const DIRECT_QUEUE_ITEMS: usize = 8192;

/// Commits built and not yet taken by the committer, at most (see `start`).
const COMMIT_SLOTS: usize = 2;

/// Projector shards by default: one per four cores (`machine_cores`), at
/// least one. The fold is ~23% of the node's CPU per op (4.65 of 19.9 µs,
/// ARCHITECTURE.md, "Cost per stage"), so with a shard per four cores its
/// cap (cores / 4 / 4.65 µs) stays above what all the cores verify, order
/// and write (cores / 19.9 µs). On this 2-core machine that is one shard:
/// the verifiers take both cores, and the whole pipeline over 128 scopes
/// ran at 58.5–60.5k ops/s with one shard, 57.6–60.9k with two
/// (`cargo bench --bench stages -- "pipeline, fold shards"`,
/// docs/PERFORMANCE.md, 2026-12-05).
pub fn projector_shards_default() -> usize {
    (machine_cores() / 4).clamp(1, crate::limits::PROJECTOR_SHARDS_MAX)
}

/// Projector shards in two threads (the cells', the trees') by default
/// wherever there are two cores to run them (`machine_cores`). Split, one
/// shard folds on two cores: 128 scopes in one shard 192k ops/s in one
/// thread, 356k in two (`cargo bench --bench stages -- "^fold shards/"`,
/// 2026-12-06), so one hot scope is not held to one core's fold. The split
/// adds the hand-over of every commit's leaves, and pays where a core
/// would idle while the fold runs: a cascade (`reversed`, 100,000 ops of
/// one scope released at once), parked ops released in bursts
/// (`shuffled`), a fold heavier than the verification beside it
/// (`authors_1k`). On this 2-core machine, three interleaved pairs each
/// (docs/PERFORMANCE.md, 2026-12-06 late night): reversed 98–104k →
/// 108–109k ops/s, shuffled 102–105k → 105–109k, authors_1k 103–109k →
/// 105–111k, causal 125–134k → 125–132k (its CPU per op 13.1–14.0 →
/// 13.4–13.8 µs).
pub fn projector_split_default() -> bool {
    machine_cores() >= 2
}

/// The cores this process may use (`std::thread::available_parallelism`:
/// the machine's, less what an affinity mask or a cgroup quota takes), 2
/// when the system cannot tell. The defaults of the verifier and network
/// threads follow it.
pub fn machine_cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// One per core by default (`machine_cores`): verification is the
    /// node's largest cost, and every core can take a share of it.
    pub verifier_threads: usize,
    /// Projector threads, each folding the scopes with
    /// `core::projector::shard_of(scope) == i` (`shards.rs`); by default
    /// `projector_shards_default`. One scope is always in one shard.
    pub projector_shards: usize,
    /// Each projector shard in two threads, one after the other over each
    /// commit: the cells' fold, then the trees' roots and checks
    /// (`projector::run_fold`, `run_tree`), so that one scope's fold takes
    /// two cores. By default `projector_split_default`.
    pub projector_split: bool,
    /// Ops per signature batch at most (the batcher takes what is queued,
    /// lingering up to `BATCH_LINGER` while it has fewer than
    /// `BATCH_LINGER_UNTIL`). Past ~190 points the
    /// multiscalar multiplication switches from Straus to Pippenger, ~20%
    /// less per signature (`cargo bench --bench verify`: 36k/s at 64, 44k/s
    /// at 256 with distinct keys; in the node, causal, 7-23% less verifier
    /// CPU than at 64, half-rate p99 unchanged), and Pippenger's windows
    /// widen with the batch: with four keys (`batch_four_keys`, 2026-12-03)
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
    /// Where the orderer reports what each host's ops came to (the node
    /// weighs its turn in the server's fair ingest by it); none outside the
    /// node.
    pub host_outcomes: Option<Arc<dyn HostOutcomes>>,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            verifier_threads: machine_cores(),
            projector_shards: projector_shards_default(),
            projector_split: projector_split_default(),
            verify_batch_max: 512,
            stage_queue_batches: 4,
            commit_ops_max: 4096,
            sync: true,
            tick_ms: 100,
            applied_bytes: true,
            host_outcomes: None,
        }
    }
}

/// What each host's ops and key deliveries came to, reported by the orderer
/// once per commit: `(host, useful, total)`, useful being the ops applied
/// or waiting for their key (not those pending on a dependency, duplicates,
/// bad signatures or dropped) and the key deliveries accepted (not those
/// ignored).
pub trait HostOutcomes: Send + Sync {
    fn record(&self, outcomes: &mut dyn Iterator<Item = (std::net::IpAddr, u32, u32)>);
}

impl std::fmt::Debug for dyn HostOutcomes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostOutcomes")
    }
}

/// A committed, durable batch, for the node's side effects.
pub struct Committed {
    pub events: Vec<crate::core::EventOut>,
    /// Applied ops: id, scope, encoding, connection (0 if woken by a cascade).
    pub applied: Vec<(Hash, Hash, Vec<u8>, ConnId)>,
    /// Scopes whose members (any role, at the governance heads) changed
    /// with this commit, with their members now, sorted.
    pub members: Vec<(Hash, Vec<crate::protocol::PublicKey>)>,
    /// Key deliveries this node made to others, now kept, to gossip.
    pub delivered: Vec<KeyDelivery>,
}

/// What the pipeline shares with the rest of the node.
pub struct PipelineState {
    /// SPEC §11 status of every scope with an applied genesis, as durable.
    pub status: RwLock<BTreeMap<Hash, ScopeStatus>>,
    /// Set once a store write failed: the node accepts nothing more.
    pub refusing: AtomicBool,
    pub refusing_reason: Mutex<Option<String>>,
    pub applied_total: AtomicU64,
    pub buffered_ops: AtomicU64,
    pub buffered_bytes: AtomicU64,
    /// Ids buffered ops wait for and nobody has sent yet (sync asks for them).
    pub wanted: Mutex<crate::peering::Wanted>,
    /// Heads of peers that we lack, per scope, by the configured peer whose
    /// heartbeat named them (`Work::Heads`'s origin): its link asks for them.
    pub lacking: Mutex<crate::peering::LackingNotes<u64>>,
    /// Heartbeats whose root differed from ours at the same heads (every
    /// projector shard adds to it).
    pub divergences_heartbeat: Arc<AtomicU64>,
    /// One past the number of the last commit written (0: none yet).
    pub durable_commits: AtomicU64,
    /// The same, for those who wait on it (the answers of the node's API).
    pub durable: tokio::sync::watch::Sender<u64>,
    /// The node's API's requests to the orderer itself (`Work::Draft`,
    /// `Undraft`, `Follow`, `Deliver`, `Own`): they carry no signature to
    /// verify, or the node's own, so they skip the stages before it (and
    /// their batching linger).
    pub direct: crossbeam_channel::Sender<Work>,
    /// The answers to the node's own ops applied by commits not yet
    /// durable, by commit number, in order: the orderer adds each commit's,
    /// the committer sends them once that commit is written (one wake-up
    /// per write, where a wait on `durable` woke every waiting write at
    /// every commit). At most one per write in progress.
    pub(crate) answers: Mutex<std::collections::VecDeque<(u64, Vec<(AuthoredReply, Authored)>)>>,
    /// The replica of the governance index the authorizer judges with: every
    /// accepted governance op, inserted by the orderer before its commit is
    /// durable, so `G` at any durable status's heads can be computed from
    /// it (`Governance::state_at_shared`, under the read lock).
    pub governance: Arc<RwLock<Governance>>,
    /// Signatures known valid (`verified.rs`): the verifiers' cache, which
    /// the node's API adds its own fresh signatures to (`node::author`,
    /// built with the `rocksdb-store` feature).
    #[cfg_attr(not(feature = "rocksdb-store"), allow(dead_code))]
    pub(crate) verified: Arc<verified::VerifiedCache>,
    /// The filter of the ops applied before the restore, once the node's
    /// thread that reads the ops table has it (`read_cold_filter`): the
    /// orderer hands it to the engine (`Engine::complete_cold_filter`).
    pub cold_filter: Mutex<Option<Result<crate::core::cold::IdFilter, crate::core::ColdReadFailed>>>,
}

/// Reads the filter of the ops applied before the restore on a thread of
/// its own, for an engine whose cold filter is partial (`Engine::
/// cold_filter_partial`), and leaves it for the orderer in `shared`: the
/// node serves meanwhile, looking ids up in the store.
pub fn read_cold_filter<F>(shared: Arc<PipelineState>, read: F)
where
    F: FnOnce() -> Result<crate::core::cold::IdFilter, crate::core::ColdReadFailed> + Send + 'static,
{
    ::metrics::gauge!("dagfold_cold_filter_partial").set(1.0);
    std::thread::Builder::new()
        .name("dagfold-coldscan".into())
        .spawn(move || {
            let started = Instant::now();
            let read = read();
            ::metrics::gauge!("dagfold_cold_filter_read_seconds").set(started.elapsed().as_secs_f64());
            *shared.cold_filter.lock().unwrap() = Some(read);
        })
        .expect("spawning the cold filter's reader");
}

impl PipelineState {
    /// The state of a pipeline about to start: no status published yet,
    /// nothing buffered, no commit written.
    fn new(
        applied_total: u64,
        governance: Arc<RwLock<Governance>>,
        verified: Arc<verified::VerifiedCache>,
        direct: crossbeam_channel::Sender<Work>,
    ) -> PipelineState {
        PipelineState {
            status: RwLock::new(BTreeMap::new()),
            refusing: AtomicBool::new(false),
            refusing_reason: Mutex::new(None),
            applied_total: AtomicU64::new(applied_total),
            buffered_ops: AtomicU64::new(0),
            buffered_bytes: AtomicU64::new(0),
            wanted: Mutex::new(crate::peering::Wanted::default()),
            lacking: Mutex::new(Default::default()),
            divergences_heartbeat: Arc::new(AtomicU64::new(0)),
            durable_commits: AtomicU64::new(0),
            durable: tokio::sync::watch::Sender::new(0),
            direct,
            answers: Default::default(),
            governance,
            verified,
            cold_filter: Mutex::new(None),
        }
    }

    /// A state for the committer alone (its stage benchmark and its
    /// tests): no governance, no signatures known, nobody on the direct
    /// queue.
    #[cfg(any(test, feature = "testkit"))]
    fn detached() -> Arc<PipelineState> {
        let (direct, _) = bounded(1);
        Arc::new(PipelineState::new(0, Default::default(), Arc::new(verified::VerifiedCache::new(16)), direct))
    }

    /// After a failed store write (the committer) or read (the orderer's
    /// engine, `Engine::cold_failed`): the node accepts nothing more until
    /// restarted, and says why (redb's rule, `store`). Whether this call
    /// is the one that stopped it.
    fn refuse(&self, what: &str, e: &dyn std::fmt::Display) -> bool {
        if self.refusing.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        eprintln!("dagfold: {what} failed; the node accepts nothing more until restarted: {e}");
        ::metrics::gauge!("dagfold_store_refusing").set(1.0);
        *self.refusing_reason.lock().unwrap() = Some(e.to_string());
        true
    }
}

pub struct Pipeline {
    pub shared: Arc<PipelineState>,
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
        on_durable: Box<dyn FnMut(Committed) + Send>,
    ) -> Pipeline {
        assert!(cfg.verifier_threads >= 1 && cfg.verify_batch_max >= 1);
        assert!((1..=crate::limits::PROJECTOR_SHARDS_MAX).contains(&cfg.projector_shards));
        engine.set_cascade_budget(cfg.commit_ops_max as u64);
        // Replicas fed by the orderer from what the engine accepted.
        let gov_replica = Arc::new(RwLock::new(Governance::default()));
        let keyring = Keyring::default();
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
        let (direct_tx, direct_rx) = bounded::<Work>(DIRECT_QUEUE_ITEMS);
        let verified = Arc::new(verified::VerifiedCache::new(verified::VERIFIED_SLOTS));
        let shared = Arc::new(PipelineState::new(engine.applied_total(), gov_replica.clone(), verified.clone(), direct_tx));
        {
            let mut st = shared.status.write().unwrap();
            for id in engine.scope_ids() {
                if let Some(s) = engine.status(&id) {
                    st.insert(id, s);
                }
            }
        }
        // The way the trees' branches are hashed, measured now rather than
        // in the first commit's fold (`protocol::sha_lanes`), and shown.
        let lanes = crate::protocol::sha_lanes::Lanes::chosen();
        ::metrics::gauge!("dagfold_sha256_lanes", "way" => lanes.name()).set(1.0);
        // From here the engine leaves its folds to the projector shards,
        // each scope's state moved to its shard.
        let projectors = engine.take_projector().split(cfg.projector_shards);
        // The node's identity, whose data ops the projector shards sign.
        let identity = engine.identity().clone();
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
        // The projector's shards sit between them, each with as many slots
        // on either side: a commit is folded while the one before it is
        // written (`shards.rs`: the split, the join, why it cannot
        // deadlock).
        let (project_tx, shard_io, commit_rx) = shards::channels(cfg.projector_shards);
        // Queue depths, sampled by the orderer for the metrics.
        let probes: Vec<(&'static str, Receiver<Batch>)> =
            vec![("verify", verify_rx.clone()), ("authorize", auth_rx.clone()), ("decrypt", dec_rx.clone()), ("order", order_rx.clone())];
        let mut threads = Vec::new();
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(f).expect("spawning a pipeline thread")
        };

        let batch_max = cfg.verify_batch_max;
        threads.push(spawn("dagfold-batcher", Box::new(move || batcher::run(ingest, verify_tx, batch_max))));
        for i in 0..cfg.verifier_threads {
            let (rx, tx, cache) = (verify_rx.clone(), auth_tx.clone(), verified.clone());
            threads.push(spawn(&format!("dagfold-verifier-{i}"), Box::new(move || verifier::run(rx, tx, &cache))));
        }
        drop((verify_rx, auth_tx));
        let g = gov_replica.clone();
        threads.push(spawn("dagfold-authorizer", Box::new(move || authorizer::run(auth_rx, dec_tx, g))));
        let k = keyring.clone();
        let gate_in = order_gate.clone();
        let id = identity.clone();
        threads.push(spawn("dagfold-decryptor", Box::new(move || decryptor::run(dec_rx, order_tx, k, &id, &gate_in))));
        let sh = shared.clone();
        let commit_ops_max = cfg.commit_ops_max;
        let tick_ms = cfg.tick_ms;
        let outcomes = cfg.host_outcomes.clone();
        threads.push(spawn(
            "dagfold-orderer",
            Box::new(move || {
                let o = orderer::OrdererIo { gov: gov_replica, keyring, probes, outcomes, gate: order_gate.clone(), direct: direct_rx };
                orderer::run(&mut engine, order_rx, project_tx, sh, o, commit_ops_max, tick_ms);
                order_gate.close();
            }),
        ));
        for (i, (projector, shards::ShardIo { rx, tx })) in projectors.into_iter().zip(shard_io).enumerate() {
            let d = shared.divergences_heartbeat.clone();
            let composer = author::Composer {
                author: identity.public_key,
                signer: crate::protocol::sig::Signer::new(&identity.seed),
                verified: verified.clone(),
                orderer: shared.direct.clone(),
            };
            for (name, f) in projector::shard_threads(i, projector, rx, tx, cfg.projector_split, d, composer) {
                threads.push(spawn(&name, f));
            }
        }
        let sh = shared.clone();
        let (sync, applied_bytes) = (cfg.sync, cfg.applied_bytes);
        threads.push(spawn(
            "dagfold-committer",
            Box::new(move || committer::run(store, commit_rx, sh, sync, applied_bytes, on_durable)),
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
