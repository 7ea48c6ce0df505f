//! A store that fails its N-th operation: the countdown of redb's fuzzer
//! and RocksDB's db_stress, over the in-memory store.
//!
//! Every write (`Store::write`), read (`Store::get`) and read of the cold
//! index (`ColdOps::get`) counts one, in one sequence; the N-th fails. Only
//! that one: a disk that errs once and then answers again, so that a node
//! which stops must stop by itself. After a failed write the store refuses
//! every later one (`MemStore`'s rule, `store`). `MemStore::reopened` on
//! `durable` is what a restart finds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::memory::MemStore;
use super::{Store, StoreError};
use crate::core::{Cf, ColdOps, ColdReadFailed, TableScan, Write};
use crate::protocol::Hash;

/// The operations counted so far, and which one fails (none with 0).
#[derive(Debug, Default)]
pub struct Countdown {
    fail_at: AtomicU64,
    done: AtomicU64,
}

impl Countdown {
    /// Fails operation `fail_at` (from 1), or none (`None`).
    pub fn new(fail_at: Option<u64>) -> Arc<Countdown> {
        Arc::new(Countdown { fail_at: AtomicU64::new(fail_at.unwrap_or(0)), done: AtomicU64::new(0) })
    }

    /// Fails no operation from now on (one already failed stays failed).
    pub fn disarm(&self) {
        if !self.landed() {
            self.fail_at.store(0, Ordering::SeqCst);
        }
    }

    /// Fails the next operation.
    pub fn fail_next(&self) {
        self.fail_at.store(self.done() + 1, Ordering::SeqCst);
    }

    /// Operations counted so far (the failed one included).
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::SeqCst)
    }

    /// Whether the fault was injected.
    pub fn landed(&self) -> bool {
        let at = self.fail_at.load(Ordering::SeqCst);
        at > 0 && self.done() >= at
    }

    /// Counts one operation; whether it is the one to fail.
    fn fails(&self) -> bool {
        self.done.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_at.load(Ordering::SeqCst)
    }
}

/// The in-memory store behind a countdown, shared with its cold reader.
#[derive(Clone)]
pub struct FaultyStore {
    pub durable: Arc<Mutex<MemStore>>,
    pub countdown: Arc<Countdown>,
}

impl FaultyStore {
    pub fn new(store: MemStore, countdown: Arc<Countdown>) -> Self {
        FaultyStore { durable: Arc::new(Mutex::new(store)), countdown }
    }
}

impl TableScan for FaultyStore {
    fn scan(&self, cf: Cf, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), crate::core::ScanFailed> {
        self.durable.lock().unwrap().scan(cf, f)
    }
}

impl Store for FaultyStore {
    fn write(&mut self, writes: &[Write], sync: bool) -> Result<(), StoreError> {
        let mut store = self.durable.lock().unwrap();
        if self.countdown.fails() {
            // The in-memory store's own fault, armed to fire now: it fails
            // this write and refuses every later one.
            store.fail_after_writes = Some(0);
        }
        store.write(writes, sync)
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if self.countdown.fails() {
            return Err(StoreError::Injected("read failure"));
        }
        self.durable.lock().unwrap().get(cf, key)
    }

    fn op_ids_with_prefix(&self, prefix: &[u8], max: usize) -> Result<Vec<Hash>, StoreError> {
        if self.countdown.fails() {
            return Err(StoreError::Injected("read failure"));
        }
        self.durable.lock().unwrap().op_ids_with_prefix(prefix, max)
    }

    fn cold_reader(&self) -> Option<Box<dyn ColdOps>> {
        Some(Box::new(self.clone()))
    }
}

impl ColdOps for FaultyStore {
    fn get(&self, id: &Hash) -> Result<Option<Vec<u8>>, ColdReadFailed> {
        Store::get(self, Cf::Ops, id).map_err(|e| ColdReadFailed(e.to_string()))
    }

    fn scan(&self, f: &mut dyn FnMut(&Hash, &[u8])) -> Result<(), ColdReadFailed> {
        let store = self.durable.lock().unwrap();
        for (k, v) in store.table(Cf::Ops).into_iter().flatten() {
            f(&k.as_slice().try_into().expect("op ids are 32 bytes"), v)
        }
        Ok(())
    }
}
