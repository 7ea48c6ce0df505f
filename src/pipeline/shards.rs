//! The fold split by scope: the orderer hands each commit to the projector
//! shards in parts, one per shard (`Split`), and the committer's encoder
//! joins the parts of each commit back into one before it is written
//! (`Join`).
//!
//! A shard owns the scopes with `core::projector::shard_of(scope) == i`:
//! their projections, convergence checks, heartbeat comparisons, drafts'
//! roots, cells, items and scope records. Every shard gets a part of every
//! commit, in commit order, even an empty one, and the encoder takes one
//! part from each shard in turn: so the parts it joins are those of one
//! commit, with no sequence numbers to match and nothing buffered out of
//! order. A joined commit is written whole, in one atomic batch (with the
//! commits queued behind it, as before); the parts' writes never share a
//! key (every key they write starts with its scope).
//!
//! No deadlock with bounded channels: the orderer sends commit N's parts to
//! every shard before any part of N+1, and the encoder waits for a part
//! of N from shard j only after taking every part before N from it, so
//! shard j's output holds nothing the encoder is not about to take.

use crossbeam_channel::{bounded, Receiver, Sender};

use super::committer::ToCommit;
use super::projector::ToProject;
use super::COMMIT_SLOTS;
use crate::core::projector::shard_of;
use crate::core::Commit;

/// The orderer's side: a commit split into one part per shard.
pub(super) struct Split {
    shards: Vec<Sender<ToProject>>,
}

/// The committer's side (its encoder's): one part from each shard in turn,
/// joined.
pub(super) struct Join {
    shards: Vec<Receiver<ToCommit>>,
    /// The joining thread's idle spells (`crate::idle`).
    spell: crate::idle::Spell,
}

/// A shard's channels: its parts in, its folded parts out.
pub(super) struct ShardIo {
    pub(super) rx: Receiver<ToProject>,
    pub(super) tx: Sender<ToCommit>,
}

/// The channels of `shards` projector shards, each bounded by
/// `COMMIT_SLOTS` on either side as the one projector's were: a shard's
/// part of commit N is folded while its part of N-1 is written.
pub(super) fn channels(shards: usize) -> (Split, Vec<ShardIo>, Join) {
    assert!((1..=crate::limits::PROJECTOR_SHARDS_MAX).contains(&shards), "projector shards out of bounds");
    let mut split = Split { shards: Vec::with_capacity(shards) };
    let mut join = Join { shards: Vec::with_capacity(shards), spell: Default::default() };
    let mut io = Vec::with_capacity(shards);
    for _ in 0..shards {
        let (tx_in, rx_in) = bounded::<ToProject>(COMMIT_SLOTS);
        let (tx_out, rx_out) = bounded::<ToCommit>(COMMIT_SLOTS);
        split.shards.push(tx_in);
        join.shards.push(rx_out);
        io.push(ShardIo { rx: rx_in, tx: tx_out });
    }
    (split, io, join)
}

impl Split {
    /// Sends one part of `m` to each shard; false once a shard is gone.
    pub(super) fn send(&self, m: ToProject) -> bool {
        if self.shards.len() == 1 {
            return self.shards[0].send(m).is_ok();
        }
        split(m, self.shards.len()).into_iter().zip(&self.shards).all(|(part, tx)| tx.send(part).is_ok())
    }

    /// No part waits for its shard: the commit being built may go at once.
    pub(super) fn is_empty(&self) -> bool {
        self.shards.iter().all(|tx| tx.is_empty())
    }

    /// Parts waiting for the shard furthest behind.
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|tx| tx.len()).max().unwrap_or(0)
    }
}

