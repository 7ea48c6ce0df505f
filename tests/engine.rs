//! Engine behaviour beyond the vectors: hostile input, the cascade's bound,
//! eviction, key-wait expiry.

use dagfold::core::{Config, Engine, Identity, OpState, Outcome};
use dagfold::protocol::*;
use dagfold::workload::{generate, WorkloadConfig};

fn node() -> Identity {
    Identity::from_secrets([5; 32], [6; 32])
}

fn workload(cfg: WorkloadConfig) -> dagfold::workload::Workload {
    let id = node();
    generate(&cfg, id.public_key, id.kem_public)
}

/// Truncations, trailing bytes, bad variants, bad UTF-8, over-limit length
/// prefixes: all `malformed`, none panics, none is remembered.
#[test]
fn hostile_frames_are_malformed_and_never_panic() {
    let w = workload(WorkloadConfig { data_ops: 20, ..Default::default() });
    let mut e = Engine::new(Config::default(), node());
    let mut count = 0u64;
    for m in &w.messages {
        let f = &m.frame;
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for cut in [1, 2, 5, 33, f.len() / 2, f.len() - 1] {
            if cut < f.len() {
                cases.push(f[..cut].to_vec());
            }
        }
        cases.push([f.as_slice(), &[0]].concat());
        let mut v = f.clone();
        v[0] = 255;
        cases.push(v);
        let mut v = f.clone();
        v[0] = 9;
        cases.push(v);
        if f[0] == MESSAGE_OP {
            // Length prefixes of `parents` at offset 1+1+32+1+32 set past the
            // limit and to 4 GiB: rejected before any allocation.
            for len in [33u32, u32::MAX] {
                let mut v = f.clone();
                v[67..71].copy_from_slice(&len.to_le_bytes());
                cases.push(v);
            }
            let mut v = f.clone();
            v[1] = 2; // version
            cases.push(v);
        }
        for c in cases {
            count += 1;
            assert_eq!(e.handle_frame(&c, 0), Outcome::Malformed, "frame {}", hex::encode(&c[..c.len().min(16)]));
        }
    }
    assert_eq!(e.stats.malformed, count);
    assert!(e.scope_ids().is_empty(), "nothing malformed is remembered");
    // Bad UTF-8 inside a decrypted payload is bad_payload, not malformed: the
    // codec says so directly.
    let mut bad = Vec::new();
    bad.extend_from_slice(&[0u8; 32]);
    bad.extend_from_slice(&1u32.to_le_bytes());
    bad.push(0);
    bad.extend_from_slice(&2u32.to_le_bytes());
    bad.extend_from_slice(&[0xC3, 0x28]);
    assert!(matches!(codec::decode_data_payload(&bad), Err(DecodeError::BadUtf8 | DecodeError::Truncated)));
}

/// A 100,000-op chain delivered in exact reverse applies in one cascade,
/// each op released once: no recursion, no rescans.
#[test]
fn reversed_100k_chain_applies_in_one_cascade() {
    let w = workload(WorkloadConfig { data_ops: 100_000, chain: true, writers: 1, events_per_op: 0, actions_per_op: 1, ..Default::default() });
    let mut e = Engine::new(Config::default(), node());
    let n = w.messages.len();
    for m in w.messages.iter().rev().take(n - 1) {
        let o = e.handle_frame(&m.frame, 0);
        assert!(matches!(o, Outcome::NotYet(_) | Outcome::KeyIgnored | Outcome::KeyAccepted), "{o:?}");
    }
    assert_eq!(e.applied_total(), 0);
    // What a sync asks peers for: only the one id nobody has sent, not the
    // 100,000 ids that are waited on but buffered here.
    assert_eq!(e.wanted(16), vec![w.messages[0].id]);
    // The scope of the ops waiting for it (the genesis: the scope's id).
    let ids = e.wanted(16);
    assert_eq!(e.wanted_scopes(&ids), vec![w.scope]);
    let released_before = e.stats.cascade_released;
    assert_eq!(e.handle_frame(&w.messages[0].frame, 0), Outcome::Applied);
    assert_eq!(e.applied_total(), w.messages.iter().filter(|m| m.id != ZERO).count() as u64);
    // Each op is released at most once per dependency it waited on (a data
    // op here waits on its parent and on the governance op of its cut).
    let released = e.stats.cascade_released - released_before;
    assert!((100_001..=2 * 100_001).contains(&released), "released {released}");
    assert_eq!(e.scope_root(&w.scope), Some(w.final_root));
    assert_eq!(e.wanted(16), Vec::<Hash>::new());
}

