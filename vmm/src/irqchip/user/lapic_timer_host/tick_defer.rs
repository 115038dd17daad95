//! Deferred ticks: the host tick of a short LAPIC deadline that the guest arms while it cannot
//! take interrupts (RFLAGS.IF clear at the exit, as inside its timer interrupt handler) is
//! armed a grace period *after* the deadline instead of the timer advance before it, and the
//! deferral ends at the guest's next exit that halts or can take interrupts.
//!
//! Why: a guest that re-arms its deadline from its timer handler (WRMSR, EOI, the rest of the
//! handler, then `sti; hlt`) cannot take the interrupt before its `sti`, and on our hosts,
//! where guest kernel code is emulated, the rest of the handler may outlast a short deadline.
//! A tick at the deadline then stops the guest in the middle of its handler for nothing: the
//! interrupt waits for the `sti; hlt` anyway, whose HLT exits to lull, which injects it
//! there. KVM's in-kernel LAPIC pays that interruption inside the kernel; lull pays a
//! signal, KVM_RUN's return and re-entry, and the guest's progress meanwhile. With the tick
//! deferred, the HLT (or the first exit with interrupts enabled) is where the expiry is
//! handled: at the HLT the timer goes back to its usual host tick, due at once if the
//! deadline is near, and the interrupt is injected on that same exit.
//!
//! ```text
//!  WRMSR exit, IF=0, deadline D <= now + DEFER_WITHIN_NS, not backing off
//!      -> host tick at D + GRACE_NS (deferred)
//!  later exit: HLT, or IF=1       -> usual tick (D - advance): due now? handled at this exit
//!                                    the deferral worked: the back-off halves
//!  the tick at D + GRACE_NS fires -> the guest ran on, interrupts enabled, without an exit:
//!    (a miss)                        the interrupt was up to GRACE_NS late; the vCPU arms
//!                                    its next `backoff` deadlines as usual (1, 2, 4, ...
//!                                    MAX_SKIP) before it defers again
//!  ... or finds IF=0, or the vCPU    late, no back-off: the guest could not have taken it
//!    halted after D + GRACE_NS       earlier (its thread was preempted in the handler, or
//!                                    the handler ran long); ticking as usual would only
//!                                    interrupt the next handlers
//! ```
//!
//! What it costs a guest that does enable interrupts and runs on without exits (returns from
//! its handler into a busy loop): one deadline up to GRACE_NS late, then fewer and fewer
//! tries. Long deadlines (beyond DEFER_WITHIN_NS) and deadlines armed with interrupts enabled
//! are never deferred.

use timer::Nanos;

use super::stale_tick::StaleTick;

/// Only deadlines at most this far ahead of their arming are deferred.
pub const DEFER_WITHIN_NS: u64 = 200_000;
/// How long after the deadline the deferred tick fires if the guest has not exited by then.
/// 150 us: a guest that re-arms from its handler arms again tens of microseconds after the
/// HLT that ended the last deferral (on our hosts, where guest kernel code is emulated, the
/// interrupt's delivery and the handler's first instructions alone take that). With 100 us
/// the tick left stale at that HLT was seldom far enough away to keep until the arm
/// (`stale_tick.rs`), and a disarm plus an arm cost ~14 us of host timer programming per
/// deadline (`timer_settime` reprograms the host's emulated clock-event device).
pub const GRACE_NS: u64 = 150_000;
/// The most deadlines a vCPU arms as usual after a missed deferral before it tries again.
pub const MAX_SKIP: u32 = 256;

/// What a deferred tick that fired found ([`TickDefer::fired`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeferredFire {
    /// The guest ran on with interrupts enabled and no exit: the vCPU backs off.
    Missed,
    /// The guest still had interrupts off, or had halted by then: late, no back-off.
    Late,
}

/// One vCPU's deferral: the deferred tick, if any, what becomes of a host tick armed for one
/// that ended, and how many deadlines to arm as usual before deferring again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickDefer {
    /// When the deferred tick fires, while one is deferred.
    tick: Option<Nanos>,
    /// The host tick of an ended deferral (`stale_tick.rs`).
    stale: StaleTick,
    backoff: u32,
    skip: u32,
}

