//! cargo-fuzz target: see `lull_fuzz::serial`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lull_fuzz::serial::run(data));
