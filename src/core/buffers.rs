//! The buffers of ops not yet applied (SPEC §6, §7): ops pending on a
//! missing dependency (indexed by the id they wait for), governance ops
//! waiting durably for their key, data ops waiting in memory for their key
//! until a deadline; their counts (ops by kind, bytes) per scope and in
//! total, and their age orders, for eviction oldest first.
//!
//! The engine decides what goes in and what comes out (verdicts, the
//! cascade, the records a commit writes, the index of known ops); the
//! buffers hold the ops and answer what waits on what, which wait expired
//! and which op to evict next.

use std::collections::{BTreeMap, VecDeque};

use super::prejudge::Prepared;
use super::types::{BufKind, Config};
use super::IdMap;
use crate::protocol::{Hash, Op};

/// An op in a buffer.
pub(crate) struct Buffered {
    pub(crate) op: Op,
    pub(crate) bytes: Vec<u8>,
    pub(crate) scope: u32,
    pub(crate) kind: BufKind,
    /// Pending, with its encoding in the ops table (`Cf::Ops`) since it was
    /// buffered: applying it writes nothing more of it. False for a pending
    /// record of the older layout (its encoding in the record itself). A
    /// data key wait woken from such a pending wait keeps both records
    /// (`Engine::evaluate`), and this.
    pub(crate) in_ops: bool,
    /// Its records (`in_ops`: its encoding in `Cf::Ops` and its pending
    /// record; a governance key wait: its `Cf::KeyWaits` record) are in the
    /// store, or in the commit being finished. An op buffered within a
    /// commit has them written when that commit is taken, if it is still
    /// buffered then (`Engine::take_commit`): one buffered and released
    /// within a commit never reaches the disk, and nothing of it is
    /// written, cancelled or deleted.
    pub(crate) written: bool,
    pub(crate) seq: u64,
    /// Pending: the ids it is registered under (their slots' `waiters`).
    pub(crate) missing: Ids,
    pub(crate) deadline_ms: u64,
    pub(crate) since_ms: u64,
    /// What the pipeline's authorizer and decryptor found (a pending op:
    /// they ran before its parents arrived), kept so that its release does
    /// not decrypt it again on the engine's thread. The plaintext counts
    /// against `PREPARED_BYTES_MAX`, not the buffer bounds.
    pub(crate) pre: Option<Prepared>,
}

/// Buffered ops by age (`seq`), oldest first, for eviction. Removal is
/// lazy: an entry is live while its op is buffered with that `seq`; dead
/// entries leave at the front, or all at once when they come to outnumber
/// the live ones (so the deque stays within about twice the buffer). A
/// `BTreeMap<seq, id>` did the same with an insert and a remove per
/// buffered op, searched from the root each time.
#[derive(Default)]
struct AgeOrder(VecDeque<(u64, Hash)>);

/// What the buffers hold under one id: the op, if it is buffered, and the
/// buffered ops waiting for it (SPEC §6: pending on it as a missing
/// dependency). One map for both, since the two are asked for under the
/// same id: an op of a chain sent backwards is first waited on, then
/// buffered, then released and its waiters woken, and each map's lookup of
/// a random id was a cache miss of its own (each ~9% of the orderer's
/// thread in `reversed`).
#[derive(Default)]
struct Slot {
    op: Option<Box<Buffered>>,
    waiters: Ids,
}

impl Slot {
    fn is_empty(&self) -> bool {
        self.op.is_none() && self.waiters.is_empty()
    }
}

type Slots = IdMap<Hash, Slot>;

/// `f` on the slot of `id`, if there is one, and the slot removed if it
/// is left empty (no slot is ever empty).
fn update_slot<R>(slots: &mut Slots, id: &Hash, f: impl FnOnce(&mut Slot) -> R) -> Option<R> {
    let std::collections::hash_map::Entry::Occupied(mut slot) = slots.entry(*id) else { return None };
    let r = f(slot.get_mut());
    if slot.get().is_empty() {
        slot.remove();
    }
    Some(r)
}

impl AgeOrder {
    fn is_live(slots: &Slots, (seq, id): &(u64, Hash)) -> bool {
        slots.get(id).and_then(|s| s.op.as_ref()).is_some_and(|b| b.seq == *seq)
    }

