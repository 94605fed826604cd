//! `capdex bench`: builds every index over a catalog and times per-turn
//! discovery in-process (no actors, no store).
//!
//! The catalog is a seeded synthetic one (`--synthetic N`) or a file
//! (`--sources FILE`: a sources object `{tools, skills, ...}`, a catalog
//! array of descriptors, or a benchmark `tools.jsonl`) with its queries
//! (`--queries FILE`: JSON lines with a `text` or `query` field). The
//! embedder is the configured one (the static one by default).
//!
//! Build time covers embedding (in batches of `embedder.batch_size`), the
//! vector index, the lexical index and the graph. Per-turn time covers
//! everything: clause splitting, query embedding, ranking, graph re-ranking
//! and tier assembly (Tier 0 included); query embedding and the rest are also
//! reported on their own (`embedP50Us`, `discoverP50Us`, ...), which matters
//! for a neural or remote embedder. Peak RSS is the process's high-water mark
//! (`VmHWM` on Linux).
//!
//! `--prompt-size` ([`prompt_size`]) instead runs a fixed query list over a
//! catalog and reports each tier's tokens against its budget, and the median
//! prompt against a dump of every capability's full schema or content.
//!
//! `--soak MINUTES` ([`soak`]) runs a real `capdex serve` on a real
//! `nats-server` under mixed load at half its measured capacity, and reports
//! RSS, data-dir bytes and p99 latency per minute.

pub mod soak;

use crate::core::catalog::Catalog;
use crate::core::compact_json::CompactJson;
use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind, DefinitionRef};
use crate::core::discovery::{discover, DiscoveryConfig, DiscoveryFilter, DiscoveryResult, StageTimings};
use crate::core::embedder::{
    embed_in_batches, embed_in_batches_as, Embed, EmbedError, HashingEmbedder, TextRole, DEFAULT_BATCH_SIZE,
};
use crate::core::evaluation::ToolRecord;
use crate::core::graph::{CapabilityGraph, Preset};
use crate::core::index::VectorIndex;
use crate::core::lexical::LexicalIndex;
use crate::core::registration::{normalise_catalog, normalise_registration, RegistrationPayload};
use crate::core::retrieval::{query_texts, Indexes, Query};
use crate::core::text::{detail_text, embedding_text};
use crate::core::tiers::{estimate_tokens, TokenBudget};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What one benchmark run measured.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchReport {
    pub n: usize,
    pub queries: usize,
    pub build_ms: f64,
    /// Whole turn (query embedding included).
    pub p50_us: f64,
    pub p99_us: f64,
    pub candidates_per_query: f64,
    /// Peak resident set size; 0 where the platform does not say.
    pub rss_bytes: u64,
    /// The embedder's model id.
    pub model_id: String,
    /// Query embedding alone (the whole message and its clauses, one request).
    pub embed_p50_us: f64,
    pub embed_p99_us: f64,
    /// Discovery without the query embedding (ranking, graph, tiers).
    pub discover_p50_us: f64,
    pub discover_p99_us: f64,
    /// Mean per-stage times of discovery.
    pub lexical_mean_us: f64,
    pub dense_mean_us: f64,
    pub fusion_mean_us: f64,
    pub graph_mean_us: f64,
    pub tiers_mean_us: f64,
    /// Mean per-stage times of the slowest 1% of turns (at least one): where
    /// the tail is spent, which the means above do not say.
    pub slowest_stages_us: StageTimings,
}

/// A benchmark input that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("failed to read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is more than {MAX_FILE_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path}: {problem}")]
    Format { path: PathBuf, problem: String },
    #[error("{path} holds no capabilities")]
    Empty { path: PathBuf },
    #[error(transparent)]
    Embedder(#[from] EmbedError),
}

/// The largest sources or queries file read.
pub const MAX_FILE_BYTES: u64 = 256 * 1024 * 1024;

const VERBS: &[&str] = &[
    "search",
    "send",
    "create",
    "delete",
    "list",
    "summarize",
    "translate",
    "schedule",
    "track",
    "convert",
    "upload",
    "download",
    "analyze",
    "book",
    "cancel",
    "export",
    "import",
    "monitor",
    "share",
    "sync",
];
const OBJECTS: &[&str] = &[
    "messages",
    "flights",
    "invoices",
    "issues",
    "files",
    "events",
    "notes",
    "songs",
    "orders",
    "photos",
    "contacts",
    "tickets",
    "reports",
    "videos",
    "payments",
    "documents",
    "tasks",
    "emails",
    "recipes",
    "articles",
];
const PLATFORMS: &[&str] = &[
    "slack",
    "github",
    "stripe",
    "spotify",
    "notion",
    "gmail",
    "jira",
    "dropbox",
    "zoom",
    "shopify",
    "trello",
    "discord",
    "telegram",
    "asana",
    "salesforce",
    "hubspot",
    "figma",
    "airtable",
    "twilio",
    "zendesk",
];
const CATEGORIES: &[&str] =
    &["communication", "developer", "finance", "media", "productivity", "travel", "commerce", "information"];

