//! The structure-aware input of the `engine` target: a small valid scope
//! from `dagfold::workload::generate`, then mutations chosen by the fuzzer
//! (reorder, duplicate, drop, flip bytes, edit fields of an op and re-sign it
//! with a member's seed, re-seal its payload, deliver keys), then a schedule
//! of commits, clock advances, ticks and restarts. `build` turns it into a
//! concrete `checks::Scenario`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use arbitrary::Arbitrary;
use dagfold::core::{decode_frame, Decoded};
use dagfold::protocol::crypto::{key_id_of, open_payload, seal_key_delivery, seal_payload, sha256, x25519_public};
use dagfold::protocol::*;
use dagfold::workload::{generate, op_frame, sign_op, Member, Workload, WorkloadConfig};

use crate::checks::{node_identity, Scenario, Step, NODE_SEED};

/// Mutations applied in order; more than this many are ignored.
const MUTATIONS_MAX: usize = 24;

#[derive(Arbitrary, Debug)]
pub struct EngineInput {
    pub seed: u8,
    /// 1..=4 writers.
    pub writers: u8,
    /// 1..=30 data ops.
    pub data_ops: u8,
    pub rotate_at: Option<u8>,
    pub remove_writer_at: Option<u8>,
    pub chain: bool,
    /// Tight buffer bounds (eviction, forgotten drops) instead of the
    /// defaults, when `tight.0 % 8 == 0`.
    pub tight: (u8, u8, u16, u8),
    pub mutations: Vec<Mutation>,
    /// After the i-th delivered message: bit 0 commit, bit 1 tick, bits 2..3
    /// advance the clock (0, 100 ms, 1 s, 5 s; then a tick), high nibble 0xF
    /// restart.
    /// Past its end: commit after each message.
    pub schedule: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
pub enum Mutation {
    Swap(u16, u16),
    /// Moves message `from` to position `to`.
    Move(u16, u16),
    /// Inserts a copy of message `from` at `to`.
    Duplicate(u16, u16),
    Remove(u16),
    Reverse,
    /// Xors one byte of a frame (no re-signing: mostly malformed or
    /// bad_signature).
    FlipByte { at: u16, pos: u32, xor: u8 },
    /// Edits fields of the `at`-th op (key deliveries are not counted) and
    /// re-signs it (`None`: by its author, if a member), so that the edit
    /// reaches the deep verdicts, not only bad_signature. `keep_original`:
    /// insert the edited copy beside it.
    Edit { at: u16, edits: Vec<Edit>, signer: Option<Signer>, keep_original: bool },
    /// One edit aimed at each verdict of SPEC §6, re-signed by the author
    /// (`kind % 8`: clock, wrong_plane, unauthorized, stale_key, stale_cut,
    /// undecryptable, bad_payload, bad genesis payload). Single mutations
    /// that coverage alone finds only slowly.
    Verdict { at: u16, kind: u8, arg: u8 },
    /// Moves the `n`-th key delivery (`None`: every one) to the end: ops
    /// wait for their keys (data ops in memory, until a clock advance drops
    /// them for now; with a rotation, delaying only the second key is what
    /// makes data ops wait while governance goes on).
    KeyLast(Option<u8>),
    /// A key delivery of a key from the pool to the node (or to another
    /// member, which the node must ignore), inserted at `at`.
    DeliverKey { at: u16, key: u8, to_node: bool, ephemeral: u8 },
}

#[derive(Arbitrary, Debug)]
pub enum Edit {
    HlcAdd(i8),
    HlcSet(u64),
    /// Adds, as parent, the id of the `n`-th op.
    AddParent(u16),
    RemoveParent(u8),
    AddCut(u16),
    RemoveCut(u8),
    /// Replaces the cut with the id of the `n`-th op alone.
    SetCut(u16),
    /// Flips the plane (governance <-> data).
    Plane,
    /// Sets `key_id` to a key of the pool (not re-sealing: undecryptable or
    /// stale_key), or ZERO.
    KeyId(Option<u8>),
    /// Sets `scope` to the id of the `n`-th op, or ZERO.
    Scope(Option<u16>),
    /// Xors one byte of the body (the op is re-decoded; skipped if it no
    /// longer decodes).
    BodyByte { pos: u32, xor: u8 },
    /// Opens the payload with its key, changes the plaintext, seals it again
    /// with a key of the pool (`None`: its own key), and sets `key_id` to
    /// that key unless `keep_key_id`.
    Reseal { plain: PlainEdit, key: Option<u8>, keep_key_id: bool },
    /// Sets `hlc` to the largest `hlc` among its dependencies (clock).
    HlcOfDependency,
    /// Adds the id of the `n`-th data op to the cut (wrong_plane).
    AddDataCut(u16),
}

#[derive(Arbitrary, Debug)]
pub enum PlainEdit {
    Keep,
    Flip { pos: u16, xor: u8 },
    Truncate(u16),
    Append(u8),
    Gov(Vec<GovSpec>),
    Data { zero_root: bool, actions: Vec<ActionSpec>, events: u8 },
}

#[derive(Arbitrary, Debug)]
pub enum GovSpec {
    Genesis { key: u8 },
    Add { member: MemberChoice, role: u8 },
    Remove { member: MemberChoice },
    SetRole { member: MemberChoice, role: u8 },
    Rotate { key: Option<u8> },
}

#[derive(Arbitrary, Debug)]
pub enum ActionSpec {
    Put { entity: u8, key: u8, value: u8 },
    Delete { entity: u8, key: u8 },
    Add { entity: u8, key: u8, amount: i64 },
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum MemberChoice {
    Admin,
    Writer(u8),
    Node,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Signer {
    Admin,
    Writer(u8),
    Node,
    /// Keep the old signature (bad_signature unless nothing changed).
    None,
}

type CacheKey = (u8, u8, u8, Option<u8>, Option<u8>, bool);

thread_local! {
    static WORKLOADS: RefCell<HashMap<CacheKey, Rc<Workload>>> = RefCell::new(HashMap::new());
}

/// `generate` is deterministic, so a cached workload is the same as a fresh
/// one; caching only saves the signing.
fn workload(k: CacheKey) -> Rc<Workload> {
    WORKLOADS.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(w) = c.get(&k) {
            return w.clone();
        }
        if c.len() >= 512 {
            c.clear();
        }
        let (seed, writers, data_ops, rotate_at, remove_writer_at, chain) = k;
        let cfg = WorkloadConfig {
            seed: seed as u64,
            writers: writers as usize,
            data_ops: data_ops as usize,
            actions_per_op: 2,
            value_bytes: 4,
            merge_share: 0.3,
            events_per_op: 1,
            keys_per_entity: 4,
            rotate_at: rotate_at.map(usize::from),
            chain,
            remove_writer_at: remove_writer_at.map(usize::from),
            view_lag: None,
        };
        let id = node_identity();
        let w = Rc::new(generate(&cfg, id.public_key, id.kem_public));
        c.insert(k, w.clone());
        w
    })
}

struct Ctx<'a> {
    w: &'a Workload,
    node: Member,
    /// The group keys of the workload, then keys nobody was given.
    pool: Vec<[u8; 32]>,
}

