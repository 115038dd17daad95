//! Cloud Hypervisor's configuration forms, mapped onto lull's [`VmConfig`]: its command line
//! (lull invoked as `cloud-hypervisor`, or `lull ch ...`: [`cli`]) and the `VmConfig` JSON its
//! clients send to `vm.create` ([`json`]). Both go through the same rules per option
//! ([`options`]), so a flag and its JSON field are honoured, accepted or refused alike:
//!
//! ```text
//!  --disk path=a,readonly=on ─┐                        ┌─ honoured: lull's DiskConfig ...
//!                             ├─► [Opt] ─► options::* ─┼─ accepted, a note said with -v
//!  {"disks":[{"path":"a",...}]┘                        └─ refused: ChError naming the option
//! ```
//!
//! `vm.restore`'s body and `--restore` (Cloud Hypervisor's `RestoreConfig`) go the same way
//! ([`restore`]).
//!
//! Everything here is pure (no file is opened, no fd is looked at): the caller checks the
//! files, taps and fds as it does for lull's own configuration.

pub mod cli;
mod flags;
pub mod json;
mod launch;
pub mod options;
pub mod restore;

use super::{ConfigError, NetConfigError};

/// The Cloud Hypervisor version whose command line and API lull follows: `--version` says it,
/// as Cloud Hypervisor does (`cloud-hypervisor vX.Y.Z`), for drivers that check it.
pub const CH_VERSION: &str = "54.0.0";

/// A Cloud Hypervisor option lull cannot take.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ChError {
    /// An option (or value) lull cannot honour.
    #[error("lull cannot honour Cloud Hypervisor's {option}: {why}")]
    Refused {
        /// The option as given (`--disk vhost_user=on`, `disks[0].vhost_user=on`).
        option: String,
        /// Why, and what to do instead.
        why: &'static str,
    },
    /// A value that does not parse.
    #[error("{option}={value} is not valid: give {expected}")]
    BadValue {
        /// The option.
        option: String,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
    /// A required part is missing.
    #[error("{0} is missing")]
    Missing(&'static str),
    /// A flag that needs a value came last, or before another flag.
    #[error("{0} needs a value")]
    NoValue(String),
    /// A flag that takes one value was given twice.
    #[error("{0} was given more than once: give it once (Cloud Hypervisor takes one)")]
    Repeated(String),
    /// A path given empty (`--disk path=`).
    #[error("{0} is empty: give the file's path")]
    EmptyPath(String),
    /// A command line clap refuses for another reason (its first line).
    #[error("{0}: see `lull ch --help`")]
    Usage(String),
    /// A `--net` that lull's own net configuration refuses.
    #[error("--net: {0}")]
    Net(#[source] NetConfigError),
    /// A `--lull KEY=VALUE` that is not one of lull's flags or does not parse.
    #[error("--lull {0}: see `lull run --help` for lull's flags")]
    Lull(String),
    /// The JSON is not Cloud Hypervisor's `VmConfig`.
    #[error("The body is not Cloud Hypervisor's VmConfig: {0}")]
    Json(String),
    /// The mapped configuration breaks one of lull's rules.
    #[error(transparent)]
    Config(#[from] ConfigErrorEq),
}

/// A [`ConfigError`] inside a [`ChError`] (which compares by message, for tests).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigErrorEq(#[source] pub ConfigError);

impl PartialEq for ConfigErrorEq {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl From<ConfigError> for ChError {
    fn from(e: ConfigError) -> Self {
        Self::Config(ConfigErrorEq(e))
    }
}
