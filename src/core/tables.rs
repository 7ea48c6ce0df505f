//! The store's tables as the engine sees them: the column families (`Cf`),
//! the writes of a commit (`Write`), and the keys and records it puts in
//! them (the per-scope record, the meta keys, a buffered op's record, a
//! projection cell's record). The layouts are in `docs/ARCHITECTURE.md`,
//! "Storage".

use borsh::{BorshDeserialize, BorshSerialize};

use crate::protocol::{Cell, Hash};

/// The column families of the store (one table each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cf {
    /// delta_id → the op as received (first valid copy): every applied op,
    /// and every op buffered on a missing dependency (a `Pending` record
    /// says which), so that a parked op's bytes are written once.
    Ops,
    /// delta_id → seq: ops buffered on a missing dependency, their bytes in
    /// `Ops` (or, written before 97e5c45, seq ‖ op). The by-parent index
    /// is derived from them at open.
    Pending,
    /// delta_id → seq ‖ op: governance ops waiting for their key.
    KeyWaits,
    /// scope ‖ path → entity, key, cell.
    Projection,
    /// delta_id → depth ‖ plaintext payload of an applied governance op.
    Governance,
    /// delta_id → reason ‖ scope ‖ seq: remembered drop verdicts.
    Dropped,
    /// key_id → group key.
    Keys,
    /// Node identity and per-scope records (heads, counters).
    Meta,
    /// scope ‖ first seq (big-endian) → the events of one commit in that
    /// scope, consecutive from `first seq`: count ‖ (op ‖ borsh(Event))*.
    /// One record per commit and scope, not per event.
    Events,
    /// The index of the cells by entity, for the API's listings: insert
    /// only, like the cells it points to, and written in the commit that
    /// creates its cell. `scope ‖ 0x00 ‖ entity` → (empty): an entity with
    /// cells; `scope ‖ 0x01 ‖ u32 BE len(entity) ‖ entity ‖ key` → (empty):
    /// a cell, found in `Projection` at its path. Keys sort by entity bytes,
    /// then by key bytes within one entity (the length prefix keeps one
    /// entity's keys apart from a longer entity's).
    Items,
}

impl Cf {
    pub const ALL: [Cf; 10] = [
        Cf::Ops,
        Cf::Pending,
        Cf::KeyWaits,
        Cf::Projection,
        Cf::Governance,
        Cf::Dropped,
        Cf::Keys,
        Cf::Meta,
        Cf::Events,
        Cf::Items,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Cf::Ops => "ops",
            Cf::Pending => "pending",
            Cf::KeyWaits => "key_waits",
            Cf::Projection => "projection",
            Cf::Governance => "governance",
            Cf::Dropped => "dropped",
            Cf::Keys => "keys",
            Cf::Meta => "meta",
            Cf::Events => "events",
            Cf::Items => "items",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Put(Cf, Vec<u8>, Vec<u8>),
    Delete(Cf, Vec<u8>),
}

/// The per-scope record in `Cf::Meta` (key `scope/` ‖ id). The engine
/// fills all but `divergences`, which the projector counts and fills.
#[derive(Clone, Debug, BorshSerialize, BorshDeserialize)]
pub struct ScopeRecord {
    pub genesis_applied: bool,
    pub gov_heads: Vec<Hash>,
    pub data_heads: Vec<Hash>,
    pub applied: u64,
    pub divergences: u64,
    pub event_seq: u64,
}

pub const META_IDENTITY: &[u8] = b"identity";
/// The store's format version in `Cf::Meta`: u32 LE (`store::FORMAT_VERSION`).
pub const META_FORMAT: &[u8] = b"format";
pub const META_SCOPE_PREFIX: &[u8] = b"scope/";
/// A followed scope in `Cf::Meta` (key `follow/` ‖ id, empty value): its
/// genesis is accepted whoever authored it (`Engine::follow`).
pub const META_FOLLOW_PREFIX: &[u8] = b"follow/";

/// A key delivery this node made, in `Cf::Meta` (key `delivery/` ‖
/// recipient ‖ scope ‖ key_id, value borsh(KeyDelivery)): served again to
/// its recipient (`docs/PROTOCOL.md`, "Key deliveries") and exported.
pub const META_DELIVERY_PREFIX: &[u8] = b"delivery/";

pub(crate) fn delivery_meta_key(kd: &crate::protocol::KeyDelivery) -> Vec<u8> {
    [META_DELIVERY_PREFIX, &kd.recipient[..], &kd.scope[..], &kd.key_id[..]].concat()
}

/// The key of a scope's record in `Cf::Meta`: `scope/` ‖ id.
pub(crate) fn scope_meta_key(scope: &Hash) -> Vec<u8> {
    [META_SCOPE_PREFIX, scope.as_slice()].concat()
}

/// A key wait's record (and a pending record of the older layout): seq ‖ op.
pub(crate) fn seq_and_bytes(seq: u64, bytes: &[u8]) -> Vec<u8> {
    [&seq.to_le_bytes()[..], bytes].concat()
}

/// A `Cf::Projection` record, as `Projector::finish_commit` writes it:
/// borsh of (entity, key, cell).
pub(crate) fn decode_cell_record(v: &[u8]) -> (String, Vec<u8>, Cell) {
    let mut r = crate::protocol::codec::Reader::new(v);
    let entity = r.string(u32::MAX).expect("stored entity");
    let key = r.bytes(u32::MAX).expect("stored key");
    let cell = crate::protocol::codec::decode_cell(&v[r.position()..]).expect("stored cell");
    (entity, key, cell)
}

/// `Cf::Items`: the tag of an entity record after the scope.
const ITEMS_ENTITY_TAG: u8 = 0x00;
/// `Cf::Items`: the tag of a cell record after the scope.
const ITEMS_CELL_TAG: u8 = 0x01;

/// The prefix of every entity record of `scope` in `Cf::Items` (the entity
/// follows it).
pub fn items_entities_prefix(scope: &Hash) -> Vec<u8> {
    [scope.as_slice(), &[ITEMS_ENTITY_TAG]].concat()
}

/// The prefix of the cell records of `entity` in `scope` in `Cf::Items`
/// (the cell's key follows it).
pub fn items_cells_prefix(scope: &Hash, entity: &str) -> Vec<u8> {
    let len = u32::try_from(entity.len()).expect("an entity fits a frame");
    [scope.as_slice(), &[ITEMS_CELL_TAG], &len.to_be_bytes(), entity.as_bytes()].concat()
}

/// The index records of a new cell (`Cf::Items`): its entity's and its own.
pub(crate) fn item_index_writes(scope: &Hash, entity: &str, key: &[u8]) -> [Write; 2] {
    [item_entity_write(scope, entity), item_cell_write(scope, entity, key)]
}

/// The index record of an entity with cells (`Cf::Items`).
pub(crate) fn item_entity_write(scope: &Hash, entity: &str) -> Write {
    Write::Put(Cf::Items, [items_entities_prefix(scope).as_slice(), entity.as_bytes()].concat(), Vec::new())
}

/// The index record of a cell (`Cf::Items`).
pub(crate) fn item_cell_write(scope: &Hash, entity: &str, key: &[u8]) -> Write {
    Write::Put(Cf::Items, [items_cells_prefix(scope, entity).as_slice(), key].concat(), Vec::new())
}
