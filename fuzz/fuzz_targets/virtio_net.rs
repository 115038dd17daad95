//! cargo-fuzz target: see `lull_fuzz::virtio_net`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lull_fuzz::virtio_net::run(data));
