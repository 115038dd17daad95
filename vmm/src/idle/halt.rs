//! The halt of a vCPU, top to bottom: everything a user-irqchip vCPU thread does while it
//! runs no guest code, carried out here as the idle core ([`IdleCore`]) decides it. The chip
//! is reached only through [`IdleChip`]: is the vCPU runnable, service its timers and mail,
//! wait until a deadline or a kick. So all of it runs on a fake chip and a fake clock.
//!
//! ```text
//!  before every entry (VcpuIdle::before_entry)     HLT exit (VcpuIdle::halt)
//!  ───────────────────────────────────────────     ─────────────────────────────────────────
//!  stop? ──────────────────────────► Stop          idle-side timers cancelled (halt_begins)
//!  service: mail, due timers                       ┌► service: mail, due timers
//!  in INIT? ───────────────────────► WaitForSipi   │  stop? ─────────────────────────► Stop
//!  IdleCore::hold                                  │  HaltSession step:
//!   Run: its window / quota timers armed ► Enter   │   runnable ──────────────────► Resume
//!   Until: block until the hold ends, ─┐           │   Poll: spin for mail or deadline ─┐
//!          count it, look again        │           │   Block: idle in the timer model,  │
//!  ◄───────────────────────────────────┘           │     wait for a kick or wake-up,    │
//!                                                  │     count what woke it             │
//!  INIT (VcpuIdle::wait_for_sipi):                 └────────────────────────────────────┘
//!  stop? ► None; SIPI? ► its vector; else block until mail, then service
//! ```
//!
//! What the idle core arms on the vCPU's timers (the injection window's start, the quota
//! check) it arms here, through [`IdleChip::timers`], and so is the synthetic global-timer
//! load (`--global-timers`) armed and re-armed, at each service; the chip arms only the
//! guest's own timers and the devices'.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use timer::{CpuTimers, Nanos, TimerKind, VmTime};

use super::core::{classify_wake, HaltStep, Hold, HoldReason, IdleCore, WakeCause, WakeCount};
use super::halt_poll::WakeKind;
use super::shared::IdleShared;
use super::vcpu_placement::VcpuPlacement;
use super::vcpu_timer::{FiredSummary, VcpuTimer};
use crate::state::counters::VcpuCounters;

/// What the vCPU does before the next entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Enter the guest.
    Enter,
    /// The vCPU is in INIT (an AP before its SIPI, or after an INIT IPI): wait for SIPI.
    WaitForSipi,
    /// The VM stops.
    Stop,
}

/// How a halt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HaltEnd {
    /// Back to the guest (or to INIT/SIPI handling: `before_entry` says which).
    Resume,
    /// The VM stops.
    Stop,
}

/// What the idle manager needs of one vCPU's chip (its LAPIC, timers and mailbox), on the
/// vCPU's thread: whether the vCPU is runnable, servicing its timers and mail, and waiting.
pub trait IdleChip {
    /// VM control asked the vCPU to stop.
    fn stop_requested(&self) -> bool;
    /// Takes the vCPU's mail and runs its due timers at `now` (the LAPIC timer too); what
    /// the timer passes fired.
    fn service(&mut self, now: Nanos) -> FiredSummary;
    /// A halted vCPU can run: an interrupt the guest takes (RFLAGS.IF as of the HLT), an
    /// INIT or SIPI, or an NMI KVM would deliver.
    fn runnable(&mut self) -> bool;
    /// An interrupt is pending in the LAPIC, whether the guest can take it or not.
    fn interrupt_pending(&self) -> bool;
    /// The vCPU is in INIT: it waits for a SIPI.
    fn in_init(&self) -> bool;
    /// The vector of a SIPI that came, taken.
    fn take_sipi(&mut self) -> Option<u8>;
    /// Its next pinned deadline (the LAPIC timer's).
    fn next_pinned(&self) -> Option<Nanos>;
    /// When its own wake-up is armed for: the LAPIC timer's host timer, if armed.
    fn wake_at(&self) -> Option<Nanos>;
    /// Its timers, where the idle core arms and cancels its own.
    fn timers(&mut self) -> &mut dyn CpuTimers<VcpuTimer>;
    /// One pass of its timers at `now`, which programs the host tick for timers just armed.
    fn run_timers(&mut self, now: Nanos);
    /// Tells senders that the vCPU spins watching [`Self::has_work`] (they then need not
    /// signal it), or no longer does.
    fn set_polling(&self, on: bool);
    /// Mail, an expired timer or VM control waits for the vCPU.
    fn has_work(&self) -> bool;
    /// What woke the vCPU from its last block, before [`Self::service`] takes it.
    fn wake_cause(&self) -> Option<WakeCause>;
    /// Clears a kick that landed while the vCPU was out of the guest (answered already).
    fn clear_kick(&mut self);
    /// Blocks the thread, idle in its timers, until `until` (VM clock), VM control and (with
    /// `wake_on_work`) mail or its wake-up.
    fn block_until(&mut self, until: Option<Nanos>, wake_on_work: bool);
}

