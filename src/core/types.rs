//! The engine's public types: how it is set up (`Config`, `GenesisPolicy`,
//! `Identity`), what it says of a message, an op or a scope (`Outcome`,
//! `Reason`, `BufKind`, `OpState`, `Scope`, `ScopeStatus`, `ScopeReport`)
//! and what it counts (`Stats`).

use std::collections::{BTreeMap, BTreeSet};

use crate::limits;
use crate::protocol::crypto::x25519_public;
use crate::protocol::{Hash, PublicKey, Role};

/// Why an op was dropped for good (SPEC §6). `malformed` and `bad_signature`
/// are not here: they are not remembered by id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    RejectedDependency,
    WrongPlane,
    Clock,
    Unauthorized,
    StaleKey,
    StaleCut,
    Undecryptable,
    BadPayload,
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::RejectedDependency,
        Reason::WrongPlane,
        Reason::Clock,
        Reason::Unauthorized,
        Reason::StaleKey,
        Reason::StaleCut,
        Reason::Undecryptable,
        Reason::BadPayload,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Reason::RejectedDependency => "rejected_dependency",
            Reason::WrongPlane => "wrong_plane",
            Reason::Clock => "clock",
            Reason::Unauthorized => "unauthorized",
            Reason::StaleKey => "stale_key",
            Reason::StaleCut => "stale_cut",
            Reason::Undecryptable => "undecryptable",
            Reason::BadPayload => "bad_payload",
        }
    }

    pub fn code(self) -> u8 {
        Reason::ALL.iter().position(|r| *r == self).expect("listed") as u8
    }

    pub fn from_code(code: u8) -> Option<Reason> {
        Reason::ALL.get(code as usize).copied()
    }
}

/// Which buffer a not-yet op waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufKind {
    /// On a dependency not yet applied (pending-by-parent).
    Pending,
    /// A governance op waiting, durably, for its key.
    KeyWait,
    /// A data op waiting in memory for its key, until its deadline.
    DataKeyWait,
}


/// What became of one received message (its cascade is counted in `Stats`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Malformed,
    BadSignature,
    Duplicate,
    GenesisRefused,
    Applied,
    Dropped(Reason),
    NotYet(BufKind),
    KeyAccepted,
    /// A key delivery not for us, that does not open, or already known.
    KeyIgnored,
    /// Not judged: the engine stopped on a failed read of the store
    /// (`Engine::cold_failed`), and judges nothing until it is rebuilt.
    StoreFailed,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub frames: u64,
    pub malformed: u64,
    pub bad_signature: u64,
    pub duplicates: u64,
    pub genesis_refused: u64,
    pub applied: u64,
    pub dropped: [u64; 8],
    pub buffered_pending: u64,
    pub buffered_key_wait: u64,
    pub buffered_data_key_wait: u64,
    pub evicted: u64,
    pub key_timeouts: u64,
    pub keys_accepted: u64,
    pub keys_ignored: u64,
    /// SPEC §8 convergence checks made (the data heads were one op).
    pub root_checks: u64,
    pub divergences: u64,
    pub events: u64,
    pub cascade_released: u64,
    /// Applied ops moved from the hot index to the cold one.
    pub cold_evicted: u64,
    /// Store reads for ids the cold filter may hold, and those that found
    /// an applied op.
    pub cold_reads: u64,
    pub cold_hits: u64,
}

/// Which geneses the node accepts (SPEC §2: a node's own policy, applied
/// after the signature check; API.md, "Which scopes a node holds"). A
/// refused genesis is counted, not remembered; its scope's ops wait in
/// pending until evicted, and a later copy is judged afresh.
#[derive(Clone, Debug)]
pub enum GenesisPolicy {
    /// Every genesis: relays, tests, `dagfold import` given no flags.
    AcceptAll,
    /// A genesis authored by the node itself or by one of these keys
    /// (`--accept-scopes-from`), or whose id the node follows
    /// (`Engine::follow`).
    Authors(Vec<PublicKey>),
}