#[test]
fn buffers_evict_oldest_first_and_count() {
    let w = workload(WorkloadConfig { data_ops: 50, chain: true, writers: 1, ..Default::default() });
    let cfg = Config { buffered_ops_per_scope_max: 10, buffered_ops_total_max: 10, ..Config::default() };
    let mut e = Engine::new(cfg, node());
    let data: Vec<_> = w.messages.iter().filter(|m| m.is_data).collect();
    for m in &data {
        e.handle_frame(&m.frame, 0); // all orphans: the governance never came
    }
    assert_eq!(e.stats.evicted, 40);
    assert_eq!(e.buffered_total().0, 10);
    for (i, m) in data.iter().enumerate() {
        let kept = e.op_state(&m.id) != OpState::Unknown;
        assert_eq!(kept, i >= 40, "op {i}: the oldest are evicted");
    }
    // The oldest kept op waits on an evicted one: a sync must ask for it.
    assert!(e.wanted(64).contains(&data[39].id), "an evicted op waited on is wanted");
    assert!(!e.wanted(64).contains(&data[40].id), "a buffered op is not");
    // An evicted op is judged afresh when delivered again.
    assert!(matches!(e.handle_frame(&data[0].frame, 0), Outcome::NotYet(_)));
}

/// Ops buffered and released again leave their age entries behind (they
/// are dropped lazily); eviction must still take the oldest op still
/// buffered, through rounds that trigger the compaction of those entries.
#[test]
fn eviction_takes_the_oldest_still_buffered_after_many_releases() {
    let w = workload(WorkloadConfig { data_ops: 400, chain: true, writers: 1, ..Default::default() });
    let cfg = Config { buffered_ops_per_scope_max: 20, buffered_ops_total_max: 20, ..Config::default() };
    let mut e = Engine::new(cfg, node());
    for m in w.messages.iter().filter(|m| !m.is_data) {
        e.handle_frame(&m.frame, 0);
    }
    let data: Vec<_> = w.messages.iter().filter(|m| m.is_data).collect();
    // Twenty rounds: 15 children parked, then their missing parent, which
    // releases them all (300 dead age entries against at most 15 live).
    for round in 0..20 {
        let base = round * 16;
        for m in &data[base + 1..base + 16] {
            assert!(matches!(e.handle_frame(&m.frame, 0), Outcome::NotYet(_)));
        }
        assert_eq!(e.handle_frame(&data[base].frame, 0), Outcome::Applied);
        assert_eq!(e.buffered_total().0, 0, "round {round} released everything");
    }
    assert_eq!(e.stats.evicted, 0);
    // 41 orphans past a missing op: the 21 oldest go, in arrival order.
    for m in &data[350..391] {
        e.handle_frame(&m.frame, 0);
    }
    assert_eq!(e.stats.evicted, 21);
    for (i, m) in data.iter().enumerate().take(391).skip(350) {
        assert_eq!(e.op_state(&m.id) != OpState::Unknown, i >= 371, "op {i}: the oldest are evicted");
    }
    // The gap, then the evicted ops delivered again, release the rest.
    for m in &data[320..350] {
        assert_eq!(e.handle_frame(&m.frame, 0), Outcome::Applied);
    }
    assert_eq!(e.buffered_total().0, 20, "the kept 20 wait on an evicted op");
    for m in &data[350..371] {
        assert_eq!(e.handle_frame(&m.frame, 0), Outcome::Applied);
    }
    assert_eq!(e.buffered_total().0, 0);
    let governance = w.messages.iter().filter(|m| !m.is_data && m.frame[0] == MESSAGE_OP).count();
    assert_eq!(e.applied_total() as usize, governance + 391);
}

