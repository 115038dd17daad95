//! `pull`: global timers of idle CPUs are expired by a running migrator (see `Hierarchy`).
//!
//! An idle CPU sleeps until its first pinned timer or the wake-up duty the hierarchy gave it
//! (its [`Sleeper`]). Whenever the hierarchy moves another CPU's duty (an activation takes it
//! over, an idle CPU claims it), the CPU that moved it re-arms that sleeper's host wake-up
//! on its own thread: a blocked vCPU is woken only for its own timers or a duty that is due.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::{CpuTimers, HostTick, ModelKind, OnFire, Sleeper, TimerModel, Waker};
use crate::base::{AfterFire, CpuId, Fired, GlobalQueue, TimerBase, TimerHandle, TimerKind};
use crate::clock::{Nanos, NEVER};
use crate::hierarchy::{Hierarchy, HierarchyConfig, HierarchyError, NodeId, RemoteExpiry};
use crate::host::HostTimer;
use crate::metrics::{Metrics, TimerMetrics};
use crate::slack::tick_deadline;

/// The shared part of the pull model: the hierarchy and every CPU's global queue.
pub struct PullModel<T> {
    hierarchy: Hierarchy,
    globals: Box<[OnceLock<Arc<GlobalQueue<T>>>]>,
    sleepers: Box<[OnceLock<Sleeper>]>,
    metrics: Metrics,
    waker: Arc<dyn Waker>,
    /// Global timers' slack (see [`crate::slack`]): a setting written before the CPUs run,
    /// not state of the lock-free protocol, so std's atomic even under loom.
    global_slack: AtomicU64,
}

