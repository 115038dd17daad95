//! Timer advance, after KVM's adaptive `lapic_timer_advance`: a vCPU's host timer for its
//! LAPIC deadline is armed early by the wake-up latency the vCPU has been seeing, and when it
//! fires early the vCPU waits (spins) until the deadline before the interrupt is made pending,
//! so the guest gets its interrupt as soon after the deadline as the host allows and never
//! before it.
//!
//! The advance is learned per vCPU: after each expiry, the latency (time from the host timer's
//! armed instant to the vCPU handling it) moves the advance an eighth of the way towards it,
//! within `[0, max]`; `max` also bounds how long one wait may burn.

use crate::config::knobs::TimerAdvanceMode;

/// The advance moves by 1/ADJUST_DIVISOR of its error per expiry.
const ADJUST_DIVISOR: u64 = 8;

/// The longest one wait may burn in `mode` (the bound of the advance, 0 when off).
fn max_wait_ns(mode: TimerAdvanceMode) -> u64 {
    match mode {
        TimerAdvanceMode::Off => 0,
        TimerAdvanceMode::Adaptive { max_ns } | TimerAdvanceMode::Fixed(max_ns) => max_ns,
    }
}

/// One vCPU's timer advance.
#[derive(Debug, Clone)]
pub struct TimerAdvance {
    mode: TimerAdvanceMode,
    advance_ns: u64,
}

impl TimerAdvance {
    /// The advance of a vCPU in `mode` (adaptive starts at 0).
    pub fn new(mode: TimerAdvanceMode) -> Self {
        let advance_ns = match mode {
            TimerAdvanceMode::Fixed(ns) => ns,
            _ => 0,
        };
        Self { mode, advance_ns }
    }

    /// The current advance.
    pub fn advance_ns(&self) -> u64 {
        self.advance_ns
    }

    /// When to arm the host timer for a LAPIC deadline.
    pub fn arm_at(&self, deadline: u64) -> u64 {
        deadline.saturating_sub(self.advance_ns)
    }

    /// The timer armed at `armed_at` was handled at `now`: learn from the latency.
    pub fn learn(&mut self, armed_at: u64, now: u64) {
        let TimerAdvanceMode::Adaptive { max_ns: max } = self.mode else {
            return;
        };
        let latency = now.saturating_sub(armed_at).min(max);
        let a = self.advance_ns;
        self.advance_ns = if latency > a {
            a + (latency - a) / ADJUST_DIVISOR
        } else {
            a - (a - latency) / ADJUST_DIVISOR
        }
        .min(max);
    }

    /// Handled at `now` before `deadline`: wait until the deadline (`Some`), or re-arm for it
    /// (`None`) if that is further away than an advance may burn.
    pub fn wait_until(&self, deadline: u64, now: u64) -> Option<u64> {
        (deadline > now && deadline - now <= max_wait_ns(self.mode)).then_some(deadline)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn off_never_advances_and_fixed_stays() {
        let mut off = TimerAdvance::new(TimerAdvanceMode::Off);
        off.learn(0, 80_000);
        assert_eq!(off.arm_at(1_000_000), 1_000_000);
        assert_eq!(off.wait_until(1_000_000, 999_999), None);
        let mut fixed = TimerAdvance::new(TimerAdvanceMode::Fixed(20_000));
        fixed.learn(0, 80_000);
        assert_eq!(fixed.arm_at(1_000_000), 980_000);
    }

    proptest! {
        /// The advance converges towards a steady latency, never past `max`, and a wait never
        /// burns more than `max` nor ends before the deadline.
        #[test]
        fn adaptive_converges_within_its_bound(
            max in 1_000u64..500_000,
            latency in 0u64..1_000_000,
            deadline in 1_000_000u64..1_000_000_000,
            now_before in 0u64..1_000_000,
        ) {
            let mut a = TimerAdvance::new(TimerAdvanceMode::Adaptive { max_ns: max });
            for _ in 0..200 {
                let armed = a.arm_at(deadline);
                a.learn(armed, armed + latency);
                prop_assert!(a.advance_ns() <= max);
            }
            let target = latency.min(max);
            prop_assert!(a.advance_ns().abs_diff(target) <= ADJUST_DIVISOR, "{} vs {target}", a.advance_ns());
            let now = deadline - now_before.min(deadline);
            if let Some(until) = a.wait_until(deadline, now) {
                prop_assert_eq!(until, deadline);
                prop_assert!(deadline - now <= max);
            }
        }
    }
}
