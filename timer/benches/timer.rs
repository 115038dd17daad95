//! Timer benchmarks (filled in below).
fn main() {}
