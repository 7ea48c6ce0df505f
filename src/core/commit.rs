//! A commit: everything the engine changed since the last one, taken with
//! `Engine::take_commit` and written as one atomic batch (`Commit::writes`),
//! with what may only leave once it is durable (events, gossip), and the
//! applied data ops for the fold (`Fold`, `Check`) when the projector runs
//! after the engine.

use super::governance::GovNode;
use super::tables::{Cf, ScopeRecord, Write};
use crate::protocol::{Action, Hash, PublicKey};

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

/// Entries a commit's list is sized for ahead, at most (`size_like`).
const PRESIZED_MAX: usize = 1 << 15;

impl Commit {
    /// Sizes the lists of `next`, the commit now being built, as this
    /// one's (up to `PRESIZED_MAX` entries each): grown from nothing by
    /// doubling, they were copied again and again at every commit (~5% of
    /// the orderer's time in `causal`).
    pub(crate) fn size_like(&self, next: &mut Commit) {
        next.writes.reserve(self.writes.len().min(PRESIZED_MAX));
        next.events.reserve(self.events.len().min(PRESIZED_MAX));
        next.applied.reserve(self.applied.len().min(PRESIZED_MAX));
        next.released.reserve(self.released.len().min(PRESIZED_MAX));
        next.folds.reserve(self.folds.len().min(PRESIZED_MAX));
    }

    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.events.is_empty() && self.folds.is_empty() && self.records.is_empty()
    }

    /// The event log: one record per scope for this commit (`Cf::Events`:
    /// scope ‖ first seq → count ‖ (op ‖ borsh(Event))*).
    pub(crate) fn put_event_log(&mut self) {
        let mut i = 0;
        while i < self.events.len() {
            let scope = self.events[i].scope;
            let first = self.events[i].seq;
            let mut j = i;
            let mut len = 4;
            while j < self.events.len() && self.events[j].scope == scope {
                let e = &self.events[j];
                assert_eq!(e.seq, first + (j - i) as u64, "a scope's events are consecutive in a commit");
                len += e.op.len() + event_encoded_len(e);
                j += 1;
            }
            // Sized once, each event's borsh written in place (no copy of
            // its kind and data, no value grown by doubling).
            let mut val = Vec::with_capacity(len);
            val.extend_from_slice(&0u32.to_le_bytes());
            for e in &self.events[i..j] {
                val.extend_from_slice(&e.op);
                put_event(&mut val, e);
            }
            debug_assert_eq!(val.len(), len);
            val[..4].copy_from_slice(&((j - i) as u32).to_le_bytes());
            let key = [scope.as_slice(), &first.to_be_bytes()].concat();
            self.writes.push(Write::Put(Cf::Events, key, val));
            i = j;
        }
    }
}

/// The length of `borsh(Event { kind, data })` of an event.
fn event_encoded_len(e: &EventOut) -> usize {
    4 + e.kind.len() + 4 + e.data.len()
}

/// Appends `borsh(Event { kind, data })` of an event: each field's `u32`
/// length, then its bytes.
fn put_event(out: &mut Vec<u8>, e: &EventOut) {
    out.extend_from_slice(&(e.kind.len() as u32).to_le_bytes());
    out.extend_from_slice(e.kind.as_bytes());
    out.extend_from_slice(&(e.data.len() as u32).to_le_bytes());
    out.extend_from_slice(&e.data);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{encode, Event};

    /// A commit's events are written per scope as one record: their count,
    /// then each event's op id and `borsh(Event)`, the same bytes as the
    /// borsh encoder gives (the record's format, read by the event feeds).
    #[test]
    fn the_event_log_holds_each_event_as_borsh_encodes_it() {
        let ev = |scope: u8, seq, kind: &str, data: &[u8]| EventOut { scope: [scope; 32], seq, op: [seq as u8; 32], kind: kind.into(), data: data.to_vec() };
        let events = vec![ev(1, 5, "put", b"abc"), ev(1, 6, "", b""), ev(1, 7, "k\u{e9}y", &[0; 300]), ev(2, 1, "x", b"y")];
        let mut c = Commit { events: events.clone(), ..Default::default() };
        c.put_event_log();
        let record = |from: &[EventOut]| {
            let mut v = (from.len() as u32).to_le_bytes().to_vec();
            for e in from {
                v.extend_from_slice(&e.op);
                v.extend_from_slice(&encode(&Event { kind: e.kind.clone(), data: e.data.clone() }));
            }
            v
        };
        let key = |scope: u8, first: u64| [[scope; 32].as_slice(), &first.to_be_bytes()].concat();
        assert_eq!(
            c.writes,
            vec![Write::Put(Cf::Events, key(1, 5), record(&events[..3])), Write::Put(Cf::Events, key(2, 1), record(&events[3..]))]
        );
    }

    /// The next commit's lists are sized as the last one's, within the
    /// bound, and start empty.
    #[test]
    fn the_next_commit_is_sized_like_the_last() {
        let last = Commit {
            applied: vec![([1; 32], [2; 32]); 1000],
            writes: (0..(PRESIZED_MAX + 5)).map(|i| Write::Delete(Cf::Pending, (i as u32).to_le_bytes().to_vec())).collect(),
            ..Default::default()
        };
        let mut next = Commit::default();
        last.size_like(&mut next);
        assert!(next.applied.is_empty() && next.writes.is_empty());
        assert!(next.applied.capacity() >= 1000);
        assert!((PRESIZED_MAX..PRESIZED_MAX + 5).contains(&next.writes.capacity()), "bounded: {}", next.writes.capacity());
        assert_eq!(next.folds.capacity(), 0);
    }
}
