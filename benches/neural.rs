//! Figures for the local neural embedder (all-MiniLM-L6-v2, or the model `CAPDEX_TEST_MODEL_DIR`
//! names; feature `neural`): load time, embedding throughput, query-embedding time, and retrieval
//! quality on the benchmark sets of `../shared/data/bench` (the model in the hybrid ranking with the
//! static table beside it at `[embedder] static_share`, as the `local` backend ranks; the same
//! without the table; the model alone; and the built-in embedder for comparison), scored like `capdex eval`. When that folder (the data folder
//! beside the repository) is not there, it says so and runs on the samples of
//! `tests/fixtures/bench` (the first 60 or 120 dev queries: figures not comparable).
//!
//! Run: `scripts/fetch-minilm.sh && cargo bench --features neural --bench neural`.
//! `CAPDEX_TEST_MODEL_DIR` picks another model directory, `CAPDEX_BENCH_DATA` another bench
//! folder, `CAPDEX_BENCH_SETS` (comma-separated, default `metatool,seal-tools`) the sets.
//! Without `--bench` (as under `cargo test`) it runs a small smoke pass: 16 tools, 8 queries.
//! It prints figures and asserts none: timings depend on the machine.

use capdex::config::{EmbedderBackend, Settings};
use capdex::core::catalog::Catalog;
use capdex::core::discovery::DiscoveryFilter;
use capdex::core::embedder::{Embed, HashingEmbedder};
use capdex::core::evaluation::{aggregate, score_query, Metrics, QueryRecord, ToolRecord};
use capdex::core::graph::CapabilityGraph;
use capdex::core::index::VectorIndex;
use capdex::core::lexical::{LexicalIndex, FIELD_WEIGHTS};
use capdex::core::retrieval::{query_texts, rank_with, Fusion, Indexes, Query};
use capdex::core::static_share;
use capdex::core::text::embedding_text;
use capdex::embedders::neural::NeuralEmbedder;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Ranked ids scored per query, as `capdex eval`'s default depth.
const DEPTH: usize = 10;

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model_dir = std::env::var_os("CAPDEX_TEST_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".models/all-MiniLM-L6-v2"));
    let data_dir = std::env::var_os("CAPDEX_BENCH_DATA").map(PathBuf::from).unwrap_or_else(|| {
        let shared = root.join("../shared/data/bench");
        if shared.is_dir() {
            return shared;
        }
        println!(
            "note: {} is not there (the data folder beside the repository; CAPDEX_BENCH_DATA picks another): \
             running on the samples in tests/fixtures/bench, whose figures are not those of the full dev splits",
            shared.display()
        );
        root.join("tests/fixtures/bench")
    });
    let sets = std::env::var("CAPDEX_BENCH_SETS").unwrap_or_else(|_| "metatool,seal-tools".to_string());

    let started = Instant::now();
    let neural = match NeuralEmbedder::load(&model_dir) {
        Ok(neural) => neural,
        Err(error) => {
            eprintln!("error: {error} [{}]", error.code());
            std::process::exit(1);
        }
    };
    println!(
        "model {} from {}: loaded in {:.0} ms ({} dimensions, {} tokens max)",
        neural.model_id(),
        model_dir.display(),
        started.elapsed().as_secs_f64() * 1e3,
        neural.dimensions(),
        neural.max_seq_length()
    );
    println!("RAYON_NUM_THREADS={}", std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "(unset)".into()));

    let settings = Settings::load(None, &Default::default()).expect("the compiled-in defaults parse");
    for set in sets.split(',').map(str::trim).filter(|set| !set.is_empty()) {
        let dir = data_dir.join(set);
        let mut tools: Vec<ToolRecord> = read_jsonl(&dir.join("tools.jsonl"));
        let mut queries: Vec<QueryRecord> = read_jsonl(&dir.join("dev_queries.jsonl"));
        if !full {
            tools.truncate(16);
            queries.truncate(8);
        }
        println!("\n== {set}: {} tools, {} dev queries", tools.len(), queries.len());
        bench_set(&neural, &tools, &queries, &settings);
    }
}

