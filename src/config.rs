//! Configuration: the documented file `config/capdex.toml` (compiled in as the
//! defaults), an optional user file on top, then `CAPDEX_*` environment
//! variables, validated into [`Settings`].
//!
//! Layering happens on TOML values so that an unknown key anywhere is caught
//! by `deny_unknown_fields` and reported with its name.

use crate::core::discovery::DiscoveryConfig;
use crate::core::kpi_window::{AlertPolicy, ScopeMode, ToolSelectionMode, WindowSpec};
use crate::core::outcome_prior::OutcomePriorSettings as PriorSettings;
use crate::core::turn_planner::{AdaptivePolicy, PlannerDefaults, ToolFailureMode};
use crate::sources::manifest_dir::ScanLimits;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The documented default configuration, as shipped in `config/capdex.toml`.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("../config/capdex.toml");

/// Environment variables with the `CAPDEX_` prefix that are not settings.
/// `CAPDEX_TEST_CRASH_AFTER_EXEC` is a test-only hook of the dispatcher (see `actors::dispatcher`).
pub const RESERVED_ENV: &[&str] = &["CAPDEX_CONFIG", "CAPDEX_NATS_SERVER", "CAPDEX_TEST_CRASH_AFTER_EXEC"];

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
    #[error("setting {field} is not valid: {problem}")]
    Invalid { field: String, problem: String },
}

/// The file shape; every field is documented in `config/capdex.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    pub data_dir: PathBuf,
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
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDiscovery {
    pub tier0_token_budget: usize,
    pub tier1_token_budget: usize,
    pub tier2_token_budget: usize,
    pub tier1_top_k: usize,
    pub tier2_top_k: usize,
    pub tier1_min_relevance: f32,
    pub use_graph_reranking: bool,
    pub graph_boost_factor: f32,
    /// `"auto"` or a number in [0, 1] (see [`LexicalWeight`]).
    pub lexical_weight: toml::Value,
    pub outcome_prior: bool,
    pub outcome_prior_strength: f32,
    pub outcome_prior_half_life_ms: u64,
    pub outcome_prior_pseudo_count: f32,
    pub outcome_prior_publish_interval_ms: u64,
    pub workers: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEmbedder {
    pub dimensions: usize,
    pub backend: String,
    pub model_dir: PathBuf,
    pub endpoint: String,
    pub model: String,
    pub api_key_env: String,
    pub batch_size: usize,
    pub timeout_ms: u64,
    pub retries: u32,
}

/// Which embedder turns texts into vectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedderBackend {
    /// The built-in feature-hashing embedder (`core::embedder`): no files, deterministic.
    Builtin,
    /// A local neural model from `model_dir` (needs the `neural` cargo feature).
    Local,
    /// An OpenAI-compatible `/v1/embeddings` endpoint.
    Http,
    /// The compiled-in static token table distilled from all-MiniLM-L6-v2
    /// (`core::static_embedder`): no files, deterministic, semantic.
    Static,
}

impl EmbedderBackend {
    /// Parses `builtin`, `local`, `http` or `static`.
    pub fn parse(text: &str) -> Result<EmbedderBackend, String> {
        match text {
            "builtin" => Ok(EmbedderBackend::Builtin),
            "local" => Ok(EmbedderBackend::Local),
            "http" => Ok(EmbedderBackend::Http),
            "static" => Ok(EmbedderBackend::Static),
            other => Err(format!("must be \"builtin\", \"local\", \"http\" or \"static\", got {other:?}")),
        }
    }
}

impl EmbedderBackend {
    /// The lexical share of fusion that suits this backend's vectors: the
    /// built-in hashing embedder's cosine is lexical itself, a neural model's
    /// is semantic ([`crate::core::retrieval::SEMANTIC_LEXICAL_WEIGHT`]).
    pub fn default_lexical_weight(self) -> f32 {
        match self {
            EmbedderBackend::Builtin => crate::core::retrieval::LEXICAL_WEIGHT,
            EmbedderBackend::Static => crate::core::retrieval::STATIC_LEXICAL_WEIGHT,
            EmbedderBackend::Local | EmbedderBackend::Http => crate::core::retrieval::SEMANTIC_LEXICAL_WEIGHT,
        }
    }
}

/// `[discovery] lexical_weight`: the lexical share of fusion, fixed or
/// following the embedder (`"auto"`, the default).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LexicalWeight {
    Auto,
    Fixed(f32),
}

