//! What the engine tells of its state: scopes (`status`, SPEC §11;
//! `report`), op states and wanted ids (sync), totals and gauges (metrics),
//! governance and keys (the pipeline's replicas). Nothing here changes a
//! verdict; the `&mut self` ones settle the projector's outstanding checks,
//! prune caches and lazy orders, or drain `touched`.

use std::sync::Arc;

use super::engine::{Engine, Entry};
use super::governance::{GovNode, GovState};
use super::types::{BufKind, OpState, Scope, ScopeReport, ScopeStatus};
use crate::protocol::{Hash, PublicKey, Role, ZERO};

impl Engine {
    pub fn scope_ids(&self) -> Vec<Hash> {
        let mut v: Vec<Hash> = self.scopes.iter().map(|s| s.id).collect();
        v.sort();
        v
    }

    /// A scope's state and buffer counts, for tests and tools.
    pub fn scope(&self, id: &Hash) -> Option<Scope> {
        let i = *self.scope_index.get(id)?;
        let (s, c) = (&self.scopes[i as usize], self.buffers.counts(i));
        Some(Scope {
            id: s.id,
            genesis_applied: s.genesis_applied,
            gov_heads: s.gov_heads.clone(),
            data_heads: s.data_heads.clone(),
            applied: s.applied,
            pending: c.pending,
            key_waiting: c.key_waiting,
            data_key_waiting: c.data_key_waiting,
            buffered_bytes: c.bytes,
            event_seq: s.event_seq,
        })
    }

    /// The scope root, when the engine folds (see `take_projector`).
    pub fn scope_root(&mut self, id: &Hash) -> Option<Hash> {
        self.scope_index.get(id)?;
        Some(self.projector.as_mut()?.root(id))
    }

    fn root_of(&mut self, id: &Hash) -> Hash {
        self.projector.as_mut().map_or(ZERO, |p| p.root(id))
    }

    /// The SPEC §11 status object, `None` (404) while the genesis is not applied.
    pub fn status(&mut self, id: &Hash) -> Option<ScopeStatus> {
        let i = *self.scope_index.get(id)?;
        self.status_at(i)
    }

    fn status_at(&mut self, i: u32) -> Option<ScopeStatus> {
        let id = self.scopes[i as usize].id;
        if !self.scopes[i as usize].genesis_applied {
            return None;
        }
        let root = self.root_of(&id);
        let members = match &self.scopes[i as usize].members_at_heads {
            Some(m) => m.clone(),
            None => {
                let heads: Vec<Hash> = self.scopes[i as usize].gov_heads.iter().copied().collect();
                match self.governance_at(&heads) {
                    Some(g) => {
                        let mut members: Vec<(PublicKey, Role)> = g.members.iter().map(|(k, r)| (*k, *r)).collect();
                        members.sort_unstable_by_key(|m| m.0);
                        let members: std::sync::Arc<[(PublicKey, Role)]> = members.into();
                        self.scopes[i as usize].members_at_heads = Some(members.clone());
                        members
                    }
                    // Not kept: the heads' state is not indexed (yet).
                    None => std::sync::Arc::from([]),
                }
            }
        };
        let (s, c) = (&self.scopes[i as usize], self.buffers.counts(i));
        Some(ScopeStatus {
            scope: s.id,
            root,
            data_heads: s.data_heads.iter().copied().collect(),
            governance_heads: s.gov_heads.iter().copied().collect(),
            applied: s.applied,
            pending: c.pending,
            key_waiting: c.key_waiting,
            data_key_waiting: c.data_key_waiting,
            members,
        })
    }

