//! `central`: one queue for every CPU's timers, expired by one timer thread that kicks the
//! owners (QEMU's main-loop style). Arming takes the shared lock; that is its cost.

use std::sync::{Arc, Mutex, MutexGuard};

use super::{CpuTimers, HostTick, ModelKind, OnFire, TimerModel, Waker};
use crate::base::{AfterFire, CpuId, Fired, TimerHandle, TimerKind};
use crate::clock::{Nanos, NEVER};
use crate::host::HostTimer;
use crate::metrics::{Metrics, TimerMetrics};
use crate::queue::TimerQueue;

struct Central<T> {
    queue: TimerQueue<(CpuId, TimerKind, T)>,
    tick: HostTick,
}

/// The shared part of the central model: the one queue and the timer thread's host timer.
pub struct CentralModel<T> {
    inner: Mutex<Central<T>>,
    metrics: Metrics,
    waker: Arc<dyn Waker>,
}

/// One CPU of the central model: a handle onto the shared queue.
pub struct CentralCpu<T> {
    cpu: CpuId,
    shared: Arc<CentralModel<T>>,
    /// Never armed: the timer thread kicks the CPU for each of its timers.
    wake_timer: Option<Box<dyn HostTimer>>,
}

impl<T: Send + 'static> CentralModel<T> {
    /// Builds the model for `n` CPUs; `host(None)` is the timer thread's host timer.
    pub fn new(
        n: usize,
        host: &mut dyn FnMut(Option<CpuId>) -> Box<dyn HostTimer>,
        waker: Arc<dyn Waker>,
    ) -> (Arc<Self>, Vec<CentralCpu<T>>) {
        let shared = Arc::new(Self {
            inner: Mutex::new(Central {
                queue: TimerQueue::new(),
                tick: HostTick::new(host(None)),
            }),
            metrics: Metrics::default(),
            waker,
        });
        let cpus = (0..n)
            .map(|cpu| CentralCpu {
                cpu,
                shared: Arc::clone(&shared),
                wake_timer: None,
            })
            .collect();
        (shared, cpus)
    }

    fn lock(&self) -> MutexGuard<'_, Central<T>> {
        crate::lock(&self.inner)
    }
}

impl<T: Send + 'static> TimerModel<T> for CentralModel<T> {
    fn kind(&self) -> ModelKind {
        ModelKind::Central
    }

    fn metrics(&self) -> TimerMetrics {
        self.metrics.read()
    }

    fn arm_global(&self, cpu: CpuId, deadline: Nanos, payload: T) -> bool {
        let mut c = self.lock();
        c.queue.arm(deadline, (cpu, TimerKind::Global, payload));
        if deadline < c.tick.armed {
            c.tick.set(deadline, &self.metrics);
        }
        true
    }

    fn service(&self, now: Nanos, f: OnFire<'_, T>) -> Nanos {
        self.metrics.remote_run();
        loop {
            let popped = self.lock().queue.pop_due(now);
            let Some((slot, deadline, (cpu, kind, payload))) = popped else {
                break;
            };
            self.metrics.remote(1);
            let handle = TimerHandle::new(cpu, kind, slot);
            let fired = Fired {
                cpu,
                handle,
                deadline,
                payload,
                remote: true,
            };
            if f(fired) == AfterFire::NotifyOwner {
                self.metrics.wakeup();
                self.waker.wake(cpu);
            }
        }
        let mut c = self.lock();
        let next = c.queue.peek().unwrap_or(NEVER);
        c.tick.ensure(next, now, &self.metrics);
        next
    }
}

impl<T: Send + 'static> CpuTimers<T> for CentralCpu<T> {
    fn cpu(&self) -> CpuId {
        self.cpu
    }

    fn arm(&mut self, kind: TimerKind, deadline: Nanos, payload: T) -> TimerHandle {
        let mut c = self.shared.lock();
        let slot = c.queue.arm(deadline, (self.cpu, kind, payload));
        if deadline < c.tick.armed {
            // The timer thread must wake earlier (QEMU: timerlist notify).
            c.tick.set(deadline, &self.shared.metrics);
        }
        TimerHandle::new(self.cpu, kind, slot)
    }

    fn cancel(&mut self, h: TimerHandle) -> Option<T> {
        if h.cpu() != self.cpu {
            return None;
        }
        self.shared.lock().queue.cancel(h.slot()).map(|(_, _, p)| p)
    }

    fn rearm(&mut self, h: TimerHandle, deadline: Nanos) -> bool {
        if h.cpu() != self.cpu {
            return false;
        }
        let mut c = self.shared.lock();
        let ok = c.queue.rearm(h.slot(), deadline);
        if ok && deadline < c.tick.armed {
            c.tick.set(deadline, &self.shared.metrics);
        }
        ok
    }

    fn run(&mut self, _now: Nanos, _f: OnFire<'_, T>) -> Nanos {
        NEVER
    }

    fn idle(&mut self, _now: Nanos) -> Nanos {
        NEVER
    }

    fn idle_timeout(&self) -> Nanos {
        NEVER
    }

    fn wake(&mut self, _now: Nanos) {}

    fn set_wake_timer(&mut self, timer: Box<dyn HostTimer>) {
        self.wake_timer = Some(timer);
    }

    fn next_deadline(&self) -> Nanos {
        NEVER
    }
}
