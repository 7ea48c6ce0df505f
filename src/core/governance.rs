//! The governance state at a cut, `G(C)` (SPEC §5), with a bounded cache.
//!
//! `G(C)` applies the actions of every op in `ancestors(C)` in ascending
//! `(depth, delta_id)` order. Only accepted governance ops are ever indexed
//! here, so `G(C)` depends on the set of ids alone. A single-op cut `{x}` is
//! derived from `G(parents(x))` when that is cached: `x` is deeper than all of
//! its ancestors, so it comes last in the order.
//!
//! Beside it, per scope, the keys ever made members by an indexed op (the
//! genesis author, `AddMember` targets): a key not among them is a member at
//! no cut of the scope, so its op is unauthorized without computing `G`
//! (`ever_member`). The cache of `G` at recent cuts evicts the least
//! recently used entry, one at a time, so a flood of distinct cuts cannot
//! flush the cuts honest ops use.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::limits::GOV_CUT_CACHE_MAX;
use crate::protocol::{GovAction, Hash, PublicKey, Role};

/// An accepted governance op (genesis included), as `G` needs it.
#[derive(Clone, Debug)]
pub struct GovNode {
    pub parents: Vec<Hash>,
    pub depth: u32,
    pub author: PublicKey,
    pub actions: Vec<GovAction>,
}

/// `G(C)` and `ancestors(C)`.
#[derive(Clone, Debug, Default)]
pub struct GovState {
    pub members: HashMap<PublicKey, Role>,
    pub kem: HashMap<PublicKey, [u8; 32]>,
    pub keyring: Vec<Hash>,
    pub ancestors: HashSet<Hash>,
}

impl GovState {
    pub fn current_key(&self) -> Option<&Hash> {
        self.keyring.last()
    }

    pub fn role(&self, member: &PublicKey) -> Option<Role> {
        self.members.get(member).copied()
    }

    fn apply(&mut self, author: &PublicKey, actions: &[GovAction]) {
        for a in actions {
            match a {
                GovAction::Genesis { first_key_id, .. } => {
                    self.members.insert(*author, Role::Admin);
                    self.keyring = vec![*first_key_id];
                }
                GovAction::AddMember { member, role, kem } => {
                    self.members.insert(*member, *role);
                    self.kem.insert(*member, *kem);
                }
                GovAction::RemoveMember { member } => {
                    self.members.remove(member);
                }
                GovAction::SetRole { member, role } => {
                    if let Some(r) = self.members.get_mut(member) {
                        *r = *role;
                    }
                }
                GovAction::RotateKey { key_id } => {
                    if !self.keyring.contains(key_id) {
                        self.keyring.push(*key_id);
                    }
                }
            }
        }
    }
}

#[derive(Default)]
pub struct Governance {
    nodes: super::IdMap<Hash, GovNode>,
    /// The scope of every indexed op whose scope is known: a genesis is its
    /// own scope, any other op is in its parents' (SPEC §6 step 2).
    scope_of: super::IdMap<Hash, Hash>,
    /// Indexed ops inserted before their first parent (restore and the
    /// pipeline's replica insert in no particular order), their scope found
    /// by `settle_scopes` before `members_ever` is next read.
    unscoped: Vec<Hash>,
    /// Per scope, every key an indexed op of it made a member (SPEC §5: only
    /// `Genesis` and `AddMember` add one), never removed. A superset of the
    /// members of `G(C)` for any cut `C` of the scope. Bounded by the
    /// accepted governance ops (one key per `AddMember`, one per genesis),
    /// which are bounded by what the scope's admins sign: a stranger adds
    /// nothing to it.
    members_ever: super::IdMap<Hash, super::IdSet<PublicKey>>,
    /// `G` at recent cuts, keyed by the cut as given.
    cache: CutCache,
    pub cache_hits: u64,
    pub cache_misses: u64,
}