/// The parts of one commit, one per shard. The first carries everything
/// that is not the fold's (the engine's writes, events, applied ops, the
/// connections); each carries its scopes' folds in their order, records and
/// statuses, and the heartbeat checks and root requests of its scopes with
/// their points (`at`) counted in its own folds: a scope's state after the
/// first `at` folds of the commit is its state after those of them that
/// are its shard's.
pub(super) fn split(m: ToProject, shards: usize) -> Vec<ToProject> {
    let ToProject { mut commit, statuses, conns, received, heartbeats, roots } = m;
    let folds = std::mem::take(&mut commit.folds);
    let records = std::mem::take(&mut commit.records);
    let mut parts: Vec<ToProject> = (0..shards)
        .map(|_| ToProject {
            commit: Commit { number: commit.number, ..Default::default() },
            statuses: Vec::new(),
            conns: Vec::new(),
            received,
            heartbeats: Vec::new(),
            roots: Vec::new(),
        })
        .collect();
    // The checks and requests come in the order of their points (the
    // orderer adds them as the commit grows).
    let mut heartbeats = heartbeats.into_iter().peekable();
    let mut roots = roots.into_iter().peekable();
    let mut place = |parts: &mut [ToProject], i: usize| {
        while let Some(mut h) = heartbeats.next_if(|h| h.at <= i) {
            let p = &mut parts[shard_of(&h.scope, shards)];
            h.at = p.commit.folds.len();
            p.heartbeats.push(h);
        }
        while let Some(mut r) = roots.next_if(|r| r.at <= i) {
            let p = &mut parts[shard_of(&r.draft.scope, shards)];
            r.at = p.commit.folds.len();
            p.roots.push(r);
        }
    };
    for (i, fold) in folds.into_iter().enumerate() {
        place(&mut parts, i);
        parts[shard_of(&fold.scope, shards)].commit.folds.push(fold);
    }
    place(&mut parts, usize::MAX);
    for (scope, rec) in records {
        parts[shard_of(&scope, shards)].commit.records.push((scope, rec));
    }
    for st in statuses {
        parts[shard_of(&st.scope, shards)].statuses.push(st);
    }
    let first = &mut parts[0];
    // Every field named: a new one must be placed here.
    let Commit { writes, events, applied, released, gov_applied, keys_added, delivered, number: _, folds: _, records: _ } = commit;
    first.commit = Commit { writes, events, applied, released, gov_applied, keys_added, delivered, ..std::mem::take(&mut first.commit) };
    first.conns = conns;
    parts
}

impl Join {
    /// The next commit, its parts joined: the first part's with the other
    /// parts' writes after its own, and the statuses in scope order (as
    /// the orderer made them); none once the shards are gone. The thread
    /// collects its freed memory once per idle spell.
    pub(super) fn recv(&mut self) -> Option<ToCommit> {
        let (mut commit, mut statuses, conns, received) = crate::idle::next(&self.shards[0], &mut self.spell)?;
        if self.shards.len() == 1 {
            return Some((commit, statuses, conns, received));
        }
        for rx in &self.shards[1..] {
            let (part, part_statuses, _, _) = crate::idle::next(rx, &mut self.spell)?;
            assert_eq!(part.number, commit.number, "the parts of one commit");
            commit.writes.extend(part.writes);
            statuses.extend(part_statuses);
        }
        statuses.sort_unstable_by_key(|s| s.scope);
        Some((commit, statuses, conns, received))
    }
}

