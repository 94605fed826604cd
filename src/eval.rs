//! `capdex eval`: indexes a benchmark `tools.jsonl`, ranks every query of a
//! `queries.jsonl` through the core (no actors), writes the run file and
//! scores it with `core::evaluation`.
//!
//! The ranking is the one discovery uses ([`crate::core::retrieval::rank`]: hybrid retrieval, clause
//! fusion, graph re-ranking as configured), read to `depth` results, with no
//! relevance minimum (a run file is a ranking, not a prompt), unless
//! `empty_when_nothing_fits` asks for an empty ranking where Tier 1 is empty.
//!
//! The embedder is the configured one, or the one `--embedder` picks
//! (`builtin`, `static`, `local --model-dir DIR`, `http --endpoint URL --model NAME`);
//! tools are embedded in batches of `embedder.batch_size`. An embedder that
//! fails stops the evaluation (a score without the dense signal would not be
//! the one asked for).
//!
//! Queries may come from several files (read as one list); a query may carry
//! its own `tools` (ranked against those alone) and `"relevant": []` (nothing
//! fits: the right answer is an empty Tier 1). Metrics cover the answerable
//! queries; [`NothingFits`] counts, with discovery's own Tier 1 rule, the
//! unanswerable ones answered empty and the answerable ones that keep a
//! relevant capability in Tier 1. `--replay SEED` runs the outcome replay
//! protocol ([`ReplayReport`]).
//!
//! With a cache directory, every vector (tools and query parts) is kept in a
//! sled store keyed by [`text_hash`] of model id and text, so a second
//! evaluation with the same model embeds nothing already seen: ablations and
//! sweeps of a neural model cost ranking time only. The model's own vectors
//! are cached; the static table's (`[embedder] static_share`) are joined to
//! them after, so a sweep of the share embeds nothing again either.

use crate::config::EmbedderSettings;
use crate::core::catalog::Catalog;
use crate::core::discovery::{asks_for_nothing, tier1_with_dependencies, DiscoveryConfig, DiscoveryFilter};
use crate::core::embedder::{embed_in_batches_as, text_hash, Embed, EmbedError, TextRole};
use crate::core::evaluation::{
    aggregate, mean_reciprocal_rank, replay_outcomes, score_query, seeded_halves, seeded_order, Metrics, NothingFits,
    QueryRecord, QueryScores, RunLine, ToolRecord,
};
use crate::core::graph::CapabilityGraph;
use crate::core::index::VectorIndex;
use crate::core::kpi_window::OutcomeReport;
use crate::core::lexical::{FieldWeights, LexicalIndex};
use crate::core::nothing_fits::{chatter_likeness, chatter_texts, coverage, terms_of, GenericFloor};
use crate::core::outcome_learning::{OutcomeLearning, Serving};
use crate::core::outcome_memory::{Neighbourhood, OutcomeMemory};
use crate::core::outcome_prior::{distinct_ids, OutcomePrior, OutcomePriorSettings, OutcomeStats};
use crate::core::outcome_trust::{Learning, OutcomeTrust, TrialGain};
use crate::core::retrieval::{query_texts, rank_with, Fusion, Indexes, Query, RankedHit};
use crate::core::static_share;
use crate::core::text::{embedding_text, index_terms};
use crate::store::{Store, StoreError};
use serde::de::DeserializeOwned;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// What to evaluate.
#[derive(Clone, Debug)]
pub struct EvalOptions {
    pub tools: PathBuf,
    /// Query files, read one after the other as one list.
    pub queries: Vec<PathBuf>,
    pub out: Option<PathBuf>,
    /// Ranked ids written per query.
    pub depth: usize,
    pub config: DiscoveryConfig,
    /// Which embedder, as in the `[embedder]` settings.
    pub embedder: EmbedderSettings,
    /// Fusion weights; the default is the one discovery uses.
    pub fusion: Fusion,
    /// Lexical field weights; the default is the one discovery uses.
    pub field_weights: FieldWeights,
    /// The outcome prior applied to every ranking, as discovery applies it.
    pub outcome_prior: Option<OutcomePrior>,
    /// Keep vectors in a sled store here, keyed by model and text.
    pub cache: Option<PathBuf>,
    /// Write an empty ranking for a request whose Tier 1 is empty ("nothing
    /// fits"); otherwise the run holds every request's ranking.
    pub empty_when_nothing_fits: bool,
    /// Run the outcome replay protocol with this seed ([`ReplayReport`]).
    pub replay: Option<u64>,
    /// The outcome prior's settings the replay builds its prior with.
    pub prior_settings: OutcomePriorSettings,
    /// Write, per request, the signals "nothing fits" can be decided on
    /// ([`crate::core::nothing_fits`]) as JSON lines here.
    pub signals: Option<PathBuf>,
}