fn bench_set(neural: &NeuralEmbedder, tools: &[ToolRecord], queries: &[QueryRecord], settings: &Settings) {
    let mut catalog = Catalog::default();
    let mut descriptors = Vec::with_capacity(tools.len());
    for descriptor in tools.iter().map(ToolRecord::to_descriptor) {
        if !catalog.descriptors.contains_key(&descriptor.id) {
            catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
            descriptors.push(descriptor);
        }
    }
    let texts: Vec<String> = descriptors.iter().map(embedding_text).collect();

    // Throughput: every tool's embedding text in one call (batches of 32, longest first).
    let started = Instant::now();
    let tool_vectors = neural.embed_texts(&texts).expect("embed tool texts");
    let seconds = started.elapsed().as_secs_f64();
    let mean_chars = texts.iter().map(|text| text.chars().count()).sum::<usize>() as f64 / texts.len().max(1) as f64;
    println!(
        "throughput: {} tool texts (mean {mean_chars:.0} chars) in {seconds:.2} s = {:.1} texts/s",
        texts.len(),
        texts.len() as f64 / seconds
    );

    // Query embedding: per query, its message and clauses in one call, as discovery does.
    let mut query_vectors = Vec::with_capacity(queries.len());
    let mut micros = Vec::with_capacity(queries.len());
    for record in queries {
        let parts = query_texts(&record.query);
        let started = Instant::now();
        let vectors = Embed::embed_batch(neural, &parts).expect("the model embeds");
        micros.push(started.elapsed().as_secs_f64() * 1e6);
        query_vectors.push((parts, vectors));
    }
    micros.sort_by(f64::total_cmp);
    let mean_parts = query_vectors.iter().map(|(parts, _)| parts.len()).sum::<usize>() as f64 / queries.len() as f64;
    println!(
        "query embedding: p50 {:.1} ms, p99 {:.1} ms, mean {:.1} ms per query ({mean_parts:.2} texts per query)",
        percentile(&micros, 0.50) / 1e3,
        percentile(&micros, 0.99) / 1e3,
        micros.iter().sum::<f64>() / micros.len().max(1) as f64 / 1e3
    );

    let lexical = LexicalIndex::build_with(&descriptors, FIELD_WEIGHTS);
    let graph = CapabilityGraph::build(&descriptors, &[]);
    let config = &settings.discovery;
    let graph_boost = config.use_graph_reranking.then_some(config.graph_boost_factor);
    let dense_only = Fusion { lexical: 0.0, clause: 0.0 };

    let neural_index = index_of(&descriptors, &tool_vectors);
    // The static table beside the model, as the `local` backend joins them (`core::static_share`).
    let share = settings.embedder.static_share;
    let started = Instant::now();
    let joined_queries: Vec<Query> = query_vectors
        .iter()
        .map(|(parts, vectors)| Query::new(parts.clone(), static_share::join(parts, vectors.clone(), share)))
        .collect();
    println!(
        "the static table's vectors joined to the queries' in {:.1} µs per query (share {share})",
        started.elapsed().as_secs_f64() * 1e6 / queries.len().max(1) as f64
    );
    let joined_index = index_of(&descriptors, &static_share::join(&texts, tool_vectors, share));
    let neural_queries: Vec<Query> =
        query_vectors.into_iter().map(|(parts, vectors)| Query::new(parts, vectors)).collect();
    let indexes = Indexes { catalog: &catalog, vectors: &neural_index, lexical: &lexical, graph: &graph };
    let joined = Indexes { vectors: &joined_index, ..indexes };
    // The fusion discovery uses with a local model (`[discovery] lexical_weight = "auto"`).
    let semantic = Fusion { lexical: EmbedderBackend::Local.default_lexical_weight(), ..Fusion::default() };
    let hybrid = evaluate(&joined, &joined_queries, queries, graph_boost, semantic);
    print_metrics("model hybrid (the local backend's vectors and fusion, graph as configured)", &hybrid);
    let without_table = Fusion { lexical: 0.4, ..Fusion::default() };
    let hybrid_alone = evaluate(&indexes, &neural_queries, queries, graph_boost, without_table);
    print_metrics("model hybrid without the static table (static_share 0, lexical share 0.4)", &hybrid_alone);
    let alone = evaluate(&indexes, &neural_queries, queries, None, dense_only);
    print_metrics("model alone (dense only, no graph)", &alone);
    // Ablation: the lexical share of the fusion with this model and the table beside it.
    for lexical in [0.1f32, 0.2, 0.3, 0.4, 0.5] {
        let fusion = Fusion { lexical, ..Fusion::default() };
        let metrics = evaluate(&joined, &joined_queries, queries, graph_boost, fusion);
        print_metrics(&format!("model hybrid, lexical share {lexical:.1}"), &metrics);
    }

    let builtin = HashingEmbedder::new(settings.embedder_dimensions).expect("positive dimensions");
    let mut builtin_index = VectorIndex::with_capacity(builtin.dimensions(), descriptors.len());
    for (descriptor, text) in descriptors.iter().zip(&texts) {
        builtin_index.upsert(&descriptor.id, &builtin.embed(text)).expect("dimensions match");
    }
    let builtin_queries: Vec<Query> = queries
        .iter()
        .map(|record| {
            let parts = query_texts(&record.query);
            let vectors = builtin.embed_batch(&parts);
            Query::new(parts, vectors)
        })
        .collect();
    let indexes = Indexes { catalog: &catalog, vectors: &builtin_index, lexical: &lexical, graph: &graph };
    print_metrics(
        "builtin hybrid (default fusion, graph as configured)",
        &evaluate(&indexes, &builtin_queries, queries, graph_boost, Fusion::default()),
    );
}

