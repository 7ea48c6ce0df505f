//! p2panda's side: the workload as p2panda operations, and its ingest path
//! (`p2panda_core` decoding and validation, `p2panda_stream`'s `Ingest` and
//! `Orderer` processors, `p2panda_store`'s SQLite store), used as a p2panda
//! application uses them. Nothing here re-implements a p2panda check: the
//! wrapper store below only forwards to `SqliteStore` (see `EventStore`).

use std::borrow::Borrow;
use std::collections::HashSet;
use std::path::Path;
use std::str::FromStr;

use anyhow::{anyhow, Context};
use p2panda_core::traits::Digest;
use p2panda_core::{validate_operation, Body, Hash, Header, LogId, Operation, SigningKey};
use p2panda_store::operations::OperationStore;
use p2panda_store::orderer::OrdererStore;
use p2panda_store::sqlite::TransactionPermit;
use p2panda_store::{SqliteError, SqliteStore, SqliteStoreBuilder, Transaction};
use p2panda_stream::ingest::{Ingest, IngestArgs, IngestResult};
use p2panda_stream::orderer::{Orderer, Ordering};
use p2panda_stream::Processor;
use serde::{Deserialize, Serialize};

/// The header extensions: the op's causal dependencies (dagfold's parents,
/// mapped to p2panda ids), which `Orderer` orders by.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Deps {
    pub dependencies: Vec<Hash>,
}

/// One author's log per scope: the log id and the topic are both the scope.
pub type LogKey = [u8; 32];

/// An op as it travels: the header's CBOR bytes and the body's bytes.
pub struct WireOp {
    pub header: Vec<u8>,
    pub body: Vec<u8>,
    /// Indices (into the causal order) of its dependencies.
    pub deps: Vec<usize>,
    pub author: usize,
}

/// Signs one op: seq_num and backlink from the author's log, the body, the
/// dependencies in the extensions.
pub fn sign(key: &SigningKey, seq_num: u32, backlink: Option<Hash>, body: &[u8], deps: Vec<Hash>) -> (Hash, Vec<u8>) {
    let mut b = Header::<Deps>::builder().body(body);
    if let Some(back) = backlink {
        b = b.chain(seq_num, back);
    }
    let header = b.build(key, Deps { dependencies: deps });
    let bytes = header.encode();
    (header.hash(), bytes)
}

/// What a receiver does with the bytes before anything is stored: decode
/// the header (strict CBOR, the signature checked with `verify_strict`,
/// its BLAKE3 id), then `validate_operation` (the body's BLAKE3 hash and
/// size against the header, the header's own consistency).
pub fn decode_and_validate(w: &WireOp) -> anyhow::Result<Operation<Deps>> {
    let header = Header::<Deps>::decode(&w.header).map_err(|e| anyhow!("header: {e}"))?;
    let op = Operation::from_parts(header, Some(Body::from(w.body.clone())));
    validate_operation(&op).map_err(|e| anyhow!("validate_operation: {e}"))?;
    Ok(op)
}

/// The item the processors pass along: the op and its ingest arguments.
#[derive(Clone, Debug)]
pub struct Event {
    pub op: Operation<Deps>,
    pub args: IngestArgs<LogKey, LogKey>,
}

impl Borrow<Operation<Deps>> for Event {
    fn borrow(&self) -> &Operation<Deps> {
        &self.op
    }
}

impl Borrow<IngestArgs<LogKey, LogKey>> for Event {
    fn borrow(&self) -> &IngestArgs<LogKey, LogKey> {
        &self.args
    }
}

impl Digest<Hash> for Event {
    fn hash(&self) -> Hash {
        self.op.hash
    }
}

impl Ordering<Hash> for Event {
    fn dependencies(&self) -> &[Hash] {
        &self.op.header.extensions.dependencies
    }
}

/// `SqliteStore` seen as a store of `Event`s, for `Orderer` (which reads
/// the op it releases back from the operation store, as its own type).
/// Every method forwards to `SqliteStore`'s own implementation; reading an
/// op back decodes its header there (and so checks its signature again).
#[derive(Clone)]
pub struct EventStore {
    pub inner: SqliteStore,
    pub args: IngestArgs<LogKey, LogKey>,
}

impl Transaction for EventStore {
    type Error = SqliteError;
    type Permit = TransactionPermit;

    async fn begin(&self) -> Result<TransactionPermit, SqliteError> {
        self.inner.begin().await
    }

    async fn rollback(&self, permit: TransactionPermit) -> Result<(), SqliteError> {
        self.inner.rollback(permit).await
    }

