//! Halt polling: before a halted vCPU's thread blocks, it may spin for a short window watching
//! for a wake-up, which saves a host sleep/wake-up when one comes soon.
//!
//! `adaptive` grows and shrinks the window like KVM's `halt_poll_ns` with its defaults (start
//! 10 us, double on a short halt that polling would have caught, halve on a halt longer than
//! the maximum, down to zero below the start) but it
//! is timer-aware: it never polls past the vCPU's next pinned deadline (if that deadline falls
//! inside the window it polls exactly until it), and it skips polling when the next deadline
//! is beyond the window and the recent wake-ups were all the vCPU's own timer (nothing else
//! is expected to come). And it learns halts from halts like them: one window for halts with
//! a pinned deadline armed, one for halts without. A guest that sleeps on its timer between
//! bursts of IPIs (and halts with no timer armed while it waits for one) would otherwise have
//! each long timer sleep undo what its short IPI waits had grown, as in KVM's one window, and
//! never poll long enough for an IPI (`lull bench wakeup`'s wake-ipi guest;
//! docs/PERFORMANCE.md).
//!
//! A deadline nearer than a block and wake-up cost ([`NEAR_DEADLINE_NS`]) is polled to
//! whatever the window says, as KVM's halt polling does once its window has grown: a guest
//! that re-arms a short deadline from its handler and halts before it would otherwise pay
//! the host's wake-up on every event while the window learns (and again after every long
//! halt that halves it).

use crate::config::knobs::HaltPollMode;

/// KVM's default maximum window.
pub const MAX_WINDOW_NS: u64 = 200_000;
/// First window after a growth from zero (KVM's `halt_poll_ns_grow_start`).
pub const GROW_START_NS: u64 = 10_000;
/// What a long halt divides the window by (KVM's `halt_poll_ns_shrink` default). A single
/// long halt (a preemption, on a loaded host) then costs the window half its length, not all
/// of it and the short halts it takes to grow back.
pub const SHRINK: u64 = 2;
/// Consecutive own-timer wake-ups after which a far deadline means "don't poll".
pub const TIMER_ONLY_HISTORY: u32 = 4;
/// An adaptive poller polls to a pinned deadline at most this far away, whatever its window:
/// what a block and its wake-up cost on our hosts, a measured constant. idle-sim re-arming a
/// deadline 33 us past its HLT (`pattern=rearm-halt tail=0`, pull, timer advance off,
/// 2026-12-04, load 4.5): blocking made each event 65 us longer and its mean lateness 77 us
/// higher than polling to the deadline, for the same host CPU per event (187 against 194 us).
pub const NEAR_DEADLINE_NS: u64 = 100_000;

/// What woke a halted vCPU, as the poller learns from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeKind {
    /// Its own timer.
    OwnTimer,
    /// An interrupt (IPI or device), or anything else that made it runnable.
    Other,
}

/// One vCPU's halt-polling state.
#[derive(Debug, Clone)]
pub struct HaltPoller {
    mode: HaltPollMode,
    /// The adaptive window of halts with a pinned deadline armed.
    timed_window_ns: u64,
    /// The adaptive window of halts without one.
    untimed_window_ns: u64,
    timer_only_streak: u32,
}

impl HaltPoller {
    /// A poller in `mode`.
    pub fn new(mode: HaltPollMode) -> Self {
        Self {
            mode,
            timed_window_ns: 0,
            untimed_window_ns: 0,
            timer_only_streak: 0,
        }
    }

    /// The current window of halts with (`timed`) or without a pinned deadline armed.
    pub fn window_ns(&self, timed: bool) -> u64 {
        match self.mode {
            HaltPollMode::Off => 0,
            HaltPollMode::Fixed(ns) => ns,
            HaltPollMode::Adaptive if timed => self.timed_window_ns,
            HaltPollMode::Adaptive => self.untimed_window_ns,
        }
    }

    /// How long to poll now, given the vCPU's next pinned deadline (adaptive: until a deadline
    /// nearer than [`NEAR_DEADLINE_NS`], whatever the window).
    pub fn budget(&self, now: u64, next_pinned: Option<u64>) -> u64 {
        let until_timer = next_pinned.map_or(u64::MAX, |d| d.saturating_sub(now));
        match self.mode {
            HaltPollMode::Off => 0,
            HaltPollMode::Fixed(ns) => ns.min(until_timer),
            HaltPollMode::Adaptive => {
                let window = self.window_ns(next_pinned.is_some());
                if until_timer <= NEAR_DEADLINE_NS {
                    // Nearer than a block's cost: poll to it.
                    until_timer
                } else if window == 0 {
                    0
                } else if until_timer <= window {
                    until_timer
                } else if self.timer_only_streak >= TIMER_ONLY_HISTORY {
                    0
                } else {
                    window
                }
            }
        }
    }

