//! The RocksDB adapter: one column family per table of `core::Cf`, one
//! `WriteBatch` per commit, the WAL synced per batch in durable mode.

use std::path::Path;
use std::sync::Arc;

use metrics::histogram;
use rocksdb::{ColumnFamilyDescriptor, Options, WriteBatch, WriteOptions, DB};

use super::batch::{in_batch_order, read_varint32, BatchEncoder, Encoded, HEADER_BYTES, TAG_PUT};
use super::{Store, StoreError};
use crate::core::{Cf, TableScan, Write};

pub struct RocksStore {
    db: Arc<DB>,
    failed: Option<String>,
    path: std::path::PathBuf,
    /// The batches encoded in Rust (`store::batch`), checked against
    /// RocksDB's own encoding at open; none if they differ.
    encoder: Option<BatchEncoder>,
}

impl RocksStore {
    /// Opens (or creates) the store in `path`, a private directory
    /// (`super::private_dir`: refused if other users may enter it).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_tuned(path, None)
    }

    /// `open`, with every table's memtable capped at `memtable_bytes_max`
    /// (the node's `--memtable-bytes-max`): smaller memtables flush more
    /// often.
    pub fn open_tuned(path: &Path, memtable_bytes_max: Option<usize>) -> Result<Self, StoreError> {
        super::private_dir(path)?;
        let cap = |bytes: usize| memtable_bytes_max.map_or(bytes, |m| bytes.min(m.max(MEMTABLE_BYTES_MIN)));
        keep_rocksdb_allocations_on_the_heap();
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        // Two cores (NUMBERS.md): one flush and one compaction at a time.
        opts.increase_parallelism(2);
        opts.set_max_background_jobs(2);
        // Memtables: small ones measured faster (`dagfold import` of 100k ops:
        // 2.5 s CPU at 8 MiB against 2.9 s at 64 MiB and 3.1 s at 4 MiB):
        // the skip-list search (FindSpliceForLevel) is the top RocksDB cost.
        opts.set_write_buffer_size(cap(64 << 20));
        // One writer thread (the committer): the single-writer memtable
        // insert reuses its skip-list splice, the concurrent one does not.
        opts.set_allow_concurrent_memtable_write(false);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        // A WAL file is deleted once every column family's data in it is
        // flushed; meta and events take a few writes per commit and would
        // otherwise hold every WAL file up to RocksDB's derived bound (4 ×
        // the sum of all memtables, ~0.5 GiB). At 64 MiB RocksDB flushes
        // them sooner: 300k causal ops left 43–51 MB of WAL instead of 225
        // MB (disk 158–165 MB against 340 MB), less for a restart to replay.
        opts.set_max_total_wal_size(64 << 20);
        // WAL recovery: an incomplete record at the end of the log is
        // dropped, any other damage stops the open. A record is cut at the
        // tail only by a crash or power cut during its write, before its
        // sync returned, so its commit was never acknowledged (the node
        // tells nothing before the sync: docs/ARCHITECTURE.md); dropping it
        // loses nothing promised. A record failing its checksum, or damage
        // before the end, means the medium lost bytes: RocksDB's default
        // (point in time) would then replay up to the damage and drop every
        // later record, acknowledged commits too, without a word. Here the
        // open fails instead (`StoreError::Corrupt`), the store is left as
        // it is, and the operator resyncs from a peer
        // (docs/RELIABILITY.md, "Corruption at open"). Absolute consistency
        // would refuse the cut tail that every kill during a write leaves.
        opts.set_wal_recovery_mode(rocksdb::DBRecoveryMode::TolerateCorruptedTailRecords);
        let cfs: Vec<ColumnFamilyDescriptor> = Cf::ALL
            .iter()
            .map(|cf| {
                let mut o = Options::default();
                // Out of order nearly every op is parked, a ~420-byte put
                // and later a delete: with 32 MiB most of them meet in the
                // memtable, and the flush drops the put (RocksDB background
                // CPU in shuffled 1.17–1.38 s → 0.84–1.01 s per 200k ops;
                // ARCHITECTURE.md, "Memtables").
                // Ops: 32 MiB. The ids are random, so every L0 → L1
                // compaction rewrites all of L1, and how often it runs is
                // set by the memtable size (four flushes each). 600k causal
                // ops at 8 MiB, two runs: 49.0–49.3k ops/s, compaction CPU
                // 3.97 s, 1.55–1.60 GB written; at 32 MiB, three runs
                // paired with them: 60.0–64.3k ops/s, 1.23–1.57 s, 0.96–1.06
                // GB (64 MiB: 61.5k; ARCHITECTURE.md, "Memtables").
                o.set_write_buffer_size(cap(match cf {
                    Cf::Pending | Cf::Ops => 32 << 20,
                    Cf::Projection => 8 << 20,
                    _ => 4 << 20,
                }));
                // LZ4 everywhere: turning it off for the ciphertext column
                // families measured no better (`tools/bench reversed`: 16.7k
                // ops/s without, 19.7k with; noisy) and stores more bytes.
                o.set_compression_type(rocksdb::DBCompressionType::Lz4);
                // (-14: RocksDB's default window bits, used by zlib only.)
                o.set_compression_options(-14, LZ4_LEVEL, 0, 0);
                if *cf == Cf::Ops {
                    // The ops table in 16 KiB blocks, not 4: LZ4 compresses
                    // a block alone, and an op's scope, author, key id and
                    // cut repeat in the ops beside it, so a larger block
                    // finds more of them (2,000,000 ops of `dagfold-loadgen
                    // file --view-lag 4` imported: the table 369 B/op at 4
                    // KiB, 347 at 16, 341 at 64; docs/PERFORMANCE.md). A
                    // point read (sync, cold checks) decompresses the whole
                    // block: ~4 µs at 16 KiB.
                    let mut table = rocksdb::BlockBasedOptions::default();
                    table.set_block_size(OPS_BLOCK_BYTES);
                    o.set_block_based_table_factory(&table);
                }
                // Column families read only by the scan at open get vector
                // memtables: an insert is an append, sorted once at flush,
                // instead of a skip-list search per key (FindSpliceForLevel
                // and the memcmp of the shared 32-byte scope prefix were half
                // of the committer's time). A point read or iterator on a
                // mutable vector memtable would sort it, so ops (sync reads),
                // events (subscriptions), meta (identity) and items (the API's
                // listings) keep the skip list.
                if !uses_skip_list(*cf) {
                    o.set_memtable_factory(rocksdb::MemtableFactory::Vector);
                }
                ColumnFamilyDescriptor::new(cf.name(), o)
            })
            .collect();
        // Tables this binary does not know: a later format; opening would
        // fail on them anyway, with a less useful message.
        if let Ok(names) = DB::list_cf(&opts, path) {
            let unknown: Vec<String> =
                names.into_iter().filter(|n| n != "default" && !Cf::ALL.iter().any(|cf| cf.name() == n)).collect();
            if !unknown.is_empty() {
                return Err(StoreError::FormatUnknown { path: path.display().to_string(), what: format!("tables {unknown:?}") });
            }
        }
        let db = DB::open_cf_descriptors(&opts, path, cfs).map_err(|e| corrupt_or(path, e))?;
        // RocksDB starts its pools' threads with the first database open.
        lower_flush_priority();
        // A damaged table is found by the restore's read of it
        // (`TableScan::scan`, `StoreError::Scan` with `Corrupt`'s message).
        let encoder = checked_encoder(&db);
        if encoder.is_none() {
            eprintln!("dagfold: RocksDB encodes its write batches unlike store::batch; batches are built through its C API");
        }
        let mut store = RocksStore { db: Arc::new(db), failed: None, path: path.to_path_buf(), encoder };
        super::check_format(&mut store, path)?;
        Ok(store)
    }

    fn cf(&self, cf: Cf) -> &rocksdb::ColumnFamily {
        handle(&self.db, cf)
    }

    /// A read handle that other threads may use while this store writes
    /// (RocksDB reads are safe concurrently with writes).
    pub fn reader(&self) -> StoreReader {
        StoreReader { db: self.db.clone(), path: self.path.clone() }
    }

    pub fn flush(&self) -> Result<(), StoreError> {
        for cf in Cf::ALL {
            self.db.flush_cf(self.cf(cf))?;
        }
        self.db.flush_wal(true)?;
        Ok(())
    }
}

