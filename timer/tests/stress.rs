//! Real threads as vCPUs on the pull model: they run in slices, go idle and block with the
//! model's timeout, are kicked through the `Waker`, and arm/cancel pinned and global timers.
//! Every timer must fire exactly once, never early; cancelled ones never. Nothing here sleeps
//! to synchronize: threads block only on their host tick, idle timeout or a kick, exactly as
//! the VMM will. A lost timer shows up as `outstanding` never reaching zero (bounded by a
//! 20 s guard).
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use timer::{AfterFire, Clock, CpuId, HostTimer, MonotonicClock, Nanos, TimerKind, Waker, NEVER};

const PER_CPU: usize = 1500;
const GUARD: Nanos = 20_000_000_000;

#[derive(Default)]
struct Parker {
    kicked: Mutex<bool>,
    cv: Condvar,
}

impl Parker {
    fn kick(&self) {
        *self.kicked.lock().unwrap() = true;
        self.cv.notify_one();
    }

    /// Blocks until kicked or `until` (monotonic ns) passes.
    fn park(&self, clock: &MonotonicClock, until: Nanos) {
        let mut k = self.kicked.lock().unwrap();
        while !*k {
            let now = clock.now();
            if now >= until {
                break;
            }
            let wait = Duration::from_nanos((until - now).min(1_000_000_000));
            k = self.cv.wait_timeout(k, wait).unwrap().0;
        }
        *k = false;
    }
}

