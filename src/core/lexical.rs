//! The lexical index: BM25F over a capability's fields, with postings lists,
//! plus the exact-name table.
//!
//! Fields and their weights ([`FieldWeights`]): the name and display name
//! (split on camelCase, snake_case and kebab-case by [`word_tokens`]), the
//! description, the category, the tags, the parameter names and, at a low
//! weight, the parameter descriptions (what a tool needs says a lot about
//! what it does, but schemas are verbose). Terms are
//! [`index_terms`]: lower-cased word tokens, stopwords dropped, stemmed.
//!
//! Scoring is BM25F in its simple form: a term's frequency in a document is
//! the weighted sum of its frequencies in the fields, `tf = Σ_f w_f · tf_f`,
//! the document length is `len = Σ_f w_f · len_f`, and
//!
//! ```text
//! bm25(q, d) = Σ_{t ∈ q, distinct} idf(t) · tf·(k1 + 1) / (tf + k1·(1 − b + b·len/avglen))
//! idf(t)     = ln(1 + (N − df + 0.5) / (df + 0.5))
//! ```
//!
//! To give one relevance in [0, 1], the score is divided by the query's
//! reference score, `Σ_{t ∈ q, t in the vocabulary} idf(t)`: the score of a
//! document of average length holding every query term exactly once with
//! weight 1 (a term the index has never seen cannot match anything, so it is
//! left out). The quotient is capped at 1. It reads as "the share of the
//! query's information the document matches".
//!
//! Each posting holds its term's contribution to the document's score,
//! `idf · tf·(k1 + 1) / (tf + k1·(1 − b + b·len/avglen))`, computed once at
//! build, so a query only adds. A search touches only the postings of the
//! query's terms (an accumulator per document, kept per thread and reset on
//! the touched documents only, so a query costs what its postings cost, not
//! what the catalog holds). Retrieval asks for the best `k` of every part of
//! a message at once ([`LexicalIndex::top_of_parts`]): one walk over the
//! parts' postings a block of documents at a time, into accumulators that
//! cover one block and stay in the cache; the few candidates the other
//! signals bring get their scores by search ([`LexicalIndex::part_scores`]).
//!
//! The index also numbers its documents densely (`0..len`) and keeps what the
//! discovery filters read of each one (kind, category, availability), so
//! retrieval checks a filter by document number, without a catalog lookup.
//!
//! It also holds each document's Tier 1 summary line and Tier 2 detail text
//! ([`LexicalIndex::summary_line`], [`LexicalIndex::detail_text`]), made on
//! first use and kept for the life of the build (one catalog version), so a
//! discovery renders a capability's texts once per version, not per query.

use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind};
use crate::core::id_table::IdTable;
use crate::core::text::{for_each_index_term, index_terms};
use crate::core::top_keys::{key_rank, key_score, quality_key, TopKeys};
use foldhash::{HashMap, HashMapExt};
use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::OnceLock;

pub mod snapshot;

/// BM25 saturation.
pub const K1: f32 = 1.2;
/// BM25 length normalisation.
pub const B: f32 = 0.75;

/// Weight of each field in the BM25F term frequency.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FieldWeights {
    pub name: f32,
    pub description: f32,
    pub category: f32,
    pub tags: f32,
    pub parameters: f32,
    /// The descriptions of the parameters in the input schema.
    pub parameter_descriptions: f32,
}

/// The weights capdex uses: a name is the densest statement of intent, the
/// description carries most of the words, category, tags and parameter names
/// add context.
pub const FIELD_WEIGHTS: FieldWeights = FieldWeights {
    name: 2.5,
    description: 1.0,
    category: 0.5,
    tags: 1.0,
    parameters: 0.5,
    parameter_descriptions: 0.3,
};

/// The weight of a capability's learned words ([`LexicalIndex::build_learned`]):
/// the words of the requests it did the job for, counted once per request,
/// as the outcome memory keeps them (`core::outcome_memory`). A user's
/// words, not the author's: weighed as the category and the parameter names,
/// half the description. Measured at 0.25, 0.5 and 1 (`capdex eval --replay`,
/// docs/performance.md): within a point of each other on every set.
pub const LEARNED_WORDS_WEIGHT: f32 = 0.5;

/// Per capability id, the words it learnt: index terms ([`index_terms`]) and
/// the number of requests that held each.
pub type LearnedWords = std::collections::HashMap<String, Vec<(String, u32)>>;

