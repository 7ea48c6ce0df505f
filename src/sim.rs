//! A deterministic multi-node simulation (TigerBeetle's VOPR, iroh-gossip's
//! `proto::sim`): 3 to 5 nodes, each the real `Engine` over a store that
//! fails its N-th operation (`store::faulty`), the peer decisions of
//! `peering` (heartbeat pages, heads we lack, sync requests and replies,
//! wanted ids, gossip routing, link timers) and a clock of its own, skewed;
//! a network that drops, delays, duplicates and reorders messages and is
//! cut and healed, asymmetrically too; clients that send the ops of
//! `workload` scopes to random nodes and resend what no commit
//! acknowledged; nodes that crash and restart from what their store holds.
//!
//! Everything follows from one `u64` seed: its own PRNG (`SimRng`), a
//! virtual clock, one thread, ordered maps only. `run(seed)` returns what
//! happened, or the first broken invariant with the command that replays
//! it (`SimFailure`). Checked:
//!
//! - no panic (the engine's own assertions are on in release builds);
//! - at every commit of every node, event sequence numbers run 1, 2, 3...
//!   per scope, and an op is applied at most once, across crashes;
//! - after every restart, the store holds every op the node's commits
//!   applied, and its event sequence numbers, no more and no less
//!   (nothing acknowledged is lost; uncommitted work is), and every op a
//!   durable commit held buffered, unless the engine had forgotten it (a
//!   key wait's deadline, an eviction); the restored reports are
//!   self-consistent;
//! - two nodes whose heartbeat heads are equal have the same root;
//! - after the faults, with every link healed and every node up, within a
//!   quiet period: every node holds, for every scope, the applied set,
//!   heads and root of one engine fed every message in causal order;
//! - then each node's reports are self-consistent and survive a restore
//!   unchanged (less data ops waiting in memory for a key).
//!
//! What is not simulated: key deliveries made by nodes (`KeysRequest`: the
//! link timers ask, and the simulated peers have none to serve); peers
//! known by address only (every node has every other configured by key,
//! so `may_see` always takes its configured branch); at most one sync in
//! flight per link (the node's I/O layer: here rounds overlap).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use crate::core::{decode_frame, Commit, Config, Decoded, Engine, Identity, OpState, Outcome, ScopeReport, ScopeStatus, VerifiedOp};
use crate::peering::{self, LackingNotes, LinkTimers};
use crate::protocol::node::{NodeMessage, SYNC_IDS_MAX};
use crate::protocol::{Hash, PublicKey, MESSAGE_OP, ZERO};
use crate::store::faulty::{Countdown, FaultyStore};
use crate::store::memory::MemStore;
use crate::store::Store;
use crate::workload::{generate_for, WorkloadConfig};

/// How often each node's timers are looked at (virtual ms).
const TICK_MS: u64 = 25;
/// A node's clock: the virtual time plus its skew, from here (so a skew
/// back in time never goes below zero).
const CLOCK_BASE_MS: u64 = 1_000_000;
/// Events one run handles at most: a run that loops is a failure, not a
/// hang (a run takes ~10^4-10^5).
const STEPS_MAX: u64 = 5_000_000;
/// How long after the faults the nodes have to converge (virtual ms):
/// key waits (3 s), client resends (1.5 s) and a few heartbeat and sync
/// rounds fit many times over.
const QUIET_MS_MAX: u64 = 60_000;

/// splitmix64: small, fast, and the same on every platform and release
/// (the workload generator has its own, seeded from this one).
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed ^ 0x5d3c_0ffe_e15e_ed00)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi);
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn index(&mut self, n: usize) -> usize {
        self.range(0, n as u64 - 1) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    pub fn share(&mut self, max: f64) -> f64 {
        max * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One run's parameters, all drawn from its seed.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub nodes: usize,
    pub scopes: usize,
    pub data_ops_per_scope: usize,
    pub writers: usize,
    /// A key rotation in each scope, and a writer removed (its later ops
    /// unauthorized, what builds on them rejected).
    pub rotate: bool,
    pub remove_writer: bool,
    pub heartbeat_ms: u64,
    pub drop_share: f64,
    pub dup_share: f64,
    pub delay_ms_max: u64,
    /// Messages delayed up to 3 s instead (reordered behind later ones).
    pub long_delay_share: f64,
    pub partitions: bool,
    pub crashes_max: u32,
    /// The share of restarts whose store fails one of its next operations.
    pub store_fault_share: f64,
    pub skew_ms_max: u64,
    /// Small: applied ops go to the cold index, read back from the store.
    pub hot_applied_max: usize,
    /// Ops judged per commit in a cascade (`Engine::set_cascade_budget`).
    pub cascade_budget: u64,
    pub data_key_wait_ms: u64,
    /// The faults last this long (virtual ms); then the quiet period.
    pub fault_ms: u64,
}

impl SimConfig {
    pub fn from_seed(seed: u64) -> SimConfig {
        let mut r = SimRng::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xc0f1);
        SimConfig {
            seed,
            nodes: r.range(3, 5) as usize,
            scopes: r.range(1, 3) as usize,
            data_ops_per_scope: r.range(3, 24) as usize,
            writers: r.range(1, 4) as usize,
            rotate: r.chance(0.3),
            remove_writer: r.chance(0.2),
            heartbeat_ms: r.range(100, 1_000),
            drop_share: if r.chance(0.2) { 0.0 } else { r.share(0.3) },
            dup_share: r.share(0.15),
            delay_ms_max: r.range(1, 150),
            long_delay_share: r.share(0.1),
            partitions: r.chance(0.7),
            crashes_max: r.range(0, 6) as u32,
            store_fault_share: if r.chance(0.3) { 0.0 } else { r.share(0.7) },
            skew_ms_max: r.range(0, 5_000),
            hot_applied_max: if r.chance(0.7) { r.range(1, 32) as usize } else { crate::limits::HOT_APPLIED_MAX },
            cascade_budget: if r.chance(0.5) { r.range(1, 8) } else { 1 << 20 },
            data_key_wait_ms: r.range(200, 3_000),
            fault_ms: r.range(3_000, 15_000),
        }
    }

    fn engine_config(&self) -> Config {
        Config {
            data_key_wait_ms: self.data_key_wait_ms,
            hot_applied_max: self.hot_applied_max,
            // One block per 64 bytes: plenty for a few hundred ops, and
            // no 16 MiB per restart.
            cold_filter_bytes: 4096,
            ..Config::default()
        }
    }
}

