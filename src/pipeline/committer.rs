//! The committer: writes each commit as one atomic store batch (the WAL
//! synced in durable mode), then hands it to the publisher, a thread of its
//! own, which publishes its statuses, answers its API writes and hands it
//! to the node's side effects, which may only follow durability. Before
//! it, the encoder, a thread of its own too, joins each commit's parts and
//! encodes its writes as the store's batch (`store::batch`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use metrics::{counter, histogram};

use super::metrics::note_age;
use super::shards::Join;
use super::{Committed, ConnId, PipelineState, COMMIT_SLOTS};
use crate::core::{Commit, IdMap, ScopeStatus, Write};
use crate::protocol::Hash;
use crate::store::batch::{BatchEncoder, Encoded};
use crate::store::Store;

/// A folded commit (or a shard's part of one) on its way from the
/// projector to the committer.
pub(super) type ToCommit = (Commit, Vec<ScopeStatus>, Vec<ConnId>, Instant);

/// A joined commit and its writes as the store's batch (none for a store
/// that encodes no batches: its writes then go to `Store::write`).
type ToWrite = (ToCommit, Option<Encoded>);

/// Commits written together at most: the ones queued when the committer
/// takes the next go in one store batch with one WAL sync (each commit is
/// still all or nothing: a batch is atomic, and a later commit's writes
/// follow an earlier one's). A sync costs ~0.6–0.8 ms on this machine
/// kind; under a trickle of small commits (the API's writes) every commit
/// waited behind the syncs of those queued before it, and the syncs, not
/// the CPU, bounded the rate (`tools/bench api_writes`,
/// docs/PERFORMANCE.md).
const COMMITS_PER_WRITE_MAX: usize = 16;

/// How often the committer publishes the store's size per table
/// (`dagfold_store_table_bytes`): a property read per table, cheap, but
/// not worth doing per commit.
const TABLE_BYTES_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Groups of written commits queued for the publisher at most: the
/// committer writes the next while the publisher works through these, and
/// waits when it is this far ahead.
const PUBLISH_QUEUE: usize = 4;

/// What the committer hands the publisher, in order.
enum Written {
    /// Commits written (and synced, when syncing): published in order.
    Commits(Vec<ToCommit>),
    /// The store refused a write: the answers still waiting are for
    /// commits that will never be written. Cleared after every commit
    /// written before the refusal was published (and its writes answered).
    Refused,
}

/// Writes each commit whose parts `parts` joined, in commit order, those
/// queued together (`COMMITS_PER_WRITE_MAX`); a thread of its own (the
/// publisher, `dagfold-publish`) publishes them, in the same order, and
/// another (the encoder, `dagfold-encoder`) joins and encodes them before.
///
/// The encoding (the batch built through RocksDB's C API, one call per
/// write, and the sort of its skip-list writes) was 28% of the committer's
/// thread in `causal` (`perf record`, 2026-12-06); the publication 14%,
/// and 20% in `scopes_10k` (2026-12-05). Both are off the thread that
/// writes, which is one for all scopes and caps a many-core node
/// (ARCHITECTURE.md, "Cost per stage, and what more cores would give").
pub(super) fn run<S: Store>(
    mut store: S,
    parts: Join,
    shared: Arc<PipelineState>,
    sync: bool,
    applied_bytes: bool,
    mut on_durable: Box<dyn FnMut(Committed) + Send>,
) {
    let (to_publish, written) = crossbeam_channel::bounded::<Written>(PUBLISH_QUEUE);
    let sh = shared.clone();
    let publisher = std::thread::Builder::new()
        .name("dagfold-publish".into())
        .spawn(move || {
            let m = PublishMetrics::new();
            for w in crate::idle::recv(&written) {
                match w {
                    Written::Commits(commits) => {
                        for c in commits {
                            published(c, &sh, applied_bytes, &m, &mut on_durable);
                        }
                    }
                    Written::Refused => sh.answers.lock().unwrap().clear(),
                }
            }
        })
        .expect("spawning the publisher");
    let encoder = store.batch_encoder();
    let (to_write, encoded) = crossbeam_channel::bounded::<ToWrite>(COMMIT_SLOTS);
    let encoding = std::thread::Builder::new()
        .name("dagfold-encoder".into())
        .spawn(move || encode_all(parts, encoder, applied_bytes, to_write))
        .expect("spawning the encoder");
    write_all(&mut store, encoded, &shared, sync, &to_publish);
    drop(to_publish);
    // Every commit written is published before the committer is done; a
    // panic there (the node's side effects) ends the committer as it did
    // when they ran on its thread.
    for t in [encoding, publisher] {
        if let Err(p) = t.join() {
            std::panic::resume_unwind(p);
        }
    }
}

