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
//! Moving towards requests has two parts: towards what a capability's
//! requests ask (its own), and towards how requests are worded at all (every
//! capability's). A capability never seen in an outcome gets the second:
//! its vector moves by the mean displacement of the remembered ones
//! ([`OutcomeMemory::style_shift`]), so it is not sunk merely for having no
//! outcomes, only overtaken where a remembered capability fits a request
//! better.
//!
//! Whether the memory is used at all, and how far it may outweigh a
//! capability's text, is decided on the outcomes as they come
//! ([`crate::core::outcome_trust`]): where it would overtake unseen
//! near-duplicates on their own requests, the trials show the loss and it
//! stays off.

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

    /// The dimension of the vectors remembered.
    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    /// What is remembered for `capability_id`: the sum of its requests'
    /// unit vectors and their number.
    pub fn entry(&self, capability_id: &str) -> Option<(&[f32], u32)> {
        self.sums.get(capability_id).map(|(sum, count)| (sum.as_slice(), *count))
    }

    /// Takes back a kept [`OutcomeMemory::entry`]; one of another dimension,
    /// with a value that is not finite or no request, is refused (returns false).
    pub fn restore(&mut self, capability_id: &str, sum: Vec<f32>, count: u32) -> bool {
        let sound = sum.len() == self.dimensions && count > 0 && sum.iter().all(|value| value.is_finite());
        if !sound || (!self.sums.contains_key(capability_id) && self.sums.len() >= MAX_REMEMBERED_CAPABILITIES) {
            return false;
        }
        self.sums.insert(capability_id.to_string(), (sum, count));
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
        blend(own, own_weight, sum, 1.0)
    }

    /// The mean displacement from a remembered capability's own (unit)
    /// vector to the mean of its requests' vectors, over the remembered
    /// capabilities `vectors` holds, and their mean number of requests;
    /// `None` when none is there.
    pub fn style_shift(&self, vectors: &VectorIndex) -> Option<(Vec<f32>, f32)> {
        let mut shift = vec![0.0f32; self.dimensions];
        let (mut capabilities, mut requests) = (0usize, 0u64);
        for (id, (sum, count)) in &self.sums {
            let Some(own) = vectors.stored_vector(id) else { continue };
            let own_norm = dot(&own, &own).sqrt();
            if own.len() != self.dimensions || own_norm <= f32::EPSILON || *count == 0 {
                continue;
            }
            for ((total, value), request_sum) in shift.iter_mut().zip(&own).zip(sum) {
                *total += request_sum / *count as f32 - value / own_norm;
            }
            capabilities += 1;
            requests += u64::from(*count);
        }
        if capabilities == 0 {
            return None;
        }
        shift.iter_mut().for_each(|value| *value /= capabilities as f32);
        Some((shift, requests as f32 / capabilities as f32))
    }

    /// A copy of `vectors` in which every remembered capability has its
    /// [`OutcomeMemory::adapted`] vector and every other row its own moved
    /// as far towards requests in general as a remembered one moves on
    /// average ([`OutcomeMemory::style_shift`]).
    pub fn adapt_index(&self, vectors: &VectorIndex, own_weight: f32) -> VectorIndex {
        let shift = self.style_shift(vectors);
        let mut adapted = VectorIndex::with_capacity(vectors.dimensions(), vectors.len());
        for row in 0..vectors.len() {
            let id = vectors.id(row);
            let Some(own) = vectors.stored_vector(id) else { continue };
            let vector = match (self.adapted(id, &own, own_weight), &shift) {
                (Some(vector), _) => vector,
                (None, Some((shift, requests))) => unseen_moved(&own, own_weight, shift, *requests).unwrap_or(own),
                (None, None) => own,
            };
            // Same dimensions as the index it came from, so the upsert cannot fail.
            let _ = adapted.upsert(id, &vector);
        }
        adapted
    }
}

