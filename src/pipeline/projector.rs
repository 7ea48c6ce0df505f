//! The projector: folds each commit's applied data ops (SPEC §8) on its own
//! thread, so that the fold and the root checks of commit N overlap with
//! the orderer's judging of N+1; split by scope into shards, one thread
//! each, so that many scopes fold on many cores (`shards.rs`); and each
//! shard, optionally, in two threads one after the other over each commit
//! (`--projector-split`): the cells' fold (`run_fold`), then the trees'
//! roots and checks (`run_tree`), so that one scope folds on two cores.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

use super::author::{Composer, RootRequest};
use super::committer::ToCommit;
use super::metrics::{note_age, shard_memory_gauge, Paced, MEMORY_EVERY};
use super::ConnId;
use crate::idle::Spell;
use crate::core::projector::{FoldSide, TreeLog, TreeSide};
use crate::core::{Commit, Projector, ScopeStatus};
use crate::protocol::{Hash, PublicKey};

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

/// A commit's part with its cells folded (their writes in the part's
/// commit), on its way to the trees: its folds as a log, each root
/// request's leaves (its actions folded into copies of the cells at its
/// point).
pub(super) struct Folded {
    part: ToProject,
    log: TreeLog,
    leaves: Vec<Vec<(Hash, Hash)>>,
}

/// The fold of each commit's applied data ops (`core::Projector`), in
/// commit order, by shard `shard` (its scopes' part of each commit), both
/// sides on this thread: the cells it changed and the scope records join
/// the commit's writes, the statuses get their roots, the convergence
/// checks and the heartbeat comparisons (counted in
/// `heartbeat_divergences`) are made; then the commit goes on to the
/// committer, and the node's data ops drafted in it are composed with
/// their roots and sent back to the orderer (`composer`), while the
/// committer writes.
pub(super) fn run(
    shard: usize,
    projector: Projector,
    rx: Receiver<ToProject>,
    tx: Sender<ToCommit>,
    heartbeat_divergences: Arc<AtomicU64>,
    composer: Composer,
) {
    let (mut cells, trees) = projector.into_sides();
    let mut trees = Trees::new(shard, trees, tx, heartbeat_divergences, composer);
    let mut log = TreeLog::default();
    let (mut memory, cells_memory) = (Paced::default(), shard_memory_gauge("cells", shard));
    let mut spell = Spell::default();
    while let Some(m) = next_part(&rx, &mut spell) {
        if let Some(m) = m {
            let t = Instant::now();
            let folded = fold_part(shard, &mut cells, m, log, &trees.composer.author);
            match trees.take(folded, t) {
                Some(back) => log = back,
                None => return,
            }
        }
        memory.run(|| {
            cells_memory.set(cells.heap_bytes() as f64);
            trees.publish_memory();
        });
    }
}

/// The next part from `rx`: `Some(None)` after `MEMORY_EVERY` without one
/// (the memory gauges are taken idle too, and the thread's freed memory
/// collected once per idle spell), `None` once it is closed.
fn next_part<T>(rx: &Receiver<T>, spell: &mut Spell) -> Option<Option<T>> {
    match crate::idle::recv_parked(rx, MEMORY_EVERY) {
        Ok(m) => {
            spell.worked();
            Some(Some(m))
        }
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
            spell.idle();
            Some(None)
        }
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => None,
    }
}

/// The cells' side of shard `shard` on a thread of its own: each part's
/// folds folded into its cells, its cells' writes made, then the part
/// handed to the tree side (`run_tree`) with its log.
pub(super) fn run_fold(shard: usize, mut cells: FoldSide, rx: Receiver<ToProject>, tx: Sender<Folded>, author: PublicKey, logs: Receiver<TreeLog>) {
    let stage = histogram!("dagfold_stage_seconds", "stage" => "fold", "shard" => shard.to_string());
    let waited = counter!("dagfold_projector_waited_microseconds_total", "on" => "trees", "shard" => shard.to_string());
    let (mut memory, cells_memory) = (Paced::default(), shard_memory_gauge("cells", shard));
    let mut spell = Spell::default();
    while let Some(m) = next_part(&rx, &mut spell) {
        if let Some(m) = m {
            let t = Instant::now();
            let log = logs.try_recv().unwrap_or_default();
            let folded = fold_part(shard, &mut cells, m, log, &author);
            stage.record(t.elapsed().as_secs_f64());
            let t_send = Instant::now();
            if tx.send(folded).is_err() {
                return;
            }
            waited.increment(t_send.elapsed().as_micros() as u64);
        }
        memory.run(|| cells_memory.set(cells.heap_bytes() as f64));
    }
}

