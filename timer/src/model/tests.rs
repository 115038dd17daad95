//! The pull model driven by random operation sequences, checking the hierarchy's invariants
//! and every timer's fate after each step; plus small tests of push and central.

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
    Activate {
        cpu: usize,
    },
    Deactivate {
        cpu: usize,
    },
    HandleRemote {
        cpu: usize,
    },
    Advance {
        delta: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..70, any::<bool>(), 0u64..3000).prop_map(|(cpu, pinned, delta)| Op::Arm { cpu, pinned, delta }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => (any::<usize>(), 0u64..3000).prop_map(|(pick, delta)| Op::Rearm { pick, delta }),
        3 => (0usize..70).prop_map(|cpu| Op::Activate { cpu }),
        4 => (0usize..70).prop_map(|cpu| Op::Deactivate { cpu }),
        1 => (0usize..70).prop_map(|cpu| Op::HandleRemote { cpu }),
        3 => (0u64..1500).prop_map(|delta| Op::Advance { delta }),
    ]
}

#[derive(Debug, Clone, Copy)]
struct Timer {
    cpu: usize,
    deadline: Nanos,
    handle: TimerHandle,
}

/// A VMM in miniature: vCPUs run, go idle, wake at their timeouts and when kicked.
struct Sim {
    model: Arc<PullModel<u64>>,
    cpus: Vec<PullCpu<u64>>,
    idle: Vec<bool>,
    now: Nanos,
    pending: HashMap<u64, Timer>,
    fired: HashMap<u64, Nanos>,
    cancelled: Vec<u64>,
    ids: Vec<u64>,
    next_id: u64,
    kicks: Arc<Mutex<Vec<CpuId>>>,
    late: Vec<(u64, Nanos, Nanos)>,
}

impl Sim {
    fn new(n: usize) -> Self {
        Self::with_group_size(n, 8)
    }

    fn with_group_size(n: usize, group_size: usize) -> Self {
        let kicks = Arc::new(Mutex::new(Vec::new()));
        let k = Arc::clone(&kicks);
        let waker: Arc<dyn Waker> = Arc::new(move |c: CpuId| k.lock().unwrap().push(c));
        let nodes: Vec<usize> = (0..n).map(|i| i / 24).collect();
        let cfg = crate::hierarchy::HierarchyConfig {
            group_size,
            ..Default::default()
        };
        let (model, cpus) = PullModel::with_config(
            cfg,
            &nodes,
            &mut |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>,
            waker,
        )
        .unwrap();
        let mut s = Self {
            model,
            cpus,
            idle: vec![false; n],
            now: 1000,
            pending: HashMap::new(),
            fired: HashMap::new(),
            cancelled: Vec::new(),
            ids: Vec::new(),
            next_id: 0,
            kicks,
            late: Vec::new(),
        };
        for c in 0..n {
            s.run(c);
        }
        s
    }

    /// The vCPU's exit path: expire, handle remote, re-arm the tick.
    fn run(&mut self, c: usize) {
        let now = self.now;
        let (pending, fired, cancelled, late) = (
            &mut self.pending,
            &mut self.fired,
            &self.cancelled,
            &mut self.late,
        );
        self.cpus[c].run(now, &mut |f: Fired<u64>| {
            let id = f.payload;
            let t = pending
                .remove(&id)
                .unwrap_or_else(|| panic!("timer {id} fired twice or unknown"));
            assert!(!cancelled.contains(&id), "cancelled timer {id} fired");
            assert_eq!(t.deadline, f.deadline);
            assert_eq!(t.cpu, f.cpu);
            assert!(
                now >= f.deadline,
                "timer {id} fired early: {now} < {}",
                f.deadline
            );
            if now > f.deadline {
                late.push((id, f.deadline, now));
            }
            assert!(fired.insert(id, now).is_none());
            if f.remote && id.is_multiple_of(3) {
                AfterFire::NotifyOwner
            } else {
                AfterFire::Done
            }
        });
    }

    /// Wakes an idle vCPU, runs it, and sends it back to idle (a timeout or a kick).
    fn bounce(&mut self, c: usize) {
        self.cpus[c].wake(self.now);
        self.run(c);
        self.cpus[c].idle(self.now);
    }

