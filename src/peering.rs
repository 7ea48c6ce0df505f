//! The peer links' decisions, sans-IO (quinn-proto's split, STYLE.md): who
//! may see a scope, which heartbeat pages go to a peer, which heads a
//! peer's heartbeat shows we lack, what to ask a peer for by sync, what a
//! sync request is answered with, where gossip goes, and when each of a
//! link's timers fires. Every entry point takes what it needs (statuses,
//! an op's state, a store read, `now_ms`) and returns what to send.
//!
//! The node (`node::peers`, `node::serve`, the orderer's `Work::Heads`)
//! runs these over QUIC, tokio timers and the store; the seeded simulator
//! (`sim`) runs the same functions over a simulated network and clock.
//! What stays in the I/O layer: dialing and redialing, streams, at most one
//! sync in flight per link with its timeout, the permits and turns of the
//! sync server, the channels and their drop counters, metrics.
//!
//! Layer: between `core` and `store` (it reads `core`'s statuses and op
//! states, and knows nothing of the store, threads or sockets).

use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet, VecDeque};
use std::ops::Bound;

use crate::core::{OpState, ScopeStatus};
use crate::limits::SYNC_REPLY_BYTES_MAX;
use crate::protocol::codec::decode_op;
use crate::protocol::node::*;
use crate::protocol::{Hash, PublicKey, PLANE_DATA, ZERO};

/// Minimum time between two rounds of sync requests to one peer.
pub const SYNC_INTERVAL_MS: u64 = 200;
/// While any op waits for a key, how often each peer is asked again for
/// the deliveries it made to this node (`KeysRequest`); it is asked once on
/// every connection too.
pub const KEYS_ASK_INTERVAL_MS: u64 = 10_000;
/// Heartbeat frames (of `HEARTBEAT_SCOPES_MAX` scopes each) sent to a peer
/// per beat at most: the scopes it may see are sent in pages, each beat
/// going on where the last stopped, so every scope is repaired however
/// many there are (10,000 scopes: a round every ~10 beats, ~16 KB a page).
pub const HEARTBEAT_PAGES_PER_BEAT_MAX: usize = 8;
/// Ops asked for with the ids our buffered ops wait for (missing parents):
/// them and a few ancestors each, per round.
pub const WANTED_SYNC_OPS_MAX: u32 = 512;
/// Ops a sync walk reads per op it may collect, at most (`collect_sync`):
/// both ends of the walk, and the dependencies of each op collected.
pub const SYNC_WALK_READS_PER_OP: usize = 4;
pub use crate::limits::LACKING_NOTES_MAX;

/// Whether a client that proved `key` may be served what reveals a scope
/// (its events, sync, heartbeats, gossip; SPEC §10): a peer configured by
/// key (`configured`), or a member (any role) in `G` at the node's current
/// governance heads (`member`: `None` when the node holds no such scope).
/// The error is the reason of the refusal, as counted.
pub fn may_see(
    key: Option<&PublicKey>,
    configured: impl FnOnce(&PublicKey) -> bool,
    member: impl FnOnce(&PublicKey) -> Option<bool>,
) -> Result<(), &'static str> {
    let Some(key) = key else { return Err("anonymous") };
    if configured(key) {
        return Ok(());
    }
    match member(key) {
        Some(true) => Ok(()),
        Some(false) => Err("not_a_member"),
        None => Err("unknown_scope"),
    }
}

/// One beat's heartbeats to a peer: the scopes `sees` lets it see, in pages
/// of `HEARTBEAT_SCOPES_MAX`, at most `HEARTBEAT_PAGES_PER_BEAT_MAX` of
/// them, starting after `cursor` (the last scope the previous beat sent)
/// and wrapping around.
pub fn heartbeat_pages(
    statuses: &BTreeMap<Hash, ScopeStatus>,
    sees: impl Fn(&ScopeStatus) -> bool,
    cursor: &mut Option<Hash>,
) -> Vec<Heartbeat> {
    // After the cursor to the end, then from the start up to it (the
    // second part is empty when there is no cursor).
    let (from, upto) = match *cursor {
        Some(c) => (Bound::Excluded(c), Bound::Included(c)),
        None => (Bound::Unbounded, Bound::Excluded(ZERO)),
    };
    let after = statuses.range::<Hash, _>((from, Bound::Unbounded)).chain(statuses.range::<Hash, _>((Bound::Unbounded, upto)));
    let mut visible = after.map(|(_, s)| s).filter(|s| sees(s)).peekable();
    let mut pages = Vec::new();
    while pages.len() < HEARTBEAT_PAGES_PER_BEAT_MAX && visible.peek().is_some() {
        let scopes: Vec<ScopeBeat> = visible
            .by_ref()
            .take(HEARTBEAT_SCOPES_MAX)
            .map(|s| ScopeBeat {
                scope: s.scope,
                root: s.root,
                governance_heads: s.governance_heads.iter().take(HEARTBEAT_HEADS_MAX).copied().collect(),
                data_heads: s.data_heads.iter().take(HEARTBEAT_HEADS_MAX).copied().collect(),
            })
            .collect();
        *cursor = scopes.last().map(|b| b.scope);
        pages.push(Heartbeat { scopes });
    }
    pages
}

