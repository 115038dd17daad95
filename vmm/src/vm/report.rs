//! The `--metrics` report of a finished run: what the VM's shared state counted, plus the
//! irqchip's own part ([`crate::irqchip::IrqChip::report`]); the same report of a running VM
//! ([`live`]); and writing it as JSON.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use timer::lock;

use super::live::LiveVm;
use crate::metrics::RunReport;
use crate::state::StopReason;

/// The `stop_reason` of a report taken while the VM runs.
pub const RUNNING: &str = "running";

/// Host-side facts read while every thread still existed.
pub struct HostFacts {
    /// Each lull thread's wake-ups and CPU time.
    pub threads: Vec<crate::host::stats::ThreadStat>,
    /// KVM's own counters.
    pub kvm: Option<BTreeMap<String, u64>>,
    /// Bytes of lull's own code on 2 MiB pages.
    pub text_on_huge_pages: u64,
}

/// Reads the host's view of the run of `vm` (call before the vCPU threads are stopped).
pub fn host_facts(vm: &LiveVm) -> HostFacts {
    HostFacts {
        threads: crate::host::stats::thread_stats(&lock(&vm.shared.ended_threads)),
        kvm: vm.stats.kvm_counters(),
        text_on_huge_pages: crate::host::sys::huge_text::own_text_on_huge_pages(),
    }
}

/// The report of a run of `vm` that ended for `reason`.
pub fn build(reason: &StopReason, vm: &LiveVm, host: HostFacts) -> RunReport {
    assemble(reason.to_string(), vm, host)
}

/// The report of a VM that is still running: its counters so far, KVM's counters, and the
/// threads that already ended (none, usually).
pub fn live(vm: &LiveVm) -> RunReport {
    let host = host_facts(vm);
    assemble(RUNNING.to_string(), vm, host)
}

fn assemble(stop_reason: String, vm: &LiveVm, host: HostFacts) -> RunReport {
    let (shared, chip, serial) = (&vm.shared, vm.chip.as_ref(), &vm.serial);
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let mut report = RunReport {
        stop_reason,
        run_time_ms: ms(shared.started.elapsed()),
        boot_time_ms: shared.booted.get().map(|d| ms(*d)),
        serial_bytes_out: serial.bytes_out.load(Ordering::Relaxed),
        unknown_port_accesses: vm.buses.noise.unknown_port.count(),
        unknown_mmio_accesses: vm.buses.noise.unknown_mmio.count(),
        irqchip: chip.name().to_string(),
        vcpus: shared.vcpu_counters.iter().map(|c| c.read()).collect(),
        threads: host.threads,
        kvm: host.kvm,
        text_on_huge_pages_bytes: host.text_on_huge_pages,
        device_timers: shared.device_timers.summary(),
        nets: vm.stats.nets.iter().map(|n| n.report()).collect(),
        disk_shrunk_image_errors: super::disks::shrink_error_total(&vm.stats.disk_shrink_errors),
        ..RunReport::default()
    };
    chip.report(&mut report);
    report
}

/// Writes `report` as pretty JSON to `path` (`-`: standard error), as `--metrics` asks.
pub fn write_json(report: &RunReport, path: &Path) -> std::io::Result<()> {
    let json = serde_json::to_string_pretty(report).map_err(std::io::Error::other)? + "\n";
    if path.as_os_str() == "-" {
        std::io::Write::write_all(&mut std::io::stderr(), json.as_bytes())
    } else {
        let mut file =
            crate::host::files::open_output(path, crate::host::files::OutputMode::Replace)?;
        std::io::Write::write_all(&mut file, json.as_bytes())
    }
}