impl RocksStore {
    /// Writes `batch`; a failure makes the store refuse every later write.
    fn write_batch(&mut self, batch: WriteBatch, sync: bool) -> Result<(), StoreError> {
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        // The WAL's share of the write (append and, when syncing, the
        // fdatasync), from RocksDB's per-thread perf context: a commit is
        // slow either here (the disk) or in the memtable (CPU). On this
        // machine kind a sync now and then takes 100–400 ms where it
        // usually takes ~1 ms, and the whole pipeline waits behind it
        // (docs/PERFORMANCE.md, "Latency at half rate").
        rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::EnableTime);
        let mut perf = rocksdb::perf::PerfContext::default();
        perf.reset();
        let written = self.db.write_opt(batch, &wo);
        let wal_ns = perf.metric(rocksdb::perf::PerfMetric::WriteWalTime);
        let memtable_ns = perf.metric(rocksdb::perf::PerfMetric::WriteMemtableTime);
        rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::Disable);
        histogram!("dagfold_store_wal_seconds").record(wal_ns as f64 / 1e9);
        histogram!("dagfold_store_memtable_seconds").record(memtable_ns as f64 / 1e9);
        if let Err(e) = written {
            self.failed = Some(e.to_string());
            return Err(e.into());
        }
        Ok(())
    }

    /// A read error of the restore's scan, with `corrupt_or`'s message.
    fn scan_failed(&self, e: rocksdb::Error) -> crate::core::ScanFailed {
        crate::core::ScanFailed(corrupt_or(&self.path, e).to_string())
    }
}