/// A small deterministic generator (SplitMix64), so runs are comparable.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

/// Returns `n` synthetic tools and skills (seed 42): names, descriptions,
/// categories, tags, parameters, and a dependency for one skill in ten.
pub fn synthetic_catalog(n: usize) -> Vec<CapabilityDescriptor> {
    let mut random = SplitMix(42);
    (0..n)
        .map(|i| {
            let (verb, object, platform) = (random.pick(VERBS), random.pick(OBJECTS), random.pick(PLATFORMS));
            let skill = i % 5 == 4;
            let name = format!("{platform}-{verb}-{object}-{i}");
            let required_tools =
                if skill && i % 10 == 9 { vec![format!("{platform}-list-files-{}", i - 1)] } else { vec![] };
            CapabilityDescriptor {
                id: format!("{}:{name}", if skill { "skill" } else { "tool" }),
                kind: if skill { CapabilityKind::Skill } else { CapabilityKind::Tool },
                display_name: crate::core::descriptor::display_name_from(&name),
                name,
                description: format!(
                    "{verb} {object} in {platform}, for example the {} {} of a {}",
                    random.pick(OBJECTS),
                    random.pick(VERBS),
                    random.pick(PLATFORMS)
                ),
                category: random.pick(CATEGORIES).to_string(),
                tags: vec![verb.to_string(), object.to_string(), platform.to_string()],
                required_secrets: vec![],
                required_tools,
                available: i % 7 != 0,
                has_side_effects: None,
                full_schema: (!skill).then(|| {
                    serde_json::json!({"type": "object", "properties": {
                        "query": {"type": "string", "description": format!("Which {object}")},
                        "limit": {"type": "integer"}}, "required": ["query"]})
                    .into()
                }),
                full_content: skill.then(|| format!("# {verb} {object}\n\nUse {platform} to {verb} {object}.\n")),
                definition_ref: DefinitionRef::Builtin,
            }
        })
        .collect()
}

/// Returns `n` synthetic user messages (seed 7), some with two requests.
pub fn synthetic_queries(n: usize) -> Vec<String> {
    let mut random = SplitMix(7);
    (0..n)
        .map(|i| {
            let first =
                format!("please {} my {} on {}", random.pick(VERBS), random.pick(OBJECTS), random.pick(PLATFORMS));
            if i % 3 == 0 {
                format!("{first}, then {} the {}", random.pick(VERBS), random.pick(OBJECTS))
            } else {
                first
            }
        })
        .collect()
}

/// Builds every index over `n` synthetic capabilities and times `n_queries`
/// discoveries with the built-in embedder of `dimensions`.
pub fn run(n: usize, n_queries: usize, dimensions: usize, config: &DiscoveryConfig) -> BenchReport {
    let embedder = HashingEmbedder::new(dimensions).unwrap_or_default();
    run_with(synthetic_catalog(n), Vec::new(), &synthetic_queries(n_queries), &embedder, DEFAULT_BATCH_SIZE, config)
        .expect("the built-in embedder does not fail")
}

/// The built indexes of a benchmark catalog.
pub struct Built {
    pub catalog: Catalog,
    pub vectors: VectorIndex,
    pub lexical: LexicalIndex,
    pub graph: CapabilityGraph,
}

impl Built {
    pub fn indexes(&self) -> Indexes<'_> {
        Indexes { catalog: &self.catalog, vectors: &self.vectors, lexical: &self.lexical, graph: &self.graph }
    }
}

/// A step of [`build`], reported to its `mark` callback when done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildStep {
    /// The descriptors moved into the catalog's map by id (the first of each id).
    Catalog,
    /// Every descriptor embedded into the vector index.
    Vectors,
    /// The lexical index built.
    Lexical,
    /// The capability graph built.
    Graph,
}

/// Embeds `descriptors` (first of each id wins) in batches and builds every index.
pub fn build(
    descriptors: Vec<CapabilityDescriptor>,
    presets: Vec<Preset>,
    embedder: &dyn Embed,
    batch_size: usize,
) -> Result<Built, EmbedError> {
    build_marked(descriptors, presets, embedder, batch_size, &mut |_| {})
}

