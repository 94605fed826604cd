//! The capability graph: typed, weighted relations between capabilities, and
//! the re-ranking that uses them.
//!
//! Edges are derived deterministically from descriptors (and presets):
//!
//! | kind | rule | weight |
//! |---|---|---|
//! | `DEPENDS_ON` | a `requiredTools` entry names another capability | 1.0 |
//! | `COMPOSED_WITH` | both appear in one preset | 0.5 |
//! | `TAGGED_WITH` | two or more shared tags | 0.3 per shared tag |
//! | `SAME_CATEGORY` | same `kind:category`, group of 2..=8 | 0.1 |
//!
//! A pair may carry one edge of each kind: a strong relation is never
//! overwritten by a weaker or different one.

use crate::core::descriptor::CapabilityDescriptor;
use crate::core::id_table::IdTable;
use foldhash::HashMap;
use petgraph::graph::{NodeIndex, UnGraph};
use petgraph::visit::EdgeRef;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// The kind of a relation between two capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EdgeKind {
    DependsOn,
    ComposedWith,
    TaggedWith,
    SameCategory,
}

impl EdgeKind {
    /// Returns true for relations strong enough to pull a neighbour into the results.
    pub fn pulls_in(self) -> bool {
        matches!(self, EdgeKind::DependsOn | EdgeKind::ComposedWith)
    }
}

/// A weighted, typed relation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Edge {
    pub kind: EdgeKind,
    pub weight: f32,
}

pub const DEPENDS_ON_WEIGHT: f32 = 1.0;
pub const COMPOSED_WITH_WEIGHT: f32 = 0.5;
pub const TAGGED_WITH_WEIGHT_PER_TAG: f32 = 0.3;
pub const SAME_CATEGORY_WEIGHT: f32 = 0.1;
/// A category group joins up only when it has this many members or fewer;
/// in bigger groups "same category" says too little to be worth the edges.
pub const SAME_CATEGORY_MAX_GROUP: usize = 8;
/// A tag shared by more capabilities than this is too common to relate them.
pub const TAG_MAX_FANOUT: usize = 64;

/// A named group of capabilities used together.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Preset {
    pub name: String,
    pub capability_ids: Vec<String>,
}

/// Summary figures of a graph.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GraphStats {
    pub nodes: usize,
    pub edges: usize,
    pub edges_by_kind: BTreeMap<String, usize>,
}

/// Typed relations over capability ids, on petgraph.
#[derive(Clone, Debug, Default)]
pub struct CapabilityGraph {
    /// The relations; node `n` is the capability `ids[n]`.
    graph: UnGraph<(), Edge>,
    /// Each node's capability id, by node index: ascending, as the nodes were
    /// added in id order.
    ids: Vec<Box<str>>,
    /// The node of each id (read through `ids`).
    nodes: IdTable,
    /// The direction the undirected graph forgets: dependent id → the ids it
    /// depends on (resolved `requiredTools`), sorted.
    dependencies: HashMap<String, Vec<String>>,
    /// Every node's neighbours with the edges to them in
    /// [`CapabilityGraph::neighbours`] order, node after node, sorted once at
    /// build time so a query never sorts (or compares ids) to walk them: node
    /// `n`'s are `adjacency[adjacency_starts[n]..adjacency_starts[n + 1]]`.
    adjacency: Vec<(NodeIndex, Edge)>,
    adjacency_starts: Vec<u32>,
}

impl CapabilityGraph {
    /// Builds the graph from scratch. Output depends only on the set of
    /// descriptors and presets, not on their order.
    pub fn build(descriptors: &[CapabilityDescriptor], presets: &[Preset]) -> CapabilityGraph {
        CapabilityGraph::build_from(descriptors, presets)
    }