impl Governance {
    /// Indexes an accepted governance op (its parents are accepted too, and
    /// indexed by the time `ever_member` or `state_at` is next called).
    pub fn insert(&mut self, id: Hash, node: GovNode) {
        let scope = match node.parents.first() {
            None => Some(id),
            Some(p) => self.scope_of.get(p).copied(),
        };
        match scope {
            Some(scope) => note_scope(&mut self.scope_of, &mut self.members_ever, id, &node, scope),
            None => self.unscoped.push(id),
        }
        self.nodes.insert(id, node);
    }

    /// Finds the scope of the ops inserted before their parents: follows
    /// first parents (a work list, no recursion) up to an op whose scope is
    /// known or to the genesis, then notes the whole path.
    fn settle_scopes(&mut self) {
        while let Some(id) = self.unscoped.pop() {
            let mut path = vec![id];
            let scope = loop {
                let last = *path.last().expect("non-empty");
                if let Some(s) = self.scope_of.get(&last) {
                    path.pop();
                    break *s;
                }
                match self.nodes[&last].parents.first() {
                    None => break last,
                    Some(p) => path.push(*p),
                }
            };
            for x in path {
                note_scope(&mut self.scope_of, &mut self.members_ever, x, &self.nodes[&x], scope);
            }
        }
    }

    /// Whether `key` was made a member of `scope` by any indexed op. If
    /// not, it is a member of `G(C)` for no cut `C` of the scope.
    pub fn ever_member(&mut self, scope: &Hash, key: &PublicKey) -> bool {
        if !self.unscoped.is_empty() {
            self.settle_scopes();
        }
        self.members_ever.get(scope).is_some_and(|m| m.contains(key))
    }

    pub fn nodes(&self) -> impl Iterator<Item = (&Hash, &GovNode)> {
        self.nodes.iter()
    }

    pub fn get(&self, id: &Hash) -> Option<&GovNode> {
        self.nodes.get(id)
    }

