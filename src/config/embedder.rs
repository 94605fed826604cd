//! The `[embedder]` section: which backend makes the vectors, and what it needs.

use super::error::{at_most, in_range, unit_rate, InvalidKind, InvalidSetting};
pub use crate::core::embedder::Pooling;
use serde::Deserialize;
use std::path::PathBuf;

/// `[embedder]` as written; every key is documented in `config/capdex.toml`.
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
    pub pooling: String,
    pub query_prefix: String,
    pub document_prefix: String,
    pub static_share: f32,
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

    /// Whether the backend is pure computation, cheap enough for every
    /// discovery thread to embed its queries itself (no model to load per
    /// thread, no service to call): the built-in and the static embedders.
    pub fn is_in_process(self) -> bool {
        matches!(self, EmbedderBackend::Builtin | EmbedderBackend::Static)
    }

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
    /// The local model's pooling when its folder has no `1_Pooling/config.json`.
    pub pooling: Pooling,
    /// Put in front of every request before it is embedded (local and http).
    pub query_prefix: String,
    /// Put in front of every capability's text before it is embedded (local and http).
    pub document_prefix: String,
    /// The compiled-in static table's share of every cosine beside a neural
    /// model (local and http; `core::static_share`), 0 for none.
    pub static_share: f32,
}

impl EmbedderSettings {
    /// Parses the backend and checks the section.
    pub fn from_raw(raw: RawEmbedder) -> Result<EmbedderSettings, InvalidSetting> {
        let backend = EmbedderBackend::parse(&raw.backend)
            .map_err(|problem| InvalidSetting::new("embedder.backend", InvalidKind::UnknownChoice, problem))?;
        let pooling = Pooling::parse(&raw.pooling)
            .map_err(|problem| InvalidSetting::new("embedder.pooling", InvalidKind::UnknownChoice, problem))?;
        let settings = EmbedderSettings {
            backend,
            pooling,
            query_prefix: raw.query_prefix,
            document_prefix: raw.document_prefix,
            static_share: raw.static_share,
            dimensions: raw.dimensions,
            model_dir: raw.model_dir,
            endpoint: raw.endpoint,
            model: raw.model,
            api_key_env: raw.api_key_env,
            batch_size: raw.batch_size,
            timeout_ms: raw.timeout_ms,
            retries: raw.retries,
        };
        settings.validate()?;
        Ok(settings)
    }

