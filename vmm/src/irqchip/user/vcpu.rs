//! The per-vCPU half of the user-space irqchip: lull's LAPIC and the vCPU's timers, driven by
//! the vCPU thread through [`VcpuIrq`], with its idle manager ([`VcpuIdle`]) beside it.
//!
//! Before every entry: the idle manager takes mail and due timers through [`IdleChip`] and
//! may hold the vCPU (injection window, quota); then the chip injects the highest pending
//! interrupt or asks for an interrupt window. At HLT and in INIT the idle manager runs the
//! whole halt (`idle/halt.rs`); the chip answers whether the vCPU is runnable, services its
//! mailbox and timers, and waits on its kick eventfd and the wake-up timerfd the timer model
//! arms (see [`VcpuWait`]). Also here: PV EOI offered and read back, CR8 kept equal to the
//! TPR; the LAPIC timer's host side (host timer, advance, tick deferral) is
//! [`LapicTimerHost`]'s, which `vcpu/lapic_timer.rs` carries out. The clock is a type parameter and the vCPU is reached only through
//! [`CpuPort`], so all of this runs in tests without KVM.

mod lapic_timer;
mod saved;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use devices::lapic::regs::MSR_TSC_DEADLINE;
use devices::lapic::{InitSipiState, Lapic, LapicEffects, LapicEvents};
use kvm_ioctls::VcpuExit;
use timer::{CpuTimers, Nanos, TimerKind, VmTime};
use vm_memory::GuestMemoryMmap;

use super::cr8::TprPoll;
use super::exit::{handle_user_exit, UserExitContext};
use super::guest_tsc::TscAnchor;
use super::host_timer::SharedTimerFd;
use super::lapic_timer_host::slack::thread_slack_ns;
use super::lapic_timer_host::LapicTimerHost;
use super::pv_deadline::PvDeadline;
use super::pv_eoi::PvEoi;
use super::pv_msr::{GuestPv, PvMsrs};
use super::router::InterruptRouter;
use super::saved::UserVcpuState;
use super::timers::on_timer_fired;
use super::wait::VcpuWait;
use crate::idle::core::WakeCause;
use crate::idle::halt::{IdleChip, VcpuIdle};
use crate::idle::vcpu_timer::{FiredSummary, VcpuTimer};
use crate::idle::IdleShared;
use crate::irqchip::{ChipExit, CpuPort, Entry, HaltEnd, KvmNmi, VcpuIrq};
use crate::metrics::VcpuCounters;
use crate::ratelimit::LogLimiter;
use crate::state::VcpuShared;

/// IA32_APIC_BASE.
const MSR_IA32_APIC_BASE: u32 = 0x1b;

/// What a [`UserVcpuIrq`] is built from.
pub struct UserVcpuParts<E: LapicEvents, C: VmTime> {
    /// The vCPU's index (= APIC ID).
    pub id: u32,
    /// Its LAPIC.
    pub lapic: Lapic<E>,
    /// Its timers, in the VM's timer model.
    pub timers: Box<dyn CpuTimers<VcpuTimer>>,
    /// The interrupt fabric (holds its mailbox).
    pub router: Arc<InterruptRouter>,
    /// The VM clock.
    pub clock: C,
    /// The idle manager's VM-wide state.
    pub idle: Arc<IdleShared>,
    /// Shared VM state (stop request, counters).
    pub shared: Arc<VcpuShared>,
    /// Unimplemented-MSR log limiter (VM-wide).
    pub unknown_msr: Arc<LogLimiter>,
    /// Guest memory (the PV EOI flag lives there).
    pub mem: Arc<GuestMemoryMmap>,
    /// Whether the guest may use PV EOI (advertised in CPUID).
    pub pv_eoi: bool,
    /// Whether the guest may use lull's PV TSC deadline (advertised in CPUID).
    pub pv_deadline: bool,
    /// The wake-up timer the timer model arms for this vCPU while it is blocked (handed to
    /// the model with `CpuTimers::set_wake_timer`); `None`: block with the model's timeout.
    pub wake_timer: Option<Arc<SharedTimerFd>>,
    /// Re-anchors the LAPIC's TSC map now and then (`None`: the guest TSC is not cheap to
    /// read, the start-up map stays).
    pub tsc_anchor: Option<TscAnchor>,
}

