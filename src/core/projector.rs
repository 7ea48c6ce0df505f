//! The fold of every scope (SPEC §8): projections, scope roots, the
//! convergence check, and the projection's share of a commit (changed
//! cells, the scope records with their divergence counts).
//!
//! Its input is the sequence of data ops the engine applied (`Fold`), in
//! apply order: the fold is a pure function of that sequence, and nothing
//! the engine decides depends on a cell or a root. So the projector runs
//! either inside the engine (`Engine::new`: the synchronous driver, the
//! tests, `import`), or after it on a thread of its own (`Engine::
//! take_projector`: the node's pipeline), where it folds commit N while the
//! orderer judges N+1. Either way each commit is finished by
//! [`Projector::finish_commit`] before it is written.
//!
//! Nothing in it crosses scopes: a scope's projection, its checks, its
//! divergences and its writes (cells, items, record, all keyed by the
//! scope) depend on its own folds alone. So the node splits it by scope
//! into shards (`split`, `shard_of`), one thread each, which fold their
//! scopes' part of every commit side by side.
//!
//! It is two sides, which the node may run on two threads, one after the
//! other over each commit (`into_sides`): the cells (`FoldSide`: the fold
//! of the actions, the leaves they change, the cells' and items' writes)
//! and the trees (`TreeSide`: the leaves set, the roots, the convergence
//! checks and divergence counts, the scope records). What passes from the
//! first to the second is a `TreeLog`: per fold, in fold order, its scope,
//! its leaves and its check. `Projector` is the two on one thread, each
//! fold passed on at once.

use super::commit::{Check, Commit, Fold};
use super::map_bytes;
use super::projection::{set_leaves, Cells, LeafChange};
use super::smt::{Smt, TogetherScratch};
use super::tables::{item_cell_write, item_entity_write, scope_meta_key, Cf, Write};
use crate::protocol::{encode, Action, Hash, PublicKey, ZERO};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProjectorStats {
    /// Convergence checks made, and those that failed.
    pub root_checks: u64,
    pub divergences: u64,
}

#[derive(Default)]
struct ScopeCells {
    cells: Cells,
    /// Entities whose index record (`Cf::Items`) this run has written, so
    /// that a new cell of one writes only its own record. Not restored:
    /// after a restart an entity's record is put once more (the same key,
    /// empty value: harmless). Cleared beyond `INDEXED_ENTITIES_MAX`.
    indexed: std::collections::HashSet<String>,
}

#[derive(Default)]
struct ScopeTree {
    smt: Smt,
    divergences: u64,
}

/// Writes a commit's part is sized for ahead, at most (`finish_commit`).
const WRITES_PRESIZED_MAX: usize = 1 << 16;

/// Entities remembered as indexed per scope, at most: a scope of many
/// entities forgets them all and puts their records again as it goes.
const INDEXED_ENTITIES_MAX: usize = 1024;

/// Convergence checks left outstanding at most: their roots are computed
/// together, the tree's batches (`MARKS_MAX` in `smt`) being the bound
/// that matters.
const CHECKS_OUTSTANDING_MAX: usize = 4096;

/// A log's room kept between commits, at most: ~0.5 MB of folds and
/// ~0.6 MB of leaves (`TreeLog::clear`).
const LOG_FOLDS_KEPT_MAX: usize = 1 << 12;
const LOG_LEAVES_KEPT_MAX: usize = 1 << 13;

/// The cells of every scope: the fold of the actions.
#[derive(Default)]
pub struct FoldSide {
    scopes: super::IdMap<Hash, ScopeCells>,
    /// Scopes whose cells changed since the last `finish_commit`.
    touched: Vec<Hash>,
}

/// The folds the fold side has folded and the tree side has not yet
/// taken, in fold order: each one's scope, the end of its leaves in
/// `leaves`, its check.
#[derive(Default)]
pub struct TreeLog {
    folds: Vec<(Hash, usize, Option<Check>)>,
    leaves: Vec<LeafChange>,
    /// Folds taken by the tree side.
    taken: usize,
}