#[test]
fn data_key_wait_expires_and_is_judged_afresh() {
    // k1 then a rotation to k2: data ops are encrypted with k2.
    let w = workload(WorkloadConfig { data_ops: 3, rotate_at: Some(0), ..Default::default() });
    let mut e = Engine::new(Config { data_key_wait_ms: 3_000, ..Config::default() }, node());
    let keys: Vec<_> = w.messages.iter().filter(|m| m.frame[0] == MESSAGE_KEY).collect();
    assert_eq!(keys.len(), 2);
    for m in w.messages.iter().filter(|m| !m.is_data && m.frame[0] == MESSAGE_OP) {
        e.handle_frame(&m.frame, 1_000);
    }
    e.handle_frame(&keys[0].frame, 1_000); // k1 only
    let d = w.messages.iter().find(|m| m.is_data).unwrap();
    assert_eq!(e.handle_frame(&d.frame, 1_000), Outcome::NotYet(dagfold::core::BufKind::DataKeyWait));
    e.handle_tick(3_999);
    assert_eq!(e.op_state(&d.id), OpState::Buffered(dagfold::core::BufKind::DataKeyWait));
    e.handle_tick(4_000);
    assert_eq!(e.op_state(&d.id), OpState::Unknown, "dropped for now: not a verdict");
    assert_eq!(e.stats.key_timeouts, 1);
    // Delivered again, it is judged afresh; the key then releases it.
    assert_eq!(e.handle_frame(&d.frame, 5_000), Outcome::NotYet(dagfold::core::BufKind::DataKeyWait));
    assert_eq!(e.handle_frame(&keys[1].frame, 5_001), Outcome::KeyAccepted);
    assert_eq!(e.op_state(&d.id), OpState::Applied);
    e.handle_tick(100_000);
    assert_eq!(e.op_state(&d.id), OpState::Applied, "a stale deadline does not touch an applied op");
}

/// A genesis signed by `author`: a scope of its own.
fn genesis_by(author: &dagfold::workload::Member, name: &str) -> (Vec<u8>, Hash) {
    let payload = encode(&GovPayload { actions: vec![GovAction::Genesis { name: name.into(), first_key_id: [7; 32] }] });
    let mut op = Op {
        version: 1,
        scope: ZERO,
        plane: 0,
        author: author.public_key,
        parents: Vec::new(),
        cut: Vec::new(),
        hlc: 1,
        key_id: ZERO,
        nonce: [0; 12],
        payload,
        signature: [0; 64],
    };
    dagfold::workload::sign_op(&mut op, author)
}

/// API.md, "Which scopes a node holds": under a restricted policy a genesis
/// by a stranger is refused (counted, not remembered), one by the node
/// itself or by an accepted author is applied, and so is one of a followed
/// scope; following is kept in the store and survives a restart.
#[test]
fn geneses_follow_the_nodes_policy() {
    use dagfold::core::GenesisPolicy;
    use dagfold::store::{memory::MemStore, Store};
    let w = workload(WorkloadConfig { data_ops: 5, ..Default::default() });
    let genesis = &w.messages[0].frame;
    let strict = Config { genesis_policy: GenesisPolicy::Authors(Vec::new()), ..Config::default() };
    let mut store = MemStore::new();

    let mut e = Engine::new(strict.clone(), node());
    assert_eq!(e.handle_frame(genesis, 0), Outcome::GenesisRefused, "a stranger's genesis");
    assert_eq!(e.op_state(&w.scope), OpState::Unknown, "a refused genesis is not remembered");
    assert_eq!(e.stats.genesis_refused, 1);
    let me = dagfold::workload::Member { seed: [5; 32], public_key: node().public_key };
    let (own, own_id) = genesis_by(&me, "mine");
    assert_eq!(e.handle_frame(&own, 0), Outcome::Applied, "the node's own genesis");
    assert_eq!(e.op_state(&own_id), OpState::Applied);
    e.follow(w.scope);
    store.write(&e.take_commit().unwrap().writes, true).unwrap();
    assert_eq!(e.handle_frame(genesis, 0), Outcome::Applied, "a followed scope's genesis");

    let restored = Engine::restore(strict, node(), &store, None, 0).expect("the tables read back");
    assert!(restored.follows(&w.scope), "following is durable");

    let trusted = Config { genesis_policy: GenesisPolicy::Authors(vec![w.admin.public_key]), ..Config::default() };
    let mut e = Engine::new(trusted, node());
    assert_eq!(e.handle_frame(genesis, 0), Outcome::Applied, "an accepted author's genesis");
}

