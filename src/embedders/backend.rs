//! Builds the configured embedder: `builtin`, `local`, `http` or `static` (see the
//! `[embedder]` section of `config/capdex.toml`).
//!
//! The local neural model is wired through a small adapter that turns its
//! errors into [`EmbedError`]s; without the `neural` feature, `local` is a
//! configuration error (the settings refuse it first).

use crate::config::{EmbedderBackend, EmbedderSettings};
use crate::core::embedder::{Embed, EmbedError, EmbedErrorCode, HashingEmbedder, Prefixed};
use crate::core::static_embedder::StaticEmbedder;
use crate::core::static_share::WithStaticTable;
use crate::embedders::http::{HttpEmbedder, HttpEmbedderConfig};
use std::time::Duration;

/// A boxed embedder the Embedder actor can own on its thread.
pub type BoxedEmbedder = Box<dyn Embed + Send>;

/// Builds the embedder `settings` select: a neural model (`local`, `http`) with
/// the static table beside it at `static_share` ([`static_share`]). No request
/// is made and no vector computed, so an unreachable endpoint is not an error
/// here (embedding is best effort); a missing key variable or model folder is.
pub fn build(settings: &EmbedderSettings) -> Result<BoxedEmbedder, EmbedError> {
    build_with_env(settings, |name| std::env::var(name).ok())
}

/// [`build`] reading environment variables through `env` (for tests).
pub fn build_with_env(
    settings: &EmbedderSettings,
    env: impl Fn(&str) -> Option<String>,
) -> Result<BoxedEmbedder, EmbedError> {
    let model = build_model_with_env(settings, env)?;
    Ok(match static_share(settings) {
        Some(share) => Box::new(WithStaticTable::new(model, share)),
        None => model,
    })
}

/// The static table's share beside the configured model: `Some` for a neural
/// model (`local`, `http`) with `static_share` above 0, `None` otherwise.
pub fn static_share(settings: &EmbedderSettings) -> Option<f32> {
    let neural = matches!(settings.backend, EmbedderBackend::Local | EmbedderBackend::Http);
    (neural && settings.static_share > 0.0).then_some(settings.static_share)
}

/// The configured model alone, without the static table beside it (`capdex
/// eval` caches the model's vectors, then joins them with the table's).
pub fn build_model(settings: &EmbedderSettings) -> Result<BoxedEmbedder, EmbedError> {
    build_model_with_env(settings, |name| std::env::var(name).ok())
}

fn build_model_with_env(
    settings: &EmbedderSettings,
    env: impl Fn(&str) -> Option<String>,
) -> Result<BoxedEmbedder, EmbedError> {
    let config_error = |message: String| EmbedError::new(EmbedErrorCode::Config, message);
    settings.validate().map_err(|err| config_error(format!("{} {}", err.field, err.problem)))?;
    match settings.backend {
        EmbedderBackend::Builtin => HashingEmbedder::new(settings.dimensions)
            .map(|embedder| Box::new(embedder) as BoxedEmbedder)
            .ok_or_else(|| config_error("embedder.dimensions must be positive".into())),
        EmbedderBackend::Http => {
            let api_key = match settings.api_key_env.as_str() {
                "" => None,
                name => Some(env(name).filter(|key| !key.is_empty()).ok_or_else(|| {
                    config_error(format!("embedder.api_key_env names {name}, but that environment variable is not set"))
                })?),
            };
            let config = HttpEmbedderConfig {
                api_key,
                batch_size: settings.batch_size,
                timeout: Duration::from_millis(settings.timeout_ms),
                retries: settings.retries,
                ..HttpEmbedderConfig::new(&settings.endpoint, &settings.model)
            };
            Ok(prefixed(Box::new(HttpEmbedder::new(config)?), settings))
        }
        EmbedderBackend::Local => local(settings).map(|model| prefixed(model, settings)),
        EmbedderBackend::Static => Ok(Box::new(StaticEmbedder::new())),
    }
}

/// `model` with the configured query and document prefixes in front of its texts
/// (itself, id included, when both are empty).
fn prefixed(model: BoxedEmbedder, settings: &EmbedderSettings) -> BoxedEmbedder {
    if settings.query_prefix.is_empty() && settings.document_prefix.is_empty() {
        return model;
    }
    Box::new(Prefixed::new(model, settings.query_prefix.clone(), settings.document_prefix.clone()))
}

#[cfg(feature = "neural")]
fn local(settings: &EmbedderSettings) -> Result<BoxedEmbedder, EmbedError> {
    let model =
        crate::embedders::neural::NeuralEmbedder::load_with(&settings.model_dir, settings.pooling).map_err(|err| {
            EmbedError::new(
                EmbedErrorCode::Config,
                format!("cannot load the model in {}: {err}", settings.model_dir.display()),
            )
        })?;
    Ok(Box::new(model))
}