/// The trees of every scope: the roots, the convergence checks, the
/// divergence counts.
#[derive(Default)]
pub struct TreeSide {
    scopes: super::IdMap<Hash, ScopeTree>,
    /// Convergence checks whose roots are not computed yet, in fold order:
    /// a chain's checks are computed together (`Smt::checkpoint`).
    checks: Vec<(Hash, Check)>,
    /// Roots of those checks, by scope, while they are compared.
    roots: super::IdMap<Hash, std::collections::VecDeque<Hash>>,
    /// `roots`' lists, kept between commits.
    together: TogetherScratch,
    pub stats: ProjectorStats,
}

/// Both sides on one thread.
#[derive(Default)]
pub struct Projector {
    fold: FoldSide,
    tree: TreeSide,
    log: TreeLog,
}

/// The shard of `scope` among `shards`: its id's first eight bytes (LE)
/// modulo the count. Stable (a function of the id alone, the same in every
/// process and release: a scope's state is moved to its shard once, at
/// start), and even, ids being hashes.
pub fn shard_of(scope: &Hash, shards: usize) -> usize {
    assert!(shards >= 1, "at least one shard");
    let head = u64::from_le_bytes(scope[..8].try_into().expect("eight bytes"));
    (head % shards as u64) as usize
}

impl TreeLog {
    /// Folds in the log, taken or not.
    pub fn len(&self) -> usize {
        self.folds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.folds.is_empty()
    }

    /// Empties the log, every fold taken, keeping its room up to a bound
    /// (a commit of 4,096 ops of two cells each fits; one of a few huge
    /// payloads is not kept for every commit after it).
    pub fn clear(&mut self) {
        assert_eq!(self.taken, self.folds.len(), "every fold of the log taken");
        self.folds.clear();
        self.leaves.clear();
        self.folds.shrink_to(LOG_FOLDS_KEPT_MAX);
        self.leaves.shrink_to(LOG_LEAVES_KEPT_MAX);
        self.taken = 0;
    }
}

impl FoldSide {
    /// Folds one applied data op into its scope's cells, and logs its
    /// leaves and check for the tree side.
    pub fn fold(&mut self, f: Fold, log: &mut TreeLog) {
        let p = self.scopes.entry(f.scope).or_default();
        if !f.actions.is_empty() {
            p.cells.apply(f.hlc, &f.author, &f.actions, &mut log.leaves);
            self.touched.push(f.scope);
        }
        log.folds.push((f.scope, log.leaves.len(), f.check));
    }

    /// The leaves one more data op by `author` at `hlc` with these actions
    /// would set in `scope`, without folding it (`Cells::leaves_after`).
    pub fn leaves_after(&self, scope: &Hash, hlc: u64, author: &PublicKey, actions: &[Action]) -> Vec<(Hash, Hash)> {
        match self.scopes.get(scope) {
            Some(p) => p.cells.leaves_after(hlc, author, actions),
            None => Cells::default().leaves_after(hlc, author, actions),
        }
    }

    /// Bytes of memory the cells of every scope hold (`Cells::heap_bytes`,
    /// the entities remembered as indexed, the map of scopes), for the
    /// memory gauges: a walk over the scopes, not over their cells.
    pub fn heap_bytes(&self) -> u64 {
        let per_scope: u64 = self
            .scopes
            .values()
            .map(|p| {
                p.cells.heap_bytes()
                    + map_bytes::<String, ()>(p.indexed.capacity())
                    + p.indexed.iter().map(|e| e.len() as u64).sum::<u64>()
            })
            .sum();
        per_scope + map_bytes::<Hash, ScopeCells>(self.scopes.capacity()) + (self.touched.capacity() * 32) as u64
    }

    /// Cells in a scope.
    pub fn cells(&self, scope: &Hash) -> usize {
        self.scopes.get(scope).map_or(0, |p| p.cells.len())
    }

