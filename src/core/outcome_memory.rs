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
//! The mean is not enough where an unseen capability has a near-duplicate
//! that was remembered (another server's copy of the same tool, a renamed
//! version): the copy moved towards *its* requests, which are worded as the
//! unseen one's would be, and overtakes it on them. So an unseen capability
//! moves as its near neighbours moved ([`Neighbourhood`]): a kernel estimate
//! of the displacement, each remembered capability whose own vector is within
//! cosine `c ≥ τ` ([`NEIGHBOUR_COSINE`]) weighing `w = (c − τ) / (1 − τ)`;
//! with `W = Σ w`, the neighbours' weighted mean displacement takes a share
//! `min(W, 1)` and the mean displacement of all the rest. The number of
//! requests it is moved as if it had is mixed the same way. A capability with
//! no near remembered neighbour moves exactly as before; one whose twin was
//! remembered moves with it.
//!
//! The memory also keeps the words of those requests
//! ([`OutcomeMemory::remember_words`]): per capability, each index term and
//! the number of its requests that held it. The words held by at least
//! [`MIN_WORD_REQUESTS`] of them are its learned words
//! ([`OutcomeMemory::learned_words`]), a field of its own in the lexical
//! index the memory's learnings rank with
//! ([`crate::core::lexical::LexicalIndex::build_learned`]): users' words for
//! what it does, which its description may never use (document expansion
//! from a query log). One request's words are not enough: "weather in
//! Berlin" teaches a weather tool "weather", and "Berlin" only once another
//! request of it names the city too; a word of one request alone would lift
//! the tool on every request that shares it, above capabilities no outcome
//! named.
//!
//! Whether the memory is used at all, and how far it may outweigh a
//! capability's text, is decided on the outcomes as they come
//! ([`crate::core::outcome_trust`]): where it would overtake unseen
//! near-duplicates on their own requests, the trials show the loss and it
//! stays off.

use crate::core::embedder::dot;
use crate::core::id_table::IdTable;
use crate::core::index::VectorIndex;
use crate::core::lexical::LearnedWords;
use crate::core::outcome_prior::NearDuplicates;
use std::collections::HashMap;

/// The most capabilities remembered; successes of further ones are ignored.
pub const MAX_REMEMBERED_CAPABILITIES: usize = 100_000;

/// The cosine of two capabilities' own vectors from which one moves with the
/// other ([`Neighbourhood`]): near-duplicates and versions of one tool, not
/// tools of one topic. Measured with `static` and all-MiniLM-L6-v2 (the
/// held-out set's unseen requests, docs/performance.md).
pub const NEIGHBOUR_COSINE: f32 = 0.8;

/// The most near neighbours one remembered capability moves (the nearest).
pub const MAX_NEIGHBOURS: usize = 64;

/// The most remembered capabilities whose near neighbours are looked for,
/// the most remembered first: each costs one pass over the vector index, so
/// this bounds what a new catalog costs the learner. Unseen neighbours of the
/// rest move by the mean displacement alone, as with no neighbour.
pub const MAX_NEIGHBOUR_SOURCES: usize = 1024;

/// Requests of a capability that must hold a word before it is one of its
/// learned words ([`OutcomeMemory::learned_words`]; module docs).
pub const MIN_WORD_REQUESTS: u32 = 2;

/// The most distinct words kept per capability. When a new word finds them
/// all kept, the words only one request held are forgotten first; if every
/// kept word was held by more, the new one is not kept.
pub const MAX_WORDS_PER_CAPABILITY: usize = 64;

/// The longest word kept, in bytes: a longer "word" (an id, a hash, a
/// pasted blob: requests may carry up to a megabyte) names no tool's use.
pub const MAX_WORD_BYTES: usize = 48;

/// The most words kept over all capabilities (each a word of at most
/// [`MAX_WORD_BYTES`] and its count: at most about 80 MB); past it, new
/// words are not kept, those kept go on counting.
pub const MAX_WORDS: usize = 1 << 20;

