//! Structure-aware: a small generated scope, mutated by the fuzzer, through
//! `core::Engine` with commits to a `MemStore`, restarts and ticks
//! (`dagfold_fuzz::engine_input`, `dagfold_fuzz::checks::check_scenario`).
//!
//! With `DAGFOLD_FUZZ_SCENARIO_OUT=FILE` set, the concrete scenario is written
//! to FILE (text, `Scenario::to_text`) before it runs: this is how a crasher
//! becomes a file under `regressions/engine/` that no longer depends on the
//! `arbitrary` crate or on the workload generator. With
//! `DAGFOLD_FUZZ_TALLY=FILE`, one line of what each run reached (verdict
//! counters) is appended to FILE: `-runs=0` over the corpus then shows how
//! deep the corpus goes.
#![no_main]

use std::io::Write;

use dagfold_fuzz::engine_input::{build, EngineInput};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: EngineInput| {
    let sc = build(&input);
    if let Some(path) = std::env::var_os("DAGFOLD_FUZZ_SCENARIO_OUT") {
        std::fs::write(path, sc.to_text()).expect("writing the scenario");
    }
    let summary = dagfold_fuzz::checks::check_scenario(&sc);
    if let Some(path) = std::env::var_os("DAGFOLD_FUZZ_TALLY") {
        let s = &summary.stats;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("tally file");
        writeln!(
            f,
            "applied={} malformed={} bad_signature={} duplicates={} dropped={:?} pending={} key_wait={} data_key_wait={} key_timeouts={} evicted={} divergences={} keys_accepted={} keys_ignored={} restarts={} comparable={}",
            s.applied, s.malformed, s.bad_signature, s.duplicates, s.dropped, s.buffered_pending, s.buffered_key_wait,
            s.buffered_data_key_wait, s.key_timeouts, s.evicted, s.divergences, s.keys_accepted, s.keys_ignored,
            summary.restarts, summary.comparable
        )
        .expect("tally line");
    }
});
