//! `--serial`: where the guest's serial console goes, `stdio`, `off`, `file=PATH` or `pty`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Where the guest's serial console goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SerialMode {
    /// lull's standard input and output.
    Stdio,
    /// Nowhere (output dropped, no input).
    Off,
    /// Appended to a file (no input).
    File(PathBuf),
    /// A new pseudo-terminal, output and input (its path in the log and in `vm.info`).
    Pty,
}

/// A `--serial` value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("'{0}' is not a serial mode: use stdio, off, file=PATH or pty")]
pub struct SerialModeError(String);

impl FromStr for SerialMode {
    type Err = SerialModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stdio" => Ok(Self::Stdio),
            "off" => Ok(Self::Off),
            "pty" => Ok(Self::Pty),
            _ => match s.strip_prefix("file=") {
                Some(path) if !path.is_empty() => Ok(Self::File(PathBuf::from(path))),
                _ => Err(SerialModeError(s.to_string())),
            },
        }
    }
}

impl fmt::Display for SerialMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stdio => f.write_str("stdio"),
            Self::Off => f.write_str("off"),
            Self::File(p) => write!(f, "file={}", p.display()),
            Self::Pty => f.write_str("pty"),
        }
    }
}

crate::string_serde!(SerialMode);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_modes_parse() {
        assert_eq!("stdio".parse(), Ok(SerialMode::Stdio));
        assert_eq!("off".parse(), Ok(SerialMode::Off));
        assert_eq!("pty".parse(), Ok(SerialMode::Pty));
        assert_eq!(SerialMode::Pty.to_string(), "pty");
        assert_eq!("file=/tmp/x".parse(), Ok(SerialMode::File("/tmp/x".into())));
        assert!("file=".parse::<SerialMode>().is_err());
        assert!("tty".parse::<SerialMode>().is_err());
    }
}
