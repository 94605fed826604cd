//! What can go wrong loading settings: [`ConfigError`] for the whole load, and
//! [`InvalidSetting`] (a key, a stable [`InvalidKind`] code and a message) for
//! a value one section refuses.

use std::fmt::Display;
use std::ops::RangeInclusive;
use std::path::PathBuf;

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: String, message: String },
    #[error("unknown environment variable {name}: no setting has that name")]
    UnknownEnv { name: String },
    #[error("environment variable {name}={value:?} is not valid: {problem}")]
    BadEnv { name: String, value: String, problem: String },
    #[error(transparent)]
    Invalid(#[from] InvalidSetting),
}

/// Why a value is refused; [`InvalidKind::code`] is its stable name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidKind {
    /// A number outside its bounds (NaN included).
    OutOfRange,
    /// A value that must be given is empty.
    Empty,
    /// A word that is not one of the allowed ones.
    UnknownChoice,
    /// Text without the required form (a URL, an address, a name, a CIDR).
    Malformed,
    /// Two settings that cannot hold together as given.
    Conflict,
    /// A setting that needs another one, which is missing.
    Incomplete,
    /// A choice this build cannot honour.
    Unsupported,
}

impl InvalidKind {
    /// The code, snake case: `out_of_range`, `empty`, `unknown_choice`, ...
    pub fn code(self) -> &'static str {
        match self {
            InvalidKind::OutOfRange => "out_of_range",
            InvalidKind::Empty => "empty",
            InvalidKind::UnknownChoice => "unknown_choice",
            InvalidKind::Malformed => "malformed",
            InvalidKind::Conflict => "conflict",
            InvalidKind::Incomplete => "incomplete",
            InvalidKind::Unsupported => "unsupported",
        }
    }
}

/// A setting whose value a section refuses: its dotted key (`nats.url`), why, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("setting {field} is not valid: {problem}")]
pub struct InvalidSetting {
    /// The dotted key as written in `config/capdex.toml` (`data_dir`, `kpi.horizon_ms`).
    pub field: String,
    pub kind: InvalidKind,
    pub problem: String,
}

impl InvalidSetting {
    pub fn new(field: impl Into<String>, kind: InvalidKind, problem: impl Into<String>) -> InvalidSetting {
        InvalidSetting { field: field.into(), kind, problem: problem.into() }
    }

    /// An [`InvalidKind::OutOfRange`] refusal.
    pub fn out_of_range(field: impl Into<String>, problem: impl Into<String>) -> InvalidSetting {
        InvalidSetting::new(field, InvalidKind::OutOfRange, problem)
    }
}

/// `value` if it lies in `range`, else "must be in A..=B, got V" for `field`.
pub(crate) fn in_range<T: PartialOrd + Display + Copy>(
    field: &str,
    value: T,
    range: RangeInclusive<T>,
) -> Result<T, InvalidSetting> {
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(InvalidSetting::out_of_range(field, format!("must be in {}..={}, got {value}", range.start(), range.end())))
    }
}

/// `value` if it is at most `max`, else "must be at most MAX, got V" for `field`.
pub(crate) fn at_most<T: PartialOrd + Display + Copy>(field: &str, value: T, max: T) -> Result<T, InvalidSetting> {
    if value <= max {
        Ok(value)
    } else {
        Err(InvalidSetting::out_of_range(field, format!("must be at most {max}, got {value}")))
    }
}

/// `value` if it is a finite number in [0, 1], else "must be a number in [0, 1], got V" for `field`.
pub(crate) fn unit_rate(field: &str, value: f32) -> Result<f32, InvalidSetting> {
    if value.is_finite() && (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(InvalidSetting::out_of_range(field, format!("must be a number in [0, 1], got {value}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_key_and_the_code_is_stable() {
        let err = in_range("nats.max_payload_bytes", 5usize, 1024..=2048).unwrap_err();
        assert_eq!(err.to_string(), "setting nats.max_payload_bytes is not valid: must be in 1024..=2048, got 5");
        assert_eq!(err.kind.code(), "out_of_range");
        assert_eq!(at_most("a.b", 3u64, 3).unwrap(), 3);
        assert_eq!(at_most("a.b", 4u64, 3).unwrap_err().problem, "must be at most 3, got 4");
        assert_eq!(unit_rate("k", 1.0).unwrap(), 1.0);
        for bad in [f32::NAN, -0.1, 1.01, f32::INFINITY] {
            assert_eq!(unit_rate("k", bad).unwrap_err().kind, InvalidKind::OutOfRange, "{bad}");
        }
        let wrapped: ConfigError = InvalidSetting::new("log_format", InvalidKind::UnknownChoice, "no").into();
        assert_eq!(wrapped.to_string(), "setting log_format is not valid: no");
    }
}