    /// [`CapabilityGraph::build`] over borrowed descriptors (a catalog's
    /// values), so a caller does not copy a catalog to build its graph.
    pub fn build_from<'a>(
        descriptors: impl IntoIterator<Item = &'a CapabilityDescriptor>,
        presets: &[Preset],
    ) -> CapabilityGraph {
        let mut sorted: Vec<&CapabilityDescriptor> = descriptors.into_iter().collect();
        sorted.sort_by(|a, b| a.id.cmp(&b.id));
        sorted.dedup_by(|a, b| a.id == b.id);
        let mut graph = CapabilityGraph {
            graph: UnGraph::with_capacity(sorted.len(), 0),
            ids: sorted.iter().map(|descriptor| descriptor.id.as_str().into()).collect(),
            nodes: IdTable::with_capacity(sorted.len()),
            ..CapabilityGraph::default()
        };
        for (row, descriptor) in sorted.iter().enumerate() {
            graph.graph.add_node(());
            graph.nodes.insert(&graph.ids, &descriptor.id, row as u32);
        }
        let mut edges: BTreeMap<(String, String, EdgeKind), f32> = BTreeMap::new();
        let mut add = |a: &str, b: &str, kind: EdgeKind, weight: f32| {
            if a == b {
                return;
            }
            let (low, high) = if a < b { (a, b) } else { (b, a) };
            let slot = edges.entry((low.to_string(), high.to_string(), kind)).or_insert(weight);
            *slot = slot.max(weight);
        };

        {
            let resolver = NameResolver::new(&sorted);
            for descriptor in &sorted {
                for required in &descriptor.required_tools {
                    if let Some(target) = resolver.resolve(required) {
                        add(&descriptor.id, target, EdgeKind::DependsOn, DEPENDS_ON_WEIGHT);
                        if target != descriptor.id {
                            let targets = graph.dependencies.entry(descriptor.id.clone()).or_default();
                            if !targets.iter().any(|existing| existing == target) {
                                targets.push(target.to_string());
                                targets.sort();
                            }
                        }
                    }
                }
            }
        }
        for preset in presets {
            let members: BTreeSet<&str> =
                preset.capability_ids.iter().map(String::as_str).filter(|id| graph.node(id).is_some()).collect();
            let members: Vec<&str> = members.into_iter().collect();
            for (i, a) in members.iter().enumerate() {
                for b in &members[i + 1..] {
                    add(a, b, EdgeKind::ComposedWith, COMPOSED_WITH_WEIGHT);
                }
            }
        }
        let by_tag = small_groups(&sorted, 2..=TAG_MAX_FANOUT, |descriptor: &'a CapabilityDescriptor| {
            let lowered: BTreeSet<String> = descriptor.tags.iter().map(|tag| tag.to_lowercase()).collect();
            lowered.into_iter().map(|tag| leak_free(&tag, &descriptor.tags)).collect()
        });
        let mut shared: BTreeMap<(&str, &str), u32> = BTreeMap::new();
        for ids in by_tag.values() {
            for (i, a) in ids.iter().enumerate() {
                for b in &ids[i + 1..] {
                    *shared.entry((a, b)).or_insert(0) += 1;
                }
            }
        }
        for ((a, b), count) in shared {
            if count >= 2 {
                add(a, b, EdgeKind::TaggedWith, TAGGED_WITH_WEIGHT_PER_TAG * count as f32);
            }
        }
        drop(by_tag);
        let by_category = small_groups(&sorted, 2..=SAME_CATEGORY_MAX_GROUP, |descriptor| {
            vec![(descriptor.kind, descriptor.category.to_lowercase())]
        });
        for ids in by_category.values() {
            for (i, a) in ids.iter().enumerate() {
                for b in &ids[i + 1..] {
                    add(a, b, EdgeKind::SameCategory, SAME_CATEGORY_WEIGHT);
                }
            }
        }
        graph.graph.reserve_exact_edges(edges.len());
        for ((a, b, kind), weight) in edges {
            if let (Some(a), Some(b)) = (graph.node(&a), graph.node(&b)) {
                graph.graph.add_edge(a, b, Edge { kind, weight });
            }
        }
        let mut adjacency = Vec::with_capacity(2 * graph.graph.edge_count());
        let mut starts = Vec::with_capacity(graph.graph.node_count() + 1);
        starts.push(0);
        for node in graph.graph.node_indices() {
            adjacency.extend(graph.sorted_neighbours(node));
            starts.push(adjacency.len() as u32);
        }
        (graph.adjacency, graph.adjacency_starts) = (adjacency, starts);
        graph
    }

    /// The node of `id`.
    fn node(&self, id: &str) -> Option<NodeIndex> {
        self.nodes.get(&self.ids, id).map(|row| NodeIndex::new(row as usize))
    }

    /// The capability id of `node`.
    fn id(&self, node: NodeIndex) -> &str {
        &self.ids[node.index()]
    }

    /// The precomputed neighbours of `node`.
    fn adjacent_to(&self, node: NodeIndex) -> &[(NodeIndex, Edge)] {
        match (self.adjacency_starts.get(node.index()), self.adjacency_starts.get(node.index() + 1)) {
            (Some(&start), Some(&end)) => &self.adjacency[start as usize..end as usize],
            _ => &[],
        }
    }

    /// The neighbours of `node` with the edges to them, strongest first, then
    /// by id, then by kind.
    fn sorted_neighbours(&self, node: NodeIndex) -> Vec<(NodeIndex, Edge)> {
        let mut out: Vec<(NodeIndex, Edge)> = self
            .graph
            .edges(node)
            .map(|edge| (other_end(edge.source(), edge.target(), node), *edge.weight()))
            .collect();
        out.sort_by(|a, b| {
            b.1.weight
                .total_cmp(&a.1.weight)
                .then_with(|| self.id(a.0).cmp(self.id(b.0)))
                .then_with(|| a.1.kind.cmp(&b.1.kind))
        });
        out
    }

    /// The precomputed [`CapabilityGraph::neighbours`] of `id`, by node.
    fn adjacent(&self, id: &str) -> &[(NodeIndex, Edge)] {
        match self.node(id) {
            Some(node) => self.adjacent_to(node),
            None => &[],
        }
    }

    /// Returns the neighbours of `id` with the edges to them, strongest first
    /// (then by id, then by kind).
    pub fn neighbours(&self, id: &str) -> Vec<(&str, Edge)> {
        self.adjacent(id).iter().map(|&(node, edge)| (self.id(node), edge)).collect()
    }

    /// Returns the capabilities `id` depends on (its `DEPENDS_ON` edges in
    /// their direction), sorted by id.
    pub fn dependencies(&self, id: &str) -> &[String] {
        self.dependencies.get(id).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Returns the capabilities that share a preset with `id` (`COMPOSED_WITH`), sorted by id.
    pub fn composed_with(&self, id: &str) -> Vec<&str> {
        let mut partners: Vec<&str> = self
            .adjacent(id)
            .iter()
            .filter(|(_, edge)| edge.kind == EdgeKind::ComposedWith)
            .map(|&(partner, _)| self.id(partner))
            .collect();
        partners.sort_unstable();
        partners
    }

    /// Returns node and edge counts.
    pub fn stats(&self) -> GraphStats {
        let mut edges_by_kind: BTreeMap<String, usize> = BTreeMap::new();
        for edge in self.graph.edge_weights() {
            let name =
                serde_json::to_value(edge.kind).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
            *edges_by_kind.entry(name).or_insert(0) += 1;
        }
        GraphStats { nodes: self.graph.node_count(), edges: self.graph.edge_count(), edges_by_kind }
    }

    /// Re-ranks search hits with the graph.
    ///
    /// 1. A hit whose neighbour is also a hit gives it `boost · weight` per edge.
    /// 2. A `DEPENDS_ON` or `COMPOSED_WITH` neighbour that is not a hit is
    ///    pulled in at `parentScore · boost · weight` (the parent's search
    ///    score), if `keep` admits it, so filters hold for pull-ins too.
    /// 3. Everything is sorted by score, best first (ties by id).
    pub fn rerank<S: AsRef<str>>(
        &self,
        hits: &[(S, f32)],
        boost: f32,
        keep: impl Fn(&str) -> bool,
    ) -> Vec<(String, f32)> {
        // Scores by borrowed id with each id's node: the hits first (a
        // repeated hit keeps its last score), then the pulled-in neighbours.
        // A query holds a few hits, so a neighbour is found among them by node
        // number, without hashing or comparing ids; strings are made once, for
        // the answer.
        let nodes: Vec<Option<NodeIndex>> = hits.iter().map(|(id, _)| self.node(id.as_ref())).collect();
        let mut scores: Vec<(&str, Option<NodeIndex>, f32)> = Vec::with_capacity(hits.len() * 2);
        for ((id, score), &node) in hits.iter().zip(&nodes) {
            let id = id.as_ref();
            match scores.iter_mut().find(|(existing, _, _)| *existing == id) {
                Some(slot) => slot.2 = *score,
                None => scores.push((id, node, *score)),
            }
        }
        let n_hits = scores.len();
        for ((_, parent_score), node) in hits.iter().zip(&nodes) {
            let Some(node) = node else { continue };
            for &(neighbour, edge) in self.adjacent_to(*node) {
                if let Some(hit) = scores[..n_hits].iter_mut().find(|(_, hit_node, _)| *hit_node == Some(neighbour)) {
                    hit.2 += boost * edge.weight;
                } else if edge.kind.pulls_in() && keep(self.id(neighbour)) {
                    let pulled = parent_score * boost * edge.weight;
                    match scores[n_hits..].iter_mut().find(|(_, pulled_node, _)| *pulled_node == Some(neighbour)) {
                        Some(slot) => slot.2 = slot.2.max(pulled),
                        None => scores.push((self.id(neighbour), Some(neighbour), 0.0f32.max(pulled))),
                    }
                }
            }
        }
        scores.sort_by(|a, b| b.2.total_cmp(&a.2).then_with(|| a.0.cmp(b.0)));
        scores.into_iter().map(|(id, _, score)| (id.to_string(), score)).collect()
    }
}

