//! cargo-fuzz target: see `lull_fuzz::timer_model`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lull_fuzz::timer_model::run(data));
