//! Counters lull keeps while a VM runs and the JSON it writes at exit (`--metrics`).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::ratelimit::LogLimiter;

pub use crate::state::counters::{VcpuCounters, LATENESS_BUCKETS};

/// Snapshot of [`VcpuCounters`].
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VcpuSnapshot {
    /// vCPU index.
    pub vcpu: u32,
    /// Port reads.
    pub io_in: u64,
    /// Port writes.
    pub io_out: u64,
    /// MMIO reads.
    pub mmio_read: u64,
    /// MMIO writes.
    pub mmio_write: u64,
    /// HLT exits.
    pub hlt: u64,
    /// Interrupted runs.
    pub interrupted: u64,
    /// Other exits.
    pub other: u64,
    /// MSR exits.
    pub msr: u64,
    /// Interrupt-window exits.
    pub irq_window: u64,
    /// Interrupts injected by lull.
    pub injected: u64,
    /// EOIs signalled through the PV EOI flag (no exit).
    pub pv_eois: u64,
    /// TSC deadlines armed through the PV deadline slot (no WRMSR exit).
    pub pv_deadlines: u64,
    /// Blocks in HLT.
    pub blocks: u64,
    /// Wake-ups by cause.
    pub wakeups: WakeupSnapshot,
    /// LAPIC timer expiries handled.
    pub lapic_timer_fires: u64,
    /// The learned timer advance at the end, ns.
    pub timer_advance_ns: u64,
    /// Time spent waiting for LAPIC deadlines after an advanced host timer, ns.
    pub advance_wait_ns: u64,
    /// Time from each KVM_RUN's return to the next, less `blocked_ns`: lull's own handling of
    /// the exits, ns.
    pub exit_handling_ns: u64,
    /// Time asleep in the wait for a wake-up (user irqchip), ns.
    pub blocked_ns: u64,
    /// Global timers this vCPU's thread expired (its own and, as a migrator, others').
    pub global_timer_fires: u64,
    /// Wake-ups on another host CPU than their block began on (user irqchip).
    pub wake_migrations: u64,
    /// Wake placement: blocks bound to their host CPU, bound wake-ups that moved anyway, and
    /// back-offs after a late bound wake-up.
    pub placement: PlacementSnapshot,
    /// Halt polls started.
    pub polls: u64,
    /// Halt polls that saw the wake-up.
    pub polls_won: u64,
    /// Halt polls that did not.
    pub polls_lost: u64,
    /// Time spent polling, ns.
    pub poll_ns: u64,
    /// Time held idle by idle injection, ns.
    pub injected_idle_ns: u64,
    /// Time held by the CPU quota, ns.
    pub throttled_ns: u64,
    /// Lateness histogram: bucket i counts [2^i, 2^(i+1)) us.
    pub lateness_us_log2: Vec<u64>,
}

/// Wake placement's counters of one vCPU.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PlacementSnapshot {
    /// Blocks for which the thread was bound to its host CPU.
    pub binds: u64,
    /// Bound wake-ups that came on another CPU anyway.
    pub bound_migrations: u64,
    /// Back-offs after a late bound wake-up.
    pub backoffs: u64,
    /// Own-timer wake-ups while bound.
    pub bound_wakes: u64,
    /// Their summed lateness behind the expected wake-up, ns.
    pub bound_late_ns: u64,
    /// Own-timer wake-ups while not bound (either mode).
    pub free_wakes: u64,
    /// Their summed lateness, ns.
    pub free_late_ns: u64,
}

/// Wake-ups of a blocked vCPU by cause.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WakeupSnapshot {
    /// Its own timer.
    pub timer: u64,
    /// An interrupt (IPI or device).
    pub interrupt: u64,
    /// VM control.
    pub control: u64,
    /// Nothing to do.
    pub other: u64,
    /// A global timer of its own base (never in `pull` while another vCPU runs).
    pub global_timer: u64,
}

impl VcpuCounters {
    /// A snapshot for vCPU `vcpu`.
    pub fn snapshot(&self, vcpu: u32) -> VcpuSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        VcpuSnapshot {
            vcpu,
            io_in: g(&self.io_in),
            io_out: g(&self.io_out),
            mmio_read: g(&self.mmio_read),
            mmio_write: g(&self.mmio_write),
            hlt: g(&self.hlt),
            interrupted: g(&self.interrupted),
            other: g(&self.other),
            msr: g(&self.msr),
            irq_window: g(&self.irq_window),
            injected: g(&self.injected),
            pv_eois: g(&self.pv_eois),
            pv_deadlines: g(&self.pv_deadlines),
            blocks: g(&self.blocks),
            wakeups: WakeupSnapshot {
                timer: g(&self.wake_timer),
                interrupt: g(&self.wake_interrupt),
                control: g(&self.wake_control),
                other: g(&self.wake_other),
                global_timer: g(&self.wake_global_timer),
            },
            lapic_timer_fires: g(&self.lapic_timer_fires),
            timer_advance_ns: g(&self.timer_advance_ns),
            advance_wait_ns: g(&self.advance_wait_ns),
            exit_handling_ns: g(&self.exit_handling_ns),
            blocked_ns: g(&self.blocked_ns),
            global_timer_fires: g(&self.global_timer_fires),
            wake_migrations: g(&self.wake_migrations),
            placement: PlacementSnapshot {
                binds: g(&self.placement_binds),
                bound_migrations: g(&self.placement_bound_migrations),
                backoffs: g(&self.placement_backoffs),
                bound_wakes: g(&self.placement_bound_wakes),
                bound_late_ns: g(&self.placement_bound_late_ns),
                free_wakes: g(&self.placement_free_wakes),
                free_late_ns: g(&self.placement_free_late_ns),
            },
            polls: g(&self.polls),
            polls_won: g(&self.polls_won),
            polls_lost: g(&self.polls).saturating_sub(g(&self.polls_won)),
            poll_ns: g(&self.poll_ns),
            injected_idle_ns: g(&self.injected_idle_ns),
            throttled_ns: g(&self.throttled_ns),
            lateness_us_log2: self.lateness_us_log2.iter().map(g).collect(),
        }
    }
}