/// The vector index of `descriptors` with their `vectors` (in order).
fn index_of(descriptors: &[capdex::core::descriptor::CapabilityDescriptor], vectors: &[Vec<f32>]) -> VectorIndex {
    let mut index = VectorIndex::with_capacity(vectors.first().map_or(0, Vec::len), descriptors.len());
    for (descriptor, vector) in descriptors.iter().zip(vectors) {
        index.upsert(&descriptor.id, vector).expect("dimensions match");
    }
    index
}

fn evaluate(
    indexes: &Indexes<'_>,
    prepared: &[Query],
    queries: &[QueryRecord],
    graph_boost: Option<f32>,
    fusion: Fusion,
) -> Metrics {
    let filter = DiscoveryFilter::default();
    let scores: Vec<_> = prepared
        .iter()
        .zip(queries)
        .map(|(query, record)| {
            let ranking = rank_with(query, indexes, &filter, DEPTH, graph_boost, fusion);
            let ranked: Vec<String> = ranking.hits.into_iter().take(DEPTH).map(|hit| hit.id).collect();
            score_query(&ranked, &record.relevant)
        })
        .collect();
    aggregate(&scores, queries.len())
}

fn print_metrics(label: &str, metrics: &Metrics) {
    println!(
        "{label}: NDCG@10 {:.2}  Recall@5 {:.2}  NDCG@5 {:.2}  Recall@1 {:.2}  Recall@10 {:.2}  MRR {:.2}",
        metrics.ndcg_at_10,
        metrics.recall_at_5,
        metrics.ndcg_at_5,
        metrics.recall_at_1,
        metrics.recall_at_10,
        metrics.mrr
    );
}

fn percentile(sorted: &[f64], quantile: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * quantile).round() as usize]
}

fn read_jsonl<T: DeserializeOwned>(path: &Path) -> Vec<T> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .enumerate()
        .map(|(index, line)| {
            serde_json::from_str(line).unwrap_or_else(|error| panic!("{} line {}: {error}", path.display(), index + 1))
        })
        .collect()
}