struct Shared {
    clock: MonotonicClock,
    parkers: Vec<Parker>,
    deadlines: Vec<AtomicU64>,
    fired: Vec<AtomicU8>,
    cancelled: Vec<AtomicBool>,
    outstanding: AtomicI64,
    done_arming: AtomicUsize,
    max_late: AtomicU64,
    remote: AtomicU64,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn vcpu_threads_never_lose_or_early_fire_a_timer() {
    stress(6, 8);
}

/// A deep tree (groups of 2, four levels for 12 CPUs) so walks cross several levels.
#[test]
fn vcpu_threads_on_a_deep_tree() {
    stress(12, 2);
}

#[allow(clippy::too_many_lines)]
fn stress(ncpus: usize, group_size: usize) {
    let clock = MonotonicClock::new();
    let total = ncpus * PER_CPU;
    let sh = Arc::new(Shared {
        clock,
        parkers: (0..ncpus).map(|_| Parker::default()).collect(),
        deadlines: (0..total).map(|_| AtomicU64::new(NEVER)).collect(),
        fired: (0..total).map(|_| AtomicU8::new(0)).collect(),
        cancelled: (0..total).map(|_| AtomicBool::new(false)).collect(),
        outstanding: AtomicI64::new(0),
        done_arming: AtomicUsize::new(0),
        max_late: AtomicU64::new(0),
        remote: AtomicU64::new(0),
    });
    let s2 = Arc::clone(&sh);
    let waker: Arc<dyn Waker> = Arc::new(move |c: CpuId| s2.parkers[c].kick());
    let nodes = vec![0; ncpus];
    let cfg = timer::HierarchyConfig {
        group_size,
        ..timer::HierarchyConfig::default()
    };
    let (pull, cpus) = timer::model::PullModel::<usize>::with_config(
        cfg,
        &nodes,
        &mut |_| Box::new(timer::FakeHostTimer::new()) as Box<dyn HostTimer>,
        waker,
    )
    .unwrap();
    let failed = Arc::new(AtomicBool::new(false));
    let start = clock.now();
    let threads: Vec<_> = cpus
        .into_iter()
        .enumerate()
        .map(|(cpu, mut t)| {
            let sh = Arc::clone(&sh);
            let failed = Arc::clone(&failed);
            std::thread::spawn(move || {
                use timer::CpuTimers;
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((cpu as u64 + 1) * 0x1234_5678));
                let mut armed = 0;
                let mut counted = false;
                let mut on_fire = |f: timer::Fired<usize>| {
                    let now = sh.clock.now();
                    let id = f.payload;
                    let d = sh.deadlines[id].load(Ordering::SeqCst);
                    assert_eq!(d, f.deadline, "timer {id} deadline");
                    assert!(now >= d, "timer {id} fired {} ns early", d - now);
                    assert!(
                        !sh.cancelled[id].load(Ordering::SeqCst),
                        "cancelled {id} fired"
                    );
                    assert_eq!(sh.fired[id].fetch_add(1, Ordering::SeqCst), 0, "{id} twice");
                    sh.max_late.fetch_max(now - d, Ordering::Relaxed);
                    if f.remote {
                        sh.remote.fetch_add(1, Ordering::Relaxed);
                    }
                    if sh.outstanding.fetch_sub(1, Ordering::SeqCst) == 1 {
                        sh.parkers.iter().for_each(Parker::kick);
                    }
                    if f.remote && id.is_multiple_of(4) {
                        AfterFire::NotifyOwner
                    } else {
                        AfterFire::Done
                    }
                };
                loop {
                    let now = sh.clock.now();
                    if now - start >= GUARD || failed.load(Ordering::SeqCst) {
                        failed.store(true, Ordering::SeqCst);
                        sh.parkers.iter().for_each(Parker::kick);
                        break;
                    }
                    // An exit: arm a few timers, cancel some.
                    if armed < PER_CPU {
                        for _ in 0..=rng.next(3) {
                            if armed == PER_CPU {
                                break;
                            }
                            let id = cpu * PER_CPU + armed;
                            armed += 1;
                            let kind = if rng.next(4) == 0 {
                                TimerKind::Pinned
                            } else {
                                TimerKind::Global
                            };
                            let d = now + rng.next(400_000);
                            sh.deadlines[id].store(d, Ordering::SeqCst);
                            sh.outstanding.fetch_add(1, Ordering::SeqCst);
                            let h = t.arm(kind, d, id);
                            if rng.next(6) == 0 {
                                if let Some(p) = t.cancel(h) {
                                    assert_eq!(p, id);
                                    sh.cancelled[id].store(true, Ordering::SeqCst);
                                    sh.outstanding.fetch_sub(1, Ordering::SeqCst);
                                }
                            }
                        }
                    }
                    let tick = t.run(sh.clock.now(), &mut on_fire);
                    let arming = armed < PER_CPU;
                    if !arming && !counted {
                        counted = true;
                        if sh.done_arming.fetch_add(1, Ordering::SeqCst) + 1 == ncpus {
                            sh.parkers.iter().for_each(Parker::kick);
                        }
                    }
                    // Done only when nobody can arm any more and nothing is pending: a vCPU
                    // that left earlier would still be an active migrator for the others.
                    if sh.done_arming.load(Ordering::SeqCst) == ncpus
                        && sh.outstanding.load(Ordering::SeqCst) == 0
                    {
                        break;
                    }
                    if rng.next(2) == 0 {
                        // Idle: block with the model's timeout, wake, run.
                        let timeout = t.idle(sh.clock.now());
                        let until = if arming {
                            timeout.min(sh.clock.now() + rng.next(300_000))
                        } else {
                            timeout
                        };
                        sh.parkers[cpu].park(&sh.clock, until.min(start + GUARD));
                        t.wake(sh.clock.now());
                    } else {
                        // Running guest code until the host tick (or a short slice while
                        // this vCPU still has work to arm).
                        let until = if arming {
                            tick.min(sh.clock.now() + rng.next(200_000))
                        } else {
                            tick
                        };
                        sh.parkers[cpu].park(&sh.clock, until.min(start + GUARD));
                    }
                }
                t
            })
        })
        .collect();
    let cpus: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    if failed.load(Ordering::SeqCst) {
        let now = sh.clock.now();
        for id in 0..total {
            if sh.fired[id].load(Ordering::SeqCst) == 0 && !sh.cancelled[id].load(Ordering::SeqCst)
            {
                let d = sh.deadlines[id].load(Ordering::SeqCst);
                if d != NEVER {
                    eprintln!(
                        "lost: timer {id} of CPU {} due {} ns ago",
                        id / PER_CPU,
                        now.saturating_sub(d)
                    );
                }
            }
        }
        for (c, t) in cpus.iter().enumerate() {
            eprintln!(
                "CPU {c}: pinned {} global {} timeout {} tick {}",
                t.base().next_pinned(),
                t.base().next_global(),
                timer::CpuTimers::idle_timeout(t),
                timer::CpuTimers::next_deadline(t)
            );
        }
        eprintln!("{:#?}", pull.hierarchy().snapshot());
        panic!("timers lost");
    }
    let mut fired = 0;
    for id in 0..total {
        let n = sh.fired[id].load(Ordering::SeqCst);
        let c = sh.cancelled[id].load(Ordering::SeqCst);
        assert_eq!(
            n,
            u8::from(!c),
            "timer {id}: fired {n} times, cancelled {c}"
        );
        fired += usize::from(n);
    }
    let m = timer::TimerModel::metrics(&*pull);
    eprintln!(
        "stress: {fired} fired ({} remote), max lateness {} us, {:?}",
        sh.remote.load(Ordering::Relaxed),
        sh.max_late.load(Ordering::Relaxed) / 1000,
        m
    );
    assert!(m.remote_expiries > 0, "no remote expiry exercised");
}