    /// Learns from one halt: `halt_ns` from HLT to wake-up (poll and block), whether polling
    /// caught the wake-up, what woke the vCPU, and whether a pinned deadline was armed when
    /// it halted (`timed`: which window learns).
    pub fn record(&mut self, halt_ns: u64, won: bool, kind: WakeKind, timed: bool) {
        self.timer_only_streak = match kind {
            WakeKind::OwnTimer => self.timer_only_streak.saturating_add(1),
            WakeKind::Other => 0,
        };
        if self.mode != HaltPollMode::Adaptive || won {
            return;
        }
        let window = if timed {
            &mut self.timed_window_ns
        } else {
            &mut self.untimed_window_ns
        };
        if *window != 0 && halt_ns > MAX_WINDOW_NS {
            // A long halt: polling only burned CPU.
            *window /= SHRINK;
            if *window < GROW_START_NS {
                *window = 0;
            }
        } else if halt_ns > *window && halt_ns <= MAX_WINDOW_NS {
            // A short halt that a longer window would have caught.
            *window = if *window == 0 {
                GROW_START_NS
            } else {
                (*window * 2).min(MAX_WINDOW_NS)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_polls_past_the_next_pinned_deadline() {
        let p = HaltPoller::new(HaltPollMode::Fixed(100_000));
        assert_eq!(p.budget(1_000, Some(31_000)), 30_000);
        assert_eq!(p.budget(1_000, None), 100_000);
        assert_eq!(p.budget(50_000, Some(10_000)), 0);
        assert_eq!(HaltPoller::new(HaltPollMode::Off).budget(0, None), 0);
    }

    #[test]
    fn adaptive_grows_on_short_halts_and_shrinks_on_long_ones() {
        let mut p = HaltPoller::new(HaltPollMode::Adaptive);
        assert_eq!(p.budget(0, None), 0);
        p.record(5_000, false, WakeKind::Other, false);
        assert_eq!(p.window_ns(false), GROW_START_NS);
        p.record(15_000, false, WakeKind::Other, false);
        assert_eq!(p.window_ns(false), 20_000);
        for _ in 0..10 {
            p.record(190_000, false, WakeKind::Other, false);
        }
        assert_eq!(p.window_ns(false), MAX_WINDOW_NS);
        p.record(1_000, true, WakeKind::Other, false); // a won poll keeps the window
        assert_eq!(p.window_ns(false), MAX_WINDOW_NS);
        p.record(5_000_000, false, WakeKind::Other, false);
        assert_eq!(p.window_ns(false), MAX_WINDOW_NS / 2);
        for _ in 0..4 {
            p.record(5_000_000, false, WakeKind::Other, false);
        }
        // 100 -> 50 -> 25 -> 12.5 us, then below the start: none.
        assert_eq!(p.window_ns(false), 0);
    }

    #[test]
    fn adaptive_is_timer_aware() {
        let mut p = HaltPoller::new(HaltPollMode::Adaptive);
        p.record(5_000, false, WakeKind::Other, true);
        p.record(15_000, false, WakeKind::Other, true);
        let w = p.window_ns(true);
        assert_eq!(w, 20_000);
        // A deadline inside the window: poll exactly until it.
        assert_eq!(p.budget(0, Some(w / 2)), w / 2);
        // Only own-timer wake-ups lately and a far deadline: skip polling.
        for _ in 0..TIMER_ONLY_HISTORY {
            p.record(1_000_000, true, WakeKind::OwnTimer, true);
        }
        assert_eq!(p.budget(0, Some(10 * w)), 0);
        // ...but still poll up to a near deadline.
        assert_eq!(p.budget(0, Some(w / 4)), w / 4);
        // An interrupt wake-up resets the history.
        p.record(1_000, true, WakeKind::Other, true);
        assert_eq!(p.budget(0, Some(10 * w)), w);
    }

    /// A deadline nearer than a block's cost is polled to from the first halt, whatever the
    /// window or the own-timer history; one beyond it is not, until the window covers it.
    #[test]
    fn adaptive_polls_to_a_deadline_nearer_than_a_block() {
        let mut p = HaltPoller::new(HaltPollMode::Adaptive);
        assert_eq!(
            p.budget(1_000, Some(1_000 + NEAR_DEADLINE_NS)),
            NEAR_DEADLINE_NS
        );
        assert_eq!(p.budget(1_000, Some(41_000)), 40_000);
        assert_eq!(p.budget(1_000, Some(2_000 + NEAR_DEADLINE_NS)), 0);
        for _ in 0..TIMER_ONLY_HISTORY {
            p.record(1_000_000, true, WakeKind::OwnTimer, true);
        }
        assert_eq!(p.budget(0, Some(40_000)), 40_000);
        assert_eq!(p.budget(0, Some(NEAR_DEADLINE_NS + 1)), 0);
        // Off and a fixed window keep their meaning.
        assert_eq!(
            HaltPoller::new(HaltPollMode::Off).budget(0, Some(40_000)),
            0
        );
        let fixed = HaltPoller::new(HaltPollMode::Fixed(10_000));
        assert_eq!(fixed.budget(0, Some(40_000)), 10_000);
    }

    /// The wake-ipi pattern: a 1 ms sleep on the vCPU's own timer, then a halt with no timer
    /// armed that an IPI ends ~60 us later. One shared window would lose to every timer sleep
    /// what the IPI wait before it had grown, and never reach the IPI; the untimed window grows
    /// until its polls win, and the timer sleeps are never polled.
    #[test]
    fn timer_sleeps_do_not_reset_what_untimed_halts_learned() {
        let mut p = HaltPoller::new(HaltPollMode::Adaptive);
        let mut won_at = None;
        for round in 0..10 {
            let gap_budget = p.budget(0, Some(1_000_000));
            assert_eq!(gap_budget, 0, "round {round}: polled a 1 ms timer sleep");
            p.record(1_000_000, false, WakeKind::OwnTimer, true);
            let ipi_budget = p.budget(0, None);
            let won = ipi_budget >= 60_000;
            if won && won_at.is_none() {
                won_at = Some(round);
            }
            p.record(60_000, won, WakeKind::Other, false);
        }
        // 0 -> 10 -> 20 -> 40 -> 80 us: the fifth IPI halt polls long enough.
        assert_eq!(won_at, Some(4));
        assert_eq!(p.window_ns(false), 80_000);
        assert_eq!(p.window_ns(true), 0);
    }
}