    /// Restores a cell read back from the store: its leaf, for the tree.
    pub fn restore_cell(&mut self, scope: Hash, path: Hash, entity: String, key: Vec<u8>, cell: crate::protocol::Cell) -> LeafChange {
        self.scopes.entry(scope).or_default().cells.restore(path, entity, key, cell)
    }

    /// Adds the cells changed since the last call to `writes`, with the
    /// index records of the created ones.
    pub fn finish_commit(&mut self, writes: &mut Vec<Write>) {
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable();
        touched.dedup();
        // Sized up front: grown by doubling from the few writes the
        // commit's part brings, the list was copied again at each step
        // (~4% of the projector in causal).
        let more: usize = touched.iter().map(|s| self.scopes.get(s).map_or(0, |p| p.cells.writes_max())).sum();
        writes.reserve(more.min(WRITES_PRESIZED_MAX));
        // An entity's record once, not once per new cell of it (the API's
        // writes make a new cell each, in one entity; a scope's ops, each
        // in its own commit, mostly add cells to entities it has).
        for scope in &touched {
            let p = self.scopes.get_mut(scope).expect("a touched scope is projected");
            for (path, slot, created) in p.cells.take_changed() {
                if created {
                    if !p.indexed.contains(&slot.entity) {
                        if p.indexed.len() >= INDEXED_ENTITIES_MAX {
                            p.indexed.clear();
                        }
                        p.indexed.insert(slot.entity.clone());
                        writes.push(item_entity_write(scope, &slot.entity));
                    }
                    writes.push(item_cell_write(scope, &slot.entity, &slot.key));
                }
                let key = [scope.as_slice(), path.as_slice()].concat();
                // borsh of (entity, key, cell), without cloning them.
                let mut val = Vec::with_capacity(16 + slot.entity.len() + slot.key.len() + 64);
                borsh::BorshSerialize::serialize(&slot.entity, &mut val).expect("Vec write");
                borsh::BorshSerialize::serialize(&slot.key, &mut val).expect("Vec write");
                borsh::BorshSerialize::serialize(&slot.cell, &mut val).expect("Vec write");
                writes.push(Write::Put(Cf::Projection, key, val));
            }
        }
        touched.clear();
        self.touched = touched;
    }
}

impl TreeSide {
    /// Bytes of memory the trees of every scope hold (`Smt::heap_bytes`,
    /// the map of scopes, the checks outstanding), for the memory gauges.
    pub fn heap_bytes(&self) -> u64 {
        let trees: u64 = self.scopes.values().map(|p| p.smt.heap_bytes()).sum();
        let roots: u64 = self.roots.values().map(|r| (r.capacity() * 32) as u64).sum();
        trees
            + map_bytes::<Hash, ScopeTree>(self.scopes.capacity())
            + (self.checks.capacity() * std::mem::size_of::<(Hash, Check)>()) as u64
            + map_bytes::<Hash, std::collections::VecDeque<Hash>>(self.roots.capacity())
            + roots
    }

    /// Takes the log's folds up to the first `until` (their leaves set,
    /// their checks queued), those before taken already.
    pub fn take(&mut self, log: &mut TreeLog, until: usize) {
        let until = until.min(log.folds.len());
        let mut from = if log.taken == 0 { 0 } else { log.folds[log.taken - 1].1 };
        for i in log.taken..until {
            let (scope, end, check) = log.folds[i];
            let p = self.scopes.entry(scope).or_default();
            set_leaves(&mut p.smt, &log.leaves[from..end]);
            from = end;
            if let Some(check) = check {
                p.smt.checkpoint();
                self.checks.push((scope, check));
                if self.checks.len() >= CHECKS_OUTSTANDING_MAX {
                    self.settle();
                }
            }
        }
        log.taken = log.taken.max(until);
    }