/// The outcome of one evaluation.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvalReport {
    pub tools: usize,
    pub metrics: Metrics,
    pub build_ms: f64,
    pub query_ms_mean: f64,
    /// The embedder's model id.
    pub model_id: String,
    /// Mean time to embed one query (its whole text and clauses), in ms.
    pub query_embed_ms_mean: f64,
    /// Empty Tier 1 for requests nothing fits, kept Tier 1 for the others.
    pub nothing_fits: NothingFits,
    /// The outcome replay, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayReport>,
}

/// The outcome replay protocol: the answerable requests are split in two
/// halves ([`seeded_halves`]); the first half's outcomes ([`replay_outcomes`])
/// arrive one request at a time, in a seeded order, and are credited to the
/// outcome statistics (the scalar prior) and, for successes, to the outcome
/// memory ([`OutcomeMemory`]: the request's vector and its words). Before each request's outcomes are learnt,
/// every learning of [`crate::core::outcome_trust::TRIED`] is tried on it
/// ([`OutcomeTrust`]). The second half is then ranked with no learning, with
/// the learning the trials chose, and with each tried learning (chosen or
/// not), to show what the choice is worth.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayReport {
    pub seed: u64,
    /// Requests whose outcomes were fed in.
    pub first_half: usize,
    /// Outcomes credited (successes and failures).
    pub outcomes: usize,
    /// Capabilities the prior adjusts.
    pub adjusted: usize,
    /// Capabilities with remembered requests ([`OutcomeMemory`]).
    pub remembered: usize,
    /// Remembered capabilities with learned words ([`OutcomeMemory::learned_words`]).
    pub learned_words: usize,
    /// Trials of the learnings on the first half's requests as they came.
    pub trials: u64,
    /// Those whose capabilities had no outcome yet.
    pub unseen_trials: u64,
    /// The learning the trials chose; `None`: nothing learnt is used.
    pub chosen: Option<Learning>,
    /// The second half ranked with no learning.
    pub without_learning: Metrics,
    /// The second half ranked with the chosen learning (as without, when none).
    pub learned: Metrics,
    /// Requests of the second half whose relevant capabilities were in no outcome.
    pub unseen: usize,
    /// Those requests with no learning, and with the chosen one: what the
    /// learning costs capabilities it never saw.
    pub unseen_without_learning: Metrics,
    pub unseen_learned: Metrics,
    /// Each tried learning: its trials' gain, and the second half (and its
    /// unseen requests) ranked with it, chosen or not.
    pub at_each_learning: Vec<LearningTrial>,
    /// What `capdex serve` learns from the same outcomes (`core::outcome_learning`).
    pub served: ServedReplay,
}

/// The replay as `capdex serve` learns ([`OutcomeLearning`], its trials
/// on the first half's successes as they come, ranked as discovery ranks):
/// what it would use for the second half.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServedReplay {
    /// Whether the prior may be used (`[discovery] outcome_prior`).
    pub prior: bool,
    pub trials: u64,
    pub unseen_trials: u64,
    /// The learning the trials chose; `None`: nothing learnt is used (from
    /// `core::outcome_learning::MIN_TRIALS` trials on; before, as configured).
    pub chosen: Option<Learning>,
    /// The second half with nothing learnt, and with what serve would use.
    pub as_served: Metrics,
    pub learned: Metrics,
    pub unseen_as_served: Metrics,
    pub unseen_learned: Metrics,
}

