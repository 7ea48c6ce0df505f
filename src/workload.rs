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
    assert!(cfg.writers >= 1 && cfg.writers <= 32, "1..=32 writers (parents are at most 32)");
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

    let mut views: Vec<View> = (0..cfg.writers).map(|_| View { vc: vec![0; cfg.writers], projection: Projection::default() }).collect();
    // Data ops in creation order: (id, hlc, author index, actions), with
    // each op's vector clock, and each author's ops in order.
    let mut created: Vec<(Hash, u64, usize, Vec<Action>)> = Vec::new();
    let mut clocks: Vec<Vec<u32>> = Vec::new();
    let mut parents_of: Vec<Vec<Hash>> = Vec::new();
    let mut by_author: Vec<Vec<usize>> = vec![Vec::new(); cfg.writers];
    let mut last: Option<Hash> = None;
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
        let parents: Vec<Hash> = if cfg.chain { last.into_iter().collect() } else { heads.into_iter().collect() };
        assert!(parents.len() <= 32);
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
        let view = &mut views[w];
        view.projection.apply(hlc, &author.public_key, &acts);
        let root_hash = view.projection.root();
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
        let (frame, id) = sign_op(&mut op, author);
        messages.push(Generated { frame, id, is_data: true });
        let j = created.len();
        created.push((id, hlc, w, acts));
        by_author[w].push(j);
        view.vc[w] += 1;
        clocks.push(view.vc.clone());
        parents_of.push(parents);
        last = Some(id);
    }
    let mut all = Projection::default();
    let mut is_parent: BTreeSet<Hash> = BTreeSet::new();
    for (j, (_, h, a, acts)) in created.iter().enumerate() {
        all.apply(*h, &writers[*a].public_key, acts);
        is_parent.extend(parents_of[j].iter().copied());
    }
    let data_heads = created.iter().map(|c| c.0).filter(|id| !is_parent.contains(id)).collect();
    Workload { scope, messages, final_root: all.root(), admin, writers, keys, governance_heads: cut, data_heads }
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
