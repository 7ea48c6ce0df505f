//! Arbitrary bytes as one wire frame's content: `decode_frame`,
//! `NodeMessage::decode` and the engine never panic; what decodes
//! re-encodes to exactly the input (`dagfold_fuzz::checks::check_frame`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dagfold_fuzz::checks::check_frame(data);
});
