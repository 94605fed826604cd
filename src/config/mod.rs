//! Configuration: the documented file `config/capdex.toml` (compiled in as the
//! defaults), an optional user file on top, then the `CAPDEX_*` variables of an
//! [`Environment`] handed in by the caller, validated into [`Settings`].
//!
//! One file per concern, each with its raw (serde) shape and a `from_raw` that
//! refuses a bad value with an [`InvalidSetting`] naming its key:
//! [`layers`] (defaults, file, environment overrides), [`environment`],
//! [`data_dir`], [`scanning`] (capability folders), [`observability`] (logs,
//! metrics), [`embedder`], [`discovery`], [`kpi`], [`planner`], [`nats`],
//! [`jetstream`], [`scg`], [`dispatch`], [`sources`], [`mcp`], [`console`], [`retention`]. [`Settings::from_raw`] only composes them.
//! Nothing here reads the process environment: the binary builds the
//! [`Environment`] once, tests build it from pairs.

mod console;
mod data_dir;
mod discovery;
mod dispatch;
mod embedder;
mod environment;
mod error;
mod jetstream;
mod kpi;
mod layers;
mod limits;
mod listener;
mod mcp;
mod nats;
mod observability;
mod planner;
mod retention;
mod scanning;
mod scg;
mod sources;

pub use console::{ConsoleSettings, RawConsole};
pub use discovery::{
    ChatterGate, DiscoverySection, LexicalWeight, MinRelevance, OutcomeLearningSettings, RawDiscovery,
    MAX_DISCOVERY_WORKERS,
};
pub use dispatch::{DispatchSettings, RawDispatch};
pub use embedder::{EmbedderBackend, EmbedderSettings, Pooling, RawEmbedder};
pub use environment::Environment;
pub use error::{ConfigError, InvalidKind, InvalidSetting};
pub use jetstream::{JetStreamSettings, RawJetStream};
pub use kpi::{KpiSettings, RawKpi};
pub use layers::{env_names, DEFAULT_CONFIG_TOML, RESERVED_ENV};
pub use mcp::{McpSettings, RawMcp, MAX_DIRECT_TOOLS};
pub use nats::{NatsAuth, NatsSettings, NatsTls, RawNats, Secret, SecretSource};
pub use observability::{LogFormat, RawMetrics};
pub use planner::{PlannerSection, RawPlanner};
pub use retention::{RawRetention, RetentionSettings};
pub use scanning::{RawScanning, ScanningSection};
pub use scg::{RawScg, ScgSettings};

