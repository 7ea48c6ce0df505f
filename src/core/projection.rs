//! The fold of SPEC §8: cells with an LWW register and a counter, and the
//! scope root over them (`smt`).
//!
//! The two halves can run apart: `Cells` folds the actions and says which
//! leaves change (`LeafChange`), and the tree (`Smt`) is told them in
//! order (`set_leaves`), so that the node's projector can fold a commit's
//! cells on one thread while another computes its roots
//! (`core::projector`). `Projection` is the two together, for whoever
//! wants one scope's projection in one place (the workload generator, the
//! tests).

use super::map_bytes;
use super::smt::{LeafId, Smt};
use crate::protocol::crypto::{cell_leaf, cell_path};
use crate::protocol::{Action, Cell, Hash, Lww, PublicKey};

#[derive(Clone, Debug)]
pub struct CellSlot {
    pub entity: String,
    pub key: Vec<u8>,
    pub cell: Cell,
    leaf: LeafId,
}

/// Paths a scope keeps room for between commits, at most.
const CHANGED_KEPT_MAX: usize = 256;

/// A leaf the tree is to set, as the fold of the cells made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeafChange {
    /// The leaf's id in the tree. A new cell's is the number of cells
    /// before it (the tree numbers its leaves in insertion order, and
    /// cells are never removed), so the cells know it without the tree.
    pub leaf: LeafId,
    /// A new cell: the tree inserts its leaf at `path`.
    pub new: bool,
    pub path: Hash,
    pub hash: Hash,
}

/// Sets the leaves of `changes` in the tree, in order.
pub fn set_leaves(smt: &mut Smt, changes: &[LeafChange]) {
    for c in changes {
        if c.new {
            let leaf = smt.insert(c.path, c.hash);
            assert_eq!(leaf, c.leaf, "a new cell's leaf is the number of cells before it");
        } else {
            smt.update(c.leaf, c.hash);
        }
    }
}

/// A scope's cells, without the tree.
#[derive(Default)]
pub struct Cells {
    cells: super::IdMap<Hash, CellSlot>,
    /// Paths changed since the last `take_changed`, for the commit.
    changed: Vec<Hash>,
    /// Of those, the cells created (their index records are written once).
    created: Vec<Hash>,
    /// The cells' own bytes on the heap: entities, keys, values
    /// (`value_bytes`), kept as they change (`heap_bytes`).
    slot_bytes: u64,
}

/// A cell's value's bytes on the heap (its entity and key are counted
/// with its slot).
fn value_bytes(cell: &Cell) -> u64 {
    cell.lww.as_ref().and_then(|l| l.value.as_ref()).map_or(0, Vec::len) as u64
}

impl Cells {
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    pub fn get(&self, path: &Hash) -> Option<&CellSlot> {
        self.cells.get(path)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Hash, &CellSlot)> {
        self.cells.iter()
    }

    /// Bytes of memory the cells hold: the map's slots, the entities, keys
    /// and values, the lists of changes (for the memory gauges; kept as
    /// the cells change, so reading it costs nothing).
    pub fn heap_bytes(&self) -> u64 {
        map_bytes::<Hash, CellSlot>(self.cells.capacity())
            + self.slot_bytes
            + ((self.changed.capacity() + self.created.capacity()) * 32) as u64
    }