    pub fn depth_for_parents(&self, parents: &[Hash]) -> u32 {
        parents.iter().map(|p| self.nodes[p].depth + 1).max().unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `G(cut)`. Every id of `cut` must be an indexed (accepted) op.
    pub fn state_at(&mut self, cut: &[Hash]) -> Arc<GovState> {
        if let Some(s) = self.cache.get(cut) {
            self.cache_hits += 1;
            return s;
        }
        self.cache_misses += 1;
        let from_parents = match cut {
            [x] if !self.nodes[x].parents.is_empty() => self.cache.get(&self.nodes[x].parents).map(|g| (x, g)),
            _ => None,
        };
        let state = match from_parents {
            Some((x, g)) => {
                let node = &self.nodes[x];
                let mut s = (*g).clone();
                s.apply(&node.author, &node.actions);
                s.ancestors.insert(*x);
                s
            }
            None => self.compute(cut),
        };
        let state = Arc::new(state);
        self.cache.insert(cut.to_vec(), state.clone());
        state
    }

    /// `G(cut)` for a reader holding a shared lock (the API): from the cache
    /// if there, without touching its order, else computed and not kept.
    /// Every id of `cut` must be an indexed (accepted) op.
    pub fn state_at_shared(&self, cut: &[Hash]) -> Arc<GovState> {
        self.cache.peek(cut).unwrap_or_else(|| Arc::new(self.compute(cut)))
    }

    /// From scratch: collect the ancestors with a work list, sort, apply.
    fn compute(&self, cut: &[Hash]) -> GovState {
        let mut ancestors: HashSet<Hash> = HashSet::new();
        let mut work: Vec<Hash> = cut.to_vec();
        while let Some(id) = work.pop() {
            if ancestors.insert(id) {
                work.extend(self.nodes[&id].parents.iter().copied());
            }
        }
        let mut order: Vec<(u32, Hash)> = ancestors.iter().map(|id| (self.nodes[id].depth, *id)).collect();
        order.sort_unstable();
        let mut s = GovState::default();
        for (_, id) in &order {
            let n = &self.nodes[id];
            s.apply(&n.author, &n.actions);
        }
        s.ancestors = ancestors;
        s
    }
}

/// Notes the scope of indexed op `id` and the members it adds.
fn note_scope(
    scope_of: &mut super::IdMap<Hash, Hash>,
    members_ever: &mut super::IdMap<Hash, super::IdSet<PublicKey>>,
    id: Hash,
    node: &GovNode,
    scope: Hash,
) {
    scope_of.insert(id, scope);
    let members = members_ever.entry(scope).or_default();
    for a in &node.actions {
        match a {
            GovAction::Genesis { .. } => {
                members.insert(node.author);
            }
            GovAction::AddMember { member, .. } => {
                members.insert(*member);
            }
            _ => {}
        }
    }
}

/// `G` at up to `GOV_CUT_CACHE_MAX` cuts; when full, the least recently
/// used one goes. A cut used within the last `GOV_CUT_CACHE_MAX` distinct
/// cuts stays, so the cuts honest ops share (the current heads, a parent's
/// state for the single-op shortcut) outlive any flood of cuts used once,
/// and a miss costs one recomputation of its own cut, never of every cut at
/// once. (CLOCK would only set a bit on a hit, but a flood that marks its
/// own entries, as the single-op shortcut marks a parent's, turns it into
/// FIFO, which evicts the hot cut every `GOV_CUT_CACHE_MAX` misses.) The
/// use order is a doubly linked list through the slots: O(1) per use.
struct CutCache {
    index: super::IdMap<Vec<Hash>, u32>,
    slots: Vec<CutSlot>,
    /// The most and the least recently used slot (`NIL`: none).
    newest: u32,
    oldest: u32,
}

struct CutSlot {
    cut: Vec<Hash>,
    state: Arc<GovState>,
    newer: u32,
    older: u32,
}

const NIL: u32 = u32::MAX;
const _: () = assert!(GOV_CUT_CACHE_MAX >= 1 && GOV_CUT_CACHE_MAX < NIL as usize);

impl Default for CutCache {
    fn default() -> Self {
        CutCache { index: Default::default(), slots: Vec::new(), newest: NIL, oldest: NIL }
    }
}

impl CutCache {
    fn peek(&self, cut: &[Hash]) -> Option<Arc<GovState>> {
        self.index.get(cut).map(|&i| self.slots[i as usize].state.clone())
    }

    fn get(&mut self, cut: &[Hash]) -> Option<Arc<GovState>> {
        let i = *self.index.get(cut)?;
        if i != self.newest {
            self.unlink(i);
            self.push_newest(i);
        }
        Some(self.slots[i as usize].state.clone())
    }

    fn insert(&mut self, cut: Vec<Hash>, state: Arc<GovState>) {
        assert!(!self.index.contains_key(&cut), "inserting a cached cut");
        let slot = CutSlot { cut: cut.clone(), state, newer: NIL, older: NIL };
        let i = if self.slots.len() < GOV_CUT_CACHE_MAX {
            self.slots.push(slot);
            (self.slots.len() - 1) as u32
        } else {
            let i = self.oldest;
            self.unlink(i);
            let old = std::mem::replace(&mut self.slots[i as usize], slot);
            self.index.remove(&old.cut);
            i
        };
        self.push_newest(i);
        self.index.insert(cut, i);
        debug_assert_eq!(self.index.len(), self.slots.len());
    }

    fn unlink(&mut self, i: u32) {
        let CutSlot { newer, older, .. } = self.slots[i as usize];
        match newer {
            NIL => self.newest = older,
            n => self.slots[n as usize].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            o => self.slots[o as usize].newer = newer,
        }
    }

