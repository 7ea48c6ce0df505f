//! Offline checks of a node's store (the node stopped or killed): it opens;
//! the applied set is closed under dependencies; every buffered op is
//! buffered for a reason that still holds (pending: a dependency not
//! applied; key wait: its key absent); states are exclusive; reopening
//! needs no re-judgement (a consistent store); the root equals a fresh fold
//! of the applied ops; the event log is numbered 1..n and names applied ops.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use anyhow::anyhow;
use dagfold::core::{Cf, Config, Engine, Identity, TableScan, VerifiedOp, META_IDENTITY};
use dagfold::protocol::codec::decode_op;
use dagfold::protocol::{Hash, Op};
use dagfold::store::rocks::RocksStore;
use dagfold::store::Store;
use serde_json::json;

#[derive(Debug, Default, Clone)]
pub struct StoreReport {
    pub opened: bool,
    pub applied_ops: u64,
    pub pending: u64,
    pub key_waits: u64,
    pub dropped: u64,
    /// The scope's event log: seq → op.
    pub events: BTreeMap<u64, Hash>,
    /// The scope's root and applied count as restored.
    pub root: Option<Hash>,
    pub scope_applied: Option<u64>,
    /// Ops applied by reopening: the rest of a cascade committed in parts.
    pub released_at_reopen: u64,
    pub ops: HashSet<Hash>,
    pub problems: Vec<String>,
}

impl StoreReport {
    pub fn summary(&self) -> serde_json::Value {
        json!({
            "opened": self.opened,
            "applied_ops": self.applied_ops,
            "pending": self.pending,
            "key_waits": self.key_waits,
            "dropped": self.dropped,
            "events": self.events.len(),
            "root": self.root.map(hex::encode),
            "released_at_reopen": self.released_at_reopen,
            "problems": self.problems,
        })
    }
}

fn scan(store: &RocksStore, cf: Cf) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    store.scan(cf, &mut |k, v| out.push((k.to_vec(), v.to_vec()))).expect("the table reads back");
    out
}

fn h32(k: &[u8]) -> Option<Hash> {
    k.try_into().ok()
}

/// Opens the store at `dir` and checks it. `fresh_fold` also re-folds the
/// applied ops from scratch and compares (slower: every op is decrypted).
pub fn check_store(dir: &Path, scope: Option<Hash>, fresh_fold: bool) -> StoreReport {
    let dir = dir.to_path_buf();
    match std::panic::catch_unwind(move || check_inner(&dir, scope, fresh_fold)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            StoreReport { opened: false, problems: vec![format!("panic while checking the store: {msg:?}")], ..Default::default() }
        }
    }
}

