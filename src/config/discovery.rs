//! The `[discovery]` section: tier budgets and fusion ([`DiscoveryConfig`]),
//! the lexical weight, the outcome prior and the discovery worker threads.

use super::embedder::EmbedderBackend;
use super::error::{at_most, InvalidKind, InvalidSetting};
use crate::core::discovery::{DiscoveryConfig, GATED_TIER1_MIN_RELEVANCE, TIER1_MIN_RELEVANCE};
use crate::core::outcome_prior::OutcomePriorSettings;
use serde::Deserialize;

/// `[discovery]` as written; every key is documented in `config/capdex.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDiscovery {
    pub tier0_token_budget: usize,
    pub tier1_token_budget: usize,
    pub tier2_token_budget: usize,
    pub tier1_top_k: usize,
    pub tier2_top_k: usize,
    /// `"auto"` or a number in [0, 1] (see [`MinRelevance`]).
    pub tier1_min_relevance: toml::Value,
    pub use_graph_reranking: bool,
    pub graph_boost_factor: f32,
    /// `"auto"` or a number in [0, 1] (see [`LexicalWeight`]).
    pub lexical_weight: toml::Value,
    /// `"auto"`, `true` or `false` (see [`ChatterGate`]).
    pub chatter_gate: toml::Value,
    pub outcome_prior: bool,
    pub outcome_prior_strength: f32,
    pub outcome_prior_half_life_ms: u64,
    pub outcome_prior_pseudo_count: f32,
    pub outcome_prior_publish_interval_ms: u64,
    pub outcome_learning: bool,
    pub outcome_learning_turns: usize,
    pub outcome_learning_max_capabilities: usize,
    pub outcome_learning_refit_interval_ms: u64,
    pub workers: usize,
}

/// `[discovery] outcome_learning*`: the outcome learner (`actors::outcome_learner`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutcomeLearningSettings {
    pub enabled: bool,
    /// Turns whose message is kept for their outcome.
    pub turns: usize,
    /// Above this many capabilities nothing is learnt nor used.
    pub max_capabilities: usize,
    /// The memory's vectors are fitted again at most this often (as more is learnt).
    pub refit_interval_ms: u64,
}

/// The most turns `outcome_learning_turns` may keep.
const MAX_LEARNING_TURNS: usize = 1_000_000;
/// The largest catalog `outcome_learning_max_capabilities` may allow: the
/// learner keeps four fitted copies of the vector index.
const MAX_LEARNING_CAPABILITIES: usize = 1_000_000;

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
        Ok(auto_or_unit(value)?.map_or(LexicalWeight::Auto, LexicalWeight::Fixed))
    }

    /// The share to use with `backend`.
    pub fn resolve(self, backend: EmbedderBackend) -> f32 {
        match self {
            LexicalWeight::Auto => backend.default_lexical_weight(),
            LexicalWeight::Fixed(weight) => weight,
        }
    }
}

/// Reads `"auto"` (`None`) or a number in [0, 1], also as text (as an environment override gives it).
fn auto_or_unit(value: &toml::Value) -> Result<Option<f32>, String> {
    let number = match value {
        toml::Value::String(text) if text.trim() == "auto" => return Ok(None),
        toml::Value::String(text) => text.trim().parse::<f64>().ok(),
        toml::Value::Float(number) => Some(*number),
        toml::Value::Integer(number) => Some(*number as f64),
        _ => None,
    };
    match number {
        Some(number) if number.is_finite() && (0.0..=1.0).contains(&number) => Ok(Some(number as f32)),
        _ => Err(format!("must be \"auto\" or a number in [0, 1], got {value}")),
    }
}

/// `[discovery] tier1_min_relevance`: the relevance a Tier 1 capability
/// needs, fixed (the shipped file's 0.3, the design's default) or following
/// the embedder and the chatter gate (`"auto"`): [`GATED_TIER1_MIN_RELEVANCE`]
/// with a neural model whose chatter gate is on, [`TIER1_MIN_RELEVANCE`] otherwise.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MinRelevance {
    Auto,
    Fixed(f32),
}