/// The trees' side of shard `shard` on a thread of its own: each part
/// from `run_fold` finished as `run` finishes it; its emptied log goes
/// back for reuse (`logs`).
pub(super) fn run_tree(
    shard: usize,
    trees: TreeSide,
    rx: Receiver<Folded>,
    tx: Sender<ToCommit>,
    heartbeat_divergences: Arc<AtomicU64>,
    composer: Composer,
    logs: Sender<TreeLog>,
) {
    let mut trees = Trees::new(shard, trees, tx, heartbeat_divergences, composer);
    let mut memory = Paced::default();
    let mut spell = Spell::default();
    while let Some(f) = next_part(&rx, &mut spell) {
        if let Some(f) = f {
            match trees.take(f, Instant::now()) {
                Some(back) => {
                    let _ = logs.try_send(back);
                }
                None => return,
            }
        }
        memory.run(|| trees.publish_memory());
    }
}

/// The threads of shard `shard`, each with its name: `run`'s, or with
/// `split` those of `run_fold` and `run_tree`, and the channels between
/// them (a part being folded while the one before it is finished).
pub(super) fn shard_threads(
    shard: usize,
    projector: Projector,
    rx: Receiver<ToProject>,
    tx: Sender<ToCommit>,
    split: bool,
    heartbeat_divergences: Arc<AtomicU64>,
    composer: Composer,
) -> Vec<(String, Box<dyn FnOnce() + Send>)> {
    let d = heartbeat_divergences;
    if !split {
        return vec![(format!("dagfold-projector-{shard}"), Box::new(move || run(shard, projector, rx, tx, d, composer)))];
    }
    let (fold_tx, fold_rx) = crossbeam_channel::bounded(super::COMMIT_SLOTS);
    let (logs_tx, logs_rx) = crossbeam_channel::bounded(super::COMMIT_SLOTS + 1);
    let (cells, trees) = projector.into_sides();
    let author = composer.author;
    vec![
        (format!("dagfold-projector-{shard}"), Box::new(move || run_fold(shard, cells, rx, fold_tx, author, logs_rx))),
        (format!("dagfold-tree-{shard}"), Box::new(move || run_tree(shard, trees, fold_rx, tx, d, composer, logs_tx))),
    ]
}

/// A part's folds through the cells, at their points the root requests'
/// leaves; its cells' writes added to its commit's.
fn fold_part(shard: usize, cells: &mut FoldSide, mut part: ToProject, mut log: TreeLog, author: &PublicKey) -> Folded {
    if shard == 0 {
        note_age("project", part.received);
    }
    let folds = std::mem::take(&mut part.commit.folds);
    let mut leaves = Vec::with_capacity(part.roots.len());
    let mut roots = part.roots.iter().peekable();
    for (i, fold) in folds.into_iter().enumerate() {
        while let Some(r) = roots.next_if(|r| r.at <= i) {
            leaves.push(cells.leaves_after(&r.draft.scope, r.hlc, author, &r.actions));
        }
        cells.fold(fold, &mut log);
    }
    for r in roots {
        leaves.push(cells.leaves_after(&r.draft.scope, r.hlc, author, &r.actions));
    }
    cells.finish_commit(&mut part.commit.writes);
    Folded { part, log, leaves }
}