    /// Folds the actions of one data op, and adds the leaves they change to
    /// `leaves`, each once, by path: leaf hashes are computed here, once
    /// per touched cell; the tree is rehashed lazily, by whoever holds it.
    pub fn apply(&mut self, hlc: u64, author: &PublicKey, actions: &[Action], leaves: &mut Vec<LeafChange>) {
        let mut touched: Vec<Hash> = Vec::with_capacity(actions.len());
        let before = self.cells.len() as LeafId;
        for (index, action) in actions.iter().enumerate() {
            let (entity, key) = action.cell();
            let path = cell_path(entity, key);
            let slot = match self.cells.entry(path) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    self.slot_bytes += (entity.len() + key.len()) as u64;
                    v.insert(CellSlot { entity: entity.to_owned(), key: key.to_vec(), cell: Cell::default(), leaf: LeafId::MAX })
                }
            };
            let before = value_bytes(&slot.cell);
            fold_action(&mut slot.cell, hlc, author, index as u32, action);
            self.slot_bytes = self.slot_bytes + value_bytes(&slot.cell) - before;
            touched.push(path);
        }
        // Sort + dedup keeps a payload of thousands of actions on one cell linear-ish.
        touched.sort_unstable();
        touched.dedup();
        let mut next = before;
        for path in &touched {
            let slot = self.cells.get_mut(path).expect("touched cell exists");
            let hash = cell_leaf(path, &slot.cell);
            let new = slot.leaf == LeafId::MAX;
            if new {
                self.created.push(*path);
                slot.leaf = next;
                next += 1;
            }
            leaves.push(LeafChange { leaf: slot.leaf, new, path: *path, hash });
        }
        self.changed.extend(touched);
    }

    /// The leaves the actions of one data op would set, folded as `apply`
    /// folds them into copies of the cells they touch: the cells are left
    /// as they are (`Smt::root_with` of these is the root after the op).
    pub fn leaves_after(&self, hlc: u64, author: &PublicKey, actions: &[Action]) -> Vec<(Hash, Hash)> {
        let mut copies: super::IdMap<Hash, Cell> = super::IdMap::default();
        for (index, action) in actions.iter().enumerate() {
            let (entity, key) = action.cell();
            let path = cell_path(entity, key);
            let cell = copies.entry(path).or_insert_with(|| self.cells.get(&path).map(|slot| slot.cell.clone()).unwrap_or_default());
            fold_action(cell, hlc, author, index as u32, action);
        }
        copies.iter().map(|(path, cell)| (*path, cell_leaf(path, cell))).collect()
    }

    /// The commit's writes of the cells changed since the last
    /// `take_changed`, at most: one per change (a cell changed twice counts
    /// twice), and for a created cell its index record and its entity's.
    pub fn writes_max(&self) -> usize {
        self.changed.len() + 2 * self.created.len()
    }

    /// Cells changed since the last call (each once), for the commit, each
    /// with whether it was created since then.
    pub fn take_changed(&mut self) -> Vec<(Hash, &CellSlot, bool)> {
        // Emptied in place: their capacity serves the scope's next commit
        // (taken, they grew again from nothing for each), up to a bound.
        self.changed.sort_unstable();
        self.changed.dedup();
        self.created.sort_unstable();
        let (cells, created) = (&self.cells, &self.created);
        let out = self.changed.drain(..).map(|p| (p, &cells[&p], created.binary_search(&p).is_ok())).collect();
        self.created.clear();
        self.changed.shrink_to(CHANGED_KEPT_MAX);
        self.created.shrink_to(CHANGED_KEPT_MAX);
        out
    }

    /// Restores a cell read back from the store (no fold is re-run): its
    /// leaf, for the tree.
    pub fn restore(&mut self, path: Hash, entity: String, key: Vec<u8>, cell: Cell) -> LeafChange {
        assert_eq!(cell_path(&entity, &key), path, "a stored cell sits at its own path");
        let leaf = self.cells.len() as LeafId;
        let hash = cell_leaf(&path, &cell);
        self.slot_bytes += (entity.len() + key.len()) as u64 + value_bytes(&cell);
        assert!(self.cells.insert(path, CellSlot { entity, key, cell, leaf }).is_none(), "a cell restored once");
        LeafChange { leaf, new: true, path, hash }
    }
}

/// One scope's cells and tree together.
#[derive(Default)]
pub struct Projection {
    cells: Cells,
    smt: Smt,
    /// `apply`'s leaves, emptied after each.
    leaves: Vec<LeafChange>,
}

impl Projection {
    pub fn cells(&self) -> &Cells {
        &self.cells
    }

    /// Folds the actions of one data op (`Cells::apply`) and sets their
    /// leaves in the tree.
    pub fn apply(&mut self, hlc: u64, author: &PublicKey, actions: &[Action]) {
        self.cells.apply(hlc, author, actions, &mut self.leaves);
        set_leaves(&mut self.smt, &self.leaves);
        self.leaves.clear();
    }

    /// The scope root after the actions of one data op were folded as
    /// `apply` folds them, without folding them (`Cells::leaves_after`,
    /// then `Smt::root_with`). Changes no cell.
    pub fn root_after(&mut self, hlc: u64, author: &PublicKey, actions: &[Action]) -> Hash {
        let leaves = self.cells.leaves_after(hlc, author, actions);
        self.smt.root_with(&leaves)
    }

