//! The Source Capability Graph's data model: node and edge kinds, content-addressed
//! node ids, route recipes, one source's graph, and its drift hash.
//!
//! Node ids are `hex(sha1(source_key | node_kind))[:16]`, so re-mapping a source gives
//! the same ids. Source keys are `<source_id>#<Qualified.Name>`; a source node's key is
//! its source id alone.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What a node stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    Source,
    EntityType,
    Field,
    Capability,
    RouteRecipe,
}

impl NodeKind {
    /// Returns the name used in node ids and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Source => "source",
            NodeKind::EntityType => "entity_type",
            NodeKind::Field => "field",
            NodeKind::Capability => "capability",
            NodeKind::RouteRecipe => "route_recipe",
        }
    }
}

/// How two nodes relate; the spelling is the contract's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EdgeKind {
    #[serde(rename = "HAS_ENTITY")]
    HasEntity,
    #[serde(rename = "HAS_FIELD")]
    HasField,
    #[serde(rename = "RESOLVES_TO")]
    ResolvesTo,
    #[serde(rename = "exposes")]
    Exposes,
    #[serde(rename = "SUPPORTS_QUERY")]
    SupportsQuery,
    #[serde(rename = "PRODUCES")]
    Produces,
    #[serde(rename = "CONSUMES")]
    Consumes,
    #[serde(rename = "builds")]
    Builds,
}

impl EdgeKind {
    /// Every edge kind, in declaration order.
    pub const ALL: [EdgeKind; 8] = [
        EdgeKind::HasEntity,
        EdgeKind::HasField,
        EdgeKind::ResolvesTo,
        EdgeKind::Exposes,
        EdgeKind::SupportsQuery,
        EdgeKind::Produces,
        EdgeKind::Consumes,
        EdgeKind::Builds,
    ];

    /// Returns the contract's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeKind::HasEntity => "HAS_ENTITY",
            EdgeKind::HasField => "HAS_FIELD",
            EdgeKind::ResolvesTo => "RESOLVES_TO",
            EdgeKind::Exposes => "exposes",
            EdgeKind::SupportsQuery => "SUPPORTS_QUERY",
            EdgeKind::Produces => "PRODUCES",
            EdgeKind::Consumes => "CONSUMES",
            EdgeKind::Builds => "builds",
        }
    }

    /// Parses the contract's spelling (case-insensitive).
    pub fn parse(text: &str) -> Option<EdgeKind> {
        EdgeKind::ALL.into_iter().find(|kind| kind.as_str().eq_ignore_ascii_case(text))
    }

    /// Returns the weight a structural edge of this kind carries.
    ///
    /// Every weight is below 1.0, the weight a seed gives its own recipe, so a
    /// capability is never outranked for its own query by one it chains into.
    pub fn structural_weight(self) -> f32 {
        match self {
            EdgeKind::SupportsQuery | EdgeKind::Produces => 0.5,
            EdgeKind::HasEntity | EdgeKind::HasField | EdgeKind::Exposes | EdgeKind::Builds => 0.3,
            EdgeKind::ResolvesTo | EdgeKind::Consumes => 0.5,
        }
    }
}

/// The kind of source a graph was mapped from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    Openapi,
    Mcp,
    Sql,
}

impl SourceKind {
    /// Parses `openapi`, `mcp` or `sql`.
    pub fn parse(text: &str) -> Option<SourceKind> {
        match text.to_ascii_lowercase().as_str() {
            "openapi" | "swagger" => Some(SourceKind::Openapi),
            "mcp" | "mcp_tool_list" => Some(SourceKind::Mcp),
            "sql" | "ddl" => Some(SourceKind::Sql),
            _ => None,
        }
    }
}

/// One node of the graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub id: String,
    pub source_key: String,
    pub kind: NodeKind,
    pub source_id: String,
    /// Leaf name: the schema, field path, operation or tool name.
    pub name: String,
    /// Description as the source gives it (may be empty).
    pub doc: String,
    /// For a field, the key of the entity type or capability it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// For a field, its enum values as the source lists them (a concept source, see `concepts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// One directed, weighted edge between two node ids.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Edge {
    pub source: String,
    pub target: String,
    pub kind: EdgeKind,
    pub weight: f32,
    /// Why the edge exists, for edges that are hypotheses (alignment, chaining).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
}