fn check_inner(dir: &Path, scope: Option<Hash>, fresh_fold: bool) -> StoreReport {
    let mut r = StoreReport::default();
    let store = match RocksStore::open(dir) {
        Ok(s) => s,
        Err(e) => {
            r.problems.push(format!("the store did not open: {e}"));
            return r;
        }
    };
    r.opened = true;
    let mut p = |s: String| {
        if r.problems.len() < 20 {
            r.problems.push(s)
        }
    };
    let Some(identity) = store.get(Cf::Meta, META_IDENTITY).ok().flatten().and_then(|b| Identity::decode(&b)) else {
        p("no identity in the store".into());
        return r;
    };
    let keys: HashSet<Hash> = scan(&store, Cf::Keys).iter().filter_map(|(k, _)| h32(k)).collect();
    // The ops table holds the applied ops and the pending ones (each with
    // a pending record: its seq, or, in the older layout, seq ‖ op).
    let pending_records: HashMap<Vec<u8>, Vec<u8>> = scan(&store, Cf::Pending).into_iter().collect();
    let mut ops: HashMap<Hash, Op> = HashMap::new();
    let mut pending_ops: HashMap<Hash, Vec<u8>> = HashMap::new();
    for (k, v) in scan(&store, Cf::Ops) {
        // A compact record (`core::oprecord`) is read back whole: its
        // parents looked up, its id checked.
        let v = match h32(&k) {
            Some(id) if dagfold::core::oprecord::is_compact(&v) => match store.op(&id) {
                Ok(Some(whole)) => whole,
                Ok(None) => continue,
                Err(e) => {
                    p(format!("an ops record does not read back: {e}"));
                    continue;
                }
            },
            _ => v,
        };
        match (h32(&k), decode_op(&v)) {
            (Some(id), Ok(_)) if pending_records.contains_key(&k) => {
                pending_ops.insert(id, v);
            }
            (Some(id), Ok(op)) => {
                ops.insert(id, op);
            }
            _ => p(format!("an ops record does not decode (key {})", hex::encode(&k))),
        }
    }
    for (id, op) in &ops {
        for d in op.dependencies() {
            if !ops.contains_key(d) {
                p(format!("applied op {} has an unapplied dependency {}", hex::encode(id), hex::encode(d)));
            }
        }
    }
    let dropped: HashSet<Hash> = scan(&store, Cf::Dropped).iter().filter_map(|(k, _)| h32(k)).collect();
    let mut pending_ids = HashSet::new();
    let mut pending_of_scope = 0u64;
    let mut ready_pending = 0u64;
    for (k, v) in &pending_records {
        let bytes = match h32(k) {
            Some(id) if v.len() == 8 => pending_ops.get(&id).cloned().unwrap_or_default(),
            _ => v.get(8..).unwrap_or_default().to_vec(),
        };
        let (Some(id), Ok(op)) = (h32(k), decode_op(&bytes)) else {
            p(format!("a pending record has no op that decodes (key {})", hex::encode(k)));
            continue;
        };
        if op.dependencies().all(|d| ops.contains_key(d)) {
            // A cascade committed in parts: the rest of it was still to be
            // judged at the kill; or a pending op woken into a data key
            // wait, its records kept through the wait. Reopening judges it
            // (checked below).
            ready_pending += 1;
        }
        if let Some(d) = op.dependencies().find(|d| dropped.contains(*d)) {
            p(format!("pending op {} waits on dropped {}", hex::encode(id), hex::encode(d)));
        }
        if Some(op.scope_of(&id)) == scope {
            pending_of_scope += 1;
        }
        pending_ids.insert(id);
    }
    let mut key_waits = 0u64;
    for (k, v) in scan(&store, Cf::KeyWaits) {
        let (Some(id), Ok(op)) = (h32(&k), decode_op(v.get(8..).unwrap_or_default())) else {
            p(format!("a key-wait record does not decode (key {})", hex::encode(&k)));
            continue;
        };
        key_waits += 1;
        if ops.contains_key(&id) || pending_ids.contains(&id) {
            p(format!("op {} waits for its key and is also applied or pending", hex::encode(id)));
        }
        if keys.contains(&op.key_id) {
            p(format!("op {} waits for key {} which is held", hex::encode(id), hex::encode(op.key_id)));
        }
    }
    for d in &dropped {
        if ops.contains_key(d) || pending_ids.contains(d) {
            p(format!("op {} is dropped and also applied or pending", hex::encode(d)));
        }
    }
    r.applied_ops = ops.len() as u64;
    r.pending = pending_ids.len() as u64;
    r.key_waits = key_waits;
    r.dropped = dropped.len() as u64;
    // Reopen as the node does.
    let mut engine = match Engine::restore(Config::default(), identity.clone(), &store, None, 0) {
        Ok(e) => e,
        Err(e) => {
            r.problems.push(format!("the store's tables did not read back: {e}"));
            return r;
        }
    };
    let commit = engine.take_commit().expect("no cold index, no cold read to fail");
    if !commit.writes.is_empty() && ready_pending == 0 {
        p(format!(
            "reopening re-judged buffered ops ({} writes, {} applied) though no stored pending op was ready",
            commit.writes.len(),
            commit.applied.len()
        ));
    }
    r.released_at_reopen = commit.applied.len() as u64;
    // The ops that reopening applied, for the fresh fold below.
    let released: Vec<(Hash, Vec<u8>)> = commit
        .writes
        .iter()
        .filter_map(|w| match w {
            // A compact record's bytes as signed are in `released`.
            dagfold::core::Write::Put(Cf::Ops, k, v) if !dagfold::core::oprecord::is_compact(v) => Some((h32(k)?, v.clone())),
            _ => None,
        })
        .chain(commit.released.iter().cloned())
        .collect();
    if let Some(scope) = scope {
        if let Some(rep) = engine.report(&scope) {
            r.root = Some(rep.root);
            r.scope_applied = Some(rep.applied.len() as u64);
            if rep.pending.len() as u64 > pending_of_scope || (ready_pending == 0 && rep.pending.len() as u64 != pending_of_scope) {
                p(format!("restored pending {} != stored pending {}", rep.pending.len(), pending_of_scope));
            }
            if fresh_fold {
                let mut fresh = Engine::new(Config::default(), identity.clone());
                for (_, v) in scan(&store, Cf::Keys) {
                    if let Ok(k) = <[u8; 32]>::try_from(v.as_slice()) {
                        fresh.add_key(k);
                    }
                }
                let applied = scan(&store, Cf::Ops).into_iter().filter(|(k, _)| !pending_records.contains_key(k));
                let applied = applied.filter_map(|(k, v)| {
                    let id = h32(&k)?;
                    let v = if dagfold::core::oprecord::is_compact(&v) { store.op(&id).ok()?? } else { v };
                    Some((id, v))
                });
                for (id, v) in applied.chain(released) {
                    let Ok(op) = decode_op(&v) else { continue };
                    fresh.handle_checked(VerifiedOp { id, op, bytes: v, pre: Default::default() }, true, 0);
                }
                match fresh.report(&scope) {
                    Some(f) => {
                        if f.root != rep.root {
                            p(format!("root {} != fresh fold of the applied ops {}", hex::encode(rep.root), hex::encode(f.root)));
                        }
                        if f.applied != rep.applied || f.data_heads != rep.data_heads || f.governance_heads != rep.governance_heads {
                            p("applied set or heads differ from a fresh fold".into());
                        }
                    }
                    None => p("a fresh fold of the applied ops has no such scope".into()),
                }
            }
        }
        // The event log of the scope (read as the node serves it): 1..=n,
        // naming applied ops.
        match store.reader().events(&scope, 1, u64::MAX, usize::MAX) {
            Ok(evs) => {
                for (seq, v) in evs {
                    match v.get(..32).and_then(h32) {
                        Some(op) => {
                            if !ops.contains_key(&op) {
                                p(format!("event {seq} names op {} which is not applied", hex::encode(op)));
                            }
                            if r.events.insert(seq, op).is_some() {
                                p(format!("event {seq} is in the log twice"));
                            }
                        }
                        None => p(format!("event {seq} does not decode")),
                    }
                }
            }
            Err(e) => p(format!("reading the event log: {e}")),
        }
        if let (Some(first), Some(last)) = (r.events.keys().next(), r.events.keys().next_back()) {
            if *first != 1 || *last != r.events.len() as u64 {
                p(format!("event log is not numbered 1..=n: {} events, from {first} to {last}", r.events.len()));
            }
        }
    }
    r.ops = ops.keys().copied().collect();
    r
}

