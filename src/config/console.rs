//! The `[console]` section: the operator console's web pages, served by
//! `capdex serve` when `listen` is set (off by default).

use super::environment::Environment;
use super::error::{InvalidKind, InvalidSetting};
use super::listener::{listener, Listener};
use super::nats::Secret;
use serde::Deserialize;
use std::net::SocketAddr;

/// `[console]` as written; documented in `config/capdex.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConsole {
    pub listen: String,
    pub token: String,
    pub operator: String,
}

/// The console's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsoleSettings {
    /// Where `capdex serve` serves the console; `None` serves none.
    pub listen: Option<SocketAddr>,
    /// The token an operator signs in with, `${env:VAR}` resolved; `None`: loopback only, no sign-in.
    pub token: Option<Secret>,
    /// The name the console's decisions are recorded under (an approval's `decidedBy`).
    pub operator: String,
}

impl ConsoleSettings {
    /// Checks the address and the token; `${env:VAR}` in the token is read
    /// from `env`; the operator is checked as every decider is (not blank, at
    /// most `max_id_bytes` bytes (`[limits]`), no control characters).
    pub fn from_raw(
        raw: RawConsole,
        env: &Environment,
        max_id_bytes: usize,
    ) -> Result<ConsoleSettings, InvalidSetting> {
        use crate::core::dispatch::approval::{check_decider, DeciderProblem};
        let Listener { listen, token } = listener("console", &raw.listen, &raw.token, env)?;
        let operator = raw.operator.trim();
        match check_decider(operator, max_id_bytes) {
            Ok(()) => Ok(ConsoleSettings { listen, token, operator: operator.to_string() }),
            Err(DeciderProblem::TooLong(exceeded)) => Err(InvalidSetting::out_of_range(
                "console.operator",
                crate::core::subject_token::too_long_text(&exceeded),
            )),
            Err(_) => {
                Err(InvalidSetting::new("console.operator", InvalidKind::Malformed, "not blank, no control characters"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{defaults, load, Case};

    fn raw() -> RawConsole {
        defaults().console
    }

    #[test]
    fn the_defaults_serve_no_console() {
        let settings = ConsoleSettings::from_raw(raw(), &Environment::default(), 128).unwrap();
        assert_eq!((settings.listen, settings.token), (None, None));
        assert_eq!(settings.operator, "console");
    }

    #[test]
    fn a_token_is_read_from_the_environment_and_never_shown() {
        let env: Environment = [("CONSOLE_TOKEN", "0123456789abcdef-xyz")].into_iter().collect();
        let mut given = raw();
        given.token = "${env:CONSOLE_TOKEN}".into();
        given.listen = "0.0.0.0:7700".into();
        let settings = ConsoleSettings::from_raw(given.clone(), &env, 128).unwrap();
        assert_eq!(settings.token.as_ref().unwrap().expose(), "0123456789abcdef-xyz");
        assert!(!format!("{settings:?}").contains("0123456789abcdef"));
        let err = ConsoleSettings::from_raw(given, &Environment::default(), 128).unwrap_err();
        assert_eq!((err.field.as_str(), err.kind), ("console.token", InvalidKind::Incomplete));
    }

    #[test]
    fn a_loopback_address_needs_no_token() {
        let mut given = raw();
        given.listen = "127.0.0.1:0".into();
        let settings = ConsoleSettings::from_raw(given, &Environment::default(), 128).unwrap();
        assert!(settings.listen.unwrap().ip().is_loopback());
        let env = [("CAPDEX_CONSOLE_LISTEN", "[::1]:7700")];
        assert!(load(&env).unwrap().console.listen.unwrap().ip().is_loopback());
    }

    #[test]
    fn bad_values_are_refused() {
        let cases: Vec<Case<RawConsole>> = vec![
            (Box::new(|r| r.listen = "0.0.0.0:7700".into()), "console.listen", InvalidKind::Conflict),
            (Box::new(|r| r.listen = "10.1.2.3:7700".into()), "console.listen", InvalidKind::Conflict),
            (Box::new(|r| r.listen = "localhost".into()), "console.listen", InvalidKind::Malformed),
            (Box::new(|r| r.token = "short".into()), "console.token", InvalidKind::Malformed),
            (Box::new(|r| r.token = "with a space in the token".into()), "console.token", InvalidKind::Malformed),
            (Box::new(|r| r.operator = "".into()), "console.operator", InvalidKind::Malformed),
            (Box::new(|r| r.operator = "a\nb".into()), "console.operator", InvalidKind::Malformed),
        ];
        for (change, field, kind) in cases {
            let mut given = raw();
            change(&mut given);
            let err = ConsoleSettings::from_raw(given, &Environment::default(), 128).unwrap_err();
            assert_eq!((err.field.as_str(), err.kind), (field, kind));
        }
    }

    #[test]
    fn an_operator_of_max_id_bytes_is_accepted_and_one_byte_more_refused_naming_the_setting() {
        let settings = load(&[("CAPDEX_LIMITS_MAX_ID_BYTES", "70"), ("CAPDEX_CONSOLE_OPERATOR", &"o".repeat(70))]);
        assert_eq!(settings.unwrap().console.operator, "o".repeat(70));
        let err = load(&[("CAPDEX_LIMITS_MAX_ID_BYTES", "70"), ("CAPDEX_CONSOLE_OPERATOR", &"o".repeat(71))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("console.operator"), "{err}");
        assert!(err.contains("is 71 bytes, over limits.max_id_bytes: at most 70"), "{err}");
    }
}
