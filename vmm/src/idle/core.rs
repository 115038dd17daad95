//! The idle core: every decision a user-irqchip vCPU makes about not running guest code, as
//! plain functions over the VM clock's time that return what to do. `halt.rs` carries the
//! decisions out (spins, blocks, holds) over the chip; this file decides, so it is tested
//! with a fake clock and a fake host timer, without KVM.
//!
//! ```text
//!           before every entry                        HLT exit
//!   ┌──────────────────────────────┐     ┌──────────────────────────────────────┐
//!   │ IdleCore::hold(now)          │     │ HaltSession::step(now, runnable)     │
//!   │  in an injection window? ───►│Hold │  runnable ──────────────► Resume     │
//!   │  quota used up? ────────────►│     │  first time: budget>0 ──► Poll{until}│
//!   │  else arm the next window /  │Run  │  otherwise ─────────────► Block      │
//!   │  quota check as pinned timers│     │ (a block wakes at the timer model's  │
//!   └──────────────────────────────┘     │  timeout: the next own deadline)     │
//!                                        └──────────────────────────────────────┘
//! ```
//!
//! Rules the tests hold it to: a poll never runs past the next pinned deadline; a block
//! never sleeps past it either; a vCPU never enters the guest inside an injection window or
//! with its quota used up; the idle manager's own timers never wake a halted vCPU (they are
//! cancelled at HLT and re-armed when it runs).

use timer::{CpuTimers, Nanos, TimerHandle, TimerKind, NEVER};

use super::halt_poll::{HaltPoller, WakeKind};
use super::shared::IdleShared;
use super::vcpu_timer::{FiredSummary, VcpuTimer};

/// Shortest interval between two CPU-quota checks of a running vCPU.
pub const MIN_QUOTA_CHECK_NS: u64 = 100_000;

/// Why the idle manager holds a vCPU out of the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldReason {
    /// An idle-injection window.
    Inject,
    /// The VM's CPU quota is used up for this period.
    Quota,
}

/// The idle manager's verdict before an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Enter the guest.
    Run {
        /// A pinned timer was armed: the host tick must be re-programmed before entry.
        armed: bool,
    },
    /// Stay out of the guest until `until` (VM clock); interrupts and timers wait.
    Until {
        /// When the hold ends.
        until: Nanos,
        /// Why.
        reason: HoldReason,
    },
}

/// What woke a blocked vCPU, as its mailbox tells it (before it is drained).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeCause {
    /// An interrupt (IPI or device) was posted.
    Interrupt,
    /// One of its timers fired on another thread.
    Timer,
    /// VM control (stop).
    Control,
}

/// How a wake-up from a block is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeCount {
    /// Its own timer (pinned, or one that made an interrupt pending).
    OwnTimer,
    /// An interrupt posted by another vCPU or a device.
    Interrupt,
    /// VM control.
    Control,
    /// A global timer (its own, or one it expired as migrator).
    GlobalTimer,
    /// Nothing to do: an empty wake-up.
    Empty,
}

impl WakeCount {
    /// What the halt poller learns from it.
    pub fn kind(self) -> WakeKind {
        match self {
            Self::OwnTimer => WakeKind::OwnTimer,
            _ => WakeKind::Other,
        }
    }
}

/// Classifies a wake-up from what the mailbox said and what the timer pass after it fired.
pub fn classify_wake(
    cause: Option<WakeCause>,
    fired: FiredSummary,
    interrupt_pending: bool,
) -> WakeCount {
    match cause {
        Some(WakeCause::Control) => WakeCount::Control,
        Some(WakeCause::Interrupt) => WakeCount::Interrupt,
        Some(WakeCause::Timer) => WakeCount::OwnTimer,
        None if fired.own_pinned > 0 => WakeCount::OwnTimer,
        // A device timer's callback may have raised the interrupt that is now pending: the
        // wake-up is the device timer's.
        None if fired.device > 0 => WakeCount::GlobalTimer,
        None if interrupt_pending => WakeCount::OwnTimer,
        None if fired.global() > 0 => WakeCount::GlobalTimer,
        None => WakeCount::Empty,
    }
}

/// When a block ends: the timer model's timeout (if work wakes the vCPU), or the hold's end.
pub fn block_deadline(model_timeout: Nanos, until: Option<Nanos>, wake_on_work: bool) -> Nanos {
    let model = if wake_on_work { model_timeout } else { NEVER };
    model.min(until.unwrap_or(NEVER))
}

/// One vCPU's idle-manager state: its halt poller and the pinned timers that end its run
/// at the next injection window or quota check.
#[derive(Debug)]
pub struct IdleCore {
    poller: HaltPoller,
    inject_timer: Option<(TimerHandle, Nanos)>,
    quota_timer: Option<(TimerHandle, Nanos)>,
    cpus: u64,
}

impl IdleCore {
    /// The idle core of one vCPU of a VM with `cpus` vCPUs.
    pub fn new(shared: &IdleShared, cpus: usize) -> Self {
        Self {
            poller: HaltPoller::new(shared.halt_poll),
            inject_timer: None,
            quota_timer: None,
            cpus: u64::try_from(cpus).unwrap_or(1).max(1),
        }
    }

