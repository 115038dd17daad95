//! The textual form of the idle manager's knobs, shared by the command line and the JSON
//! config: durations (`50us`, `2ms`), `key=value` lists, and the serde of a knob that travels
//! as a string.

/// A knob's value does not parse.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct KnobError(pub String);

/// Parses a duration in humantime's grammar, the one `lull bench` uses too: `250ns`, `50us`,
/// `2ms`, `1s`, `1m30s`. A bare number is refused: the message names the units to write.
pub fn parse_duration_ns(s: &str) -> Result<u64, KnobError> {
    let s = s.trim();
    let d = humantime::parse_duration(s).map_err(|e| {
        KnobError(format!(
            "'{s}' is not a duration ({e}): write a number with a unit, e.g. 50us, 2ms or 1s"
        ))
    })?;
    u64::try_from(d.as_nanos()).map_err(|_| KnobError(format!("'{s}' is too long")))
}

/// Formats nanoseconds the way [`parse_duration_ns`] reads them.
pub fn format_duration_ns(ns: u64) -> String {
    if ns != 0 && ns.is_multiple_of(1_000_000_000) {
        format!("{}s", ns / 1_000_000_000)
    } else if ns != 0 && ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else if ns != 0 && ns.is_multiple_of(1_000) {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

/// Splits `key=value,key=value` into pairs; a bare word becomes (word, "").
pub fn parse_pairs(s: &str) -> Vec<(&str, &str)> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => (p.trim(), ""),
        })
        .collect()
}

/// Milliseconds from a `key=MS` value (a plain number is milliseconds; units are accepted).
pub fn parse_ms_or_duration(v: &str) -> Result<u64, KnobError> {
    if v.chars().all(|c| c.is_ascii_digit()) && !v.is_empty() {
        v.parse::<u64>()
            .ok()
            .and_then(|ms| ms.checked_mul(1_000_000))
            .ok_or_else(|| KnobError(format!("'{v}' is too large")))
    } else {
        parse_duration_ns(v)
    }
}

/// A serde helper for knobs that travel as strings (FromStr + Display).
#[macro_export]
macro_rules! string_serde {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.to_string())
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <String as serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("50us"), Ok(50_000));
        assert_eq!(parse_duration_ns("2ms"), Ok(2_000_000));
        assert_eq!(parse_duration_ns("1s"), Ok(1_000_000_000));
        assert_eq!(parse_duration_ns("250ns"), Ok(250));
        assert_eq!(parse_duration_ns("1m30s"), Ok(90_000_000_000));
        let bare = parse_duration_ns("700").unwrap_err().0;
        assert!(bare.contains("with a unit"), "{bare}");
        assert!(parse_duration_ns("fast").is_err());
        assert!(parse_duration_ns("99999999999999999s").is_err());
        assert_eq!(format_duration_ns(200_000), "200us");
        assert_eq!(format_duration_ns(3), "3ns");
        assert_eq!(parse_ms_or_duration("100"), Ok(100_000_000));
        assert_eq!(parse_ms_or_duration("250us"), Ok(250_000));
    }

    #[test]
    fn pairs() {
        assert_eq!(
            parse_pairs("percent=25, period=100"),
            vec![("percent", "25"), ("period", "100")]
        );
        assert_eq!(parse_pairs("4"), vec![("4", "")]);
    }
}
