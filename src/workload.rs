//! A deterministic generator of scopes and their ops, with honest
//! `root_hash` values: for the property tests, the seeded simulation, the
//! benchmarks and the load generator.
//!
//! A scope has one admin, `writers` writers and the node as a reader (with
//! the group key delivered to it). Each writer keeps its own view (the ops
//! it knows and the projection of them); before writing it may first merge
//! another writer's view (`merge_share`), so ops join concurrent heads. Each
//! op's `root_hash` is its author's root with the op applied, as SPEC §8
//! wants, so an honest history never diverges.

use std::collections::BTreeSet;

use rand::{Rng, SeedableRng};

use crate::core::projection::Projection;
use crate::limits::OP_PARENTS_MAX;
use crate::protocol::crypto::{encode_op, key_id_of, seal_key_delivery, seal_payload, x25519_public};
use crate::protocol::*;

#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub seed: u64,
    pub writers: usize,
    pub data_ops: usize,
    pub actions_per_op: usize,
    pub value_bytes: usize,
    /// Probability that a writer merges another writer's view before writing.
    pub merge_share: f64,
    pub events_per_op: usize,
    /// Distinct cell keys per entity.
    pub keys_per_entity: u32,
    /// After this many data ops, rotate to a second key (a governance op).
    pub rotate_at: Option<usize>,
    /// A straight chain: every op's only parent is the previous op.
    pub chain: bool,
    /// After this many data ops, the admin removes writer 0, which goes on
    /// writing at the new cut: its later ops are `unauthorized`, and what
    /// builds on them `rejected_dependency`.
    pub remove_writer_at: Option<usize>,
    /// Instead of per-writer views: every writer knows the history up to
    /// at most this many ops before its own (each op's knowledge a prefix
    /// of the creation order, never shrinking), as in a large group whose
    /// members all follow the scope a little late. It works for any number
    /// of writers (`writers` up to 1..=32 only without it): at most
    /// `lag + 1` ops are concurrent, so parents stay within
    /// `OP_PARENTS_MAX` for `lag` up to 31.
    pub view_lag: Option<usize>,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            seed: 1,
            writers: 4,
            data_ops: 1000,
            actions_per_op: 2,
            value_bytes: 16,
            merge_share: 0.2,
            events_per_op: 1,
            keys_per_entity: 1000,
            rotate_at: None,
            chain: false,
            remove_writer_at: None,
            view_lag: None,
        }
    }
}

pub struct Member {
    pub seed: [u8; 32],
    pub public_key: PublicKey,
}

impl Member {
    fn new(rng: &mut impl Rng) -> Member {
        let seed: [u8; 32] = rng.gen();
        Member { seed, public_key: sig::public_key_from_seed(&seed) }
    }
}

/// One generated op or key delivery, as a wire frame's content.
#[derive(Clone, Debug)]
pub struct Generated {
    pub frame: Vec<u8>,
    /// The op's id (ZERO for a key delivery).
    pub id: Hash,
    pub is_data: bool,
}

pub struct Workload {
    pub scope: Hash,
    /// Everything in causal order: genesis, governance, key deliveries, data.
    pub messages: Vec<Generated>,
    /// The root of the fold of every data op.
    pub final_root: Hash,
    pub admin: Member,
    pub writers: Vec<Member>,
    pub keys: Vec<[u8; 32]>,
    /// The governance heads at the end (the cut of the last data ops).
    pub governance_heads: Vec<Hash>,
    pub data_heads: Vec<Hash>,
}

pub fn op_frame(op: &Op) -> (Vec<u8>, Hash) {
    let (bytes, id) = encode_op(op);
    let mut frame = Vec::with_capacity(bytes.len() + 1);
    frame.push(MESSAGE_OP);
    frame.extend_from_slice(&bytes);
    (frame, id)
}

/// Signs `op` in place by `author` and returns its frame and id.
pub fn sign_op(op: &mut Op, author: &Member) -> (Vec<u8>, Hash) {
    op.author = author.public_key;
    op.signature = [0; 64];
    let (_, id) = encode_op(op);
    op.signature = sig::sign(&author.seed, &id);
    op_frame(op)
}