/// `StoreError::Corrupt` for RocksDB's corruption errors (checksums,
/// damaged files), else the error as it is.
fn corrupt_or(path: &Path, e: rocksdb::Error) -> StoreError {
    match e.kind() {
        rocksdb::ErrorKind::Corruption => StoreError::Corrupt { path: path.display().to_string(), detail: e.into_string() },
        _ => e.into(),
    }
}

/// The op stored under `id` as it was signed: a compact record's
/// references looked up with one iterator, made for its first, in
/// ascending order as the parents are (`core::oprecord`).
fn op_as_signed(db: &DB, id: &crate::protocol::Hash) -> Result<Option<Vec<u8>>, StoreError> {
    let h = handle(db, Cf::Ops);
    let Some(record) = db.get_cf(h, id)? else { return Ok(None) };
    let mut it = None;
    super::op_as_signed(id, record, |p, max| op_ids_with_prefix(it.get_or_insert_with(|| ops_iterator(db)), p, max)).map(Some)
}

fn ops_iterator(db: &DB) -> rocksdb::DBRawIteratorWithThreadMode<'_, DB> {
    db.raw_iterator_cf(handle(db, Cf::Ops))
}

/// The ids in the ops table starting with `prefix`, at most `max`: a
/// parent reference of a compact op record (`core::oprecord`).
fn op_ids_with_prefix(
    it: &mut rocksdb::DBRawIteratorWithThreadMode<'_, DB>,
    prefix: &[u8],
    max: usize,
) -> Result<Vec<crate::protocol::Hash>, StoreError> {
    it.seek(prefix);
    let mut out = Vec::new();
    while it.valid() && out.len() < max {
        let Some(k) = it.key() else { break };
        if !k.starts_with(prefix) {
            break;
        }
        if let Ok(id) = k.try_into() {
            out.push(id);
        }
        it.next();
    }
    it.status()?;
    Ok(out)
}

/// The column family of `cf`, opened with the database.
fn handle(db: &DB, cf: Cf) -> &rocksdb::ColumnFamily {
    db.cf_handle(cf.name()).expect("every column family is opened")
}

/// Counts a batch's writes per table (`dagfold_store_writes_total`), in the
/// order of `Cf::ALL`.
fn count_writes(per_table: [u64; Cf::ALL.len()]) {
    for (cf, n) in Cf::ALL.iter().zip(per_table) {
        if n > 0 {
            metrics::counter!("dagfold_store_writes_total", "cf" => cf.name()).increment(n);
        }
    }
}