    fn service_kicks(&mut self) {
        for _ in 0..10_000 {
            let k: Vec<CpuId> = std::mem::take(&mut *self.kicks.lock().unwrap());
            if k.is_empty() {
                return;
            }
            for c in k {
                if self.idle[c] {
                    self.bounce(c);
                } else {
                    self.run(c);
                }
            }
        }
        panic!("kick storm");
    }

    /// When the next thing happens: an active vCPU's host tick or an idle one's timeout.
    fn next_event(&self) -> Option<(Nanos, usize)> {
        (0..self.cpus.len())
            .map(|c| {
                let t = if self.idle[c] {
                    self.cpus[c].idle_timeout()
                } else {
                    self.cpus[c].next_deadline()
                };
                (t, c)
            })
            .filter(|&(t, _)| t != NEVER)
            .min()
    }

    fn advance_to(&mut self, target: Nanos) {
        for _ in 0..100_000 {
            self.service_kicks();
            match self.next_event() {
                Some((t, c)) if t <= target => {
                    self.now = self.now.max(t);
                    if self.idle[c] {
                        self.bounce(c);
                    } else {
                        self.run(c);
                    }
                }
                _ => {
                    self.now = self.now.max(target);
                    return;
                }
            }
        }
        panic!("no progress advancing to {target}");
    }

