//! One `--disk`: a raw image file behind a virtio-blk device,
//! `path=FILE[,readonly=on|off][,bandwidth=BYTES][,ops=N][,burst=BYTES][,refill=DURATION]`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use devices::rate_limiter::{RateLimit, RateLimitError};

/// One `--disk`: a raw image file behind a virtio-blk device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    /// The image file (its size a non-zero multiple of 512 bytes).
    pub path: PathBuf,
    /// The guest may not write (the device offers VIRTIO_BLK_F_RO, writes fail).
    pub readonly: bool,
    /// Rate limit of the device's requests (`bandwidth=`, `ops=`, `burst=`, `refill=`).
    pub rate: RateLimit,
}

/// A `--disk` value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiskConfigError {
    /// No `path=`.
    #[error("'{0}' is not a disk: use path=FILE[,readonly=on|off][,bandwidth=BYTES][,ops=N]")]
    NoPath(String),
    /// An option lull does not know.
    #[error(
        "Unknown --disk option '{0}': the options are path=FILE, readonly=on|off, \
         bandwidth=BYTES (a second), ops=N (a second), burst=BYTES and refill=DURATION"
    )]
    UnknownOption(String),
    /// A rate option with a bad value.
    #[error("--disk: {0}")]
    Rate(#[from] RateLimitError),
    /// `readonly=` with a value other than on or off.
    #[error("--disk readonly={0} is neither on nor off")]
    BadReadonly(String),
}

impl FromStr for DiskConfig {
    type Err = DiskConfigError;

    /// `path=FILE[,readonly=on|off][,bandwidth=BYTES][,ops=N][,burst=BYTES][,refill=DURATION]`;
    /// the options may come in any order.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut path = None;
        let mut readonly = false;
        let mut rate = RateLimit::default();
        for option in s.split(',') {
            let (key, value) = option.split_once('=').unwrap_or((option, ""));
            if rate.apply_option(key, value)? {
                continue;
            }
            if let Some(p) = option.strip_prefix("path=").filter(|p| !p.is_empty()) {
                path = Some(PathBuf::from(p));
            } else if let Some(v) = option.strip_prefix("readonly=") {
                readonly = match v {
                    "on" => true,
                    "off" => false,
                    _ => return Err(DiskConfigError::BadReadonly(v.to_string())),
                };
            } else if !option.starts_with("path=") {
                return Err(DiskConfigError::UnknownOption(option.to_string()));
            }
        }
        match path {
            Some(path) => Ok(Self {
                path,
                readonly,
                rate,
            }),
            None => Err(DiskConfigError::NoPath(s.to_string())),
        }
    }
}

impl fmt::Display for DiskConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "path={}", self.path.display())?;
        if self.readonly {
            f.write_str(",readonly=on")?;
        }
        write!(f, "{}", self.rate)
    }
}

crate::string_serde!(DiskConfig);
