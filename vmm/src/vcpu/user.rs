//! The vCPU run loop of `--irqchip user`: lull's own LAPIC, HLT and timers.
//!
//! One iteration: drain the mailbox into the LAPIC, run due timers, inject the highest
//! pending interrupt (or ask for an interrupt window), KVM_RUN, handle the exit. HLT blocks the
//! thread through the timer model (`CpuTimers::idle` gives the timeout) until its own timer,
//! an interrupt aimed at it, or VM control wakes it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use devices::lapic::{InitSipiState, Lapic, LapicEffects, LapicEvents, LapicTimerChange};
use kvm_bindings::{kvm_regs, kvm_sregs};
use kvm_ioctls::{VcpuExit, VcpuFd};
use timer::{AfterFire, Clock, CpuTimers, Fired, Nanos, TimerHandle, TimerKind};
use vmm_sys_util::ioctl::ioctl_with_ref;

use super::apic_base::{sync_kvm_apic_base, MSR_IA32_APIC_BASE};
use super::exit::{ExitContext, StopReason, VcpuAction};
use super::halt::Halt;
use super::user_exit::{handle_user_exit, UserExitContext};
use crate::idle::global_load::GlobalLoad;
use crate::idle::halt_poll::HaltPoller;
use crate::idle::IdleShared;
use crate::irqchip::clock::VmClock;
use crate::irqchip::kick;
use crate::irqchip::mailbox::Mailbox;
use crate::irqchip::router::InterruptRouter;
use crate::metrics::VcpuCounters;
use crate::ratelimit::LogLimiter;
use crate::vm::VmShared;

/// KVM_INTERRUPT, which kvm-ioctls does not wrap.
mod raw {
    #[allow(unused_imports)]
    use ioctl_ioc_nr as _;
    use vmm_sys_util::{ioctl_ioc_nr, ioctl_iow_nr};

    const KVMIO: u32 = 0xAE;
    ioctl_iow_nr!(KVM_INTERRUPT, KVMIO, 0x86, kvm_bindings::kvm_interrupt);
}
use raw::KVM_INTERRUPT;

/// What a vCPU's timers carry: which of its timers fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VcpuTimer {
    /// Its LAPIC timer (pinned).
    Lapic,
    /// The start of the next idle-injection window (pinned).
    IdleInject,
    /// A CPU-quota check (pinned): the budget may be used up by now.
    QuotaCheck,
    /// A synthetic device/housekeeping deadline (global), by load slot.
    Global(u32),
}

/// What one pass over the timers fired, for the thread that ran it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FiredSummary {
    /// Pinned timers of this vCPU (LAPIC, injection, quota).
    pub own_pinned: u32,
    /// Global timers of this vCPU's own base.
    pub own_global: u32,
    /// Global timers of other vCPUs (this one is a migrator).
    pub remote_global: u32,
}

/// The expiry callback every thread uses. Pinned timers flag their owner's mailbox (and kick
/// it if they fired on another thread); global ones are queued for re-arming, nobody is woken.
pub fn on_timer_fired(
    router: &InterruptRouter,
    global: Option<&GlobalLoad>,
    summary: &mut FiredSummary,
    fired: Fired<VcpuTimer>,
) -> AfterFire {
    let notify = |flag: fn(&Mailbox)| {
        if let Some(mailbox) = router.mailbox(fired.cpu) {
            flag(mailbox);
        }
        if fired.remote {
            AfterFire::NotifyOwner
        } else {
            AfterFire::Done
        }
    };
    match fired.payload {
        VcpuTimer::Lapic => {
            summary.own_pinned += 1;
            notify(Mailbox::flag_timer)
        }
        VcpuTimer::IdleInject | VcpuTimer::QuotaCheck => {
            summary.own_pinned += 1;
            notify(Mailbox::flag_recheck)
        }
        VcpuTimer::Global(slot) => {
            if fired.remote {
                summary.remote_global += 1;
            } else {
                summary.own_global += 1;
            }
            if let Some(g) = global {
                g.fired(slot);
            }
            AfterFire::Done
        }
    }
}