impl TickDefer {
    /// A deadline the guest arms at `now`, `interruptible` or not at that exit: when its
    /// deferred host tick fires, or `None` to arm it as usual.
    pub fn arm(&mut self, now: Nanos, deadline: Nanos, interruptible: bool) -> Option<Nanos> {
        self.tick = None;
        self.stale.armed(now);
        if interruptible || deadline <= now || deadline - now > DEFER_WITHIN_NS {
            return None;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        self.tick = Some(deadline.saturating_add(GRACE_NS));
        self.tick
    }

    /// The timer was cancelled or re-armed as usual: nothing deferred any more.
    pub fn clear(&mut self) {
        self.tick = None;
        self.stale.changed();
    }

    /// The guest halted or could take interrupts at an exit at `now`: true if that ends a
    /// deferral (the timer goes back to its usual tick; the one armed for the deferral is
    /// stale). Not at the exit of the deferred tick itself: [`Self::fired`] judges that one.
    pub fn guest_exited(&mut self, now: Nanos) -> bool {
        match self.tick {
            Some(tick) if now < tick => {
                self.tick = None;
                self.stale.deferral_ended(now, tick);
                self.backoff /= 2;
                true
            }
            _ => false,
        }
    }

    /// The timer's host tick fired: `None` if it was not a deferred one. `ran_on`: it ended
    /// guest code that could take interrupts (not a halt, not RFLAGS.IF clear), the guest
    /// running on without an exit, which is a miss and backs off. Otherwise the deferral was
    /// right but its grace too short for this once (the vCPU thread was preempted in the
    /// handler, or the handler ran long): late, no back-off, or every preemption on a loaded
    /// host would send the next deadlines' ticks into the handler that defers them.
    pub fn fired(&mut self, ran_on: bool) -> Option<DeferredFire> {
        self.tick.take()?;
        if !ran_on {
            return Some(DeferredFire::Late);
        }
        self.backoff = (self.backoff * 2).clamp(1, MAX_SKIP);
        self.skip = self.backoff;
        Some(DeferredFire::Missed)
    }

    /// Whether a host tick armed for an ended deferral is to be moved by this timer pass
    /// (once; a kept one only after the guest's next arm: `stale_tick.rs`).
    pub fn take_stale(&mut self) -> bool {
        self.stale.take_move()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use timer::{Clock, FakeClock};

    use super::*;

    #[test]
    fn only_short_deadlines_armed_with_interrupts_off_are_deferred() {
        let clock = FakeClock::new(1_000_000);
        let now = clock.now();
        let mut d = TickDefer::default();
        let short = now + 77_000;
        assert_eq!(d.arm(now, short, false), Some(short + GRACE_NS));
        assert_eq!(
            d.arm(now, short, true),
            None,
            "the guest can take it: tick as usual"
        );
        let long = now + DEFER_WITHIN_NS + 1;
        assert_eq!(d.arm(now, long, false), None, "a long deadline");
        assert_eq!(d.arm(now, now, false), None, "already due");
    }

    #[test]
    fn a_miss_backs_off_and_deferrals_that_work_win_it_back() {
        let clock = FakeClock::new(0);
        let mut d = TickDefer::default();
        let arm = |d: &mut TickDefer| {
            let now = clock.now();
            d.arm(now, now + 50_000, false).is_some()
        };
        // The guest exits by itself: the deferral ends once, the armed tick is stale once.
        assert!(arm(&mut d));
        assert!(d.guest_exited(clock.now() + 60_000));
        assert!(
            !d.guest_exited(clock.now() + 60_000),
            "nothing deferred any more"
        );
        assert!(d.take_stale() && !d.take_stale());
        assert_eq!(d.fired(true), None, "a usual tick is no miss");
        // The deferred tick fires (the exit at its time is its own, not the guest's).
        assert!(arm(&mut d));
        assert!(!d.guest_exited(clock.now() + 50_000 + GRACE_NS));
        assert_eq!(d.fired(true), Some(DeferredFire::Missed));
        // One deadline as usual, then a try.
        assert!(!arm(&mut d));
        assert!(arm(&mut d));
        assert_eq!(d.fired(true), Some(DeferredFire::Missed));
        assert!(!arm(&mut d) && !arm(&mut d));
        assert!(arm(&mut d));
        assert!(d.guest_exited(clock.now()));
        assert!(arm(&mut d));
        assert!(d.guest_exited(clock.now()));
        assert!(arm(&mut d));
        assert_eq!(d.fired(true), Some(DeferredFire::Missed));
        assert!(
            !arm(&mut d),
            "a miss after the back-off was won back skips one again"
        );
        assert!(arm(&mut d));
        d.clear();
        assert_eq!(d.fired(true), None, "a cancelled deferral is no miss");
    }

    /// A deferred tick that finds the guest still unable to take interrupts (its thread was
    /// preempted in the handler) or halted is late, not a miss: the next short deadline armed
    /// with interrupts off is deferred again, and a real miss still backs off.
    #[test]
    fn a_tick_that_finds_interrupts_off_or_a_halt_is_late_and_does_not_back_off() {
        let clock = FakeClock::new(0);
        let mut d = TickDefer::default();
        let arm = |d: &mut TickDefer| {
            clock.advance(200_000);
            let now = clock.now();
            d.arm(now, now + 50_000, false).is_some()
        };
        for _ in 0..3 {
            assert!(arm(&mut d));
            assert_eq!(d.fired(false), Some(DeferredFire::Late));
        }
        assert!(arm(&mut d), "late ticks leave the deferral on");
        assert_eq!(d.fired(true), Some(DeferredFire::Missed));
        assert!(!arm(&mut d), "a miss backs off");
        assert!(arm(&mut d));
        assert_eq!(d.fired(false), Some(DeferredFire::Late));
        assert!(
            arm(&mut d),
            "a late tick neither backs off nor adds to the back-off"
        );
        assert_eq!(d.fired(true), Some(DeferredFire::Missed));
        assert!(
            !arm(&mut d) && !arm(&mut d),
            "the second miss in a row skips two"
        );
    }

    proptest! {
        /// Whatever the outcomes, a deferred tick is never before its deadline nor more than
        /// GRACE_NS after it; after a miss the vCPU never defers more than once in a row of
        /// `backoff + 1` arms until a deferral works again, and a late tick (interrupts off or
        /// halted when it fired) leaves the next deferral free to come at once.
        #[test]
        fn a_deferred_tick_is_bounded_and_misses_back_off(
            steps in prop::collection::vec((0u64..400_000, any::<bool>(), 0u8..3), 1..200),
        ) {
            let clock = FakeClock::new(0);
            let mut d = TickDefer::default();
            let mut misses_in_a_row = 0u32;
            // Arms owed as usual before the next deferral (at least), and arms since the last try.
            let mut owed = 0u32;
            let mut since_try = u32::MAX;
            for (ahead, interruptible, outcome) in steps {
                clock.advance(1_000);
                let now = clock.now();
                let deferrable = !interruptible && ahead > 0 && ahead <= DEFER_WITHIN_NS;
                match d.arm(now, now + ahead, interruptible) {
                    Some(tick) => {
                        prop_assert!(deferrable);
                        prop_assert_eq!(tick, now + ahead + GRACE_NS);
                        prop_assert!(since_try >= owed, "tried after {since_try} < {owed}");
                        since_try = 0;
                        match outcome {
                            0 => {
                                prop_assert!(d.guest_exited(now + ahead));
                                misses_in_a_row = 0;
                                owed = 0;
                            }
                            1 => {
                                prop_assert_eq!(d.fired(false), Some(DeferredFire::Late));
                                // Owes nothing: the next deferrable arm must defer at once.
                                let next = clock.now() + 1;
                                prop_assert!(d.arm(next, next + 50_000, false).is_some());
                                d.clear();
                                owed = 0;
                            }
                            _ => {
                                prop_assert_eq!(d.fired(true), Some(DeferredFire::Missed));
                                misses_in_a_row += 1;
                                owed = (1u32 << (misses_in_a_row - 1).min(8)).min(MAX_SKIP);
                            }
                        }
                    }
                    None => {
                        if deferrable {
                            since_try = since_try.saturating_add(1);
                        }
                    }
                }
            }
        }
    }
}