/// The ids of `sorted` grouped by each of their `keys` (a key listed once per
/// descriptor), only the groups whose size is in `sizes`, ids in `sorted`'s
/// order. Counted first, gathered second, so that only groups small enough to
/// relate their members are ever held: at a million capabilities, every id
/// listed under each of its tags and its category would be a transient
/// hundred megabytes.
fn small_groups<'a, K: Ord + std::hash::Hash + Clone>(
    sorted: &[&'a CapabilityDescriptor],
    sizes: std::ops::RangeInclusive<usize>,
    keys: impl Fn(&'a CapabilityDescriptor) -> Vec<K>,
) -> BTreeMap<K, Vec<&'a str>> {
    let mut counts: HashMap<K, usize> = HashMap::default();
    for descriptor in sorted {
        for key in keys(descriptor) {
            *counts.entry(key).or_insert(0) += 1;
        }
    }
    let mut groups: BTreeMap<K, Vec<&'a str>> = BTreeMap::new();
    for descriptor in sorted {
        for key in keys(descriptor) {
            if sizes.contains(&counts[&key]) {
                groups.entry(key).or_default().push(&descriptor.id);
            }
        }
    }
    groups
}

fn other_end(source: NodeIndex, target: NodeIndex, node: NodeIndex) -> NodeIndex {
    if source == node {
        target
    } else {
        source
    }
}