use crate::core::discovery::DiscoveryConfig;
use crate::core::manifest::ScanLimits;
use crate::core::turn_planner::PlannerDefaults;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The file shape; every field is documented in `config/capdex.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    pub data_dir: PathBuf,
    pub data_dir_min_free_bytes: u64,
    pub capability_dirs: Vec<PathBuf>,
    pub max_manifest_bytes: u64,
    pub max_attachment_bytes: u64,
    pub watch: bool,
    pub watch_debounce_ms: u64,
    pub log: String,
    pub log_format: String,
    pub discovery: RawDiscovery,
    pub embedder: RawEmbedder,
    pub nats: RawNats,
    pub kpi: RawKpi,
    pub planner: RawPlanner,
    pub metrics: RawMetrics,
    pub scg: RawScg,
    pub jetstream: RawJetStream,
    pub dispatch: RawDispatch,
    /// `[[sources]]`: live sources added on every start.
    #[serde(default)]
    pub sources: Vec<crate::core::sources::settings::SourceSettings>,
    pub mcp: RawMcp,
    pub console: RawConsole,
    pub limits: limits::RawLimits,
    pub retention: RawRetention,
}

/// Validated settings; each actor receives only its part.
#[derive(Clone, Debug)]
pub struct Settings {
    pub data_dir: PathBuf,
    /// Free bytes the data dir keeps; under them writes are refused (`storage_full`), 0: no check.
    pub data_dir_min_free_bytes: u64,
    pub capability_dirs: Vec<PathBuf>,
    pub scan_limits: ScanLimits,
    pub watch: bool,
    pub watch_debounce_ms: u64,
    pub log: String,
    pub log_format: LogFormat,
    /// With `lexical_weight` resolved for the configured embedder.
    pub discovery: DiscoveryConfig,
    /// `[discovery] lexical_weight` as written (`auto` follows the embedder).
    pub lexical_weight: LexicalWeight,
    /// `[discovery] chatter_gate` as written (`auto` follows the embedder).
    pub chatter_gate: ChatterGate,
    /// `[discovery] tier1_min_relevance` as written (`auto` follows the embedder and the chatter gate).
    pub tier1_min_relevance: MinRelevance,
    /// `[discovery] outcome_learning*`.
    pub outcome_learning: OutcomeLearningSettings,
    pub embedder_dimensions: usize,
    pub nats: NatsSettings,
    /// The `[embedder]` section (`embedder_dimensions` is its `dimensions`).
    pub embedder: EmbedderSettings,
    pub kpi: KpiSettings,
    pub planner: PlannerDefaults,
    pub planner_discovery_max_retries: u32,
    pub planner_discovery_retry_backoff_ms: u64,
    pub metrics_listen_addr: Option<SocketAddr>,
    /// Threads that run the NATS service's discoveries (`[discovery] workers`, 0: one per core).
    pub discovery_workers: usize,
    pub scg: ScgSettings,
    pub jetstream: JetStreamSettings,
    pub dispatch: DispatchSettings,
    /// `[[sources]]`, checked; their files are read from `scg.map_path_roots`.
    pub sources: Vec<crate::core::sources::settings::SourceSettings>,
    /// The MCP face (`[mcp]`).
    pub mcp: McpSettings,
    /// Limits on everything from outside (`[limits]`).
    pub limits: crate::core::limits::Limits,
    /// The operator console (`[console]`).
    pub console: ConsoleSettings,
    /// Age and count limits of the stores that grow (`[retention]`).
    pub retention: RetentionSettings,
}

impl Settings {
    /// `[discovery]` with its `"auto"` settings (lexical weight, chatter gate,
    /// Tier 1 floor) resolved for `backend`, e.g. an embedder chosen on the
    /// command line instead of the configured one.
    pub fn discovery_for(&self, backend: EmbedderBackend) -> DiscoveryConfig {
        let auto = (self.lexical_weight, self.chatter_gate, self.tier1_min_relevance);
        discovery::resolve_auto(self.discovery.clone(), auto, backend)
    }

    /// Loads the defaults, then `file` (if any), then the `CAPDEX_*` variables of `env`.
    pub fn load(file: Option<&Path>, env: &Environment) -> Result<Settings, ConfigError> {
        match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
                Settings::load_text(&path.display().to_string(), Some(&text), env)
            }
            None => Settings::load_text("(environment)", None, env),
        }
    }

    /// [`Settings::load`] of a config file's `text` (`origin` names it in errors).
    pub fn load_text(origin: &str, text: Option<&str>, env: &Environment) -> Result<Settings, ConfigError> {
        let mut value = layers::defaults()?;
        if let Some(text) = text {
            let user = layers::parse_toml(origin, text)?;
            layers::merge(&mut value, user);
        }
        layers::apply_env(&mut value, env)?;
        let raw: RawSettings = value.try_into().map_err(|err: toml::de::Error| ConfigError::Parse {
            path: origin.to_string(),
            message: err.message().to_string(),
        })?;
        Settings::from_raw(raw, env)
    }

    /// Validates raw settings section by section; `env` gives the home folder for `~`.
    pub fn from_raw(raw: RawSettings, env: &Environment) -> Result<Settings, ConfigError> {
        let data_dir = data_dir::data_dir_from_raw(raw.data_dir)?;
        let log_format = LogFormat::from_raw(&raw.log_format)?;
        let embedder = EmbedderSettings::from_raw(raw.embedder)?;
        let discovery = DiscoverySection::from_raw(raw.discovery, embedder.backend)?;
        let nats = NatsSettings::from_raw(raw.nats)?;
        let limits = limits::limits_from_raw(raw.limits)?;
        let kpi = KpiSettings::from_raw(
            raw.kpi,
            discovery.prior,
            discovery.prior_publish_interval_ms,
            crate::core::kpi_window::OutcomeLimits::from(&limits),
        )?;
        let planner = PlannerSection::from_raw(raw.planner)?;
        let metrics_listen_addr = observability::metrics_listen_addr(&raw.metrics)?;
        let scanning = ScanningSection::from_raw(
            RawScanning {
                capability_dirs: raw.capability_dirs,
                max_manifest_bytes: raw.max_manifest_bytes,
                max_attachment_bytes: raw.max_attachment_bytes,
                watch: raw.watch,
                watch_debounce_ms: raw.watch_debounce_ms,
            },
            env,
        )?;
        Ok(Settings {
            data_dir,
            data_dir_min_free_bytes: raw.data_dir_min_free_bytes,
            capability_dirs: scanning.capability_dirs,
            scan_limits: ScanLimits { text: limits, ..scanning.scan_limits },
            watch: scanning.watch,
            watch_debounce_ms: scanning.watch_debounce_ms,
            log: raw.log,
            log_format,
            discovery: discovery.config,
            lexical_weight: discovery.lexical_weight,
            chatter_gate: discovery.chatter_gate,
            tier1_min_relevance: discovery.tier1_min_relevance,
            outcome_learning: discovery.learning,
            embedder_dimensions: embedder.dimensions,
            embedder,
            nats,
            kpi,
            planner: planner.defaults,
            planner_discovery_max_retries: planner.discovery_max_retries,
            planner_discovery_retry_backoff_ms: planner.discovery_retry_backoff_ms,
            metrics_listen_addr,
            discovery_workers: discovery.workers,
            jetstream: JetStreamSettings::from_raw(raw.jetstream)?,
            scg: ScgSettings::from_raw(raw.scg)?,
            dispatch: DispatchSettings::from_raw(raw.dispatch, limits.max_id_bytes)?,
            sources: sources::sources_from_raw(raw.sources)?,
            mcp: McpSettings::from_raw(raw.mcp, env, limits.max_id_bytes)?,
            console: ConsoleSettings::from_raw(raw.console, env, limits.max_id_bytes)?,
            limits,
            retention: RetentionSettings::from_raw(raw.retention)?,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::kpi_window::{AlertPolicy, ScopeMode, WindowSpec};
    use crate::core::turn_planner::AdaptivePolicy;

    fn env(pairs: &[(&str, &str)]) -> Environment {
        pairs.iter().copied().collect()
    }

    /// The compiled-in defaults as raw settings, for the sections' own tests.
    pub(crate) fn defaults() -> RawSettings {
        layers::defaults().unwrap().try_into().expect("the built-in config has the file shape")
    }

    /// One refusal case of a section's test: an edit of its raw shape, the key and the kind expected.
    pub(crate) type Case<R> = (Box<dyn FnOnce(&mut R)>, &'static str, InvalidKind);

    /// Loads the defaults with the environment variables `pairs` only.
    pub(crate) fn load(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::load(None, &env(pairs))
    }

    #[test]
    fn shipped_file_gives_the_design_defaults() {
        let settings = Settings::load(None, &env(&[])).unwrap();
        // The core's default fusion suits the built-in embedder; the shipped
        // file's embedder is the static one, and "auto" follows it.
        let static_fusion = crate::core::retrieval::STATIC_LEXICAL_WEIGHT;
        assert_eq!(settings.discovery, DiscoveryConfig { lexical_weight: static_fusion, ..DiscoveryConfig::default() });
        assert_eq!(settings.kpi.alerts, AlertPolicy::default());
        assert_eq!(settings.kpi.window, WindowSpec::new(100, 0).unwrap());
        assert_eq!(settings.kpi.adaptive, AdaptivePolicy::default());
        assert_eq!(settings.planner, PlannerDefaults::default());
        assert_eq!(settings.kpi.scope, ScopeMode::OrganizationPersona);
        assert_eq!(settings.nats.subject_prefix, "capdex.v1");
    }

    #[test]
    fn env_overrides_the_file() {
        let settings = Settings::load(
            None,
            &env(&[
                ("CAPDEX_NATS_URL", "nats://10.0.0.1:4333"),
                ("CAPDEX_DATA_DIR", "/tmp/x"),
                ("CAPDEX_DISCOVERY_TIER1_TOP_K", "7"),
                ("CAPDEX_DISCOVERY_GRAPH_BOOST_FACTOR", "0.2"),
                ("CAPDEX_CAPABILITY_DIRS", "a:b"),
                ("CAPDEX_NATS_SERVER", "/ignored"),
                ("HOME", "/home/ada"),
            ]),
        )
        .unwrap();
        assert_eq!(settings.nats.url, "nats://10.0.0.1:4333");
        assert_eq!(settings.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(settings.discovery.tier1_top_k, 7);
        assert_eq!(settings.discovery.graph_boost_factor, 0.2);
        let dirs = &settings.capability_dirs;
        assert_eq!(dirs[dirs.len() - 2..], [PathBuf::from("a"), PathBuf::from("b")]);
        assert_eq!(dirs[1], PathBuf::from(".capdex/capabilities"));
        assert_eq!(dirs[0], PathBuf::from("/home/ada/.capdex/capabilities"), "~ is the given HOME");
    }

    #[test]
    fn the_chatter_gate_follows_the_embedder_unless_set() {
        let shipped = Settings::load(None, &env(&[])).unwrap();
        assert_eq!(shipped.chatter_gate, ChatterGate::Auto);
        assert!(!shipped.discovery.chatter_gate, "off with the static embedder");
        let http = [
            ("CAPDEX_EMBEDDER_BACKEND", "http"),
            ("CAPDEX_EMBEDDER_ENDPOINT", "http://127.0.0.1:9"),
            ("CAPDEX_EMBEDDER_MODEL", "m"),
        ];
        assert!(Settings::load(None, &env(&http)).unwrap().discovery.chatter_gate, "on with a neural model");
        let off = Settings::load(None, &env(&[http[0], http[1], http[2], ("CAPDEX_DISCOVERY_CHATTER_GATE", "false")]));
        assert!(!off.unwrap().discovery.chatter_gate);
        let on = Settings::load(None, &env(&[("CAPDEX_DISCOVERY_CHATTER_GATE", "true")])).unwrap();
        assert_eq!((on.chatter_gate, on.discovery.chatter_gate), (ChatterGate::Fixed(true), true));
        let file = Settings::load_text("f.toml", Some("[discovery]\nchatter_gate = false\n"), &env(&[])).unwrap();
        assert_eq!(file.chatter_gate, ChatterGate::Fixed(false));
        for bad in ["yes", "0.5"] {
            let err = Settings::load(None, &env(&[("CAPDEX_DISCOVERY_CHATTER_GATE", bad)])).unwrap_err();
            assert!(err.to_string().contains("discovery.chatter_gate"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_tier1_floor_follows_the_embedder_and_the_gate_unless_set() {
        use crate::core::discovery::{GATED_TIER1_MIN_RELEVANCE, TIER1_MIN_RELEVANCE};
        let floor = |pairs: &[(&str, &str)]| Settings::load(None, &env(pairs)).unwrap();
        let http = [
            ("CAPDEX_EMBEDDER_BACKEND", "http"),
            ("CAPDEX_EMBEDDER_ENDPOINT", "http://127.0.0.1:9"),
            ("CAPDEX_EMBEDDER_MODEL", "m"),
        ];
        // The shipped file keeps the design's 0.3 whatever the embedder.
        let shipped = floor(&[]);
        assert_eq!(shipped.tier1_min_relevance, MinRelevance::Fixed(TIER1_MIN_RELEVANCE));
        assert_eq!(floor(&http).discovery.tier1_min_relevance, TIER1_MIN_RELEVANCE);
        let auto =
            |pairs: &[(&str, &str)]| floor(&[pairs, &[("CAPDEX_DISCOVERY_TIER1_MIN_RELEVANCE", "auto")]].concat());
        let shipped = auto(&[]);
        assert_eq!(shipped.tier1_min_relevance, MinRelevance::Auto);
        assert_eq!(shipped.discovery.tier1_min_relevance, TIER1_MIN_RELEVANCE, "the static embedder, no gate");
        assert_eq!(auto(&http).discovery.tier1_min_relevance, GATED_TIER1_MIN_RELEVANCE, "a neural model, gated");
        let ungated = auto(&[http[0], http[1], http[2], ("CAPDEX_DISCOVERY_CHATTER_GATE", "false")]);
        assert_eq!(ungated.discovery.tier1_min_relevance, TIER1_MIN_RELEVANCE, "no gate: the floor keeps chatter out");
        let gated_static = auto(&[("CAPDEX_DISCOVERY_CHATTER_GATE", "true")]);
        assert_eq!(gated_static.discovery.tier1_min_relevance, TIER1_MIN_RELEVANCE, "static relevance is not lower");
        let fixed = floor(&[http[0], http[1], http[2], ("CAPDEX_DISCOVERY_TIER1_MIN_RELEVANCE", "0.25")]);
        assert_eq!((fixed.tier1_min_relevance, fixed.discovery.tier1_min_relevance), (MinRelevance::Fixed(0.25), 0.25));
        // The command line's embedder resolves "auto" again.
        assert_eq!(shipped.discovery_for(EmbedderBackend::Local).tier1_min_relevance, GATED_TIER1_MIN_RELEVANCE);
        assert_eq!(fixed.discovery_for(EmbedderBackend::Static).tier1_min_relevance, 0.25);
        for bad in ["1.5", "-0.1", "NaN", "some"] {
            // "some" is refused by the variable's type, the others by the section.
            let err = Settings::load(None, &env(&[("CAPDEX_DISCOVERY_TIER1_MIN_RELEVANCE", bad)])).unwrap_err();
            assert!(err.to_string().to_lowercase().contains("tier1_min_relevance"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_lexical_weight_follows_the_embedder_unless_set() {
        let shipped = Settings::load(None, &env(&[])).unwrap();
        assert_eq!(shipped.lexical_weight, LexicalWeight::Auto);
        assert_eq!(shipped.discovery.lexical_weight, crate::core::retrieval::STATIC_LEXICAL_WEIGHT);
        let builtin = Settings::load(None, &env(&[("CAPDEX_EMBEDDER_BACKEND", "builtin")])).unwrap();
        assert_eq!(builtin.discovery.lexical_weight, crate::core::retrieval::LEXICAL_WEIGHT);
        let http = Settings::load(
            None,
            &env(&[
                ("CAPDEX_EMBEDDER_BACKEND", "http"),
                ("CAPDEX_EMBEDDER_ENDPOINT", "http://127.0.0.1:9"),
                ("CAPDEX_EMBEDDER_MODEL", "m"),
            ]),
        )
        .unwrap();
        assert_eq!(http.discovery.lexical_weight, crate::core::retrieval::SEMANTIC_LEXICAL_WEIGHT);
        let fixed = Settings::load(
            None,
            &env(&[
                ("CAPDEX_EMBEDDER_BACKEND", "http"),
                ("CAPDEX_EMBEDDER_ENDPOINT", "http://127.0.0.1:9"),
                ("CAPDEX_EMBEDDER_MODEL", "m"),
                ("CAPDEX_DISCOVERY_LEXICAL_WEIGHT", "0.45"),
            ]),
        )
        .unwrap();
        assert_eq!(fixed.lexical_weight, LexicalWeight::Fixed(0.45));
        assert_eq!(fixed.discovery.lexical_weight, 0.45);
        for bad in ["1.5", "-0.1", "NaN", "some"] {
            let err = Settings::load(None, &env(&[("CAPDEX_DISCOVERY_LEXICAL_WEIGHT", bad)])).unwrap_err();
            assert!(err.to_string().contains("discovery.lexical_weight"), "{bad}: {err}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let err = Settings::load(None, &env(&[("CAPDEX_DISCOVERY_TOPK", "3")])).unwrap_err();
        assert!(matches!(err, ConfigError::UnknownEnv { .. }), "{err}");
        let err = Settings::load(None, &env(&[("CAPDEX_DISCOVERY_TIER1_TOP_K", "many")])).unwrap_err();
        assert!(err.to_string().contains("CAPDEX_DISCOVERY_TIER1_TOP_K"), "{err}");
        let err = Settings::load(None, &env(&[("CAPDEX_KPI_ALERT_BELOW_WEIGHTED_SUCCESS_RATE", "nan")])).unwrap_err();
        assert!(err.to_string().contains("kpi.alert_below_weighted_success_rate"), "{err}");
        for (name, value, field) in [
            ("CAPDEX_KPI_ADAPTIVE_MIN_WEIGHTED_SUCCESS_RATE", "NaN", "kpi.adaptive_min_weighted_success_rate"),
            ("CAPDEX_KPI_ADAPTIVE_RECOVER_WEIGHTED_SUCCESS_RATE", "0.5", "kpi.adaptive_recover_weighted_success_rate"),
            ("CAPDEX_KPI_ALERT_BELOW_WEIGHTED_SUCCESS_RATE", "1.5", "kpi.alert_below_weighted_success_rate"),
            ("CAPDEX_KPI_ALERT_MIN_SAMPLES", "0", "kpi.alert_min_samples"),
            ("CAPDEX_KPI_ADAPTIVE_MIN_SAMPLES", "101", "kpi.adaptive_min_samples"),
            ("CAPDEX_KPI_ALERT_COOLDOWN_MS", "99999999999", "kpi.alert_cooldown_ms"),
        ] {
            let err = Settings::load(None, &env(&[(name, value)])).unwrap_err();
            assert!(err.to_string().contains(field), "{name}={value}: {err}");
        }
        let err = Settings::load(None, &env(&[("CAPDEX_KPI_ALERT_BELOW_WEIGHTED_SUCCESS_RATE", "low")])).unwrap_err();
        assert!(err.to_string().contains("CAPDEX_KPI_ALERT_BELOW_WEIGHTED_SUCCESS_RATE"), "{err}");
        let err = Settings::load(None, &env(&[("CAPDEX_PLANNER_DEFAULT_TOOL_FAILURE_MODE", "maybe")])).unwrap_err();
        assert!(err.to_string().contains("maybe"), "{err}");
        let err = Settings::load(None, &env(&[("CAPDEX_DISCOVERY_TIER2_TOP_K", "9")])).unwrap_err();
        assert!(err.to_string().contains("discovery.tier2_top_k"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[discovery]\ntier1_topk = 3\n").unwrap();
        let err = Settings::load(Some(&path), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("tier1_topk"), "{err}");
        std::fs::write(&path, "[kpi]\nscope = \"planet\"\n").unwrap();
        assert!(Settings::load(Some(&path), &env(&[])).is_err());
    }

    #[test]
    fn jetstream_settings_are_validated() {
        let settings = Settings::load(None, &env(&[])).unwrap();
        assert!(settings.jetstream.enabled);
        assert_eq!(settings.jetstream.index_stream, "CAPDEX_INDEX");
        assert_eq!(settings.jetstream.outcome_stream, "CAPDEX_OUTCOMES");
        for (name, value, field) in [
            ("CAPDEX_JETSTREAM_INDEX_STREAM", "A.B", "jetstream.index_stream"),
            ("CAPDEX_JETSTREAM_OUTCOME_STREAM", "CAPDEX_INDEX", "jetstream.outcome_stream"),
            ("CAPDEX_JETSTREAM_NODE_NAME", "a b", "jetstream.node_name"),
            ("CAPDEX_JETSTREAM_REPLICAS", "0", "jetstream.replicas"),
            ("CAPDEX_JETSTREAM_DUPLICATE_WINDOW_MS", "5", "jetstream.duplicate_window_ms"),
            ("CAPDEX_JETSTREAM_OUTCOME_MAX_IN_FLIGHT", "0", "jetstream.outcome_max_in_flight"),
        ] {
            let err = Settings::load(None, &env(&[(name, value)])).unwrap_err();
            assert!(err.to_string().contains(field), "{name}={value}: {err}");
        }
    }

    #[test]
    fn embedder_backends_are_checked_for_what_they_need() {
        let settings = Settings::load(None, &env(&[])).unwrap();
        assert_eq!(settings.embedder.backend, EmbedderBackend::Static);
        assert_eq!(settings.embedder.batch_size, 32);
        let settings = Settings::load(
            None,
            &env(&[
                ("CAPDEX_EMBEDDER_BACKEND", "http"),
                ("CAPDEX_EMBEDDER_ENDPOINT", "http://127.0.0.1:8080"),
                ("CAPDEX_EMBEDDER_MODEL", "all-minilm"),
                ("CAPDEX_EMBEDDER_API_KEY_ENV", "EMBED_KEY"),
            ]),
        )
        .unwrap();
        assert_eq!(settings.embedder.backend, EmbedderBackend::Http);
        assert_eq!(settings.embedder.api_key_env, "EMBED_KEY");
        for (pairs, field) in [
            (vec![("CAPDEX_EMBEDDER_BACKEND", "openai")], "embedder.backend"),
            (vec![("CAPDEX_EMBEDDER_BACKEND", "http")], "embedder.endpoint"),
            (vec![("CAPDEX_EMBEDDER_BACKEND", "http"), ("CAPDEX_EMBEDDER_ENDPOINT", "http://x")], "embedder.model"),
            (vec![("CAPDEX_EMBEDDER_BATCH_SIZE", "0")], "embedder.batch_size"),
            (vec![("CAPDEX_EMBEDDER_API_KEY_ENV", "sk-live-123")], "embedder.api_key_env"),
        ] {
            let err = Settings::load(None, &env(&pairs)).unwrap_err();
            assert!(err.to_string().contains(field), "{pairs:?}: {err}");
        }
        let local = Settings::load(
            None,
            &env(&[("CAPDEX_EMBEDDER_BACKEND", "local"), ("CAPDEX_EMBEDDER_MODEL_DIR", "/models/minilm")]),
        );
        if cfg!(feature = "neural") {
            assert_eq!(local.unwrap().embedder.backend, EmbedderBackend::Local);
        } else {
            let err = local.unwrap_err().to_string();
            assert!(err.contains("built without the `neural` feature"), "{err}");
        }
    }

    #[test]
    fn every_setting_has_an_env_name() {
        let names: Vec<String> = env_names().into_iter().map(|(name, _)| name).collect();
        for expected in
            ["CAPDEX_DATA_DIR", "CAPDEX_NATS_URL", "CAPDEX_KPI_ALERT_COOLDOWN_MS", "CAPDEX_METRICS_LISTEN_ADDR"]
        {
            assert!(names.contains(&expected.to_string()), "{expected}");
        }
    }

    #[test]
    fn nats_credentials_are_one_method_each_complete_and_never_shown() {
        let load = |pairs: &[(&str, &str)]| Settings::load(None, &env(pairs));
        assert_eq!(load(&[]).unwrap().nats.auth, NatsAuth::None);
        let settings = load(&[("CAPDEX_NATS_USER", "capdex"), ("CAPDEX_NATS_PASSWORD", "s3cret-pw")]).unwrap();
        assert_eq!(
            settings.nats.auth,
            NatsAuth::UserPassword {
                user: "capdex".into(),
                password: SecretSource::Value(Secret::new("s3cret-pw".into()))
            }
        );
        assert!(!format!("{settings:?}").contains("s3cret-pw"), "secrets never reach Debug output");
        let settings = load(&[("CAPDEX_NATS_TOKEN_FILE", "/run/secrets/nats-token")]).unwrap();
        assert_eq!(settings.nats.auth, NatsAuth::Token(SecretSource::File("/run/secrets/nats-token".into())));
        let settings =
            load(&[("CAPDEX_NATS_CREDS_FILE", "/etc/capdex.creds"), ("CAPDEX_NATS_URL", "tls://h:4222")]).unwrap();
        assert_eq!(settings.nats.auth, NatsAuth::CredsFile("/etc/capdex.creds".into()));
        assert!(settings.nats.tls.required, "a tls:// URL requires TLS");
        for (pairs, field) in [
            (&[("CAPDEX_NATS_USER", "capdex")][..], "nats.password"),
            (&[("CAPDEX_NATS_PASSWORD", "pw")][..], "nats.user"),
            (&[("CAPDEX_NATS_TOKEN", "t"), ("CAPDEX_NATS_NKEY_SEED", "SU")][..], "nats.user"),
            (&[("CAPDEX_NATS_TOKEN", "t"), ("CAPDEX_NATS_TOKEN_FILE", "/t")][..], "nats.token"),
            (&[("CAPDEX_NATS_TLS_CERT_FILE", "/c.pem")][..], "nats.tls_cert_file"),
        ] {
            match load(pairs) {
                Err(ConfigError::Invalid(InvalidSetting { field: got, .. })) => assert_eq!(got, field, "{pairs:?}"),
                other => panic!("{pairs:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn discovery_workers_default_to_the_cores_and_are_bounded() {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        assert_eq!(Settings::load(None, &env(&[])).unwrap().discovery_workers, cores);
        let three = Settings::load(None, &env(&[("CAPDEX_DISCOVERY_WORKERS", "3")])).unwrap();
        assert_eq!(three.discovery_workers, 3);
        let err = Settings::load(None, &env(&[("CAPDEX_DISCOVERY_WORKERS", "257")])).unwrap_err();
        assert!(err.to_string().contains("discovery.workers"), "{err}");
    }
}
