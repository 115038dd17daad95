//! Coalescing within one VM in `pull` with slack, on a fake clock: every vCPU is halted and
//! wakes only when its wake-up fires, and the host serves the wake-ups as Linux serves ranged
//! hrtimers on one host CPU (a wake-up armed for `w` may fire anywhere in `[w, w + slack]`;
//! the host CPU wakes at the first range's end and fires every wake-up whose range has begun).
//! A vCPU that wakes for its own timer becomes the migrator and expires every global timer of
//! the VM that is due, and the wake-up duty it took over no longer wakes the vCPU that held
//! it, so expiries of different vCPUs within the slack of each other share one host wake-up.
//!
//! Checked: every timer fires once, never before its deadline and never past its range; no
//! vCPU wakes for nothing; slack never adds host wake-ups; and the expiries one host wake-up
//! serves beyond its first are what slack saved (`coalesced`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;

use super::*;
use crate::host::FakeHostTimer;

/// What one simulated run saw.
#[derive(Debug, Default)]
struct Run {
    /// Per timer (by payload): the instants it fired at.
    fired: BTreeMap<usize, Vec<Nanos>>,
    /// Host CPU wake-ups (instants at which at least one wake-up fired).
    host_wakeups: u32,
    /// vCPU wake-ups by their wake-up (not kicks).
    vcpu_wakeups: u32,
    /// Expiries a host wake-up served beyond its first, summed: k expiries count k - 1.
    coalesced: u32,
}

/// Gives each CPU a fake wake timer (what a blocked vCPU waits on); returns them, by CPU.
pub(super) fn fake_wake_timers<T: Send + 'static>(cpus: &mut [PullCpu<T>]) -> Vec<FakeHostTimer> {
    cpus.iter_mut()
        .map(|c| {
            let t = FakeHostTimer::new();
            c.set_wake_timer(Box::new(t.clone()));
            t
        })
        .collect()
}

/// `timers[c]`: vCPU `c`'s timers as (deadline, pinned); every vCPU arms them, halts, and
/// from then on wakes only for its wake-up (or a kick), expires what is due and halts again.
fn simulate(timers: &[Vec<(Nanos, bool)>], slack: Nanos) -> Result<Run, TestCaseError> {
    let kicks = Arc::new(Mutex::new(Vec::new()));
    let k = Arc::clone(&kicks);
    let (model, mut cpus) = PullModel::<usize>::new(
        &vec![0; timers.len()],
        &mut |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>,
        Arc::new(move |c: CpuId| k.lock().unwrap().push(c)),
    )
    .unwrap();
    model.set_global_slack(slack);
    let wakes = fake_wake_timers(&mut cpus);
    let mut payload = 0;
    for (c, list) in timers.iter().enumerate() {
        for &(deadline, pinned) in list {
            let kind = if pinned {
                TimerKind::Pinned
            } else {
                TimerKind::Global
            };
            cpus[c].arm(kind, deadline, payload);
            payload += 1;
        }
    }
    for cpu in &mut cpus {
        cpu.idle(0);
    }
    let mut run = Run::default();
    let mut now = 0;
    // One vCPU's wake: expires what is due (as a halted vCPU does) and halts again.
    let bounce = |cpu: &mut PullCpu<usize>, now: Nanos, run: &mut Run| -> usize {
        cpu.wake(now);
        let mut n = 0;
        cpu.run_halted(now, &mut |f| {
            run.fired.entry(f.payload).or_default().push(now);
            n += 1;
            AfterFire::Done
        });
        cpu.idle(now);
        n
    };
    for _ in 0..10_000 {
        // The host CPU wakes at the first end of a range.
        let at = wakes
            .iter()
            .map(|w| w.deadline().saturating_add(slack))
            .min()
            .unwrap_or(NEVER);
        if at == NEVER {
            return Ok(run);
        }
        prop_assert!(at >= now, "a wake-up armed for the past: {} < {}", at, now);
        now = at;
        run.host_wakeups += 1;
        let mut served = 0;
        // Every wake-up whose range has begun fires; one re-armed meanwhile (its duty taken
        // over by a vCPU woken first) is not due and does not wake its vCPU.
        for c in 0..cpus.len() {
            if wakes[c].deadline() <= now {
                wakes[c].expire();
                run.vcpu_wakeups += 1;
                let n = bounce(&mut cpus[c], now, &mut run);
                prop_assert!(n > 0, "vCPU {} woke at {} for nothing", c, now);
                served += n;
            }
            let kicked: Vec<CpuId> = std::mem::take(&mut *kicks.lock().unwrap());
            for k in kicked {
                served += bounce(&mut cpus[k], now, &mut run);
            }
        }
        run.coalesced += u32::try_from(served.saturating_sub(1)).unwrap();
    }
    Err(TestCaseError::fail("no progress"))
}

fn vm() -> impl Strategy<Value = Vec<Vec<(Nanos, bool)>>> {
    let timer = (1u64..100_000, any::<bool>());
    proptest::collection::vec(proptest::collection::vec(timer, 0..12), 1..5)
}

proptest! {
    #[test]
    fn halted_vcpus_share_wake_ups_within_the_slack_never_early(
        timers in vm(),
        slack in prop_oneof![Just(0u64), 1u64..20_000],
    ) {
        let run = simulate(&timers, slack)?;
        let all: Vec<Nanos> = timers.iter().flatten().map(|&(d, _)| d).collect();
        prop_assert_eq!(run.fired.len(), all.len(), "a timer was lost");
        for (i, &d) in all.iter().enumerate() {
            let at = &run.fired[&i];
            prop_assert_eq!(at.len(), 1, "timer {} fired {:?}", i, at);
            prop_assert!(
                crate::slack::in_range(d, at[0], slack),
                "timer {} due {} fired at {} (slack {})", i, d, at[0], slack
            );
        }
        // Every host wake-up served an expiry: the expiries are one per host wake-up plus
        // the coalesced ones.
        let fires = u32::try_from(all.len()).unwrap();
        prop_assert_eq!(run.host_wakeups + run.coalesced, fires);
        let hard = simulate(&timers, 0)?;
        prop_assert!(
            run.host_wakeups <= hard.host_wakeups,
            "{} host wake-ups with slack {}, {} without", run.host_wakeups, slack, hard.host_wakeups
        );
    }
}

/// The point of it: vCPU 0's pinned timer and vCPU 1's global timers within the slack of each
/// other cost one host wake-up, which serves all three.
#[test]
fn a_pinned_wake_up_serves_the_global_timers_in_its_range() {
    let timers = vec![vec![(1_000, true)], vec![(1_200, false), (1_500, false)]];
    let hard = simulate(&timers, 0).unwrap();
    assert_eq!((hard.host_wakeups, hard.coalesced), (3, 0));
    let ranged = simulate(&timers, 600).unwrap();
    assert_eq!((ranged.host_wakeups, ranged.coalesced), (1, 2));
    assert!(ranged.fired.values().all(|at| at == &[1_600]));
}