    /// Makes the outstanding convergence checks, in fold order; returns the
    /// divergences found (each counted and logged, never a reason to drop,
    /// §8).
    pub fn settle(&mut self) -> u64 {
        if self.checks.is_empty() {
            return 0;
        }
        let mut found = 0;
        let mut roots = std::mem::take(&mut self.roots);
        for (scope, check) in std::mem::take(&mut self.checks) {
            let p = self.scopes.get_mut(&scope).expect("a checked scope is projected");
            let queue = roots.entry(scope).or_default();
            if queue.is_empty() {
                let mut v = Vec::new();
                p.smt.take_checkpoint_roots(&mut v);
                queue.extend(v);
            }
            let root = queue.pop_front().expect("one root per checkpoint");
            self.stats.root_checks += 1;
            if root == check.root {
                continue;
            }
            p.divergences += 1;
            self.stats.divergences += 1;
            found += 1;
            eprintln!(
                "dagfold: divergence in scope {} after op {}: local root {}, author's {}",
                hex::encode(scope),
                hex::encode(check.op),
                hex::encode(root),
                hex::encode(check.root)
            );
        }
        debug_assert!(roots.values().all(|q| q.is_empty()), "every checkpoint's root compared");
        roots.clear();
        self.roots = roots;
        found
    }

    /// The scope root (ZERO for a scope with no cells).
    pub fn root(&mut self, scope: &Hash) -> Hash {
        self.settle();
        self.scopes.get_mut(scope).map_or(ZERO, |p| p.smt.root())
    }

    /// The roots of `scopes`, in order, as `root` gives each: the rehash
    /// of all their trees done together (`Smt::roots_together`), for the
    /// statuses of the scopes a commit touched.
    pub fn roots(&mut self, scopes: &[Hash], out: &mut Vec<Hash>) {
        self.settle();
        out.clear();
        // The trees leave the map for the call (each once: a scope listed
        // twice, or with no cells, is found missing) and go back after.
        let mut taken: Vec<(Hash, ScopeTree)> = scopes.iter().filter_map(|s| self.scopes.remove_entry(s)).collect();
        let mut trees: Vec<&mut Smt> = taken.iter_mut().map(|(_, t)| &mut t.smt).collect();
        Smt::roots_together(&mut trees, &mut self.together, out);
        if taken.len() != scopes.len() {
            let of: super::IdMap<Hash, Hash> = taken.iter().map(|(s, _)| *s).zip(out.iter().copied()).collect();
            *out = scopes.iter().map(|s| of.get(s).copied().unwrap_or(ZERO)).collect();
        }
        self.scopes.extend(taken);
    }

    /// The scope root with these leaves set (`FoldSide::leaves_after`),
    /// the tree left as it is. A scope not projected yet has no cells, so
    /// it is the root of those leaves alone.
    pub fn root_with(&mut self, scope: &Hash, leaves: &[(Hash, Hash)]) -> Hash {
        self.settle();
        match self.scopes.get_mut(scope) {
            Some(p) => p.smt.root_with(leaves),
            None => Smt::default().root_with(leaves),
        }
    }

    /// Divergences found in a scope since it was created.
    pub fn divergences(&mut self, scope: &Hash) -> u64 {
        self.settle();
        self.scopes.get(scope).map_or(0, |p| p.divergences)
    }

    /// Restores a leaf of a cell read back from the store.
    pub fn restore_leaf(&mut self, scope: Hash, leaf: LeafChange) {
        set_leaves(&mut self.scopes.entry(scope).or_default().smt, &[leaf]);
    }

    /// Restores a scope's divergence count read back from its record.
    pub fn restore_divergences(&mut self, scope: Hash, divergences: u64) {
        self.scopes.entry(scope).or_default().divergences = divergences;
    }

    /// Adds the engine's scope records (`Commit::records`) to a commit's
    /// writes, with their divergence counts, once its folds are taken.
    pub fn finish_commit(&mut self, c: &mut Commit) {
        self.settle();
        for (scope, mut rec) in c.records.drain(..) {
            rec.divergences = self.divergences(&scope);
            c.writes.push(Write::Put(Cf::Meta, scope_meta_key(&scope), encode(&rec)));
        }
    }
}