    /// Checks what `backend` needs (also after command-line flags changed it).
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        in_range("embedder.dimensions", self.dimensions, 1..=4096)?;
        in_range("embedder.batch_size", self.batch_size, 1..=2048)?;
        in_range("embedder.timeout_ms", self.timeout_ms, 1..=600_000)?;
        at_most("embedder.retries", self.retries, 10)?;
        unit_rate("embedder.static_share", self.static_share)?;
        for (field, prefix) in
            [("embedder.query_prefix", &self.query_prefix), ("embedder.document_prefix", &self.document_prefix)]
        {
            at_most(field, prefix.len(), 1024)?;
        }
        if !self.api_key_env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(InvalidSetting::new(
                "embedder.api_key_env",
                InvalidKind::Malformed,
                format!("must be the name of an environment variable (letters, digits, _), got {:?}", self.api_key_env),
            ));
        }
        match self.backend {
            EmbedderBackend::Builtin | EmbedderBackend::Static => {}
            EmbedderBackend::Local => {
                if !cfg!(feature = "neural") {
                    return Err(InvalidSetting::new(
                        "embedder.backend",
                        InvalidKind::Unsupported,
                        "\"local\" needs the neural model, but capdex was built without the `neural` feature \
                         (rebuild with `cargo build --features neural`, or use \"builtin\" or \"http\")",
                    ));
                }
                if self.model_dir.as_os_str().is_empty() {
                    return Err(InvalidSetting::new(
                        "embedder.model_dir",
                        InvalidKind::Incomplete,
                        "must name the model folder when backend is \"local\"",
                    ));
                }
            }
            EmbedderBackend::Http => {
                if !(self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://")) {
                    return Err(InvalidSetting::new(
                        "embedder.endpoint",
                        InvalidKind::Incomplete,
                        format!("must be an http:// or https:// URL when backend is \"http\", got {:?}", self.endpoint),
                    ));
                }
                if self.model.trim().is_empty() {
                    return Err(InvalidSetting::new(
                        "embedder.model",
                        InvalidKind::Incomplete,
                        "must name the model when backend is \"http\"",
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{defaults, load, Case};

    fn check(edit: impl FnOnce(&mut RawEmbedder)) -> Result<EmbedderSettings, InvalidSetting> {
        let mut raw = defaults().embedder;
        edit(&mut raw);
        EmbedderSettings::from_raw(raw)
    }

    #[test]
    fn the_defaults_are_the_static_embedder() {
        let settings = check(|_| {}).unwrap();
        assert_eq!((settings.backend, settings.dimensions, settings.batch_size), (EmbedderBackend::Static, 512, 32));
        assert_eq!(settings.static_share, crate::core::static_share::DEFAULT_STATIC_SHARE);
        let http = check(|raw| {
            raw.backend = "http".into();
            raw.endpoint = "https://e.example".into();
            raw.model = "m".into();
        })
        .unwrap();
        assert_eq!(http.backend, EmbedderBackend::Http);
        assert_eq!(check(|raw| raw.backend = "static".into()).unwrap().backend, EmbedderBackend::Static);
        assert_eq!(
            (settings.pooling, settings.query_prefix.as_str(), settings.document_prefix.as_str()),
            (Pooling::Mean, "", "")
        );
        let bge = check(|raw| {
            raw.pooling = "cls".into();
            raw.query_prefix = "Represent this sentence for searching relevant passages: ".into();
        })
        .unwrap();
        assert_eq!(bge.pooling, Pooling::Cls);
        assert!(bge.query_prefix.starts_with("Represent"));
    }

    #[test]
    fn each_invalid_value_names_its_key_and_kind() {
        use InvalidKind::*;
        let cases: Vec<Case<RawEmbedder>> = vec![
            (Box::new(|r| r.backend = "openai".into()), "embedder.backend", UnknownChoice),
            (Box::new(|r| r.dimensions = 0), "embedder.dimensions", OutOfRange),
            (Box::new(|r| r.dimensions = 4097), "embedder.dimensions", OutOfRange),
            (Box::new(|r| r.batch_size = 2049), "embedder.batch_size", OutOfRange),
            (Box::new(|r| r.timeout_ms = 0), "embedder.timeout_ms", OutOfRange),
            (Box::new(|r| r.retries = 11), "embedder.retries", OutOfRange),
            (Box::new(|r| r.api_key_env = "sk-live".into()), "embedder.api_key_env", Malformed),
            (Box::new(|r| r.pooling = "sum".into()), "embedder.pooling", UnknownChoice),
            (Box::new(|r| r.query_prefix = "q".repeat(1025)), "embedder.query_prefix", OutOfRange),
            (Box::new(|r| r.document_prefix = "d".repeat(1025)), "embedder.document_prefix", OutOfRange),
            (Box::new(|r| r.static_share = 1.5), "embedder.static_share", OutOfRange),
            (Box::new(|r| r.static_share = f32::NAN), "embedder.static_share", OutOfRange),
            (Box::new(|r| r.backend = "http".into()), "embedder.endpoint", Incomplete),
            (
                Box::new(|r| {
                    r.backend = "http".into();
                    r.endpoint = "http://x".into();
                    r.model = " ".into();
                }),
                "embedder.model",
                Incomplete,
            ),
        ];
        for (edit, field, kind) in cases {
            let err = check(edit).unwrap_err();
            assert_eq!((err.field.as_str(), err.kind), (field, kind), "{err}");
        }
        let local = check(|r| r.backend = "local".into());
        if cfg!(feature = "neural") {
            assert_eq!(local.unwrap_err().field, "embedder.model_dir");
        } else {
            assert_eq!(local.unwrap_err().kind, Unsupported);
        }
    }

    #[test]
    fn the_environment_overrides_the_section() {
        let settings = load(&[
            ("CAPDEX_EMBEDDER_BATCH_SIZE", "64"),
            ("CAPDEX_EMBEDDER_RETRIES", "0"),
            ("CAPDEX_EMBEDDER_POOLING", "max"),
            ("CAPDEX_EMBEDDER_QUERY_PREFIX", "query: "),
        ])
        .unwrap();
        assert_eq!((settings.embedder.batch_size, settings.embedder.retries), (64, 0));
        assert_eq!((settings.embedder.pooling, settings.embedder.query_prefix.as_str()), (Pooling::Max, "query: "));
    }
}
