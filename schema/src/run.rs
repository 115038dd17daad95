//! The report of a run (`--metrics`, `vm.counters`) and the parts of it that are not a
//! vCPU's, a net's or the timer model's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{NetReport, TimerMetrics, VcpuReadout};

/// The JSON written to `--metrics` at exit. Field names are stable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunReport {
    /// lull's exit status.
    pub exit_status: i32,
    /// Why the run ended, in words.
    pub stop_reason: String,
    /// Milliseconds from lull's start to the end of the run.
    pub run_time_ms: u64,
    /// Milliseconds from lull's start to the guest's boot-complete marker, if it wrote one.
    pub boot_time_ms: Option<u64>,
    /// Bytes the guest wrote to its serial console.
    pub serial_bytes_out: u64,
    /// Accesses to unowned ports.
    pub unknown_port_accesses: u64,
    /// Accesses to unowned MMIO.
    pub unknown_mmio_accesses: u64,
    /// Accesses to unimplemented MSRs (#GP injected; user irqchip).
    pub unknown_msr_accesses: u64,
    /// LAPIC accesses that were ignored or faulted (user irqchip).
    pub lapic_invalid_accesses: u64,
    /// LAPIC timer deadlines clamped to the minimum (user irqchip).
    pub lapic_timer_clamps: u64,
    /// IPIs sent between vCPUs (user irqchip).
    pub ipis: u64,
    /// Device interrupts delivered through the IOAPIC (user irqchip).
    pub device_interrupts: u64,
    /// Interrupt controller model.
    pub irqchip: String,
    /// Timer model (user irqchip only).
    pub timer_model: Option<String>,
    /// Timer-model counters (user irqchip only).
    pub timers: Option<TimerMetrics>,
    /// Halt-polling mode (user irqchip).
    pub halt_poll: Option<String>,
    /// Timer advance mode (user irqchip).
    pub timer_advance: Option<String>,
    /// Timer slack of halted vCPUs' wake-ups, `off` or a duration (user irqchip; absent with
    /// the kernel irqchip and in reports of a lull before `--timer-slack`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timer_slack: Option<String>,
    /// Wake placement mode (user irqchip).
    pub wake_placement: Option<String>,
    /// Idle injection (user irqchip): setting and time all vCPUs were idle together in ns.
    pub idle_inject: Option<IdleInjectReport>,
    /// CPU quota (user irqchip).
    pub cpu_quota: Option<QuotaReport>,
    /// Global-timer load (user irqchip): setting and fires on the `central` timer thread.
    pub global_timers: Option<GlobalTimersReport>,
    /// Refill timers of rate-limited disks and nets: what expired them and what each did.
    pub device_timers: Option<DeviceTimersReport>,
    /// virtio-blk requests that failed (IOERR to the guest) because a disk's image file had
    /// shrunk under the VM below them.
    pub disk_shrunk_image_errors: u64,
    /// virtio-net devices, in `--net` order: frames and bytes each way, drops.
    pub nets: Vec<NetReport>,
    /// Per-vCPU exits.
    pub vcpus: Vec<VcpuReadout>,
    /// lull's threads: context switches (host wake-ups) and CPU time.
    pub threads: Vec<ThreadStat>,
    /// KVM's counters for this VM (all exits, in-kernel ones included), when debugfs is
    /// mounted.
    pub kvm: Option<BTreeMap<String, u64>>,
    /// Bytes of lull's own machine code backed by 2 MiB pages (`--huge-text`), as
    /// `/proc/self/smaps` shows them at the end of the run.
    pub text_on_huge_pages_bytes: u64,
}

/// Idle injection in the report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IdleInjectReport {
    /// The setting.
    pub config: String,
    /// Time during which every vCPU was idle (held or halted) with at least one held, ns.
    pub all_idle_together_ns: u64,
}

/// The global-timer load in the report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GlobalTimersReport {
    /// The setting.
    pub config: String,
    /// Global timers expired by the `central` model's timer thread.
    pub timer_thread_fires: u64,
}

/// Throttling by the CPU quota, as the report gives it (`cpu_quota`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct QuotaReport {
    /// The setting.
    pub config: String,
    /// Offset of period starts from the VM clock's zero, in ns.
    pub phase_ns: u64,
    /// Periods in which the VM was throttled.
    pub throttled_periods: u64,
    /// Time the VM spent throttled.
    pub throttled_ns: u64,
    /// Throttled intervals as CLOCK_MONOTONIC nanoseconds [start, end) (first 100000).
    pub intervals: Vec<(u64, u64)>,
}

/// The device timers in the report (`device_timers`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceTimersReport {
    /// `hierarchy` or `timerfd`.
    pub mode: String,
    /// Per device: the disks in `--disk` order, then the nets in `--net` order.
    pub devices: Vec<DeviceTimerReport>,
}

/// What one device's timer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceTimerReport {
    /// Refill timers asked for (requests held back by the rate limiter).
    pub requested: u64,
    /// Refill timers that fired.
    pub fired: u64,
    /// Fires that ran on the VMM thread (timerfd mode).
    pub vmm_thread_fires: u64,
}

/// One lull thread as the scheduler saw it (`threads`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ThreadStat {
    /// Thread name (`vcpu0`, `timers`, `lull`, ...).
    pub name: String,
    /// Times it blocked (each is one host wake-up later).
    pub voluntary_ctxt_switches: u64,
    /// Times it was preempted.
    pub nonvoluntary_ctxt_switches: u64,
    /// CPU time it consumed, in nanoseconds.
    pub cpu_ns: u64,
}
