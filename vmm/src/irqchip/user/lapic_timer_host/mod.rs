//! The LAPIC timer's host side, one owner for it: the host timer armed in the vCPU's timer
//! model for the guest's LAPIC deadline and what it was armed for, the learned advance
//! ([`advance`]), the tick deferral of a short deadline armed with interrupts off
//! ([`tick_defer`], with its stale tick: [`stale_tick`]), and the timer slack's reading of a
//! wake-up ([`slack`]). The chip (`vcpu/lapic_timer.rs`) tells it what the guest did and
//! carries out what it answers, so every decision of the arm path is made here, over a
//! vCPU's [`CpuTimers`] and VM-clock times: it runs on a fake clock and fake host timers.
//!
//! ```text
//!  guest arms D at an exit ─► arm_for_guest: IF=0 and D near? ─► tick at D + grace (deferred)
//!                                          otherwise ─────────► tick at D - advance
//!  HLT / exit with IF=1 ────► end_deferral: the usual tick again; due already? taken here
//!                             due_at_exit: its tick due? taken out of the model, handled here
//!  tick fired (or taken) ───► fired: learn the advance; Expiry { wait until D if early }
//!  interrupt made pending ──► delivered: lateness, split at the slack range's end
//! ```

pub mod advance;
pub mod slack;
pub mod stale_tick;
pub mod tick_defer;

use std::sync::atomic::Ordering;

use timer::{CpuTimers, Nanos, TimerHandle, TimerKind};

use self::advance::TimerAdvance;
use self::slack::{advance_latency, split_lateness};
use self::tick_defer::{DeferredFire, TickDefer};
use crate::config::knobs::{TimerAdvanceMode, TimerSlack};
use crate::idle::vcpu_timer::VcpuTimer;
use crate::state::counters::VcpuCounters;

/// One vCPU's LAPIC timer, host side.
#[derive(Debug)]
pub struct LapicTimerHost {
    /// Its host timer in the vCPU's timer model, while armed.
    handle: Option<TimerHandle>,
    /// When that host timer is armed for (the deadline less the advance, or a deferred tick).
    armed_at: Option<Nanos>,
    advance: TimerAdvance,
    /// Whether the host tick is deferred past the deadline (`tick_defer.rs`).
    tick_defer: TickDefer,
    /// Taken out of the timer model at an exit, due: the next service pass counts it as fired
    /// on this thread.
    taken: bool,
    slack: TimerSlack,
}

/// An expiry of the LAPIC timer, as [`LapicTimerHost::fired`] judged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    /// The guest's deadline.
    pub deadline: Nanos,
    /// Wait (spin) until then before the interrupt is made pending: the host timer came
    /// early by the advance, and the interrupt is never early.
    pub wait_until: Option<Nanos>,
    /// How early its host timer was armed (deadline less armed time).
    advance_ns: u64,
}

impl LapicTimerHost {
    /// Nothing armed, the advance in `advance` mode, wake-ups read with `slack`.
    pub fn new(advance: TimerAdvanceMode, slack: TimerSlack) -> Self {
        Self {
            handle: None,
            armed_at: None,
            advance: TimerAdvance::new(advance),
            tick_defer: TickDefer::default(),
            taken: false,
            slack,
        }
    }

    /// When the halted vCPU's own wake-up is armed for: the host timer, if armed.
    pub fn wake_at(&self) -> Option<Nanos> {
        self.handle.and(self.armed_at)
    }

    /// The current advance.
    pub fn advance_ns(&self) -> u64 {
        self.advance.advance_ns()
    }

    /// Arms the host timer for `deadline`, early by the learned advance.
    pub fn arm(&mut self, timers: &mut dyn CpuTimers<VcpuTimer>, deadline: Nanos) {
        self.tick_defer.clear();
        self.arm_host(timers, self.advance.arm_at(deadline));
    }

    /// A deadline the guest armed at `now`, at an exit where it could (`interruptible`) or
    /// could not take interrupts: its host tick deferred past it or as usual. True if
    /// deferred.
    pub fn arm_for_guest(
        &mut self,
        timers: &mut dyn CpuTimers<VcpuTimer>,
        now: Nanos,
        deadline: Nanos,
        interruptible: bool,
    ) -> bool {
        match self.tick_defer.arm(now, deadline, interruptible) {
            Some(at) => {
                self.arm_host(timers, at);
                true
            }
            None => {
                self.arm(timers, deadline);
                false
            }
        }
    }

    /// The guest cancelled its timer.
    pub fn cancel(&mut self, timers: &mut dyn CpuTimers<VcpuTimer>) {
        self.tick_defer.clear();
        if let Some(h) = self.handle.take() {
            timers.cancel(h);
        }
    }