/// What a run did, summed by the campaign.
#[derive(Clone, Debug, Default)]
pub struct SimStats {
    pub nodes: u64,
    pub scopes: u64,
    pub ops: u64,
    pub messages_sent: u64,
    pub messages_delivered: u64,
    pub dropped: u64,
    pub duplicated: u64,
    /// Messages lost to a cut link (at sending or in flight).
    pub cut: u64,
    pub partitions: u64,
    pub asymmetric_cuts: u64,
    pub crashes: u64,
    /// Injected store failures that landed (a write or a read failed).
    pub store_faults: u64,
    pub restarts: u64,
    pub client_sends: u64,
    pub client_resends: u64,
    pub heartbeats: u64,
    pub sync_requests: u64,
    pub sync_ops_served: u64,
    pub gossip: u64,
    pub commits: u64,
    pub events_checked: u64,
    pub cold_reads: u64,
    pub key_timeouts: u64,
    /// Virtual ms from the end of the faults until every node converged.
    pub converge_ms: u64,
    pub steps: u64,
}

impl SimStats {
    pub fn add(&mut self, o: &SimStats) {
        let SimStats {
            nodes,
            scopes,
            ops,
            messages_sent,
            messages_delivered,
            dropped,
            duplicated,
            cut,
            partitions,
            asymmetric_cuts,
            crashes,
            store_faults,
            restarts,
            client_sends,
            client_resends,
            heartbeats,
            sync_requests,
            sync_ops_served,
            gossip,
            commits,
            events_checked,
            cold_reads,
            key_timeouts,
            converge_ms,
            steps,
        } = o;
        self.nodes += nodes;
        self.scopes += scopes;
        self.ops += ops;
        self.messages_sent += messages_sent;
        self.messages_delivered += messages_delivered;
        self.dropped += dropped;
        self.duplicated += duplicated;
        self.cut += cut;
        self.partitions += partitions;
        self.asymmetric_cuts += asymmetric_cuts;
        self.crashes += crashes;
        self.store_faults += store_faults;
        self.restarts += restarts;
        self.client_sends += client_sends;
        self.client_resends += client_resends;
        self.heartbeats += heartbeats;
        self.sync_requests += sync_requests;
        self.sync_ops_served += sync_ops_served;
        self.gossip += gossip;
        self.commits += commits;
        self.events_checked += events_checked;
        self.cold_reads += cold_reads;
        self.key_timeouts += key_timeouts;
        self.converge_ms = self.converge_ms.max(*converge_ms);
        self.steps += steps;
    }
}

/// A broken invariant: what, when, and how to see it again.
#[derive(Clone, Debug)]
pub struct SimFailure {
    pub seed: u64,
    pub at_ms: u64,
    pub what: String,
}

impl SimFailure {
    /// The one command that replays this run.
    pub fn replay_command(&self) -> String {
        replay_command(self.seed)
    }
}

pub fn replay_command(seed: u64) -> String {
    format!("DAGFOLD_SIM_SEED={seed} cargo test --release --test sim replay -- --nocapture")
}

impl std::fmt::Display for SimFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "simulation seed {} failed at {} ms: {}\nreplay: {}", self.seed, self.at_ms, self.what, self.replay_command())
    }
}

/// What travels between two nodes.
#[derive(Clone, Debug)]
enum Wire {
    /// An op frame: gossip.
    Frame(Vec<u8>),
    /// A `NodeMessage` (heartbeat, sync request), encoded.
    Node(Vec<u8>),
    /// A sync reply's op frames, in order, as one stream (a cut stream
    /// delivers a prefix of them).
    SyncReply(Vec<Vec<u8>>),
}

#[derive(Debug)]
enum Ev {
    Deliver { to: usize, from: usize, wire: Wire },
    /// A client's message reaches `to` (if that incarnation is still up).
    ClientDeliver { to: usize, incarnation: u64, msg: usize },
    ClientSend { msg: usize },
    /// Whether an op acknowledged only as buffered was applied anywhere
    /// since; if not, the client sends it again.
    ClientCheck { msg: usize },
    Tick { node: usize, incarnation: u64 },
    Commit { node: usize, incarnation: u64 },
    Crash { node: usize },
    Restart { node: usize },
    Partition,
    Heal,
    EndOfFaults,
}

/// A message a client sends until a commit acknowledges it.
struct ClientMsg {
    frame: Vec<u8>,
    /// The op's id, or ZERO for a key delivery.
    id: Hash,
    /// A key delivery's recipient (the node it is sent to) and key id.
    key: Option<(usize, Hash)>,
    acked: bool,
    /// Which node's commit acknowledged it, with its outcome there.
    acked_by: Option<(usize, Outcome)>,
}

/// A node's state that lives only in memory: lost at a crash.
struct Running {
    engine: Engine,
    store: FaultyStore,
    /// Per peer (by node index; `None` for itself): its timers and where
    /// its heartbeat pages stopped.
    links: Vec<Option<(LinkTimers, Option<Hash>)>>,
    lacking: LackingNotes<usize>,
    /// The statuses as of the last durable commit (what the node's
    /// heartbeats and `may_see` read).
    published: BTreeMap<Hash, ScopeStatus>,
    /// Where each op judged since its commit came from (peer index + 1).
    origins: BTreeMap<Hash, u64>,
    /// Client messages handled since the last commit, with their outcome.
    unacked: Vec<(usize, Outcome)>,
    /// Ops judged since the last commit that went into a durable buffer.
    buffered: Vec<Hash>,
    /// Ops judged afresh into a data key wait: in memory only (unlike a
    /// pending op woken into one, which keeps its records).
    fresh_waits: BTreeSet<Hash>,
    commit_scheduled: bool,
}

struct SimNode {
    identity: Identity,
    /// What survives a crash: the durable tables (shared with the store
    /// in use, `FaultyStore::durable`).
    durable: Arc<Mutex<MemStore>>,
    running: Option<Running>,
    incarnation: u64,
    skew_ms: i64,
    /// Ops the node's durable commits applied: never lost, never again.
    applied: BTreeSet<Hash>,
    /// The last event sequence number durable per scope.
    event_seq: BTreeMap<Hash, u64>,
    /// Ops a durable commit held buffered (pending, key wait): a crash
    /// must not lose them. Left out at a crash: those the running engine
    /// had forgotten by then (a key wait's deadline, an eviction).
    kept: BTreeSet<Hash>,
    /// The countdown of the store now in use (whether its fault landed).
    countdown: Option<Arc<Countdown>>,
}

