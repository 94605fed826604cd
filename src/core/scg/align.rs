//! Linking across sources: field-name normalisation, TypeAligner (weighted
//! `RESOLVES_TO` between entity types, and between their matching fields) and
//! `CONSUMES` edges from capabilities whose outputs feed another's inputs.
//!
//! # Normalisation ([`field_concept`])
//! The leaf of a field path is split at case changes and non-alphanumerics and
//! lower-cased; a trailing identifier word (`id`, `ids`, `gid`, `uuid`, `key`) and
//! a trailing time word (`at`, `on`, `date`, `time`, `timestamp`) are dropped when
//! something is left; each word is put in the singular; then a small lexicon
//! folds spellings of one concept ([`CONCEPT_LEXICON`]). So `AlbumId`, `album_id`
//! and `albums` meet, `due_on` meets `due_date`, `completed_at` meets `closed_at`.
//!
//! # Scoring ([`TypeAligner`])
//! Each concept weighs its inverse document frequency over all entity types being
//! aligned, `ln(1 + N/df) / ln(1 + N)`, times [`STOP_FIELD_WEIGHT`] for the
//! stop-fields (`id`, `name`, timestamps, urls, `type`...). A pair's score is the
//! weighted overlap `Σshared / sqrt(ΣA · ΣB)` plus [`EXACT_NAME_BONUS`] when the
//! entity names are equal (case-insensitive), capped at 1. The published original
//! used plain Jaccard, which scores real counterparts 0.03–0.23 because big schemas
//! have big unions, and `{id, name}` pairs 1.0; the weighted overlap does neither.
//! A pair becomes an edge when its score is at least [`ALIGN_THRESHOLD`] **and** it
//! shares at least [`MIN_SHARED_INFORMATIVE`] informative (non-stop) concepts, or one
//! with equal names: schemas made only of stop-fields never align.

use super::mcp::singular;
use super::model::{Edge, EdgeKind, Node, NodeKind, SourceGraph};
use std::collections::{BTreeMap, BTreeSet};

/// Minimum score for a RESOLVES_TO edge between two entity types.
pub const ALIGN_THRESHOLD: f32 = 0.1;
/// Informative concepts two entity types must share (one suffices when their names are equal).
pub const MIN_SHARED_INFORMATIVE: usize = 3;
/// Added to the score when two entity types have the same name.
pub const EXACT_NAME_BONUS: f32 = 0.2;
/// Factor applied to a stop-field's weight.
pub const STOP_FIELD_WEIGHT: f32 = 0.25;
/// Highest weight an alignment edge carries, below a seed's own 1.0.
pub const MAX_LINK_WEIGHT: f32 = 0.95;
/// At most this many producers feed one input field through CONSUMES.
pub const MAX_PRODUCERS_PER_INPUT: usize = 5;
/// Factor on a CONSUMES edge between two sources: a shared name across APIs is weaker evidence.
pub const CROSS_SOURCE_CONSUMES_FACTOR: f32 = 0.6;

/// Concepts that say little about what an entity is.
pub const STOP_FIELDS: [&str; 16] = [
    "id",
    "gid",
    "uuid",
    "name",
    "created",
    "updated",
    "deleted",
    "url",
    "uri",
    "href",
    "link",
    "type",
    "kind",
    "resource_type",
    "resource_subtype",
    "etag",
];

/// Spellings folded into one concept, after splitting and singularising.
pub const CONCEPT_LEXICON: [(&str, &str); 10] = [
    ("modified", "updated"),
    ("status", "state"),
    ("tag", "label"),
    ("note", "body"),
    ("completed", "closed"),
    ("summary", "title"),
    ("subject", "title"),
    ("html_url", "url"),
    ("permalink_url", "url"),
    ("web_url", "url"),
];

const ID_WORDS: [&str; 5] = ["id", "ids", "gid", "uuid", "key"];
const TIME_WORDS: [&str; 5] = ["at", "on", "date", "time", "timestamp"];

/// Returns the normalised concept of a field path (see the module docs).
///
/// # Examples
/// ```
/// use capdex::core::scg::align::field_concept;
/// assert_eq!(field_concept("AlbumId"), "album");
/// assert_eq!(field_concept("Task.due_on"), field_concept("dueDate"));
/// assert_eq!(field_concept("labels"), "label");
/// assert_eq!(field_concept("id"), "id");
/// ```
pub fn field_concept(path: &str) -> String {
    let leaf = path.rsplit('.').next().unwrap_or(path);
    let mut words = split_words(leaf);
    if words.len() > 1 && words.last().is_some_and(|word| ID_WORDS.contains(&word.as_str())) {
        words.pop();
    }
    if words.len() > 1 && words.last().is_some_and(|word| TIME_WORDS.contains(&word.as_str())) {
        words.pop();
    }
    let joined = words.iter().map(|word| singular(word)).collect::<Vec<_>>().join("_");
    CONCEPT_LEXICON.iter().find(|(from, _)| *from == joined).map_or(joined, |(_, to)| to.to_string())
}