    async fn commit(&self, permit: TransactionPermit) -> Result<(), SqliteError> {
        self.inner.commit(permit).await
    }
}

impl OrdererStore<Hash> for EventStore {
    type Error = SqliteError;

    async fn mark_ready(&self, id: Hash) -> Result<bool, SqliteError> {
        OrdererStore::<Hash>::mark_ready(&self.inner, id).await
    }

    async fn mark_pending(&self, id: Hash, dependencies: Vec<Hash>) -> Result<bool, SqliteError> {
        OrdererStore::<Hash>::mark_pending(&self.inner, id, dependencies).await
    }

    async fn get_next_pending(&self, id: Hash) -> Result<Option<HashSet<(Hash, Vec<Hash>)>>, SqliteError> {
        OrdererStore::<Hash>::get_next_pending(&self.inner, id).await
    }

    async fn take_next_ready(&self) -> Result<Option<Hash>, SqliteError> {
        OrdererStore::<Hash>::take_next_ready(&self.inner).await
    }

    async fn remove_pending(&self, id: Hash) -> Result<bool, SqliteError> {
        OrdererStore::<Hash>::remove_pending(&self.inner, id).await
    }

    async fn ready(&self, keys: &[Hash]) -> Result<bool, SqliteError> {
        OrdererStore::<Hash>::ready(&self.inner, keys).await
    }
}

impl OperationStore<Event, Hash> for EventStore {
    type Error = SqliteError;

    async fn insert_operation<L: LogId>(&self, id: &Hash, event: &Event, log_id: &L) -> Result<bool, SqliteError> {
        OperationStore::<Operation<Deps>, Hash>::insert_operation(&self.inner, id, &event.op, log_id).await
    }

    async fn get_operation(&self, id: &Hash) -> Result<Option<Event>, SqliteError> {
        let op: Option<Operation<Deps>> = self.inner.get_operation(id).await?;
        Ok(op.map(|op| Event { op, args: self.args.clone() }))
    }

    async fn get_operation_tx(&self, id: &Hash) -> Result<Option<Event>, SqliteError> {
        let op: Option<Operation<Deps>> = self.inner.get_operation_tx(id).await?;
        Ok(op.map(|op| Event { op, args: self.args.clone() }))
    }

    async fn has_operation(&self, id: &Hash) -> Result<bool, SqliteError> {
        OperationStore::<Operation<Deps>, Hash>::has_operation(&self.inner, id).await
    }

    async fn has_operation_tx(&self, id: &Hash) -> Result<bool, SqliteError> {
        OperationStore::<Operation<Deps>, Hash>::has_operation_tx(&self.inner, id).await
    }

    async fn delete_operation(&self, id: &Hash) -> Result<bool, SqliteError> {
        OperationStore::<Operation<Deps>, Hash>::delete_operation(&self.inner, id).await
    }

    async fn delete_operation_payload(&self, id: &Hash) -> Result<bool, SqliteError> {
        OperationStore::<Operation<Deps>, Hash>::delete_operation_payload(&self.inner, id).await
    }
}

/// How the SQLite database is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sqlite {
    /// As `SqliteStoreBuilder` opens a file: sqlx creates it in WAL mode
    /// and leaves SQLite's `synchronous=FULL`, so every commit fsyncs the
    /// WAL: every committed transaction is on disk.
    AsOpened,
    /// `journal_mode=WAL`, `synchronous=NORMAL` (the usual tuning): a
    /// commit appends to the WAL without an fsync; the WAL is synced at
    /// checkpoints. Survives a crash of the process; a power loss may
    /// roll back the last commits. And one index more than p2panda's
    /// migrations make (`INDEXES`).
    WalNormalIndexed,
}

/// Two indexes p2panda-store 0.7.1's migrations do not make, without
/// which ingest is quadratic in the ops stored: `operations_v1` is indexed
/// by `hash` only, so finding an author's latest op (once per op ingested,
/// for its backlink: `LogStore::get_latest_entry`) scans the table; and
/// `OrdererStore::take_next_ready` walks `orderer_ready_v1` by
/// `queue_index` past every op already taken (`in_queue = FALSE`).
pub const INDEXES: [&str; 2] = [
    "CREATE INDEX compare_latest_entry ON operations_v1 (verifying_key, log_id, seq_num)",
    "CREATE INDEX compare_ready_queue ON orderer_ready_v1 (in_queue, queue_index)",
];

