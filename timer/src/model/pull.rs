//! `pull`: global timers of idle CPUs are expired by a running migrator (see `Hierarchy`).

use std::sync::{Arc, OnceLock};

use super::{CpuTimers, HostTick, ModelKind, OnFire, TimerModel, Waker};
use crate::base::{AfterFire, CpuId, Fired, GlobalQueue, TimerBase, TimerHandle, TimerKind};
use crate::clock::{Nanos, NEVER};
use crate::hierarchy::{Hierarchy, HierarchyConfig, HierarchyError, NodeId, RemoteExpiry};
use crate::host::HostTimer;
use crate::metrics::{Metrics, MetricsSnapshot};

/// The shared part of the pull model: the hierarchy and every CPU's global queue.
pub struct PullModel<T> {
    hierarchy: Hierarchy,
    globals: Box<[OnceLock<Arc<GlobalQueue<T>>>]>,
    metrics: Metrics,
    waker: Arc<dyn Waker>,
}

/// One CPU of the pull model.
pub struct PullCpu<T> {
    base: TimerBase<T>,
    shared: Arc<PullModel<T>>,
    tick: HostTick,
    idle: bool,
    wakeup: Nanos,
}

impl<T: Send + 'static> PullModel<T> {
    /// Builds the model for CPUs on `nodes` (groups of 8); every CPU starts active.
    #[allow(clippy::type_complexity)]
    pub fn new(
        nodes: &[NodeId],
        host: &mut dyn FnMut(Option<CpuId>) -> Box<dyn HostTimer>,
        waker: Arc<dyn Waker>,
    ) -> Result<(Arc<Self>, Vec<PullCpu<T>>), HierarchyError> {
        Self::with_config(HierarchyConfig::default(), nodes, host, waker)
    }

    /// As [`PullModel::new`] with a hierarchy configuration.
    #[allow(clippy::type_complexity)]
    pub fn with_config(
        config: HierarchyConfig,
        nodes: &[NodeId],
        host: &mut dyn FnMut(Option<CpuId>) -> Box<dyn HostTimer>,
        waker: Arc<dyn Waker>,
    ) -> Result<(Arc<Self>, Vec<PullCpu<T>>), HierarchyError> {
        let max_cpus = config.max_cpus;
        let hierarchy = Hierarchy::new(config, nodes)?;
        let bases: Vec<TimerBase<T>> = (0..nodes.len()).map(TimerBase::new).collect();
        let globals: Box<[OnceLock<Arc<GlobalQueue<T>>>]> =
            (0..max_cpus).map(|_| OnceLock::new()).collect();
        for b in &bases {
            let _ = globals[b.cpu()].set(Arc::clone(b.global()));
        }
        let shared = Arc::new(Self {
            hierarchy,
            globals,
            metrics: Metrics::default(),
            waker,
        });
        let cpus = bases
            .into_iter()
            .map(|base| {
                shared.hierarchy.activate(base.cpu());
                PullCpu {
                    tick: HostTick::new(host(Some(base.cpu()))),
                    base,
                    shared: Arc::clone(&shared),
                    idle: false,
                    wakeup: NEVER,
                }
            })
            .collect();
        Ok((shared, cpus))
    }

    /// Adds a vCPU on NUMA node `node` at run time (CPU hot-plug); it starts active, like a
    /// vCPU thread about to run. Safe while the other vCPUs run and go idle.
    pub fn add_cpu(
        self: &Arc<Self>,
        node: NodeId,
        host: Box<dyn HostTimer>,
    ) -> Result<PullCpu<T>, HierarchyError> {
        let cpu = self.hierarchy.add_cpu(node)?;
        let base = TimerBase::new(cpu);
        let _ = self.globals[cpu].set(Arc::clone(base.global()));
        self.hierarchy.activate(cpu);
        Ok(PullCpu {
            tick: HostTick::new(host),
            base,
            shared: Arc::clone(self),
            idle: false,
            wakeup: NEVER,
        })
    }

    /// The hierarchy, for inspection.
    pub fn hierarchy(&self) -> &Hierarchy {
        &self.hierarchy
    }

    fn kick(&self, cpu: Option<CpuId>) {
        if let Some(c) = cpu {
            self.metrics.wakeup();
            self.waker.wake(c);
        }
    }
}