/// Returns whether a concept is a stop-field.
pub fn is_stop_field(concept: &str) -> bool {
    STOP_FIELDS.contains(&concept)
}

/// Splits a name into lower-cased words at case changes and non-alphanumerics (`dueOn` → `due on`).
pub fn split_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let chars: Vec<char> = text.chars().collect();
    for (at, &c) in chars.iter().enumerate() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            continue;
        }
        let previous = at.checked_sub(1).map(|before| chars[before]);
        let next = chars.get(at + 1);
        let boundary = c.is_uppercase()
            && previous.is_some_and(|before| {
                before.is_lowercase()
                    || before.is_ascii_digit()
                    || (before.is_uppercase() && next.is_some_and(|after| after.is_lowercase()))
            });
        if boundary && !current.is_empty() {
            words.push(std::mem::take(&mut current));
        }
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// One entity type as the aligner sees it.
#[derive(Clone, Debug)]
struct AlignedEntity<'a> {
    node: &'a Node,
    /// Concept → the first top-level field node carrying it.
    concepts: BTreeMap<String, &'a Node>,
}

/// What linking produced, with counts for reports.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Links {
    /// Entity-to-entity and field-to-field RESOLVES_TO edges.
    pub resolves_to: Vec<Edge>,
    pub consumes: Vec<Edge>,
    /// Entity pairs compared.
    pub n_pairs_compared: usize,
    /// Entity-to-entity RESOLVES_TO edges among `resolves_to`.
    pub n_entity_edges: usize,
}

/// Aligns entity types across sources and chains capabilities; see the module docs.
#[derive(Clone, Copy, Debug, Default)]
pub struct TypeAligner;

impl TypeAligner {
    /// Links every pair of different sources among `graphs`.
    pub fn link(&self, graphs: &[&SourceGraph]) -> Links {
        let entities = entities(graphs);
        let n_entities = entities.len().max(1) as f32;
        // Concepts interned in name order, so sums run in the same order whatever the graph order.
        let concept_names: Vec<&str> = entities
            .iter()
            .flat_map(|entity| entity.concepts.keys().map(String::as_str))
            .collect::<BTreeSet<&str>>()
            .into_iter()
            .collect();
        let concept_ids: BTreeMap<&str, u32> =
            concept_names.iter().enumerate().map(|(at, name)| (*name, at as u32)).collect();
        let lists: Vec<Vec<u32>> = entities
            .iter()
            .map(|entity| entity.concepts.keys().map(|concept| concept_ids[concept.as_str()]).collect())
            .collect();
        let mut document_frequency = vec![0usize; concept_names.len()];
        for list in &lists {
            for &concept in list {
                document_frequency[concept as usize] += 1;
            }
        }
        let stop: Vec<bool> = concept_names.iter().map(|name| is_stop_field(name)).collect();
        let weights: Vec<f32> = document_frequency
            .iter()
            .zip(&stop)
            .map(|(&df, &is_stop)| {
                let idf = (1.0 + n_entities / df.max(1) as f32).ln() / (1.0 + n_entities).ln();
                if is_stop {
                    idf * STOP_FIELD_WEIGHT
                } else {
                    idf
                }
            })
            .collect();
        let totals: Vec<f32> = lists.iter().map(|list| list.iter().map(|&c| weights[c as usize]).sum()).collect();
        let mut links = Links::default();
        for (left_idx, left) in entities.iter().enumerate() {
            for (right_idx, right) in entities.iter().enumerate().skip(left_idx + 1) {
                if left.node.source_id == right.node.source_id {
                    continue;
                }
                links.n_pairs_compared += 1;
                let names_equal = left.node.name.eq_ignore_ascii_case(&right.node.name);
                let shared = intersect(&lists[left_idx], &lists[right_idx]);
                let informative: Vec<&str> = shared
                    .iter()
                    .filter(|&&concept| !stop[concept as usize])
                    .map(|&concept| concept_names[concept as usize])
                    .collect();
                let gate = informative.len() >= MIN_SHARED_INFORMATIVE || (names_equal && !informative.is_empty());
                if !gate || totals[left_idx] <= 0.0 || totals[right_idx] <= 0.0 {
                    continue;
                }
                let overlap: f32 = shared.iter().map(|&concept| weights[concept as usize]).sum::<f32>()
                    / (totals[left_idx] * totals[right_idx]).sqrt();
                let score = (overlap + if names_equal { EXACT_NAME_BONUS } else { 0.0 }).min(1.0);
                if score < ALIGN_THRESHOLD {
                    continue;
                }
                let edge_weight = score.min(MAX_LINK_WEIGHT);
                let evidence = vec![
                    format!("overlap={overlap:.3}"),
                    format!("shared={}", informative.join(",")),
                    format!("name_match={names_equal}"),
                ];
                links.resolves_to.push(oriented(&left.node.id, &right.node.id, edge_weight, evidence));
                links.n_entity_edges += 1;
                for concept in informative {
                    let (left_field, right_field) = (left.concepts[concept], right.concepts[concept]);
                    let (low, high) = if left.node.source_key <= right.node.source_key {
                        (left.node, right.node)
                    } else {
                        (right.node, left.node)
                    };
                    let evidence =
                        vec![format!("concept={concept}"), format!("via={}~{}", low.source_key, high.source_key)];
                    links.resolves_to.push(oriented(&left_field.id, &right_field.id, edge_weight, evidence));
                }
            }
        }
        links.resolves_to = dedup(links.resolves_to);
        links.consumes = consumes(graphs);
        links
    }
}

