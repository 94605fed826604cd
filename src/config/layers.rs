//! The layers a configuration is made of, as TOML values: the compiled-in
//! defaults, an optional user file merged on top, then the `CAPDEX_*`
//! variables of the [`Environment`]. Layering works on TOML values so that an
//! unknown key anywhere is caught by `deny_unknown_fields` and reported with its name.

use super::environment::Environment;
use super::error::ConfigError;
use std::collections::BTreeMap;

/// The documented default configuration, as shipped in `config/capdex.toml`.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("../../config/capdex.toml");

/// Environment variables with the `CAPDEX_` prefix that are not settings.
/// `CAPDEX_TEST_CRASH_AFTER_EXEC` is a test-only hook of the dispatcher (see `actors::dispatcher`);
/// `CAPDEX_COUNT_HEAP` makes the process count its live heap from its first
/// allocation (`allocations`), before any setting is read;
/// the others name what the tests and benchmarks run beside capdex (`scripts/test.sh` exports them).
pub const RESERVED_ENV: &[&str] = &[
    "CAPDEX_CONFIG",
    "CAPDEX_COUNT_HEAP",
    "CAPDEX_NATS_SERVER",
    "CAPDEX_TEST_CRASH_AFTER_EXEC",
    "CAPDEX_PYTHON",
    "CAPDEX_NPM_TOOLS",
    "CAPDEX_TEST_MODEL_DIR",
    "CAPDEX_NEURAL_TESTS",
    "CAPDEX_BENCH_SERVE_BIN",
    "CAPDEX_CHROMIUM",
    "CAPDEX_CHROMEDRIVER",
    "CAPDEX_CONSOLE_SCREENSHOTS",
];

/// The prefix of the variables `${env:VAR}` templates read by default
/// (`[dispatch] env_allow`): secrets, not settings, so never refused as unknown.
pub const SECRET_ENV_PREFIX: &str = "CAPDEX_SECRET_";

/// Settings whose variable is a comma-separated list rather than a colon-separated one.
const COMMA_LISTS: &[&str] = &["CAPDEX_DISPATCH_ENV_ALLOW"];

/// Number settings that also take `"auto"` (the default is a number, so the
/// variable would otherwise have to be one).
const NUMBER_OR_AUTO: &[&str] = &["CAPDEX_DISCOVERY_TIER1_MIN_RELEVANCE"];

/// The compiled-in defaults as a TOML value.
pub(crate) fn defaults() -> Result<toml::Value, ConfigError> {
    parse_toml("(built-in defaults)", DEFAULT_CONFIG_TOML)
}

/// Returns every setting's `CAPDEX_*` variable name with its dotted key.
pub fn env_names() -> Vec<(String, String)> {
    let defaults = defaults().expect("the built-in config parses");
    let mut names = Vec::new();
    if let toml::Value::Table(table) = defaults {
        for (key, value) in table {
            match value {
                toml::Value::Table(section) => {
                    for sub in section.keys() {
                        names.push((
                            format!("CAPDEX_{}_{}", key.to_uppercase(), sub.to_uppercase()),
                            format!("{key}.{sub}"),
                        ));
                    }
                }
                _ => names.push((format!("CAPDEX_{}", key.to_uppercase()), key)),
            }
        }
    }
    names
}

/// Parses `text` (from `origin`, named in the error) as a TOML table.
pub(crate) fn parse_toml(origin: &str, text: &str) -> Result<toml::Value, ConfigError> {
    toml::from_str::<toml::Value>(text)
        .map_err(|err| ConfigError::Parse { path: origin.to_string(), message: err.to_string() })
}