    /// The scope root of §8.
    pub fn root(&mut self) -> Hash {
        self.smt.root()
    }

    /// Asks for the root of the current state (see `Smt::checkpoint`).
    pub fn checkpoint(&mut self) {
        self.smt.checkpoint();
    }

    /// The roots of the checkpoints since the last call, in order.
    pub fn take_checkpoint_roots(&mut self, out: &mut Vec<Hash>) {
        self.smt.take_checkpoint_roots(out);
    }

    /// See `Cells::take_changed`.
    pub fn take_changed(&mut self) -> Vec<(Hash, &CellSlot, bool)> {
        self.cells.take_changed()
    }

    /// Restores a cell read back from the store (no fold is re-run).
    pub fn restore(&mut self, path: Hash, entity: String, key: Vec<u8>, cell: Cell) {
        let leaf = self.cells.restore(path, entity, key, cell);
        set_leaves(&mut self.smt, &[leaf]);
    }
}

/// Folds the `index`-th action of a data op by `author` at `hlc` into its
/// cell (§8): the one fold of `apply` and `root_after`.
fn fold_action(cell: &mut Cell, hlc: u64, author: &PublicKey, index: u32, action: &Action) {
    let candidate = |value| Lww { hlc, author: *author, index, value };
    match action {
        Action::Put { value, .. } => keep_greater(&mut cell.lww, candidate(Some(value.clone()))),
        Action::Delete { .. } => keep_greater(&mut cell.lww, candidate(None)),
        Action::Add { amount, .. } => cell.counter = cell.counter.wrapping_add(*amount),
    }
}

