//! `capdex eval`: indexes a benchmark `tools.jsonl`, ranks every query of a
//! `queries.jsonl` through the core (no actors), writes the run file and
//! scores it with `core::evaluation`.
//!
//! The ranking is the one discovery uses ([`crate::core::retrieval::rank`]: hybrid retrieval, clause
//! fusion, graph re-ranking as configured), read to `depth` results, with no
//! relevance minimum (a run file is a ranking, not a prompt).
//!
//! The embedder is the configured one, or the one `--embedder` picks
//! (`builtin`, `static`, `local --model-dir DIR`, `http --endpoint URL --model NAME`);
//! tools are embedded in batches of `embedder.batch_size`. An embedder that
//! fails stops the evaluation (a score without the dense signal would not be
//! the one asked for).
//!
//! With a cache directory, every vector (tools and query parts) is kept in a
//! sled store keyed by [`text_hash`] of model id and text, so a second
//! evaluation with the same model embeds nothing already seen: ablations and
//! sweeps of a neural model cost ranking time only.

use crate::config::EmbedderSettings;
use crate::core::catalog::Catalog;
use crate::core::discovery::{DiscoveryConfig, DiscoveryFilter};
use crate::core::embedder::{embed_in_batches, text_hash, Embed, EmbedError};
use crate::core::evaluation::{aggregate, score_query, Metrics, QueryRecord, RunLine, ToolRecord};
use crate::core::graph::CapabilityGraph;
use crate::core::index::VectorIndex;
use crate::core::kpi_window::OutcomeReport;
use crate::core::lexical::{FieldWeights, LexicalIndex};
use crate::core::outcome_prior::{distinct_ids, OutcomePrior, OutcomePriorSettings, OutcomeStats};
use crate::core::retrieval::{query_texts, rank_with, Fusion, Indexes, Query};
use crate::core::text::embedding_text;
use crate::store::{Store, StoreError};
use serde::de::DeserializeOwned;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What to evaluate.
#[derive(Clone, Debug)]
pub struct EvalOptions {
    pub tools: PathBuf,
    pub queries: PathBuf,
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

/// The vectors of `texts`: from `cache` where it has them, the others
/// embedded in batches of `batch_size` (and cached).
fn embed_cached(
    embedder: &(impl Embed + ?Sized),
    cache: Option<&Store>,
    texts: &[String],
    batch_size: usize,
) -> Result<Vec<Vec<f32>>, EvalError> {
    let Some(cache) = cache else {
        return Ok(embed_in_batches(embedder, texts, batch_size)?);
    };
    let model_id = embedder.model_id();
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
    let embedded = embed_in_batches(embedder, &texts_missing, batch_size)?;
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
        let sample = report.validate(0).map_err(|err| EvalError::Outcome {
            path: path.into(),
            number: i + 1,
            problem: err.to_string(),
        })?;
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

/// Runs the evaluation described by `options`.
pub fn run(options: &EvalOptions) -> Result<EvalReport, EvalError> {
    let tools: Vec<ToolRecord> = read_jsonl(&options.tools)?;
    let queries: Vec<QueryRecord> = read_jsonl(&options.queries)?;
    let embedder = crate::embedders::backend::build(&options.embedder)?;
    let batch_size = options.embedder.batch_size;
    let cache = options.cache.as_deref().map(Store::open).transpose()?;

    let started = Instant::now();
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
    let embedded = embed_cached(embedder.as_ref(), cache.as_ref(), &texts, batch_size)?;
    let mut vectors = VectorIndex::with_capacity(embedder.dimensions(), unique.len());
    for (descriptor, vector) in unique.iter().zip(embedded) {
        vectors.upsert(&descriptor.id, &vector).map_err(|_| EvalError::Dimensions)?;
    }
    let lexical = LexicalIndex::build_with(&descriptors, options.field_weights);
    let graph = CapabilityGraph::build(&descriptors, &[]);
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let indexes = Indexes { catalog: &catalog, vectors: &vectors, lexical: &lexical, graph: &graph };

    let filter = DiscoveryFilter::default();
    let graph_boost = options.config.use_graph_reranking.then_some(options.config.graph_boost_factor);
    let started = Instant::now();
    let mut embed_seconds = 0.0;
    let runs: Vec<RunLine> = queries
        .iter()
        .enumerate()
        .map(|(query_idx, record)| {
            let texts = query_texts(&record.query);
            let embed_started = Instant::now();
            let query_vectors = embed_cached(embedder.as_ref(), cache.as_ref(), &texts, batch_size)?;
            embed_seconds += embed_started.elapsed().as_secs_f64();
            let query = Query::new(texts, query_vectors);
            let mut ranking = rank_with(&query, &indexes, &filter, options.depth, graph_boost, options.fusion);
            if let Some(prior) = &options.outcome_prior {
                prior.apply(&mut ranking.hits);
            }
            Ok(RunLine { query_idx, ranked: ranking.hits.into_iter().take(options.depth).map(|hit| hit.id).collect() })
        })
        .collect::<Result<_, EvalError>>()?;
    let query_ms_mean = started.elapsed().as_secs_f64() * 1e3 / queries.len().max(1) as f64;
    if let Some(cache) = &cache {
        cache.flush()?;
    }
    let query_embed_ms_mean = embed_seconds * 1e3 / queries.len().max(1) as f64;

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
    let scores: Vec<_> =
        runs.iter().zip(&queries).map(|(run, record)| score_query(&run.ranked, &record.relevant)).collect();
    Ok(EvalReport {
        tools: catalog.len(),
        metrics: aggregate(&scores, queries.len()),
        build_ms,
        query_ms_mean,
        model_id: embedder.model_id(),
        query_embed_ms_mean,
    })
}
