//! The invariants the fuzz targets assert, one function per target.
//!
//! This file depends on `dagfold` and `std` only, so that
//! `tests/fuzz_regressions.rs` can include it (`#[path]`) and replay the
//! crashers kept under `tools/fuzz/regressions/TARGET/` through exactly the
//! checks that found them. A check that fails panics.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use dagfold::core::smt::reference_root;
use dagfold::core::{decode_frame, Commit, Config, Decoded, Engine, EventOut, Identity, ScopeReport};
use dagfold::protocol::codec::{check_shape, decode_cell, decode_data_payload, decode_gov_payload, op_body};
use dagfold::protocol::crypto::{cell_leaf, cell_path, delta_id_of_body};
use dagfold::protocol::node::NodeMessage;
use dagfold::protocol::{encode, Hash, Message, ZERO};
use dagfold::store::memory::MemStore;
use dagfold::store::Store;

/// The node every fuzz engine runs as (and every generated scope is made for).
pub const NODE_SEED: [u8; 32] = [0x5e; 32];
pub const NODE_KEM: [u8; 32] = [0x6b; 32];

pub fn node_identity() -> Identity {
    static ID: OnceLock<Identity> = OnceLock::new();
    ID.get_or_init(|| Identity::from_secrets(NODE_SEED, NODE_KEM)).clone()
}

// ----- frame ----------------------------------------------------------------

/// Arbitrary bytes as the content of one wire frame (SPEC §10).
///
/// - `decode_frame` never panics; an op that decodes keeps the shape rules and
///   re-encodes to exactly the input (decoding is strict, SPEC §1: any other
///   byte string for the same op would have been malformed); so does a key
///   delivery.
/// - `NodeMessage::decode` never panics, accepts only variants 2..=254 and,
///   when it accepts, re-encodes to exactly the input.
/// - The engine judges the frame without panicking.
pub fn check_frame(data: &[u8]) {
    match decode_frame(data) {
        Ok(Decoded::Op { id, op, bytes }) => {
            assert_eq!(encode(&Message::Op(op.clone())), data, "an op frame re-encodes to exactly its input");
            assert_eq!(bytes, &data[1..], "the op's bytes are the frame less its variant byte");
            assert_eq!(id, delta_id_of_body(op_body(&bytes)), "the id is the hash of the body");
            assert!(check_shape(&op).is_ok(), "a decoded op keeps the shape rules");
        }
        Ok(Decoded::Key(kd)) => {
            assert_eq!(encode(&Message::Key(kd)), data, "a key frame re-encodes to exactly its input");
        }
        Err(_) => {}
    }
    if let Some(m) = NodeMessage::decode(data) {
        assert!(NodeMessage::is_node_variant(data[0]), "a node message has a node variant");
        assert_eq!(m.encode(), data, "a node message re-encodes to exactly its input");
    }
    let mut e = Engine::new(Config::default(), node_identity());
    e.handle_frame(data, 0);
    e.handle_tick(u64::MAX);
    e.take_commit().expect("no cold index");
}

// ----- payload --------------------------------------------------------------

/// Arbitrary bytes as a governance payload, a data payload and a cell: each
/// decoder either refuses or gives a value that re-encodes to the input. A
/// data payload's actions are folded into an empty projection, whose root
/// must equal the reference root of §8 over its cells.
pub fn check_payload(data: &[u8]) {
    if let Ok(p) = decode_gov_payload(data) {
        assert_eq!(encode(&p), data, "a governance payload re-encodes to exactly its input");
    }
    if let Ok(p) = decode_data_payload(data) {
        assert_eq!(encode(&p), data, "a data payload re-encodes to exactly its input");
        let mut proj = dagfold::core::projection::Projection::default();
        proj.apply(7, &[9; 32], &p.actions);
        let mut cells: Vec<(Hash, Hash)> = proj
            .cells()
            .iter()
            .map(|(path, slot)| {
                assert_eq!(*path, cell_path(&slot.entity, &slot.key));
                (*path, cell_leaf(path, &slot.cell))
            })
            .collect();
        assert_eq!(proj.root(), reference_root(&mut cells), "incremental root equals the reference root");
    }
    if let Ok(c) = decode_cell(data) {
        assert_eq!(encode(&c), data, "a cell re-encodes to exactly its input");
    }
}

// ----- engine ---------------------------------------------------------------

