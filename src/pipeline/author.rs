//! The pipeline's share of authoring (API.md, "Model"): the orderer hands
//! out drafts (`core::Draft`: parents, cut, hlc, key) against the state it
//! holds, in the same commits as received ops, so that many writers never
//! wait on a lock around the whole path. A data draft goes on with its
//! commit to the projector, which computes its root at the point of the
//! commit where it was taken (`RootRequest`), then composes, seals and
//! signs the op (`Composer`) and sends the commit's ops back to the
//! orderer in one message: a data write costs the API's task one request
//! and one answer, and the orderer one wake-up per commit for all of them.
//!
//! Per scope, drafts out at once are bounded: a draft's op names the heads
//! it saw, and the ops out at once become heads side by side until a later
//! op names them all, so the bound keeps the data heads (and an op's
//! parents) well within SPEC §7's 32. Governance drafts go one at a time, so
//! that two changes of the group are never judged against the same members
//! (two removals of one member: the second finds it gone). Requests past
//! the bound wait here, in order, and are drafted as the ops out come back
//! judged.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{DraftRequest, Drafted};
use crate::core::{DraftRefused, Engine, IdMap};
use crate::protocol::{Hash, PLANE_DATA};

/// Data drafts out at once per scope. Each op out while others are applied
/// adds a data head; 16 leaves room for as many heads from other writers
/// within SPEC §7's 32 parents. It is not what binds `tools/bench
/// api_writes` on 2 cores (2026-12-04: 24 gave the same ~5,000 ops/s within
/// noise; the node's CPU per write is, docs/PERFORMANCE.md).
pub const DRAFTS_OUT_PER_SCOPE_MAX: u32 = 16;

/// Requests waiting for a draft, over all scopes: past this a request is
/// refused as busy (the API's own admission bounds it first).
pub const DRAFTS_WAITING_MAX: usize = 8192;

/// A draft whose op has not come back in this long (its writer gone, the
/// store refusing) no longer counts against its scope's bound.
const DRAFT_RETURN_MS: u64 = 10_000;

#[derive(Default)]
struct ScopeDrafts {
    data_out: u32,
    gov_out: bool,
    waiting: VecDeque<DraftRequest>,
    last: Option<Instant>,
}

/// A data draft whose root the projector computes: the scope's root with
/// `actions` folded, once the first `at` folds of the commit are folded;
/// the op is then composed with it (`Composer`).
pub(super) struct RootRequest {
    pub(super) at: usize,
    pub(super) hlc: u64,
    pub(super) actions: Vec<crate::protocol::Action>,
    pub(super) draft: crate::core::Draft,
    /// The payload's encoding, its root (the first 32 bytes) zero.
    pub(super) plain: Vec<u8>,
    pub(super) reply: super::AuthoredReply,
}

/// Composes, seals and signs the node's data ops on a projector shard, and
/// sends them back to the orderer (`Work::Own`).
pub(super) struct Composer {
    pub(super) author: crate::protocol::PublicKey,
    pub(super) signer: crate::protocol::sig::Signer,
    /// The verifiers' cache: the node's fresh signatures go in it, so a
    /// copy of the op echoed back by a peer is not verified again.
    pub(super) verified: std::sync::Arc<super::verified::VerifiedCache>,
    pub(super) orderer: crossbeam_channel::Sender<super::Work>,
}

impl Composer {
    /// A composer for a fold stage without an orderer (`shards::
    /// fold_stage`), whose commits carry no drafts: a throwaway key, its
    /// ops sent nowhere.
    #[cfg(feature = "testkit")]
    pub(super) fn detached() -> Composer {
        let seed = [7; 32];
        Composer {
            author: crate::protocol::sig::public_key_from_seed(&seed),
            signer: crate::protocol::sig::Signer::new(&seed),
            verified: std::sync::Arc::new(super::verified::VerifiedCache::new(16)),
            orderer: crossbeam_channel::bounded(1).0,
        }
    }