/// The encoder of `store::batch` with each table's column family id, read
/// from RocksDB's own encoding of a put into it, if it encodes puts and
/// deletes of every table, short and long, as RocksDB does; else none.
fn checked_encoder(db: &DB) -> Option<BatchEncoder> {
    let mut ids = [0u32; Cf::ALL.len()];
    for (i, cf) in Cf::ALL.iter().enumerate() {
        let mut b = WriteBatch::default();
        b.put_cf(handle(db, *cf), b"", b"");
        let d = b.data();
        if d.len() <= HEADER_BYTES + 1 || d[HEADER_BYTES] != TAG_PUT {
            return None;
        }
        ids[i] = read_varint32(&d[HEADER_BYTES + 1..])?.0;
    }
    let encoder = BatchEncoder::new(ids, uses_skip_list);
    let mut sample = Vec::new();
    for cf in Cf::ALL {
        for (k, v) in [(0, 0), (1, 127), (200, 128), (32, 20_000)] {
            sample.push(Write::Put(cf, vec![k as u8; k], vec![v as u8; v]));
            sample.push(Write::Delete(cf, vec![v as u8; k]));
        }
    }
    let ours = encoder.encode_in_order(sample.iter(), sample.len());
    (ours.bytes() == rocksdb_batch(db, sample.iter(), 0).data()).then_some(encoder)
}

/// `writes` as a batch built through RocksDB's C API, in the order given.
fn rocksdb_batch<'a>(db: &DB, writes: impl Iterator<Item = &'a Write>, bytes: usize) -> WriteBatch {
    let mut batch = WriteBatch::with_capacity_bytes(bytes);
    for w in writes {
        match w {
            Write::Put(cf, k, v) => batch.put_cf(handle(db, *cf), k, v),
            Write::Delete(cf, k) => batch.delete_cf(handle(db, *cf), k),
        }
    }
    batch
}

/// The column families read while the node runs keep RocksDB's skip-list
/// memtable; the others get the vector memtable (see `open`).
fn uses_skip_list(cf: Cf) -> bool {
    matches!(cf, Cf::Ops | Cf::Events | Cf::Meta | Cf::Items)
}

/// glibc's malloc, which RocksDB's C++ uses (Rust allocates with
/// mimalloc), serves blocks above a threshold with fresh `mmap`s, so each
/// commit's write batch (megabytes, grown by doubling) and each memtable
/// arena block landed on new pages that the kernel zeroes: `clear_page_erms`
/// was an eighth of the committer thread in shuffled, under the batch's
/// reallocations. With the threshold at 64 MiB and trimming past 256 MiB
/// they come from the heap and are reused (committer CPU per 200k shuffled
/// ops 1.47–1.61 → 1.18–1.50 s, two pairs, and the zeroing left the
/// profile). Process-wide and set once, before the first store opens.
fn keep_rocksdb_allocations_on_the_heap() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: mallopt only changes glibc's allocation parameters; it is
        // called once, and the values are in range.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        }
    });
}

/// Niceness of RocksDB's flush threads (its high-priority pool, threads
/// named `rocksdb:high`), the same as the verifiers'. A flush is a burst
/// of 50–130 ms of one core (sorting and compressing a memtable) that at
/// normal priority took the core from the orderer, projector and
/// committer, whose ops then waited behind it: the longest stalls of the
/// applied count at half rate began as a flush ended. Niced, it runs on
/// what they leave. Half rate (100k ops at 33k/s), eight interleaved pairs
/// with the thread reniced from outside: p99 median 28.9 → 16.4 ms, max
/// 34.5 → 26.9 ms; shuffled, three pairs: 50.1/51.3/49.7k →
/// 53.5/52.9/53.6k ops/s. Compaction (`rocksdb:low`) keeps its priority:
/// niced too, it fell behind (disk per op at the end of shuffled
/// 590/629 → 763/802 B).
pub const FLUSH_NICE: i32 = 10;

/// LZ4's level for every table: a level below zero is LZ4's acceleration
/// (here 4), which skips ahead faster where it finds no match. The tables
/// are mostly ciphertext, ids and signatures, where LZ4 finds little but
/// the fields an op shares with the ops beside it (scope, author, key id,
/// cut), long matches that it still finds. 1M ops at 20k/s, two pairs:
/// flush and compaction 4.45 / 4.82 → 3.90 / 3.88 µs per op, disk 398 /
/// 397 → 396 / 397 B/op; at 16 the disk grew to 416 B/op
/// (docs/PERFORMANCE.md, 2026-12-07).
const LZ4_LEVEL: i32 = -4;

/// The smallest memtable `open_tuned` sets, whatever its cap: one commit's
/// batch of ~4k ops should fit in a few.
const MEMTABLE_BYTES_MIN: usize = 64 << 10;