/// A scope of a peer's heartbeat that it may see: its heads (governance,
/// then data) and root, for the engine to compare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeardScope {
    pub scope: Hash,
    pub heads: Vec<Hash>,
    pub root: Hash,
}

/// The scopes of a heartbeat that are heard: only those the sender may see
/// (anything else would let anyone have the node note heads to ask for,
/// and learn which scopes it holds); each refusal's reason goes to
/// `refused`.
pub fn heard_scopes(
    hb: Heartbeat,
    may_see: impl Fn(&Hash) -> Result<(), &'static str>,
    mut refused: impl FnMut(&'static str),
) -> Vec<HeardScope> {
    let mut out = Vec::with_capacity(hb.scopes.len());
    for s in hb.scopes {
        if let Err(reason) = may_see(&s.scope) {
            refused(reason);
            continue;
        }
        let heads = s.governance_heads.iter().chain(&s.data_heads).copied().collect();
        out.push(HeardScope { scope: s.scope, heads, root: s.root });
    }
    out
}

/// The heads of a peer that this node knows nothing of (`state`: the
/// engine's `op_state`): what to ask that peer for. An op applied, dropped,
/// buffered or unreadable is not asked for again.
pub fn lacking_heads(heads: &[Hash], state: impl Fn(&Hash) -> OpState) -> Vec<Hash> {
    heads.iter().filter(|h| state(h) == OpState::Unknown).copied().collect()
}

/// Notes of heads that peers' heartbeats showed we lack, per peer (`P`: how
/// the driver names a peer; the node, by its address) and scope, in the
/// order noted; at most `LACKING_NOTES_MAX`, the oldest dropped as one is
/// added (bounded here, not where a link takes them: with no link up, a
/// member's heartbeats would otherwise grow them without bound).
#[derive(Debug)]
pub struct LackingNotes<P> {
    notes: VecDeque<(P, Hash, Vec<Hash>)>,
}

impl<P> Default for LackingNotes<P> {
    fn default() -> Self {
        LackingNotes { notes: VecDeque::new() }
    }
}

impl<P: PartialEq + Copy> LackingNotes<P> {
    pub fn note(&mut self, peer: P, scope: Hash, lacking: Vec<Hash>) {
        if lacking.is_empty() {
            return;
        }
        if self.notes.len() >= LACKING_NOTES_MAX {
            self.notes.pop_front();
        }
        self.notes.push_back((peer, scope, lacking));
    }

    /// Takes the notes of `peer`, oldest first.
    pub fn take_for(&mut self, peer: P) -> Vec<(Hash, Vec<Hash>)> {
        let mut taken = Vec::new();
        self.notes.retain_mut(|(p, scope, lacking)| {
            if *p != peer {
                return true;
            }
            taken.push((*scope, std::mem::take(lacking)));
            false
        });
        taken
    }

    pub fn len(&self) -> usize {
        self.notes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.notes.is_empty()
    }
}

/// The ids our buffered ops wait for, and the scopes of those ops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    pub ids: Vec<Hash>,
    pub scopes: Vec<Hash>,
}

