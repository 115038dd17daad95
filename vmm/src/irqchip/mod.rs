//! The interrupt controller of a VM, behind one interface for both modes: who owns each vCPU's
//! LAPIC, how devices raise lines, what a vCPU does before entering the guest and when it
//! halts, and how everyone is woken to stop.
//!
//! ```text
//!  vm ──builds──► dyn IrqChip ──vcpu(id)──► Box<dyn VcpuIrq> ──owned by──► vCPU thread id
//!                  │ kernel: KVM's LAPIC/IOAPIC/PIC; every VcpuIrq call is a no-op
//!                  │ user:   lull's LAPICs + IOAPIC + timer model + idle manager
//!                  ├─ edge_irq(gsi) / irq_lines(): device lines (irqfd, KVM_IRQ_LINE, or
//!                  │                               lull's IOAPIC)
//!                  ├─ start(): helper threads (the `central` model's timer thread)
//!                  ├─ kick_all(): wake every vCPU so that it sees the stop
//!                  ├─ kick_to_pause(), paused(), resuming(): pause and resume (`vm::pause_resume`)
//!                  └─ report(): the chip's part of the `--metrics` JSON
//!
//!  vCPU loop (vcpu::run):  before_entry ─► KVM_RUN ─► handle_exit (chip first, then generic)
//!                              ▲                        │ HLT
//!                              └──────── halted ◄───────┘
//! ```
//!
//! The per-vCPU half acts on its vCPU only through [`CpuPort`] (inject, interrupt window, NMI,
//! CR8, APIC base, kick registration), which `vcpu` implements over a KVM `VcpuFd` and tests
//! implement with a fake: the whole user-space irqchip runs in unit tests without `/dev/kvm`.
//! In the spirit of crosvm's `IrqChip` (`inject_interrupts`, `halted`, `wait_until_runnable`,
//! `kick_halted_vcpus`).

pub mod clock;
pub mod fake_port;
pub mod kernel;
pub mod user;

use std::sync::Arc;

use devices::serial::Trigger;
use devices::testdev::IrqLines;
use kvm_ioctls::VcpuExit;
use vmm_sys_util::eventfd::EventFd;

use crate::metrics::RunReport;
use crate::state::{StopReason, VcpuShared};

pub use crate::idle::halt::{Entry, HaltEnd};

/// Why an irqchip could not be built or started.
#[derive(Debug, thiserror::Error)]
pub enum IrqChipError {
    /// A KVM call failed.
    #[error("KVM call {call} failed: {source}")]
    Kvm {
        /// Which call.
        call: &'static str,
        /// Why.
        source: kvm_ioctls::Error,
    },
    /// A LAPIC could not be configured (a lull bug).
    #[error("Cannot configure the LAPIC of vCPU {id}: {source}")]
    Lapic {
        /// Which vCPU.
        id: u32,
        /// Why.
        source: devices::lapic::LapicError,
    },
    /// The timer model could not be built.
    #[error("Cannot build the timer model: {0}")]
    TimerModel(#[from] timer::ModelError),
    /// A host resource (signal handler, timerfd, eventfd, thread) could not be created.
    #[error("Cannot create {what}: {source}")]
    Host {
        /// What.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The per-vCPU part of a vCPU was asked for twice, or for a vCPU that does not exist.
    #[error("vCPU {0} has no irqchip part left to take (a lull bug)")]
    NoVcpuPart(u32),
}

/// The NMIs KVM still holds for a vCPU (`KVM_GET_VCPU_EVENTS`): KVM keeps the second of two
/// NMIs injected back to back until the guest's IRET from the first.
pub use devices::lapic::CpuNmi as KvmNmi;

/// What the per-vCPU irqchip may do to its vCPU. Implemented over KVM by `vcpu::KvmPort`.
pub trait CpuPort {
    /// The guest can take an external interrupt now (RFLAGS.IF and no interrupt shadow).
    fn can_inject(&mut self) -> bool;
    /// RFLAGS.IF as of the last exit.
    fn interrupts_enabled(&mut self) -> bool;
    /// Queues external interrupt `vector` for the next entry (at most one per entry).
    fn inject(&mut self, vector: u8) -> std::io::Result<()>;
    /// Asks KVM to exit as soon as the guest can take an interrupt.
    fn request_interrupt_window(&mut self, on: bool);
    /// Clears a kick that landed while the vCPU was not in KVM_RUN (answered already).
    fn clear_immediate_exit(&mut self);
    /// Queues an NMI.
    fn inject_nmi(&mut self) -> std::io::Result<()>;
    /// The NMIs KVM still holds for the vCPU (one ioctl: ask only while some may be).
    fn kvm_nmi(&mut self) -> std::io::Result<KvmNmi>;
    /// Sets CR8 for the next entry (`kvm_run.cr8`, which KVM loads at every entry without an
    /// in-kernel LAPIC): the TPR's bits 7:4.
    fn set_cr8(&mut self, cr8: u64);
    /// Tells KVM the guest's IA32_APIC_BASE (KVM derives CPUID.1:EDX[9] from it).
    fn set_apic_base(&mut self, value: u64);
    /// Makes kicks of the calling thread interrupt this vCPU's KVM_RUN.
    fn register_kick(&mut self);
    /// Undoes [`Self::register_kick`] before the vCPU goes away.
    fn unregister_kick(&mut self);
}

/// What the irqchip made of an exit it handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChipExit {
    /// Re-enter the guest.
    Continue,
    /// Stop the VM.
    Stop(StopReason),
}

/// The per-vCPU half of the irqchip, owned by that vCPU's thread.
pub trait VcpuIrq: Send {
    /// Called once on the vCPU's thread before its first entry.
    fn attach(&mut self, cpu: &mut dyn CpuPort);
    /// Before an entry: takes posted interrupts and due timers, holds the vCPU while the idle
    /// manager says so, injects the highest pending interrupt the guest can take.
    fn before_entry(&mut self, cpu: &mut dyn CpuPort) -> Entry;
    /// After KVM_RUN returned, before its exit is handled: accounting of guest run time, and
    /// `cr8`, the guest's CR8 as of the exit (`kvm_run.cr8`; `None` where lull does not track
    /// it), which is the TPR.
    fn after_run(&mut self, cr8: Option<u64>);
    /// Handles the exits only this chip knows (LAPIC and IOAPIC MMIO, LAPIC MSRs, interrupt
    /// windows); gives every other exit back. What the exit asks of the vCPU itself is done
    /// in [`Self::exit_done`], once the exit no longer borrows the vCPU.
    fn handle_exit<'a>(&mut self, exit: VcpuExit<'a>) -> Result<ChipExit, VcpuExit<'a>>;
    /// After every exit: applies what the exit asked of the vCPU (e.g. its APIC base).
    fn exit_done(&mut self, cpu: &mut dyn CpuPort);
    /// HLT reached user space: polls, then blocks, until the vCPU is runnable or the VM stops.
    fn halted(&mut self, cpu: &mut dyn CpuPort) -> HaltEnd;
    /// The vCPU is in INIT: blocks until a SIPI arrives (its vector) or the VM stops (`None`).
    fn wait_for_sipi(&mut self, cpu: &mut dyn CpuPort) -> Option<u8>;
    /// Called once on the vCPU's thread when it leaves its loop.
    fn detach(&mut self, cpu: &mut dyn CpuPort);
    /// lull's own interrupt state of this vCPU for a snapshot, taken on its thread while the
    /// VM is paused (interrupts posted to it are taken into its LAPIC first); `None` where KVM
    /// holds it (`--irqchip kernel`).
    /// `halted`: the vCPU is halted (kept, so that it halts again when restored).
    fn save(&mut self, _halted: bool) -> Option<user::saved::UserVcpuState> {
        None
    }
    /// Takes a snapshot's [`Self::save`] before the vCPU's thread starts (its timer's host
    /// timer is armed at [`Self::attach`]); checks it first and changes nothing if it is bad.
    fn restore(
        &mut self,
        _state: &user::saved::UserVcpuState,
    ) -> Result<(), user::saved::ChipStateError> {
        Err(user::saved::ChipStateError::KernelIrqchip)
    }
    /// Whether a [`Self::restore`] left the vCPU halted: asked once, as its thread starts.
    fn take_restored_halt(&mut self) -> bool {
        false
    }
}

