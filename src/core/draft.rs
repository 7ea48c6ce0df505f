//! What the node needs to author an op of its own (API.md, "Model"), taken
//! from the engine's state at the moment it is asked: the parents (the
//! current heads of the plane), the cut (the current governance heads, for
//! a data op), the smallest `hlc` the receive path accepts, and the key of
//! `G(cut)`. The caller signs and sends the op into the same receive path as
//! any other; nothing here changes the engine.
//!
//! The checks a draft makes are those the receive path would make of the
//! op, asked ahead so that a request the node cannot honour gets a clear
//! answer and no op: the scope exists, the node's role in `G(cut)` allows
//! the plane, the node holds the current key, and the heads fit in an op
//! (SPEC §7: 32 ids).

use std::sync::Arc;

use super::engine::Engine;
use super::governance::GovState;
use crate::limits::{OP_CUT_MAX, OP_PARENTS_MAX};
use crate::protocol::{Hash, Role, PLANE_DATA, PLANE_GOVERNANCE};

/// The state an authored op is built on.
#[derive(Clone, Debug)]
pub struct Draft {
    pub scope: Hash,
    pub plane: u8,
    pub parents: Vec<Hash>,
    /// Governance heads, for a data op; empty for a governance op.
    pub cut: Vec<Hash>,
    /// Greater than every dependency's `hlc` (SPEC §6 step 2); the author
    /// takes the larger of this and its wall clock.
    pub hlc_min: u64,
    /// The current key of `G(cut)` and its id.
    pub key: [u8; 32],
    pub key_id: Hash,
    /// `G(cut)`: members, their `kem` keys, the keyring.
    pub governance: Arc<GovState>,
    /// The keys of the keyring, in its order (what a new member is given).
    pub keyring: Vec<[u8; 32]>,
}

/// Why no op can be drafted (each maps to one API error).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DraftRefused {
    #[error("no scope with this id has its genesis applied on this node")]
    UnknownScope,
    #[error("this node is not a member of the scope")]
    NotAMember,
    #[error("this node is a reader of the scope; writing data needs the writer or admin role")]
    NotAWriter,
    #[error("changing the group needs the admin role, which this node does not have in the scope")]
    NotAnAdmin,
    #[error("the node does not hold the scope's current group key {0}")]
    NoKey(String),
    #[error("the scope has {0} heads on this plane, more than an op may name (32); retry once they merge")]
    TooManyHeads(usize),
    #[error("too many writes are waiting for their turn on this node; retry")]
    Busy,
}

impl Engine {
    /// The state to author an op of `plane` in `scope` on, if the receive
    /// path would accept it from this node.
    pub fn draft(&mut self, scope: &Hash, plane: u8) -> Result<Draft, DraftRefused> {
        let i = *self.scope_index.get(scope).ok_or(DraftRefused::UnknownScope)? as usize;
        if !self.scopes[i].genesis_applied {
            return Err(DraftRefused::UnknownScope);
        }
        let gov_heads: Vec<Hash> = self.scopes[i].gov_heads.iter().copied().collect();
        let data_heads: Vec<Hash> = self.scopes[i].data_heads.iter().copied().collect();
        let g = self.governance_at(&gov_heads).ok_or(DraftRefused::UnknownScope)?;
        let me = self.identity().public_key;
        match (g.role(&me), plane) {
            (None, _) => return Err(DraftRefused::NotAMember),
            (Some(Role::Reader), PLANE_DATA) => return Err(DraftRefused::NotAWriter),
            (Some(Role::Reader | Role::Writer), PLANE_GOVERNANCE) => return Err(DraftRefused::NotAnAdmin),
            _ => {}
        }
        let (parents, cut) = if plane == PLANE_DATA { (data_heads, gov_heads) } else { (gov_heads, Vec::new()) };
        if parents.len() > OP_PARENTS_MAX as usize || cut.len() > OP_CUT_MAX as usize {
            return Err(DraftRefused::TooManyHeads(parents.len().max(cut.len())));
        }
        let key_id = *g.current_key().ok_or(DraftRefused::UnknownScope)?;
        let key = *self.keys.get(&key_id).ok_or_else(|| DraftRefused::NoKey(hex::encode(key_id)))?;
        let mut hlc_min = 0u64;
        for d in parents.iter().chain(&cut) {
            if let Some(m) = self.applied(d) {
                hlc_min = hlc_min.max(m.hlc.saturating_add(1));
            }
        }
        let keyring = g.keyring.iter().filter_map(|k| self.keys.get(k).copied()).collect();
        Ok(Draft { scope: *scope, plane, parents, cut, hlc_min, key, key_id, governance: g, keyring })
    }
}
