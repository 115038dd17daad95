//! Model checking of the wake-up duty's retarget race with loom: a CPU going idle as the last
//! one out (claiming the duty of the all-idle tree and arming its host wake-up for it) while
//! another CPU becomes active and takes the duty over (re-arming the sleeper's host wake-up
//! from its own thread). Each thread does exactly what `PullCpu` does (`update_idle`, `wake`)
//! with the hierarchy, the CPUs' [`Sleeper`]s and fake host timers.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" cargo test -p timer --release --test loom_retarget`
//! (`LOOM_MAX_PREEMPTIONS=4` searches deeper). Without `--cfg loom` this file is empty.
//!
//! The tree: 4 CPUs, groups of 2. CPU 2 is idle with a global event at 100 (someone must
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

use loom::thread;
use timer::hierarchy::{Hierarchy, HierarchyConfig};
use timer::model::Sleeper;
use timer::{CpuId, FakeHostTimer, Metrics, Nanos, NEVER};

/// Each CPU's own deadline (its first pinned timer) while it sleeps.
const OWN: [Nanos; 4] = [400, 1000, NEVER, NEVER];
/// CPU 2's global event.
const EVENT: Nanos = 100;

struct Vm {
    h: Hierarchy,
    sleepers: Vec<Sleeper>,
    timers: Vec<FakeHostTimer>,
    m: Metrics,
}

impl Vm {
    fn new() -> Arc<Self> {
        let cfg = HierarchyConfig {
            group_size: 2,
            max_cpus: 4,
            max_nodes: 1,
            cpus_per_node: None,
        };
        let timers: Vec<FakeHostTimer> = (0..4).map(|_| FakeHostTimer::new()).collect();
        let sleepers: Vec<Sleeper> = timers
            .iter()
            .map(|t| {
                let s = Sleeper::new();
                s.attach(Box::new(t.clone()));
                s
            })
            .collect();
        let vm = Self {
            h: Hierarchy::new(cfg, &[0, 0, 0, 0]).unwrap(),
            sleepers,
            timers,
            m: Metrics::default(),
        };
        Arc::new(vm)
    }

    /// The hierarchy moved `c`'s duty: re-arm its host wake-up (`PullModel::retarget`).
    fn retarget(&self, c: Option<CpuId>) {
        if let Some(c) = c {
            self.sleepers[c].retarget(&|| self.h.wakeup(c), &self.m);
        }
    }

    /// `c` goes idle (or, idle, re-reports) with `next_global` (`PullCpu::update_idle`).
    fn idle(&self, c: CpuId, next_global: Nanos) {
        let upd = self.h.deactivate(c, next_global);
        self.retarget(upd.retarget);
        self.sleepers[c].sleep(OWN[c], &|| self.h.wakeup(c), Some(0), &self.m);
    }

    /// `c` wakes up and becomes active (`PullCpu::wake`).
    fn wake(&self, c: CpuId) {
        self.sleepers[c].wake();
        let released = self.h.activate(c);
        self.retarget(released);
    }

    /// At rest: the tree is consistent (one duty holder iff all idle with an event); every
    /// idle CPU's host wake-up is armed for exactly its own deadline or its duty (no stale
    /// wake-up); the first event has someone: an active migrator or a sleeper whose host
    /// wake-up fires by then (no lost expiry).
    fn check(&self) {
        let s = self.h.snapshot();
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
        let root = &s.groups[s.root().unwrap()];
        let covered = if root.state.active != 0 {
            (0..4).any(|c| !s.cpus[c].idle && self.h.remote_deadline(c) <= EVENT)
        } else {
            (0..4).any(|c| s.cpus[c].idle && self.timers[c].deadline() <= EVENT)
        };
        assert!(covered, "nobody expires the event at {EVENT}");
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

/// CPU 2 idle with its event, CPU 1 running, CPU 0 asleep for its own deadline.
fn start() -> Arc<Vm> {
    let vm = Vm::new();
    vm.h.activate(0);
    vm.h.activate(1);
    vm.idle(2, EVENT);
    vm.idle(0, NEVER);
    vm
}

/// CPU 1 goes idle as the last one out (claiming the duty for 100) while CPU 0 wakes and
/// becomes active (taking it over): CPU 1 ends up armed for its own 1000, never 100.
#[test]
fn loom_last_one_out_races_an_activation() {
    model(|| {
        let vm = start();
        let v = Arc::clone(&vm);
        let t = thread::spawn(move || v.idle(1, NEVER));
        vm.wake(0);
        t.join().unwrap();
        vm.check();
        assert_eq!(vm.timers[1].deadline(), 1000);
        assert_eq!(vm.h.wakeup(1), NEVER);
    });
}

/// As above, but CPU 0 goes idle again after running: exactly one of the two sleepers wakes
/// for the event at 100, the other for its own deadline.
#[test]
fn loom_last_one_out_races_a_flip() {
    model(|| {
        let vm = start();
        let v = Arc::clone(&vm);
        let t = thread::spawn(move || v.idle(1, NEVER));
        vm.wake(0);
        vm.idle(0, NEVER);
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
/// duty over from whoever holds it): no sleeper is left armed for a duty.
#[test]
fn loom_new_timer_claim_races_an_activation() {
    model(|| {
        let vm = start();
        vm.idle(1, NEVER);
        assert_eq!(vm.timers[1].deadline(), EVENT);
        let v = Arc::clone(&vm);
        let t = thread::spawn(move || v.idle(3, 50));
        vm.wake(0);
        t.join().unwrap();
        vm.check();
        assert_eq!(vm.timers[1].deadline(), 1000);
        assert_eq!(vm.timers[3].deadline(), NEVER);
        assert!(vm.h.remote_deadline(0) <= 50, "CPU 3's timer at 50 is lost");
    });
}

/// All idle, CPU 1 holds the duty and wakes for it while CPU 0 wakes for its own deadline:
/// the hand-over ends with nobody holding a duty, whichever activation comes first.
#[test]
fn loom_holder_wakes_while_another_activates() {
    model(|| {
        let vm = start();
        vm.idle(1, NEVER);
        let v = Arc::clone(&vm);
        let t = thread::spawn(move || v.wake(1));
        vm.wake(0);
        t.join().unwrap();
        vm.check();
        let s = vm.h.snapshot();
        assert_eq!(s.duty_holder, None);
        assert!(vm.h.remote_deadline(0).min(vm.h.remote_deadline(1)) <= EVENT);
    });
}