/// One step of an engine scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A frame's content, and its rank in the scenario's causal order (the
    /// position of the generated message it was made from).
    Frame { rank: u32, frame: Vec<u8> },
    /// `now_ms += ms`.
    Advance(u64),
    Tick,
    /// `take_commit`, written to the store.
    Commit,
    /// Commit, then rebuild the engine from the store (`Engine::restore`).
    Restart,
}

/// A concrete engine run: the fuzz target's input, once generated and
/// mutated. Kept as text under `regressions/engine/` (see `to_text`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario {
    /// `None`: `Config::default()`. `Some((ops, bytes, dropped))`: tight
    /// per-scope buffer bounds and remembered drops, to reach eviction.
    pub tight: Option<(u64, u64, u64)>,
    pub steps: Vec<Step>,
}

impl Scenario {
    pub fn config(&self) -> Config {
        let mut cfg = Config::default();
        if let Some((ops, bytes, dropped)) = self.tight {
            cfg.buffered_ops_per_scope_max = ops;
            cfg.buffered_bytes_per_scope_max = bytes;
            cfg.dropped_remembered_max = dropped;
        }
        cfg
    }

    /// A line-based text form, independent of the `arbitrary` crate and of
    /// the workload generator, so a kept crasher replays the same forever.
    pub fn to_text(&self) -> String {
        let mut s = String::from("dagfold-fuzz-engine 1\n");
        if let Some((o, b, d)) = self.tight {
            s += &format!("tight {o} {b} {d}\n");
        }
        for st in &self.steps {
            match st {
                Step::Frame { rank, frame } => s += &format!("frame {rank} {}\n", to_hex(frame)),
                Step::Advance(ms) => s += &format!("advance {ms}\n"),
                Step::Tick => s += "tick\n",
                Step::Commit => s += "commit\n",
                Step::Restart => s += "restart\n",
            }
        }
        s
    }

    pub fn from_text(text: &str) -> Result<Scenario, String> {
        let mut lines = text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#'));
        if lines.next() != Some("dagfold-fuzz-engine 1") {
            return Err("missing header `dagfold-fuzz-engine 1`".into());
        }
        let mut sc = Scenario { tight: None, steps: Vec::new() };
        for line in lines {
            let w: Vec<&str> = line.split_whitespace().collect();
            let num = |s: &str| s.parse::<u64>().map_err(|e| format!("{line}: {e}"));
            match w.as_slice() {
                ["tight", o, b, d] => sc.tight = Some((num(o)?, num(b)?, num(d)?)),
                ["frame", rank, hex] => sc.steps.push(Step::Frame { rank: num(rank)? as u32, frame: from_hex(hex)? }),
                ["frame", rank] => sc.steps.push(Step::Frame { rank: num(rank)? as u32, frame: Vec::new() }),
                ["advance", ms] => sc.steps.push(Step::Advance(num(ms)?)),
                ["tick"] => sc.steps.push(Step::Tick),
                ["commit"] => sc.steps.push(Step::Commit),
                ["restart"] => sc.steps.push(Step::Restart),
                _ => return Err(format!("unknown line: {line}")),
            }
        }
        Ok(sc)
    }
}

pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn from_hex(s: &str) -> Result<Vec<u8>, String> {
    if s.len() % 2 != 0 {
        return Err("odd hex length".into());
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| e.to_string())).collect()
}

/// Every non-empty scope report of an engine, by scope. `no_divergences`
/// zeroes the divergence count (it depends on arrival order as soon as an
/// op is missing or lies, SPEC §8); `no_memory_waits` forgets the data ops
/// waiting in memory for a key (they are not written to the store, SPEC §6
/// step 4). A scope left with nothing in it is left out.
fn reports(e: &mut Engine, no_divergences: bool, no_memory_waits: bool) -> BTreeMap<Hash, ScopeReport> {
    let mut out = BTreeMap::new();
    for id in e.scope_ids() {
        let mut r = e.report(&id).expect("a listed scope has a report");
        if no_divergences {
            r.divergences = 0;
        }
        if no_memory_waits {
            r.data_key_waiting.clear();
        }
        let empty = r.root == ZERO
            && r.data_heads.is_empty()
            && r.governance_heads.is_empty()
            && r.applied.is_empty()
            && r.dropped.is_empty()
            && r.key_waiting.is_empty()
            && r.data_key_waiting.is_empty()
            && r.pending.is_empty()
            && r.divergences == 0;
        if !empty {
            out.insert(id, r);
        }
    }
    out
}

fn short(h: &Hash) -> String {
    to_hex(&h[..6])
}

