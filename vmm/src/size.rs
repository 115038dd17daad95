//! Memory sizes as users write them: `256M`, `1G`, `131072K`, `1.5G`, or plain bytes, read by
//! `parse-size` with binary units (`lull bench --memory` reads them the same way).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes, parsed from `NUMBER[K|M|G|T][i][B]` (binary units, case-insensitive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

/// A size string that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("'{0}' is not a size: write a number with an optional K, M or G suffix, e.g. 256M")]
pub struct SizeError(pub String);

impl ByteSize {
    /// Mebibytes.
    pub const fn mib(n: u64) -> Self {
        Self(n << 20)
    }
}

impl FromStr for ByteSize {
    type Err = SizeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_size::Config::new()
            .with_binary()
            .parse_size(s.trim())
            .map(ByteSize)
            .map_err(|_| SizeError(s.to_string()))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b != 0 && b.is_multiple_of(1 << 30) {
            write!(f, "{}G", b >> 30)
        } else if b != 0 && b.is_multiple_of(1 << 20) {
            write!(f, "{}M", b >> 20)
        } else if b != 0 && b.is_multiple_of(1 << 10) {
            write!(f, "{}K", b >> 10)
        } else {
            write!(f, "{b}")
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(b) => Ok(ByteSize(b)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!("256M".parse(), Ok(ByteSize(256 << 20)));
        assert_eq!("1g".parse(), Ok(ByteSize(1 << 30)));
        assert_eq!("64KiB".parse(), Ok(ByteSize(64 << 10)));
        assert_eq!("4096".parse(), Ok(ByteSize(4096)));
        assert_eq!("2MB".parse(), Ok(ByteSize(2 << 20)));
        assert_eq!("1.5G".parse(), Ok(ByteSize(3 << 29)));
    }

    #[test]
    fn rejects_garbage_and_overflow() {
        for bad in ["", "M", "12X", "-1M", "99999999999999999999G"] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad}");
        }
    }

    #[test]
    fn round_trips_through_display_and_json() {
        for s in ["256M", "1G", "3K", "1000"] {
            let v: ByteSize = s.parse().unwrap();
            assert_eq!(v.to_string(), s);
            let j = serde_json::to_string(&v).unwrap();
            assert_eq!(serde_json::from_str::<ByteSize>(&j).unwrap(), v);
        }
        assert_eq!(
            serde_json::from_str::<ByteSize>("1048576").unwrap(),
            ByteSize(1 << 20)
        );
    }
}
