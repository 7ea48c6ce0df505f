//! An in-memory store: the model for tests, and a backend for benchmarks of
//! the engine alone. It can be told to fail a write (fault injection).

use std::collections::BTreeMap;

use super::{Store, StoreError};
use crate::core::{Cf, TableScan, Write};

#[derive(Default, Clone)]
pub struct MemStore {
    tables: BTreeMap<&'static str, BTreeMap<Vec<u8>, Vec<u8>>>,
    /// Fail the write after this many more succeed.
    pub fail_after_writes: Option<u64>,
    failed: Option<String>,
    pub writes: u64,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn table(&self, cf: Cf) -> Option<&BTreeMap<Vec<u8>, Vec<u8>>> {
        self.tables.get(cf.name())
    }

    /// What a restart finds: the same tables, no fault armed, no refusal.
    pub fn reopened(&self) -> MemStore {
        MemStore { tables: self.tables.clone(), ..MemStore::default() }
    }
}

impl TableScan for MemStore {
    fn scan(&self, cf: Cf, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), crate::core::ScanFailed> {
        if let Some(t) = self.tables.get(cf.name()) {
            for (k, v) in t {
                f(k, v);
            }
        }
        Ok(())
    }
}

impl Store for MemStore {
    fn write(&mut self, writes: &[Write], _sync: bool) -> Result<(), StoreError> {
        if let Some(why) = &self.failed {
            return Err(StoreError::Refusing(why.clone()));
        }
        if let Some(n) = self.fail_after_writes.as_mut() {
            if *n == 0 {
                self.failed = Some("injected write failure".into());
                return Err(StoreError::Injected("write failure"));
            }
            *n -= 1;
        }
        for w in writes {
            match w {
                Write::Put(cf, k, v) => {
                    self.tables.entry(cf.name()).or_default().insert(k.clone(), v.clone());
                }
                Write::Delete(cf, k) => {
                    if let Some(t) = self.tables.get_mut(cf.name()) {
                        t.remove(k);
                    }
                }
            }
        }
        self.writes += 1;
        Ok(())
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.tables.get(cf.name()).and_then(|t| t.get(key).cloned()))
    }

    fn op_ids_with_prefix(&self, prefix: &[u8], max: usize) -> Result<Vec<crate::protocol::Hash>, StoreError> {
        let Some(t) = self.tables.get(Cf::Ops.name()) else { return Ok(Vec::new()) };
        Ok(t.range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter_map(|(k, _)| k.as_slice().try_into().ok())
            .take(max)
            .collect())
    }
}