/// Per capability, the sum of the unit vectors of the requests it succeeded
/// on, and their words.
#[derive(Clone, Debug)]
pub struct OutcomeMemory {
    dimensions: usize,
    sums: HashMap<String, (Vec<f32>, u32)>,
    /// Per remembered capability: each word of its requests and how many held it, in the order first seen.
    words: HashMap<String, Vec<(String, u32)>>,
    /// Words kept over all capabilities, and the most that may be ([`MAX_WORDS`]).
    word_count: usize,
    word_budget: usize,
}

impl OutcomeMemory {
    /// An empty memory for vectors of `dimensions`.
    pub fn new(dimensions: usize) -> OutcomeMemory {
        OutcomeMemory::with_word_budget(dimensions, MAX_WORDS)
    }

    /// [`OutcomeMemory::new`] keeping at most `word_budget` words in all.
    pub fn with_word_budget(dimensions: usize, word_budget: usize) -> OutcomeMemory {
        OutcomeMemory { dimensions, sums: HashMap::new(), words: HashMap::new(), word_count: 0, word_budget }
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

    /// Remembers the words of one request `capability_id` did the job for:
    /// its index terms (the lexical index's
    /// [`crate::core::text::index_terms`]: lower-cased,
    /// stop words dropped, stemmed), each distinct one counted once; only for a
    /// capability whose request [`OutcomeMemory::remember`] took, and within
    /// [`MAX_WORDS_PER_CAPABILITY`], [`MAX_WORD_BYTES`] and [`MAX_WORDS`].
    pub fn remember_words(&mut self, capability_id: &str, words: &[String]) {
        if !self.sums.contains_key(capability_id) {
            return;
        }
        let kept = self.words.entry(capability_id.to_string()).or_default();
        // A set, not a scan: a request of a megabyte may hold a hundred thousand words.
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for word in words {
            if word.is_empty() || word.len() > MAX_WORD_BYTES || !seen.insert(word.as_str()) {
                continue;
            }
            if let Some((_, requests)) = kept.iter_mut().find(|(kept, _)| kept == word) {
                *requests = requests.saturating_add(1);
                continue;
            }
            // Full here: its once-seen words make room (under the overall bound, a new word just waits).
            if kept.len() >= MAX_WORDS_PER_CAPABILITY {
                let before = kept.len();
                kept.retain(|&(_, requests)| requests > 1);
                self.word_count -= before - kept.len();
            }
            if kept.len() < MAX_WORDS_PER_CAPABILITY && self.word_count < self.word_budget {
                kept.push((word.clone(), 1));
                self.word_count += 1;
            }
        }
    }

    /// The words kept for `capability_id` and how many requests held each
    /// (what [`OutcomeMemory::restore_words`] takes back).
    pub fn words(&self, capability_id: &str) -> &[(String, u32)] {
        self.words.get(capability_id).map_or(&[], Vec::as_slice)
    }

    /// Takes back kept [`OutcomeMemory::words`] of a restored capability;
    /// empty words, longer ones than [`MAX_WORD_BYTES`], counts of 0 or above
    /// its requests, repeats and words past [`MAX_WORDS_PER_CAPABILITY`] or
    /// [`MAX_WORDS`] are left out. Returns how many were taken.
    pub fn restore_words(&mut self, capability_id: &str, words: Vec<(String, u32)>) -> usize {
        let requests = self.count(capability_id);
        if requests == 0 {
            return 0;
        }
        self.word_count -= self.words.remove(capability_id).map_or(0, |old| old.len());
        let room = self.word_budget.saturating_sub(self.word_count).min(MAX_WORDS_PER_CAPABILITY);
        let mut kept: Vec<(String, u32)> = Vec::with_capacity(words.len().min(room));
        for (word, count) in words {
            let sound = !word.is_empty() && word.len() <= MAX_WORD_BYTES && count > 0 && count <= requests;
            if sound && kept.len() < room && !kept.iter().any(|(kept, _)| *kept == word) {
                kept.push((word, count));
            }
        }
        let taken = kept.len();
        self.word_count += taken;
        self.words.insert(capability_id.to_string(), kept);
        taken
    }

    /// Each remembered capability's learned words: those at least
    /// [`MIN_WORD_REQUESTS`] of its requests held, with their counts (in
    /// the order first seen); capabilities with none are left out.
    pub fn learned_words(&self) -> LearnedWords {
        self.words
            .iter()
            .filter_map(|(id, words)| {
                let learned: Vec<(String, u32)> =
                    words.iter().filter(|(_, requests)| *requests >= MIN_WORD_REQUESTS).cloned().collect();
                (!learned.is_empty()).then(|| (id.clone(), learned))
            })
            .collect()
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
        for id in self.sums.keys() {
            let Some((displacement, count)) = self.displacement(id, vectors) else { continue };
            shift.iter_mut().zip(&displacement).for_each(|(total, value)| *total += value);
            capabilities += 1;
            requests += u64::from(count);
        }
        if capabilities == 0 {
            return None;
        }
        shift.iter_mut().for_each(|value| *value /= capabilities as f32);
        Some((shift, requests as f32 / capabilities as f32))
    }

    /// The displacement from the own (unit) vector of the remembered
    /// `capability_id` in `vectors` to the mean of its requests' vectors, and
    /// their number; `None` when it is not remembered, not in `vectors` or
    /// has no dense signal there.
    fn displacement(&self, capability_id: &str, vectors: &VectorIndex) -> Option<(Vec<f32>, u32)> {
        let (sum, count) = self.sums.get(capability_id)?;
        let own = vectors.stored_vector(capability_id)?;
        let own_norm = dot(&own, &own).sqrt();
        if own.len() != self.dimensions || own_norm <= f32::EPSILON || *count == 0 {
            return None;
        }
        let displacement =
            own.iter().zip(sum).map(|(value, request_sum)| request_sum / *count as f32 - value / own_norm).collect();
        Some((displacement, *count))
    }

    /// A copy of `vectors` in which every remembered capability has its
    /// [`OutcomeMemory::adapted`] vector and every other row its own moved
    /// towards requests as its near remembered neighbours moved
    /// (`neighbourhood`, found on `vectors`: see the module's notes) and,
    /// for the rest of the way, as far as a remembered one moves on average
    /// ([`OutcomeMemory::style_shift`]). A `neighbourhood` found on an index
    /// of another size is not used.
    pub fn adapt_index(&self, vectors: &VectorIndex, own_weight: f32, neighbourhood: &Neighbourhood) -> VectorIndex {
        let shift = self.style_shift(vectors);
        let found_here = neighbourhood.rows == vectors.len();
        // Each source's displacement once; the near rows in row order, summed as the rows pass.
        let displacements: Vec<Option<(Vec<f32>, u32)>> = match found_here {
            true => neighbourhood.sources.iter().map(|id| self.displacement(id, vectors)).collect(),
            false => Vec::new(),
        };
        let mut by_row = neighbourhood.near.iter().copied().filter(|_| found_here).peekable();
        let mut near = Near { displacement: vec![0.0; self.dimensions], weight: 0.0, requests: 0.0 };
        let mut adapted = VectorIndex::with_capacity(vectors.dimensions(), vectors.len());
        for row in 0..vectors.len() {
            near.clear();
            while let Some((_, source, weight)) = by_row.next_if(|&(near_row, _, _)| near_row as usize <= row) {
                if let Some((displacement, count)) = &displacements[source as usize] {
                    near.add(displacement, *count, weight);
                }
            }
            let id = vectors.id(row);
            let Some(own) = vectors.stored_vector(id) else { continue };
            let vector = match (self.adapted(id, &own, own_weight), &shift) {
                (Some(vector), _) => vector,
                (None, Some((shift, requests))) => match near.mixed_with(shift, *requests) {
                    Some((shift, requests)) => unseen_moved(&own, own_weight, &shift, requests),
                    None => unseen_moved(&own, own_weight, shift, *requests),
                }
                .unwrap_or(own),
                (None, None) => own,
            };
            // Same dimensions as the index it came from, so the upsert cannot fail.
            let _ = adapted.upsert(id, &vector);
        }
        adapted
    }
}

/// One row's near remembered neighbours: `Σ w·Δ`, `Σ w` and `Σ w·n`.
struct Near {
    displacement: Vec<f32>,
    weight: f32,
    requests: f32,
}

impl Near {
    fn clear(&mut self) {
        if self.weight == 0.0 {
            return; // nothing was added (every weight added is positive)
        }
        self.displacement.iter_mut().for_each(|value| *value = 0.0);
        (self.weight, self.requests) = (0.0, 0.0);
    }