/// [`build`], calling `mark` after each step.
fn build_marked(
    descriptors: Vec<CapabilityDescriptor>,
    presets: Vec<Preset>,
    embedder: &dyn Embed,
    batch_size: usize,
    mark: &mut dyn FnMut(BuildStep),
) -> Result<Built, EmbedError> {
    // The catalog takes the descriptors first (the first of each id), as the
    // Indexer holds them: the one moment they are held twice (the input and
    // the map being filled) comes before any index exists, so it stays below
    // the finished build's peak (at a million capabilities, a third of a
    // gigabyte of descriptors held twice on top of every index had been the
    // peak). Every index is then built from the catalog's descriptors, borrowed.
    // Built in bulk (`collect` sorts, then fills every node): inserted one at
    // a time, a B-tree's nodes are left a third to a half empty.
    let first: Vec<bool> = {
        let mut seen = std::collections::HashSet::with_capacity(descriptors.len());
        descriptors.iter().map(|descriptor| seen.insert(descriptor.id.as_str())).collect()
    };
    let held = descriptors
        .into_iter()
        .zip(first)
        .filter_map(|(descriptor, first)| first.then(|| (descriptor.id.clone(), descriptor)))
        .collect();
    let catalog = Catalog { version: 1, descriptors: held, ..Catalog::default() };
    mark(BuildStep::Catalog);
    let described: Vec<&CapabilityDescriptor> = catalog.descriptors.values().collect();
    // One batch at a time, straight into the index: the vectors are never
    // all held twice (as rows and as columns), which would double the peak.
    let mut vectors = VectorIndex::with_capacity(embedder.dimensions(), described.len());
    for batch in described.chunks(batch_size.max(1)) {
        let texts: Vec<String> = batch.iter().map(|descriptor| embedding_text(descriptor)).collect();
        for (descriptor, vector) in batch.iter().zip(embed_in_batches(embedder, &texts, batch_size)?) {
            // A vector that does not fit leaves its capability to the lexical signal, as in the Indexer.
            let _ = vectors.upsert(&descriptor.id, &vector);
        }
    }
    vectors.prepare();
    mark(BuildStep::Vectors);
    let lexical = LexicalIndex::build(described.iter().copied());
    mark(BuildStep::Lexical);
    let graph = CapabilityGraph::build_from(described, &presets);
    mark(BuildStep::Graph);
    Ok(Built { catalog, vectors, lexical, graph })
}

/// Embeds one message (whole and clauses) and runs one discovery; returns
/// the result and the embedding time in µs.
pub fn discover_message(
    message: &str,
    built: &Built,
    embedder: &dyn Embed,
    batch_size: usize,
    config: &DiscoveryConfig,
    tier0: String,
) -> Result<(DiscoveryResult, f64), EmbedError> {
    let started = Instant::now();
    let texts = query_texts(message);
    let vectors = embed_in_batches_as(embedder, &texts, batch_size, TextRole::Query)?;
    let embed_us = started.elapsed().as_secs_f64() * 1e6;
    let query = Query::new(texts, vectors);
    let mut result = discover(&query, &built.indexes(), config, &DiscoveryFilter::default(), tier0);
    result.diagnostics.timings.embed_us = embed_us;
    Ok((result, embed_us))
}

/// Builds every index over `descriptors` and times one discovery per query.
pub fn run_with(
    descriptors: Vec<CapabilityDescriptor>,
    presets: Vec<Preset>,
    queries: &[String],
    embedder: &dyn Embed,
    batch_size: usize,
    config: &DiscoveryConfig,
) -> Result<BenchReport, EmbedError> {
    let started = Instant::now();
    let built = build(descriptors, presets, embedder, batch_size)?;
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let filter = DiscoveryFilter::default();
    let tier0 = built.catalog.tier0(&filter, TokenBudget::new(config.tier0_token_budget));

    let mut turn_us: Vec<f64> = Vec::with_capacity(queries.len());
    let mut embed_us: Vec<f64> = Vec::with_capacity(queries.len());
    let mut discover_us: Vec<f64> = Vec::with_capacity(queries.len());
    let mut stages = [0.0f64; 5];
    let mut turns: Vec<(f64, StageTimings)> = Vec::with_capacity(queries.len());
    let mut candidates = 0usize;
    for message in queries {
        let started = Instant::now();
        // Tier 0 is cached per catalog version in the Discoverer, so a turn only clones it.
        let (result, embedded_us) = discover_message(message, &built, embedder, batch_size, config, tier0.clone())?;
        let total = started.elapsed().as_secs_f64() * 1e6;
        turn_us.push(total);
        embed_us.push(embedded_us);
        discover_us.push(total - embedded_us);
        let timings = result.diagnostics.timings;
        for (sum, value) in stages.iter_mut().zip([
            timings.lexical_us,
            timings.dense_us,
            timings.fusion_us,
            timings.graph_us,
            timings.tiers_us,
        ]) {
            *sum += value;
        }
        candidates += result.diagnostics.candidates_scanned;
        turns.push((total, StageTimings { total_us: total, ..timings }));
    }
    let slowest_stages_us = mean_of_slowest(turns, 0.01);
    for list in [&mut turn_us, &mut embed_us, &mut discover_us] {
        list.sort_by(f64::total_cmp);
    }
    let per_query = |sum: f64| sum / queries.len().max(1) as f64;
    Ok(BenchReport {
        n: built.catalog.len(),
        queries: queries.len(),
        build_ms,
        p50_us: percentile(&turn_us, 0.50),
        p99_us: percentile(&turn_us, 0.99),
        candidates_per_query: per_query(candidates as f64),
        rss_bytes: peak_rss_bytes(),
        model_id: embedder.model_id(),
        embed_p50_us: percentile(&embed_us, 0.50),
        embed_p99_us: percentile(&embed_us, 0.99),
        discover_p50_us: percentile(&discover_us, 0.50),
        discover_p99_us: percentile(&discover_us, 0.99),
        lexical_mean_us: per_query(stages[0]),
        dense_mean_us: per_query(stages[1]),
        fusion_mean_us: per_query(stages[2]),
        graph_mean_us: per_query(stages[3]),
        tiers_mean_us: per_query(stages[4]),
        slowest_stages_us,
    })
}