impl LexicalWeight {
    /// Reads `"auto"` or a number in [0, 1] (also as text, as an environment override gives it).
    pub fn parse(value: &toml::Value) -> Result<LexicalWeight, String> {
        let number = match value {
            toml::Value::String(text) if text.trim() == "auto" => return Ok(LexicalWeight::Auto),
            toml::Value::String(text) => text.trim().parse::<f64>().ok(),
            toml::Value::Float(number) => Some(*number),
            toml::Value::Integer(number) => Some(*number as f64),
            _ => None,
        };
        match number {
            Some(number) if number.is_finite() && (0.0..=1.0).contains(&number) => {
                Ok(LexicalWeight::Fixed(number as f32))
            }
            _ => Err(format!("must be \"auto\" or a number in [0, 1], got {value}")),
        }
    }

    /// The share to use with `backend`.
    pub fn resolve(self, backend: EmbedderBackend) -> f32 {
        match self {
            LexicalWeight::Auto => backend.default_lexical_weight(),
            LexicalWeight::Fixed(weight) => weight,
        }
    }
}

/// The `[embedder]` section, validated for its backend.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedderSettings {
    pub backend: EmbedderBackend,
    /// Dimensions of the built-in embedder.
    pub dimensions: usize,
    pub model_dir: PathBuf,
    pub endpoint: String,
    pub model: String,
    /// Name of the environment variable holding the HTTP bearer key ("" for none).
    pub api_key_env: String,
    pub batch_size: usize,
    pub timeout_ms: u64,
    pub retries: u32,
}