    /// The halt poller.
    pub fn poller(&self) -> &HaltPoller {
        &self.poller
    }

    /// Before an entry at `now`: hold the vCPU, or let it run with the timers that will
    /// stop it at the next injection window and quota check armed.
    pub fn hold(
        &mut self,
        now: Nanos,
        shared: &IdleShared,
        timers: &mut dyn CpuTimers<VcpuTimer>,
        to_monotonic: impl Fn(Nanos) -> u64,
    ) -> Hold {
        let mut armed = false;
        if let Some(inj) = &shared.inject {
            if let Some(end) = inj.window_end(now) {
                return Hold::Until {
                    until: end,
                    reason: HoldReason::Inject,
                };
            }
            let start = inj.next_window_start(now);
            if self.inject_timer.map(|(_, d)| d) != Some(start) {
                cancel(timers, &mut self.inject_timer);
                let h = timers.arm(TimerKind::Pinned, start, VcpuTimer::IdleInject);
                self.inject_timer = Some((h, start));
                armed = true;
            }
        }
        if let Some(quota) = &shared.quota {
            if let Some(until) = quota.throttled_until(now, to_monotonic) {
                cancel(timers, &mut self.quota_timer);
                return Hold::Until {
                    until,
                    reason: HoldReason::Quota,
                };
            }
            if self.quota_timer.is_none() {
                let check = now + (quota.remaining(now) / self.cpus).max(MIN_QUOTA_CHECK_NS);
                let h = timers.arm(TimerKind::Pinned, check, VcpuTimer::QuotaCheck);
                self.quota_timer = Some((h, check));
                armed = true;
            }
        }
        Hold::Run { armed }
    }

    /// HLT: the idle manager's own timers must not wake a halted vCPU (re-armed when it runs).
    pub fn halt_begins(&mut self, timers: &mut dyn CpuTimers<VcpuTimer>) {
        cancel(timers, &mut self.inject_timer);
        cancel(timers, &mut self.quota_timer);
    }

    /// Forgets the idle-manager timers that fired by `now` (their handles are stale).
    pub fn timers_fired(&mut self, now: Nanos) {
        if self.inject_timer.is_some_and(|(_, d)| d <= now) {
            self.inject_timer = None;
        }
        if self.quota_timer.is_some_and(|(_, d)| d <= now) {
            self.quota_timer = None;
        }
    }

    /// Starts the handling of one HLT at `now`.
    pub fn halt_session(&self, now: Nanos) -> HaltSession {
        HaltSession {
            start: now,
            polled: false,
            poll_won: false,
            blocked: false,
            last_wake: WakeKind::Other,
            timed: None,
        }
    }

    /// The next step of `session` at `now`. `runnable`: an interrupt the guest can take is
    /// pending, or INIT/SIPI changed its state; `next_pinned`: its next pinned deadline.
    pub fn halt_step(
        &mut self,
        session: &mut HaltSession,
        now: Nanos,
        runnable: bool,
        next_pinned: Option<Nanos>,
    ) -> HaltStep {
        // Classified once, at the halt's first step: its timer may fire or move later.
        let timed = *session.timed.get_or_insert(next_pinned.is_some());
        if runnable {
            let won = session.poll_won && !session.blocked;
            self.poller.record(
                now.saturating_sub(session.start),
                won,
                session.last_wake,
                timed,
            );
            return HaltStep::Resume;
        }
        if !session.polled {
            session.polled = true;
            let budget = self.poller.budget(now, next_pinned);
            if budget > 0 {
                return HaltStep::Poll {
                    until: now.saturating_add(budget),
                    deadline: next_pinned,
                };
            }
        }
        session.blocked = true;
        HaltStep::Block
    }
}

fn cancel(timers: &mut dyn CpuTimers<VcpuTimer>, slot: &mut Option<(TimerHandle, Nanos)>) {
    if let Some((h, _)) = slot.take() {
        timers.cancel(h);
    }
}

/// The course of one HLT: polled yet, won, blocked, what last woke it, and whether a pinned
/// deadline was armed when it began (which of the poller's windows learns from it).
#[derive(Debug, Clone, Copy)]
pub struct HaltSession {
    start: Nanos,
    polled: bool,
    poll_won: bool,
    blocked: bool,
    last_wake: WakeKind,
    timed: Option<bool>,
}

impl HaltSession {
    /// The poll ended; `won`: a wake-up came during it.
    pub fn polled(&mut self, won: bool) {
        self.poll_won = won;
    }

    /// The vCPU woke (or a timer pass fired its own timer) for this kind of reason.
    pub fn woke(&mut self, kind: WakeKind) {
        self.last_wake = kind;
    }
}

/// What a halted vCPU does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HaltStep {
    /// Back to the guest.
    Resume,
    /// Spin watching for a wake-up until `until`, or until `deadline` (its own timer) passes.
    Poll {
        /// End of the poll window (never past `deadline`).
        until: Nanos,
        /// The next pinned deadline.
        deadline: Option<Nanos>,
    },
    /// Block in the timer model until its own timer, an interrupt or VM control.
    Block,
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