/// What differs between two sets of reports, in hex, for a failing check.
fn diff_reports(a: &BTreeMap<Hash, ScopeReport>, b: &BTreeMap<Hash, ScopeReport>) -> String {
    let mut out = String::new();
    let scopes: std::collections::BTreeSet<&Hash> = a.keys().chain(b.keys()).collect();
    for s in scopes {
        match (a.get(s), b.get(s)) {
            (Some(x), Some(y)) if x == y => {}
            (Some(x), Some(y)) => {
                out += &format!("scope {}:", short(s));
                let list = |v: &[Hash]| v.iter().map(short).collect::<Vec<_>>().join(",");
                if x.root != y.root {
                    out += &format!(" root {} vs {};", short(&x.root), short(&y.root));
                }
                for (name, p, q) in [
                    ("data_heads", &x.data_heads, &y.data_heads),
                    ("governance_heads", &x.governance_heads, &y.governance_heads),
                    ("applied", &x.applied, &y.applied),
                    ("pending", &x.pending, &y.pending),
                    ("key_waiting", &x.key_waiting, &y.key_waiting),
                    ("data_key_waiting", &x.data_key_waiting, &y.data_key_waiting),
                ] {
                    if p != q {
                        out += &format!(" {name} [{}] vs [{}];", list(p), list(q));
                    }
                }
                if x.dropped != y.dropped {
                    let d = |m: &BTreeMap<Hash, dagfold::core::Reason>| {
                        m.iter().map(|(k, r)| format!("{}:{}", short(k), r.name())).collect::<Vec<_>>().join(",")
                    };
                    out += &format!(" dropped [{}] vs [{}];", d(&x.dropped), d(&y.dropped));
                }
                if x.divergences != y.divergences {
                    out += &format!(" divergences {} vs {};", x.divergences, y.divergences);
                }
                out += "\n";
            }
            (Some(_), None) => out += &format!("scope {} only on the left\n", short(s)),
            (None, _) => out += &format!("scope {} only on the right\n", short(s)),
        }
    }
    out
}

fn assert_same(a: &BTreeMap<Hash, ScopeReport>, b: &BTreeMap<Hash, ScopeReport>, what: &str) {
    assert!(a == b, "{what}; ids are the first 6 bytes, left vs right:\n{}", diff_reports(a, b));
}

/// The counters of each scope (the status object, SPEC §11) agree with the
/// sets of the report, and an op is in exactly one of them.
fn check_consistent(e: &mut Engine) {
    for id in e.scope_ids() {
        let r = e.report(&id).expect("a listed scope has a report");
        let s = e.scope(&id).expect("listed");
        assert_eq!(s.applied, r.applied.len() as u64, "applied counter equals the applied set");
        assert_eq!(s.pending, r.pending.len() as u64, "pending counter equals the pending set");
        assert_eq!(s.key_waiting, r.key_waiting.len() as u64, "key_waiting counter equals its set");
        assert_eq!(s.data_key_waiting, r.data_key_waiting.len() as u64, "data_key_waiting counter equals its set");
        let mut all: Vec<&Hash> = r.applied.iter().chain(&r.pending).chain(&r.key_waiting).chain(&r.data_key_waiting).collect();
        all.extend(r.dropped.keys());
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "an op is in exactly one of applied, dropped, pending, key waits");
        for h in r.data_heads.iter().chain(&r.governance_heads) {
            assert!(r.applied.binary_search(h).is_ok(), "a head is an applied op");
        }
        if let Some(st) = e.status(&id) {
            assert_eq!(st.root, r.root);
            assert_eq!(st.applied, r.applied.len() as u64);
        }
    }
}

struct Run {
    engine: Engine,
    store: MemStore,
    events: Vec<EventOut>,
    /// Data ops dropped for now (`key_timeout`), across restarts.
    key_timeouts: u64,
    evicted: u64,
    /// A restart forgot data ops waiting in memory for a key.
    lost_memory_waits: bool,
}

impl Run {
    fn new(cfg: Config) -> Run {
        Run {
            engine: Engine::new(cfg, node_identity()),
            store: MemStore::new(),
            events: Vec::new(),
            key_timeouts: 0,
            evicted: 0,
            lost_memory_waits: false,
        }
    }

    fn commit(&mut self) {
        let Commit { writes, events, .. } = self.engine.take_commit().expect("no cold index, no cold read to fail");
        self.store.write(&writes, true).expect("the in-memory store takes every write");
        self.events.extend(events);
    }