impl EmbedderSettings {
    /// Checks what `backend` needs; the problem names its field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(1..=4096).contains(&self.dimensions) {
            return Err(("embedder.dimensions", format!("must be in 1..=4096, got {}", self.dimensions)));
        }
        if !(1..=2048).contains(&self.batch_size) {
            return Err(("embedder.batch_size", format!("must be in 1..=2048, got {}", self.batch_size)));
        }
        if !(1..=600_000).contains(&self.timeout_ms) {
            return Err(("embedder.timeout_ms", format!("must be in 1..=600000, got {}", self.timeout_ms)));
        }
        if self.retries > 10 {
            return Err(("embedder.retries", format!("must be at most 10, got {}", self.retries)));
        }
        if !self.api_key_env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err((
                "embedder.api_key_env",
                format!("must be the name of an environment variable (letters, digits, _), got {:?}", self.api_key_env),
            ));
        }
        match self.backend {
            EmbedderBackend::Builtin | EmbedderBackend::Static => {}
            EmbedderBackend::Local => {
                if !cfg!(feature = "neural") {
                    return Err((
                        "embedder.backend",
                        "\"local\" needs the neural model, but capdex was built without the `neural` feature \
                         (rebuild with `cargo build --features neural`, or use \"builtin\" or \"http\")"
                            .into(),
                    ));
                }
                if self.model_dir.as_os_str().is_empty() {
                    return Err(("embedder.model_dir", "must name the model folder when backend is \"local\"".into()));
                }
            }
            EmbedderBackend::Http => {
                if !(self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://")) {
                    return Err((
                        "embedder.endpoint",
                        format!("must be an http:// or https:// URL when backend is \"http\", got {:?}", self.endpoint),
                    ));
                }
                if self.model.trim().is_empty() {
                    return Err(("embedder.model", "must name the model when backend is \"http\"".into()));
                }
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNats {
    pub url: String,
    pub subject_prefix: String,
    pub service_name: String,
    pub max_payload_bytes: usize,
    pub drain_timeout_ms: u64,
    pub user: String,
    pub password: String,
    pub password_file: PathBuf,
    pub token: String,
    pub token_file: PathBuf,
    pub nkey_seed: String,
    pub nkey_seed_file: PathBuf,
    pub creds_file: PathBuf,
    pub tls_ca_file: PathBuf,
    pub tls_cert_file: PathBuf,
    pub tls_key_file: PathBuf,
    pub tls_required: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKpi {
    pub rolling_window_size: usize,
    pub scope: ScopeMode,
    pub emit_alerts: bool,
    pub alert_below_weighted_success_rate: f32,
    pub alert_min_samples: usize,
    pub alert_cooldown_ms: u64,
    pub horizon_ms: u64,
    pub adaptive_enabled: bool,
    pub adaptive_min_samples: usize,
    pub adaptive_min_weighted_success_rate: f32,
    pub adaptive_recover_weighted_success_rate: f32,
    pub adaptive_force_all_tools_when_degraded: bool,
    pub adaptive_force_fail_open_when_degraded: bool,
    pub metrics_max_scopes: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlanner {
    pub default_tool_failure_mode: ToolFailureMode,
    pub default_tool_selection_mode: ToolSelectionMode,
    pub discovery_max_retries: u32,
    pub discovery_retry_backoff_ms: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    pub listen_addr: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawScg {
    pub map_path_roots: Vec<PathBuf>,
    pub memory_half_life_ms: u64,
}

/// The Source Capability Graph's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScgSettings {
    /// Folders `capdex.v1.map` may read sources from by path; empty refuses paths.
    pub map_path_roots: Vec<PathBuf>,
    /// Half-life of a memory note's influence, in milliseconds (at least 1).
    pub memory_half_life_ms: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJetStream {
    pub enabled: bool,
    pub index_stream: String,
    pub index_max_age_ms: u64,
    pub outcome_stream: String,
    pub outcome_max_age_ms: u64,
    pub outcome_consumer: String,
    pub events_stream: String,
    pub node_name: String,
    pub replicas: usize,
    pub duplicate_window_ms: u64,
    pub apply_timeout_ms: u64,
    pub outcome_max_in_flight: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDispatch {
    pub default_timeout_ms: u64,
    pub approval_ttl_ms: u64,
    pub binding_mode: String,
    pub rate_window_ms: u64,
    pub ssrf_allowlist: Vec<String>,
}

/// Dispatch settings (`[dispatch]` in config/capdex.toml).
#[derive(Clone, Debug)]
pub struct DispatchSettings {
    pub default_timeout_ms: u64,
    pub approval_ttl_ms: u64,
    pub binding_mode: crate::core::dispatch::pipeline::BindingMode,
    pub rate_window_ms: u64,
    pub ssrf_allowlist: Vec<crate::core::dispatch::ssrf::Cidr>,
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Validated settings; each actor receives only its part.
#[derive(Clone, Debug)]
pub struct Settings {
    pub data_dir: PathBuf,
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
}

#[derive(Clone, Debug)]
pub struct NatsSettings {
    pub url: String,
    pub subject_prefix: String,
    pub service_name: String,
    pub max_payload_bytes: usize,
    pub drain_timeout_ms: u64,
    pub auth: NatsAuth,
    pub tls: NatsTls,
}

/// JetStream: the index mutation log and the outcome stream (see `gateway::jetstream`).
#[derive(Clone, Debug, PartialEq, Eq)]
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

#[derive(Clone, Debug)]
pub struct KpiSettings {
    pub window: WindowSpec,
    pub scope: ScopeMode,
    pub alerts: AlertPolicy,
    pub adaptive: AdaptivePolicy,
    /// The outcome prior's settings (`[discovery] outcome_prior*`).
    pub prior: PriorSettings,
    /// At most one prior is sent to the Router per this many milliseconds (0: after every change).
    pub prior_publish_interval_ms: u64,
    /// Scopes that get per-scope Prometheus gauges (the first ones seen).
    pub metrics_max_scopes: usize,
}

impl Settings {
    /// Loads the defaults, then `file` (if any), then the `CAPDEX_*` variables in `env`.
    pub fn load(file: Option<&Path>, env: &BTreeMap<String, String>) -> Result<Settings, ConfigError> {
        let mut value = parse_toml("(built-in defaults)", DEFAULT_CONFIG_TOML)?;
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
            let user = parse_toml(&path.display().to_string(), &text)?;
            merge(&mut value, user);
        }
        apply_env(&mut value, env)?;
        let raw: RawSettings = value.try_into().map_err(|err: toml::de::Error| ConfigError::Parse {
            path: file.map_or("(environment)".into(), |p| p.display().to_string()),
            message: err.message().to_string(),
        })?;
        Settings::from_raw(raw)
    }

    /// Validates raw settings.
    pub fn from_raw(raw: RawSettings) -> Result<Settings, ConfigError> {
        let invalid = |field: &str, problem: String| ConfigError::Invalid { field: field.to_string(), problem };
        if raw.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty".into()));
        }
        let log_format = match raw.log_format.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => return Err(invalid("log_format", format!("must be \"text\" or \"json\", got {other:?}"))),
        };
        let embedder = EmbedderSettings {
            backend: EmbedderBackend::parse(&raw.embedder.backend)
                .map_err(|problem| invalid("embedder.backend", problem))?,
            dimensions: raw.embedder.dimensions,
            model_dir: raw.embedder.model_dir.clone(),
            endpoint: raw.embedder.endpoint.clone(),
            model: raw.embedder.model.clone(),
            api_key_env: raw.embedder.api_key_env.clone(),
            batch_size: raw.embedder.batch_size,
            timeout_ms: raw.embedder.timeout_ms,
            retries: raw.embedder.retries,
        };
        embedder.validate().map_err(|(field, problem)| invalid(field, problem))?;
        let lexical_weight = LexicalWeight::parse(&raw.discovery.lexical_weight)
            .map_err(|problem| invalid("discovery.lexical_weight", problem))?;
        let discovery = DiscoveryConfig {
            tier0_token_budget: raw.discovery.tier0_token_budget,
            tier1_token_budget: raw.discovery.tier1_token_budget,
            tier2_token_budget: raw.discovery.tier2_token_budget,
            tier1_top_k: raw.discovery.tier1_top_k,
            tier2_top_k: raw.discovery.tier2_top_k,
            tier1_min_relevance: raw.discovery.tier1_min_relevance,
            use_graph_reranking: raw.discovery.use_graph_reranking,
            graph_boost_factor: raw.discovery.graph_boost_factor,
            lexical_weight: lexical_weight.resolve(embedder.backend),
        };
        discovery
            .validate()
            .map_err(|problem| invalid(&format!("discovery.{}", snake(problem.field)), problem.problem))?;
        validate_prefix(&raw.nats.subject_prefix).map_err(|problem| invalid("nats.subject_prefix", problem))?;
        if !(raw.nats.url.starts_with("nats://") || raw.nats.url.starts_with("tls://")) {
            return Err(invalid("nats.url", format!("must start with nats:// or tls://, got {:?}", raw.nats.url)));
        }
        if raw.nats.service_name.is_empty()
            || !raw.nats.service_name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(
                "nats.service_name",
                format!("must be letters, digits, - or _, got {:?}", raw.nats.service_name),
            ));
        }
        let nats_auth_settings = nats_auth(&raw.nats)?;
        let nats_tls_settings = nats_tls(&raw.nats)?;
        if !(1024..=64 * 1024 * 1024).contains(&raw.nats.max_payload_bytes) {
            return Err(invalid(
                "nats.max_payload_bytes",
                format!("must be in 1024..=67108864, got {}", raw.nats.max_payload_bytes),
            ));
        }
        if !(1..=100_000).contains(&raw.kpi.rolling_window_size) {
            return Err(invalid(
                "kpi.rolling_window_size",
                format!("must be in 1..=100000, got {}", raw.kpi.rolling_window_size),
            ));
        }
        let rate = |field: &str, value: f32| {
            if value.is_finite() && (0.0..=1.0).contains(&value) {
                Ok(value)
            } else {
                Err(invalid(field, format!("must be a number in [0, 1], got {value}")))
            }
        };
        let threshold = rate("kpi.alert_below_weighted_success_rate", raw.kpi.alert_below_weighted_success_rate)?;
        let adaptive_min = rate("kpi.adaptive_min_weighted_success_rate", raw.kpi.adaptive_min_weighted_success_rate)?;
        let adaptive_recover =
            rate("kpi.adaptive_recover_weighted_success_rate", raw.kpi.adaptive_recover_weighted_success_rate)?;
        if adaptive_recover < adaptive_min {
            return Err(invalid(
                "kpi.adaptive_recover_weighted_success_rate",
                format!(
                    "must be at least kpi.adaptive_min_weighted_success_rate ({adaptive_min}), got {adaptive_recover}"
                ),
            ));
        }
        for (field, value) in [
            ("kpi.alert_min_samples", raw.kpi.alert_min_samples),
            ("kpi.adaptive_min_samples", raw.kpi.adaptive_min_samples),
        ] {
            if !(1..=raw.kpi.rolling_window_size).contains(&value) {
                return Err(invalid(
                    field,
                    format!("must be in 1..=kpi.rolling_window_size ({}), got {value}", raw.kpi.rolling_window_size),
                ));
            }
        }
        const DAY_MS: u64 = 86_400_000;
        if raw.kpi.alert_cooldown_ms > DAY_MS {
            return Err(invalid(
                "kpi.alert_cooldown_ms",
                format!("must be at most {DAY_MS}, got {}", raw.kpi.alert_cooldown_ms),
            ));
        }
        if raw.kpi.horizon_ms > 365 * DAY_MS {
            return Err(invalid(
                "kpi.horizon_ms",
                format!("must be at most {}, got {}", 365 * DAY_MS, raw.kpi.horizon_ms),
            ));
        }
        if raw.planner.discovery_max_retries > 5 {
            return Err(invalid(
                "planner.discovery_max_retries",
                format!("must be at most 5, got {}", raw.planner.discovery_max_retries),
            ));
        }
        if raw.planner.discovery_retry_backoff_ms > 10_000 {
            return Err(invalid(
                "planner.discovery_retry_backoff_ms",
                format!("must be at most 10000, got {}", raw.planner.discovery_retry_backoff_ms),
            ));
        }
        let prior = PriorSettings {
            enabled: raw.discovery.outcome_prior,
            strength: raw.discovery.outcome_prior_strength,
            half_life_ms: raw.discovery.outcome_prior_half_life_ms,
            pseudo_count: raw.discovery.outcome_prior_pseudo_count,
        };
        prior.validate().map_err(|(field, problem)| invalid(&format!("discovery.{field}"), problem))?;
        if raw.discovery.outcome_prior_publish_interval_ms > 3_600_000 {
            return Err(invalid(
                "discovery.outcome_prior_publish_interval_ms",
                format!("must be at most 3600000, got {}", raw.discovery.outcome_prior_publish_interval_ms),
            ));
        }
        if raw.kpi.metrics_max_scopes > 10_000 {
            return Err(invalid(
                "kpi.metrics_max_scopes",
                format!("must be at most 10000, got {}", raw.kpi.metrics_max_scopes),
            ));
        }
        let window = WindowSpec::new(raw.kpi.rolling_window_size, raw.kpi.horizon_ms)
            .ok_or_else(|| invalid("kpi.rolling_window_size", "must not be 0".into()))?;
        let metrics_listen_addr = match raw.metrics.listen_addr.trim() {
            "" => None,
            text => Some(
                text.parse()
                    .map_err(|err| invalid("metrics.listen_addr", format!("{text:?} is not host:port ({err})")))?,
            ),
        };
        for (field, value) in
            [("max_manifest_bytes", raw.max_manifest_bytes), ("max_attachment_bytes", raw.max_attachment_bytes)]
        {
            if !(1..=64 * 1024 * 1024).contains(&value) {
                return Err(invalid(field, format!("must be in 1..=67108864, got {value}")));
            }
        }
        let jetstream = validate_jetstream(raw.jetstream)?;
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let capability_dirs = raw
            .capability_dirs
            .into_iter()
            .map(|dir| match (dir.strip_prefix("~"), &home) {
                (Ok(rest), Some(home)) => home.join(rest),
                _ => dir,
            })
            .collect();
        if raw.scg.memory_half_life_ms == 0 || raw.scg.memory_half_life_ms > 3650 * DAY_MS {
            return Err(invalid(
                "scg.memory_half_life_ms",
                format!("must be in 1..={}, got {}", 3650 * DAY_MS, raw.scg.memory_half_life_ms),
            ));
        }
        let scg =
            ScgSettings { map_path_roots: raw.scg.map_path_roots, memory_half_life_ms: raw.scg.memory_half_life_ms };
        Ok(Settings {
            data_dir: raw.data_dir,
            capability_dirs,
            scan_limits: ScanLimits {
                max_manifest_bytes: raw.max_manifest_bytes,
                max_attachment_bytes: raw.max_attachment_bytes,
            },
            watch: raw.watch,
            watch_debounce_ms: raw.watch_debounce_ms,
            log: raw.log,
            log_format,
            discovery,
            lexical_weight,
            embedder_dimensions: raw.embedder.dimensions,
            embedder,
            nats: NatsSettings {
                url: raw.nats.url,
                subject_prefix: raw.nats.subject_prefix,
                service_name: raw.nats.service_name,
                max_payload_bytes: raw.nats.max_payload_bytes,
                drain_timeout_ms: raw.nats.drain_timeout_ms,
                auth: nats_auth_settings,
                tls: nats_tls_settings,
            },
            kpi: KpiSettings {
                window,
                scope: raw.kpi.scope,
                alerts: AlertPolicy {
                    enabled: raw.kpi.emit_alerts,
                    below_weighted_success_rate: threshold,
                    min_samples: raw.kpi.alert_min_samples,
                    cooldown_ms: raw.kpi.alert_cooldown_ms,
                },
                adaptive: AdaptivePolicy {
                    enabled: raw.kpi.adaptive_enabled,
                    min_samples: raw.kpi.adaptive_min_samples,
                    min_weighted_success_rate: adaptive_min,
                    recover_weighted_success_rate: adaptive_recover,
                    force_all_tools_when_degraded: raw.kpi.adaptive_force_all_tools_when_degraded,
                    force_fail_open_when_degraded: raw.kpi.adaptive_force_fail_open_when_degraded,
                },
                prior,
                prior_publish_interval_ms: raw.discovery.outcome_prior_publish_interval_ms,
                metrics_max_scopes: raw.kpi.metrics_max_scopes,
            },
            planner: PlannerDefaults {
                tool_failure_mode: raw.planner.default_tool_failure_mode,
                tool_selection_mode: raw.planner.default_tool_selection_mode,
            },
            planner_discovery_max_retries: raw.planner.discovery_max_retries,
            planner_discovery_retry_backoff_ms: raw.planner.discovery_retry_backoff_ms,
            metrics_listen_addr,
            discovery_workers: discovery_workers(raw.discovery.workers)?,
            scg,
            jetstream,
            dispatch: dispatch_settings(&raw.dispatch)?,
        })
    }
}

/// The most discovery worker threads allowed.
pub const MAX_DISCOVERY_WORKERS: usize = 256;

/// `[discovery] workers`: 0 is the available parallelism; at most [`MAX_DISCOVERY_WORKERS`].
fn discovery_workers(workers: usize) -> Result<usize, ConfigError> {
    if workers > MAX_DISCOVERY_WORKERS {
        return Err(ConfigError::Invalid {
            field: "discovery.workers".to_string(),
            problem: format!("must be at most {MAX_DISCOVERY_WORKERS}, got {workers}"),
        });
    }
    Ok(match workers {
        0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        n => n,
    })
}

/// Checks the `[jetstream]` section: names are ADR-6 `restricted-term`s, limits are bounded.
fn validate_jetstream(raw: RawJetStream) -> Result<JetStreamSettings, ConfigError> {
    let invalid = |field: &str, problem: String| ConfigError::Invalid { field: field.to_string(), problem };
    let restricted = |text: &str| text.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    for (field, value) in [
        ("jetstream.index_stream", &raw.index_stream),
        ("jetstream.outcome_stream", &raw.outcome_stream),
        ("jetstream.outcome_consumer", &raw.outcome_consumer),
        ("jetstream.events_stream", &raw.events_stream),
    ] {
        if value.is_empty() || value.len() > 64 || !restricted(value) {
            return Err(invalid(field, format!("must be 1 to 64 letters, digits, - or _, got {value:?}")));
        }
    }
    if raw.index_stream == raw.outcome_stream {
        return Err(invalid("jetstream.outcome_stream", "must differ from jetstream.index_stream".into()));
    }
    if raw.events_stream == raw.index_stream || raw.events_stream == raw.outcome_stream {
        return Err(invalid("jetstream.events_stream", "must differ from the index and outcome streams".into()));
    }
    if raw.node_name.len() > 64 || !restricted(&raw.node_name) {
        return Err(invalid(
            "jetstream.node_name",
            format!("must be at most 64 letters, digits, - or _, got {:?}", raw.node_name),
        ));
    }
    if !(1..=5).contains(&raw.replicas) {
        return Err(invalid("jetstream.replicas", format!("must be in 1..=5, got {}", raw.replicas)));
    }
    const YEAR_MS: u64 = 365 * 86_400_000;
    for (field, value) in
        [("jetstream.index_max_age_ms", raw.index_max_age_ms), ("jetstream.outcome_max_age_ms", raw.outcome_max_age_ms)]
    {
        if value > 10 * YEAR_MS {
            return Err(invalid(field, format!("must be at most {}, got {value}", 10 * YEAR_MS)));
        }
    }
    if !(1_000..=86_400_000).contains(&raw.duplicate_window_ms) {
        return Err(invalid(
            "jetstream.duplicate_window_ms",
            format!("must be in 1000..=86400000, got {}", raw.duplicate_window_ms),
        ));
    }
    if !(100..=600_000).contains(&raw.apply_timeout_ms) {
        return Err(invalid(
            "jetstream.apply_timeout_ms",
            format!("must be in 100..=600000, got {}", raw.apply_timeout_ms),
        ));
    }
    if !(1..=65_536).contains(&raw.outcome_max_in_flight) {
        return Err(invalid(
            "jetstream.outcome_max_in_flight",
            format!("must be in 1..=65536, got {}", raw.outcome_max_in_flight),
        ));
    }
    Ok(JetStreamSettings {
        enabled: raw.enabled,
        index_stream: raw.index_stream,
        index_max_age_ms: raw.index_max_age_ms,
        outcome_stream: raw.outcome_stream,
        outcome_max_age_ms: raw.outcome_max_age_ms,
        outcome_consumer: raw.outcome_consumer,
        events_stream: raw.events_stream,
        node_name: raw.node_name,
        replicas: raw.replicas,
        duplicate_window_ms: raw.duplicate_window_ms,
        apply_timeout_ms: raw.apply_timeout_ms,
        outcome_max_in_flight: raw.outcome_max_in_flight,
    })
}

/// Returns every setting's `CAPDEX_*` variable name with its dotted key.
pub fn env_names() -> Vec<(String, String)> {
    let defaults = parse_toml("(built-in defaults)", DEFAULT_CONFIG_TOML).expect("the built-in config parses");
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

fn parse_toml(origin: &str, text: &str) -> Result<toml::Value, ConfigError> {
    toml::from_str::<toml::Value>(text)
        .map_err(|err| ConfigError::Parse { path: origin.to_string(), message: err.to_string() })
}

fn merge(base: &mut toml::Value, overlay: toml::Value) {
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

fn apply_env(value: &mut toml::Value, env: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    let names: BTreeMap<String, String> = env_names().into_iter().collect();
    for (name, text) in env.iter().filter(|(name, _)| name.starts_with("CAPDEX_")) {
        if RESERVED_ENV.contains(&name.as_str()) {
            continue;
        }
        let key = names.get(name).ok_or_else(|| ConfigError::UnknownEnv { name: name.clone() })?;
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
            name: name.clone(),
            value: text.clone(),
            problem: problem.to_string(),
        };
        let parsed = match table.get(leaf) {
            Some(toml::Value::Integer(_)) => {
                toml::Value::Integer(text.trim().parse().map_err(|_| bad("expected a whole number"))?)
            }
            Some(toml::Value::Float(_)) => {
                toml::Value::Float(text.trim().parse().map_err(|_| bad("expected a number"))?)
            }
            Some(toml::Value::Boolean(_)) => toml::Value::Boolean(match text.trim() {
                "true" | "1" | "yes" => true,
                "false" | "0" | "no" => false,
                _ => return Err(bad("expected true or false")),
            }),
            Some(toml::Value::Array(current)) => {
                let given = std::env::split_paths(text)
                    .filter(|p| !p.as_os_str().is_empty())
                    .map(|p| toml::Value::String(p.display().to_string()));
                // CAPDEX_CAPABILITY_DIRS adds to the configured folders, as documented.
                let mut list = if name == "CAPDEX_CAPABILITY_DIRS" { current.clone() } else { Vec::new() };
                list.extend(given);
                toml::Value::Array(list)
            }
            _ => toml::Value::String(text.clone()),
        };
        table.insert(leaf.to_string(), parsed);
    }
    Ok(())
}

fn dispatch_settings(raw: &RawDispatch) -> Result<DispatchSettings, ConfigError> {
    use crate::core::dispatch::{pipeline::BindingMode, registry, ssrf::Cidr};
    let invalid = |field: &str, problem: String| ConfigError::Invalid { field: field.to_string(), problem };
    if !(1..=registry::MAX_CALL_TIMEOUT_MS).contains(&raw.default_timeout_ms) {
        return Err(invalid(
            "dispatch.default_timeout_ms",
            format!("must be in 1..=600000, got {}", raw.default_timeout_ms),
        ));
    }
    if !(1..=7 * 86_400_000).contains(&raw.approval_ttl_ms) {
        return Err(invalid(
            "dispatch.approval_ttl_ms",
            format!("must be in 1..=604800000, got {}", raw.approval_ttl_ms),
        ));
    }
    if !(1_000..=3_600_000).contains(&raw.rate_window_ms) {
        return Err(invalid(
            "dispatch.rate_window_ms",
            format!("must be in 1000..=3600000, got {}", raw.rate_window_ms),
        ));
    }
    let binding_mode = match raw.binding_mode.as_str() {
        "open" => BindingMode::Open,
        "strict" => BindingMode::Strict,
        other => {
            return Err(invalid("dispatch.binding_mode", format!("must be \"open\" or \"strict\", got {other:?}")))
        }
    };
    let ssrf_allowlist = raw
        .ssrf_allowlist
        .iter()
        .map(|entry| Cidr::parse(entry).map_err(|problem| invalid("dispatch.ssrf_allowlist", problem)))
        .collect::<Result<_, _>>()?;
    Ok(DispatchSettings {
        default_timeout_ms: raw.default_timeout_ms,
        approval_ttl_ms: raw.approval_ttl_ms,
        binding_mode,
        rate_window_ms: raw.rate_window_ms,
        ssrf_allowlist,
    })
}

/// Checks a subject prefix: dot-separated tokens of letters, digits, `-` and `_`.
fn validate_prefix(prefix: &str) -> Result<(), String> {
    let ok = !prefix.is_empty()
        && prefix
            .split('.')
            .all(|token| !token.is_empty() && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    if ok {
        Ok(())
    } else {
        Err(format!("{prefix:?} is not a subject prefix (dot-separated tokens of letters, digits, - or _)"))
    }
}

fn snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, ch) in camel.chars().enumerate() {
        if ch.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    out
}

/// A secret setting (password, token, nkey seed): its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    /// Returns the secret itself; only for handing it to the NATS client.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Where a secret comes from: the setting itself, or a file read at connect time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    Value(Secret),
    File(PathBuf),
}

/// How capdex authenticates to NATS (`[nats]` `user`, `token`, `nkey_seed`, `creds_file`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NatsAuth {
    #[default]
    None,
    UserPassword {
        user: String,
        password: SecretSource,
    },
    Token(SecretSource),
    NkeySeed(SecretSource),
    CredsFile(PathBuf),
}

/// TLS to NATS (`[nats]` `tls_*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatsTls {
    /// PEM CA certificates to trust.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Refuse plain text (also implied by a `tls://` URL).
    pub required: bool,
}