    /// Every remembered op of a scope with its state, for tests and `inspect`.
    pub fn report(&mut self, id: &Hash) -> Option<ScopeReport> {
        let i = *self.scope_index.get(id)?;
        let mut r = ScopeReport { scope: *id, ..Default::default() };
        for (op_id, e) in &self.ops {
            match e {
                Entry::Applied(m) if m.scope == i => r.applied.push(*op_id),
                Entry::Dropped { reason, scope } if *scope == i => {
                    r.dropped.insert(*op_id, *reason);
                }
                Entry::Buffered => {
                    let b = self.buffers.get(op_id).expect("a buffered op is in its buffer");
                    if b.scope == i {
                        match b.kind {
                            BufKind::Pending => r.pending.push(*op_id),
                            BufKind::KeyWait => r.key_waiting.push(*op_id),
                            BufKind::DataKeyWait => r.data_key_waiting.push(*op_id),
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(cold) = &self.cold {
            let scope_id = self.scopes[i as usize].id;
            let ops = &self.ops;
            let read = cold.scan(&mut |op_id, bytes| {
                // The ops table holds pending ops too.
                if matches!(ops.get(op_id), Some(Entry::Buffered)) {
                    return;
                }
                let op = super::oprecord::decode_without_parents(bytes).expect("a stored op decodes");
                if op.scope_of(op_id) == scope_id {
                    r.applied.push(*op_id);
                }
            });
            // As for any read of the cold index: the engine stops.
            if let Err(e) = read {
                let _ = self.cold_failed.set(e);
            }
        }
        r.applied.sort();
        r.applied.dedup();
        for v in [&mut r.pending, &mut r.key_waiting, &mut r.data_key_waiting] {
            v.sort();
        }
        r.root = self.root_of(id);
        r.divergences = self.projector.as_mut().map_or(0, |p| p.divergences(id));
        let s = &self.scopes[i as usize];
        r.data_heads = s.data_heads.iter().copied().collect();
        r.governance_heads = s.gov_heads.iter().copied().collect();
        Some(r)
    }

    /// The state of one op id, for sync and tests.
    pub fn op_state(&self, id: &Hash) -> OpState {
        match self.ops.get(id) {
            None if self.cold_op(id).is_some() => OpState::Applied,
            None if self.cold_failed().is_some() => OpState::Unreadable,
            None => OpState::Unknown,
            Some(Entry::Applied(_)) => OpState::Applied,
            Some(Entry::Dropped { reason, .. }) => OpState::Dropped(*reason),
            Some(Entry::Buffered) => OpState::Buffered(self.buffers.get(id).expect("a buffered op is in its buffer").kind),
        }
    }

    /// Ids that buffered ops wait for and that are not known at all: what a
    /// sync should ask peers for. At most `max`.
    ///
    /// Cost: the ids waited on that were unknown when first waited on (kept
    /// in `maybe_wanted` and pruned here), not every id waited on: in a long
    /// reversed chain nearly all of those are known, buffered themselves.
    /// The smallest ids first: the set's iteration order is seeded per
    /// process, and no output may depend on it (a seed of the simulation
    /// replays the same in any process).
    pub fn wanted(&mut self, max: usize) -> Vec<Hash> {
        let (ops, buffers) = (&self.ops, &self.buffers);
        self.maybe_wanted.retain(|id| !ops.contains_key(id) && buffers.is_waited_on(id));
        let mut wanted: Vec<Hash> = self.maybe_wanted.iter().copied().collect();
        if wanted.len() > max {
            wanted.select_nth_unstable(max);
            wanted.truncate(max);
        }
        wanted.sort_unstable();
        wanted
    }

    /// The scopes of the buffered ops that wait for `ids`, each once: a
    /// request for the ids names their heads as held
    /// (`peering::sync_requests`).
    pub fn wanted_scopes(&self, ids: &[Hash]) -> Vec<Hash> {
        let mut scopes: Vec<u32> = ids.iter().filter_map(|id| self.buffers.waiting_scope(id)).collect();
        scopes.sort_unstable();
        scopes.dedup();
        scopes.into_iter().map(|i| self.scopes[i as usize].id).collect()
    }

    pub fn buffered_total(&self) -> (u64, u64) {
        self.buffers.total()
    }

    pub fn applied_total(&self) -> u64 {
        self.scopes.iter().map(|s| s.applied).sum()
    }

    /// `G(cut)` when every id of `cut` is an applied governance op.
    pub fn governance_at(&mut self, cut: &[Hash]) -> Option<Arc<GovState>> {
        for c in cut {
            self.gov.get(c)?;
        }
        let mut cut = cut.to_vec();
        cut.sort();
        cut.dedup();
        Some(self.gov.state_at(&cut))
    }

    /// Whether a scope's status changed since it was last taken.
    pub fn statuses_stale(&self) -> bool {
        self.stale_statuses > 0
    }

    /// The statuses of the scopes whose status changed since it was last
    /// taken, each once, in the order they were first touched (none for a
    /// scope whose genesis is not applied).
    pub fn take_statuses(&mut self) -> Vec<ScopeStatus> {
        let touched = std::mem::take(&mut self.touched);
        let mut v = Vec::with_capacity(self.stale_statuses);
        for &i in &touched {
            if self.take_stale(i) {
                v.extend(self.status_at(i));
            }
        }
        // The list's allocation kept for the next round.
        self.touched = touched;
        self.touched.clear();
        v
    }

    /// `scope`'s status if it changed since it was last taken, which it
    /// then no longer has to be (the API's writes, answered between the
    /// rounds of `take_statuses`).
    pub fn take_status(&mut self, scope: &Hash) -> Option<ScopeStatus> {
        let i = *self.scope_index.get(scope)?;
        if self.take_stale(i) {
            self.status_at(i)
        } else {
            None
        }
    }

    fn take_stale(&mut self, i: u32) -> bool {
        let stale = std::mem::take(&mut self.scopes[i as usize].status_stale);
        self.stale_statuses -= usize::from(stale);
        stale
    }

    /// Every accepted governance op, for the pipeline's replica.
    pub fn governance_nodes(&self) -> Vec<(Hash, GovNode)> {
        self.gov.nodes().map(|(id, n)| (*id, n.clone())).collect()
    }

    /// Every group key held.
    pub fn keys(&self) -> Vec<[u8; 32]> {
        self.keys.values().copied().collect()
    }

    /// When the oldest buffered op was buffered (ms), for the age metric.
    pub fn oldest_buffered_since_ms(&mut self) -> Option<u64> {
        self.buffers.oldest_since_ms()
    }

    /// The last event sequence number handed out in a scope (0: none).
    pub fn event_seq(&self, scope: &Hash) -> u64 {
        self.scope_index.get(scope).map_or(0, |&i| self.scopes[i as usize].event_seq)
    }

    /// Per-scope event sequence numbers (the last one handed out).
    pub fn event_seqs(&self) -> Vec<(Hash, u64)> {
        self.scopes.iter().map(|s| (s.id, s.event_seq)).collect()
    }

    pub fn governance_cache_stats(&self) -> (u64, u64) {
        (self.gov.cache_hits, self.gov.cache_misses)
    }
}