    /// The ops of a commit's drafts with their roots, in order: composed
    /// and sealed one by one, signed together (`sign_all`).
    pub(super) fn compose_all(&self, drafted: Vec<(RootRequest, Hash)>) -> Vec<super::OwnOp> {
        let (mut ops, rest): (Vec<crate::protocol::Op>, Vec<(Vec<u8>, super::AuthoredReply)>) = drafted
            .into_iter()
            .map(|(r, root)| {
                let RootRequest { hlc, draft, mut plain, reply, .. } = r;
                plain[..32].copy_from_slice(&root);
                (seal(self.author, &draft, hlc, &plain), (plain, reply))
            })
            .unzip();
        let signed = sign_all(&self.signer, &self.verified, &mut ops);
        ops.into_iter()
            .zip(signed)
            .zip(rest)
            .map(|((op, (bytes, id)), (plain, reply))| super::OwnOp { id, op, bytes, plain: Some(plain), reply })
            .collect()
    }

    /// Sends a commit's composed ops to the orderer. Its direct queue
    /// holds at most one item per write in progress (`node::author::
    /// WRITES_IN_PROGRESS_MAX`, half its size), so it has room; were it
    /// full or closed (the node stopping), the writes are answered busy or
    /// not at all, and their drafts' turns come back by `DRAFT_RETURN_MS`.
    pub(super) fn send(&self, ops: Vec<super::OwnOp>) {
        if ops.is_empty() {
            return;
        }
        if let Err(crossbeam_channel::TrySendError::Full(super::Work::Own(ops))) = self.orderer.try_send(super::Work::Own(ops)) {
            for o in ops {
                let _ = o.reply.send(Err(DraftRefused::Busy));
            }
        }
    }
}

/// The op of `draft` by `author` at `hlc`, its payload `plain` sealed with
/// the draft's key under a fresh random nonce (SPEC §4, from the thread's
/// CSPRNG), signed (`sign`): its id, the op and its encoding. For the
/// node's governance writes (`node::author`).
#[cfg(feature = "rocksdb-store")]
pub(crate) fn compose(
    signer: &crate::protocol::sig::Signer,
    verified: &super::verified::VerifiedCache,
    author: crate::protocol::PublicKey,
    draft: &crate::core::Draft,
    hlc: u64,
    plain: &[u8],
) -> (Hash, crate::protocol::Op, Vec<u8>) {
    let mut op = seal(author, draft, hlc, plain);
    let (bytes, id) = sign(signer, verified, &mut op);
    (id, op, bytes)
}

/// The op of `draft` by `author` at `hlc`, its payload `plain` sealed with
/// the draft's key under a fresh random nonce (SPEC §4, from the thread's
/// CSPRNG), not signed yet.
fn seal(author: crate::protocol::PublicKey, draft: &crate::core::Draft, hlc: u64, plain: &[u8]) -> crate::protocol::Op {
    use rand::RngCore;
    let mut nonce = [0u8; 12];
    rand::thread_rng().fill_bytes(&mut nonce);
    let (scope, plane) = (draft.scope, draft.plane);
    crate::protocol::Op {
        version: 1,
        scope,
        plane,
        author,
        parents: draft.parents.clone(),
        cut: draft.cut.clone(),
        hlc,
        key_id: draft.key_id,
        nonce,
        payload: crate::protocol::crypto::seal_payload(&draft.key, &nonce, &scope, plane, plain),
        signature: [0; 64],
    }
}

/// Signs `op` in place with the node's key; its encoding and id
/// (`sign_all`).
#[cfg(feature = "rocksdb-store")]
pub(crate) fn sign(
    signer: &crate::protocol::sig::Signer,
    verified: &super::verified::VerifiedCache,
    op: &mut crate::protocol::Op,
) -> (Vec<u8>, Hash) {
    sign_all(signer, verified, std::slice::from_mut(op)).pop().expect("one op signed")
}

/// Signs `ops` in place with the node's key, together (`Signer::sign_many`:
/// eight `[r]B` at once and one field inversion for them); each op's encoding (the
/// signature is its last 64 bytes, SPEC §3) and id, in order.
///
/// The signatures are made by the node's own key over these ids: the
/// verifiers take each as a copy of an op found valid (`(id, signature)` in
/// their cache) rather than check it again. Checking it cost a verification
/// per write in batches of one or two (the writer waits), ~11% of the
/// node's CPU under `tools/bench api_writes` (docs/PERFORMANCE.md); a peer
/// still verifies it.
fn sign_all(
    signer: &crate::protocol::sig::Signer,
    verified: &super::verified::VerifiedCache,
    ops: &mut [crate::protocol::Op],
) -> Vec<(Vec<u8>, Hash)> {
    let mut encoded: Vec<(Vec<u8>, Hash)> = ops
        .iter_mut()
        .map(|op| {
            op.signature = [0; 64];
            crate::protocol::crypto::encode_op(op)
        })
        .collect();
    let ids: Vec<Hash> = encoded.iter().map(|(_, id)| *id).collect();
    for ((op, (bytes, _)), signature) in ops.iter_mut().zip(&mut encoded).zip(signer.sign_many(&ids)) {
        op.signature = signature;
        let at = bytes.len() - 64;
        bytes[at..].copy_from_slice(&signature);
    }
    verified.record(encoded.iter().zip(ops.iter()).map(|((_, id), op)| (id, &op.signature)));
    encoded
}