    /// Rebuilds the engine from the store and checks it holds what the
    /// running engine held, less the data key waits (memory only).
    fn restart(&mut self, cfg: &Config, now_ms: u64) {
        self.commit();
        let before = reports(&mut self.engine, false, true);
        if self.engine.scope_ids().iter().any(|s| self.engine.scope(s).is_some_and(|s| s.data_key_waiting > 0)) {
            self.lost_memory_waits = true;
        }
        self.key_timeouts += self.engine.stats.key_timeouts;
        self.evicted += self.engine.stats.evicted;
        self.engine = Engine::restore(cfg.clone(), node_identity(), &self.store, None, now_ms).expect("the tables read back");
        self.commit();
        let after = reports(&mut self.engine, false, true);
        assert_same(&before, &after, "Engine::restore from the committed writes gives the same state");
        check_consistent(&mut self.engine);
    }

    /// Whether anything was lost to time or bounds, this incarnation included.
    fn lost_anything(&self) -> bool {
        self.key_timeouts + self.engine.stats.key_timeouts > 0 || self.evicted + self.engine.stats.evicted > 0 || self.lost_memory_waits
    }
}

/// Per-scope event sequence numbers run 1, 2, 3... in emission order.
fn check_event_seqs(events: &[EventOut]) {
    let mut next: BTreeMap<Hash, u64> = BTreeMap::new();
    for ev in events {
        let n = next.entry(ev.scope).or_insert(1);
        assert_eq!(ev.seq, *n, "event sequence numbers are consecutive per scope");
        *n += 1;
    }
}

fn event_multiset(events: &[EventOut]) -> Vec<(Hash, Hash, String, Vec<u8>)> {
    let mut v: Vec<_> = events.iter().map(|e| (e.scope, e.op, e.kind.clone(), e.data.clone())).collect();
    v.sort();
    v
}

/// Runs a scenario and asserts:
///
/// 1. no panic, and the report of every scope is self-consistent;
/// 2. after every `restart` and at the end, `Engine::restore` from the
///    committed writes (a `MemStore`) gives the same reports, less the data
///    key waits (memory only);
/// 3. the same frames delivered in causal order (by rank), at one instant,
///    give the same reports less `divergences`, and the same events as a
///    multiset, whenever the first run lost nothing to time or bounds (no
///    `key_timeout`, no eviction, no restart with data key waits, default
///    bounds).
pub fn check_scenario(sc: &Scenario) -> Summary {
    let cfg = sc.config();
    let mut a = Run::new(cfg.clone());
    let mut now: u64 = 0;
    let mut frames: Vec<(u32, &[u8])> = Vec::new();
    for st in &sc.steps {
        match st {
            Step::Frame { rank, frame } => {
                a.engine.handle_frame(frame, now);
                frames.push((*rank, frame));
            }
            Step::Advance(ms) => now = now.saturating_add(*ms),
            Step::Tick => a.engine.handle_tick(now),
            Step::Commit => a.commit(),
            Step::Restart => a.restart(&cfg, now),
        }
    }
    a.commit();
    check_consistent(&mut a.engine);
    check_event_seqs(&a.events);
    let ra = reports(&mut a.engine, true, false);
    let comparable = sc.tight.is_none() && !a.lost_anything();
    let summary = Summary {
        stats: a.engine.stats.clone(),
        restarts: sc.steps.iter().filter(|s| matches!(s, Step::Restart)).count() as u32,
        comparable,
    };
    // Restore at the end.
    a.restart(&cfg, now);

    if comparable {
        frames.sort_by_key(|(rank, _)| *rank);
        let mut b = Run::new(cfg.clone());
        for (_, f) in &frames {
            b.engine.handle_frame(f, 0);
            b.commit();
        }
        check_consistent(&mut b.engine);
        check_event_seqs(&b.events);
        let rb = reports(&mut b.engine, true, false);
        assert_same(&ra, &rb, "the same frames in causal order give the same state");
        assert_eq!(event_multiset(&a.events), event_multiset(&b.events), "the same frames give the same events");
    }
    summary
}

/// What a scenario reached, for judging the harness (`DAGFOLD_FUZZ_TALLY`).
#[derive(Clone, Debug)]
pub struct Summary {
    /// The engine's counters since its last restart (before the final one).
    pub stats: dagfold::core::Stats,
    pub restarts: u32,
    /// Whether the causal-order comparison ran.
    pub comparable: bool,
}
