//! Shared code of the dagfold fuzz targets (`fuzz_targets/`).
//!
//! `checks` holds the invariants and depends on `dagfold` alone, so that
//! `tests/fuzz_regressions.rs` can replay kept crashers through it;
//! `engine_input` is the structure-aware input of the `engine` target.

pub mod checks;
pub mod engine_input;