/// One vCPU's idle manager: its idle core, wake placement, its share of the global-timer
/// load and the VM-wide idle state.
#[derive(Debug)]
pub struct VcpuIdle<C: VmTime> {
    /// The vCPU's index.
    id: u32,
    /// Its share of the global-timer load is armed (once it runs).
    global_armed: bool,
    core: IdleCore,
    shared: Arc<IdleShared>,
    placement: VcpuPlacement,
    counters: Arc<VcpuCounters>,
    clock: C,
    /// When the vCPU last entered the guest (charged to the quota after the exit).
    entered: Nanos,
}

impl<C: VmTime> VcpuIdle<C> {
    /// The idle manager of vCPU `id` of a VM with `cpus` vCPUs, counting in `counters`.
    pub fn new(
        shared: Arc<IdleShared>,
        id: u32,
        cpus: usize,
        clock: C,
        counters: Arc<VcpuCounters>,
    ) -> Self {
        Self {
            id,
            global_armed: false,
            core: IdleCore::new(&shared, cpus),
            placement: VcpuPlacement::new(shared.wake_placement),
            shared,
            counters,
            clock,
            entered: 0,
        }
    }

    /// On the vCPU thread, before its first run.
    pub fn attach(&mut self) {
        self.placement.attach();
    }

    /// Before an entry: services the vCPU and holds it while the idle core says so (an
    /// injection window, a used-up quota); says whether it enters, waits for SIPI or stops.
    pub fn before_entry(&mut self, chip: &mut impl IdleChip) -> Entry {
        loop {
            if chip.stop_requested() {
                return Entry::Stop;
            }
            let now = self.clock.now();
            self.service(chip, now);
            if chip.in_init() {
                return Entry::WaitForSipi;
            }
            let clock = &self.clock;
            let hold = self
                .core
                .hold(now, &self.shared, chip.timers(), |t| clock.to_monotonic(t));
            match hold {
                Hold::Run { armed } => {
                    if armed {
                        // Armed after this iteration's timer pass: program the host tick
                        // for it now, or KVM_RUN would not be interrupted in time.
                        chip.run_timers(now);
                    }
                    return Entry::Enter;
                }
                Hold::Until { until, reason } => self.hold_until(chip, now, until, reason),
            }
        }
    }

    /// The vCPU enters the guest now.
    pub fn entering(&mut self) {
        self.entered = self.clock.now();
    }

    /// KVM_RUN returned: the guest time since [`Self::entering`] is charged to the quota.
    pub fn ran(&self) {
        if let Some(quota) = &self.shared.quota {
            let now = self.clock.now();
            quota.charge(now, now.saturating_sub(self.entered));
        }
    }

    /// One HLT: service, poll or block until the vCPU can run again (or the VM stops).
    pub fn halt(&mut self, chip: &mut impl IdleChip) -> HaltEnd {
        self.core.halt_begins(chip.timers());
        let mut session = self.core.halt_session(self.clock.now());
        loop {
            // A kick that arrived while blocked is answered by the service below: clear it
            // so that the next KVM_RUN does not return at once.
            chip.clear_kick();
            let now = self.clock.now();
            if self.service(chip, now).own_pinned > 0 {
                session.woke(WakeKind::OwnTimer);
            }
            if chip.stop_requested() {
                return HaltEnd::Stop;
            }
            let runnable = chip.runnable();
            let next_pinned = chip.next_pinned();
            match self
                .core
                .halt_step(&mut session, now, runnable, next_pinned)
            {
                HaltStep::Resume => return HaltEnd::Resume,
                HaltStep::Poll { until, deadline } => {
                    let won = self.poll(chip, now, until, deadline);
                    session.polled(won);
                }
                HaltStep::Block => {
                    let count = self.halt_block(chip);
                    session.woke(count.kind());
                }
            }
        }
    }

    /// INIT state: blocks, serving timers and mail, until a SIPI (its vector) or the VM stops.
    pub fn wait_for_sipi(&mut self, chip: &mut impl IdleChip) -> Option<u8> {
        loop {
            if chip.stop_requested() {
                return None;
            }
            if let Some(vector) = chip.take_sipi() {
                return Some(vector);
            }
            // Idle in the timer model while waiting, so that in `pull` a vCPU that has not
            // started never holds migrator duty; its timers still run when due.
            chip.block_until(None, true);
            let now = self.clock.now();
            self.service(chip, now);
        }
    }

