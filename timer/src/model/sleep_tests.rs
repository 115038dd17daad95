//! Blocked CPUs wake only on their host wake-up (the wake timer the pull model arms and other
//! CPUs re-arm), driven by random operation sequences: (a) no timer is lost, late or early;
//! (b) no wake-up fires with nothing to do (no own timer, no remote expiry as migrator).
//!
//! The simulated VMM here is the minimum for that: unlike the one in `tests.rs` it never
//! wakes an idle CPU at a timeout it computed, only when its fake wake timer's deadline is
//! reached (or when it is kicked), so a retarget that failed to move the host wake-up shows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;

use super::*;
use crate::host::FakeHostTimer;

#[derive(Debug, Clone)]
enum Op {
    Arm {
        cpu: usize,
        pinned: bool,
        delta: u64,
    },
    Cancel {
        pick: usize,
    },
    Rearm {
        pick: usize,
        delta: u64,
    },
    Idle {
        cpu: usize,
    },
    Kick {
        cpu: usize,
    },
    Advance {
        delta: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..16, any::<bool>(), 1u64..3000)
            .prop_map(|(cpu, pinned, delta)| Op::Arm { cpu, pinned, delta }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => (any::<usize>(), 1u64..3000).prop_map(|(pick, delta)| Op::Rearm { pick, delta }),
        4 => (0usize..16).prop_map(|cpu| Op::Idle { cpu }),
        1 => (0usize..16).prop_map(|cpu| Op::Kick { cpu }),
        4 => (0u64..1500).prop_map(|delta| Op::Advance { delta }),
    ]
}

struct Timer {
    cpu: usize,
    handle: TimerHandle,
}

struct Sim {
    model: Arc<PullModel<u64>>,
    cpus: Vec<PullCpu<u64>>,
    ticks: Vec<FakeHostTimer>,
    wakes: Vec<FakeHostTimer>,
    idle: Vec<bool>,
    now: Nanos,
    pending: HashMap<u64, (Timer, Nanos)>,
    next_id: u64,
    kicks: Arc<Mutex<Vec<CpuId>>>,
    timer_wakeups: u64,
}

impl Sim {
    fn new(n: usize, group_size: usize) -> Self {
        let kicks = Arc::new(Mutex::new(Vec::new()));
        let k = Arc::clone(&kicks);
        let cfg = crate::hierarchy::HierarchyConfig {
            group_size,
            ..Default::default()
        };
        let mut ticks = Vec::new();
        let (model, mut cpus) = PullModel::with_config(
            cfg,
            &vec![0; n],
            &mut |_| {
                let t = FakeHostTimer::new();
                ticks.push(t.clone());
                Box::new(t) as Box<dyn HostTimer>
            },
            Arc::new(move |c: CpuId| k.lock().unwrap().push(c)),
        )
        .unwrap();
        let wakes = super::coalesce_tests::fake_wake_timers(&mut cpus);
        Self {
            model,
            cpus,
            ticks,
            wakes,
            idle: vec![false; n],
            now: 1000,
            pending: HashMap::new(),
            next_id: 0,
            kicks,
            timer_wakeups: 0,
        }
    }

    /// A timer pass on `c`; returns how many timers fired (own or remote).
    fn run(&mut self, c: usize) -> usize {
        let (now, pending) = (self.now, &mut self.pending);
        let mut fired = 0;
        self.cpus[c].run(now, &mut |f: Fired<u64>| {
            let (t, deadline) = pending
                .remove(&f.payload)
                .unwrap_or_else(|| panic!("timer {} fired twice or after cancel", f.payload));
            assert_eq!((t.cpu, deadline), (f.cpu, f.deadline));
            assert_eq!(now, deadline, "timer {} fired late or early", f.payload);
            fired += 1;
            if f.remote && f.payload.is_multiple_of(3) {
                AfterFire::NotifyOwner
            } else {
                AfterFire::Done
            }
        });
        fired
    }

    /// An idle CPU wakes (its wake timer fired, or a kick), runs, goes idle again.
    fn bounce(&mut self, c: usize, by_timer: bool) -> Result<(), TestCaseError> {
        self.cpus[c].wake(self.now);
        let fired = self.run(c);
        if by_timer {
            self.timer_wakeups += 1;
            prop_assert!(fired > 0, "CPU {} woke at {} for nothing", c, self.now);
        }
        self.cpus[c].idle(self.now);
        Ok(())
    }

    fn service_kicks(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..10_000 {
            let k: Vec<CpuId> = std::mem::take(&mut *self.kicks.lock().unwrap());
            if k.is_empty() {
                return Ok(());
            }
            for c in k {
                if self.idle[c] {
                    self.bounce(c, false)?;
                } else {
                    self.run(c);
                }
            }
        }
        Err(TestCaseError::fail("kick storm"))
    }

    fn advance_to(&mut self, target: Nanos) -> Result<(), TestCaseError> {
        for _ in 0..100_000 {
            self.service_kicks()?;
            let next = (0..self.cpus.len())
                .map(|c| {
                    let t = if self.idle[c] {
                        self.wakes[c].deadline()
                    } else {
                        self.ticks[c].deadline()
                    };
                    (t, c)
                })
                .filter(|&(t, _)| t != NEVER)
                .min();
            match next {
                Some((t, c)) if t <= target => {
                    prop_assert!(t >= self.now, "CPU {} armed for the past: {}", c, t);
                    self.now = t;
                    if self.idle[c] {
                        self.bounce(c, true)?;
                    } else {
                        self.ticks[c].expire();
                        self.run(c);
                    }
                }
                _ => {
                    self.now = target;
                    return Ok(());
                }
            }
        }
        Err(TestCaseError::fail("no progress"))
    }

