//! The `--metrics` report of a finished run: what the VM's shared state counted, plus the
//! irqchip's own part ([`IrqChip::report`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use devices::serial::SerialCounters;

use crate::irqchip::IrqChip;
use crate::metrics::RunReport;
use crate::state::{lock, StopReason, VmShared};

/// Host-side facts read while every thread still existed.
pub struct HostFacts {
    /// Each lull thread's wake-ups and CPU time.
    pub threads: Vec<crate::host_stats::ThreadStat>,
    /// KVM's own counters.
    pub kvm: Option<std::collections::BTreeMap<String, u64>>,
}

/// Reads the host's view of the run (call before the vCPU threads are stopped).
pub fn host_facts(shared: &VmShared) -> HostFacts {
    HostFacts {
        threads: crate::host_stats::thread_stats(&lock(&shared.ended_threads)),
        kvm: shared.kvm_counters(),
    }
}

/// The report of a run that ended for `reason`.
pub fn build(
    reason: &StopReason,
    shared: &VmShared,
    chip: &dyn IrqChip,
    serial: &SerialCounters,
    host: HostFacts,
) -> RunReport {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let mut report = RunReport {
        stop_reason: reason.to_string(),
        run_time_ms: ms(shared.started.elapsed()),
        boot_time_ms: shared.booted.get().map(|d| ms(*d)),
        serial_bytes_out: serial.bytes_out.load(Ordering::Relaxed),
        unknown_port_accesses: shared.noise.unknown_port.count(),
        unknown_mmio_accesses: shared.noise.unknown_mmio.count(),
        irqchip: chip.name().to_string(),
        vcpus: (0u32..)
            .zip(&shared.vcpu_counters)
            .map(|(i, c)| c.snapshot(i))
            .collect(),
        threads: host.threads,
        kvm: host.kvm,
        ..RunReport::default()
    };
    chip.report(&mut report);
    report
}
