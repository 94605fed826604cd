//! Routing a query over the SCG, and reading a node's neighbourhood.
//!
//! [`RouteIndex::route`]:
//! 1. embed the query with the index-time embedder (or, with none, score word overlap);
//! 2. rank every in-scope capability and entity-type node by similarity and keep the
//!    best [`seed_count`] as seeds;
//! 3. expand each seed one hop along every edge kind, outbound and inbound;
//! 4. score each reached node `similarity(query, seed) + edge weight`, the seed itself
//!    with [`SELF_WEIGHT`]; every edge weighs less, so a capability is never outranked
//!    for its own query by one it chains into;
//! 5. map each node to its recipe (a field to its owner's), keep each recipe's best score,
//!    drop recipes with a step outside the scope, and return the top k (ties by key).
//!
//! Scope is applied before seeding, so out-of-scope sources never crowd in-scope ones out;
//! an empty scope routes nothing and observes nothing.

use super::align::Links;
use super::model::{node_id, Edge, EdgeKind, Node, NodeKind, RouteRecipe, SourceGraph};
use crate::core::embedder::{dot, Embed};
use crate::core::text::{is_stopword, stem, word_tokens};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Recipes returned when the caller does not say.
pub const DEFAULT_K: usize = 5;
/// The most recipes one route returns.
pub const MAX_K: usize = 50;
/// The weight a seed gives its own recipe; every edge weighs less.
pub const SELF_WEIGHT: f32 = 1.0;
/// Characters of a node's description used for its embedding.
pub const MAX_DOC_CHARS: usize = 400;
/// Edges listed before an unfiltered observation turns into a survey.
pub const SURVEY_ABOVE_EDGES: usize = 40;

/// Returns how many seeds a route for `k` recipes expands.
pub fn seed_count(k: usize) -> usize {
    (4 * k).max(20)
}

/// Which sources a request may see.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// Every source (a plain chat session).
    #[default]
    All,
    /// Only these sources (a workspace); empty sees nothing.
    Sources(BTreeSet<String>),
}

impl Scope {
    /// Returns whether a source is visible.
    pub fn permits(&self, source_id: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Sources(sources) => sources.contains(source_id),
        }
    }
}

/// One ranked recipe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RankedRecipe {
    pub source_key: String,
    pub steps: Vec<String>,
    pub score: f32,
    /// The seed node's source key that reached this recipe.
    pub via: String,
}

/// The searchable, expandable union of mapped sources and their links.
#[derive(Debug)]
pub struct RouteIndex {
    nodes: Vec<Node>,
    by_id: HashMap<String, usize>,
    edges: Vec<Edge>,
    /// Node index → indices of edges touching it.
    incident: Vec<Vec<usize>>,
    recipes: BTreeMap<String, RouteRecipe>,
    /// Seedable nodes (capabilities, entity types) with their vectors and word sets.
    seedable: Vec<(usize, Vec<f32>, BTreeSet<String>)>,
    embedder_model: Option<String>,
}

/// Why an observation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ObserveError {
    #[error("no node {0:?} in scope")]
    NotFound(String),
}

/// An edge seen from one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedEdge {
    pub kind: EdgeKind,
    /// `out` when the observed node is the edge's source, else `in`.
    pub direction: String,
    pub weight: f32,
    pub neighbour_id: String,
    pub neighbour_key: String,
    pub neighbour_kind: NodeKind,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
}

/// A count of one kind of edge around a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SurveyRow {
    pub kind: EdgeKind,
    pub direction: String,
    pub neighbour_kind: NodeKind,
    pub count: usize,
}

/// A node's typed neighbourhood.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    pub node: Node,
    /// In-scope edges around the node, before any filter.
    pub n_edges: usize,
    /// Counts by kind, direction and neighbour kind, when the node is large and no filter was given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub survey: Vec<SurveyRow>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edges: Vec<ObservedEdge>,
    /// Recipes this node is, or is a step of.
    pub recipes: Vec<RouteRecipe>,
}