    /// The guest halts, or exited able to take interrupts, at `now`, its deadline `deadline`:
    /// a deferred tick goes back to its usual time. Not when the deferred tick itself is due:
    /// that exit is its doing, a miss. True if the timer is due at this exit, which the guest
    /// chose (no host wake-up latency to learn): taken, the caller flags it for its next
    /// service pass.
    pub fn end_deferral(
        &mut self,
        timers: &mut dyn CpuTimers<VcpuTimer>,
        now: Nanos,
        deadline: Option<Nanos>,
    ) -> bool {
        if !self.tick_defer.guest_exited(now) {
            return false;
        }
        let Some(deadline) = deadline else {
            return false;
        };
        if self.advance.arm_at(deadline) <= now {
            self.armed_at = None;
            self.take(timers);
            true
        } else {
            self.arm(timers, deadline);
            false
        }
    }

    /// At an exit the guest chose (a HLT, or one where it can take interrupts) at `now`: true
    /// if the host tick is due (its deadline less the advance), then taken out of the timer
    /// model and handled on this exit. `pull` would fire it at this exit's pass anyway;
    /// `central` fires it on its timer thread and `push` may on another vCPU's, which then
    /// kick this one: for a deadline already past, a hop of two thread wake-ups.
    pub fn due_at_exit(&mut self, timers: &mut dyn CpuTimers<VcpuTimer>, now: Nanos) -> bool {
        if self.armed_at.is_some_and(|at| at <= now) {
            self.take(timers);
            return true;
        }
        false
    }

    /// Whether the timer was taken at an exit since the last service pass (then counted as
    /// fired on this thread); once.
    pub fn take_taken(&mut self) -> bool {
        std::mem::take(&mut self.taken)
    }

    /// Whether a host tick armed for an ended deferral is to be moved by this timer pass.
    pub fn take_stale(&mut self) -> bool {
        self.tick_defer.take_stale()
    }

    /// The host timer fired, or was taken, noticed at `now` (`ran_on`: it ended guest code
    /// that could take interrupts); the guest's deadline is `deadline`: learns the advance
    /// and says how to deliver the expiry (`None`: no deadline any more).
    pub fn fired(
        &mut self,
        now: Nanos,
        ran_on: bool,
        deadline: Option<Nanos>,
        counters: &VcpuCounters,
    ) -> Option<Expiry> {
        self.handle = None;
        if let Some(fire) = self.tick_defer.fired(ran_on) {
            // No advance to learn from a tick armed after the deadline. A miss (the guest ran
            // on without an exit) backs off; a late one does not.
            self.armed_at = None;
            let counter = match fire {
                DeferredFire::Missed => &counters.ticks_deferred_missed,
                DeferredFire::Late => &counters.ticks_deferred_late,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let deadline = deadline?;
        let mut advance_ns = 0;
        if let Some(armed_at) = self.armed_at.take() {
            advance_ns = deadline.saturating_sub(armed_at);
            // With slack the advance learns the host's delay past the range, not the slack.
            let latency = advance_latency(armed_at, now, self.slack);
            self.advance
                .learn(armed_at, armed_at.saturating_add(latency));
            counters
                .timer_advance_ns
                .store(self.advance.advance_ns(), Ordering::Relaxed);
        }
        Some(Expiry {
            deadline,
            wait_until: self.advance.wait_until(deadline, now),
            advance_ns,
        })
    }

    /// The interrupt of `expiry` is made pending at `now`: records its lateness, split at the
    /// end of the slack's range.
    pub fn delivered(&self, expiry: Expiry, now: Nanos, counters: &VcpuCounters) {
        if expiry.deadline <= now {
            counters.record_lateness(now - expiry.deadline);
            let late = split_lateness(expiry.deadline, expiry.advance_ns, self.slack, now);
            counters.record_late_past_range(late.host_ns);
        }
    }

    /// Takes the host timer out of the timer model for this thread's next service pass.
    fn take(&mut self, timers: &mut dyn CpuTimers<VcpuTimer>) {
        if let Some(h) = self.handle.take() {
            // `None`: the model fired it already (and flagged the mailbox itself).
            if timers.cancel(h).is_some() {
                self.taken = true;
            }
        }
    }

    /// Arms the host timer at `at`.
    fn arm_host(&mut self, timers: &mut dyn CpuTimers<VcpuTimer>, at: Nanos) {
        self.armed_at = Some(at);
        if let Some(h) = self.handle {
            if timers.rearm(h, at) {
                return;
            }
        }
        self.handle = Some(timers.arm(TimerKind::Pinned, at, VcpuTimer::Lapic));
    }
}

#[cfg(test)]
mod tests;
