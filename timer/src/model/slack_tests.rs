//! Global timers with slack in `pull`, on a fake clock: a running migrator whose only host
//! tick is deferred to the end of the ranges expires every global timer (its own and an idle
//! vCPU's, pulled through the hierarchy) within its range, never before it, and with no more
//! ticks than without slack.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::base::TimerKind;
use crate::host::FakeHostTimer;
use crate::slack::in_range;

/// What one simulated run saw: when each timer (by index) fired, and the ticks that fired.
struct Run {
    fired: BTreeMap<usize, Vec<Nanos>>,
    ticks: u32,
}

/// Two vCPUs: vCPU 1 arms `remote` global timers and halts for good (no pinned timer), vCPU 0
/// arms `own` and runs, exiting at `exits`; the only other time it runs its timers is its host
/// tick. Global slack `slack`.
fn simulate(own: &[Nanos], remote: &[Nanos], exits: &[Nanos], slack: Nanos) -> Run {
    let tick = FakeHostTimer::new();
    let t = tick.clone();
    let mut host = move |cpu: Option<CpuId>| -> Box<dyn HostTimer> {
        match cpu {
            Some(0) => Box::new(t.clone()),
            _ => Box::new(FakeHostTimer::new()),
        }
    };
    let mut m = build::<usize>(ModelKind::Pull, &[0, 0], &mut host, Arc::new(|_| {})).unwrap();
    m.shared.set_global_slack(slack);
    for (i, &d) in remote.iter().enumerate() {
        m.cpus[1].arm(TimerKind::Global, d, own.len() + i);
    }
    m.cpus[1].idle(0);
    for (i, &d) in own.iter().enumerate() {
        m.cpus[0].arm(TimerKind::Global, d, i);
    }
    let mut run = Run {
        fired: BTreeMap::new(),
        ticks: 0,
    };
    let mut exits = exits.to_vec();
    exits.sort_unstable();
    let mut exits = exits.into_iter().peekable();
    let mut now = 0;
    loop {
        let fired = &mut run.fired;
        m.cpus[0].run(now, &mut |f| {
            fired.entry(f.payload).or_default().push(now);
            AfterFire::Done
        });
        let at_tick = tick.deadline();
        let at_exit = exits.peek().copied().unwrap_or(NEVER);
        if at_tick == NEVER && at_exit == NEVER {
            return run;
        }
        // A tick due at an exit's instant fires too: the host timer expires whatever the vCPU
        // does, and the model takes a tick armed at or before `now` as fired (it re-arms it
        // without a disarm). Taking the exit alone at a tie lost that tick from the count.
        if at_tick <= at_exit {
            tick.expire();
            run.ticks += 1;
            now = now.max(at_tick);
        } else {
            exits.next();
            now = now.max(at_exit);
        }
    }
}

fn deadlines() -> impl Strategy<Value = Vec<Nanos>> {
    proptest::collection::vec(1u64..100_000, 0..24)
}

proptest! {
    #[test]
    fn every_global_timer_fires_once_within_its_range_and_slack_never_adds_ticks(
        own in deadlines(),
        remote in deadlines(),
        exits in proptest::collection::vec(0u64..120_000, 0..16),
        slack in prop_oneof![Just(0u64), 1u64..20_000],
    ) {
        let run = simulate(&own, &remote, &exits, slack);
        let all: Vec<Nanos> = own.iter().chain(&remote).copied().collect();
        prop_assert_eq!(run.fired.len(), all.len(), "a timer was lost");
        for (i, &d) in all.iter().enumerate() {
            let at = &run.fired[&i];
            prop_assert_eq!(at.len(), 1, "timer {} fired {:?}", i, at);
            prop_assert!(in_range(d, at[0], slack), "timer {} due {} fired at {} (slack {})", i, d, at[0], slack);
        }
        let hard = simulate(&own, &remote, &exits, 0);
        prop_assert!(run.ticks <= hard.ticks, "{} ticks with slack {}, {} without", run.ticks, slack, hard.ticks);
    }
}

/// The point of it: expiries within the slack of each other cost one tick, not one each.
#[test]
fn close_expiries_share_one_tick() {
    let own = [1_000, 1_200];
    let remote = [1_100, 1_500, 9_000];
    assert_eq!(simulate(&own, &remote, &[], 0).ticks, 5);
    let ranged = simulate(&own, &remote, &[], 600);
    assert_eq!(ranged.ticks, 2, "1000..1600 at 1600, 9000 at 9600");
    assert_eq!(ranged.fired[&0], [1_600]);
    assert_eq!(ranged.fired[&4], [9_600]);
}