impl MinRelevance {
    /// Reads `"auto"` or a number in [0, 1] (also as text, as an environment override gives it).
    pub fn parse(value: &toml::Value) -> Result<MinRelevance, String> {
        Ok(auto_or_unit(value)?.map_or(MinRelevance::Auto, MinRelevance::Fixed))
    }

    /// The floor to use with `backend` when the chatter gate is `gate_on`.
    pub fn resolve(self, backend: EmbedderBackend, gate_on: bool) -> f32 {
        match self {
            // The backends that are not in process are the neural models (`local`, `http`).
            MinRelevance::Auto if gate_on && !backend.is_in_process() => GATED_TIER1_MIN_RELEVANCE,
            MinRelevance::Auto => TIER1_MIN_RELEVANCE,
            MinRelevance::Fixed(floor) => floor,
        }
    }
}

/// `config` with the three `[discovery]` settings that may follow the
/// embedder (`"auto"`: lexical weight, chatter gate, Tier 1 floor) as written
/// in `auto`, resolved for `backend`: at load for the configured embedder,
/// and again for one chosen on the command line (`Settings::discovery_for`).
pub fn resolve_auto(
    config: DiscoveryConfig,
    auto: (LexicalWeight, ChatterGate, MinRelevance),
    backend: EmbedderBackend,
) -> DiscoveryConfig {
    let (lexical_weight, chatter_gate, tier1_min_relevance) = auto;
    let gate_on = chatter_gate.resolve(backend);
    DiscoveryConfig {
        lexical_weight: lexical_weight.resolve(backend),
        chatter_gate: gate_on,
        tier1_min_relevance: tier1_min_relevance.resolve(backend, gate_on),
        ..config
    }
}

/// `[discovery] chatter_gate`: whether a request no nearer its best
/// capabilities than chatter gets an empty Tier 1
/// (`core::discovery::asks_for_nothing`), fixed or following the embedder
/// (`"auto"`, the default: on with a neural model, whose cosines tell chatter
/// from requests; off with the static and built-in embedders, where it would
/// cost answerable requests their Tier 1; `docs/performance.md`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ChatterGate {
    Auto,
    Fixed(bool),
}

impl ChatterGate {
    /// Reads `"auto"`, `true` or `false` (also as text, as an environment override gives it).
    pub fn parse(value: &toml::Value) -> Result<ChatterGate, String> {
        match value {
            toml::Value::Boolean(on) => Ok(ChatterGate::Fixed(*on)),
            toml::Value::String(text) => match text.trim() {
                "auto" => Ok(ChatterGate::Auto),
                "true" => Ok(ChatterGate::Fixed(true)),
                "false" => Ok(ChatterGate::Fixed(false)),
                _ => Err(format!("must be \"auto\", true or false, got {value}")),
            },
            _ => Err(format!("must be \"auto\", true or false, got {value}")),
        }
    }

    /// Whether the gate is on with `backend`.
    pub fn resolve(self, backend: EmbedderBackend) -> bool {
        match self {
            // The backends that are not in process are the neural models (`local`, `http`).
            ChatterGate::Auto => !backend.is_in_process(),
            ChatterGate::Fixed(on) => on,
        }
    }
}

/// The most discovery worker threads allowed.
pub const MAX_DISCOVERY_WORKERS: usize = 256;

/// The longest `outcome_prior_publish_interval_ms` (an hour).
const MAX_PRIOR_PUBLISH_INTERVAL_MS: u64 = 3_600_000;

/// The `[discovery]` section, validated; [`super::Settings`] spreads it over its fields.
#[derive(Clone, Debug, PartialEq)]
pub struct DiscoverySection {
    /// With `lexical_weight` resolved for the embedder.
    pub config: DiscoveryConfig,
    /// `lexical_weight` as written.
    pub lexical_weight: LexicalWeight,
    /// `chatter_gate` as written.
    pub chatter_gate: ChatterGate,
    /// `tier1_min_relevance` as written.
    pub tier1_min_relevance: MinRelevance,
    /// The outcome prior (`outcome_prior*`), which the KPI actor keeps.
    pub prior: OutcomePriorSettings,
    pub prior_publish_interval_ms: u64,
    pub learning: OutcomeLearningSettings,
    /// Worker threads, 0 resolved to the available parallelism.
    pub workers: usize,
}

