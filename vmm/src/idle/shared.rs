//! The idle manager's VM-wide state: the modes and the VM-wide parts (injection, quota,
//! global-timer load) every vCPU thread of the VM shares.

use super::global_load::GlobalLoad;
use super::inject::IdleInjector;
use super::quota::CpuQuota;
use crate::config::knobs::{
    CpuQuotaConfig, GlobalTimersConfig, HaltPollMode, IdleInjectConfig, TimerAdvanceMode,
    TimerSlack, WakePlacementMode,
};

/// What a VM's idle state is built from: its idle knobs.
#[derive(Debug, Clone, Copy)]
pub struct IdleKnobs {
    /// Halt polling.
    pub halt_poll: HaltPollMode,
    /// Timer advance.
    pub timer_advance: TimerAdvanceMode,
    /// Timer slack of halted vCPUs' wake-ups.
    pub timer_slack: TimerSlack,
    /// Wake placement.
    pub wake_placement: WakePlacementMode,
    /// Synchronized idle injection.
    pub idle_inject: Option<IdleInjectConfig>,
    /// Per-VM CPU quota.
    pub cpu_quota: Option<CpuQuotaConfig>,
    /// Synthetic global-timer load.
    pub global_timers: Option<GlobalTimersConfig>,
}

/// The idle manager's VM-wide state, shared by every vCPU thread.
#[derive(Debug)]
pub struct IdleShared {
    /// Halt-polling mode of every vCPU.
    pub halt_poll: HaltPollMode,
    /// Timer advance of every vCPU.
    pub timer_advance: TimerAdvanceMode,
    /// Timer slack of every vCPU's halted wait.
    pub timer_slack: TimerSlack,
    /// Idle injection, if enabled.
    pub inject: Option<IdleInjector>,
    /// CPU quota, if enabled.
    pub quota: Option<CpuQuota>,
    /// Global-timer load, if enabled.
    pub global: Option<GlobalLoad>,
    /// Wake placement of every vCPU.
    pub wake_placement: WakePlacementMode,
}

impl IdleShared {
    /// The idle state of a VM of `cpus` vCPUs set up by `knobs`; the quota's periods are
    /// placed from CLOCK_MONOTONIC `epoch` (the VM clock's zero).
    pub fn new(knobs: IdleKnobs, cpus: usize, epoch: u64) -> Self {
        Self {
            halt_poll: knobs.halt_poll,
            timer_advance: knobs.timer_advance,
            timer_slack: knobs.timer_slack,
            inject: knobs.idle_inject.map(|c| IdleInjector::new(c, cpus)),
            quota: knobs.cpu_quota.map(|q| CpuQuota::new(q, epoch)),
            global: knobs.global_timers.map(GlobalLoad::new),
            wake_placement: knobs.wake_placement,
        }
    }
}
