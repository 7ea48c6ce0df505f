//! What the pipeline computes ahead of the engine, as pure functions of an
//! op and of accepted governance ops: the op with its signature checked
//! (`VerifiedOp`), its authorization at its cut (`authorize_at`), its
//! payload opened (`Prepared`). The engine uses them on an op's first
//! judgement and computes whatever is missing itself, with the same result.

use super::governance::{GovState, Governance};
use crate::protocol::codec::decode_data_payload;
use crate::protocol::{DataPayload, Hash, Op, OpKind, Role, PLANE_DATA, PLANE_GOVERNANCE};

/// A signature-checked op on its way in (`delta_id` recomputed).
#[derive(Clone, Debug)]
pub struct VerifiedOp {
    pub id: Hash,
    pub op: Op,
    pub bytes: Vec<u8>,
    /// Work the pipeline's stages did ahead of the engine.
    pub pre: Prepared,
}

/// Authorization at the cut (SPEC §6 step 3, less `stale_cut`): a pure
/// function of the op and `G(cut)`, so a stage holding a replica of the
/// governance index computes the same verdict as the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreAuth {
    Ok,
    Unauthorized,
    StaleKey,
}

pub fn authorize_at(g: &GovState, op: &Op) -> PreAuth {
    let authorized =
        matches!((op.plane, g.role(&op.author)), (PLANE_GOVERNANCE, Some(Role::Admin)) | (PLANE_DATA, Some(Role::Writer | Role::Admin)));
    if !authorized {
        PreAuth::Unauthorized
    } else if g.current_key() != Some(&op.key_id) {
        PreAuth::StaleKey
    } else {
        PreAuth::Ok
    }
}

/// `authorize_at(G(cut), op)` for a non-genesis op whose cut ids are all
/// indexed in `gov` and, as step 2 of SPEC §6 checks before step 3, ops of
/// the op's own scope (if they are not, the engine drops the op
/// `wrong_plane` before this result is read). An author that no op of the
/// scope ever made a member is a member of `G` at none of its cuts: its op
/// is unauthorized without computing `G(cut)`, a walk over the cut's
/// ancestors that a flood of strangers' ops citing varied cuts would
/// otherwise cost once each.
pub fn authorize(gov: &mut Governance, op: &Op) -> PreAuth {
    debug_assert!(op.kind() != OpKind::Genesis, "a genesis has no cut");
    if !gov.ever_member(&op.scope, &op.author) {
        return PreAuth::Unauthorized;
    }
    authorize_at(&gov.state_at(op.cut_ids()), op)
}

/// Results computed ahead by the authorizer and decryptor stages; the
/// engine uses them on an op's first judgement and computes anything
/// missing itself.
#[derive(Clone, Debug, Default)]
pub struct Prepared {
    pub auth: Option<PreAuth>,
    /// The payload opened with the key of `key_id`: `Some(None)` is a tag
    /// mismatch.
    pub opened: Option<Option<Vec<u8>>>,
    /// A data op's payload opened and decoded (SPEC §6 step 4 done whole),
    /// with the length of its plaintext; `opened` is then `None`. Set by
    /// `open_data`, where the decoding is a pure function of the plaintext
    /// as in the engine.
    pub data: Option<(DataPayload, usize)>,
    /// A key delivery to this node: the key it seals (`Some(None)`: it
    /// does not open; `Engine::handle_key_opened`).
    pub key: Option<Option<[u8; 32]>>,
}

impl Prepared {
    /// Keeps the opened payload of a data op (`plane`) decoded when it
    /// decodes, else as opened: the engine then finds it undecodable
    /// (`bad_payload`) or, for a governance op, decodes it itself.
    pub fn open_data(&mut self, plane: u8, opened: Option<Vec<u8>>) {
        if plane == PLANE_DATA {
            if let Some(plain) = &opened {
                if let Ok(p) = decode_data_payload(plain) {
                    self.data = Some((p, plain.len()));
                    self.opened = None;
                    return;
                }
            }
        }
        self.opened = Some(opened);
    }

    /// Bytes of the payload held, opened or decoded (by its plaintext).
    pub fn payload_bytes(&self) -> usize {
        match (&self.opened, &self.data) {
            (Some(Some(p)), _) => p.len(),
            (_, Some((_, n))) => *n,
            _ => 0,
        }
    }

    /// Forgets the opened payload (the engine opens it again if needed).
    pub fn drop_payload(&mut self) {
        self.opened = None;
        self.data = None;
    }
}