/// What learning from outcomes costs (`capdex bench --outcome-learning`):
/// each query is a turn whose third hit did the job, learnt as `capdex
/// serve` learns it by default (a trial of the nine learnings, then
/// remembered; `core::outcome_learning`).
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LearningBenchReport {
    pub n: usize,
    /// Successes learnt.
    pub successes: usize,
    pub trials: u64,
    /// The time to learn one success (a trial ranks the message ten times;
    /// one in [`crate::core::outcome_learning::REFIT_EVERY`] also fits the memory again).
    pub learn_p50_us: f64,
    pub learn_p99_us: f64,
    pub learn_max_us: f64,
    /// Fitting the memory to a new publication of the vector index (four own weights).
    pub refit_ms: f64,
    pub remembered: usize,
    /// Remembered capabilities with learned words (the refit builds a lexical index with them when any).
    pub learned_words: usize,
    pub rss_bytes: u64,
}

/// Builds `descriptors` and learns one success per query ([`LearningBenchReport`]).
pub fn outcome_learning(
    descriptors: Vec<CapabilityDescriptor>,
    queries: &[String],
    embedder: &dyn Embed,
    batch_size: usize,
    config: &DiscoveryConfig,
) -> Result<LearningBenchReport, EmbedError> {
    use crate::core::outcome_learning::{OutcomeLearning, Serving};
    let built = build(descriptors, Vec::new(), embedder, batch_size)?;
    let vectors = std::sync::Arc::new(built.vectors.clone());
    // As `capdex serve` learns by default: the prior may be used, so it is tried too.
    let prior = crate::core::outcome_prior::OutcomePrior::neutral();
    let serving = Serving::new(built.indexes(), &vectors, config, Some(&prior));
    let mut learning = OutcomeLearning::new(vectors.dimensions(), true);
    let mut learn_us = Vec::with_capacity(queries.len());
    for message in queries {
        let texts = query_texts(message);
        let query = Query::new(texts.clone(), embed_in_batches_as(embedder, &texts, batch_size, TextRole::Query)?);
        let ranked = crate::core::discovery::ranked_ids(&query, serving.indexes(), config, None);
        let Some(done) = ranked.get(2) else { continue };
        let started = Instant::now();
        learning.learn(&query, std::slice::from_ref(done), &serving, true);
        learn_us.push(started.elapsed().as_secs_f64() * 1e6);
    }
    let republished = std::sync::Arc::new(built.vectors.clone());
    let started = Instant::now();
    learning.refit(&republished, serving.indexes());
    let refit_ms = started.elapsed().as_secs_f64() * 1e3;
    learn_us.sort_by(f64::total_cmp);
    Ok(LearningBenchReport {
        n: built.catalog.len(),
        successes: learn_us.len(),
        trials: learning.trust().trials(),
        learn_p50_us: percentile(&learn_us, 0.50),
        learn_p99_us: percentile(&learn_us, 0.99),
        learn_max_us: learn_us.last().copied().unwrap_or(0.0),
        refit_ms,
        remembered: learning.memory().len(),
        learned_words: learning.memory().learned_words().len(),
        rss_bytes: peak_rss_bytes(),
    })
}