impl Ctx<'_> {
    fn key(&self, i: u8) -> [u8; 32] {
        self.pool[i as usize % self.pool.len()]
    }

    fn member(&self, c: MemberChoice) -> &Member {
        match c {
            MemberChoice::Admin => &self.w.admin,
            MemberChoice::Writer(i) => &self.w.writers[i as usize % self.w.writers.len()],
            MemberChoice::Node => &self.node,
        }
    }

    fn kem_of(&self, m: &Member) -> [u8; 32] {
        if m.public_key == self.node.public_key {
            node_identity().kem_public
        } else {
            x25519_public(&m.seed) // as the workload publishes them
        }
    }

    /// `None`: the op's author, if it is a member (else it is not re-signed).
    fn signer(&self, s: Option<Signer>, author: &PublicKey) -> Option<&Member> {
        match s {
            None => std::iter::once(&self.w.admin)
                .chain(&self.w.writers)
                .chain(std::iter::once(&self.node))
                .find(|m| m.public_key == *author),
            Some(Signer::Admin) => Some(&self.w.admin),
            Some(Signer::Writer(i)) => Some(&self.w.writers[i as usize % self.w.writers.len()]),
            Some(Signer::Node) => Some(&self.node),
            Some(Signer::None) => None,
        }
    }
}

/// The position of the `n`-th op frame (key deliveries and broken frames
/// are not counted), modulo their number.
fn nth_op(msgs: &[(u32, Vec<u8>)], n: u16) -> Option<usize> {
    let ops: Vec<usize> = (0..msgs.len()).filter(|&i| msgs[i].1.first() == Some(&MESSAGE_OP)).collect();
    if ops.is_empty() {
        return None;
    }
    Some(ops[n as usize % ops.len()])
}

fn decode_op_frame(frame: &[u8]) -> Option<Op> {
    match decode_frame(frame) {
        Ok(Decoded::Op { op, .. }) => Some(op),
        _ => None,
    }
}

