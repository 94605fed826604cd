//! The SCG on real inputs (`tests/fixtures`): Gitea, Asana and Petstore OpenAPI, six MCP
//! tools/list captures, and the Chinook DDL in PostgreSQL and SQLite dialects.

use crate::support::fixture;
use capdex::core::embedder::HashingEmbedder;
use capdex::core::scg::align::{field_concept, published_original_alignment_count, TypeAligner};
use capdex::core::scg::map_source;
use capdex::core::scg::model::{node_id, EdgeKind, NodeKind, SourceGraph, SourceKind};
use capdex::core::scg::route::{RouteIndex, Scope};
use std::path::PathBuf;

fn map(relative: &str, source_id: &str) -> SourceGraph {
    let path = fixture(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    map_source(source_id, None, &text).unwrap_or_else(|err| panic!("{} did not map: {err}", path.display()))
}

fn edge_between(links: &[capdex::core::scg::model::Edge], a: &str, b: &str) -> Option<f32> {
    links
        .iter()
        .find(|edge| (edge.source == a && edge.target == b) || (edge.source == b && edge.target == a))
        .map(|edge| edge.weight)
}

#[test]
fn gitea_issue_and_asana_task_align_and_so_do_their_assignees() {
    let gitea = map("openapi/gitea.io.json", "gitea");
    let asana = map("openapi/asana.com.json", "asana");
    assert_eq!(gitea.kind, SourceKind::Openapi);
    let links = TypeAligner.link(&[&gitea, &asana]);
    let issue = node_id("gitea#Issue", NodeKind::EntityType);
    let task = node_id("asana#TaskResponse", NodeKind::EntityType);
    assert!(edge_between(&links.resolves_to, &issue, &task).is_some(), "Issue~TaskResponse not aligned");
    let issue_assignee = node_id("gitea#Issue.assignee", NodeKind::Field);
    let task_assignee = node_id("asana#TaskResponse.assignee", NodeKind::Field);
    assert!(edge_between(&links.resolves_to, &issue_assignee, &task_assignee).is_some(), "assignee fields not aligned");
    // {id, name}-only schemas do not align with everything.
    for graph in [&gitea, &asana] {
        for node in graph.nodes.iter().filter(|node| node.kind == NodeKind::EntityType) {
            let concepts: std::collections::BTreeSet<String> = graph
                .edges
                .iter()
                .filter(|edge| edge.kind == EdgeKind::HasField && edge.source == node.id)
                .filter_map(|edge| graph.node(&edge.target))
                .filter(|field| !field.name.contains('.'))
                .map(|field| field_concept(&field.name))
                .collect();
            if !concepts.is_empty()
                && concepts.iter().all(|concept| ["id", "gid", "name", "resource_type"].contains(&concept.as_str()))
            {
                let touching =
                    links.resolves_to.iter().filter(|edge| edge.source == node.id || edge.target == node.id).count();
                assert_eq!(touching, 0, "{} ({concepts:?}) aligned", node.source_key);
            }
        }
    }
    let before = published_original_alignment_count(&[&gitea, &asana]);
    eprintln!(
        "gitea+asana: {} pairs, RESOLVES_TO entity edges before (published rule) {before}, after {}; field edges {}; CONSUMES {}",
        links.n_pairs_compared,
        links.n_entity_edges,
        links.resolves_to.len() - links.n_entity_edges,
        links.consumes.len()
    );
    assert!(links.n_entity_edges < 200, "alignment is too loose: {} entity edges", links.n_entity_edges);
    assert!(links.consumes.iter().all(|edge| !edge.evidence.iter().any(|e| e == "concept=id" || e == "concept=name")));
}

#[test]
fn every_fixture_source_maps_with_all_node_kinds() {
    let mut sources: Vec<(String, String)> = vec![
        ("openapi/petstore.readme-oas-examples.json".into(), "petstore".into()),
        ("openapi/gitea.io.json".into(), "gitea".into()),
        ("openapi/asana.com.json".into(), "asana".into()),
        ("sql/chinook.postgresql-ddl.sql".into(), "chinook_pg".into()),
        ("sql/chinook.sqlite-ddl.sql".into(), "chinook_sqlite".into()),
    ];
    let mut mcp: Vec<PathBuf> = std::fs::read_dir(fixture("mcp")).unwrap().map(|entry| entry.unwrap().path()).collect();
    mcp.sort();
    for path in mcp {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        sources.push((format!("mcp/{stem}.json"), format!("mcp_{stem}")));
    }
    let mut graphs = Vec::new();
    for (relative, source_id) in &sources {
        let started = std::time::Instant::now();
        let graph = map(relative, source_id);
        eprintln!(
            "{relative}: {} nodes, {} edges, {} capabilities, {} entity types, {} PRODUCES in {:?}",
            graph.nodes.len(),
            graph.edges.len(),
            graph.count_nodes(NodeKind::Capability),
            graph.count_nodes(NodeKind::EntityType),
            graph.count_edges(EdgeKind::Produces),
            started.elapsed()
        );
        assert!(graph.count_nodes(NodeKind::Capability) > 0, "{relative}: no capabilities");
        assert!(graph.count_nodes(NodeKind::RouteRecipe) > 0, "{relative}: no recipes");
        // Re-mapping gives the same ids and the same drift hash.
        assert_eq!(map(relative, source_id).drift_hash, graph.drift_hash);
        graphs.push(graph);
    }
    let by_id = |id: &str| graphs.iter().find(|graph| graph.source_id == id).unwrap();
    for sql in ["chinook_pg", "chinook_sqlite"] {
        assert_eq!(by_id(sql).count_nodes(NodeKind::EntityType), 11, "{sql}");
        assert!(by_id(sql).count_edges(EdgeKind::ResolvesTo) >= 11, "{sql}: foreign keys missing");
    }
    assert!(by_id("gitea").count_edges(EdgeKind::Produces) > 1000);
    assert!(by_id("mcp_memory").count_nodes(NodeKind::EntityType) > 0, "MCP output schemas give entity types");

    let refs: Vec<&SourceGraph> = graphs.iter().collect();
    let links = TypeAligner.link(&refs);
    let embedder = HashingEmbedder::default();
    let index = RouteIndex::build(&graphs, &links, Some(&embedder));
    let ranked = index.route("who is assigned to this issue", 5, &Scope::All, Some(&embedder));
    assert!(!ranked.is_empty());
    let workspace = Scope::Sources(["chinook_pg".to_string()].into());
    let ranked = index.route("invoices of a customer", 5, &workspace, Some(&embedder));
    assert!(
        !ranked.is_empty() && ranked.iter().all(|recipe| recipe.source_key.starts_with("chinook_pg#")),
        "{ranked:#?}"
    );
    assert!(ranked.iter().take(3).any(|recipe| recipe.source_key.to_lowercase().contains("invoice")), "{ranked:#?}");
}

/// On Gitea, Asana and Petstore together: for every CONSUMES edge (a sample of 80),
/// routing the producer's own text ranks the producer's recipe above the consumer's,
/// and every chain a route returns follows CONSUMES edges step by step.
#[test]
fn a_producer_is_not_outranked_by_its_consumer_and_chains_follow_consumes() {
    use capdex::core::scg::route::{node_text, MAX_CHAIN_STEPS};
    let graphs = vec![
        map("openapi/gitea.io.json", "gitea"),
        map("openapi/asana.com.json", "asana"),
        map("openapi/petstore.readme-oas-examples.json", "petstore"),
    ];
    let refs: Vec<&SourceGraph> = graphs.iter().collect();
    let links = TypeAligner.link(&refs);
    let embedder = HashingEmbedder::default();
    let index = RouteIndex::build(&graphs, &links, Some(&embedder));
    let node = |id: &str| graphs.iter().find_map(|graph| graph.node(id)).expect("edge ends are nodes");
    let consumes: std::collections::BTreeSet<(String, String)> = links
        .consumes
        .iter()
        .map(|edge| (node(&edge.source).source_key.clone(), node(&edge.target).source_key.clone()))
        .collect();
    let step = (links.consumes.len() / 80).max(1);
    let mut checked = 0;
    for edge in links.consumes.iter().step_by(step) {
        let (producer, consumer) = (node(&edge.source), node(&edge.target));
        let ranked = index.route(&node_text(producer), 50, &Scope::All, Some(&embedder));
        let position = |key: &str| ranked.iter().position(|recipe| recipe.source_key == key);
        let own = position(&producer.source_key)
            .unwrap_or_else(|| panic!("{} is not routed for its own text", producer.source_key));
        if let Some(theirs) = position(&consumer.source_key) {
            assert!(own < theirs, "{} outranked by its consumer {}", producer.source_key, consumer.source_key);
            checked += 1;
        }
        for recipe in &ranked {
            assert!(recipe.steps.len() <= MAX_CHAIN_STEPS, "{recipe:?}");
            for pair in recipe.steps.windows(2) {
                assert!(
                    consumes.contains(&(pair[0].clone(), pair[1].clone())),
                    "{pair:?} is no CONSUMES edge in {recipe:?}"
                );
            }
        }
    }
    assert!(checked >= 20, "only {checked} producer/consumer pairs were both routed");
    // Some routes chain more than one step.
    let chained = ["comments on a task", "list open pull requests of a repository", "pets available for adoption"]
        .iter()
        .flat_map(|query| index.route(query, 10, &Scope::All, Some(&embedder)))
        .filter(|recipe| recipe.steps.len() > 1)
        .count();
    assert!(chained > 0, "no multi-step recipe on the shared specs");
}

/// One id everywhere: for every source fixture the SCG tests read, the tools
/// `tools_of` finds are named exactly as the mapper's capability nodes.
#[test]
fn every_scg_fixture_offers_tools_under_the_mappers_capability_keys() {
    let mut checked = 0;
    for folder in ["openapi", "mcp", "sql"] {
        let mut paths: Vec<PathBuf> =
            std::fs::read_dir(fixture(folder)).unwrap().map(|entry| entry.unwrap().path()).collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path).unwrap();
            let graph = map_source("src", None, &text).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            let mapped: std::collections::BTreeSet<String> = graph
                .nodes
                .iter()
                .filter(|node| node.kind == NodeKind::Capability)
                .map(|node| node.source_key.clone())
                .collect();
            let tools = capdex::core::sources::tools::tools_of(graph.kind, &text)
                .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            let ids: std::collections::BTreeSet<String> =
                tools.iter().map(|tool| capdex::core::sources::capability_id("src", &tool.name)).collect();
            assert_eq!(ids.len(), tools.len(), "{}: one tool per name", path.display());
            assert!(!ids.is_empty(), "{} offers no tool", path.display());
            assert_eq!(mapped, ids, "{}", path.display());
            for tool in &tools {
                let schema = &tool.input_schema;
                if let Err(err) = jsonschema::validator_for(schema) {
                    panic!("{} {}: the input schema is not a JSON Schema: {err}", path.display(), tool.name);
                }
                if folder == "openapi" {
                    // The document's references are inlined: the schema stands alone.
                    assert!(
                        !schema.to_string().contains("\"$ref\""),
                        "{} {}: a $ref is left",
                        path.display(),
                        tool.name
                    );
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 11, "3 OpenAPI documents, 6 MCP tool lists and 2 DDL files");
}