fn gov_op(scope: Hash, parents: Vec<Hash>, hlc: u64, key: &[u8; 32], nonce: [u8; 12], actions: Vec<GovAction>) -> Op {
    let plain = encode(&GovPayload { actions });
    Op {
        version: 1,
        scope,
        plane: PLANE_GOVERNANCE,
        author: [0; 32],
        parents,
        cut: vec![],
        hlc,
        key_id: key_id_of(key),
        nonce,
        payload: seal_payload(key, &nonce, &scope, PLANE_GOVERNANCE, &plain),
        signature: [0; 64],
    }
}

/// A writer's knowledge as a vector clock: it knows the first `vc[a]` ops
/// of each author `a` (a set closed under ancestry, since an op's author
/// knew everything its clock names).
struct View {
    vc: Vec<u32>,
    projection: Projection,
}

/// Generates a scope for a node with `node_public` / `node_kem`.
pub fn generate(cfg: &WorkloadConfig, node_public: PublicKey, node_kem: [u8; 32]) -> Workload {
    generate_for(cfg, node_public, node_kem, &[])
}

/// `generate`, with `readers` (other nodes' public and X25519 keys) made
/// readers too, each delivered every key right after the node's delivery
/// of it: a scope replicated by several nodes (the simulator's). The
/// ephemeral keys of their deliveries are derived from the seed, so the
/// rest of the scope is the same as `generate`'s.
pub fn generate_for(cfg: &WorkloadConfig, node_public: PublicKey, node_kem: [u8; 32], readers: &[(PublicKey, [u8; 32])]) -> Workload {
    match cfg.view_lag {
        None => assert!(cfg.writers >= 1 && cfg.writers <= 32, "1..=32 writers (parents are at most 32) without view_lag"),
        Some(lag) => assert!(cfg.writers >= 1 && lag < OP_PARENTS_MAX as usize, "view_lag at most 31: parents are at most 32"),
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let admin = Member::new(&mut rng);
    let writers: Vec<Member> = (0..cfg.writers).map(|_| Member::new(&mut rng)).collect();
    let k1: [u8; 32] = rng.gen();
    let k2: [u8; 32] = rng.gen();
    let mut hlc: u64 = 1_000;
    let mut messages = Vec::new();

    let mut genesis = Op {
        version: 1,
        scope: ZERO,
        plane: PLANE_GOVERNANCE,
        author: [0; 32],
        parents: vec![],
        cut: vec![],
        hlc,
        key_id: ZERO,
        nonce: [0; 12],
        payload: encode(&GovPayload {
            actions: vec![GovAction::Genesis { name: format!("workload-{}", cfg.seed), first_key_id: key_id_of(&k1) }],
        }),
        signature: [0; 64],
    };
    let (frame, scope) = sign_op(&mut genesis, &admin);
    messages.push(Generated { frame, id: scope, is_data: false });
    let delivery = |key: &[u8; 32], rng: &mut rand::rngs::StdRng| {
        let e: [u8; 32] = rng.gen();
        let kd = seal_key_delivery(scope, key, node_public, &node_kem, &e);
        let mut out = vec![Generated { frame: encode(&Message::Key(kd)), id: ZERO, is_data: false }];
        for (n, (public, kem)) in readers.iter().enumerate() {
            let e = crate::protocol::crypto::sha256_parts(&[b"workload/reader", &cfg.seed.to_le_bytes(), &(n as u32).to_le_bytes(), key]);
            let kd = seal_key_delivery(scope, key, *public, kem, &e);
            out.push(Generated { frame: encode(&Message::Key(kd)), id: ZERO, is_data: false });
        }
        out
    };
    messages.extend(delivery(&k1, &mut rng));
    hlc += 1;
    let mut actions: Vec<GovAction> = writers
        .iter()
        .map(|w| GovAction::AddMember { member: w.public_key, role: Role::Writer, kem: x25519_public(&w.seed) })
        .collect();
    actions.push(GovAction::AddMember { member: node_public, role: Role::Reader, kem: node_kem });
    for (public, kem) in readers {
        actions.push(GovAction::AddMember { member: *public, role: Role::Reader, kem: *kem });
    }
    let mut g1 = gov_op(scope, vec![scope], hlc, &k1, rng.gen(), actions);
    let (frame, g1_id) = sign_op(&mut g1, &admin);
    messages.push(Generated { frame, id: g1_id, is_data: false });
    let mut cut = vec![g1_id];
    let mut key = k1;
    let mut keys = vec![k1];

    let per_writer = cfg.view_lag.is_none();
    let mut views: Vec<View> = if per_writer {
        (0..cfg.writers).map(|_| View { vc: vec![0; cfg.writers], projection: Projection::default() }).collect()
    } else {
        Vec::new()
    };
    // With `view_lag`: the prefix every writer knows (its length, its fold
    // and its heads), only ever longer.
    let (mut known, mut known_fold, mut known_heads) = (0usize, Projection::default(), BTreeSet::<Hash>::new());
    // Data ops in creation order: (id, hlc, author index, actions), with
    // each op's vector clock, and each author's ops in order.
    let mut created: Vec<(Hash, u64, usize, Vec<Action>)> = Vec::new();
    let mut clocks: Vec<Vec<u32>> = Vec::new();
    let mut parents_of: Vec<Vec<Hash>> = Vec::new();
    let mut by_author: Vec<Vec<usize>> = vec![Vec::new(); cfg.writers];
    let mut last: Option<Hash> = None;
    let mut unsigned: Vec<(usize, usize, Op)> = Vec::with_capacity(cfg.data_ops.min(SIGN_CHUNK));
    for i in 0..cfg.data_ops {
        if cfg.rotate_at == Some(i) {
            hlc += 1;
            let mut g2 = gov_op(scope, cut.clone(), hlc, &key, rng.gen(), vec![GovAction::RotateKey { key_id: key_id_of(&k2) }]);
            let (frame, g2_id) = sign_op(&mut g2, &admin);
            messages.push(Generated { frame, id: g2_id, is_data: false });
            messages.extend(delivery(&k2, &mut rng));
            cut = vec![g2_id];
            key = k2;
            keys.push(k2);
        }
        if cfg.remove_writer_at == Some(i) {
            hlc += 1;
            let mut g = gov_op(scope, cut.clone(), hlc, &key, rng.gen(), vec![GovAction::RemoveMember { member: writers[0].public_key }]);
            let (frame, g_id) = sign_op(&mut g, &admin);
            messages.push(Generated { frame, id: g_id, is_data: false });
            cut = vec![g_id];
        }
        let w = if cfg.chain { 0 } else { rng.gen_range(0..cfg.writers) };
        let parents: Vec<Hash> = match cfg.view_lag {
            Some(lag) => {
                // A chain's author knows every op before its own.
                let upto = if cfg.chain { created.len() } else { known.max(created.len().saturating_sub(rng.gen_range(0..=lag))) };
                for j in known..upto {
                    let (id, h, au, acts) = &mut created[j];
                    // Folded once, then not kept: 10^7 ops fit in memory.
                    known_fold.apply(*h, &writers[*au].public_key, &std::mem::take(acts));
                    for p in &parents_of[j] {
                        known_heads.remove(p);
                    }
                    known_heads.insert(*id);
                }
                known = upto;
                known_heads.iter().copied().collect()
            }
            None => {
                if !cfg.chain && cfg.writers > 1 && rng.gen_bool(cfg.merge_share) {
                    let other = (w + rng.gen_range(1..cfg.writers)) % cfg.writers;
                    for a in 0..cfg.writers {
                        let (from, to) = (views[w].vc[a], views[other].vc[a]);
                        for k in from..to.max(from) {
                            let (_, h, au, acts) = &created[by_author[a][k as usize]];
                            views[w].projection.apply(*h, &writers[*au].public_key, acts);
                        }
                        views[w].vc[a] = from.max(to);
                    }
                }
                // The view's heads: each author's latest known op, unless another
                // author's latest known op already knew it.
                let heads: BTreeSet<Hash> = (0..cfg.writers)
                    .filter(|a| views[w].vc[*a] > 0)
                    .filter(|a| {
                        (0..cfg.writers).all(|b| {
                            b == *a || views[w].vc[b] == 0 || clocks[by_author[b][views[w].vc[b] as usize - 1]][*a] < views[w].vc[*a]
                        })
                    })
                    .map(|a| created[by_author[a][views[w].vc[a] as usize - 1]].0)
                    .collect();
                if cfg.chain { last.into_iter().collect() } else { heads.into_iter().collect() }
            }
        };
        assert!(parents.len() <= OP_PARENTS_MAX as usize);
        hlc += 1;
        let entity = format!("e{}", rng.gen_range(0..4u32));
        let mut acts = Vec::with_capacity(cfg.actions_per_op);
        for _ in 0..cfg.actions_per_op {
            let k = format!("k{}", rng.gen_range(0..cfg.keys_per_entity.max(1))).into_bytes();
            let a = match rng.gen_range(0..10u32) {
                0 => Action::Delete { entity: entity.clone(), key: k },
                1..=3 => Action::Add { entity: entity.clone(), key: k, amount: rng.gen_range(-100..100) },
                _ => {
                    let mut value = vec![0u8; cfg.value_bytes];
                    rng.fill(&mut value[..]);
                    Action::Put { entity: entity.clone(), key: k, value }
                }
            };
            acts.push(a);
        }
        let author = &writers[w];
        let root_hash = if per_writer {
            views[w].projection.apply(hlc, &author.public_key, &acts);
            views[w].projection.root()
        } else {
            known_fold.root_after(hlc, &author.public_key, &acts)
        };
        let events = (0..cfg.events_per_op).map(|e| Event { kind: format!("ev{e}"), data: (i as u64).to_le_bytes().to_vec() }).collect();
        let plain = encode(&DataPayload { root_hash, actions: acts.clone(), events });
        let nonce: [u8; 12] = rng.gen();
        let mut op = Op {
            version: 1,
            scope,
            plane: PLANE_DATA,
            author: [0; 32],
            parents: parents.clone(),
            cut: cut.clone(),
            hlc,
            key_id: key_id_of(&key),
            nonce,
            payload: seal_payload(&key, &nonce, &scope, PLANE_DATA, &plain),
            signature: [0; 64],
        };
        // Signed at the end, on every core: the id does not cover the
        // signature.
        op.author = author.public_key;
        let (_, id) = encode_op(&op);
        unsigned.push((messages.len(), w, op));
        messages.push(Generated { frame: Vec::new(), id, is_data: true });
        if unsigned.len() == SIGN_CHUNK {
            sign_all(&mut messages, std::mem::take(&mut unsigned), &writers);
        }
        let j = created.len();
        created.push((id, hlc, w, acts));
        if per_writer {
            by_author[w].push(j);
            views[w].vc[w] += 1;
            clocks.push(views[w].vc.clone());
        }
        parents_of.push(parents);
        last = Some(id);
    }
    let mut is_parent: BTreeSet<Hash> = BTreeSet::new();
    for parents in &parents_of {
        is_parent.extend(parents.iter().copied());
    }
    // The fold of every data op: the known prefix's fold taken to the end
    // (with `view_lag`, the actions of the ops before it are gone), else
    // a fold of them all.
    let mut all = if per_writer { Projection::default() } else { known_fold };
    for (_, h, a, acts) in &created[if per_writer { 0 } else { known }..] {
        all.apply(*h, &writers[*a].public_key, acts);
    }
    let data_heads = created.iter().map(|c| c.0).filter(|id| !is_parent.contains(id)).collect();
    sign_all(&mut messages, unsigned, &writers);
    Workload { scope, messages, final_root: all.root(), admin, writers, keys, governance_heads: cut, data_heads }
}

/// Data ops signed together (`sign_all`): the unsigned ones held at once.
const SIGN_CHUNK: usize = 1 << 16;

/// Signs each `(message index, writer, op)` by its writer into its frame,
/// the ops shared out over the machine's cores (signing is most of the
/// generator's time: ~10^7 ops in a `steady_10m`).
fn sign_all(messages: &mut [Generated], unsigned: Vec<(usize, usize, Op)>, writers: &[Member]) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = unsigned.len().div_ceil(threads).max(1);
    let mut parts: Vec<Vec<(usize, usize, Op)>> = Vec::new();
    let mut rest = unsigned.into_iter();
    loop {
        let part: Vec<_> = rest.by_ref().take(per).collect();
        if part.is_empty() {
            break;
        }
        parts.push(part);
    }
    let signed: Vec<Vec<(usize, Vec<u8>)>> = std::thread::scope(|t| {
        let handles: Vec<_> = parts
            .into_iter()
            .map(|part| t.spawn(move || part.into_iter().map(|(i, w, mut op)| (i, sign_op(&mut op, &writers[w]).0)).collect()))
            .collect();
        handles.into_iter().map(|h| h.join().expect("a signing thread")).collect()
    });
    for (i, frame) in signed.into_iter().flatten() {
        messages[i].frame = frame;
    }
}

/// A permutation of `0..n` that moves items only within windows of `window`.
pub fn shuffle_within_windows(n: usize, window: usize, seed: u64) -> Vec<usize> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for chunk in order.chunks_mut(window.max(1)) {
        for i in (1..chunk.len()).rev() {
            chunk.swap(i, rng.gen_range(0..=i));
        }
    }
    order
}