/// What to ask a peer for in one round: per scope, the heads its heartbeats
/// showed we lack (`lacking`, its notes oldest first: the first note of a
/// scope is asked, later ones of the same scope wait for the next
/// heartbeat), with `ours` as the scope's heads we have; then the ids our
/// buffered ops wait for (`wanted`), in any scope, with our heads of the
/// scopes of the ops that wait: without them the answer walked back from
/// each id until it had `WANTED_SYNC_OPS_MAX` ops, most of them held.
///
/// A noted head that `known` says has come since (by gossip, as a
/// heartbeat's heads usually do: they are the sender's newest ops, in
/// flight to us) is not asked for, nor is a scope whose noted heads all
/// came. The answer walks back from the heads asked for until it meets one
/// of ours, so a request for heads we hold, while the DAG is wide, served
/// back up to `SYNC_OPS_MAX` ops we had (2026-12-05: `api_writes`, node B
/// received 12,288 such duplicates per 60,000 writes).
pub fn sync_requests(
    lacking: Vec<(Hash, Vec<Hash>)>,
    known: impl Fn(&Hash) -> bool,
    ours: impl Fn(&Hash) -> Vec<Hash>,
    wanted: Wanted,
) -> Vec<SyncRequest> {
    let mut out: Vec<SyncRequest> = Vec::new();
    for (scope, mut want) in lacking {
        if out.iter().any(|r| r.scope == scope) {
            continue;
        }
        want.retain(|h| !known(h));
        if want.is_empty() {
            continue;
        }
        want.truncate(SYNC_IDS_MAX);
        let mut have = ours(&scope);
        have.truncate(SYNC_IDS_MAX);
        out.push(SyncRequest { scope, want, have, max_ops: SYNC_OPS_MAX });
    }
    if !wanted.ids.is_empty() {
        let mut want = wanted.ids;
        want.truncate(SYNC_IDS_MAX);
        let mut have: Vec<Hash> = wanted.scopes.iter().flat_map(&ours).collect();
        have.sort_unstable();
        have.dedup();
        have.truncate(SYNC_IDS_MAX);
        out.push(SyncRequest { scope: ZERO, want, have, max_ops: WANTED_SYNC_OPS_MAX });
    }
    out
}