/// The fold stage alone, as the pipeline runs it: `commits` split by scope
/// on a thread standing for the orderer, folded by `projectors` (a
/// `Projector::split`) on their shard threads (two each, the cells' and the
/// trees', with `split`), joined on this thread and handed to `on_commit`
/// (standing for the committer). For the stage benchmark
/// (`benches/stages.rs`) and the tests.
#[cfg(feature = "testkit")]
pub fn fold_stage(
    projectors: Vec<crate::core::Projector>,
    split_sides: bool,
    commits: Vec<(Commit, Vec<crate::core::ScopeStatus>)>,
    mut on_commit: impl FnMut(Commit, Vec<crate::core::ScopeStatus>),
) {
    let (split, io, mut join) = channels(projectors.len());
    let heartbeat_divergences = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    std::thread::scope(|s| {
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name).spawn_scoped(s, f).expect("spawning a fold stage thread");
        };
        for (i, (projector, ShardIo { rx, tx })) in projectors.into_iter().zip(io).enumerate() {
            let d = heartbeat_divergences.clone();
            for (name, f) in super::projector::shard_threads(i, projector, rx, tx, split_sides, d, super::author::Composer::detached()) {
                spawn(name, f);
            }
        }
        spawn("dagfold-split".into(), Box::new(move || {
            for (commit, statuses) in commits {
                let received = std::time::Instant::now();
                let m = ToProject { commit, statuses, conns: Vec::new(), received, heartbeats: Vec::new(), roots: Vec::new() };
                if !split.send(m) {
                    return;
                }
            }
        }));
        while let Some((commit, statuses, _, _)) = join.recv() {
            on_commit(commit, statuses);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Fold, ScopeRecord, ScopeStatus, Write};
    use crate::pipeline::projector::HeartbeatCheck;

    /// A scope of shard `shard` of 2.
    fn scope(shard: u8, n: u8) -> crate::protocol::Hash {
        let mut s = [n; 32];
        s[0] = 2 * n + shard;
        assert_eq!(shard_of(&s, 2), shard as usize);
        s
    }

    fn fold(scope: crate::protocol::Hash, hlc: u64) -> Fold {
        Fold { scope, hlc, author: [1; 32], actions: vec![], check: None }
    }

    fn status(scope: crate::protocol::Hash) -> ScopeStatus {
        ScopeStatus {
            scope,
            governance_heads: vec![],
            data_heads: vec![],
            applied: 0,
            pending: 0,
            key_waiting: 0,
            data_key_waiting: 0,
            root: crate::protocol::ZERO,
            members: std::sync::Arc::from([]),
        }
    }

    /// Each part holds its scopes' folds in their order, records and
    /// statuses, and the heartbeat checks and drafts' root requests at the
    /// same point of its scopes' folds; the first the rest of the commit. The join takes one part
    /// from each shard, in shard order whatever order they come in: the
    /// first part's commit with every part's writes, the statuses in scope
    /// order.
    #[test]
    fn a_commit_is_split_by_scope_and_joined_whole() {
        let (a, b, c) = (scope(0, 1), scope(1, 2), scope(1, 3));
        let peer = "127.0.0.1:9".parse().unwrap();
        let check = |at, scope| HeartbeatCheck { at, peer, scope, root: [at as u8; 32] };
        let rec = ScopeRecord { genesis_applied: true, gov_heads: vec![], data_heads: vec![], applied: 1, divergences: 0, event_seq: 0 };
        let mut commit = Commit { number: 7, ..Default::default() };
        commit.folds = vec![fold(a, 1), fold(b, 2), fold(c, 3), fold(a, 4), fold(b, 5)];
        commit.records = vec![(a, rec.clone()), (b, rec.clone()), (c, rec)];
        commit.writes = vec![Write::Put(crate::core::Cf::Ops, vec![1], vec![1])];
        commit.applied = vec![([1; 32], a)];
        // After the first fold, after the third and at the end.
        let heartbeats = vec![check(1, b), check(3, a), check(3, b), check(5, c)];
        let request = |at, scope| {
            let draft = crate::core::Draft {
                scope,
                plane: crate::protocol::PLANE_DATA,
                parents: vec![],
                cut: vec![],
                hlc_min: 0,
                key: [0; 32],
                key_id: [0; 32],
                governance: Default::default(),
                keyring: vec![],
            };
            let reply = tokio::sync::oneshot::channel().0;
            crate::pipeline::author::RootRequest { at, hlc: 0, actions: vec![], draft, plain: vec![0; 40], reply }
        };
        // A draft of c at the start, of a after the second fold.
        let roots = vec![request(0, c), request(2, a)];
        let m = ToProject {
            commit,
            statuses: vec![status(a), status(b), status(c)],
            conns: vec![9],
            received: std::time::Instant::now(),
            heartbeats,
            roots,
        };
        let parts = split(m, 2);
        let hlcs = |p: &ToProject| p.commit.folds.iter().map(|f| (f.scope, f.hlc)).collect::<Vec<_>>();
        assert_eq!(hlcs(&parts[0]), [(a, 1), (a, 4)]);
        assert_eq!(hlcs(&parts[1]), [(b, 2), (c, 3), (b, 5)]);
        let points = |p: &ToProject| p.heartbeats.iter().map(|h| (h.scope, h.at)).collect::<Vec<_>>();
        assert_eq!(points(&parts[0]), [(a, 1)], "a after its first fold");
        assert_eq!(points(&parts[1]), [(b, 0), (b, 2), (c, 3)], "b before its first, after c's; c at the end");
        let points = |p: &ToProject| p.roots.iter().map(|r| (r.draft.scope, r.at)).collect::<Vec<_>>();
        assert_eq!((points(&parts[0]), points(&parts[1])), (vec![(a, 1)], vec![(c, 0)]));
        assert_eq!(parts.iter().map(|p| p.commit.records.len()).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(parts.iter().map(|p| p.statuses.len()).collect::<Vec<_>>(), [1, 2]);
        assert_eq!((parts[0].commit.writes.len(), parts[0].commit.applied.len(), parts[0].conns.clone()), (1, 1, vec![9]));
        assert!(parts[1].commit.writes.is_empty() && parts[1].commit.applied.is_empty() && parts[1].conns.is_empty());
        assert!(parts.iter().all(|p| p.commit.number == 7));

        let (_split, io, mut join) = channels(2);
        let mut folded: Vec<ToCommit> = parts
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let mut commit = p.commit;
                commit.folds.clear();
                commit.writes.push(Write::Put(crate::core::Cf::Projection, vec![i as u8 + 2], vec![]));
                let mut statuses = p.statuses;
                statuses.reverse();
                (commit, statuses, p.conns, p.received)
            })
            .collect();
        // The parts come in any order; the commit is joined in shard order.
        io[1].tx.send(folded.pop().unwrap()).unwrap();
        io[0].tx.send(folded.pop().unwrap()).unwrap();
        let (commit, statuses, conns, _) = join.recv().expect("both parts in");
        assert_eq!(commit.writes.iter().map(|w| match w { Write::Put(_, k, _) => k[0], _ => 0 }).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!((commit.number, commit.applied.len(), conns), (7, 1, vec![9]));
        assert_eq!(statuses.iter().map(|s| s.scope).collect::<Vec<_>>(), [a, b, c]);
        drop(io);
        assert!(join.recv().is_none(), "no commit once the shards are gone");
    }
}