impl DiscoverySection {
    /// Checks the section; `backend` decides what `lexical_weight = "auto"` means.
    pub fn from_raw(raw: RawDiscovery, backend: EmbedderBackend) -> Result<DiscoverySection, InvalidSetting> {
        let lexical_weight = LexicalWeight::parse(&raw.lexical_weight)
            .map_err(|problem| InvalidSetting::out_of_range("discovery.lexical_weight", problem))?;
        let chatter_gate = ChatterGate::parse(&raw.chatter_gate)
            .map_err(|problem| InvalidSetting::out_of_range("discovery.chatter_gate", problem))?;
        let tier1_min_relevance = MinRelevance::parse(&raw.tier1_min_relevance)
            .map_err(|problem| InvalidSetting::out_of_range("discovery.tier1_min_relevance", problem))?;
        let config = resolve_auto(
            DiscoveryConfig {
                tier0_token_budget: raw.tier0_token_budget,
                tier1_token_budget: raw.tier1_token_budget,
                tier2_token_budget: raw.tier2_token_budget,
                tier1_top_k: raw.tier1_top_k,
                tier2_top_k: raw.tier2_top_k,
                // These three are set by `resolve_auto` from what is written.
                tier1_min_relevance: TIER1_MIN_RELEVANCE,
                use_graph_reranking: raw.use_graph_reranking,
                graph_boost_factor: raw.graph_boost_factor,
                lexical_weight: backend.default_lexical_weight(),
                chatter_gate: false,
            },
            (lexical_weight, chatter_gate, tier1_min_relevance),
            backend,
        );
        config.validate().map_err(|problem| {
            // The one relation between two keys; every other check is a bound.
            let kind = if problem.field == "tier2TopK" { InvalidKind::Conflict } else { InvalidKind::OutOfRange };
            InvalidSetting::new(format!("discovery.{}", snake(problem.field)), kind, problem.problem)
        })?;
        let prior = OutcomePriorSettings {
            enabled: raw.outcome_prior,
            strength: raw.outcome_prior_strength,
            half_life_ms: raw.outcome_prior_half_life_ms,
            pseudo_count: raw.outcome_prior_pseudo_count,
        };
        prior
            .validate()
            .map_err(|(field, problem)| InvalidSetting::out_of_range(format!("discovery.{field}"), problem))?;
        let prior_publish_interval_ms = at_most(
            "discovery.outcome_prior_publish_interval_ms",
            raw.outcome_prior_publish_interval_ms,
            MAX_PRIOR_PUBLISH_INTERVAL_MS,
        )?;
        let learning = OutcomeLearningSettings {
            enabled: raw.outcome_learning,
            turns: at_most("discovery.outcome_learning_turns", raw.outcome_learning_turns, MAX_LEARNING_TURNS)?,
            max_capabilities: at_most(
                "discovery.outcome_learning_max_capabilities",
                raw.outcome_learning_max_capabilities,
                MAX_LEARNING_CAPABILITIES,
            )?,
            refit_interval_ms: at_most(
                "discovery.outcome_learning_refit_interval_ms",
                raw.outcome_learning_refit_interval_ms,
                MAX_PRIOR_PUBLISH_INTERVAL_MS,
            )?,
        };
        let workers = match at_most("discovery.workers", raw.workers, MAX_DISCOVERY_WORKERS)? {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            n => n,
        };
        Ok(DiscoverySection {
            config,
            lexical_weight,
            chatter_gate,
            tier1_min_relevance,
            prior,
            prior_publish_interval_ms,
            learning,
            workers,
        })
    }
}