    /// Appends an op just buffered with a new `seq` (`live`: how many ops
    /// this order holds, this one included).
    fn push(&mut self, seq: u64, id: Hash, live: u64, slots: &Slots) {
        self.0.push_back((seq, id));
        if self.0.len() as u64 > 2 * live + 64 {
            self.0.retain(|e| Self::is_live(slots, e));
        }
    }

    /// The oldest live entry, dropping the dead ones before it.
    fn oldest(&mut self, slots: &Slots) -> Option<Hash> {
        while let Some(front) = self.0.front() {
            if Self::is_live(slots, front) {
                return Some(front.1);
            }
            self.0.pop_front();
        }
        None
    }

    fn sort(&mut self) {
        self.0.make_contiguous().sort_unstable();
    }
}

/// A few op ids: a pending op's missing dependencies, the ops waiting for
/// an id. Mostly one, held inline: a list on the heap for each was an
/// allocation per parked op, and a cache miss to read it when its parent
/// came (~9% of the order stage in `shuffled`, `cargo bench --bench
/// stages -- "order stage"`).
pub(crate) type Ids = smallvec::SmallVec<[Hash; 1]>;

/// Plaintext of buffered ops kept from the pipeline's decryptor, all scopes
/// together; beyond, a buffered op keeps only its authorization and is
/// decrypted again when released.
const PREPARED_BYTES_MAX: usize = 32 << 20;

fn prepared_bytes(pre: &Option<Prepared>) -> usize {
    pre.as_ref().map_or(0, Prepared::payload_bytes)
}

/// The ops one scope holds in the buffers, by kind, and their bytes.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BufferCounts {
    pub(crate) pending: u64,
    pub(crate) key_waiting: u64,
    pub(crate) data_key_waiting: u64,
    pub(crate) bytes: u64,
}

impl BufferCounts {
    fn ops(&self) -> u64 {
        self.pending + self.key_waiting + self.data_key_waiting
    }

    fn of_kind_mut(&mut self, kind: BufKind) -> &mut u64 {
        match kind {
            BufKind::Pending => &mut self.pending,
            BufKind::KeyWait => &mut self.key_waiting,
            BufKind::DataKeyWait => &mut self.data_key_waiting,
        }
    }
}

/// One scope's part of the buffers.
#[derive(Default)]
struct ScopeBuffers {
    counts: BufferCounts,
    /// Buffered ops of this scope by age, for eviction oldest first.
    order: AgeOrder,
}

pub(crate) struct Buffers {
    /// By id: the buffered op (boxed: a `Buffered` is a few hundred bytes,
    /// and a map of 100k of them moved every entry at each growth), and
    /// pending-by-parent, the ops buffered on that id as a missing
    /// dependency. A slot with neither is removed.
    slots: Slots,
    /// The slots holding an op.
    buffered: usize,
    /// Plaintext held in buffered ops' `pre` (see `PREPARED_BYTES_MAX`).
    prepared_bytes_total: usize,
    /// key_id → the ops waiting for it.
    key_waiters: IdMap<Hash, Vec<Hash>>,
    /// Data key waits by (deadline, seq).
    data_deadlines: BTreeMap<(u64, u64), Hash>,
    /// By the engine's scope index (`add_scope`).
    scopes: Vec<ScopeBuffers>,
    global_order: AgeOrder,
    bytes_total: u64,
    ops_per_scope_max: u64,
    bytes_per_scope_max: u64,
    ops_total_max: u64,
    bytes_total_max: u64,
}

impl Buffers {
    /// Empty buffers with the bounds of `cfg`.
    pub(crate) fn new(cfg: &Config) -> Self {
        Buffers {
            slots: Slots::default(),
            buffered: 0,
            prepared_bytes_total: 0,
            key_waiters: IdMap::default(),
            data_deadlines: BTreeMap::new(),
            scopes: Vec::new(),
            global_order: AgeOrder::default(),
            bytes_total: 0,
            ops_per_scope_max: cfg.buffered_ops_per_scope_max,
            bytes_per_scope_max: cfg.buffered_bytes_per_scope_max,
            ops_total_max: cfg.buffered_ops_total_max,
            bytes_total_max: cfg.buffered_bytes_total_max,
        }
    }