/// The mean stage times of the slowest `share` of `turns` (by their total,
/// at least one turn); all zero when there are none.
fn mean_of_slowest(mut turns: Vec<(f64, StageTimings)>, share: f64) -> StageTimings {
    turns.sort_by(|a, b| b.0.total_cmp(&a.0));
    let count = ((turns.len() as f64 * share).ceil() as usize).clamp(1, turns.len().max(1));
    let slowest = &turns[..count.min(turns.len())];
    let mean = |stage: fn(&StageTimings) -> f64| {
        slowest.iter().map(|(_, timings)| stage(timings)).sum::<f64>() / slowest.len().max(1) as f64
    };
    StageTimings {
        embed_us: mean(|t| t.embed_us),
        lexical_us: mean(|t| t.lexical_us),
        dense_us: mean(|t| t.dense_us),
        fusion_us: mean(|t| t.fusion_us),
        graph_us: mean(|t| t.graph_us),
        tiers_us: mean(|t| t.tiers_us),
        total_us: mean(|t| t.total_us),
    }
}

/// One structure's share of the memory account.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryPart {
    pub structure: &'static str,
    /// Heap bytes its construction left allocated.
    pub bytes: i64,
    pub bytes_per_capability: f64,
    /// The most heap bytes its construction held at once above what it
    /// left: the step's temporaries, which raise the peak but not the rest.
    pub transient_bytes: i64,
}

/// `capdex bench --memory`: where the bytes of a built catalog go.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryAccount {
    pub n: usize,
    pub model_id: String,
    /// The heap bytes of each structure, measured by the allocator (what
    /// building it left allocated, net of what it freed).
    pub parts: Vec<MemoryPart>,
    /// Their sum.
    pub live_bytes: i64,
    /// Resident bytes before the catalog existed (code, runtime, the embedder's tables).
    pub baseline_rss_bytes: u64,
    /// Resident bytes after the build and the queries.
    pub rss_bytes: u64,
    /// Resident bytes neither in the baseline nor live on the heap: the
    /// allocator's free and partly used pages, fragmentation.
    pub allocator_overhead_bytes: i64,
    /// The process's high-water mark (transient build and query memory included).
    pub peak_rss_bytes: u64,
    /// Queries run after the build (their caches count in `rssBytes`).
    pub queries: usize,
}

/// Builds every index over `descriptors` as [`build`] does, measuring the heap
/// bytes each structure holds with the binary's counting allocator
/// ([`crate::allocations`]); `None` when the process's allocator does not count.
/// `make` creates the descriptors, so that they are measured too.
pub fn memory_account(
    make: impl FnOnce() -> (Vec<CapabilityDescriptor>, Vec<Preset>),
    queries: &[String],
    embedder: &dyn Embed,
    batch_size: usize,
    config: &DiscoveryConfig,
) -> Result<Option<MemoryAccount>, EmbedError> {
    use crate::allocations::{self, Meter};
    if !allocations::start() {
        return Ok(None);
    }
    let baseline_rss_bytes = current_rss_bytes();
    let meter = Meter::now();
    let (descriptors, presets) = make();
    let all_descriptors = meter.grown();
    let descriptors_transient = meter.transient();
    // The schemas' share: a copy of them weighs what they do.
    let meter = Meter::now();
    let schemas: Vec<Option<CompactJson>> = descriptors.iter().map(|d| d.full_schema.clone()).collect();
    let schema_bytes = meter.grown() - (schemas.capacity() * std::mem::size_of::<Option<CompactJson>>()) as isize;
    drop(schemas);

    // What the embedder loads on its first use (the static embedder's
    // vocabulary and scales), once per process: not the vectors' share.
    let meter = Meter::now();
    embedder.embed_batch(&["capdex".to_string()])?;
    let model = (meter.grown(), meter.transient());

    let n = descriptors.len();
    let mut parts = vec![
        ("descriptors (ids, names, texts, tags)", all_descriptors - schema_bytes, descriptors_transient),
        ("schemas", schema_bytes, 0),
        ("embedder model (loaded once)", model.0, model.1),
    ];
    let mut meter = Meter::now();
    let built = build_marked(descriptors, presets, embedder, batch_size, &mut |step| {
        let structure = match step {
            BuildStep::Vectors => "vectors",
            BuildStep::Lexical => "lexical index (postings, terms)",
            BuildStep::Graph => "capability graph",
            BuildStep::Catalog => "catalog map (id keys, tree nodes)",
        };
        parts.push((structure, meter.grown(), meter.transient()));
        meter = Meter::now();
    })?;
    let meter = Meter::now();
    let filter = DiscoveryFilter::default();
    let tier0 = built.catalog.tier0(&filter, TokenBudget::new(config.tier0_token_budget));
    parts.push(("tier 0 text", meter.grown(), meter.transient()));
    for message in queries {
        discover_message(message, &built, embedder, batch_size, config, tier0.clone())?;
    }
    let live_bytes: i64 = parts.iter().map(|(_, bytes, _)| *bytes as i64).sum();
    let rss_bytes = current_rss_bytes();
    let account = MemoryAccount {
        n: built.catalog.len(),
        model_id: embedder.model_id(),
        parts: parts
            .into_iter()
            .map(|(structure, bytes, transient)| MemoryPart {
                structure,
                bytes: bytes as i64,
                bytes_per_capability: bytes as f64 / n.max(1) as f64,
                transient_bytes: transient as i64,
            })
            .collect(),
        live_bytes,
        baseline_rss_bytes,
        rss_bytes,
        allocator_overhead_bytes: rss_bytes as i64 - baseline_rss_bytes as i64 - live_bytes,
        peak_rss_bytes: peak_rss_bytes(),
        queries: queries.len(),
    };
    drop(built);
    Ok(Some(account))
}

