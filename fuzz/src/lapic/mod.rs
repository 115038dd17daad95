//! The `lapic` target: lull's real per-vCPU user irqchip (`vmm::irqchip::user::vcpu::
//! UserVcpuIrq`), 2-4 of them from one real `UserIrqChip` (`crate::chip`: fake clock, fake
//! host timers, any timer model, PV EOI on or off), driven the way `vmm::vcpu::run` drives
//! them: `before_entry` on a fake `CpuPort` whose interrupt window the input opens and
//! closes, then the guest's exit as a real `kvm_ioctls::VcpuExit` (LAPIC MMIO at the current
//! base, IOAPIC MMIO, x2APIC / IA32_APIC_BASE / TSC-deadline / PV EOI / PV deadline MSRs,
//! IPIs, EOIs through the register or the PV flag, deadlines stored in the PV deadline slot,
//! interrupt windows, EINTR) through `after_run`, `handle_exit`
//! (the generic `vmm::vcpu::exit::handle_exit` for what the chip gives back) and `exit_done`.
//! Between steps the clock moves, the `central` model's thread runs, devices raise IOAPIC
//! lines. A vCPU that an INIT stopped waits for its SIPI (`wait_for_sipi` is called only once
//! the SIPI is there, so nothing blocks).
//!
//! `lapic_idle` (`run_idle`) drives the same vCPUs on a chip with the idle manager's features
//! on (halt polling, timer advance, idle injection, CPU quota, global timers), with the same
//! checks. A vCPU handling its timer early spins on a clock that then moves by itself
//! (`chip::FuzzClock`); the target moves the clock past the holds of idle injection and the
//! quota (from its own copies of both) before the chip would block in them.
//!
//! The priority checks trust nothing the LAPIC computes: `model.rs` records, per vCPU, the
//! vectors the fake port saw injected and no EOI (register, MSR or PV flag) has ended, and the
//! TPR the guest wrote; IPI targets come from the SDM's destination rules over the LAPICs'
//! registers (`oracle.rs`), not from `devices::lapic::route`.
//!
//! Checked (`check.rs`), for every vCPU after every step:
//! - ISR = the recorded in-service vectors; TPR = the TPR written; PPR = the SDM's function of
//!   the two (11.8.3.1); the next interrupt is the highest pending vector iff its class is
//!   above PPR's; no vector below 16 in IRR or ISR;
//! - IA32_APIC_BASE as last told to KVM (`CpuPort::set_apic_base`) is the LAPIC's;
//! - **no lost timer**: a vCPU in the guest with a LAPIC deadline has a host timer armed no
//!   later (its own tick, or the `central` thread's), or, while the guest cannot take
//!   interrupts, no later than the tick deferral's grace after it (`vmm::irqchip::user::lapic_timer_host::tick_defer`);
//!   **the clamp bounds the storm**: LAPIC
//!   timer fires <= the guest's LAPIC writes + elapsed time / `min_period_ns`.
//!
//! At every entry: CR8 as given to KVM (`kvm_run.cr8`) = TPR[7:4] of the TPR written; never
//! more than one injection, and none while the port says the guest cannot take one; the
//! injected vector's class is above the recorded PPR, and it is the LAPIC's highest pending one
//! (now the highest in service, above everything left in IRR); nothing early: a timer deadline
//! the clock has not reached is still armed, untouched; no idle-manager hold the target did not
//! foresee; an open window with nothing injected means
//! nothing is deliverable; the interrupt-window request is on exactly when something is
//! still deliverable; no timer deadline is due (a due timer fired before the entry), and a
//! periodic re-arm is `min_period_ns` after the deadline it replaces; an unmasked timer fire
//! left its vector in IRR or ISR; **a posted IPI is never lost**: every fixed IPI another
//! step sent to this vCPU (a target by the SDM's rules, `oracle.rs`) is in its IRR or ISR,
//! and every NMI was injected; a PV EOI flag lull sets is set
//! only for a lone, edge-triggered in-service vector with nothing pending.
//!
//! At every IPI: `devices::lapic::route` over the LAPICs' addressing state names exactly the
//! LAPICs the SDM's rules accept (either way where the SDM leaves it open), and sends the same
//! message with lowest-priority delivery to exactly one software-enabled LAPIC they accept.
//!
//! At every exit: a deadline a guest write set is at least `min_delay_ns` away; an EOI
//! (register or PV flag) retires the highest in-service vector; a PV flag lull set is taken
//! back; a deadline stored in a PV deadline slot is taken (the slot reads 0) and counted once;
//! nothing panics, whatever the guest wrote.
//!
//! `LULL_FUZZ_TRACE=1` prints each step as it runs (e.g. under `cargo test`'s replay).

mod check;
mod enter;
mod exit;
mod idle;
pub mod input;
mod ipi;
mod machine;
mod model;
mod oracle;
mod vcpu;

use arbitrary::Unstructured;

use input::Op;
use machine::Machine;

/// Runs one input: a VM configuration, then steps until the bytes run out.
pub fn run(data: &[u8]) {
    run_with(data, false);
}

/// Runs one input on a chip with the idle manager's features on (halt polling, timer advance,
/// idle injection, CPU quota, global timers): the `lapic_idle` target.
pub fn run_idle(data: &[u8]) {
    run_with(data, true);
}

fn run_with(data: &[u8], idle: bool) {
    let mut u = Unstructured::new(data);
    let Ok(Some(mut machine)) = Machine::new(&mut u, idle) else {
        return;
    };
    let trace = std::env::var_os("LULL_FUZZ_TRACE").is_some();
    while let Ok(op) = u.arbitrary::<Op>() {
        if trace {
            eprintln!("{op:?}");
        }
        machine.step(op);
        machine.check();
        if u.is_empty() {
            break;
        }
    }
}