/// One learning of the replay's [`OutcomeTrust`]: what its trials gained
/// (mean reciprocal rank of the capabilities that did the job), and what it
/// gives the second half.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LearningTrial {
    #[serde(flatten)]
    pub trial: TrialGain,
    pub second_half: Metrics,
    pub unseen: Metrics,
}

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("failed to read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} line {line}: {source}")]
    Parse { path: PathBuf, line: usize, source: serde_json::Error },
    #[error("failed to write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("the embedder gave vectors of another dimension than its first ones")]
    Dimensions,
    #[error("{path} outcome {number}: {problem}")]
    Outcome { path: PathBuf, number: usize, problem: String },
    #[error(transparent)]
    Embedder(#[from] EmbedError),
    #[error("embedding cache: {0}")]
    Cache(#[from] StoreError),
}

/// The configured model, the cache of its vectors and the static table's share beside it:
/// the model's vectors are cached alone, so a run with another share embeds nothing again.
struct Vectors<'a> {
    model: &'a dyn Embed,
    cache: Option<&'a Store>,
    static_share: Option<f32>,
    batch_size: usize,
}

impl Vectors<'_> {
    /// The vectors of `texts` in their `role`, the static table's joined to the model's.
    fn of(&self, texts: &[String], role: TextRole) -> Result<Vec<Vec<f32>>, EvalError> {
        let vectors = embed_cached(self.model, self.cache, texts, self.batch_size, role)?;
        Ok(match self.static_share {
            Some(share) => static_share::join(texts, vectors, share),
            None => vectors,
        })
    }

    /// The model id of the vectors [`Vectors::of`] gives.
    fn model_id(&self) -> String {
        match self.static_share {
            Some(share) => static_share::joined_model_id(&self.model.model_id(), share),
            None => self.model.model_id(),
        }
    }
}

/// The vectors of `texts` in their `role`: from `cache` where it has them, the others
/// embedded in batches of `batch_size` (and cached; a request's vector under its own key,
/// since a model may embed a request differently from the same text of a capability).
fn embed_cached(
    embedder: &(impl Embed + ?Sized),
    cache: Option<&Store>,
    texts: &[String],
    batch_size: usize,
    role: TextRole,
) -> Result<Vec<Vec<f32>>, EvalError> {
    let Some(cache) = cache else {
        return Ok(embed_in_batches_as(embedder, texts, batch_size, role)?);
    };
    let model_id = match role {
        TextRole::Document => embedder.model_id(),
        TextRole::Query => format!("{}#query", embedder.model_id()),
    };
    let hashes: Vec<String> = texts.iter().map(|text| text_hash(&model_id, text)).collect();
    let mut vectors = Vec::with_capacity(texts.len());
    let mut missing = Vec::new();
    for (i, hash) in hashes.iter().enumerate() {
        let cached = cache.text_embedding(hash)?;
        if cached.is_none() {
            missing.push(i);
        }
        vectors.push(cached.unwrap_or_default());
    }
    let texts_missing: Vec<String> = missing.iter().map(|&i| texts[i].clone()).collect();
    let embedded = embed_in_batches_as(embedder, &texts_missing, batch_size, role)?;
    for (i, vector) in missing.into_iter().zip(embedded) {
        cache.put_text_embedding(&hashes[i], &vector)?;
        vectors[i] = vector;
    }
    Ok(vectors)
}