#[derive(Default)]
pub(super) struct Authoring {
    scopes: IdMap<Hash, ScopeDrafts>,
    waiting: usize,
    /// Roots for the projector to compute with the commit being built.
    pub(super) roots: Vec<RootRequest>,
    /// Scopes with an authored op judged in the commit being built: their
    /// statuses go with it, so that a read after a write's answer sees it.
    pub(super) judged: std::collections::BTreeSet<Hash>,
    /// The answers to the authored ops applied in the commit being built,
    /// sent once it is durable (`PipelineState::answers`).
    pub(super) answers: Vec<(super::AuthoredReply, super::Authored)>,
}

impl Authoring {
    /// A request: drafted now if its scope has room, else queued.
    pub(super) fn request(&mut self, engine: &mut Engine, req: DraftRequest, now_ms: u64) {
        let s = self.scopes.entry(*req.scope()).or_default();
        let room = if req.plane() == PLANE_DATA { s.data_out < DRAFTS_OUT_PER_SCOPE_MAX } else { !s.gov_out };
        if room && s.waiting.is_empty() {
            self.draft(engine, req, now_ms);
        } else if self.waiting >= DRAFTS_WAITING_MAX {
            req.refuse(DraftRefused::Busy);
        } else {
            s.waiting.push_back(req);
            self.waiting += 1;
        }
    }

    /// An authored op of `scope` was judged: its draft is back; the
    /// requests waiting on the scope are drafted against the state now.
    pub(super) fn returned(&mut self, engine: &mut Engine, scope: &Hash, plane: u8, now_ms: u64) {
        self.judged.insert(*scope);
        let Some(s) = self.scopes.get_mut(scope) else { return };
        if plane == PLANE_DATA {
            s.data_out = s.data_out.saturating_sub(1);
        } else {
            s.gov_out = false;
        }
        self.drain(engine, *scope, now_ms);
    }

    /// Frees the bound of drafts whose ops never came back.
    pub(super) fn expire(&mut self, engine: &mut Engine, now_ms: u64) {
        let stale: Vec<Hash> = self
            .scopes
            .iter()
            .filter(|(_, s)| {
                (s.data_out > 0 || s.gov_out) && s.last.is_some_and(|t| t.elapsed() > Duration::from_millis(DRAFT_RETURN_MS))
            })
            .map(|(k, _)| *k)
            .collect();
        for scope in stale {
            if let Some(s) = self.scopes.get_mut(&scope) {
                s.data_out = 0;
                s.gov_out = false;
            }
            self.drain(engine, scope, now_ms);
        }
        self.scopes.retain(|_, s| s.data_out > 0 || s.gov_out || !s.waiting.is_empty());
    }

    fn drain(&mut self, engine: &mut Engine, scope: Hash, now_ms: u64) {
        loop {
            let Some(s) = self.scopes.get_mut(&scope) else { return };
            let room = match s.waiting.front() {
                None => return,
                Some(r) if r.plane() == PLANE_DATA => s.data_out < DRAFTS_OUT_PER_SCOPE_MAX,
                Some(_) => !s.gov_out,
            };
            if !room {
                return;
            }
            let req = s.waiting.pop_front().expect("a front");
            self.waiting -= 1;
            self.draft(engine, req, now_ms);
        }
    }