    /// Makes room for the engine's next scope index.
    pub(crate) fn add_scope(&mut self) {
        self.scopes.push(ScopeBuffers::default());
    }

    /// Puts an op in its buffer; `fresh` when its `seq` is new, not when it
    /// goes back to the buffer it was just taken from (its age entries are
    /// still in place: nothing between `take` and this call pops or
    /// compacts them).
    pub(crate) fn put(&mut self, id: Hash, mut b: Box<Buffered>, fresh: bool) {
        let kept = prepared_bytes(&b.pre);
        if kept > 0 && self.prepared_bytes_total + kept > PREPARED_BYTES_MAX {
            if let Some(p) = b.pre.as_mut() {
                p.drop_payload();
            }
        }
        self.prepared_bytes_total += prepared_bytes(&b.pre);
        let s = &mut self.scopes[b.scope as usize];
        *s.counts.of_kind_mut(b.kind) += 1;
        s.counts.bytes += b.bytes.len() as u64;
        let (seq, scope, scope_ops) = (b.seq, b.scope as usize, s.counts.ops());
        self.bytes_total += b.bytes.len() as u64;
        let previous = self.slots.entry(id).or_default().op.replace(b);
        debug_assert!(previous.is_none(), "an op is buffered once");
        self.buffered += 1;
        if fresh {
            let live = self.buffered as u64;
            self.scopes[scope].order.push(seq, id, scope_ops, &self.slots);
            self.global_order.push(seq, id, live, &self.slots);
        }
    }

    /// Takes an op out of its buffer (not out of the lists it is registered
    /// in: see `unregister`).
    pub(crate) fn take(&mut self, id: &Hash) -> Option<Box<Buffered>> {
        let b = update_slot(&mut self.slots, id, |s| s.op.take())??;
        self.buffered -= 1;
        self.prepared_bytes_total -= prepared_bytes(&b.pre);
        let s = &mut self.scopes[b.scope as usize];
        *s.counts.of_kind_mut(b.kind) -= 1;
        s.counts.bytes -= b.bytes.len() as u64;
        self.bytes_total -= b.bytes.len() as u64;
        Some(b)
    }

    /// Registers a buffered op under what it waits for: each missing
    /// dependency (pending), its key (key waits), its deadline (data key
    /// waits).
    pub(crate) fn register(&mut self, id: Hash, b: &Buffered) {
        for m in &b.missing {
            self.slots.entry(*m).or_default().waiters.push(id);
        }
        if b.kind != BufKind::Pending {
            self.key_waiters.entry(b.op.key_id).or_default().push(id);
        }
        if b.kind == BufKind::DataKeyWait {
            self.data_deadlines.insert((b.deadline_ms, b.seq), id);
        }
    }

    /// Removes a buffered op from the lists it is registered in.
    pub(crate) fn unregister(&mut self, id: &Hash, b: &Buffered) {
        for m in &b.missing {
            update_slot(&mut self.slots, m, |s| s.waiters.retain(|x| x != id));
        }
        if b.kind != BufKind::Pending {
            if let Some(list) = self.key_waiters.get_mut(&b.op.key_id) {
                list.retain(|x| x != id);
                if list.is_empty() {
                    self.key_waiters.remove(&b.op.key_id);
                }
            }
        }
        if b.kind == BufKind::DataKeyWait {
            self.data_deadlines.remove(&(b.deadline_ms, b.seq));
        }
    }

    /// A data op woken before its deadline no longer expires.
    pub(crate) fn cancel_deadline(&mut self, b: &Buffered) {
        if b.kind == BufKind::DataKeyWait {
            self.data_deadlines.remove(&(b.deadline_ms, b.seq));
        }
    }

    /// The ops waiting for `id` (it is applied or dropped: their wait on it
    /// is over), no longer registered under it.
    pub(crate) fn take_waiters(&mut self, id: &Hash) -> Option<Ids> {
        update_slot(&mut self.slots, id, |s| std::mem::take(&mut s.waiters)).filter(|w| !w.is_empty())
    }