/// An ordered sequence of capability steps that answers something.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteRecipe {
    pub source_key: String,
    pub steps: Vec<String>,
}

/// Everything mapped from one source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceGraph {
    pub source_id: String,
    pub kind: SourceKind,
    /// Changes whenever the mapped structure does; see [`drift_hash`].
    pub drift_hash: String,
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
    pub recipes: Vec<RouteRecipe>,
}

/// Returns `hex(sha1(source_key | node_kind))[:16]`.
///
/// # Examples
/// ```
/// use capdex::core::scg::model::{node_id, NodeKind};
/// assert_eq!(node_id("gitea#Issue", NodeKind::EntityType).len(), 16);
/// assert_ne!(node_id("gitea#Issue", NodeKind::EntityType), node_id("gitea#Issue", NodeKind::Field));
/// ```
pub fn node_id(source_key: &str, kind: NodeKind) -> String {
    let digest = sha1_smol::Sha1::from(format!("{source_key}|{}", kind.as_str())).digest().to_string();
    digest[..16].to_string()
}

/// Returns a hash of a graph's structure that ignores the order nodes and edges were emitted in.
pub fn drift_hash(nodes: &[Node], edges: &[Edge], recipes: &[RouteRecipe]) -> String {
    let mut lines: BTreeSet<String> = BTreeSet::new();
    for node in nodes {
        lines.insert(format!("n|{}|{}|{}", node.kind.as_str(), node.source_key, node.doc));
    }
    for edge in edges {
        lines.insert(format!("e|{}|{}|{}|{:.4}", edge.kind.as_str(), edge.source, edge.target, edge.weight));
    }
    for recipe in recipes {
        lines.insert(format!("r|{}|{}", recipe.source_key, recipe.steps.join(",")));
    }
    let mut hasher = sha1_smol::Sha1::new();
    for line in &lines {
        hasher.update(line.as_bytes());
        hasher.update(b"\n");
    }
    hasher.digest().to_string()[..16].to_string()
}

/// Collects nodes and edges for one source, deduplicating both.
#[derive(Debug)]
pub struct GraphBuilder {
    source_id: String,
    nodes: BTreeMap<String, Node>,
    edges: BTreeMap<(String, String, EdgeKind), Edge>,
    recipes: BTreeMap<String, RouteRecipe>,
}

impl GraphBuilder {
    /// Starts a graph for `source_id` with its source node.
    pub fn new(source_id: &str, title: &str) -> GraphBuilder {
        let mut builder = GraphBuilder {
            source_id: source_id.to_string(),
            nodes: BTreeMap::new(),
            edges: BTreeMap::new(),
            recipes: BTreeMap::new(),
        };
        builder.insert(source_id.to_string(), NodeKind::Source, source_id, title, None);
        builder
    }

    /// Returns the source node's id.
    pub fn source_node(&self) -> String {
        node_id(&self.source_id, NodeKind::Source)
    }

    /// Returns `<source_id>#<qualified>`.
    pub fn key(&self, qualified: &str) -> String {
        format!("{}#{qualified}", self.source_id)
    }

    /// Adds (or keeps) the node `<source_id>#<qualified>` of `kind`; returns its id.
    pub fn node(&mut self, qualified: &str, kind: NodeKind, name: &str, doc: &str, owner: Option<&str>) -> String {
        let key = self.key(qualified);
        self.insert(key, kind, name, doc, owner)
    }

    fn insert(&mut self, key: String, kind: NodeKind, name: &str, doc: &str, owner: Option<&str>) -> String {
        let id = node_id(&key, kind);
        let entry = self.nodes.entry(id.clone()).or_insert_with(|| Node {
            id: id.clone(),
            source_key: key,
            kind,
            source_id: self.source_id.clone(),
            name: name.to_string(),
            doc: String::new(),
            owner: owner.map(str::to_string),
            values: Vec::new(),
        });
        if entry.doc.is_empty() && !doc.trim().is_empty() {
            entry.doc = doc.trim().to_string();
        }
        id
    }