fn id_of(frame: &[u8]) -> Option<Hash> {
    match decode_frame(frame) {
        Ok(Decoded::Op { id, .. }) => Some(id),
        _ => None,
    }
}

fn role(r: u8) -> Role {
    match r % 3 {
        0 => Role::Reader,
        1 => Role::Writer,
        _ => Role::Admin,
    }
}

fn plaintext(ctx: &Ctx<'_>, op: &Op) -> Vec<u8> {
    if op.scope == ZERO {
        return op.payload.clone();
    }
    ctx.pool
        .iter()
        .find(|k| key_id_of(k) == op.key_id)
        .and_then(|k| open_payload(k, &op.nonce, &op.scope, op.plane, &op.payload))
        .unwrap_or_default()
}

fn edit_plain(ctx: &Ctx<'_>, old: Vec<u8>, e: &PlainEdit) -> Vec<u8> {
    match e {
        PlainEdit::Keep => old,
        PlainEdit::Flip { pos, xor } => {
            let mut p = old;
            if !p.is_empty() {
                let i = *pos as usize % p.len();
                p[i] ^= *xor;
            }
            p
        }
        PlainEdit::Truncate(n) => {
            let mut p = old;
            p.truncate(*n as usize % (p.len() + 1));
            p
        }
        PlainEdit::Append(b) => {
            let mut p = old;
            p.push(*b);
            p
        }
        PlainEdit::Gov(specs) => {
            let actions = specs
                .iter()
                .take(8)
                .map(|s| match s {
                    GovSpec::Genesis { key } => GovAction::Genesis { name: "fuzz".into(), first_key_id: key_id_of(&ctx.key(*key)) },
                    GovSpec::Add { member, role: r } => {
                        let m = ctx.member(*member);
                        GovAction::AddMember { member: m.public_key, role: role(*r), kem: ctx.kem_of(m) }
                    }
                    GovSpec::Remove { member } => GovAction::RemoveMember { member: ctx.member(*member).public_key },
                    GovSpec::SetRole { member, role: r } => GovAction::SetRole { member: ctx.member(*member).public_key, role: role(*r) },
                    GovSpec::Rotate { key } => GovAction::RotateKey { key_id: key.map_or(ZERO, |k| key_id_of(&ctx.key(k))) },
                })
                .collect();
            encode(&GovPayload { actions })
        }
        PlainEdit::Data { zero_root, actions, events } => {
            let root_hash = if *zero_root || old.len() < 32 { ZERO } else { old[..32].try_into().unwrap() };
            let cell = |e: &u8, k: &u8| (format!("e{}", e % 4), vec![b'k', b'0' + k % 4]);
            let actions = actions
                .iter()
                .take(8)
                .map(|a| match a {
                    ActionSpec::Put { entity, key, value } => {
                        let (entity, key) = cell(entity, key);
                        Action::Put { entity, key, value: vec![*value] }
                    }
                    ActionSpec::Delete { entity, key } => {
                        let (entity, key) = cell(entity, key);
                        Action::Delete { entity, key }
                    }
                    ActionSpec::Add { entity, key, amount } => {
                        let (entity, key) = cell(entity, key);
                        Action::Add { entity, key, amount: *amount }
                    }
                })
                .collect();
            let events = (0..events % 3).map(|i| Event { kind: format!("f{i}"), data: vec![i] }).collect();
            encode(&DataPayload { root_hash, actions, events })
        }
    }
}