impl Projector {
    /// Splits into `shards` projectors, the `i`-th holding the scopes with
    /// `shard_of(scope) == i` (the counts of `stats` go to the first). Call
    /// between commits; each shard then folds only its scopes' folds, in
    /// their order, and together they give what this one would have.
    pub fn split(mut self, shards: usize) -> Vec<Projector> {
        assert!(self.fold.touched.is_empty(), "between commits");
        self.settle();
        let mut parts: Vec<Projector> = (0..shards).map(|_| Projector::default()).collect();
        parts[0].tree.stats = self.tree.stats;
        for (scope, p) in self.fold.scopes.drain() {
            parts[shard_of(&scope, shards)].fold.scopes.insert(scope, p);
        }
        for (scope, p) in self.tree.scopes.drain() {
            parts[shard_of(&scope, shards)].tree.scopes.insert(scope, p);
        }
        parts
    }

    /// The two sides, to run on two threads: each commit's folds through
    /// `FoldSide::fold` into a log, then `TreeSide::take` of it. Call
    /// between commits.
    pub fn into_sides(mut self) -> (FoldSide, TreeSide) {
        assert!(self.fold.touched.is_empty(), "between commits");
        self.settle();
        (self.fold, self.tree)
    }

    pub fn stats(&self) -> ProjectorStats {
        self.tree.stats
    }

    /// Folds one applied data op. Its convergence check, if any, is made by
    /// the next `settle` (or whatever reads a root or a count: `root`,
    /// `divergences`, `finish_commit`), with those of the ops after it.
    pub fn fold(&mut self, f: Fold) {
        self.fold.fold(f, &mut self.log);
        self.tree.take(&mut self.log, usize::MAX);
        self.log.clear();
    }

    /// See `TreeSide::settle`.
    pub fn settle(&mut self) -> u64 {
        self.tree.settle()
    }

    /// The scope root (ZERO for a scope with no cells).
    pub fn root(&mut self, scope: &Hash) -> Hash {
        self.tree.root(scope)
    }

    /// The scope root after one more data op by `author` at `hlc` with
    /// these actions, without folding it: the `root_hash` an op authored
    /// here carries (§8).
    pub fn root_after(&mut self, scope: &Hash, hlc: u64, author: &PublicKey, actions: &[Action]) -> Hash {
        let leaves = self.fold.leaves_after(scope, hlc, author, actions);
        self.tree.root_with(scope, &leaves)
    }

    /// Divergences found in a scope since it was created.
    pub fn divergences(&mut self, scope: &Hash) -> u64 {
        self.tree.divergences(scope)
    }

    /// Cells in a scope.
    pub fn cells(&self, scope: &Hash) -> usize {
        self.fold.cells(scope)
    }

    /// Restores a cell read back from the store (no fold is re-run).
    pub fn restore_cell(&mut self, scope: Hash, path: Hash, entity: String, key: Vec<u8>, cell: crate::protocol::Cell) {
        let leaf = self.fold.restore_cell(scope, path, entity, key, cell);
        self.tree.restore_leaf(scope, leaf);
    }

    /// Restores a scope's divergence count read back from its record.
    pub fn restore_divergences(&mut self, scope: Hash, divergences: u64) {
        self.tree.restore_divergences(scope, divergences);
    }

    /// Adds the projection's writes to a commit whose folds are all folded:
    /// the cells changed since the last call, then the engine's scope
    /// records (`Commit::records`) with their divergence counts (the order
    /// the two sides add them in on two threads).
    pub fn finish_commit(&mut self, c: &mut Commit) {
        debug_assert!(c.folds.is_empty(), "a commit is finished once its folds are folded");
        self.fold.finish_commit(&mut c.writes);
        self.tree.finish_commit(c);
    }
}
#[cfg(test)]
mod tests {
    use super::super::projection::Projection;
    use super::super::tables::ScopeRecord;
    use super::*;

