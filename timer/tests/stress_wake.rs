//! Real vCPU threads on the pull model that block the way the VMM is to block: on their wake
//! timer (which `idle` arms and other threads re-arm when the wake-up duty moves) or a kick,
//! never on a timeout of their own. Every timer must fire exactly once and never early: a
//! retarget that moved a wake-up too late would lose one (caught by the 20 s guard).
//!
//! The wake timer here is a condition variable with an absolute deadline, standing in for a
//! timerfd: re-arming it notifies the waiter, which only re-computes its wait (that is not a
//! wake-up of the vCPU: it calls `wake` only when the deadline passed or it was kicked).
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicI64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use timer::model::PullModel;
use timer::{
    AfterFire, Clock, CpuId, CpuTimers, FakeHostTimer, Fired, HierarchyConfig, HostTimer,
    HostTimerError, MonotonicClock, Nanos, TimerKind, TimerModel, NEVER,
};

const PER_CPU: usize = 800;
const GUARD: Nanos = 20_000_000_000;

/// A vCPU's wake timer and kick flag.
#[derive(Default)]
struct WakeCell {
    state: Mutex<(Nanos, bool)>,
    cv: Condvar,
}

impl WakeCell {
    fn kick(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_one();
    }

    /// Blocks until the wake timer's deadline passes (consuming the expiry, like reading a
    /// timerfd), a kick, or `until`. True if the wake timer fired.
    fn wait(&self, clock: &MonotonicClock, until: Nanos) -> bool {
        let mut s = self.state.lock().unwrap();
        loop {
            if std::mem::take(&mut s.1) {
                return false;
            }
            let now = clock.now();
            if s.0 <= now {
                s.0 = NEVER;
                return true;
            }
            if until <= now {
                return false;
            }
            let wait = s.0.min(until) - now;
            s = self
                .cv
                .wait_timeout(s, Duration::from_nanos(wait.min(1_000_000_000)))
                .unwrap()
                .0;
        }
    }
}

struct WakeTimer(Arc<WakeCell>);

impl HostTimer for WakeTimer {
    fn arm(&mut self, deadline: Nanos) -> Result<(), HostTimerError> {
        self.0.state.lock().unwrap().0 = deadline;
        self.0.cv.notify_one();
        Ok(())
    }

    fn disarm(&mut self) -> Result<(), HostTimerError> {
        self.arm(NEVER)
    }
}

struct Shared {
    clock: MonotonicClock,
    cells: Vec<Arc<WakeCell>>,
    deadlines: Vec<std::sync::atomic::AtomicU64>,
    fired: Vec<AtomicU8>,
    outstanding: AtomicI64,
    done_arming: AtomicUsize,
}

impl Shared {
    fn on_fire(&self, f: Fired<usize>) -> AfterFire {
        let now = self.clock.now();
        let d = self.deadlines[f.payload].load(Ordering::SeqCst);
        assert_eq!(d, f.deadline);
        assert!(now >= d, "timer {} fired {} ns early", f.payload, d - now);
        assert_eq!(self.fired[f.payload].fetch_add(1, Ordering::SeqCst), 0);
        if self.outstanding.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.cells.iter().for_each(|c| c.kick());
        }
        AfterFire::Done
    }

    fn finished(&self) -> bool {
        self.done_arming.load(Ordering::SeqCst) == self.cells.len()
            && self.outstanding.load(Ordering::SeqCst) == 0
    }
}

fn vcpu(sh: &Shared, cpu: usize, t: &mut dyn CpuTimers<usize>, start: Nanos) {
    let mut rng = 0x9e37_79b9_7f4a_7c15 ^ ((cpu as u64 + 1) * 0x1234_5678);
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut armed = 0;
    let mut on_fire = |f: Fired<usize>| sh.on_fire(f);
    loop {
        let now = sh.clock.now();
        assert!(now - start < GUARD, "CPU {cpu}: timers lost");
        for _ in 0..=next(2) {
            if armed == PER_CPU {
                break;
            }
            let id = cpu * PER_CPU + armed;
            armed += 1;
            let kind = if next(4) == 0 {
                TimerKind::Pinned
            } else {
                TimerKind::Global
            };
            let d = now + next(2_000_000);
            sh.deadlines[id].store(d, Ordering::SeqCst);
            sh.outstanding.fetch_add(1, Ordering::SeqCst);
            t.arm(kind, d, id);
            if armed == PER_CPU {
                sh.done_arming.fetch_add(1, Ordering::SeqCst);
            }
        }
        let tick = t.run(sh.clock.now(), &mut on_fire);
        if sh.finished() {
            return;
        }
        if armed == PER_CPU || next(4) != 0 {
            // Halt: idle in the model, block on the wake timer or a kick, nothing else.
            t.idle(sh.clock.now());
            sh.cells[cpu].wait(&sh.clock, start + GUARD);
            t.wake(sh.clock.now());
        } else {
            // Run guest code for a slice, interrupted by the host tick or a kick.
            let until = tick.min(sh.clock.now() + next(300_000));
            sh.cells[cpu].wait(&sh.clock, until);
        }
    }
}

#[test]
fn pull_vcpus_blocking_on_their_wake_timers_lose_no_timer() {
    let n = 4;
    let clock = MonotonicClock::new();
    let cells: Vec<Arc<WakeCell>> = (0..n).map(|_| Arc::default()).collect();
    let sh = Arc::new(Shared {
        clock,
        cells: cells.clone(),
        deadlines: (0..n * PER_CPU)
            .map(|_| std::sync::atomic::AtomicU64::new(NEVER))
            .collect(),
        fired: (0..n * PER_CPU).map(|_| AtomicU8::new(0)).collect(),
        outstanding: AtomicI64::new(0),
        done_arming: AtomicUsize::new(0),
    });
    let kick = cells.clone();
    let cfg = HierarchyConfig {
        group_size: 2,
        ..HierarchyConfig::default()
    };
    let (model, cpus) = PullModel::<usize>::with_config(
        cfg,
        &vec![0; n],
        &mut |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>,
        Arc::new(move |c: CpuId| kick[c].kick()),
    )
    .unwrap();
    let start = clock.now();
    let threads: Vec<_> = cpus
        .into_iter()
        .enumerate()
        .map(|(cpu, mut t)| {
            t.set_wake_timer(Box::new(WakeTimer(Arc::clone(&cells[cpu]))));
            let sh = Arc::clone(&sh);
            std::thread::spawn(move || vcpu(&sh, cpu, &mut t, start))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for (id, f) in sh.fired.iter().enumerate() {
        assert_eq!(f.load(Ordering::SeqCst), 1, "timer {id}");
    }
    let m = model.metrics();
    eprintln!("stress_wake: {m:?}");
    assert!(m.remote_expiries > 0 && m.timer_wakeups > 0, "{m:?}");
}
