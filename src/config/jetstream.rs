//! The `[jetstream]` section: the streams through which several nodes share
//! the index mutation log, the outcomes and the KPI events (see `gateway::jetstream`).

use super::error::{at_most, in_range, InvalidKind, InvalidSetting};
use serde::Deserialize;

/// `[jetstream]` as written is already its settings: `from_raw` only checks it.
pub type RawJetStream = JetStreamSettings;

/// JetStream: the index mutation log and the outcome stream (see `gateway::jetstream`);
/// every key is documented in `config/capdex.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JetStreamSettings {
    pub enabled: bool,
    pub index_stream: String,
    /// 0: kept forever.
    pub index_max_age_ms: u64,
    pub outcome_stream: String,
    pub outcome_max_age_ms: u64,
    /// Durable consumer name prefix; each node's consumer is `<outcome_consumer>-<node name>`.
    pub outcome_consumer: String,
    /// The stream through which the KPI and alert events of stream outcomes
    /// are published once, whatever the number of nodes.
    pub events_stream: String,
    /// Empty: a name generated once and kept in the data dir.
    pub node_name: String,
    pub replicas: usize,
    pub duplicate_window_ms: u64,
    pub apply_timeout_ms: u64,
    pub outcome_max_in_flight: usize,
}

/// The longest a stream keeps its messages: ten years, in milliseconds.
const MAX_AGE_MS: u64 = 10 * 365 * 86_400_000;

/// Whether `text` is an ADR-6 `restricted-term` (letters, digits, `-`, `_`; possibly empty).
fn restricted(text: &str) -> bool {
    text.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl JetStreamSettings {
    /// Checks the section: names are ADR-6 `restricted-term`s, the streams distinct, limits bounded.
    pub fn from_raw(raw: RawJetStream) -> Result<JetStreamSettings, InvalidSetting> {
        for (field, value) in [
            ("jetstream.index_stream", &raw.index_stream),
            ("jetstream.outcome_stream", &raw.outcome_stream),
            ("jetstream.outcome_consumer", &raw.outcome_consumer),
            ("jetstream.events_stream", &raw.events_stream),
        ] {
            if value.is_empty() || value.len() > 64 || !restricted(value) {
                return Err(InvalidSetting::new(
                    field,
                    InvalidKind::Malformed,
                    format!("must be 1 to 64 letters, digits, - or _, got {value:?}"),
                ));
            }
        }
        if raw.index_stream == raw.outcome_stream {
            return Err(InvalidSetting::new(
                "jetstream.outcome_stream",
                InvalidKind::Conflict,
                "must differ from jetstream.index_stream",
            ));
        }
        if raw.events_stream == raw.index_stream || raw.events_stream == raw.outcome_stream {
            return Err(InvalidSetting::new(
                "jetstream.events_stream",
                InvalidKind::Conflict,
                "must differ from the index and outcome streams",
            ));
        }
        if raw.node_name.len() > 64 || !restricted(&raw.node_name) {
            return Err(InvalidSetting::new(
                "jetstream.node_name",
                InvalidKind::Malformed,
                format!("must be at most 64 letters, digits, - or _, got {:?}", raw.node_name),
            ));
        }
        in_range("jetstream.replicas", raw.replicas, 1..=5)?;
        at_most("jetstream.index_max_age_ms", raw.index_max_age_ms, MAX_AGE_MS)?;
        at_most("jetstream.outcome_max_age_ms", raw.outcome_max_age_ms, MAX_AGE_MS)?;
        in_range("jetstream.duplicate_window_ms", raw.duplicate_window_ms, 1_000..=86_400_000)?;
        in_range("jetstream.apply_timeout_ms", raw.apply_timeout_ms, 100..=600_000)?;
        in_range("jetstream.outcome_max_in_flight", raw.outcome_max_in_flight, 1..=65_536)?;
        Ok(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{defaults, load, Case};

    fn check(edit: impl FnOnce(&mut RawJetStream)) -> Result<JetStreamSettings, InvalidSetting> {
        let mut raw = defaults().jetstream;
        edit(&mut raw);
        JetStreamSettings::from_raw(raw)
    }

    #[test]
    fn the_defaults_name_three_distinct_streams() {
        let settings = check(|_| {}).unwrap();
        assert!(settings.enabled);
        let streams = [&settings.index_stream, &settings.outcome_stream, &settings.events_stream];
        assert_eq!(streams, ["CAPDEX_INDEX", "CAPDEX_OUTCOMES", "CAPDEX_EVENTS"]);
        assert_eq!((settings.node_name.as_str(), settings.replicas), ("", 1), "an empty node name is generated later");
    }

    #[test]
    fn each_invalid_value_names_its_key_and_kind() {
        use InvalidKind::*;
        let cases: Vec<Case<RawJetStream>> = vec![
            (Box::new(|r| r.index_stream = "A.B".into()), "jetstream.index_stream", Malformed),
            (Box::new(|r| r.outcome_consumer = String::new()), "jetstream.outcome_consumer", Malformed),
            (Box::new(|r| r.events_stream = "E".repeat(65)), "jetstream.events_stream", Malformed),
            (Box::new(|r| r.outcome_stream = "CAPDEX_INDEX".into()), "jetstream.outcome_stream", Conflict),
            (Box::new(|r| r.events_stream = "CAPDEX_OUTCOMES".into()), "jetstream.events_stream", Conflict),
            (Box::new(|r| r.node_name = "a b".into()), "jetstream.node_name", Malformed),
            (Box::new(|r| r.replicas = 6), "jetstream.replicas", OutOfRange),
            (Box::new(|r| r.index_max_age_ms = MAX_AGE_MS + 1), "jetstream.index_max_age_ms", OutOfRange),
            (Box::new(|r| r.outcome_max_age_ms = MAX_AGE_MS + 1), "jetstream.outcome_max_age_ms", OutOfRange),
            (Box::new(|r| r.duplicate_window_ms = 999), "jetstream.duplicate_window_ms", OutOfRange),
            (Box::new(|r| r.apply_timeout_ms = 99), "jetstream.apply_timeout_ms", OutOfRange),
            (Box::new(|r| r.outcome_max_in_flight = 65_537), "jetstream.outcome_max_in_flight", OutOfRange),
        ];
        for (edit, field, kind) in cases {
            let err = check(edit).unwrap_err();
            assert_eq!((err.field.as_str(), err.kind), (field, kind), "{err}");
        }
    }

    #[test]
    fn the_environment_overrides_the_section() {
        let settings =
            load(&[("CAPDEX_JETSTREAM_ENABLED", "false"), ("CAPDEX_JETSTREAM_NODE_NAME", "node-a")]).unwrap();
        assert!(!settings.jetstream.enabled);
        assert_eq!(settings.jetstream.node_name, "node-a");
    }
}
