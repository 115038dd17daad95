//! The user-space irqchip (`--irqchip user`): how vCPU threads, the IOAPIC and timers hand
//! each other interrupts without KVM's in-kernel LAPIC.
//!
//! ```text
//!  vCPU thread i                      other threads (vCPU j, VMM, timer thread)
//!  ─────────────                      ─────────────────────────────────────────
//!  owns Lapic i + CpuTimers i         route(ipi) ─> Mailbox i ─> kick i
//!  before KVM_RUN: drain Mailbox i,     kick = tgkill(SIGRTMIN+1) if i may be in KVM_RUN
//!    run timers, inject                        (handler sets kvm_run.immediate_exit)
//!  HLT: CpuTimers::idle -> park until        + unpark if i may be blocked in HLT
//!    timeout or kick; CpuTimers::wake
//!  host tick: POSIX timer -> SIGRTMIN+1 to its own thread
//! ```

pub mod clock;
pub mod host_timer;
pub mod kick;
pub mod mailbox;
pub mod router;
pub mod setup;