    fn add(&mut self, displacement: &[f32], requests: u32, weight: f32) {
        self.displacement.iter_mut().zip(displacement).for_each(|(total, value)| *total += weight * value);
        self.weight += weight;
        self.requests += weight * requests as f32;
    }

    /// The displacement and number of requests an unseen row moves by: the
    /// neighbours' weighted means with a share `min(Σ w, 1)`, the mean
    /// `shift` and `requests` of all remembered ones for the rest.
    fn mixed_with(&self, shift: &[f32], requests: f32) -> Option<(Vec<f32>, f32)> {
        if self.weight <= 0.0 || !self.weight.is_finite() || shift.len() != self.displacement.len() {
            return None;
        }
        let share = self.weight.min(1.0);
        let moved = self
            .displacement
            .iter()
            .zip(shift)
            .map(|(near, mean)| share * near / self.weight + (1.0 - share) * mean)
            .collect();
        Some((moved, share * self.requests / self.weight + (1.0 - share) * requests))
    }
}

/// Which rows of one vector index are near neighbours of which remembered
/// capabilities ([`NEIGHBOUR_COSINE`]), found with one scoring pass over the
/// index per remembered capability and kept: a learner extends it as
/// capabilities are first remembered ([`Neighbourhood::extend`]) and starts a
/// new one for a new index.
#[derive(Clone, Debug, Default)]
pub struct Neighbourhood {
    /// The rows of the index it was found on.
    rows: usize,
    /// The remembered capabilities looked from, in the order they were, and their positions by id.
    sources: Vec<String>,
    looked: IdTable,
    /// `(row, source, weight)`, in row order: row is within cosine `c ≥ τ` of the source's own vector,
    /// `weight = (c − τ) / (1 − τ)`.
    near: Vec<(u32, u32, f32)>,
}

impl Neighbourhood {
    /// Nothing looked for yet, on `vectors`.
    pub fn new(vectors: &VectorIndex) -> Neighbourhood {
        Neighbourhood { rows: vectors.len(), ..Neighbourhood::default() }
    }