/// The encoder's loop: each commit joined from its parts, in commit order,
/// its writes encoded as the store's batch when the store has an encoder.
/// Ends when the shards are gone, or the committer.
///
/// Once encoded, the writes the publisher has no use for are freed here,
/// where the encoding has just read them: all of them, or with
/// `applied_bytes` all but the applied ops' encodings (`published`). They
/// were allocated on the orderer's and the projector's threads, and a
/// block freed on another thread is written to (mimalloc links it into
/// its page's list of remote frees): on the publisher, long after, that
/// was a cache miss per block, 44% of its thread in `scopes_10k`.
fn encode_all(
    mut parts: Join,
    encoder: Option<BatchEncoder>,
    applied_bytes: bool,
    to_write: crossbeam_channel::Sender<ToWrite>,
) {
    let (encode_seconds, commit_writes) = (histogram!("dagfold_encode_seconds"), histogram!("dagfold_commit_writes"));
    while let Some(mut c) = parts.recv() {
        let t = Instant::now();
        let e = encoder.as_ref().map(|e| e.encode(&c.0.writes));
        encode_seconds.record(t.elapsed().as_secs_f64());
        commit_writes.record(c.0.writes.len() as f64);
        if e.is_some() {
            if applied_bytes {
                c.0.writes.retain(|w| matches!(w, Write::Put(crate::core::Cf::Ops, ..)));
            } else {
                c.0.writes = Vec::new();
            }
        }
        if to_write.send((c, e)).is_err() {
            return;
        }
    }
}

/// The committer's loop (`run`): each group of commits written, then
/// queued for the publisher.
fn write_all<S: Store>(
    store: &mut S,
    encoded: crossbeam_channel::Receiver<ToWrite>,
    shared: &PipelineState,
    sync: bool,
    to_publish: &crossbeam_channel::Sender<Written>,
) {
    let mut group: Vec<ToWrite> = Vec::with_capacity(COMMITS_PER_WRITE_MAX);
    let mut sized: Option<Instant> = None;
    let (commit_seconds, commits_per_write) = (histogram!("dagfold_commit_seconds"), histogram!("dagfold_commits_per_write"));
    for first in crate::idle::recv(&encoded) {
        if sized.is_none_or(|t| t.elapsed() >= TABLE_BYTES_INTERVAL) {
            sized = Some(Instant::now());
            publish_table_bytes(store);
        }
        group.push(first);
        while group.len() < COMMITS_PER_WRITE_MAX {
            match encoded.try_recv() {
                Ok(c) => group.push(c),
                Err(_) => break,
            }
        }
        if shared.refusing.load(Ordering::Relaxed) {
            never_written(&mut group, to_publish);
            continue;
        }
        let t = Instant::now();
        for ((_, _, _, received), _) in &group {
            note_age("commit", *received);
        }
        if let Err(e) = write_group(store, &mut group, sync) {
            counter!("dagfold_store_write_failures_total").increment(1);
            let _ = shared.refuse("store write", &e);
            never_written(&mut group, to_publish);
            continue;
        }
        commit_seconds.record(t.elapsed().as_secs_f64());
        commits_per_write.record(group.len() as f64);
        // The orderer may now answer for these commits' ops from the store.
        let last = group.last().expect("a group holds a commit").0 .0.number;
        shared.durable_commits.store(last + 1, Ordering::Release);
        // The batches are done with: freed here, each one block.
        if to_publish.send(Written::Commits(group.drain(..).map(|(c, _)| c).collect())).is_err() {
            return;
        }
    }
}