/// An immutable BM25F index over descriptors; rebuilt as a whole on change.
#[derive(Clone, Debug, Default)]
pub struct LexicalIndex {
    ids: Vec<Box<str>>,
    /// The document of each id (read through `ids`).
    docs: IdTable,
    terms: HashMap<String, u32>,
    /// Every term's postings, one after the other, term by term (documents
    /// ascending within a term): term `t`'s are
    /// `postings[posting_starts[t]..posting_starts[t + 1]]`, each a document
    /// and the term's share of its BM25 score, [`contribution`], computed
    /// once at build so a query only adds.
    postings: Vec<(u32, f32)>,
    posting_starts: Vec<u32>,
    idf: Vec<f32>,
    /// `k1·(1 − b + b·len/avglen)` per document.
    length_norms: Vec<f32>,
    /// `avglen`, the mean weighted document length the norms were made with.
    average_length: f32,
    /// Loose spelling of each id, name and display name → documents, best match kind first.
    exact: HashMap<Box<str>, Box<[(u32, ExactMatch)]>>,
    /// What the discovery filters read of each document.
    attributes: Vec<DocAttributes>,
    /// The distinct categories, as spelled; [`DocAttributes::category`] indexes them.
    categories: Vec<String>,
    /// The distinct source ids; [`DocAttributes::source`] indexes them.
    sources: Vec<String>,
    /// Tells index builds apart (clones share it): a cache keyed on it is valid
    /// for exactly this document numbering.
    generation: u64,
    /// Each document's tier texts, made on first use.
    texts: Vec<DocTexts>,
    /// `id_rank[doc]`: the place of the document's id among all ids in byte
    /// order, so comparing two ranks compares the two ids without reading them.
    id_rank: Vec<u32>,
}

/// A document's Tier 1 summary line and Tier 2 detail text, each made once, on first use.
#[derive(Clone, Debug, Default)]
struct DocTexts {
    summary: OnceLock<Box<str>>,
    detail: OnceLock<Box<str>>,
}

/// What the discovery filters read of one document (see
/// [`crate::core::filter::DiscoveryFilter::admits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DocAttributes {
    pub kind: CapabilityKind,
    pub available: bool,
    /// Index into [`LexicalIndex::categories`].
    pub category: u32,
    /// Index into [`LexicalIndex::sources`]; `None` for a capability of no source.
    pub source: Option<u32>,
}

/// Hands out index generations; 0 is never handed out.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Per-thread accumulator of [`LexicalIndex::score`]: all zeros between calls.
    static ACCUMULATOR: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Per-thread block accumulators of [`LexicalIndex::top_of_parts`]: all zeros between calls.
    static BLOCK_ACCUMULATORS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Per-thread lists of the documents a block touched, per part, of
    /// [`LexicalIndex::top_of_parts`]: all empty between calls.
    static TOUCHED: std::cell::Cell<Vec<Vec<u32>>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A thread's accumulators, emptied if a walk over them unwinds (a `keep`
/// that panics), so they are never left holding a half-read block.
struct ZeroedOnUnwind<'a>(&'a mut Vec<f32>);

impl Drop for ZeroedOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.clear();
        }
    }
}

/// How a query met a capability's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExactMatch {
    /// The query is the capability's display name.
    DisplayName,
    /// The query is the capability's name.
    Name,
    /// The query is the capability's id.
    Id,
}

/// The lexical side of one query: a normalised score per touched document.
#[derive(Clone, Debug, Default)]
pub struct LexicalScores {
    /// `(document, relevance in [0, 1])`, unordered.
    pub scores: Vec<(u32, f32)>,
}