    fn pick(&self, pick: usize) -> Option<u64> {
        let mut ids: Vec<u64> = self.pending.keys().copied().collect();
        ids.sort_unstable();
        (!ids.is_empty()).then(|| ids[pick % ids.len()])
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let n = self.cpus.len();
        match *op {
            Op::Arm { cpu, pinned, delta } => {
                let c = cpu % n;
                let kind = if pinned {
                    TimerKind::Pinned
                } else {
                    TimerKind::Global
                };
                let id = self.next_id;
                self.next_id += 1;
                let deadline = self.now + delta;
                let handle = self.cpus[c].arm(kind, deadline, id);
                self.pending
                    .insert(id, (Timer { cpu: c, handle }, deadline));
                if !self.idle[c] {
                    self.run(c);
                }
            }
            Op::Cancel { pick } => {
                if let Some(id) = self.pick(pick) {
                    let (t, _) = self.pending.remove(&id).unwrap();
                    prop_assert_eq!(self.cpus[t.cpu].cancel(t.handle), Some(id));
                }
            }
            Op::Rearm { pick, delta } => {
                if let Some(id) = self.pick(pick) {
                    let d = self.now + delta;
                    let (c, h) = {
                        let (t, deadline) = self.pending.get_mut(&id).unwrap();
                        *deadline = d;
                        (t.cpu, t.handle)
                    };
                    prop_assert!(self.cpus[c].rearm(h, d));
                    if !self.idle[c] {
                        self.run(c);
                    }
                }
            }
            Op::Idle { cpu } => {
                let c = cpu % n;
                if !self.idle[c] {
                    self.run(c);
                    self.idle[c] = true;
                    self.cpus[c].idle(self.now);
                }
            }
            Op::Kick { cpu } => {
                // An interrupt for an idle CPU: it runs from now on.
                let c = cpu % n;
                if self.idle[c] {
                    self.idle[c] = false;
                    self.cpus[c].wake(self.now);
                    self.run(c);
                }
            }
            Op::Advance { delta } => self.advance_to(self.now + delta)?,
        }
        self.service_kicks()?;
        self.check()
    }

    /// The tree (with its duty invariant) is consistent, and every sleeping CPU's host
    /// wake-up is armed for exactly its first pinned timer or its duty.
    fn check(&self) -> Result<(), TestCaseError> {
        let h = self.model.hierarchy();
        h.dump().check().map_err(TestCaseError::fail)?;
        for c in 0..self.cpus.len() {
            if self.idle[c] {
                let want = self.cpus[c].base().next_pinned().min(h.wakeup(c));
                prop_assert_eq!(self.wakes[c].deadline(), want, "CPU {} wake-up", c);
                prop_assert_eq!(self.model.armed_wakeup(c), want);
                // The wake-up alone wakes it: no tick left to fire a second time.
                prop_assert_eq!(self.ticks[c].deadline(), NEVER, "CPU {} tick while idle", c);
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256),
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn sleepers_wake_only_for_work_and_no_timer_is_lost(
        n in 1usize..=16,
        group_size in prop_oneof![Just(2usize), Just(8usize)],
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        let mut sim = Sim::new(n, group_size);
        for op in &ops {
            sim.step(op)?;
        }
        // Everyone idle, then run the clock until every timer fired.
        for c in 0..n {
            sim.step(&Op::Idle { cpu: c })?;
        }
        let last = sim.pending.values().map(|&(_, d)| d).max().unwrap_or(sim.now);
        sim.advance_to(last + 1)?;
        prop_assert!(sim.pending.is_empty(), "lost timers: {:?}",
            sim.pending.iter().map(|(id, (t, d))| (*id, t.cpu, *d)).collect::<Vec<_>>());
        let m = sim.model.metrics();
        prop_assert_eq!(m.empty_wakeups, 0);
        prop_assert_eq!(m.timer_wakeups, sim.timer_wakeups);
    }
}

/// The case step by step: CPU 1 goes idle last and holds the duty for CPU 0's device
/// timer at 1500; CPU 2 wakes for its own timer at 1100: CPU 1's host wake-up moves to its
/// own deadline without waking it, and CPU 2, going idle last, takes the duty.
#[test]
fn an_activation_moves_the_sleepers_wake_up() {
    let mut sim = Sim::new(3, 8);
    let arm = |cpu, pinned, delta| Op::Arm { cpu, pinned, delta };
    for op in [
        arm(0, false, 500),
        arm(0, true, 2500),
        arm(1, true, 2000),
        arm(2, true, 100),
    ] {
        sim.step(&op).unwrap();
    }
    for cpu in [0, 2, 1] {
        sim.step(&Op::Idle { cpu }).unwrap();
    }
    assert_eq!(
        sim.wakes[1].deadline(),
        1500,
        "the last one out wakes for CPU 0's timer"
    );
    assert_eq!(sim.wakes[2].deadline(), 1100);
    sim.step(&Op::Advance { delta: 100 }).unwrap();
    assert_eq!(sim.wakes[1].deadline(), 3000, "moved to CPU 1's own timer");
    assert_eq!(sim.wakes[2].deadline(), 1500, "CPU 2 took the duty");
    let m = sim.model.metrics();
    assert_eq!((m.wake_retargets, m.timer_wakeups), (1, 1));
    sim.step(&Op::Advance { delta: 3000 }).unwrap();
    assert!(sim.pending.is_empty());
    let m = sim.model.metrics();
    assert_eq!((m.remote_expiries, m.empty_wakeups), (1, 0));
    assert_eq!(sim.timer_wakeups, 4);
}