    /// A scope's record as the engine makes it in round `round`.
    fn record(round: u64) -> ScopeRecord {
        ScopeRecord { genesis_applied: true, gov_heads: vec![], data_heads: vec![[round as u8; 32]], applied: round, divergences: 0, event_seq: round }
    }

    /// `root_after` of a projected scope and of one not projected yet, with
    /// a check outstanding, against the root after the fold.
    #[test]
    fn root_after_equals_the_root_after_the_fold() {
        let scope = [7u8; 32];
        let put = |k: u8| Action::Put { entity: "e".into(), key: vec![k], value: vec![k] };
        let fold = |hlc, actions: Vec<Action>, check| Fold { scope, hlc, author: [1; 32], actions, check };
        let mut p = Projector::default();
        let mut alone = Projection::default();
        alone.apply(1, &[1; 32], &[put(0), put(1)]);
        assert_eq!(p.root_after(&scope, 1, &[1; 32], &[put(0), put(1)]), alone.root());
        assert_eq!(p.root(&scope), ZERO);
        assert_eq!(p.cells(&scope), 0);
        p.fold(fold(1, vec![put(0), put(1)], None));
        let want = alone.root();
        p.fold(fold(2, vec![], Some(Check { op: [0; 32], root: want })));
        let after = p.root_after(&scope, 3, &[1; 32], &[put(1), put(2)]);
        assert_eq!(p.stats().root_checks, 1, "the outstanding check made first");
        assert_eq!(p.stats().divergences, 0);
        assert_eq!(p.root(&scope), want);
        p.fold(fold(3, vec![put(1), put(2)], None));
        assert_eq!(p.root(&scope), after);
    }

    /// New cells index their entity once, and each cell once; a later
    /// commit's new cell of the entity indexes only itself, a changed cell
    /// nothing.
    #[test]
    fn an_entity_with_new_cells_is_indexed_once() {
        let put = |entity: &str, k: u8| Action::Put { entity: entity.into(), key: vec![k], value: vec![k] };
        let fold = |scope, actions: Vec<Action>| Fold { scope, hlc: 1, author: [1; 32], actions, check: None };
        let items = |c: &Commit| -> Vec<Vec<u8>> {
            c.writes.iter().filter_map(|w| if let Write::Put(Cf::Items, k, _) = w { Some(k.clone()) } else { None }).collect()
        };
        let (s1, s2) = ([7u8; 32], [8u8; 32]);
        let mut p = Projector::default();
        p.fold(fold(s1, vec![put("e", 0), put("e", 1), put("f", 2)]));
        p.fold(fold(s1, vec![put("e", 3)]));
        p.fold(fold(s2, vec![put("e", 0)]));
        let mut c = Commit::default();
        p.finish_commit(&mut c);
        let mut got = items(&c);
        got.sort();
        let mut want: Vec<Vec<u8>> = vec![
            item_entity_write(&s1, "e"),
            item_entity_write(&s1, "f"),
            item_entity_write(&s2, "e"),
            item_cell_write(&s1, "e", &[0]),
            item_cell_write(&s1, "e", &[1]),
            item_cell_write(&s1, "e", &[3]),
            item_cell_write(&s1, "f", &[2]),
            item_cell_write(&s2, "e", &[0]),
        ]
        .into_iter()
        .map(|w| if let Write::Put(_, k, _) = w { k } else { unreachable!() })
        .collect();
        want.sort();
        assert_eq!(got, want);
        p.fold(fold(s1, vec![put("e", 0), put("e", 4)]));
        let mut c = Commit::default();
        p.finish_commit(&mut c);
        let key = |w| if let Write::Put(_, k, _) = w { k } else { unreachable!() };
        assert_eq!(items(&c), vec![key(item_cell_write(&s1, "e", &[4]))]);
        // A new entity in a later commit is indexed, and a scope that
        // forgot its entities (a restart, or too many) indexes them again.
        p.fold(fold(s1, vec![put("g", 5)]));
        let mut c = Commit::default();
        p.finish_commit(&mut c);
        assert_eq!(items(&c), vec![key(item_entity_write(&s1, "g")), key(item_cell_write(&s1, "g", &[5]))]);
        let mut restarted = Projector::default();
        restarted.fold(fold(s1, vec![put("e", 6)]));
        let mut c = Commit::default();
        restarted.finish_commit(&mut c);
        assert_eq!(items(&c), vec![key(item_entity_write(&s1, "e")), key(item_cell_write(&s1, "e", &[6]))]);
    }