    fn draft(&mut self, engine: &mut Engine, req: DraftRequest, now_ms: u64) {
        let draft = match engine.draft(req.scope(), req.plane()) {
            Ok(d) => d,
            Err(e) => {
                req.refuse(e);
                return;
            }
        };
        let s = self.scopes.entry(draft.scope).or_default();
        s.last = Some(Instant::now());
        let hlc = now_ms.max(draft.hlc_min);
        match req {
            DraftRequest::Data { actions, plain, reply, .. } => {
                s.data_out += 1;
                let at = engine.folds_in_commit();
                self.roots.push(RootRequest { at, hlc, actions, draft, plain, reply });
            }
            DraftRequest::Governance { reply, .. } => {
                // A requester gone frees the scope's turn at once.
                s.gov_out = reply.send(Ok(Drafted { draft, hlc })).is_ok();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::crypto::{encode_op, open_payload};
    use crate::protocol::sig;

    fn request(scope: Hash, plain: Vec<u8>) -> (RootRequest, tokio::sync::oneshot::Receiver<Result<super::super::Authored, DraftRefused>>) {
        let draft = crate::core::Draft {
            scope,
            plane: PLANE_DATA,
            parents: vec![[3; 32]],
            cut: vec![[4; 32]],
            hlc_min: 0,
            key: [5; 32],
            key_id: [6; 32],
            governance: Default::default(),
            keyring: vec![],
        };
        let (reply, rx) = tokio::sync::oneshot::channel();
        (RootRequest { at: 0, hlc: 77, actions: vec![], draft, plain, reply }, rx)
    }

    #[test]
    fn a_composed_op_carries_its_root_sealed_and_signed_and_goes_back_with_its_commits_others() {
        let seed = [9; 32];
        let (orderer, from_projector) = crossbeam_channel::bounded(4);
        let composer = Composer {
            author: sig::public_key_from_seed(&seed),
            signer: sig::Signer::new(&seed),
            verified: std::sync::Arc::new(super::super::verified::VerifiedCache::new(64)),
            orderer,
        };
        let scope = [1; 32];
        let plain: Vec<u8> = (0..50u8).collect();
        let (r1, _rx1) = request(scope, plain.clone());
        let (r2, _rx2) = request(scope, plain.clone());
        // The cache is direct-mapped: each id is looked up before the next
        // op's may take its slot.
        let known = |o: &super::super::OwnOp| composer.verified.known_valid(std::iter::once((&o.id, &o.op.signature)));
        let mut ops = composer.compose_all(vec![(r1, [8; 32])]);
        assert_eq!(known(&ops[0]), [true], "its fresh signature is in the verifiers' cache");
        ops.extend(composer.compose_all(vec![(r2, [2; 32])]));
        assert_eq!(known(&ops[1]), [true]);
        composer.send(ops);
        let Ok(super::super::Work::Own(ops)) = from_projector.try_recv() else { panic!("one message with the commit's ops") };
        assert!(from_projector.try_recv().is_err(), "one message for both");
        assert_eq!(ops.len(), 2);
        assert_ne!(ops[0].op.nonce, ops[1].op.nonce, "a fresh nonce per op");
        for (o, root) in ops.iter().zip([[8u8; 32], [2; 32]]) {
            let mut want = plain.clone();
            want[..32].copy_from_slice(&root);
            assert_eq!(o.plain.as_deref(), Some(&want[..]), "the root is the payload's first field");
            let opened = open_payload(&[5; 32], &o.op.nonce, &scope, PLANE_DATA, &o.op.payload);
            assert_eq!(opened.as_deref(), Some(&want[..]), "sealed with the draft's key");
            assert_eq!((o.op.scope, o.op.plane, o.op.hlc), (scope, PLANE_DATA, 77));
            assert_eq!((o.op.parents.clone(), o.op.cut.clone(), o.op.key_id), (vec![[3; 32]], vec![[4; 32]], [6; 32]));
            let (bytes, id) = encode_op(&o.op);
            assert_eq!((&bytes, id), (&o.bytes, o.id), "the bytes and id of the op as signed");
            assert!(sig::verify(&composer.author, &o.id, &o.op.signature));
        }
    }

    #[test]
    fn composed_ops_the_orderer_cannot_take_are_answered_busy() {
        let seed = [9; 32];
        let (orderer, _from_projector) = crossbeam_channel::bounded(1);
        orderer.try_send(super::super::Work::Malformed).unwrap();
        let composer = Composer {
            author: sig::public_key_from_seed(&seed),
            signer: sig::Signer::new(&seed),
            verified: std::sync::Arc::new(super::super::verified::VerifiedCache::new(64)),
            orderer,
        };
        let (r, mut rx) = request([1; 32], vec![0; 40]);
        composer.send(composer.compose_all(vec![(r, [8; 32])]));
        assert!(matches!(rx.try_recv(), Ok(Err(DraftRefused::Busy))));
    }
}