/// The ops table's block size (see `open`).
const OPS_BLOCK_BYTES: usize = 16 << 10;

/// Read-ahead of the table scans at open (`TableScan::scan`, and the cold
/// filter's read of the ops table): each reads a whole table once, in key
/// order.
const SCAN_READAHEAD_BYTES: usize = 4 << 20;

/// Every record of `cf` in key order, once: blocks read ahead and not kept
/// in the block cache, each record borrowed where it lies, not copied.
fn scan_table(db: &DB, cf: Cf, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), rocksdb::Error> {
    let mut opts = rocksdb::ReadOptions::default();
    opts.fill_cache(false);
    opts.set_readahead_size(SCAN_READAHEAD_BYTES);
    let mut it = db.raw_iterator_cf_opt(handle(db, cf), opts);
    it.seek_to_first();
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        f(k, v);
        it.next();
    }
    // A failed read (a block failing its checksum) ends the iteration.
    it.status()
}

/// Lowers the priority of RocksDB's flush threads to `FLUSH_NICE` (found
/// by name in `/proc/self/task`). Returns the threads at `FLUSH_NICE` or
/// above.
pub fn lower_flush_priority() -> usize {
    #[cfg(target_os = "linux")]
    {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
        tasks
            .flatten()
            .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("rocksdb:high")))
            .filter_map(|t| t.file_name().to_str().and_then(|s| s.parse::<libc::id_t>().ok()))
            .filter(|tid| crate::niceness::lower_thread(*tid, FLUSH_NICE))
            .count()
    }
    #[cfg(not(target_os = "linux"))]
    0
}

impl TableScan for RocksStore {
    fn scan(&self, cf: Cf, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), crate::core::ScanFailed> {
        // A block failing its checksum: `StoreError::Corrupt`, whose
        // message says what to do.
        scan_table(&self.db, cf, f).map_err(|e| self.scan_failed(e))
    }

    fn is_empty(&self, cf: Cf) -> Result<bool, crate::core::ScanFailed> {
        let mut it = self.db.raw_iterator_cf(self.cf(cf));
        it.seek_to_first();
        it.status().map_err(|e| self.scan_failed(e))?;
        Ok(!it.valid())
    }
}

impl Store for RocksStore {
    fn write(&mut self, writes: &[Write], sync: bool) -> Result<(), StoreError> {
        if let Some(why) = &self.failed {
            return Err(StoreError::Refusing(why.clone()));
        }
        if let Some(e) = &self.encoder {
            let b = e.encode(writes);
            return self.write_encoded(&[&b], sync);
        }
        // RocksDB's encoding differs from `store::batch`'s (found at open):
        // the batch built through its C API, in the same order, sized up
        // front (grown by doubling, its buffer was copied at each step).
        let bytes: usize = writes
            .iter()
            .map(|w| match w {
                Write::Put(_, k, v) => k.len() + v.len() + 16,
                Write::Delete(_, k) => k.len() + 8,
            })
            .sum();
        let mut per_table = [0u64; Cf::ALL.len()];
        for w in writes {
            let (Write::Put(cf, ..) | Write::Delete(cf, _)) = w;
            per_table[*cf as usize] += 1;
        }
        count_writes(per_table);
        let batch = rocksdb_batch(&self.db, in_batch_order(writes, uses_skip_list).into_iter(), bytes + 64);
        self.write_batch(batch, sync)
    }

    fn batch_encoder(&self) -> Option<BatchEncoder> {
        self.encoder.clone()
    }

