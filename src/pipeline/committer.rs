//! The committer: writes each commit as one atomic store batch (the WAL
//! synced in durable mode), then publishes its statuses and hands it to the
//! node's side effects, which may only follow durability.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use metrics::{counter, histogram};

use super::metrics::note_age;
use super::shards::Join;
use super::{Committed, ConnId, PipelineState};
use crate::core::{Commit, IdMap, ScopeStatus, Write};
use crate::protocol::Hash;
use crate::store::Store;

/// A folded commit (or a shard's part of one) on its way from the
/// projector to the committer.
pub(super) type ToCommit = (Commit, Vec<ScopeStatus>, Vec<ConnId>, Instant);

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

/// Writes each commit whose parts `parts` joined, in commit order, those
/// queued together (`COMMITS_PER_WRITE_MAX`).
pub(super) fn run<S: Store>(
    mut store: S,
    parts: Join,
    shared: Arc<PipelineState>,
    sync: bool,
    applied_bytes: bool,
    mut on_durable: Box<dyn FnMut(Committed) + Send>,
) {
    let mut group: Vec<ToCommit> = Vec::with_capacity(COMMITS_PER_WRITE_MAX);
    let mut sized: Option<Instant> = None;
    while let Some(first) = parts.recv() {
        if sized.is_none_or(|t| t.elapsed() >= TABLE_BYTES_INTERVAL) {
            sized = Some(Instant::now());
            publish_table_bytes(&store);
        }
        group.push(first);
        while group.len() < COMMITS_PER_WRITE_MAX {
            match parts.try_recv() {
                Some(c) => group.push(c),
                None => break,
            }
        }
        if shared.refusing.load(Ordering::Relaxed) {
            never_written(&mut group, &shared);
            continue;
        }
        let t = Instant::now();
        for (_, _, _, received) in &group {
            note_age("commit", *received);
        }
        if let Err(e) = write_group(&mut store, &mut group, sync) {
            counter!("dagfold_store_write_failures_total").increment(1);
            let _ = shared.refuse("store write", &e);
            never_written(&mut group, &shared);
            continue;
        }
        histogram!("dagfold_commit_seconds").record(t.elapsed().as_secs_f64());
        histogram!("dagfold_commits_per_write").record(group.len() as f64);
        for c in group.drain(..) {
            published(c, &shared, applied_bytes, &mut on_durable);
        }
    }
}

/// Commits that will never be written (the store refuses): dropped, and
/// the answers waiting on them with them, so their writers hear the store
/// refuses.
fn never_written(group: &mut Vec<ToCommit>, shared: &PipelineState) {
    group.clear();
    shared.answers.lock().unwrap().clear();
}

/// The bytes of each table's files and memtables, as gauges.
fn publish_table_bytes<S: Store>(store: &S) {
    for (cf, files, memtables) in store.table_bytes() {
        metrics::gauge!("dagfold_store_table_bytes", "cf" => cf.name(), "in" => "files").set(files as f64);
        metrics::gauge!("dagfold_store_table_bytes", "cf" => cf.name(), "in" => "memtables").set(memtables as f64);
    }
}

/// Writes the commits of `group` as one atomic batch, in order (none with
/// no writes: an in-memory key wait is only published).
fn write_group<S: Store>(store: &mut S, group: &mut [ToCommit], sync: bool) -> Result<(), crate::store::StoreError> {
    match group {
        [(c, ..)] if c.writes.is_empty() => Ok(()),
        [(c, ..)] => store.write(&c.writes, sync),
        _ => {
            // Moved into one list and back, in order: the store keeps the
            // later of two writes to a key.
            let lens: Vec<usize> = group.iter().map(|(c, ..)| c.writes.len()).collect();
            let mut all: Vec<Write> = Vec::with_capacity(lens.iter().sum());
            for (c, ..) in group.iter_mut() {
                all.append(&mut c.writes);
            }
            let r = if all.is_empty() { Ok(()) } else { store.write(&all, sync) };
            for ((c, ..), n) in group.iter_mut().zip(lens).rev() {
                c.writes = all.split_off(all.len() - n);
            }
            r
        }
    }
}

/// A commit written: readable (and durable, when syncing) from here. Its
/// statuses are published, its API writes answered, and its side effects
/// handed to the node.
fn published(c: ToCommit, shared: &PipelineState, applied_bytes: bool, on_durable: &mut Box<dyn FnMut(Committed) + Send>) {
    let (mut commit, statuses, conns, received) = c;
    // The orderer may now answer for its ops from the store.
    shared.durable_commits.store(commit.number + 1, Ordering::Release);
    histogram!("dagfold_commit_writes").record(commit.writes.len() as f64);
    histogram!("dagfold_commit_applied_ops").record(commit.applied.len() as f64);
    histogram!("dagfold_end_to_end_seconds").record(received.elapsed().as_secs_f64());
    counter!("dagfold_applied_total").increment(commit.applied.len() as u64);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Cf;
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

    fn commit(number: u64, writes: Vec<Write>) -> ToCommit {
        (Commit { writes, number, ..Default::default() }, Vec::new(), Vec::new(), Instant::now())
    }

    #[test]
    fn queued_commits_are_written_in_one_batch_in_order() {
        let put = |v: &[u8]| Write::Put(Cf::Meta, b"k".to_vec(), v.to_vec());
        let mut group = vec![
            commit(0, vec![put(b"first"), Write::Put(Cf::Meta, b"a".to_vec(), b"1".to_vec())]),
            commit(1, vec![]),
            commit(2, vec![put(b"last"), Write::Delete(Cf::Meta, b"a".to_vec())]),
        ];
        let mut store = Counting(MemStore::new(), 0);
        write_group(&mut store, &mut group, true).unwrap();
        assert_eq!(store.1, 1, "one store write for the group");
        // The later commit's writes win.
        assert_eq!(store.get(Cf::Meta, b"k").unwrap().as_deref(), Some(&b"last"[..]));
        assert_eq!(store.get(Cf::Meta, b"a").unwrap(), None);
        // Each commit has its own writes back (the published side effects
        // read them).
        let lens: Vec<usize> = group.iter().map(|(c, ..)| c.writes.len()).collect();
        assert_eq!(lens, [2, 0, 2]);
        assert!(matches!(&group[2].0.writes[0], Write::Put(_, _, v) if v == b"last"));
        // A commit alone with nothing to write writes nothing.
        let mut empty = vec![commit(3, vec![])];
        write_group(&mut store, &mut empty, true).unwrap();
        assert_eq!(store.1, 1);
    }
}
