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

use std::sync::Arc;

use crate::limits::{GOV_CUT_CACHE_MAX, GOV_CUT_CACHE_WEIGHT_MAX};
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
    pub members: super::IdMap<PublicKey, Role>,
    pub kem: super::IdMap<PublicKey, [u8; 32]>,
    pub keyring: Vec<Hash>,
    pub ancestors: super::IdSet<Hash>,
}

impl GovState {
    pub fn current_key(&self) -> Option<&Hash> {
        self.keyring.last()
    }

    pub fn role(&self, member: &PublicKey) -> Option<Role> {
        self.members.get(member).copied()
    }

    /// What the state holds, in entries (members, their X25519 keys, key
    /// ids, ancestors), for the cache's bound: its memory is about 100
    /// bytes per entry.
    pub fn weight(&self) -> usize {
        1 + self.members.len() + self.kem.len() + self.keyring.len() + self.ancestors.len()
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

impl Default for Governance {
    fn default() -> Self {
        Governance::with_cache(GOV_CUT_CACHE_MAX, GOV_CUT_CACHE_WEIGHT_MAX)
    }
}

impl Governance {
    /// Bytes of memory held: the index of governance ops (each one's
    /// parents and actions), the scope of every indexed op, the members
    /// ever, and the cache of states at cuts (`GovState::weight`'s ~100
    /// bytes an entry), for the memory gauges. A walk over the governance
    /// ops and scopes, not over the data ops.
    pub fn heap_bytes(&self) -> u64 {
        use super::map_bytes;
        let nodes: u64 = self
            .nodes
            .values()
            .map(|n| (n.parents.capacity() * 32 + n.actions.capacity() * std::mem::size_of::<GovAction>()) as u64)
            .sum();
        let members: u64 = self.members_ever.values().map(|m| map_bytes::<PublicKey, ()>(m.capacity())).sum();
        let c = &self.cache;
        let cache = map_bytes::<Vec<Hash>, u32>(c.index.capacity())
            + (c.slots.capacity() * std::mem::size_of::<CutSlot>()) as u64
            + c.slots.iter().map(|s| (s.cut.capacity() * 32) as u64).sum::<u64>()
            + (c.weight * 100) as u64;
        nodes
            + map_bytes::<Hash, GovNode>(self.nodes.capacity())
            + map_bytes::<Hash, Hash>(self.scope_of.capacity())
            + (self.unscoped.capacity() * 32) as u64
            + map_bytes::<Hash, super::IdSet<PublicKey>>(self.members_ever.capacity())
            + members
            + cache
    }

    /// With a cache of at most `entries` states weighing at most `weight`
    /// in all (`GovState::weight`).
    fn with_cache(entries: usize, weight: usize) -> Self {
        assert!(entries >= 1 && entries < NIL as usize);
        Governance {
            nodes: Default::default(),
            scope_of: Default::default(),
            unscoped: Vec::new(),
            members_ever: Default::default(),
            cache: CutCache::new(entries, weight),
            cache_hits: 0,
            cache_misses: 0,
        }
    }

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
        let mut ancestors: super::IdSet<Hash> = super::IdSet::default();
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

/// `G` at up to `GOV_CUT_CACHE_MAX` cuts weighing at most
/// `GOV_CUT_CACHE_WEIGHT_MAX` in all; when full, the least recently used
/// ones go, as few as make room. A cut used within the last few thousand
/// distinct cuts stays, so the cuts honest ops share (each scope's current
/// heads, a parent's state for the single-op shortcut) outlive any flood
/// of cuts used once, and a miss costs one recomputation of its own cut,
/// never of every cut at once. (CLOCK would only set a bit on a hit, but a
/// flood that marks its own entries, as the single-op shortcut marks a
/// parent's, turns it into FIFO, which evicts the hot cut every
/// `GOV_CUT_CACHE_MAX` misses.) The use order is a doubly linked list
/// through the slots: O(1) per use. A state heavier than the whole bound is
/// not kept.
struct CutCache {
    index: super::IdMap<Vec<Hash>, u32>,
    slots: Vec<CutSlot>,
    /// Slots of evicted states, their state dropped, for the next insert.
    free: Vec<u32>,
    /// The most and the least recently used slot (`NIL`: none).
    newest: u32,
    oldest: u32,
    entries_max: usize,
    weight_max: usize,
    /// The weight of the states indexed.
    weight: usize,
    /// What an evicted slot holds until it is reused.
    empty: Arc<GovState>,
}

struct CutSlot {
    cut: Vec<Hash>,
    state: Arc<GovState>,
    weight: usize,
    newer: u32,
    older: u32,
}

const NIL: u32 = u32::MAX;
const _: () = assert!(GOV_CUT_CACHE_MAX >= 1 && GOV_CUT_CACHE_MAX < NIL as usize);

impl CutCache {
    fn new(entries_max: usize, weight_max: usize) -> Self {
        CutCache {
            index: Default::default(),
            slots: Vec::new(),
            free: Vec::new(),
            newest: NIL,
            oldest: NIL,
            entries_max,
            weight_max,
            weight: 0,
            empty: Arc::new(GovState::default()),
        }
    }

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
        let weight = state.weight();
        if weight > self.weight_max {
            return;
        }
        while self.index.len() >= self.entries_max || self.weight + weight > self.weight_max {
            self.evict_oldest();
        }
        let slot = CutSlot { cut: cut.clone(), state, weight, newer: NIL, older: NIL };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.weight += weight;
        self.push_newest(i);
        self.index.insert(cut, i);
        debug_assert_eq!(self.index.len() + self.free.len(), self.slots.len());
    }

    fn evict_oldest(&mut self) {
        let i = self.oldest;
        assert_ne!(i, NIL, "evicting from an empty cache");
        self.unlink(i);
        let slot = &mut self.slots[i as usize];
        self.index.remove(&slot.cut);
        self.weight -= slot.weight;
        slot.cut = Vec::new();
        slot.state = self.empty.clone();
        slot.weight = 0;
        self.free.push(i);
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

    /// A chain of `n` ops after a genesis, ids 1..=n after the genesis's 0,
    /// into `g`.
    fn chain_into(mut g: Governance, n: u32) -> Governance {
        g.insert(id(0), genesis(key(1)));
        for i in 1..=n {
            g.insert(id(i), add(id(i - 1), i, key(1), key(2)));
        }
        g
    }

    /// A chain of `n` ops with a cache of `entries` states of any weight.
    fn chain_cached(n: u32, entries: usize) -> Governance {
        chain_into(Governance::with_cache(entries, usize::MAX), n)
    }

    /// After `entries + 1` distinct cuts, only the first is gone: the most
    /// recent `entries` are all hits.
    #[test]
    fn the_cut_cache_evicts_one_entry_at_a_time() {
        let entries = 256;
        let n = entries as u32 + 1;
        let mut g = chain_cached(n, entries);
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
        let n = 4 * 256;
        let mut g = chain_cached(n, 256);
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

    /// States weighing more than the bound in all: the least recently used
    /// go until the new one fits, and one heavier than the bound is not
    /// kept; what is served equals the state computed from scratch.
    #[test]
    fn the_cut_cache_keeps_its_weight_bound() {
        // Cut `{i}` weighs 1 + members 2 + kem 1 + keyring 1 + ancestors
        // i + 1 = i + 6.
        let mut g = chain_into(Governance::with_cache(1_000, 40), 40);
        for i in [1, 2, 3] {
            g.state_at(&[id(i)]);
        }
        assert_eq!(g.cache.weight, 7 + 8 + 9);
        g.state_at(&[id(20)]);
        assert_eq!(g.cache.weight, 9 + 26, "the two oldest went to make room");
        assert_eq!(g.cache.index.len(), 2);
        let misses = g.cache_misses;
        g.state_at(&[id(3)]);
        assert_eq!(g.cache_misses, misses, "cut 3 stayed");
        g.state_at(&[id(1)]);
        assert_eq!(g.cache_misses, misses + 1, "cut 1 was evicted");
        let heavy = g.state_at(&[id(35)]);
        assert_eq!(heavy.weight(), 41);
        assert!(g.cache.peek(&[id(35)]).is_none(), "heavier than the bound: not kept");
        assert!(g.cache.weight <= 40);
        for i in 1..=40 {
            let s = g.state_at(&[id(i)]);
            assert_eq!(s.ancestors, g.compute(&[id(i)]).ancestors);
            assert_eq!(s.members, g.compute(&[id(i)]).members);
            assert!(g.cache.weight <= 40);
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