/// Returns the common elements of two sorted lists.
fn intersect(left: &[u32], right: &[u32]) -> Vec<u32> {
    let (mut left_at, mut right_at, mut out) = (0, 0, Vec::new());
    while left_at < left.len() && right_at < right.len() {
        match left[left_at].cmp(&right[right_at]) {
            std::cmp::Ordering::Less => left_at += 1,
            std::cmp::Ordering::Greater => right_at += 1,
            std::cmp::Ordering::Equal => {
                out.push(left[left_at]);
                left_at += 1;
                right_at += 1;
            }
        }
    }
    out
}

fn source_of(source_key: &str) -> &str {
    source_key.split('#').next().unwrap_or(source_key)
}

fn oriented(a: &str, b: &str, weight: f32, evidence: Vec<String>) -> Edge {
    let (source, target) = if a <= b { (a, b) } else { (b, a) };
    Edge { source: source.to_string(), target: target.to_string(), kind: EdgeKind::ResolvesTo, weight, evidence }
}

fn dedup(edges: Vec<Edge>) -> Vec<Edge> {
    let mut best: BTreeMap<(String, String, EdgeKind), Edge> = BTreeMap::new();
    for edge in edges {
        let key = (edge.source.clone(), edge.target.clone(), edge.kind);
        match best.get(&key) {
            Some(existing) if existing.weight >= edge.weight => {}
            _ => {
                best.insert(key, edge);
            }
        }
    }
    best.into_values().collect()
}

fn entities<'a>(graphs: &[&'a SourceGraph]) -> Vec<AlignedEntity<'a>> {
    let mut out = Vec::new();
    for graph in graphs {
        let mut by_id: BTreeMap<&str, AlignedEntity<'a>> = BTreeMap::new();
        for node in graph.nodes.iter().filter(|node| node.kind == NodeKind::EntityType) {
            by_id.insert(node.id.as_str(), AlignedEntity { node, concepts: BTreeMap::new() });
        }
        for edge in graph.edges.iter().filter(|edge| edge.kind == EdgeKind::HasField) {
            let (Some(entity), Some(field)) = (by_id.get_mut(edge.source.as_str()), graph.node(&edge.target)) else {
                continue;
            };
            if field.name.contains('.') {
                continue;
            }
            let concept = field_concept(&field.name);
            let current = entity.concepts.entry(concept).or_insert(field);
            if field.source_key < current.source_key {
                *current = field;
            }
        }
        out.extend(by_id.into_values());
    }
    out
}