fn read_text(path: &Path) -> Result<String, BenchError> {
    let size = std::fs::metadata(path).map_err(|source| BenchError::Read { path: path.into(), source })?.len();
    if size > MAX_FILE_BYTES {
        return Err(BenchError::TooLarge { path: path.into() });
    }
    std::fs::read_to_string(path).map_err(|source| BenchError::Read { path: path.into(), source })
}

/// Reads capabilities from a sources object `{tools, skills, extensions,
/// channels, presets}`, a catalog array of descriptors, or a benchmark
/// `tools.jsonl` (one tool a line); items the loaders refuse are left out.
pub fn load_sources(path: &Path) -> Result<(Vec<CapabilityDescriptor>, Vec<Preset>), BenchError> {
    let text = read_text(path)?;
    let format = |problem: String| BenchError::Format { path: path.into(), problem };
    let tools_lines = || -> Result<Vec<CapabilityDescriptor>, BenchError> {
        let mut descriptors = Vec::new();
        for (i, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
            let tool: ToolRecord =
                serde_json::from_str(line).map_err(|err| format(format!("line {}: {err}", i + 1)))?;
            descriptors.push(tool.to_descriptor());
        }
        Ok(descriptors)
    };
    let normalised = match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Array(items)) => {
            normalise_catalog(&items, crate::core::limits::Limits::default().max_id_bytes)
        }
        Ok(value @ serde_json::Value::Object(_)) => match serde_json::from_value::<RegistrationPayload>(value) {
            Ok(payload) => normalise_registration(&payload, crate::core::limits::Limits::default().max_id_bytes),
            // One line of a tools file is an object too.
            Err(err) => match tools_lines() {
                Ok(descriptors) => crate::core::registration::Normalised { descriptors, ..Default::default() },
                Err(_) => {
                    return Err(format(format!(
                        "not a sources file {{tools, skills, extensions, channels, presets}}: {err}"
                    )))
                }
            },
        },
        Ok(_) => return Err(format("expected a sources object, a catalog array or tools JSON lines".into())),
        Err(_) => crate::core::registration::Normalised { descriptors: tools_lines()?, ..Default::default() },
    };
    if normalised.descriptors.is_empty() {
        return Err(BenchError::Empty { path: path.into() });
    }
    Ok((normalised.descriptors, normalised.presets))
}

/// Reads queries: JSON lines with a `text` or `query` string field.
pub fn load_queries(path: &Path) -> Result<Vec<String>, BenchError> {
    let text = read_text(path)?;
    let mut queries = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
        let problem = |what: &str| BenchError::Format { path: path.into(), problem: format!("line {}: {what}", i + 1) };
        let value: serde_json::Value = serde_json::from_str(line).map_err(|err| problem(&err.to_string()))?;
        let query = value
            .get("text")
            .or_else(|| value.get("query"))
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| problem("needs a \"text\" or \"query\" string"))?;
        queries.push(query.to_string());
    }
    if queries.is_empty() {
        return Err(BenchError::Format { path: path.into(), problem: "no queries".into() });
    }
    Ok(queries)
}

/// One query's prompt size.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptSizeLine {
    pub query: String,
    pub tier0_tokens: usize,
    pub tier1_tokens: usize,
    pub tier2_tokens: usize,
    pub total_tokens: usize,
    /// Tokens of the rendered prompt (at most `totalTokens`).
    pub rendered_tokens: usize,
    pub tier1_ids: Vec<String>,
}

/// Prompt sizes over a query list against the budgets and a dump of every schema.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptSizeReport {
    pub n: usize,
    pub queries: usize,
    pub budgets: [usize; 3],
    /// Queries where some tier exceeded its budget (none, when capdex holds its invariant).
    pub over_budget: usize,
    pub max_tier_tokens: [usize; 3],
    pub median_total_tokens: f64,
    pub max_total_tokens: usize,
    /// Every capability's full schema or content (its Tier 2 text), one after another.
    pub dump_all_tokens: usize,
    /// `medianTotalTokens / dumpAllTokens`.
    pub median_share_of_dump: f64,
    pub lines: Vec<PromptSizeLine>,
}

