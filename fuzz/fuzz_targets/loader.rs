//! cargo-fuzz target: see `lull_fuzz::loader`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lull_fuzz::loader::run(data));
