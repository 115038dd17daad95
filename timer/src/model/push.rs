//! `push`: every CPU programs its own host timer for the head of its base, global timers
//! included; an idle CPU wakes for each of its timers. No migration, no shared state.

use std::sync::Arc;

use super::{CpuTimers, HostTick, ModelKind, OnFire, Sleeper, TimerModel, Waker};
use crate::base::{CpuId, TimerBase, TimerHandle, TimerKind};
use crate::clock::{Nanos, NEVER};
use crate::host::HostTimer;
use crate::metrics::{Metrics, TimerMetrics};

/// The shared part of the push model (only counters).
pub struct PushModel {
    metrics: Metrics,
}

/// One CPU of the push model.
pub struct PushCpu<T> {
    base: TimerBase<T>,
    shared: Arc<PushModel>,
    tick: HostTick,
    sleeper: Sleeper,
    idle: bool,
}

impl PushModel {
    /// Builds the model for `n` CPUs. The waker is unused: nothing fires off its owner.
    pub fn new<T: Send + 'static>(
        n: usize,
        host: &mut dyn FnMut(Option<CpuId>) -> Box<dyn HostTimer>,
        _waker: Arc<dyn Waker>,
    ) -> (Arc<Self>, Vec<PushCpu<T>>) {
        let shared = Arc::new(Self {
            metrics: Metrics::default(),
        });
        let cpus = (0..n)
            .map(|cpu| PushCpu {
                base: TimerBase::new(cpu),
                shared: Arc::clone(&shared),
                tick: HostTick::new(host(Some(cpu))),
                sleeper: Sleeper::new(),
                idle: false,
            })
            .collect();
        (shared, cpus)
    }
}

impl<T> TimerModel<T> for PushModel {
    fn kind(&self) -> ModelKind {
        ModelKind::Push
    }

    fn metrics(&self) -> TimerMetrics {
        self.metrics.read()
    }

    fn arm_global(&self, _cpu: CpuId, _deadline: Nanos, _payload: T) -> bool {
        false
    }

    fn service(&self, _now: Nanos, _f: OnFire<'_, T>) -> Nanos {
        NEVER
    }
}

impl<T: Send + 'static> PushCpu<T> {
    /// Follows the head of the base: the wake-up while idle (the tick too when no host
    /// wake-up is attached), the tick while running.
    fn sync(&mut self, now: Option<Nanos>) {
        if self.idle && self.sleeper.has_timer() {
            self.sleep(now);
            return;
        }
        self.tick
            .track(self.base.next_expiry(), now, &self.shared.metrics);
        if self.idle {
            self.sleep(now);
        }
    }

    /// Arms the wake-up for the head of the base: push wakes for every timer.
    fn sleep(&self, now: Option<Nanos>) -> Nanos {
        self.sleeper.sleep(
            self.base.next_expiry(),
            &|| NEVER,
            now,
            &self.shared.metrics,
        )
    }
}

impl<T: Send + 'static> CpuTimers<T> for PushCpu<T> {
    fn cpu(&self) -> CpuId {
        self.base.cpu()
    }

    fn arm(&mut self, kind: TimerKind, deadline: Nanos, payload: T) -> TimerHandle {
        let h = self.base.arm(kind, deadline, payload);
        self.sync(None);
        h
    }

    fn cancel(&mut self, h: TimerHandle) -> Option<T> {
        let p = self.base.cancel(h);
        self.sync(None);
        p
    }

    fn rearm(&mut self, h: TimerHandle, deadline: Nanos) -> bool {
        let ok = self.base.rearm(h, deadline);
        self.sync(None);
        ok
    }

    fn run(&mut self, now: Nanos, f: OnFire<'_, T>) -> Nanos {
        self.shared.metrics.local(self.base.expire(now, f));
        self.sync(Some(now));
        self.base.next_expiry()
    }

    fn idle(&mut self, now: Nanos) -> Nanos {
        self.idle = true;
        let timeout = self.sleep(Some(now));
        if self.sleeper.has_timer() {
            // After the wake-up is armed (see `HostTick::release`).
            self.tick.release(now, &self.shared.metrics);
        }
        timeout
    }

    fn idle_timeout(&self) -> Nanos {
        self.base.next_expiry()
    }

    fn wake(&mut self, now: Nanos) {
        if self.idle {
            self.idle = false;
            if self.sleeper.wake() <= now {
                let busy = self.base.next_expiry() <= now;
                self.shared.metrics.timer_wakeup(busy);
            }
        }
    }

    fn set_wake_timer(&mut self, timer: Box<dyn HostTimer>) {
        self.sleeper.attach(timer);
    }

    fn next_deadline(&self) -> Nanos {
        self.tick.armed
    }
}