fn keep_greater(current: &mut Option<Lww>, candidate: Lww) {
    match current {
        Some(c) if *c >= candidate => {}
        _ => *current = Some(candidate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: u8, v: &[u8]) -> Action {
        Action::Put { entity: "e".into(), key: vec![k], value: v.to_vec() }
    }

    fn delete(k: u8) -> Action {
        Action::Delete { entity: "e".into(), key: vec![k] }
    }

    fn add(k: u8, amount: i64) -> Action {
        Action::Add { entity: "e".into(), key: vec![k], amount }
    }

    /// One data op: (hlc, author, actions).
    type Op = (u64, PublicKey, Vec<Action>);

    /// Two projections of the same ops; then each op of `next`, in turn:
    /// `root_after` on one equals the root of the other after `apply`, and
    /// leaves its projection as it was (root, cells, nothing changed), so
    /// the `apply` that follows brings both to the same state.
    fn check(base: &[Op], next: &[Op]) {
        let mut applied = Projection::default();
        let mut asked = Projection::default();
        for (hlc, author, actions) in base {
            applied.apply(*hlc, author, actions);
            asked.apply(*hlc, author, actions);
        }
        asked.take_changed();
        for (i, (hlc, author, actions)) in next.iter().enumerate() {
            let before = asked.root();
            let cells = asked.cells().len();
            let got = asked.root_after(*hlc, author, actions);
            applied.apply(*hlc, author, actions);
            assert_eq!(got, applied.root(), "op {i}: root_after is the root after apply");
            assert_eq!(asked.root(), before, "op {i}: the root is unchanged");
            assert_eq!(asked.cells().len(), cells, "op {i}: no cell added");
            assert!(asked.take_changed().is_empty(), "op {i}: nothing marked changed");
            asked.apply(*hlc, author, actions);
            assert_eq!(asked.root(), applied.root(), "op {i}: apply after root_after");
            asked.take_changed();
        }
        let mut a: Vec<_> = applied.cells().iter().map(|(p, s)| (*p, s.cell.clone())).collect();
        let mut b: Vec<_> = asked.cells().iter().map(|(p, s)| (*p, s.cell.clone())).collect();
        a.sort_by_key(|c| c.0);
        b.sort_by_key(|c| c.0);
        assert_eq!(a, b);
        for p in [&applied, &asked] {
            assert_eq!(p.cells().slot_bytes, counted_afresh(p.cells()), "the cells' bytes as kept are those counted afresh");
        }
    }

    fn counted_afresh(cells: &Cells) -> u64 {
        cells.iter().map(|(_, s)| (s.entity.len() + s.key.len()) as u64 + value_bytes(&s.cell)).sum()
    }

    /// A cell's bytes follow its value (a longer one, a shorter one, a
    /// tombstone), count its entity and key once, and come back the same
    /// when the cells are restored from their records.
    #[test]
    fn heap_bytes_follow_the_values() {
        let a = [1u8; 32];
        let mut p = Projection::default();
        p.apply(1, &a, &[put(0, &[0; 1000])]);
        assert_eq!(p.cells().slot_bytes, 1 + 1 + 1000);
        p.apply(2, &a, &[put(0, &[0; 10]), put(1, &[0; 5])]);
        assert_eq!(p.cells().slot_bytes, 2 + 10 + 2 + 5);
        p.apply(1, &a, &[put(1, &[0; 500])]);
        assert_eq!(p.cells().slot_bytes, 2 + 10 + 2 + 5, "an older put changes nothing");
        p.apply(3, &a, &[delete(0), add(1, 4)]);
        assert_eq!(p.cells().slot_bytes, 2 + 2 + 5);
        assert!(p.cells().heap_bytes() >= p.cells().slot_bytes + map_bytes::<Hash, CellSlot>(2));
        let mut restored = Cells::default();
        for (path, s) in p.cells().iter() {
            restored.restore(*path, s.entity.clone(), s.key.clone(), s.cell.clone());
        }
        assert_eq!(restored.slot_bytes, p.cells().slot_bytes);
    }

    #[test]
    fn root_after_is_the_root_after_apply_and_changes_nothing() {
        let (a, b, c) = ([1u8; 32], [2u8; 32], [3u8; 32]);
        let base: Vec<Op> = vec![
            (10, b, vec![put(0, b"x"), put(1, b"y"), add(2, 5), delete(3)]),
            (11, a, vec![put(4, b"z"), add(4, -2)]),
        ];
        let next: Vec<Op> = vec![
            // A Delete of an untouched cell makes a tombstone.
            (12, a, vec![delete(50)]),
            // Add on a cell with a counter, on one with a register, on a new one.
            (13, c, vec![add(2, 7), add(4, i64::MAX), add(51, -9)]),
            // Put twice on one cell in one op: the later index wins.
            (14, a, vec![put(0, b"first"), put(0, b"second")]),
            // Put, then Delete, then Add on one cell.
            (15, b, vec![put(52, b"p"), delete(52), add(52, 1)]),
            // Equal hlc, other authors: the greater author wins, the lesser not.
            (15, a, vec![put(52, b"lesser author")]),
            (15, c, vec![put(52, b"greater author")]),
            // An older hlc loses; a newer Delete wins.
            (1, c, vec![put(1, b"old"), delete(0)]),
            (20, a, vec![delete(1)]),
            // No actions: the root as it is.
            (21, a, vec![]),
            // Counters wrap.
            (22, b, vec![add(4, i64::MAX), add(4, i64::MAX)]),
        ];
        check(&base, &next);
        // From an empty projection.
        check(&[], &next);
    }

    /// Random ops over a few cells (so ops meet cells already touched),
    /// with hlcs and authors that often tie, on projections of hundreds.
    #[test]
    fn root_after_random_ops_equals_apply() {
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0x6A09_E667_F3BC_C908u64);
        let mut next = move || rand::RngCore::next_u64(&mut rng);
        for round in 0..6 {
            let keys = [4u64, 30, 250][round % 3];
            let op = |next: &mut dyn FnMut() -> u64| -> Op {
                let actions = (0..next() % 6)
                    .map(|_| {
                        let k = (next() % keys) as u8;
                        match next() % 3 {
                            0 => put(k, &next().to_le_bytes()[..(next() % 4) as usize]),
                            1 => delete(k),
                            _ => add(k, next() as i64),
                        }
                    })
                    .collect();
                (next() % 8, [(next() % 3) as u8; 32], actions)
            };
            let base: Vec<Op> = (0..100).map(|_| op(&mut next)).collect();
            let more: Vec<Op> = (0..100).map(|_| op(&mut next)).collect();
            check(&base, &more);
        }
    }
}
