//! cargo-fuzz target: see `lull_fuzz::api`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lull_fuzz::api::run(data));
