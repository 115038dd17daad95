//! Real threads as vCPUs on each timer model: they run in slices, go idle and block with the
//! model's timeout, are kicked through the `Waker`, and arm/cancel pinned and global timers.
//! Every timer must fire exactly once, never early; cancelled ones never. Nothing here sleeps
//! to synchronize: threads block only on their host tick, idle timeout or a kick, exactly as
//! the VMM will (the `central` model's timer thread blocks on its host timer, which the
//! arming vCPU "programs" by kicking it). A lost timer shows up as `outstanding` never
//! reaching zero (bounded by a 20 s guard, after which the state is dumped).
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use timer::model::PullModel;
use timer::{
    build, AfterFire, Clock, CpuId, CpuTimers, Fired, HierarchyConfig, HostTimer, HostTimerError,
    ModelKind, MonotonicClock, Nanos, TimerKind, TimerModel, Waker, NEVER,
};

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
    ncpus: usize,
    /// One per vCPU, plus the central timer thread's at index `ncpus`.
    parkers: Vec<Parker>,
    deadlines: Vec<AtomicU64>,
    fired: Vec<AtomicU8>,
    cancelled: Vec<AtomicBool>,
    outstanding: AtomicI64,
    done_arming: AtomicUsize,
    failed: AtomicBool,
    max_late: AtomicU64,
    remote: AtomicU64,
}

impl Shared {
    fn on_fire(&self, f: Fired<usize>) -> AfterFire {
        let now = self.clock.now();
        let id = f.payload;
        let d = self.deadlines[id].load(Ordering::SeqCst);
        assert_eq!(d, f.deadline, "timer {id} deadline");
        assert!(now >= d, "timer {id} fired {} ns early", d - now);
        assert!(
            !self.cancelled[id].load(Ordering::SeqCst),
            "cancelled {id} fired"
        );
        assert_eq!(
            self.fired[id].fetch_add(1, Ordering::SeqCst),
            0,
            "{id} twice"
        );
        self.max_late.fetch_max(now - d, Ordering::Relaxed);
        if f.remote {
            self.remote.fetch_add(1, Ordering::Relaxed);
        }
        if self.outstanding.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.kick_all();
        }
        if f.remote && id.is_multiple_of(4) {
            AfterFire::NotifyOwner
        } else {
            AfterFire::Done
        }
    }

    fn kick_all(&self) {
        self.parkers.iter().for_each(Parker::kick);
    }

    /// True when every vCPU has armed all its timers and all of them fired or were cancelled,
    /// or the run failed.
    fn finished(&self, start: Nanos) -> bool {
        if self.clock.now() - start >= GUARD {
            self.failed.store(true, Ordering::SeqCst);
        }
        if self.failed.load(Ordering::SeqCst) {
            self.kick_all();
            return true;
        }
        self.done_arming.load(Ordering::SeqCst) == self.ncpus
            && self.outstanding.load(Ordering::SeqCst) == 0
    }
}

/// The central timer thread's host timer: programming it wakes the timer thread.
struct ServiceTimer(Arc<Shared>);

impl HostTimer for ServiceTimer {
    fn arm(&mut self, _deadline: Nanos) -> Result<(), HostTimerError> {
        self.0.parkers[self.0.ncpus].kick();
        Ok(())
    }

    fn disarm(&mut self) -> Result<(), HostTimerError> {
        Ok(())
    }
}

/// The pull model (for diagnostics), the shared part, the per-vCPU parts.
type Built = (
    Option<Arc<PullModel<usize>>>,
    Arc<dyn TimerModel<usize>>,
    Vec<Box<dyn CpuTimers<usize>>>,
);

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
fn pull_vcpu_threads_never_lose_or_early_fire_a_timer() {
    stress(ModelKind::Pull, 6, 8);
}

/// A deep tree (groups of 2, four levels for 12 CPUs) so walks cross several levels.
#[test]
fn pull_vcpu_threads_on_a_deep_tree() {
    stress(ModelKind::Pull, 12, 2);
}

#[test]
fn push_vcpu_threads() {
    stress(ModelKind::Push, 4, 8);
}

#[test]
fn central_timer_thread() {
    stress(ModelKind::Central, 4, 8);
}

/// One vCPU thread: exits arm/cancel timers and run the model; it alternates between running
/// (blocked until its host tick or a kick) and idle (blocked until its timeout or a kick).
fn vcpu(sh: &Shared, cpu: usize, t: &mut dyn CpuTimers<usize>, start: Nanos) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((cpu as u64 + 1) * 0x1234_5678));
    let (mut armed, mut counted) = (0, false);
    let mut on_fire = |f: Fired<usize>| sh.on_fire(f);
    loop {
        let now = sh.clock.now();
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
        let tick = t.run(sh.clock.now(), &mut on_fire);
        let arming = armed < PER_CPU;
        if !arming && !counted {
            counted = true;
            if sh.done_arming.fetch_add(1, Ordering::SeqCst) + 1 == sh.ncpus {
                sh.kick_all();
            }
        }
        // Done only when nobody can arm any more and nothing is pending: a vCPU that left
        // earlier would still be an active migrator for the others.
        if sh.finished(start) {
            return;
        }
        let slice = if arming { rng.next(300_000) } else { NEVER };
        if rng.next(2) == 0 {
            let timeout = t.idle(sh.clock.now());
            let until = timeout.min(sh.clock.now().saturating_add(slice));
            sh.parkers[cpu].park(&sh.clock, until.min(start + GUARD));
            t.wake(sh.clock.now());
        } else {
            let until = tick.min(sh.clock.now().saturating_add(slice));
            sh.parkers[cpu].park(&sh.clock, until.min(start + GUARD));
        }
    }
}

