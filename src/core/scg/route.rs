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
//!    drop recipes with a step outside the scope, and return the top k (ties by key);
//! 6. with memory notes ([`RouteIndex::route_with_memory`]), add each recipe's memory score
//!    (see [`super::memory`]) before ranking.
//!
//! A ranked recipe's steps are an ordered chain that follows CONSUMES: a recipe reached
//! from a seed over a CONSUMES edge starts with that seed (the producer), and the chain is
//! extended backwards with the in-scope producer of its first step that best matches the
//! query (similarity + edge weight), up to [`MAX_CHAIN_STEPS`] steps, never repeating one.
//! Only producers the query is about join a chain: their similarity must reach
//! [`CHAIN_MIN_RELATIVE`] of the best seed's, so a chain never starts with an unrelated call.
//!
//! Scope is applied before seeding, so out-of-scope sources never crowd in-scope ones out;
//! an empty scope routes nothing and observes nothing.

use super::align::{split_words, Links};
use super::concepts::{
    ConceptIndex, ConceptStep, GraphView, Lexicon, NodeConcept, RecipeConcept, Resolved, ResolvedConcept,
};
use super::mcp::singular;
use super::memory::{self, MemoryBias, Note};
use super::model::{node_id, Edge, EdgeKind, Node, NodeKind, RouteRecipe, SourceGraph};
use crate::core::embedder::{dot, Embed};
use crate::core::text::{for_each_index_term, is_stopword, word_tokens};
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
/// How much each recipe already taken from a source lowers the next one's claim to a place.
pub const SOURCE_REPEAT_PENALTY: f32 = 0.15;
/// The most steps a recipe's chain grows to along CONSUMES.
pub const MAX_CHAIN_STEPS: usize = 3;
/// What a capability's name gains when it names, in the plural, a thing the question names
/// in the plural (`comments` → `issueGetComments` over `issueGetComment`): a list is asked for.
pub const PLURAL_AGREEMENT: f32 = 0.1;
/// A producer joins a chain backwards only when its similarity to the query is at least
/// this fraction of the best seed's.
pub const CHAIN_MIN_RELATIVE: f32 = 0.6;

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
    /// The part of `score` that came from memory notes (0 when none applied).
    #[serde(default)]
    pub memory: f32,
    /// The resolved concepts this recipe answers, with the operation and field carrying each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub concepts: Vec<RecipeConcept>,
}

/// Ranked recipes and how many sources the request could see (the `capdex.v1.route` reply).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteAnswer {
    pub recipes: Vec<RankedRecipe>,
    pub sources_in_scope: usize,
    /// The concepts the question resolved to, and what resolved each.
    #[serde(default)]
    pub concepts: Vec<ResolvedConcept>,
}