/// Lays `overlay` over `base`: tables merge key by key, anything else replaces.
pub(crate) fn merge(base: &mut toml::Value, overlay: toml::Value) {
    match (base, overlay) {
        (toml::Value::Table(base), toml::Value::Table(overlay)) => {
            for (key, value) in overlay {
                match base.get_mut(&key) {
                    Some(existing) if existing.is_table() && value.is_table() => merge(existing, value),
                    _ => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, overlay) => *base = overlay,
    }
}

/// Writes every `CAPDEX_*` variable of `env` (except [`RESERVED_ENV`]) into
/// `value`, typed like the default it replaces; a list is colon-separated
/// (comma-separated for [`COMMA_LISTS`]), and `CAPDEX_CAPABILITY_DIRS` adds to
/// the configured folders instead of replacing them. `CAPDEX_SECRET_*`
/// variables are skipped: they are values for `${env:VAR}`, not settings.
pub(crate) fn apply_env(value: &mut toml::Value, env: &Environment) -> Result<(), ConfigError> {
    let names: BTreeMap<String, String> = env_names().into_iter().collect();
    for (name, text) in env.with_prefix("CAPDEX_") {
        if RESERVED_ENV.contains(&name) || name.starts_with(SECRET_ENV_PREFIX) {
            continue;
        }
        let key = names.get(name).ok_or_else(|| ConfigError::UnknownEnv { name: name.to_string() })?;
        let (section, leaf) = match key.split_once('.') {
            Some((section, leaf)) => (Some(section), leaf),
            None => (None, key.as_str()),
        };
        let table = match section {
            Some(section) => value.get_mut(section).and_then(toml::Value::as_table_mut),
            None => value.as_table_mut(),
        }
        .expect("env names come from the defaults' own tables");
        let bad = |problem: &str| ConfigError::BadEnv {
            name: name.to_string(),
            value: text.to_string(),
            problem: problem.to_string(),
        };
        let parsed = match table.get(leaf) {
            Some(toml::Value::Integer(_)) => {
                toml::Value::Integer(text.trim().parse().map_err(|_| bad("expected a whole number"))?)
            }
            Some(toml::Value::Float(_)) if NUMBER_OR_AUTO.contains(&name) && text.trim() == "auto" => {
                toml::Value::String("auto".to_string())
            }
            Some(toml::Value::Float(_)) => {
                toml::Value::Float(text.trim().parse().map_err(|_| bad("expected a number"))?)
            }
            Some(toml::Value::Boolean(_)) => toml::Value::Boolean(match text.trim() {
                "true" | "1" | "yes" => true,
                "false" | "0" | "no" => false,
                _ => return Err(bad("expected true or false")),
            }),
            Some(toml::Value::Array(_)) if COMMA_LISTS.contains(&name) => toml::Value::Array(
                text.split(',')
                    .map(str::trim)
                    .filter(|part| !part.is_empty())
                    .map(|part| toml::Value::String(part.to_string()))
                    .collect(),
            ),
            Some(toml::Value::Array(current)) => {
                // A pure split of the given text (no environment is read).
                let given = std::env::split_paths(text)
                    .filter(|p| !p.as_os_str().is_empty())
                    .map(|p| toml::Value::String(p.display().to_string()));
                // CAPDEX_CAPABILITY_DIRS adds to the configured folders, as documented.
                let mut list = if name == "CAPDEX_CAPABILITY_DIRS" { current.clone() } else { Vec::new() };
                list.extend(given);
                toml::Value::Array(list)
            }
            _ => toml::Value::String(text.to_string()),
        };
        table.insert(leaf.to_string(), parsed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Environment {
        pairs.iter().copied().collect()
    }

    #[test]
    fn env_values_take_the_type_of_the_default_they_replace() {
        let mut value = defaults().unwrap();
        apply_env(
            &mut value,
            &env(&[
                ("CAPDEX_WATCH", "no"),
                ("CAPDEX_KPI_ROLLING_WINDOW_SIZE", " 42 "),
                ("CAPDEX_DISCOVERY_GRAPH_BOOST_FACTOR", "0.25"),
                ("CAPDEX_SCG_MAP_PATH_ROOTS", "/a::/b"),
                ("CAPDEX_CAPABILITY_DIRS", "x"),
                ("CAPDEX_CONFIG", "/reserved/is/skipped"),
                ("CAPDEX_SECRET_API_KEY", "a secret, not a setting"),
                ("HOME", "/not/a/setting"),
            ]),
        )
        .unwrap();
        assert_eq!(value["watch"], toml::Value::Boolean(false));
        assert_eq!(value["kpi"]["rolling_window_size"], toml::Value::Integer(42));
        assert_eq!(value["discovery"]["graph_boost_factor"], toml::Value::Float(0.25));
        let roots: Vec<_> = ["/a", "/b"].map(|s| toml::Value::String(s.into())).into();
        assert_eq!(value["scg"]["map_path_roots"], toml::Value::Array(roots), "a list replaces, empty parts dropped");
        let dirs = value["capability_dirs"].as_array().unwrap();
        assert_eq!(dirs.len(), 3, "CAPDEX_CAPABILITY_DIRS adds to the two defaults");
        assert_eq!(dirs[2], toml::Value::String("x".into()));
    }

    #[test]
    fn bad_and_unknown_env_values_name_the_variable() {
        for (name, value, problem) in [
            ("CAPDEX_WATCH", "sometimes", "expected true or false"),
            ("CAPDEX_KPI_HORIZON_MS", "1.5", "expected a whole number"),
            ("CAPDEX_KPI_ALERT_BELOW_WEIGHTED_SUCCESS_RATE", "low", "expected a number"),
        ] {
            match apply_env(&mut defaults().unwrap(), &env(&[(name, value)])) {
                Err(ConfigError::BadEnv { name: got, problem: why, .. }) => {
                    assert_eq!((got.as_str(), why.as_str()), (name, problem))
                }
                other => panic!("{name}={value} gave {other:?}"),
            }
        }
        let err = apply_env(&mut defaults().unwrap(), &env(&[("CAPDEX_NATS_URI", "x")])).unwrap_err();
        assert!(matches!(err, ConfigError::UnknownEnv { ref name } if name == "CAPDEX_NATS_URI"), "{err}");
    }

    #[test]
    fn a_file_merges_key_by_key() {
        let mut value = defaults().unwrap();
        merge(&mut value, parse_toml("f", "log = \"debug\"\n[nats]\nurl = \"nats://h:1\"\n").unwrap());
        assert_eq!(value["log"].as_str(), Some("debug"));
        assert_eq!(value["nats"]["url"].as_str(), Some("nats://h:1"));
        assert_eq!(value["nats"]["subject_prefix"].as_str(), Some("capdex.v1"), "the rest of the section stays");
        assert!(matches!(parse_toml("f", "= 1"), Err(ConfigError::Parse { ref path, .. }) if path == "f"));
    }
}