/// The trees' side of a shard and what it finishes parts with.
struct Trees {
    trees: TreeSide,
    tx: Sender<ToCommit>,
    heartbeat_divergences: Arc<AtomicU64>,
    composer: Composer,
    waited: Counter,
    stage: Histogram,
    compose: Histogram,
    queue: Gauge,
    /// The divergences found over all shards (each adds its own).
    divergences: Gauge,
    divergences_counted: u64,
    /// `dagfold_memory_bytes{part="trees"}` of this shard.
    memory: Gauge,
}

impl Trees {
    fn new(shard: usize, trees: TreeSide, tx: Sender<ToCommit>, heartbeat_divergences: Arc<AtomicU64>, composer: Composer) -> Trees {
        let label = shard.to_string();
        let divergences = gauge!("dagfold_engine_divergences_total");
        divergences.increment(trees.stats.divergences as f64);
        Trees {
            divergences_counted: trees.stats.divergences,
            trees,
            tx,
            heartbeat_divergences,
            composer,
            waited: counter!("dagfold_projector_waited_microseconds_total", "on" => "commit", "shard" => label.clone()),
            stage: histogram!("dagfold_stage_seconds", "stage" => "project", "shard" => label.clone()),
            compose: histogram!("dagfold_stage_seconds", "stage" => "compose", "shard" => label.clone()),
            queue: gauge!("dagfold_queue_batches", "stage" => "commit", "shard" => label),
            divergences,
            memory: shard_memory_gauge("trees", shard),
        }
    }

    fn publish_memory(&self) {
        self.memory.set(self.trees.heap_bytes() as f64);
    }

    /// Finishes a part: its folds' leaves set and checks made, with the
    /// heartbeat comparisons and the drafts' roots at their points; the
    /// scope records join the commit's writes, after its cells'; the
    /// statuses get their roots. Sends it on to the committer, then the
    /// drafts' ops to the orderer. Its log, emptied; none once the
    /// committer is gone.
    fn take(&mut self, f: Folded, t: Instant) -> Option<TreeLog> {
        let Folded { part, mut log, leaves } = f;
        let ToProject { mut commit, mut statuses, conns, received, heartbeats, roots } = part;
        let mut heartbeats = heartbeats.into_iter().peekable();
        let mut roots = roots.into_iter().zip(leaves).peekable();
        let mut drafted = Vec::new();
        for i in 0..log.len() {
            while let Some(h) = heartbeats.next_if(|h| h.at <= i) {
                self.compare_heartbeat(&h);
            }
            while let Some((r, leaves)) = roots.next_if(|(r, _)| r.at <= i) {
                let root = self.trees.root_with(&r.draft.scope, &leaves);
                drafted.push((r, root));
            }
            self.trees.take(&mut log, i + 1);
        }
        for h in heartbeats {
            self.compare_heartbeat(&h);
        }
        for (r, leaves) in roots {
            let root = self.trees.root_with(&r.draft.scope, &leaves);
            drafted.push((r, root));
        }
        log.clear();
        self.trees.finish_commit(&mut commit);
        let scopes: Vec<Hash> = statuses.iter().map(|st| st.scope).collect();
        let mut roots = Vec::with_capacity(scopes.len());
        self.trees.roots(&scopes, &mut roots);
        for (st, root) in statuses.iter_mut().zip(roots) {
            st.root = root;
        }
        let found = self.trees.stats.divergences;
        self.divergences.increment((found - self.divergences_counted) as f64);
        self.divergences_counted = found;
        self.queue.set(self.tx.len() as f64);
        self.stage.record(t.elapsed().as_secs_f64());
        let t_send = Instant::now();
        if self.tx.send((commit, statuses, conns, received)).is_err() {
            return None;
        }
        self.waited.increment(t_send.elapsed().as_micros() as u64);
        if !drafted.is_empty() {
            let t = Instant::now();
            self.composer.send(self.composer.compose_all(drafted));
            self.compose.record(t.elapsed().as_secs_f64());
        }
        Some(log)
    }

    /// SPEC §8 repaired through sync: a peer with our heads and another root.
    fn compare_heartbeat(&mut self, h: &HeartbeatCheck) {
        let ours = self.trees.root(&h.scope);
        if ours != h.root {
            self.heartbeat_divergences.fetch_add(1, Ordering::Relaxed);
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
}