impl RouteIndex {
    /// Builds the index; `embedder` is the index-time embedder, or `None` for word overlap only.
    pub fn build(graphs: &[SourceGraph], links: &Links, embedder: Option<&dyn Embed>) -> RouteIndex {
        let mut nodes: Vec<Node> = graphs.iter().flat_map(|graph| graph.nodes.iter().cloned()).collect();
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        nodes.dedup_by(|a, b| a.id == b.id);
        let by_id: HashMap<String, usize> = nodes.iter().enumerate().map(|(at, node)| (node.id.clone(), at)).collect();
        let edges: Vec<Edge> = graphs
            .iter()
            .flat_map(|graph| graph.edges.iter().cloned())
            .chain(links.resolves_to.iter().cloned())
            .chain(links.consumes.iter().cloned())
            .filter(|edge| by_id.contains_key(&edge.source) && by_id.contains_key(&edge.target))
            .collect();
        let mut incident = vec![Vec::new(); nodes.len()];
        for (edge_idx, edge) in edges.iter().enumerate() {
            // A heavier edge would let a chained capability outrank the one the query matched.
            debug_assert!(edge.weight < SELF_WEIGHT, "edge weight {} is not below SELF_WEIGHT", edge.weight);
            incident[by_id[&edge.source]].push(edge_idx);
            if edge.source != edge.target {
                incident[by_id[&edge.target]].push(edge_idx);
            }
        }
        let recipes = graphs
            .iter()
            .flat_map(|graph| graph.recipes.iter().cloned())
            .map(|recipe| (recipe.source_key.clone(), recipe))
            .collect();
        let seedable_idx: Vec<usize> = nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| matches!(node.kind, NodeKind::Capability | NodeKind::EntityType))
            .map(|(at, _)| at)
            .collect();
        let texts: Vec<String> = seedable_idx.iter().map(|at| node_text(&nodes[*at])).collect();
        let vectors = match embedder {
            // An embedder that fails leaves the nodes without vectors (words still seed).
            Some(embedder) => embedder.embed_batch(&texts).unwrap_or_else(|_| vec![Vec::new(); texts.len()]),
            None => vec![Vec::new(); texts.len()],
        };
        let seedable = seedable_idx
            .into_iter()
            .zip(vectors)
            .zip(&texts)
            .map(|((at, vector), text)| (at, vector, word_set(text)))
            .collect();
        RouteIndex { nodes, by_id, edges, incident, recipes, seedable, embedder_model: embedder.map(|e| e.model_id()) }
    }

    /// Returns the number of nodes, edges and recipes.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.nodes.len(), self.edges.len(), self.recipes.len())
    }

    /// Returns the embedder model the index was built with, if any.
    pub fn embedder_model(&self) -> Option<&str> {
        self.embedder_model.as_deref()
    }

    /// Ranks recipes for `query`; `k` is clamped to 1..=[`MAX_K`]. `embedder` must be the one given to [`RouteIndex::build`].
    pub fn route(&self, query: &str, k: usize, scope: &Scope, embedder: Option<&dyn Embed>) -> Vec<RankedRecipe> {
        let k = k.clamp(1, MAX_K);
        let query_vector =
            embedder.filter(|_| self.embedder_model.is_some()).and_then(|embedder| embedder.embed(query).ok());
        let query_words = word_set(query);
        let mut seeds: Vec<(f32, usize)> = self
            .seedable
            .iter()
            .filter(|(at, _, _)| scope.permits(&self.nodes[*at].source_id))
            .map(|(at, vector, words)| {
                let similarity = match &query_vector {
                    Some(query_vector) if query_vector.len() == vector.len() => dot(query_vector, vector),
                    _ => lexical(&query_words, words),
                };
                (similarity, *at)
            })
            .filter(|(similarity, _)| *similarity > 0.0)
            .collect();
        seeds.sort_by(|a, b| {
            b.0.total_cmp(&a.0).then_with(|| self.nodes[a.1].source_key.cmp(&self.nodes[b.1].source_key))
        });
        seeds.truncate(seed_count(k));
        let mut best: BTreeMap<String, (f32, usize)> = BTreeMap::new();
        let offer = |recipe_key: &str, score: f32, seed: usize, best: &mut BTreeMap<String, (f32, usize)>| {
            if self.recipes.contains_key(recipe_key) {
                let entry = best.entry(recipe_key.to_string()).or_insert((f32::MIN, seed));
                if score > entry.0 {
                    *entry = (score, seed);
                }
            }
        };
        for &(similarity, seed) in &seeds {
            for recipe_key in self.recipe_keys(seed) {
                offer(recipe_key, similarity + SELF_WEIGHT, seed, &mut best);
            }
            for &edge_idx in &self.incident[seed] {
                let edge = &self.edges[edge_idx];
                let other = if self.by_id[&edge.source] == seed { &edge.target } else { &edge.source };
                let other_idx = self.by_id[other];
                if !scope.permits(&self.nodes[other_idx].source_id) {
                    continue;
                }
                for recipe_key in self.recipe_keys(other_idx) {
                    offer(recipe_key, similarity + edge.weight, seed, &mut best);
                }
            }
        }
        let mut ranked: Vec<RankedRecipe> = best
            .into_iter()
            .filter_map(|(key, (score, seed))| {
                let recipe = &self.recipes[&key];
                let in_scope = recipe.steps.iter().all(|step| scope.permits(step.split('#').next().unwrap_or(step)));
                in_scope.then(|| RankedRecipe {
                    source_key: recipe.source_key.clone(),
                    steps: recipe.steps.clone(),
                    score,
                    via: self.nodes[seed].source_key.clone(),
                })
            })
            .collect();
        ranked.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.source_key.cmp(&b.source_key)));
        ranked.truncate(k);
        ranked
    }

    /// Returns the recipe keys a node stands for: its own, or its owner's for a field.
    fn recipe_keys(&self, at: usize) -> Vec<&str> {
        let node = &self.nodes[at];
        match node.kind {
            NodeKind::Capability | NodeKind::EntityType | NodeKind::RouteRecipe => vec![node.source_key.as_str()],
            NodeKind::Field => node.owner.as_deref().into_iter().collect(),
            NodeKind::Source => Vec::new(),
        }
    }

    /// Finds a node by id or by source key (probing capability, entity type, source, field, recipe).
    pub fn find(&self, node_ref: &str) -> Option<&Node> {
        if let Some(at) = self.by_id.get(node_ref) {
            return Some(&self.nodes[*at]);
        }
        [NodeKind::Capability, NodeKind::EntityType, NodeKind::Source, NodeKind::Field, NodeKind::RouteRecipe]
            .into_iter()
            .find_map(|kind| self.by_id.get(&node_id(node_ref, kind)).map(|at| &self.nodes[*at]))
    }

    /// Returns a node's neighbourhood: a survey when it has more than
    /// [`SURVEY_ABOVE_EDGES`] edges and no filter is given, else its edges (of `edge_kinds`, when given).
    pub fn observe(&self, node_ref: &str, edge_kinds: &[EdgeKind], scope: &Scope) -> Result<Observation, ObserveError> {
        let node = self
            .find(node_ref)
            .filter(|node| scope.permits(&node.source_id))
            .ok_or_else(|| ObserveError::NotFound(node_ref.to_string()))?;
        let at = self.by_id[&node.id];
        let mut all = Vec::new();
        for &edge_idx in &self.incident[at] {
            let edge = &self.edges[edge_idx];
            let outbound = edge.source == node.id;
            let neighbour = &self.nodes[self.by_id[if outbound { &edge.target } else { &edge.source }]];
            if !scope.permits(&neighbour.source_id) {
                continue;
            }
            all.push(ObservedEdge {
                kind: edge.kind,
                direction: if outbound { "out" } else { "in" }.to_string(),
                weight: edge.weight,
                neighbour_id: neighbour.id.clone(),
                neighbour_key: neighbour.source_key.clone(),
                neighbour_kind: neighbour.kind,
                evidence: edge.evidence.clone(),
            });
        }
        all.sort_by(|a, b| (a.kind, &a.direction, &a.neighbour_key).cmp(&(b.kind, &b.direction, &b.neighbour_key)));
        let recipes = self
            .recipes
            .values()
            .filter(|recipe| recipe.source_key == node.source_key || recipe.steps.contains(&node.source_key))
            .filter(|recipe| recipe.steps.iter().all(|step| scope.permits(step.split('#').next().unwrap_or(step))))
            .cloned()
            .collect();
        let n_edges = all.len();
        let (survey, edges) = if edge_kinds.is_empty() && n_edges > SURVEY_ABOVE_EDGES {
            let mut counts: BTreeMap<(EdgeKind, String, NodeKind), usize> = BTreeMap::new();
            for edge in &all {
                *counts.entry((edge.kind, edge.direction.clone(), edge.neighbour_kind)).or_insert(0) += 1;
            }
            let survey = counts
                .into_iter()
                .map(|((kind, direction, neighbour_kind), count)| SurveyRow { kind, direction, neighbour_kind, count })
                .collect();
            (survey, Vec::new())
        } else {
            let edges =
                all.into_iter().filter(|edge| edge_kinds.is_empty() || edge_kinds.contains(&edge.kind)).collect();
            (Vec::new(), edges)
        };
        Ok(Observation { node: node.clone(), n_edges, survey, edges, recipes })
    }
}