/// Everything one user-irqchip vCPU thread owns.
pub struct UserVcpu<E: LapicEvents> {
    /// The KVM vCPU.
    pub vcpu: VcpuFd,
    /// Its index (= APIC ID).
    pub id: u32,
    /// Its LAPIC.
    pub lapic: Lapic<E>,
    /// Its timers, in the VM's timer model.
    pub timers: Box<dyn CpuTimers<VcpuTimer>>,
    /// The interrupt fabric.
    pub router: Arc<InterruptRouter>,
    /// The VM clock.
    pub clock: VmClock,
    /// Shared VM state.
    pub shared: Arc<VmShared>,
    /// The architectural reset state, for INIT.
    pub reset_regs: kvm_regs,
    /// The architectural reset state, for INIT.
    pub reset_sregs: kvm_sregs,
    /// Unimplemented-MSR log limiter (VM-wide).
    pub unknown_msr: Arc<LogLimiter>,
    /// The armed LAPIC timer.
    pub lapic_timer: Option<TimerHandle>,
    /// The idle manager's VM-wide state.
    pub idle: Arc<IdleShared>,
    /// This vCPU's halt poller.
    pub poller: HaltPoller,
    /// The armed idle-injection timer and its deadline.
    pub inject_timer: Option<(TimerHandle, Nanos)>,
    /// The armed quota-check timer and its deadline.
    pub quota_timer: Option<(TimerHandle, Nanos)>,
    /// Whether this vCPU's share of the global-timer load is armed.
    pub global_armed: bool,
}

impl<E: LapicEvents> UserVcpu<E> {
    fn mailbox(&self) -> Option<Arc<Mailbox>> {
        self.router.mailbox(self.index()).cloned()
    }

    fn index(&self) -> usize {
        usize::try_from(self.id).unwrap_or(usize::MAX)
    }

    fn counters(&self) -> &VcpuCounters {
        &self.shared.vcpu_counters[self.index()]
    }

    /// Runs the vCPU until the VM stops.
    pub fn run(mut self) {
        let Some(mailbox) = self.mailbox() else {
            self.shared.stop.request(StopReason::VmmError(format!(
                "vCPU {} has no mailbox",
                self.id
            )));
            return;
        };
        mailbox.bind_current_thread();
        if let Err(e) = crate::seccomp::apply(crate::seccomp::ThreadKind::Vcpu) {
            self.shared
                .stop_from_thread(StopReason::VmmError(e.to_string()));
            return;
        }
        kick::register_vcpu_thread(self.vcpu.get_kvm_run());
        let reason = self.run_loop(&mailbox);
        kick::unregister_vcpu_thread();
        if let Some(reason) = reason {
            self.shared.stop_from_thread(reason);
        }
    }

    fn run_loop(&mut self, mailbox: &Mailbox) -> Option<StopReason> {
        loop {
            if self.shared.stop.is_requested() {
                return None;
            }
            let now = self.clock.now();
            self.service(mailbox, now);
            if self.lapic.init_sipi_state() != InitSipiState::Running {
                match self.wait_for_sipi(mailbox) {
                    Ok(true) => continue,
                    Ok(false) => return None,
                    Err(reason) => return Some(reason),
                }
            }
            if self.idle_manager_holds(mailbox, now) {
                continue;
            }
            self.inject();
            let entered = self.clock.now();
            let result = self.vcpu.run();
            let now = self.clock.now();
            if let Some(quota) = &self.idle.quota {
                quota.charge(now, now.saturating_sub(entered));
            }
            let mut effects = None;
            let action = match result {
                Ok(VcpuExit::InternalError) => VcpuAction::Stop(StopReason::GuestCrash(format!(
                    "KVM internal error on vCPU {}",
                    self.id
                ))),
                Ok(exit) => {
                    let index = usize::try_from(self.id).unwrap_or(usize::MAX);
                    let mut ctx = UserExitContext {
                        base: ExitContext {
                            vcpu: self.id,
                            pio: &self.shared.pio,
                            counters: &self.shared.vcpu_counters[index],
                            noise: &self.shared.noise,
                        },
                        lapic: &mut self.lapic,
                        router: &self.router,
                        now,
                        unknown_msr: &self.unknown_msr,
                    };
                    let outcome = handle_user_exit(exit, &mut ctx);
                    effects = outcome.effects;
                    outcome.action.unwrap_or(VcpuAction::Continue)
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.counters().interrupted.fetch_add(1, Ordering::Relaxed);
                    VcpuAction::Continue
                }
                Err(e) => VcpuAction::Stop(StopReason::VmmError(format!(
                    "KVM_RUN on vCPU {}: {e}",
                    self.id
                ))),
            };
            self.vcpu.set_kvm_immediate_exit(0);
            if let Some(effects) = effects {
                self.apply(effects);
            }
            match action {
                VcpuAction::Continue => {}
                VcpuAction::BootComplete => self.shared.mark_booted(),
                VcpuAction::Halted => {
                    if let Halt::Stop = self.halt(mailbox) {
                        return None;
                    }
                }
                VcpuAction::Stop(reason) => return Some(reason),
            }
        }
    }