    /// The ops waiting for the key `key_id` (it arrived).
    pub(crate) fn take_key_waiters(&mut self, key_id: &Hash) -> Option<Vec<Hash>> {
        self.key_waiters.remove(key_id)
    }

    /// Whether some buffered op waits for `id`.
    pub(crate) fn is_waited_on(&self, id: &Hash) -> bool {
        self.slots.get(id).is_some_and(|s| !s.waiters.is_empty())
    }

    /// The scope of an op waiting for `id`, if one does (an op's
    /// dependencies are of its own scope).
    pub(crate) fn waiting_scope(&self, id: &Hash) -> Option<u32> {
        let w = self.slots.get(id)?.waiters.first()?;
        self.get(w).map(|b| b.scope)
    }

    /// Every id some buffered op waits for.
    pub(crate) fn waited_on(&self) -> impl Iterator<Item = &Hash> {
        self.slots.iter().filter(|(_, s)| !s.waiters.is_empty()).map(|(id, _)| id)
    }

    /// The next data key wait whose deadline is `now_ms` or earlier, its
    /// deadline removed (the op may have left its buffer since).
    pub(crate) fn pop_expired(&mut self, now_ms: u64) -> Option<Hash> {
        let (&(deadline, seq), &id) = self.data_deadlines.iter().next()?;
        if deadline > now_ms {
            return None;
        }
        self.data_deadlines.remove(&(deadline, seq));
        Some(id)
    }

    /// The earliest data key-wait deadline.
    pub(crate) fn next_deadline_ms(&self) -> Option<u64> {
        self.data_deadlines.keys().next().map(|(d, _)| *d)
    }

    /// SPEC §7: while `scope` or all the buffers together are over a bound,
    /// the op to evict next, the oldest (by `seq`) of that scope or of all.
    pub(crate) fn over_bound_oldest(&mut self, scope: u32) -> Option<Hash> {
        let s = &mut self.scopes[scope as usize];
        let victim = if s.counts.ops() > self.ops_per_scope_max
            || s.counts.bytes > self.bytes_per_scope_max
        {
            s.order.oldest(&self.slots)
        } else if self.buffered as u64 > self.ops_total_max
            || self.bytes_total > self.bytes_total_max
        {
            self.global_order.oldest(&self.slots)
        } else {
            return None;
        };
        Some(victim.expect("an over-full buffer holds an op"))
    }

    /// The records were read in id order at restore: puts the age orders
    /// back in order of `seq`.
    pub(crate) fn sort_age_orders(&mut self) {
        for s in &mut self.scopes {
            s.order.sort();
        }
        self.global_order.sort();
    }

    pub(crate) fn get(&self, id: &Hash) -> Option<&Buffered> {
        self.slots.get(id)?.op.as_deref()
    }

    /// An op still buffered whose records are not written yet (see
    /// `Buffered::written`), marked written.
    pub(crate) fn take_unwritten(&mut self, id: &Hash) -> Option<&Buffered> {
        let b = self.slots.get_mut(id)?.op.as_mut().filter(|b| !b.written)?;
        b.written = true;
        Some(&**b)
    }

    /// When the oldest buffered op was buffered (ms).
    pub(crate) fn oldest_since_ms(&mut self) -> Option<u64> {
        let id = self.global_order.oldest(&self.slots)?;
        self.get(&id).map(|b| b.since_ms)
    }

    pub(crate) fn counts(&self, scope: u32) -> BufferCounts {
        self.scopes[scope as usize].counts
    }