/// One vCPU's chip and idle manager, owned by its thread.
pub struct UserVcpuIrq<E: LapicEvents, C: VmTime> {
    /// Its LAPIC, timers and mailbox.
    chip: VcpuChip<E, C>,
    /// Its idle manager, which runs the vCPU's holds and halts over `chip`.
    idle: VcpuIdle<C>,
}

/// One vCPU's LAPIC and timers: what the guest sees of its interrupt controller.
struct VcpuChip<E: LapicEvents, C: VmTime> {
    id: u32,
    lapic: Lapic<E>,
    timers: Box<dyn CpuTimers<VcpuTimer>>,
    /// The LAPIC timer's host side: its host timer, advance and tick deferral.
    lapic_timer: LapicTimerHost,
    /// What it shares with the VM's other threads.
    vm: ChipVm,
    clock: C,
    counters: Arc<VcpuCounters>,
    /// What the last exit asked of the LAPIC's surroundings, applied at `exit_done`.
    effects: Option<LapicEffects>,
    /// PV EOI and PV deadline, as far as the guest may use them.
    pv: GuestPv,
    /// Keeps the TSC map from drifting (see `guest_tsc`).
    tsc_anchor: Option<TscAnchor>,
    /// What it blocks on.
    wait: VcpuWait,
    /// The exit that makes the vCPU look at CR8 while an interrupt is held by TPR.
    tpr_poll: TprPoll,
    /// Halted or waiting for SIPI: no guest code runs until the next entry, so timer passes
    /// leave the host tick to the pass before that entry (`CpuTimers::run_halted`).
    halted: bool,
    /// Restored from a snapshot taken while halted: the vCPU starts halted.
    restored_halt: bool,
}

/// What one vCPU's chip shares with the VM's other threads.
struct ChipVm {
    /// The interrupt fabric (holds every vCPU's mailbox).
    router: Arc<InterruptRouter>,
    /// The idle manager's VM-wide state (the global-timer load whose timers fire here).
    idle: Arc<IdleShared>,
    /// Stop and pause requests, counters, device timers.
    shared: Arc<VcpuShared>,
    /// Unimplemented-MSR log limiter.
    unknown_msr: Arc<LogLimiter>,
}

impl<E: LapicEvents + Send, C: VmTime> UserVcpuIrq<E, C> {
    /// The per-vCPU irqchip of vCPU `parts.id`; `None` if the router has no mailbox or the
    /// VM no counters for it.
    pub fn new(parts: UserVcpuParts<E, C>) -> Option<Self> {
        let index = usize::try_from(parts.id).ok()?;
        let mailbox = parts.router.mailbox(index)?.clone();
        let counters = parts.shared.counters(parts.id)?.clone();
        let cpus = parts.router.mailboxes().len();
        let idle = VcpuIdle::new(
            parts.idle.clone(),
            parts.id,
            cpus,
            parts.clock.clone(),
            counters.clone(),
        );
        let chip = VcpuChip {
            id: parts.id,
            lapic: parts.lapic,
            timers: parts.timers,
            lapic_timer: LapicTimerHost::new(parts.idle.timer_advance, parts.idle.timer_slack),
            vm: ChipVm {
                router: parts.router,
                idle: parts.idle,
                shared: parts.shared,
                unknown_msr: parts.unknown_msr,
            },
            clock: parts.clock,
            counters,
            effects: None,
            pv: GuestPv {
                mem: parts.mem,
                eoi: parts.pv_eoi.then(PvEoi::default),
                deadline: parts.pv_deadline.then(PvDeadline::default),
            },
            tsc_anchor: parts.tsc_anchor,
            wait: VcpuWait {
                mailbox,
                wake_timer: parts.wake_timer,
            },
            tpr_poll: TprPoll::default(),
            halted: false,
            restored_halt: false,
        };
        Some(Self { chip, idle })
    }

