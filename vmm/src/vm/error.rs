//! Why a VM could not be built or run: the one error of the `vm` layer, wrapping its steps'.

use std::path::PathBuf;

use ::devices::mmio::MmioBusError;
use ::devices::pio::PioBusError;

use super::disks::DiskOpenError;
use super::guest::GuestError;
use super::input_error::InputError;
use super::kvm::KvmError;
use crate::irqchip::IrqChipError;
use crate::setup::boot::BootError;
use crate::vcpu::VcpuError;

/// Why a VM could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// The guest (kit, kernel, initramfs) cannot be used.
    #[error(transparent)]
    Guest(#[from] GuestError),
    /// The guest could not be loaded into memory.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// An input or output path cannot be used (an output is an input, a kernel is a
    /// directory).
    #[error(transparent)]
    Input(#[from] InputError),
    /// KVM refused.
    #[error(transparent)]
    Kvm(#[from] KvmError),
    /// A vCPU could not be set up or started.
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    /// The interrupt controller could not be built.
    #[error(transparent)]
    IrqChip(#[from] IrqChipError),
    /// An output file cannot be written.
    #[error("Cannot open serial output file {path}: {source}")]
    SerialFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No pseudo-terminal could be opened for `--serial pty`.
    #[error("Cannot open a pseudo-terminal for the serial console: {0}")]
    SerialPty(#[source] std::io::Error),
    /// The metrics file cannot be written.
    #[error("Cannot write the metrics file {path}: {source}")]
    MetricsFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A device could not be placed on the port bus (a lull bug).
    #[error("Device layout: {0}")]
    Bus(#[from] PioBusError),
    /// A device could not be placed on the MMIO bus (a lull bug).
    #[error("Device layout: {0}")]
    MmioBus(#[from] MmioBusError),
    /// A `--disk` image cannot be used.
    #[error(transparent)]
    Disk(#[from] DiskOpenError),
    /// A `--net` tap cannot be used.
    #[error(transparent)]
    Net(#[from] crate::host::sys::tap::TapError),
    /// A host resource (eventfd, signal handler, event loop) could not be created.
    #[error("Cannot create {what}: {source}")]
    Host {
        /// What.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The event loop failed to start.
    #[error("Cannot start the event loop: {0:?}")]
    EventLoop(event_manager::Error),
    /// A seccomp filter could not be built or installed.
    #[error(transparent)]
    Seccomp(#[from] crate::host::seccomp::SeccompError),
    /// A snapshot cannot be read or is refused.
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    /// A snapshot this lull cannot restore, or a state KVM would not take back.
    #[error("Cannot restore the snapshot: {0}")]
    Restore(String),
}