    /// A scope's shard is a function of its id alone: these values are
    /// what every release computes, so a store's scopes land where they
    /// did before.
    #[test]
    fn shard_of_is_stable() {
        let mut scope = [0u8; 32];
        scope[..8].copy_from_slice(&1_000_003u64.to_le_bytes());
        scope[8..].fill(0xff);
        assert_eq!([1, 2, 3, 4, 7, 64].map(|n| shard_of(&scope, n)), [0, 1, 1, 3, 4, 3]);
        let ids: Vec<Hash> = (0u32..4096).map(|i| crate::protocol::crypto::sha256(&i.to_le_bytes())).collect();
        let mut counts = [0u32; 4];
        for id in &ids {
            counts[shard_of(id, 4)] += 1;
        }
        assert!(counts.iter().all(|&c| (900..1150).contains(&c)), "even over hashed ids: {counts:?}");
    }

    /// Folds of many scopes through one projector and through three
    /// shards of a projector split after the first commit: the same
    /// writes (as sets: the shards' keys are disjoint), roots and
    /// divergence counts.
    #[test]
    fn shards_fold_as_one_projector() {
        let scopes: Vec<Hash> = (0u8..12).map(|i| crate::protocol::crypto::sha256(&[i])).collect();
        let put = |k: u64| Action::Put { entity: "e".into(), key: k.to_le_bytes().to_vec(), value: vec![k as u8] };
        let commit = |round: u64| {
            let mut c = Commit::default();
            for (i, scope) in scopes.iter().enumerate() {
                let hlc = round * 100 + i as u64;
                // Every third scope checks a wrong root: a divergence.
                let check = (round % 2 == 1 && i % 3 == 0).then_some(Check { op: [i as u8; 32], root: [9; 32] });
                c.folds.push(Fold { scope: *scope, hlc, author: [1; 32], actions: vec![put(hlc % 7), put(hlc)], check });
                c.records.push((*scope, record(round)));
            }
            c
        };
        let finish = |ps: &mut [Projector], mut c: Commit| {
            let n = ps.len();
            for f in std::mem::take(&mut c.folds) {
                ps[shard_of(&f.scope, n)].fold(f);
            }
            let mut writes = Vec::new();
            for (i, p) in ps.iter_mut().enumerate() {
                let mut part = Commit { records: c.records.iter().filter(|(s, _)| shard_of(s, n) == i).cloned().collect(), ..Default::default() };
                p.finish_commit(&mut part);
                writes.extend(part.writes.into_iter().map(|w| format!("{w:?}")));
            }
            writes.sort();
            writes
        };
        let mut one = vec![Projector::default()];
        let mut first = Projector::default();
        assert_eq!(finish(std::slice::from_mut(&mut first), commit(0)), finish(&mut one, commit(0)));
        let mut three = first.split(3);
        assert!(three.iter().all(|p| !p.fold.scopes.is_empty()), "twelve scopes over three shards");
        for round in 1..6 {
            assert_eq!(finish(&mut three, commit(round)), finish(&mut one, commit(round)), "round {round}");
        }
        for scope in &scopes {
            let s = &mut three[shard_of(scope, 3)];
            assert_eq!((s.root(scope), s.divergences(scope)), (one[0].root(scope), one[0].divergences(scope)));
        }
        let divergences: u64 = three.iter().map(|p| p.stats().divergences).sum();
        assert_eq!((divergences, one[0].stats().divergences), (12, 12));
    }

