//! The governance state at a cut, `G(C)` (SPEC §5), with a bounded cache.
//!
//! `G(C)` applies the actions of every op in `ancestors(C)` in ascending
//! `(depth, delta_id)` order. Only accepted governance ops are ever indexed
//! here, so `G(C)` depends on the set of ids alone. A single-op cut `{x}` is
//! derived from `G(parents(x))` when that is cached: `x` is deeper than all of
//! its ancestors, so it comes last in the order.

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
    /// Keyed by the sorted cut. Cleared whole when full: a miss only costs a
    /// recomputation, and the hot cut (the current heads) is recomputed once.
    cache: super::IdMap<Vec<Hash>, Arc<GovState>>,
    pub cache_hits: u64,
    pub cache_misses: u64,
}

impl Governance {
    pub fn insert(&mut self, id: Hash, node: GovNode) {
        self.nodes.insert(id, node);
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
            return s.clone();
        }
        self.cache_misses += 1;
        let state = match cut {
            [x] if !self.nodes[x].parents.is_empty() && self.cache.contains_key(&self.nodes[x].parents) => {
                let node = &self.nodes[x];
                let mut s = (*self.cache[&node.parents]).clone();
                s.apply(&node.author, &node.actions);
                s.ancestors.insert(*x);
                s
            }
            _ => self.compute(cut),
        };
        let state = Arc::new(state);
        if self.cache.len() >= GOV_CUT_CACHE_MAX {
            self.cache.clear();
        }
        self.cache.insert(cut.to_vec(), state.clone());
        state
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
