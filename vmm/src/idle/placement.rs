//! Timer-aware wake placement (`--wake-placement`): where the host may wake a blocked vCPU
//! thread. With `cache-hot`, a vCPU that blocks for a short sleep (its next own deadline is
//! near) is bound to the host CPU it blocked on for the length of that sleep, so that it wakes
//! where its caches (and KVM's per-CPU vCPU state) are still warm instead of migrating to
//! whichever CPU the scheduler finds idle; a long sleep never binds it.
//!
//! ```text
//!   block at now, next own wake-up at w, on host CPU c
//!     off, or w - now > max_sleep, or backing off ──► Free     (the scheduler places the wake)
//!     otherwise ─────────────────────────────────────► Bind(c) (affinity {c} for the sleep)
//!   wake-up (own timer, `late` after w) while bound ─► Release (the thread's own CPU set again)
//!     late > GIVE_UP_LATE_NS: c was busy when the wake-up came, and the binding made the
//!     vCPU wait for it ─► no binding for BACKOFF_NS (the CPU is not ours to keep)
//! ```
//!
//! The binding is a CPU affinity, so it holds the vCPU, not the CPU: another host task may
//! run on `c` while the vCPU sleeps, and the vCPU's wake-up then waits for it or preempts it
//! instead of taking an idle CPU. That is the cost `resources/bench/placement.sh` weighs
//! (docs/PERFORMANCE.md, "Wake placement"); the give-up rule bounds it by backing off as soon
//! as a bound wake-up comes late. A binding lasts one sleep (bound before the block, released
//! after the wake-up), so a vCPU never runs guest code bound.
//!
//! Which sleeps count as short: Linux counts a task as cache-hot for
//! `sysctl_sched_migration_cost` (500 us) after it ran; a vCPU that sleeps less than a few
//! times that, on a CPU with little else to do, finds most of its working set where it left
//! it. The default bound, [`DEFAULT_MAX_SLEEP_NS`](crate::config::knobs::DEFAULT_MAX_SLEEP_NS), is 2 ms: it covers the 1 ms tick-like
//! sleepers this is written for and leaves out the 4 ms ticks and longer sleeps, where other
//! work has had time to take the cache. The give-up lateness, [`GIVE_UP_LATE_NS`], is five
//! times the guest-measured wake-up lateness p50 of an unloaded host here (35-50 us).
//!
//! What it is worth (measured on the 2-core development host, docs/PERFORMANCE.md): a bind
//! and release cost ~4.6 us of syscalls; a wake-up on the other CPU costs the thread
//! 1.6-3.7 us of cache refill (256 KiB-1 MiB working set, shared L3,
//! `resources/bench/migration_cost.c`); and with placement off Linux already wakes 99.5% of
//! these sleepers on the CPU they slept on (it prefers an idle previous CPU). Binding cut the
//! remaining migrations by a third to a half when no other task competed (not when one did),
//! left the wake-up lateness p50 unchanged, and moved a competing host task's throughput by
//! less than the shared host's noise; it saves ~0.01 us of refill per wake-up for ~0.7-2.5 us
//! of syscalls, so the default is `off`.

use timer::Nanos;

use crate::config::knobs::WakePlacementMode;

/// A bound own-timer wake-up later than this behind its deadline gives the CPU up: its
/// wake-up waited for another task (the host's unloaded wake-up lateness is tens of us).
pub const GIVE_UP_LATE_NS: u64 = 250_000;
/// How long a vCPU that gave its CPU up does not bind again.
pub const BACKOFF_NS: u64 = 100_000_000;

/// What to do with the vCPU thread's CPU affinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Leave it as it is.
    Keep,
    /// Bind the thread to this host CPU for the coming sleep.
    Bind(u32),
    /// Give the thread its own CPU set back.
    Release,
}

/// How a wake-up of a bound vCPU went, as [`WakePlacement::woke`] learns from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeOutcome {
    /// Its own wake-up came, this long after the time it slept for.
    OnTime {
        /// Wake-up time less the expected one (0 if early).
        late_ns: u64,
    },
    /// Something else woke it first (an interrupt, VM control): nothing to learn.
    Early,
}

