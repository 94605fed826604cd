//! `capdex eval`: indexes a benchmark `tools.jsonl`, ranks every query of a
//! `queries.jsonl` through the core (no actors), writes the run file and
//! scores it with `core::evaluation`.
//!
//! The ranking is the one discovery uses ([`crate::core::retrieval::rank`]: hybrid retrieval, clause
//! fusion, graph re-ranking as configured), read to `depth` results, with no
//! relevance minimum (a run file is a ranking, not a prompt).

use crate::core::capability_prior::{distinct_ids, CapabilityStats, PriorSettings, PriorSnapshot};
use crate::core::catalog::Catalog;
use crate::core::discovery::{DiscoveryConfig, DiscoveryFilter};
use crate::core::embedder::{Embed, HashingEmbedder};
use crate::core::evaluation::{aggregate, score_query, Metrics, QueryRecord, RunLine, ToolRecord};
use crate::core::graph::CapabilityGraph;
use crate::core::index::VectorIndex;
use crate::core::kpi_window::OutcomeReport;
use crate::core::lexical::{FieldWeights, LexicalIndex};
use crate::core::retrieval::{query_texts, rank_with, Fusion, Indexes, Query};
use crate::core::text::embedding_text;
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
    pub dimensions: usize,
    /// Fusion weights; the default is the one discovery uses.
    pub fusion: Fusion,
    /// Lexical field weights; the default is the one discovery uses.
    pub field_weights: FieldWeights,
    /// The outcome prior applied to every ranking, as discovery applies it.
    pub outcome_prior: Option<PriorSnapshot>,
}

/// The outcome of one evaluation.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvalReport {
    pub tools: usize,
    pub metrics: Metrics,
    pub build_ms: f64,
    pub query_ms_mean: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("failed to read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} line {line}: {source}")]
    Parse { path: PathBuf, line: usize, source: serde_json::Error },
    #[error("failed to write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("the embedder needs at least one dimension")]
    Dimensions,
    #[error("{path} outcome {number}: {problem}")]
    Outcome { path: PathBuf, number: usize, problem: String },
}

/// Builds the outcome prior from task outcomes (`capdex.v1.outcome` objects,
/// one a line), all observed at the same instant so none has decayed.
pub fn prior_from_outcomes(path: &Path, settings: &PriorSettings) -> Result<PriorSnapshot, EvalError> {
    let reports: Vec<OutcomeReport> = read_jsonl(path)?;
    let mut stats = CapabilityStats::default();
    for (i, report) in reports.iter().enumerate() {
        let sample = report.validate(0).map_err(|err| EvalError::Outcome {
            path: path.into(),
            number: i + 1,
            problem: err.to_string(),
        })?;
        for capability_id in distinct_ids(&report.capabilities) {
            stats.observe(capability_id, sample.score, 0, settings.half_life_ms);
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
    let embedder = HashingEmbedder::new(options.dimensions).ok_or(EvalError::Dimensions)?;

    let started = Instant::now();
    let descriptors: Vec<_> = tools.iter().map(ToolRecord::to_descriptor).collect();
    let mut catalog = Catalog::default();
    let mut vectors = VectorIndex::with_capacity(embedder.dimensions(), descriptors.len());
    for descriptor in &descriptors {
        if catalog.descriptors.contains_key(&descriptor.id) {
            continue;
        }
        vectors
            .upsert(&descriptor.id, &embedder.embed(&embedding_text(descriptor)))
            .map_err(|_| EvalError::Dimensions)?;
        catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
    }
    let lexical = LexicalIndex::build_with(&descriptors, options.field_weights);
    let graph = CapabilityGraph::build(&descriptors, &[]);
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let indexes = Indexes { catalog: &catalog, vectors: &vectors, lexical: &lexical, graph: &graph };

    let filter = DiscoveryFilter::default();
    let graph_boost = options.config.use_graph_reranking.then_some(options.config.graph_boost_factor);
    let started = Instant::now();
    let runs: Vec<RunLine> = queries
        .iter()
        .enumerate()
        .map(|(query_idx, record)| {
            let texts = query_texts(&record.query);
            let query = Query::new(texts.clone(), embedder.embed_batch(&texts));
            let mut ranking = rank_with(&query, &indexes, &filter, options.depth, graph_boost, options.fusion);
            if let Some(prior) = &options.outcome_prior {
                prior.apply(&mut ranking.hits);
            }
            RunLine { query_idx, ranked: ranking.hits.into_iter().take(options.depth).map(|hit| hit.id).collect() }
        })
        .collect();
    let query_ms_mean = started.elapsed().as_secs_f64() * 1e3 / queries.len().max(1) as f64;

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
    Ok(EvalReport { tools: catalog.len(), metrics: aggregate(&scores, queries.len()), build_ms, query_ms_mean })
}
