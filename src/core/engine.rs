//! The receive-and-apply state machine of SPEC §6, sans-IO: verdicts,
//! buffering, apply, the cascade, and the write set of a commit.
//!
//! Inputs are `handle_*` calls carrying bytes or verified ops and `now_ms`;
//! outputs are pulled with `take_commit` (the store writes of everything the
//! handled messages changed, cascades included, plus the events they produced,
//! to be dispatched only once those writes are durable). No threads, sockets,
//! clocks or storage live here: the same code runs in tests, the simulation,
//! the benchmarks and the node.
//!
//! Beside it: its public types (`types`), the tables and their records
//! (`tables`), the commit (`commit`), what the pipeline computes ahead
//! (`prejudge`), the buffers (`buffers`), and two more `impl Engine` blocks
//! that read and fill its `pub(super)` fields: `restore` and the queries
//! (`queries`).
//!
//! This file stays over 800 lines (about 900 without its tests) because
//! judging, buffering, applying and cascading all change the same indexes and
//! the same commit, and read best in one place.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use super::buffers::{Buffered, Buffers, Ids};
use super::cold::{ColdOps, ColdReadFailed, IdFilter};
use super::commit::{Check, Commit, EventOut, Fold};
use super::governance::{GovNode, GovState, Governance};
use super::oprecord;
use super::prejudge::{authorize, PreAuth, Prepared, VerifiedOp};
use super::projector::Projector;
use super::tables::{delivery_meta_key, seq_and_bytes, Cf, ScopeRecord, Write, META_FOLLOW_PREFIX};
use super::types::{BufKind, Config, GenesisPolicy, Identity, Outcome, Reason, Stats};
use super::{IdMap, IdSet};
use crate::limits;
use crate::protocol::codec::{decode_data_payload, decode_frame, decode_gov_payload, Decoded};
use crate::protocol::crypto::{open_key_delivery_to, open_payload};
use crate::protocol::*;

#[derive(Clone, Copy, Debug)]
pub(super) struct AppliedMeta {
    pub(super) scope: u32,
    pub(super) plane: u8,
    pub(super) hlc: u64,
    /// Interned cut (SPEC §3) of the op; only read for data ops.
    pub(super) cut: u32,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Entry {
    Applied(AppliedMeta),
    Buffered,
    Dropped { reason: Reason, scope: u32 },
}

/// One scope's state in the engine (its buffered ops are counted in
/// `Buffers`, its cells in the projector).
pub(super) struct ScopeState {
    pub(super) id: Hash,
    pub(super) genesis_applied: bool,
    pub(super) gov_heads: BTreeSet<Hash>,
    /// The members at `gov_heads`, sorted by key, once a status asked for
    /// them; `None` again whenever `gov_heads` change. (A status is asked
    /// for every scope a commit touches: with thousands of scopes written
    /// at once, the state at the heads and its sort cost more than the
    /// rest of the status.)
    pub(super) members_at_heads: Option<std::sync::Arc<[(PublicKey, Role)]>>,
    pub(super) data_heads: BTreeSet<Hash>,
    pub(super) applied: u64,
    pub(super) event_seq: u64,
    dirty: bool,
    /// Its status changed since it was last taken: listed in
    /// `Engine::touched` (`Engine::take_statuses`).
    pub(super) status_stale: bool,
}

impl ScopeState {
    fn new(id: Hash) -> Self {
        ScopeState {
            id,
            genesis_applied: false,
            gov_heads: BTreeSet::new(),
            members_at_heads: None,
            data_heads: BTreeSet::new(),
            applied: 0,
            event_seq: 0,
            dirty: false,
            status_stale: false,
        }
    }
}

/// The decrypted, rule-checked payload of an op about to be applied.
enum Decrypted {
    Gov(Vec<u8>, GovPayload),
    Data(DataPayload),
}

enum Judgement {
    /// With the interned cut of the op's cut ids when the judgement found
    /// it (a data op whose parent has the same cut), so that the apply
    /// need not hash and look the cut up again.
    Apply(Decrypted, Option<u32>),
    Drop(Reason),
    Pending(Ids),
    KeyWait,
}

/// The engine's memory by part, in bytes: the capacities of its maps and
/// lists and what their entries hold, not the allocator's own slack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineMemory {
    /// The index of known ops (applied, buffered, dropped), the ages of
    /// its applied and dropped entries, the cold filter.
    pub op_index: u64,
    /// Each scope's state (heads, members at its heads), the group keys,
    /// the interned cuts.
    pub scopes: u64,
    /// The governance ops, the scope of every op, the states at cuts
    /// cached (`Governance::heap_bytes`).
    pub governance: u64,
    /// The ops waiting for a dependency or a key (`Buffers::heap_bytes`).
    pub buffers: u64,
}

pub struct Engine {
    cfg: Config,
    identity: Identity,
    pub(super) ops: IdMap<Hash, Entry>,
    /// The ops not yet applied (`Entry::Buffered` in `ops`).
    pub(super) buffers: Buffers,
    /// Ids waited on that were not known when first waited on: a superset
    /// of what `wanted` returns (see there).
    pub(super) maybe_wanted: IdSet<Hash>,
    pub(super) keys: IdMap<Hash, [u8; 32]>,
    pub(super) scopes: Vec<ScopeState>,
    pub(super) scope_index: IdMap<Hash, u32>,
    cuts: Vec<Arc<[Hash]>>,
    cut_index: IdMap<Arc<[Hash]>, u32>,
    pub(super) gov: Governance,
    pub(super) dropped_order: VecDeque<(u64, Hash)>,
    pub(super) seq: u64,
    pub(super) work: VecDeque<Hash>,
    pub(super) out: Commit,
    /// Scopes whose status changed since it was last taken
    /// (`take_statuses`), each listed once while `status_stale`, in the
    /// order they were touched, and counted in `stale_statuses`.
    pub(super) touched: Vec<u32>,
    pub(super) stale_statuses: usize,
    /// Ops buffered in the commit being built, whose records it writes
    /// if they are still buffered when it is taken (`Buffered::written`).
    buffered_in_commit: Vec<Hash>,
    /// Ops records deleted (a pending op dropped or evicted) by commits not
    /// known to be durable, with the commit's number: until then the store
    /// may still hold them, and the cold index must not take one for an
    /// applied op.
    ops_deleted: IdMap<Hash, u64>,
    /// The cold index (see `core::cold`): none, and every applied op stays
    /// in `ops`.
    pub(super) cold: Option<Box<dyn ColdOps>>,
    pub(super) cold_filter: IdFilter,
    /// The filter does not yet hold the ops applied before a restore (the
    /// driver reads them into one and hands it over:
    /// `complete_cold_filter`): until then every id may be a cold one.
    pub(super) cold_filter_partial: bool,
    /// The first failed read of the cold index. From it on the engine's
    /// answers may be wrong (an applied op taken for unknown), so it judges
    /// nothing more and `take_commit` hands out no more commits: as after a
    /// failed write (`store`), only a reopen, which rebuilds the engine from
    /// the store, brings the two back together. A cell, since `op_state`
    /// reads through `&self`.
    pub(super) cold_failed: std::cell::OnceCell<ColdReadFailed>,
    /// Applied ops in `ops`, oldest first, with the number of the commit
    /// that applied them (an id read back from the cold index comes again).
    hot_order: VecDeque<(u64, Hash)>,
    /// The number of the commit being built.
    commit_number: u64,
    /// Every commit up to this number is durable (`note_durable`).
    durable_through: Option<u64>,
    /// Woken ops judged per call at most (`set_cascade_budget`).
    cascade_budget: u64,
    /// The fold, when the engine runs it itself; `None` once a driver took
    /// it to run after the engine (`take_projector`): applied data ops then
    /// leave in `Commit::folds`.
    pub(super) projector: Option<Projector>,
    /// Scopes whose genesis is accepted whoever authored it (`follow`).
    pub(super) followed: IdSet<Hash>,
    pub stats: Stats,
}

