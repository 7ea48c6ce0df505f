//! The seeded multi-node simulation (`dagfold::sim`): a fixed list of seeds,
//! each a run of 3 to 5 nodes with dropped, delayed, duplicated and
//! reordered messages, partitions (asymmetric too), crashes, store faults
//! and skewed clocks, that must converge (docs/RELIABILITY.md, "Simulation").
//! A failure prints its seed and the command that replays it; the campaign
//! (`dagfold-campaign sim --seeds N --from S`) runs thousands.

/// The suite's seeds: 0..SEEDS (release, 2 cores: see docs/RELIABILITY.md).
const SEEDS: u64 = 1000;


#[test]
fn seeds() {
    let mut total = dagfold::sim::SimStats::default();
    for seed in 0..SEEDS {
        match std::panic::catch_unwind(|| dagfold::sim::run(seed)) {
            Ok(Ok(stats)) => total.add(&stats),
            Ok(Err(f)) => panic!("{f}"),
            Err(_) => panic!("simulation seed {seed} panicked\nreplay: {}", dagfold::sim::replay_command(seed)),
        }
    }
    // The faults landed: a suite that injects nothing tests nothing.
    assert!(total.dropped > 0 && total.duplicated > 0 && total.cut > 0, "{total:?}");
    assert!(total.partitions > 0 && total.asymmetric_cuts > 0, "{total:?}");
    assert!(total.crashes > 0 && total.store_faults > 0 && total.cold_reads > 0, "{total:?}");
    eprintln!("{total:?}");
}

/// Seeds beyond the suite's that a campaign found failing, each kept once
/// fixed: 128,717 (2026-12-06, seeds 100,000..200,000): a data op durably
/// pending, woken into a key wait, forgotten at its deadline (its records
/// deleted), then sent again and applied in memory when the node crashed;
/// the simulator still counted it as durably buffered. The check's fault,
/// not the node's: a commit that deletes an op's record now ends its keep.
#[test]
fn seeds_a_campaign_found() {
    for seed in [128_717] {
        if let Err(f) = dagfold::sim::run(seed) {
            panic!("{f}");
        }
    }
}

/// `DAGFOLD_SIM_SEED=N cargo test --release --test sim replay -- --nocapture`
/// runs seed N alone (the command a failure prints).
#[test]
fn replay() {
    let Ok(seed) = std::env::var("DAGFOLD_SIM_SEED") else { return };
    let seed: u64 = seed.parse().expect("DAGFOLD_SIM_SEED is a u64");
    eprintln!("{:?}", dagfold::sim::SimConfig::from_seed(seed));
    match dagfold::sim::run(seed) {
        Ok(stats) => eprintln!("seed {seed} passed: {stats:?}"),
        Err(f) => panic!("{f}"),
    }
}

/// The same seed gives the same run, to the message.
#[test]
fn one_seed_runs_the_same_twice() {
    let a = dagfold::sim::run(3).expect("seed 3");
    let b = dagfold::sim::run(3).expect("seed 3");
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}
