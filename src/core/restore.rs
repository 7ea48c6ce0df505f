//! `Engine::restore`: the engine rebuilt from the tables earlier commits
//! wrote (`TableScan`), at open.
//!
//! It sets the engine's indexes directly (so the engine's fields it fills
//! are `pub(super)`): keys, scope records, applied ops (left in the store
//! when there is a cold index), governance, cells, remembered drops and
//! buffered ops, whose by-parent index is derived here.

use std::collections::HashMap;

use borsh::BorshDeserialize;

use super::buffers::Buffered;
use super::cold::ColdOps;
use super::engine::{AppliedMeta, Engine, Entry};
use super::governance::GovNode;
use super::tables::{decode_cell_record, item_index_writes, Cf, ScopeRecord, META_FOLLOW_PREFIX, META_SCOPE_PREFIX};
use super::types::{BufKind, Config, Identity, Reason};
use crate::protocol::codec::{decode_gov_payload, decode_op, op_body};
use crate::protocol::crypto::delta_id_of_body;
use crate::protocol::{Hash, PLANE_GOVERNANCE};

/// Read access to the tables, for `Engine::restore`. A failed read (a
/// damaged table) ends the scan with an error, which ends the restore:
/// the open fails with it, never a panic and never a partial engine.
pub trait TableScan {
    fn scan(&self, cf: Cf, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), ScanFailed>;

    /// Whether `cf` holds no record (a store overrides this scan of all).
    fn is_empty(&self, cf: Cf) -> Result<bool, ScanFailed> {
        let mut empty = true;
        self.scan(cf, &mut |_, _| empty = false)?;
        Ok(empty)
    }
}

/// A read of the tables at open failed (the store's own message: for a
/// damaged table, what to do).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScanFailed(pub String);