/// Memory notes for a route, and the clock and half-life their decay uses.
#[derive(Clone, Copy, Debug)]
pub struct MemoryView<'a> {
    pub notes: &'a [Note],
    pub now_ms: u64,
    pub half_life_ms: u64,
    /// The notes' vectors ([`RouteIndex::note_vector`]), one per note in order, when the
    /// caller keeps them; otherwise each route embeds the notes.
    pub vectors: Option<&'a [Vec<f32>]>,
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
    /// Concepts and their carriers (see [`super::concepts`]).
    concepts: ConceptIndex,
    /// Capability node index → the stems its name has in the plural (only when it has some).
    plural_names: HashMap<usize, BTreeSet<String>>,
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
    /// Memory notes anchored at this node, strongest first (filled by the caller that holds them).
    #[serde(default)]
    pub notes: Vec<Note>,
    /// The concepts this node carries, strongest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub concepts: Vec<NodeConcept>,
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
        let concepts = ConceptIndex::build(
            &GraphView { nodes: &nodes, edges: &edges, incident: &incident, by_id: &by_id },
            Lexicon::builtin(),
            embedder,
        );
        let plural_names = nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| node.kind == NodeKind::Capability)
            .map(|(at, node)| (at, plural_stems(&node.name)))
            .filter(|(_, stems)| !stems.is_empty())
            .collect();
        RouteIndex {
            plural_names,
            nodes,
            by_id,
            edges,
            incident,
            recipes,
            seedable,
            embedder_model: embedder.map(|e| e.model_id()),
            concepts,
        }
    }

    /// Every text [`RouteIndex::build`] asks its embedder for over `graphs`: the seedable
    /// nodes' texts and the lexicon's concepts'. A slow embedder embeds them elsewhere
    /// first, and the build then reads them from a `PrecomputedEmbedder`.
    pub fn embedding_texts(graphs: &[SourceGraph]) -> Vec<String> {
        let mut texts: Vec<String> = graphs
            .iter()
            .flat_map(|graph| graph.nodes.iter())
            .filter(|node| matches!(node.kind, NodeKind::Capability | NodeKind::EntityType))
            .map(node_text)
            .collect::<BTreeSet<String>>()
            .into_iter()
            .collect();
        texts.extend(super::concepts::concept_texts(Lexicon::builtin()));
        texts
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
        self.route_with_memory(query, k, scope, embedder, None)
    }

    /// Routes a question and says which concepts it resolved to: the `capdex.v1.route`
    /// reply but for `sourcesInScope`, which the caller knows.
    pub fn route_answer(
        &self,
        query: &str,
        k: usize,
        scope: &Scope,
        embedder: Option<&dyn Embed>,
        memory: Option<MemoryView<'_>>,
    ) -> RouteAnswer {
        let (mut recipes, resolved) = self.rank(query, k, scope, embedder, memory);
        for recipe in &mut recipes {
            recipe.concepts = self.recipe_concepts(recipe, &resolved, scope);
        }
        RouteAnswer { recipes, sources_in_scope: 0, concepts: self.concepts.describe(&resolved) }
    }

    /// The resolved concepts a ranked recipe answers: per concept, the recipe's operation and
    /// the field carrying it, and the other source's when a RESOLVES_TO edge joins the field.
    fn recipe_concepts(&self, recipe: &RankedRecipe, resolved: &Resolved, scope: &Scope) -> Vec<RecipeConcept> {
        let mut candidates: Vec<usize> = Vec::new();
        for kind in [NodeKind::Capability, NodeKind::EntityType] {
            if let Some(&at) = self.by_id.get(&node_id(&recipe.source_key, kind)) {
                candidates.push(at);
            }
        }
        // The recipe's own node first, then its steps from the last (the one that answers) back.
        for step in recipe.steps.iter().rev() {
            if let Some(&at) = self.by_id.get(&node_id(step, NodeKind::Capability)) {
                if !candidates.contains(&at) {
                    candidates.push(at);
                }
            }
        }
        let operation = recipe.steps.last().cloned().unwrap_or_else(|| recipe.source_key.clone());
        let mut out = Vec::new();
        for (concept_at, _, _) in &resolved.concepts {
            let concept = self.concepts.concept(*concept_at);
            if concept.operations_only {
                continue;
            }
            let carriers = self.concepts.carriers(*concept_at);
            // The strongest carrier; on a tie, the one nearest the recipe's own node.
            let best = candidates
                .iter()
                .filter_map(|&at| {
                    carriers.binary_search_by_key(&at, |carrier| carrier.node).ok().map(|found| carriers[found])
                })
                .fold(None, |best: Option<super::concepts::Carrier>, carrier| match best {
                    Some(best) if best.strength >= carrier.strength => Some(best),
                    _ => Some(carrier),
                });
            let Some(carrier) = best else { continue };
            let node = &self.nodes[carrier.node];
            let step_of = |node: &Node| match node.kind {
                NodeKind::Capability => node.source_key.clone(),
                _ => operation.clone(),
            };
            let Some(field_at) = carrier.field else {
                out.push(RecipeConcept {
                    concept: concept.id.clone(),
                    answers: format!("{} ({})", concept.label, node.name),
                    steps: vec![ConceptStep { source: node.source_id.clone(), operation: step_of(node), field: None }],
                    resolves_to: None,
                });
                continue;
            };
            let field = &self.nodes[field_at];
            let of = field
                .owner
                .as_deref()
                .and_then(|owner| owner.split_once('#'))
                .map_or(node.name.as_str(), |(_, name)| name);
            let mut steps = vec![ConceptStep {
                source: node.source_id.clone(),
                operation: step_of(node),
                field: Some(field.source_key.clone()),
            }];
            // The edge the concept came over, or the heaviest one joining the field to another in-scope source.
            let edge_at = carrier.resolves_to.or_else(|| {
                self.incident[field_at]
                    .iter()
                    .copied()
                    .filter(|&edge_at| self.edges[edge_at].kind == EdgeKind::ResolvesTo)
                    .filter(|&edge_at| {
                        let other = self.other_end(edge_at, field_at);
                        self.nodes[other].source_id != field.source_id && scope.permits(&self.nodes[other].source_id)
                    })
                    .max_by(|&a, &b| self.edges[a].weight.total_cmp(&self.edges[b].weight).then(b.cmp(&a)))
            });
            let mut resolves_to = None;
            if let Some(edge_at) = edge_at {
                let other =
                    self.nodes.get(self.other_end(edge_at, field_at)).filter(|other| other.kind == NodeKind::Field);
                if let Some(other) = other.filter(|other| scope.permits(&other.source_id)) {
                    if let Some(reader) = self.reader_of(other, scope) {
                        steps.push(ConceptStep {
                            source: other.source_id.clone(),
                            operation: reader,
                            field: Some(other.source_key.clone()),
                        });
                        resolves_to = Some(format!(
                            "{} ~ {} ({:.2})",
                            field.source_key, other.source_key, self.edges[edge_at].weight
                        ));
                    }
                }
            }
            out.push(RecipeConcept {
                concept: concept.id.clone(),
                answers: format!("{} of {of}", concept.label),
                steps,
                resolves_to,
            });
        }
        out
    }

    /// The node at the other end of an edge from `at`.
    fn other_end(&self, edge_at: usize, at: usize) -> usize {
        let edge = &self.edges[edge_at];
        let source = self.by_id[&edge.source];
        if source == at {
            self.by_id[&edge.target]
        } else {
            source
        }
    }

    /// An in-scope operation that reads a field: its entity type's recipe, else a producer.
    fn reader_of(&self, field: &Node, scope: &Scope) -> Option<String> {
        let owner = field.owner.as_deref()?;
        if let Some(recipe) = self.recipes.get(owner) {
            if let Some(step) = recipe.steps.last().filter(|step| scope.permits(step.split('#').next().unwrap_or(step)))
            {
                return Some(step.clone());
            }
        }
        let at = *self.by_id.get(&field.id)?;
        self.incident[at]
            .iter()
            .map(|&edge_at| &self.edges[edge_at])
            .filter(|edge| edge.kind == EdgeKind::Produces && edge.target == field.id)
            .filter_map(|edge| self.by_id.get(&edge.source).map(|&at| &self.nodes[at]))
            .filter(|node| node.kind == NodeKind::Capability && scope.permits(&node.source_id))
            .map(|node| node.source_key.clone())
            .min()
    }

    /// Like [`RouteIndex::route`], with memory notes biasing recipes up or down.
    pub fn route_with_memory(
        &self,
        query: &str,
        k: usize,
        scope: &Scope,
        embedder: Option<&dyn Embed>,
        memory: Option<MemoryView<'_>>,
    ) -> Vec<RankedRecipe> {
        self.rank(query, k, scope, embedder, memory).0
    }

    /// Ranks recipes, and returns the concepts the question resolved to.
    fn rank(
        &self,
        query: &str,
        k: usize,
        scope: &Scope,
        embedder: Option<&dyn Embed>,
        memory: Option<MemoryView<'_>>,
    ) -> (Vec<RankedRecipe>, Resolved) {
        let k = k.clamp(1, MAX_K);
        let query_vector =
            embedder.filter(|_| self.embedder_model.is_some()).and_then(|embedder| embedder.embed(query).ok());
        let query_words = word_set(query);
        let field_name = |at: usize| self.nodes[at].source_key.clone();
        let resolved = self.concepts.resolve(query, query_vector.as_deref(), &field_name);
        let mut concept_scores: HashMap<usize, f32> = HashMap::new();
        self.concepts.score_into(&resolved, &mut concept_scores);
        let plurals = plural_stems(query);
        let mut seeds: Vec<(f32, usize)> = self
            .seedable
            .iter()
            .filter(|(at, _, _)| scope.permits(&self.nodes[*at].source_id))
            .map(|(at, vector, words)| {
                let similarity = match &query_vector {
                    Some(query_vector) if query_vector.len() == vector.len() => dot(query_vector, vector),
                    _ => lexical(&query_words, words),
                };
                let agreement = if !plurals.is_empty()
                    && self.plural_names.get(at).is_some_and(|stems| stems.intersection(&plurals).next().is_some())
                {
                    PLURAL_AGREEMENT
                } else {
                    0.0
                };
                (similarity + agreement + concept_scores.get(at).copied().unwrap_or(0.0), *at)
            })
            .filter(|(similarity, _)| *similarity > 0.0)
            .collect();
        let similarities: HashMap<usize, f32> = seeds.iter().map(|&(similarity, at)| (at, similarity)).collect();
        seeds.sort_by(|a, b| {
            b.0.total_cmp(&a.0).then_with(|| self.nodes[a.1].source_key.cmp(&self.nodes[b.1].source_key))
        });
        let min_chain_similarity = seeds.first().map_or(f32::MAX, |seed| seed.0 * CHAIN_MIN_RELATIVE);
        seeds.truncate(seed_count(k));
        // Recipe key → (score, seed, producer the recipe was reached from over CONSUMES).
        let mut best: BTreeMap<String, (f32, usize, Option<usize>)> = BTreeMap::new();
        let offer = |recipe_key: &str,
                     score: f32,
                     seed: usize,
                     producer: Option<usize>,
                     best: &mut BTreeMap<String, (f32, usize, Option<usize>)>| {
            if self.recipes.contains_key(recipe_key) {
                let entry = best.entry(recipe_key.to_string()).or_insert((f32::MIN, seed, producer));
                if score > entry.0 {
                    *entry = (score, seed, producer);
                }
            }
        };
        for &(similarity, seed) in &seeds {
            for recipe_key in self.recipe_keys(seed) {
                offer(recipe_key, similarity + SELF_WEIGHT, seed, None, &mut best);
            }
            for &edge_idx in &self.incident[seed] {
                let edge = &self.edges[edge_idx];
                let outbound = self.by_id[&edge.source] == seed;
                let other = if outbound { &edge.target } else { &edge.source };
                let other_idx = self.by_id[other];
                if !scope.permits(&self.nodes[other_idx].source_id) {
                    continue;
                }
                let producer =
                    (outbound && edge.kind == EdgeKind::Consumes && self.nodes[seed].kind == NodeKind::Capability)
                        .then_some(seed);
                for recipe_key in self.recipe_keys(other_idx) {
                    offer(recipe_key, similarity + edge.weight, seed, producer, &mut best);
                }
            }
        }
        let bias = match memory {
            Some(view) => MemoryBias::compute(
                view.notes,
                |at, note| match (&query_vector, view.vectors.and_then(|vectors| vectors.get(at))) {
                    (Some(query_vector), Some(vector)) if vector.len() == query_vector.len() => {
                        dot(query_vector, vector).clamp(0.0, 1.0)
                    }
                    _ => self.relevance(&query_words, query_vector.as_deref(), embedder, note),
                },
                |source_id| scope.permits(source_id),
                view.now_ms,
                view.half_life_ms,
            ),
            None => MemoryBias::default(),
        };
        let mut ranked: Vec<RankedRecipe> = best
            .into_iter()
            .filter_map(|(key, (score, seed, producer))| {
                let recipe = &self.recipes[&key];
                let in_scope = recipe.steps.iter().all(|step| scope.permits(step.split('#').next().unwrap_or(step)));
                if !in_scope {
                    return None;
                }
                let steps = self.chain(&recipe.steps, producer, &similarities, min_chain_similarity, scope);
                let memory = bias.for_recipe(&recipe.source_key, &steps);
                Some(RankedRecipe {
                    source_key: recipe.source_key.clone(),
                    steps,
                    score: score + memory,
                    via: self.nodes[seed].source_key.clone(),
                    memory,
                    concepts: Vec::new(),
                })
            })
            .collect();
        ranked.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.source_key.cmp(&b.source_key)));
        let named = self.concepts.named_sources(&resolved);
        (diversify(ranked, k, &named), resolved)
    }

    /// Returns a recipe's steps as a chain along CONSUMES: the producer it was reached from
    /// first, then in-scope producers of the first step, best match first, up to [`MAX_CHAIN_STEPS`].
    fn chain(
        &self,
        steps: &[String],
        producer: Option<usize>,
        similarities: &HashMap<usize, f32>,
        min_similarity: f32,
        scope: &Scope,
    ) -> Vec<String> {
        let mut chain: Vec<String> = steps.to_vec();
        if let Some(producer) = producer {
            let key = &self.nodes[producer].source_key;
            if !chain.contains(key) {
                chain.insert(0, key.clone());
            }
        }
        while chain.len() < MAX_CHAIN_STEPS {
            let Some(&first) = self.by_id.get(&node_id(&chain[0], NodeKind::Capability)) else { break };
            let next = self.incident[first]
                .iter()
                .map(|&edge_idx| &self.edges[edge_idx])
                .filter(|edge| edge.kind == EdgeKind::Consumes && edge.target == self.nodes[first].id)
                .map(|edge| (self.by_id[&edge.source], edge.weight))
                .filter(|&(at, _)| {
                    let node = &self.nodes[at];
                    node.kind == NodeKind::Capability
                        && scope.permits(&node.source_id)
                        && !chain.contains(&node.source_key)
                })
                .filter_map(|(at, weight)| {
                    let similarity = similarities.get(&at).copied().unwrap_or(0.0);
                    (similarity >= min_similarity).then_some((similarity + weight, at))
                })
                .max_by(|a, b| {
                    a.0.total_cmp(&b.0).then_with(|| self.nodes[b.1].source_key.cmp(&self.nodes[a.1].source_key))
                });
            match next {
                Some((_, at)) => chain.insert(0, self.nodes[at].source_key.clone()),
                None => break,
            }
        }
        chain
    }

    /// Returns the vector a note is matched against queries with; empty when
    /// the embedder fails (the note is then matched by word overlap).
    pub fn note_vector(note: &Note, embedder: &dyn Embed) -> Vec<f32> {
        embedder.embed(&memory::note_text(note)).unwrap_or_default()
    }

    /// Returns a note's relevance to a query, in [0, 1]: cosine with the embedder, word overlap without.
    fn relevance(
        &self,
        query_words: &BTreeSet<String>,
        query_vector: Option<&[f32]>,
        embedder: Option<&dyn Embed>,
        note: &Note,
    ) -> f32 {
        let text = memory::note_text(note);
        match (query_vector, embedder) {
            (Some(query_vector), Some(embedder)) => match embedder.embed(&text) {
                Ok(vector) if vector.len() == query_vector.len() => dot(query_vector, &vector).clamp(0.0, 1.0),
                _ => lexical(query_words, &word_set(&text)),
            },
            _ => lexical(query_words, &word_set(&text)),
        }
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
        let concepts = self
            .concepts
            .of_node(at)
            .into_iter()
            .map(|(concept, strength)| NodeConcept { concept: concept.to_string(), strength })
            .collect();
        Ok(Observation { node: node.clone(), n_edges, survey, edges, recipes, notes: Vec::new(), concepts })
    }
}