impl Engine {
    pub fn new(cfg: Config, identity: Identity) -> Self {
        let buffers = Buffers::new(&cfg);
        let mut e = Engine {
            cfg,
            identity,
            ops: IdMap::default(),
            buffers,
            maybe_wanted: IdSet::default(),
            keys: IdMap::default(),
            scopes: Vec::new(),
            scope_index: IdMap::default(),
            cuts: Vec::new(),
            cut_index: IdMap::default(),
            gov: Governance::default(),
            dropped_order: VecDeque::new(),
            seq: 1,
            work: VecDeque::new(),
            out: Commit::default(),
            touched: Vec::new(),
            stale_statuses: 0,
            buffered_in_commit: Vec::new(),
            ops_deleted: Default::default(),
            cold: None,
            cold_filter: IdFilter::new(0),
            cold_filter_partial: false,
            cold_failed: std::cell::OnceCell::new(),
            hot_order: VecDeque::new(),
            commit_number: 0,
            durable_through: None,
            cascade_budget: u64::MAX,
            projector: Some(Projector::default()),
            followed: IdSet::default(),
            stats: Stats::default(),
        };
        e.intern_cut(&[]);
        e
    }

    /// Gives the engine a cold index: from now on an applied op leaves the
    /// in-memory index once more than `hot_applied_max` newer ones are
    /// applied and its commit is durable (`note_durable`), and is read back
    /// from `cold` when asked for. Without one, every applied op stays.
    pub fn set_cold(&mut self, cold: Box<dyn ColdOps>) {
        self.cold = Some(cold);
        self.cold_filter = IdFilter::new(self.cfg.cold_filter_bytes);
    }

    /// Whether the cold filter still waits for the ops applied before the
    /// restore (`complete_cold_filter`): meanwhile, an id the engine does
    /// not hold is looked up in the store.
    pub fn cold_filter_partial(&self) -> bool {
        self.cold_filter_partial
    }

    /// The size of the cold filter, for `cold::filter_of_stored_ops`.
    pub fn cold_filter_bytes(&self) -> usize {
        self.cfg.cold_filter_bytes
    }

    /// Completes the cold filter after a restore with `stored`, the filter
    /// of the ops table read after the restore (`cold::filter_of_stored_ops`);
    /// the ops that left the in-memory index since are already in.
    pub fn complete_cold_filter(&mut self, stored: &IdFilter) {
        self.cold_filter.union(stored);
        self.cold_filter_partial = false;
    }

    /// Completes a partial cold filter at once, on the caller's thread,
    /// from `cold` (`cold::filter_of_stored_ops`): for the drivers that do
    /// not serve while it is read (`InlineDriver`, the simulation).
    pub fn complete_cold_filter_now(&mut self, cold: &dyn ColdOps) -> Result<(), ColdReadFailed> {
        if self.cold_filter_partial {
            let filter = super::cold::filter_of_stored_ops(cold, self.cfg.cold_filter_bytes)?;
            self.complete_cold_filter(&filter);
        }
        Ok(())
    }

