//! cargo-fuzz target: see `lull_fuzz::cli`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lull_fuzz::cli::run(data));