impl LexicalIndex {
    /// Builds the index over `descriptors` with [`FIELD_WEIGHTS`].
    pub fn build<'a>(descriptors: impl IntoIterator<Item = &'a CapabilityDescriptor>) -> LexicalIndex {
        LexicalIndex::build_with(descriptors, FIELD_WEIGHTS)
    }

    /// Builds the index with explicit field weights. A repeated id keeps its first descriptor.
    pub fn build_with<'a>(
        descriptors: impl IntoIterator<Item = &'a CapabilityDescriptor>,
        weights: FieldWeights,
    ) -> LexicalIndex {
        LexicalIndex::build_learned(descriptors, weights, &LearnedWords::new())
    }

    /// [`LexicalIndex::build_with`] with one more field per capability: the
    /// words `learned` holds for it, each at [`LEARNED_WORDS_WEIGHT`] times
    /// the number of requests that held it (BM25F's `tf` and the document's
    /// length both take them in, so a capability's own words keep their
    /// weight against its learned ones). With nothing learned it is
    /// [`LexicalIndex::build_with`]'s index, float for float.
    pub fn build_learned<'a>(
        descriptors: impl IntoIterator<Item = &'a CapabilityDescriptor>,
        weights: FieldWeights,
        learned: &LearnedWords,
    ) -> LexicalIndex {
        let learned_of = |id: &str| learned.get(id).map_or(&[][..], Vec::as_slice);
        let mut index =
            LexicalIndex { generation: GENERATIONS.fetch_add(1, AtomicOrdering::Relaxed), ..LexicalIndex::default() };
        let mut lengths: Vec<f32> = Vec::new();
        let mut doc_terms: HashMap<u32, f32> = HashMap::new();
        let mut category_ids: HashMap<String, u32> = HashMap::new();
        // How many documents hold each term, and the documents kept (the first of each id).
        let mut document_counts: Vec<u32> = Vec::new();
        let mut kept: Vec<&CapabilityDescriptor> = Vec::new();
        let mut source_ids: HashMap<String, u32> = HashMap::new();
        for descriptor in descriptors {
            if index.docs.get(&index.ids, &descriptor.id).is_some() {
                continue;
            }
            let doc = index.ids.len() as u32;
            index.ids.push(descriptor.id.as_str().into());
            index.docs.insert(&index.ids, &descriptor.id, doc);
            let next_category = index.categories.len() as u32;
            let category = *category_ids.entry(descriptor.category.clone()).or_insert_with(|| {
                index.categories.push(descriptor.category.clone());
                next_category
            });
            let source = descriptor.definition_ref.source_id().map(|source_id| {
                let next_source = index.sources.len() as u32;
                *source_ids.entry(source_id.to_string()).or_insert_with(|| {
                    index.sources.push(source_id.to_string());
                    next_source
                })
            });
            index.attributes.push(DocAttributes {
                kind: descriptor.kind,
                available: descriptor.available,
                category,
                source,
            });
            index.texts.push(DocTexts::default());
            let terms = &mut index.terms;
            let length = doc_term_weights(descriptor, weights, learned_of(&descriptor.id), &mut doc_terms, |term| {
                let next_id = terms.len() as u32;
                *terms.entry(term).or_insert(next_id)
            });
            for &term in doc_terms.keys() {
                if term as usize >= document_counts.len() {
                    document_counts.resize(term as usize + 1, 0);
                }
                document_counts[term as usize] += 1;
            }
            kept.push(descriptor);
            lengths.push(length);
            for (key, kind) in [
                (loose_key(&descriptor.id), ExactMatch::Id),
                (loose_key(&descriptor.name), ExactMatch::Name),
                (loose_key(&descriptor.display_name), ExactMatch::DisplayName),
            ] {
                if key.is_empty() {
                    continue;
                }
                // Almost every key names one document: a slice of one, made
                // once; a shared key's slice is made again, one longer.
                match index.exact.get_mut(key.as_str()) {
                    None => {
                        index.exact.insert(key.into_boxed_str(), Box::new([(doc, kind)]));
                    }
                    Some(slot) => match slot.iter_mut().find(|(existing, _)| *existing == doc) {
                        Some(entry) => entry.1 = entry.1.max(kind),
                        None => *slot = slot.iter().copied().chain([(doc, kind)]).collect(),
                    },
                }
            }
        }
        // The postings, laid out term by term in one array of exactly their
        // number: each term's place is known from the counts, and a second
        // pass over the documents (in document order, so each term's
        // documents stay ascending) fills them in. Two passes cost a second
        // tokenisation and no copy of the postings: a million capabilities
        // would otherwise gather a quarter of a gigabyte before laying it out.
        document_counts.resize(index.terms.len(), 0);
        let mut starts = Vec::with_capacity(index.terms.len() + 1);
        let mut total = 0u32;
        starts.push(0);
        for count in &document_counts {
            total += count;
            starts.push(total);
        }
        drop(document_counts);
        let mut next = starts.clone();
        index.postings = vec![(0, 0.0); total as usize];
        for (doc, descriptor) in kept.into_iter().enumerate() {
            let terms = &index.terms;
            doc_term_weights(descriptor, weights, learned_of(&descriptor.id), &mut doc_terms, |term| terms[&term]);
            for (&term, &tf) in &doc_terms {
                let slot = &mut next[term as usize];
                index.postings[*slot as usize] = (doc as u32, tf);
                *slot += 1;
            }
        }
        drop(next);
        index.posting_starts = starts;
        index.fill_idf();
        let n_docs = index.ids.len() as f32;
        let average = if lengths.is_empty() { 1.0 } else { lengths.iter().sum::<f32>() / n_docs };
        let average = if average > 0.0 { average } else { 1.0 };
        index.length_norms = lengths.iter().map(|&length| length_norm(length, average)).collect();
        index.average_length = average;
        // The postings held each term's weighted frequency; now its contribution.
        for term in 0..index.terms.len() {
            let (start, end) = (index.posting_starts[term] as usize, index.posting_starts[term + 1] as usize);
            let idf = index.idf[term];
            for posting in &mut index.postings[start..end] {
                posting.1 = contribution(idf, posting.1, index.length_norms[posting.0 as usize]);
            }
        }
        for matches in index.exact.values_mut().filter(|matches| matches.len() > 1) {
            matches.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        }
        index.rank_ids();
        index
    }

    /// Fills `idf` from the postings.
    fn fill_idf(&mut self) {
        let n_docs = self.ids.len() as f32;
        self.idf = (0..self.terms.len())
            .map(|term| {
                let df = self.term_postings(term as u32).len() as f32;
                (1.0 + (n_docs - df + 0.5) / (df + 0.5)).ln()
            })
            .collect();
    }

    /// Fills `id_rank` from `ids`.
    fn rank_ids(&mut self) {
        let mut by_id: Vec<u32> = (0..self.ids.len() as u32).collect();
        by_id.sort_unstable_by(|&a, &b| self.ids[a as usize].cmp(&self.ids[b as usize]));
        self.id_rank = vec![0; by_id.len()];
        for (rank, doc) in by_id.into_iter().enumerate() {
            self.id_rank[doc as usize] = rank as u32;
        }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// The postings of `term`: `(document, contribution)`, documents ascending.
    fn term_postings(&self, term: u32) -> &[(u32, f32)] {
        let (start, end) = (self.posting_starts[term as usize], self.posting_starts[term as usize + 1]);
        &self.postings[start as usize..end as usize]
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Returns the id of document `doc`.
    pub fn id(&self, doc: u32) -> &str {
        &self.ids[doc as usize]
    }

    /// Returns the place of document `doc`'s id among all ids in byte order:
    /// `id_rank(a) < id_rank(b)` exactly when `id(a) < id(b)`.
    pub fn id_rank(&self, doc: u32) -> u32 {
        self.id_rank[doc as usize]
    }

    /// Returns the document of `id`.
    pub fn doc(&self, id: &str) -> Option<u32> {
        self.docs.get(&self.ids, id)
    }

    /// Returns [`crate::core::text::summary_line`] of `descriptor`, which must
    /// be the descriptor this index was built with for its id (the catalog of
    /// the same version): made on first use and kept with the document. A
    /// descriptor whose id the index lacks gets a fresh line.
    pub fn summary_line<'a>(&'a self, descriptor: &CapabilityDescriptor) -> Cow<'a, str> {
        match self.doc(&descriptor.id).and_then(|doc| self.texts.get(doc as usize)) {
            Some(texts) => {
                Cow::Borrowed(texts.summary.get_or_init(|| crate::core::text::summary_line(descriptor).into()))
            }
            None => Cow::Owned(crate::core::text::summary_line(descriptor)),
        }
    }

    /// Returns [`crate::core::text::detail_text`] of `descriptor`, kept as
    /// [`LexicalIndex::summary_line`] keeps the summary.
    pub fn detail_text<'a>(&'a self, descriptor: &CapabilityDescriptor) -> Cow<'a, str> {
        match self.doc(&descriptor.id).and_then(|doc| self.texts.get(doc as usize)) {
            Some(texts) => {
                Cow::Borrowed(texts.detail.get_or_init(|| crate::core::text::detail_text(descriptor).into()))
            }
            None => Cow::Owned(crate::core::text::detail_text(descriptor)),
        }
    }

    /// Returns what the filters read of document `doc`.
    pub fn attributes(&self, doc: u32) -> DocAttributes {
        self.attributes[doc as usize]
    }

    /// Returns the distinct categories, as spelled, indexed by [`DocAttributes::category`].
    pub fn categories(&self) -> &[String] {
        &self.categories
    }

    /// Returns the distinct source ids, indexed by [`DocAttributes::source`].
    pub fn sources(&self) -> &[String] {
        &self.sources
    }

    /// Returns this build's generation: equal for clones, different for any two builds.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Scores every document that holds a term of `query`, normalised to [0, 1]
    /// as the module docs describe.
    pub fn score(&self, query: &str) -> LexicalScores {
        let mut query_terms: Vec<u32> = Vec::new();
        for_each_index_term(query, |term| query_terms.extend(self.terms.get(term).copied()));
        query_terms.sort_unstable();
        query_terms.dedup();
        let reference: f32 = query_terms.iter().map(|&term| self.idf[term as usize]).sum();
        if reference <= 0.0 {
            return LexicalScores::default();
        }
        // A dense accumulator and a list of touched documents: no hashing per
        // posting. The accumulator is the thread's, all zeros between calls
        // (each touched slot is reset on the way out), so a query never pays
        // for zeroing the whole catalog.
        ACCUMULATOR.with(|cell| match cell.try_borrow_mut() {
            Ok(mut accumulator) => self.accumulate(&query_terms, reference, &mut accumulator),
            Err(_) => self.accumulate(&query_terms, reference, &mut Vec::new()),
        })
    }

    /// The postings walk of [`LexicalIndex::score`] into `accumulator`, which
    /// is all zeros on entry and on return.
    fn accumulate(&self, query_terms: &[u32], reference: f32, accumulator: &mut Vec<f32>) -> LexicalScores {
        if accumulator.len() < self.ids.len() {
            accumulator.resize(self.ids.len(), 0.0);
        }
        let mut touched: Vec<u32> = Vec::new();
        for &term in query_terms {
            for &(doc, weight) in self.term_postings(term) {
                let slot = &mut accumulator[doc as usize];
                if *slot == 0.0 {
                    touched.push(doc);
                }
                *slot += weight;
            }
        }
        let scores = touched
            .into_iter()
            .map(|doc| {
                let slot = &mut accumulator[doc as usize];
                let score = (*slot / reference).min(1.0);
                *slot = 0.0;
                (doc, score)
            })
            .collect();
        LexicalScores { scores }
    }

    /// The terms of each of `parts` (a query's texts) that the index knows,
    /// with each part's reference score: what [`LexicalIndex::top_of_parts`]
    /// and [`LexicalIndex::part_scores`] read.
    pub fn parts_query<'t>(&self, parts: impl IntoIterator<Item = &'t str>) -> PartsQuery {
        let mut query = PartsQuery::default();
        for text in parts {
            let mut terms: Vec<u32> = Vec::new();
            for_each_index_term(text, |term| terms.extend(self.terms.get(term).copied()));
            terms.sort_unstable();
            terms.dedup();
            let reference: f32 = terms.iter().map(|&term| self.idf[term as usize]).sum();
            query.parts.push(PartTerms { terms, reference });
        }
        query
    }

    /// The best `k` documents of each part of `query` that pass `keep`, best
    /// first (ties by document): for each part, what
    /// `self.score(part).top(k, keep)` gives, float for float, in one walk
    /// over the postings of all the parts' terms.
    ///
    /// The walk goes a block of documents at a time, each term's postings
    /// within the block in term order, into one accumulator per part that
    /// covers the block alone: it stays in the cache where one over the whole
    /// catalog would send every posting's update through memory, and each
    /// term's postings are read once however many parts hold it.
    pub fn top_of_parts(&self, query: &PartsQuery, k: usize, keep: impl Fn(u32) -> bool) -> Vec<Vec<(u32, f32)>> {
        self.top_of_parts_in_blocks(query, k, keep, DOCS_PER_BLOCK)
    }

    /// [`LexicalIndex::top_of_parts`] with blocks of `block` documents.
    fn top_of_parts_in_blocks(
        &self,
        query: &PartsQuery,
        k: usize,
        keep: impl Fn(u32) -> bool,
        block: usize,
    ) -> Vec<Vec<(u32, f32)>> {
        let block = block.max(1);
        let n_parts = query.parts.len();
        let mut tops: Vec<TopKeys> = (0..n_parts).map(|_| TopKeys::new(k)).collect();
        // Each term of any part once, ascending, with the parts that hold it.
        let mut walked: Vec<(u32, Vec<usize>)> = Vec::new();
        for (p, part) in query.parts.iter().enumerate() {
            if part.reference <= 0.0 {
                continue;
            }
            for &term in &part.terms {
                match walked.binary_search_by_key(&term, |(walked, _)| *walked) {
                    Ok(at) => walked[at].1.push(p),
                    Err(at) => walked.insert(at, (term, vec![p])),
                }
            }
        }
        if k == 0 || walked.is_empty() {
            return vec![Vec::new(); n_parts];
        }
        // A catalog smaller than a block is one block of its size.
        let block = block.min(self.ids.len().max(1));
        BLOCK_ACCUMULATORS.with(|cell| match cell.try_borrow_mut() {
            Ok(mut accumulators) => {
                self.walk_blocks(query, &walked, &mut tops, &keep, block, &mut ZeroedOnUnwind(&mut accumulators))
            }
            Err(_) => self.walk_blocks(query, &walked, &mut tops, &keep, block, &mut ZeroedOnUnwind(&mut Vec::new())),
        });
        tops.into_iter()
            .map(|top| top.into_best_first().into_iter().map(|key| (key_rank(key), key_score(key))).collect())
            .collect()
    }

    /// The block walk of [`LexicalIndex::top_of_parts`]: offers every
    /// document of each part to `tops`. `accumulators` is all zeros on entry
    /// and on return (each touched slot is reset as it is read).
    fn walk_blocks(
        &self,
        query: &PartsQuery,
        walked: &[(u32, Vec<usize>)],
        tops: &mut [TopKeys],
        keep: &impl Fn(u32) -> bool,
        block: usize,
        accumulators: &mut ZeroedOnUnwind<'_>,
    ) {
        let n_parts = query.parts.len();
        let accumulators = &mut *accumulators.0;
        if accumulators.len() < n_parts * block {
            accumulators.resize(n_parts * block, 0.0);
        }
        let mut cursors: Vec<&[(u32, f32)]> = walked.iter().map(|(term, _)| self.term_postings(*term)).collect();
        // The thread's lists, kept between calls (empty): lists made per query
        // would cost fresh pages from the system as they grow.
        let mut touched = TOUCHED.with(|cell| cell.take());
        touched.resize_with(n_parts.max(touched.len()), Vec::new);
        for start in (0..self.ids.len()).step_by(block) {
            let end = (start + block).min(self.ids.len()) as u32;
            let start = start as u32;
            for ((_, parts), cursor) in walked.iter().zip(&mut cursors) {
                // Read on, not searched for: the postings are read in order anyway.
                let within = cursor.iter().position(|&(doc, _)| doc >= end).unwrap_or(cursor.len());
                let (in_block, rest) = cursor.split_at(within);
                if let [p] = parts[..] {
                    // One part (the usual case): no loop over parts per posting.
                    let (accumulator, touched) = (&mut accumulators[p * block..(p + 1) * block], &mut touched[p]);
                    for &(doc, weight) in in_block {
                        let slot = &mut accumulator[(doc - start) as usize];
                        if *slot == 0.0 {
                            touched.push(doc);
                        }
                        *slot += weight;
                    }
                } else {
                    for &(doc, weight) in in_block {
                        let at = (doc - start) as usize;
                        for &p in parts {
                            let slot = &mut accumulators[p * block + at];
                            if *slot == 0.0 {
                                touched[p].push(doc);
                            }
                            *slot += weight;
                        }
                    }
                }
                *cursor = rest;
            }
            for (p, (docs, top)) in touched.iter_mut().zip(tops.iter_mut()).enumerate() {
                let reference = query.parts[p].reference;
                let mut bar = top.bar();
                for doc in docs.drain(..) {
                    let slot = &mut accumulators[p * block + (doc - start) as usize];
                    let score = (*slot / reference).min(1.0);
                    *slot = 0.0;
                    // Most documents lose on the score alone.
                    if score < bar {
                        continue;
                    }
                    let key = quality_key(score, doc);
                    if top.could_take(key) && keep(doc) {
                        top.take(key);
                        bar = top.bar();
                    }
                }
            }
        }
        TOUCHED.with(|cell| cell.replace(touched));
    }

    /// Each of `docs`' score on each part of `query`, into `scores`
    /// (`scores[i * parts + p]`, resized): the score `self.score(part)` gives
    /// the document, float for float, or 0 where it gives none. `docs` must
    /// be ascending: each term's postings are read once, galloping from one
    /// document to the next.
    pub fn part_scores(&self, query: &PartsQuery, docs: &[u32], scores: &mut Vec<f32>) {
        let n_parts = query.parts.len();
        scores.clear();
        scores.resize(docs.len() * n_parts, 0.0);
        // Each part's terms ascending, so each document's sum adds them in the order `score` does.
        for (p, part) in query.parts.iter().enumerate() {
            if part.reference <= 0.0 {
                continue;
            }
            for &term in &part.terms {
                let mut postings = self.term_postings(term);
                for (i, &doc) in docs.iter().enumerate() {
                    postings = &postings[gallop(postings, doc)..];
                    match postings.first() {
                        Some(&(found, weight)) if found == doc => scores[i * n_parts + p] += weight,
                        Some(_) => {}
                        None => break,
                    }
                }
            }
            for i in 0..docs.len() {
                let sum = &mut scores[i * n_parts + p];
                *sum = (*sum / part.reference).min(1.0);
            }
        }
    }

    /// Returns the documents whose id, name or display name is `query`, once
    /// case, spaces and punctuation are ignored; the strongest match first.
    pub fn exact_matches(&self, query: &str) -> &[(u32, ExactMatch)] {
        self.exact.get(loose_key(query).as_str()).map(|matches| &**matches).unwrap_or(&[])
    }
}

