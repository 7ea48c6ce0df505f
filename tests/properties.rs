//! Property tests: any permutation, with duplicates, of the same messages
//! gives the same state; the incremental root equals the reference root.

use dagfold::core::{Config, Engine, Identity, ScopeReport};
use dagfold::workload::{generate, WorkloadConfig};
use proptest::prelude::*;

fn node() -> Identity {
    Identity::from_secrets([11; 32], [12; 32])
}

fn run(frames: &[&Vec<u8>]) -> Engine {
    let mut e = Engine::new(Config::default(), node());
    for f in frames {
        e.handle_frame(f, 0);
        e.take_commit().unwrap();
    }
    e
}

fn report(e: &mut Engine, scope: &[u8; 32]) -> ScopeReport {
    let mut r = e.report(scope).expect("scope known");
    r.divergences = 0; // order-dependent when some ops are dropped
    r
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn any_order_with_duplicates_gives_the_same_state(
        seed in any::<u64>(),
        writers in 1usize..5,
        data_ops in 1usize..60,
        merge_share in 0.0f64..0.9,
        rotate in proptest::option::of(0usize..60),
        remove in proptest::option::of(0usize..60),
        perm_seed in any::<u64>(),
        dup_every in 2usize..7,
    ) {
        let cfg = WorkloadConfig {
            seed, writers, data_ops, merge_share, rotate_at: rotate, remove_writer_at: remove,
            actions_per_op: 3, keys_per_entity: 8, ..WorkloadConfig::default()
        };
        let id = node();
        let w = generate(&cfg, id.public_key, id.kem_public);
        let causal: Vec<&Vec<u8>> = w.messages.iter().map(|m| &m.frame).collect();
        let mut a = run(&causal);
        let ra = report(&mut a, &w.scope);
        if remove.is_none_or(|r| r >= data_ops) {
            prop_assert_eq!(ra.applied.len(), w.messages.iter().filter(|m| m.id != [0; 32]).count());
            prop_assert_eq!(ra.root, w.final_root);
            prop_assert!(ra.dropped.is_empty());
            prop_assert_eq!(a.stats.divergences, 0);
            prop_assert_eq!(&ra.data_heads, &{ let mut h = w.data_heads.clone(); h.sort(); h });
        }
        // A permutation with duplicates.
        let order = dagfold::workload::shuffle_within_windows(causal.len(), causal.len(), perm_seed);
        let mut shuffled: Vec<&Vec<u8>> = order.iter().map(|i| causal[*i]).collect();
        let dups: Vec<&Vec<u8>> = shuffled.iter().step_by(dup_every).copied().collect();
        for (k, d) in dups.into_iter().enumerate() {
            let at = (k * 7919) % (shuffled.len() + 1);
            shuffled.insert(at, d);
        }
        let mut b = run(&shuffled);
        let rb = report(&mut b, &w.scope);
        prop_assert_eq!(ra, rb);
    }

    #[test]
    fn incremental_root_equals_reference(paths in proptest::collection::vec(any::<[u8; 32]>(), 0..200), updates in proptest::collection::vec((any::<usize>(), any::<[u8; 32]>()), 0..50)) {
        let mut smt = dagfold::core::smt::Smt::new();
        let mut cells: Vec<([u8; 32], [u8; 32])> = Vec::new();
        let mut ids = Vec::new();
        for p in paths {
            if cells.iter().any(|(q, _)| *q == p) { continue; }
            let leaf = dagfold::protocol::crypto::sha256(&p);
            ids.push(smt.insert(p, leaf));
            cells.push((p, leaf));
        }
        for (i, h) in updates {
            if ids.is_empty() { break; }
            let i = i % ids.len();
            smt.update(ids[i], h);
            cells[i].1 = h;
        }
        prop_assert_eq!(smt.root(), dagfold::core::smt::reference_root(&mut cells));
    }
}