/// Issue 20: an op by a key that no governance op of its scope ever made a
/// member is unauthorized (after the dependency checks, as SPEC §6 orders
/// them) without `G(cut)` computed, whichever of the scope's cuts it cites:
/// the governance cache sees neither a hit nor a miss. A writer's op at a
/// cut where it is not a member still computes the state it is judged at.
#[test]
fn a_strangers_op_is_unauthorized_without_computing_its_cut() {
    use dagfold::core::{decode_frame, Decoded, Reason};
    let w = workload(WorkloadConfig { data_ops: 20, writers: 2, rotate_at: Some(10), ..Default::default() });
    let mut e = Engine::new(Config::default(), node());
    for m in &w.messages {
        e.handle_frame(&m.frame, 0);
    }
    assert_eq!(e.scope_root(&w.scope), Some(w.final_root));
    let gov: Vec<Hash> = w.messages.iter().filter(|m| !m.is_data && m.id != ZERO).map(|m| m.id).collect();
    assert!(gov.len() >= 3, "genesis, members, rotation");
    let Ok(Decoded::Op { op: template, .. }) = decode_frame(&w.messages.iter().rev().find(|m| m.is_data).unwrap().frame) else {
        panic!("a data op")
    };
    let stranger = dagfold::workload::Member { seed: [77; 32], public_key: dagfold::protocol::sig::public_key_from_seed(&[77; 32]) };
    let before = e.governance_cache_stats();
    for (n, g) in gov.iter().enumerate() {
        let data = Op { parents: Vec::new(), cut: vec![*g], hlc: 1 << 40, ..template.clone() };
        let govern = Op { plane: PLANE_GOVERNANCE, parents: vec![*g], cut: Vec::new(), hlc: (1 << 40) + n as u64, ..template.clone() };
        for mut op in [data, govern] {
            let (frame, id) = dagfold::workload::sign_op(&mut op, &stranger);
            assert_eq!(e.handle_frame(&frame, 0), Outcome::Dropped(Reason::Unauthorized));
            assert_eq!(e.op_state(&id), OpState::Dropped(Reason::Unauthorized));
        }
    }
    assert_eq!(e.governance_cache_stats(), before, "no state computed for a stranger");
    // Dependency checks still come first: an unknown cut is pending, a cut
    // of the data plane wrong_plane.
    let mut op = Op { parents: Vec::new(), cut: vec![[3; 32]], hlc: 1 << 41, ..template.clone() };
    assert_eq!(e.handle_frame(&dagfold::workload::sign_op(&mut op, &stranger).0, 0), Outcome::NotYet(dagfold::core::BufKind::Pending));
    let mut op = Op { parents: Vec::new(), cut: vec![w.data_heads[0]], hlc: 1 << 41, ..template.clone() };
    assert_eq!(e.handle_frame(&dagfold::workload::sign_op(&mut op, &stranger).0, 0), Outcome::Dropped(Reason::WrongPlane));
    // A writer, a member of the scope at some cut, is judged at the genesis
    // (where it is not a member): that state is computed.
    let mut op = Op { parents: Vec::new(), cut: vec![gov[0]], hlc: 1 << 41, ..template };
    assert_eq!(e.handle_frame(&dagfold::workload::sign_op(&mut op, &w.writers[0]).0, 0), Outcome::Dropped(Reason::Unauthorized));
    let after = e.governance_cache_stats();
    assert_eq!(after.0 + after.1, before.0 + before.1 + 1, "a member's op computes (or finds) its state");
}