/// An edge-triggered device interrupt (the serial port's): an irqfd or an IOAPIC pin.
pub enum EdgeIrq {
    /// A KVM irqfd on the line's GSI.
    Irqfd(EventFd),
    /// An edge on lull's IOAPIC.
    Ioapic(user::router::IoapicEdgeTrigger),
}

impl Trigger for EdgeIrq {
    type E = std::io::Error;

    fn trigger(&self) -> Result<(), Self::E> {
        match self {
            Self::Irqfd(evt) => evt.write(1),
            Self::Ioapic(t) => {
                let Ok(()) = t.trigger();
                Ok(())
            }
        }
    }
}

/// A VM's interrupt controller.
pub trait IrqChip: Send + Sync {
    /// `kernel` or `user`.
    fn name(&self) -> &'static str;
    /// The per-vCPU half of vCPU `id` (taken once).
    fn vcpu(&self, id: u32, shared: &Arc<VcpuShared>) -> Result<Box<dyn VcpuIrq>, IrqChipError>;
    /// An edge trigger for device line `gsi`.
    fn edge_irq(&self, gsi: u32) -> Result<EdgeIrq, IrqChipError>;
    /// Level-driven device lines (pc-testdev's IRQ ports).
    fn irq_lines(&self) -> Arc<dyn IrqLines>;
    /// Starts the chip's own threads, if any.
    fn start(&self, shared: &Arc<VcpuShared>) -> Result<(), IrqChipError>;
    /// Wakes every vCPU (and helper thread) so that it sees the stop request.
    fn kick_all(&self);
    /// Wakes every vCPU so that it sees the pause request (`state::pause_gate`), leaving nothing
    /// behind that would wake it again after the pause.
    fn kick_to_pause(&self);
    /// Every vCPU is parked at CLOCK_MONOTONIC time `monotonic`: the chip's clock stops there.
    fn paused(&self, monotonic: u64);
    /// The VM resumes after `paused_ns`: the chip's clock goes on from where it stopped and
    /// its host timers are armed again (before the vCPUs are released).
    fn resuming(&self, paused_ns: u64);
    /// Fills the chip's part of the run report.
    fn report(&self, report: &mut RunReport);
    /// lull's own IOAPIC for a snapshot; `None` where KVM holds it (`--irqchip kernel`).
    fn save_ioapic(&self) -> Option<devices::ioapic::IoApicState> {
        None
    }
    /// Takes a snapshot's IOAPIC (after checking it: nothing changes if it is bad) before the
    /// vCPUs start.
    fn restore_ioapic(
        &self,
        _state: &devices::ioapic::IoApicState,
    ) -> Result<(), user::saved::ChipStateError> {
        Err(user::saved::ChipStateError::KernelIrqchip)
    }
}
