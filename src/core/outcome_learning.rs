//! Learning from outcomes while serving: the outcome prior
//! ([`crate::core::outcome_prior`]) and the outcome memory
//! ([`crate::core::outcome_memory`]) fed by the turns' outcomes, used by
//! discovery only once trials on those outcomes show they help
//! ([`crate::core::outcome_trust`]).
//!
//! A turn planned with a `turnId` leaves its message here
//! ([`TurnMessages`], bounded, oldest first out). When that turn's outcome
//! arrives and it succeeded, the learner ([`OutcomeLearning::learn`]):
//! 1. ranks the message with nothing learnt and with each of
//!    [`live_learnings`] (the prior as published, the memory fitted before
//!    this outcome: none saw the request), and records the gain in the
//!    reciprocal rank of the capabilities that did the job (a trial);
//! 2. remembers the message's vector and its words for each of them.
//!
//! Once [`MIN_TRIALS`] trials were made, discovery uses the learning
//! [`OutcomeTrust::chosen`] picks ([`OutcomeLearning::learned`]): the prior
//! (a capability it has nothing of its own for borrowing from its remembered
//! near-duplicates), the memory (its vectors: the capabilities moved towards
//! their requests, every other capability as its remembered near-duplicates
//! moved and by the memory's style shift; and its learned words, a field of
//! the lexical index), or both; with none chosen it
//! ranks exactly as with nothing learnt, so a capability no outcome named is
//! never ranked lower on the strength of a guess. Before, it ranks as
//! configured (the prior as `outcome_prior` says: it also serves deployments
//! whose outcomes name no planned turn, and dispatch results). The fitted vectors belong to one vector index, the
//! learned words' lexical index to one lexical index: a new catalog
//! publication is served without them until they are fitted to it again.

use crate::core::discovery::{ranked_ids, DiscoveryConfig};
use crate::core::evaluation::mean_reciprocal_rank;
use crate::core::index::VectorIndex;
use crate::core::lexical::{LearnedWords, LexicalIndex, FIELD_WEIGHTS};
use crate::core::outcome_memory::{Neighbourhood, OutcomeMemory};
use crate::core::outcome_prior::{NearDuplicates, OutcomePrior};
use crate::core::outcome_trust::{Learning, OutcomeTrust, TrustState};
use crate::core::retrieval::{Indexes, Query};
use crate::core::text::index_terms;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// The memory's own weights tried live, in requests: from one that soon
/// outweighs a capability's text to one that only leans on it.
pub const OWN_WEIGHTS: [f32; 4] = [1.0, 2.0, 5.0, 10.0];

/// Trials made before they decide what discovery uses: with fewer, the
/// standard error of a mean gain is itself too uncertain for the two-error
/// rule (a t distribution with fewer than 30 degrees of freedom is not yet
/// close to the normal), so discovery ranks as configured (the prior as
/// `outcome_prior` says, no memory).
pub const MIN_TRIALS: u64 = 30;

/// Successes learnt before the memory's vectors are fitted again for the trials.
pub const REFIT_EVERY: usize = 10;

/// The learnings tried live: the memory at each of [`OWN_WEIGHTS`] and its
/// words alone, and, when the prior may be used (`prior`, `[discovery]
/// outcome_prior`), the prior alone and with each of those.
pub fn live_learnings(prior: bool) -> Vec<Learning> {
    let memory =
        |prior| OWN_WEIGHTS.iter().map(move |&weight| Learning::memory(prior, weight)).chain([Learning::words(prior)]);
    let with_prior = prior.then(|| std::iter::once(Learning::PRIOR).chain(memory(true)));
    memory(false).chain(with_prior.into_iter().flatten()).collect()
}

/// The most bytes (ids and messages) [`TurnMessages`] keeps, whatever its
/// capacity in turns: requests may carry messages of up to a megabyte.
pub const TURN_MESSAGES_MAX_BYTES: usize = 8 << 20;

/// The messages of the turns planned lately, by `turnId`; at most
/// `capacity` turns and [`TURN_MESSAGES_MAX_BYTES`], the oldest dropped first.
#[derive(Clone, Debug)]
pub struct TurnMessages {
    capacity: usize,
    max_bytes: usize,
    bytes: usize,
    order: VecDeque<String>,
    messages: HashMap<String, String>,
}

