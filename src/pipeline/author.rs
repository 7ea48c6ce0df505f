//! The orderer's share of authoring (API.md, "Model"): it hands out drafts
//! (`core::Draft`: parents, cut, hlc, key) against the state it holds, in
//! the same commits as received ops, so that many writers never wait on a
//! lock around the whole path; the projector adds each data draft's root at
//! the point of the commit where it was taken (`RootRequest`).
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
/// `actions` folded, once the first `at` folds of the commit are folded.
pub(super) struct RootRequest {
    pub(super) at: usize,
    pub(super) hlc: u64,
    pub(super) author: crate::protocol::PublicKey,
    pub(super) actions: Vec<crate::protocol::Action>,
    pub(super) draft: crate::core::Draft,
    pub(super) reply: tokio::sync::oneshot::Sender<Result<Drafted, DraftRefused>>,
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
        let s = self.scopes.entry(req.scope).or_default();
        let room = if req.plane == PLANE_DATA { s.data_out < DRAFTS_OUT_PER_SCOPE_MAX } else { !s.gov_out };
        if room && s.waiting.is_empty() {
            self.draft(engine, req, now_ms);
        } else if self.waiting >= DRAFTS_WAITING_MAX {
            let _ = req.reply.send(Err(DraftRefused::Busy));
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
                Some(r) if r.plane == PLANE_DATA => s.data_out < DRAFTS_OUT_PER_SCOPE_MAX,
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
        let draft = match engine.draft(&req.scope, req.plane) {
            Ok(d) => d,
            Err(e) => {
                let _ = req.reply.send(Err(e));
                return;
            }
        };
        let s = self.scopes.entry(req.scope).or_default();
        s.last = Some(Instant::now());
        let hlc = now_ms.max(draft.hlc_min);
        if req.plane == PLANE_DATA {
            s.data_out += 1;
            let (at, author) = (engine.folds_in_commit(), engine.identity().public_key);
            self.roots.push(RootRequest { at, hlc, author, actions: req.actions, draft, reply: req.reply });
        } else {
            // A requester gone frees the scope's turn at once.
            s.gov_out = req.reply.send(Ok(Drafted { draft, hlc, root: None })).is_ok();
        }
    }
}