impl Engine {
    /// Rebuilds the in-memory indexes from the tables written by earlier
    /// commits: nothing is re-folded (cells are read back, the tree is
    /// rebuilt from them). Buffered ops whose wait is already over (which a
    /// consistent store never has) are re-judged; call `take_commit` after.
    ///
    /// With a cold index (`cold`, reading the same store), the applied ops
    /// are not read back: the engine's cold filter stays partial (every id
    /// it does not hold is looked up in the store) until the driver hands
    /// it the filter of the ops table (`cold::filter_of_stored_ops`, then
    /// `complete_cold_filter`): the node does that on a thread while it
    /// serves, `InlineDriver` at once. The scope records' applied counts
    /// are checked against the ops table only without a cold index (the
    /// store's block checksums stand for the table's bytes).
    pub fn restore(
        cfg: Config,
        identity: Identity,
        t: &dyn TableScan,
        cold: Option<Box<dyn ColdOps>>,
        now_ms: u64,
    ) -> Result<Engine, ScanFailed> {
        let mut e = Engine::new(cfg, identity);
        if let Some(cold) = cold {
            e.set_cold(cold);
        }
        t.scan(Cf::Keys, &mut |k, v| {
            let key_id: Hash = k.try_into().expect("key id is 32 bytes");
            let key: [u8; 32] = v.try_into().expect("a group key is 32 bytes");
            assert_eq!(crate::protocol::crypto::key_id_of(&key), key_id, "stored key matches its id");
            e.keys.insert(key_id, key);
        })?;
        t.scan(Cf::Meta, &mut |k, v| {
            if let Some(scope) = k.strip_prefix(META_FOLLOW_PREFIX) {
                e.followed.insert(scope.try_into().expect("followed scope id is 32 bytes"));
            }
            if let Some(scope) = k.strip_prefix(META_SCOPE_PREFIX) {
                let scope: Hash = scope.try_into().expect("scope id is 32 bytes");
                let rec = ScopeRecord::try_from_slice(v).expect("scope record decodes");
                let i = e.scope_idx(&scope);
                let s = &mut e.scopes[i as usize];
                s.genesis_applied = rec.genesis_applied;
                s.gov_heads = rec.gov_heads.into_iter().collect();
                s.members_at_heads = None;
                s.data_heads = rec.data_heads.into_iter().collect();
                s.applied = rec.applied;
                s.event_seq = rec.event_seq;
                e.projector.as_mut().expect("a new engine folds").restore_divergences(scope, rec.divergences);
            }
        })?;
        // In id order: what a restore does never depends on a hash seed.
        let mut gov_records: std::collections::BTreeMap<Hash, Vec<u8>> = Default::default();
        t.scan(Cf::Governance, &mut |k, v| {
            gov_records.insert(k.try_into().expect("op id is 32 bytes"), v.to_vec());
        })?;
        // Pending records first: the ops table holds their ops, which are
        // not applied. A record is the op's seq; one written before session
        // 13 is seq ‖ op, its op not in the ops table.
        let mut pending: HashMap<Hash, (u64, Option<Vec<u8>>, bool)> = HashMap::new();
        t.scan(Cf::Pending, &mut |k, v| {
            let seq = u64::from_le_bytes(v[..8].try_into().expect("a pending record starts with its seq"));
            let old_layout = v.len() > 8;
            pending.insert(k.try_into().expect("op id is 32 bytes"), (seq, old_layout.then(|| v[8..].to_vec()), !old_layout));
        })?;
        if let Some(cold) = e.cold.take() {
            // With a cold index, applied ops stay in the store: the ones the
            // engine needs now (governance, pending) are read by id, and
            // the filter of the rest is the driver's to complete, a read of
            // every op (`Engine::complete_cold_filter`): seconds at 10^7
            // ops, which the node spends serving.
            let read = |id: &Hash| -> Result<Vec<u8>, ScanFailed> {
                cold.get(id).map_err(|f| ScanFailed(f.to_string()))?.ok_or_else(|| ScanFailed(format!("op {} has a record but is not in the ops table", hex::encode(id))))
            };
            for (id, rec) in std::mem::take(&mut gov_records) {
                let bytes = read(&id)?;
                e.restore_gov(id, &bytes, &rec);
            }
            for (id, p) in pending.iter_mut().filter(|(_, p)| p.2) {
                p.1 = Some(read(id)?);
            }
            e.cold = Some(cold);
            e.cold_filter_partial = true;
        } else {
            let mut per_scope_applied: HashMap<u32, u64> = HashMap::new();
            t.scan(Cf::Ops, &mut |k, v| {
                let id: Hash = k.try_into().expect("op id is 32 bytes");
                if let Some(p) = pending.get_mut(&id) {
                    assert!(p.2, "an op in the ops table has a pending record of the current layout");
                    p.1 = Some(v.to_vec());
                    return;
                }
                // A compact record's id is checked when it is read back
                // whole (`oprecord::expand`), which needs the table.
                let op = super::oprecord::decode_without_parents(v).expect("a stored op decodes");
                if !super::oprecord::is_compact(v) {
                    assert_eq!(delta_id_of_body(op_body(v)), id, "a stored op sits under its id");
                }
                let scope = e.scope_idx(&op.scope_of(&id));
                let cut = e.intern_cut(op.cut_ids());
                e.ops.insert(id, Entry::Applied(AppliedMeta { scope, plane: op.plane, hlc: op.hlc, cut }));
                *per_scope_applied.entry(scope).or_default() += 1;
                if op.plane == PLANE_GOVERNANCE {
                    let rec = gov_records.remove(&id).expect("an applied governance op has its record");
                    e.restore_gov(id, v, &rec);
                }
            })?;
            for (scope, n) in per_scope_applied {
                assert_eq!(e.scopes[scope as usize].applied, n, "scope record counts its applied ops");
            }
        }
        assert!(gov_records.is_empty(), "every governance record has its op");
        let mut cells = 0u64;
        t.scan(Cf::Projection, &mut |k, v| {
            let scope: Hash = k[..32].try_into().expect("scope ‖ path");
            let path: Hash = k[32..].try_into().expect("scope ‖ path");
            let (entity, key, cell) = decode_cell_record(v);
            e.scope_idx(&scope);
            e.projector.as_mut().expect("a new engine folds").restore_cell(scope, path, entity, key, cell);
            cells += 1;
        })?;
        // A store written before the cell index (`Cf::Items`) has cells and
        // no index records; every cell has its records since, written with
        // it: build them once, in the commit of the restore.
        if cells > 0 && t.is_empty(Cf::Items)? {
            t.scan(Cf::Projection, &mut |k, v| {
                let scope: Hash = k[..32].try_into().expect("scope ‖ path");
                let (entity, key, _) = decode_cell_record(v);
                e.out.writes.extend(item_index_writes(&scope, &entity, &key));
            })?;
        }
        let mut dropped: Vec<(u64, Hash, Reason, Hash)> = Vec::new();
        t.scan(Cf::Dropped, &mut |k, v| {
            let reason = Reason::from_code(v[0]).expect("stored reason is known");
            let scope: Hash = v[1..33].try_into().unwrap();
            let seq = u64::from_le_bytes(v[33..41].try_into().unwrap());
            dropped.push((seq, k.try_into().unwrap(), reason, scope));
        })?;
        dropped.sort();
        for (seq, id, reason, scope) in dropped {
            let scope = e.scope_idx(&scope);
            e.ops.insert(id, Entry::Dropped { reason, scope });
            e.dropped_order.push_back((seq, id));
            e.seq = e.seq.max(seq + 1);
        }
        let mut buffered: Vec<(u64, Hash, Vec<u8>, BufKind, bool)> = Vec::new();
        for (id, (seq, bytes, in_ops)) in pending {
            buffered.push((seq, id, bytes.expect("a pending record has its op"), BufKind::Pending, in_ops));
        }
        t.scan(Cf::KeyWaits, &mut |k, v| {
            let seq = u64::from_le_bytes(v[..8].try_into().unwrap());
            buffered.push((seq, k.try_into().unwrap(), v[8..].to_vec(), BufKind::KeyWait, false));
        })?;
        buffered.sort_by_key(|b| b.0);
        // Every buffered op is held before any one's dependencies are
        // looked at: an id the engine does not hold may be looked up in the
        // store (the cold index, partial until completed), and the store
        // holds the pending ops too, which are not applied.
        for (_, id, ..) in &buffered {
            e.ops.insert(*id, Entry::Buffered);
        }
        for (seq, id, bytes, kind, in_ops) in buffered {
            let op = decode_op(&bytes).expect("a buffered op decodes");
            assert_eq!(delta_id_of_body(op_body(&bytes)), id, "a buffered op sits under its id");
            let scope = e.scope_idx(&op.scope_of(&id));
            e.seq = e.seq.max(seq + 1);
            let mut missing = super::buffers::Ids::new();
            if kind == BufKind::Pending {
                for d in op.dependencies() {
                    if e.applied(d).is_none() {
                        missing.push(*d);
                    }
                }
                for m in &missing {
                    e.note_waited(m);
                }
                if missing.is_empty() {
                    e.work.push_back(id);
                }
            } else if e.keys.contains_key(&op.key_id) {
                e.work.push_back(id);
            }
            let b = Box::new(Buffered { op, bytes, scope, kind, in_ops, written: true, seq, missing, deadline_ms: 0, since_ms: now_ms, pre: None });
            e.buffers.register(id, &b);
            e.put_buffered(id, b, true);
        }
        // The records were read in id order: age order is by seq.
        e.buffers.sort_age_orders();
        // Ops whose dependency is a remembered drop go on to be dropped.
        let mut doomed: Vec<Hash> = e.buffers.waited_on().filter(|d| matches!(e.ops.get(*d), Some(Entry::Dropped { .. }))).copied().collect();
        // In id order, not the map's (seeded per process).
        doomed.sort_unstable();
        for d in doomed {
            if let Some(ws) = e.buffers.take_waiters(&d) {
                e.work.extend(ws);
            }
        }
        e.run_cascade(now_ms);
        Ok(e)
    }

