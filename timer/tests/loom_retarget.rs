//! Model checking of the wake-up duty's retarget race with loom, on the real pull model: a
//! CPU going idle as the last one out (claiming the duty of the all-idle tree and arming its
//! host wake-up for it) while another CPU becomes active and takes the duty over (re-arming
//! the sleeper's host wake-up from its own thread). Each loom thread owns one [`PullCpu`] of
//! one [`PullModel`] and calls what a vCPU thread calls (`idle`, `wake`, `arm`,
//! `run_halted`, `run`); the wake timers are [`FakeHostTimer`]s that record their deadline.
//!
//! Run with `make loom-tests` (bound 5), or:
//! `RUSTFLAGS="--cfg loom" cargo test -p timer --release --test loom_retarget` (bound 3 by
//! default; `LOOM_MAX_PREEMPTIONS=6` searches deeper). Without `--cfg loom` this file is empty.
//!
//! The tree: 4 CPUs, groups of 2. CPU 2 is idle with a global timer at 100 (someone must
//! expire it: a migrator or the duty holder); CPU 3 is idle with nothing.
//! ```text
//!           [root]
//!          /      \
//!      [G0]        [G1]
//!      /  \        /  \
//!     0    1      2    3
//! ```
#![cfg(loom)]
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use loom::sync::Mutex;
use loom::thread;
use timer::hierarchy::{Hierarchy, HierarchyConfig};
use timer::model::{PullCpu, PullModel};
use timer::{
    AfterFire, CpuId, CpuTimers, FakeHostTimer, GlobalQueue, HostTimer, Nanos, TimerKind, NEVER,
};

/// Each CPU's own deadline (its first pinned timer) while it sleeps.
const OWN: [Nanos; 4] = [400, 1000, NEVER, NEVER];
/// CPU 2's global timer.
const EVENT: Nanos = 100;
/// The time CPUs go idle and are kicked awake at (before every deadline).
const NOW: Nanos = 10;

type Cpu = PullCpu<&'static str>;

struct Vm {
    shared: Arc<PullModel<&'static str>>,
    /// The CPUs' wake timers (clones of what the model arms).
    timers: Vec<FakeHostTimer>,
    /// The CPUs the model asked the VMM to kick, in order.
    kicks: Arc<Mutex<Vec<CpuId>>>,
    /// CPU 2's global queue, where its event waits until someone expires it.
    event: Arc<GlobalQueue<&'static str>>,
}

impl Vm {
    fn h(&self) -> &Hierarchy {
        self.shared.hierarchy()
    }

    /// At rest: the tree is consistent (one duty holder iff all idle with an event); every
    /// idle CPU's host wake-up is armed for exactly its own deadline or its duty (no stale
    /// wake-up); the event, while pending, has someone: an active migrator or a sleeper
    /// whose host wake-up fires by then (no lost expiry).
    fn check(&self) {
        let s = self.h().dump();
        s.check().unwrap();
        for (c, cpu) in s.cpus.iter().enumerate() {
            if cpu.idle {
                assert_eq!(
                    self.timers[c].deadline(),
                    OWN[c].min(cpu.wakeup),
                    "CPU {c}'s host wake-up is stale"
                );
            }
        }
        if self.event.next_expiry() > EVENT {
            return;
        }
        let root = &s.groups[s.root().unwrap()];
        let covered = if root.state.active != 0 {
            (0..4).any(|c| !s.cpus[c].idle && self.h().remote_deadline(c) <= EVENT)
        } else {
            (0..4).any(|c| s.cpus[c].idle && self.timers[c].deadline() <= EVENT)
        };
        assert!(covered, "nobody expires the event at {EVENT}");
    }

    fn kicked(&self, c: CpuId) -> bool {
        self.kicks.lock().unwrap().contains(&c)
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

/// The real pull model with fake host timers and a waker that records kicks; CPU 2 idle with
/// its timer at `EVENT`, CPU 3 idle, CPU 1 running, CPU 0 asleep for its own deadline.
fn start() -> (Arc<Vm>, Vec<Cpu>) {
    let cfg = HierarchyConfig {
        group_size: 2,
        max_cpus: 4,
        max_nodes: 1,
        cpus_per_node: None,
    };
    let kicks = Arc::new(Mutex::new(Vec::new()));
    let k = Arc::clone(&kicks);
    let waker = Arc::new(move |c: CpuId| k.lock().unwrap().push(c));
    let mut ticks = |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>;
    let (shared, mut cpus) = PullModel::with_config(cfg, &[0; 4], &mut ticks, waker).unwrap();
    let timers: Vec<FakeHostTimer> = (0..4).map(|_| FakeHostTimer::new()).collect();
    for (cpu, t) in cpus.iter_mut().zip(&timers) {
        cpu.set_wake_timer(Box::new(t.clone()));
    }
    cpus[0].arm(TimerKind::Pinned, OWN[0], "own 0");
    cpus[1].arm(TimerKind::Pinned, OWN[1], "own 1");
    cpus[2].arm(TimerKind::Global, EVENT, "event");
    cpus[3].idle(NOW);
    cpus[2].idle(NOW);
    cpus[0].idle(NOW);
    let vm = Vm {
        event: Arc::clone(cpus[2].base().global()),
        shared,
        timers,
        kicks,
    };
    (Arc::new(vm), cpus)
}

/// Runs `f` on `cpu` in a loom thread; joining gives the CPU back with `f`'s result.
fn on_thread<R: Send + 'static>(
    mut cpu: Cpu,
    f: impl FnOnce(&mut Cpu) -> R + Send + 'static,
) -> thread::JoinHandle<(Cpu, R)> {
    thread::spawn(move || {
        let r = f(&mut cpu);
        (cpu, r)
    })
}

/// Runs `cpu`'s due timers at `now`; returns how many were CPU 2's event.
fn run_counting_event(cpu: &mut Cpu, now: Nanos, halted: bool) -> usize {
    let mut n = 0;
    let mut f = |fired: timer::Fired<&'static str>| {
        n += usize::from(fired.payload == "event");
        AfterFire::Done
    };
    if halted {
        cpu.run_halted(now, &mut f);
    } else {
        cpu.run(now, &mut f);
    }
    n
}

