//! The `lull` command.
fn main() {}