/// A group of 1,000 writers who each know the history up to a few ops
/// before their own (`view_lag`): every op applies, its parents within the
/// bound, no author's root diverges from the engine's, and the fold ends
/// on the generator's root, in causal order and shuffled.
#[test]
fn a_thousand_writers_with_lagging_views_converge() {
    use std::collections::HashSet;
    let cfg = WorkloadConfig { seed: 8, writers: 1000, data_ops: 3000, view_lag: Some(8), ..Default::default() };
    let w = workload(cfg);
    let mut authors = HashSet::new();
    let mut most_parents = 0;
    for m in w.messages.iter().filter(|m| m.is_data) {
        let Ok(dagfold::core::Decoded::Op { op, .. }) = dagfold::core::decode_frame(&m.frame) else { panic!("an op") };
        authors.insert(op.author);
        most_parents = most_parents.max(op.parents.len());
    }
    assert!(authors.len() > 900, "{} distinct authors", authors.len());
    assert!(most_parents > 1 && most_parents <= 9, "concurrent heads joined, at most lag + 1: {most_parents}");
    for order in [None, Some(dagfold::workload::shuffle_within_windows(w.messages.len(), 500, 3))] {
        let mut e = Engine::new(Config::default(), node());
        let frames: Vec<&Vec<u8>> = match &order {
            None => w.messages.iter().map(|m| &m.frame).collect(),
            Some(o) => o.iter().map(|&i| &w.messages[i].frame).collect(),
        };
        for f in frames {
            e.handle_frame(f, 0);
        }
        let applied = w.messages.iter().filter(|m| m.id != ZERO).count() as u64;
        assert_eq!(e.status(&w.scope).map(|s| s.applied), Some(applied));
        assert_eq!(e.scope_root(&w.scope), Some(w.final_root));
        assert_eq!(e.stats.divergences, 0);
    }
}

