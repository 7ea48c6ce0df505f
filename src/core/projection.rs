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
            let candidate = |value| Lww { hlc, author: *author, index: index as u32, value };
            match action {
                Action::Put { value, .. } => keep_greater(&mut slot.cell.lww, candidate(Some(value.clone()))),
                Action::Delete { .. } => keep_greater(&mut slot.cell.lww, candidate(None)),
                Action::Add { amount, .. } => slot.cell.counter = slot.cell.counter.wrapping_add(*amount),
            }
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

    /// Cells changed since the last call (each once), for the commit, each
    /// with whether it was created since then.
    pub fn take_changed(&mut self) -> Vec<(Hash, &CellSlot, bool)> {
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable();
        changed.dedup();
        let mut created = std::mem::take(&mut self.created);
        created.sort_unstable();
        changed.into_iter().map(|p| (p, &self.cells[&p], created.binary_search(&p).is_ok())).collect()
    }

    /// Restores a cell read back from the store (no fold is re-run).
    pub fn restore(&mut self, path: Hash, entity: String, key: Vec<u8>, cell: Cell) {
        assert_eq!(cell_path(&entity, &key), path, "a stored cell sits at its own path");
        let leaf = self.smt.insert(path, cell_leaf(&path, &cell));
        self.cells.insert(path, CellSlot { entity, key, cell, leaf });
    }
}

fn keep_greater(current: &mut Option<Lww>, candidate: Lww) {
    match current {
        Some(c) if *c >= candidate => {}
        _ => *current = Some(candidate),
    }
}
