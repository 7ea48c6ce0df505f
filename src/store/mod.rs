//! Storage: the `Store` trait, its RocksDB adapter (one column family per
//! table, one atomic write batch per commit) and an in-memory model.
//!
//! After a failed write a store refuses every later write (redb's rule): the
//! in-memory engine has moved past what is on disk, and only a reopen, which
//! rebuilds the engine from disk, brings the two back together.

pub mod batch;
// A store that fails its N-th operation, for the tests and campaigns.
#[cfg(any(test, feature = "testkit"))]
pub mod faulty;
pub mod memory;
#[cfg(feature = "rocksdb-store")]
pub mod rocks;

use crate::core::{Cf, TableScan, Write};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[cfg(feature = "rocksdb-store")]
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("the store refuses writes after an earlier failure ({0}); restart the node")]
    Refusing(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("injected fault: {0}")]
    Injected(&'static str),
    /// A read of applied ops back from the store failed: the engine stopped
    /// (`core::Engine::cold_failed`), and nothing more is written.
    #[error("the store refuses writes after a failed read; restart the node: {0}")]
    ColdRead(#[from] crate::core::ColdReadFailed),
    /// A read of the tables at open failed (`core::TableScan`): the message
    /// is the store's (for a damaged table, `Corrupt`'s, with what to do).
    #[error("{0}")]
    Scan(#[from] crate::core::ScanFailed),
    /// The data directory holds the identity's secret keys, every group key
    /// and decrypted cells: a directory other users may enter is refused.
    #[error(
        "the data directory {path} is open to other users (mode {mode:o}); it holds the node's secret keys and decrypted state. \
         Make it private (chmod 700 {path}) and consider the keys in it exposed if others could read them"
    )]
    NotPrivate { path: String, mode: u32 },
    /// Written by a later dagfold: its layout may hold what this binary
    /// would misread, so it is not opened.
    #[error(
        "the store at {path} has format version {found}; this dagfold reads versions up to {FORMAT_VERSION}. \
         Run the newer dagfold that wrote it (a store is never converted back to an older format)"
    )]
    FormatTooNew { path: String, found: u32 },
    /// A format record, or tables, this binary does not know.
    #[error(
        "the store at {path} is in no format this dagfold knows ({what}): written by a newer dagfold, not a dagfold \
         store, or its meta table is damaged; it was left as it is"
    )]
    FormatUnknown { path: String, what: String },
    /// RocksDB found the files damaged (a WAL record or a table block
    /// failing its checksum), at open, in the restore's reads of applied
    /// ops, or in the node's first read of the ops table while it serves.
    /// No data was changed: going on could roll back commits the node had
    /// acknowledged.
    #[error(
        "the store at {path} is corrupt; dagfold stopped and left its data as it is: {detail}. \
         To resync from a peer: move the directory aside (mv {path} {path}.corrupt) and start the node again with \
         --peer KEY@ADDR (docs/RELIABILITY.md, \"Corruption at open\")"
    )]
    Corrupt { path: String, detail: String },
    /// An op's record in the ops table did not read back as the op it
    /// was stored as (`core::oprecord`): a parent it refers to is missing
    /// or does not give the op's id. The table is damaged.
    #[error("the op {id} in the ops table does not read back whole: {why}")]
    OpRecord { id: String, why: crate::core::oprecord::RecordError },
}

/// The store's format version, in `Cf::Meta` under `core::META_FORMAT`
/// (u32 LE), written when a store is created. Version 1 is the layout of
/// docs/ARCHITECTURE.md, "Storage", as of 2026-12-04, the older records it
/// still reads included; a store with no version was written before
/// versions existed, holds that layout, and is given version 1 at its
/// next open. A change of layout that an older binary would misread takes
/// the next version; a binary refuses a store of a later version than its
/// own (`StoreError::FormatTooNew`), and `tests/fixtures/store-v1` keeps
/// a store of version 1 that every later binary must open.
///
/// Version 2 (2026-12-05) adds the compact record of an applied data op
/// in the ops table (`core::oprecord`: its parents by reference), which a
/// binary of version 1 would take for a malformed op. Every record of
/// version 1 is still read as it was, so a store of version 1 is given
/// version 2 at its first open by this binary, before anything is written.
pub const FORMAT_VERSION: u32 = 2;

/// Checks the format version of the store just opened at `path`, writing
/// this binary's where there is none (a new store, or one from before
/// versions) or an older one (whose records this binary reads).
pub fn check_format(store: &mut dyn Store, path: &std::path::Path) -> Result<(), StoreError> {
    let path = path.display().to_string();
    match store.get(Cf::Meta, crate::core::META_FORMAT)? {
        None => store.write(&[Write::Put(Cf::Meta, crate::core::META_FORMAT.to_vec(), FORMAT_VERSION.to_le_bytes().to_vec())], true),
        Some(v) => match <[u8; 4]>::try_from(v.as_slice()).map(u32::from_le_bytes) {
            Ok(found) if found == FORMAT_VERSION => Ok(()),
            // An older layout, all of whose records this binary reads: from
            // now on it may hold records the older binary would misread.
            Ok(found) if (1..FORMAT_VERSION).contains(&found) => {
                store.write(&[Write::Put(Cf::Meta, crate::core::META_FORMAT.to_vec(), FORMAT_VERSION.to_le_bytes().to_vec())], true)
            }
            Ok(found) if found > FORMAT_VERSION => Err(StoreError::FormatTooNew { path, found }),
            _ => Err(StoreError::FormatUnknown { path, what: format!("format record {}", hex::encode(&v)) }),
        },
    }
}

