//! Timer slack (`--timer-slack`): the range a halted vCPU's wake-up may fall in, and what a
//! delivery in it means, as pure functions over nanoseconds.
//!
//! ```text
//!             advance          slack S
//!        |<------------>|<--------------->|
//!   deadline - advance          deadline - advance + S         (the wake-up's range)
//!        [==============+=================]
//!                   deadline                  host delay past the range end is measured
//!   woken before the deadline: wait (spin) for it; the interrupt is never early
//! ```
//!
//! With slack on, the vCPU thread sleeps with a relative timeout to the range's start and its
//! thread timer slack (`PR_SET_TIMERSLACK`) set to S: the kernel's ranged hrtimer then expires
//! anywhere in the range, together with any other timer of that host CPU whose range overlaps
//! (another VM's vCPU, another vCPU of this one), so one CPU wake-up serves them all. With slack
//! off nothing changes: an absolute timerfd (which ignores the thread's slack) and a thread
//! slack of 1 ns, so the wake-up is as close to the range's start as the host allows.

use std::time::Duration;

use timer::Nanos;

use crate::config::knobs::TimerSlack;

/// The thread timer slack a vCPU thread runs with: 1 ns when off (Linux takes 0 as "the
/// default", 50 us), the slack when on.
pub fn thread_slack_ns(slack: TimerSlack) -> u64 {
    slack.ns().max(1)
}

/// Whether a halted vCPU waits on its hard timerfd (slack off) rather than a ranged timeout.
pub fn hard_wait(slack: TimerSlack) -> bool {
    !slack.is_on()
}

/// The instants a halted vCPU's wake-up for one timer may fall in (VM clock, inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakeRange {
    /// The deadline less the advance: the wake-up is never asked for before it.
    pub earliest: Nanos,
    /// `earliest` plus the slack: a wake-up past it is late by host delay.
    pub latest: Nanos,
}

impl WakeRange {
    /// The range of the wake-up for `deadline` with `advance_ns` of timer advance.
    pub fn new(deadline: Nanos, advance_ns: u64, slack: TimerSlack) -> Self {
        let earliest = deadline.saturating_sub(advance_ns);
        Self {
            earliest,
            latest: earliest.saturating_add(slack.ns()),
        }
    }

    /// True if a wake-up at `t` is within the range.
    pub fn contains(&self, t: Nanos) -> bool {
        (self.earliest..=self.latest).contains(&t)
    }
}

/// The relative timeout of a ranged wait that starts at `now` for a wake-up at `wake_at`
/// (the kernel adds the thread's slack); `None` if it is due already.
pub fn ranged_timeout(wake_at: Nanos, now: Nanos) -> Option<Duration> {
    (wake_at > now).then(|| Duration::from_nanos(wake_at - now))
}

/// When the interrupt of `deadline` is delivered by a vCPU woken at `woke`: a wake-up before
/// the deadline waits for it, so never before it.
pub fn delivered_at(deadline: Nanos, woke: Nanos) -> Nanos {
    woke.max(deadline)
}

/// A delivery's lateness, split at the end of its wake-up's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lateness {
    /// Lateness the slack allowed (up to the range's end).
    pub slack_ns: u64,
    /// Lateness past the range's end: the host's delay.
    pub host_ns: u64,
}

impl Lateness {
    /// The whole lateness.
    pub fn total(&self) -> u64 {
        self.slack_ns + self.host_ns
    }
}

/// Splits the lateness of a delivery at `delivered` for `deadline` (none if not after it)
/// into the part the range allowed and the host's delay past the range.
pub fn split_lateness(
    deadline: Nanos,
    advance_ns: u64,
    slack: TimerSlack,
    delivered: Nanos,
) -> Lateness {
    let late = delivered.saturating_sub(deadline);
    let allowed = WakeRange::new(deadline, advance_ns, slack)
        .latest
        .saturating_sub(deadline);
    let slack_ns = late.min(allowed);
    Lateness {
        slack_ns,
        host_ns: late - slack_ns,
    }
}