/// Builds the outcome prior from task outcomes (`capdex.v1.outcome` objects,
/// one a line), all observed at the same instant so none has decayed.
pub fn prior_from_outcomes(path: &Path, settings: &OutcomePriorSettings) -> Result<OutcomePrior, EvalError> {
    let reports: Vec<OutcomeReport> = read_jsonl(path)?;
    let mut stats = OutcomeStats::default();
    for (i, report) in reports.iter().enumerate() {
        let sample = report
            .validate(0, crate::core::kpi_window::OutcomeLimits::default())
            .map_err(|err| EvalError::Outcome { path: path.into(), number: i + 1, problem: err.to_string() })?;
        for capability_id in distinct_ids(&report.capabilities) {
            stats.credit(capability_id, sample.score, 0, settings.half_life_ms);
        }
    }
    Ok(stats.snapshot(settings, 0))
}

/// Reads a JSON-lines file, skipping blank lines.
fn read_jsonl<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, EvalError> {
    let text = std::fs::read_to_string(path).map_err(|source| EvalError::Read { path: path.into(), source })?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|source| EvalError::Parse { path: path.into(), line: i + 1, source })
        })
        .collect()
}

/// A tool set indexed as discovery indexes a catalog.
struct Indexed {
    catalog: Catalog,
    vectors: VectorIndex,
    lexical: LexicalIndex,
    graph: CapabilityGraph,
}

impl Indexed {
    fn indexes(&self) -> Indexes<'_> {
        Indexes { catalog: &self.catalog, vectors: &self.vectors, lexical: &self.lexical, graph: &self.graph }
    }
}

/// Indexes `tools` (a repeated id keeps its first record) with the vectors `vectors_of` gives.
fn index_tools(tools: &[ToolRecord], vectors_of: &Vectors<'_>, options: &EvalOptions) -> Result<Indexed, EvalError> {
    let descriptors: Vec<_> = tools.iter().map(ToolRecord::to_descriptor).collect();
    let mut catalog = Catalog::default();
    let mut unique = Vec::with_capacity(descriptors.len());
    for descriptor in &descriptors {
        if !catalog.descriptors.contains_key(&descriptor.id) {
            catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
            unique.push(descriptor);
        }
    }
    let texts: Vec<String> = unique.iter().map(|descriptor| embedding_text(descriptor)).collect();
    let embedded = vectors_of.of(&texts, TextRole::Document)?;
    let dimensions = embedded.first().map_or(0, Vec::len);
    let mut vectors = VectorIndex::with_capacity(dimensions, unique.len());
    for (descriptor, vector) in unique.iter().zip(embedded) {
        vectors.upsert(&descriptor.id, &vector).map_err(|_| EvalError::Dimensions)?;
    }
    let lexical = LexicalIndex::build_with(&descriptors, options.field_weights);
    let graph = CapabilityGraph::build(&descriptors, &[]);
    Ok(Indexed { catalog, vectors, lexical, graph })
}

/// One request, embedded and ranked.
struct Ranked {
    /// Best first, at most `depth` (and `2 · tier1TopK`) of them, before any prior.
    hits: Vec<RankedHit>,
    /// The request's texts and vectors (ranked again by the replay).
    query: Query,
}

