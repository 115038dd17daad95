//! `--seccomp`: which filter lull's threads run under (the filters themselves are
//! `host::seccomp`).

use serde::{Deserialize, Serialize};

/// What `--seccomp` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum SeccompMode {
    /// No filter.
    Off,
    /// Allow-list; other syscalls are allowed and logged by the kernel.
    Log,
    /// Allow-list; any other syscall kills the process.
    #[default]
    On,
}

impl SeccompMode {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Log => "log",
            Self::On => "on",
        }
    }
}