    /// The same pairs by id, for the outcome prior to borrow along
    /// ([`crate::core::outcome_prior::OutcomePrior::with_near`]); `vectors`
    /// is the index it was found on (another size gives none).
    pub fn near_duplicates(&self, vectors: &VectorIndex) -> NearDuplicates {
        let pairs = self.near.iter().filter(|_| self.rows == vectors.len());
        NearDuplicates::from_pairs(
            self.sources.clone(),
            pairs.map(|&(row, source, weight)| (vectors.id(row as usize).to_string(), source, weight)),
        )
    }

    /// Number of remembered capabilities whose neighbours were looked for.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }

    /// Looks for the near neighbours in `vectors` (the index this
    /// neighbourhood was started on) of the capabilities remembered in
    /// `memory` that were not looked from yet, the most remembered first, up
    /// to [`MAX_NEIGHBOUR_SOURCES`] in all; returns how many it looked from.
    pub fn extend(&mut self, memory: &OutcomeMemory, vectors: &VectorIndex) -> usize {
        if self.rows != vectors.len() || self.sources.len() >= MAX_NEIGHBOUR_SOURCES {
            return 0;
        }
        let mut new: Vec<(&str, u32)> = memory
            .sums
            .iter()
            .filter(|(id, _)| self.looked.get(&self.sources, id).is_none())
            .map(|(id, (_, count))| (id.as_str(), *count))
            .collect();
        new.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        new.truncate(MAX_NEIGHBOUR_SOURCES - self.sources.len());
        let mut scores = Vec::new();
        for (id, _) in &new {
            let source = self.sources.len() as u32;
            self.sources.push((*id).to_string());
            self.looked.insert(&self.sources, id, source);
            let (Some(own), Some(own_row)) = (vectors.stored_vector(id), vectors.row(id)) else { continue };
            if !vectors.scores_into(&own, &mut scores) {
                continue;
            }
            let own_norm = dot(&own, &own).sqrt().max(f32::EPSILON);
            let near = vectors
                .top_rows(&scores, MAX_NEIGHBOURS, |row| row != own_row && scores[row] / own_norm >= NEIGHBOUR_COSINE);
            for (row, score) in near {
                let cosine = (score / own_norm).min(1.0);
                let weight = (cosine - NEIGHBOUR_COSINE) / (1.0 - NEIGHBOUR_COSINE);
                if weight > 0.0 {
                    self.near.push((row as u32, source, weight));
                }
            }
        }
        // In row order, as a fit reads them.
        self.near.sort_unstable_by_key(|&(row, source, _)| (row, source));
        new.len()
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
    use crate::core::outcome_prior::tests::proven_and_failed;

    fn unit(values: &[f32]) -> Vec<f32> {
        let norm = dot(values, values).sqrt();
        values.iter().map(|value| value / norm).collect()
    }

    fn words(text: &str) -> Vec<String> {
        crate::core::text::index_terms(text)
    }

    #[test]
    fn words_become_learned_once_enough_requests_held_them() {
        let mut memory = OutcomeMemory::new(2);
        memory.remember_words("a", &words("weather in Berlin"));
        assert!(memory.words("a").is_empty(), "only a capability whose request was remembered");
        for request in ["weather in Berlin", "the weather in Oslo, Oslo weather", "rain in Berlin?"] {
            assert!(memory.remember("a", &[1.0, 0.0]));
            memory.remember_words("a", &words(request));
        }
        let learned = memory.learned_words();
        let mut a = learned["a"].clone();
        a.sort();
        // "weather" twice (once per request, however often it says it), "berlin" twice; "oslo" and "rain" once.
        assert_eq!(a, vec![("berlin".to_string(), 2), ("weather".to_string(), 2)]);
        assert_eq!(memory.words("a").len(), 4);
        // Kept words come back as they were; unsound ones are left out.
        let mut restored = OutcomeMemory::new(2);
        assert_eq!(restored.restore_words("a", memory.words("a").to_vec()), 0, "no requests restored yet");
        let (sum, count) = memory.entry("a").unwrap();
        assert!(restored.restore("a", sum.to_vec(), count));
        let mut kept = memory.words("a").to_vec();
        kept.extend([(String::new(), 1), ("zero".into(), 0), ("many".into(), 4), ("berlin".into(), 1)]);
        assert_eq!(restored.restore_words("a", kept), 4);
        assert_eq!(restored.learned_words(), memory.learned_words());
    }

    #[test]
    fn a_capability_keeps_a_bounded_number_of_words_the_recurring_first() {
        let mut memory = OutcomeMemory::new(2);
        assert!(memory.remember("a", &[1.0, 0.0]));
        memory.remember_words("a", &["kept".to_string()]);
        assert!(memory.remember("a", &[1.0, 0.0]));
        memory.remember_words("a", &["kept".to_string()]);
        for batch in 0..4 {
            let many: Vec<String> = (0..MAX_WORDS_PER_CAPABILITY).map(|n| format!("w{batch}x{n}")).collect();
            assert!(memory.remember("a", &[1.0, 0.0]));
            memory.remember_words("a", &many);
            assert!(memory.words("a").len() <= MAX_WORDS_PER_CAPABILITY);
        }
        assert!(memory.words("a").contains(&("kept".to_string(), 2)), "a recurring word outlives the once-seen");
        assert_eq!(memory.learned_words()["a"], vec![("kept".to_string(), 2)]);
        // Over all capabilities too, and no word longer than MAX_WORD_BYTES.
        let mut memory = OutcomeMemory::with_word_budget(2, 5);
        let long = "x".repeat(MAX_WORD_BYTES + 1);
        for id in ["a", "b", "c"] {
            assert!(memory.remember(id, &[1.0, 0.0]));
            memory.remember_words(id, &["one".into(), "two".into(), long.clone()]);
        }
        let kept: usize = ["a", "b", "c"].iter().map(|id| memory.words(id).len()).sum();
        assert_eq!((kept, memory.word_count), (5, 5));
        assert!(["a", "b", "c"].iter().all(|id| memory.words(id).iter().all(|(word, _)| word.len() <= MAX_WORD_BYTES)));
        // A full memory still counts the words it keeps; a restore replaces, within the budget.
        assert!(memory.remember("a", &[1.0, 0.0]));
        memory.remember_words("a", &["one".into()]);
        assert_eq!(memory.words("a")[0], ("one".to_string(), 2));
        assert_eq!(memory.words("c"), [("one".to_string(), 1)], "the last word had no room");
        assert_eq!(memory.restore_words("c", vec![("three".into(), 1), ("four".into(), 1)]), 1);
        assert_eq!((memory.words("c")[0].0.as_str(), memory.word_count), ("three", 5));
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
        let adapted = memory.adapt_index(&index, 2.0, &Neighbourhood::new(&index));
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
    fn an_unseen_twin_moves_as_its_remembered_twin_moved() {
        // "copy" is a near-duplicate of "seen" (cosine 0.98); "far" is another tool.
        // "seen" was remembered with requests leaning to the third axis, "other"
        // with requests leaning to the fourth: the mean displacement points between.
        let mut index = VectorIndex::new(4);
        index.upsert("seen", &[1.0, 0.0, 0.0, 0.0]).unwrap();
        index.upsert("copy", &unit(&[1.0, 0.2, 0.0, 0.0])).unwrap();
        index.upsert("other", &[0.0, 1.0, 0.0, 0.0]).unwrap();
        index.upsert("far", &unit(&[0.3, 0.0, 0.0, 1.0])).unwrap();
        let mut memory = OutcomeMemory::new(4);
        for _ in 0..3 {
            memory.remember("seen", &unit(&[1.0, 0.0, 1.0, 0.0]));
        }
        memory.remember("other", &unit(&[0.0, 1.0, 0.0, 1.0]));
        let mut neighbourhood = Neighbourhood::new(&index);
        assert_eq!(neighbourhood.extend(&memory, &index), 2);
        assert_eq!(neighbourhood.extend(&memory, &index), 0, "each is looked from once");
        assert_eq!(neighbourhood.sources(), 2);
        let kernel = memory.adapt_index(&index, 2.0, &neighbourhood);
        let mean_only = memory.adapt_index(&index, 2.0, &Neighbourhood::default());
        // The twin's vector moved as the remembered one's: towards the third axis, not the fourth.
        let copy = kernel.stored_vector("copy").unwrap();
        let seen = kernel.stored_vector("seen").unwrap();
        assert!(dot(&copy, &seen) > 0.95, "{copy:?} {seen:?}");
        let copy_mean = mean_only.stored_vector("copy").unwrap();
        assert!(copy[2] > copy_mean[2] && copy[3] < copy_mean[3]);
        // A request worded as "seen"'s were, asking for what both do, still ranks the twin level.
        let request = unit(&[1.0, 0.1, 1.0, 0.0]);
        let gap = |vectors: &VectorIndex| {
            vectors.cosine("seen", &request).unwrap() - vectors.cosine("copy", &request).unwrap()
        };
        assert!(gap(&kernel) < gap(&mean_only), "{} vs {}", gap(&kernel), gap(&mean_only));
        // No near neighbour: the mean displacement alone, as before.
        assert_eq!(kernel.stored_vector("far"), mean_only.stored_vector("far"));
        // The remembered keep their own adaptation.
        assert_eq!(kernel.stored_vector("seen"), mean_only.stored_vector("seen"));
        // The prior is borrowed along the same pairs: the twin from "seen" alone.
        let near = neighbourhood.near_duplicates(&index);
        assert_eq!(near.len(), 1);
        let prior = proven_and_failed("seen", "other").with_near(std::sync::Arc::new(near));
        let copy = prior.adjustment("copy");
        assert!(copy > 0.0 && copy <= prior.adjustment("seen"), "{copy}");
        assert_eq!(prior.adjustment("far"), 0.0);
    }

    #[test]
    fn a_neighbourhood_found_on_another_index_is_not_used_and_sources_are_bounded() {
        let mut index = VectorIndex::new(2);
        index.upsert("seen", &[1.0, 0.0]).unwrap();
        index.upsert("copy", &unit(&[1.0, 0.1])).unwrap();
        let mut memory = OutcomeMemory::new(2);
        memory.remember("seen", &[0.0, 1.0]);
        let mut smaller = VectorIndex::new(2);
        smaller.upsert("seen", &[1.0, 0.0]).unwrap();
        let mut elsewhere = Neighbourhood::new(&smaller);
        assert_eq!(elsewhere.extend(&memory, &index), 0, "started on another index");
        elsewhere.extend(&memory, &smaller);
        let without = memory.adapt_index(&index, 1.0, &Neighbourhood::default());
        assert_eq!(memory.adapt_index(&index, 1.0, &elsewhere).stored_vector("copy"), without.stored_vector("copy"));
        // At most MAX_NEIGHBOUR_SOURCES are looked from, the most remembered first.
        let mut many = OutcomeMemory::new(2);
        let mut wide = VectorIndex::new(2);
        for i in 0..MAX_NEIGHBOUR_SOURCES + 5 {
            let id = format!("c{i}");
            wide.upsert(&id, &[1.0, i as f32 / 1e4]).unwrap();
            many.remember(&id, &[0.0, 1.0]);
        }
        many.remember("c1028", &[0.0, 1.0]);
        let mut bounded = Neighbourhood::new(&wide);
        assert_eq!(bounded.extend(&many, &wide), MAX_NEIGHBOUR_SOURCES);
        assert_eq!(bounded.sources[0], "c1028", "the most remembered first");
        assert_eq!(bounded.extend(&many, &wide), 0);
        assert!(bounded.near.iter().all(|(_, _, weight)| *weight > 0.0 && *weight <= 1.0));
        assert!(bounded.near.len() <= MAX_NEIGHBOURS * MAX_NEIGHBOUR_SOURCES);
    }

    #[test]
    fn with_nothing_remembered_every_vector_stays() {
        let mut index = VectorIndex::new(2);
        index.upsert("a", &unit(&[1.0, 0.2])).unwrap();
        let adapted = OutcomeMemory::new(2).adapt_index(&index, 5.0, &Neighbourhood::new(&index));
        assert_eq!(adapted.stored_vector("a"), index.stored_vector("a"));
    }

    #[test]
    fn an_unseen_capability_without_a_dense_signal_keeps_its_zero_vector() {
        let mut index = VectorIndex::new(2);
        index.upsert("seen", &[1.0, 0.0]).unwrap();
        index.upsert("silent", &[0.0, 0.0]).unwrap();
        let mut memory = OutcomeMemory::new(2);
        memory.remember("seen", &[0.0, 1.0]);
        let adapted = memory.adapt_index(&index, 1.0, &Neighbourhood::new(&index));
        assert_eq!(adapted.stored_vector("silent"), index.stored_vector("silent"));
    }
}