/// Applies one edit to `op`; `false` if it does not apply.
fn apply_edit(ctx: &Ctx<'_>, msgs: &[(u32, Vec<u8>)], op: &mut Op, e: &Edit) -> bool {
    let id_at = |i: u16| nth_op(msgs, i).and_then(|j| id_of(&msgs[j].1));
    match e {
        Edit::HlcAdd(d) => op.hlc = op.hlc.wrapping_add(*d as i64 as u64),
        Edit::HlcSet(h) => op.hlc = *h,
        Edit::AddParent(i) => {
            let Some(id) = id_at(*i) else { return false };
            op.parents.push(id);
            op.parents.sort();
            op.parents.dedup();
        }
        Edit::RemoveParent(i) => {
            if op.parents.is_empty() {
                return false;
            }
            let i = *i as usize % op.parents.len();
            op.parents.remove(i);
        }
        Edit::AddCut(i) => {
            let Some(id) = id_at(*i) else { return false };
            op.cut.push(id);
            op.cut.sort();
            op.cut.dedup();
        }
        Edit::RemoveCut(i) => {
            if op.cut.is_empty() {
                return false;
            }
            let i = *i as usize % op.cut.len();
            op.cut.remove(i);
        }
        Edit::SetCut(i) => {
            let Some(id) = id_at(*i) else { return false };
            op.cut = vec![id];
        }
        Edit::Plane => op.plane ^= 1,
        Edit::KeyId(k) => op.key_id = k.map_or(ZERO, |k| key_id_of(&ctx.key(k))),
        Edit::Scope(i) => {
            op.scope = match i {
                None => ZERO,
                Some(i) => match id_at(*i) {
                    Some(id) => id,
                    None => return false,
                },
            }
        }
        Edit::HlcOfDependency => {
            let deps: Vec<Hash> = op.dependencies().copied().collect();
            let hlc = msgs.iter().filter_map(|(_, f)| decode_op_frame(f)).filter(|o| {
                let (_, id) = dagfold::protocol::crypto::encode_op(o);
                deps.contains(&id)
            });
            let Some(max) = hlc.map(|o| o.hlc).max() else { return false };
            op.hlc = max;
        }
        Edit::AddDataCut(i) => {
            let data: Vec<Hash> = msgs
                .iter()
                .filter_map(|(_, f)| match decode_frame(f) {
                    Ok(Decoded::Op { id, op, .. }) if op.plane == PLANE_DATA => Some(id),
                    _ => None,
                })
                .collect();
            if data.is_empty() {
                return false;
            }
            op.cut.push(data[*i as usize % data.len()]);
            op.cut.sort();
            op.cut.dedup();
        }
        Edit::BodyByte { pos, xor } => {
            let (mut frame, _) = op_frame(op);
            let body_len = frame.len() - 1 - 64;
            if body_len == 0 {
                return false;
            }
            frame[1 + *pos as usize % body_len] ^= *xor;
            match decode_op_frame(&frame) {
                Some(o) => *op = o,
                None => return false,
            }
        }
        Edit::Reseal { plain, key, keep_key_id } => {
            let p = edit_plain(ctx, plaintext(ctx, op), plain);
            if op.scope == ZERO {
                op.payload = p;
            } else {
                let own = ctx.pool.iter().find(|k| key_id_of(k) == op.key_id).copied();
                let Some(k) = key.map(|k| ctx.key(k)).or(own) else { return false };
                op.payload = seal_payload(&k, &op.nonce, &op.scope, op.plane, &p);
                if !keep_key_id {
                    op.key_id = key_id_of(&k);
                }
            }
        }
    }
    true
}