    /// Gives a node its enum values, unless it has some already.
    pub fn values(&mut self, id: &str, values: &[String]) {
        if let Some(node) = self.nodes.get_mut(id).filter(|node| node.values.is_empty()) {
            node.values = values.to_vec();
        }
    }

    /// Returns whether a node with this id exists.
    pub fn has_node(&self, id: &str) -> bool {
        self.nodes.contains_key(id)
    }

    /// Adds a structural edge (weight from [`EdgeKind::structural_weight`]).
    pub fn edge(&mut self, source: &str, target: &str, kind: EdgeKind) {
        self.weighted_edge(source, target, kind, kind.structural_weight(), Vec::new());
    }

    /// Adds an edge with its own weight and evidence; a repeated edge keeps the higher weight.
    pub fn weighted_edge(&mut self, source: &str, target: &str, kind: EdgeKind, weight: f32, evidence: Vec<String>) {
        let edge = Edge { source: source.to_string(), target: target.to_string(), kind, weight, evidence };
        let key = (edge.source.clone(), edge.target.clone(), kind);
        match self.edges.get(&key) {
            Some(existing) if existing.weight >= weight => {}
            _ => {
                self.edges.insert(key, edge);
            }
        }
    }

    /// Adds a recipe, its node, and `builds` edges from each step's capability.
    pub fn recipe(&mut self, qualified: &str, steps: Vec<String>, doc: &str) {
        if steps.is_empty() {
            return;
        }
        let key = self.key(qualified);
        let recipe_id = self.insert(key.clone(), NodeKind::RouteRecipe, qualified, doc, None);
        for step in &steps {
            let step_id = node_id(step, NodeKind::Capability);
            self.edge(&step_id, &recipe_id, EdgeKind::Builds);
        }
        self.recipes.insert(key.clone(), RouteRecipe { source_key: key, steps });
    }

    /// Finishes the graph and stamps its drift hash.
    pub fn finish(self, kind: SourceKind) -> SourceGraph {
        let nodes: Vec<Node> = self.nodes.into_values().collect();
        let edges: Vec<Edge> = self.edges.into_values().collect();
        let recipes: Vec<RouteRecipe> = self.recipes.into_values().collect();
        let drift_hash = drift_hash(&nodes, &edges, &recipes);
        SourceGraph { source_id: self.source_id, kind, drift_hash, nodes, edges, recipes }
    }
}

impl SourceGraph {
    /// Returns the node with this id.
    pub fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.binary_search_by(|node| node.id.as_str().cmp(id)).ok().map(|at| &self.nodes[at])
    }

    /// Counts nodes by kind.
    pub fn count_nodes(&self, kind: NodeKind) -> usize {
        self.nodes.iter().filter(|node| node.kind == kind).count()
    }

    /// Counts edges by kind.
    pub fn count_edges(&self, kind: EdgeKind) -> usize {
        self.edges.iter().filter(|edge| edge.kind == kind).count()
    }
}

/// One mapped source as it is kept: its graph, the workspaces that enabled it, when it was mapped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredSource {
    pub graph: SourceGraph,
    /// Workspaces that enabled this source.
    pub workspaces: Vec<String>,
    /// Unix milliseconds of the last map.
    pub mapped_at_ms: u64,
}

/// The mapped sources after one source was (re-)mapped into them.
#[derive(Clone, Debug, PartialEq)]
pub struct Replaced {
    /// Every source, sorted by id, the new one in place of its earlier map.
    pub sources: Vec<StoredSource>,
    /// Where the new one is in `sources`.
    pub at: usize,
    /// False when the source was mapped before with the same drift hash.
    pub changed: bool,
}