    /// Services the chip at `now` and forgets the idle core's timers that fired by then; the
    /// global-timer load's timers that fired (on any thread) are re-armed on this vCPU.
    fn service(&mut self, chip: &mut impl IdleChip, now: Nanos) -> FiredSummary {
        self.rearm_global_load(chip, now);
        let fired = chip.service(now);
        if fired.global() > 0 && self.rearm_global_load(chip, now) {
            // Re-armed after the chip's timer pass: cover them with the host tick.
            chip.run_timers(now);
        }
        self.core.timers_fired(now);
        fired
    }

    /// Arms this vCPU's share of the global-timer load once it runs (out of INIT), and
    /// re-arms the load's fired timers on this vCPU's timers. True if anything was armed.
    fn rearm_global_load(&mut self, chip: &mut impl IdleChip, now: Nanos) -> bool {
        let Some(global) = self.shared.global.as_ref() else {
            return false;
        };
        let mut slots = global.take_pending();
        if !self.global_armed && !chip.in_init() {
            self.global_armed = true;
            slots.extend(global.initial_slots(self.id));
        }
        let armed = !slots.is_empty();
        let timers = chip.timers();
        for slot in slots {
            let deadline = global.next_deadline(slot, now);
            timers.arm(TimerKind::Global, deadline, VcpuTimer::Global(slot));
        }
        armed
    }

    /// Holds the vCPU out of the guest until `until` (an injection window or a used-up
    /// quota); interrupts and timers wait for the end.
    fn hold_until(
        &mut self,
        chip: &mut impl IdleChip,
        now: Nanos,
        until: Nanos,
        reason: HoldReason,
    ) {
        let inject = self
            .shared
            .inject
            .as_ref()
            .filter(|_| reason == HoldReason::Inject);
        if let Some(inj) = inject {
            inj.enter_forced(now);
        }
        chip.block_until(Some(until), false);
        let left = self.clock.now();
        if let Some(inj) = inject {
            inj.leave_forced(left);
        }
        let counter = match reason {
            HoldReason::Inject => &self.counters.injected_idle_ns,
            HoldReason::Quota => &self.counters.throttled_ns,
        };
        counter.fetch_add(left.saturating_sub(now), Ordering::Relaxed);
    }

    /// Spins from `start` (when the poll was decided) until a wake-up comes, `deadline` (its
    /// own timer) passes, or `until`; true if the poll saw a wake-up.
    fn poll(
        &mut self,
        chip: &mut impl IdleChip,
        start: Nanos,
        until: Nanos,
        deadline: Option<Nanos>,
    ) -> bool {
        self.counters.polls.fetch_add(1, Ordering::Relaxed);
        // Senders then set the flags watched here without a signal (see `mailbox.rs`).
        chip.set_polling(true);
        let won = loop {
            if chip.has_work() || chip.stop_requested() {
                break true;
            }
            let t = self.clock.now();
            if deadline.is_some_and(|d| d <= t) {
                break true;
            }
            if t >= until {
                break false;
            }
            std::hint::spin_loop();
        };
        chip.set_polling(false);
        let c = &self.counters;
        c.poll_ns
            .fetch_add(self.clock.now().saturating_sub(start), Ordering::Relaxed);
        if won {
            c.polls_won.fetch_add(1, Ordering::Relaxed);
        }
        won
    }

    /// One block of a halted vCPU; counts what woke it.
    fn halt_block(&mut self, chip: &mut impl IdleChip) -> WakeCount {
        self.counters.blocks.fetch_add(1, Ordering::Relaxed);
        if let Some(inj) = &self.shared.inject {
            inj.enter_blocked(self.clock.now());
        }
        // Its own next wake-up: the LAPIC timer's host timer, if armed.
        let wake_at = chip.wake_at();
        let now = self.clock.now();
        self.placement.before_block(now, wake_at, &self.counters);
        chip.block_until(None, true);
        let now = self.clock.now();
        self.placement.after_wake(now, wake_at, &self.counters);
        if let Some(inj) = &self.shared.inject {
            inj.leave_blocked(now);
        }
        let cause = chip.wake_cause();
        chip.clear_kick();
        let fired = self.service(chip, now);
        let count = classify_wake(cause, fired, chip.interrupt_pending());
        let c = &self.counters;
        if fired.total() > 1 {
            c.wake_multi_expiry.fetch_add(1, Ordering::Relaxed);
            c.wake_coalesced
                .fetch_add(u64::from(fired.total() - 1), Ordering::Relaxed);
        }
        let w = &c.wakeups;
        let counter = match count {
            WakeCount::OwnTimer => &w.timer,
            WakeCount::Interrupt => &w.interrupt,
            WakeCount::Control => &w.control,
            WakeCount::GlobalTimer => &w.global_timer,
            WakeCount::Empty => &w.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        count
    }
}

#[cfg(test)]
#[path = "halt_tests.rs"]
mod tests;
