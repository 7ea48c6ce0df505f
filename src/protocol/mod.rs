//! The SPEC types, codec, hashing, signing, sealing. Pure functions only.
pub mod codec;
pub mod crypto;
pub mod node;
pub mod edwards_lanes;
pub mod idhash;
pub mod sha512_lanes;
pub mod sha_lanes;
pub mod sig;
pub mod types;

pub use codec::DecodeError;
pub use types::*;
