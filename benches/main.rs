//! Benchmarks of the pure core: embedding, exact search, graph build and the
//! lexical index, the whole per-turn discovery on a 1,000-capability catalog.
//!
//! Run with `cargo bench`; `cargo test --all-targets` runs each once as a smoke test.

use capdex::core::catalog::Catalog;
use capdex::core::descriptor::{CapabilityDescriptor, CapabilityKind, DefinitionRef};
use capdex::core::discovery::{discover, DiscoveryConfig, DiscoveryFilter};
use capdex::core::embedder::{Embed, HashingEmbedder};
use capdex::core::graph::CapabilityGraph;
use capdex::core::index::VectorIndex;
use capdex::core::lexical::LexicalIndex;
use capdex::core::retrieval::{query_texts, Indexes, Query};
use capdex::core::text::embedding_text;
use capdex::core::tiers::TokenBudget;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

const VERBS: &[&str] =
    &["search", "send", "create", "delete", "list", "summarize", "translate", "schedule", "track", "convert"];
const OBJECTS: &[&str] =
    &["messages", "flights", "invoices", "issues", "files", "events", "notes", "songs", "orders", "photos"];
const PLATFORMS: &[&str] =
    &["slack", "github", "stripe", "spotify", "notion", "gmail", "jira", "dropbox", "zoom", "shopify"];
const CATEGORIES: &[&str] = &["communication", "developer", "finance", "media", "productivity", "travel", "commerce"];

/// A deterministic synthetic catalog of `n` capabilities.
fn catalog(n: usize) -> Vec<CapabilityDescriptor> {
    (0..n)
        .map(|i| {
            let (verb, object, platform) = (VERBS[i % 10], OBJECTS[(i / 10) % 10], PLATFORMS[(i / 100) % 10]);
            let name = format!("{platform}-{verb}-{object}-{i}");
            CapabilityDescriptor {
                id: format!("tool:{name}"),
                kind: CapabilityKind::Tool,
                display_name: name.clone(),
                name,
                description: format!("{verb} {object} in {platform} from a natural language request"),
                category: CATEGORIES[i % CATEGORIES.len()].to_string(),
                tags: vec![verb.to_string(), object.to_string(), platform.to_string()],
                required_secrets: vec![],
                required_tools: vec![],
                available: true,
                has_side_effects: None,
                full_schema: Some(serde_json::json!({"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}).into()),
                full_content: None,
                definition_ref: DefinitionRef::Builtin,
            }
        })
        .collect()
}

fn benches(c: &mut Criterion) {
    let embedder = HashingEmbedder::default();
    let descriptors = catalog(1000);
    let texts: Vec<String> = descriptors.iter().map(embedding_text).collect();
    let mut index = VectorIndex::new(embedder.dimensions());
    let mut catalog = Catalog::default();
    for (descriptor, text) in descriptors.iter().zip(&texts) {
        index.upsert(&descriptor.id, &embedder.embed(text)).unwrap();
        catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
    }
    let graph = CapabilityGraph::build(&descriptors, &[]);
    let lexical = LexicalIndex::build(&descriptors);
    let indexes = Indexes { catalog: &catalog, vectors: &index, lexical: &lexical, graph: &graph };
    let config = DiscoveryConfig::default();
    let filter = DiscoveryFilter::default();
    let query = "could you track the flights in booking and send me the invoices";

    let mut group = c.benchmark_group("capdex::core");
    group.throughput(Throughput::Elements(1));
    group.bench_function("embedder/embed_query", |b| b.iter(|| embedder.embed(black_box(query))));
    let query_vector = embedder.embed(query);
    let texts_of_query = query_texts(query);
    let prepared = Query::new(texts_of_query.clone(), embedder.embed_batch(&texts_of_query));
    group.bench_function("lexical/score_1000", |b| b.iter(|| lexical.score(black_box(query)).top(10, |_| true)));
    group.bench_function("index/search_top10_of_1000", |b| {
        b.iter(|| index.search(black_box(&query_vector), 10, |_| true))
    });
    group.bench_function("discovery/discover_1000", |b| {
        b.iter(|| {
            let tier0 = catalog.tier0(&filter, TokenBudget::new(config.tier0_token_budget));
            discover(black_box(&prepared), &indexes, &config, &filter, tier0)
        })
    });
    group.throughput(Throughput::Elements(1000));
    group.bench_function("graph/build_1000", |b| b.iter(|| CapabilityGraph::build(black_box(&descriptors), &[])));
    group.bench_function("lexical/build_1000", |b| b.iter(|| LexicalIndex::build(black_box(&descriptors))));
    group.bench_function("embedder/embed_1000_capabilities", |b| b.iter(|| embedder.embed_batch(black_box(&texts))));
    group.finish();
}

criterion_group!(core_benches, benches);
criterion_main!(core_benches);