struct Sim {
    cfg: SimConfig,
    rng: SimRng,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    nodes: Vec<SimNode>,
    keys: Vec<PublicKey>,
    client: Vec<ClientMsg>,
    /// Directed links cut: (from, to).
    cut: BTreeSet<(usize, usize)>,
    faults: bool,
    /// Signatures found valid, by (id, signature): the pipeline's cache
    /// (`pipeline::verified`), so each op is verified once per run.
    verified: BTreeSet<(Hash, [u8; 64])>,
    crashes_left: u32,
    /// The reference: every scope's report of one engine fed every message
    /// in causal order, and the ops it applied.
    reference: BTreeMap<Hash, ScopeReport>,
    reference_applied: BTreeSet<Hash>,
    stats: SimStats,
}

type Check = Result<(), String>;

/// Runs the simulation of `seed`.
pub fn run(seed: u64) -> Result<SimStats, SimFailure> {
    let cfg = SimConfig::from_seed(seed);
    let mut sim = Sim::new(cfg);
    match sim.run() {
        Ok(()) => Ok(sim.stats),
        Err(what) => Err(SimFailure { seed, at_ms: sim.now, what }),
    }
}

impl Sim {
    fn new(cfg: SimConfig) -> Sim {
        let mut rng = SimRng::new(cfg.seed);
        let mut nodes = Vec::new();
        for _ in 0..cfg.nodes {
            let mut seed = [0u8; 32];
            let mut kem = [0u8; 32];
            for c in seed.chunks_mut(8).chain(kem.chunks_mut(8)) {
                c.copy_from_slice(&rng.next_u64().to_le_bytes());
            }
            nodes.push(SimNode {
                identity: Identity::from_secrets(seed, kem),
                durable: Arc::new(Mutex::new(MemStore::new())),
                running: None,
                incarnation: 0,
                skew_ms: 0,
                applied: BTreeSet::new(),
                event_seq: BTreeMap::new(),
                kept: BTreeSet::new(),
                countdown: None,
            });
        }
        let keys = nodes.iter().map(|n| n.identity.public_key).collect();
        let crashes_left = cfg.crashes_max;
        let stats = SimStats { nodes: cfg.nodes as u64, scopes: cfg.scopes as u64, ..SimStats::default() };
        Sim {
            cfg,
            rng,
            now: 0,
            seq: 0,
            queue: BTreeMap::new(),
            nodes,
            keys,
            client: Vec::new(),
            cut: BTreeSet::new(),
            faults: true,
            verified: BTreeSet::new(),
            crashes_left,
            reference: BTreeMap::new(),
            reference_applied: BTreeSet::new(),
            stats,
        }
    }

    fn at(&mut self, delay_ms: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((self.now + delay_ms, self.seq), ev);
    }

    fn local_now(&self, node: usize) -> u64 {
        (CLOCK_BASE_MS + self.now).saturating_add_signed(self.nodes[node].skew_ms)
    }

    fn run(&mut self) -> Check {
        self.make_scopes();
        for n in 0..self.nodes.len() {
            self.restart(n)?;
        }
        if self.cfg.partitions {
            let t = self.rng.range(0, self.cfg.fault_ms);
            self.at(t, Ev::Partition);
        }
        for _ in 0..self.cfg.crashes_max {
            let t = self.rng.range(0, self.cfg.fault_ms);
            let node = self.rng.index(self.nodes.len());
            self.at(t, Ev::Crash { node });
        }
        let end = self.cfg.fault_ms;
        self.at(end, Ev::EndOfFaults);
        let mut next_convergence_check = u64::MAX;
        while let Some(((t, _), ev)) = self.queue.pop_first() {
            self.now = t;
            self.stats.steps += 1;
            if self.stats.steps > STEPS_MAX {
                return Err(format!("more than {STEPS_MAX} events"));
            }
            if matches!(ev, Ev::EndOfFaults) {
                self.end_faults()?;
                next_convergence_check = self.now;
            }
            self.handle(ev)?;
            if self.now >= next_convergence_check {
                if self.converged() {
                    self.stats.converge_ms = self.now - end;
                    break;
                }
                if self.now > end + QUIET_MS_MAX {
                    return Err(format!("no convergence {QUIET_MS_MAX} ms after the faults:\n{}", self.divergence()));
                }
                next_convergence_check = self.now + 250;
            }
        }
        if self.stats.converge_ms == 0 && !self.converged() {
            return Err(format!("the run ended without convergence:\n{}", self.divergence()));
        }
        self.final_checks()
    }

    /// The scopes, every node a reader of each, and the client's schedule:
    /// each scope's messages in causal order from a random start, each op
    /// to a random node, each key delivery to its recipient.
    fn make_scopes(&mut self) {
        let readers: Vec<(PublicKey, [u8; 32])> = self.nodes[1..].iter().map(|n| (n.identity.public_key, n.identity.kem_public)).collect();
        let first = self.nodes[0].identity.clone();
        let mut reference = Engine::new(self.cfg.engine_config(), first.clone());
        for _ in 0..self.cfg.scopes {
            let data_ops = self.cfg.data_ops_per_scope;
            let wcfg = WorkloadConfig {
                seed: self.rng.next_u64(),
                writers: self.cfg.writers,
                data_ops,
                actions_per_op: 2,
                value_bytes: 8,
                merge_share: 0.3,
                events_per_op: 1,
                keys_per_entity: 6,
                rotate_at: self.cfg.rotate.then_some(data_ops / 2),
                chain: false,
                remove_writer_at: (self.cfg.remove_writer && self.cfg.writers > 1).then_some(data_ops / 3),
                view_lag: None,
            };
            let w = generate_for(&wcfg, first.public_key, first.kem_public, &readers);
            let mut t = self.rng.range(0, self.cfg.fault_ms / 2);
            for m in &w.messages {
                reference.handle_frame(&m.frame, 0);
                let key = match decode_frame(&m.frame) {
                    Ok(Decoded::Key(kd)) => Some((self.keys.iter().position(|k| *k == kd.recipient).expect("a node's delivery"), kd.key_id)),
                    _ => None,
                };
                if m.id != ZERO {
                    self.stats.ops += 1;
                }
                let msg = self.client.len();
                self.client.push(ClientMsg { frame: m.frame.clone(), id: m.id, key, acked: false, acked_by: None });
                self.seq += 1;
                self.queue.insert((t, self.seq), Ev::ClientSend { msg });
                t += self.rng.range(0, 120);
            }
        }
        reference.take_commit().expect("no cold index");
        for id in reference.scope_ids() {
            let r = reference.report(&id).expect("listed");
            self.reference_applied.extend(r.applied.iter().copied());
            self.reference.insert(id, r);
        }
    }