pub trait Store: TableScan + Send {
    /// Writes all of `writes` atomically; with `sync` the WAL is on disk
    /// before this returns.
    fn write(&mut self, writes: &[Write], sync: bool) -> Result<(), StoreError>;
    /// An encoder of this store's batches for another thread than the
    /// writer's (`pipeline::committer`), or none: the writes then go to
    /// `write` as they are.
    fn batch_encoder(&self) -> Option<batch::BatchEncoder> {
        None
    }
    /// Writes batches made by this store's `batch_encoder`, in order, as
    /// one atomic batch; with `sync` the WAL is on disk before this
    /// returns. A store without an encoder takes none.
    fn write_encoded(&mut self, batches: &[&batch::Encoded], sync: bool) -> Result<(), StoreError> {
        let _ = (batches, sync);
        Err(StoreError::Refusing("this store encodes no batches".into()))
    }
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Bytes on disk (0 for the in-memory model).
    fn disk_bytes(&self) -> u64 {
        0
    }
    /// Per table, the bytes of its table files and of its memtables (none
    /// for the in-memory model).
    fn table_bytes(&self) -> Vec<(Cf, u64, u64)> {
        Vec::new()
    }
    /// The ids in the ops table that start with `prefix`, at most `max`.
    fn op_ids_with_prefix(&self, prefix: &[u8], max: usize) -> Result<Vec<crate::protocol::Hash>, StoreError>;
    /// The op stored under `id` as it was signed: a compact record's
    /// parents looked up in the table (`core::oprecord`).
    fn op(&self, id: &crate::protocol::Hash) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(record) = self.get(Cf::Ops, id)? else { return Ok(None) };
        op_as_signed(id, record, |p, max| self.op_ids_with_prefix(p, max)).map(Some)
    }
    /// A reader of applied ops for the engine's cold index (`core::cold`),
    /// or none: the engine then keeps every applied op in memory.
    fn cold_reader(&self) -> Option<Box<dyn crate::core::ColdOps>> {
        None
    }
}

/// The ids a parent reference of a compact op record is looked up to: two
/// are already a 2^64 search for whoever would make them.
const REFERENCE_MATCHES_MAX: usize = 8;

/// `record`, stored under `id` in the ops table, as the op was signed:
/// `ids_with_prefix(prefix, max)` looks a parent reference up in the table
/// (only for a compact record).
pub fn op_as_signed(
    id: &crate::protocol::Hash,
    record: Vec<u8>,
    mut ids_with_prefix: impl FnMut(&[u8], usize) -> Result<Vec<crate::protocol::Hash>, StoreError>,
) -> Result<Vec<u8>, StoreError> {
    crate::core::oprecord::expand(id, record, |p| ids_with_prefix(p, REFERENCE_MATCHES_MAX).map_err(|e| e.to_string()))
        .map_err(|why| StoreError::OpRecord { id: hex::encode(id), why })
}

/// Makes `path` the node's private data directory: created owner-only
/// (0700) if missing, made so if it exists empty (it holds nothing yet),
/// refused if it holds anything and has any group or other permission bit;
/// and the process's umask set to 0077, so that every file RocksDB and the
/// node create in it afterwards is 0600.
pub fn private_dir(path: &std::path::Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        // SAFETY: umask only sets the process's file-creation mask.
        unsafe { libc::umask(0o077) };
        match std::fs::metadata(path) {
            Ok(m) => {
                let mode = m.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    if std::fs::read_dir(path)?.next().is_some() {
                        return Err(StoreError::NotPrivate { path: path.display().to_string(), mode });
                    }
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(path)?;
    Ok(())
}

/// Bytes of the files under `path` (the store's footprint on disk).
pub fn dir_bytes(path: &std::path::Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(path) else { return 0 };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The node identity, created on first use and kept in the store.
pub fn load_or_create_identity(store: &mut dyn Store) -> Result<crate::core::Identity, StoreError> {
    use crate::core::{Identity, META_IDENTITY};
    if let Some(bytes) = store.get(Cf::Meta, META_IDENTITY)? {
        return Ok(Identity::decode(&bytes).expect("stored identity is 64 bytes"));
    }
    use rand::RngCore;
    let mut seed = [0u8; 32];
    let mut kem = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut seed);
    rand::rngs::OsRng.fill_bytes(&mut kem);
    let id = Identity::from_secrets(seed, kem);
    store.write(&[Write::Put(Cf::Meta, META_IDENTITY.to_vec(), id.encode())], true)?;
    Ok(id)
}
