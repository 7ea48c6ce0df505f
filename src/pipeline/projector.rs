//! The projector: folds each commit's applied data ops (SPEC §8) on its own
//! thread, so that the fold and the root checks of commit N overlap with
//! the orderer's judging of N+1; split by scope into shards, one thread
//! each, so that many scopes fold on many cores (`shards.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use metrics::{counter, gauge, histogram};

use super::author::{Composer, RootRequest};
use super::committer::ToCommit;
use super::metrics::note_age;
use super::ConnId;
use crate::core::{Commit, Projector, ScopeStatus};
use crate::protocol::Hash;

/// A commit on its way from the orderer to the projector: the statuses'
/// roots are the projector's to fill, and the heartbeat roots to compare.
pub(super) struct ToProject {
    pub(super) commit: Commit,
    pub(super) statuses: Vec<ScopeStatus>,
    pub(super) conns: Vec<ConnId>,
    pub(super) received: Instant,
    pub(super) heartbeats: Vec<HeartbeatCheck>,
    /// Data drafts of the node's API, whose roots are computed at their
    /// point in the commit.
    pub(super) roots: Vec<RootRequest>,
}

/// A peer's heartbeat with the same heads as ours: its root is compared
/// with ours once the first `at` folds of its commit are folded.
pub(super) struct HeartbeatCheck {
    pub(super) at: usize,
    pub(super) peer: std::net::SocketAddr,
    pub(super) scope: Hash,
    pub(super) root: Hash,
}

/// The fold of each commit's applied data ops (`core::Projector`), in
/// commit order, by shard `shard` (its scopes' part of each commit): the
/// cells it changed and the scope records join the commit's writes, the
/// statuses get their roots, the convergence checks and the heartbeat
/// comparisons (counted in `heartbeat_divergences`) are made; then the
/// commit goes on to the committer, and the node's data ops drafted in it
/// are composed with their roots and sent back to the orderer (`composer`),
/// while the committer writes.
pub(super) fn run(
    shard: usize,
    mut projector: Projector,
    rx: Receiver<ToProject>,
    tx: Sender<ToCommit>,
    heartbeat_divergences: Arc<AtomicU64>,
    composer: Composer,
) {
    let label = shard.to_string();
    let waited = counter!("dagfold_projector_waited_microseconds_total", "on" => "commit", "shard" => label.clone());
    let stage = histogram!("dagfold_stage_seconds", "stage" => "project", "shard" => label.clone());
    let compose = histogram!("dagfold_stage_seconds", "stage" => "compose", "shard" => label.clone());
    let queue = gauge!("dagfold_queue_batches", "stage" => "commit", "shard" => label);
    // The divergences found over all shards (each adds its own).
    let divergences = gauge!("dagfold_engine_divergences_total");
    let mut divergences_counted = projector.stats.divergences;
    divergences.increment(divergences_counted as f64);
    for m in rx {
        let ToProject { mut commit, mut statuses, conns, received, heartbeats, roots } = m;
        let t = Instant::now();
        if shard == 0 {
            note_age("project", received);
        }
        let folds = std::mem::take(&mut commit.folds);
        let mut heartbeats = heartbeats.into_iter().peekable();
        let mut roots = roots.into_iter().peekable();
        let mut drafted = Vec::new();
        for (i, fold) in folds.into_iter().enumerate() {
            while let Some(h) = heartbeats.next_if(|h| h.at <= i) {
                compare_heartbeat(&mut projector, &h, &heartbeat_divergences);
            }
            while let Some(r) = roots.next_if(|r| r.at <= i) {
                drafted.push(draft_root(&mut projector, &composer, r));
            }
            projector.fold(fold);
        }
        for h in heartbeats {
            compare_heartbeat(&mut projector, &h, &heartbeat_divergences);
        }
        for r in roots {
            drafted.push(draft_root(&mut projector, &composer, r));
        }
        projector.finish_commit(&mut commit);
        for st in &mut statuses {
            st.root = projector.root(&st.scope);
        }
        divergences.increment((projector.stats.divergences - divergences_counted) as f64);
        divergences_counted = projector.stats.divergences;
        queue.set(tx.len() as f64);
        stage.record(t.elapsed().as_secs_f64());
        let t_send = Instant::now();
        if tx.send((commit, statuses, conns, received)).is_err() {
            return;
        }
        waited.increment(t_send.elapsed().as_micros() as u64);
        if !drafted.is_empty() {
            let t = Instant::now();
            composer.send(composer.compose_all(drafted));
            compose.record(t.elapsed().as_secs_f64());
        }
    }
}

/// A data draft's root: the scope's root at the draft's point with its
/// actions folded (SPEC §8: the root of the op and its ancestors, the
/// ancestors being every data op applied then, the heads it names).
fn draft_root(projector: &mut Projector, composer: &Composer, r: RootRequest) -> (RootRequest, Hash) {
    let root = projector.root_after(&r.draft.scope, r.hlc, &composer.author, &r.actions);
    (r, root)
}

/// SPEC §8 repaired through sync: a peer with our heads and another root.
fn compare_heartbeat(projector: &mut Projector, h: &HeartbeatCheck, divergences: &AtomicU64) {
    let ours = projector.root(&h.scope);
    if ours != h.root {
        divergences.fetch_add(1, Ordering::Relaxed);
        counter!("dagfold_divergences_total", "source" => "heartbeat").increment(1);
        eprintln!(
            "dagfold: divergence with {} in scope {}: same heads, roots {} (ours) and {} (theirs)",
            h.peer,
            hex::encode(h.scope),
            hex::encode(ours),
            hex::encode(h.root)
        );
    }
}