fn apply_mutation(ctx: &Ctx<'_>, msgs: &mut Vec<(u32, Vec<u8>)>, m: &Mutation) {
    if msgs.is_empty() {
        return;
    }
    let n = msgs.len();
    let at = |i: u16| i as usize % n;
    match m {
        Mutation::Swap(a, b) => msgs.swap(at(*a), at(*b)),
        Mutation::Move(a, b) => {
            let x = msgs.remove(at(*a));
            let to = *b as usize % (msgs.len() + 1);
            msgs.insert(to, x);
        }
        Mutation::Duplicate(a, b) => {
            let x = msgs[at(*a)].clone();
            msgs.insert(*b as usize % (n + 1), x);
        }
        Mutation::Remove(a) => {
            msgs.remove(at(*a));
        }
        Mutation::Reverse => msgs.reverse(),
        Mutation::FlipByte { at: a, pos, xor } => {
            let f = &mut msgs[at(*a)].1;
            if !f.is_empty() {
                let i = *pos as usize % f.len();
                f[i] ^= *xor;
            }
        }
        Mutation::Verdict { at: a, kind, arg } => {
            let own = None;
            let (edits, signer): (Vec<Edit>, Option<Signer>) = match kind % 8 {
                0 => (vec![Edit::HlcOfDependency], None),
                1 => (vec![Edit::AddDataCut(*arg as u16)], None),
                2 => (vec![Edit::HlcAdd(0)], Some(Signer::Node)),
                3 => (vec![Edit::Reseal { plain: PlainEdit::Keep, key: Some(*arg), keep_key_id: false }], None),
                // The first governance op after the genesis adds the members:
                // its cut is behind every rotation and removal.
                4 => (vec![Edit::SetCut(1), Edit::Reseal { plain: PlainEdit::Keep, key: Some(0), keep_key_id: false }], None),
                5 => (vec![Edit::Reseal { plain: PlainEdit::Keep, key: Some(*arg), keep_key_id: true }], None),
                6 => (vec![Edit::Reseal { plain: PlainEdit::Truncate(*arg as u16), key: own, keep_key_id: false }], None),
                _ => {
                    let plain = PlainEdit::Flip { pos: *arg as u16, xor: 0x80 };
                    let m = Mutation::Edit { at: 0, edits: vec![Edit::Reseal { plain, key: own, keep_key_id: false }], signer: None, keep_original: true };
                    return apply_mutation(ctx, msgs, &m);
                }
            };
            let m = Mutation::Edit { at: *a, edits, signer, keep_original: arg & 1 == 1 };
            apply_mutation(ctx, msgs, &m);
        }
        Mutation::Edit { at: a, edits, signer, keep_original } => {
            let Some(i) = nth_op(msgs, *a) else { return };
            let Some(mut op) = decode_op_frame(&msgs[i].1) else { return };
            let author = op.author;
            let mut changed = false;
            for e in edits.iter().take(4) {
                changed |= apply_edit(ctx, msgs, &mut op, e);
            }
            if !changed {
                return;
            }
            let frame = match ctx.signer(*signer, &author) {
                Some(m) => sign_op(&mut op, m).0,
                None => op_frame(&op).0,
            };
            let rank = msgs[i].0;
            if *keep_original {
                msgs.insert(i + 1, (rank, frame));
            } else {
                msgs[i] = (rank, frame);
            }
        }
        Mutation::KeyLast(which) => {
            let keys: Vec<usize> = (0..n).filter(|&i| msgs[i].1.first() == Some(&MESSAGE_KEY)).collect();
            let chosen: Vec<usize> = match which {
                None => keys,
                Some(k) if !keys.is_empty() => vec![keys[*k as usize % keys.len()]],
                Some(_) => vec![],
            };
            for (moved, i) in chosen.into_iter().enumerate() {
                let x = msgs.remove(i - moved);
                msgs.push(x);
            }
        }
        Mutation::DeliverKey { at: a, key, to_node, ephemeral } => {
            let k = ctx.key(*key);
            let (public, kem) = if *to_node {
                let id = node_identity();
                (id.public_key, id.kem_public)
            } else {
                let w = &ctx.w.writers[0];
                (w.public_key, x25519_public(&w.seed))
            };
            let kd = seal_key_delivery(ctx.w.scope, &k, public, &kem, &[*ephemeral | 1; 32]);
            let i = at(*a);
            let rank = msgs[i].0;
            msgs.insert(i, (rank, encode(&Message::Key(kd))));
        }
    }
}

/// The concrete scenario this input stands for.
pub fn build(input: &EngineInput) -> Scenario {
    let writers = 1 + input.writers % 4;
    let data_ops = 1 + input.data_ops % 30;
    // Only positions inside the run have an effect; fold the rest away so the
    // cache key space stays small.
    let rotate_at = input.rotate_at.map(|r| r % data_ops);
    let remove_writer_at = input.remove_writer_at.map(|r| r % data_ops);
    let w = workload((input.seed, writers, data_ops, rotate_at, remove_writer_at, input.chain));
    let node = Member { seed: NODE_SEED, public_key: node_identity().public_key };
    let mut pool = w.keys.clone();
    pool.extend((0u8..2).map(|i| sha256(&[b'f', b'u', b'z', b'z', i, input.seed])));
    let ctx = Ctx { w: &w, node, pool };

    let mut msgs: Vec<(u32, Vec<u8>)> = w.messages.iter().enumerate().map(|(i, m)| (i as u32, m.frame.clone())).collect();
    for m in input.mutations.iter().take(MUTATIONS_MAX) {
        apply_mutation(&ctx, &mut msgs, m);
    }

    let mut steps = Vec::with_capacity(msgs.len() * 2);
    for (i, (rank, frame)) in msgs.into_iter().enumerate() {
        steps.push(Step::Frame { rank, frame });
        match input.schedule.get(i) {
            None => steps.push(Step::Commit),
            Some(&b) => {
                if b & 0xF0 == 0xF0 {
                    steps.push(Step::Restart);
                    continue;
                }
                if b & 1 != 0 {
                    steps.push(Step::Commit);
                }
                // A node's timer ticks when the clock passes a deadline; an
                // advance is followed by a tick, and bit 1 adds one anyway.
                let advance = [0, 100, 1_000, 5_000][((b >> 2) & 3) as usize];
                if advance > 0 {
                    steps.push(Step::Advance(advance));
                }
                if advance > 0 || b & 2 != 0 {
                    steps.push(Step::Tick);
                }
            }
        }
    }
    let (sel, o, b, d) = input.tight;
    let tight = (sel % 8 == 0).then(|| (1 + (o % 8) as u64, 256 + b as u64 * 4, 1 + (d % 16) as u64));
    Scenario { tight, steps }
}
