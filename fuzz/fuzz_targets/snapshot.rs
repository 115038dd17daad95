//! cargo-fuzz target: see `lull_fuzz::snapshot`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lull_fuzz::snapshot::run(data));
