//! Benchmark of the Source Capability Graph on real inputs: map time and node
//! and edge counts per source, TypeAligner and CONSUMES counts against the
//! published original's rules, route latency (p50/p99, the whole reply with its concepts) with every source mapped, the
//! share of recipes that chain along CONSUMES, and route latency with memory notes.
//!
//! `cargo bench --bench scg` runs the full figures; under `cargo test` it runs a
//! smoke version on the small inputs only (the harness passes no `--bench`).
//!
//! The inputs are `../shared/data` (the data folder beside the repository) when it
//! is there; otherwise the copies of the same files in `tests/fixtures`, and it says so.

use capdex::core::embedder::{Embed, HashingEmbedder};
use capdex::core::scg::align::{published_original_alignment_count, TypeAligner};
use capdex::core::scg::map_source;
use capdex::core::scg::memory::{self, Deposit, Polarity};
use capdex::core::scg::model::{EdgeKind, SourceGraph};
use capdex::core::scg::route::{MemoryView, RouteIndex, Scope, DEFAULT_K};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const QUERIES: [&str; 12] = [
    "who is assigned to this issue",
    "list open pull requests of a repository",
    "tasks due this week in a project",
    "invoices of a customer",
    "tracks on a playlist",
    "read a file",
    "current time in another timezone",
    "commit history of a branch",
    "add an observation to an entity in the knowledge graph",
    "create a webhook",
    "pets available for adoption",
    "comments on a task",
];

