//! Structure-aware: a small generated scope, mutated by the fuzzer, through
//! `core::Engine` with commits to a `MemStore`, restarts and ticks
//! (`dagfold_fuzz::engine_input`, `dagfold_fuzz::checks::check_scenario`).
//!
//! With `DAGFOLD_FUZZ_SCENARIO_OUT=FILE` set, the concrete scenario is written
//! to FILE (text, `Scenario::to_text`) before it runs: this is how a crasher
//! becomes a file under `regressions/engine/` that no longer depends on the
//! `arbitrary` crate or on the workload generator.
#![no_main]

use dagfold_fuzz::engine_input::{build, EngineInput};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: EngineInput| {
    let sc = build(&input);
    if let Some(path) = std::env::var_os("DAGFOLD_FUZZ_SCENARIO_OUT") {
        std::fs::write(path, sc.to_text()).expect("writing the scenario");
    }
    dagfold_fuzz::checks::check_scenario(&sc);
});