    /// Applies what a LAPIC write asks for.
    fn apply(&mut self, effects: LapicEffects) {
        match effects.timer {
            LapicTimerChange::Arm { deadline_ns } => self.arm_lapic_timer(deadline_ns),
            LapicTimerChange::Cancel => {
                if let Some(h) = self.lapic_timer.take() {
                    self.timers.cancel(h);
                }
            }
            LapicTimerChange::Unchanged => {}
        }
        if effects.destination_changed {
            self.router
                .update_destination(self.index(), self.lapic.destination_info());
        }
        if let Some(ipi) = effects.ipi {
            self.router.send_ipi(&ipi);
        }
        if effects.base_change.is_some() {
            // KVM derives CPUID.1:EDX[9] from its own copy of the MSR (vcpu/apic_base.rs).
            if let Ok(value) = self.lapic.read_msr(MSR_IA32_APIC_BASE, self.clock.now()) {
                sync_kvm_apic_base(&self.vcpu, self.id, value);
            }
        }
        if let Some(eoi) = effects.eoi {
            if eoi.level_triggered {
                self.router.end_of_interrupt(eoi.vector);
            }
        }
    }

    fn arm_lapic_timer(&mut self, deadline: Nanos) {
        if let Some(h) = self.lapic_timer {
            if self.timers.rearm(h, deadline) {
                return;
            }
        }
        self.lapic_timer = Some(
            self.timers
                .arm(TimerKind::Pinned, deadline, VcpuTimer::Lapic),
        );
    }

    /// Drains the mailbox, runs due timers and the LAPIC timer, re-arms queued global timers.
    pub(crate) fn service(&mut self, mailbox: &Mailbox, now: Nanos) -> FiredSummary {
        for ipi in mailbox.take_mail() {
            self.lapic.receive(&ipi);
        }
        mailbox.take_recheck();
        self.rearm_global_load(now);
        let summary = self.run_timers(now);
        // Re-arm the global timers that just fired at once, and cover them with the host tick.
        if summary.own_global + summary.remote_global > 0 && self.rearm_global_load(now) {
            self.sync_host_tick(now);
        }
        self.idle_timers_fired(now);
        if mailbox.take_timer_due() {
            self.lapic_timer = None;
            if let Some(deadline) = self.lapic.timer_deadline() {
                if deadline <= now {
                    self.counters().record_lateness(now - deadline);
                }
            }
            if let Some(next) = self.lapic.timer_fired(now) {
                self.arm_lapic_timer(next);
            }
        }
        for _ in 0..self.lapic.take_nmi() {
            let _ = self.vcpu.nmi();
        }
        summary
    }

    /// Runs the timer pass again (after arming a timer outside [`Self::service`]), so that
    /// the host tick covers the new deadline.
    pub(crate) fn sync_host_tick(&mut self, now: Nanos) {
        self.run_timers(now);
    }