    /// The LAPIC (tests and reports).
    pub fn lapic(&self) -> &Lapic<E> {
        &self.chip.lapic
    }
}

impl<E: LapicEvents + Send, C: VmTime> VcpuChip<E, C> {
    fn counters(&self) -> &VcpuCounters {
        &self.counters
    }

    /// A stop or a pause: either way the vCPU leaves its halt or wait (`vcpu::run` tells them
    /// apart and parks for a pause).
    fn stop_requested(&self) -> bool {
        self.vm.shared.stop.is_requested() || self.vm.shared.pause.is_requested()
    }

    /// Drains the mailbox, runs due timers and the LAPIC timer, re-arms queued global timers.
    fn service(&mut self, cpu: &mut dyn CpuPort, now: Nanos) -> FiredSummary {
        for ipi in self.wait.mailbox.take_mail() {
            self.lapic.receive(&ipi);
        }
        self.wait.mailbox.take_recheck();
        self.arm_device_timers();
        let mut summary = self.run_timers(now);
        if self.lapic_timer.take_taken() {
            summary.own_pinned += 1;
        }
        // Arm what devices asked for in their callbacks, and cover it with the host tick (the
        // idle manager re-arms the global-timer load's: `VcpuIdle::service`).
        if summary.global() > 0 && self.arm_device_timers() {
            self.run_timers(now);
        }
        if summary.device > 0 {
            // A device's callback may have raised a line to this vCPU: take it now rather
            // than at the next exit.
            for ipi in self.wait.mailbox.take_mail() {
                self.lapic.receive(&ipi);
            }
        }
        self.tpr_poll.fired(now);
        if self.wait.mailbox.take_timer_due() {
            let ran_on = !self.halted && cpu.interrupts_enabled();
            let now = self.lapic_timer_due(now, ran_on);
            if let Some(next) = self.lapic.timer_fired(now) {
                self.lapic_timer.arm(self.timers.as_mut(), next);
                // Armed after this pass's timer run: program the host tick for it now (`pull`
                // programs a running vCPU's tick only in `run`), or a periodic timer's next
                // period would wait for the vCPU's next exit (none with PV EOI in a busy loop).
                self.run_timers(now);
            }
        }
        for _ in 0..self.lapic.take_nmi() {
            let _ = cpu.inject_nmi();
        }
        summary
    }

    /// Asks KVM what it still holds of the NMIs lull gave it, while it may hold any (one
    /// ioctl), and tells the LAPIC. A failed ask counts as none held.
    fn ask_kvm_nmi(&mut self, cpu: &mut dyn CpuPort) {
        if self.lapic.nmi_in_cpu() {
            self.lapic.cpu_nmi(cpu.kvm_nmi().unwrap_or(KvmNmi::None));
        }
    }

    /// Whether a halted vCPU must run for an NMI lull gave KVM: KVM delivers it at the next
    /// entry whatever IF is, unless NMIs are blocked (the guest halted in its NMI handler; the
    /// NMI then waits for IRET). KVM keeps the second of two NMIs until the first's IRET, so
    /// the guest may halt with one still held: ask KVM while lull's NMIs may be outstanding.
    fn nmi_runnable(&mut self, cpu: &mut dyn CpuPort) -> bool {
        self.ask_kvm_nmi(cpu);
        self.lapic.nmi_wakes_cpu()
    }

    /// One pass of the timer model: expires what is due (this vCPU's timers, and other
    /// vCPUs' global ones if it is a migrator), programs the host tick, counts global fires.
    fn run_timers(&mut self, now: Nanos) -> FiredSummary {
        let (router, global) = (&self.vm.router, self.vm.idle.global.as_ref());
        let mut summary = FiredSummary::default();
        let mut devices_due = Vec::new();
        let mut on_fire =
            |fired| on_timer_fired(router, global, &mut devices_due, &mut summary, fired);
        if self.halted {
            self.timers.run_halted(now, &mut on_fire);
        } else if self.lapic_timer.take_stale() {
            // The tick armed for an ended deferral would interrupt the guest for nothing.
            self.timers.run_exact(now, &mut on_fire);
        } else {
            self.timers.run(now, &mut on_fire);
        }
        for id in devices_due {
            self.vm.shared.device_timers.fire(id);
        }
        if summary.global() > 0 {
            self.counters()
                .global_timer_fires
                .fetch_add(u64::from(summary.global()), Ordering::Relaxed);
        }
        summary
    }

