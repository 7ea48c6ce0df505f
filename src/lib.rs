//! dagfold: a server node for replicated, end-to-end encrypted group state.
//!
//! See `docs/ARCHITECTURE.md` for the bird's-eye view and the code map.

#[cfg(feature = "rocksdb-store")]
pub mod api;
pub mod clock;
#[cfg(feature = "rocksdb-store")]
pub mod cli;
#[cfg(feature = "rocksdb-store")]
pub mod client;
#[cfg(feature = "rocksdb-store")]
pub mod client_commands;
pub mod core;
pub mod durable;
pub mod idle;
#[cfg(feature = "rocksdb-store")]
pub mod export;
pub mod limits;
pub mod net;
pub mod niceness;
#[cfg(feature = "rocksdb-store")]
pub mod node;
pub mod peering;
pub mod pipeline;
pub mod protocol;
pub mod store;
// Test-only code (the `testkit` feature, which tests, benches and tools turn
// on): the shipped library holds only the node.
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
// The seeded multi-node simulation (`tests/sim.rs`, `dagfold-campaign sim`).
#[cfg(any(test, feature = "testkit"))]
pub mod sim;
#[cfg(any(test, feature = "testkit"))]
pub mod workload;