    /// One pass of the timer model: expires what is due (this vCPU's timers, and other
    /// vCPUs' global ones if it is a migrator), programs the host tick, counts global fires.
    fn run_timers(&mut self, now: Nanos) -> FiredSummary {
        let router = self.router.clone();
        let idle = self.idle.clone();
        let mut summary = FiredSummary::default();
        self.timers.run(now, &mut |fired| {
            on_timer_fired(&router, idle.global.as_ref(), &mut summary, fired)
        });
        let global_fires = u64::from(summary.own_global + summary.remote_global);
        if global_fires > 0 {
            self.counters()
                .global_timer_fires
                .fetch_add(global_fires, Ordering::Relaxed);
        }
        summary
    }

    /// Arms this vCPU's share of the global-timer load once it runs, and re-arms the load's
    /// fired timers on this vCPU's base.
    fn rearm_global_load(&mut self, now: Nanos) -> bool {
        let Some(global) = self.idle.global.as_ref() else {
            return false;
        };
        let mut slots = global.take_pending();
        if !self.global_armed && self.lapic.init_sipi_state() == InitSipiState::Running {
            self.global_armed = true;
            slots.extend(global.initial_slots(self.id));
        }
        let armed = !slots.is_empty();
        for slot in slots {
            let deadline = global.next_deadline(slot, now);
            self.timers
                .arm(TimerKind::Global, deadline, VcpuTimer::Global(slot));
        }
        armed
    }

    /// Injects the highest pending interrupt if the guest can take it, else asks KVM for an
    /// interrupt window.
    fn inject(&mut self) {
        let Some(vector) = self.lapic.next_interrupt() else {
            self.vcpu.get_kvm_run().request_interrupt_window = 0;
            return;
        };
        let run = self.vcpu.get_kvm_run();
        if run.ready_for_interrupt_injection != 0 && run.if_flag != 0 {
            let irq = kvm_bindings::kvm_interrupt {
                irq: u32::from(vector),
            };
            // SAFETY: KVM_INTERRUPT reads one kvm_interrupt from `irq`, which outlives the
            // call; the fd is this thread's vCPU.
            let rc = unsafe { ioctl_with_ref(&self.vcpu, KVM_INTERRUPT(), &irq) };
            if rc == 0 {
                self.lapic.interrupt_injected(vector);
                self.counters().injected.fetch_add(1, Ordering::Relaxed);
            }
            let more = self.lapic.next_interrupt().is_some();
            self.vcpu.get_kvm_run().request_interrupt_window = u8::from(more);
        } else {
            run.request_interrupt_window = 1;
        }
    }

    /// An AP (or a vCPU after INIT) waits for its start-up IPI. Ok(false): the VM stops.
    fn wait_for_sipi(&mut self, mailbox: &Mailbox) -> Result<bool, StopReason> {
        let vcpu_err =
            |what: &str, e: kvm_ioctls::Error| StopReason::VmmError(format!("{what} on vCPU: {e}"));
        // INIT: back to the architectural reset state.
        self.vcpu
            .set_regs(&self.reset_regs)
            .map_err(|e| vcpu_err("KVM_SET_REGS", e))?;
        self.vcpu
            .set_sregs(&self.reset_sregs)
            .map_err(|e| vcpu_err("KVM_SET_SREGS", e))?;
        loop {
            if self.shared.stop.is_requested() {
                return Ok(false);
            }
            if let Some(vector) = self.lapic.take_sipi() {
                let mut sregs = self.reset_sregs;
                sregs.cs.selector = u16::from(vector) << 8;
                sregs.cs.base = u64::from(vector) << 12;
                self.vcpu
                    .set_sregs(&sregs)
                    .map_err(|e| vcpu_err("KVM_SET_SREGS", e))?;
                let regs = kvm_regs {
                    rip: 0,
                    rflags: 2,
                    ..self.reset_regs
                };
                self.vcpu
                    .set_regs(&regs)
                    .map_err(|e| vcpu_err("KVM_SET_REGS", e))?;
                return Ok(true);
            }
            // Idle in the timer model while waiting, so that in `pull` a vCPU that has not
            // started never holds migrator duty; its timers still run when due.
            self.block_until(mailbox, None, true);
            let now = self.clock.now();
            self.service(mailbox, now);
        }
    }
}
