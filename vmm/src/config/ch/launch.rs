//! What Cloud Hypervisor's command line asks for ([`ChCommand`], [`ChLaunch`]): the result of
//! `cli::parse`, which the flags of `flags` fill in (a file of its own, so that neither of the
//! two imports the other).

use std::path::PathBuf;

use super::options;
use super::restore::ChRestore;
use crate::config::VmConfig;

/// Where the API socket comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiSocketArg {
    /// Created at this path.
    Path(PathBuf),
    /// An inherited listening socket.
    Fd(i32),
}

/// Where `--event-monitor` writes Cloud Hypervisor's event records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventMonitorArg {
    /// A file or FIFO opened for writing at this path (`path=P`).
    Path(PathBuf),
    /// An inherited descriptor open for writing (`fd=N`).
    Fd(i32),
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ChCommand {
    /// `--version`/`-V`: say the version.
    Version,
    /// `--help`/`-h`: the help to print.
    Help(String),
    /// Run a VM, or serve the API.
    Launch(Box<ChLaunch>),
}

/// A VM to run (or to create, with the API socket).
#[derive(Debug, Clone, PartialEq)]
pub struct ChLaunch {
    /// The VM (Cloud Hypervisor's defaults: 1 vCPU, 512 MiB, the serial port to nowhere).
    pub config: VmConfig,
    /// A kernel was given: the VM boots at once (with the API socket too, as Cloud
    /// Hypervisor does).
    pub boots: bool,
    /// `--api-socket`.
    pub api_socket: Option<ApiSocketArg>,
    /// `--event-monitor`.
    pub event_monitor: Option<EventMonitorArg>,
    /// `--log-file`.
    pub log_file: Option<PathBuf>,
    /// `-v` count.
    pub verbose: u8,
    /// Tap fds given with `--net fd=N` (and their MACs), in order after the named taps.
    pub net_fds: Vec<options::ChNet>,
    /// `--restore`: the snapshot to restore instead of a VM to boot (no VM flag with it).
    pub restore: Option<ChRestore>,
    /// What was accepted without effect, said with `-v`.
    pub notes: Vec<String>,
    /// `--lull` values: applied to `config`, and to each VM `vm.create` makes from Cloud
    /// Hypervisor's `VmConfig` (as libvirt's driver creates every VM).
    pub lull_knobs: Vec<String>,
}
