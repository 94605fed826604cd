//! `capdex map`, `capdex route` and `capdex observe`: the Source Capability Graph on the data dir.
//!
//! Each command opens the store in `data_dir`, so they build on each other: `map`
//! stores a source's graph (replacing an earlier map of it) and recomputes the
//! cross-source links; `route` and `observe` read every stored source, recompute
//! the links only when a source changed since, and embed with the configured
//! built-in embedder.

use anyhow::Context as _;
use capdex::config::Settings;
use capdex::core::embedder::{Embed, HashingEmbedder};
use capdex::core::scg::align::{Links, TypeAligner};
use capdex::core::scg::model::{EdgeKind, NodeKind, SourceGraph, SourceKind};
use capdex::core::scg::route::{RouteIndex, Scope};
use capdex::core::scg::{map_source, MAX_SOURCE_BYTES};
use capdex::store::scg::{ScgStore, StoredLinks, StoredSource};
use capdex::store::Store;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// What `capdex map` was asked to do.
#[derive(Debug)]
pub struct MapArgs<'a> {
    pub file: &'a Path,
    pub source_id: &'a str,
    pub kind: Option<&'a str>,
    pub workspaces: &'a [String],
    pub json: bool,
}

fn open(settings: &Settings) -> anyhow::Result<ScgStore> {
    std::fs::create_dir_all(&settings.data_dir)
        .with_context(|| format!("failed to create data_dir {}", settings.data_dir.display()))?;
    let store = Store::open(&settings.data_dir).with_context(|| {
        "is another capdex process using this data_dir? set --data-dir or CAPDEX_DATA_DIR".to_string()
    })?;
    Ok(ScgStore::open(&store)?)
}

fn embedder(settings: &Settings) -> anyhow::Result<HashingEmbedder> {
    HashingEmbedder::new(settings.embedder_dimensions).context("embedder.dimensions must be positive")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// Recomputes the links over every stored source and stores them.
fn relink(scg: &ScgStore, sources: &[StoredSource]) -> anyhow::Result<Links> {
    let graphs: Vec<&SourceGraph> = sources.iter().map(|source| &source.graph).collect();
    let links = TypeAligner.link(&graphs);
    let computed_from =
        sources.iter().map(|source| (source.graph.source_id.clone(), source.graph.drift_hash.clone())).collect();
    scg.put_links(&StoredLinks { links: links.clone(), computed_from })?;
    Ok(links)
}

/// Loads every source and current links (recomputing stale ones).
fn load(scg: &ScgStore) -> anyhow::Result<(Vec<StoredSource>, Links)> {
    let sources = scg.sources()?;
    let links = match scg.links()? {
        Some(stored) if stored.is_current(&sources) => stored.links,
        _ => relink(scg, &sources)?,
    };
    Ok((sources, links))
}

fn scope(sources: &[StoredSource], workspace: Option<&str>) -> Scope {
    match workspace {
        None => Scope::All,
        Some(workspace) => Scope::Sources(
            sources
                .iter()
                .filter(|source| source.workspaces.iter().any(|enabled| enabled == workspace))
                .map(|source| source.graph.source_id.clone())
                .collect(),
        ),
    }
}

/// `capdex map FILE --source-id ID [--kind K] [--workspace WS]...`.
pub fn map(settings: &Settings, args: MapArgs<'_>) -> anyhow::Result<()> {
    let kind = match args.kind {
        Some(text) => {
            Some(SourceKind::parse(text).with_context(|| format!("unknown --kind {text:?}: use openapi, mcp or sql"))?)
        }
        None => None,
    };
    let size = std::fs::metadata(args.file).with_context(|| format!("failed to read {}", args.file.display()))?.len();
    anyhow::ensure!(
        size <= MAX_SOURCE_BYTES as u64,
        "{} is {size} bytes, more than the {MAX_SOURCE_BYTES} allowed",
        args.file.display()
    );
    let text = std::fs::read_to_string(args.file)
        .with_context(|| format!("failed to read {} as UTF-8 text", args.file.display()))?;
    let started = Instant::now();
    let graph =
        map_source(args.source_id, kind, &text).with_context(|| format!("failed to map {}", args.file.display()))?;
    let map_ms = started.elapsed().as_secs_f64() * 1000.0;

    let scg = open(settings)?;
    let previous = scg.source(args.source_id)?;
    let changed = previous.as_ref().is_none_or(|previous| previous.graph.drift_hash != graph.drift_hash);
    let mut workspaces: Vec<String> = previous.map(|previous| previous.workspaces).unwrap_or_default();
    workspaces.extend(args.workspaces.iter().cloned());
    workspaces.sort();
    workspaces.dedup();
    let node_counts: BTreeMap<&str, usize> =
        [NodeKind::Source, NodeKind::EntityType, NodeKind::Field, NodeKind::Capability, NodeKind::RouteRecipe]
            .into_iter()
            .map(|kind| (kind.as_str(), graph.count_nodes(kind)))
            .collect();
    let edge_counts: BTreeMap<&str, usize> =
        EdgeKind::ALL.into_iter().map(|kind| (kind.as_str(), graph.count_edges(kind))).collect();
    let (n_nodes, n_edges, drift_hash, source_kind) =
        (graph.nodes.len(), graph.edges.len(), graph.drift_hash.clone(), graph.kind);
    scg.put_source(&StoredSource { graph, workspaces: workspaces.clone(), mapped_at_ms: now_ms() })?;
    let started = Instant::now();
    let sources = scg.sources()?;
    let links = relink(&scg, &sources)?;
    let link_ms = started.elapsed().as_secs_f64() * 1000.0;
    scg.flush()?;
    if args.json {
        let report = serde_json::json!({
            "sourceId": args.source_id, "kind": source_kind, "driftHash": drift_hash, "changed": changed,
            "workspaces": workspaces, "nodes": n_nodes, "edges": n_edges, "nodeCounts": node_counts, "edgeCounts": edge_counts,
            "mapMs": map_ms, "linkMs": link_ms, "sources": sources.len(),
            "links": {"entityResolvesTo": links.n_entity_edges, "fieldResolvesTo": links.resolves_to.len() - links.n_entity_edges,
                      "consumes": links.consumes.len(), "pairsCompared": links.n_pairs_compared},
        });
        println!("{}", serde_json::to_string_pretty(&report).context("failed to encode the report")?);
    } else {
        println!(
            "mapped {} ({source_kind:?}): {n_nodes} nodes, {n_edges} edges in {map_ms:.1} ms; drift hash {drift_hash} ({})",
            args.source_id,
            if changed { "changed" } else { "unchanged" }
        );
        println!("  nodes {node_counts:?}\n  edges {edge_counts:?}");
        println!(
            "linked {} sources in {link_ms:.1} ms: {} RESOLVES_TO between entity types, {} between fields, {} CONSUMES",
            sources.len(),
            links.n_entity_edges,
            links.resolves_to.len() - links.n_entity_edges,
            links.consumes.len()
        );
    }
    Ok(())
}

/// `capdex route "<query>" [--workspace WS] [-k K] [--json]`.
pub fn route(settings: &Settings, query: &str, workspace: Option<&str>, k: usize, json: bool) -> anyhow::Result<()> {
    let scg = open(settings)?;
    let (sources, links) = load(&scg)?;
    let scope = scope(&sources, workspace);
    let graphs: Vec<SourceGraph> = sources.into_iter().map(|source| source.graph).collect();
    let embedder = embedder(settings)?;
    let index = RouteIndex::build(&graphs, &links, Some(&embedder as &dyn Embed));
    let ranked = index.route(query, k, &scope, Some(&embedder as &dyn Embed));
    if json {
        let recipes: Vec<serde_json::Value> = ranked
            .iter()
            .map(|recipe| serde_json::json!({"sourceKey": recipe.source_key, "steps": recipe.steps, "score": recipe.score}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "recipes": recipes }))
                .context("failed to encode the recipes")?
        );
    } else if ranked.is_empty() {
        println!(
            "no recipes (is a source mapped{}?)",
            workspace.map(|ws| format!(" and enabled in workspace {ws}")).unwrap_or_default()
        );
    } else {
        for recipe in &ranked {
            println!(
                "{:.3}  {}  steps: {}  (via {})",
                recipe.score,
                recipe.source_key,
                recipe.steps.join(" → "),
                recipe.via
            );
        }
    }
    Ok(())
}

