//! The host tick of an ended deferral (`tick_defer.rs`): moved at once, or kept armed until
//! the guest arms its next deadline.
//!
//! A deferral ends at the guest's HLT (or an exit where it can take interrupts), usually with
//! its deadline due there: the interrupt is injected on that exit, and the host tick armed a
//! grace after the deadline is left for nothing. Disarming it at once costs a `timer_settime`
//! that reprograms the host's clock-event device (it is the CPU's earliest timer), on the way
//! back into the guest; ~7 us on our hosts, where that device is itself emulated. A guest
//! that re-arms from its handler arms its next deadline soon after, which moves the tick
//! anyway (one reprogram instead of two). So the stale tick is kept while the guest is
//! expected to arm again well before it fires, going by how long it took lately:
//!
//! ```text
//!  deferral ends at `now`, stale tick at T:
//!    T - now >= KEEP_MARGIN x (learned time from a deferral's end to the next arm)
//!        -> kept: the next pass leaves it; the guest's next arm moves it (one reprogram)
//!    otherwise, or nothing learned yet
//!        -> moved: the next pass tracks the timers exactly (disarm or re-arm)
//!  a kept tick that fires first costs one exit for nothing; the late arm after it teaches
//!  the learned time to keep fewer
//! ```

use timer::Nanos;

/// Kept only if the stale tick is at least this many times the learned time to the next arm
/// away (a margin for the guest's variation). On our hosts, with idle-sim re-arming every
/// ~77 us: 3/2 left ~1.2-1.3 host timer programmings per deadline, 5/4 ~1.05, and the vCPU's
/// signals (every tick that fired, kept ones among them) stayed at 0.01-0.02 per deadline.
pub const KEEP_MARGIN_NUM: u64 = 5;
/// Denominator of the margin (5/4).
pub const KEEP_MARGIN_DEN: u64 = 4;
/// The learned time moves by 1/LEARN_DIVISOR of its error per sample.
const LEARN_DIVISOR: u64 = 8;

/// What becomes of a stale deferred tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum State {
    /// None stale.
    #[default]
    None,
    /// Left armed until the guest arms its timer again.
    Kept,
    /// To be moved by the next timer pass.
    Move,
}

/// One vCPU's stale deferred tick and how long its guest takes to arm again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaleTick {
    state: State,
    /// When the last deferral ended, until the next arm.
    ended_at: Option<Nanos>,
    /// Learned time from a deferral's end to the guest's next arm.
    to_next_arm_ns: Option<u64>,
}

impl StaleTick {
    /// A deferral ended at `now`; its host tick is armed for `tick_at`: kept or moved.
    pub fn deferral_ended(&mut self, now: Nanos, tick_at: Nanos) {
        self.ended_at = Some(now);
        // Compared without a division, so that a tick is kept only at 5/4 of the learned
        // time or more, exactly (a rounded-down margin kept ticks a few ns short of it).
        let keep = self.to_next_arm_ns.is_some_and(|t| {
            tick_at.saturating_sub(now).saturating_mul(KEEP_MARGIN_DEN)
                >= t.saturating_mul(KEEP_MARGIN_NUM)
        });
        self.state = if keep { State::Kept } else { State::Move };
    }

    /// The guest armed its timer at `now`: learns from the time since the deferral ended, and
    /// a kept tick is to be moved by the next pass.
    pub fn armed(&mut self, now: Nanos) {
        if let Some(ended) = self.ended_at.take() {
            let sample = now.saturating_sub(ended);
            self.to_next_arm_ns = Some(match self.to_next_arm_ns {
                None => sample,
                Some(t) if sample > t => t + (sample - t) / LEARN_DIVISOR,
                Some(t) => t - (t - sample) / LEARN_DIVISOR,
            });
        }
        self.changed();
    }

    /// The timer changed otherwise (cancelled, armed as usual): a kept tick is moved.
    pub fn changed(&mut self) {
        if self.state == State::Kept {
            self.state = State::Move;
        }
    }

    /// Whether the next timer pass must move the tick (once).
    pub fn take_move(&mut self) -> bool {
        if self.state == State::Move {
            self.state = State::None;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn moved_at_once_until_the_guest_has_been_seen_to_arm_soon_enough() {
        let mut s = StaleTick::default();
        assert!(!s.take_move(), "nothing stale");
        // Nothing learned: moved.
        s.deferral_ended(1_000_000, 1_080_000);
        assert!(s.take_move() && !s.take_move(), "moved once");
        // The guest arms 40 us after the end: a tick 80 us away is kept until then.
        s.armed(1_040_000);
        s.deferral_ended(2_000_000, 2_080_000);
        assert!(!s.take_move(), "kept");
        s.armed(2_040_000);
        assert!(s.take_move() && !s.take_move(), "the arm moves it, once");
        // A tick nearer than 5/4 of the learned time: moved at once.
        s.deferral_ended(3_000_000, 3_049_000);
        assert!(s.take_move());
        // Cancelled while kept: moved.
        s.armed(3_040_000);
        s.deferral_ended(4_000_000, 4_080_000);
        s.changed();
        assert!(s.take_move());
    }

    #[test]
    fn a_guest_that_arms_late_teaches_it_to_keep_fewer() {
        let mut s = StaleTick::default();
        s.deferral_ended(0, 80_000);
        s.armed(40_000);
        let mut t = 1_000_000;
        let mut kept = 0;
        for _ in 0..64 {
            s.deferral_ended(t, t + 80_000);
            if !s.take_move() {
                kept += 1;
            }
            // The guest now takes 120 us: every kept tick fires before the arm.
            s.armed(t + 120_000);
            s.take_move();
            t += 1_000_000;
        }
        assert!(kept > 0, "kept at first");
        s.deferral_ended(t, t + 80_000);
        assert!(s.take_move(), "kept {kept} times, then learned to move");
    }

    proptest! {
        /// Whatever the timings, a tick is kept only with something learned and at least
        /// KEEP_MARGIN of it away, and every kept tick is moved by the next arm or change.
        #[test]
        fn kept_only_far_enough_and_always_moved_by_the_next_arm(
            steps in prop::collection::vec((1u64..500_000, 1u64..500_000, any::<bool>()), 1..100),
        ) {
            let mut s = StaleTick::default();
            let mut t = 0u64;
            for (to_tick, to_arm, cancel) in steps {
                t += 1_000_000;
                let learned = s.to_next_arm_ns;
                s.deferral_ended(t, t + to_tick);
                let moved = s.take_move();
                if !moved {
                    let l = learned.expect("kept with nothing learned");
                    prop_assert!(to_tick * KEEP_MARGIN_DEN >= l * KEEP_MARGIN_NUM);
                    if cancel { s.changed() } else { s.armed(t + to_arm) }
                    prop_assert!(s.take_move(), "a kept tick outlived the next arm");
                } else if !cancel {
                    s.armed(t + to_arm);
                }
                prop_assert!(!s.take_move(), "moved twice");
            }
        }
    }
}
