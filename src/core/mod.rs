//! The sans-IO core: verdicts, governance at a cut, buffers, fold, root.
/// Maps keyed by ids (SHA-256 outputs): foldhash, seeded per process, is
/// several times cheaper than SipHash here (the profile named
/// `DefaultHasher::write`) and still keyed, so a peer cannot aim ids at one
/// bucket; an id's 32 bytes are taken inline (`protocol::idhash`).
/// Iteration order never reaches the state: every output is sorted.
pub type IdMap<K, V> = std::collections::HashMap<K, V, crate::protocol::idhash::IdState>;
pub type IdSet<K> = std::collections::HashSet<K, crate::protocol::idhash::IdState>;

/// Bytes of memory a hash map (or set: `V = ()`) of `capacity` entries of
/// `(K, V)` holds: its slots and their control bytes (hashbrown's layout),
/// not what the entries point to. For the memory gauges.
pub fn map_bytes<K, V>(capacity: usize) -> u64 {
    (capacity * (std::mem::size_of::<(K, V)>() + 1)) as u64
}

/// Starts loading the cache line that holds `value`, so that a read of it
/// soon after overlaps its miss with other work. Changes nothing; nothing
/// off x86_64.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch has no effect on memory, and a reference's address
    // is valid.
    unsafe {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(value as *const T as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

mod buffers;
pub mod cold;
pub mod commit;
pub mod draft;
pub mod engine;
pub mod governance;
pub mod prejudge;
pub mod projection;
pub mod projector;
pub mod queries;
pub mod oprecord;
pub mod restore;
pub mod smt;
pub mod tables;
pub mod types;

pub use cold::{ColdOps, ColdReadFailed};
pub use commit::{Check, Commit, EventOut, Fold};
pub use draft::{Draft, DraftRefused};
pub use engine::{Engine, EngineMemory};
pub use prejudge::{authorize_at, PreAuth, Prepared, VerifiedOp};
pub use projector::{Projector, ProjectorStats};
pub use restore::{ScanFailed, TableScan};
pub use tables::{Cf, ScopeRecord, Write, META_DELIVERY_PREFIX, META_FOLLOW_PREFIX, META_FORMAT, META_IDENTITY, META_SCOPE_PREFIX};
pub use types::{BufKind, Config, GenesisPolicy, Identity, OpState, Outcome, Reason, Scope, ScopeReport, ScopeStatus, Stats};
/// Frame decoding lives in `protocol`; re-exported here for the drivers.
pub use crate::protocol::codec::{decode_frame, Decoded};