    /// Bytes of memory the buffers hold, for the memory gauges: each op
    /// (its box, its encoding and, about as large, its decoded form, the
    /// plaintext kept from the decryptor), and the maps and orders that
    /// index them.
    pub(crate) fn heap_bytes(&self) -> u64 {
        use super::map_bytes;
        let lists: u64 = self.key_waiters.values().map(|l| (l.capacity() * 32) as u64).sum();
        let ages = (self.global_order.0.capacity() + self.scopes.iter().map(|s| s.order.0.capacity()).sum::<usize>())
            * std::mem::size_of::<(u64, Hash)>();
        self.buffered as u64 * std::mem::size_of::<Buffered>() as u64
            + 2 * self.bytes_total
            + self.prepared_bytes_total as u64
            + map_bytes::<Hash, Slot>(self.slots.capacity())
            + map_bytes::<Hash, Vec<Hash>>(self.key_waiters.capacity())
            + lists
            + (self.data_deadlines.len() * std::mem::size_of::<((u64, u64), Hash)>()) as u64
            + (ages + self.scopes.capacity() * std::mem::size_of::<ScopeBuffers>()) as u64
    }

    /// Ops buffered and their bytes, all scopes together.
    pub(crate) fn total(&self) -> (u64, u64) {
        (self.buffered as u64, self.bytes_total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(seq: u64, missing: &[Hash]) -> Box<Buffered> {
        Box::new(Buffered {
            op: super::super::engine::empty_op(),
            bytes: vec![0; 100],
            scope: 0,
            kind: BufKind::Pending,
            in_ops: true,
            written: false,
            seq,
            missing: missing.iter().copied().collect(),
            deadline_ms: 0,
            since_ms: seq,
            pre: None,
        })
    }

    /// A chain sent backwards, as the cascade meets it: each op is waited
    /// on before it is buffered, so one slot holds both, and the slot
    /// leaves once the op is taken and its waiters woken, in either order.
    #[test]
    fn a_slot_holds_an_op_and_its_waiters_and_leaves_when_both_are_gone() {
        let mut b = Buffers::new(&Config::default());
        b.add_scope();
        let ids: Vec<Hash> = (1..=4u8).map(|i| [i; 32]).collect();
        // ids[3] waits on ids[2], which waits on ids[1], which waits on ids[0].
        for i in (1..4).rev() {
            let op = pending(i as u64, &[ids[i - 1]]);
            b.register(ids[i], &op);
            b.put(ids[i], op, true);
        }
        assert_eq!(b.total(), (3, 300));
        assert!(b.is_waited_on(&ids[0]) && b.is_waited_on(&ids[1]) && !b.is_waited_on(&ids[3]));
        assert_eq!(b.waiting_scope(&ids[1]), Some(0));
        let mut waited: Vec<Hash> = b.waited_on().copied().collect();
        waited.sort();
        assert_eq!(waited, ids[..3]);
        assert_eq!(b.slots.len(), 4, "ids[1] and ids[2] each one slot for the op and its waiters");

        // ids[0] arrives: its waiter is woken, taken, and wakes the next.
        assert_eq!(b.take_waiters(&ids[0]).as_deref(), Some(&ids[1..2]));
        assert_eq!(b.take_waiters(&ids[0]), None);
        let op = b.take(&ids[1]).expect("buffered");
        assert_eq!(op.seq, 1);
        assert!(b.get(&ids[1]).is_none() && b.is_waited_on(&ids[1]), "its waiters stay until it is applied");
        assert_eq!(b.take_waiters(&ids[1]).as_deref(), Some(&ids[2..3]));
        // The other order: the waiters first, then the op.
        assert_eq!(b.take_waiters(&ids[2]).as_deref(), Some(&ids[3..4]));
        assert_eq!(b.take(&ids[2]).map(|o| o.seq), Some(2));
        assert_eq!(b.take(&ids[2]).map(|o| o.seq), None);
        assert_eq!(b.oldest_since_ms(), Some(3));
        let last = b.take(&ids[3]).expect("buffered");
        assert_eq!(b.total(), (0, 0));
        assert_eq!(b.oldest_since_ms(), None);
        assert_eq!(b.slots.len(), 0, "no slot outlives its op and its waiters");
        drop(last);

        // An op evicted while waiting leaves no waiter list behind.
        let op = pending(5, &[ids[0]]);
        b.register(ids[1], &op);
        b.put(ids[1], op, true);
        let op = b.take(&ids[1]).expect("buffered");
        b.unregister(&ids[1], &op);
        assert!(!b.is_waited_on(&ids[0]));
        assert_eq!(b.slots.len(), 0);
    }
}