/// The latency the timer advance learns from when a host timer armed for `armed_at` is
/// handled at `handled`: the part past the range's end (with slack off, all of it). The
/// advance compensates the host's delay, not the slack the VM asked for: learning the slack
/// would make every wake-up early by it and the vCPU spin it away.
pub fn advance_latency(armed_at: Nanos, handled: Nanos, slack: TimerSlack) -> Nanos {
    handled.saturating_sub(armed_at).saturating_sub(slack.ns())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::config::MAX_TIMER_SLACK_NS;

    fn slack_of(ns: u64) -> TimerSlack {
        if ns == 0 {
            TimerSlack::Off
        } else {
            TimerSlack::Range(ns)
        }
    }

    #[test]
    fn off_is_hard() {
        assert_eq!(thread_slack_ns(TimerSlack::Off), 1);
        assert!(hard_wait(TimerSlack::Off));
        assert!(!hard_wait(TimerSlack::Range(1_000)));
        assert_eq!(thread_slack_ns(TimerSlack::Range(100_000)), 100_000);
        let r = WakeRange::new(1_000_000, 20_000, TimerSlack::Off);
        assert_eq!((r.earliest, r.latest), (980_000, 980_000));
        assert_eq!(ranged_timeout(980_000, 980_000), None);
        assert_eq!(
            ranged_timeout(980_000, 900_000),
            Some(Duration::from_nanos(80_000))
        );
    }

    #[test]
    fn a_lateness_splits_at_the_end_of_the_range() {
        let s = TimerSlack::Range(100_000);
        // Range [980us, 1080us] for a 1ms deadline: 80us of it after the deadline.
        let at = |t| split_lateness(1_000_000, 20_000, s, t);
        assert_eq!(at(990_000), Lateness::default());
        assert_eq!(
            at(1_050_000),
            Lateness {
                slack_ns: 50_000,
                host_ns: 0
            }
        );
        assert_eq!(
            at(1_100_000),
            Lateness {
                slack_ns: 80_000,
                host_ns: 20_000
            }
        );
        assert_eq!(advance_latency(980_000, 1_100_000, s), 20_000);
        assert_eq!(advance_latency(980_000, 1_000_000, s), 0);
        assert_eq!(advance_latency(980_000, 1_000_000, TimerSlack::Off), 20_000);
    }

    proptest! {
        /// Whatever the advance, slack and wake-up instant: the interrupt is never delivered
        /// before its deadline; a wake-up within the range is late by at most what the range
        /// allows after the deadline (no host part); one past it is late by the host's delay
        /// past the range's end; and off allows nothing.
        #[test]
        fn never_early_never_past_the_range_but_by_host_delay(
            deadline in 0u64..1_000_000_000_000,
            advance in 0u64..200_000,
            slack_ns in prop_oneof![Just(0u64), 1u64..=MAX_TIMER_SLACK_NS],
            woke_after_start in 0u64..20_000_000,
        ) {
            let slack = slack_of(slack_ns);
            let range = WakeRange::new(deadline, advance, slack);
            prop_assert!(range.earliest <= deadline);
            prop_assert_eq!(range.latest - range.earliest, slack_ns);
            let woke = range.earliest + woke_after_start;
            let delivered = delivered_at(deadline, woke);
            prop_assert!(delivered >= deadline, "early: {delivered} < {deadline}");
            let late = split_lateness(deadline, advance, slack, delivered);
            prop_assert_eq!(late.total(), delivered - deadline);
            prop_assert!(late.slack_ns <= slack_ns);
            if range.contains(woke) {
                prop_assert_eq!(late.host_ns, 0);
            } else {
                prop_assert_eq!(late.host_ns, delivered - range.latest.max(deadline));
            }
            if !slack.is_on() {
                prop_assert_eq!(late.slack_ns, 0);
                prop_assert_eq!(late.host_ns, delivered - deadline);
            }
        }

        /// A ranged wait's timeout ends exactly at the wake-up it was computed for.
        #[test]
        fn a_timeout_ends_at_its_wake_up(wake_at in 0u64..u64::MAX / 2, now in 0u64..u64::MAX / 2) {
            match ranged_timeout(wake_at, now) {
                Some(d) => prop_assert_eq!(now + u64::try_from(d.as_nanos()).unwrap(), wake_at),
                None => prop_assert!(wake_at <= now),
            }
        }

        /// The advance never learns the slack: a wake-up anywhere in the range teaches it no
        /// latency; past the range, exactly the delay past it.
        #[test]
        fn the_advance_learns_host_delay_only(
            armed in 0u64..1_000_000_000,
            slack_ns in 1u64..=MAX_TIMER_SLACK_NS,
            after in 0u64..20_000_000,
        ) {
            let learned = advance_latency(armed, armed + after, TimerSlack::Range(slack_ns));
            prop_assert_eq!(learned, after.saturating_sub(slack_ns));
        }
    }
}