/// Commits that will never be written (the store refuses): dropped, and
/// (by the publisher, after those written before) the answers waiting on
/// them with them, so their writers hear the store refuses.
fn never_written(group: &mut Vec<ToWrite>, to_publish: &crossbeam_channel::Sender<Written>) {
    group.clear();
    let _ = to_publish.send(Written::Refused);
}

/// The bytes of each table's files and memtables, as gauges.
fn publish_table_bytes<S: Store>(store: &S) {
    for (cf, files, memtables) in store.table_bytes() {
        metrics::gauge!("dagfold_store_table_bytes", "cf" => cf.name(), "in" => "files").set(files as f64);
        metrics::gauge!("dagfold_store_table_bytes", "cf" => cf.name(), "in" => "memtables").set(memtables as f64);
    }
}

/// Writes the commits of `group` as one atomic batch, in order (none with
/// no writes: an in-memory key wait is only published): their encoded
/// batches joined, or their writes.
fn write_group<S: Store>(store: &mut S, group: &mut [ToWrite], sync: bool) -> Result<(), crate::store::StoreError> {
    if group.iter().all(|(_, e)| e.is_some()) {
        let batches: Vec<&Encoded> = group.iter().filter_map(|(_, e)| e.as_ref()).filter(|e| e.records() > 0).collect();
        return if batches.is_empty() { Ok(()) } else { store.write_encoded(&batches, sync) };
    }
    match group {
        [((c, ..), _)] if c.writes.is_empty() => Ok(()),
        [((c, ..), _)] => store.write(&c.writes, sync),
        _ => {
            // Moved into one list and back, in order: the store keeps the
            // later of two writes to a key.
            let lens: Vec<usize> = group.iter().map(|((c, ..), _)| c.writes.len()).collect();
            let mut all: Vec<Write> = Vec::with_capacity(lens.iter().sum());
            for ((c, ..), _) in group.iter_mut() {
                all.append(&mut c.writes);
            }
            let r = if all.is_empty() { Ok(()) } else { store.write(&all, sync) };
            for (((c, ..), _), n) in group.iter_mut().zip(lens).rev() {
                c.writes = all.split_off(all.len() - n);
            }
            r
        }
    }
}

/// The publisher's metrics, their handles looked up in the registry once.
struct PublishMetrics {
    applied_ops: metrics::Histogram,
    end_to_end: metrics::Histogram,
    applied_total: metrics::Counter,
}

impl PublishMetrics {
    fn new() -> PublishMetrics {
        PublishMetrics {
            applied_ops: histogram!("dagfold_commit_applied_ops"),
            end_to_end: histogram!("dagfold_end_to_end_seconds"),
            applied_total: counter!("dagfold_applied_total"),
        }
    }
}

/// A commit written: readable (and durable, when syncing) from here. Its
/// statuses are published, its API writes answered, and its side effects
/// handed to the node.
fn published(
    c: ToCommit,
    shared: &PipelineState,
    applied_bytes: bool,
    m: &PublishMetrics,
    on_durable: &mut Box<dyn FnMut(Committed) + Send>,
) {
    let (mut commit, statuses, conns, received) = c;
    m.applied_ops.record(commit.applied.len() as f64);
    m.end_to_end.record(received.elapsed().as_secs_f64());
    m.applied_total.increment(commit.applied.len() as u64);
    shared.applied_total.fetch_add(commit.applied.len() as u64, Ordering::Relaxed);
    // Scopes whose members changed, for the node to end the live
    // subscriptions of members removed (SPEC §10).
    let mut members = Vec::new();
    {
        let mut st = shared.status.write().unwrap();
        for s in statuses {
            if st.get(&s.scope).is_none_or(|old| !Arc::ptr_eq(&old.members, &s.members) && old.members != s.members) {
                members.push((s.scope, s.members.iter().map(|(k, _)| *k).collect()));
            }
            st.insert(s.scope, s);
        }
    }
    // An API write is answered from here: its status is published
    // first, so a read after the answer sees it.
    shared.durable.send_replace(commit.number + 1);
    answer_own_ops(shared, commit.number);
    // The encodings of applied ops are in the batch just written, or
    // (a pending op's, written when it was buffered; a data op's stored by
    // reference to its parents) beside it: moved out, not copied, as the
    // commit's writes are done with.
    let mut bytes: IdMap<Hash, Vec<u8>> = IdMap::default();
    if applied_bytes {
        bytes.reserve(commit.applied.len());
        for w in commit.writes.drain(..) {
            if let Write::Put(crate::core::Cf::Ops, k, v) = w {
                if let Ok(id) = Hash::try_from(k.as_slice()) {
                    bytes.insert(id, v);
                }
            }
        }
        bytes.extend(commit.released.drain(..));
    }
    let applied = commit
        .applied
        .iter()
        .zip(conns)
        .map(|((id, scope), conn)| (*id, *scope, bytes.remove(id).unwrap_or_default(), conn))
        .collect();
    on_durable(Committed { events: commit.events, applied, members, delivered: commit.delivered });
}

