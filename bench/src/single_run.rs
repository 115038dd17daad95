//! One VM of a kit guest in one mode, run to its end, its console in a file and lull's
//! `--metrics` beside it: what `timer-modes` and `latency` run once per mode and repetition.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lull_schema::RunReport;

use super::common::read_metrics;
use super::density::Mode;
use super::error::BenchError;
use super::fleet::{self, VmOutcome, VmSpec, Watch};

/// What to run.
pub(crate) struct SingleRun<'a> {
    /// The lull binary.
    pub lull: &'a Path,
    /// The guest ELF.
    pub guest: &'a Path,
    /// Where the run's files go: `STEM.console`, `STEM.json` (the metrics), `STEM.stderr`.
    pub stem: PathBuf,
    /// `lull run` flags besides the kernel, console, metrics and mode (`--cmdline ...`).
    pub flags: Vec<String>,
    /// The irqchip and timer model.
    pub mode: Mode,
    /// The VM has booted when its console contains this.
    pub boot_marker: &'a str,
    /// Kill it if it still runs after this long.
    pub deadline: Duration,
    /// About how long it should take (the progress bar's length).
    pub expected: Duration,
    /// Label for progress lines.
    pub label: String,
}

/// Runs it: the VM's outcome, and lull's metrics (`None` if it wrote none that parse).
pub(crate) fn run(r: SingleRun) -> Result<(VmOutcome, Option<RunReport>), BenchError> {
    let serial = r.stem.with_extension("console");
    let metrics = r.stem.with_extension("json");
    let _ = std::fs::remove_file(&serial);
    let _ = std::fs::remove_file(&metrics);
    let mut c = std::process::Command::new(r.lull);
    c.arg("run")
        .arg("--kernel")
        .arg(r.guest)
        .args(&r.flags)
        .arg("--serial")
        .arg(format!("file={}", serial.display()))
        .arg("--metrics")
        .arg(&metrics)
        .args(r.mode.lull_args());
    let watch = Watch {
        boot_marker: r.boot_marker.into(),
        end_markers: Vec::new(),
        guest_bytes: 64 << 20,
        deadline: r.deadline,
        settle: Duration::ZERO,
        planned: None,
        stagger: false,
        label: r.label,
        expected: r.expected,
    };
    let spec = VmSpec {
        command: c,
        serial,
        stderr: r.stem.with_extension("stderr"),
        api: None,
        restore: None,
    };
    let vm = fleet::run(vec![spec], &watch)?.vms.remove(0);
    Ok((vm, read_metrics(&metrics)))
}

/// Why a VM failed, for a row's failures: its status and the last line it or lull printed.
pub(crate) fn failure(what: &str, vm: &VmOutcome) -> String {
    let last = vm.console.lines().chain(vm.stderr.lines()).last();
    format!("{what}: status {:?}: {}", vm.code, last.unwrap_or(""))
}