/// Whether a sync request is served, and at most how many ops: one that
/// names its scope needs `may_see` of it; one for ids of any scope (ZERO:
/// missing parents) needs a proven key, and each op is then served only if
/// its scope may be seen (`collect_sync`'s `visible`).
pub fn sync_served(req: &SyncRequest, key: Option<&PublicKey>, may_see: impl FnOnce(&Hash) -> Result<(), &'static str>) -> Result<usize, &'static str> {
    if req.scope != ZERO {
        may_see(&req.scope)?;
    } else if key.is_none() {
        return Err("anonymous");
    }
    Ok(req.max_ops.min(SYNC_OPS_MAX) as usize)
}

/// A sync request's answer: walks back from `want` through dependencies
/// (`get`: an op's encoding as stored, if any), stopping at unknown ids and
/// at what the requester holds, collecting at most `max` ops and (past the
/// first) at most `SYNC_REPLY_BYTES_MAX` bytes of them; returns them
/// ancestors first, so the requester applies them with little buffering.
/// Only ops of scopes `visible` says the requester may see are collected
/// or walked through (SPEC §10).
///
/// What the requester holds is `have` and every ancestor of it. The walk
/// goes down from both ends together, newest first: an op's `hlc` is above
/// each of its dependencies' (SPEC §6, `clock`), so an ancestor of `have`
/// is reached from `have`'s side before `want`'s side comes down to it,
/// and is not collected. Stopping only at the ids of `have` served, while
/// the DAG was wide, every op below them reached by another path, up to
/// `max` ops the requester held. The walk reads at most
/// `SYNC_WALK_READS_PER_OP` ops for each it may collect: past that it
/// stops (a requester asks again for what its buffered ops still miss).
pub fn collect_sync(
    get: impl Fn(&Hash) -> Option<Vec<u8>>,
    want: &[Hash],
    have: &[Hash],
    max: usize,
    visible: &dyn Fn(&Hash) -> bool,
) -> Vec<Vec<u8>> {
    let mut reads_left = max.saturating_mul(SYNC_WALK_READS_PER_OP).max(SYNC_WALK_READS_PER_OP);
    let mut read: HashMap<Hash, Option<WalkRead>> = HashMap::new();
    let mut load = |read: &mut HashMap<Hash, Option<WalkRead>>, id: &Hash| walk_read(read, &get, visible, &mut reads_left, id);
    // (hlc, held side, id): newest first; at one hlc, `have`'s side first.
    let mut frontier: BinaryHeap<(u64, bool, Hash)> = BinaryHeap::new();
    // Reached from `have` (held), or from `want` (each taken once).
    let mut held: HashSet<Hash> = HashSet::new();
    let mut taken: HashSet<Hash> = HashSet::new();
    let mut wanted = 0usize;
    for id in have {
        if held.insert(*id) {
            if let Some(hlc) = load(&mut read, id) {
                frontier.push((hlc, true, *id));
            }
        }
    }
    for id in want {
        if !held.contains(id) && taken.insert(*id) {
            if let Some(hlc) = load(&mut read, id) {
                frontier.push((hlc, false, *id));
                wanted += 1;
            }
        }
    }
    let mut out = Vec::new();
    let mut bytes_out: u64 = 0;
    while wanted > 0 {
        let Some((_, is_held, id)) = frontier.pop() else { break };
        let r = read.get_mut(&id).and_then(Option::as_mut).expect("a frontier op was read");
        let deps = std::mem::take(&mut r.deps);
        // Taken from `r` either way: collected, or (held) never collected.
        let bytes = std::mem::take(&mut r.bytes);
        if is_held {
            for dep in deps {
                if held.insert(dep) {
                    if let Some(hlc) = load(&mut read, &dep) {
                        frontier.push((hlc, true, dep));
                    }
                }
            }
            continue;
        }
        wanted -= 1;
        if held.contains(&id) {
            continue;
        }
        if out.len() >= max || (!out.is_empty() && bytes_out + bytes.len() as u64 > SYNC_REPLY_BYTES_MAX) {
            break;
        }
        bytes_out += bytes.len() as u64;
        out.push(bytes);
        for dep in deps {
            if !held.contains(&dep) && taken.insert(dep) {
                if let Some(hlc) = load(&mut read, &dep) {
                    frontier.push((hlc, false, dep));
                    wanted += 1;
                }
            }
        }
    }
    out.reverse();
    out
}

/// An op read by a sync walk: its clock, its dependencies, its encoding
/// (taken when collected).
struct WalkRead {
    hlc: u64,
    deps: Vec<Hash>,
    bytes: Vec<u8>,
}

/// An op for a sync walk, read once (`read` keeps it, or None: unknown,
/// undecodable, of a scope not `visible`, or past the walk's reads): its
/// clock.
fn walk_read(
    read: &mut HashMap<Hash, Option<WalkRead>>,
    get: &impl Fn(&Hash) -> Option<Vec<u8>>,
    visible: &dyn Fn(&Hash) -> bool,
    reads_left: &mut usize,
    id: &Hash,
) -> Option<u64> {
    if let Some(r) = read.get(id) {
        return r.as_ref().map(|r| r.hlc);
    }
    if *reads_left == 0 {
        return None;
    }
    *reads_left -= 1;
    let r = get(id).and_then(|bytes| {
        let op = decode_op(&bytes).ok()?;
        // A genesis belongs to the scope it names (SPEC §2).
        let scope = if op.scope == ZERO { *id } else { op.scope };
        if !visible(&scope) {
            return None;
        }
        let mut deps = op.parents;
        if op.plane == PLANE_DATA {
            deps.extend_from_slice(&op.cut);
        }
        Some(WalkRead { hlc: op.hlc, deps, bytes })
    });
    let hlc = r.as_ref().map(|r| r.hlc);
    read.insert(*id, r);
    hlc
}

/// Whether an applied op that came from link `origin` (0: from none of the
/// links: a client, the node itself) is gossiped on link `link` (from 1):
/// never back to where it came from. The peer must also be allowed to see
/// its scope (`may_see`).
pub fn gossip_to(origin: u64, link: u64) -> bool {
    origin != link
}

/// A link's timers: the heartbeat, the round of sync requests, the ask for
/// key deliveries. All are due at once when the link comes up; a timer
/// that fell behind (the link was busy) fires once and goes on from then,
/// never in a burst.
#[derive(Clone, Debug)]
pub struct LinkTimers {
    heartbeat_ms: u64,
    next_beat_ms: u64,
    next_sync_ms: u64,
    next_keys_ms: u64,
    asked_keys: bool,
}

/// What a link should do now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Due {
    /// Send this beat's heartbeat pages (`heartbeat_pages`).
    pub beat: bool,
    /// Send a round of sync requests (`sync_requests`).
    pub sync: bool,
    /// Ask the peer for the key deliveries it made to this node.
    pub keys: bool,
}