/// Takes the best `k` of `ranked` (sorted best first), each pick's score lowered by
/// [`SOURCE_REPEAT_PENALTY`] for every recipe of its source already taken, so a close
/// second source gets a place; within one source the order stays, and scores are kept.
/// Each source the question names (`named`) that has a ranked recipe gets a place: once
/// the places left are as few as the named sources not yet taken, only their recipes are.
fn diversify(ranked: Vec<RankedRecipe>, k: usize, named: &BTreeSet<String>) -> Vec<RankedRecipe> {
    let sources: Vec<String> = ranked
        .iter()
        .map(|recipe| recipe.source_key.split('#').next().unwrap_or(&recipe.source_key).to_string())
        .collect();
    let mut left: Vec<Option<RankedRecipe>> = ranked.into_iter().map(Some).collect();
    let mut taken: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::with_capacity(k.min(left.len()));
    while out.len() < k {
        let missing: BTreeSet<&str> = if named.is_empty() {
            BTreeSet::new()
        } else {
            (0..left.len())
                .filter(|&at| left[at].is_some())
                .map(|at| sources[at].as_str())
                .filter(|source| named.contains(*source) && !taken.contains_key(source))
                .collect()
        };
        let reserved = k - out.len() <= missing.len();
        // The first remaining recipe of each source is that source's best.
        let mut best: Option<(f32, usize)> = None;
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        for (at, recipe) in left.iter().enumerate() {
            let Some(recipe) = recipe else { continue };
            let source = sources[at].as_str();
            if (reserved && !missing.contains(source)) || !seen.insert(source) {
                continue;
            }
            let adjusted = recipe.score - SOURCE_REPEAT_PENALTY * taken.get(source).copied().unwrap_or(0) as f32;
            if best.is_none_or(|(score, _)| adjusted > score) {
                best = Some((adjusted, at));
            }
        }
        let Some((_, at)) = best else { break };
        let recipe = left[at].take().expect("a remaining recipe");
        *taken.entry(sources[at].as_str()).or_insert(0) += 1;
        out.push(recipe);
    }
    out
}