    fn write_encoded(&mut self, batches: &[&Encoded], sync: bool) -> Result<(), StoreError> {
        if let Some(why) = &self.failed {
            return Err(StoreError::Refusing(why.clone()));
        }
        let mut per_table = [0u64; Cf::ALL.len()];
        for b in batches {
            for (n, m) in per_table.iter_mut().zip(b.per_table()) {
                *n += u64::from(*m);
            }
        }
        count_writes(per_table);
        let batch = match batches {
            [b] => WriteBatch::from_data(b.bytes()),
            _ => WriteBatch::from_data(&super::batch::join(batches)),
        };
        self.write_batch(batch, sync)
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.db.get_cf(self.cf(cf), key)?)
    }

    fn op_ids_with_prefix(&self, prefix: &[u8], max: usize) -> Result<Vec<crate::protocol::Hash>, StoreError> {
        op_ids_with_prefix(&mut ops_iterator(&self.db), prefix, max)
    }

    fn op(&self, id: &crate::protocol::Hash) -> Result<Option<Vec<u8>>, StoreError> {
        op_as_signed(&self.db, id)
    }

    fn disk_bytes(&self) -> u64 {
        super::dir_bytes(&self.path)
    }

    fn table_bytes(&self) -> Vec<(Cf, u64, u64)> {
        let prop = |cf: Cf, name: &str| self.db.property_int_value_cf(self.cf(cf), name).ok().flatten().unwrap_or(0);
        Cf::ALL.iter().map(|cf| (*cf, prop(*cf, "rocksdb.total-sst-files-size"), prop(*cf, "rocksdb.size-all-mem-tables"))).collect()
    }

    fn cold_reader(&self) -> Option<Box<dyn crate::core::ColdOps>> {
        Some(Box::new(self.reader()))
    }

}

impl crate::core::ColdOps for StoreReader {
    fn get(&self, id: &crate::protocol::Hash) -> Result<Option<Vec<u8>>, crate::core::ColdReadFailed> {
        // A read error is a failing disk, and stops the engine: never taken
        // for "not found" (`core::cold`). A damaged block (met here when
        // the restore reads an op back, not at open): `StoreError::
        // Corrupt`'s message, with what to do.
        self.db.get_cf(handle(&self.db, Cf::Ops), id).map_err(|e| crate::core::ColdReadFailed(corrupt_or(&self.path, e).to_string()))
    }

    fn scan(&self, f: &mut dyn FnMut(&crate::protocol::Hash, &[u8])) -> Result<(), crate::core::ColdReadFailed> {
        // A damaged block: `StoreError::Corrupt`'s message, with what to do.
        scan_table(&self.db, Cf::Ops, &mut |k, v| f(k.try_into().expect("op ids are 32 bytes"), v))
            .map_err(|e| crate::core::ColdReadFailed(corrupt_or(&self.path, e).to_string()))
    }
}

/// Concurrent reads of committed data: ops for sync, events for
/// subscriptions, applied ops for the engine's cold index.
#[derive(Clone)]
pub struct StoreReader {
    db: Arc<DB>,
    path: std::path::PathBuf,
}

impl StoreReader {