impl TurnMessages {
    /// Keeps at most `capacity` turns (0 keeps none).
    pub fn new(capacity: usize) -> TurnMessages {
        TurnMessages::with_max_bytes(capacity, TURN_MESSAGES_MAX_BYTES)
    }

    /// Keeps at most `capacity` turns and `max_bytes` of ids and messages.
    pub fn with_max_bytes(capacity: usize, max_bytes: usize) -> TurnMessages {
        TurnMessages { capacity, max_bytes, bytes: 0, order: VecDeque::new(), messages: HashMap::new() }
    }

    /// Keeps `message` for `turn_id`; a turn planned again keeps its latest
    /// message. A turn larger than the byte bound alone is not kept.
    pub fn insert(&mut self, turn_id: &str, message: &str) {
        let size = turn_id.len() + message.len();
        self.take(turn_id);
        if self.capacity == 0 || size > self.max_bytes {
            return;
        }
        while self.messages.len() >= self.capacity || self.bytes + size > self.max_bytes {
            match self.order.pop_front() {
                Some(oldest) => {
                    if let Some(dropped) = self.messages.remove(&oldest) {
                        self.bytes -= oldest.len() + dropped.len();
                    }
                }
                None => break,
            }
        }
        self.order.push_back(turn_id.to_string());
        self.messages.insert(turn_id.to_string(), message.to_string());
        self.bytes += size;
    }

    /// The message of `turn_id`, no longer kept (an outcome is learnt once).
    pub fn take(&mut self, turn_id: &str) -> Option<String> {
        let message = self.messages.remove(turn_id)?;
        self.bytes -= turn_id.len() + message.len();
        // Outcomes mostly follow their plans closely: the newest turns are at the back.
        if let Some(position) = self.order.iter().rposition(|kept| kept == turn_id) {
            self.order.remove(position);
        }
        Some(message)
    }

    /// Number of turns kept.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether no turn is kept.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}

/// What discovery uses: the chosen learning, and with a memory, its vectors
/// in place of the vector index `base` and its lexical index (the learned
/// words) in place of the lexical index of generation `lexical_base`.
#[derive(Debug)]
pub struct Learned {
    pub base: Arc<VectorIndex>,
    pub vectors: Option<Arc<VectorIndex>>,
    /// With the memory: the lexical index with the capabilities' learned words
    /// (`LexicalIndex::build_learned`), `None` while no capability has any.
    pub lexical: Option<Arc<LexicalIndex>>,
    /// The generation of the published lexical index `lexical` was built beside.
    pub lexical_base: u64,
    pub learning: Learning,
    /// With the prior: the near-duplicates a capability the prior says
    /// nothing about borrows it from (`OutcomePrior::with_near`), as fitted to `base`.
    pub near: Option<Arc<NearDuplicates>>,
}

/// The memory's vectors at each own weight, fitted to one vector index, and
/// the remembered capabilities' near neighbours in it; its learned words in
/// a lexical index beside one published lexical index.
struct Fitted {
    base: Arc<VectorIndex>,
    adapted: Vec<(f32, Arc<VectorIndex>)>,
    neighbourhood: Neighbourhood,
    near: Arc<NearDuplicates>,
    /// The learned words `lexical` was built with.
    learned: LearnedWords,
    lexical: Option<Arc<LexicalIndex>>,
    lexical_base: u64,
}

/// A fit's lexical index, for the next fit beside the same lexical index to
/// take again when the learned words did not change.
struct LearnedLexical {
    learned: LearnedWords,
    lexical: Option<Arc<LexicalIndex>>,
    lexical_base: u64,
}

impl Fitted {
    /// Fits to `base` and to the catalog and lexical index of `published`,
    /// with what was found of `base`'s neighbourhood before, if anything, and
    /// the lexical index fitted before, taken again when it was built beside
    /// the same lexical index with the same learned words.
    fn fit(
        memory: &OutcomeMemory,
        base: &Arc<VectorIndex>,
        published: &Indexes<'_>,
        found: Option<Neighbourhood>,
        before: Option<LearnedLexical>,
    ) -> Fitted {
        let learned = memory.learned_words();
        let lexical_base = published.lexical.generation();
        // An index not taken again goes here, before anything is built.
        let kept = match before {
            Some(before) if before.lexical_base == lexical_base && before.learned == learned => Some(before.lexical),
            _ => None,
        };
        let mut neighbourhood = found.unwrap_or_else(|| Neighbourhood::new(base));
        neighbourhood.extend(memory, base);
        let adapted = OWN_WEIGHTS
            .iter()
            .map(|&weight| (weight, Arc::new(memory.adapt_index(base, weight, &neighbourhood))))
            .collect();
        let near = Arc::new(neighbourhood.near_duplicates(base));
        let lexical = kept.unwrap_or_else(|| {
            (!learned.is_empty()).then(|| {
                Arc::new(LexicalIndex::build_learned(published.catalog.descriptors.values(), FIELD_WEIGHTS, &learned))
            })
        });
        Fitted { base: base.clone(), adapted, neighbourhood, near, learned, lexical, lexical_base }
    }