/// `tier1TopK` → `tier1_top_k`: the core names fields as the wire does, the file in snake case.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{defaults, load, Case};

    fn check(edit: impl FnOnce(&mut RawDiscovery)) -> Result<DiscoverySection, InvalidSetting> {
        let mut raw = defaults().discovery;
        edit(&mut raw);
        DiscoverySection::from_raw(raw, EmbedderBackend::Builtin)
    }

    #[test]
    fn the_defaults_are_the_design_defaults() {
        let section = check(|_| {}).unwrap();
        assert_eq!(section.config, DiscoveryConfig::default());
        assert_eq!(section.lexical_weight, LexicalWeight::Auto);
        assert!(section.prior.enabled);
        assert_eq!(section.prior_publish_interval_ms, 1000);
        let auto = |backend| DiscoverySection::from_raw(defaults().discovery, backend).unwrap().config.lexical_weight;
        assert_eq!(auto(EmbedderBackend::Static), crate::core::retrieval::STATIC_LEXICAL_WEIGHT);
        assert_eq!(auto(EmbedderBackend::Http), crate::core::retrieval::SEMANTIC_LEXICAL_WEIGHT);
        let fixed = check(|raw| raw.lexical_weight = toml::Value::Float(0.25)).unwrap();
        assert_eq!((fixed.lexical_weight, fixed.config.lexical_weight), (LexicalWeight::Fixed(0.25), 0.25));
        assert_eq!(check(|raw| raw.workers = 7).unwrap().workers, 7);
    }

    #[test]
    fn each_invalid_value_names_its_key_and_kind() {
        use InvalidKind::*;
        let cases: Vec<Case<RawDiscovery>> = vec![
            (
                Box::new(|r| r.lexical_weight = toml::Value::String("lots".into())),
                "discovery.lexical_weight",
                OutOfRange,
            ),
            (Box::new(|r| r.lexical_weight = toml::Value::Float(1.5)), "discovery.lexical_weight", OutOfRange),
            (Box::new(|r| r.tier1_top_k = 0), "discovery.tier1_top_k", OutOfRange),
            (Box::new(|r| r.tier2_top_k = 9), "discovery.tier2_top_k", Conflict),
            (Box::new(|r| r.tier0_token_budget = 2_000_000), "discovery.tier0_token_budget", OutOfRange),
            (
                Box::new(|r| r.tier1_min_relevance = toml::Value::Float(f64::NAN)),
                "discovery.tier1_min_relevance",
                OutOfRange,
            ),
            (Box::new(|r| r.graph_boost_factor = 2.0), "discovery.graph_boost_factor", OutOfRange),
            (Box::new(|r| r.outcome_prior_strength = 0.6), "discovery.outcome_prior_strength", OutOfRange),
            (Box::new(|r| r.outcome_prior_half_life_ms = 0), "discovery.outcome_prior_half_life_ms", OutOfRange),
            (Box::new(|r| r.outcome_prior_pseudo_count = 0.0), "discovery.outcome_prior_pseudo_count", OutOfRange),
            (
                Box::new(|r| r.outcome_prior_publish_interval_ms = 3_600_001),
                "discovery.outcome_prior_publish_interval_ms",
                OutOfRange,
            ),
            (Box::new(|r| r.workers = MAX_DISCOVERY_WORKERS + 1), "discovery.workers", OutOfRange),
        ];
        for (edit, field, kind) in cases {
            let err = check(edit).unwrap_err();
            assert_eq!((err.field.as_str(), err.kind), (field, kind), "{err}");
        }
    }

    #[test]
    fn the_environment_overrides_the_section() {
        let settings =
            load(&[("CAPDEX_DISCOVERY_TIER2_TOP_K", "1"), ("CAPDEX_DISCOVERY_LEXICAL_WEIGHT", "0.5")]).unwrap();
        assert_eq!(settings.discovery.tier2_top_k, 1);
        assert_eq!(settings.lexical_weight, LexicalWeight::Fixed(0.5));
    }

    #[test]
    fn snake_case_follows_the_file() {
        assert_eq!(snake("tier1TopK"), "tier1_top_k");
        assert_eq!(snake("graphBoostFactor"), "graph_boost_factor");
    }
}