/// Answers the node's own ops applied by commits up to `number`, now
/// durable (`PipelineState::answers`).
fn answer_own_ops(shared: &PipelineState, number: u64) {
    let mut due = Vec::new();
    {
        let mut answers = shared.answers.lock().unwrap();
        while answers.front().is_some_and(|(n, _)| *n <= number) {
            due.extend(answers.pop_front().map(|(_, a)| a).unwrap_or_default());
        }
    }
    for (reply, answer) in due {
        let _ = reply.send(Ok(answer));
    }
}

/// The commit stage alone, as the pipeline runs it: `commits` handed to
/// the encoder through the join (one shard), written to `store` (the
/// WAL synced if `sync`), and published by the publisher; returns the ops
/// the publisher handed on once every commit is published. For the stage
/// benchmark (`benches/stages.rs`, "commit stage"): the committer's own
/// rate, the cap it puts on a node of many cores.
#[cfg(feature = "testkit")]
pub fn commit_stage<S: Store>(store: S, commits: Vec<(Commit, Vec<ScopeStatus>)>, sync: bool) -> u64 {
    let (_, mut io, join) = super::shards::channels(1);
    let tx = io.pop().expect("one shard").tx;
    let shared = PipelineState::detached();
    let handed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let h = handed.clone();
    let on_durable: Box<dyn FnMut(Committed) + Send> = Box::new(move |c: Committed| {
        h.fetch_add(c.applied.len() as u64, Ordering::Relaxed);
    });
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("dagfold-commits".into())
            .spawn_scoped(s, move || {
                for (commit, statuses) in commits {
                    let conns = vec![0; commit.applied.len()];
                    if tx.send((commit, statuses, conns, Instant::now())).is_err() {
                        return;
                    }
                }
            })
            .expect("spawning the commit stage's feeder");
        run(store, join, shared, sync, true, on_durable);
    });
    handed.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Cf;
    use crate::store::faulty::{Countdown, FaultyStore};
    use crate::store::memory::MemStore;

    /// A store that counts its writes.
    struct Counting(MemStore, usize);

    impl crate::core::TableScan for Counting {
        fn scan(&self, cf: Cf, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), crate::core::ScanFailed> {
            self.0.scan(cf, f)
        }
    }

    impl Store for Counting {
        fn write(&mut self, writes: &[Write], sync: bool) -> Result<(), crate::store::StoreError> {
            self.1 += 1;
            self.0.write(writes, sync)
        }
        fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, crate::store::StoreError> {
            self.0.get(cf, key)
        }
        fn op_ids_with_prefix(&self, prefix: &[u8], max: usize) -> Result<Vec<crate::protocol::Hash>, crate::store::StoreError> {
            self.0.op_ids_with_prefix(prefix, max)
        }
    }

    /// The in-memory store behind a countdown: its `durable` is what the
    /// commits wrote, its countdown counts the writes and fails the one it
    /// names.
    fn faulty(fail_at: Option<u64>) -> FaultyStore {
        FaultyStore::new(MemStore::new(), Countdown::new(fail_at))
    }

    /// Whether commit `number` (`numbered`) is in the store.
    fn holds(store: &FaultyStore, number: u8) -> bool {
        store.durable.lock().unwrap().get(Cf::Meta, &[number]).unwrap().is_some()
    }

    /// Commit `number`, one write and one applied op (`[number; 32]`).
    fn numbered(number: u8) -> ToCommit {
        let (mut c, _) = commit(number as u64, vec![Write::Put(Cf::Meta, vec![number], vec![])]);
        c.0.applied = vec![([number; 32], [0; 32])];
        c.2 = vec![0];
        c
    }

    /// The committer running on a thread of its own with `store`, fed by
    /// the returned sender; each commit's side effects wait for a token
    /// from the returned receiver's twin and then report the commit's
    /// number.
    #[allow(clippy::type_complexity)]
    fn committer(
        store: FaultyStore,
    ) -> (
        crossbeam_channel::Sender<ToCommit>,
        std::sync::mpsc::SyncSender<()>,
        std::sync::mpsc::Receiver<u8>,
        Arc<PipelineState>,
        std::thread::JoinHandle<()>,
    ) {
        let (_, mut io, join) = super::super::shards::channels(1);
        let tx = io.pop().unwrap().tx;
        let (go, wait) = std::sync::mpsc::sync_channel::<()>(16);
        let (report, reported) = std::sync::mpsc::channel::<u8>();
        let shared = PipelineState::detached();
        let sh = shared.clone();
        let on_durable: Box<dyn FnMut(Committed) + Send> = Box::new(move |c: Committed| {
            wait.recv().unwrap();
            report.send(c.applied[0].0[0]).unwrap();
        });
        let t = std::thread::spawn(move || run(store, join, sh, true, true, on_durable));
        (tx, go, reported, shared, t)
    }

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let start = Instant::now();
        while !f() {
            assert!(start.elapsed() < std::time::Duration::from_secs(20), "waited for {what}");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// The committer writes the next commit while the side effects of the
    /// one before it still run (on the publisher's thread); the commits
    /// are published in order, and all of them before the committer ends.
    #[test]
    fn a_commit_is_written_while_the_one_before_is_published() {
        let store = faulty(None);
        let (tx, go, reported, shared, t) = committer(store.clone());
        tx.send(numbered(0)).unwrap();
        wait_until("commit 0 written", || holds(&store, 0));
        // Commit 0's side effects wait for a token: commit 1 is written
        // meanwhile, and the orderer told both are durable.
        tx.send(numbered(1)).unwrap();
        wait_until("commit 1 written while commit 0 is published", || holds(&store, 1));
        assert_eq!(shared.durable_commits.load(Ordering::Acquire), 2);
        assert!(reported.try_recv().is_err(), "commit 0's side effects still wait");
        tx.send(numbered(2)).unwrap();
        drop(tx);
        for _ in 0..3 {
            go.send(()).unwrap();
        }
        t.join().unwrap();
        assert_eq!(reported.try_iter().collect::<Vec<_>>(), [0, 1, 2]);
        assert!((0..3).all(|n| holds(&store, n)));
        assert_eq!(store.countdown.done(), 3, "one write per commit");
        assert_eq!(*shared.durable.borrow(), 3);
    }

    /// A write that fails after a commit was written but not yet
    /// published: that commit's API writes are still answered (it is
    /// durable), the next one's hear that it never will be.
    #[test]
    fn a_refusal_answers_the_commits_written_before_it() {
        let store = faulty(Some(2));
        let (tx, go, reported, shared, t) = committer(store.clone());
        let authored = |commit: u64| super::super::Authored { id: [0; 32], root: None, outcome: crate::core::Outcome::Applied, commit, event_seq: 0 };
        let (reply0, mut answer0) = tokio::sync::oneshot::channel();
        let (reply1, mut answer1) = tokio::sync::oneshot::channel();
        shared.answers.lock().unwrap().extend([(0, vec![(reply0, authored(0))]), (1, vec![(reply1, authored(1))])]);
        tx.send(numbered(0)).unwrap();
        wait_until("commit 0 written", || holds(&store, 0));
        tx.send(numbered(1)).unwrap();
        wait_until("commit 1's write refused", || shared.refusing.load(Ordering::Acquire));
        go.send(()).unwrap();
        drop(tx);
        t.join().unwrap();
        assert_eq!(reported.try_iter().collect::<Vec<_>>(), [0], "only the written commit is published");
        assert_eq!(answer0.try_recv().unwrap().unwrap().commit, 0, "the durable commit's write is answered");
        let never = answer1.try_recv();
        assert!(matches!(never, Err(tokio::sync::oneshot::error::TryRecvError::Closed)), "the refused commit's write hears it never will be");
        assert!(shared.answers.lock().unwrap().is_empty());
    }

    /// The stage alone (for its benchmark) writes every commit in order
    /// and publishes every applied op.
    #[cfg(feature = "testkit")]
    #[test]
    fn the_commit_stage_alone_writes_and_publishes_every_commit() {
        let store = faulty(None);
        let commits: Vec<(Commit, Vec<ScopeStatus>)> = (0..5u8).map(|n| (numbered(n).0, Vec::new())).collect();
        assert_eq!(commit_stage(store.clone(), commits, false), 5);
        assert!((0..5).all(|n| holds(&store, n)));
    }

    fn commit(number: u64, writes: Vec<Write>) -> ToWrite {
        ((Commit { writes, number, ..Default::default() }, Vec::new(), Vec::new(), Instant::now()), None)
    }

    fn put(k: &[u8], v: &[u8]) -> Write {
        Write::Put(Cf::Meta, k.to_vec(), v.to_vec())
    }

    /// Three commits to write together: the later one's writes must win.
    fn queued() -> Vec<ToWrite> {
        vec![
            commit(0, vec![put(b"k", b"first"), put(b"a", b"1")]),
            commit(1, vec![]),
            commit(2, vec![put(b"k", b"last"), Write::Delete(Cf::Meta, b"a".to_vec())]),
        ]
    }

    #[test]
    fn queued_commits_are_written_in_one_batch_in_order() {
        let mut group = queued();
        let mut store = Counting(MemStore::new(), 0);
        write_group(&mut store, &mut group, true).unwrap();
        assert_eq!(store.1, 1, "one store write for the group");
        // The later commit's writes win.
        assert_eq!(store.get(Cf::Meta, b"k").unwrap().as_deref(), Some(&b"last"[..]));
        assert_eq!(store.get(Cf::Meta, b"a").unwrap(), None);
        // Each commit has its own writes back (the published side effects
        // read them).
        let lens: Vec<usize> = group.iter().map(|((c, ..), _)| c.writes.len()).collect();
        assert_eq!(lens, [2, 0, 2]);
        assert!(matches!(&group[2].0 .0.writes[0], Write::Put(_, _, v) if v == b"last"));
        // A commit alone with nothing to write writes nothing.
        let mut empty = vec![commit(3, vec![])];
        write_group(&mut store, &mut empty, true).unwrap();
        assert_eq!(store.1, 1);
    }

    /// On RocksDB the encoder's batches of queued commits are joined into
    /// one, in order: the later commit's writes win there too.
    #[cfg(feature = "rocksdb-store")]
    #[test]
    fn queued_commits_encoded_are_written_in_one_batch_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = crate::store::rocks::RocksStore::open(dir.path()).unwrap();
        let encoder = store.batch_encoder().expect("RocksDB's batches are encoded here");
        let mut group = queued();
        for ((c, ..), e) in group.iter_mut() {
            *e = Some(encoder.encode(&c.writes));
        }
        write_group(&mut store, &mut group, true).unwrap();
        assert_eq!(store.get(Cf::Meta, b"k").unwrap().as_deref(), Some(&b"last"[..]));
        assert_eq!(store.get(Cf::Meta, b"a").unwrap(), None);
        assert_eq!(group.iter().map(|((c, ..), _)| c.writes.len()).collect::<Vec<_>>(), [2, 0, 2], "the writes kept");
    }
}
