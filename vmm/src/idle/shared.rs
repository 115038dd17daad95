//! The idle manager's VM-wide state: the modes and the VM-wide parts (injection, quota,
//! global-timer load) every vCPU thread of the VM shares.

use super::global_load::GlobalLoad;
use super::inject::IdleInjector;
use super::quota::CpuQuota;
use crate::config::knobs::{HaltPollMode, TimerAdvanceMode, TimerSlack, WakePlacementMode};

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