/// Documents a block of [`LexicalIndex::top_of_parts`]: one part's
/// accumulator for a block is 32 KiB.
const DOCS_PER_BLOCK: usize = 8192;

/// A query's parts in the index's terms ([`LexicalIndex::parts_query`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PartsQuery {
    parts: Vec<PartTerms>,
}

/// One part of a [`PartsQuery`].
#[derive(Clone, Debug, PartialEq)]
struct PartTerms {
    /// The part's terms the index knows, ascending, each once.
    terms: Vec<u32>,
    /// `Σ idf` of `terms` (module docs); a part without any scores nothing.
    reference: f32,
}

impl PartsQuery {
    /// How many parts it has (the texts it was made of).
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
}

impl LexicalScores {
    /// Returns the best `k` documents that pass `keep`, best first (ties by document).
    pub fn top(&self, k: usize, keep: impl Fn(u32) -> bool) -> Vec<(u32, f32)> {
        // Keys order by score, then the lower document first.
        let mut top = TopKeys::new(k);
        for &(doc, score) in &self.scores {
            let key = quality_key(score, doc);
            if top.could_take(key) && keep(doc) {
                top.take(key);
            }
        }
        top.into_best_first().into_iter().map(|key| (key_rank(key), key_score(key))).collect()
    }
}