/// Seeds a fresh store with a node identity (so that frames files can be
/// made before the node first runs).
pub fn seed_identity(dir: &Path, id: &Identity) -> anyhow::Result<()> {
    let mut store = RocksStore::open(dir)?;
    store.write(&[dagfold::core::Write::Put(Cf::Meta, META_IDENTITY.to_vec(), id.encode())], true)?;
    Ok(())
}

pub fn identity_from(seed: u64, label: &str) -> Identity {
    let h = |part: &str| dagfold::protocol::crypto::sha256_parts(&[b"campaign", label.as_bytes(), part.as_bytes(), &seed.to_le_bytes()]);
    Identity::from_secrets(h("seed"), h("kem"))
}

/// The data ops of a frames file, in file order (id, encoded frame).
pub fn data_ops_of_file(path: &Path) -> anyhow::Result<Vec<Hash>> {
    let f = std::fs::File::open(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let mut r = dagfold::durable::FileFrames::new(std::io::BufReader::new(f));
    let mut out = Vec::new();
    while let Some(item) = r.next_frame()? {
        if let dagfold::durable::FrameItem::Frame(frame) = item {
            if let Ok(dagfold::core::Decoded::Op { id, op, .. }) = dagfold::core::decode_frame(&frame) {
                if op.plane == dagfold::protocol::PLANE_DATA {
                    out.push(id);
                }
            }
        }
    }
    Ok(out)
}
