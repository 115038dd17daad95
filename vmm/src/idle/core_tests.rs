//! The idle core against a real timer model on fake host timers: no KVM, no threads, no real
//! time. Each property is one of the rules in the module's top comment.

use std::sync::Arc;

use proptest::prelude::*;
use timer::{build, CpuTimers, FakeHostTimer, HostTimer, ModelKind, NEVER};

use super::*;
use crate::config::knobs::{CpuQuotaConfig, HaltPollMode, IdleInjectConfig};
use crate::idle::inject::IdleInjector;
use crate::idle::quota::CpuQuota;

fn shared(halt_poll: HaltPollMode) -> IdleShared {
    IdleShared {
        halt_poll,
        timer_advance: crate::config::knobs::TimerAdvanceMode::Off,
        timer_slack: crate::config::knobs::TimerSlack::Off,
        inject: None,
        quota: None,
        global: None,
        wake_placement: crate::config::knobs::WakePlacementMode::Off,
    }
}

/// The timers of vCPU 0 of a one-vCPU VM in `kind`, and the `central` model's thread timer.
fn timers_and_central(kind: ModelKind) -> (Box<dyn CpuTimers<VcpuTimer>>, FakeHostTimer) {
    let waker = Arc::new(|_cpu: usize| {});
    let central = FakeHostTimer::new();
    let mut host = |cpu: Option<usize>| match cpu {
        None => Box::new(central.clone()) as Box<dyn HostTimer>,
        Some(_) => Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>,
    };
    let model = build::<VcpuTimer>(kind, &[0], &mut host, waker).unwrap();
    (model.cpus.into_iter().next().unwrap(), central)
}

fn timers(kind: ModelKind) -> Box<dyn CpuTimers<VcpuTimer>> {
    timers_and_central(kind).0
}

/// The vCPU's next timer deadline as its own timer pass sees it at `now` (nothing due).
fn next_deadline(t: &mut dyn CpuTimers<VcpuTimer>, now: u64) -> u64 {
    t.run(now, &mut |_| timer::AfterFire::Done)
}

fn mode() -> impl Strategy<Value = HaltPollMode> {
    prop_oneof![
        Just(HaltPollMode::Off),
        Just(HaltPollMode::Adaptive),
        (1u64..1_000_000).prop_map(HaltPollMode::Fixed),
    ]
}

proptest! {
    /// A poll never runs past the next pinned deadline, whatever the poller learned.
    #[test]
    fn a_poll_never_passes_the_next_deadline(
        mode in mode(),
        history in prop::collection::vec((0u64..2_000_000, any::<bool>(), any::<bool>()), 0..20),
        now in 0u64..1_000_000_000,
        until_deadline in prop::option::of(0u64..1_000_000),
    ) {
        let idle = shared(mode);
        let mut core = IdleCore::new(&idle, 1);
        // Teach the adaptive window with earlier halts.
        for (halt_ns, won, own_timer) in history {
            let mut s = core.halt_session(0);
            s.polled(won);
            if own_timer {
                s.woke(WakeKind::OwnTimer);
            }
            core.halt_step(&mut s, halt_ns, true, None);
        }
        let deadline = until_deadline.map(|d| now + d);
        let mut session = core.halt_session(now);
        match core.halt_step(&mut session, now, false, deadline) {
            HaltStep::Poll { until, .. } => {
                prop_assert!(until > now);
                if let Some(d) = deadline {
                    prop_assert!(until <= d, "poll until {until} past the deadline {d}");
                }
            }
            HaltStep::Block => {}
            HaltStep::Resume => prop_assert!(false, "resumed a vCPU that is not runnable"),
        }
        // The second step of the same halt never polls again: it blocks.
        prop_assert_eq!(core.halt_step(&mut session, now, false, deadline), HaltStep::Block);
        prop_assert_eq!(core.halt_step(&mut session, now, true, deadline), HaltStep::Resume);
    }

    /// A halted vCPU never sleeps past its own pinned deadline: the block ends at the timer
    /// model's timeout (or, in `central`, the timer thread's timer kicks it), at or before its
    /// earliest pinned timer, whatever global timers it has, in every model.
    #[test]
    fn a_block_never_sleeps_past_the_pinned_deadline(
        kind in prop_oneof![Just(ModelKind::Pull), Just(ModelKind::Push), Just(ModelKind::Central)],
        pinned in prop::collection::vec(1u64..1_000_000_000, 1..5),
        global in prop::collection::vec(1u64..1_000_000_000, 0..5),
        now in 0u64..1_000,
    ) {
        let (mut t, central) = timers_and_central(kind);
        for &d in &pinned {
            t.arm(timer::TimerKind::Pinned, d, VcpuTimer::Lapic);
        }
        for (slot, &d) in (0u32..).zip(&global) {
            t.arm(timer::TimerKind::Global, d, VcpuTimer::Global(slot));
        }
        let timeout = t.idle(now);
        let earliest = pinned.iter().copied().min().unwrap_or(NEVER);
        let wake = block_deadline(timeout.min(t.idle_timeout()), None, true).min(central.deadline());
        prop_assert!(wake <= earliest, "block until {wake} past pinned {earliest}");
    }

    /// No entry inside an injection window: the hold lasts exactly to the window's end, and
    /// outside a window the next window's start is armed as a pinned timer.
    #[test]
    fn injection_windows_are_respected(
        percent in 1u8..100,
        period_ms in 1u64..100,
        now in 0u64..10_000_000_000,
    ) {
        let cfg = IdleInjectConfig { percent, period_ns: period_ms * 1_000_000 };
        let mut idle = shared(HaltPollMode::Off);
        idle.inject = Some(IdleInjector::new(cfg, 1));
        let mut core = IdleCore::new(&idle, 1);
        let mut t = timers(ModelKind::Pull);
        let idle_ns = cfg.period_ns / 100 * u64::from(percent);
        let in_window = now % cfg.period_ns < idle_ns;
        match core.hold(now, &idle, t.as_mut(), |x| x) {
            Hold::Until { until, reason } => {
                prop_assert!(in_window);
                prop_assert_eq!(reason, HoldReason::Inject);
                prop_assert_eq!(until, now - now % cfg.period_ns + idle_ns);
            }
            Hold::Run { armed } => {
                prop_assert!(!in_window);
                prop_assert!(armed);
                let start = now - now % cfg.period_ns + cfg.period_ns;
                prop_assert_eq!(next_deadline(t.as_mut(), now), start);
                // Asked again at the same time, nothing new is armed.
                prop_assert_eq!(core.hold(now, &idle, t.as_mut(), |x| x), Hold::Run { armed: false });
            }
        }
    }
}