    /// The two sides apart, as the node's two threads run them (a commit's
    /// folds all through the cells, then the log through the trees, the
    /// roots of drafts asked at their points in between), against one
    /// projector folding the same ops one by one: the same writes in the
    /// same order, roots at each point, and divergence counts.
    #[test]
    fn the_sides_apart_fold_as_one_projector() {
        let scopes: Vec<Hash> = (0u8..3).map(|i| crate::protocol::crypto::sha256(&[i])).collect();
        let put = |k: u64| Action::Put { entity: "e".into(), key: (k % 40).to_le_bytes().to_vec(), value: k.to_le_bytes().to_vec() };
        let mut one = Projector::default();
        let (mut cells, mut trees) = Projector::default().into_sides();
        let mut log = TreeLog::default();
        for round in 0..8u64 {
            let mut folds = Vec::new();
            let mut records = Vec::new();
            for i in 0..30u64 {
                let scope = scopes[(i % 3) as usize];
                let hlc = round * 100 + i;
                let actions = if i % 7 == 0 { vec![] } else { vec![put(hlc), put(hlc * 3)] };
                // Every fifth op checks; one in four of those a wrong root.
                let check = (i % 5 == 0).then_some(Check { op: [i as u8; 32], root: if i % 20 == 0 { [9; 32] } else { ZERO } });
                folds.push(Fold { scope, hlc, author: [1; 32], actions, check });
            }
            for scope in &scopes {
                records.push((*scope, record(round)));
            }
            // A check's root is the one projector's, so that most agree.
            let mut want_roots = Vec::new();
            for (at, f) in folds.iter_mut().enumerate() {
                if at % 6 == 0 {
                    want_roots.push(one.root_after(&f.scope, 1_000 + at as u64, &[2; 32], &[put(at as u64)]));
                }
                if let Some(c) = &mut f.check {
                    if c.root == ZERO {
                        c.root = one.root_after(&f.scope, f.hlc, &f.author, &f.actions);
                    }
                }
                one.fold(f.clone());
            }
            let mut want = Commit { records: records.clone(), ..Default::default() };
            one.finish_commit(&mut want);
            // The sides: the cells first, with each draft's leaves at its point.
            let mut leaves = Vec::new();
            for (at, f) in folds.iter().enumerate() {
                if at % 6 == 0 {
                    leaves.push((at, cells.leaves_after(&f.scope, 1_000 + at as u64, &[2; 32], &[put(at as u64)])));
                }
                cells.fold(f.clone(), &mut log);
            }
            let mut got = Commit { records, ..Default::default() };
            cells.finish_commit(&mut got.writes);
            let mut got_roots = Vec::new();
            for (at, l) in &leaves {
                trees.take(&mut log, *at);
                got_roots.push(trees.root_with(&folds[*at].scope, l));
            }
            trees.take(&mut log, usize::MAX);
            log.clear();
            trees.finish_commit(&mut got);
            assert_eq!(got_roots, want_roots, "round {round}: the drafts' roots");
            assert_eq!(format!("{:?}", got.writes), format!("{:?}", want.writes), "round {round}: the writes");
            // The statuses' roots, together: each scope once (as the
            // orderer asks), or listed twice and with a scope of no cells.
            let asked = if round % 2 == 0 { scopes.clone() } else { vec![scopes[2], [7; 32], scopes[0], scopes[2], scopes[1]] };
            let mut roots = Vec::new();
            trees.roots(&asked, &mut roots);
            assert_eq!(roots, asked.iter().map(|s| one.root(s)).collect::<Vec<_>>(), "round {round}: the statuses' roots");
            for scope in &scopes {
                assert_eq!(trees.root(scope), one.root(scope));
            }
        }
        assert_eq!(trees.stats, one.stats());
        assert_eq!(one.stats().divergences, 8 * 2, "the wrong roots, and only them");
    }
}