/// Runs the evaluation described by `options`.
pub fn run(options: &EvalOptions) -> Result<EvalReport, EvalError> {
    let tools: Vec<ToolRecord> = read_jsonl(&options.tools)?;
    let mut queries: Vec<QueryRecord> = Vec::new();
    for path in &options.queries {
        queries.extend(read_jsonl::<QueryRecord>(path)?);
    }
    let model = crate::embedders::backend::build_model(&options.embedder)?;
    let cache = options.cache.as_deref().map(Store::open).transpose()?;
    let vectors_of = Vectors {
        model: model.as_ref(),
        cache: cache.as_ref(),
        static_share: crate::embedders::backend::static_share(&options.embedder),
        batch_size: options.embedder.batch_size,
    };

    let started = Instant::now();
    let shared = index_tools(&tools, &vectors_of, options)?;
    let build_ms = started.elapsed().as_secs_f64() * 1e3;

    let filter = DiscoveryFilter::default();
    let graph_boost = options.config.use_graph_reranking.then_some(options.config.graph_boost_factor);
    // Deep enough for the run file and for Tier 1 with its dependencies.
    let limit = options.depth.max(options.config.tier1_top_k * 2);
    // The chatter sentences by the same model, for the chatter gate and the signals.
    let generic = if options.config.chatter_gate || options.signals.is_some() {
        vectors_of.of(&chatter_texts(), TextRole::Query)?
    } else {
        Vec::new()
    };
    let started = Instant::now();
    let mut embed_seconds = 0.0;
    let mut ranked: Vec<Ranked> = Vec::with_capacity(queries.len());
    // A request with its own tools is ranked against an index of those alone.
    let mut own: Vec<Option<Indexed>> = Vec::with_capacity(queries.len());
    for record in &queries {
        let texts = query_texts(&record.query);
        let embed_started = Instant::now();
        let query_vectors = vectors_of.of(&texts, TextRole::Query)?;
        embed_seconds += embed_started.elapsed().as_secs_f64();
        let query = Query::new(texts, query_vectors).with_chatter(&generic);
        let indexed = match &record.tools {
            Some(tools) => Some(index_tools(tools, &vectors_of, options)?),
            None => None,
        };
        let indexes = indexed.as_ref().unwrap_or(&shared).indexes();
        let ranking = rank_with(&query, &indexes, &filter, limit, graph_boost, options.fusion);
        ranked.push(Ranked { hits: ranking.hits, query });
        own.push(indexed);
    }
    let query_ms_mean = started.elapsed().as_secs_f64() * 1e3 / queries.len().max(1) as f64;
    if let Some(cache) = &cache {
        cache.flush()?;
    }
    let query_embed_ms_mean = embed_seconds * 1e3 / queries.len().max(1) as f64;
    let indexes_of = |i: usize| own[i].as_ref().unwrap_or(&shared).indexes();

    // The run: every request's ranking, or, when asked, an empty one where Tier 1 is empty ("nothing fits").
    let reach = DiscoveryConfig { tier1_min_relevance: 0.0, ..options.config.clone() };
    let mut nothing_fits = NothingFits::default();
    let mut runs: Vec<RunLine> = Vec::with_capacity(queries.len());
    for (query_idx, (record, ranking)) in queries.iter().zip(&ranked).enumerate() {
        let mut hits = ranking.hits.clone();
        if let Some(prior) = &options.outcome_prior {
            prior.apply(&mut hits);
        }
        let indexes = indexes_of(query_idx);
        let without_gate = tier1_with_dependencies(&hits, &indexes, &options.config, &filter);
        let holds = |tier1: &[(String, f32)]| tier1.iter().any(|(id, _)| record.relevant.contains(id));
        let held_without_gate = holds(&without_gate);
        let tier1 =
            if asks_for_nothing(&ranking.query, &hits, &indexes, &options.config) { Vec::new() } else { without_gate };
        if record.answerable() {
            let in_reach = holds(&tier1_with_dependencies(&hits, &indexes, &reach, &filter));
            nothing_fits.answerable(in_reach, held_without_gate, holds(&tier1));
        } else {
            nothing_fits.unanswerable(record.split.as_deref(), tier1.is_empty());
        }
        let ranked_ids = if tier1.is_empty() && options.empty_when_nothing_fits {
            Vec::new()
        } else {
            hits.into_iter().take(options.depth).map(|hit| hit.id).collect()
        };
        runs.push(RunLine { query_idx, ranked: ranked_ids });
    }

    if let Some(out) = &options.out {
        let write_error = |source| EvalError::Write { path: out.clone(), source };
        let file = std::fs::File::create(out).map_err(write_error)?;
        let mut writer = std::io::BufWriter::new(file);
        for line in &runs {
            let json = serde_json::to_string(line).expect("a run line always serialises");
            writeln!(writer, "{json}").map_err(write_error)?;
        }
        writer.flush().map_err(write_error)?;
    }
    // Metrics are over the answerable requests (a request nothing fits has no relevant capability to find).
    let answerable: Vec<usize> = (0..queries.len()).filter(|&i| queries[i].answerable()).collect();
    let scores: Vec<QueryScores> =
        answerable.iter().map(|&i| score_query(&runs[i].ranked, &queries[i].relevant)).collect();
    let replay = options.replay.map(|seed| replay(seed, options, &queries, &ranked, &answerable, &shared));
    if let Some(path) = &options.signals {
        write_signals(path, &queries, &ranked, &shared, &own, &generic)?;
    }
    Ok(EvalReport {
        tools: shared.catalog.len(),
        metrics: aggregate(&scores, answerable.len()),
        build_ms,
        query_ms_mean,
        model_id: vectors_of.model_id(),
        query_embed_ms_mean,
        nothing_fits,
        replay,
    })
}

