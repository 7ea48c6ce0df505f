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

use super::commit::{Check, Commit, Fold};
use super::projection::Projection;
use super::tables::{item_cell_write, item_entity_write, scope_meta_key, Cf, Write};
use crate::protocol::{encode, Action, Hash, PublicKey, ZERO};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProjectorStats {
    /// Convergence checks made, and those that failed.
    pub root_checks: u64,
    pub divergences: u64,
}

#[derive(Default)]
struct Projected {
    projection: Projection,
    divergences: u64,
    /// Entities whose index record (`Cf::Items`) this run has written, so
    /// that a new cell of one writes only its own record. Not restored:
    /// after a restart an entity's record is put once more (the same key,
    /// empty value: harmless). Cleared beyond `INDEXED_ENTITIES_MAX`.
    indexed: std::collections::HashSet<String>,
}

/// Writes a commit's part is sized for ahead, at most (`finish_commit`).
const WRITES_PRESIZED_MAX: usize = 1 << 16;

/// Entities remembered as indexed per scope, at most: a scope of many
/// entities forgets them all and puts their records again as it goes.
const INDEXED_ENTITIES_MAX: usize = 1024;

#[derive(Default)]
pub struct Projector {
    scopes: super::IdMap<Hash, Projected>,
    /// Scopes whose cells changed since the last `finish_commit`.
    touched: Vec<Hash>,
    /// Convergence checks whose roots are not computed yet, in fold order:
    /// a chain's checks are computed together (`Smt::checkpoint`).
    checks: Vec<(Hash, Check)>,
    /// Roots of those checks, by scope, while they are compared.
    roots: super::IdMap<Hash, std::collections::VecDeque<Hash>>,
    pub stats: ProjectorStats,
}

/// Convergence checks left outstanding at most: their roots are computed
/// together, the tree's batches (`MARKS_MAX` in `smt`) being the bound
/// that matters.
const CHECKS_OUTSTANDING_MAX: usize = 4096;

/// The shard of `scope` among `shards`: its id's first eight bytes (LE)
/// modulo the count. Stable (a function of the id alone, the same in every
/// process and release: a scope's state is moved to its shard once, at
/// start), and even, ids being hashes.
pub fn shard_of(scope: &Hash, shards: usize) -> usize {
    assert!(shards >= 1, "at least one shard");
    let head = u64::from_le_bytes(scope[..8].try_into().expect("eight bytes"));
    (head % shards as u64) as usize
}

impl Projector {
    /// Splits into `shards` projectors, the `i`-th holding the scopes with
    /// `shard_of(scope) == i` (the counts of `stats` go to the first). Call
    /// between commits; each shard then folds only its scopes' folds, in
    /// their order, and together they give what this one would have.
    pub fn split(mut self, shards: usize) -> Vec<Projector> {
        assert!(self.touched.is_empty(), "between commits");
        self.settle();
        let mut parts: Vec<Projector> = (0..shards).map(|_| Projector::default()).collect();
        parts[0].stats = self.stats;
        for (scope, p) in self.scopes.drain() {
            parts[shard_of(&scope, shards)].scopes.insert(scope, p);
        }
        parts
    }

    /// Folds one applied data op. Its convergence check, if any, is made by
    /// the next `settle` (or whatever reads a root or a count: `root`,
    /// `divergences`, `finish_commit`), with those of the ops after it.
    pub fn fold(&mut self, f: Fold) {
        let p = self.scopes.entry(f.scope).or_default();
        if !f.actions.is_empty() {
            p.projection.apply(f.hlc, &f.author, &f.actions);
            self.touched.push(f.scope);
        }
        if let Some(check) = f.check {
            p.projection.checkpoint();
            self.checks.push((f.scope, check));
            if self.checks.len() >= CHECKS_OUTSTANDING_MAX {
                self.settle();
            }
        }
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
                p.projection.take_checkpoint_roots(&mut v);
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
        self.scopes.get_mut(scope).map_or(ZERO, |p| p.projection.root())
    }

    /// The scope root after one more data op by `author` at `hlc` with
    /// these actions, without folding it (`Projection::root_after`): the
    /// `root_hash` an op authored here carries (§8). A scope not projected
    /// yet has no cells, so it is the root of the op's cells alone.
    pub fn root_after(&mut self, scope: &Hash, hlc: u64, author: &PublicKey, actions: &[Action]) -> Hash {
        self.settle();
        match self.scopes.get_mut(scope) {
            Some(p) => p.projection.root_after(hlc, author, actions),
            None => Projection::default().root_after(hlc, author, actions),
        }
    }

