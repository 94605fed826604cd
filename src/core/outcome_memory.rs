//! Outcome memory: what requests a capability did the job for, kept as the
//! vectors of those requests, and the capability's vector moved towards them.
//!
//! The outcome prior ([`crate::core::outcome_prior`]) says how well a
//! capability does on the whole; it cannot say *for which requests*. The
//! memory keeps, per capability, the sum of the (unit) vectors of the
//! requests it succeeded on ([`OutcomeMemory::remember`]), and gives the
//! capability a vector between its own text's and theirs
//! ([`OutcomeMemory::adapted`]):
//!
//! `v' = normalise(k · v + Σ q_i)`
//!
//! with `v` the capability's own (unit) vector, `q_i` the remembered request
//! vectors and `k` the weight of the capability's own text, counted in
//! requests (the prior's `pseudo_count`: with few outcomes the text decides,
//! with many the requests do). A new request close to past requests the
//! capability succeeded on then meets it in the dense ranking, whatever words
//! its description uses.
//!
//! A capability never seen in an outcome keeps its own vector, so its cosine
//! with every request, and so its relevance, are exactly what they were
//! without the memory: it is never pushed down by it, only overtaken where a
//! remembered capability now fits a request better.

use crate::core::embedder::dot;
use crate::core::index::VectorIndex;
use std::collections::HashMap;

/// The most capabilities remembered; successes of further ones are ignored.
pub const MAX_REMEMBERED_CAPABILITIES: usize = 100_000;

/// Per capability, the sum of the unit vectors of the requests it succeeded on.
#[derive(Clone, Debug, Default)]
pub struct OutcomeMemory {
    dimensions: usize,
    sums: HashMap<String, (Vec<f32>, u32)>,
}

impl OutcomeMemory {
    /// An empty memory for vectors of `dimensions`.
    pub fn new(dimensions: usize) -> OutcomeMemory {
        OutcomeMemory { dimensions, sums: HashMap::new() }
    }

    /// Number of capabilities with at least one remembered request.
    pub fn len(&self) -> usize {
        self.sums.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.sums.is_empty()
    }

    /// Remembers that `capability_id` did the job for the request embedded
    /// as `request`. A vector of another dimension, or a zero one (no dense
    /// signal), is ignored; returns whether it was remembered.
    pub fn remember(&mut self, capability_id: &str, request: &[f32]) -> bool {
        let norm = dot(request, request).sqrt();
        if request.len() != self.dimensions || !norm.is_finite() || norm <= f32::EPSILON {
            return false;
        }
        if !self.sums.contains_key(capability_id) && self.sums.len() >= MAX_REMEMBERED_CAPABILITIES {
            return false;
        }
        let (sum, count) =
            self.sums.entry(capability_id.to_string()).or_insert_with(|| (vec![0.0; self.dimensions], 0));
        for (total, value) in sum.iter_mut().zip(request) {
            *total += value / norm;
        }
        *count += 1;
        true
    }

    /// Number of requests remembered for `capability_id`.
    pub fn count(&self, capability_id: &str) -> u32 {
        self.sums.get(capability_id).map_or(0, |(_, count)| *count)
    }

    /// The vector of `capability_id` moved towards its remembered requests:
    /// `normalise(own_weight · own + Σ q)`, with `own` normalised first;
    /// `None` when nothing is remembered for it (it keeps `own`) or the
    /// dimensions differ.
    pub fn adapted(&self, capability_id: &str, own: &[f32], own_weight: f32) -> Option<Vec<f32>> {
        let (sum, _) = self.sums.get(capability_id)?;
        if own.len() != sum.len() {
            return None;
        }
        let own_norm = dot(own, own).sqrt();
        let scale = if own_norm > f32::EPSILON { own_weight.max(0.0) / own_norm } else { 0.0 };
        let mut moved: Vec<f32> = own.iter().zip(sum).map(|(value, total)| scale * value + total).collect();
        let norm = dot(&moved, &moved).sqrt();
        if norm <= f32::EPSILON {
            return None;
        }
        moved.iter_mut().for_each(|value| *value /= norm);
        Some(moved)
    }

    /// A copy of `vectors` in which every remembered capability has its
    /// [`OutcomeMemory::adapted`] vector and every other row its own.
    pub fn adapt_index(&self, vectors: &VectorIndex, own_weight: f32) -> VectorIndex {
        let mut adapted = VectorIndex::with_capacity(vectors.dimensions(), vectors.len());
        for row in 0..vectors.len() {
            let id = vectors.id(row);
            let Some(own) = vectors.stored_vector(id) else { continue };
            let vector = self.adapted(id, &own, own_weight).unwrap_or(own);
            // Same dimensions as the index it came from, so the upsert cannot fail.
            let _ = adapted.upsert(id, &vector);
        }
        adapted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(values: &[f32]) -> Vec<f32> {
        let norm = dot(values, values).sqrt();
        values.iter().map(|value| value / norm).collect()
    }

    #[test]
    fn remembered_requests_pull_the_vector_and_the_own_text_weighs_as_k_requests() {
        let mut memory = OutcomeMemory::new(2);
        let own = [1.0, 0.0];
        assert_eq!(memory.adapted("a", &own, 5.0), None);
        assert!(memory.remember("a", &[0.0, 3.0]));
        assert_eq!(memory.count("a"), 1);
        // One request against a text worth one request: halfway.
        let half = memory.adapted("a", &own, 1.0).unwrap();
        assert!((half[0] - half[1]).abs() < 1e-6 && (dot(&half, &half) - 1.0).abs() < 1e-5);
        // Worth five requests: the text still leads.
        let leaning = memory.adapted("a", &own, 5.0).unwrap();
        assert!((leaning[0] - unit(&[5.0, 1.0])[0]).abs() < 1e-6);
        // More requests move it further.
        for _ in 0..9 {
            memory.remember("a", &[0.0, 1.0]);
        }
        let moved = memory.adapted("a", &own, 5.0).unwrap();
        assert!(moved[1] > moved[0]);
    }

    #[test]
    fn zero_and_misshapen_vectors_are_not_remembered() {
        let mut memory = OutcomeMemory::new(3);
        assert!(!memory.remember("a", &[0.0, 0.0, 0.0]));
        assert!(!memory.remember("a", &[1.0, 0.0]));
        assert!(!memory.remember("a", &[f32::NAN, 0.0, 1.0]));
        assert!(memory.is_empty());
        assert!(memory.remember("a", &[0.0, 0.0, 2.0]));
        assert_eq!(memory.adapted("a", &[1.0, 0.0], 1.0), None, "another dimension");
    }

    #[test]
    fn an_unseen_capability_keeps_its_vector_and_so_every_cosine() {
        let mut index = VectorIndex::new(2);
        index.upsert("seen", &unit(&[1.0, 0.2])).unwrap();
        index.upsert("unseen", &unit(&[0.3, 1.0])).unwrap();
        let mut memory = OutcomeMemory::new(2);
        memory.remember("seen", &[0.0, 1.0]);
        let adapted = memory.adapt_index(&index, 2.0);
        assert_eq!(adapted.len(), 2);
        for query in [[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]] {
            assert_eq!(adapted.cosine("unseen", &query), index.cosine("unseen", &query));
        }
        let towards = [0.0, 1.0];
        assert!(adapted.cosine("seen", &towards).unwrap() > index.cosine("seen", &towards).unwrap() + 0.2);
    }
}