/// `capdex observe NODE [--workspace WS] [--edge-kind K]... [--json]`.
pub fn observe(
    settings: &Settings,
    node: &str,
    workspace: Option<&str>,
    edge_kinds: &[String],
    json: bool,
) -> anyhow::Result<()> {
    let kinds: Vec<EdgeKind> = edge_kinds
        .iter()
        .map(|text| EdgeKind::parse(text).with_context(|| format!("unknown edge kind {text:?}")))
        .collect::<anyhow::Result<_>>()?;
    let scg = open(settings)?;
    let (sources, links) = load(&scg)?;
    let scope = scope(&sources, workspace);
    let graphs: Vec<SourceGraph> = sources.into_iter().map(|source| source.graph).collect();
    let index = RouteIndex::build(&graphs, &links, None);
    let observation = index.observe(node, &kinds, &scope)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&observation).context("failed to encode the observation")?);
        return Ok(());
    }
    let node = &observation.node;
    println!("{} {} ({}) — {} edges", node.kind.as_str(), node.source_key, node.id, observation.n_edges);
    if !node.doc.is_empty() {
        println!("  {}", node.doc.lines().next().unwrap_or_default());
    }
    for row in &observation.survey {
        println!("  {:>5} × {} {} {}", row.count, row.kind.as_str(), row.direction, row.neighbour_kind.as_str());
    }
    if !observation.survey.is_empty() {
        println!("  (a survey: add --edge-kind KIND to list edges)");
    }
    for edge in &observation.edges {
        println!(
            "  {} {:<3} {:.2} {} {}",
            edge.kind.as_str(),
            edge.direction,
            edge.weight,
            edge.neighbour_kind.as_str(),
            edge.neighbour_key
        );
    }
    for recipe in &observation.recipes {
        println!("  recipe {}: {}", recipe.source_key, recipe.steps.join(" → "));
    }
    Ok(())
}