#[derive(Clone, Debug)]
pub struct Config {
    pub data_key_wait_ms: u64,
    pub buffered_ops_per_scope_max: u64,
    pub buffered_bytes_per_scope_max: u64,
    pub buffered_ops_total_max: u64,
    pub buffered_bytes_total_max: u64,
    pub dropped_remembered_max: u64,
    pub genesis_policy: GenesisPolicy,
    /// Applied ops kept in the in-memory index once the engine has a cold
    /// index (`ColdOps`); older ones are read back from the store.
    pub hot_applied_max: usize,
    /// Size of the filter in front of the cold index.
    pub cold_filter_bytes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_key_wait_ms: limits::DATA_KEY_WAIT_MS_DEFAULT,
            buffered_ops_per_scope_max: limits::BUFFERED_OPS_PER_SCOPE_MAX,
            buffered_bytes_per_scope_max: limits::BUFFERED_BYTES_PER_SCOPE_MAX,
            buffered_ops_total_max: limits::BUFFERED_OPS_TOTAL_MAX,
            buffered_bytes_total_max: limits::BUFFERED_BYTES_TOTAL_MAX,
            dropped_remembered_max: limits::DROPPED_REMEMBERED_MAX,
            genesis_policy: GenesisPolicy::AcceptAll,
            hot_applied_max: limits::HOT_APPLIED_MAX,
            cold_filter_bytes: limits::COLD_FILTER_BYTES,
        }
    }
}

#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    pub seed: [u8; 32],
    pub kem_secret: [u8; 32],
    pub public_key: PublicKey,
    pub kem_public: [u8; 32],
}

impl Identity {
    pub fn from_secrets(seed: [u8; 32], kem_secret: [u8; 32]) -> Self {
        Identity {
            seed,
            kem_secret,
            public_key: crate::protocol::sig::public_key_from_seed(&seed),
            kem_public: x25519_public(&kem_secret),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        [self.seed, self.kem_secret].concat()
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        (bytes.len() == 64).then(|| {
            Identity::from_secrets(bytes[..32].try_into().unwrap(), bytes[32..].try_into().unwrap())
        })
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("public_key", &hex::encode(self.public_key)).finish_non_exhaustive()
    }
}


/// A scope as the engine holds it (`Engine::scope`), for tests and tools.
pub struct Scope {
    pub id: Hash,
    pub genesis_applied: bool,
    pub gov_heads: BTreeSet<Hash>,
    pub data_heads: BTreeSet<Hash>,
    pub applied: u64,
    pub pending: u64,
    pub key_waiting: u64,
    pub data_key_waiting: u64,
    pub buffered_bytes: u64,
    pub event_seq: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpState {
    Unknown,
    /// The store failed to say (a failed read; the engine has stopped,
    /// `Engine::cold_failed`): never taken for `Unknown`.
    Unreadable,
    Applied,
    Dropped(Reason),
    Buffered(BufKind),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopeStatus {
    pub scope: Hash,
    pub root: Hash,
    pub data_heads: Vec<Hash>,
    pub governance_heads: Vec<Hash>,
    pub applied: u64,
    pub pending: u64,
    pub key_waiting: u64,
    pub data_key_waiting: u64,
    /// The members of `G` at `governance_heads`, sorted by key: whom the
    /// node may serve what reveals the scope (SPEC §10). Not in the JSON.
    /// Shared: a scope's statuses between two changes of its governance
    /// heads hold the same list (one status per scope a commit touches:
    /// with thousands of scopes each was a copy, compared by the committer
    /// with the last).
    pub members: std::sync::Arc<[(PublicKey, Role)]>,
}

impl ScopeStatus {
    /// Whether `key` is a member (any role) of the scope at its current
    /// governance heads.
    pub fn is_member(&self, key: &PublicKey) -> bool {
        self.members.binary_search_by(|(m, _)| m.cmp(key)).is_ok()
    }

    /// The JSON object of SPEC §11.
    pub fn to_json(&self) -> serde_json::Value {
        let hexes = |v: &[Hash]| v.iter().map(hex::encode).collect::<Vec<_>>();
        serde_json::json!({
            "scope": hex::encode(self.scope),
            "root": hex::encode(self.root),
            "data_heads": hexes(&self.data_heads),
            "governance_heads": hexes(&self.governance_heads),
            "applied": self.applied,
            "pending": self.pending,
            "key_waiting": self.key_waiting,
            "data_key_waiting": self.data_key_waiting,
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScopeReport {
    pub scope: Hash,
    pub root: Hash,
    pub data_heads: Vec<Hash>,
    pub governance_heads: Vec<Hash>,
    pub applied: Vec<Hash>,
    pub dropped: BTreeMap<Hash, Reason>,
    pub key_waiting: Vec<Hash>,
    pub data_key_waiting: Vec<Hash>,
    pub pending: Vec<Hash>,
    pub divergences: u64,
}