/// Returns `Some(path)` unless the setting is empty.
fn some_path(path: &Path) -> Option<PathBuf> {
    (!path.as_os_str().is_empty()).then(|| path.to_path_buf())
}

/// Validates the `[nats]` authentication keys: at most one method, each complete.
fn nats_auth(raw: &RawNats) -> Result<NatsAuth, ConfigError> {
    let invalid =
        |field: &str, problem: &str| ConfigError::Invalid { field: field.to_string(), problem: problem.into() };
    let secret = |field: &str, value: &str, file: &Path| -> Result<Option<SecretSource>, ConfigError> {
        match (value.is_empty(), some_path(file)) {
            (true, None) => Ok(None),
            (false, None) => Ok(Some(SecretSource::Value(Secret::new(value.to_string())))),
            (true, Some(path)) => Ok(Some(SecretSource::File(path))),
            (false, Some(_)) => Err(invalid(field, "give the secret or its file, not both")),
        }
    };
    let password = secret("nats.password", &raw.password, &raw.password_file)?;
    let token = secret("nats.token", &raw.token, &raw.token_file)?;
    let nkey_seed = secret("nats.nkey_seed", &raw.nkey_seed, &raw.nkey_seed_file)?;
    let creds_file = some_path(&raw.creds_file);
    let user = (!raw.user.is_empty()).then(|| raw.user.clone());
    let methods = [user.is_some() || password.is_some(), token.is_some(), nkey_seed.is_some(), creds_file.is_some()];
    if methods.iter().filter(|set| **set).count() > 1 {
        return Err(invalid("nats.user", "set at most one of user and password, token, nkey seed or creds file"));
    }
    Ok(match (user, password, token, nkey_seed, creds_file) {
        (Some(user), Some(password), ..) => NatsAuth::UserPassword { user, password },
        (Some(_), None, ..) => return Err(invalid("nats.password", "a user needs a password")),
        (None, Some(_), ..) => return Err(invalid("nats.user", "a password needs a user")),
        (_, _, Some(token), ..) => NatsAuth::Token(token),
        (_, _, _, Some(seed), _) => NatsAuth::NkeySeed(seed),
        (.., Some(path)) => NatsAuth::CredsFile(path),
        _ => NatsAuth::None,
    })
}

