//! How `lull bench` fails: its exit statuses and its errors.

use std::path::PathBuf;

/// `lull bench` exit status: everything ran and every VM passed.
pub const EXIT_OK: u8 = 0;
/// `lull bench` exit status: bad input (guest, kit, lull binary, output path).
pub const EXIT_BAD_INPUT: u8 = 4;
/// `lull bench` exit status: it ran, but some VM failed (its row lists why).
pub const EXIT_VM_FAILED: u8 = 8;
/// `lull bench` exit status: stopped by SIGINT or SIGTERM (its VMs stopped first, no result).
pub const EXIT_STOPPED: u8 = 12;

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A file could not be written or read.
    #[error("Cannot use {0}: {1}; check that the directory exists and is writable")]
    Io(PathBuf, #[source] std::io::Error),
    /// A VMM process could not be started.
    #[error("Cannot start {0}: {1}; check that it is installed (or pass --lull / --qemu)")]
    Spawn(String, #[source] std::io::Error),
    /// The guest ELF is missing.
    #[error("Guest {0} not found: build the kit with `make guests`, or pass --guest PATH")]
    NoGuest(PathBuf),
    /// The kit's Linux guest is missing.
    #[error(transparent)]
    Kit(kit::KitError),
    /// lull cannot find its own binary.
    #[error("Cannot find the lull binary to launch VMs ({0}); pass --lull PATH")]
    NoLull(#[source] std::io::Error),
    /// The JSON report could not be encoded or decoded.
    #[error("Cannot encode or decode the JSON report: {0}; check that it is a lull bench JSON")]
    Json(#[from] serde_json::Error),
    /// The SVG plot could not be drawn.
    #[error(transparent)]
    Plot(#[from] PlotError),
    /// A quota period too short to halve in milliseconds.
    #[error("--period {0:?} is too short: write at least 2ms (the quota is half of it, in ms)")]
    Period(std::time::Duration),
    /// Flags that do not go together.
    #[error("{0}")]
    Flags(String),
    /// Nothing to run.
    #[error("No mode can run here: {0}")]
    NoModes(String),
    /// The VM whose snapshot a row's clones restore could not be booted or snapshotted.
    #[error("Cannot snapshot the {0} VM to clone: {1}")]
    Snapshot(String, String),
    /// `--timer-slack` was given to a lull binary without it.
    #[error(
        "--timer-slack was given but {0} has no --timer-slack: build a newer lull \
         (cargo build -p lull) or pass --lull PATH"
    )]
    NoTimerSlack(PathBuf),
}

/// The plot could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("Cannot draw the density plot: {0}; report this as a bug with the --json of the run")]
pub struct PlotError(pub(crate) String);