    fn handle(&mut self, ev: Ev) -> Check {
        match ev {
            Ev::Deliver { to, from, wire } => self.deliver(to, from, wire),
            Ev::ClientSend { msg } => {
                self.client_send(msg);
                Ok(())
            }
            Ev::ClientCheck { msg } => {
                let id = self.client[msg].id;
                if self.client[msg].acked && !self.nodes.iter().any(|n| n.applied.contains(&id)) {
                    self.client[msg].acked = false;
                    self.client[msg].acked_by = None;
                    self.client_retry(msg);
                }
                Ok(())
            }
            Ev::ClientDeliver { to, incarnation, msg } => {
                if self.nodes[to].incarnation != incarnation || self.nodes[to].running.is_none() {
                    self.client_retry(msg);
                    return Ok(());
                }
                let now = self.local_now(to);
                let frame = self.client[msg].frame.clone();
                let outcome = self.judge(to, &frame, 0, now);
                let r = self.nodes[to].running.as_mut().expect("up");
                r.unacked.push((msg, outcome));
                self.schedule_commit(to);
                Ok(())
            }
            Ev::Tick { node, incarnation } => {
                if self.nodes[node].incarnation != incarnation || self.nodes[node].running.is_none() {
                    return Ok(());
                }
                self.tick(node);
                self.at(TICK_MS, Ev::Tick { node, incarnation });
                Ok(())
            }
            Ev::Commit { node, incarnation } => {
                if self.nodes[node].incarnation != incarnation || self.nodes[node].running.is_none() {
                    return Ok(());
                }
                self.nodes[node].running.as_mut().expect("up").commit_scheduled = false;
                self.commit(node)
            }
            Ev::Crash { node } => {
                if self.faults && self.crashes_left > 0 && self.nodes[node].running.is_some() {
                    self.crashes_left -= 1;
                    self.stats.crashes += 1;
                    self.crash(node);
                    let t = self.rng.range(10, 3_000);
                    self.at(t, Ev::Restart { node });
                }
                Ok(())
            }
            Ev::Restart { node } => {
                if self.nodes[node].running.is_none() {
                    self.restart(node)?;
                }
                Ok(())
            }
            Ev::Partition => {
                if self.faults {
                    self.partition();
                    let t = self.rng.range(100, 4_000);
                    self.at(t, Ev::Heal);
                }
                Ok(())
            }
            Ev::Heal => {
                self.heal();
                if self.faults && self.rng.chance(0.7) {
                    let t = self.rng.range(100, 3_000);
                    self.at(t, Ev::Partition);
                }
                Ok(())
            }
            Ev::EndOfFaults => Ok(()),
        }
    }

    // ----- the network -------------------------------------------------