/// One CPU of the pull model.
pub struct PullCpu<T> {
    base: TimerBase<T>,
    shared: Arc<PullModel<T>>,
    tick: HostTick,
    idle: bool,
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
        let sleepers: Box<[OnceLock<Sleeper>]> = (0..max_cpus).map(|_| OnceLock::new()).collect();
        for b in &bases {
            let _ = globals[b.cpu()].set(Arc::clone(b.global()));
            let _ = sleepers[b.cpu()].set(Sleeper::new());
        }
        let shared = Arc::new(Self {
            hierarchy,
            globals,
            sleepers,
            metrics: Metrics::default(),
            waker,
            global_slack: AtomicU64::new(0),
        });
        let cpus = bases
            .into_iter()
            .map(|base| {
                let released = shared.hierarchy.activate(base.cpu());
                shared.retarget(released);
                PullCpu {
                    tick: HostTick::new(host(Some(base.cpu()))),
                    base,
                    shared: Arc::clone(&shared),
                    idle: false,
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
        let _ = self.sleepers[cpu].set(Sleeper::new());
        let released = self.hierarchy.activate(cpu);
        self.retarget(released);
        Ok(PullCpu {
            tick: HostTick::new(host),
            base,
            shared: Arc::clone(self),
            idle: false,
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

    fn sleeper(&self, cpu: CpuId) -> &Sleeper {
        match self.sleepers.get(cpu).and_then(OnceLock::get) {
            Some(s) => s,
            None => panic!("CPU {cpu} has no sleeper"),
        }
    }

    /// The hierarchy moved `cpu`'s wake-up duty: re-arm its host wake-up (not waking it).
    fn retarget(&self, cpu: Option<CpuId>) {
        if let Some(c) = cpu {
            self.sleeper(c)
                .retarget(&|| self.hierarchy.wakeup(c), &self.metrics);
        }
    }

    /// The deadline `cpu`'s host wake-up is armed for while it sleeps (`NEVER` if none or
    /// awake), for inspection and simulated VMMs.
    pub fn armed_wakeup(&self, cpu: CpuId) -> Nanos {
        self.sleeper(cpu).armed()
    }
}

impl<T: Send + 'static> TimerModel<T> for PullModel<T> {
    fn kind(&self) -> ModelKind {
        ModelKind::Pull
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

    fn set_global_slack(&self, slack: Nanos) {
        self.global_slack.store(slack, Ordering::Relaxed);
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
    /// Expires what is due at `now`: its own timers, and remote ones while it is an active
    /// migrator; returns the deadline its host tick must fire by (the timeout while idle;
    /// running, its global timers' and duty's at the end of their slack range).
    fn expire_due(&mut self, now: Nanos, f: OnFire<'_, T>) -> Nanos {
        let shared = Arc::clone(&self.shared);
        let cpu = self.base.cpu();
        shared.metrics.local(self.base.expire(now, f));
        if self.idle {
            self.update_idle(Some(now));
            return self.idle_timeout();
        }
        if shared.hierarchy.requires_handle_remote(cpu, now) {
            shared.metrics.remote_run();
            let mut remote = Remote { shared: &shared, f };
            shared.hierarchy.handle_remote(cpu, now, &mut remote);
        }
        tick_deadline(
            self.base.next_pinned(),
            self.base.next_global(),
            shared.hierarchy.remote_deadline(cpu),
            shared.global_slack.load(Ordering::Relaxed),
        )
    }

    /// The first global expiry this CPU reports when idle: only if before its first pinned.
    fn reported(&self) -> Nanos {
        let g = self.base.next_global();
        if g < self.base.next_pinned() {
            g
        } else {
            NEVER
        }
    }

    /// Reports an idle CPU's first global expiry (going idle, or after arming, cancelling or
    /// expiring while idle), then (re-)arms its host wake-up for its first pinned timer or
    /// its wake-up duty (`now`, if known, may spare the syscall, see [`Sleeper::sleep`]).
    fn update_idle(&mut self, now: Option<Nanos>) {
        let shared = &*self.shared;
        let cpu = self.base.cpu();
        let upd = shared.hierarchy.deactivate(cpu, self.reported());
        shared.kick(upd.kick);
        shared.retarget(upd.retarget);
        shared.sleeper(cpu).sleep(
            self.base.next_pinned(),
            &|| shared.hierarchy.wakeup(cpu),
            now,
            &shared.metrics,
        );
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
        if self.idle {
            self.update_idle(None);
        }
        h
    }

    fn cancel(&mut self, h: TimerHandle) -> Option<T> {
        let p = self.base.cancel(h);
        // Idle: the reported event and the wake-up may both move (later: nobody must wake
        // for a timer that is gone).
        if p.is_some() && self.idle {
            self.update_idle(None);
        }
        p
    }

    fn rearm(&mut self, h: TimerHandle, deadline: Nanos) -> bool {
        let ok = self.base.rearm(h, deadline);
        if ok && self.idle {
            self.update_idle(None);
        }
        ok
    }

    fn run(&mut self, now: Nanos, f: OnFire<'_, T>) -> Nanos {
        let deadline = self.expire_due(now, f);
        if !self.idle {
            self.tick.ensure(deadline, now, &self.shared.metrics);
        }
        deadline
    }

    fn run_halted(&mut self, now: Nanos, f: OnFire<'_, T>) -> Nanos {
        self.expire_due(now, f)
    }

    fn run_exact(&mut self, now: Nanos, f: OnFire<'_, T>) -> Nanos {
        let deadline = self.expire_due(now, f);
        if !self.idle {
            self.tick.track(deadline, Some(now), &self.shared.metrics);
        }
        deadline
    }

    fn idle(&mut self, now: Nanos) -> Nanos {
        if !self.idle {
            self.idle = true;
            self.base.share_globals();
            self.update_idle(Some(now));
            if self.shared.sleeper(self.base.cpu()).has_timer() {
                // The host wake-up (own pinned timers, duty), armed above, takes over from
                // the tick: released after it (see `HostTick::release`).
                self.tick.release(now, &self.shared.metrics);
            }
        }
        self.idle_timeout()
    }

    fn idle_timeout(&self) -> Nanos {
        let cpu = self.base.cpu();
        self.base
            .next_pinned()
            .min(self.shared.hierarchy.wakeup(cpu))
    }

    fn wake(&mut self, now: Nanos) {
        if self.idle {
            self.idle = false;
            let shared = &*self.shared;
            let cpu = self.base.cpu();
            let armed = shared.sleeper(cpu).wake();
            let released = shared.hierarchy.activate(cpu);
            shared.retarget(released);
            self.base.reclaim_globals();
            if armed <= now {
                // Woken by its host wake-up: for an own timer, or for a remote expiry it
                // now runs as migrator (the duty it held), else for nothing.
                let busy =
                    self.base.next_expiry() <= now || shared.hierarchy.remote_deadline(cpu) <= now;
                shared.metrics.timer_wakeup(busy);
            }
        }
    }

    fn set_wake_timer(&mut self, timer: Box<dyn HostTimer>) {
        self.shared.sleeper(self.base.cpu()).attach(timer);
    }

    fn next_deadline(&self) -> Nanos {
        self.tick.armed
    }
}
