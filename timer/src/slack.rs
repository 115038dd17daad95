//! Timer slack for global timers (`--timer-slack` in lull): a global timer (a device's
//! refill, housekeeping) due at `e` may expire anywhere in `[e, e + slack]`, never before `e`.
//!
//! A running CPU expires its due timers at every exit, so what slack changes is only when
//! its host tick must fire at the latest: at its first pinned timer exactly (a guest's LAPIC
//! deadline is never deferred here), but at the *end* of the range of its first global timer
//! and of its hierarchy duty. Any exit before then serves them; if none comes, the tick at
//! the range's end serves every global expiry whose range it falls in (every one due by
//! then), so expiries within `slack` of each other cost one tick, not one each:
//!
//! ```text
//!   global expiries   e1  e2    e3                    e4
//!   ranges            [e1-----------+S]               [e4-----------+S]
//!   ticks, slack 0    ^   ^     ^                     ^            (one per expiry)
//!   ticks, slack S                  ^ e1+S: e1 e2 e3                ^ e4+S
//! ```
//!
//! A halted CPU's wake-up is not deferred here: the VMM sleeps with the host's own ranged
//! timeout (`[wake-up, wake-up + slack]`), which also batches wake-ups across processes.

use crate::clock::Nanos;

/// The deadline a running CPU's host tick must fire by: its first pinned timer, or the end
/// of the range of its first global timer or of its remote duty, whichever is first.
pub fn tick_deadline(pinned: Nanos, global: Nanos, remote: Nanos, slack: Nanos) -> Nanos {
    pinned.min(global.min(remote).saturating_add(slack))
}

/// True if an expiry at `t` of a timer due at `deadline` is within its range.
pub fn in_range(deadline: Nanos, t: Nanos, slack: Nanos) -> bool {
    deadline <= t && t <= deadline.saturating_add(slack)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::NEVER;

    #[test]
    fn pinned_timers_are_never_deferred_and_never_stays_never() {
        assert_eq!(tick_deadline(100, 50, NEVER, 0), 50);
        assert_eq!(tick_deadline(100, 50, NEVER, 30), 80);
        assert_eq!(tick_deadline(100, 50, 60, 80), 100);
        assert_eq!(tick_deadline(NEVER, NEVER, NEVER, 1_000), NEVER);
        assert_eq!(tick_deadline(NEVER, NEVER, 10, 5), 15);
        assert!(in_range(10, 10, 0) && in_range(10, 15, 5));
        assert!(!in_range(10, 9, 5) && !in_range(10, 16, 5));
    }
}
