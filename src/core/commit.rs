//! A commit: everything the engine changed since the last one, taken with
//! `Engine::take_commit` and written as one atomic batch (`Commit::writes`),
//! with what may only leave once it is durable (events, gossip), and the
//! applied data ops for the fold (`Fold`, `Check`) when the projector runs
//! after the engine.

use super::governance::GovNode;
use super::tables::{Cf, ScopeRecord, Write};
use super::IdSet;
use crate::protocol::{encode, Action, Event, Hash, PublicKey};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventOut {
    pub scope: Hash,
    /// Per-scope sequence number, from 1, in apply order.
    pub seq: u64,
    pub op: Hash,
    pub kind: String,
    pub data: Vec<u8>,
}

/// Everything handled since the last `take_commit`: to be written in one
/// atomic batch; the events go out only once it is durable.
#[derive(Default, Debug)]
pub struct Commit {
    pub writes: Vec<Write>,
    pub events: Vec<EventOut>,
    /// Ops applied, in apply order, with their scope (for gossip).
    pub applied: Vec<(Hash, Hash)>,
    /// The encodings of applied ops, as signed, that this commit does not
    /// write as they are (a pending op's were written when it was
    /// buffered; a data op's record refers to its parents,
    /// `core::oprecord`), for gossip.
    pub released: Vec<(Hash, Vec<u8>)>,
    /// Governance ops applied, for the pipeline's replicas of the index.
    pub gov_applied: Vec<(Hash, GovNode)>,
    /// Group keys accepted.
    pub keys_added: Vec<[u8; 32]>,
    /// Key deliveries this node made to others, kept by this commit, to be
    /// gossiped once it is durable.
    pub delivered: Vec<crate::protocol::KeyDelivery>,
    /// This commit's number (consecutive from 0 per engine): the driver
    /// reports it back through `Engine::note_durable` once it is written.
    pub number: u64,
    /// Data ops applied, in apply order, for a projector outside the engine
    /// (`Engine::take_projector`); empty when the engine folds them itself.
    pub folds: Vec<Fold>,
    /// Records of the scopes this commit changed, written by
    /// `Projector::finish_commit` with their divergence counts.
    pub records: Vec<(Hash, ScopeRecord)>,
}

impl Commit {
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.events.is_empty() && self.folds.is_empty() && self.records.is_empty()
    }

    /// Drops the puts of buffer records (`Cf::Pending`, `Cf::KeyWaits`, an
    /// op's encoding in `Cf::Ops`) whose keys are in `cancelled`: records of
    /// ops buffered and released within this commit (`Engine::take_commit`).
    pub(crate) fn drop_cancelled_puts(&mut self, cancelled: &IdSet<(u8, Hash)>) {
        let writes = std::mem::take(&mut self.writes);
        self.writes = writes
            .into_iter()
            .filter(|w| match w {
                Write::Put(cf @ (Cf::Pending | Cf::KeyWaits | Cf::Ops), k, _) => {
                    let id: Hash = k.as_slice().try_into().expect("buffer keys are ids");
                    !cancelled.contains(&(*cf as u8, id))
                }
                _ => true,
            })
            .collect();
    }

    /// The event log: one record per scope for this commit (`Cf::Events`:
    /// scope ‖ first seq → count ‖ (op ‖ borsh(Event))*).
    pub(crate) fn put_event_log(&mut self) {
        let mut i = 0;
        while i < self.events.len() {
            let scope = self.events[i].scope;
            let first = self.events[i].seq;
            let mut j = i;
            let mut val = Vec::new();
            val.extend_from_slice(&0u32.to_le_bytes());
            while j < self.events.len() && self.events[j].scope == scope {
                let e = &self.events[j];
                assert_eq!(e.seq, first + (j - i) as u64, "a scope's events are consecutive in a commit");
                val.extend_from_slice(&e.op);
                val.extend_from_slice(&encode(&Event { kind: e.kind.clone(), data: e.data.clone() }));
                j += 1;
            }
            val[..4].copy_from_slice(&((j - i) as u32).to_le_bytes());
            let key = [scope.as_slice(), &first.to_be_bytes()].concat();
            self.writes.push(Write::Put(Cf::Events, key, val));
            i = j;
        }
    }
}

/// One applied data op, for the fold.
#[derive(Clone, Debug)]
pub struct Fold {
    pub scope: Hash,
    pub hlc: u64,
    pub author: PublicKey,
    pub actions: Vec<Action>,
    /// SPEC §8: the data heads were exactly this op once it was applied,
    /// so the scope root must equal its author's.
    pub check: Option<Check>,
}

#[derive(Clone, Copy, Debug)]
pub struct Check {
    pub op: Hash,
    /// The `root_hash` of the op's payload.
    pub root: Hash,
}
