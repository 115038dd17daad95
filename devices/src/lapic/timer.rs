//! The LAPIC timer: one-shot, periodic and TSC-deadline modes over a caller-supplied clock.
//!
//! The timer owns no clock. Every operation takes `now_ns` (monotonic nanoseconds) and returns
//! what the caller must do with its host timer ([`LapicTimerChange`]). The count runs at
//! `bus_hz / divisor`, so a one-shot deadline is `now + initial * divisor * 1e9 / bus_hz` ns.
//! Periodic mode re-arms from the previous deadline, so it never drifts. [`TimerLimits`] floors
//! every future deadline so a guest cannot drive the host into a timer storm.
//!
//! A one-shot count that has already run out, or a TSC deadline at or before `now`, expires on
//! the spot (SDM 11.5.4.1: the interrupt is pending when the write completes): the write
//! reports [`TimerUpdate::expired`] and arms no host timer. That costs no storm protection:
//! every such expiry needs a guest register write, which is already an exit.
//!
//! Mode switches (LVT timer bits 18:17) follow the SDM and KVM's `apic_update_lvtt`: only a
//! switch into or out of TSC-deadline mode disarms the timer and clears the counts; between
//! one-shot and periodic the initial count and the running count are kept, and the new mode
//! decides what happens when the count reaches zero.

use super::events::LapicEvents;

const NS_PER_SEC: u128 = 1_000_000_000;

/// Default LAPIC timer input (bus) frequency: 1 GHz, like KVM's in-kernel LAPIC.
pub const DEFAULT_BUS_HZ: u64 = 1_000_000_000;

/// What the caller must do with the host timer that backs this LAPIC timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub enum LapicTimerChange {
    /// Keep whatever is armed (possibly nothing).
    #[default]
    Unchanged,
    /// Arm (or move) the host timer to fire at this monotonic time; call
    /// [`Lapic::timer_fired`](super::Lapic::timer_fired) once it has passed.
    Arm {
        /// Monotonic deadline in nanoseconds.
        deadline_ns: u64,
    },
    /// Disarm the host timer.
    Cancel,
}

impl LapicTimerChange {
    /// This change followed by `later`: the later one wins unless it is `Unchanged`.
    pub(crate) fn then(self, later: LapicTimerChange) -> LapicTimerChange {
        match later {
            LapicTimerChange::Unchanged => self,
            _ => later,
        }
    }
}

/// The outcome of a timer register write inside the LAPIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub(crate) struct TimerUpdate {
    /// What to do with the host timer.
    pub(crate) change: LapicTimerChange,
    /// The timer expired on the spot: raise its interrupt now.
    pub(crate) expired: bool,
}

impl From<LapicTimerChange> for TimerUpdate {
    fn from(change: LapicTimerChange) -> Self {
        TimerUpdate {
            change,
            expired: false,
        }
    }
}

/// Converts between guest TSC values and the caller's monotonic nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TscMap {
    /// Guest TSC frequency in kHz.
    pub tsc_khz: u64,
    /// Guest TSC value at monotonic time 0 ns.
    pub tsc_at_ns0: u64,
}

impl Default for TscMap {
    fn default() -> Self {
        TscMap {
            tsc_khz: 1_000_000,
            tsc_at_ns0: 0,
        }
    }
}

impl TscMap {
    /// The guest TSC at monotonic time `ns` (saturates at `u64::MAX`).
    ///
    /// ```
    /// use devices::lapic::TscMap;
    /// let map = TscMap { tsc_khz: 2_000_000, tsc_at_ns0: 100 };
    /// assert_eq!(map.tsc_at(1_000), 2_100);
    /// assert_eq!(map.ns_at(2_100), 1_000);
    /// ```
    pub fn tsc_at(&self, ns: u64) -> u64 {
        let ticks = u128::from(ns) * u128::from(self.tsc_khz) / 1_000_000;
        saturate(ticks + u128::from(self.tsc_at_ns0))
    }

    /// The first monotonic time at which the guest TSC reaches `tsc` (0 for values before
    /// time 0, `u64::MAX` if the TSC never gets there).
    pub fn ns_at(&self, tsc: u64) -> u64 {
        let ticks = u128::from(tsc.saturating_sub(self.tsc_at_ns0));
        match u128::from(self.tsc_khz) {
            0 => u64::MAX,
            khz => saturate((ticks * 1_000_000).div_ceil(khz)),
        }
    }
}

