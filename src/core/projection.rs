//! The fold of SPEC §8: cells with an LWW register and a counter, and the
//! scope root over them (`smt`).


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

#[derive(Default)]
pub struct Projection {
    cells: super::IdMap<Hash, CellSlot>,
    smt: Smt,
    /// Paths changed since the last `take_changed`, for the commit.
    changed: Vec<Hash>,
    /// Of those, the cells created (their index records are written once).
    created: Vec<Hash>,
}

impl Projection {
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    pub fn get(&self, path: &Hash) -> Option<&CellSlot> {
        self.cells.get(path)
    }

    pub fn cells(&self) -> impl Iterator<Item = (&Hash, &CellSlot)> {
        self.cells.iter()
    }

    /// Folds the actions of one data op. Leaf hashes are refreshed here, once
    /// per touched cell; the tree is rehashed lazily by `root`.
    pub fn apply(&mut self, hlc: u64, author: &PublicKey, actions: &[Action]) {
        let mut touched: Vec<Hash> = Vec::with_capacity(actions.len());
        for (index, action) in actions.iter().enumerate() {
            let (entity, key) = action.cell();
            let path = cell_path(entity, key);
            let slot = self.cells.entry(path).or_insert_with(|| CellSlot {
                entity: entity.to_owned(),
                key: key.to_vec(),
                cell: Cell::default(),
                leaf: u32::MAX,
            });
            fold_action(&mut slot.cell, hlc, author, index as u32, action);
            touched.push(path);
        }
        // Sort + dedup keeps a payload of thousands of actions on one cell linear-ish.
        touched.sort_unstable();
        touched.dedup();
        for path in &touched {
            let slot = self.cells.get_mut(path).expect("touched cell exists");
            let leaf = cell_leaf(path, &slot.cell);
            if slot.leaf == u32::MAX {
                self.created.push(*path);
                slot.leaf = self.smt.insert(*path, leaf);
            } else {
                self.smt.update(slot.leaf, leaf);
            }
        }
        self.changed.extend(touched);
    }

    /// The scope root after the actions of one data op were folded as
    /// `apply` folds them, without folding them: they are folded into
    /// copies of the cells they touch, and the tree is asked for the root
    /// with those cells' leaves (`Smt::root_with`). Changes no cell.
    pub fn root_after(&mut self, hlc: u64, author: &PublicKey, actions: &[Action]) -> Hash {
        let mut copies: super::IdMap<Hash, Cell> = super::IdMap::default();
        for (index, action) in actions.iter().enumerate() {
            let (entity, key) = action.cell();
            let path = cell_path(entity, key);
            let cell = copies.entry(path).or_insert_with(|| self.cells.get(&path).map(|slot| slot.cell.clone()).unwrap_or_default());
            fold_action(cell, hlc, author, index as u32, action);
        }
        let leaves: Vec<(Hash, Hash)> = copies.iter().map(|(path, cell)| (*path, cell_leaf(path, cell))).collect();
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

    /// Restores a cell read back from the store (no fold is re-run).
    pub fn restore(&mut self, path: Hash, entity: String, key: Vec<u8>, cell: Cell) {
        assert_eq!(cell_path(&entity, &key), path, "a stored cell sits at its own path");
        let leaf = self.smt.insert(path, cell_leaf(&path, &cell));
        self.cells.insert(path, CellSlot { entity, key, cell, leaf });
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
            let cells = asked.len();
            let got = asked.root_after(*hlc, author, actions);
            applied.apply(*hlc, author, actions);
            assert_eq!(got, applied.root(), "op {i}: root_after is the root after apply");
            assert_eq!(asked.root(), before, "op {i}: the root is unchanged");
            assert_eq!(asked.len(), cells, "op {i}: no cell added");
            assert!(asked.take_changed().is_empty(), "op {i}: nothing marked changed");
            asked.apply(*hlc, author, actions);
            assert_eq!(asked.root(), applied.root(), "op {i}: apply after root_after");
            asked.take_changed();
        }
        let mut a: Vec<_> = applied.cells().map(|(p, s)| (*p, s.cell.clone())).collect();
        let mut b: Vec<_> = asked.cells().map(|(p, s)| (*p, s.cell.clone())).collect();
        a.sort_by_key(|c| c.0);
        b.sort_by_key(|c| c.0);
        assert_eq!(a, b);
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