/// An unseen capability's vector as if it had `requests` remembered
/// requests whose mean is its own (unit) vector plus `shift`:
/// `normalise(k · v + n · (v + Δ)) = normalise((k + n) · v + n · Δ)`.
/// A capability without a dense signal (a zero vector) keeps it.
fn unseen_moved(own: &[f32], own_weight: f32, shift: &[f32], requests: f32) -> Option<Vec<f32>> {
    if dot(own, own) <= f32::EPSILON {
        return None;
    }
    blend(own, own_weight.max(0.0) + requests, shift, requests)
}

/// `normalise(own_weight · own / |own| + towards_weight · towards)`; `None`
/// when the dimensions differ or the result is zero.
fn blend(own: &[f32], own_weight: f32, towards: &[f32], towards_weight: f32) -> Option<Vec<f32>> {
    if own.len() != towards.len() {
        return None;
    }
    let own_norm = dot(own, own).sqrt();
    let scale = if own_norm > f32::EPSILON { own_weight.max(0.0) / own_norm } else { 0.0 };
    let mut moved: Vec<f32> =
        own.iter().zip(towards).map(|(value, toward)| scale * value + towards_weight * toward).collect();
    let norm = dot(&moved, &moved).sqrt();
    if !norm.is_finite() || norm <= f32::EPSILON {
        return None;
    }
    moved.iter_mut().for_each(|value| *value /= norm);
    Some(moved)
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
    fn an_unseen_capability_moves_as_far_towards_requests_as_the_remembered_on_average() {
        // Requests lean towards the third axis whatever they ask for (their style);
        // "seen" was remembered with one, "unseen" never.
        let mut index = VectorIndex::new(3);
        index.upsert("seen", &[1.0, 0.0, 0.0]).unwrap();
        index.upsert("unseen", &[0.0, 1.0, 0.0]).unwrap();
        let mut memory = OutcomeMemory::new(3);
        memory.remember("seen", &unit(&[1.0, 0.0, 1.0]));
        let (shift, requests) = memory.style_shift(&index).unwrap();
        assert_eq!(requests, 1.0);
        let expected = [unit(&[1.0, 0.0, 1.0])[0] - 1.0, 0.0, unit(&[1.0, 0.0, 1.0])[2]];
        for (got, want) in shift.iter().zip(expected) {
            assert!((got - want).abs() < 1e-3, "{shift:?}");
        }
        let adapted = memory.adapt_index(&index, 2.0);
        assert_eq!(adapted.len(), 2);
        // A request for the unseen capability, in the requests' style: both moved alike,
        // so the unseen one gains on it as much as the seen one gains on its own.
        let for_unseen = unit(&[0.0, 1.0, 1.0]);
        let for_seen = unit(&[1.0, 0.0, 1.0]);
        let gain = |id: &str, query: &[f32]| adapted.cosine(id, query).unwrap() - index.cosine(id, query).unwrap();
        assert!(gain("unseen", &for_unseen) > 0.1);
        assert!((gain("unseen", &for_unseen) - gain("seen", &for_seen)).abs() < 0.02);
        assert!(adapted.cosine("unseen", &for_unseen).unwrap() > adapted.cosine("seen", &for_unseen).unwrap());
    }

    #[test]
    fn with_nothing_remembered_every_vector_stays() {
        let mut index = VectorIndex::new(2);
        index.upsert("a", &unit(&[1.0, 0.2])).unwrap();
        let adapted = OutcomeMemory::new(2).adapt_index(&index, 5.0);
        assert_eq!(adapted.stored_vector("a"), index.stored_vector("a"));
    }

    #[test]
    fn an_unseen_capability_without_a_dense_signal_keeps_its_zero_vector() {
        let mut index = VectorIndex::new(2);
        index.upsert("seen", &[1.0, 0.0]).unwrap();
        index.upsert("silent", &[0.0, 0.0]).unwrap();
        let mut memory = OutcomeMemory::new(2);
        memory.remember("seen", &[0.0, 1.0]);
        let adapted = memory.adapt_index(&index, 1.0);
        assert_eq!(adapted.stored_vector("silent"), index.stored_vector("silent"));
    }
}