    /// Arms the device timers devices asked for (in MMIO exits or timer callbacks) as global
    /// timers on this vCPU's base. True if anything was armed.
    fn arm_device_timers(&mut self) -> bool {
        let pending = self.vm.shared.device_timers.take_pending();
        let epoch = self.clock.to_monotonic(0);
        for &(id, at) in &pending {
            let deadline = at.saturating_sub(epoch);
            self.timers
                .arm(TimerKind::Global, deadline, VcpuTimer::Device(id));
        }
        !pending.is_empty()
    }

    /// Applies what a LAPIC access asks for.
    fn apply(&mut self, effects: LapicEffects, cpu: &mut dyn CpuPort) {
        let interruptible = cpu.interrupts_enabled();
        self.apply_timer(effects.timer, effects.timer_expired, interruptible);
        if effects.destination_changed {
            if let Ok(index) = usize::try_from(self.id) {
                self.vm
                    .router
                    .update_destination(index, self.lapic.destination_info());
            }
        }
        if let Some(ipi) = effects.ipi {
            self.vm.router.send_ipi(&ipi);
        }
        if effects.base_change.is_some() {
            if let Ok(value) = self.lapic.read_msr(MSR_IA32_APIC_BASE, self.clock.now()) {
                cpu.set_apic_base(value);
            }
        }
        if let Some(eoi) = effects.eoi {
            if eoi.level_triggered {
                self.vm.router.end_of_interrupt(eoi.vector);
            }
        }
    }

    /// Injects the highest pending interrupt if the guest can take it, else asks KVM for an
    /// interrupt window. An NMI KVM has yet to deliver goes first: KVM queues what lull
    /// injects as already injected, ahead of its own pending NMIs, so the interrupt waits for
    /// the window after the NMI handler's IRET (`Lapic::injectable_interrupt`).
    fn inject(&mut self, cpu: &mut dyn CpuPort) {
        if self.lapic.next_interrupt().is_none() {
            cpu.request_interrupt_window(false);
            return;
        }
        if !cpu.can_inject() {
            cpu.request_interrupt_window(true);
            return;
        }
        self.ask_kvm_nmi(cpu);
        let Some(vector) = self.lapic.injectable_interrupt() else {
            cpu.request_interrupt_window(true);
            return;
        };
        if cpu.inject(vector).is_ok() {
            self.lapic.interrupt_injected(vector);
            self.counters().injected.fetch_add(1, Ordering::Relaxed);
        }
        let more = self.lapic.next_interrupt().is_some();
        cpu.request_interrupt_window(more);
    }

    /// Blocks the thread until `until`, VM control and (with `wake_on_work`) mail or its
    /// wake-up (see [`VcpuWait`]); counts the time asleep.
    fn block_until(&mut self, until: Option<Nanos>, wake_on_work: bool) {
        let shared = self.vm.shared.clone();
        let asleep = self.wait.block_until(
            self.timers.as_mut(),
            &self.clock,
            until,
            wake_on_work,
            || shared.stop.is_requested() || shared.pause.is_requested(),
        );
        self.counters()
            .blocked_ns
            .fetch_add(asleep, Ordering::Relaxed);
    }

    /// Before an entry the idle manager lets happen: injects or asks for a window, sets CR8,
    /// keeps the TPR poll and offers PV EOI.
    fn prepare_entry(&mut self, cpu: &mut dyn CpuPort) {
        self.inject(cpu);
        cpu.set_cr8(self.lapic.cr8());
        let now = self.clock.now();
        let held = self.lapic.held_by_tpr();
        if self.tpr_poll.before_entry(held, now, self.timers.as_mut()) {
            self.run_timers(now);
        }
        if let Some(pv) = &mut self.pv.eoi {
            pv.before_entry(&self.lapic, &self.pv.mem);
        }
    }