impl LinkTimers {
    pub fn new(now_ms: u64, heartbeat_ms: u64) -> LinkTimers {
        assert!(heartbeat_ms > 0, "a heartbeat interval");
        LinkTimers { heartbeat_ms, next_beat_ms: now_ms, next_sync_ms: now_ms, next_keys_ms: now_ms, asked_keys: false }
    }

    /// What is due at `now_ms`; `waiting_for_keys` (whether any op waits
    /// for a key) is asked only when the keys timer fires: keys are asked
    /// for on the first firing, then only while something waits.
    pub fn poll(&mut self, now_ms: u64, waiting_for_keys: impl FnOnce() -> bool) -> Due {
        let mut due = Due::default();
        if now_ms >= self.next_beat_ms {
            due.beat = true;
            self.next_beat_ms = next_after(self.next_beat_ms, self.heartbeat_ms, now_ms);
        }
        if now_ms >= self.next_sync_ms {
            due.sync = true;
            self.next_sync_ms = now_ms + SYNC_INTERVAL_MS;
        }
        if now_ms >= self.next_keys_ms {
            self.next_keys_ms = now_ms + KEYS_ASK_INTERVAL_MS;
            if !self.asked_keys || waiting_for_keys() {
                self.asked_keys = true;
                due.keys = true;
            }
        }
        due
    }

    /// When `poll` next has something to do.
    pub fn next_deadline_ms(&self) -> u64 {
        self.next_beat_ms.min(self.next_sync_ms).min(self.next_keys_ms)
    }
}