/// Returns the tag as spelled in `original` (first case-insensitive match),
/// so grouping is case-insensitive without allocating a new key per id.
fn leak_free<'a>(lowered: &str, original: &'a [String]) -> &'a str {
    original.iter().find(|tag| tag.to_lowercase() == lowered).map(String::as_str).unwrap_or("")
}

/// Resolves a `requiredTools` entry to a capability id: an exact id, then
/// `tool:<name>`, then a capability whose name matches once case, `-` and `_`
/// are ignored (`github_search` meets `githubSearch`).
///
/// Loose names are kept only for the entries that are no id, bare or as
/// `tool:<name>` (most name their dependency exactly): the resolver's size
/// follows the dependencies, not the catalog.
struct NameResolver<'s, 'a> {
    /// Sorted by id, no id twice.
    sorted: &'s [&'a CapabilityDescriptor],
    by_loose_name: BTreeMap<String, &'a str>,
}

impl<'s, 'a> NameResolver<'s, 'a> {
    fn new(sorted: &'s [&'a CapabilityDescriptor]) -> NameResolver<'s, 'a> {
        let mut resolver = NameResolver { sorted, by_loose_name: BTreeMap::new() };
        let wanted: BTreeSet<String> = sorted
            .iter()
            .flat_map(|descriptor| &descriptor.required_tools)
            .filter(|required| resolver.exact(required).is_none())
            .map(|required| loose(required))
            .collect();
        if wanted.is_empty() {
            return resolver;
        }
        for descriptor in sorted {
            // Tools win over other kinds for the same loose name: dependencies are tools.
            let key = loose(&descriptor.name);
            if !wanted.contains(&key) {
                continue;
            }
            let by_loose_name = &mut resolver.by_loose_name;
            let replace = match by_loose_name.get(&key) {
                None => true,
                Some(existing) => !existing.starts_with("tool:") && descriptor.id.starts_with("tool:"),
            };
            if replace {
                by_loose_name.insert(key, &descriptor.id);
            }
        }
        resolver
    }

    /// The id `id` itself, or `tool:<id>`.
    fn exact(&self, required: &str) -> Option<&'a str> {
        let find = |id: &str| {
            let at = self.sorted.binary_search_by(|descriptor| descriptor.id.as_str().cmp(id)).ok()?;
            Some(self.sorted[at].id.as_str())
        };
        find(required).or_else(|| find(&format!("tool:{required}")))
    }

    fn resolve(&self, required: &str) -> Option<&'a str> {
        self.exact(required).or_else(|| self.by_loose_name.get(&loose(required)).copied())
    }
}