/// Returns the text a node is embedded with: its name split into words, then its description.
pub fn node_text(node: &Node) -> String {
    let doc: String = node.doc.chars().take(MAX_DOC_CHARS).collect();
    format!("{} {}\n{doc}", node.name, word_tokens(&node.name).join(" "))
}

fn word_set(text: &str) -> BTreeSet<String> {
    word_tokens(text).into_iter().filter(|token| !is_stopword(token)).map(|token| stem(&token)).collect()
}

/// Word overlap `|q ∩ n| / sqrt(|q| · |n|)`, used when no embedder is configured.
fn lexical(query: &BTreeSet<String>, node: &BTreeSet<String>) -> f32 {
    if query.is_empty() || node.is_empty() {
        return 0.0;
    }
    query.intersection(node).count() as f32 / ((query.len() * node.len()) as f32).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::embedder::HashingEmbedder;
    use crate::core::scg::align::TypeAligner;
    use crate::core::scg::model::{GraphBuilder, SourceKind};

    fn tracker(source: &str, entity: &str, read: &str, read_doc: &str) -> SourceGraph {
        let mut builder = GraphBuilder::new(source, source);
        let source_node = builder.source_node();
        let entity_id = builder.node(entity, NodeKind::EntityType, entity, "a unit of work", None);
        builder.edge(&source_node, &entity_id, EdgeKind::HasEntity);
        let entity_key = builder.key(entity);
        let capability = builder.node(read, NodeKind::Capability, read, read_doc, None);
        builder.edge(&source_node, &capability, EdgeKind::Exposes);
        builder.recipe(read, vec![builder.key(read)], read_doc);
        for field in ["title", "assignee", "labels", "state", "number"] {
            let field_id = builder.node(&format!("{entity}.{field}"), NodeKind::Field, field, "", Some(&entity_key));
            builder.edge(&entity_id, &field_id, EdgeKind::HasField);
            builder.edge(&capability, &field_id, EdgeKind::Produces);
        }
        builder.recipe(entity, vec![builder.key(read)], "");
        let list = format!("{read}Comments");
        let list_id = builder.node(&list, NodeKind::Capability, &list, "list comments on one item by its number", None);
        let input = builder.node(&format!("{list}.number"), NodeKind::Field, "number", "", Some(&builder.key(&list)));
        builder.edge(&list_id, &input, EdgeKind::SupportsQuery);
        builder.recipe(&list, vec![builder.key(&list)], "");
        builder.finish(SourceKind::Openapi)
    }

    fn index(embedder: Option<&dyn Embed>) -> RouteIndex {
        let graphs = vec![
            tracker("gitea", "Issue", "getIssue", "Get an issue"),
            tracker("asana", "Task", "getTask", "Get a task"),
        ];
        let refs: Vec<&SourceGraph> = graphs.iter().collect();
        let links = TypeAligner.link(&refs);
        assert!(links.n_entity_edges >= 1 && !links.consumes.is_empty());
        RouteIndex::build(&graphs, &links, embedder)
    }

    #[test]
    fn a_capability_is_not_outranked_by_what_it_chains_into() {
        let embedder = HashingEmbedder::default();
        let index = index(Some(&embedder));
        let ranked = index.route("get an issue", DEFAULT_K, &Scope::All, Some(&embedder));
        assert!(ranked.len() <= DEFAULT_K && !ranked.is_empty());
        let top = &ranked[0];
        assert!(top.source_key == "gitea#getIssue" || top.source_key == "gitea#Issue", "{ranked:#?}");
        let position = |key: &str| ranked.iter().position(|recipe| recipe.source_key == key);
        let consumer = position("gitea#getIssueComments").expect("the chained capability is reached over CONSUMES");
        assert!(position("gitea#getIssue").expect("the matched capability is ranked") < consumer, "{ranked:#?}");
        // Alignment widens the route to the other tracker.
        assert!(ranked.iter().any(|recipe| recipe.source_key.starts_with("asana#")), "{ranked:#?}");
    }

    #[test]
    fn scope_is_applied_before_seeding_and_empty_routes_nothing() {
        let embedder = HashingEmbedder::default();
        let index = index(Some(&embedder));
        let only_asana = Scope::Sources(["asana".to_string()].into());
        let ranked = index.route("unit of work", 50, &only_asana, Some(&embedder));
        assert!(!ranked.is_empty());
        assert!(ranked.iter().all(|recipe| recipe.steps.iter().all(|step| step.starts_with("asana#"))));
        assert!(index.route("get an issue", 5, &Scope::Sources(BTreeSet::new()), Some(&embedder)).is_empty());
        assert!(index.observe("gitea#Issue", &[], &only_asana).is_err());
    }

    #[test]
    fn lexical_routing_without_an_embedder() {
        let index = index(None);
        let ranked = index.route("task", 3, &Scope::All, None);
        assert!(
            !ranked.is_empty() && ranked.iter().take(2).all(|recipe| recipe.source_key.starts_with("asana#")),
            "{ranked:#?}"
        );
        assert!(index.route("", 3, &Scope::All, None).is_empty());
    }

    #[test]
    fn observation_lists_typed_edges_and_filters() {
        let index = index(None);
        let observation = index.observe("gitea#Issue", &[], &Scope::All).unwrap();
        assert!(observation.survey.is_empty());
        assert!(observation.edges.iter().any(|edge| edge.kind == EdgeKind::HasEntity && edge.direction == "in"));
        assert!(observation
            .edges
            .iter()
            .any(|edge| edge.kind == EdgeKind::ResolvesTo && edge.neighbour_key == "asana#Task"));
        assert_eq!(observation.recipes.len(), 1);
        let filtered = index.observe("gitea#Issue", &[EdgeKind::HasField], &Scope::All).unwrap();
        assert_eq!(filtered.edges.len(), 5);
        assert!(filtered.edges.iter().all(|edge| edge.kind == EdgeKind::HasField));
        let by_id = index.observe(&node_id("gitea#Issue", NodeKind::EntityType), &[], &Scope::All).unwrap();
        assert_eq!(by_id.node.source_key, "gitea#Issue");
    }

    #[test]
    fn k_is_clamped() {
        let index = index(None);
        assert!(index.route("issue task comments", 0, &Scope::All, None).len() <= 1);
        assert!(index.route("issue task comments", 10_000, &Scope::All, None).len() <= MAX_K);
    }
}
