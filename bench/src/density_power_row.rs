//! The power figures of one density row, as the report stores them, and their columns in
//! the density table (`density_power` measures them).

use serde::{Deserialize, Serialize};

use super::power::cpuidle::StateSummary;
use super::power::{PowerWindow, Reading};

/// The power figures of one density row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DensityPower {
    /// Everything measured over the part of the row's window between the first and the last
    /// power sample inside it.
    pub window: Reading<PowerWindow>,
    /// RAPL package power above the baseline per VM, W.
    pub watts_per_vm: Reading<f64>,
    /// RAPL package power above the baseline per vCPU, W.
    pub watts_per_vcpu: Reading<f64>,
    /// RAPL package energy above the baseline per VM over the window, J.
    pub joules_per_vm: Reading<f64>,
    /// RAPL package energy above the baseline per vCPU over the window, J.
    pub joules_per_vcpu: Reading<f64>,
    /// The external meter's power above its baseline per VM, W.
    pub meter_watts_per_vm: Reading<f64>,
    /// Host CPU idle exits per second above the baseline, per vCPU.
    pub idle_exits_per_vcpu_s: Reading<f64>,
    /// Per host idle state: entries per second and residency share, all host CPUs.
    pub residency: Reading<Vec<StateSummary>>,
    /// Host wake-ups per second above the baseline, per vCPU: the host CPUs' idle exits
    /// (cpuidle) where the host has idle states, else its local timer, rescheduling and
    /// function-call interrupts (LOC + RES + CAL), a proxy: `host_wakeups_source` says which.
    #[serde(default = "Reading::not_recorded")]
    pub host_wakeups_per_vcpu_s: Reading<f64>,
    /// What [`Self::host_wakeups_per_vcpu_s`] and [`Self::host_wakeups_per_timer_event`]
    /// count: `cpuidle idle exits`, or `LOC+RES+CAL interrupts above the baseline`.
    #[serde(default)]
    pub host_wakeups_source: Option<String>,
    /// Host CPU idle exits in the window per guest timer event (the guests' events per
    /// second of their run, all vCPUs); without cpuidle states, the LOC + RES + CAL
    /// interrupts above the baseline per guest timer event.
    pub host_wakeups_per_timer_event: Reading<f64>,
    /// Local timer interrupts (`LOC`) per second, all host CPUs.
    pub local_timer_irqs_per_s: Reading<f64>,
    /// Rescheduling interrupts (`RES`) per second, all host CPUs.
    pub resched_irqs_per_s: Reading<f64>,
    /// Context switches (voluntary + nonvoluntary) of every VMM thread per second.
    pub vmm_context_switches_per_s: Reading<f64>,
}

/// `r`'s value with `prec` decimals, or `-` if it has none.
pub fn opt(r: Option<&Reading<f64>>, prec: usize) -> String {
    r.and_then(|r| r.value)
        .map_or_else(|| "-".into(), |v| format!("{v:.prec$}"))
}

/// The power columns of the density table's header.
pub fn header_columns() -> String {
    format!(
        "{:>10}{:>9}{:>8}{:>8}",
        "idlx/v/s", "hwk/v/s", "W/VM", "hwk/tev"
    )
}

/// The power columns of a row whose figures are `p` (`-` where a figure is missing;
/// `density_power::notes` says why).
pub fn columns(p: Option<&DensityPower>) -> String {
    format!(
        "{:>10}{:>9}{:>8}{:>8}",
        opt(p.map(|p| &p.idle_exits_per_vcpu_s), 1),
        opt(p.map(|p| &p.host_wakeups_per_vcpu_s), 1),
        opt(p.map(|p| &p.watts_per_vm), 2),
        opt(p.map(|p| &p.host_wakeups_per_timer_event), 2)
    )
}
