//! A measured value, or why there is none: what every reader of the host returns.

use std::fmt::Display;

use serde::{Deserialize, Serialize};

/// A measured value, or why there is none (in JSON: `{"value": null, "reason": "..."}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reading<T> {
    /// The value, if it could be measured.
    pub value: Option<T>,
    /// Why there is no value.
    pub reason: Option<String>,
}

impl<T> Reading<T> {
    /// A measured value.
    pub fn ok(value: T) -> Self {
        Self {
            value: Some(value),
            reason: None,
        }
    }

    /// No value in a report written before the figure existed (serde's default for it).
    pub fn not_recorded() -> Self {
        Self {
            value: None,
            reason: Some("not recorded by the lull bench that wrote this report".to_string()),
        }
    }

    /// No value, for `reason`.
    pub fn missing(reason: impl Display) -> Self {
        Self {
            value: None,
            reason: Some(reason.to_string()),
        }
    }
}

impl<T, E: Display> From<Result<T, E>> for Reading<T> {
    fn from(result: Result<T, E>) -> Self {
        result.map_or_else(Self::missing, Self::ok)
    }
}