/// The first place in `postings` (documents ascending) whose document is not
/// below `doc`: searched in steps that double from the start, then halved,
/// so a document near the start (the next candidate, usually) costs a few reads.
fn gallop(postings: &[(u32, f32)], doc: u32) -> usize {
    let mut end = 1;
    while end < postings.len() && postings[end - 1].0 < doc {
        end *= 2;
    }
    let start = end / 2;
    let end = end.min(postings.len());
    start + postings[start..end].partition_point(|&(found, _)| found < doc)
}

/// A term's share of a document's BM25 score: `idf · tf·(k1 + 1) / (tf + norm)`
/// for the term's `idf`, its weighted frequency `tf` in the document and the
/// document's [`length_norm`].
fn contribution(idf: f32, tf: f32, norm: f32) -> f32 {
    idf * (tf * (K1 + 1.0) / (tf + norm))
}

/// BM25's length normalisation of a document of weighted length `length`.
fn length_norm(length: f32, average: f32) -> f32 {
    K1 * (1.0 - B + B * length / average)
}

/// Fills `doc_terms` with the weighted frequency (BM25F's `tf`) of each term
/// of `descriptor`'s fields and of its `learned` words, each term numbered by
/// `term_id`; returns the document's weighted length. Both passes of the
/// build call it, so their frequencies are the same floats.
fn doc_term_weights(
    descriptor: &CapabilityDescriptor,
    weights: FieldWeights,
    learned: &[(String, u32)],
    doc_terms: &mut HashMap<u32, f32>,
    mut term_id: impl FnMut(String) -> u32,
) -> f32 {
    doc_terms.clear();
    let mut length = 0.0f32;
    let mut name_text = descriptor.name.clone();
    if descriptor.display_name != descriptor.name {
        name_text.push(' ');
        name_text.push_str(&descriptor.display_name);
    }
    let (parameters, parameter_descriptions) = parameter_texts(descriptor);
    let tags = descriptor.tags.join(" ");
    for (text, weight) in [
        (name_text.as_str(), weights.name),
        (descriptor.description.as_str(), weights.description),
        (descriptor.category.as_str(), weights.category),
        (tags.as_str(), weights.tags),
        (parameters.as_str(), weights.parameters),
        (parameter_descriptions.as_str(), weights.parameter_descriptions),
    ] {
        if weight <= 0.0 {
            continue;
        }
        for term in index_terms(text) {
            *doc_terms.entry(term_id(term)).or_insert(0.0) += weight;
            length += weight;
        }
    }
    for (term, requests) in learned {
        let weight = LEARNED_WORDS_WEIGHT * *requests as f32;
        if term.is_empty() || !(weight > 0.0 && weight.is_finite()) {
            continue;
        }
        *doc_terms.entry(term_id(term.clone())).or_insert(0.0) += weight;
        length += weight;
    }
    length
}

