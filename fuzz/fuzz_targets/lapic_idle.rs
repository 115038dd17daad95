//! cargo-fuzz target: see `lull_fuzz::lapic::run_idle`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lull_fuzz::lapic::run_idle(data));