fn inputs(dir: &Path, full: bool) -> Vec<(PathBuf, String)> {
    let mut inputs: Vec<(PathBuf, String)> = vec![
        (dir.join("openapi/petstore.readme-oas-examples.json"), "petstore".into()),
        (dir.join("sql/chinook.postgresql-ddl.sql"), "chinook_pg".into()),
        (dir.join("sql/chinook.sqlite-ddl.sql"), "chinook_sqlite".into()),
    ];
    if full {
        inputs.push((dir.join("openapi/gitea.io.json"), "gitea".into()));
        inputs.push((dir.join("openapi/asana.com.json"), "asana".into()));
    }
    let mut mcp: Vec<PathBuf> = std::fs::read_dir(dir.join("mcp"))
        .unwrap_or_else(|err| panic!("{}/mcp: {err}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    mcp.sort();
    for path in mcp.into_iter().filter(|path| path.extension().is_some_and(|ext| ext == "json")) {
        let id = format!("mcp_{}", path.file_stem().unwrap().to_string_lossy());
        inputs.push((path, id));
    }
    inputs
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// CONSUMES edges under the published rule: exact lower-cased leaf equality, any field.
fn published_original_consumes(graphs: &[&SourceGraph]) -> (usize, usize) {
    let mut produced: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut consumed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for graph in graphs {
        for edge in &graph.edges {
            let Some(field) = graph.node(&edge.target) else { continue };
            let leaf = field.name.rsplit('.').next().unwrap_or(&field.name).to_lowercase();
            match edge.kind {
                EdgeKind::Produces => produced.entry(leaf).or_default().insert(edge.source.clone()),
                EdgeKind::SupportsQuery => consumed.entry(leaf).or_default().insert(edge.source.clone()),
                _ => continue,
            };
        }
    }
    let (mut total, mut on_id) = (0, 0);
    for (leaf, producers) in &produced {
        let Some(consumers) = consumed.get(leaf) else { continue };
        let n = producers.len() * consumers.len() - producers.intersection(consumers).count();
        total += n;
        if leaf == "id" {
            on_id += n;
        }
    }
    (total, on_id)
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shared = root.join("../shared/data");
    let dir = if shared.join("openapi").is_dir() {
        shared
    } else {
        println!(
            "note: {} is not there (the data folder beside the repository); mapping the copies in tests/fixtures",
            shared.display()
        );
        root.join("tests/fixtures")
    };
    let runs = if full { 5 } else { 1 };
    println!("capdex::core::scg ({})", if full { "full" } else { "smoke" });
    let mut graphs = Vec::new();
    for (path, source_id) in inputs(&dir, full) {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
        let mut times = Vec::new();
        let mut graph = None;
        for _ in 0..runs {
            let started = Instant::now();
            graph = Some(map_source(&source_id, None, &text).unwrap_or_else(|err| panic!("{}: {err}", path.display())));
            times.push(started.elapsed());
        }
        times.sort();
        let graph = graph.unwrap();
        println!(
            "  map {:<48} {:>7.2} ms  {:>5} nodes {:>5} edges",
            path.strip_prefix(&dir).unwrap().display(),
            percentile(&times, 0.5).as_secs_f64() * 1000.0,
            graph.nodes.len(),
            graph.edges.len()
        );
        graphs.push(graph);
    }
    let refs: Vec<&SourceGraph> = graphs.iter().collect();
    let started = Instant::now();
    let links = TypeAligner.link(&refs);
    let link_time = started.elapsed();
    let (published_consumes, published_on_id) = published_original_consumes(&refs);
    println!(
        "  TypeAligner over {} sources: {} pairs in {:.1} ms; RESOLVES_TO between entity types: published rule {} → capdex {} (+{} field pairs)",
        graphs.len(),
        links.n_pairs_compared,
        link_time.as_secs_f64() * 1000.0,
        published_original_alignment_count(&refs),
        links.n_entity_edges,
        links.resolves_to.len() - links.n_entity_edges
    );
    println!(
        "  CONSUMES: published rule {published_consumes} ({published_on_id} on `id`) → capdex {} (none on stop-fields)",
        links.consumes.len()
    );
    let embedder = HashingEmbedder::default();
    let started = Instant::now();
    let index = RouteIndex::build(&graphs, &links, Some(&embedder as &dyn Embed));
    let (n_nodes, n_edges, n_recipes) = index.counts();
    println!(
        "  route index: {n_nodes} nodes, {n_edges} edges, {n_recipes} recipes, built (embedded) in {:.1} ms",
        started.elapsed().as_secs_f64() * 1000.0
    );
    let reps = if full { 50 } else { 2 };
    let mut latencies = Vec::new();
    for _ in 0..reps {
        for query in QUERIES {
            let started = Instant::now();
            // The whole reply: concepts resolved, recipes ranked, each recipe's concepts named.
            let answer = index.route_answer(query, DEFAULT_K, &Scope::All, Some(&embedder as &dyn Embed), None);
            latencies.push(started.elapsed());
            assert!(!answer.recipes.is_empty(), "no route for {query:?}");
        }
    }
    latencies.sort();
    println!(
        "  route k={DEFAULT_K} (with concepts), {} queries: p50 {:.3} ms, p99 {:.3} ms",
        latencies.len(),
        percentile(&latencies, 0.5).as_secs_f64() * 1000.0,
        percentile(&latencies, 0.99).as_secs_f64() * 1000.0
    );
    let ranked_all: Vec<_> = QUERIES
        .iter()
        .flat_map(|query| index.route(query, DEFAULT_K, &Scope::All, Some(&embedder as &dyn Embed)))
        .collect();
    let chained = ranked_all.iter().filter(|recipe| recipe.steps.len() > 1).count();
    println!(
        "  chains: {chained} of {} top-{DEFAULT_K} recipes have more than one step (along CONSUMES)",
        ranked_all.len()
    );

    // Routing with memory: notes anchored at recipes the queries reach, deposited over 30 days.
    let day = 24 * 3600 * 1000u64;
    let now = 30 * day;
    let mut notes = Vec::new();
    for (at, recipe) in ranked_all.iter().enumerate().take(if full { 200 } else { 20 }) {
        let polarity = if at % 3 == 0 { Polarity::DeadEnd } else { Polarity::Positive };
        let deposit = Deposit {
            content: format!("note {at}: {} answered the question", recipe.source_key),
            polarity,
            anchors: vec![recipe.source_key.clone()],
            label: "ws:bench".into(),
        };
        notes.push(memory::merge(None, &deposit, &deposit.anchors, now - (at as u64 % 30) * day));
    }
    // As the ScgGraph actor does: note vectors are computed once, at deposit.
    let vectors: Vec<Vec<f32>> = notes.iter().map(|note| RouteIndex::note_vector(note, &embedder)).collect();
    let view =
        MemoryView { notes: &notes, now_ms: now, half_life_ms: memory::DEFAULT_HALF_LIFE_MS, vectors: Some(&vectors) };
    let mut latencies = Vec::new();
    let mut moved = 0;
    for _ in 0..reps {
        for query in QUERIES {
            let started = Instant::now();
            let ranked =
                index.route_with_memory(query, DEFAULT_K, &Scope::All, Some(&embedder as &dyn Embed), Some(view));
            latencies.push(started.elapsed());
            moved += ranked.iter().filter(|recipe| recipe.memory != 0.0).count();
        }
    }
    latencies.sort();
    println!(
        "  route k={DEFAULT_K} with {} memory notes, {} queries: p50 {:.3} ms, p99 {:.3} ms; {:.1} recipes a query biased",
        notes.len(),
        latencies.len(),
        percentile(&latencies, 0.5).as_secs_f64() * 1000.0,
        percentile(&latencies, 0.99).as_secs_f64() * 1000.0,
        moved as f64 / latencies.len() as f64
    );
    if full {
        for query in QUERIES {
            let ranked = index.route(query, 3, &Scope::All, Some(&embedder as &dyn Embed));
            let chains: Vec<String> = ranked.iter().map(|recipe| recipe.steps.join(" → ")).collect();
            println!("    {query:?} → {chains:?}");
        }
    }
}
