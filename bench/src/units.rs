//! The units of the bench's flags, in the grammar `lull run` uses for the same things:
//! durations as humantime reads them (`30s`, `500ms`, `2m`, `1m30s`; a bare number is refused,
//! so that nobody has to guess its unit), sizes as parse-size reads them with binary units
//! (`64M` is 64 MiB, as in `lull run --memory`).

use std::time::Duration;

/// A flag value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    /// Not a duration, or a bare number.
    #[error("'{0}' is not a duration: write a number with a unit, e.g. 30s, 500ms or 2m ({1})")]
    Duration(String, String),
    /// A zero duration.
    #[error("'{0}' is zero: a run needs a duration above zero, e.g. 30s")]
    ZeroDuration(String),
    /// Not a size.
    #[error("'{0}' is not a size: write a number with an optional K, M or G suffix, e.g. 64M")]
    Size(String),
}

/// Parses a positive duration: `30s`, `500ms`, `2m`, `1m30s` (humantime's grammar).
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| UnitError::Duration(s.to_string(), e.to_string()))?;
    if d.is_zero() {
        return Err(UnitError::ZeroDuration(s.to_string()));
    }
    Ok(d)
}

/// Parses a size in bytes: `64M`, `1G`, `131072K`, `64MiB` or plain bytes (binary units).
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|_| UnitError::Size(s.to_string()))
}

/// Reads one value of `--timer-slack`: `off` or a duration (lull checks its bound).
pub(crate) fn parse_slack(s: &str) -> Result<String, String> {
    if s == "off" {
        return Ok(s.into());
    }
    parse_duration(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("{e} (a timer slack is off or a duration such as 100us)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        let bare = parse_duration("10").unwrap_err().to_string();
        assert!(bare.contains("with a unit"), "{bare}");
        assert!(parse_duration("soon").is_err());
        assert_eq!(
            parse_duration("0s"),
            Err(UnitError::ZeroDuration("0s".into()))
        );
    }

    #[test]
    fn sizes_are_binary() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("-1M").is_err());
    }
}