/// Runs every query and measures each tier against its budget.
pub fn prompt_size(
    descriptors: Vec<CapabilityDescriptor>,
    presets: Vec<Preset>,
    queries: &[String],
    embedder: &dyn Embed,
    batch_size: usize,
    config: &DiscoveryConfig,
) -> Result<PromptSizeReport, EmbedError> {
    let built = build(descriptors, presets, embedder, batch_size)?;
    let dump: String = built.catalog.descriptors.values().map(detail_text).collect::<Vec<_>>().join("\n");
    let dump_all_tokens = estimate_tokens(&dump);
    let tier0 = built.catalog.tier0(&DiscoveryFilter::default(), TokenBudget::new(config.tier0_token_budget));
    let budgets = [config.tier0_token_budget, config.tier1_token_budget, config.tier2_token_budget];
    let mut lines = Vec::with_capacity(queries.len());
    for message in queries {
        let (result, _) = discover_message(message, &built, embedder, batch_size, config, tier0.clone())?;
        let estimate = result.token_estimate;
        lines.push(PromptSizeLine {
            query: message.clone(),
            // Counted again on the rendered tier text, not trusted from the estimate.
            tier0_tokens: estimate_tokens(&result.tier0),
            tier1_tokens: estimate.tier1_tokens,
            tier2_tokens: estimate.tier2_tokens,
            total_tokens: estimate.total_tokens,
            rendered_tokens: estimate_tokens(&result.rendered),
            tier1_ids: result.tier1.iter().map(|entry| entry.id.clone()).collect(),
        });
    }
    let over_budget = lines
        .iter()
        .filter(|l| l.tier0_tokens > budgets[0] || l.tier1_tokens > budgets[1] || l.tier2_tokens > budgets[2])
        .count();
    let max_tier_tokens = [
        lines.iter().map(|l| l.tier0_tokens).max().unwrap_or(0),
        lines.iter().map(|l| l.tier1_tokens).max().unwrap_or(0),
        lines.iter().map(|l| l.tier2_tokens).max().unwrap_or(0),
    ];
    let mut totals: Vec<f64> = lines.iter().map(|l| l.total_tokens as f64).collect();
    totals.sort_by(f64::total_cmp);
    let median_total_tokens = median(&totals);
    Ok(PromptSizeReport {
        n: built.catalog.len(),
        queries: lines.len(),
        budgets,
        over_budget,
        max_tier_tokens,
        median_total_tokens,
        max_total_tokens: lines.iter().map(|l| l.total_tokens).max().unwrap_or(0),
        dump_all_tokens,
        median_share_of_dump: if dump_all_tokens == 0 { 0.0 } else { median_total_tokens / dump_all_tokens as f64 },
        lines,
    })
}

/// The median of sorted values (mean of the middle two for an even count); 0 when empty.
fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Nearest-rank percentile of sorted values; 0 when empty.
fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (fraction * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// A size as a person writes it: bytes, or a number with `KB`, `MB`, `GB`
/// (powers of 1,000) or `KiB`, `MiB`, `GiB` (powers of 1,024); `60MB`, `1.5 GiB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("{text:?} is not a size (e.g. 60MB, 1.5GiB, 1048576)"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown unit {other:?} in {text:?}: use B, KB, MB, GB, KiB, MiB or GiB")),
    };
    let bytes = number * scale;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is not a size of at least one byte"));
    }
    Ok(bytes as u64)
}

/// Returns the peak resident set size from `/proc/self/status`, or 0.
pub fn peak_rss_bytes() -> u64 {
    proc_status_bytes("VmHWM:")
}

/// The resident set size now; 0 where the platform does not say.
pub fn current_rss_bytes() -> u64 {
    proc_status_bytes("VmRSS:")
}