    /// Whether this fit is of `base` and of the lexical index `lexical`.
    fn fits(&self, base: &Arc<VectorIndex>, lexical: &LexicalIndex) -> bool {
        Arc::ptr_eq(&self.base, base) && self.lexical_base == lexical.generation()
    }

    fn vectors(&self, weight: f32) -> Option<&Arc<VectorIndex>> {
        self.adapted.iter().find(|(fitted, _)| *fitted == weight).map(|(_, vectors)| vectors)
    }
}

/// One trial: the mean reciprocal rank of the capabilities that did the job
/// as discovery served them (`without`) and with each learning (`with`);
/// `unseen`: nothing was learnt about any of them before.
#[derive(Clone, Debug, PartialEq)]
pub struct Trial {
    pub without: f64,
    pub with: Vec<f64>,
    pub unseen: bool,
}

/// What serving discovery ranks with now: its indexes (with the vector
/// index published, not a learnt one), settings, and the prior as published.
pub struct Serving<'a> {
    indexes: Indexes<'a>,
    /// The published vector index, the one in `indexes`: the memory's fit is kept per index.
    vectors: &'a Arc<VectorIndex>,
    config: &'a DiscoveryConfig,
    prior: Option<&'a OutcomePrior>,
}

impl<'a> Serving<'a> {
    /// `indexes` ranking with `vectors`, the published vector index, whatever theirs was.
    pub fn new(
        indexes: Indexes<'a>,
        vectors: &'a Arc<VectorIndex>,
        config: &'a DiscoveryConfig,
        prior: Option<&'a OutcomePrior>,
    ) -> Serving<'a> {
        Serving { indexes: Indexes { vectors, ..indexes }, vectors, config, prior }
    }

    /// The indexes discovery ranks with as published.
    pub fn indexes(&self) -> &Indexes<'a> {
        &self.indexes
    }
}

/// The live learner's state: the memory, the trials, and the memory's
/// vectors as last fitted.
pub struct OutcomeLearning {
    memory: OutcomeMemory,
    trust: OutcomeTrust,
    fitted: Option<Fitted>,
    learnt_since_fit: usize,
}

impl OutcomeLearning {
    /// Nothing learnt, for vectors of `dimensions`; `prior`: whether the prior may be used.
    pub fn new(dimensions: usize, prior: bool) -> OutcomeLearning {
        OutcomeLearning::restore(OutcomeMemory::new(dimensions), None, prior)
    }

    /// What was kept: the memory, and the trials if they tried today's learnings.
    pub fn restore(memory: OutcomeMemory, trust: Option<TrustState>, prior: bool) -> OutcomeLearning {
        let learnings = live_learnings(prior);
        let trust = trust
            .and_then(|state| OutcomeTrust::from_state(state, &learnings))
            .unwrap_or_else(|| OutcomeTrust::new(&learnings));
        OutcomeLearning { memory, trust, fitted: None, learnt_since_fit: usize::MAX }
    }

    pub fn memory(&self) -> &OutcomeMemory {
        &self.memory
    }

    pub fn trust(&self) -> &OutcomeTrust {
        &self.trust
    }