/// CPU 1 goes idle as the last one out (claiming the duty for 100) while CPU 0 wakes and
/// becomes active (taking it over): CPU 1 ends up armed for its own 1000, never 100.
#[test]
fn loom_last_one_out_races_an_activation() {
    model(|| {
        let (vm, mut cpus) = start();
        let t = on_thread(cpus.remove(1), |c| c.idle(NOW));
        cpus[0].wake(NOW);
        t.join().unwrap();
        vm.check();
        assert_eq!(vm.timers[1].deadline(), 1000);
        assert_eq!(vm.h().wakeup(1), NEVER);
    });
}

/// As above, but CPU 0 goes idle again after running: exactly one of the two sleepers wakes
/// for the event at 100, the other for its own deadline.
#[test]
fn loom_last_one_out_races_a_flip() {
    model(|| {
        let (vm, mut cpus) = start();
        let t = on_thread(cpus.remove(1), |c| c.idle(NOW));
        cpus[0].wake(NOW);
        cpus[0].idle(NOW);
        t.join().unwrap();
        vm.check();
        let at_event = [0, 1]
            .iter()
            .filter(|&&c| vm.timers[c].deadline() == EVENT)
            .count();
        assert_eq!(at_event, 1, "exactly one sleeper wakes for the event");
    });
}

/// All idle, CPU 1 holds the duty. Idle CPU 3 arms an earlier global timer (its walk reaches
/// the idle root: it claims the duty from CPU 1) while CPU 0 becomes active (and takes the
/// duty over from whoever holds it) and runs: no sleeper is left armed for a duty, and the
/// running CPU 0 has its host tick armed for the new timer or was kicked to re-arm it.
#[test]
fn loom_new_timer_claim_races_an_activation() {
    model(|| {
        let (vm, mut cpus) = start();
        cpus[1].idle(NOW);
        assert_eq!(vm.timers[1].deadline(), EVENT);
        let t = on_thread(cpus.remove(3), |c| {
            c.arm(TimerKind::Global, 50, "new");
        });
        cpus[0].wake(NOW);
        cpus[0].run(NOW, &mut |_| AfterFire::Done);
        t.join().unwrap();
        vm.check();
        assert_eq!(vm.timers[1].deadline(), 1000);
        assert_eq!(vm.timers[3].deadline(), NEVER);
        assert!(
            vm.h().remote_deadline(0) <= 50,
            "CPU 3's timer at 50 is lost"
        );
        assert!(
            cpus[0].next_deadline() <= 50 || vm.kicked(0),
            "running CPU 0 neither ticks for CPU 3's timer at 50 nor was kicked"
        );
    });
}

/// All idle, CPU 1 holds the duty and wakes for it (at 100) and runs halted, while CPU 0
/// wakes for something else: the hand-over ends with nobody holding a duty, whichever
/// activation comes first, and the event is expired exactly once, by CPU 1 at once or by
/// whichever of the two is the migrator when they next run.
#[test]
fn loom_holder_wakes_while_another_activates() {
    model(|| {
        let (vm, mut cpus) = start();
        cpus[1].idle(NOW);
        let t = on_thread(cpus.remove(1), |c| {
            c.wake(EVENT);
            run_counting_event(c, EVENT, true)
        });
        cpus[0].wake(NOW);
        let (mut c1, mut fired) = t.join().unwrap();
        vm.check();
        let s = vm.h().dump();
        assert_eq!(s.duty_holder, None);
        assert!(fired == 1 || vm.h().remote_deadline(0).min(vm.h().remote_deadline(1)) <= EVENT);
        fired += run_counting_event(&mut cpus[0], EVENT, false);
        fired += run_counting_event(&mut c1, EVENT, false);
        assert_eq!(fired, 1, "CPU 2's event fired {fired} times");
    });
}