/// The next firing of a periodic timer after `at`: on the period's grid,
/// or one period from `now_ms` if the grid fell behind.
fn next_after(at: u64, period_ms: u64, now_ms: u64) -> u64 {
    let next = at + period_ms;
    if next > now_ms {
        next
    } else {
        now_ms + period_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(scope: u8, member: Option<PublicKey>) -> ScopeStatus {
        ScopeStatus {
            scope: [scope; 32],
            root: [scope ^ 0xff; 32],
            data_heads: vec![[scope.wrapping_add(1); 32]],
            governance_heads: vec![[scope.wrapping_add(2); 32]],
            applied: 2,
            pending: 0,
            key_waiting: 0,
            data_key_waiting: 0,
            members: member.map(|m| (m, crate::protocol::Role::Reader)).into_iter().collect::<Vec<_>>().into(),
        }
    }

    #[test]
    fn may_see_refuses_the_anonymous_and_strangers_and_serves_peers_and_members() {
        let k = [7; 32];
        assert_eq!(may_see(None, |_| true, |_| Some(true)), Err("anonymous"));
        assert_eq!(may_see(Some(&k), |_| true, |_| None), Ok(()));
        assert_eq!(may_see(Some(&k), |_| false, |_| Some(true)), Ok(()));
        assert_eq!(may_see(Some(&k), |_| false, |_| Some(false)), Err("not_a_member"));
        assert_eq!(may_see(Some(&k), |_| false, |_| None), Err("unknown_scope"));
    }

    #[test]
    fn heartbeat_pages_go_on_where_the_last_beat_stopped_and_wrap_around() {
        let n = HEARTBEAT_SCOPES_MAX * HEARTBEAT_PAGES_PER_BEAT_MAX + 5;
        let statuses: BTreeMap<Hash, ScopeStatus> = (0..n)
            .map(|i| {
                let mut s = status(0, None);
                s.scope[..4].copy_from_slice(&(i as u32).to_be_bytes());
                (s.scope, s)
            })
            .collect();
        let mut cursor = None;
        let first = heartbeat_pages(&statuses, |_| true, &mut cursor);
        assert_eq!(first.len(), HEARTBEAT_PAGES_PER_BEAT_MAX);
        let second = heartbeat_pages(&statuses, |_| true, &mut cursor);
        let sent: usize = first.iter().chain(&second).map(|h| h.scopes.len()).sum();
        assert!(sent >= n, "every scope within two beats");
        assert_eq!(second[0].scopes.len(), HEARTBEAT_SCOPES_MAX, "the second beat wraps around to fill its pages");
        assert!(heartbeat_pages(&statuses, |_| false, &mut cursor).is_empty());
    }

    #[test]
    fn lacking_notes_are_bounded_and_taken_per_peer_in_order() {
        let mut notes = LackingNotes::default();
        notes.note(1u64, [1; 32], vec![]);
        assert!(notes.is_empty(), "nothing lacking, nothing noted");
        for i in 0..LACKING_NOTES_MAX + 3 {
            notes.note((i % 2) as u64, [i as u8; 32], vec![[9; 32]]);
        }
        assert_eq!(notes.len(), LACKING_NOTES_MAX);
        let ones = notes.take_for(1);
        assert_eq!(ones.len(), LACKING_NOTES_MAX / 2);
        assert_eq!(ones[0].0, [3; 32], "the oldest notes were dropped first");
        assert_eq!(notes.len(), LACKING_NOTES_MAX / 2);
        assert!(notes.take_for(1).is_empty());
    }

    #[test]
    fn sync_requests_ask_one_note_per_scope_then_the_wanted_ids() {
        let lacking = vec![([1; 32], vec![[10; 32]]), ([2; 32], vec![[20; 32]]), ([1; 32], vec![[11; 32]])];
        let wanted = Wanted { ids: vec![[30; 32]], scopes: vec![[3; 32], [2; 32]] };
        let reqs = sync_requests(lacking, |_| false, |s| vec![*s], wanted);
        assert_eq!(reqs.len(), 3);
        assert_eq!((reqs[0].scope, reqs[0].want.clone(), reqs[0].have.clone()), ([1; 32], vec![[10; 32]], vec![[1; 32]]));
        assert_eq!(reqs[1].scope, [2; 32]);
        assert_eq!((reqs[2].scope, reqs[2].want.clone(), reqs[2].max_ops), (ZERO, vec![[30; 32]], WANTED_SYNC_OPS_MAX));
        assert_eq!(reqs[2].have, vec![[2; 32], [3; 32]], "our heads of the waiting ops' scopes");
        assert!(sync_requests(Vec::new(), |_| false, |_| Vec::new(), Wanted::default()).is_empty());
    }

    /// Heads that came by gossip after the heartbeat named them are not
    /// asked for; a scope whose noted heads all came asks nothing.
    #[test]
    fn heads_that_came_since_the_heartbeat_are_not_asked_for() {
        let lacking = vec![([1; 32], vec![[10; 32], [11; 32]]), ([2; 32], vec![[20; 32]])];
        let came = |h: &Hash| *h == [10; 32] || *h == [20; 32];
        let reqs = sync_requests(lacking, came, |s| vec![*s], Wanted::default());
        assert_eq!(reqs.len(), 1, "scope 2's one head came: no request for it");
        assert_eq!((reqs[0].scope, reqs[0].want.clone()), ([1; 32], vec![[11; 32]]));
        let all_came = vec![([1; 32], vec![[10; 32]])];
        assert!(sync_requests(all_came, |_| true, |s| vec![*s], Wanted::default()).is_empty());
    }

    #[test]
    fn a_sync_for_any_scope_needs_a_key_and_one_for_a_scope_needs_may_see() {
        let any = SyncRequest { scope: ZERO, want: vec![], have: vec![], max_ops: u32::MAX };
        assert_eq!(sync_served(&any, None, |_| Ok(())), Err("anonymous"));
        assert_eq!(sync_served(&any, Some(&[1; 32]), |_| Err("x")), Ok(SYNC_OPS_MAX as usize));
        let one = SyncRequest { scope: [1; 32], max_ops: 3, ..any };
        assert_eq!(sync_served(&one, Some(&[1; 32]), |_| Err("not_a_member")), Err("not_a_member"));
        assert_eq!(sync_served(&one, Some(&[1; 32]), |_| Ok(())), Ok(3));
    }

    #[test]
    fn link_timers_fire_at_once_then_on_their_intervals_never_in_a_burst() {
        let mut t = LinkTimers::new(1_000, 500);
        assert_eq!(t.poll(1_000, || false), Due { beat: true, sync: true, keys: true });
        assert_eq!(t.next_deadline_ms(), 1_000 + SYNC_INTERVAL_MS);
        assert_eq!(t.poll(1_200, || panic!("keys not due")), Due { sync: true, ..Due::default() });
        assert_eq!(t.poll(1_500, || false), Due { beat: true, sync: true, keys: false });
        // Busy for 10 beats: one beat, then on from now.
        assert!(t.poll(6_700, || false).beat);
        assert!(!t.poll(6_900, || false).beat);
        assert!(t.poll(7_200, || false).beat);
        // Keys again only while something waits for one.
        assert!(!t.poll(11_000, || false).keys);
        assert!(t.poll(21_000, || true).keys);
    }

    /// Ops of a wide DAG in causal order: (id, encoding, dependencies).
    /// `lag` None: four writers, each merging the others' views now and
    /// then, governance and a key rotation on the way; else eight writers,
    /// each knowing the history up to `lag` ops before its own.
    fn wide_dag(lag: Option<usize>) -> Vec<(Hash, Vec<u8>, Vec<Hash>)> {
        let cfg = match lag {
            None => crate::workload::WorkloadConfig { data_ops: 1500, merge_share: 0.2, rotate_at: Some(700), ..Default::default() },
            Some(_) => crate::workload::WorkloadConfig { data_ops: 1500, writers: 8, view_lag: lag, ..Default::default() },
        };
        let w = crate::workload::generate(&cfg, [9; 32], [8; 32]);
        w.messages
            .iter()
            .filter(|m| m.id != ZERO)
            .map(|m| {
                let bytes = m.frame[1..].to_vec();
                let op = decode_op(&bytes).unwrap();
                let mut deps = op.parents.clone();
                if op.plane == PLANE_DATA {
                    deps.extend_from_slice(&op.cut);
                }
                (m.id, bytes, deps)
            })
            .collect()
    }

    /// The ids of `ops` no other op of them depends on.
    fn heads(ops: &[(Hash, Vec<u8>, Vec<Hash>)]) -> Vec<Hash> {
        let below: HashSet<Hash> = ops.iter().flat_map(|o| o.2.iter().copied()).collect();
        ops.iter().map(|o| o.0).filter(|id| !below.contains(id)).collect()
    }

    /// (Before the walk from both ends, a requester lacking one op of the
    /// eight writers' DAG was sent ~all 1,500, up to `SYNC_OPS_MAX`.)
    #[test]
    fn a_sync_serves_only_what_the_requester_lacks_while_the_dag_is_wide() {
        for lag in [None, Some(4), Some(8)] {
            serves_only_what_is_lacking(&wide_dag(lag));
        }
    }

    fn serves_only_what_is_lacking(ops: &[(Hash, Vec<u8>, Vec<Hash>)]) {
        let by_id: HashMap<Hash, Vec<u8>> = ops.iter().map(|o| (o.0, o.1.clone())).collect();
        let get = |id: &Hash| by_id.get(id).cloned();
        let id_of = |bytes: &Vec<u8>| crate::protocol::crypto::encode_op(&decode_op(bytes).unwrap()).1;
        let want = heads(ops);
        assert!(ops.iter().filter(|o| o.2.len() > 2).count() > 100, "a wide DAG: ops with several parents");
        let mut checked = 0;
        for held in [1, 2, 10, 300, 700, 1200, ops.len() - 40, ops.len() - 1, ops.len()] {
            // The requester holds a prefix (closed under ancestry: causal
            // order) and names its heads.
            let have = heads(&ops[..held]);
            let lacking: HashSet<Hash> = ops[held..].iter().map(|o| o.0).collect();
            let got = collect_sync(get, &want, &have, 4096, &|_| true);
            let ids: Vec<Hash> = got.iter().map(id_of).collect();
            assert_eq!(ids.iter().copied().collect::<HashSet<Hash>>(), lacking, "holding {held}: exactly what it lacks");
            assert_eq!(ids.len(), lacking.len(), "holding {held}: each once");
            // Ancestors first: each op's dependencies it lacks come before it.
            let at: HashMap<Hash, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
            for (i, id) in ids.iter().enumerate() {
                let deps = &ops.iter().find(|o| o.0 == *id).unwrap().2;
                assert!(deps.iter().all(|d| at.get(d).is_none_or(|&j| j < i)), "holding {held}: ancestors first");
            }
            // A truncated reply: only ops it lacks, the newest.
            let few = collect_sync(get, &want, &have, 25, &|_| true);
            assert_eq!(few.len(), lacking.len().min(25), "holding {held}");
            assert!(few.iter().map(id_of).all(|id| lacking.contains(&id)), "holding {held}: a truncated reply, only what it lacks");
            checked += 1;
        }
        assert_eq!(checked, 9);
    }

    /// Ops that came by gossip wait for parents the requester lacks: the
    /// request for them names its heads of their scope, and the answer is
    /// what it lacks below them, nothing it holds. (Without the heads, the
    /// answer was the newest `WANTED_SYNC_OPS_MAX` ancestors of each id,
    /// most of them held: 512 ops for 1 lacking below.)
    #[test]
    fn a_request_for_missing_parents_is_answered_with_only_what_is_lacking() {
        let ops = wide_dag(Some(4));
        let by_id: HashMap<Hash, Vec<u8>> = ops.iter().map(|o| (o.0, o.1.clone())).collect();
        let get = |id: &Hash| by_id.get(id).cloned();
        let id_of = |bytes: &Vec<u8>| crate::protocol::crypto::encode_op(&decode_op(bytes).unwrap()).1;
        let scope = decode_op(&ops[0].1).unwrap().scope;
        for (held, lost) in [(1400, 1), (1000, 30), (700, 600)] {
            // Held: a prefix; lost: the next ops; then ops by gossip, whose
            // dependencies past the prefix are wanted.
            let prefix: HashSet<Hash> = ops[..held].iter().map(|o| o.0).collect();
            let arrived = &ops[held + lost..(held + lost + 5).min(ops.len())];
            let here: HashSet<Hash> = prefix.iter().chain(arrived.iter().map(|o| &o.0)).copied().collect();
            let mut ids: Vec<Hash> = arrived.iter().flat_map(|o| o.2.iter().copied()).filter(|d| !here.contains(d)).collect();
            ids.sort_unstable();
            ids.dedup();
            assert!(!ids.is_empty());
            let ours = |s: &Hash| if *s == scope { heads(&ops[..held]) } else { Vec::new() };
            let reqs = sync_requests(Vec::new(), |_| false, ours, Wanted { ids, scopes: vec![scope] });
            let req = &reqs[0];
            assert_eq!(req.scope, ZERO);
            let got: Vec<Hash> = collect_sync(get, &req.want, &req.have, req.max_ops as usize, &|_| true).iter().map(id_of).collect();
            assert!(!got.is_empty(), "{held}/{lost}");
            assert!(got.iter().all(|id| !prefix.contains(id)), "{held}/{lost}: nothing held is served");
            if lost <= WANTED_SYNC_OPS_MAX as usize {
                let lacking: HashSet<Hash> = ops[held..held + lost].iter().map(|o| o.0).collect();
                assert!(got.iter().all(|id| lacking.contains(id)), "{held}/{lost}: only the lost ops");
            }
            // Without our heads, the same ids bring back ops held (while
            // the gap is within one answer).
            if lost < WANTED_SYNC_OPS_MAX as usize {
                let blind: Vec<Hash> = collect_sync(get, &req.want, &[], req.max_ops as usize, &|_| true).iter().map(id_of).collect();
                assert!(blind.iter().any(|id| prefix.contains(id)), "{held}/{lost}");
            }
        }
    }

    #[test]
    fn a_sync_walk_reads_a_bounded_number_of_ops() {
        let ops = wide_dag(None);
        let by_id: HashMap<Hash, Vec<u8>> = ops.iter().map(|o| (o.0, o.1.clone())).collect();
        let reads = std::cell::Cell::new(0usize);
        let get = |id: &Hash| {
            reads.set(reads.get() + 1);
            by_id.get(id).cloned()
        };
        // Holding nothing it names (an unknown id as `have`), asking for 50:
        // the newest 50, within the walk's reads.
        let got = collect_sync(get, &heads(&ops), &[[7; 32]], 50, &|_| true);
        assert_eq!(got.len(), 50);
        assert!(reads.get() <= 50 * SYNC_WALK_READS_PER_OP, "{} reads", reads.get());
        // An op of a scope it may not see is neither served nor walked through.
        reads.set(0);
        let got = collect_sync(get, &heads(&ops), &[], 4096, &|_| false);
        assert!(got.is_empty());
        assert!(reads.get() <= heads(&ops).len(), "{} reads", reads.get());
    }

    #[test]
    fn gossip_never_goes_back_to_its_origin() {
        assert!(!gossip_to(2, 2));
        assert!(gossip_to(0, 1) && gossip_to(1, 2));
    }
}