/// A pending op woken into a data key wait keeps its durable records (its
/// pending record and encoding), so a crash within the wait loses nothing
/// that was durable; at its deadline both go with it (dropped for now,
/// SPEC §6 step 4). Found by the simulator (`tests/sim.rs`, seed 7612 of
/// the campaign): an op a node held durably as pending was woken into a
/// key wait, its records deleted, and the node restarted; no node ever had
/// it again, nor what built on it.
#[test]
fn a_pending_op_woken_into_a_key_wait_survives_a_restart() {
    use dagfold::core::{BufKind, Cf};
    use dagfold::store::memory::MemStore;
    use dagfold::store::Store;
    let commit = |e: &mut Engine, store: &mut MemStore| {
        let c = e.take_commit().expect("no cold index");
        store.write(&c.writes, true).expect("the in-memory store");
        e.note_durable(c.number);
    };
    let w = workload(WorkloadConfig { data_ops: 4, writers: 1, chain: true, rotate_at: Some(2), ..Default::default() });
    let data: Vec<_> = w.messages.iter().filter(|m| m.is_data).collect();
    let gov: Vec<_> = w.messages.iter().filter(|m| !m.is_data && m.id != [0; 32]).collect();
    let deliveries: Vec<_> = w.messages.iter().filter(|m| m.id == [0; 32]).collect();
    assert_eq!((data.len(), gov.len(), deliveries.len()), (4, 3, 2), "genesis, members, rotation; a delivery per key");
    let cfg = Config::default();
    let mut store = MemStore::new();
    let mut e = Engine::new(cfg.clone(), node());
    for m in [gov[0], deliveries[0]] {
        assert!(matches!(e.handle_frame(&m.frame, 0), Outcome::Applied | Outcome::KeyAccepted));
    }
    // The first op under the new key before its parent and cut, and they
    // before theirs: all pending.
    for m in [data[2], data[0], data[1], gov[2]] {
        assert_eq!(e.handle_frame(&m.frame, 0), Outcome::NotYet(BufKind::Pending));
    }
    commit(&mut e, &mut store);
    // What they all wait on arrives: one cascade applies its parent and
    // the rotation, each waking it (twice woken); the new key has not come:
    // a key wait.
    assert_eq!(e.handle_frame(&gov[1].frame, 0), Outcome::Applied);
    assert_eq!(e.op_state(&data[1].id), OpState::Applied);
    assert_eq!(e.op_state(&gov[2].id), OpState::Applied);
    assert_eq!(e.op_state(&data[2].id), OpState::Buffered(BufKind::DataKeyWait));
    commit(&mut e, &mut store);
    let in_store = |s: &MemStore, cf: Cf| s.table(cf).is_some_and(|t| t.contains_key(data[2].id.as_slice()));
    assert!(in_store(&store, Cf::Pending) && in_store(&store, Cf::Ops), "its records are kept through the wait");
    let before_key = store.clone();

    // A crash within the wait: the restart has it, waiting again.
    let mut r = Engine::restore(cfg.clone(), node(), &store, None, 0).expect("the tables read back");
    commit(&mut r, &mut store);
    assert_eq!(r.op_state(&data[2].id), OpState::Buffered(BufKind::DataKeyWait));
    assert_eq!(r.handle_frame(&deliveries[1].frame, 0), Outcome::KeyAccepted);
    assert_eq!(r.op_state(&data[2].id), OpState::Applied);
    commit(&mut r, &mut store);
    assert!(!in_store(&store, Cf::Pending) && in_store(&store, Cf::Ops), "applied: the pending record goes, the encoding stays");
    let mut again = Engine::restore(cfg.clone(), node(), &store, None, 0).expect("the tables read back");
    assert_eq!(again.op_state(&data[2].id), OpState::Applied);
    assert!(again.take_commit().expect("no cold index").events.is_empty(), "applied once");

    // No key before the deadline: dropped for now, its records with it.
    let mut store = before_key;
    let mut t = Engine::restore(cfg.clone(), node(), &store, None, 0).expect("the tables read back");
    t.handle_tick(cfg.data_key_wait_ms + 1);
    assert_eq!(t.op_state(&data[2].id), OpState::Unknown);
    commit(&mut t, &mut store);
    assert!(!in_store(&store, Cf::Pending) && !in_store(&store, Cf::Ops), "nothing of it left");
    let mut again = Engine::restore(cfg, node(), &store, None, 0).expect("the tables read back");
    assert_eq!(again.op_state(&data[2].id), OpState::Unknown);
    assert_eq!(again.handle_frame(&data[2].frame, 0), Outcome::NotYet(BufKind::DataKeyWait), "a later copy is judged afresh");
}

/// A scope's status names the members at its governance heads, read again
/// whenever the heads move (the engine keeps them between statuses): after
/// the genesis only its author, after the members op every member, after
/// a removal one fewer (a key rotation between them changes no member).
#[test]
fn the_status_follows_the_members_as_the_governance_heads_move() {
    let w = workload(WorkloadConfig { data_ops: 20, writers: 2, rotate_at: Some(8), remove_writer_at: Some(12), ..Default::default() });
    let mut e = Engine::new(Config::default(), node());
    let mut seen = Vec::new();
    for m in &w.messages {
        e.handle_frame(&m.frame, 0);
        if let Some(st) = e.status(&w.scope) {
            let mut expected: Vec<PublicKey> = e.governance_at(&st.governance_heads).expect("the heads are applied").members.keys().copied().collect();
            expected.sort_unstable();
            let members: Vec<PublicKey> = st.members.iter().map(|(k, _)| *k).collect();
            assert_eq!(members, expected, "the members at the heads");
            if seen.last() != Some(&members.len()) {
                seen.push(members.len());
            }
        }
    }
    assert_eq!(seen, [1, 4, 3], "its author alone, then with two writers and the node, then a writer less");
}