    fn pick(&self, pick: usize) -> Option<u64> {
        (!self.ids.is_empty()).then(|| self.ids[pick % self.ids.len()])
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let n = self.cpus.len();
        let model = Arc::clone(&self.model);
        let h = model.hierarchy();
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
                self.pending.insert(
                    id,
                    Timer {
                        cpu: c,
                        deadline,
                        handle,
                    },
                );
                self.ids.push(id);
                if !self.idle[c] {
                    self.run(c);
                }
            }
            Op::Cancel { pick } => {
                if let Some(id) = self.pick(pick) {
                    let t = self.pending.get(&id).copied();
                    let h = t.map(|t| t.handle);
                    if let Some(t) = t {
                        prop_assert_eq!(self.cpus[t.cpu].cancel(t.handle), Some(id));
                        self.pending.remove(&id);
                        self.cancelled.push(id);
                    } else {
                        // Already fired or cancelled: a stale handle does nothing.
                        let _ = h;
                    }
                }
            }
            Op::Rearm { pick, delta } => {
                if let Some(id) = self.pick(pick) {
                    if let Some(t) = self.pending.get_mut(&id) {
                        t.deadline = self.now + delta;
                        let (c, hd, d) = (t.cpu, t.handle, t.deadline);
                        prop_assert!(self.cpus[c].rearm(hd, d));
                        if !self.idle[c] {
                            self.run(c);
                        }
                    }
                }
            }
            Op::Activate { cpu } => {
                let c = cpu % n;
                if self.idle[c] {
                    self.idle[c] = false;
                    self.cpus[c].wake(self.now);
                    self.run(c);
                }
            }
            Op::Deactivate { cpu } => {
                let c = cpu % n;
                if !self.idle[c] {
                    self.run(c);
                    let b = self.cpus[c].base();
                    let reported = if b.next_global() < b.next_pinned() {
                        b.next_global()
                    } else {
                        NEVER
                    };
                    let forecast = h.quick_check(c, reported);
                    self.idle[c] = true;
                    self.cpus[c].idle(self.now);
                    let truth = self.model.hierarchy().wakeup(c);
                    prop_assert!(
                        forecast <= truth,
                        "quick_check {} later than wakeup {}",
                        forecast,
                        truth
                    );
                }
            }
            Op::HandleRemote { cpu } => {
                let c = cpu % n;
                if !self.idle[c] {
                    self.run(c);
                    prop_assert!(!h.requires_handle_remote(c, self.now), "no fixed point");
                    struct Nothing;
                    impl crate::hierarchy::RemoteExpiry for Nothing {
                        fn expire_remote(&mut self, cpu: CpuId, now: Nanos) {
                            panic!("CPU {cpu} still had due remote timers at {now}");
                        }
                        fn next_global(&mut self, _cpu: CpuId) -> Nanos {
                            NEVER
                        }
                    }
                    let again = h.handle_remote(c, self.now, &mut Nothing);
                    prop_assert_eq!(again.cpus_expired, 0);
                }
            }
            Op::Advance { delta } => self.advance_to(self.now + delta),
        }
        self.service_kicks();
        self.check()
    }

    /// Every pending global timer of an idle CPU is reachable; every running CPU's tick covers
    /// what it must expire; the tree is consistent.
    fn check(&self) -> Result<(), TestCaseError> {
        let h = self.model.hierarchy();
        let snap = h.snapshot();
        snap.check().map_err(TestCaseError::fail)?;
        for c in 0..self.cpus.len() {
            prop_assert_eq!(snap.cpus[c].idle, self.idle[c]);
            let b = self.cpus[c].base();
            if !self.idle[c] {
                let must = b.next_expiry().min(h.remote_deadline(c));
                prop_assert!(
                    self.cpus[c].next_deadline() <= must,
                    "CPU {} tick {} misses {}",
                    c,
                    self.cpus[c].next_deadline(),
                    must
                );
                continue;
            }
            let g = b.next_global();
            if g == NEVER || self.cpus[c].idle_timeout() <= g {
                continue;
            }
            // Queued at level 0 under its true owner, no later than the timer ...
            let cs = snap.cpus[c];
            let g0 = &snap.groups[cs.group];
            let e = g0.events.iter().find(|e| e.slot == cs.slot);
            prop_assert!(
                e.is_some_and(|e| e.cpu == c && e.expiry <= g),
                "CPU {} timer {} not queued: {:?}",
                c,
                g,
                e
            );
            // ... and up to a group with an active migrator, or the root's wakeup.
            let mut grp = g0;
            loop {
                if grp.state.active != 0 {
                    break;
                }
                prop_assert!(grp.next_expiry <= g);
                match grp.parent {
                    Some((p, _)) => grp = &snap.groups[p],
                    None => {
                        let covered = (0..self.cpus.len()).any(|i| {
                            self.idle[i] && self.cpus[i].idle_timeout() <= grp.next_expiry
                        });
                        prop_assert!(
                            covered,
                            "CPU {} timer {} unreachable: nobody wakes for root {}",
                            c,
                            g,
                            grp.next_expiry
                        );
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs time forward until nothing is pending; every timer must have fired exactly once.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        let last = self
            .pending
            .values()
            .map(|t| t.deadline)
            .max()
            .unwrap_or(self.now);
        self.advance_to(last + 1);
        prop_assert!(self.pending.is_empty(), "lost timers: {:?}", self.pending);
        prop_assert_eq!(
            self.fired.len() + self.cancelled.len(),
            usize::try_from(self.next_id).unwrap()
        );
        Ok(())
    }
}

type Stat = (usize, usize, usize, u64, u64);
static STATS: Mutex<Vec<Stat>> = Mutex::new(Vec::new());

proptest! {
    #![proptest_config(ProptestConfig {
        // PROPTEST_CASES=5000 for a soak run.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256), max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn pull_model_never_loses_a_timer(
        n in 1usize..=70,
        group_size in prop_oneof![3 => Just(8usize), 1 => Just(2usize)],
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let mut sim = Sim::with_group_size(n, group_size);
        for op in &ops {
            sim.step(op)?;
        }
        sim.drain()?;
        prop_assert!(sim.late.is_empty(), "late timers: {:?}", sim.late);
        let m = sim.model.metrics();
        STATS.lock().unwrap().push((n, ops.len(), sim.fired.len(), m.remote_expiries, m.wakeups_requested));
    }
}

#[test]
fn remote_expiry_runs_on_the_migrator_and_notifies_the_owner() {
    let mut sim = Sim::new(2);
    // CPU 1 arms a global timer (id 0: notify) and goes idle; CPU 0 stays up.
    sim.step(&Op::Arm {
        cpu: 1,
        pinned: false,
        delta: 100,
    })
    .unwrap();
    sim.step(&Op::Deactivate { cpu: 1 }).unwrap();
    let kicks_before = sim.model.metrics().wakeups_requested;
    sim.step(&Op::Advance { delta: 200 }).unwrap();
    assert_eq!(sim.fired.get(&0), Some(&1100));
    let m = sim.model.metrics();
    assert_eq!(m.remote_expiries, 1);
    assert!(m.wakeups_requested > kicks_before);
    assert!(m.host_timer_arms > 0);
}

#[test]
fn push_wakes_for_every_timer_and_central_expires_everything() {
    let fake = FakeHostTimer::new();
    let f2 = fake.clone();
    let woken = Arc::new(Mutex::new(Vec::new()));
    let w = Arc::clone(&woken);
    let mut m = build::<u32>(
        ModelKind::Push,
        &[0, 0],
        &mut |_| Box::new(f2.clone()),
        Arc::new(move |c: CpuId| w.lock().unwrap().push(c)),
    )
    .unwrap();
    let a = m.cpus[1].arm(TimerKind::Global, 50, 7);
    assert_eq!(fake.deadline(), 50);
    assert_eq!(m.cpus[1].idle(0), 50);
    assert_eq!(m.cpus[1].cancel(a), Some(7));
    assert_eq!(fake.deadline(), NEVER);
    m.cpus[1].arm(TimerKind::Pinned, 60, 8);
    let mut got = Vec::new();
    m.cpus[1].run(60, &mut |f| {
        got.push(f.payload);
        AfterFire::Done
    });
    assert_eq!(got, vec![8]);
    assert_eq!(m.shared.metrics().local_expiries, 1);

    let central = FakeHostTimer::new();
    let c2 = central.clone();
    let mut m = build::<u32>(
        ModelKind::Central,
        &[0, 0],
        &mut |_| Box::new(c2.clone()),
        Arc::new(move |c: CpuId| woken.lock().unwrap().push(c)),
    )
    .unwrap();
    m.cpus[0].arm(TimerKind::Pinned, 30, 1);
    let x = m.cpus[1].arm(TimerKind::Global, 20, 2);
    assert_eq!(central.deadline(), 20);
    assert!(m.cpus[1].rearm(x, 25));
    assert_eq!(m.cpus[0].cancel(x), None, "only the owner cancels");
    let mut got = Vec::new();
    let next = m.shared.service(26, &mut |f| {
        got.push((f.cpu, f.payload));
        AfterFire::NotifyOwner
    });
    assert_eq!(got, vec![(1, 2)]);
    assert_eq!(next, 30);
    assert_eq!(m.shared.metrics().wakeups_requested, 1);
    assert_eq!(m.shared.kind(), ModelKind::Central);
    assert_eq!("pull".parse::<ModelKind>().unwrap(), ModelKind::Pull);
    assert!("x".parse::<ModelKind>().is_err());
}

#[test]
#[ignore]
fn stats() {
    pull_model_never_loses_a_timer();
    let s = STATS.lock().unwrap();
    let tot = |f: fn(&Stat) -> u64| s.iter().map(f).sum::<u64>();
    eprintln!(
        "cases {} fired {} remote {} wakeups {} maxcpus {}",
        s.len(),
        tot(|x| x.2 as u64),
        tot(|x| x.3),
        tot(|x| x.4),
        s.iter().map(|x| x.0).max().unwrap()
    );
}

#[test]
fn pull_model_hot_adds_a_cpu_that_pulls_timers() {
    let cfg = crate::hierarchy::HierarchyConfig {
        group_size: 2,
        max_cpus: 8,
        ..Default::default()
    };
    let (m, mut cpus) = PullModel::<u32>::with_config(
        cfg,
        &[0, 0],
        &mut |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>,
        Arc::new(|_: CpuId| {}),
    )
    .unwrap();
    cpus[0].arm(TimerKind::Global, 100, 0);
    cpus[1].arm(TimerKind::Global, 200, 1);
    assert_eq!(cpus[0].idle(0), NEVER);
    assert_eq!(
        cpus[1].idle(0),
        100,
        "last one out wakes for the first global timer"
    );
    // A new vCPU arrives: a new root is grown above the old one; the newcomer is the only
    // running vCPU, so it pulls both idle vCPUs' timers.
    let mut new = m.add_cpu(1, Box::new(FakeHostTimer::new())).unwrap();
    assert_eq!(new.cpu(), 2);
    assert_eq!(m.hierarchy().num_levels(), 2);
    m.hierarchy().snapshot().check().unwrap();
    assert_eq!(new.run(0, &mut |_| AfterFire::Done), 100);
    let mut got = Vec::new();
    new.run(250, &mut |f| {
        got.push((f.cpu, f.payload));
        AfterFire::Done
    });
    assert_eq!(got, vec![(0, 0), (1, 1)]);
    assert_eq!(m.metrics().remote_expiries, 2);
}