/// Writes, per request, its first hits' signals for "nothing fits": relevance,
/// whole-message cosine, coverage of the request's words, whether relevant;
/// and the request's likeness to chatter beside the catalog's generic floor.
fn write_signals(
    path: &Path,
    queries: &[QueryRecord],
    ranked: &[Ranked],
    shared: &Indexed,
    own: &[Option<Indexed>],
    generic: &[Vec<f32>],
) -> Result<(), EvalError> {
    let write_error = |source| EvalError::Write { path: path.into(), source };
    let file = std::fs::File::create(path).map_err(write_error)?;
    let mut writer = std::io::BufWriter::new(file);
    let shared_floor = GenericFloor::measure(generic, &shared.vectors);
    for (i, (record, ranking)) in queries.iter().zip(ranked).enumerate() {
        let indexes = own[i].as_ref().unwrap_or(shared).indexes();
        let floor = match record.tools {
            Some(_) => GenericFloor::measure(generic, indexes.vectors),
            None => shared_floor.clone(),
        };
        let whole = ranking.query.parts.first().map(|part| part.vector.as_slice()).unwrap_or(&[]);
        let hits: Vec<serde_json::Value> = ranking
            .hits
            .iter()
            .take(5)
            .map(|hit| {
                let text = indexes.catalog.descriptors.get(&hit.id).map(embedding_text).unwrap_or_default();
                serde_json::json!({
                    "relevant": record.relevant.contains(&hit.id),
                    "relevance": hit.relevance,
                    "cosine": indexes.vectors.cosine(&hit.id, whole),
                    "coverage": coverage(&record.query, &terms_of(&text)),
                    "exact": hit.exact.is_some(),
                })
            })
            .collect();
        let line = serde_json::json!({
            "queryIdx": i,
            "answerable": record.answerable(),
            "genericLikeness": chatter_likeness(whole, generic),
            "floorMax": floor.floor(),
            "floorMedian": floor.quantile(0.5),
            "floorQ90": floor.quantile(0.9),
            "hits": hits,
        });
        writeln!(writer, "{line}").map_err(write_error)?;
    }
    writer.flush().map_err(write_error)
}

/// Requests learnt between two refits of the learnings the replay tries.
const TRIAL_REFIT_EVERY: usize = 10;

/// What the outcomes so far have taught, once: the prior's snapshot, the
/// memory's index at each own weight the learnings use and the lexical index
/// with its learned words; each [`Learning`] ranks with its part of it
/// ([`Learnt::rank`]).
struct Learnt<'a> {
    prior: OutcomePrior,
    adapted: Vec<(f32, VectorIndex)>,
    /// The lexical index with the memory's learned words, when a learning uses the memory.
    lexical: Option<LexicalIndex>,
    shared: &'a Indexed,
}

