//! The LAPIC timer, for [`VcpuChip`]: what the guest does with its timer handed to the
//! timer's host side (`lapic_timer_host`, which decides), and what it answers carried out:
//! the mailbox flagged for a timer taken at an exit, the wait for an early expiry's deadline.

use std::sync::atomic::Ordering;

use devices::lapic::{LapicEvents, LapicTimerChange};
use timer::{Nanos, VmTime};

use super::VcpuChip;

impl<E: LapicEvents + Send, C: VmTime> VcpuChip<E, C> {
    /// The guest halts, or exited able to take interrupts, at `now`: a deferred tick goes
    /// back to its usual time, or is handled at this exit if that has come.
    pub(super) fn end_tick_deferral(&mut self, now: Nanos) {
        let deadline = self.lapic.timer_deadline();
        if self
            .lapic_timer
            .end_deferral(self.timers.as_mut(), now, deadline)
        {
            self.wait.mailbox.flag_timer();
        }
    }

    /// At an exit the guest chose at `now`: a LAPIC timer whose host tick is due is handled
    /// on this exit, not by the timer model (see `LapicTimerHost::due_at_exit`).
    pub(super) fn lapic_timer_due_at_exit(&mut self, now: Nanos) {
        if self.lapic_timer.due_at_exit(self.timers.as_mut(), now) {
            self.wait.mailbox.flag_timer();
        }
    }

    /// The LAPIC timer's host timer fired (noticed at `now`; `ran_on`: it ended guest code
    /// that could take interrupts): waits for the deadline if it came early enough to,
    /// records the lateness; returns the time the expiry is handled at.
    pub(super) fn lapic_timer_due(&mut self, now: Nanos, ran_on: bool) -> Nanos {
        let deadline = self.lapic.timer_deadline();
        let Some(expiry) = self
            .lapic_timer
            .fired(now, ran_on, deadline, &self.counters)
        else {
            return now;
        };
        let mut now = now;
        if let Some(until) = expiry.wait_until {
            let start = now;
            while now < until {
                std::hint::spin_loop();
                now = self.clock.now();
            }
            self.counters
                .advance_wait_ns
                .fetch_add(now - start, Ordering::Relaxed);
        }
        self.lapic_timer.delivered(expiry, now, &self.counters);
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
            self.counters.record_lateness(0);
            self.counters.record_late_past_range(0);
        }
        match change {
            LapicTimerChange::Arm { deadline_ns } => {
                let now = self.clock.now();
                let timers = self.timers.as_mut();
                if self
                    .lapic_timer
                    .arm_for_guest(timers, now, deadline_ns, interruptible)
                {
                    self.counters.ticks_deferred.fetch_add(1, Ordering::Relaxed);
                }
            }
            LapicTimerChange::Cancel => self.lapic_timer.cancel(self.timers.as_mut()),
            LapicTimerChange::Unchanged => {}
        }
    }
}