/// Returns CONSUMES edges: producer capability → consumer capability where a produced
/// field and an input field share an informative concept (stop-fields never chain).
fn consumes(graphs: &[&SourceGraph]) -> Vec<Edge> {
    // Concept → producers as (capability id, number of fields it produces, field key).
    let mut produced: BTreeMap<String, Vec<(usize, String, String)>> = BTreeMap::new();
    let mut consumed: Vec<(String, String, String)> = Vec::new();
    for graph in graphs {
        let mut produce_counts: BTreeMap<&str, usize> = BTreeMap::new();
        for edge in graph.edges.iter().filter(|edge| edge.kind == EdgeKind::Produces) {
            *produce_counts.entry(edge.source.as_str()).or_insert(0) += 1;
        }
        for edge in &graph.edges {
            let Some(field) = graph.node(&edge.target) else { continue };
            let concept = field_concept(&field.name);
            if is_stop_field(&concept) || concept.is_empty() {
                continue;
            }
            match edge.kind {
                EdgeKind::Produces if !field.name.contains('.') => {
                    let count = produce_counts.get(edge.source.as_str()).copied().unwrap_or(0);
                    produced.entry(concept).or_default().push((count, edge.source.clone(), field.source_key.clone()));
                }
                EdgeKind::SupportsQuery if !field.name.contains('.') => {
                    consumed.push((concept, edge.source.clone(), field.source_key.clone()));
                }
                _ => {}
            }
        }
    }
    let n_concepts = produced.len().max(1) as f32;
    let mut edges: BTreeMap<(String, String), Edge> = BTreeMap::new();
    for producers in produced.values_mut() {
        producers.sort();
        producers.dedup_by(|a, b| a.1 == b.1);
    }
    for (concept, consumer, input_key) in consumed {
        let Some(producers) = produced.get(&concept) else { continue };
        // Rarer concepts make stronger chains.
        let base = 0.3 + 0.5 * ((1.0 + n_concepts / producers.len() as f32).ln() / (1.0 + n_concepts).ln());
        let consumer_source = source_of(&input_key);
        // Producers in the consumer's own source first: a chain within one API is the likelier one.
        let mut ranked: Vec<&(usize, String, String)> =
            producers.iter().filter(|(_, producer, _)| *producer != consumer).collect();
        ranked.sort_by_key(|(count, _, output_key)| {
            (source_of(output_key) != consumer_source, *count, output_key.clone())
        });
        for (_, producer, output_key) in ranked.into_iter().take(MAX_PRODUCERS_PER_INPUT) {
            let key = (producer.clone(), consumer.clone());
            if edges.contains_key(&key) {
                continue;
            }
            let factor = if source_of(output_key) == consumer_source { 1.0 } else { CROSS_SOURCE_CONSUMES_FACTOR };
            edges.insert(
                key,
                Edge {
                    source: producer.clone(),
                    target: consumer.clone(),
                    kind: EdgeKind::Consumes,
                    weight: (base * factor).min(MAX_LINK_WEIGHT),
                    evidence: vec![format!("binds={output_key}->{input_key}"), format!("concept={concept}")],
                },
            );
        }
    }
    edges.into_values().collect()
}