fn stress(kind: ModelKind, ncpus: usize, group_size: usize) {
    let clock = MonotonicClock::new();
    let total = ncpus * PER_CPU;
    let sh = Arc::new(Shared {
        clock,
        ncpus,
        parkers: (0..=ncpus).map(|_| Parker::default()).collect(),
        deadlines: (0..total).map(|_| AtomicU64::new(NEVER)).collect(),
        fired: (0..total).map(|_| AtomicU8::new(0)).collect(),
        cancelled: (0..total).map(|_| AtomicBool::new(false)).collect(),
        outstanding: AtomicI64::new(0),
        done_arming: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
        max_late: AtomicU64::new(0),
        remote: AtomicU64::new(0),
    });
    let (pull, model, cpus) = build_model(&sh, kind, group_size);
    let cpus = run_threads(&sh, kind, &model, cpus, clock.now());
    if sh.failed.load(Ordering::SeqCst) {
        report_lost(&sh, &cpus, pull.as_deref());
        panic!("{kind:?}: timers lost");
    }
    let fired = fired_once_each(&sh);
    let m = model.metrics();
    eprintln!(
        "stress {kind:?}: {fired} fired ({} remote), max lateness {} us, {m:?}",
        sh.remote.load(Ordering::Relaxed),
        sh.max_late.load(Ordering::Relaxed) / 1000,
    );
    match kind {
        ModelKind::Pull | ModelKind::Central => assert!(m.remote_expiries > 0),
        ModelKind::Push => assert_eq!(m.remote_expiries, 0),
    }
}

/// The model of `kind` over `sh`'s CPUs (all in node 0), with fake per-CPU host timers and
/// the service timer of the test.
fn build_model(sh: &Arc<Shared>, kind: ModelKind, group_size: usize) -> Built {
    let s2 = Arc::clone(sh);
    let waker: Arc<dyn Waker> = Arc::new(move |c: CpuId| s2.parkers[c].kick());
    let nodes = vec![0; sh.ncpus];
    let s3 = Arc::clone(sh);
    let mut host = move |cpu: Option<CpuId>| -> Box<dyn HostTimer> {
        match cpu {
            Some(_) => Box::new(timer::FakeHostTimer::new()),
            None => Box::new(ServiceTimer(Arc::clone(&s3))),
        }
    };
    if kind == ModelKind::Pull {
        let cfg = HierarchyConfig {
            group_size,
            ..HierarchyConfig::default()
        };
        let (m, c) = PullModel::with_config(cfg, &nodes, &mut host, waker).unwrap();
        let cpus = c
            .into_iter()
            .map(|c| Box::new(c) as Box<dyn CpuTimers<usize>>)
            .collect();
        (Some(Arc::clone(&m)), m, cpus)
    } else {
        let m = build(kind, &nodes, &mut host, waker).unwrap();
        (None, m.shared, m.cpus)
    }
}

/// Runs a thread per vCPU (and the central model's service thread) until the test is over;
/// returns the vCPUs' timers.
fn run_threads(
    sh: &Arc<Shared>,
    kind: ModelKind,
    model: &Arc<dyn TimerModel<usize>>,
    cpus: Vec<Box<dyn CpuTimers<usize>>>,
    start: Nanos,
) -> Vec<Box<dyn CpuTimers<usize>>> {
    let service = (kind == ModelKind::Central).then(|| {
        let (sh, model) = (Arc::clone(sh), Arc::clone(model));
        std::thread::spawn(move || {
            let mut on_fire = |f: Fired<usize>| sh.on_fire(f);
            while !sh.finished(start) {
                let next = model.service(sh.clock.now(), &mut on_fire);
                sh.parkers[sh.ncpus].park(&sh.clock, next.min(start + GUARD));
            }
        })
    });
    let threads: Vec<_> = cpus
        .into_iter()
        .enumerate()
        .map(|(cpu, mut t)| {
            let sh = Arc::clone(sh);
            std::thread::spawn(move || {
                vcpu(&sh, cpu, &mut *t, start);
                t
            })
        })
        .collect();
    let cpus: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    if let Some(s) = service {
        s.join().unwrap();
    }
    cpus
}

/// After a failure: every timer still pending past its deadline, each CPU's state and the
/// pull model's hierarchy.
fn report_lost(sh: &Shared, cpus: &[Box<dyn CpuTimers<usize>>], pull: Option<&PullModel<usize>>) {
    let now = sh.clock.now();
    for id in 0..sh.fired.len() {
        let pending =
            sh.fired[id].load(Ordering::SeqCst) == 0 && !sh.cancelled[id].load(Ordering::SeqCst);
        let d = sh.deadlines[id].load(Ordering::SeqCst);
        if pending && d != NEVER {
            let ago = now.saturating_sub(d);
            eprintln!("lost: timer {id} of CPU {} due {ago} ns ago", id / PER_CPU);
        }
    }
    for (c, t) in cpus.iter().enumerate() {
        let (timeout, tick) = (t.idle_timeout(), t.next_deadline());
        eprintln!("CPU {c}: idle timeout {timeout} tick {tick}");
    }
    if let Some(p) = pull {
        eprintln!("{:#?}", p.hierarchy().dump());
    }
}

/// Checks that every timer fired once, but for the cancelled ones, which never fired;
/// returns how many fired.
fn fired_once_each(sh: &Shared) -> usize {
    let mut fired = 0;
    for id in 0..sh.fired.len() {
        let n = sh.fired[id].load(Ordering::SeqCst);
        let c = sh.cancelled[id].load(Ordering::SeqCst);
        assert_eq!(
            n,
            u8::from(!c),
            "timer {id}: fired {n} times, cancelled {c}"
        );
        fired += usize::from(n);
    }
    fired
}