/// Opens a fresh store in the file `db` (migrations run, not timed) and
/// returns it with the journal mode and synchronous setting in effect.
pub async fn open(db: &Path, mode: Sqlite) -> anyhow::Result<(SqliteStore, String)> {
    let url = format!("sqlite://{}", db.display());
    let store = match mode {
        Sqlite::AsOpened => SqliteStoreBuilder::new().database_url(&url).build().await?,
        Sqlite::WalNormalIndexed => {
            let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&url)?
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .synchronous(sqlx::sqlite::SqliteSynchronous::Normal);
            // The builder's pool sizes.
            let pool = sqlx::sqlite::SqlitePoolOptions::new().min_connections(3).max_connections(16).connect_with(opts).await?;
            p2panda_store::sqlite::run_pending_migrations(&pool).await?;
            for index in INDEXES {
                sqlx::query(index).execute(&pool).await?;
            }
            SqliteStore::from_pool(pool)
        }
    };
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(store.pool()).await?;
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(store.pool()).await?;
    let sync = ["OFF", "NORMAL", "FULL", "EXTRA"].get(sync as usize).copied().unwrap_or("?");
    Ok((store, format!("journal_mode={journal}, synchronous={sync}")))
}

/// How many ops each arrival releases from the orderer (itself and what
/// waited on it), for ops arriving in `order` with dependencies `deps`:
/// so that the timed loop takes exactly the ops the orderer has ready
/// (`Orderer::next` waits forever when none is).
pub fn releases(ops: &[WireOp], order: &[usize]) -> Vec<u32> {
    let n = ops.len();
    let mut arrived = vec![false; n];
    let mut ready = vec![false; n];
    let mut waiting: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut out = Vec::with_capacity(order.len());
    for &i in order {
        arrived[i] = true;
        let mut released = 0u32;
        let mut work = vec![i];
        while let Some(j) = work.pop() {
            if ready[j] || !arrived[j] {
                continue;
            }
            match ops[j].deps.iter().find(|&&d| !ready[d]) {
                Some(&d) => waiting[d].push(j),
                None => {
                    ready[j] = true;
                    released += 1;
                    work.extend(std::mem::take(&mut waiting[j]));
                }
            }
        }
        out.push(released);
    }
    out
}

/// Durable ingest: every op decoded and validated from its bytes, through
/// `Ingest` (validation again, log integrity against the author's latest
/// op, insert, topic association: one transaction) and `Orderer` (ready or
/// pending by dependencies: one transaction; each op it releases: one
/// more), in `order`. Returns the seconds from the first op to the last
/// one out of the orderer.
pub async fn ingest(ops: &[WireOp], order: &[usize], released: &[u32], store: SqliteStore, scope: LogKey) -> anyhow::Result<f64> {
    let args = IngestArgs { log_id: scope, topic: scope, prune_flag: false };
    let ingest: Ingest<SqliteStore, Event, LogKey, Deps, LogKey> = Ingest::new(store.clone());
    let orderer: Orderer<Event, Hash, EventStore> = Orderer::new(EventStore { inner: store, args: args.clone() });
    let t = std::time::Instant::now();
    let mut out = 0usize;
    for (&i, &r) in order.iter().zip(released) {
        let op = decode_and_validate(&ops[i])?;
        ingest.process(Event { op, args: args.clone() }).await.map_err(|(_, e)| anyhow!("ingest: {e}"))?;
        let (event, result) = ingest.next().await.map_err(|(_, e)| anyhow!("ingest: {e}"))?;
        if result != IngestResult::Inserted {
            return Err(anyhow!("op {i} was already stored"));
        }
        orderer.process(event).await.map_err(|(_, e)| anyhow!("orderer: {e}"))?;
        for _ in 0..r {
            // Bounded: should the orderer release fewer than `releases`
            // says, this fails instead of waiting forever.
            tokio::time::timeout(std::time::Duration::from_secs(10), orderer.next())
                .await
                .map_err(|_| anyhow!("the orderer released fewer ops than expected after op {i}"))?
                .map_err(|(_, e)| anyhow!("orderer: {e}"))?;
            out += 1;
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    if out != ops.len() {
        return Err(anyhow!("the orderer released {out} of {} ops", ops.len()));
    }
    Ok(seconds)
}

/// A fresh store, the ingest, and the store closed: the seconds of the
/// ingest alone.
pub fn durable_run(ops: &[WireOp], order: &[usize], released: &[u32], db: &Path, mode: Sqlite, scope: LogKey) -> anyhow::Result<(f64, String)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let (store, pragmas) = open(db, mode).await.context("opening the SQLite store")?;
        let seconds = ingest(ops, order, released, store.clone(), scope).await?;
        store.pool().close().await;
        Ok((seconds, pragmas))
    })
}