impl<'a> Learnt<'a> {
    fn new(
        learnings: &[Learning],
        stats: &OutcomeStats,
        memory: &OutcomeMemory,
        neighbourhood: &Neighbourhood,
        options: &EvalOptions,
        shared: &'a Indexed,
    ) -> Learnt<'a> {
        let mut adapted: Vec<(f32, VectorIndex)> = Vec::new();
        for weight in learnings.iter().filter_map(|learning| learning.memory_own_weight) {
            if !adapted.iter().any(|(done, _)| *done == weight) {
                adapted.push((weight, memory.adapt_index(&shared.vectors, weight, neighbourhood)));
            }
        }
        // The prior borrowed along near-duplicates, as `capdex serve` applies it.
        let near = Arc::new(neighbourhood.near_duplicates(&shared.vectors));
        let learned = memory.learned_words();
        let lexical = (learnings.iter().any(|learning| learning.memory_words) && !learned.is_empty())
            .then(|| LexicalIndex::build_learned(shared.catalog.descriptors.values(), options.field_weights, &learned));
        Learnt { prior: stats.snapshot(&options.prior_settings, 0).with_near(near), adapted, lexical, shared }
    }

    /// `ranked`'s request ranked again with `learning` (`None`: no learning; the
    /// request's own ranking where the memory is not used or it came with its own tools).
    fn rank(
        &self,
        learning: Option<Learning>,
        ranked: &Ranked,
        record: &QueryRecord,
        options: &EvalOptions,
    ) -> Vec<RankedHit> {
        let Some(learning) = learning else { return ranked.hits.clone() };
        let vectors = match learning.memory_own_weight {
            Some(weight) => self.adapted.iter().find(|(done, _)| *done == weight).map(|(_, vectors)| vectors),
            None => Some(&self.shared.vectors),
        };
        let mut hits = match (vectors, &record.tools) {
            (Some(vectors), None) if learning.uses_memory() => {
                let learned = self.lexical.as_ref().filter(|_| learning.memory_words);
                let lexical = learned.unwrap_or(&self.shared.lexical);
                let indexes = Indexes { vectors, lexical, ..self.shared.indexes() };
                let graph_boost = options.config.use_graph_reranking.then_some(options.config.graph_boost_factor);
                let limit = options.depth.max(options.config.tier1_top_k * 2);
                rank_with(&ranked.query, &indexes, &DiscoveryFilter::default(), limit, graph_boost, options.fusion).hits
            }
            _ => ranked.hits.clone(),
        };
        if learning.prior {
            self.prior.apply(&mut hits);
        }
        hits
    }
}

fn hit_ids(hits: Vec<RankedHit>, depth: usize) -> Vec<String> {
    hits.into_iter().take(depth).map(|hit| hit.id).collect()
}

