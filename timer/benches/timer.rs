//! Timer benchmarks: `cargo bench -p timer` (or `make bench-timer`, which also prints the
//! summary line). Measurement times are short so the whole run stays within a few minutes.
// criterion_group!/criterion_main! generate undocumented items.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use timer::model::{CentralModel, PullModel};
use timer::{
    Clock, CpuTimers, FakeHostTimer, Hierarchy, HostTimer, MonotonicClock, TimerBase, TimerKind,
};
use vmm_sys_util::timerfd::TimerFd;

const FAR: u64 = 1 << 50;

fn enqueue_cancel(c: &mut Criterion) {
    let mut g = c.benchmark_group("enqueue_cancel");
    for (name, kind, pending, shared) in [
        ("pinned", TimerKind::Pinned, 0, false),
        ("pinned_8_pending", TimerKind::Pinned, 8, false),
        ("global", TimerKind::Global, 0, false),
        ("global_8_pending", TimerKind::Global, 8, false),
        // While the owner is idle its global timers sit behind the shared queue's lock.
        ("global_idle_owner", TimerKind::Global, 0, true),
    ] {
        let mut base = TimerBase::new(0);
        if shared {
            base.share_globals();
        }
        for i in 0..pending {
            base.arm(kind, FAR + i * 1000, 0u64);
        }
        let mut d = FAR + 500;
        g.bench_function(name, |b| {
            b.iter(|| {
                d = d.wrapping_add(7919) & ((1 << 52) - 1);
                let h = base.arm(kind, black_box(d), 1u64);
                black_box(base.cancel(h))
            })
        });
    }
    g.finish();
}

/// What a host timer arm costs a timer event: a timerfd armed for a deadline on the model's
/// clock (read, subtracted, programmed) and disarmed.
fn timerfd(c: &mut Criterion) {
    let clock = MonotonicClock::new();
    let mut fd = TimerFd::new().expect("timerfd");
    let mut g = c.benchmark_group("timerfd");
    g.bench_function("arm_disarm", |b| {
        b.iter(|| {
            let deadline = black_box(clock.now() + 1_000_000_000);
            let rel = deadline.saturating_sub(clock.now()).max(1);
            fd.reset(Duration::from_nanos(rel), None).expect("arm");
            fd.clear().expect("disarm");
        })
    });
    g.finish();
}

fn hierarchy(n: usize, others_active: bool) -> Arc<Hierarchy> {
    let h = Arc::new(Hierarchy::with_cpus(n).expect("hierarchy"));
    for c in 0..n {
        if c == 0 || others_active {
            h.activate(c);
        } else {
            h.deactivate(c, FAR + c as u64);
        }
    }
    h
}

fn idle_cycle(c: &mut Criterion) {
    let mut g = c.benchmark_group("idle_cycle");
    for n in [8usize, 64, 512] {
        // Typical: CPU 0 goes idle and comes back while its group stays active.
        let h = hierarchy(n, true);
        g.bench_with_input(BenchmarkId::new("uncontended", n), &n, |b, _| {
            b.iter(|| {
                black_box(h.deactivate(0, FAR));
                h.activate(0);
            })
        });
        // Worst case: CPU 0 is the last active CPU, so both walks go up to the root.
        let h = hierarchy(n, false);
        g.bench_with_input(BenchmarkId::new("last_active", n), &n, |b, _| {
            b.iter(|| {
                black_box(h.deactivate(0, FAR));
                h.activate(0);
            })
        });
        // Two threads: CPU 1 (same group) cycles in the background.
        let h = hierarchy(n, false);
        h.activate(1);
        g.bench_with_input(BenchmarkId::new("contended_2_threads", n), &n, |b, _| {
            b.iter_custom(|iters| {
                let stop = Arc::new(AtomicBool::new(false));
                let (h2, s2) = (Arc::clone(&h), Arc::clone(&stop));
                let bg = std::thread::spawn(move || {
                    while !s2.load(Ordering::Relaxed) {
                        black_box(h2.deactivate(1, FAR + 1));
                        h2.activate(1);
                    }
                });
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(h.deactivate(0, FAR));
                    h.activate(0);
                }
                let e = t.elapsed();
                stop.store(true, Ordering::Relaxed);
                bg.join().expect("background thread");
                e
            })
        });
    }
    g.finish();
}

/// A whole vCPU idle round trip in the pull model (hand-over of global timers included),
/// with one pinned and one global timer pending and the other 7 vCPUs running.
fn pull_idle_wake(c: &mut Criterion) {
    let (_m, mut cpus) = PullModel::<u64>::new(
        &[0; 8],
        &mut |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>,
        Arc::new(|_| {}),
    )
    .expect("pull model");
    let cpu = &mut cpus[0];
    cpu.arm(TimerKind::Pinned, FAR + 10, 1);
    cpu.arm(TimerKind::Global, FAR, 2);
    c.benchmark_group("pull")
        .bench_function("idle_wake_8", |b| {
            b.iter(|| {
                black_box(cpu.idle(0));
                cpu.wake(0);
            })
        });
}

fn central(c: &mut Criterion) {
    let mut g = c.benchmark_group("central");
    let fake = FakeHostTimer::new();
    let (_m, cpus) = CentralModel::<u64>::new(
        2,
        &mut |_| Box::new(fake.clone()) as Box<dyn HostTimer>,
        Arc::new(|_| {}),
    );
    let mut cpus = cpus.into_iter();
    let mut c0 = cpus.next().expect("cpu 0");
    let c1 = cpus.next().expect("cpu 1");
    g.bench_function("uncontended", |b| {
        b.iter(|| {
            let h = c0.arm(TimerKind::Global, FAR, 1);
            black_box(c0.cancel(h))
        })
    });
    let c1 = Arc::new(std::sync::Mutex::new(c1));
    g.bench_function("contended_2_threads", |b| {
        b.iter_custom(|iters| {
            let stop = Arc::new(AtomicBool::new(false));
            let (c1, s2) = (Arc::clone(&c1), Arc::clone(&stop));
            let bg = std::thread::spawn(move || {
                let mut c1 = c1.lock().expect("cpu 1");
                while !s2.load(Ordering::Relaxed) {
                    let h = c1.arm(TimerKind::Global, FAR + 1, 2);
                    black_box(c1.cancel(h));
                }
            });
            let t = Instant::now();
            for _ in 0..iters {
                let h = c0.arm(TimerKind::Global, FAR, 1);
                black_box(c0.cancel(h));
            }
            let e = t.elapsed();
            stop.store(true, Ordering::Relaxed);
            bg.join().expect("background thread");
            e
        })
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = enqueue_cancel, timerfd, idle_cycle, pull_idle_wake, central
}
criterion_main!(benches);