/// Validates the `[nats]` TLS keys: a client certificate needs its key and the reverse.
fn nats_tls(raw: &RawNats) -> Result<NatsTls, ConfigError> {
    let client_cert = match (some_path(&raw.tls_cert_file), some_path(&raw.tls_key_file)) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err(ConfigError::Invalid {
                field: "nats.tls_cert_file".into(),
                problem: "a client certificate needs its key (tls_key_file) and the reverse".into(),
            })
        }
    };
    Ok(NatsTls {
        ca_file: some_path(&raw.tls_ca_file),
        client_cert,
        required: raw.tls_required || raw.url.starts_with("tls://"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn shipped_file_gives_the_design_defaults() {
        let settings = Settings::load(None, &env(&[])).unwrap();
        assert_eq!(settings.discovery, DiscoveryConfig::default());
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
        assert!(dirs[0].ends_with(".capdex/capabilities") && !dirs[0].starts_with("~"));
    }

    #[test]
    fn the_lexical_weight_follows_the_embedder_unless_set() {
        let builtin = Settings::load(None, &env(&[])).unwrap();
        assert_eq!(builtin.lexical_weight, LexicalWeight::Auto);
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
        assert_eq!(settings.embedder.backend, EmbedderBackend::Builtin);
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
                Err(ConfigError::Invalid { field: got, .. }) => assert_eq!(got, field, "{pairs:?}"),
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