/// Returns the names and the descriptions of the top-level parameters of the
/// input schema, each joined, from one parse of the schema.
fn parameter_texts(descriptor: &CapabilityDescriptor) -> (String, String) {
    let Some(schema) = descriptor.full_schema.as_ref().map(|schema| schema.value()) else {
        return (String::new(), String::new());
    };
    let Some(properties) = schema.get("properties").and_then(|properties| properties.as_object()) else {
        return (String::new(), String::new());
    };
    let names: Vec<&str> = properties.keys().map(String::as_str).collect();
    let descriptions: Vec<&str> =
        properties.values().filter_map(|property| property.get("description")?.as_str()).collect();
    (names.join(" "), descriptions.join(" "))
}

/// The spelling exact-name matching compares: lower-cased letters and digits
/// only, so `Web Search`, `web-search` and `web_search` meet.
pub fn loose_key(text: &str) -> String {
    text.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::descriptor::{CapabilityKind, DefinitionRef};
    use proptest::prelude::*;

    fn descriptor(name: &str, description: &str, tags: &[&str]) -> CapabilityDescriptor {
        CapabilityDescriptor {
            id: format!("tool:{name}"),
            kind: CapabilityKind::Tool,
            name: name.into(),
            display_name: crate::core::descriptor::display_name_from(name),
            description: description.into(),
            category: "misc".into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            required_secrets: vec![],
            required_tools: vec![],
            available: true,
            has_side_effects: None,
            full_schema: Some(
                serde_json::json!({"type": "object", "properties": {"cityName": {"type": "string"}}}).into(),
            ),
            full_content: None,
            definition_ref: DefinitionRef::Builtin,
        }
    }

    #[test]
    fn tier_texts_are_made_once_per_document_and_equal_fresh_ones() {
        let descriptors = sample();
        let index = LexicalIndex::build(&descriptors);
        for descriptor in &descriptors {
            let summary = index.summary_line(descriptor);
            assert!(matches!(summary, Cow::Borrowed(_)));
            assert_eq!(summary, crate::core::text::summary_line(descriptor));
            assert_eq!(index.detail_text(descriptor), crate::core::text::detail_text(descriptor));
            // The second call returns the very text the first one made.
            assert!(std::ptr::eq(index.summary_line(descriptor).as_ref(), summary.as_ref()));
        }
        let stranger = descriptor("stranger", "Not in the index", &[]);
        assert!(matches!(index.summary_line(&stranger), Cow::Owned(_)));
        assert_eq!(index.detail_text(&stranger), crate::core::text::detail_text(&stranger));
    }

    fn sample() -> Vec<CapabilityDescriptor> {
        vec![
            descriptor("getWeatherForecast", "Forecast for the coming days", &["weather"]),
            descriptor("send_email", "Send an email message to a recipient", &["mail"]),
            descriptor("web-search", "Search the web for current information", &["search"]),
            descriptor("news-search", "Search recent news articles", &["news", "search"]),
        ]
    }

    fn ranked(index: &LexicalIndex, query: &str) -> Vec<String> {
        index.score(query).top(10, |_| true).into_iter().map(|(doc, _)| index.id(doc).to_string()).collect()
    }

    fn sorted_scores(index: &LexicalIndex, query: &str) -> Vec<(u32, u32)> {
        let mut scores: Vec<(u32, u32)> =
            index.score(query).scores.into_iter().map(|(doc, score)| (doc, score.to_bits())).collect();
        scores.sort_unstable();
        scores
    }

    #[test]
    fn learned_words_are_a_field_of_their_own() {
        let descriptors = sample();
        let plain = LexicalIndex::build(&descriptors);
        let nothing = LexicalIndex::build_learned(&descriptors, FIELD_WEIGHTS, &LearnedWords::new());
        for query in ["weather forecast", "search news", "send mail to Oslo"] {
            assert_eq!(
                sorted_scores(&plain, query),
                sorted_scores(&nothing, query),
                "nothing learned: the same floats"
            );
        }
        // Users asked the web search for flights twice: it now answers "flight" (as stemmed terms).
        let learned: LearnedWords =
            [("tool:web-search".to_string(), vec![("flight".to_string(), 2), ("cheap".to_string(), 2)])].into();
        let index = LexicalIndex::build_learned(&descriptors, FIELD_WEIGHTS, &learned);
        assert!(ranked(&plain, "cheap flights").is_empty());
        assert_eq!(ranked(&index, "cheap flights"), vec!["tool:web-search"]);
        // Weighed as two requests at LEARNED_WORDS_WEIGHT each: as a tag word seen once
        // (weight 1) in a document made as long.
        let mut tagged = descriptors.clone();
        tagged[2].tags.extend(["flight".to_string(), "cheap".to_string()]);
        let as_tags = LexicalIndex::build(&tagged);
        assert_eq!(sorted_scores(&index, "cheap flights"), sorted_scores(&as_tags, "cheap flights"));
        assert_eq!(sorted_scores(&index, "search news"), sorted_scores(&as_tags, "search news"));
    }

    #[test]
    fn names_split_and_match() {
        let index = LexicalIndex::build(&sample());
        assert_eq!(ranked(&index, "weather forecast")[0], "tool:getWeatherForecast");
        assert_eq!(ranked(&index, "emails")[0], "tool:send_email");
        assert_eq!(ranked(&index, "web")[0], "tool:web-search");
        // Parameter names are a field too: `cityName` splits into `city`.
        assert_eq!(ranked(&index, "city").len(), 4);
        assert!(ranked(&index, "zebra").is_empty());
    }

    #[test]
    fn scores_are_unit_and_full_matches_score_high() {
        let index = LexicalIndex::build(&sample());
        for query in ["search", "news search", "send email now", "the of", "web search for news"] {
            for (_, score) in index.score(query).scores {
                assert!((0.0..=1.0).contains(&score), "{query}: {score}");
            }
        }
        let best = index.score("news search").top(1, |_| true)[0];
        assert_eq!(index.id(best.0), "tool:news-search");
        assert!(best.1 > 0.8, "{best:?}");
    }

    #[test]
    fn exact_names_ignore_case_and_punctuation() {
        let index = LexicalIndex::build(&sample());
        let doc = index.doc("tool:web-search").unwrap();
        assert_eq!(index.exact_matches("Web Search"), &[(doc, ExactMatch::Name)]);
        assert_eq!(index.exact_matches("tool:web-search"), &[(doc, ExactMatch::Id)]);
        assert!(index.exact_matches("web").is_empty());
    }

    #[test]
    fn top_filters() {
        let index = LexicalIndex::build(&sample());
        let news = index.doc("tool:news-search").unwrap();
        let top = index.score("search").top(5, |doc| doc != news);
        assert!(top.iter().all(|(doc, _)| *doc != news));
        assert_eq!(top.len(), 1);
    }

    proptest! {
        #[test]
        fn top_matches_a_full_sort(
            words in proptest::collection::vec(proptest::sample::select(vec!["alpha", "beta", "gamma", "delta", "search", "send"]), 1..6),
            n_docs in 1usize..30,
            k in 0usize..8,
        ) {
            let descriptors: Vec<CapabilityDescriptor> = (0..n_docs)
                .map(|i| descriptor(&format!("cap{i}"), &words.iter().cycle().skip(i).take(1 + i % 4).copied().collect::<Vec<_>>().join(" "), &[]))
                .collect();
            let index = LexicalIndex::build(&descriptors);
            let scores = index.score(&words.join(" "));
            let mut all = scores.scores.clone();
            all.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            all.truncate(k);
            prop_assert_eq!(scores.top(k, |_| true), all);
            for (_, score) in scores.scores {
                prop_assert!((0.0..=1.0).contains(&score));
            }
        }

        #[test]
        fn the_parts_walk_gives_each_part_s_own_scores(
            texts in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(vec!["alpha", "beta", "gamma", "delta", "search", "send", "unknown"]), 0..5),
                1..4,
            ),
            n_docs in 1usize..40,
            k in 0usize..8,
            block in 1usize..9,
            odd in 1u32..4,
        ) {
            let words = ["alpha", "beta", "gamma", "delta", "search", "send"];
            let descriptors: Vec<CapabilityDescriptor> = (0..n_docs)
                .map(|i| descriptor(&format!("cap{i}"), &words.iter().cycle().skip(i).take(1 + i % 4).copied().collect::<Vec<_>>().join(" "), &[]))
                .collect();
            let index = LexicalIndex::build(&descriptors);
            let texts: Vec<String> = texts.iter().map(|words| words.join(" ")).collect();
            let query = index.parts_query(texts.iter().map(String::as_str));
            // A filter that turns some documents away.
            let keep = |doc: u32| doc % (odd + 1) != 1;
            let tops = index.top_of_parts_in_blocks(&query, k, keep, block);
            let docs: Vec<u32> = (0..n_docs as u32).collect();
            let mut scores = Vec::new();
            index.part_scores(&query, &docs, &mut scores);
            for (p, text) in texts.iter().enumerate() {
                let own = index.score(text);
                prop_assert_eq!(&tops[p], &own.top(k, keep), "part {}", p);
                for &doc in &docs {
                    let expected = own.scores.iter().find(|(d, _)| *d == doc).map_or(0.0, |(_, score)| *score);
                    prop_assert_eq!(scores[doc as usize * texts.len() + p].to_bits(), expected.to_bits());
                }
            }
        }
    }
}