/// The replay protocol of [`ReplayReport`] over the rankings of the answerable requests.
fn replay(
    seed: u64,
    options: &EvalOptions,
    queries: &[QueryRecord],
    ranked: &[Ranked],
    answerable: &[usize],
    shared: &Indexed,
) -> ReplayReport {
    let (first, second) = seeded_halves(answerable.len(), seed);
    let mut stats = OutcomeStats::default();
    let mut memory = OutcomeMemory::new(shared.vectors.dimensions());
    let mut neighbourhood = Neighbourhood::new(&shared.vectors);
    let mut trust = OutcomeTrust::default();
    let mut learnt: Option<Learnt> = None;
    // As `capdex serve` learns, with its own trials (ranked as discovery ranks).
    let served_prior = options.prior_settings.enabled;
    let served_vectors = Arc::new(shared.vectors.clone());
    let mut served = OutcomeLearning::new(served_vectors.dimensions(), served_prior);
    let mut learnt_since_refit = usize::MAX;
    let mut outcomes = 0;
    // The first half's outcomes arrive in a seeded order; before each request's outcomes are
    // learnt, every learning as it stands is tried on it (prequential: none saw the request).
    for position in seeded_order(first.len(), seed.rotate_left(17)) {
        let i = answerable[first[position]];
        let ids = hit_ids(ranked[i].hits.clone(), options.depth);
        let credited = replay_outcomes(&ids, &queries[i].relevant);
        if outcomes > 0 {
            if learnt_since_refit >= TRIAL_REFIT_EVERY {
                neighbourhood.extend(&memory, &shared.vectors);
                learnt = Some(Learnt::new(trust.learnings(), &stats, &memory, &neighbourhood, options, shared));
                learnt_since_refit = 0;
            }
            if let (Some(learnt), None) = (&learnt, &queries[i].tools) {
                let succeeded: Vec<String> =
                    credited.iter().filter(|(_, score)| *score >= 0.5).map(|(id, _)| id.clone()).collect();
                let serving = Serving::new(shared.indexes(), &served_vectors, &options.config, Some(&learnt.prior));
                served.learn(&ranked[i].query, &succeeded, &serving, true);
            }
            if let Some(learnt) = &learnt {
                let succeeded: Vec<&str> =
                    credited.iter().filter(|(_, score)| *score >= 0.5).map(|(id, _)| id.as_str()).collect();
                let with: Vec<f64> = trust
                    .learnings()
                    .iter()
                    .map(|&learning| {
                        let ids = hit_ids(learnt.rank(Some(learning), &ranked[i], &queries[i], options), options.depth);
                        mean_reciprocal_rank(&ids, &succeeded)
                    })
                    .collect();
                let unseen = succeeded.iter().all(|id| !stats.capabilities.contains_key(*id));
                trust.record(mean_reciprocal_rank(&ids, &succeeded), &with, unseen);
            }
        }
        // The whole message's vector (the first part), for requests ranked against the shared catalog.
        let request = match (&queries[i].tools, ranked[i].query.parts.first()) {
            (None, Some(part)) => Some(part.vector.as_slice()),
            _ => None,
        };
        for (id, score) in credited {
            stats.credit(&id, score, 0, options.prior_settings.half_life_ms);
            outcomes += 1;
            if let (true, Some(request)) = (score >= 0.5, request) {
                if memory.remember(&id, request) {
                    memory.remember_words(&id, &index_terms(&queries[i].query));
                }
            }
        }
        learnt_since_refit = learnt_since_refit.saturating_add(1);
    }
    // The second half's requests whose relevant capabilities were never in an outcome.
    let unseen: Vec<usize> = second
        .iter()
        .copied()
        .filter(|&k| queries[answerable[k]].relevant.iter().all(|id| !stats.capabilities.contains_key(id.as_str())))
        .collect();
    neighbourhood.extend(&memory, &shared.vectors);
    let learnt = Learnt::new(trust.learnings(), &stats, &memory, &neighbourhood, options, shared);
    let score = |half: &[usize], learning: Option<Learning>| {
        let scores: Vec<QueryScores> = half
            .iter()
            .map(|&k| {
                let i = answerable[k];
                let ids = hit_ids(learnt.rank(learning, &ranked[i], &queries[i], options), options.depth);
                score_query(&ids, &queries[i].relevant)
            })
            .collect();
        aggregate(&scores, half.len())
    };
    let chosen = trust.chosen();
    // Before enough trials, discovery ranks as configured: the prior as `outcome_prior` says.
    let as_configured = Learning { prior: served_prior, ..Learning::NOTHING };
    let served_uses = served.decided().unwrap_or(as_configured);
    let served = ServedReplay {
        prior: served_prior,
        trials: served.trust().trials(),
        unseen_trials: served.trust().unseen_trials(),
        chosen: served.trust().chosen(),
        as_served: score(&second, None),
        learned: score(&second, Some(served_uses)),
        unseen_as_served: score(&unseen, None),
        unseen_learned: score(&unseen, Some(served_uses)),
    };
    let at_each_learning = trust
        .gains()
        .into_iter()
        .map(|trial| LearningTrial {
            trial,
            second_half: score(&second, Some(trial.learning)),
            unseen: score(&unseen, Some(trial.learning)),
        })
        .collect();
    ReplayReport {
        seed,
        first_half: first.len(),
        outcomes,
        adjusted: learnt.prior.len(),
        remembered: memory.len(),
        learned_words: memory.learned_words().len(),
        trials: trust.trials(),
        unseen_trials: trust.unseen_trials(),
        chosen,
        without_learning: score(&second, None),
        learned: score(&second, chosen),
        unseen: unseen.len(),
        unseen_without_learning: score(&unseen, None),
        unseen_learned: score(&unseen, chosen),
        at_each_learning,
        served,
    }
}