/// A `/proc/self/status` line in kB, as bytes.
fn proc_status_bytes(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with(key))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(parse_size("60MB"), Ok(60_000_000));
        assert_eq!(parse_size("1.5 GiB"), Ok(1_610_612_736));
        assert_eq!(parse_size("1048576"), Ok(1_048_576));
        assert_eq!(parse_size("512kib"), Ok(524_288));
        for bad in ["", "MB", "-5MB", "0", "12 parsecs", "1e9", "NaN"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_memory_account_needs_a_counting_allocator() {
        // Test binaries run on the system allocator: the account says it cannot count.
        let embedder = HashingEmbedder::default();
        let config = DiscoveryConfig::default();
        let account = memory_account(|| (synthetic_catalog(50), Vec::new()), &[], &embedder, 16, &config).unwrap();
        assert!(account.is_none());
    }

    #[test]
    fn synthetic_data_is_deterministic_and_varied() {
        assert_eq!(synthetic_catalog(50), synthetic_catalog(50));
        let ids: std::collections::BTreeSet<String> = synthetic_catalog(200).into_iter().map(|d| d.id).collect();
        assert_eq!(ids.len(), 200);
        assert_eq!(synthetic_queries(10), synthetic_queries(10));
        assert!(synthetic_queries(3)[0].contains(", then "));
    }

    #[test]
    fn the_slowest_share_is_averaged_by_stage() {
        let turn =
            |total: f64, dense: f64| (total, StageTimings { dense_us: dense, total_us: total, ..Default::default() });
        let turns: Vec<_> = (1..=200).map(|i| turn(f64::from(i), f64::from(i) / 2.0)).collect();
        // 1% of 200 is the two slowest: totals 200 and 199.
        let slowest = mean_of_slowest(turns, 0.01);
        assert_eq!((slowest.total_us, slowest.dense_us), (199.5, 99.75));
        assert_eq!(mean_of_slowest(vec![turn(3.0, 1.0)], 0.01).dense_us, 1.0);
        assert_eq!(mean_of_slowest(Vec::new(), 0.01), StageTimings::default());
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 0.5), 50.0);
        assert_eq!(percentile(&values, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn loads_every_source_shape_and_queries() {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/catalog");
        let (descriptors, _) = load_sources(&data.join("synthcat-1000.sources.json")).unwrap();
        assert!(descriptors.len() >= 900, "{}", descriptors.len());
        let (catalog, _) = load_sources(&data.join("agentos-catalog.json")).unwrap();
        assert!(catalog.len() >= 300, "{}", catalog.len());
        let queries = load_queries(&data.join("synthcat-1000.queries.jsonl")).unwrap();
        assert!(queries.len() >= 100 && queries.iter().all(|q| !q.is_empty()));
        let dir = tempfile::tempdir().unwrap();
        let tools = dir.path().join("tools.jsonl");
        std::fs::write(&tools, "{\"id\":\"a\",\"name\":\"alpha\",\"description\":\"send mail\"}\n").unwrap();
        assert_eq!(load_sources(&tools).unwrap().0.len(), 1);
        let bad = dir.path().join("bad.jsonl");
        std::fs::write(&bad, "{\"q\": 1}\n").unwrap();
        assert!(matches!(load_queries(&bad), Err(BenchError::Format { .. })));
        std::fs::write(&bad, "[]").unwrap();
        assert!(matches!(load_sources(&bad), Err(BenchError::Empty { .. })));
        assert!(matches!(load_sources(&dir.path().join("missing.json")), Err(BenchError::Read { .. })));
    }

    #[test]
    fn prompt_sizes_stay_within_the_budgets() {
        let config = DiscoveryConfig { tier1_token_budget: 120, tier2_token_budget: 150, ..DiscoveryConfig::default() };
        let queries = synthetic_queries(12);
        let report =
            prompt_size(synthetic_catalog(200), Vec::new(), &queries, &HashingEmbedder::default(), 32, &config)
                .unwrap();
        assert_eq!((report.n, report.queries, report.over_budget), (200, 12, 0));
        assert!(report.max_tier_tokens[1] <= 120 && report.max_tier_tokens[2] <= 150);
        assert!(report.median_total_tokens > 0.0 && report.median_total_tokens < report.dump_all_tokens as f64);
        assert!(report.lines.iter().all(|l| l.rendered_tokens <= l.total_tokens));
        assert_eq!(median(&[1.0, 2.0, 10.0, 11.0]), 6.0);
    }

    #[test]
    fn learning_from_outcomes_is_timed_per_success() {
        let embedder = HashingEmbedder::default();
        let queries = synthetic_queries(40);
        let report =
            outcome_learning(synthetic_catalog(300), &queries, &embedder, 64, &DiscoveryConfig::default()).unwrap();
        assert_eq!(report.n, 300);
        assert!(report.successes > 30 && report.trials + 1 == report.successes as u64, "{report:?}");
        assert!(report.learn_p50_us > 0.0 && report.learn_p50_us <= report.learn_max_us, "{report:?}");
        assert!(report.remembered > 0 && report.refit_ms > 0.0, "{report:?}");
    }

    #[test]
    fn a_small_run_reports_every_figure() {
        let report = run(300, 20, 64, &DiscoveryConfig::default());
        assert_eq!((report.n, report.queries), (300, 20));
        assert!(report.p50_us > 0.0 && report.p99_us >= report.p50_us);
        assert!(report.candidates_per_query >= 1.0);
        assert!(report.embed_p50_us > 0.0 && report.discover_p50_us > 0.0);
        assert!(report.embed_p50_us <= report.p50_us * 1.0001 + 1.0);
        assert_eq!(report.model_id, "capdex-hashing-v2-64");
    }
}