    fn send(&mut self, from: usize, to: usize, wire: Wire) {
        self.stats.messages_sent += 1;
        if self.cut.contains(&(from, to)) {
            self.stats.cut += 1;
            return;
        }
        if self.faults && self.rng.chance(self.cfg.drop_share) {
            self.stats.dropped += 1;
            // A sync reply's stream may break after a few of its ops.
            if let Wire::SyncReply(ops) = &wire {
                if ops.len() > 1 && self.rng.chance(0.5) {
                    let keep = self.rng.range(1, ops.len() as u64 - 1) as usize;
                    let prefix = Wire::SyncReply(ops[..keep].to_vec());
                    let d = self.delay();
                    self.at(d, Ev::Deliver { to, from, wire: prefix });
                }
            }
            return;
        }
        let copies = if self.faults && self.rng.chance(self.cfg.dup_share) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let d = self.delay();
            self.at(d, Ev::Deliver { to, from, wire: wire.clone() });
        }
    }

    fn delay(&mut self) -> u64 {
        if !self.faults {
            return self.rng.range(1, 20);
        }
        if self.rng.chance(self.cfg.long_delay_share) {
            return self.rng.range(self.cfg.delay_ms_max, 3_000);
        }
        self.rng.range(1, self.cfg.delay_ms_max)
    }

    /// Cuts links: the nodes split in two (both ways), or some links one
    /// way only, or one node isolated.
    fn partition(&mut self) {
        let n = self.nodes.len();
        self.stats.partitions += 1;
        match self.rng.range(0, 2) {
            0 => {
                let side: Vec<bool> = (0..n).map(|_| self.rng.chance(0.5)).collect();
                for a in 0..n {
                    for b in 0..n {
                        if side[a] != side[b] {
                            self.cut.insert((a, b));
                        }
                    }
                }
            }
            1 => {
                self.stats.asymmetric_cuts += 1;
                for a in 0..n {
                    for b in 0..n {
                        if a != b && self.rng.chance(0.3) {
                            self.cut.insert((a, b));
                        }
                    }
                }
            }
            _ => {
                let x = self.rng.index(n);
                let inbound = self.rng.chance(0.5);
                for b in (0..n).filter(|b| *b != x) {
                    // Isolated one way (asymmetric) or both.
                    if inbound || self.rng.chance(0.5) {
                        self.cut.insert((b, x));
                    }
                    self.cut.insert((x, b));
                }
            }
        }
    }

    /// Every cut link comes back; the links reconnect (their timers start
    /// again: a heartbeat and a sync round at once).
    fn heal(&mut self) {
        let healed = std::mem::take(&mut self.cut);
        for (a, b) in healed {
            let now = self.local_now(a);
            let hb = self.cfg.heartbeat_ms;
            if let Some(r) = self.nodes[a].running.as_mut() {
                if let Some(link) = r.links[b].as_mut() {
                    link.0 = LinkTimers::new(now, hb);
                }
            }
        }
    }

    fn end_faults(&mut self) -> Check {
        self.faults = false;
        self.heal();
        for n in 0..self.nodes.len() {
            if let Some(c) = &self.nodes[n].countdown {
                c.disarm();
            }
            if self.nodes[n].running.is_none() {
                self.restart(n)?;
            }
        }
        Ok(())
    }

    // ----- clients -----------------------------------------------------

    fn client_send(&mut self, msg: usize) {
        if self.client[msg].acked {
            return;
        }
        self.stats.client_sends += 1;
        let to = match self.client[msg].key {
            Some((recipient, _)) => recipient,
            None => self.rng.index(self.nodes.len()),
        };
        if self.nodes[to].running.is_none() {
            self.client_retry(msg);
            return;
        }
        let incarnation = self.nodes[to].incarnation;
        let d = self.rng.range(1, 10);
        self.at(d, Ev::ClientDeliver { to, incarnation, msg });
    }

    /// No acknowledgement: the client sends again later.
    fn client_retry(&mut self, msg: usize) {
        self.stats.client_resends += 1;
        let t = self.rng.range(200, 1_500);
        self.at(t, Ev::ClientSend { msg });
    }

    // ----- a node ------------------------------------------------------

    /// Decodes, verifies (once per run per signature) and judges a frame;
    /// `origin`: the link it came from (peer index + 1), 0 for a client.
    fn judge(&mut self, node: usize, frame: &[u8], origin: u64, now: u64) -> Outcome {
        let r = self.nodes[node].running.as_mut().expect("up");
        match decode_frame(frame) {
            Err(_) => r.engine.note_malformed(),
            Ok(Decoded::Key(kd)) => {
                r.engine.stats.frames += 1;
                r.engine.handle_key(&kd, now)
            }
            Ok(Decoded::Op { id, op, bytes }) => {
                let key = (id, op.signature);
                let valid = self.verified.contains(&key) || crate::protocol::sig::verify(&op.author, &id, &op.signature);
                if valid {
                    self.verified.insert(key);
                }
                if origin != 0 {
                    r.origins.insert(id, origin);
                }
                let outcome = r.engine.handle_checked(VerifiedOp { id, op, bytes, pre: Default::default() }, valid, now);
                match outcome {
                    Outcome::NotYet(crate::core::BufKind::Pending | crate::core::BufKind::KeyWait) => r.buffered.push(id),
                    Outcome::NotYet(crate::core::BufKind::DataKeyWait) => {
                        r.fresh_waits.insert(id);
                    }
                    _ => {}
                }
                if traced(&id) {
                    eprintln!("trace {}: node {node} judged {} from {origin}: {outcome:?}", self.now, short(&id));
                }
                outcome
            }
        }
    }

    fn schedule_commit(&mut self, node: usize) {
        let incarnation = self.nodes[node].incarnation;
        let r = self.nodes[node].running.as_mut().expect("up");
        if !r.commit_scheduled {
            r.commit_scheduled = true;
            let d = self.rng.range(0, 5);
            self.at(d, Ev::Commit { node, incarnation });
        }
    }

    fn deliver(&mut self, to: usize, from: usize, wire: Wire) -> Check {
        if self.cut.contains(&(from, to)) {
            self.stats.cut += 1;
            return Ok(());
        }
        if self.nodes[to].running.is_none() {
            return Ok(());
        }
        self.stats.messages_delivered += 1;
        let now = self.local_now(to);
        let origin = from as u64 + 1;
        match wire {
            Wire::Frame(frame) => {
                self.judge(to, &frame, origin, now);
                self.schedule_commit(to);
            }
            Wire::SyncReply(frames) => {
                for frame in frames {
                    self.judge(to, &frame, origin, now);
                }
                self.schedule_commit(to);
            }
            Wire::Node(bytes) => match NodeMessage::decode(&bytes) {
                Some(NodeMessage::Heartbeat(hb)) => self.heard(to, from, hb)?,
                Some(NodeMessage::SyncRequest(req)) => self.serve_sync(to, from, req),
                other => return Err(format!("node {to}: an unexpected node message from {from}: {other:?}")),
            },
        }
        Ok(())
    }

    /// `may_see` as node `node` decides it for the key of node `peer`.
    fn may_see(&self, node: usize, peer: usize, scope: &Hash) -> Result<(), &'static str> {
        let configured = |k: &PublicKey| self.keys.iter().enumerate().any(|(i, p)| i != node && p == k);
        let r = self.nodes[node].running.as_ref().expect("up");
        peering::may_see(Some(&self.keys[peer]), configured, |k| r.published.get(scope).map(|s| s.is_member(k)))
    }

    /// A peer's heartbeat: note the heads we lack; where the heads are
    /// equal, the roots must be too.
    fn heard(&mut self, node: usize, from: usize, hb: crate::protocol::node::Heartbeat) -> Check {
        let heard = peering::heard_scopes(hb, |s| self.may_see(node, from, s), |_| {});
        let r = self.nodes[node].running.as_mut().expect("up");
        for s in heard {
            let lacking = peering::lacking_heads(&s.heads, |h| r.engine.op_state(h));
            if !lacking.is_empty() {
                r.lacking.note(from, s.scope, lacking);
            } else if let Some(st) = r.published.get(&s.scope) {
                let mut theirs = s.heads.clone();
                theirs.sort();
                let mut ours: Vec<Hash> = st.data_heads.iter().chain(&st.governance_heads).copied().collect();
                ours.sort();
                if ours == theirs && st.root != s.root {
                    return Err(format!(
                        "node {node} and node {from} have the same heads in scope {} and different roots ({} vs {})",
                        short(&s.scope),
                        short(&st.root),
                        short(&s.root)
                    ));
                }
            }
        }
        Ok(())
    }

    /// The sync server: what the requester may see, read from what is
    /// durable (the node's store reader), ancestors first.
    fn serve_sync(&mut self, node: usize, from: usize, req: crate::protocol::node::SyncRequest) {
        let key = self.keys[from];
        let Ok(max) = peering::sync_served(&req, Some(&key), |s| self.may_see(node, from, s)) else { return };
        let durable = self.nodes[node].durable.clone();
        let get = |id: &Hash| crate::store::Store::op(&*durable.lock().unwrap(), id).ok().flatten();
        let visible = |s: &Hash| self.may_see(node, from, s).is_ok();
        let ops = peering::collect_sync(get, &req.want, &req.have, max, &visible);
        self.stats.sync_ops_served += ops.len() as u64;
        let frames = ops
            .into_iter()
            .map(|bytes| {
                let mut f = Vec::with_capacity(bytes.len() + 1);
                f.push(MESSAGE_OP);
                f.extend_from_slice(&bytes);
                f
            })
            .collect();
        self.send(node, from, Wire::SyncReply(frames));
    }

    /// The node's timers: key waits, then each link's heartbeat and sync.
    fn tick(&mut self, node: usize) {
        let now = self.local_now(node);
        let mut out: Vec<(usize, Wire)> = Vec::new();
        let r = self.nodes[node].running.as_mut().expect("up");
        r.engine.handle_tick(now);
        let waiting = r.published.values().any(|s| s.key_waiting + s.data_key_waiting > 0);
        for peer in 0..r.links.len() {
            let Some((timers, cursor)) = r.links[peer].as_mut() else { continue };
            let due = timers.poll(now, || waiting);
            if due.beat {
                for hb in peering::heartbeat_pages(&r.published, |_| true, cursor) {
                    self.stats.heartbeats += 1;
                    out.push((peer, Wire::Node(NodeMessage::Heartbeat(hb).encode())));
                }
            }
            if due.sync {
                let lacking = r.lacking.take_for(peer);
                let published = &r.published;
                let ours = |s: &Hash| published.get(s).map(|st| st.governance_heads.iter().chain(&st.data_heads).copied().collect()).unwrap_or_default();
                let ids = r.engine.wanted(SYNC_IDS_MAX);
                let wanted = peering::Wanted { scopes: r.engine.wanted_scopes(&ids), ids };
                let known = |h: &Hash| r.engine.op_state(h) != OpState::Unknown;
                for req in peering::sync_requests(lacking, known, ours, wanted) {
                    self.stats.sync_requests += 1;
                    out.push((peer, Wire::Node(NodeMessage::SyncRequest(req).encode())));
                }
            }
        }
        for (peer, wire) in out {
            self.send(node, peer, wire);
        }
        self.schedule_commit(node);
    }

    /// Takes the engine's commit and writes it; on success, what may only
    /// follow durability: the checks of events and applied ops, gossip,
    /// statuses, client acknowledgements. A failed write or read stops the
    /// node (it restarts later, from its store).
    fn commit(&mut self, node: usize) -> Check {
        let r = self.nodes[node].running.as_mut().expect("up");
        let commit = match r.engine.take_commit() {
            Ok(c) => c,
            Err(_) => return self.store_failed(node),
        };
        if !commit.writes.is_empty() && r.store.write(&commit.writes, true).is_err() {
            return self.store_failed(node);
        }
        r.engine.note_durable(commit.number);
        self.stats.commits += 1;
        for w in &commit.writes {
            let (what, cf, k) = match w {
                crate::core::Write::Put(cf, k, _) => ("put", cf, k),
                crate::core::Write::Delete(cf, k) => ("delete", cf, k),
            };
            if traced(k) {
                let state = <Hash>::try_from(k.as_slice()).map(|id| r.engine.op_state(&id));
                eprintln!("trace {}: node {node} commit {} {what} {}; now {state:?}", self.now, commit.number, cf.name());
            }
        }
        for (id, _) in &commit.applied {
            if traced(id) {
                eprintln!("trace {}: node {node} commit {} applied it", self.now, commit.number);
            }
        }
        self.after_commit(node, commit)?;
        let now = self.local_now(node);
        let r = self.nodes[node].running.as_mut().expect("up");
        if r.engine.cascade_remaining() {
            r.engine.continue_cascade(now);
            self.schedule_commit(node);
        }
        Ok(())
    }

    fn after_commit(&mut self, node: usize, commit: Commit) -> Check {
        let n = &mut self.nodes[node];
        for ev in &commit.events {
            let last = n.event_seq.entry(ev.scope).or_insert(0);
            if ev.seq != *last + 1 {
                return Err(format!("node {node}: event {} of scope {} after {}", ev.seq, short(&ev.scope), last));
            }
            *last = ev.seq;
            self.stats.events_checked += 1;
        }
        let r = n.running.as_mut().expect("up");
        n.kept.extend(r.buffered.drain(..));
        // What the commit forgot (its ops record deleted, not put again:
        // a key wait's deadline) is no longer kept, though the engine may
        // know it again before a crash (judged afresh, not yet durable).
        let mut ops_last: BTreeMap<&[u8], bool> = BTreeMap::new();
        for w in &commit.writes {
            match w {
                crate::core::Write::Put(crate::core::Cf::Ops, k, _) => ops_last.insert(k, true),
                crate::core::Write::Delete(crate::core::Cf::Ops, k) => ops_last.insert(k, false),
                _ => None,
            };
        }
        n.kept.retain(|id| ops_last.get(id.as_slice()) != Some(&false));
        for (id, _) in &commit.applied {
            if !n.applied.insert(*id) {
                return Err(format!("node {node}: op {} applied twice", short(id)));
            }
        }
        let r = n.running.as_mut().expect("up");
        // Gossip: the applied ops' encodings, in this batch or (a pending
        // op's) beside it; never back to the link they came from.
        let mut bytes: BTreeMap<Hash, &Vec<u8>> = BTreeMap::new();
        for w in &commit.writes {
            if let crate::core::Write::Put(crate::core::Cf::Ops, k, v) = w {
                bytes.insert(k.as_slice().try_into().expect("op ids are 32 bytes"), v);
            }
        }
        for (id, v) in &commit.released {
            bytes.insert(*id, v);
        }
        let mut out: Vec<(usize, Hash, Wire)> = Vec::new();
        for (id, scope) in &commit.applied {
            let origin = r.origins.remove(id).unwrap_or(0);
            let Some(op) = bytes.get(id) else { continue };
            let mut frame = Vec::with_capacity(op.len() + 1);
            frame.push(MESSAGE_OP);
            frame.extend_from_slice(op);
            for peer in 0..r.links.len() {
                if r.links[peer].is_some() && peering::gossip_to(origin, peer as u64 + 1) {
                    out.push((peer, *scope, Wire::Frame(frame.clone())));
                }
            }
        }
        for st in r.engine.take_statuses() {
            r.published.insert(st.scope, st);
        }
        let unacked = std::mem::take(&mut r.unacked);
        let mut retry = Vec::new();
        let mut checks = Vec::new();
        for (msg, outcome) in unacked {
            let m = &self.client[msg];
            let kept = match outcome {
                Outcome::Applied | Outcome::Dropped(_) => true,
                Outcome::NotYet(crate::core::BufKind::Pending | crate::core::BufKind::KeyWait) => true,
                // Already held: kept unless only in memory, waiting for a key.
                Outcome::Duplicate => r.engine.op_state(&m.id) != OpState::Buffered(crate::core::BufKind::DataKeyWait),
                Outcome::KeyAccepted | Outcome::KeyIgnored => m.key.is_some_and(|(_, key_id)| r.engine.has_key(&key_id)),
                _ => false,
            };
            if kept {
                self.client[msg].acked = true;
                self.client[msg].acked_by = Some((node, outcome));
                // Buffered is not for good: a data op woken into a key wait
                // is dropped for now at its deadline (SPEC §6 step 4), to be
                // judged afresh when sent again. So, as the load generator
                // does, the client sends again an op no node applied.
                if matches!(outcome, Outcome::NotYet(_) | Outcome::Duplicate) && self.reference_applied.contains(&self.client[msg].id) {
                    checks.push(msg);
                }
            } else {
                retry.push(msg);
            }
        }
        for msg in retry {
            self.client_retry(msg);
        }
        for msg in checks {
            let t = self.rng.range(2_000, 4_000);
            self.at(t, Ev::ClientCheck { msg });
        }
        for (peer, scope, wire) in out {
            if self.may_see(node, peer, &scope).is_ok() {
                self.stats.gossip += 1;
                self.send(node, peer, wire);
            }
        }
        Ok(())
    }

    fn store_failed(&mut self, node: usize) -> Check {
        self.stats.store_faults += 1;
        self.crash(node);
        let t = self.rng.range(10, 2_000);
        self.at(t, Ev::Restart { node });
        Ok(())
    }

    /// Loses everything in memory; what the client sent there and no
    /// commit acknowledged is sent again.
    fn crash(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        n.incarnation += 1;
        if std::env::var("DAGFOLD_SIM_TRACE").is_ok() {
            eprintln!("trace {}: node {node} crashed", self.now);
        }
        let Some(r) = n.running.take() else { return };
        // What the engine forgot, or holds again only in memory (judged
        // afresh into a key wait after its deadline), may be gone; and an
        // engine stopped on a failed read cannot say (`Unreadable`).
        n.kept.retain(|id| match r.engine.op_state(id) {
            OpState::Unknown | OpState::Unreadable => false,
            OpState::Buffered(crate::core::BufKind::DataKeyWait) => !r.fresh_waits.contains(id),
            _ => true,
        });
        self.stats.cold_reads += r.engine.stats.cold_reads;
        self.stats.key_timeouts += r.engine.stats.key_timeouts;
        for (msg, _) in r.unacked {
            self.client_retry(msg);
        }
    }

    /// Starts a node from its store (`Engine::restore`) with a fresh clock
    /// skew, maybe a store that fails one of its next operations; checks
    /// that the store holds exactly what its commits applied.
    fn restart(&mut self, node: usize) -> Check {
        self.stats.restarts += 1;
        let skew = self.cfg.skew_ms_max as i64;
        self.nodes[node].skew_ms = self.rng.range(0, 2 * skew as u64) as i64 - skew;
        let now = self.local_now(node);
        let cfg = self.cfg.engine_config();
        let identity = self.nodes[node].identity.clone();
        self.check_store(node)?;
        let fault_at = (self.faults && self.rng.chance(self.cfg.store_fault_share)).then(|| self.rng.range(1, 300));
        let countdown = Countdown::new(fault_at);
        let reopened = self.nodes[node].durable.lock().unwrap().reopened();
        let mut store = FaultyStore::new(reopened, countdown.clone());
        self.nodes[node].durable = store.durable.clone();
        self.nodes[node].countdown = Some(countdown.clone());
        let mut engine = match Engine::restore(cfg, identity, &store, store.cold_reader(), now) {
            Ok(e) => e,
            Err(_) => return self.restart_failed(node, &countdown),
        };
        engine.set_cascade_budget(self.cfg.cascade_budget);
        let commit = match engine.take_commit() {
            Ok(c) => c,
            Err(_) => return self.restart_failed(node, &countdown),
        };
        if !commit.writes.is_empty() && store.write(&commit.writes, true).is_err() {
            return self.restart_failed(node, &countdown);
        }
        engine.note_durable(commit.number);
        // The cold filter of the ops applied before, read after the
        // restore's commit as the node reads it (on its own thread there).
        if engine.complete_cold_filter_now(&store).is_err() {
            return self.restart_failed(node, &countdown);
        }
        reports(&mut engine).map_err(|e| format!("node {node} after a restore: {e}"))?;
        if std::env::var("DAGFOLD_SIM_TRACE").is_ok() {
            let ids: Vec<String> = commit.applied.iter().map(|(id, _)| short(id)).collect();
            eprintln!("trace {}: node {node} restarted, its restore commit applied [{}]", self.now, ids.join(","));
        }
        let hb = self.cfg.heartbeat_ms;
        let links = (0..self.nodes.len()).map(|p| (p != node).then(|| (LinkTimers::new(now, hb), None))).collect();
        let mut published = BTreeMap::new();
        for s in engine.scope_ids() {
            if let Some(st) = engine.status(&s) {
                published.insert(s, st);
            }
        }
        let n = &mut self.nodes[node];
        n.running = Some(Running {
            engine,
            store,
            links,
            lacking: LackingNotes::default(),
            published,
            origins: BTreeMap::new(),
            unacked: Vec::new(),
            buffered: Vec::new(),
            fresh_waits: BTreeSet::new(),
            commit_scheduled: false,
        });
        n.incarnation += 1;
        let incarnation = n.incarnation;
        self.after_commit(node, commit)?;
        let r = self.nodes[node].running.as_mut().expect("up");
        if r.engine.cascade_remaining() {
            r.engine.continue_cascade(now);
            self.schedule_commit(node);
        }
        let t = self.rng.range(0, TICK_MS);
        self.at(t, Ev::Tick { node, incarnation });
        Ok(())
    }

    fn restart_failed(&mut self, node: usize, countdown: &Countdown) -> Check {
        if !countdown.landed() {
            return Err(format!("node {node}: the restore failed with no fault injected"));
        }
        self.store_failed(node)
    }

    /// What the node's store holds is what its durable commits applied:
    /// every op applied (none lost, none more: the ops table less the
    /// pending records), and each scope's event numbering (its record).
    /// Read from the tables, not through a restore, which may itself apply
    /// what a cascade committed in parts left pending.
    fn check_store(&mut self, node: usize) -> Check {
        use crate::core::{Cf, ScopeRecord, META_SCOPE_PREFIX};
        let n = &self.nodes[node];
        let durable = n.durable.lock().unwrap();
        let pending: BTreeSet<&Vec<u8>> = durable.table(Cf::Pending).map(|t| t.keys().collect()).unwrap_or_default();
        let held: BTreeSet<Hash> = durable
            .table(Cf::Ops)
            .into_iter()
            .flatten()
            .filter(|(k, _)| !pending.contains(k))
            .map(|(k, _)| k.as_slice().try_into().expect("op ids are 32 bytes"))
            .collect();
        if let Some(lost) = n.applied.difference(&held).next() {
            return Err(format!("node {node}: op {} was applied by a durable commit and is not in its store", short(lost)));
        }
        if let Some(more) = held.difference(&n.applied).next() {
            return Err(format!("node {node}: its store holds op {} applied, which no durable commit applied", short(more)));
        }
        let has = |cf: Cf, id: &Hash| durable.table(cf).is_some_and(|t| t.contains_key(id.as_slice()));
        if let Some(lost) = n.kept.iter().find(|id| !has(Cf::Ops, id) && !has(Cf::KeyWaits, id) && !has(Cf::Dropped, id)) {
            return Err(format!("node {node}: op {} was durably buffered, and is not in its store after a restart", short(lost)));
        }
        let mut seqs = BTreeMap::new();
        for (k, v) in durable.table(Cf::Meta).into_iter().flatten() {
            if let Some(scope) = k.strip_prefix(META_SCOPE_PREFIX) {
                let rec: ScopeRecord = borsh::from_slice(v).map_err(|e| format!("node {node}: a scope record: {e}"))?;
                if rec.event_seq > 0 {
                    seqs.insert(<Hash>::try_from(scope).expect("scope ids are 32 bytes"), rec.event_seq);
                }
            }
        }
        let made: BTreeMap<Hash, u64> = n.event_seq.iter().filter(|(_, s)| **s > 0).map(|(k, s)| (*k, *s)).collect();
        if seqs != made {
            return Err(format!("node {node}: the store's event numbering is not what its commits made"));
        }
        Ok(())
    }

    // ----- the end -----------------------------------------------------

    /// Every client message acknowledged and every node holding the
    /// reference's applied set, heads and root in every scope.
    fn converged(&mut self) -> bool {
        if self.client.iter().any(|m| !m.acked) {
            return false;
        }
        let reference = &self.reference;
        self.nodes.iter().all(|n| {
            // A node whose engine stopped on a failed read restarts first.
            let Some(r) = n.running.as_ref().filter(|r| r.engine.cold_failed().is_none()) else { return false };
            reference.iter().all(|(id, want)| {
                r.published.get(id).is_some_and(|st| {
                    st.root == want.root
                        && st.applied == want.applied.len() as u64
                        && st.data_heads == want.data_heads
                        && st.governance_heads == want.governance_heads
                })
            })
        })
    }

    fn divergence(&mut self) -> String {
        let mut out = String::new();
        let unacked = self.client.iter().filter(|m| !m.acked).count();
        out += &format!("client messages not acknowledged: {unacked}\n");
        let mut missing: BTreeSet<Hash> = BTreeSet::new();
        for (i, n) in self.nodes.iter_mut().enumerate() {
            let Some(r) = n.running.as_mut() else {
                out += &format!("node {i}: down\n");
                continue;
            };
            for (id, want) in &self.reference {
                match r.engine.report(id) {
                    None => out += &format!("node {i}: scope {} unknown\n", short(id)),
                    Some(got) => {
                        if got.applied != want.applied || got.root != want.root || got.data_heads != want.data_heads {
                            missing.extend(want.applied.iter().filter(|a| !got.applied.contains(a)));
                            let missing: Vec<String> = want.applied.iter().filter(|a| !got.applied.contains(a)).map(short).collect();
                            out += &format!(
                                "node {i}: scope {}: applied {} of {} (missing {}), pending {}, key waits {}+{}, root {} vs {}\n",
                                short(id),
                                got.applied.len(),
                                want.applied.len(),
                                missing.join(","),
                                got.pending.len(),
                                got.key_waiting.len(),
                                got.data_key_waiting.len(),
                                short(&got.root),
                                short(&want.root)
                            );
                        }
                    }
                }
            }
        }
        for id in &missing {
            let acked = self.client.iter().find(|m| m.id == *id).and_then(|m| m.acked_by);
            let states: Vec<String> =
                self.nodes.iter().map(|n| n.running.as_ref().map_or("down".into(), |r| format!("{:?}", r.engine.op_state(id)))).collect();
            out += &format!("op {}: acknowledged by {acked:?}; now {}\n", short(id), states.join(", "));
        }
        out
    }

    /// The engine's reports at convergence equal the reference's in every
    /// node, are self-consistent, and come back unchanged from the store.
    fn final_checks(&mut self) -> Check {
        for node in 0..self.nodes.len() {
            let now = self.local_now(node);
            loop {
                let r = self.nodes[node].running.as_mut().ok_or(format!("node {node} down at the end"))?;
                let commit = r.engine.take_commit().map_err(|e| format!("node {node}: {e}"))?;
                r.store.write(&commit.writes, true).map_err(|e| format!("node {node}: {e}"))?;
                r.engine.note_durable(commit.number);
                self.after_commit(node, commit)?;
                let r = self.nodes[node].running.as_mut().expect("up");
                if !r.engine.cascade_remaining() {
                    break;
                }
                r.engine.continue_cascade(now);
            }
            let r = self.nodes[node].running.as_mut().expect("up");
            self.stats.cold_reads += r.engine.stats.cold_reads;
            self.stats.key_timeouts += r.engine.stats.key_timeouts;
            let before = reports(&mut r.engine)?;
            for (id, want) in &self.reference {
                let got = before.get(id).ok_or(format!("node {node}: scope {} missing", short(id)))?;
                if got.applied != want.applied || got.data_heads != want.data_heads || got.governance_heads != want.governance_heads || got.root != want.root {
                    return Err(format!("node {node}: scope {} differs from the reference at the end", short(id)));
                }
            }
            self.check_store(node)?;
            let n = &self.nodes[node];
            let durable = n.durable.lock().unwrap();
            let mut restored = Engine::restore(self.cfg.engine_config(), n.identity.clone(), &*durable, None, now).map_err(|e| e.to_string())?;
            drop(durable);
            let after = reports(&mut restored)?;
            if before != after {
                return Err(format!("node {node}: a restore from the store gives other reports than the running engine"));
            }
        }
        Ok(())
    }
}