/// Returns the text a node is embedded with: its name split into words, then its description.
pub fn node_text(node: &Node) -> String {
    let doc: String = node.doc.chars().take(MAX_DOC_CHARS).collect();
    format!("{} {}\n{doc}", node.name, word_tokens(&node.name).join(" "))
}

/// The singular stems of the words of a text or a name that are in the plural
/// (`issueGetComments` → `comment`), stopwords aside, and never in the singular in the
/// same text (a text saying both `membership` and `memberships` asks for no list).
fn plural_stems(text: &str) -> BTreeSet<String> {
    let words: Vec<String> =
        split_words(text).into_iter().filter(|word| word.chars().count() > 2 && !is_stopword(word)).collect();
    let mut singular_words: BTreeSet<&str> = BTreeSet::new();
    let mut plurals: BTreeSet<String> = BTreeSet::new();
    for word in &words {
        let stem = singular(word);
        if stem == *word {
            singular_words.insert(word);
        } else {
            plurals.insert(stem);
        }
    }
    plurals.retain(|stem| !singular_words.contains(stem.as_str()));
    plurals
}

fn word_set(text: &str) -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    for_each_index_term(text, |term| {
        if !words.contains(term) {
            words.insert(term.to_string());
        }
    });
    words
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
    fn recipes_chain_along_consumes() {
        let embedder = HashingEmbedder::default();
        let index = index(Some(&embedder));
        let ranked = index.route("get an issue", 50, &Scope::All, Some(&embedder));
        let comments = ranked.iter().find(|recipe| recipe.source_key == "gitea#getIssueComments").unwrap();
        assert_eq!(comments.steps.last().map(String::as_str), Some("gitea#getIssueComments"));
        assert!(comments.steps.len() >= 2, "the consumer's recipe starts with a producer: {comments:?}");
        assert_eq!(comments.steps[0], "gitea#getIssue", "the matched producer comes first: {comments:?}");
        for recipe in &ranked {
            let unique: BTreeSet<&String> = recipe.steps.iter().collect();
            assert_eq!(unique.len(), recipe.steps.len(), "{recipe:?}");
            assert!(recipe.steps.len() <= MAX_CHAIN_STEPS);
        }
        // A scope without the producer's source leaves it out of the chain.
        let only_asana = Scope::Sources(["asana".to_string()].into());
        for recipe in index.route("list comments", 50, &only_asana, Some(&embedder)) {
            assert!(recipe.steps.iter().all(|step| step.starts_with("asana#")), "{recipe:?}");
        }
    }

    #[test]
    fn memory_biases_routes_up_and_down() {
        use crate::core::scg::memory::{merge, Deposit, Polarity};
        let embedder = HashingEmbedder::default();
        let index = index(Some(&embedder));
        let query = "comments on an issue";
        let plain = index.route(query, 50, &Scope::All, Some(&embedder));
        let score_of =
            |ranked: &[RankedRecipe], key: &str| ranked.iter().find(|r| r.source_key == key).map(|r| r.score);
        let deposit = |polarity, content: &str| Deposit {
            content: content.into(),
            polarity,
            anchors: vec!["asana#getTaskComments".into()],
            label: "ws:acme".into(),
        };
        let now = 1_000_000;
        let day = 24 * 3600 * 1000;
        for (polarity, up) in [(Polarity::Positive, true), (Polarity::DeadEnd, false)] {
            let note = merge(
                None,
                &deposit(polarity, "comments of an issue came back"),
                &["asana#getTaskComments".into()],
                now,
            );
            let notes = [note];
            let view = MemoryView { notes: &notes, now_ms: now, half_life_ms: day, vectors: None };
            let biased = index.route_with_memory(query, 50, &Scope::All, Some(&embedder), Some(view));
            let vectors: Vec<Vec<f32>> = notes.iter().map(|note| RouteIndex::note_vector(note, &embedder)).collect();
            let cached = MemoryView { vectors: Some(&vectors), ..view };
            assert_eq!(index.route_with_memory(query, 50, &Scope::All, Some(&embedder), Some(cached)), biased);
            let (before, after) = (
                score_of(&plain, "asana#getTaskComments").unwrap(),
                score_of(&biased, "asana#getTaskComments").unwrap(),
            );
            assert_eq!(after > before, up, "{polarity:?}: {before} → {after}");
            let moved = biased.iter().find(|r| r.source_key == "asana#getTaskComments").unwrap();
            assert!((moved.score - before - moved.memory).abs() < 1e-5 && moved.memory != 0.0);
            // Ten half-lives later the note barely counts.
            let late = MemoryView { notes: &notes, now_ms: now + 10 * day, half_life_ms: day, vectors: None };
            let faded = index.route_with_memory(query, 50, &Scope::All, Some(&embedder), Some(late));
            let faded = score_of(&faded, "asana#getTaskComments").unwrap();
            assert!((faded - before).abs() < (after - before).abs() / 500.0, "{before} {after} {faded}");
            // A scope without the anchor's source ignores the note.
            let scoped = index.route_with_memory(
                query,
                50,
                &Scope::Sources(["gitea".to_string()].into()),
                Some(&embedder),
                Some(view),
            );
            assert!(scoped.iter().all(|r| r.memory == 0.0));
        }
    }

    #[test]
    fn a_question_resolves_to_concepts_and_recipes_name_operation_and_field() {
        let embedder = HashingEmbedder::default();
        let index = index(Some(&embedder));
        // No word of the question is in any node: `responsible` resolves to the owner concept.
        let answer = index.route_answer("who is responsible for this", 5, &Scope::All, Some(&embedder), None);
        let owner = answer.concepts.iter().find(|concept| concept.concept == "owner").expect("owner resolved");
        assert!(owner
            .via
            .iter()
            .any(|via| via.through == super::super::concepts::Through::Lexicon && via.term == "responsible"));
        let sources: BTreeSet<&str> =
            answer.recipes.iter().take(3).map(|recipe| recipe.source_key.split('#').next().unwrap()).collect();
        assert_eq!(sources, ["asana", "gitea"].into(), "{answer:#?}");
        let recipe =
            answer.recipes.iter().find(|recipe| recipe.source_key == "gitea#getIssue").expect("getIssue ranked");
        let concept = recipe.concepts.iter().find(|concept| concept.concept == "owner").expect("answers owner");
        assert_eq!(concept.answers, "owner of Issue");
        assert_eq!(concept.steps[0].operation, "gitea#getIssue");
        assert_eq!(concept.steps[0].field.as_deref(), Some("gitea#Issue.assignee"));
        // The aligned tracker carries it too, over RESOLVES_TO.
        assert_eq!(concept.steps.len(), 2, "{concept:#?}");
        assert_eq!(concept.steps[1].source, "asana");
        assert_eq!(concept.steps[1].field.as_deref(), Some("asana#Task.assignee"));
        assert!(concept.resolves_to.as_deref().is_some_and(|edge| edge.contains(" ~ ")));
        // A field's own name resolves through the source; the route without concepts is unchanged in form.
        let by_field = index.route_answer("assignee", 5, &Scope::All, Some(&embedder), None);
        let owner = by_field.concepts.iter().find(|concept| concept.concept == "owner").expect("owner resolved");
        assert!(owner.via.iter().any(|via| via.through == super::super::concepts::Through::Source));
        assert_eq!(
            index.route("who is responsible for this", 5, &Scope::All, Some(&embedder)),
            answer
                .recipes
                .iter()
                .cloned()
                .map(|recipe| RankedRecipe { concepts: Vec::new(), ..recipe })
                .collect::<Vec<_>>()
        );
        // Observe lists what a node carries.
        let observed = index.observe("gitea#Issue", &[], &Scope::All).unwrap();
        assert!(observed.concepts.iter().any(|concept| concept.concept == "owner"), "{:?}", observed.concepts);
    }

    #[test]
    fn a_concept_reaches_a_table_through_its_columns_and_foreign_keys() {
        let ddl = "CREATE TABLE Employee (EmployeeId INTEGER PRIMARY KEY, LastName TEXT, ReportsTo INTEGER REFERENCES Employee (EmployeeId));\n\
                   CREATE TABLE Customer (CustomerId INTEGER PRIMARY KEY, City TEXT, SupportRepId INTEGER REFERENCES Employee (EmployeeId));\n\
                   CREATE TABLE Genre (GenreId INTEGER PRIMARY KEY, Name TEXT);";
        let graph = crate::core::scg::map_source("shop", None, ddl).unwrap();
        let graphs = vec![graph];
        let refs: Vec<&SourceGraph> = graphs.iter().collect();
        let index = RouteIndex::build(&graphs, &TypeAligner.link(&refs), None);
        let answer = index.route_answer("who is in charge of this customer", 3, &Scope::All, None, None);
        assert!(answer.concepts.iter().any(|concept| concept.concept == "owner"), "{:#?}", answer.concepts);
        let customer =
            answer.recipes.iter().find(|recipe| recipe.source_key == "shop#Customer").expect("Customer ranked");
        let owner = customer.concepts.iter().find(|concept| concept.concept == "owner").expect("answers owner");
        assert_eq!(owner.steps[0].field.as_deref(), Some("shop#Customer.SupportRepId"), "{owner:#?}");
        // The owner concept reaches Employee over the foreign key's RESOLVES_TO as well as by ReportsTo.
        let observed = index.observe("shop#Employee", &[], &Scope::All).unwrap();
        assert!(observed.concepts.iter().any(|concept| concept.concept == "owner"));
        assert!(!answer.recipes.iter().any(|recipe| recipe.source_key.contains("Genre")), "{:#?}", answer.recipes);
    }

    #[test]
    fn enum_values_resolve_the_field_they_belong_to_and_carry_the_lexicon_concept_they_spell() {
        let document = serde_json::json!({
            "openapi": "3.0.0", "info": {"title": "tracker", "version": "1"},
            "paths": {"/tickets/{id}": {"get": {"operationId": "getTicket",
                "parameters": [{"name": "id", "in": "path", "schema": {"type": "string"}}],
                "responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Ticket"}}}}}}}},
            "components": {"schemas": {"Ticket": {"properties": {
                "title": {"type": "string"},
                "severity": {"type": "string", "enum": ["blocker", "trivial"]},
                "phase": {"type": "string", "enum": ["open", "closed", "resolved"]},
                "icon": {"type": "string", "enum": ["open", "rocket", "puzzle", "globe"]}
            }}}}
        });
        let graph = crate::core::scg::map_source("tracker", Some(SourceKind::Openapi), &document.to_string()).unwrap();
        let severity = graph.nodes.iter().find(|node| node.source_key == "tracker#Ticket.severity").unwrap();
        assert_eq!(severity.values, ["blocker", "trivial"]);
        let graphs = vec![graph];
        let refs: Vec<&SourceGraph> = graphs.iter().collect();
        let index = RouteIndex::build(&graphs, &TypeAligner.link(&refs), None);
        // A question word that is a value resolves to the field's own concept, through the source.
        let answer = index.route_answer("show me the blockers", 3, &Scope::All, None, None);
        let concept = answer.concepts.iter().find(|concept| concept.concept == "field:severity").expect("resolved");
        assert_eq!(concept.via[0].through, super::super::concepts::Through::Source);
        assert!(concept.via[0].detail.contains("tracker#Ticket.severity") && concept.via[0].detail.contains("blocker"));
        assert_eq!(answer.recipes[0].source_key, "tracker#getTicket", "{:#?}", answer.recipes);
        // `phase`, whose values are all status words, carries status; `icon`, with one of four, does not.
        let observed = index.observe("tracker#Ticket", &[], &Scope::All).unwrap();
        assert!(observed.concepts.iter().any(|concept| concept.concept == "status"), "{:#?}", observed.concepts);
        let status = index.route_answer("which tickets are resolved", 3, &Scope::All, None, None);
        let owner = status.recipes.iter().flat_map(|recipe| &recipe.concepts).find(|c| c.concept == "status").unwrap();
        assert_eq!(owner.steps[0].field.as_deref(), Some("tracker#Ticket.phase"), "{owner:#?}");
    }

    #[test]
    fn an_index_built_from_precomputed_vectors_routes_as_one_built_with_the_embedder() {
        let graphs = vec![
            tracker("gitea", "Issue", "getIssue", "Get an issue"),
            tracker("asana", "Task", "getTask", "Get a task"),
        ];
        let refs: Vec<&SourceGraph> = graphs.iter().collect();
        let links = TypeAligner.link(&refs);
        let embedder = HashingEmbedder::new(64).unwrap();
        let direct = RouteIndex::build(&graphs, &links, Some(&embedder));
        let texts = RouteIndex::embedding_texts(&graphs);
        let query = "who is responsible for this ticket".to_string();
        let mut all = texts.clone();
        all.push(query.clone());
        let table = crate::core::embedder::PrecomputedEmbedder::new(
            embedder.model_id(),
            64,
            &all,
            Embed::embed_batch(&embedder, &all).unwrap(),
        );
        let precomputed = RouteIndex::build(&graphs, &links, Some(&table));
        assert_eq!(precomputed.embedder_model(), direct.embedder_model());
        let answer =
            |index: &RouteIndex, embedder: &dyn Embed| index.route_answer(&query, 3, &Scope::All, Some(embedder), None);
        assert_eq!(answer(&precomputed, &table), answer(&direct, &embedder));
        assert!(answer(&precomputed, &table).concepts.iter().any(|concept| concept.concept == "owner"));
    }

    #[test]
    fn plural_stems_are_the_nouns_only_asked_for_in_the_plural() {
        let stems = |text: &str| plural_stems(text).into_iter().collect::<Vec<_>>();
        assert_eq!(stems("comments on a ticket"), ["comment"]);
        assert_eq!(stems("issueGetComments"), ["comment"]);
        assert!(stems("getTeamMembership: a team membership, of the memberships").is_empty());
        assert!(stems("the status of this").is_empty());
    }

    #[test]
    fn a_second_source_gets_a_close_place_and_order_within_a_source_stays() {
        let recipe = |key: &str, score: f32| RankedRecipe {
            source_key: key.into(),
            steps: vec![key.into()],
            score,
            via: key.into(),
            memory: 0.0,
            concepts: Vec::new(),
        };
        let ranked =
            vec![recipe("a#1", 2.0), recipe("a#2", 1.95), recipe("a#3", 1.9), recipe("b#1", 1.85), recipe("b#2", 1.0)];
        let keys = |list: Vec<RankedRecipe>| list.into_iter().map(|r| r.source_key).collect::<Vec<_>>();
        assert_eq!(keys(diversify(ranked.clone(), 3, &BTreeSet::new())), ["a#1", "b#1", "a#2"]);
        assert_eq!(keys(diversify(ranked.clone(), 10, &BTreeSet::new())), ["a#1", "b#1", "a#2", "a#3", "b#2"]);
        // A far second source does not.
        let far = vec![recipe("a#1", 2.0), recipe("a#2", 1.95), recipe("b#1", 1.0)];
        assert_eq!(keys(diversify(far.clone(), 2, &BTreeSet::new())), ["a#1", "a#2"]);
        // A source the question names gets a place, however far, and the rest stays in order.
        let named: BTreeSet<String> = ["b".to_string()].into();
        assert_eq!(keys(diversify(far.clone(), 2, &named)), ["a#1", "b#1"]);
        assert_eq!(keys(diversify(far.clone(), 3, &named)), ["a#1", "a#2", "b#1"]);
        // A named source with no ranked recipe reserves nothing.
        let absent: BTreeSet<String> = ["c".to_string()].into();
        assert_eq!(keys(diversify(far, 2, &absent)), ["a#1", "a#2"]);
    }

    #[test]
    fn k_is_clamped() {
        let index = index(None);
        assert!(index.route("issue task comments", 0, &Scope::All, None).len() <= 1);
        assert!(index.route("issue task comments", 10_000, &Scope::All, None).len() <= MAX_K);
    }
}
