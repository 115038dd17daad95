//! A vCPU thread's side of wake placement: asks `idle::placement` before each block and after
//! each wake-up what to do with the thread's CPU affinity, does it (`sys::affinity`), and
//! counts, in either mode, the wake-ups that came on another host CPU than the block
//! (`wake_migrations`), the blocks bound to their CPU, the bound wake-ups that still moved
//! (none if the host honours the binding), the back-offs, and how late own-timer wake-ups
//! came, bound and not (what binding costs in wake-up latency, under the same load).

use std::sync::atomic::Ordering;

use timer::Nanos;

use crate::config::knobs::WakePlacementMode;
use crate::host::sys::affinity::{self, CpuSet};
use crate::idle::placement::{Placement, WakeOutcome, WakePlacement};
use crate::ratelimit::LogLimiter;
use crate::state::counters::VcpuCounters;

/// Failed affinity changes of vCPU threads (VM-wide log limiter).
static AFFINITY_FAILED: LogLimiter = LogLimiter::new();

/// One vCPU thread's wake placement.
#[derive(Debug)]
pub struct VcpuPlacement {
    mode: WakePlacementMode,
    decision: WakePlacement,
    /// The thread's own CPU set, read on the vCPU thread at attach.
    own: Option<CpuSet>,
    /// The host CPU the current block began on.
    blocked_on: Option<u32>,
}

impl VcpuPlacement {
    /// Placement in `mode`; nothing binds before [`Self::attach`] ran on the vCPU thread.
    pub fn new(mode: WakePlacementMode) -> Self {
        Self {
            mode,
            decision: WakePlacement::new(WakePlacementMode::Off, 1),
            own: None,
            blocked_on: None,
        }
    }

    /// On the vCPU thread, before its first run: reads the thread's own CPU set (which a
    /// release gives back) and starts deciding.
    pub fn attach(&mut self) {
        if self.mode == WakePlacementMode::Off {
            return;
        }
        match CpuSet::of_current_thread() {
            Ok(own) => {
                self.decision = WakePlacement::new(self.mode, own.count());
                self.own = Some(own);
            }
            Err(e) => tracing::warn!("wake placement off for a vCPU: its CPU set: {e}"),
        }
    }

    /// Before a block at `now` expecting its own wake-up at `wake_at`.
    pub fn before_block(&mut self, now: Nanos, wake_at: Option<Nanos>, counters: &VcpuCounters) {
        let cpu = affinity::current_cpu();
        self.blocked_on = cpu;
        let placement = self.decision.before_block(now, wake_at, cpu);
        if matches!(placement, Placement::Bind(_)) {
            counters.placement.binds.fetch_add(1, Ordering::Relaxed);
        }
        self.apply(placement);
    }

    /// After the wake-up at `now` from a block that expected its own wake-up at `wake_at`.
    pub fn after_wake(&mut self, now: Nanos, wake_at: Option<Nanos>, counters: &VcpuCounters) {
        let bound = self.decision.is_bound();
        let moved = match (self.blocked_on.take(), affinity::current_cpu()) {
            (Some(before), Some(after)) => before != after,
            _ => false,
        };
        if moved {
            counters.wake_migrations.fetch_add(1, Ordering::Relaxed);
            if bound {
                counters
                    .placement
                    .bound_migrations
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        let outcome = match wake_at {
            Some(w) if now >= w => WakeOutcome::OnTime { late_ns: now - w },
            _ => WakeOutcome::Early,
        };
        if let WakeOutcome::OnTime { late_ns } = outcome {
            let p = &counters.placement;
            let (wakes, late) = if bound {
                (&p.bound_wakes, &p.bound_late_ns)
            } else {
                (&p.free_wakes, &p.free_late_ns)
            };
            wakes.fetch_add(1, Ordering::Relaxed);
            late.fetch_add(late_ns, Ordering::Relaxed);
        }
        let (placement, gave_up) = self.decision.woke(now, outcome);
        if gave_up {
            counters.placement.backoffs.fetch_add(1, Ordering::Relaxed);
        }
        self.apply(placement);
    }

    fn apply(&self, placement: Placement) {
        let result = match (placement, &self.own) {
            (Placement::Bind(cpu), Some(_)) => affinity::bind_current_thread(cpu),
            (Placement::Release, Some(own)) => own.apply_to_current_thread(),
            _ => Ok(()),
        };
        if let Err(e) = result {
            if let Some(n) = AFFINITY_FAILED.hit() {
                tracing::warn!("wake placement: {placement:?} failed: {e} ({n} so far)");
            }
        }
    }
}
