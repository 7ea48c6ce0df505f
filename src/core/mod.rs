//! The sans-IO core: verdicts, governance at a cut, buffers, fold, root.
pub mod engine;
pub mod governance;
pub mod projection;
pub mod smt;

pub use engine::*;
