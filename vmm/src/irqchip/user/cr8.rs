//! CR8 and the TPR are one register (SDM vol. 3, 11.8.6.1): CR8[3:0] = TPR[7:4]. Without an
//! in-kernel LAPIC, KVM keeps the guest's CR8 in `kvm_run.cr8`, so lull's LAPIC and that field
//! are kept equal at every crossing:
//!
//! ```text
//!  KVM_RUN returns ─► Lapic::sync_cr8(kvm_run.cr8)   the guest's MOV CR8 since the entry
//!                     (before the exit is handled: a TPR read right after MOV CR8 sees it)
//!  exit handled    ─► TPR writes through MMIO / x2APIC MSR change the LAPIC only
//!  before entry    ─► kvm_run.cr8 = Lapic::cr8()      KVM loads it at every entry
//!  KVM_EXIT_SET_TPR   the guest lowered CR8 (KVM's VMX/SVM CR8 intercept): the sync above,
//!                     then the entry injects what the new priority lets in
//! ```
//!
//! Host limit: KVM raises `KVM_EXIT_SET_TPR` only from the hardware CR8 intercepts, never for
//! a MOV CR8 its own emulator runs, which on PVM hosts is all guest CPL0 code. There an
//! interrupt held by TPR alone would wait for the guest's next exit, however long. So while one
//! is held ([`devices::lapic::Lapic::held_by_tpr`]) and the vCPU runs, [`TprPoll`] keeps a
//! pinned timer [`TPR_POLL_NS`] ahead whose only effect is an exit: a lowered CR8 is seen
//! within that time, at the cost of at most one exit per period and only while something is
//! held. An interrupt-window request is no substitute: where the CPU virtualizes (VMX/SVM),
//! KVM opens the window at the first instruction with IF=1, so every entry would exit at once
//! while the interrupt stays held (an exit storm; there KVM reports the CR8 write anyway); on
//! PVM it comes only when KVM next leaves its emulator, with no bound on the wait.

use timer::{CpuTimers, Nanos, TimerHandle, TimerKind};

use crate::idle::vcpu_timer::VcpuTimer;

/// How long an interrupt held by TPR alone may wait for a CR8 write KVM does not report.
pub const TPR_POLL_NS: Nanos = 1_000_000;

/// The pinned timer that makes a vCPU exit while an interrupt is held by TPR.
#[derive(Debug, Default)]
pub struct TprPoll {
    armed: Option<(TimerHandle, Nanos)>,
}

impl TprPoll {
    /// Before an entry at `now`: arms the poll if an interrupt is `held` by TPR and none is
    /// armed, cancels it if nothing is held. True if it armed one (program the host tick).
    pub fn before_entry(
        &mut self,
        held: bool,
        now: Nanos,
        timers: &mut dyn CpuTimers<VcpuTimer>,
    ) -> bool {
        if !held {
            self.cancel(timers);
            return false;
        }
        if self.armed.is_some() {
            return false;
        }
        let deadline = now + TPR_POLL_NS;
        let h = timers.arm(TimerKind::Pinned, deadline, VcpuTimer::TprPoll);
        self.armed = Some((h, deadline));
        true
    }

    /// Forgets the poll if it fired by `now` (its handle is stale).
    pub fn fired(&mut self, now: Nanos) {
        if self.armed.is_some_and(|(_, d)| d <= now) {
            self.armed = None;
        }
    }

    /// Cancels the poll (HLT: a halted vCPU cannot write CR8).
    pub fn cancel(&mut self, timers: &mut dyn CpuTimers<VcpuTimer>) {
        if let Some((h, _)) = self.armed.take() {
            timers.cancel(h);
        }
    }

    /// Whether a poll is armed.
    pub fn is_armed(&self) -> bool {
        self.armed.is_some()
    }
}