    /// After KVM_RUN, before the exit: re-anchors the TSC map when due, reads back PV EOI
    /// and a PV deadline.
    fn after_run(&mut self) {
        if let Some(anchor) = &mut self.tsc_anchor {
            if let Some(map) = anchor.refresh(&self.clock, self.clock.now()) {
                self.lapic.set_tsc_map(map);
            }
        }
        if let Some(pv) = &mut self.pv.eoi {
            if pv.after_exit(&mut self.lapic, &self.pv.mem).is_some() {
                self.counters.pv_eois.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Before the exit itself: a deadline stored in the PV slot is older than it.
        if let Some(tsc) = self
            .pv
            .deadline
            .as_ref()
            .and_then(|pv| pv.take(&self.pv.mem))
        {
            self.counters.pv_deadlines.fetch_add(1, Ordering::Relaxed);
            let now = self.clock.now();
            if let Ok(effects) = self.lapic.write_msr(MSR_TSC_DEADLINE, tsc, now) {
                // Taken at an exit the guest chose (its HLT, as the ABI asks): as usual.
                self.apply_timer(effects.timer, effects.timer_expired, true);
            }
        }
    }

    /// Handles the exits only the chip knows (see [`VcpuIrq::handle_exit`]).
    fn handle_exit<'a>(&mut self, exit: VcpuExit<'a>) -> Result<ChipExit, VcpuExit<'a>> {
        if matches!(exit, VcpuExit::Hlt) {
            // A halted vCPU cannot write CR8: nothing to poll for until it runs again.
            self.tpr_poll.cancel(self.timers.as_mut());
        }
        let pv = PvMsrs {
            eoi: self.pv.eoi.as_mut(),
            deadline: self.pv.deadline.as_mut(),
        };
        let Err(exit) = pv.handle(exit, &self.pv.mem, &self.counters) else {
            return Ok(ChipExit::Continue);
        };
        let mut ctx = UserExitContext {
            vcpu: self.id,
            counters: &self.counters,
            lapic: &mut self.lapic,
            router: &self.vm.router,
            now: self.clock.now(),
            unknown_msr: &self.vm.unknown_msr,
        };
        self.effects = handle_user_exit(exit, &mut ctx)?;
        Ok(ChipExit::Continue)
    }
}

impl<E: LapicEvents + Send, C: VmTime> VcpuIrq for UserVcpuIrq<E, C> {
    fn attach(&mut self, cpu: &mut dyn CpuPort) {
        self.chip.wait.mailbox.bind_current_thread();
        let slack = self.chip.vm.idle.timer_slack;
        if slack.is_on() {
            // The ranged wait's timeout expires within this slack (`ranged_wake.rs`).
            if let Err(e) = crate::host::sys::thread::set_timer_slack(thread_slack_ns(slack)) {
                tracing::warn!(
                    vcpu = self.chip.id,
                    "cannot set the timer slack {slack}: {e}"
                );
            }
        }
        self.idle.attach();
        self.chip.arm_restored();
        cpu.register_kick();
    }

    fn before_entry(&mut self, cpu: &mut dyn CpuPort) -> Entry {
        if cpu.interrupts_enabled() {
            let now = self.chip.clock.now();
            self.chip.end_tick_deferral(now);
            self.chip.lapic_timer_due_at_exit(now);
        }
        let chip = &mut self.chip;
        let entry = self.idle.before_entry(&mut ChipOnCpu { chip, cpu });
        if entry != Entry::Enter {
            return entry;
        }
        self.chip.prepare_entry(cpu);
        self.idle.entering();
        Entry::Enter
    }

    fn after_run(&mut self, cr8: Option<u64>) {
        if let Some(cr8) = cr8 {
            self.chip.lapic.sync_cr8(cr8);
        }
        self.idle.ran();
        self.chip.after_run();
    }

