//! Replays the inputs saved in `fuzz/regressions/<target>/` through each target's driver as
//! an ordinary test (no libFuzzer, no sanitizer; `cargo test` in `fuzz/`, part of `make
//! test`). A driver panics when an invariant breaks, so an input that once crashed a target
//! or broke an invariant fails here again if the bug comes back. Each directory also holds
//! a few seeds from fuzzing runs, so every driver's checks run on every `make test`.
//!
//! To keep a crash: copy `fuzz/artifacts/<target>/crash-*` into `fuzz/regressions/<target>/`.

use std::fs;
use std::path::PathBuf;

/// A target's driver: runs one input, panics when an invariant breaks.
type Driver = fn(&[u8]);

/// Runs every saved input of `target` through `run`; there must be at least one.
fn replay(target: &str, run: Driver) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target);
    let entries =
        fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    let mut inputs: Vec<PathBuf> = entries
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    inputs.retain(|p| p.is_file());
    inputs.sort();
    assert!(!inputs.is_empty(), "no saved inputs in {}", dir.display());
    for path in inputs {
        let data =
            fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        // Printed only when the test fails: the input that broke the driver.
        eprintln!("replaying {}", path.display());
        run(&data);
    }
}

/// Every target's driver, by the name of its `fuzz_targets/` file.
const TARGETS: [(&str, Driver); 11] = [
    ("lapic", lull_fuzz::lapic::run),
    ("lapic_idle", lull_fuzz::lapic::run_idle),
    ("ioapic", lull_fuzz::ioapic::run),
    ("serial", lull_fuzz::serial::run),
    ("timer", lull_fuzz::timer_model::run),
    ("loader", lull_fuzz::loader::run),
    ("cli", lull_fuzz::cli::run),
    ("api", lull_fuzz::api::run),
    ("virtio_blk", lull_fuzz::virtio_blk::run),
    ("virtio_net", lull_fuzz::virtio_net::run),
    ("snapshot", lull_fuzz::snapshot::run),
];

#[test]
fn saved_inputs_keep_every_invariant() {
    for (target, run) in TARGETS {
        replay(target, run);
    }
}
