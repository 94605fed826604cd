//! A neural model's vectors with the compiled-in static table's beside them
//! (`[embedder] static_share`).
//!
//! The static table ([`crate::core::static_embedder`]) was distilled from
//! all-MiniLM-L6-v2 over 450,000 sentences of software and tool language and
//! everyday English, and holds 17,257 whole words of that language that
//! WordPiece models read only as pieces ("factorial", "playlist",
//! "cryptocurrency"). Beside a neural model
//! (`local`, `http`) it is a second, differently built opinion of the same
//! texts, and the two together rank better than the model alone on every dev
//! set with both models measured (`docs/performance.md`, "The static table
//! beside a neural model").
//!
//! Each text's vector is the model's unit vector scaled by `√(1 − share)`
//! followed by the table's unit vector scaled by `√share`: still a unit vector
//! (when both parts are), and a dot product of two such vectors is
//! `(1 − share) · model cosine + share · table cosine`, so the vector index,
//! its quantisation and every cosine-based rule work on them unchanged. A part
//! that is the zero vector (a text neither knows) stays zero.

use crate::core::embedder::{Embed, EmbedError};
use crate::core::static_embedder::{StaticEmbedder, MODEL_ID as STATIC_MODEL_ID};

/// The table's share of the dense cosine as shipped (`config/capdex.toml`):
/// with a lexical share of 0.35, both all-MiniLM-L6-v2 and all-mpnet-base-v2
/// gained on all three dev sets at 0.2 against the model alone at 0.4 (the
/// neural lexical share is now 0.325, [`crate::core::retrieval::SEMANTIC_LEXICAL_WEIGHT`]).
pub const DEFAULT_STATIC_SHARE: f32 = 0.2;

/// `inner`'s vectors with the static table's beside them, the table taking
/// `share` of every cosine (see the module docs).
pub struct WithStaticTable<E> {
    inner: E,
    share: f32,
    model_id: String,
}

impl<E: Embed> WithStaticTable<E> {
    /// Wraps `inner`; `share` is clamped to [0, 1].
    pub fn new(inner: E, share: f32) -> WithStaticTable<E> {
        let share = if share.is_finite() { share.clamp(0.0, 1.0) } else { 0.0 };
        let model_id = joined_model_id(&inner.model_id(), share);
        WithStaticTable { inner, share, model_id }
    }
}

/// The model id of `model_id`'s vectors joined with the table's at `share`:
/// names both, so vectors stored with another model, table or share are never reused.
pub fn joined_model_id(model_id: &str, share: f32) -> String {
    format!("{model_id}+{STATIC_MODEL_ID}@{share:.3}")
}

/// Joins a model's vectors of `texts` (in order) with the table's vectors of
/// the same texts: `(√(1 − share) · m̂, √share · t̂)`, each part normalised first.
pub fn join(texts: &[String], model_vectors: Vec<Vec<f32>>, share: f32) -> Vec<Vec<f32>> {
    let table = StaticEmbedder::new();
    let (model_weight, table_weight) = ((1.0 - share).sqrt(), share.sqrt());
    texts
        .iter()
        .zip(model_vectors)
        .map(|(text, model_vector)| {
            let table_vector = table.embed(text);
            let mut joined = Vec::with_capacity(model_vector.len() + table_vector.len());
            push_scaled(&mut joined, &model_vector, model_weight);
            push_scaled(&mut joined, &table_vector, table_weight);
            joined
        })
        .collect()
}

/// Appends `vector` normalised to length `weight` (the zero vector as zeros).
fn push_scaled(out: &mut Vec<f32>, vector: &[f32], weight: f32) {
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
    let scale = if norm > 0.0 { weight / norm } else { 0.0 };
    out.extend(vector.iter().map(|v| v * scale));
}

impl<E: Embed> Embed for WithStaticTable<E> {
    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    /// The model's dimensions and the table's; 0 while the model's are unknown
    /// (a remote model before its first answer).
    fn dimensions(&self) -> usize {
        match self.inner.dimensions() {
            0 => 0,
            model => model + StaticEmbedder::new().dimensions(),
        }
    }

    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(join(texts, self.inner.embed_batch(texts)?, self.share))
    }

    fn embed_queries(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(join(texts, self.inner.embed_queries(texts)?, self.share))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::embedder::{EmbedErrorCode, HashingEmbedder, Prefixed};
    use proptest::prelude::*;

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn texts(items: &[&str]) -> Vec<String> {
        items.iter().map(|text| text.to_string()).collect()
    }

    proptest! {
        #[test]
        fn a_dot_product_is_the_weighted_sum_of_both_cosines(
            a in "[a-z ]{1,40}", b in "[a-z ]{1,40}", share in 0.0f32..=1.0,
        ) {
            let model = HashingEmbedder::new(64).unwrap();
            let joined = WithStaticTable::new(model, share);
            let pair = texts(&[&a, &b]);
            let both = joined.embed_batch(&pair).unwrap();
            let m = model.embed_batch(&pair);
            let t = StaticEmbedder::new().embed_batch(&pair).unwrap();
            let expected = (1.0 - share) * dot(&m[0], &m[1]) + share * dot(&t[0], &t[1]);
            prop_assert!((dot(&both[0], &both[1]) - expected).abs() < 1e-4, "{} vs {expected}", dot(&both[0], &both[1]));
            prop_assert_eq!(both[0].len(), 64 + StaticEmbedder::new().dimensions());
        }
    }

    #[test]
    fn vectors_are_unit_length_and_a_text_neither_knows_stays_zero() {
        let joined = WithStaticTable::new(HashingEmbedder::new(32).unwrap(), 0.2);
        let vectors = joined.embed_batch(&texts(&["book a flight to Paris", "", "   "])).unwrap();
        assert!((dot(&vectors[0], &vectors[0]) - 1.0).abs() < 1e-5);
        assert!(vectors[1].iter().chain(&vectors[2]).all(|v| *v == 0.0));
    }

    #[test]
    fn queries_go_through_the_model_s_own_query_path() {
        let prefixed = Prefixed::new(HashingEmbedder::new(32).unwrap(), "flights ", "");
        let joined = WithStaticTable::new(prefixed, 0.5);
        let text = texts(&["hotel in Rome"]);
        assert_ne!(joined.embed_queries(&text).unwrap(), joined.embed_batch(&text).unwrap());
    }

    #[test]
    fn the_model_id_names_the_model_the_table_and_the_share() {
        let model = HashingEmbedder::new(32).unwrap();
        let id = WithStaticTable::new(model, 0.2).model_id();
        assert_eq!(id, format!("{}+{STATIC_MODEL_ID}@0.200", model.model_id()));
        assert_ne!(WithStaticTable::new(model, 0.25).model_id(), id);
        assert_eq!(WithStaticTable::new(model, f32::NAN).share, 0.0);
    }

    struct Unknown;

    impl Embed for Unknown {
        fn model_id(&self) -> String {
            "remote".into()
        }
        fn dimensions(&self) -> usize {
            0
        }
        fn embed_batch(&self, _: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
            Err(EmbedError::new(EmbedErrorCode::Unavailable, "down"))
        }
    }

    #[test]
    fn a_model_s_failure_and_unknown_dimensions_pass_through() {
        let joined = WithStaticTable::new(Unknown, 0.2);
        assert_eq!(joined.dimensions(), 0);
        assert_eq!(joined.embed("a").unwrap_err().code, EmbedErrorCode::Unavailable);
    }
}