/// One vCPU's wake-placement state.
#[derive(Debug, Clone)]
pub struct WakePlacement {
    mode: WakePlacementMode,
    bound: bool,
    backoff_until: Nanos,
}

impl WakePlacement {
    /// The state of a vCPU in `mode`; `cpus_allowed`: how many host CPUs its thread may run
    /// on (binding means nothing on one).
    pub fn new(mode: WakePlacementMode, cpus_allowed: usize) -> Self {
        Self {
            mode: if cpus_allowed > 1 {
                mode
            } else {
                WakePlacementMode::Off
            },
            bound: false,
            backoff_until: 0,
        }
    }

    /// Whether the thread is bound now.
    pub fn is_bound(&self) -> bool {
        self.bound
    }

    /// Before a block at `now` on host CPU `cpu` (`None`: unknown), expecting its own wake-up
    /// at `wake_at` (`None`: no timer armed, an open-ended sleep).
    pub fn before_block(
        &mut self,
        now: Nanos,
        wake_at: Option<Nanos>,
        cpu: Option<u32>,
    ) -> Placement {
        let WakePlacementMode::CacheHot { max_sleep_ns } = self.mode else {
            return Placement::Keep;
        };
        let short = wake_at.is_some_and(|w| w.saturating_sub(now) <= max_sleep_ns);
        match cpu {
            Some(cpu) if short && now >= self.backoff_until && !self.bound => {
                self.bound = true;
                Placement::Bind(cpu)
            }
            _ if self.bound => {
                self.bound = false;
                Placement::Release
            }
            _ => Placement::Keep,
        }
    }

    /// After the wake-up at `now`: a bound thread gets its CPU set back; a bound wake-up that
    /// came more than [`GIVE_UP_LATE_NS`] late starts a back-off of [`BACKOFF_NS`]. True in
    /// the second element if it did.
    pub fn woke(&mut self, now: Nanos, outcome: WakeOutcome) -> (Placement, bool) {
        if !self.bound {
            return (Placement::Keep, false);
        }
        self.bound = false;
        let gave_up =
            matches!(outcome, WakeOutcome::OnTime { late_ns } if late_ns > GIVE_UP_LATE_NS);
        if gave_up {
            self.backoff_until = now.saturating_add(BACKOFF_NS);
        }
        (Placement::Release, gave_up)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::config::knobs::DEFAULT_MAX_SLEEP_NS;

    const HOT: WakePlacementMode = WakePlacementMode::CacheHot {
        max_sleep_ns: DEFAULT_MAX_SLEEP_NS,
    };

    #[test]
    fn a_short_sleep_binds_for_its_length_and_a_long_one_never() {
        let mut p = WakePlacement::new(HOT, 2);
        assert_eq!(
            p.before_block(0, Some(1_000_000), Some(1)),
            Placement::Bind(1)
        );
        assert!(p.is_bound());
        let late = WakeOutcome::OnTime { late_ns: 20_000 };
        assert_eq!(p.woke(1_020_000, late), (Placement::Release, false));
        assert!(!p.is_bound());
        // Exactly the bound still binds; a nanosecond more does not.
        assert_eq!(
            p.before_block(0, Some(DEFAULT_MAX_SLEEP_NS), Some(0)),
            Placement::Bind(0)
        );
        p.woke(DEFAULT_MAX_SLEEP_NS, WakeOutcome::Early);
        assert_eq!(
            p.before_block(0, Some(DEFAULT_MAX_SLEEP_NS + 1), Some(0)),
            Placement::Keep
        );
        // No timer: an open-ended sleep. Unknown CPU: nothing to bind to.
        assert_eq!(p.before_block(0, None, Some(0)), Placement::Keep);
        assert_eq!(p.before_block(0, Some(10), None), Placement::Keep);
        // An unbound wake-up changes nothing.
        assert_eq!(p.woke(10, late), (Placement::Keep, false));
    }

    #[test]
    fn off_or_a_single_cpu_never_binds() {
        let mut off = WakePlacement::new(WakePlacementMode::Off, 8);
        assert_eq!(off.before_block(0, Some(1), Some(3)), Placement::Keep);
        let mut one = WakePlacement::new(HOT, 1);
        assert_eq!(one.before_block(0, Some(1), Some(0)), Placement::Keep);
    }

    #[test]
    fn a_late_bound_wakeup_backs_off() {
        let mut p = WakePlacement::new(HOT, 2);
        assert_eq!(
            p.before_block(0, Some(1_000_000), Some(0)),
            Placement::Bind(0)
        );
        let late = WakeOutcome::OnTime {
            late_ns: GIVE_UP_LATE_NS + 1,
        };
        let woke_at = 1_000_000 + GIVE_UP_LATE_NS + 1;
        assert_eq!(p.woke(woke_at, late), (Placement::Release, true));
        // Inside the back-off: short sleeps stay free.
        let t = woke_at + BACKOFF_NS - 1;
        assert_eq!(p.before_block(t, Some(t + 1_000), Some(0)), Placement::Keep);
        // After it: they bind again.
        let t = woke_at + BACKOFF_NS;
        assert_eq!(
            p.before_block(t, Some(t + 1_000), Some(1)),
            Placement::Bind(1)
        );
        // A late wake-up by an interrupt teaches nothing (it did not wait for the CPU).
        assert_eq!(
            p.woke(t + 10_000_000, WakeOutcome::Early),
            (Placement::Release, false)
        );
    }

    #[derive(Debug, Clone)]
    enum Step {
        Block {
            sleep: Option<u64>,
            cpu: Option<u32>,
        },
        Wake {
            late: Option<u64>,
        },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (
                proptest::option::of(0u64..10_000_000),
                proptest::option::of(0u32..4)
            )
                .prop_map(|(sleep, cpu)| Step::Block { sleep, cpu }),
            proptest::option::of(0u64..1_000_000).prop_map(|late| Step::Wake { late }),
        ]
    }

