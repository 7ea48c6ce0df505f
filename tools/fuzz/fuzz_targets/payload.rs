//! Arbitrary bytes as a governance payload, a data payload and a cell:
//! strict decoding round-trips (`dagfold_fuzz::checks::check_payload`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dagfold_fuzz::checks::check_payload(data);
});