    fn handle_exit<'a>(&mut self, exit: VcpuExit<'a>) -> Result<ChipExit, VcpuExit<'a>> {
        self.chip.handle_exit(exit)
    }

    fn exit_done(&mut self, cpu: &mut dyn CpuPort) {
        cpu.clear_immediate_exit();
        if let Some(effects) = self.chip.effects.take() {
            self.chip.apply(effects, cpu);
        }
    }

    fn halted(&mut self, cpu: &mut dyn CpuPort) -> HaltEnd {
        let now = self.chip.clock.now();
        self.chip.end_tick_deferral(now);
        self.chip.lapic_timer_due_at_exit(now);
        self.chip.halted = true;
        let chip = &mut self.chip;
        let end = self.idle.halt(&mut ChipOnCpu { chip, cpu });
        self.chip.halted = false;
        end
    }

    fn wait_for_sipi(&mut self, cpu: &mut dyn CpuPort) -> Option<u8> {
        self.chip.halted = true;
        let chip = &mut self.chip;
        let vector = self.idle.wait_for_sipi(&mut ChipOnCpu { chip, cpu });
        self.chip.halted = false;
        vector
    }

    fn detach(&mut self, cpu: &mut dyn CpuPort) {
        cpu.unregister_kick();
    }

    fn save(&mut self, halted: bool) -> Option<UserVcpuState> {
        Some(self.save_chip(halted))
    }

    fn restore(&mut self, state: &UserVcpuState) -> Result<(), super::saved::ChipStateError> {
        self.restore_chip(state)
    }

    fn take_restored_halt(&mut self) -> bool {
        std::mem::take(&mut self.chip.restored_halt)
    }
}

/// A vCPU's chip and the vCPU, as its idle manager drives them.
struct ChipOnCpu<'a, E: LapicEvents, C: VmTime> {
    chip: &'a mut VcpuChip<E, C>,
    cpu: &'a mut dyn CpuPort,
}

impl<E: LapicEvents + Send, C: VmTime> IdleChip for ChipOnCpu<'_, E, C> {
    fn stop_requested(&self) -> bool {
        self.chip.stop_requested()
    }

    fn service(&mut self, now: Nanos) -> FiredSummary {
        self.chip.service(self.cpu, now)
    }

    fn runnable(&mut self) -> bool {
        (self.chip.lapic.has_pending_interrupt() && self.cpu.interrupts_enabled())
            || self.in_init()
            || self.chip.nmi_runnable(self.cpu)
    }

    fn interrupt_pending(&self) -> bool {
        self.chip.lapic.has_pending_interrupt()
    }

    fn in_init(&self) -> bool {
        self.chip.lapic.init_sipi_state() != InitSipiState::Running
    }

    fn take_sipi(&mut self) -> Option<u8> {
        self.chip.lapic.take_sipi()
    }

    fn next_pinned(&self) -> Option<Nanos> {
        self.chip.lapic.timer_deadline()
    }

    fn wake_at(&self) -> Option<Nanos> {
        self.chip.lapic_timer.wake_at()
    }

    fn timers(&mut self) -> &mut dyn CpuTimers<VcpuTimer> {
        self.chip.timers.as_mut()
    }

    fn run_timers(&mut self, now: Nanos) {
        self.chip.run_timers(now);
    }

    fn set_polling(&self, on: bool) {
        if on {
            self.chip.wait.mailbox.set_polling();
        } else {
            self.chip.wait.mailbox.clear_polling();
        }
    }

    fn has_work(&self) -> bool {
        self.chip.wait.mailbox.has_work()
    }

    fn wake_cause(&self) -> Option<WakeCause> {
        self.chip.wait.mailbox.wake_cause()
    }

    fn clear_kick(&mut self) {
        self.cpu.clear_immediate_exit();
    }

    fn block_until(&mut self, until: Option<Nanos>, wake_on_work: bool) {
        self.chip.block_until(until, wake_on_work);
    }
}

#[cfg(test)]
#[path = "vcpu/saved_tests.rs"]
mod saved_tests;
#[cfg(test)]
#[path = "vcpu_tests.rs"]
mod tests;