/// Puts `graph` in place of its earlier map among `stored` (sorted by source id):
/// its workspaces are those that enabled it before plus `workspaces`, sorted and
/// without repeats, so a re-map never disables a source anywhere.
pub fn replace_source(stored: Vec<StoredSource>, graph: SourceGraph, workspaces: Vec<String>, now_ms: u64) -> Replaced {
    let previous = stored.iter().find(|source| source.graph.source_id == graph.source_id);
    let changed = previous.is_none_or(|previous| previous.graph.drift_hash != graph.drift_hash);
    let mut enabled: Vec<String> = previous.map(|previous| previous.workspaces.clone()).unwrap_or_default();
    enabled.extend(workspaces);
    enabled.sort();
    enabled.dedup();
    let mut sources: Vec<StoredSource> =
        stored.into_iter().filter(|source| source.graph.source_id != graph.source_id).collect();
    let at = sources.partition_point(|source| source.graph.source_id < graph.source_id);
    sources.insert(at, StoredSource { graph, workspaces: enabled, mapped_at_ms: now_ms });
    Replaced { sources, at, changed }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(id: &str, drift: &str, workspaces: &[&str]) -> StoredSource {
        let graph = SourceGraph {
            source_id: id.into(),
            kind: SourceKind::Mcp,
            drift_hash: drift.into(),
            nodes: vec![],
            edges: vec![],
            recipes: vec![],
        };
        StoredSource { graph, workspaces: workspaces.iter().map(|w| w.to_string()).collect(), mapped_at_ms: 1 }
    }

    #[test]
    fn a_remap_replaces_in_order_and_keeps_every_workspace() {
        let stored = vec![source("a", "h1", &["w1"]), source("c", "h3", &[])];
        let fresh = source("b", "h2", &[]).graph;
        let added = replace_source(stored.clone(), fresh, vec!["w2".into()], 9);
        let ids: Vec<&str> = added.sources.iter().map(|s| s.graph.source_id.as_str()).collect();
        assert_eq!((ids, added.at, added.changed), (vec!["a", "b", "c"], 1, true));
        assert_eq!((added.sources[1].workspaces.clone(), added.sources[1].mapped_at_ms), (vec!["w2".to_string()], 9));

        let same = replace_source(stored.clone(), source("a", "h1", &[]).graph, vec!["w0".into(), "w1".into()], 9);
        assert_eq!((same.sources.len(), same.at, same.changed), (2, 0, false));
        assert_eq!(same.sources[0].workspaces, ["w0", "w1"]);

        let drifted = replace_source(stored, source("c", "h4", &[]).graph, vec![], 9);
        assert_eq!((drifted.at, drifted.changed, drifted.sources[1].graph.drift_hash.as_str()), (1, true, "h4"));
    }

    #[test]
    fn node_ids_follow_the_contract() {
        // `echo -n "petstore#Pet|entity_type" | sha1sum` gives fca8ef4656098b8bc5db...
        assert_eq!(node_id("petstore#Pet", NodeKind::EntityType), "fca8ef4656098b8b");
    }

    #[test]
    fn drift_hash_ignores_order_and_sees_changes() {
        let mut first = GraphBuilder::new("s", "S");
        first.node("A", NodeKind::EntityType, "A", "", None);
        first.node("B", NodeKind::EntityType, "B", "", None);
        let mut second = GraphBuilder::new("s", "S");
        second.node("B", NodeKind::EntityType, "B", "", None);
        second.node("A", NodeKind::EntityType, "A", "", None);
        let first = first.finish(SourceKind::Openapi);
        let second = second.finish(SourceKind::Openapi);
        assert_eq!(first.drift_hash, second.drift_hash);
        let mut third = GraphBuilder::new("s", "S");
        third.node("A", NodeKind::EntityType, "A", "", None);
        assert_ne!(third.finish(SourceKind::Openapi).drift_hash, first.drift_hash);
    }

    #[test]
    fn edge_kinds_round_trip() {
        for kind in EdgeKind::ALL {
            assert_eq!(EdgeKind::parse(kind.as_str()), Some(kind));
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{}\"", kind.as_str()));
            assert!(kind.structural_weight() < 1.0);
        }
    }
}
