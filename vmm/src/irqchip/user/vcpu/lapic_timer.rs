//! The LAPIC timer's host timer, for [`VcpuChip`]: armed early by the learned advance
//! (`idle/advance.rs`), deferred past a short deadline the guest armed with interrupts off
//! (`idle/tick_defer.rs`), and on firing waited out to the deadline, with its lateness split
//! into the host's part and the timer slack's (`idle/slack.rs`).

use std::sync::atomic::Ordering;

use devices::lapic::{LapicEvents, LapicTimerChange};
use timer::{Nanos, TimerKind};

use super::VcpuChip;
use crate::idle::halt::VmTime;
use crate::idle::slack::{advance_latency, split_lateness};
use crate::idle::tick_defer::DeferredFire;
use crate::idle::vcpu_timer::VcpuTimer;

impl<E: LapicEvents + Send, C: VmTime> VcpuChip<E, C> {
    /// Arms the LAPIC timer's host timer for `deadline`, early by the learned advance.
    pub(super) fn arm_lapic_timer(&mut self, deadline: Nanos) {
        self.tick_defer.clear();
        self.arm_lapic_host_timer(self.advance.arm_at(deadline));
    }

    /// A deadline the guest armed at an exit where it could (`interruptible`) or could not
    /// take interrupts: its host tick deferred past it (see `idle/tick_defer.rs`) or as usual.
    pub(super) fn arm_lapic_timer_for_guest(&mut self, deadline: Nanos, interruptible: bool) {
        let now = self.clock.now();
        match self.tick_defer.arm(now, deadline, interruptible) {
            Some(at) => {
                self.counters.ticks_deferred.fetch_add(1, Ordering::Relaxed);
                self.arm_lapic_host_timer(at);
            }
            None => self.arm_lapic_timer(deadline),
        }
    }

    /// The guest halts, or exited able to take interrupts, at `now`: a deferred tick goes
    /// back to its usual time (the next timer pass handles it at once if that has come).
    /// Not when the deferred tick itself is due: that exit is its doing, a miss.
    pub(super) fn end_tick_deferral(&mut self, now: Nanos) {
        if !self.tick_defer.guest_exited(now) {
            return;
        }
        if let Some(deadline) = self.lapic.timer_deadline() {
            if self.advance.arm_at(deadline) <= now {
                // Due at this exit, which the guest chose: no host wake-up latency to learn.
                self.lapic_armed_at = None;
                self.take_due_lapic_timer();
            } else {
                self.arm_lapic_timer(deadline);
            }
        }
    }

    /// At an exit the guest chose (a HLT, or one where it can take interrupts) at `now`: a
    /// LAPIC timer whose host tick is due (its deadline less the advance) is handled on this
    /// exit, not by the timer model. `pull` would fire it at this exit's pass anyway; `central`
    /// fires it on its timer thread and `push` may on another vCPU's, which then kick this
    /// one: for a deadline already past, a hop of two thread wake-ups. The usual wait for the
    /// deadline (the advance), the lateness and the injection then come on this exit.
    pub(super) fn lapic_timer_due_at_exit(&mut self, now: Nanos) {
        if self.lapic_armed_at.is_some_and(|at| at <= now) {
            self.take_due_lapic_timer();
        }
    }

    /// Takes the LAPIC timer out of the timer model and flags it for this thread's next
    /// service pass, which counts it as fired on this thread (and judges a deferred tick
    /// whose time has come as if it had fired).
    fn take_due_lapic_timer(&mut self) {
        if let Some(h) = self.lapic_timer.take() {
            // `None`: the model fired it already (and flagged the mailbox itself).
            if self.timers.cancel(h).is_some() {
                self.lapic_taken = true;
            }
        }
        self.wait.mailbox.flag_timer();
    }

    /// Arms the LAPIC timer's host timer at `at`.
    pub(super) fn arm_lapic_host_timer(&mut self, at: Nanos) {
        self.lapic_armed_at = Some(at);
        if let Some(h) = self.lapic_timer {
            if self.timers.rearm(h, at) {
                return;
            }
        }
        self.lapic_timer = Some(self.timers.arm(TimerKind::Pinned, at, VcpuTimer::Lapic));
    }

    /// The LAPIC timer's host timer fired (noticed at `now`; `ran_on`: it ended guest code
    /// that could take interrupts): learns the advance, waits for the deadline if it came
    /// early enough to, records the lateness; returns the time the expiry is handled at.
    pub(super) fn lapic_timer_due(&mut self, now: Nanos, ran_on: bool) -> Nanos {
        self.lapic_timer = None;
        if let Some(fire) = self.tick_defer.fired(ran_on) {
            // No advance to learn from a tick armed after the deadline. A miss (the guest ran
            // on without an exit) backs off; a late one does not.
            self.lapic_armed_at = None;
            let counter = match fire {
                DeferredFire::Missed => &self.counters.ticks_deferred_missed,
                DeferredFire::Late => &self.counters.ticks_deferred_late,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let Some(deadline) = self.lapic.timer_deadline() else {
            return now;
        };
        let slack = self.idle.timer_slack;
        let mut advance_ns = 0;
        if let Some(armed_at) = self.lapic_armed_at.take() {
            advance_ns = deadline.saturating_sub(armed_at);
            // With slack the advance learns the host's delay past the range, not the slack.
            let latency = advance_latency(armed_at, now, slack);
            self.advance
                .learn(armed_at, armed_at.saturating_add(latency));
            self.counters
                .timer_advance_ns
                .store(self.advance.advance_ns(), Ordering::Relaxed);
        }
        let mut now = now;
        if let Some(until) = self.advance.wait_until(deadline, now) {
            let start = now;
            while now < until {
                std::hint::spin_loop();
                now = self.clock.now();
            }
            self.counters
                .advance_wait_ns
                .fetch_add(now - start, Ordering::Relaxed);
        }
        if deadline <= now {
            self.counters().record_lateness(now - deadline);
            let late = split_lateness(deadline, advance_ns, slack, now);
            self.counters().record_late_past_range(late.host_ns);
        }
        now
    }

    /// Carries out a LAPIC write's timer change. An expiry at the write itself (`expired`: a
    /// deadline already past, a settled expiry) is counted as a fire delivered with no delay
    /// of lull's: no host timer reports it, and every expiry must be accounted for.
    /// `interruptible`: whether the guest could take interrupts at the access.
    pub(super) fn apply_timer(
        &mut self,
        change: LapicTimerChange,
        expired: bool,
        interruptible: bool,
    ) {
        if expired {
            self.counters().record_lateness(0);
            self.counters().record_late_past_range(0);
        }
        match change {
            LapicTimerChange::Arm { deadline_ns } => {
                self.arm_lapic_timer_for_guest(deadline_ns, interruptible);
            }
            LapicTimerChange::Cancel => {
                self.tick_defer.clear();
                if let Some(h) = self.lapic_timer.take() {
                    self.timers.cancel(h);
                }
            }
            LapicTimerChange::Unchanged => {}
        }
    }
}
