//! Storage: the `Store` trait, its RocksDB adapter (one column family per
//! table, one atomic write batch per commit) and an in-memory model.
//!
//! After a failed write a store refuses every later write (redb's rule): the
//! in-memory engine has moved past what is on disk, and only a reopen, which
//! rebuilds the engine from disk, brings the two back together.

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
    /// The data directory holds the identity's secret keys, every group key
    /// and decrypted cells: a directory other users may enter is refused.
    #[error(
        "the data directory {path} is open to other users (mode {mode:o}); it holds the node's secret keys and decrypted state. \
         Make it private (chmod 700 {path}) and consider the keys in it exposed if others could read them"
    )]
    NotPrivate { path: String, mode: u32 },
}

pub trait Store: TableScan + Send {
    /// Writes all of `writes` atomically; with `sync` the WAL is on disk
    /// before this returns.
    fn write(&mut self, writes: &[Write], sync: bool) -> Result<(), StoreError>;
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Bytes on disk (0 for the in-memory model).
    fn disk_bytes(&self) -> u64 {
        0
    }
    /// A reader of applied ops for the engine's cold index (`core::cold`),
    /// or none: the engine then keeps every applied op in memory.
    fn cold_reader(&self) -> Option<Box<dyn crate::core::ColdOps>> {
        None
    }
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