/// Floors on timer deadlines that keep a guest from storming the host with timer events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerLimits {
    /// Shortest period of a periodic timer (default 100 us). Shorter periods run at this one.
    pub min_period_ns: u64,
    /// Shortest delay from `now` of any one-shot or TSC-deadline arm (default 1 us). A deadline
    /// closer than this runs at this delay; one at or before `now` expires at once, unarmed.
    pub min_delay_ns: u64,
}

impl Default for TimerLimits {
    fn default() -> Self {
        TimerLimits {
            min_period_ns: 100_000,
            min_delay_ns: 1_000,
        }
    }
}

/// Timer mode (LVT timer bits 18:17).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum TimerMode {
    /// Counts down once from the initial count.
    #[default]
    OneShot,
    /// Reloads the initial count at every expiry.
    Periodic,
    /// Fires when the TSC reaches IA32_TSC_DEADLINE.
    TscDeadline,
}

impl TimerMode {
    /// The mode encoded in an LVT timer value; `None` for the reserved encoding 0b11.
    pub fn from_lvt(lvt: u32) -> Option<TimerMode> {
        match (lvt >> 17) & 3 {
            0 => Some(TimerMode::OneShot),
            1 => Some(TimerMode::Periodic),
            2 => Some(TimerMode::TscDeadline),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Armed {
    pub(super) deadline_ns: u64,
    /// 0 unless periodic.
    pub(super) period_ns: u64,
}

/// State of one LAPIC timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LapicTimer {
    bus_hz: u64,
    tsc: TscMap,
    pub(super) limits: TimerLimits,
    pub(super) mode: TimerMode,
    pub(super) divide_config: u32,
    pub(super) initial_count: u32,
    pub(super) tsc_deadline: u64,
    pub(super) armed: Option<Armed>,
}

fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

impl LapicTimer {
    pub(crate) fn new(bus_hz: u64, tsc: TscMap, limits: TimerLimits) -> Self {
        LapicTimer {
            bus_hz: bus_hz.max(1),
            tsc,
            limits,
            mode: TimerMode::OneShot,
            divide_config: 0,
            initial_count: 0,
            tsc_deadline: 0,
            armed: None,
        }
    }

    /// Back to the power-up state (mode one-shot, divide by 2, disarmed).
    pub(crate) fn reset(&mut self) {
        *self = LapicTimer::new(self.bus_hz, self.tsc, self.limits);
    }

    pub(crate) fn mode(&self) -> TimerMode {
        self.mode
    }

    /// Converts later TSC values with `tsc`; an armed deadline stays as it was converted.
    pub(crate) fn set_tsc_map(&mut self, tsc: TscMap) {
        self.tsc = tsc;
    }

    pub(crate) fn deadline(&self) -> Option<u64> {
        self.armed.map(|a| a.deadline_ns)
    }

    pub(crate) fn initial_count(&self) -> u32 {
        self.initial_count
    }

    pub(crate) fn divide_config(&self) -> u32 {
        self.divide_config
    }

    /// The divisor selected by the divide configuration register (bits 0, 1 and 3).
    pub(crate) fn divisor(&self) -> u64 {
        let code = ((self.divide_config & 8) >> 1) | (self.divide_config & 3);
        1 << ((code + 1) & 7)
    }

    pub(super) fn ticks_to_ns(&self, ticks: u64) -> u64 {
        let ns = u128::from(ticks) * u128::from(self.divisor()) * NS_PER_SEC;
        saturate(ns / u128::from(self.bus_hz))
    }

    fn ns_to_ticks(&self, ns: u64) -> u64 {
        let ticks = u128::from(ns) * u128::from(self.bus_hz);
        saturate(ticks / (NS_PER_SEC * u128::from(self.divisor())))
    }

    /// A deadline after `now_ns`, pushed out to the minimum delay if it is closer.
    fn floor(&self, now_ns: u64, deadline_ns: u64, events: &dyn LapicEvents) -> u64 {
        let floor = now_ns.saturating_add(self.limits.min_delay_ns);
        if deadline_ns >= floor {
            return deadline_ns;
        }
        events.timer_clamped(deadline_ns, floor);
        floor
    }

    /// Starts counting `count` ticks from `now_ns` (one-shot or periodic). A one-shot count that
    /// has already run out (zero duration) expires at once.
    fn arm_count(&mut self, count: u32, now_ns: u64, events: &dyn LapicEvents) -> TimerUpdate {
        let duration = self.ticks_to_ns(u64::from(count));
        let (deadline_ns, period_ns) = if self.mode == TimerMode::Periodic {
            let period = self.period_ns(events);
            // A fresh start runs a whole (clamped) period; a rescaled count the remainder.
            let first = if count == self.initial_count {
                period
            } else {
                duration.max(self.limits.min_delay_ns).max(1)
            };
            (now_ns.saturating_add(first), period)
        } else if duration == 0 {
            return self.expire_now();
        } else {
            (
                self.floor(now_ns, now_ns.saturating_add(duration), events),
                0,
            )
        };
        self.armed = Some(Armed {
            deadline_ns,
            period_ns,
        });
        LapicTimerChange::Arm { deadline_ns }.into()
    }

    /// The periodic reload interval of the initial count, clamped to the minimum period.
    pub(super) fn period_ns(&self, events: &dyn LapicEvents) -> u64 {
        let period = self.ticks_to_ns(u64::from(self.initial_count));
        let clamped = period.max(self.limits.min_period_ns).max(1);
        if clamped != period {
            events.timer_clamped(period, clamped);
        }
        clamped
    }

    /// The count ran out, or the TSC deadline passed, at the write itself: disarm (the
    /// TSC-deadline MSR reads 0 after expiry) and tell the LAPIC to raise the interrupt.
    fn expire_now(&mut self) -> TimerUpdate {
        self.tsc_deadline = 0;
        TimerUpdate {
            change: self.disarm(),
            expired: true,
        }
    }

    pub(crate) fn write_initial_count(
        &mut self,
        count: u32,
        now_ns: u64,
        events: &dyn LapicEvents,
    ) -> TimerUpdate {
        if self.mode == TimerMode::TscDeadline {
            return LapicTimerChange::Unchanged.into();
        }
        self.initial_count = count;
        if count == 0 {
            return self.disarm().into();
        }
        self.arm_count(count, now_ns, events)
    }

    fn disarm(&mut self) -> LapicTimerChange {
        match self.armed.take() {
            Some(_) => LapicTimerChange::Cancel,
            None => LapicTimerChange::Unchanged,
        }
    }

    /// The current count register at `now_ns`.
    pub(crate) fn current_count(&self, now_ns: u64) -> u32 {
        let Some(armed) = self.armed else { return 0 };
        if self.mode == TimerMode::TscDeadline {
            return 0;
        }
        let remaining = if now_ns < armed.deadline_ns {
            armed.deadline_ns - now_ns
        } else if armed.period_ns > 0 {
            armed.period_ns - (now_ns - armed.deadline_ns) % armed.period_ns
        } else {
            0
        };
        let ticks = self.ns_to_ticks(remaining);
        u32::try_from(ticks)
            .unwrap_or(u32::MAX)
            .min(self.initial_count)
    }

    pub(crate) fn write_divide(
        &mut self,
        value: u32,
        now_ns: u64,
        events: &dyn LapicEvents,
    ) -> TimerUpdate {
        let remaining = self.current_count(now_ns);
        self.divide_config = value & 0xB;
        match self.armed {
            Some(_) if self.mode != TimerMode::TscDeadline && remaining > 0 => {
                self.arm_count(remaining, now_ns, events)
            }
            _ => LapicTimerChange::Unchanged.into(),
        }
    }

    /// Expires the timer now if its deadline has passed (the host timer may be late), so that
    /// a following change of mode or LVT applies from `now_ns` on and not to the past. A
    /// periodic timer moves on to its next period; its host timer, due already, fires and
    /// [`Lapic::timer_fired`](super::Lapic::timer_fired) re-arms it there.
    pub(crate) fn settle(&mut self, now_ns: u64) -> TimerUpdate {
        match self.fire(now_ns) {
            (false, _) => LapicTimerChange::Unchanged.into(),
            (true, next) => TimerUpdate {
                change: match next {
                    None => LapicTimerChange::Cancel,
                    Some(_) => LapicTimerChange::Unchanged,
                },
                expired: true,
            },
        }
    }

    /// Switches mode (after [`LapicTimer::settle`]). Into or out of TSC-deadline mode the
    /// timer is disarmed and the counts cleared; between one-shot and periodic the running
    /// count goes on, and only what happens at zero changes (reload, or stop), so the host
    /// timer stays as it is.
    pub(crate) fn set_mode(
        &mut self,
        mode: TimerMode,
        events: &dyn LapicEvents,
    ) -> LapicTimerChange {
        if mode == self.mode {
            return LapicTimerChange::Unchanged;
        }
        let deadline_switch =
            (mode == TimerMode::TscDeadline) != (self.mode == TimerMode::TscDeadline);
        self.mode = mode;
        if deadline_switch {
            self.initial_count = 0;
            self.tsc_deadline = 0;
            return self.disarm();
        }
        if let Some(mut armed) = self.armed {
            armed.period_ns = match mode {
                TimerMode::Periodic => self.period_ns(events),
                _ => 0,
            };
            self.armed = Some(armed);
        }
        LapicTimerChange::Unchanged
    }

    pub(crate) fn write_tsc_deadline(
        &mut self,
        tsc: u64,
        now_ns: u64,
        events: &dyn LapicEvents,
    ) -> TimerUpdate {
        if self.mode != TimerMode::TscDeadline {
            return LapicTimerChange::Unchanged.into();
        }
        self.tsc_deadline = tsc;
        if tsc == 0 {
            return self.disarm().into();
        }
        let deadline_ns = self.tsc.ns_at(tsc);
        if deadline_ns <= now_ns {
            return self.expire_now();
        }
        let deadline_ns = self.floor(now_ns, deadline_ns, events);
        self.armed = Some(Armed {
            deadline_ns,
            period_ns: 0,
        });
        LapicTimerChange::Arm { deadline_ns }.into()
    }

    pub(crate) fn tsc_deadline(&self) -> u64 {
        if self.mode == TimerMode::TscDeadline {
            self.tsc_deadline
        } else {
            0
        }
    }

    /// Expires the timer if its deadline has passed. Returns whether it expired and the
    /// deadline that is armed afterwards.
    pub(crate) fn fire(&mut self, now_ns: u64) -> (bool, Option<u64>) {
        let Some(armed) = self.armed else {
            return (false, None);
        };
        if now_ns < armed.deadline_ns {
            return (false, Some(armed.deadline_ns));
        }
        if armed.period_ns == 0 {
            self.armed = None;
            self.tsc_deadline = 0;
            return (true, None);
        }
        // Skip the periods the caller missed, but stay on the original grid.
        let missed = (now_ns - armed.deadline_ns) / armed.period_ns + 1;
        let next = armed
            .deadline_ns
            .saturating_add(missed.saturating_mul(armed.period_ns));
        self.armed = Some(Armed {
            deadline_ns: next,
            period_ns: armed.period_ns,
        });
        (true, Some(next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lapic::events::NoopLapicEvents;

    fn timer(mode: TimerMode) -> LapicTimer {
        let mut t = LapicTimer::new(DEFAULT_BUS_HZ, TscMap::default(), TimerLimits::default());
        let _ = t.set_mode(mode, &NoopLapicEvents);
        t
    }

    #[test]
    fn every_divide_value() {
        let expected = [
            (0b0000, 2),
            (0b0001, 4),
            (0b0010, 8),
            (0b0011, 16),
            (0b1000, 32),
            (0b1001, 64),
            (0b1010, 128),
            (0b1011, 1),
        ];
        for (dcr, divisor) in expected {
            let mut t = timer(TimerMode::OneShot);
            let _ = t.write_divide(dcr, 0, &NoopLapicEvents);
            assert_eq!(t.divisor(), divisor, "dcr {dcr:#b}");
            let change = t.write_initial_count(10_000, 5_000, &NoopLapicEvents);
            let deadline_ns = 5_000 + 10_000 * divisor;
            assert_eq!(change, LapicTimerChange::Arm { deadline_ns }.into());
            assert_eq!(t.current_count(5_000), 10_000);
            assert_eq!(t.current_count(5_000 + 2_500 * divisor), 7_500);
            assert_eq!(t.current_count(deadline_ns), 0);
            assert_eq!(t.fire(deadline_ns), (true, None));
            assert_eq!(t.current_count(deadline_ns + 1), 0);
        }
    }

    #[test]
    fn tsc_map_round_trips_without_overflow() {
        let map = TscMap {
            tsc_khz: 2_100_000,
            tsc_at_ns0: 5,
        };
        assert_eq!(map.tsc_at(1_000_000_000), 2_100_000_005);
        assert_eq!(map.ns_at(2_100_000_005), 1_000_000_000);
        assert_eq!(map.ns_at(0), 0);
        assert_eq!(map.tsc_at(u64::MAX), u64::MAX);
        assert!(map.ns_at(u64::MAX) < u64::MAX);
        let zero = TscMap {
            tsc_khz: 0,
            tsc_at_ns0: 0,
        };
        assert_eq!(zero.ns_at(1), u64::MAX);
    }

    #[test]
    fn only_tsc_deadline_switches_disarm() {
        let mut t = timer(TimerMode::Periodic);
        let armed = t.write_initial_count(1_000_000, 0, &NoopLapicEvents);
        assert_eq!(
            armed.change,
            LapicTimerChange::Arm {
                deadline_ns: 2_000_000
            }
        );
        // Periodic -> one-shot: the running count goes on and stops at zero.
        let events = &NoopLapicEvents;
        assert_eq!(
            t.set_mode(TimerMode::OneShot, events),
            LapicTimerChange::Unchanged
        );
        assert_eq!(t.initial_count(), 1_000_000);
        assert_eq!(t.current_count(1_000_000), 500_000);
        assert_eq!(t.fire(2_000_000), (true, None));
        // One-shot -> periodic while counting: the count reloads at zero.
        let _ = t.write_initial_count(1_000_000, 3_000_000, events);
        assert_eq!(
            t.set_mode(TimerMode::Periodic, events),
            LapicTimerChange::Unchanged
        );
        assert_eq!(t.current_count(4_000_000), 500_000);
        assert_eq!(t.fire(5_000_000), (true, Some(7_000_000)));
        // Into TSC-deadline mode: disarmed, counts cleared.
        assert_eq!(
            t.set_mode(TimerMode::TscDeadline, events),
            LapicTimerChange::Cancel
        );
        assert_eq!((t.initial_count(), t.deadline()), (0, None));
        // And out of it.
        let _ = t.write_tsc_deadline(1 << 40, 0, events);
        assert_eq!(
            t.set_mode(TimerMode::OneShot, events),
            LapicTimerChange::Cancel
        );
        assert_eq!((t.tsc_deadline(), t.deadline()), (0, None));
    }

    #[test]
    fn counts_and_deadlines_already_run_out_expire_unarmed() {
        // A 4 GHz bus at divide 1: one tick is 0.25 ns, so a count of 1 has run out at once.
        let mut t = LapicTimer::new(4_000_000_000, TscMap::default(), TimerLimits::default());
        let _ = t.write_divide(0xB, 0, &NoopLapicEvents);
        let update = t.write_initial_count(1, 10, &NoopLapicEvents);
        assert!(update.expired);
        assert_eq!(update.change, LapicTimerChange::Unchanged);
        assert_eq!((t.deadline(), t.current_count(10)), (None, 0));
        // TSC deadline at now (TSC 1 GHz from 0: tsc == ns) and before now.
        let mut t = timer(TimerMode::TscDeadline);
        let _ = t.write_tsc_deadline(5_000_000, 0, &NoopLapicEvents);
        for tsc in [1_000, 2_000] {
            let update = t.write_tsc_deadline(tsc, 2_000, &NoopLapicEvents);
            assert!(update.expired, "deadline {tsc} at now 2000");
            assert_eq!((t.deadline(), t.tsc_deadline()), (None, 0));
        }
        // The first one cancelled the armed host timer; the second had nothing to cancel.
        let _ = t.write_tsc_deadline(5_000_000, 0, &NoopLapicEvents);
        assert_eq!(
            t.write_tsc_deadline(1, 2_000, &NoopLapicEvents).change,
            LapicTimerChange::Cancel
        );
        // One nanosecond ahead is in the future: armed at the floor, not expired.
        let update = t.write_tsc_deadline(2_001, 2_000, &NoopLapicEvents);
        assert!(!update.expired);
        assert_eq!(update.change, LapicTimerChange::Arm { deadline_ns: 3_000 });
    }

    #[test]
    fn divide_change_rescales_remaining_count() {
        let mut t = timer(TimerMode::OneShot);
        let _ = t.write_initial_count(1_000, 0, &NoopLapicEvents); // 2000 ns
        assert_eq!(
            t.write_divide(0b0001, 1_000, &NoopLapicEvents).change, // 500 ticks left at /4
            LapicTimerChange::Arm { deadline_ns: 3_000 }
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Initial(u32),
        Divide(u32),
        Mode(u8),
        Deadline(u64),
        Fire,
        Advance(u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            prop_oneof![any::<u32>(), 0u32..1_000].prop_map(Op::Initial),
            (0u32..16).prop_map(Op::Divide),
            (0u8..3).prop_map(Op::Mode),
            prop_oneof![any::<u64>(), 0u64..10_000_000].prop_map(Op::Deadline),
            Just(Op::Fire),
            prop_oneof![0u64..1_000, 0u64..100_000_000].prop_map(Op::Advance),
        ]
    }

    proptest::proptest! {
        #[test]
        fn deadlines_respect_the_floors(
            ops in proptest::collection::vec(op(), 1..100),
            bus_hz in 1u64..5_000_000_000,
        ) {
            let limits = TimerLimits::default();
            let tsc = TscMap { tsc_khz: 3_000_000, tsc_at_ns0: 0 };
            let mut t = LapicTimer::new(bus_hz, tsc, limits);
            let mut now = 0u64;
            let mut count_before: Option<u32> = None;
            for op in ops {
                let change = match op {
                    Op::Initial(count) => t.write_initial_count(count, now, &NoopLapicEvents).change,
                    Op::Divide(value) => t.write_divide(value, now, &NoopLapicEvents).change,
                    Op::Mode(mode) => {
                        let mode = match mode {
                            0 => TimerMode::OneShot,
                            1 => TimerMode::Periodic,
                            _ => TimerMode::TscDeadline,
                        };
                        let counting = t.mode() != TimerMode::TscDeadline;
                        let settled = t.settle(now).change;
                        let (initial, count) = (t.initial_count(), t.current_count(now));
                        let change = settled.then(t.set_mode(mode, &NoopLapicEvents));
                        if counting && mode != TimerMode::TscDeadline {
                            // One-shot <-> periodic: the counts run on untouched.
                            proptest::prop_assert_eq!(change, settled);
                            proptest::prop_assert_eq!(t.initial_count(), initial);
                            proptest::prop_assert_eq!(t.current_count(now), count);
                        }
                        change
                    }
                    Op::Deadline(tsc) => {
                        let update = t.write_tsc_deadline(tsc, now, &NoopLapicEvents);
                        if update.expired {
                            proptest::prop_assert!(tsc != 0 && t.tsc.ns_at(tsc) <= now);
                            proptest::prop_assert_eq!(t.deadline(), None);
                        }
                        update.change
                    }
                    Op::Fire => {
                        let before = t.deadline();
                        let (_, next) = t.fire(now);
                        if let (Some(before), Some(next)) = (before, next) {
                            proptest::prop_assert!(next == before || next - before >= limits.min_period_ns);
                        }
                        LapicTimerChange::Unchanged
                    }
                    Op::Advance(ns) => {
                        now += ns;
                        let count = t.current_count(now);
                        if let (Some(before), TimerMode::OneShot) = (count_before, t.mode()) {
                            proptest::prop_assert!(count <= before, "one-shot count never rises");
                        }
                        count_before = Some(count);
                        continue;
                    }
                };
                count_before = None;
                if let LapicTimerChange::Arm { deadline_ns } = change {
                    proptest::prop_assert!(deadline_ns >= now + limits.min_delay_ns);
                }
                proptest::prop_assert!(t.current_count(now) <= t.initial_count());
            }
        }
    }
}
