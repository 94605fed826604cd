//! Embedder: turns texts into vectors with the configured [`Embed`] model.
//! Runs on a `SyncArbiter` thread, since embedding is CPU work (or, for the
//! HTTP backend, a blocking request). Texts go to the model in batches of at
//! most `batch_size` (32 by default), whatever the backend. A failure is
//! answered, not hidden: the reply carries the typed [`EmbedError`].

use crate::actors::Inspect;
use crate::core::embedder::{embed_in_batches_as, Embed, EmbedError, TextRole, DEFAULT_BATCH_SIZE};
use actix::prelude::*;

/// Embeds texts, in order, as capabilities' texts or as requests (`role`).
#[derive(Message, Debug)]
#[rtype(result = "EmbeddedTexts")]
pub struct EmbedTexts {
    pub texts: Vec<String>,
    pub role: TextRole,
}

/// Vectors for the texts of an [`EmbedTexts`] (or why there are none), and the model asked.
#[derive(Debug, Clone)]
pub struct EmbeddedTexts {
    pub model_id: String,
    /// The model's dimension as far as known (0: not known yet).
    pub dimensions: usize,
    pub vectors: Result<Vec<Vec<f32>>, EmbedError>,
}

/// What the embedder has done so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EmbedderStats {
    pub model_id: String,
    pub dimensions: usize,
    /// Requests made to the model (each at most `batch_size` texts).
    pub batches: u64,
    pub texts_embedded: u64,
    /// Messages that got an error instead of vectors.
    pub failures: u64,
    pub last_error: Option<EmbedError>,
}

pub struct Embedder {
    model: Box<dyn Embed + Send>,
    batch_size: usize,
    stats: EmbedderStats,
}

impl Embedder {
    pub fn new(model: Box<dyn Embed + Send>) -> Embedder {
        let stats =
            EmbedderStats { model_id: model.model_id(), dimensions: model.dimensions(), ..EmbedderStats::default() };
        Embedder { model, batch_size: DEFAULT_BATCH_SIZE, stats }
    }

    /// Sends at most `batch_size` texts (at least 1) to the model at a time.
    pub fn with_batch_size(mut self, batch_size: usize) -> Embedder {
        self.batch_size = batch_size.max(1);
        self
    }
}

impl Actor for Embedder {
    type Context = SyncContext<Self>;
}

impl Handler<EmbedTexts> for Embedder {
    type Result = MessageResult<EmbedTexts>;

    fn handle(&mut self, msg: EmbedTexts, _: &mut SyncContext<Self>) -> Self::Result {
        self.stats.batches += msg.texts.len().div_ceil(self.batch_size) as u64;
        let vectors = embed_in_batches_as(self.model.as_ref(), &msg.texts, self.batch_size, msg.role);
        match &vectors {
            Ok(_) => {
                self.stats.texts_embedded += msg.texts.len() as u64;
                metrics::counter!("capdex_embedder_texts_total").increment(msg.texts.len() as u64);
            }
            Err(err) => {
                self.stats.failures += 1;
                self.stats.last_error = Some(err.clone());
                metrics::counter!("capdex_embedder_failures_total").increment(1);
                tracing::warn!(code = %err.code, message = %err.message, texts = msg.texts.len(), "embedding failed");
            }
        }
        self.stats.dimensions = self.model.dimensions();
        MessageResult(EmbeddedTexts {
            model_id: self.stats.model_id.clone(),
            dimensions: self.stats.dimensions,
            vectors,
        })
    }
}

impl Handler<Inspect<EmbedderStats>> for Embedder {
    type Result = MessageResult<Inspect<EmbedderStats>>;

    fn handle(&mut self, _: Inspect<EmbedderStats>, _: &mut SyncContext<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::embedder::{EmbedErrorCode, HashingEmbedder};
    use crate::embedders::backend::FailingEmbedder;

    #[actix::test]
    async fn embeds_in_order_and_counts() {
        let addr = SyncArbiter::start(1, || Embedder::new(Box::new(HashingEmbedder::new(16).unwrap())));
        let out = addr
            .send(EmbedTexts { texts: vec!["alpha".into(), "beta".into()], role: TextRole::Document })
            .await
            .unwrap();
        let vectors = out.vectors.unwrap();
        assert_eq!(vectors.len(), 2);
        assert_eq!(vectors[0], HashingEmbedder::new(16).unwrap().embed("alpha"));
        let stats = addr.send(Inspect::<EmbedderStats>::new()).await.unwrap();
        assert_eq!((stats.batches, stats.texts_embedded, stats.dimensions), (1, 2, 16));
    }

    #[actix::test]
    async fn requests_are_embedded_as_queries_and_capabilities_as_documents() {
        use crate::core::embedder::Prefixed;
        let model = || Prefixed::new(HashingEmbedder::new(64).unwrap(), "find a tool to ", "a tool that can ");
        let addr = SyncArbiter::start(1, move || Embedder::new(Box::new(model())));
        let hashing = HashingEmbedder::new(64).unwrap();
        for (role, prefix) in [(TextRole::Query, "find a tool to "), (TextRole::Document, "a tool that can ")] {
            let out = addr.send(EmbedTexts { texts: vec!["book flights".into()], role }).await.unwrap();
            assert_eq!(out.vectors.unwrap(), vec![hashing.embed(&format!("{prefix}book flights"))], "{role:?}");
        }
    }

    #[actix::test]
    async fn batches_hold_at_most_batch_size_texts() {
        let addr =
            SyncArbiter::start(1, || Embedder::new(Box::new(HashingEmbedder::new(8).unwrap())).with_batch_size(32));
        let texts: Vec<String> = (0..65).map(|i| format!("text {i}")).collect();
        let out = addr.send(EmbedTexts { texts, role: TextRole::Query }).await.unwrap();
        assert_eq!(out.vectors.unwrap().len(), 65);
        let stats = addr.send(Inspect::<EmbedderStats>::new()).await.unwrap();
        assert_eq!(stats.batches, 3);
    }

    #[actix::test]
    async fn failures_are_answered_with_their_error() {
        let addr = SyncArbiter::start(1, || {
            Embedder::new(Box::new(FailingEmbedder {
                model_id: "remote".into(),
                error: EmbedError::new(EmbedErrorCode::Unavailable, "connection refused"),
            }))
        });
        let out = addr.send(EmbedTexts { texts: vec!["a".into()], role: TextRole::Document }).await.unwrap();
        assert_eq!(out.model_id, "remote");
        assert_eq!(out.vectors.unwrap_err().code, EmbedErrorCode::Unavailable);
        let stats = addr.send(Inspect::<EmbedderStats>::new()).await.unwrap();
        assert_eq!(stats.failures, 1);
    }
}