    /// Starts loading what judging these ops reads first of the cold index
    /// (each op's id is looked up there unless in memory): a batch's ids
    /// before its ops, so that their cache misses overlap instead of each
    /// stalling its op. Changes nothing.
    pub fn prefetch<'a>(&self, ids: impl Iterator<Item = &'a Hash>) {
        if self.cold.is_none() || self.cold_filter_partial {
            return;
        }
        for id in ids {
            self.cold_filter.prefetch(id);
        }
    }

    /// Whether `id` may be an applied op of the cold index.
    fn cold_may_contain(&self, id: &Hash) -> bool {
        self.cold_filter_partial || self.cold_filter.may_contain(id)
    }

    /// The driver reports that every commit up to `number` is durable, so
    /// ops they applied may leave the in-memory index.
    pub fn note_durable(&mut self, number: u64) {
        self.durable_through = Some(self.durable_through.map_or(number, |d| d.max(number)));
        let Some(durable) = self.durable_through else { return };
        if !self.ops_deleted.is_empty() {
            self.ops_deleted.retain(|_, n| *n > durable);
        }
        if self.cold.is_none() {
            return;
        }
        while self.hot_order.len() > self.cfg.hot_applied_max {
            let &(n, id) = self.hot_order.front().expect("longer than the bound");
            if n > durable {
                break;
            }
            self.hot_order.pop_front();
            if matches!(self.ops.get(&id), Some(Entry::Applied(_))) {
                self.ops.remove(&id);
                self.cold_filter.insert(&id);
                self.stats.cold_evicted += 1;
            }
        }
    }

    /// Applied ops in the in-memory index, and the bytes of the cold filter.
    pub fn index_sizes(&self) -> (usize, u64) {
        (self.ops.len(), self.cold_filter.heap_bytes())
    }

    /// The engine's memory by part, for the memory gauges (see
    /// `EngineMemory`). Walks the scopes and the governance ops, not the
    /// data ops: for a gauge read about once a second.
    pub fn memory(&self) -> EngineMemory {
        use super::map_bytes;
        let entry = std::mem::size_of::<(u64, Hash)>();
        let op_index = map_bytes::<Hash, Entry>(self.ops.capacity())
            + ((self.hot_order.capacity() + self.dropped_order.capacity()) * entry) as u64
            + map_bytes::<Hash, u64>(self.ops_deleted.capacity())
            + map_bytes::<Hash, ()>(self.maybe_wanted.capacity())
            + (self.buffered_in_commit.capacity() * std::mem::size_of::<Hash>()) as u64
            + self.cold_filter.heap_bytes();
        // A set's element costs about its key and a third more in the
        // B-tree's nodes.
        let heads: usize = self.scopes.iter().map(|s| s.gov_heads.len() + s.data_heads.len()).sum();
        let members: usize = self.scopes.iter().filter_map(|s| s.members_at_heads.as_ref()).map(|m| m.len()).sum();
        let cuts: usize = self.cuts.iter().map(|c| 16 + c.len() * 32).sum();
        let scopes = (self.scopes.capacity() * std::mem::size_of::<ScopeState>() + heads * 43) as u64
            + (members * std::mem::size_of::<(PublicKey, Role)>()) as u64
            + map_bytes::<Hash, u32>(self.scope_index.capacity())
            + map_bytes::<Hash, [u8; 32]>(self.keys.capacity())
            + map_bytes::<Hash, ()>(self.followed.capacity())
            + (self.cuts.capacity() * 16 + cuts) as u64
            + map_bytes::<Arc<[Hash]>, u32>(self.cut_index.capacity());
        EngineMemory { op_index, scopes, governance: self.gov.heap_bytes(), buffers: self.buffers.heap_bytes() }
    }

    /// An applied op of the cold index, read back from the store. A failed
    /// read is kept in `cold_failed` (the engine stops) and read as none:
    /// nothing judged from here on is committed.
    pub(super) fn cold_op(&self, id: &Hash) -> Option<Op> {
        let cold = self.cold.as_ref()?;
        if !self.cold_may_contain(id) || self.ops_deleted.contains_key(id) {
            return None;
        }
        let bytes = match cold.get(id) {
            Ok(bytes) => bytes?,
            Err(e) => {
                let _ = self.cold_failed.set(e);
                return None;
            }
        };
        // Its scope, plane, hlc and cut: a record's parents are not needed.
        Some(oprecord::decode_without_parents(&bytes).expect("a stored op decodes"))
    }

    /// The failed read of the cold index that stopped the engine, if any.
    pub fn cold_failed(&self) -> Option<&ColdReadFailed> {
        self.cold_failed.get()
    }

    /// Whether `id` is an applied op of the cold index.
    fn cold_applied(&mut self, id: &Hash) -> bool {
        self.cold_meta(id).is_some()
    }

    /// The meta of an applied op of the cold index; it comes back into the
    /// hot index, since ops that name it as a dependency tend to follow.
    fn cold_meta(&mut self, id: &Hash) -> Option<AppliedMeta> {
        if self.cold.is_none() || !self.cold_may_contain(id) {
            return None;
        }
        self.stats.cold_reads += 1;
        let op = self.cold_op(id)?;
        self.stats.cold_hits += 1;
        let scope = self.scope_idx(&op.scope_of(id));
        let cut = self.intern_cut(op.cut_ids());
        let m = AppliedMeta { scope, plane: op.plane, hlc: op.hlc, cut };
        self.ops.insert(*id, Entry::Applied(m));
        self.hot_order.push_back((self.commit_number, *id));
        Some(m)
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub(super) fn intern_cut(&mut self, cut: &[Hash]) -> u32 {
        if let Some(i) = self.cut_index.get(cut) {
            return *i;
        }
        let arc: Arc<[Hash]> = cut.into();
        let i = self.cuts.len() as u32;
        self.cuts.push(arc.clone());
        self.cut_index.insert(arc, i);
        i
    }

    pub(super) fn scope_idx(&mut self, scope: &Hash) -> u32 {
        if let Some(i) = self.scope_index.get(scope) {
            return *i;
        }
        let i = self.scopes.len() as u32;
        self.scopes.push(ScopeState::new(*scope));
        self.buffers.add_scope();
        self.scope_index.insert(*scope, i);
        i
    }

    // ----- inputs -------------------------------------------------------

    /// One wire frame's content (SPEC §10), decoded and verified here. The
    /// pipeline instead verifies in batches and calls `handle_verified`.
    pub fn handle_frame(&mut self, frame: &[u8], now_ms: u64) -> Outcome {
        match decode_frame(frame) {
            Err(_) => {
                self.stats.frames += 1;
                self.stats.malformed += 1;
                Outcome::Malformed
            }
            Ok(Decoded::Key(kd)) => {
                self.stats.frames += 1;
                self.handle_key(&kd, now_ms)
            }
            Ok(Decoded::Op { id, op, bytes }) => {
                let valid = crate::protocol::sig::verify(&op.author, &id, &op.signature);
                self.handle_checked(VerifiedOp { id, op, bytes, pre: Prepared::default() }, valid, now_ms)
            }
        }
    }

    /// Counts a frame that failed to decode upstream (the pipeline decodes
    /// in the transport).
    pub fn note_malformed(&mut self) -> Outcome {
        self.stats.frames += 1;
        self.stats.malformed += 1;
        Outcome::Malformed
    }

    /// An op whose signature was checked upstream (`signature_valid`).
    pub fn handle_checked(&mut self, v: VerifiedOp, signature_valid: bool, now_ms: u64) -> Outcome {
        self.stats.frames += 1;
        if !signature_valid {
            self.stats.bad_signature += 1;
            return Outcome::BadSignature;
        }
        self.handle_verified(v, now_ms)
    }

    fn handle_verified(&mut self, v: VerifiedOp, now_ms: u64) -> Outcome {
        if self.cold_failed().is_some() {
            return Outcome::StoreFailed;
        }
        if self.ops.contains_key(&v.id) || self.cold_applied(&v.id) {
            self.stats.duplicates += 1;
            return Outcome::Duplicate;
        }
        if self.cold_failed().is_some() {
            return Outcome::StoreFailed;
        }
        if v.op.kind() == OpKind::Genesis {
            if let GenesisPolicy::Authors(authors) = &self.cfg.genesis_policy {
                let accepted =
                    v.op.author == self.identity.public_key || authors.contains(&v.op.author) || self.followed.contains(&v.id);
                if !accepted {
                    self.stats.genesis_refused += 1;
                    return Outcome::GenesisRefused;
                }
            }
        }
        let id = v.id;
        let outcome = self.evaluate(v.op, v.bytes, id, None, Some(v.pre), now_ms);
        self.run_cascade(now_ms);
        if self.cold_failed().is_some() {
            return Outcome::StoreFailed;
        }
        outcome
    }

    /// Accepts the genesis of `scope` whoever authored it, from now on
    /// (API.md, "Which scopes a node holds"): kept in `Cf::Meta` with the
    /// next commit. Its copies refused before are judged afresh when they
    /// come again (a refused genesis is not remembered).
    pub fn follow(&mut self, scope: Hash) {
        if self.followed.insert(scope) {
            let mut key = META_FOLLOW_PREFIX.to_vec();
            key.extend_from_slice(&scope);
            self.out.writes.push(Write::Put(Cf::Meta, key, Vec::new()));
        }
    }

    /// A key delivery this node made (API.md): judged as any delivery (one
    /// to the node itself adds its key), and kept in `Cf::Meta` under its
    /// recipient, to be served to it again, and gossiped once durable.
    pub fn handle_own_delivery(&mut self, kd: &KeyDelivery, now_ms: u64) -> Outcome {
        let outcome = self.handle_key(kd, now_ms);
        self.out.writes.push(Write::Put(Cf::Meta, delivery_meta_key(kd), encode(kd)));
        if kd.recipient != self.identity.public_key {
            self.out.delivered.push(kd.clone());
        }
        outcome
    }

    /// The number of the commit being built: what is handled now becomes
    /// durable with it.
    pub fn commit_number(&self) -> u64 {
        self.commit_number
    }

    /// Whether the genesis of `scope` is accepted whoever authored it.
    pub fn follows(&self, scope: &Hash) -> bool {
        self.followed.contains(scope)
    }

    /// A key delivery (SPEC §9).
    pub fn handle_key(&mut self, kd: &KeyDelivery, now_ms: u64) -> Outcome {
        self.handle_key_opened(kd, None, now_ms)
    }

    /// `handle_key`, with the delivery opened ahead when `opened` is given
    /// (the pipeline's decryptor opens a batch's deliveries to this node
    /// together, `crypto::open_key_deliveries_to`): `Some(None)` if it
    /// does not open.
    pub fn handle_key_opened(&mut self, kd: &KeyDelivery, opened: Option<Option<[u8; 32]>>, now_ms: u64) -> Outcome {
        if self.cold_failed().is_some() {
            return Outcome::StoreFailed;
        }
        if kd.recipient != self.identity.public_key || self.keys.contains_key(&kd.key_id) {
            self.stats.keys_ignored += 1;
            return Outcome::KeyIgnored;
        }
        let opened = opened.unwrap_or_else(|| open_key_delivery_to(kd, &self.identity.kem_secret, &self.identity.kem_public));
        let Some(key) = opened else {
            self.stats.keys_ignored += 1;
            return Outcome::KeyIgnored;
        };
        self.add_key(key);
        self.run_cascade(now_ms);
        if self.cold_failed().is_some() {
            return Outcome::StoreFailed;
        }
        Outcome::KeyAccepted
    }

    /// Stores a group key and wakes what waits for it (also used by tools
    /// that hold a key themselves).
    pub fn add_key(&mut self, key: [u8; 32]) {
        let key_id = crate::protocol::crypto::key_id_of(&key);
        if self.keys.insert(key_id, key).is_some() {
            return;
        }
        self.stats.keys_accepted += 1;
        self.out.keys_added.push(key);
        self.out.writes.push(Write::Put(Cf::Keys, key_id.to_vec(), key.to_vec()));
        if let Some(ws) = self.buffers.take_key_waiters(&key_id) {
            self.work.extend(ws);
        }
    }

    pub fn has_key(&self, key_id: &Hash) -> bool {
        self.keys.contains_key(key_id)
    }

    /// Drops data ops whose key wait expired (`key_timeout`: not a verdict,
    /// they are forgotten and judged afresh if delivered again).
    pub fn handle_tick(&mut self, now_ms: u64) {
        while let Some(id) = self.buffers.pop_expired(now_ms) {
            if let Some(b) = self.take_buffered(&id) {
                self.forget(&id);
                self.buffers.unregister(&id, &b);
                // The records a woken pending op kept go too.
                self.forget_prior(&id, Some(&b), false);
                self.stats.key_timeouts += 1;
            }
        }
    }

    /// The earliest data key-wait deadline, for the caller's timer.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.buffers.next_deadline_ms()
    }

    // ----- judging ------------------------------------------------------

    pub(super) fn applied(&mut self, id: &Hash) -> Option<AppliedMeta> {
        match self.ops.get(id) {
            Some(Entry::Applied(m)) => Some(*m),
            Some(_) => None,
            None => self.cold_meta(id),
        }
    }

    /// SPEC §6 steps 2–4, in order; the first failing clause decides.
    /// Takes the plaintext out of `pre` once it is used (only an op that
    /// gets that far is decrypted; a pending one keeps it).
    fn judge(&mut self, op: &Op, scope: u32, pre: Option<&mut Prepared>) -> Judgement {
        if op.kind() == OpKind::Genesis {
            return match decode_gov_payload(&op.payload) {
                Ok(p) if genesis_payload_ok(&p) => Judgement::Apply(Decrypted::Gov(op.payload.clone(), p), None),
                _ => Judgement::Drop(Reason::BadPayload),
            };
        }
        // Step 2: dependencies, each looked up once: what the clauses
        // below read of them is kept (`metas[i]` is the `i`-th of
        // `op.dependencies()`: the parents, then a data op's cut).
        let mut missing = Ids::new();
        let mut metas: smallvec::SmallVec<[AppliedMeta; 8]> = smallvec::SmallVec::new();
        for d in op.dependencies() {
            match self.ops.get(d) {
                Some(Entry::Dropped { .. }) => return Judgement::Drop(Reason::RejectedDependency),
                Some(Entry::Applied(m)) => metas.push(*m),
                Some(Entry::Buffered) => missing.push(*d),
                None => match self.cold_meta(d) {
                    Some(m) => metas.push(m),
                    None => missing.push(*d),
                },
            }
        }
        if !missing.is_empty() {
            return Judgement::Pending(missing);
        }
        let (parents, cut) = metas.split_at(op.parents.len());
        if parents.iter().any(|m| m.scope != scope || m.plane != op.plane)
            || cut.iter().any(|m| m.scope != scope || m.plane != PLANE_GOVERNANCE)
        {
            return Judgement::Drop(Reason::WrongPlane);
        }
        if metas.iter().any(|m| op.hlc <= m.hlc) {
            return Judgement::Drop(Reason::Clock);
        }
        // Step 3: authorize at the cut.
        let auth = match pre.as_ref().and_then(|p| p.auth) {
            Some(a) => a,
            // Step 2 found every cut id applied, of this scope.
            None => authorize(&mut self.gov, op),
        };
        match auth {
            PreAuth::Ok => {}
            PreAuth::Unauthorized => return Judgement::Drop(Reason::Unauthorized),
            PreAuth::StaleKey => return Judgement::Drop(Reason::StaleKey),
        }
        let mut same_cut = None;
        if op.plane == PLANE_DATA {
            let mut g: Option<Arc<GovState>> = None;
            for m in &metas[..op.parents.len()] {
                if *self.cuts[m.cut as usize] == *op.cut {
                    same_cut = Some(m.cut);
                    continue;
                }
                let pcut = self.cuts[m.cut as usize].clone();
                let g = g.get_or_insert_with(|| self.gov.state_at(&op.cut));
                if !pcut.iter().all(|x| g.ancestors.contains(x)) {
                    return Judgement::Drop(Reason::StaleCut);
                }
            }
        }
        // Step 4: decrypt, and decode (both may be done ahead).
        let mut pre = pre;
        if let Some((p, _)) = pre.as_mut().and_then(|p| p.data.take()) {
            debug_assert_eq!(op.plane, PLANE_DATA, "only a data op's payload is decoded ahead");
            return Judgement::Apply(Decrypted::Data(p), same_cut);
        }
        let opened = match pre.and_then(|p| p.opened.take()) {
            Some(opened) => opened,
            None => {
                let Some(key) = self.keys.get(&op.key_id) else {
                    return Judgement::KeyWait;
                };
                open_payload(key, &op.nonce, &op.scope, op.plane, &op.payload)
            }
        };
        let Some(plain) = opened else {
            return Judgement::Drop(Reason::Undecryptable);
        };
        if op.plane == PLANE_GOVERNANCE {
            match decode_gov_payload(&plain) {
                Ok(p) if governance_payload_ok(&p) => Judgement::Apply(Decrypted::Gov(plain, p), None),
                _ => Judgement::Drop(Reason::BadPayload),
            }
        } else {
            match decode_data_payload(&plain) {
                Ok(p) => Judgement::Apply(Decrypted::Data(p), same_cut),
                Err(_) => Judgement::Drop(Reason::BadPayload),
            }
        }
    }

    /// Judges an op (new, or woken from a buffer: `prior`) and settles it.
    fn evaluate(
        &mut self,
        op: Op,
        bytes: Vec<u8>,
        id: Hash,
        prior: Option<Box<Buffered>>,
        mut pre: Option<Prepared>,
        now_ms: u64,
    ) -> Outcome {
        let scope = self.scope_idx(&op.scope_of(&id));
        match self.judge(&op, scope, pre.as_mut()) {
            Judgement::Apply(payload, cut) => {
                self.forget_prior(&id, prior.as_deref(), true);
                let stored = prior.is_some_and(|b| b.in_ops && b.written);
                self.apply(op, bytes, id, scope, payload, stored, cut);
                Outcome::Applied
            }
            Judgement::Drop(reason) => {
                self.forget_prior(&id, prior.as_deref(), false);
                self.drop_op(id, scope, reason);
                Outcome::Dropped(reason)
            }
            Judgement::Pending(missing) => {
                match prior {
                    Some(mut b) if b.kind == BufKind::Pending => {
                        // Still waiting: it stays registered under the ids
                        // still missing (a subset of those it was under).
                        debug_assert!(missing.iter().all(|m| b.missing.contains(m)));
                        b.missing = missing;
                        b.op = op;
                        b.bytes = bytes;
                        b.pre = pre;
                        self.put_buffered(id, b, false);
                    }
                    prior => {
                        self.forget_prior(&id, prior.as_deref(), false);
                        for m in &missing {
                            self.note_waited(m);
                        }
                        self.buffer(op, bytes, id, scope, BufKind::Pending, missing, pre, now_ms, false, false);
                    }
                }
                Outcome::NotYet(BufKind::Pending)
            }
            Judgement::KeyWait => {
                let kind = if op.plane == PLANE_GOVERNANCE { BufKind::KeyWait } else { BufKind::DataKeyWait };
                // A pending op woken into a data key wait keeps its pending
                // record and its encoding: it was durable, and a crash
                // within the wait must not lose it (a restart re-judges it).
                // Its wait is still in memory; at its deadline both go. So
                // does one woken again while it waits (two of its missing
                // dependencies applied in one cascade wake it twice). One
                // buffered within this commit has them written with it.
                let kept = kind == BufKind::DataKeyWait && prior.as_deref().is_some_and(|b| b.in_ops);
                if !kept {
                    self.forget_prior(&id, prior.as_deref(), false);
                }
                let written = kept && prior.as_deref().is_some_and(|b| b.written);
                self.buffer(op, bytes, id, scope, kind, Ids::new(), None, now_ms, kept, written);
                Outcome::NotYet(kind)
            }
        }
    }

    /// Deletes the durable records of a buffered op leaving its buffer, and
    /// a pending op's encoding in the ops table unless it is `applied`. A
    /// data key wait has none, unless it kept those of its pending wait;
    /// an op buffered within this commit has none yet (`Buffered::written`).
    fn forget_prior(&mut self, id: &Hash, prior: Option<&Buffered>, applied: bool) {
        let Some(b) = prior.filter(|b| b.written) else { return };
        let cf = match b.kind {
            BufKind::Pending => Cf::Pending,
            BufKind::KeyWait => Cf::KeyWaits,
            BufKind::DataKeyWait if b.in_ops => Cf::Pending,
            BufKind::DataKeyWait => return,
        };
        self.out.writes.push(Write::Delete(cf, id.to_vec()));
        if b.in_ops && !applied {
            self.out.writes.push(Write::Delete(Cf::Ops, id.to_vec()));
            if self.cold.is_some() {
                self.ops_deleted.insert(*id, self.commit_number);
            }
        }
    }

    /// The records of the ops buffered within this commit and buffered
    /// still, after every other write of the commit (a delete of an earlier
    /// copy's records, evicted in it, comes before): a pending op's
    /// encoding goes where it stays once applied, its pending record only
    /// says that it is not applied yet; a governance key wait's record holds
    /// its encoding.
    fn write_buffered_in_commit(&mut self) {
        for id in std::mem::take(&mut self.buffered_in_commit) {
            let Some(b) = self.buffers.take_unwritten(&id) else { continue };
            match b.kind {
                BufKind::KeyWait => self.out.writes.push(Write::Put(Cf::KeyWaits, id.to_vec(), seq_and_bytes(b.seq, &b.bytes))),
                _ if b.in_ops => {
                    self.out.writes.push(Write::Put(Cf::Ops, id.to_vec(), b.bytes.clone()));
                    self.out.writes.push(Write::Put(Cf::Pending, id.to_vec(), b.seq.to_le_bytes().to_vec()));
                }
                _ => {}
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn buffer(
        &mut self,
        op: Op,
        bytes: Vec<u8>,
        id: Hash,
        scope: u32,
        kind: BufKind,
        missing: Ids,
        pre: Option<Prepared>,
        now_ms: u64,
        kept: bool,
        written: bool,
    ) {
        let seq = self.next_seq();
        let in_ops = kind == BufKind::Pending || kept;
        if !written && (in_ops || kind == BufKind::KeyWait) {
            self.buffered_in_commit.push(id);
        }
        let deadline_ms = now_ms.saturating_add(self.cfg.data_key_wait_ms);
        match kind {
            BufKind::Pending => self.stats.buffered_pending += 1,
            BufKind::KeyWait => self.stats.buffered_key_wait += 1,
            BufKind::DataKeyWait => self.stats.buffered_data_key_wait += 1,
        }
        let b = Box::new(Buffered { op, bytes, scope, kind, in_ops, written, seq, missing, deadline_ms, since_ms: now_ms, pre });
        self.buffers.register(id, &b);
        self.put_buffered(id, b, true);
        self.enforce_bounds(scope);
    }

    /// Notes that `scope`'s status changed (`take_statuses`): listed once
    /// until its status is taken.
    fn touch(&mut self, scope: u32) {
        let s = &mut self.scopes[scope as usize];
        if !s.status_stale {
            s.status_stale = true;
            self.stale_statuses += 1;
            self.touched.push(scope);
        }
    }

    fn next_seq(&mut self) -> u64 {
        let s = self.seq;
        self.seq += 1;
        s
    }

    /// Puts an op in its buffer (`Buffers::put`) and marks it buffered.
    pub(super) fn put_buffered(&mut self, id: Hash, b: Box<Buffered>, fresh: bool) {
        self.touch(b.scope);
        self.ops.insert(id, Entry::Buffered);
        self.buffers.put(id, b, fresh);
    }

    /// Takes an op out of its buffer (not out of `ops`, the waiter lists or
    /// the store).
    fn take_buffered(&mut self, id: &Hash) -> Option<Box<Buffered>> {
        let b = self.buffers.take(id)?;
        self.touch(b.scope);
        Some(b)
    }

    /// SPEC §7: what overflows is evicted oldest first and counted.
    fn enforce_bounds(&mut self, scope: u32) {
        while let Some(id) = self.buffers.over_bound_oldest(scope) {
            self.evict(&id);
        }
    }

    fn evict(&mut self, id: &Hash) {
        let b = self.take_buffered(id).expect("evicting a buffered op");
        self.forget(id);
        self.buffers.unregister(id, &b);
        self.forget_prior(id, Some(&b), false);
        self.stats.evicted += 1;
    }

    /// Records that an op waits on `m`, for [`Engine::wanted`].
    pub(super) fn note_waited(&mut self, m: &Hash) {
        if !self.ops.contains_key(m) {
            self.maybe_wanted.insert(*m);
        }
    }

    /// Forgets an op (evicted, expired, or a drop no longer remembered): a
    /// later copy is judged afresh. Ops still waiting on it now want it.
    fn forget(&mut self, id: &Hash) {
        self.ops.remove(id);
        if self.buffers.is_waited_on(id) {
            self.maybe_wanted.insert(*id);
        }
    }

    fn drop_op(&mut self, id: Hash, scope: u32, reason: Reason) {
        self.touch(scope);
        self.stats.dropped[reason.code() as usize] += 1;
        self.ops.insert(id, Entry::Dropped { reason, scope });
        let seq = self.next_seq();
        let mut v = vec![reason.code()];
        v.extend_from_slice(&self.scopes[scope as usize].id);
        v.extend_from_slice(&seq.to_le_bytes());
        self.out.writes.push(Write::Put(Cf::Dropped, id.to_vec(), v));
        self.dropped_order.push_back((seq, id));
        while self.dropped_order.len() as u64 > self.cfg.dropped_remembered_max {
            let (_, old) = self.dropped_order.pop_front().expect("non-empty");
            if matches!(self.ops.get(&old), Some(Entry::Dropped { .. })) {
                self.forget(&old);
                self.out.writes.push(Write::Delete(Cf::Dropped, old.to_vec()));
            }
        }
        if let Some(ws) = self.buffers.take_waiters(&id) {
            self.work.extend(ws);
        }
    }

    /// Applies an op; `stored`: its encoding is in the ops table already (a
    /// pending op's, written when it was buffered); `cut`: the interned cut
    /// of its cut ids, if known.
    #[allow(clippy::too_many_arguments)]
    fn apply(&mut self, op: Op, bytes: Vec<u8>, id: Hash, scope: u32, payload: Decrypted, stored: bool, cut: Option<u32>) {
        self.stats.applied += 1;
        self.touch(scope);
        debug_assert!(cut.is_none_or(|c| *self.cuts[c as usize] == *op.cut_ids()), "the interned cut of its cut ids");
        let cut = cut.unwrap_or_else(|| self.intern_cut(op.cut_ids()));
        self.ops.insert(id, Entry::Applied(AppliedMeta { scope, plane: op.plane, hlc: op.hlc, cut }));
        if self.cold.is_some() {
            self.hot_order.push_back((self.commit_number, id));
        }
        self.out.applied.push((id, self.scopes[scope as usize].id));
        match payload {
            Decrypted::Gov(plain, p) => {
                let depth = self.gov.depth_for_parents(&op.parents);
                let mut rec = depth.to_le_bytes().to_vec();
                rec.extend_from_slice(&plain);
                self.out.writes.push(Write::Put(Cf::Governance, id.to_vec(), rec));
                let node = GovNode { parents: op.parents.clone(), depth, author: op.author, actions: p.actions };
                self.out.gov_applied.push((id, node.clone()));
                self.gov.insert(id, node);
                let s = &mut self.scopes[scope as usize];
                if op.kind() == OpKind::Genesis {
                    s.genesis_applied = true;
                }
                for p in &op.parents {
                    s.gov_heads.remove(p);
                }
                s.gov_heads.insert(id);
                s.members_at_heads = None;
                s.applied += 1;
                s.dirty = true;
            }
            Decrypted::Data(p) => {
                let s = &mut self.scopes[scope as usize];
                for parent in &op.parents {
                    s.data_heads.remove(parent);
                }
                s.data_heads.insert(id);
                s.applied += 1;
                s.dirty = true;
                // SPEC §8 convergence check, made by the fold.
                let check = (s.data_heads.len() == 1).then_some(Check { op: id, root: p.root_hash });
                self.stats.root_checks += u64::from(check.is_some());
                let fold = Fold { scope: s.id, hlc: op.hlc, author: op.author, actions: p.actions, check };
                match &mut self.projector {
                    Some(projector) => {
                        projector.fold(fold);
                        self.stats.divergences += projector.settle();
                    }
                    None => self.out.folds.push(fold),
                }
                for ev in p.events {
                    s.event_seq += 1;
                    let seq = s.event_seq;
                    self.stats.events += 1;
                    self.out.events.push(EventOut { scope: s.id, seq, op: id, kind: ev.kind, data: ev.data });
                }
            }
        }
        if !self.ops_deleted.is_empty() {
            self.ops_deleted.remove(&id);
        }
        if stored {
            self.out.released.push((id, bytes));
        } else {
            // A data op's parents are applied, so in the table: stored by
            // reference (`core::oprecord`), its bytes as signed handed on
            // with the released ones.
            match oprecord::compact(&op, &bytes) {
                Some(record) => {
                    self.out.writes.push(Write::Put(Cf::Ops, id.to_vec(), record));
                    self.out.released.push((id, bytes));
                }
                None => self.out.writes.push(Write::Put(Cf::Ops, id.to_vec(), bytes)),
            }
        }
        if let Some(ws) = self.buffers.take_waiters(&id) {
            self.work.extend(ws);
        }
    }

    /// Lets a call judge at most `steps` woken ops (default: no bound). What
    /// is left stays in the work list, still buffered, until
    /// `continue_cascade` or the next input: a driver can then commit a long
    /// cascade in parts and overlap its writes with the rest of it. The
    /// outcome is the same, since every verdict depends only on the op and
    /// on what is applied, and a crash in between leaves buffered ops whose
    /// wait is over, which `restore` re-judges.
    pub fn set_cascade_budget(&mut self, steps: u64) {
        self.cascade_budget = steps.max(1);
    }

    /// Whether a cascade stopped at its budget and has more to judge.
    pub fn cascade_remaining(&self) -> bool {
        !self.work.is_empty()
    }

    /// Judges the next part of a cascade left at its budget.
    pub fn continue_cascade(&mut self, now_ms: u64) {
        self.run_cascade(now_ms);
    }

    /// The cascade (SPEC §6 step 5): an explicit work list, each woken op
    /// judged once per wake; no recursion, no rescans.
    pub(super) fn run_cascade(&mut self, now_ms: u64) {
        let mut steps: u64 = 0;
        while steps < self.cascade_budget {
            if self.cold_failed().is_some() {
                // Nothing judged from here is committed: stop.
                self.work.clear();
                break;
            }
            let Some(id) = self.work.pop_front() else { break };
            steps += 1;
            assert!(steps <= limits::CASCADE_STEPS_MAX, "cascade exceeded its bound");
            // The op index's slot of this id, read now: its apply writes
            // it, and the read's cache miss overlaps the buffers' below
            // instead of following it.
            std::hint::black_box(self.ops.contains_key(&id));
            let Some(b) = self.take_buffered(&id) else {
                continue; // Evicted, expired, or already settled this cascade.
            };
            self.stats.cascade_released += 1;
            self.buffers.cancel_deadline(&b);
            // Move the op out (no copy); a re-buffered op gets it back.
            let mut b = b;
            let op = std::mem::replace(&mut b.op, empty_op());
            let bytes = std::mem::take(&mut b.bytes);
            let pre = b.pre.take();
            self.evaluate(op, bytes, id, Some(b), pre, now_ms);
        }
    }

    // ----- outputs ------------------------------------------------------

    /// Ops applied since the last `take_commit`.
    pub fn applied_in_commit(&self) -> usize {
        self.out.applied.len()
    }

    /// Folds left for the projector since the last `take_commit` (none
    /// while the engine folds itself).
    pub fn folds_in_commit(&self) -> usize {
        self.out.folds.len()
    }

    /// Everything changed since the last call, as one atomic batch; an
    /// error, now and at every later call, once a read of the cold index
    /// failed (`cold_failed`): what was judged since may be wrong, and the
    /// driver stops writing, as after a failed write.
    pub fn take_commit(&mut self) -> Result<Commit, ColdReadFailed> {
        if let Some(e) = self.cold_failed() {
            return Err(e.clone());
        }
        self.write_buffered_in_commit();
        self.out.put_event_log();
        for s in self.scopes.iter_mut().filter(|s| s.dirty) {
            s.dirty = false;
            let rec = ScopeRecord {
                genesis_applied: s.genesis_applied,
                gov_heads: s.gov_heads.iter().copied().collect(),
                data_heads: s.data_heads.iter().copied().collect(),
                applied: s.applied,
                divergences: 0,
                event_seq: s.event_seq,
            };
            self.out.records.push((s.id, rec));
        }
        self.out.number = self.commit_number;
        self.commit_number += 1;
        let mut commit = std::mem::take(&mut self.out);
        commit.size_like(&mut self.out);
        if let Some(projector) = &mut self.projector {
            projector.finish_commit(&mut commit);
        }
        Ok(commit)
    }

    /// Hands the fold to the driver, to run after the engine (the node's
    /// projector thread): from now on applied data ops leave in
    /// `Commit::folds`, each commit is finished by `Projector::
    /// finish_commit`, and the roots in `status` are ZERO, for the
    /// projector to fill. Call between commits.
    pub fn take_projector(&mut self) -> Projector {
        assert!(self.out.folds.is_empty() && self.out.records.is_empty() && self.out.writes.is_empty(), "between commits");
        self.projector.take().expect("the engine holds the projector")
    }

}

/// A placeholder left in a buffer record whose op was moved out.
pub(super) fn empty_op() -> Op {
    Op {
        version: 0,
        scope: ZERO,
        plane: 0,
        author: [0; 32],
        parents: Vec::new(),
        cut: Vec::new(),
        hlc: 0,
        key_id: ZERO,
        nonce: [0; 12],
        payload: Vec::new(),
        signature: [0; 64],
    }
}

/// SPEC §4: a genesis payload holds exactly one action, `Genesis`, whose
/// `first_key_id` is not ZERO.
fn genesis_payload_ok(p: &GovPayload) -> bool {
    matches!(p.actions.as_slice(), [GovAction::Genesis { first_key_id, .. }] if *first_key_id != ZERO)
}

/// SPEC §4: at least one action, no `Genesis`, no `RotateKey(ZERO)`.
fn governance_payload_ok(p: &GovPayload) -> bool {
    !p.actions.is_empty()
        && p.actions.iter().all(|a| match a {
            GovAction::Genesis { .. } => false,
            GovAction::RotateKey { key_id } => *key_id != ZERO,
            _ => true,
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::types::OpState;
    use crate::store::memory::MemStore;
    use crate::store::Store;
    use crate::workload::{generate, Generated, Workload, WorkloadConfig};
    use std::sync::Mutex;

    /// The cold index over a store the test writes to.
    pub(crate) struct SharedCold(pub(crate) Arc<Mutex<MemStore>>);

    impl ColdOps for SharedCold {
        fn get(&self, id: &Hash) -> Result<Option<Vec<u8>>, ColdReadFailed> {
            self.0.lock().unwrap().get(Cf::Ops, id).map_err(|e| ColdReadFailed(e.to_string()))
        }

        fn scan(&self, f: &mut dyn FnMut(&Hash, &[u8])) -> Result<(), ColdReadFailed> {
            let store = self.0.lock().unwrap();
            for (k, v) in store.table(Cf::Ops).into_iter().flatten() {
                f(&k.as_slice().try_into().unwrap(), v)
            }
            Ok(())
        }
    }

    /// A chain of `ops` data ops, and an engine that applied everything
    /// before them, its commits written to a store.
    pub(crate) fn chain(ops: usize, cfg: Config) -> (Identity, Vec<Generated>, Arc<Mutex<MemStore>>, Engine) {
        let id = Identity::from_secrets([31; 32], [32; 32]);
        let w: Workload = generate(&WorkloadConfig { data_ops: ops, chain: true, ..Default::default() }, id.public_key, id.kem_public);
        let (prefix, data): (Vec<_>, Vec<_>) = w.messages.into_iter().partition(|m| !m.is_data);
        let store = Arc::new(Mutex::new(MemStore::new()));
        let mut e = Engine::new(cfg, id.clone());
        for m in &prefix {
            e.handle_frame(&m.frame, 0);
        }
        write(&mut e, &store);
        (id, data, store, e)
    }

    pub(crate) fn write(e: &mut Engine, store: &Mutex<MemStore>) -> Commit {
        let c = e.take_commit().unwrap();
        store.lock().unwrap().write(&c.writes, true).unwrap();
        e.note_durable(c.number);
        c
    }

    pub(crate) fn puts(c: &Commit, cf: Cf) -> Vec<(Vec<u8>, usize)> {
        c.writes
            .iter()
            .filter_map(|w| match w {
                Write::Put(x, k, v) if *x == cf => Some((k.clone(), v.len())),
                _ => None,
            })
            .collect()
    }

    /// The buffers' memory follows what they hold: a chain parked in
    /// reverse counts each op's box, encoding and decoded form; released by
    /// its first op, that part goes and the index holds the applied ops.
    #[test]
    fn the_buffers_memory_follows_the_ops_parked() {
        let (_, data, _, mut e) = chain(200, Config::default());
        let empty = e.memory();
        for m in data[1..].iter().rev() {
            assert_eq!(e.handle_frame(&m.frame, 0), Outcome::NotYet(BufKind::Pending));
        }
        let parked = e.memory();
        let bytes: u64 = data[1..].iter().map(|m| m.frame.len() as u64).sum();
        let per_op = 199 * std::mem::size_of::<Buffered>() as u64;
        assert!(parked.buffers >= empty.buffers + per_op + 2 * bytes, "{parked:?} for {bytes} bytes parked");
        assert_eq!(e.handle_frame(&data[0].frame, 0), Outcome::Applied);
        let released = e.memory();
        assert!(released.buffers + per_op + 2 * bytes <= parked.buffers, "{released:?} after {parked:?}");
        assert!(released.op_index >= super::super::map_bytes::<Hash, Entry>(200), "{released:?}");
        assert!(released.scopes > 0 && released.governance > 0, "{released:?}");
    }

    /// A pending op's encoding is written once: into the ops table when it
    /// is buffered, its pending record then only its seq. Applying it later
    /// writes the deletion of that record and nothing more of it (its
    /// encoding goes on in `Commit::released`, for gossip), and a fresh
    /// engine reopened on the store between the two finds it pending.
    #[test]
    fn a_pending_op_is_written_once() {
        let (id, data, store, mut e) = chain(3, Config::default());
        assert_eq!(e.handle_frame(&data[2].frame, 0), Outcome::NotYet(BufKind::Pending));
        assert_eq!(e.handle_frame(&data[1].frame, 0), Outcome::NotYet(BufKind::Pending));
        let parked = write(&mut e, &store);
        let mut ops = puts(&parked, Cf::Ops);
        ops.sort();
        let mut want: Vec<(Vec<u8>, usize)> = [&data[1], &data[2]].iter().map(|m| (m.id.to_vec(), m.frame.len() - 1)).collect();
        want.sort();
        assert_eq!(ops, want, "the parked ops' encodings, in the ops table");
        assert!(puts(&parked, Cf::Pending).iter().all(|(_, len)| *len == 8), "pending records hold a seq");
        let reopened = Engine::restore(Config::default(), id.clone(), &*store.lock().unwrap(), None, 0).expect("the tables read back");
        assert_eq!(reopened.op_state(&data[1].id), OpState::Buffered(BufKind::Pending));
        assert_eq!(reopened.op_state(&data[2].id), OpState::Buffered(BufKind::Pending));
        assert_eq!(e.handle_frame(&data[0].frame, 0), Outcome::Applied);
        let released = write(&mut e, &store);
        assert_eq!(puts(&released, Cf::Ops), vec![(data[0].id.to_vec(), data[0].frame.len() - 1)], "only the new op's encoding");
        assert_eq!(released.writes.iter().filter(|w| matches!(w, Write::Delete(Cf::Pending, _))).count(), 2);
        let gossip: Vec<Hash> = released.released.iter().map(|(i, _)| *i).collect();
        assert_eq!(gossip, vec![data[1].id, data[2].id]);
        assert!(released.released.iter().all(|(i, b)| data.iter().any(|m| m.id == *i && m.frame[1..] == b[..])));
        let reopened = Engine::restore(Config::default(), id, &*store.lock().unwrap(), None, 0).expect("the tables read back");
        assert_eq!(reopened.applied_total(), e.applied_total());
        assert_eq!(reopened.buffered_total().0, 0);
    }

    /// An op buffered and released within one commit writes what it would
    /// have written arriving in order (its record in the ops table, nothing
    /// in the pending table); one buffered, evicted and buffered again
    /// within a commit has its records written once, by that commit.
    #[test]
    fn buffer_records_are_written_once_by_the_commit_that_ends_buffered() {
        let table = |c: &Commit| {
            let mut w: Vec<String> = c.writes.iter().filter_map(|w| match w {
                Write::Put(cf @ (Cf::Ops | Cf::Pending), k, v) => Some(format!("put {cf:?} {k:?} {v:?}")),
                Write::Delete(cf @ (Cf::Ops | Cf::Pending), k) => Some(format!("delete {cf:?} {k:?}")),
                _ => None,
            }).collect();
            w.sort();
            w
        };
        let (_, data, store, mut e) = chain(4, Config::default());
        let (_, _, in_order_store, mut in_order) = chain(4, Config::default());
        for m in &data[..3] {
            assert_eq!(in_order.handle_frame(&m.frame, 0), Outcome::Applied);
        }
        assert_eq!(e.handle_frame(&data[2].frame, 0), Outcome::NotYet(BufKind::Pending));
        assert_eq!(e.handle_frame(&data[1].frame, 0), Outcome::NotYet(BufKind::Pending));
        assert_eq!(e.handle_frame(&data[0].frame, 0), Outcome::Applied);
        let shuffled = write(&mut e, &store);
        assert_eq!(table(&shuffled), table(&write(&mut in_order, &in_order_store)));

        let (_, data, store, mut e) = chain(4, Config { buffered_ops_per_scope_max: 1, ..Config::default() });
        assert_eq!(e.handle_frame(&data[2].frame, 0), Outcome::NotYet(BufKind::Pending));
        assert_eq!(e.handle_frame(&data[3].frame, 0), Outcome::NotYet(BufKind::Pending));
        assert_eq!(e.handle_frame(&data[2].frame, 0), Outcome::NotYet(BufKind::Pending));
        assert_eq!(e.stats.evicted, 2);
        let c = write(&mut e, &store);
        let seq = e.buffers.get(&data[2].id).unwrap().seq;
        assert_eq!(
            table(&c),
            vec![
                format!("put Ops {:?} {:?}", data[2].id.to_vec(), data[2].frame[1..].to_vec()),
                format!("put Pending {:?} {:?}", data[2].id.to_vec(), seq.to_le_bytes().to_vec()),
            ]
        );
        assert_eq!(e.handle_frame(&data[1].frame, 0), Outcome::NotYet(BufKind::Pending), "d2 evicted, d1 waits on d0");
        let c = write(&mut e, &store);
        assert_eq!(c.writes.iter().filter(|w| matches!(w, Write::Delete(Cf::Ops | Cf::Pending, k) if *k == data[2].id.to_vec())).count(), 2);
    }

    /// Each scope touched since the statuses were last taken has its status
    /// taken once, as it is at the time it is taken; one taken alone (an
    /// API write's) is not taken again by the next round unless touched
    /// again; a scope whose genesis is not applied has none.
    #[test]
    fn statuses_are_taken_once_per_touched_scope() {
        let (id, a, _, mut e) = chain(3, Config::default());
        let b: Workload = generate(&WorkloadConfig { seed: 7, data_ops: 2, chain: true, ..Default::default() }, id.public_key, id.kem_public);
        let sa = *e.scope_ids().first().unwrap();
        assert!(e.statuses_stale(), "the prefix touched scope a");
        assert_eq!(e.take_statuses().iter().map(|s| s.scope).collect::<Vec<_>>(), vec![sa]);
        assert!(!e.statuses_stale() && e.take_statuses().is_empty());

        // b's genesis parked on a missing dependency touches nothing
        // applied: b is touched, but has no status.
        let genesis = &b.messages[0];
        let rest: Vec<&Generated> = b.messages[1..].iter().collect();
        for m in &rest {
            e.handle_frame(&m.frame, 0);
        }
        assert!(e.scope(&b.scope).is_some_and(|s| s.pending > 0), "b's ops wait for its genesis");
        e.handle_frame(&a[0].frame, 0);
        let taken = e.take_statuses();
        assert_eq!(taken.iter().map(|s| s.scope).collect::<Vec<_>>(), vec![sa], "b's genesis not applied");
        assert_eq!(taken[0].applied, e.status(&sa).unwrap().applied);

        // Touched three times, taken once, with its state at the taking.
        e.handle_frame(&genesis.frame, 0);
        e.handle_frame(&a[1].frame, 0);
        e.handle_frame(&a[2].frame, 0);
        assert!(e.statuses_stale());
        let alone = e.take_status(&sa).expect("a was touched");
        assert_eq!(alone.applied, e.status(&sa).unwrap().applied);
        assert!(e.take_status(&sa).is_none(), "taken already");
        let taken = e.take_statuses();
        assert_eq!(taken.iter().map(|s| s.scope).collect::<Vec<_>>(), vec![b.scope], "a was taken alone");
        assert_eq!(taken[0].applied, e.status(&b.scope).unwrap().applied);
        assert_eq!(taken[0].applied, 2 + b.messages.iter().filter(|m| !m.is_data && m.id != ZERO).count() as u64, "b whole");
        assert!(!e.statuses_stale() && e.take_statuses().is_empty());
    }

    /// A pending op evicted has its ops record deleted; until that deletion
    /// is durable the store still holds it, and the cold index must not take
    /// it for an applied op even when its filter says "maybe" (a false
    /// positive, made here by inserting the id).
    #[test]
    fn an_evicted_pending_op_is_never_read_back_as_applied() {
        let (_, data, store, mut e) = chain(4, Config { buffered_ops_per_scope_max: 1, ..Config::default() });
        e.set_cold(Box::new(SharedCold(store.clone())));
        assert_eq!(e.handle_frame(&data[1].frame, 0), Outcome::NotYet(BufKind::Pending));
        write(&mut e, &store);
        // Buffering d3 evicts d1, the oldest: its records are deleted by the
        // commit being built, not yet written.
        assert_eq!(e.handle_frame(&data[3].frame, 0), Outcome::NotYet(BufKind::Pending));
        assert_eq!(e.stats.evicted, 1);
        assert_eq!(e.op_state(&data[1].id), OpState::Unknown);
        assert!(store.lock().unwrap().get(Cf::Ops, &data[1].id).unwrap().is_some(), "still in the store");
        e.cold_filter.insert(&data[1].id);
        assert_eq!(e.handle_frame(&data[2].frame, 0), Outcome::NotYet(BufKind::Pending), "d1 is not applied");
        write(&mut e, &store);
        assert!(store.lock().unwrap().get(Cf::Ops, &data[1].id).unwrap().is_none());
        assert!(e.ops_deleted.is_empty(), "forgotten once durable");
    }
}
