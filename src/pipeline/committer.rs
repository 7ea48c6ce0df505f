//! The committer: writes each commit as one atomic store batch (the WAL
//! synced in durable mode), then publishes its statuses and hands it to the
//! node's side effects, which may only follow durability.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Receiver;
use metrics::{counter, histogram};

use super::metrics::note_age;
use super::{Committed, ConnId, PipelineState};
use crate::core::{Commit, ScopeStatus, Write};
use crate::store::Store;

/// A folded commit on its way from the projector to the committer.
pub(super) type ToCommit = (Commit, Vec<ScopeStatus>, Vec<ConnId>, Instant);

pub(super) fn run<S: Store>(
    mut store: S,
    rx: Receiver<ToCommit>,
    shared: Arc<PipelineState>,
    sync: bool,
    applied_bytes: bool,
    mut on_durable: Box<dyn FnMut(Committed) + Send>,
) {
    for (commit, statuses, conns, received) in rx {
        if shared.refusing.load(Ordering::Relaxed) {
            continue;
        }
        let t = Instant::now();
        note_age("commit", received);
        if commit.writes.is_empty() {
            // Nothing to make durable (an in-memory key wait): publish only.
        } else if let Err(e) = store.write(&commit.writes, sync) {
            counter!("dagfold_store_write_failures_total").increment(1);
            let _ = shared.refuse("store write", &e);
            continue;
        }
        // Readable in the store from here (and durable, when syncing): the
        // orderer may now answer for its ops from the store.
        shared.durable_commits.store(commit.number + 1, Ordering::Release);
        histogram!("dagfold_commit_seconds").record(t.elapsed().as_secs_f64());
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
                if st.get(&s.scope).is_none_or(|old| old.members != s.members) {
                    members.push((s.scope, s.members.iter().map(|(k, _)| *k).collect()));
                }
                st.insert(s.scope, s);
            }
        }
        // An API write is answered from here: its status is published
        // first, so a read after the answer sees it.
        shared.durable.send_replace(commit.number + 1);
        // The encodings of applied ops are in the batch just written, or
        // (a pending op's, written when it was buffered) beside it.
        let mut bytes: HashMap<&[u8], &Vec<u8>> = HashMap::new();
        if applied_bytes {
            for w in &commit.writes {
                if let Write::Put(crate::core::Cf::Ops, k, v) = w {
                    bytes.insert(k.as_slice(), v);
                }
            }
            for (id, v) in &commit.released {
                bytes.insert(id.as_slice(), v);
            }
        }
        let applied = commit
            .applied
            .iter()
            .zip(conns)
            .map(|((id, scope), conn)| (*id, *scope, bytes.get(id.as_slice()).map(|v| (*v).clone()).unwrap_or_default(), conn))
            .collect();
        on_durable(Committed { events: commit.events, applied, members, delivered: commit.delivered });
    }
}
