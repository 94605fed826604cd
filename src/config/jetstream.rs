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
    /// Most mutations the index log keeps; 0: no limit.
    pub index_max_msgs: u64,
    pub outcome_stream: String,
    pub outcome_max_age_ms: u64,
    /// Most outcomes the outcome stream keeps; 0: no limit.
    pub outcome_max_msgs: u64,
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
    /// How long a starting node keeps opening its streams and buckets while
    /// the JetStream cluster is not ready (`gateway::patience`).
    pub open_timeout_ms: u64,
    pub outcome_max_in_flight: usize,
    /// Whether dispatch state (registry, bindings, approvals, re-drive claims,
    /// rate windows) lives in the key-value buckets below, shared by every node.
    pub shared_dispatch: bool,
    /// Bucket of capability records and bindings.
    pub registry_bucket: String,
    /// Bucket of approvals.
    pub approvals_bucket: String,
    /// How long an approval is kept after its last change; 0 keeps it.
    pub approvals_max_age_ms: u64,
    /// Most entries the approvals bucket keeps (live approvals are never
    /// pruned, so it may hold more of them); 0: no limit.
    pub approvals_max_count: usize,
    /// Bucket of re-drive claims and stored results, one per (executionId, stepId).
    pub redrive_bucket: String,
    /// How long a re-drive record is kept after its last change; 0 keeps it.
    pub redrive_max_age_ms: u64,
    /// Most entries the re-drive bucket keeps (claims in progress are never
    /// pruned, so it may hold more of them); 0: no limit.
    pub redrive_max_count: usize,
    /// Bucket of rate windows, one per (capability, agent).
    pub rates_bucket: String,
    /// Bucket of SCG sources, cross-source links and memory notes.
    pub scg_bucket: String,
    /// Bucket of live source definitions.
    pub sources_bucket: String,
}

impl JetStreamSettings {
    /// The names of the key-value buckets, each with its setting's key.
    pub fn buckets(&self) -> [(&'static str, &str); 6] {
        [
            ("jetstream.registry_bucket", &self.registry_bucket),
            ("jetstream.approvals_bucket", &self.approvals_bucket),
            ("jetstream.redrive_bucket", &self.redrive_bucket),
            ("jetstream.rates_bucket", &self.rates_bucket),
            ("jetstream.scg_bucket", &self.scg_bucket),
            ("jetstream.sources_bucket", &self.sources_bucket),
        ]
    }
}

/// The longest a stream keeps its messages: ten years, in milliseconds.
const MAX_AGE_MS: u64 = 10 * 365 * 86_400_000;

/// The most entries a bucket's count limit may name: a billion.
const MAX_COUNT: usize = 1_000_000_000;

/// Whether `text` is an ADR-6 `restricted-term` (letters, digits, `-`, `_`; possibly empty).
fn restricted(text: &str) -> bool {
    text.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl JetStreamSettings {
    /// Checks the section: names are ADR-6 `restricted-term`s, the streams distinct, limits bounded.
    pub fn from_raw(raw: RawJetStream) -> Result<JetStreamSettings, InvalidSetting> {
        for (field, value) in [
            ("jetstream.index_stream", raw.index_stream.as_str()),
            ("jetstream.outcome_stream", &raw.outcome_stream),
            ("jetstream.outcome_consumer", &raw.outcome_consumer),
            ("jetstream.events_stream", &raw.events_stream),
        ]
        .into_iter()
        .chain(raw.buckets())
        {
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
        let buckets = raw.buckets();
        for (at, (field, name)) in buckets.iter().enumerate() {
            if buckets[..at].iter().any(|(_, other)| other == name) {
                return Err(InvalidSetting::new(*field, InvalidKind::Conflict, "must differ from the other buckets"));
            }
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
        in_range("jetstream.open_timeout_ms", raw.open_timeout_ms, 1_000..=600_000)?;
        in_range("jetstream.outcome_max_in_flight", raw.outcome_max_in_flight, 1..=65_536)?;
        at_most("jetstream.approvals_max_age_ms", raw.approvals_max_age_ms, MAX_AGE_MS)?;
        at_most("jetstream.redrive_max_age_ms", raw.redrive_max_age_ms, MAX_AGE_MS)?;
        at_most("jetstream.approvals_max_count", raw.approvals_max_count, MAX_COUNT)?;
        at_most("jetstream.redrive_max_count", raw.redrive_max_count, MAX_COUNT)?;
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
            (Box::new(|r| r.open_timeout_ms = 999), "jetstream.open_timeout_ms", OutOfRange),
            (Box::new(|r| r.outcome_max_in_flight = 65_537), "jetstream.outcome_max_in_flight", OutOfRange),
            (Box::new(|r| r.rates_bucket = "R.S".into()), "jetstream.rates_bucket", Malformed),
            (Box::new(|r| r.scg_bucket = "CAPDEX_REGISTRY".into()), "jetstream.scg_bucket", Conflict),
            (Box::new(|r| r.redrive_max_age_ms = MAX_AGE_MS + 1), "jetstream.redrive_max_age_ms", OutOfRange),
            (Box::new(|r| r.approvals_max_count = MAX_COUNT + 1), "jetstream.approvals_max_count", OutOfRange),
            (Box::new(|r| r.redrive_max_count = MAX_COUNT + 1), "jetstream.redrive_max_count", OutOfRange),
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
