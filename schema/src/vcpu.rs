//! One vCPU in the report (`vcpus`): its exits, its wake-ups by cause, wake placement's work.

use serde::{Deserialize, Serialize};

/// One vCPU's exits, wake-ups and idle work (the report's `vcpus`; lull's `VcpuCounters`
/// read at one moment).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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
    /// Short LAPIC deadlines armed with interrupts off whose host tick lull deferred to the
    /// guest's next exit (`vmm/src/irqchip/user/lapic_timer_host/tick_defer.rs`; user irqchip).
    pub ticks_deferred: u64,
    /// Deferred host ticks that fired because the guest ran on without an exit.
    pub ticks_deferred_missed: u64,
    /// Deferred host ticks that fired while the guest still had interrupts off, or had halted
    /// only after them: late, but the guest could not have taken the interrupt sooner.
    pub ticks_deferred_late: u64,
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
    /// The part of each lateness past the end of its wake-up's range (`--timer-slack`; with
    /// slack off, all of it): the host's delay, in the buckets of `lateness_us_log2` (absent
    /// in reports of a lull before `--timer-slack`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub late_past_range_us_log2: Vec<u64>,
    /// Wake-ups from a block that served more than one timer expiry (own or global; absent
    /// in reports of a lull before `--timer-slack`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_multi_expiry: Option<u64>,
    /// Expiries served by a wake-up from a block beyond its first (k expiries count k - 1):
    /// the host wake-ups the VM's coalescing saved (absent in reports of a lull before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_coalesced: Option<u64>,
}

/// Wake placement's counters of one vCPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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

impl WakeupSnapshot {
    /// Each cause with its count, named as its JSON key.
    pub fn by_cause(&self) -> [(&'static str, u64); 5] {
        [
            ("timer", self.timer),
            ("interrupt", self.interrupt),
            ("control", self.control),
            ("other", self.other),
            ("global_timer", self.global_timer),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_named_as_their_keys() {
        let w = WakeupSnapshot {
            timer: 1,
            interrupt: 2,
            control: 3,
            other: 4,
            global_timer: 5,
        };
        let json = serde_json::to_value(&w).expect("serializes");
        let keys: Vec<&str> = json
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut named: Vec<&str> = w.by_cause().iter().map(|(k, _)| *k).collect();
        named.sort_unstable();
        assert_eq!(keys, named);
        for (cause, n) in w.by_cause() {
            assert_eq!(json[cause], n, "{cause}");
        }
    }
}