fn loose(name: &str) -> String {
    let bare = name.rsplit(':').next().unwrap_or(name);
    bare.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::descriptor::{CapabilityKind, DefinitionRef};

    fn descriptor(id: &str, category: &str, tags: &[&str], requires: &[&str]) -> CapabilityDescriptor {
        let (kind, name) = id.split_once(':').unwrap();
        CapabilityDescriptor {
            id: id.into(),
            kind: CapabilityKind::parse(kind).unwrap(),
            name: name.into(),
            display_name: name.into(),
            description: String::new(),
            category: category.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            required_secrets: vec![],
            required_tools: requires.iter().map(|t| t.to_string()).collect(),
            available: true,
            has_side_effects: None,
            full_schema: None,
            full_content: None,
            definition_ref: DefinitionRef::Builtin,
        }
    }

    fn sample() -> Vec<CapabilityDescriptor> {
        vec![
            descriptor("skill:github", "developer", &["git", "code", "issues", "prs"], &["cli_executor", "gh"]),
            descriptor("tool:cli-executor", "developer", &["shell", "code", "git", "issues"], &[]),
            descriptor("tool:web-search", "information", &["search", "web"], &[]),
            descriptor("tool:web-browser", "information", &["web", "browse"], &[]),
        ]
    }

    #[test]
    fn edges_of_each_kind_coexist() {
        let graph = CapabilityGraph::build(
            &sample(),
            &[Preset { name: "p".into(), capability_ids: vec!["skill:github".into(), "tool:cli-executor".into()] }],
        );
        let kinds: Vec<EdgeKind> = graph.neighbours("skill:github").iter().map(|(_, edge)| edge.kind).collect();
        assert_eq!(graph.dependencies("skill:github"), ["tool:cli-executor".to_string()]);
        assert!(graph.dependencies("tool:cli-executor").is_empty(), "DEPENDS_ON keeps its direction");
        assert_eq!(graph.composed_with("tool:cli-executor"), vec!["skill:github"]);
        // 3 shared tags give TAGGED_WITH 0.9; DEPENDS_ON (loose name match) and COMPOSED_WITH survive beside it.
        assert_eq!(kinds, vec![EdgeKind::DependsOn, EdgeKind::TaggedWith, EdgeKind::ComposedWith]);
        let stats = graph.stats();
        assert_eq!(stats.nodes, 4);
        assert_eq!(stats.edges_by_kind.get("SAME_CATEGORY"), Some(&1));
        assert_eq!(stats.edges_by_kind.get("DEPENDS_ON"), Some(&1));
    }

    #[test]
    fn build_ignores_input_order() {
        let mut reversed = sample();
        reversed.reverse();
        let a = CapabilityGraph::build(&sample(), &[]);
        let b = CapabilityGraph::build(&reversed, &[]);
        assert_eq!(a.stats(), b.stats());
        assert_eq!(a.neighbours("skill:github"), b.neighbours("skill:github"));
    }

    #[test]
    fn rerank_boosts_and_pulls_in_within_filters() {
        let graph = CapabilityGraph::build(&sample(), &[]);
        let hits = vec![("skill:github".to_string(), 0.8), ("tool:web-search".to_string(), 0.5)];
        let ranked = graph.rerank(&hits, 0.15, |_| true);
        assert_eq!(ranked[0].0, "skill:github");
        let pulled = ranked.iter().find(|(id, _)| id == "tool:cli-executor").unwrap();
        assert!((pulled.1 - 0.8 * 0.15 * 1.0).abs() < 1e-6);
        let filtered = graph.rerank(&hits, 0.15, |id| !id.starts_with("tool:"));
        assert!(filtered.iter().all(|(id, _)| id != "tool:cli-executor"));
    }

    /// The re-ranking as first written, over ids and hash maps, with the
    /// neighbours sorted per call: what [`CapabilityGraph::rerank`] must equal.
    fn rerank_reference(
        graph: &CapabilityGraph,
        hits: &[(String, f32)],
        boost: f32,
        keep: impl Fn(&str) -> bool,
    ) -> Vec<(String, f32)> {
        let mut scores: HashMap<&str, f32> = HashMap::default();
        for (id, score) in hits {
            scores.insert(id.as_str(), *score);
        }
        let hit_ids: BTreeSet<&str> = hits.iter().map(|(id, _)| id.as_str()).collect();
        for (id, parent_score) in hits {
            let Some(node) = graph.node(id) else { continue };
            let mut neighbours: Vec<(&str, Edge)> = graph
                .graph
                .edges(node)
                .map(|edge| (graph.id(other_end(edge.source(), edge.target(), node)), *edge.weight()))
                .collect();
            neighbours.sort_by(|a, b| {
                b.1.weight.total_cmp(&a.1.weight).then_with(|| a.0.cmp(b.0)).then_with(|| a.1.kind.cmp(&b.1.kind))
            });
            assert_eq!(neighbours, graph.neighbours(id), "precomputed neighbours of {id}");
            for (neighbour, edge) in neighbours {
                if hit_ids.contains(neighbour) {
                    *scores.get_mut(neighbour).unwrap() += boost * edge.weight;
                } else if edge.kind.pulls_in() && keep(neighbour) {
                    let slot = scores.entry(neighbour).or_insert(0.0);
                    *slot = slot.max(parent_score * boost * edge.weight);
                }
            }
        }
        let mut ranked: Vec<(&str, f32)> = scores.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        ranked.into_iter().map(|(id, score)| (id.to_string(), score)).collect()
    }

    proptest::proptest! {
        #[test]
        fn rerank_equals_the_reference_float_for_float(
            specs in proptest::collection::vec(
                (0usize..3, 0usize..3, proptest::collection::vec(0usize..5, 0..4), proptest::collection::vec(0usize..12, 0..3)),
                1..12,
            ),
            preset in proptest::collection::vec(0usize..12, 0..5),
            hits in proptest::collection::vec((0usize..14, 0.0f32..1.0), 0..10),
            boost in 0.0f32..1.0,
            excluded in 0usize..14,
        ) {
            let kinds = ["tool", "skill", "channel"];
            let descriptors: Vec<CapabilityDescriptor> = specs
                .iter()
                .enumerate()
                .map(|(i, (kind, category, tags, requires))| {
                    let tags: Vec<String> = tags.iter().map(|t| format!("t{t}")).collect();
                    let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
                    let requires: Vec<String> = requires.iter().map(|r| format!("c{r}")).collect();
                    let requires: Vec<&str> = requires.iter().map(String::as_str).collect();
                    descriptor(&format!("{}:c{i}", kinds[*kind]), &format!("g{category}"), &tags, &requires)
                })
                .collect();
            let ids = |i: &usize| descriptors.get(*i).map_or(format!("tool:missing{i}"), |d| d.id.clone());
            let presets = [Preset { name: "p".into(), capability_ids: preset.iter().map(ids).collect() }];
            let graph = CapabilityGraph::build(&descriptors, &presets);
            let hits: Vec<(String, f32)> = hits.iter().map(|(i, score)| (ids(i), *score)).collect();
            let excluded = ids(&excluded);
            let keep = |id: &str| id != excluded;
            let fast = graph.rerank(&hits, boost, keep);
            let reference = rerank_reference(&graph, &hits, boost, keep);
            proptest::prop_assert_eq!(fast.len(), reference.len());
            for ((id, score), (reference_id, reference_score)) in fast.iter().zip(&reference) {
                proptest::prop_assert_eq!(id, reference_id);
                proptest::prop_assert_eq!(score.to_bits(), reference_score.to_bits());
            }
            for descriptor in &descriptors {
                let mut partners: Vec<&str> = graph
                    .neighbours(&descriptor.id)
                    .into_iter()
                    .filter(|(_, edge)| edge.kind == EdgeKind::ComposedWith)
                    .map(|(partner, _)| partner)
                    .collect();
                partners.sort_unstable();
                proptest::prop_assert_eq!(graph.composed_with(&descriptor.id), partners);
            }
        }
    }
}