    /// Learns that the capabilities `succeeded` did the job for `query` (the
    /// turn's message and clauses, embedded): a trial first, when something
    /// is remembered, then the message's vector remembered for each of them
    /// the served index holds. Returns the trial, if one was made, and the
    /// ids remembered. `may_refit`: whether the memory's vectors may be fitted
    /// again now (fitting costs a pass over the index per own weight; the
    /// caller bounds how often).
    pub fn learn(
        &mut self,
        query: &Query,
        succeeded: &[String],
        serving: &Serving<'_>,
        may_refit: bool,
    ) -> (Option<Trial>, Vec<String>) {
        let known: Vec<String> = succeeded
            .iter()
            .filter(|id| serving.vectors.stored_vector(id).is_some())
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let Some(request) = query.parts.first().map(|part| part.vector.as_slice()) else {
            return (None, Vec::new());
        };
        if known.is_empty() || request.len() != self.memory.dimensions() {
            return (None, Vec::new());
        }
        let trial = if self.memory.is_empty() { None } else { self.trial(query, &known, serving, may_refit) };
        let remembered = known.into_iter().filter(|id| self.memory.remember(id, request)).collect::<Vec<_>>();
        if !remembered.is_empty() {
            let words = query.parts.first().map(|part| index_terms(&part.text)).unwrap_or_default();
            for id in &remembered {
                self.memory.remember_words(id, &words);
            }
        }
        if !remembered.is_empty() {
            self.learnt_since_fit = self.learnt_since_fit.saturating_add(1);
        }
        (trial, remembered)
    }