impl<T> PullModel<T> {
    fn global(&self, cpu: CpuId) -> &GlobalQueue<T> {
        match self.globals.get(cpu).and_then(OnceLock::get) {
            Some(g) => g,
            None => panic!("CPU {cpu} has no timer base"),
        }
    }
}

impl<T: Send + 'static> TimerModel<T> for PullModel<T> {
    fn kind(&self) -> ModelKind {
        ModelKind::Pull
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    fn service(&self, _now: Nanos, _f: OnFire<'_, T>) -> Nanos {
        NEVER
    }
}

/// Expires other CPUs' global queues for the hierarchy, on the migrator's thread.
struct Remote<'a, T> {
    shared: &'a PullModel<T>,
    f: &'a mut dyn FnMut(Fired<T>) -> AfterFire,
}

impl<T> RemoteExpiry for Remote<'_, T> {
    fn expire_remote(&mut self, cpu: CpuId, now: Nanos) {
        let (fired, notify) = self.shared.global(cpu).expire(now, true, self.f);
        self.shared.metrics.remote(fired);
        if notify > 0 {
            self.shared.metrics.wakeup();
            self.shared.waker.wake(cpu);
        }
    }

    fn next_global(&mut self, cpu: CpuId) -> Nanos {
        self.shared.global(cpu).next_expiry()
    }
}

impl<T: Send + 'static> PullCpu<T> {
    /// The first global expiry this CPU reports when idle: only if before its first pinned.
    fn reported(&self) -> Nanos {
        let g = self.base.next_global();
        if g < self.base.next_pinned() {
            g
        } else {
            NEVER
        }
    }

    /// Re-reports an idle CPU's first global expiry (after arming or expiring while idle).
    fn update_idle(&mut self) {
        let upd = self
            .shared
            .hierarchy
            .deactivate(self.base.cpu(), self.reported());
        self.wakeup = upd.wakeup;
        self.shared.kick(upd.kick);
    }

    /// The base, for inspection.
    pub fn base(&self) -> &TimerBase<T> {
        &self.base
    }
}

impl<T: Send + 'static> CpuTimers<T> for PullCpu<T> {
    fn cpu(&self) -> CpuId {
        self.base.cpu()
    }

    fn arm(&mut self, kind: TimerKind, deadline: Nanos, payload: T) -> TimerHandle {
        let h = self.base.arm(kind, deadline, payload);
        if self.idle && kind == TimerKind::Global {
            self.update_idle();
        }
        h
    }

    fn cancel(&mut self, h: TimerHandle) -> Option<T> {
        let p = self.base.cancel(h);
        // A cancelled pinned timer may have been the wake-up covering a global one.
        if p.is_some() && self.idle && h.kind() == TimerKind::Pinned {
            self.update_idle();
        }
        p
    }

    fn rearm(&mut self, h: TimerHandle, deadline: Nanos) -> bool {
        let ok = self.base.rearm(h, deadline);
        if ok && self.idle {
            self.update_idle();
        }
        ok
    }

    fn run(&mut self, now: Nanos, f: OnFire<'_, T>) -> Nanos {
        let shared = Arc::clone(&self.shared);
        let cpu = self.base.cpu();
        shared.metrics.local(self.base.expire(now, f));
        if self.idle {
            self.update_idle();
            return self.idle_timeout();
        }
        if shared.hierarchy.requires_handle_remote(cpu, now) {
            shared.metrics.remote_run();
            let mut remote = Remote { shared: &shared, f };
            shared.hierarchy.handle_remote(cpu, now, &mut remote);
        }
        let deadline = self
            .base
            .next_expiry()
            .min(shared.hierarchy.remote_deadline(cpu));
        self.tick.ensure(deadline, now, &shared.metrics);
        deadline
    }

    fn idle(&mut self, _now: Nanos) -> Nanos {
        if !self.idle {
            self.idle = true;
            self.base.share_globals();
            self.update_idle();
        }
        self.idle_timeout()
    }

    fn idle_timeout(&self) -> Nanos {
        self.base.next_pinned().min(self.wakeup)
    }

    fn wake(&mut self, _now: Nanos) {
        if self.idle {
            self.idle = false;
            self.wakeup = NEVER;
            self.shared.hierarchy.activate(self.base.cpu());
            self.base.reclaim_globals();
        }
    }

    fn next_deadline(&self) -> Nanos {
        self.tick.armed
    }
}