    proptest! {
        /// Over any run of blocks and wake-ups on a fake clock: a binding is only made for a
        /// sleep of at most the bound, every binding is released by the next wake-up or block
        /// (so none outlives one sleep), no binding is made inside a back-off, and the
        /// decisions keep `is_bound` truthful.
        #[test]
        fn bindings_last_one_short_sleep(
            max in 1u64..5_000_000,
            steps in proptest::collection::vec((step(), 1u64..3_000_000), 1..200),
        ) {
            let mut p = WakePlacement::new(WakePlacementMode::CacheHot { max_sleep_ns: max }, 4);
            let mut now = 0u64;
            let mut bound = false;
            let mut backoff_until = 0u64;
            for (s, dt) in steps {
                now += dt;
                match s {
                    Step::Block { sleep, cpu } => {
                        let d = p.before_block(now, sleep.map(|s| now + s), cpu);
                        match d {
                            Placement::Bind(c) => {
                                prop_assert!(!bound);
                                prop_assert_eq!(Some(c), cpu);
                                prop_assert!(sleep.is_some_and(|s| s <= max));
                                prop_assert!(now >= backoff_until);
                                bound = true;
                            }
                            Placement::Release => {
                                prop_assert!(bound);
                                bound = false;
                            }
                            Placement::Keep => {
                                // Keeping a binding into a new sleep is never decided.
                                prop_assert!(!bound);
                            }
                        }
                    }
                    Step::Wake { late } => {
                        let outcome = late.map_or(WakeOutcome::Early, |late_ns| WakeOutcome::OnTime { late_ns });
                        let (d, gave_up) = p.woke(now, outcome);
                        prop_assert_eq!(d == Placement::Release, bound);
                        prop_assert_eq!(gave_up, bound && late.is_some_and(|l| l > GIVE_UP_LATE_NS));
                        if gave_up {
                            backoff_until = now + BACKOFF_NS;
                        }
                        bound = false;
                    }
                }
                prop_assert_eq!(p.is_bound(), bound);
            }
        }
    }
}
