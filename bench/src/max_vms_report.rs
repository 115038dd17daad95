//! The `--max-vms` JSON document (schema `lull-bench-max-vms/1`): per mode, the steps of the
//! search (max_vms.rs) and where it stopped.

use serde::{Deserialize, Serialize};

use super::host::HostInfo;
use super::power::{PowerWindow, Reading};
use super::report::{DensityParams, DensityRow, SkippedMode};
use super::slo::{Slo, Verdict};

/// Schema name of the `--max-vms` JSON.
pub const MAX_VMS_SCHEMA: &str = "lull-bench-max-vms/1";

/// Why the search stopped where it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "bound", rename_all = "snake_case")]
pub enum Stop {
    /// Every count up to the cap met the SLO.
    Cap {
        /// The cap.
        cap: u32,
    },
    /// One more VM would not fit in the host's memory.
    Memory {
        /// The most VMs that fit.
        fits: u32,
        /// What one VM held (its PSS as the last step's window opened; guessed before the
        /// first step), bytes.
        per_vm_bytes: f64,
        /// `MemAvailable` with no VM, bytes.
        available_bytes: u64,
    },
    /// One more VM would need more threads than the host has left.
    Threads {
        /// The most VMs whose threads fit.
        fits: u32,
        /// Threads per VM (lull's, measured; guessed before the first step).
        per_vm: f64,
        /// The threads the host could still start with no VM.
        available: u64,
    },
    /// The smallest count that failed, and its failed bounds.
    Slo {
        /// That count.
        vms: u32,
        /// The bounds it failed.
        failed: Vec<String>,
    },
}

/// One measured count of a mode's search.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MaxVmsStep {
    /// VMs run.
    pub vms: u32,
    /// Every bound met.
    pub met: bool,
    /// Each bound's verdict.
    pub verdicts: Vec<Verdict>,
    /// The density row of the step's window.
    pub row: DensityRow,
}

/// One mode's search.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MaxVmsMode {
    /// The mode.
    pub mode: String,
    /// The steps in the order run.
    pub steps: Vec<MaxVmsStep>,
    /// The most VMs within the SLO (0: not even one).
    pub max_vms: u32,
    /// `max_vms` x vCPUs per VM.
    pub max_vcpus: u32,
    /// What stopped the search.
    pub stopped_by: Stop,
    /// `max_vms / kernel's max_vms` (`null` for kernel, without a kernel row, or if kernel
    /// held none).
    pub ratio_to_kernel: Option<f64>,
}

/// The `--max-vms` JSON document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MaxVmsReport {
    /// Always [`MAX_VMS_SCHEMA`].
    pub schema: String,
    /// The host.
    pub host: HostInfo,
    /// The request (`vms` unused).
    pub params: DensityParams,
    /// The search's cap.
    pub cap: u32,
    /// The bounds.
    pub slo: Slo,
    /// `MemAvailable` before the first run, bytes (`null` if unreadable).
    pub mem_available_bytes: Option<u64>,
    /// The threads the host could still start before the first run (`null` if unknown).
    #[serde(default)]
    pub threads_available: Option<u64>,
    /// The lateness p99 of one VM of the first mode searched, ns: what a relative lateness
    /// bound (`lateness_vs_one_vm`) multiplies.
    #[serde(default)]
    pub lateness_reference_p99_ns: Option<u64>,
    /// The host with no VM (see the density report).
    pub power_baseline: Reading<PowerWindow>,
    /// One search per mode, in run order.
    pub modes: Vec<MaxVmsMode>,
    /// Modes left out, with why.
    pub skipped: Vec<SkippedMode>,
}