/// Every scope's report, less data ops waiting in memory for a key (not
/// durable, SPEC §6 step 4), checked for consistency with the status
/// counters (`tools/fuzz/src/checks.rs`, `check_consistent`).
fn reports(e: &mut Engine) -> Result<BTreeMap<Hash, ScopeReport>, String> {
    let mut out = BTreeMap::new();
    for id in e.scope_ids() {
        let mut r = e.report(&id).expect("a listed scope has a report");
        let s = e.scope(&id).expect("listed");
        if s.applied != r.applied.len() as u64 || s.pending != r.pending.len() as u64 || s.key_waiting != r.key_waiting.len() as u64 {
            return Err(format!("scope {}: counters and report disagree", short(&id)));
        }
        let mut all: Vec<&Hash> = r.applied.iter().chain(&r.pending).chain(&r.key_waiting).chain(&r.data_key_waiting).collect();
        all.extend(r.dropped.keys());
        let n = all.len();
        all.sort();
        all.dedup();
        if all.len() != n {
            return Err(format!("scope {}: an op in two states", short(&id)));
        }
        for h in r.data_heads.iter().chain(&r.governance_heads) {
            if r.applied.binary_search(h).is_err() {
                return Err(format!("scope {}: head {} not applied", short(&id), short(h)));
            }
        }
        r.data_key_waiting.clear();
        out.insert(id, r);
    }
    Ok(out)
}

/// `DAGFOLD_SIM_TRACE=HEX`: what happens to the ops whose id starts so.
fn traced(id: &[u8]) -> bool {
    static TRACE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    TRACE.get_or_init(|| std::env::var("DAGFOLD_SIM_TRACE").ok()).as_ref().is_some_and(|t| hex::encode(id).starts_with(t.as_str()))
}

fn short(h: &Hash) -> String {
    hex::encode(&h[..6])
}