#[test]
fn a_used_up_quota_holds_until_the_period_ends_and_halts_cancel_idle_timers() {
    let cfg: CpuQuotaConfig = "quota=2,period=10,phase=aligned".parse().unwrap();
    let mut idle = shared(HaltPollMode::Off);
    idle.quota = Some(CpuQuota::with_phase(cfg, 0));
    let mut core = IdleCore::new(&idle, 2);
    let mut t = timers(ModelKind::Pull);
    // Budget left: run, with a quota check armed at remaining / cpus.
    assert_eq!(
        core.hold(1_000, &idle, t.as_mut(), |x| x),
        Hold::Run { armed: true }
    );
    assert_eq!(next_deadline(t.as_mut(), 1_000), 1_000 + 1_000_000);
    // HLT cancels the check: a halted vCPU is never woken by the idle manager.
    core.halt_begins(t.as_mut());
    assert_eq!(next_deadline(t.as_mut(), 1_000), NEVER);
    // The budget is used up: hold to the end of the 10 ms period.
    if let Some(q) = &idle.quota {
        q.charge(3_000_000, 2_000_000);
    }
    assert_eq!(
        core.hold(3_000_000, &idle, t.as_mut(), |x| x),
        Hold::Until {
            until: 10_000_000,
            reason: HoldReason::Quota
        }
    );
    // In the next period it runs again.
    assert!(matches!(
        core.hold(10_000_000, &idle, t.as_mut(), |x| x),
        Hold::Run { .. }
    ));
}

#[test]
fn fired_idle_timers_are_forgotten_and_armed_again() {
    let cfg = IdleInjectConfig {
        percent: 10,
        period_ns: 1_000_000,
    };
    let mut idle = shared(HaltPollMode::Off);
    idle.inject = Some(IdleInjector::new(cfg, 1));
    let mut core = IdleCore::new(&idle, 1);
    let mut t = timers(ModelKind::Push);
    assert_eq!(
        core.hold(500_000, &idle, t.as_mut(), |x| x),
        Hold::Run { armed: true }
    );
    let mut fired = Vec::new();
    t.run(1_000_000, &mut |f| {
        fired.push(f.payload);
        timer::AfterFire::Done
    });
    assert_eq!(fired, vec![VcpuTimer::IdleInject]);
    core.timers_fired(1_000_000);
    // 1.15 ms: past the window [1.0, 1.1) ms; the next start is armed anew.
    assert_eq!(
        core.hold(1_150_000, &idle, t.as_mut(), |x| x),
        Hold::Run { armed: true }
    );
    assert_eq!(next_deadline(t.as_mut(), 1_150_000), 2_000_000);
}

#[test]
fn wake_ups_are_counted_by_what_woke_them() {
    let none = FiredSummary::default();
    let pinned = FiredSummary {
        own_pinned: 1,
        ..FiredSummary::default()
    };
    let remote = FiredSummary {
        remote_global: 2,
        ..FiredSummary::default()
    };
    assert_eq!(
        classify_wake(Some(WakeCause::Control), pinned, true),
        WakeCount::Control
    );
    assert_eq!(
        classify_wake(Some(WakeCause::Interrupt), none, false),
        WakeCount::Interrupt
    );
    assert_eq!(classify_wake(None, pinned, false), WakeCount::OwnTimer);
    assert_eq!(classify_wake(None, none, true), WakeCount::OwnTimer);
    assert_eq!(classify_wake(None, remote, false), WakeCount::GlobalTimer);
    assert_eq!(classify_wake(None, none, false), WakeCount::Empty);
    // A device timer whose callback raised the pending interrupt woke it.
    let device = FiredSummary {
        own_global: 1,
        device: 1,
        ..FiredSummary::default()
    };
    assert_eq!(classify_wake(None, device, true), WakeCount::GlobalTimer);
    assert_eq!(WakeCount::OwnTimer.kind(), WakeKind::OwnTimer);
    assert_eq!(WakeCount::GlobalTimer.kind(), WakeKind::Other);
}

#[test]
fn a_hold_blocks_until_its_end_and_ignores_work() {
    assert_eq!(block_deadline(5_000, Some(9_000), false), 9_000);
    assert_eq!(block_deadline(5_000, Some(9_000), true), 5_000);
    assert_eq!(block_deadline(NEVER, None, true), NEVER);
}