    pub fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let h = handle(&self.db, cf);
        Ok(self.db.get_cf(h, key)?)
    }

    /// The op stored under `id` as it was signed (`Store::op`).
    pub fn op(&self, id: &crate::protocol::Hash) -> Result<Option<Vec<u8>>, StoreError> {
        op_as_signed(&self.db, id)
    }

    /// The records of `cf` whose keys start with `prefix` and sort after
    /// `prefix ‖ after` (from the first with `None`), in key order, at most
    /// `max`, each key without its prefix.
    pub fn records_after(&self, cf: Cf, prefix: &[u8], after: Option<&[u8]>, max: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StoreError> {
        let h = handle(&self.db, cf);
        let mut it = self.db.raw_iterator_cf(h);
        let start = [prefix, after.unwrap_or_default()].concat();
        it.seek(&start);
        let mut out = Vec::new();
        while it.valid() && out.len() < max {
            let (Some(k), Some(v)) = (it.key(), it.value()) else { break };
            if !k.starts_with(prefix) {
                break;
            }
            if after.is_none() || k != start.as_slice() {
                out.push((k[prefix.len()..].to_vec(), v.to_vec()));
            }
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    /// The keys of `cf` that start with `prefix` and sort after
    /// `prefix ‖ after` (from the first with `None`), in key order, at most
    /// `max`, each without its prefix.
    pub fn keys_after(&self, cf: Cf, prefix: &[u8], after: Option<&[u8]>, max: usize) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self.records_after(cf, prefix, after, max)?.into_iter().map(|(k, _)| k).collect())
    }

    /// Events of `scope` with sequence numbers in `from..=to`, at most
    /// `max`, each as op ‖ borsh(Event). The log holds one record per commit
    /// and scope (`core::Cf::Events`): start at the record holding `from`.
    pub fn events(&self, scope: &[u8; 32], from: u64, to: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let h = handle(&self.db, Cf::Events);
        let start = [scope.as_slice(), &from.to_be_bytes()].concat();
        let mut it = self.db.raw_iterator_cf(h);
        it.seek_for_prev(&start);
        if !it.valid() || it.key().is_none_or(|k| k.len() != 40 || &k[..32] != scope.as_slice()) {
            it.seek(&start);
        }
        let mut out = Vec::new();
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else { break };
            if k.len() != 40 || &k[..32] != scope.as_slice() {
                break;
            }
            let first = u64::from_be_bytes(k[32..].try_into().unwrap());
            let mut r = crate::protocol::codec::Reader::new(v);
            let n = r.u32().expect("event record count");
            for i in 0..n as u64 {
                let start = r.position();
                r.take(32).expect("event op id");
                r.string(u32::MAX).expect("event kind");
                r.bytes(u32::MAX).expect("event data");
                let seq = first + i;
                if seq > to || out.len() >= max {
                    return Ok(out);
                }
                if seq >= from {
                    out.push((seq, v[start..r.position()].to_vec()));
                }
            }
            it.next();
        }
        it.status()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random_writes(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<Write> {
        (0..n)
            .map(|_| {
                let cf = Cf::ALL[rng.gen_range(0..Cf::ALL.len())];
                // Few distinct keys, so that writes to one key meet.
                let key: Vec<u8> = vec![rng.gen_range(0..4u8); [0, 1, 32, 200][rng.gen_range(0..4)]];
                match rng.gen_range(0..4) {
                    0 => Write::Delete(cf, key),
                    _ => Write::Put(cf, key, vec![rng.gen(); [0, 5, 127, 128, 20_000][rng.gen_range(0..5)]]),
                }
            })
            .collect()
    }

    #[test]
    fn the_encoder_encodes_as_rocksdb_does() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        let encoder = store.batch_encoder().expect("the encoder passed its check at open");
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in [0, 1, 2, 50, 400] {
            let writes = random_writes(&mut rng, n);
            let order = in_batch_order(&writes, uses_skip_list);
            let theirs = rocksdb_batch(&store.db, order.into_iter(), 0);
            assert_eq!(encoder.encode(&writes).bytes(), theirs.data(), "{n} writes");
        }
    }

    /// A store whose encoder failed its check writes through RocksDB's C
    /// API what the encoder would have written.
    #[test]
    fn without_the_encoder_the_same_writes_land() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let writes = random_writes(&mut rng, 300);
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut encoded = RocksStore::open(a.path()).unwrap();
        let mut plain = RocksStore::open(b.path()).unwrap();
        plain.encoder = None;
        assert!(plain.batch_encoder().is_none());
        encoded.write(&writes, true).unwrap();
        plain.write(&writes, true).unwrap();
        for cf in Cf::ALL {
            let mut rows = [Vec::new(), Vec::new()];
            for (store, rows) in [&encoded, &plain].into_iter().zip(rows.iter_mut()) {
                store.scan(cf, &mut |k, v| rows.push((k.to_vec(), v.to_vec()))).unwrap();
            }
            assert_eq!(rows[0], rows[1], "{}", cf.name());
        }
    }

    /// Batches encoded apart and written together leave what their writes,
    /// in order, say: a later write to a key wins, within a batch and
    /// across them.
    #[test]
    fn encoded_batches_written_together_are_their_writes_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = RocksStore::open(dir.path()).unwrap();
        let encoder = store.batch_encoder().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let parts: Vec<Vec<Write>> = (0..4).map(|i| random_writes(&mut rng, 30 * i)).collect();
        let encoded: Vec<Encoded> = parts.iter().map(|p| encoder.encode(p)).collect();
        store.write_encoded(&encoded.iter().collect::<Vec<_>>(), true).unwrap();
        let mut want: std::collections::HashMap<(u8, Vec<u8>), Option<Vec<u8>>> = Default::default();
        for w in parts.iter().flatten() {
            match w {
                Write::Put(cf, k, v) => want.insert((*cf as u8, k.clone()), Some(v.clone())),
                Write::Delete(cf, k) => want.insert((*cf as u8, k.clone()), None),
            };
        }
        assert!(want.values().any(Option::is_some) && want.values().any(Option::is_none));
        for ((cf, k), v) in want {
            assert_eq!(store.get(Cf::ALL[cf as usize], &k).unwrap(), v);
        }
    }
}
