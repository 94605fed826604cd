//! `capdex bench --synthetic N`: builds every index over a seeded synthetic
//! catalog and times per-turn discovery in-process (no actors, no store),
//! with the built-in embedder.
//!
//! Build time covers embedding, the vector index, the lexical index and the
//! graph. Discovery time covers everything per turn: clause splitting, query
//! embedding, ranking, graph re-ranking and tier assembly (Tier 0 included).
//! Peak RSS is the process's high-water mark (`VmHWM` on Linux).

use crate::core::catalog::Catalog;
use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind, SourceRef};
use crate::core::discovery::{discover, DiscoveryConfig, DiscoveryFilter};
use crate::core::embedder::{Embed, HashingEmbedder};
use crate::core::graph::CapabilityGraph;
use crate::core::index::VectorIndex;
use crate::core::lexical::LexicalIndex;
use crate::core::retrieval::{query_texts, Indexes, Query};
use crate::core::text::embedding_text;
use crate::core::tiers::TokenBudget;
use std::time::Instant;

/// What one benchmark run measured.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchReport {
    pub n: usize,
    pub queries: usize,
    pub build_ms: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub candidates_per_query: f64,
    /// Peak resident set size; 0 where the platform does not say.
    pub rss_bytes: u64,
}

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
                }),
                full_content: skill.then(|| format!("# {verb} {object}\n\nUse {platform} to {verb} {object}.\n")),
                source_ref: SourceRef::Builtin,
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

/// Builds every index over `n` synthetic capabilities and times `n_queries` discoveries.
pub fn run(n: usize, n_queries: usize, dimensions: usize, config: &DiscoveryConfig) -> BenchReport {
    let descriptors = synthetic_catalog(n);
    let queries = synthetic_queries(n_queries);
    let embedder = HashingEmbedder::new(dimensions).unwrap_or_default();

    let started = Instant::now();
    let texts: Vec<String> = descriptors.iter().map(embedding_text).collect();
    let mut vectors = VectorIndex::with_capacity(embedder.dimensions(), descriptors.len());
    for (descriptor, vector) in descriptors.iter().zip(embedder.embed_batch(&texts)) {
        vectors.upsert(&descriptor.id, &vector).expect("the embedder's dimension is the index's");
    }
    drop(texts);
    let lexical = LexicalIndex::build(&descriptors);
    let graph = CapabilityGraph::build(&descriptors, &[]);
    // The catalog takes the descriptors over, as the Indexer holds them: one copy.
    let catalog = Catalog {
        version: 1,
        descriptors: descriptors.into_iter().map(|descriptor| (descriptor.id.clone(), descriptor)).collect(),
        ..Catalog::default()
    };
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let indexes = Indexes { catalog: &catalog, vectors: &vectors, lexical: &lexical, graph: &graph };
    let filter = DiscoveryFilter::default();
    let tier0 = catalog.tier0(&filter, TokenBudget::new(config.tier0_token_budget));

    let mut durations_us: Vec<f64> = Vec::with_capacity(queries.len());
    let mut candidates = 0usize;
    for message in &queries {
        let started = Instant::now();
        let texts = query_texts(message);
        let query = Query::new(texts.clone(), embedder.embed_batch(&texts));
        // Tier 0 is cached per catalog version in the Router, so a turn only clones it.
        let result = discover(&query, &indexes, config, &filter, tier0.clone());
        durations_us.push(started.elapsed().as_secs_f64() * 1e6);
        candidates += result.diagnostics.candidates_scanned;
    }
    durations_us.sort_by(f64::total_cmp);
    BenchReport {
        n,
        queries: queries.len(),
        build_ms,
        p50_us: percentile(&durations_us, 0.50),
        p99_us: percentile(&durations_us, 0.99),
        candidates_per_query: candidates as f64 / queries.len().max(1) as f64,
        rss_bytes: peak_rss_bytes(),
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

/// Returns the peak resident set size from `/proc/self/status`, or 0.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_data_is_deterministic_and_varied() {
        assert_eq!(synthetic_catalog(50), synthetic_catalog(50));
        let ids: std::collections::BTreeSet<String> = synthetic_catalog(200).into_iter().map(|d| d.id).collect();
        assert_eq!(ids.len(), 200);
        assert_eq!(synthetic_queries(10), synthetic_queries(10));
        assert!(synthetic_queries(3)[0].contains(", then "));
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 0.5), 50.0);
        assert_eq!(percentile(&values, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn a_small_run_reports_every_figure() {
        let report = run(300, 20, 64, &DiscoveryConfig::default());
        assert_eq!((report.n, report.queries), (300, 20));
        assert!(report.p50_us > 0.0 && report.p99_us >= report.p50_us);
        assert!(report.candidates_per_query >= 1.0);
    }
}