/// Counts the RESOLVES_TO edges the published original would emit: lower-cased leaf
/// names, plain Jaccard, +0.2 for equal names, threshold 0.6. Kept for comparisons.
pub fn published_original_alignment_count(graphs: &[&SourceGraph]) -> usize {
    let entities = entities(graphs);
    let leaf_sets: Vec<BTreeSet<String>> = entities
        .iter()
        .map(|entity| entity.concepts.values().map(|field| field.name.to_lowercase()).collect())
        .collect();
    let mut count = 0;
    for (left_idx, left) in entities.iter().enumerate() {
        for (right_idx, right) in entities.iter().enumerate().skip(left_idx + 1) {
            if left.node.source_id == right.node.source_id {
                continue;
            }
            let (a, b) = (&leaf_sets[left_idx], &leaf_sets[right_idx]);
            let union = a.union(b).count();
            let jaccard = if union == 0 { 0.0 } else { a.intersection(b).count() as f32 / union as f32 };
            let bonus = if left.node.name.eq_ignore_ascii_case(&right.node.name) { 0.2 } else { 0.0 };
            if (jaccard + bonus).min(1.0) >= 0.6 {
                count += 1;
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scg::model::{GraphBuilder, SourceKind};

    fn check(input: &str, expected: &str) {
        assert_eq!(field_concept(input), expected, "{input}");
    }

    #[test]
    fn normalisation() {
        check("AlbumId", "album");
        check("album_id", "album");
        check("albumIds", "album");
        check("id", "id");
        check("created_at", "created");
        check("createdAt", "created");
        check("due_on", "due");
        check("dueDate", "due");
        check("labels", "label");
        check("tags", "label");
        check("HTMLUrl", "url");
        check("html_url", "url");
        check("completed_at", "closed");
        check("Issue.assignee", "assignee");
        check("resource_type", "resource_type");
    }

    fn entity_graph(source: &str, entities: &[(&str, &[&str])]) -> SourceGraph {
        let mut builder = GraphBuilder::new(source, source);
        for (name, fields) in entities {
            let entity = builder.node(name, NodeKind::EntityType, name, "", None);
            let key = builder.key(name);
            for field in *fields {
                let field_id = builder.node(&format!("{name}.{field}"), NodeKind::Field, field, "", Some(&key));
                builder.edge(&entity, &field_id, EdgeKind::HasField);
            }
        }
        builder.finish(SourceKind::Openapi)
    }

    #[test]
    fn id_name_schemas_do_not_align_but_counterparts_do() {
        let left = entity_graph(
            "a",
            &[("Ref", &["id", "name"]), ("Issue", &["id", "title", "assignee", "labels", "state", "due_date", "body"])],
        );
        let right = entity_graph(
            "b",
            &[
                ("Compact", &["gid", "name"]),
                ("Task", &["gid", "name", "assignee", "tags", "status", "due_on", "notes"]),
            ],
        );
        let links = TypeAligner.link(&[&left, &right]);
        assert_eq!(links.n_entity_edges, 1, "{:#?}", links.resolves_to);
        let issue = crate::core::scg::model::node_id("a#Issue", NodeKind::EntityType);
        let task = crate::core::scg::model::node_id("b#Task", NodeKind::EntityType);
        let (low, high) = if issue < task { (issue, task) } else { (task, issue) };
        assert!(links.resolves_to.iter().any(|edge| edge.source == low && edge.target == high));
        // The published original links the two {id, name}-like pairs' opposite: Ref~Compact shares only `name`.
        assert_eq!(published_original_alignment_count(&[&left, &right]), 0);
        let twins_left = entity_graph("a", &[("Ref", &["id", "name"])]);
        let twins_right = entity_graph("b", &[("Other", &["id", "name"])]);
        assert_eq!(published_original_alignment_count(&[&twins_left, &twins_right]), 1);
        assert_eq!(TypeAligner.link(&[&twins_left, &twins_right]).n_entity_edges, 0);
    }

    fn chain_graph(source: &str, producer_field: &str, consumer_input: &str) -> SourceGraph {
        let mut builder = GraphBuilder::new(source, source);
        let producer = builder.node("list", NodeKind::Capability, "list", "", None);
        let output =
            builder.node("list.response.item", NodeKind::Field, producer_field, "", Some(&builder.key("list")));
        builder.edge(&producer, &output, EdgeKind::Produces);
        let id_output = builder.node("list.response.id", NodeKind::Field, "id", "", Some(&builder.key("list")));
        builder.edge(&producer, &id_output, EdgeKind::Produces);
        let consumer = builder.node("get", NodeKind::Capability, "get", "", None);
        let input = builder.node("get.input", NodeKind::Field, consumer_input, "", Some(&builder.key("get")));
        builder.edge(&consumer, &input, EdgeKind::SupportsQuery);
        let id_input = builder.node("get.id", NodeKind::Field, "id", "", Some(&builder.key("get")));
        builder.edge(&consumer, &id_input, EdgeKind::SupportsQuery);
        builder.finish(SourceKind::Openapi)
    }

    #[test]
    fn consumes_chains_on_informative_names_and_prefers_its_own_source() {
        let left = chain_graph("a", "repoName", "repo_name");
        let right = chain_graph("b", "repo_names", "repoName");
        let links = TypeAligner.link(&[&left, &right]);
        // Within each source, and across both ways; never on `id`.
        assert_eq!(links.consumes.len(), 4, "{:#?}", links.consumes);
        assert!(links.consumes.iter().all(|edge| edge.evidence.iter().any(|e| e == "concept=repo_name")));
        let within = links
            .consumes
            .iter()
            .find(|edge| edge.evidence[0].starts_with("binds=a#") && edge.evidence[0].contains("->a#"))
            .unwrap();
        let across = links
            .consumes
            .iter()
            .find(|edge| edge.evidence[0].starts_with("binds=b#") && edge.evidence[0].contains("->a#"))
            .unwrap();
        assert!(within.weight > across.weight);
    }

    #[test]
    fn alignment_does_not_depend_on_graph_order() {
        let left = entity_graph("a", &[("Issue", &["title", "assignee", "labels", "state"])]);
        let right = entity_graph("b", &[("Task", &["title", "assignee", "tags", "status"])]);
        assert_eq!(TypeAligner.link(&[&left, &right]).resolves_to, TypeAligner.link(&[&right, &left]).resolves_to);
    }
}