/// VM-wide counters of guest behaviour that lull ignores.
#[derive(Debug, Default)]
pub struct GuestNoise {
    /// Accesses to ports no device owns.
    pub unknown_port: LogLimiter,
    /// Accesses to MMIO addresses no device owns.
    pub unknown_mmio: LogLimiter,
}

/// Guest misbehaviour at its LAPICs, counted and logged rate-limited.
#[derive(Debug, Default)]
pub struct LapicNoise {
    /// Ignored or faulting accesses.
    pub invalid_access: LogLimiter,
    /// Vectors below 16.
    pub illegal_vector: LogLimiter,
    /// Timer deadlines pushed out to the minimum period.
    pub timer_clamped: LogLimiter,
    /// Delivery modes lull does not deliver.
    pub unsupported_delivery_mode: LogLimiter,
}

impl devices::lapic::LapicEvents for LapicNoise {
    fn invalid_access(&self, access: devices::lapic::InvalidAccess) {
        if let Some(n) = self.invalid_access.hit() {
            tracing::warn!("guest LAPIC access ignored or faulted: {access:?} ({n} so far)");
        }
    }
    fn illegal_vector(&self, vector: u8) {
        if let Some(n) = self.illegal_vector.hit() {
            tracing::warn!("guest used illegal interrupt vector {vector} ({n} so far)");
        }
    }
    fn timer_clamped(&self, requested_ns: u64, clamped_ns: u64) {
        if let Some(n) = self.timer_clamped.hit() {
            tracing::warn!(
                "guest LAPIC timer of {requested_ns} ns clamped to {clamped_ns} ns ({n} so far)"
            );
        }
    }
    fn unsupported_delivery_mode(&self, mode: u8) {
        if let Some(n) = self.unsupported_delivery_mode.hit() {
            tracing::warn!("guest IPI delivery mode {mode} not delivered ({n} so far)");
        }
    }
}

/// The JSON written to `--metrics` at exit. Field names are stable.
#[derive(Debug, Clone, Default, Serialize)]
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
    pub timers: Option<timer::MetricsSnapshot>,
    /// Halt-polling mode (user irqchip).
    pub halt_poll: Option<String>,
    /// Timer advance mode (user irqchip).
    pub timer_advance: Option<String>,
    /// Wake placement mode (user irqchip).
    pub wake_placement: Option<String>,
    /// Idle injection (user irqchip): setting and time all vCPUs were idle together in ns.
    pub idle_inject: Option<IdleInjectReport>,
    /// CPU quota (user irqchip).
    pub cpu_quota: Option<crate::idle::quota::QuotaReport>,
    /// Global-timer load (user irqchip): setting and fires on the `central` timer thread.
    pub global_timers: Option<GlobalTimersReport>,
    /// Refill timers of rate-limited disks and nets: what expired them and what each did.
    pub device_timers: Option<crate::state::device_timers::DeviceTimersReport>,
    /// virtio-blk requests that failed (IOERR to the guest) because a disk's image file had
    /// shrunk under the VM below them.
    pub disk_shrunk_image_errors: u64,
    /// virtio-net devices, in `--net` order: frames and bytes each way, drops.
    pub nets: Vec<crate::state::net_port::NetReport>,
    /// Per-vCPU exits.
    pub vcpus: Vec<VcpuSnapshot>,
    /// lull's threads: context switches (host wake-ups) and CPU time.
    pub threads: Vec<crate::host::stats::ThreadStat>,
    /// KVM's counters for this VM (all exits, in-kernel ones included), when debugfs is
    /// mounted.
    pub kvm: Option<std::collections::BTreeMap<String, u64>>,
    /// Bytes of lull's own machine code backed by 2 MiB pages (`--huge-text`), as
    /// `/proc/self/smaps` shows them at the end of the run.
    pub text_on_huge_pages_bytes: u64,
}

/// Idle injection in the report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct IdleInjectReport {
    /// The setting.
    pub config: String,
    /// Time during which every vCPU was idle (held or halted) with at least one held, ns.
    pub all_idle_together_ns: u64,
}

/// The global-timer load in the report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct GlobalTimersReport {
    /// The setting.
    pub config: String,
    /// Global timers expired by the `central` model's timer thread.
    pub timer_thread_fires: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_lands_in_log2_buckets() {
        let c = VcpuCounters::default();
        for ns in [0, 999, 1_000, 3_000, 1_000_000, u64::MAX] {
            c.record_lateness(ns);
        }
        let s = c.snapshot(0);
        assert_eq!(s.lateness_us_log2[0], 3); // 0, 999 ns, 1 us
        assert_eq!(s.lateness_us_log2[1], 1); // 3 us
        assert_eq!(s.lateness_us_log2[9], 1); // 1 ms = 1000 us, in [512, 1024)
        assert_eq!(s.lateness_us_log2[19], 1); // everything from ~0.5 s on
        assert_eq!(s.lapic_timer_fires, 6);
    }
}