    /// An applied governance op back into the governance index, from its
    /// op's bytes and its record (depth ‖ payload).
    fn restore_gov(&mut self, id: Hash, bytes: &[u8], rec: &[u8]) {
        let op = decode_op(bytes).expect("a stored op decodes");
        assert_eq!(delta_id_of_body(op_body(bytes)), id, "a stored op sits under its id");
        assert_eq!(op.plane, PLANE_GOVERNANCE, "a governance record's op is a governance op");
        self.scope_idx(&op.scope_of(&id));
        let depth = u32::from_le_bytes(rec[..4].try_into().unwrap());
        let p = decode_gov_payload(&rec[4..]).expect("stored governance payload decodes");
        self.gov.insert(id, GovNode { parents: op.parents, depth, author: op.author, actions: p.actions });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::engine::tests::{chain, puts, write, SharedCold};
    use crate::core::tables::{seq_and_bytes, Write};
    use crate::core::types::{OpState, Outcome};
    use crate::store::Store;

    /// A pending record of the layout before 97e5c45 (seq ‖ op, the op
    /// not in the ops table) is still read: its op is pending, and applying
    /// it writes its encoding to the ops table then.
    #[test]
    fn a_pending_record_of_the_older_layout_is_read() {
        let (id, data, store, _) = chain(2, Config::default());
        let old = Write::Put(Cf::Pending, data[1].id.to_vec(), seq_and_bytes(1_000, &data[1].frame[1..]));
        store.lock().unwrap().write(&[old], true).unwrap();
        let mut r = Engine::restore(Config::default(), id, &*store.lock().unwrap(), None, 0).expect("the tables read back");
        assert!(r.take_commit().unwrap().writes.is_empty());
        assert_eq!(r.op_state(&data[1].id), OpState::Buffered(BufKind::Pending));
        assert_eq!(r.handle_frame(&data[0].frame, 0), Outcome::Applied);
        let c = r.take_commit().unwrap();
        let mut ops: Vec<Vec<u8>> = puts(&c, Cf::Ops).into_iter().map(|(k, _)| k).collect();
        ops.sort();
        let mut want = vec![data[0].id.to_vec(), data[1].id.to_vec()];
        want.sort();
        assert_eq!(ops, want);
        // Stored by reference to its parent (`core::oprecord`): its bytes
        // as signed go on for gossip.
        assert_eq!(c.released, vec![(data[1].id, data[1].frame[1..].to_vec())]);
        assert_eq!(r.op_state(&data[1].id), OpState::Applied);
    }

    /// Restored with a cold index, the engine reads no applied op back at
    /// open: its filter is partial, and until it is completed every id it
    /// does not hold is looked up in the store, so an applied op is still a
    /// duplicate and still a parent; completed, the filter answers (a
    /// second duplicate costs one read, an unknown id none).
    #[test]
    fn a_cold_restore_reads_no_op_and_knows_every_one() {
        let (id, data, store, mut e) = chain(40, Config::default());
        e.set_cold(Box::new(SharedCold(store.clone())));
        for m in &data[..30] {
            assert_eq!(e.handle_frame(&m.frame, 0), Outcome::Applied);
        }
        write(&mut e, &store);
        // The tables as written (a copy: the cold index locks the store).
        let tables = store.lock().unwrap().reopened();
        let mut r = Engine::restore(Config::default(), id, &tables, Some(Box::new(SharedCold(store.clone()))), 0).expect("the tables read back");
        assert!(r.cold_filter_partial());
        assert_eq!(r.stats.cold_reads, 0, "nothing read back at open");
        assert_eq!(r.applied_total(), e.applied_total());
        assert_eq!(r.handle_frame(&data[3].frame, 0), Outcome::Duplicate);
        assert_eq!(r.handle_frame(&data[30].frame, 0), Outcome::Applied, "its parent found in the store");
        write(&mut r, &store);
        let reads = r.stats.cold_reads;
        assert!(reads >= 2, "looked up while partial: {reads}");
        let filter = crate::core::cold::filter_of_stored_ops(&SharedCold(store.clone()), r.cold_filter_bytes()).unwrap();
        r.complete_cold_filter(&filter);
        assert!(!r.cold_filter_partial());
        assert_eq!(r.handle_frame(&data[4].frame, 0), Outcome::Duplicate);
        assert_eq!(r.stats.cold_reads, reads + 1, "an applied op: one read");
        assert_eq!(r.handle_frame(&data[31].frame, 0), Outcome::Applied, "its parent is hot");
        assert_eq!(r.op_state(&[7; 32]), OpState::Unknown);
        assert_eq!(r.stats.cold_reads, reads + 1, "an unknown id: the filter says no, nothing read");
    }

    /// A pending op whose parent is pending too, the child stored first:
    /// restored with a partial cold filter, the parent is not taken for an
    /// applied op (the store holds pending ops as well), so the child still
    /// waits on it and is released with it when the grandparent comes.
    #[test]
    fn a_cold_restore_never_takes_a_pending_op_for_an_applied_one() {
        let (id, data, store, mut e) = chain(4, Config::default());
        e.set_cold(Box::new(SharedCold(store.clone())));
        assert_eq!(e.handle_frame(&data[0].frame, 0), Outcome::Applied);
        assert_eq!(e.handle_frame(&data[3].frame, 0), Outcome::NotYet(BufKind::Pending));
        assert_eq!(e.handle_frame(&data[2].frame, 0), Outcome::NotYet(BufKind::Pending));
        write(&mut e, &store);
        let tables = store.lock().unwrap().reopened();
        let mut r = Engine::restore(Config::default(), id, &tables, Some(Box::new(SharedCold(store.clone()))), 0).expect("the tables read back");
        assert!(r.cold_filter_partial());
        assert_eq!(r.op_state(&data[3].id), OpState::Buffered(BufKind::Pending));
        assert_eq!(r.op_state(&data[2].id), OpState::Buffered(BufKind::Pending));
        assert_eq!(r.handle_frame(&data[1].frame, 0), Outcome::Applied);
        assert_eq!(r.op_state(&data[2].id), OpState::Applied);
        assert_eq!(r.op_state(&data[3].id), OpState::Applied, "released with its parent");
    }
}
