//! The structures of SPEC §3, §4, §8, §9 and §10.
//!
//! Encoding uses borsh's derive (SPEC §1 is borsh). Decoding is hand-written in
//! `codec`, so that every length prefix is checked against the limits of §7
//! and against the bytes that remain before anything is allocated for it.

use borsh::BorshSerialize;

pub type Hash = [u8; 32];
pub type PublicKey = [u8; 32];
pub const ZERO: Hash = [0u8; 32];

/// A 32-byte id (scope, op, key) from its text form: exactly 64 hex
/// characters, either case; `None` for anything else. The command line, the
/// admin API and the tools read ids this one way.
pub fn parse_hash_hex(s: &str) -> Option<Hash> {
    let mut hash = ZERO;
    hex::decode_to_slice(s, &mut hash).ok()?;
    Some(hash)
}

pub const PLANE_GOVERNANCE: u8 = 0;
pub const PLANE_DATA: u8 = 1;

#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize)]
pub struct Op {
    pub version: u8,
    pub scope: Hash,
    pub plane: u8,
    pub author: PublicKey,
    pub parents: Vec<Hash>,
    pub cut: Vec<Hash>,
    pub hlc: u64,
    pub key_id: Hash,
    pub nonce: [u8; 12],
    pub payload: Vec<u8>,
    pub signature: [u8; 64],
}

/// What kind of op, by the shape table of SPEC §3.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Genesis,
    Governance,
    Data,
}

impl Op {
    pub fn kind(&self) -> OpKind {
        if self.scope == ZERO {
            OpKind::Genesis
        } else if self.plane == PLANE_GOVERNANCE {
            OpKind::Governance
        } else {
            OpKind::Data
        }
    }

    /// The scope this op belongs to: its own id for a genesis (SPEC §2).
    pub fn scope_of(&self, id: &Hash) -> Hash {
        if self.scope == ZERO {
            *id
        } else {
            self.scope
        }
    }

    /// SPEC §3: the cut of an op (governance: its parents; data: its cut).
    pub fn cut_ids(&self) -> &[Hash] {
        if self.plane == PLANE_GOVERNANCE {
            &self.parents
        } else {
            &self.cut
        }
    }

    /// SPEC §3: the dependencies (parents, then the cut for a data op).
    pub fn dependencies(&self) -> impl Iterator<Item = &Hash> {
        let cut: &[Hash] = if self.plane == PLANE_DATA { &self.cut } else { &[] };
        self.parents.iter().chain(cut.iter())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, BorshSerialize)]
#[borsh(use_discriminant = false)]
pub enum Role {
    Reader,
    Writer,
    Admin,
}

#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize)]
pub enum GovAction {
    Genesis { name: String, first_key_id: Hash },
    AddMember { member: PublicKey, role: Role, kem: [u8; 32] },
    RemoveMember { member: PublicKey },
    SetRole { member: PublicKey, role: Role },
    RotateKey { key_id: Hash },
}

#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize)]
pub struct GovPayload {
    pub actions: Vec<GovAction>,
}

#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize)]
pub enum Action {
    Put { entity: String, key: Vec<u8>, value: Vec<u8> },
    Delete { entity: String, key: Vec<u8> },
    Add { entity: String, key: Vec<u8>, amount: i64 },
}

impl Action {
    pub fn cell(&self) -> (&str, &[u8]) {
        match self {
            Action::Put { entity, key, .. }
            | Action::Delete { entity, key }
            | Action::Add { entity, key, .. } => (entity, key),
        }
    }

    /// Bytes it holds (entity, key and value), for memory bounds.
    pub fn bytes_len(&self) -> usize {
        let (entity, key) = self.cell();
        entity.len() + key.len() + if let Action::Put { value, .. } = self { value.len() } else { 8 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize)]
pub struct Event {
    pub kind: String,
    pub data: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize)]
pub struct DataPayload {
    pub root_hash: Hash,
    pub actions: Vec<Action>,
    pub events: Vec<Event>,
}

#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize)]
pub struct KeyDelivery {
    pub scope: Hash,
    pub key_id: Hash,
    pub recipient: PublicKey,
    pub ephemeral: [u8; 32],
    pub sealed: Vec<u8>,
}

/// SPEC §10. Variants 2..=254 are the node's own (see `docs/PROTOCOL.md`);
/// the core only ever sees 0 and 1.
#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize)]
pub enum Message {
    Op(Op),
    Key(KeyDelivery),
}

pub const MESSAGE_OP: u8 = 0;
pub const MESSAGE_KEY: u8 = 1;
pub const MESSAGE_RESERVED: u8 = 255;

/// SPEC §8.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, BorshSerialize)]
pub struct Lww {
    pub hlc: u64,
    pub author: PublicKey,
    pub index: u32,
    pub value: Option<Vec<u8>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, BorshSerialize)]
pub struct Cell {
    pub lww: Option<Lww>,
    pub counter: i64,
}

pub fn encode<T: BorshSerialize>(value: &T) -> Vec<u8> {
    borsh::to_vec(value).expect("encoding into a Vec cannot fail")
}
