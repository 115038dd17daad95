//! Why a VM configuration cannot be used.

use std::path::PathBuf;

use super::limits::{MAX_CPUS, MAX_DISKS, MAX_MEMORY, MAX_VIRTIO_DEVICES, MIN_MEMORY};
use crate::size::ByteSize;

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file cannot be read.
    #[error("Cannot read config file {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The config file is a device, FIFO or directory: lull reads regular files only.
    #[error(
        "Config file {0} is not a regular file: give a JSON file (at most 1 MiB), not a \
         device, FIFO or directory"
    )]
    NotAFile(PathBuf),
    /// The config file exceeds [`super::limits::MAX_CONFIG_BYTES`].
    #[error("Config file {0} is larger than 1 MiB: a VM configuration is a small JSON object")]
    FileTooLarge(PathBuf),
    /// The config file is not valid JSON for this schema.
    #[error("Config file {path} is not valid: {source} (see `lull run --help` for the fields)")]
    ParseFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// `--cpus` out of range.
    #[error("--cpus {0} is out of range: use 1 to {MAX_CPUS}")]
    Cpus(u32),
    /// `--memory` out of range.
    #[error("--memory {0} is out of range: use {MIN_MEMORY} to {MAX_MEMORY}")]
    Memory(ByteSize),
    /// `--memory` not a whole number of 4 KiB pages.
    #[error(
        "--memory {0} is not a multiple of 4 KiB: guest memory is mapped in whole 4 KiB pages; \
         give a multiple of 4K (e.g. 32M, 256M, 1G)"
    )]
    MemoryAlignment(ByteSize),
    /// A `--cpu-quota` that can never park a vCPU.
    #[error(
        "--cpu-quota quota={quota_ms}ms per period={period_ms}ms is at least what {cpus} vCPU(s) \
         can run in a period ({cpus} x period), so it would never apply: give a quota below \
         {cpus} x period, or no --cpu-quota"
    )]
    QuotaNeverApplies {
        /// The quota, ms.
        quota_ms: u64,
        /// The period, ms.
        period_ms: u64,
        /// vCPUs.
        cpus: u32,
    },
    /// More disks than lull has MMIO windows and interrupt lines for.
    #[error("{0} disks given; lull takes at most {MAX_DISKS}")]
    TooManyDisks(usize),
    /// More disks and network devices together than lull has MMIO windows and lines for.
    #[error(
        "{disks} disks and {nets} network devices given; lull takes at most \
         {MAX_VIRTIO_DEVICES} of them together"
    )]
    TooManyDevices {
        /// `--disk`s.
        disks: usize,
        /// `--net`s.
        nets: usize,
    },
    /// Two `--net`s on one tap.
    #[error("Tap {0} is given to two --net devices; give each its own tap")]
    DuplicateTap(String),
    /// A flag clap parsed could not be applied over the config file (clap's reason).
    #[error("Cannot apply the command line's flags over the config file: {0}")]
    Flags(clap::Error),
    /// An idle-manager knob was given without the user irqchip.
    #[error("{0} needs --irqchip user (with --irqchip kernel, KVM decides when vCPUs run)")]
    NeedsUserIrqchip(&'static str),
    /// VM flags given with `--restore`, whose VM is the snapshot's (`--metrics`, `--serial`
    /// and `--net` aside).
    #[error(
        "{0} cannot be given with --restore: the restored VM is the snapshot's, as it was \
         saved; of the VM's flags only this run's outputs, --metrics (its report) and \
         --serial (its console), and --net tap=NAME (a tap of its own for each of the \
         snapshot's nets) go with --restore"
    )]
    FlagsWithRestore(String),
    /// `--net` with `--restore` that cannot replace the snapshot's taps.
    #[error(transparent)]
    RestoreNets(#[from] super::restore_nets::RestoreNetsError),
}