    fn trial(&mut self, query: &Query, succeeded: &[String], serving: &Serving<'_>, may_refit: bool) -> Option<Trial> {
        self.fit(serving.vectors, &serving.indexes, may_refit);
        let fitted = self.fitted.as_ref()?;
        let succeeded: Vec<&str> = succeeded.iter().map(String::as_str).collect();
        // The prior as discovery would use it with this fit: borrowed along near-duplicates.
        let near_prior = serving.prior.map(|prior| prior.with_near(fitted.near.clone()));
        let reciprocal = |indexes: &Indexes<'_>, prior: bool| {
            let prior = near_prior.as_ref().filter(|_| prior);
            mean_reciprocal_rank(&ranked_ids(query, indexes, serving.config, prior), &succeeded)
        };
        let without = reciprocal(&serving.indexes, false);
        let with: Option<Vec<f64>> = self
            .trust
            .learnings()
            .iter()
            .map(|learning| {
                let vectors = match learning.memory_own_weight {
                    Some(weight) => fitted.vectors(weight)?,
                    None => serving.indexes.vectors,
                };
                let learned = fitted.lexical.as_deref().filter(|_| learning.memory_words);
                let lexical = learned.unwrap_or(serving.indexes.lexical);
                Some(reciprocal(&Indexes { vectors, lexical, ..serving.indexes }, learning.prior))
            })
            .collect();
        // Unseen: nothing learnt moved any of them yet (no remembered request, no prior of their own).
        let unseen =
            succeeded.iter().all(|id| self.memory.count(id) == 0 && serving.prior.is_none_or(|prior| !prior.knows(id)));
        let trial = Trial { without, with: with?, unseen };
        self.trust.record(trial.without, &trial.with, trial.unseen).then_some(trial)
    }

    /// Fits the memory to `base` and `published` (its catalog and lexical
    /// index) when it was fitted to others, or when [`REFIT_EVERY`] successes
    /// were learnt since and `may_refit`.
    fn fit(&mut self, base: &Arc<VectorIndex>, published: &Indexes<'_>, may_refit: bool) {
        let stale = self.fitted.as_ref().is_none_or(|fitted| !fitted.fits(base, published.lexical));
        if stale || (may_refit && self.learnt_since_fit >= REFIT_EVERY) {
            // The old fit's copies go first (never two sets of copies of the index at once); its
            // neighbourhood is kept for the same index.
            let (found, before) = match self.fitted.take() {
                Some(fitted) => {
                    let Fitted { base: fitted_base, neighbourhood, learned, lexical, lexical_base, .. } = fitted;
                    let found = Arc::ptr_eq(&fitted_base, base).then_some(neighbourhood);
                    (found, Some(LearnedLexical { learned, lexical, lexical_base }))
                }
                None => (None, None),
            };
            self.fitted = Some(Fitted::fit(&self.memory, base, published, found, before));
            self.learnt_since_fit = 0;
        }
    }

    /// Fits the memory to `base` and `published` now, whatever was fitted
    /// before (what a new catalog publication costs; `capdex bench
    /// --outcome-learning` times it).
    pub fn refit(&mut self, base: &Arc<VectorIndex>, published: &Indexes<'_>) {
        self.fitted = None;
        self.fitted = Some(Fitted::fit(&self.memory, base, published, None, None));
        self.learnt_since_fit = 0;
    }

    /// What the trials decided discovery uses, once [`MIN_TRIALS`] were made
    /// (`None` before: as configured): the chosen learning, or nothing learnt.
    pub fn decided(&self) -> Option<Learning> {
        (self.trust.trials() >= MIN_TRIALS).then(|| self.trust.chosen().unwrap_or(Learning::NOTHING))
    }

    /// What discovery should use with the vector index `base`, once
    /// [`MIN_TRIALS`] trials were made (`None` before: discovery ranks as
    /// configured): the chosen learning, with the memory's vectors fitted to
    /// `base` (again if `may_refit` and the memory grew by [`REFIT_EVERY`]
    /// since) and, with the prior, the near-duplicates it is borrowed along,
    /// or, with none chosen, nothing learnt (no prior, no memory).
    pub fn learned(&mut self, base: &Arc<VectorIndex>, published: &Indexes<'_>, may_refit: bool) -> Option<Learned> {
        let learning = self.decided()?;
        if learning.prior || learning.uses_memory() {
            self.fit(base, published, may_refit);
        }
        let fitted = self.fitted.as_ref().filter(|fitted| fitted.fits(base, published.lexical));
        let vectors = match learning.memory_own_weight {
            None => None,
            Some(weight) => Some(fitted?.vectors(weight)?.clone()),
        };
        let lexical = if learning.memory_words { fitted?.lexical.clone() } else { None };
        let near = fitted.filter(|_| learning.prior).map(|fitted| fitted.near.clone());
        let lexical_base = published.lexical.generation();
        Some(Learned { base: base.clone(), vectors, lexical, lexical_base, learning, near })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::catalog::Catalog;
    use crate::core::descriptor::CapabilityDescriptor;
    use crate::core::embedder::{Embed, HashingEmbedder};
    use crate::core::graph::CapabilityGraph;
    use crate::core::lexical::LexicalIndex;
    use crate::core::retrieval::query_texts;
    use crate::core::text::embedding_text;
    use proptest::prelude::*;

    #[test]
    fn turn_messages_keep_the_latest_turns_and_give_each_once() {
        let mut turns = TurnMessages::new(2);
        turns.insert("t1", "first");
        turns.insert("t2", "second");
        turns.insert("t1", "first, planned again");
        turns.insert("t3", "third");
        assert_eq!(turns.len(), 2);
        assert_eq!(turns.take("t2"), None, "the oldest turn made room (t1 was planned again since)");
        assert_eq!(turns.take("t1").as_deref(), Some("first, planned again"));
        assert_eq!(turns.take("t2"), None, "given once");
        assert_eq!(turns.take("t3").as_deref(), Some("third"));
        assert!(turns.is_empty());
        let mut none = TurnMessages::new(0);
        none.insert("t", "m");
        assert!(none.is_empty());
        // Bytes bound the turns kept too; a turn larger than the bound alone is not kept.
        let mut small = TurnMessages::with_max_bytes(100, 10);
        small.insert("a", "1234");
        small.insert("b", "5678");
        small.insert("c", "9");
        assert_eq!((small.len(), small.take("a")), (2, None));
        small.insert("d", "x".repeat(10).as_str());
        assert_eq!(small.take("d"), None);
    }

    proptest! {
        #[test]
        fn turn_messages_never_exceed_their_bounds(
            capacity in 0usize..8,
            max_bytes in 0usize..40,
            steps in proptest::collection::vec((any::<bool>(), 0u8..12, 0usize..12), 0..80),
        ) {
            let mut turns = TurnMessages::with_max_bytes(capacity, max_bytes);
            for (insert, turn, length) in steps {
                let turn = format!("t{turn}");
                let message = "m".repeat(length);
                if insert {
                    turns.insert(&turn, &message);
                    let fits = capacity > 0 && turn.len() + length <= max_bytes;
                    prop_assert_eq!(turns.messages.contains_key(&turn), fits);
                } else if let Some(kept) = turns.take(&turn) {
                    prop_assert!(kept.chars().all(|ch| ch == 'm'));
                }
                prop_assert!(turns.len() <= capacity);
                prop_assert_eq!(turns.order.len(), turns.messages.len());
                let bytes: usize = turns.messages.iter().map(|(id, message)| id.len() + message.len()).sum();
                prop_assert_eq!(turns.bytes, bytes);
                prop_assert!(bytes <= max_bytes);
            }
        }
    }

    fn tool(id: &str, description: &str) -> CapabilityDescriptor {
        crate::core::descriptor::test_tool(id.trim_start_matches("tool:"), description)
    }

    /// A catalog served by discovery, with its indexes.
    struct Served {
        catalog: Catalog,
        vectors: Arc<VectorIndex>,
        lexical: LexicalIndex,
        graph: CapabilityGraph,
        embedder: HashingEmbedder,
    }

    impl Served {
        fn new(descriptors: &[CapabilityDescriptor]) -> Served {
            let embedder = HashingEmbedder::default();
            let mut catalog = Catalog::default();
            let mut vectors = VectorIndex::new(embedder.dimensions());
            for descriptor in descriptors {
                vectors.upsert(&descriptor.id, &embedder.embed(&embedding_text(descriptor))).unwrap();
                catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
            }
            let graph = CapabilityGraph::build_from(catalog.descriptors.values(), &[]);
            Served { lexical: LexicalIndex::build(descriptors), catalog, vectors: Arc::new(vectors), graph, embedder }
        }

        fn query(&self, message: &str) -> Query {
            let texts = query_texts(message);
            let vectors = texts.iter().map(|text| self.embedder.embed(text)).collect();
            Query::new(texts, vectors)
        }

        fn serving<'a>(&'a self, config: &'a DiscoveryConfig, vectors: &'a Arc<VectorIndex>) -> Serving<'a> {
            let indexes = Indexes { catalog: &self.catalog, vectors, lexical: &self.lexical, graph: &self.graph };
            Serving::new(indexes, vectors, config, None)
        }
    }

    fn ledger_and_weather() -> Served {
        Served::new(&[
            tool("tool:ledger", "Record payments against open accounts payable entries"),
            tool("tool:weather", "Tell the weather forecast for a city"),
        ])
    }

    /// Requests worded unlike any description, each done by `tool:ledger` (also the learner's tests').
    pub(crate) const ASKED: [&str; 6] = [
        "what do I still owe the plumber",
        "how much is left on the plumber bill",
        "did the plumber get paid already",
        "settle what we owe the plumber",
        "remaining balance for the plumber",
        "is the plumber invoice cleared",
    ];

    #[test]
    fn learning_is_used_once_trials_show_it_lifts_what_did_the_job() {
        let served = Served::new(&[
            tool("tool:ledger", "Record payments against open accounts payable entries"),
            tool("tool:plumbing", "Find a plumber near you and book a visit"),
            tool("tool:weather", "Tell the weather forecast for a city"),
        ]);
        let config = DiscoveryConfig { use_graph_reranking: false, ..DiscoveryConfig::default() };
        let mut learning = OutcomeLearning::new(served.embedder.dimensions(), false);
        let done = vec!["tool:ledger".to_string()];
        let serving = served.serving(&config, &served.vectors);
        assert!(learning.learned(&served.vectors, &serving.indexes, true).is_none(), "as configured before any trial");
        for round in 0..6 {
            for asked in ASKED {
                let (trial, remembered) = learning.learn(&served.query(asked), &done, &serving, true);
                assert_eq!(remembered, done);
                assert_eq!(trial.is_some(), round > 0 || asked != ASKED[0], "a trial once something is remembered");
                if learning.trust().trials() < MIN_TRIALS {
                    assert_eq!(learning.decided(), None, "as configured before {MIN_TRIALS} trials");
                }
            }
        }
        let chosen = learning.learned(&served.vectors, &serving.indexes, true).expect("the trials show a gain");
        assert!(Arc::ptr_eq(&chosen.base, &served.vectors));
        assert_eq!(chosen.learning.memory_own_weight.map(|weight| OWN_WEIGHTS.contains(&weight)), Some(true));
        assert!(!chosen.learning.prior, "no prior is published here, so it cannot gain");
        // A request worded like the remembered ones now meets the ledger first.
        let asked = served.query("what do we still owe the electrician");
        let before = ranked_ids(&asked, &serving.indexes, &config, None);
        let vectors = chosen.vectors.as_ref().expect("the memory is what helps here");
        let lexical = chosen.lexical.as_deref().expect("words several requests held were learnt");
        let after = ranked_ids(&asked, &Indexes { vectors, lexical, ..serving.indexes }, &config, None);
        assert_ne!(before.first().map(String::as_str), Some("tool:ledger"));
        assert_eq!(after.first().map(String::as_str), Some("tool:ledger"));
        // The requests' words are the ledger's now: "owe" lifts it lexically too.
        let words = learning.memory().learned_words();
        let ledger: Vec<&str> = words["tool:ledger"].iter().map(|(word, _)| word.as_str()).collect();
        assert!(ledger.contains(&"plumber") && ledger.contains(&"owe"), "{ledger:?}");
        // Fitted to one index: another publication gets its own fit.
        let republished = Arc::new((*served.vectors).clone());
        let refitted = learning.learned(&republished, &serving.indexes, false).unwrap();
        assert!(Arc::ptr_eq(&refitted.base, &republished));
    }

    #[test]
    fn a_trial_is_unseen_while_nothing_was_learnt_about_what_did_the_job() {
        let served = ledger_and_weather();
        let config = DiscoveryConfig::default();
        let serving = served.serving(&config, &served.vectors);
        let mut learning = OutcomeLearning::new(served.embedder.dimensions(), false);
        let learn = |learning: &mut OutcomeLearning, asked: &str, done: &str| {
            learning.learn(&served.query(asked), &[done.to_string()], &serving, true).0
        };
        assert_eq!(learn(&mut learning, ASKED[0], "tool:ledger"), None, "nothing remembered to try yet");
        let first = learn(&mut learning, "rain tomorrow in Oslo?", "tool:weather").unwrap();
        assert!(first.unseen, "nothing learnt about the weather yet");
        let second = learn(&mut learning, "will it snow in Bergen?", "tool:weather").unwrap();
        assert!(!second.unseen);
        assert_eq!((learning.trust().trials(), learning.trust().unseen_trials()), (2, 1));
    }

    #[test]
    fn near_neighbours_are_looked_for_once_per_remembered_capability_and_index() {
        let descriptors = [
            tool("tool:ledger", "Record payments against open accounts payable entries"),
            tool("tool:weather", "Tell the weather forecast for a city"),
        ];
        let served = Served::new(&descriptors);
        let config = DiscoveryConfig::default();
        let serving = served.serving(&config, &served.vectors);
        let mut learning = OutcomeLearning::new(served.embedder.dimensions(), false);
        learning.learn(&served.query(ASKED[0]), &["tool:ledger".to_string()], &serving, true);
        learning.learn(&served.query("rain tomorrow in Oslo?"), &["tool:weather".to_string()], &serving, true);
        let looked = |learning: &OutcomeLearning| learning.fitted.as_ref().map(|fitted| fitted.neighbourhood.sources());
        assert_eq!(looked(&learning), Some(1), "fitted for the trial, before the weather was remembered");
        for asked in &ASKED[1..] {
            learning.learn(&served.query(asked), &["tool:ledger".to_string()], &serving, true);
        }
        for city in ["Bergen", "Turku", "Riga", "Malmo", "Tartu"] {
            let asked = format!("rain tomorrow in {city}?");
            learning.learn(&served.query(&asked), &["tool:weather".to_string()], &serving, true);
        }
        assert_eq!(looked(&learning), Some(2), "the refit looked from the newly remembered one alone");
        // A new publication with one more capability: its own neighbourhood.
        let mut grown = (*served.vectors).clone();
        grown.upsert("tool:other", &served.embedder.embed("Tell the weather forecast for a town")).unwrap();
        let grown = Arc::new(grown);
        learning.refit(&grown, &serving.indexes);
        let fitted = learning.fitted.as_ref().unwrap();
        assert_eq!((fitted.neighbourhood.sources(), Arc::ptr_eq(&fitted.base, &grown)), (2, true));
    }

    #[test]
    fn a_refit_builds_the_learned_words_index_again_only_when_they_changed() {
        let served = ledger_and_weather();
        let config = DiscoveryConfig::default();
        let serving = served.serving(&config, &served.vectors);
        let mut learning = OutcomeLearning::new(served.embedder.dimensions(), false);
        let ledger = ["tool:ledger".to_string()];
        learning.learn(&served.query(ASKED[0]), &ledger, &serving, false);
        learning.learn(&served.query(ASKED[1]), &ledger, &serving, false);
        learning.refit(&served.vectors, &serving.indexes);
        let lexical = |learning: &OutcomeLearning| learning.fitted.as_ref().unwrap().lexical.clone().unwrap();
        let first = lexical(&learning);
        // A success whose words no other request held: nothing new is learned, the index is kept.
        learning.learn(&served.query("rain tomorrow in Oslo?"), &["tool:weather".to_string()], &serving, false);
        learning.learnt_since_fit = REFIT_EVERY;
        learning.fit(&served.vectors, &serving.indexes, true);
        assert!(Arc::ptr_eq(&first, &lexical(&learning)));
        // "plumber" held by a third request: built again.
        learning.learn(&served.query(ASKED[2]), &ledger, &serving, false);
        learning.learnt_since_fit = REFIT_EVERY;
        learning.fit(&served.vectors, &serving.indexes, true);
        assert!(!Arc::ptr_eq(&first, &lexical(&learning)));
    }

    #[test]
    fn the_prior_is_tried_only_where_it_may_be_used() {
        let without = live_learnings(false);
        assert_eq!(without.len(), OWN_WEIGHTS.len() + 1);
        assert!(without.iter().all(|learning| !learning.prior && learning.memory_words));
        assert!(without.contains(&Learning::words(false)), "the memory's words alone are tried too");
        let with = live_learnings(true);
        assert_eq!(with.len(), 2 * (OWN_WEIGHTS.len() + 1) + 1);
        assert!(with.contains(&Learning::PRIOR) && with.contains(&Learning::words(true)));
        assert_eq!(with.iter().filter(|learning| learning.prior).count(), OWN_WEIGHTS.len() + 2);
    }

    #[test]
    fn ids_the_index_does_not_hold_and_vectors_of_another_model_are_not_learnt() {
        let served = Served::new(&[tool("tool:weather", "Tell the weather forecast for a city")]);
        let config = DiscoveryConfig::default();
        let serving = served.serving(&config, &served.vectors);
        let mut learning = OutcomeLearning::new(served.embedder.dimensions(), false);
        let (trial, remembered) =
            learning.learn(&served.query("rain tomorrow?"), &["tool:unknown".to_string()], &serving, true);
        assert_eq!((trial, remembered.len()), (None, 0));
        let mut other = OutcomeLearning::new(3, false);
        let (_, remembered) =
            other.learn(&served.query("rain tomorrow?"), &["tool:weather".to_string()], &serving, true);
        assert!(remembered.is_empty() && other.memory().is_empty());
    }

    #[test]
    fn a_memory_that_only_hurts_is_never_chosen() {
        // Two near-identical tools; requests that succeeded with one are asked of the other.
        let served = Served::new(&[
            tool("tool:convert-a", "Convert an amount between two currencies"),
            tool("tool:convert-b", "Convert an amount between two currencies today"),
            tool("tool:weather", "Tell the weather forecast for a city"),
        ]);
        let config = DiscoveryConfig { use_graph_reranking: false, ..DiscoveryConfig::default() };
        let serving = served.serving(&config, &served.vectors);
        let mut learning = OutcomeLearning::new(served.embedder.dimensions(), false);
        for round in 0..40 {
            let done = if round % 2 == 0 { "tool:convert-a" } else { "tool:convert-b" };
            let asked = format!("convert {} euros to dollars", 10 + round);
            learning.learn(&served.query(&asked), &[done.to_string()], &serving, true);
        }
        assert!(learning.trust().trials() >= MIN_TRIALS);
        let learned = learning.learned(&served.vectors, &serving.indexes, true).unwrap();
        assert_eq!(
            (learned.learning, learned.vectors.is_none(), learned.lexical.is_none()),
            (Learning::NOTHING, true, true),
            "{:?}",
            learning.trust().gains()
        );
    }
}