    fn push_newest(&mut self, i: u32) {
        let s = &mut self.slots[i as usize];
        s.newer = NIL;
        s.older = self.newest;
        match self.newest {
            NIL => self.oldest = i,
            n => self.slots[n as usize].newer = i,
        }
        self.newest = i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> Hash {
        let mut h = [0u8; 32];
        h[..4].copy_from_slice(&n.to_be_bytes());
        h[31] = 1;
        h
    }

    fn key(n: u8) -> PublicKey {
        [n; 32]
    }

    fn genesis(author: PublicKey) -> GovNode {
        GovNode { parents: vec![], depth: 0, author, actions: vec![GovAction::Genesis { name: String::new(), first_key_id: [1; 32] }] }
    }

    fn add(parent: Hash, depth: u32, author: PublicKey, member: PublicKey) -> GovNode {
        GovNode { parents: vec![parent], depth, author, actions: vec![GovAction::AddMember { member, role: Role::Writer, kem: [0; 32] }] }
    }

    /// A chain of `n` ops after a genesis, ids 1..=n after the genesis's 0.
    fn chain(n: u32) -> Governance {
        let mut g = Governance::default();
        g.insert(id(0), genesis(key(1)));
        for i in 1..=n {
            g.insert(id(i), add(id(i - 1), i, key(1), key(2)));
        }
        g
    }

    /// After `GOV_CUT_CACHE_MAX + 1` distinct cuts, only the first is gone:
    /// the most recent `GOV_CUT_CACHE_MAX` are all hits.
    #[test]
    fn the_cut_cache_evicts_one_entry_at_a_time() {
        let n = GOV_CUT_CACHE_MAX as u32 + 1;
        let mut g = chain(n);
        for i in 1..=n {
            g.state_at(&[id(i)]);
        }
        assert_eq!((g.cache_hits, g.cache_misses), (0, u64::from(n)));
        for i in 2..=n {
            let s = g.state_at(&[id(i)]);
            assert_eq!(s.ancestors.len(), i as usize + 1);
        }
        assert_eq!((g.cache_hits, g.cache_misses), (u64::from(n) - 1, u64::from(n)), "the most recent cuts are all hits");
        g.state_at(&[id(1)]);
        assert_eq!(g.cache_misses, u64::from(n) + 1, "the oldest cut was evicted");
    }

    /// A cut in use survives a flood of cuts used once; every state equals
    /// the one computed from scratch.
    #[test]
    fn a_cut_in_use_outlives_a_flood_of_cuts_used_once() {
        let n = 4 * GOV_CUT_CACHE_MAX as u32;
        let mut g = chain(n);
        let hot = [id(n)];
        g.state_at(&hot);
        for i in 1..n {
            let s = g.state_at(&[id(i)]);
            assert_eq!(s.ancestors, g.compute(&[id(i)]).ancestors);
            let misses = g.cache_misses;
            g.state_at(&hot);
            assert_eq!(g.cache_misses, misses, "the hot cut stays cached");
        }
    }

    /// The keys ever made members, per scope, whatever the order ops were
    /// indexed in (children before parents, as restore may).
    #[test]
    fn members_ever_per_scope_in_any_insertion_order() {
        let other = [9; 32];
        let nodes = [
            (id(2), add(id(1), 2, key(1), key(3))),
            (id(1), add(id(0), 1, key(1), key(2))),
            (other, genesis(key(4))),
            (id(0), genesis(key(1))),
        ];
        let mut g = Governance::default();
        for (i, n) in nodes.iter().cloned() {
            g.insert(i, n);
        }
        let scope = id(0);
        for k in [1, 2, 3] {
            assert!(g.ever_member(&scope, &key(k)), "key {k}");
            assert!(!g.ever_member(&other, &key(k)), "key {k} in the other scope");
        }
        assert!(g.ever_member(&other, &key(4)));
        assert!(!g.ever_member(&scope, &key(4)));
        assert!(!g.ever_member(&[7; 32], &key(1)), "an unknown scope has no members");
        assert_eq!((g.cache_hits, g.cache_misses), (0, 0), "no state computed");
    }
}
