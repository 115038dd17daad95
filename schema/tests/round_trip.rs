//! Reports lull wrote (before the types moved here) read into [`RunReport`] and written back
//! give the same bytes: same keys, same order, same nulls.

use std::path::Path;

use lull_schema::RunReport;

/// `lull run --metrics` writes `to_string_pretty` and a newline.
fn round_trip(name: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reports")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("the stored report is readable");
    let report: RunReport = serde_json::from_str(&text).expect("lull's report parses");
    let again = serde_json::to_string_pretty(&report).expect("serializes") + "\n";
    assert_eq!(again, text, "{name}");
}

/// `--irqchip user` with idle injection, a CPU quota, global timers and a rate-limited disk.
#[test]
fn user_irqchip_with_idle_work_and_a_disk() {
    round_trip("user-idle-disk.json");
}

/// `--irqchip kernel`: the user irqchip's parts are null.
#[test]
fn kernel_irqchip() {
    round_trip("kernel.json");
}

/// A virtio-net device: its counters flattened into its `nets` entry.
#[test]
fn a_net() {
    round_trip("user-net.json");
}

/// A report without a key (an older lull's) reads, the key as its default.
#[test]
fn a_missing_key_reads_as_its_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reports/user-net.json");
    let text = std::fs::read_to_string(path).expect("the stored report is readable");
    let full: RunReport = serde_json::from_str(&text).expect("lull's report parses");
    assert_ne!(full.serial_bytes_out, 0);
    assert_ne!(full.vcpus[0].io_out, 0);
    assert_ne!(full.nets[0].tap, "");
    let cut = text
        .replacen("\"serial_bytes_out\"", "\"serial_bytes_outx\"", 1)
        .replacen("\"io_out\"", "\"io_outx\"", 1)
        .replacen("\"tap\"", "\"tapx\"", 1);
    let read: RunReport = serde_json::from_str(&cut).expect("a report without a key reads");
    assert_eq!(read.serial_bytes_out, 0);
    assert_eq!(read.vcpus[0].io_out, 0);
    assert_eq!(read.vcpus[0].io_in, full.vcpus[0].io_in);
    assert_eq!(read.nets[0].tap, "");
    assert_eq!(read.nets[0].mac, full.nets[0].mac);
    assert_eq!(read.threads, full.threads);
}
