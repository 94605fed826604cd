//! Embedder: turns texts into vectors with the configured [`Embed`] model.
//! Runs on a `SyncArbiter` thread, since embedding is CPU work.

use crate::actors::Observe;
use crate::core::embedder::Embed;
use actix::prelude::*;

/// Embeds texts, in order.
#[derive(Message, Debug)]
#[rtype(result = "EmbeddedTexts")]
pub struct EmbedTexts {
    pub texts: Vec<String>,
}

/// Vectors for the texts of an [`EmbedTexts`], and the model that made them.
#[derive(Debug, Clone)]
pub struct EmbeddedTexts {
    pub model_id: String,
    pub vectors: Vec<Vec<f32>>,
}

/// What the embedder has done so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EmbedderStats {
    pub model_id: String,
    pub dimensions: usize,
    pub batches: u64,
    pub texts_embedded: u64,
}

pub struct Embedder {
    model: Box<dyn Embed + Send>,
    stats: EmbedderStats,
}

impl Embedder {
    pub fn new(model: Box<dyn Embed + Send>) -> Embedder {
        let stats =
            EmbedderStats { model_id: model.model_id(), dimensions: model.dimensions(), ..EmbedderStats::default() };
        Embedder { model, stats }
    }
}

impl Actor for Embedder {
    type Context = SyncContext<Self>;
}

impl Handler<EmbedTexts> for Embedder {
    type Result = MessageResult<EmbedTexts>;

    fn handle(&mut self, msg: EmbedTexts, _: &mut SyncContext<Self>) -> Self::Result {
        self.stats.batches += 1;
        self.stats.texts_embedded += msg.texts.len() as u64;
        metrics::counter!("capdex_embedder_texts_total").increment(msg.texts.len() as u64);
        MessageResult(EmbeddedTexts {
            model_id: self.stats.model_id.clone(),
            vectors: self.model.embed_batch(&msg.texts),
        })
    }
}

impl Handler<Observe<EmbedderStats>> for Embedder {
    type Result = MessageResult<Observe<EmbedderStats>>;

    fn handle(&mut self, _: Observe<EmbedderStats>, _: &mut SyncContext<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::embedder::HashingEmbedder;

    #[actix::test]
    async fn embeds_in_order_and_counts() {
        let addr = SyncArbiter::start(1, || Embedder::new(Box::new(HashingEmbedder::new(16).unwrap())));
        let out = addr.send(EmbedTexts { texts: vec!["alpha".into(), "beta".into()] }).await.unwrap();
        assert_eq!(out.vectors.len(), 2);
        assert_eq!(out.vectors[0], HashingEmbedder::new(16).unwrap().embed("alpha"));
        let stats = addr.send(Observe::<EmbedderStats>::new()).await.unwrap();
        assert_eq!((stats.batches, stats.texts_embedded, stats.dimensions), (1, 2, 16));
    }
}