#[cfg(not(feature = "neural"))]
fn local(_: &EmbedderSettings) -> Result<BoxedEmbedder, EmbedError> {
    Err(EmbedError::new(
        EmbedErrorCode::Config,
        "embedder.backend \"local\" needs capdex built with the `neural` feature (cargo build --features neural)",
    ))
}

/// An embedder that always fails with the same error: stands in for one that
/// could not be rebuilt, so the rest of capdex keeps answering lexically.
#[derive(Clone, Debug)]
pub struct FailingEmbedder {
    pub model_id: String,
    pub error: EmbedError,
}

impl Embed for FailingEmbedder {
    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    fn dimensions(&self) -> usize {
        0
    }

    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        Err(self.error.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn settings(backend: EmbedderBackend) -> EmbedderSettings {
        EmbedderSettings {
            backend,
            dimensions: 64,
            model_dir: PathBuf::new(),
            endpoint: "http://127.0.0.1:9".into(),
            model: "m".into(),
            api_key_env: String::new(),
            batch_size: 32,
            timeout_ms: 1000,
            retries: 0,
            pooling: crate::config::Pooling::Mean,
            query_prefix: String::new(),
            document_prefix: String::new(),
            static_share: 0.0,
        }
    }

    #[test]
    fn builds_each_backend_from_settings() {
        let builtin = build(&settings(EmbedderBackend::Builtin)).unwrap();
        assert_eq!(builtin.model_id(), "capdex-hashing-v2-64");
        assert_eq!(builtin.embed("web search").unwrap(), HashingEmbedder::new(64).unwrap().embed("web search"));
        let http = build(&settings(EmbedderBackend::Http)).unwrap();
        assert_eq!(http.model_id(), "openai-compatible:http://127.0.0.1:9/v1/embeddings#m");
        assert_eq!(http.dimensions(), 0);
        let mut with_prefix = settings(EmbedderBackend::Http);
        with_prefix.query_prefix = "query: ".into();
        let http_prefixed = build(&with_prefix).unwrap();
        assert!(
            http_prefixed.model_id().starts_with(&format!("{}+prefix-", http.model_id())),
            "{}",
            http_prefixed.model_id()
        );
        let distilled = build(&settings(EmbedderBackend::Static)).unwrap();
        assert_eq!(distilled.model_id(), crate::core::static_embedder::MODEL_ID);
        assert_eq!(distilled.embed("web search").unwrap(), StaticEmbedder::new().embed("web search"));
    }

    #[test]
    fn a_neural_model_gets_the_static_table_beside_it_at_its_share() {
        let mut http = settings(EmbedderBackend::Http);
        http.static_share = 0.2;
        let alone = build_model(&http).unwrap().model_id();
        assert_eq!(build(&http).unwrap().model_id(), crate::core::static_share::joined_model_id(&alone, 0.2));
        assert_eq!(static_share(&http), Some(0.2));
        http.static_share = 0.0;
        assert_eq!((build(&http).unwrap().model_id(), static_share(&http)), (alone, None));
        for backend in [EmbedderBackend::Static, EmbedderBackend::Builtin] {
            let mut in_process = settings(backend);
            in_process.static_share = 0.2;
            assert_eq!(static_share(&in_process), None, "{backend:?}");
            assert_eq!(build(&in_process).unwrap().model_id(), build_model(&in_process).unwrap().model_id());
        }
    }

    #[test]
    fn a_missing_key_variable_is_a_config_error() {
        let mut with_key = settings(EmbedderBackend::Http);
        with_key.api_key_env = "CAPDEX_TEST_EMBED_KEY".into();
        let err = build_with_env(&with_key, |_| None).err().unwrap();
        assert_eq!(err.code, EmbedErrorCode::Config);
        assert!(err.message.contains("CAPDEX_TEST_EMBED_KEY"), "{err}");
        assert!(build_with_env(&with_key, |_| Some("k".into())).is_ok());
    }

    #[cfg(not(feature = "neural"))]
    #[test]
    fn local_without_the_feature_says_so() {
        let mut local = settings(EmbedderBackend::Local);
        local.model_dir = "/models/minilm".into();
        let err = build(&local).err().unwrap();
        assert_eq!(err.code, EmbedErrorCode::Config);
        assert!(err.message.contains("neural"), "{err}");
    }

    #[test]
    fn the_failing_embedder_fails_only_with_texts() {
        let failing =
            FailingEmbedder { model_id: "x".into(), error: EmbedError::new(EmbedErrorCode::Unavailable, "down") };
        assert!(failing.embed_batch(&[]).unwrap().is_empty());
        assert_eq!(failing.embed("a").unwrap_err().code, EmbedErrorCode::Unavailable);
    }
}