    /// Divergences found in a scope since it was created.
    pub fn divergences(&mut self, scope: &Hash) -> u64 {
        self.settle();
        self.scopes.get(scope).map_or(0, |p| p.divergences)
    }

    /// Cells in a scope.
    pub fn cells(&self, scope: &Hash) -> usize {
        self.scopes.get(scope).map_or(0, |p| p.projection.len())
    }

    /// Restores a cell read back from the store (no fold is re-run).
    pub fn restore_cell(&mut self, scope: Hash, path: Hash, entity: String, key: Vec<u8>, cell: crate::protocol::Cell) {
        self.scopes.entry(scope).or_default().projection.restore(path, entity, key, cell);
    }

    /// Restores a scope's divergence count read back from its record.
    pub fn restore_divergences(&mut self, scope: Hash, divergences: u64) {
        self.scopes.entry(scope).or_default().divergences = divergences;
    }

    /// Adds the projection's writes to a commit whose folds are all folded:
    /// the cells changed since the last call, and the engine's scope
    /// records (`Commit::records`) with their divergence counts.
    pub fn finish_commit(&mut self, c: &mut Commit) {
        debug_assert!(c.folds.is_empty(), "a commit is finished once its folds are folded");
        self.settle();
        for (scope, mut rec) in c.records.drain(..) {
            rec.divergences = self.divergences(&scope);
            c.writes.push(Write::Put(Cf::Meta, scope_meta_key(&scope), encode(&rec)));
        }
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable();
        touched.dedup();
        // Sized up front: grown by doubling from the few writes the
        // commit's part brings, the list was copied again at each step
        // (~4% of the projector in causal).
        let writes: usize = touched.iter().map(|s| self.scopes.get(s).map_or(0, |p| p.projection.writes_max())).sum();
        c.writes.reserve(writes.min(WRITES_PRESIZED_MAX));
        // An entity's record once, not once per new cell of it (the API's
        // writes make a new cell each, in one entity; a scope's ops, each
        // in its own commit, mostly add cells to entities it has).
        for scope in &touched {
            let p = self.scopes.get_mut(scope).expect("a touched scope is projected");
            for (path, slot, created) in p.projection.take_changed() {
                if created {
                    if !p.indexed.contains(&slot.entity) {
                        if p.indexed.len() >= INDEXED_ENTITIES_MAX {
                            p.indexed.clear();
                        }
                        p.indexed.insert(slot.entity.clone());
                        c.writes.push(item_entity_write(scope, &slot.entity));
                    }
                    c.writes.push(item_cell_write(scope, &slot.entity, &slot.key));
                }
                let key = [scope.as_slice(), path.as_slice()].concat();
                // borsh of (entity, key, cell), without cloning them.
                let mut val = Vec::with_capacity(16 + slot.entity.len() + slot.key.len() + 64);
                borsh::BorshSerialize::serialize(&slot.entity, &mut val).expect("Vec write");
                borsh::BorshSerialize::serialize(&slot.key, &mut val).expect("Vec write");
                borsh::BorshSerialize::serialize(&slot.cell, &mut val).expect("Vec write");
                c.writes.push(Write::Put(Cf::Projection, key, val));
            }
        }
        touched.clear();
        self.touched = touched;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(p.stats.root_checks, 1, "the outstanding check made first");
        assert_eq!(p.stats.divergences, 0);
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
                c.records.push((*scope, super::super::tables::ScopeRecord {
                    genesis_applied: true,
                    gov_heads: vec![],
                    data_heads: vec![[round as u8; 32]],
                    applied: round,
                    divergences: 0,
                    event_seq: round,
                }));
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
        assert!(three.iter().all(|p| !p.scopes.is_empty()), "twelve scopes over three shards");
        for round in 1..6 {
            assert_eq!(finish(&mut three, commit(round)), finish(&mut one, commit(round)), "round {round}");
        }
        for scope in &scopes {
            let s = &mut three[shard_of(scope, 3)];
            assert_eq!((s.root(scope), s.divergences(scope)), (one[0].root(scope), one[0].divergences(scope)));
        }
        let divergences: u64 = three.iter().map(|p| p.stats.divergences).sum();
        assert_eq!((divergences, one[0].stats.divergences), (12, 12));
    }
}
