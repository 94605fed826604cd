//! Concepts at query time: a question's words and phrases resolve to concepts, and
//! concepts to the fields, entity types and operations that carry them in each source.
//!
//! # Where concepts come from, in order of trust
//! 1. **The mapped sources.** A question word that is itself the name of a field in a
//!    mapped source (after [`field_concept`] normalisation: `assignee`, `due_on`, `tags`)
//!    resolves *through that field*: to the lexicon concept that field spelling carries, or
//!    else to the field's own concept, carried by every field of that spelling and, over
//!    `RESOLVES_TO`, by the fields and entity types the aligner (or a foreign key) joined
//!    it to. A question word that is an **enum value** of a field (`closed` of
//!    `Issue.state`) resolves to that field's concept at [`ENUM_VALUE_WEIGHT`], and a value
//!    the lexicon spells or uses as a term makes the field carry its concept too.
//! 2. **The configured embedder** (the one discovery uses): the question's vector is
//!    compared with each concept's vector (its label and terms); a concept at cosine
//!    [`EMBED_MIN_COSINE`] or more that words did not resolve is added, weighted by the
//!    cosine. With the built-in hashing embedder this only adds near-spellings; with a
//!    semantic embedder (`static`, `local`, `http`) it adds meaning.
//! 3. **The curated lexicon** (`assets/scg/concepts.json`): common API concepts (owner,
//!    status, amount, due date, location, identity, …), each with the terms people use
//!    and the spellings that carry it in API and database names, and the sources of that
//!    vocabulary. A term (a word or a phrase) of the question resolves its concept.
//!
//! # Carriers
//! At build time every capability and entity type is given, per concept, the strength
//! with which it carries it: [`NAME_STRENGTH`] when a word of its own name is a carrier
//! spelling (`issueGetIssue` carries *work item* and *read*), [`FIELD_STRENGTH`] when a
//! field it produces, takes or has is (`Issue.assignee` carries *owner*), and
//! `RESOLVES_TO_STRENGTH × weight` when a field or entity type joined to it over
//! `RESOLVES_TO` carries it (`Customer.SupportRepId` → `Employee`). Operation-only
//! concepts (the verbs: create, read, update, delete, …) are carried by names only.
//!
//! # Ranking
//! A node's concept score is the share of the resolved concepts it carries, each weighted
//! by its resolution weight and its rarity (`ln(1 + N / carriers)`), so a node carrying
//! the rare concepts of a question ranks above one carrying only the common ones. Route
//! adds it, times [`CONCEPT_WEIGHT`], to the word or vector similarity.

use super::align::{field_concept, is_stop_field, split_words};
use super::mcp::singular;
use super::model::{Edge, EdgeKind, Node, NodeKind};
use crate::core::embedder::{dot, Embed};
use crate::core::text::is_stopword;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::OnceLock;

/// Strength of a concept carried by a word of a node's own name.
pub const NAME_STRENGTH: f32 = 1.0;
/// Strength of a concept carried by a field a node produces, takes or has.
pub const FIELD_STRENGTH: f32 = 0.6;
/// Strength of a source's own concept (its id named in the question) on its nodes.
pub const SOURCE_STRENGTH: f32 = 1.0;
/// Strength of a concept carried by an input field (a filter, not an answer).
pub const INPUT_STRENGTH: f32 = 0.3;
/// Weight of a concept resolved by a bare question word (`who`, `what`, `where`...).
pub const QUESTION_WORD_WEIGHT: f32 = 0.5;
/// Weight of a source resolved by its id in the question.
pub const SOURCE_MENTION_WEIGHT: f32 = 0.6;
/// Question words: a concept they resolve weighs [`QUESTION_WORD_WEIGHT`].
const QUESTION_WORDS: [&str; 6] = ["who", "what", "which", "where", "when", "how"];
/// Factor on a `RESOLVES_TO` edge's weight for a concept carried across it.
pub const RESOLVES_TO_STRENGTH: f32 = 0.6;
/// How much a full concept match adds to a node's similarity.
pub const CONCEPT_WEIGHT: f32 = 0.9;
/// Lowest cosine between a question and a concept for the embedder to resolve it.
pub const EMBED_MIN_COSINE: f32 = 0.6;
/// The most concepts the embedder adds to one question.
pub const MAX_EMBEDDED_CONCEPTS: usize = 3;
/// The weight of the `read` concept a question naming no action is given.
pub const DEFAULT_READ_WEIGHT: f32 = 0.5;
/// The lexicon concept a question naming no action resolves to.
pub const READ: &str = "read";
/// Weight of a concept resolved by a question word that is an enum value of a field.
pub const ENUM_VALUE_WEIGHT: f32 = 0.6;
/// The most field concepts one enum value resolves to.
const MAX_VALUE_CONCEPTS: usize = 3;
/// The longest phrase (in words) a lexicon term may be.
const MAX_TERM_WORDS: usize = 4;

const LEXICON_JSON: &str = include_str!("../../../assets/scg/concepts.json");

/// How a concept was resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Through {
    /// A question word that names a field of a mapped source.
    Source,
    /// The configured embedder.
    Embedder,
    /// A term of the curated lexicon.
    Lexicon,
}

/// One piece of evidence for a resolved concept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConceptVia {
    pub through: Through,
    /// The question's word or phrase (empty for the embedder).
    pub term: String,
    /// The field that named it (source), the cosine (embedder), or the lexicon entry.
    pub detail: String,
}

/// One concept a question resolved to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedConcept {
    /// The concept's id: a lexicon id (`owner`), or `field:<concept>` for a source's own.
    pub concept: String,
    pub label: String,
    /// The resolution's weight in (0, 1].
    pub weight: f32,
    pub via: Vec<ConceptVia>,
    /// Capabilities and entity types carrying it (in every source).
    pub carriers: usize,
}

impl ResolvedConcept {
    /// `owner (lexicon "responsible")`, for people.
    pub fn label(&self) -> String {
        let vias: Vec<String> = self
            .via
            .iter()
            .map(|via| match via.through {
                Through::Source => format!("source {:?} = {}", via.term, via.detail),
                Through::Embedder => format!("embedder {}", via.detail),
                Through::Lexicon => format!("lexicon {:?}", via.term),
            })
            .collect();
        format!("{} ({})", self.concept, vias.join(", "))
    }
}

/// One concept of the curated lexicon, as written in `assets/scg/concepts.json`.
#[derive(Clone, Debug, Deserialize)]
struct LexiconEntry {
    id: String,
    label: String,
    on: String,
    terms: Vec<String>,
    carriers: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
struct LexiconFile {
    concepts: Vec<LexiconEntry>,
}

/// One concept ready for matching.
#[derive(Clone, Debug)]
pub struct Concept {
    pub id: String,
    pub label: String,
    /// Carried by operation names only (verbs).
    pub operations_only: bool,
    /// Terms as normalised word sequences.
    terms: Vec<Vec<String>>,
    /// Carrier spellings, normalised (`due_on` → `due`, words singular, joined by `_`).
    carriers: BTreeSet<String>,
}

/// The curated lexicon.
#[derive(Clone, Debug)]
pub struct Lexicon {
    pub concepts: Vec<Concept>,
}

impl Lexicon {
    /// Parses a lexicon file's text.
    pub fn parse(text: &str) -> Result<Lexicon, serde_json::Error> {
        let file: LexiconFile = serde_json::from_str(text)?;
        let concepts = file
            .concepts
            .into_iter()
            .map(|entry| {
                let mut terms: Vec<Vec<String>> = entry
                    .terms
                    .iter()
                    .map(|term| normalise_words(term))
                    .filter(|words| !words.is_empty() && words.len() <= MAX_TERM_WORDS)
                    .collect();
                terms.sort();
                terms.dedup();
                let carriers = entry
                    .carriers
                    .iter()
                    .flat_map(|carrier| [field_concept(carrier), normalise_words(carrier).join("_")])
                    .filter(|carrier| !carrier.is_empty())
                    .collect();
                Concept { id: entry.id, label: entry.label, operations_only: entry.on == "operations", terms, carriers }
            })
            .collect();
        Ok(Lexicon { concepts })
    }

    /// The concepts a text's lexicon terms resolve to, the longest term at each place
    /// winning: (concept index, the term as it matched), by concept, the first term kept.
    pub fn resolve_terms(&self, text: &str) -> Vec<(usize, String)> {
        let words = normalise_words(text);
        let mut found: BTreeMap<usize, String> = BTreeMap::new();
        let mut at = 0;
        while at < words.len() {
            let best = self
                .concepts
                .iter()
                .enumerate()
                .flat_map(|(concept, entry)| entry.terms.iter().map(move |term| (concept, term)))
                .filter(|(_, term)| words[at..].starts_with(term))
                .max_by_key(|(concept, term)| (term.len(), std::cmp::Reverse(*concept)));
            match best {
                Some((_, term)) => {
                    let len = term.len();
                    for (concept, entry) in self.concepts.iter().enumerate() {
                        if entry.terms.iter().any(|other| other.len() == len && words[at..].starts_with(other)) {
                            found.entry(concept).or_insert_with(|| words[at..at + len].join(" "));
                        }
                    }
                    at += len;
                }
                None => at += 1,
            }
        }
        found.into_iter().collect()
    }

    /// Whether a spelling (a field name, or a word of an operation's name) carries a concept.
    pub fn carried_by(&self, concept: usize, spelling: &str) -> bool {
        let concept = &self.concepts[concept];
        let normalised = field_concept(spelling);
        concept.carriers.contains(&normalised)
            || (!normalised.is_empty() && concept.carriers.contains(&normalise_words(spelling).join("_")))
    }

    /// The lexicon compiled in from `assets/scg/concepts.json`.
    pub fn builtin() -> &'static Lexicon {
        static LEXICON: OnceLock<Lexicon> = OnceLock::new();
        LEXICON.get_or_init(|| Lexicon::parse(LEXICON_JSON).expect("assets/scg/concepts.json is valid (unit test)"))
    }
}

/// The texts the lexicon's concepts are embedded with (label, then terms), in order.
pub fn concept_texts(lexicon: &Lexicon) -> Vec<String> {
    lexicon
        .concepts
        .iter()
        .map(|concept| {
            let terms: Vec<String> = concept.terms.iter().map(|term| term.join(" ")).collect();
            format!("{}: {}", concept.label, terms.join(", "))
        })
        .collect()
}

/// Lower-cased words of a text or a name, camelCase and snake_case split, each in the
/// singular; one-letter words (the `s` of `else's`) are dropped.
pub fn normalise_words(text: &str) -> Vec<String> {
    split_words(text).iter().filter(|word| word.chars().count() > 1).map(|word| singular(word)).collect()
}

/// One carrier of a concept: a seedable node and the field (if any) that carries it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Carrier {
    /// Index of the node in the route index.
    pub node: usize,
    pub strength: f32,
    /// Index of the field node that carries the concept, when not the name.
    pub field: Option<usize>,
    /// The RESOLVES_TO edge the concept came over, when it did.
    pub resolves_to: Option<usize>,
}

/// Concepts and their carriers over one set of mapped sources.
#[derive(Debug, Default)]
pub struct ConceptIndex {
    /// Lexicon concepts first, then the sources' own field concepts.
    concepts: Vec<Concept>,
    /// Per concept, its carriers (best per node), by node index.
    carriers: Vec<Vec<Carrier>>,
    /// Rarity weight per concept.
    idf: Vec<f32>,
    /// First word of a lexicon term → (concept, term words).
    terms: HashMap<String, Vec<(usize, Vec<String>)>>,
    /// A field spelling of the sources → (concept, an example field node).
    fields: HashMap<String, (usize, usize)>,
    /// An enum value of the sources' fields, normalised → (the field's concept, the field node, the value).
    values: HashMap<String, Vec<(usize, usize, String)>>,
    /// The words of capabilities' and entity types' names (an enum value naming one resolves nothing).
    name_words: std::collections::HashSet<String>,
    /// Concept vectors (empty without an embedder).
    vectors: Vec<Vec<f32>>,
    /// Node index → the concepts it carries, strongest first.
    by_node: HashMap<usize, Vec<(usize, f32)>>,
    /// The lexicon's `read` concept, the default action of a question.
    read: Option<usize>,
}

/// What the concept index needs of the route index's graph.
pub struct GraphView<'a> {
    pub nodes: &'a [Node],
    pub edges: &'a [Edge],
    pub incident: &'a [Vec<usize>],
    pub by_id: &'a HashMap<String, usize>,
}

impl ConceptIndex {
    /// Finds every concept's carriers among `graph`'s capabilities and entity types.
    pub fn build(graph: &GraphView<'_>, lexicon: &Lexicon, embedder: Option<&dyn Embed>) -> ConceptIndex {
        let mut concepts = lexicon.concepts.clone();
        // Carrier spelling → lexicon concepts carrying it.
        let mut spelling: HashMap<&str, Vec<usize>> = HashMap::new();
        for (at, concept) in lexicon.concepts.iter().enumerate() {
            for carrier in &concept.carriers {
                spelling.entry(carrier.as_str()).or_default().push(at);
            }
        }
        let mut fields: HashMap<String, (usize, usize)> = HashMap::new();
        let mut values: HashMap<String, Vec<(usize, usize, String)>> = HashMap::new();
        // Lexicon term (words joined by `_`) → lexicon concepts, for enum values.
        let mut term_of: HashMap<String, Vec<usize>> = HashMap::new();
        for (at, concept) in lexicon.concepts.iter().enumerate() {
            for term in &concept.terms {
                term_of.entry(term.join("_")).or_default().push(at);
            }
        }
        let mut field_concepts: Vec<Vec<usize>> = vec![Vec::new(); graph.nodes.len()];
        // Source concepts: a field spelling no lexicon concept carries becomes its own concept.
        let mut own: BTreeMap<String, usize> = BTreeMap::new();
        for (at, node) in graph.nodes.iter().enumerate() {
            if node.kind != NodeKind::Field {
                continue;
            }
            let leaf = node.name.rsplit('.').next().unwrap_or(&node.name);
            let concept = field_concept(leaf);
            if concept.is_empty() || is_stop_field(&concept) {
                continue;
            }
            let mut carried: Vec<usize> = spelling.get(concept.as_str()).cloned().unwrap_or_default();
            for word in normalise_words(leaf) {
                if let Some(more) = spelling.get(word.as_str()) {
                    carried.extend(more.iter().filter(|&&c| !lexicon.concepts[c].operations_only));
                }
            }
            carried.retain(|&c| !lexicon.concepts[c].operations_only);
            let lexicon_primary = spelling
                .get(concept.as_str())
                .and_then(|found| found.iter().copied().find(|&c| !lexicon.concepts[c].operations_only));
            let primary = match lexicon_primary {
                Some(lexicon_concept) => lexicon_concept,
                None => *own.entry(concept.clone()).or_insert_with(|| {
                    concepts.push(Concept {
                        id: format!("field:{concept}"),
                        label: concept.replace('_', " "),
                        operations_only: false,
                        terms: Vec::new(),
                        carriers: [concept.clone()].into(),
                    });
                    concepts.len() - 1
                }),
            };
            carried.push(primary);
            // Enum values: a question word that is one resolves to the field's concept, and a
            // lexicon concept that at least half of the values spell or use as a term (`open`,
            // `closed` → status) is carried by the field too (an `icon` field whose values
            // happen to be `ticket` and `people` carries nothing).
            let mut value_concepts: BTreeMap<usize, usize> = BTreeMap::new();
            for value in &node.values {
                let words = normalise_words(value);
                if words.is_empty() || words.len() > MAX_TERM_WORDS {
                    continue;
                }
                let spelled = words.join("_");
                let mut of_value: BTreeSet<usize> = BTreeSet::new();
                for source in [spelling.get(spelled.as_str()), term_of.get(&spelled)] {
                    of_value.extend(source.into_iter().flatten().filter(|&&c| !lexicon.concepts[c].operations_only));
                }
                for concept in of_value {
                    *value_concepts.entry(concept).or_insert(0) += 1;
                }
                let list = values.entry(spelled).or_default();
                if list.len() < MAX_VALUE_CONCEPTS && !list.iter().any(|(concept, _, _)| *concept == primary) {
                    list.push((primary, at, value.clone()));
                }
            }
            let n_values = node.values.len();
            carried.extend(
                value_concepts
                    .into_iter()
                    .filter(|&(_, count)| 2 * count >= n_values && (count >= 2 || n_values == 1))
                    .map(|(concept, _)| concept),
            );
            carried.sort_unstable();
            carried.dedup();
            fields.entry(concept).or_insert((primary, at));
            field_concepts[at] = carried;
        }
        // Each source is a concept its own id names, carried by all of its nodes.
        let mut source_concepts: BTreeMap<&str, usize> = BTreeMap::new();
        for node in graph.nodes.iter().filter(|node| node.kind == NodeKind::Source) {
            let words = normalise_words(&node.source_id);
            if words.is_empty() || source_concepts.contains_key(node.source_id.as_str()) {
                continue;
            }
            concepts.push(Concept {
                id: format!("source:{}", node.source_id),
                label: format!("source {}", node.source_id),
                operations_only: false,
                terms: vec![words],
                carriers: BTreeSet::new(),
            });
            source_concepts.insert(node.source_id.as_str(), concepts.len() - 1);
        }
        let mut best: Vec<HashMap<usize, Carrier>> = vec![HashMap::new(); concepts.len()];
        let mut offer = |concept: usize, carrier: Carrier| {
            let entry = best[concept].entry(carrier.node).or_insert(carrier);
            if carrier.strength > entry.strength {
                *entry = carrier;
            }
        };
        for (at, node) in graph.nodes.iter().enumerate() {
            if !matches!(node.kind, NodeKind::Capability | NodeKind::EntityType) {
                continue;
            }
            if let Some(&concept) = source_concepts.get(node.source_id.as_str()) {
                offer(concept, Carrier { node: at, strength: SOURCE_STRENGTH, field: None, resolves_to: None });
            }
            let words = normalise_words(&node.name);
            let mut names: BTreeSet<String> = words.iter().cloned().collect();
            names.extend(words.windows(2).map(|pair| pair.join("_")));
            for name in &names {
                let own_concept = own.get(name.as_str());
                for &concept in spelling.get(name.as_str()).into_iter().flatten().chain(own_concept) {
                    if concepts[concept].operations_only && node.kind != NodeKind::Capability {
                        continue;
                    }
                    offer(concept, Carrier { node: at, strength: NAME_STRENGTH, field: None, resolves_to: None });
                }
            }
            for &edge_at in &graph.incident[at] {
                let edge = &graph.edges[edge_at];
                let outbound = graph.by_id.get(&edge.source) == Some(&at);
                let other = graph.by_id[if outbound { &edge.target } else { &edge.source }];
                let strength = match edge.kind {
                    EdgeKind::HasField | EdgeKind::Produces if outbound => FIELD_STRENGTH,
                    EdgeKind::SupportsQuery if outbound => INPUT_STRENGTH,
                    _ => continue,
                };
                for &concept in &field_concepts[other] {
                    offer(concept, Carrier { node: at, strength, field: Some(other), resolves_to: None });
                }
            }
        }
        // Over RESOLVES_TO: a field's concepts reach the entity type owning the joined field,
        // and an entity type's name concepts reach the entity type it resolves to.
        for (edge_at, edge) in graph.edges.iter().enumerate() {
            if edge.kind != EdgeKind::ResolvesTo {
                continue;
            }
            let (Some(&left), Some(&right)) = (graph.by_id.get(&edge.source), graph.by_id.get(&edge.target)) else {
                continue;
            };
            for (from, to) in [(left, right), (right, left)] {
                let (from_node, to_node) = (&graph.nodes[from], &graph.nodes[to]);
                let strength = RESOLVES_TO_STRENGTH * edge.weight;
                if from_node.kind == NodeKind::Field && to_node.kind == NodeKind::Field {
                    let Some(owner) = to_node
                        .owner
                        .as_deref()
                        .and_then(|key| graph.by_id.get(&super::model::node_id(key, NodeKind::EntityType)).copied())
                    else {
                        continue;
                    };
                    for &concept in &field_concepts[from] {
                        offer(concept, Carrier { node: owner, strength, field: Some(to), resolves_to: Some(edge_at) });
                    }
                } else if from_node.kind == NodeKind::EntityType && to_node.kind == NodeKind::EntityType {
                    for word in normalise_words(&from_node.name) {
                        for &concept in spelling.get(word.as_str()).into_iter().flatten() {
                            offer(concept, Carrier { node: to, strength, field: None, resolves_to: Some(edge_at) });
                        }
                    }
                }
            }
        }
        let carriers: Vec<Vec<Carrier>> = best
            .into_iter()
            .map(|by_node| {
                let mut list: Vec<Carrier> = by_node.into_values().collect();
                list.sort_by_key(|carrier| carrier.node);
                list
            })
            .collect();
        let n_nodes = graph
            .nodes
            .iter()
            .filter(|node| matches!(node.kind, NodeKind::Capability | NodeKind::EntityType))
            .count()
            .max(1) as f32;
        let idf = carriers.iter().map(|list| (1.0 + n_nodes / list.len().max(1) as f32).ln()).collect();
        let mut terms: HashMap<String, Vec<(usize, Vec<String>)>> = HashMap::new();
        for (at, concept) in concepts.iter().enumerate() {
            for term in &concept.terms {
                terms.entry(term[0].clone()).or_default().push((at, term.clone()));
            }
        }
        let vectors = match embedder {
            Some(embedder) => embedder.embed_batch(&concept_texts(lexicon)).unwrap_or_default(),
            None => Vec::new(),
        };
        let mut by_node: HashMap<usize, Vec<(usize, f32)>> = HashMap::new();
        for (concept, list) in carriers.iter().enumerate() {
            for carrier in list {
                by_node.entry(carrier.node).or_default().push((concept, carrier.strength));
            }
        }
        for list in by_node.values_mut() {
            list.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        }
        let read = concepts.iter().position(|concept| concept.id == READ);
        let name_words = graph
            .nodes
            .iter()
            .filter(|node| matches!(node.kind, NodeKind::Capability | NodeKind::EntityType))
            .flat_map(|node| normalise_words(&node.name))
            .collect();
        ConceptIndex { concepts, carriers, idf, terms, fields, values, name_words, vectors, by_node, read }
    }

    /// Returns the concept with this index.
    pub fn concept(&self, at: usize) -> &Concept {
        &self.concepts[at]
    }

    /// Returns a concept's carriers.
    pub fn carriers(&self, concept: usize) -> &[Carrier] {
        &self.carriers[concept]
    }

    /// Returns the concepts a node carries, strongest first, as (id, strength).
    pub fn of_node(&self, node: usize) -> Vec<(&str, f32)> {
        self.by_node
            .get(&node)
            .into_iter()
            .flatten()
            .map(|&(concept, strength)| (self.concepts[concept].id.as_str(), strength))
            .collect()
    }

    /// Resolves a question to concepts: (concept index, weight, evidence), by concept index.
    pub fn resolve(
        &self,
        question: &str,
        query_vector: Option<&[f32]>,
        field_names: &dyn Fn(usize) -> String,
    ) -> Resolved {
        let words = normalise_words(question);
        let mut found: BTreeMap<usize, (f32, Vec<ConceptVia>)> = BTreeMap::new();
        let mut add = |concept: usize, weight: f32, via: ConceptVia| {
            if self.carriers[concept].is_empty() {
                return;
            }
            let entry = found.entry(concept).or_insert((0.0, Vec::new()));
            entry.0 = entry.0.max(weight);
            if !entry.1.contains(&via) {
                entry.1.push(via);
            }
        };
        // The lexicon's terms (applied last, matched first): at each place the longest phrase
        // wins, so `in charge` is not also `charge`.
        let mut matches: Vec<(usize, usize, usize)> = Vec::new();
        for start in 0..words.len() {
            for (concept, term) in self.terms.get(&words[start]).into_iter().flatten() {
                if words[start..].starts_with(term) {
                    matches.push((start, term.len(), *concept));
                }
            }
        }
        let longest_over = |at: usize| {
            matches.iter().filter(|(start, len, _)| (*start..start + len).contains(&at)).map(|m| m.1).max().unwrap_or(0)
        };
        let in_phrase: Vec<bool> = (0..words.len()).map(|at| longest_over(at) > 1).collect();
        let in_term: Vec<bool> = (0..words.len()).map(|at| longest_over(at) > 0).collect();
        // 1. The sources' own fields: the question's words and adjacent pairs (not stopwords,
        // not inside a lexicon phrase) that name a field.
        let content = |at: usize| !is_stopword(&words[at]) && !in_phrase[at];
        // Each candidate with whether a lexicon term covers it.
        let mut candidates: Vec<(String, bool)> =
            (0..words.len()).filter(|&at| content(at)).map(|at| (words[at].clone(), in_term[at])).collect();
        candidates.extend(
            (1..words.len())
                .filter(|&at| content(at - 1) && content(at))
                .map(|at| (format!("{}_{}", words[at - 1], words[at]), in_term[at - 1] || in_term[at])),
        );
        for (candidate, known) in &candidates {
            let normalised = field_concept(candidate);
            if let Some(&(concept, field)) = self.fields.get(&normalised).or_else(|| self.fields.get(candidate)) {
                let via = ConceptVia {
                    through: Through::Source,
                    term: candidate.replace('_', " "),
                    detail: field_names(field),
                };
                add(concept, 1.0, via);
                continue;
            }
            // An enum value resolves only a word nothing else knows (a field's name, a lexicon
            // term, a word of an operation's or entity type's name).
            if *known || candidate.split('_').any(|word| self.name_words.contains(word)) {
                continue;
            }
            for (concept, field, value) in self.values.get(candidate).into_iter().flatten() {
                let via = ConceptVia {
                    through: Through::Source,
                    term: candidate.replace('_', " "),
                    detail: format!("{} = {value:?}", field_names(*field)),
                };
                add(*concept, ENUM_VALUE_WEIGHT, via);
            }
        }
        // 2. The embedder.
        if let Some(query_vector) = query_vector {
            let mut scored: Vec<(f32, usize)> = self
                .vectors
                .iter()
                .enumerate()
                .filter(|(_, vector)| vector.len() == query_vector.len())
                .map(|(at, vector)| (dot(query_vector, vector), at))
                .filter(|(cosine, _)| *cosine >= EMBED_MIN_COSINE)
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for (cosine, concept) in scored.into_iter().take(MAX_EMBEDDED_CONCEPTS) {
                let via = ConceptVia {
                    through: Through::Embedder,
                    term: String::new(),
                    detail: format!("cosine {cosine:.2}"),
                };
                add(concept, cosine.min(1.0), via);
            }
        }
        // 3. The lexicon's terms.
        for &(start, len, concept) in &matches {
            if (start..start + len).any(|at| longest_over(at) > len) {
                continue;
            }
            let is_source = self.concepts[concept].id.starts_with("source:");
            let through = if is_source { Through::Source } else { Through::Lexicon };
            let weight = if is_source {
                SOURCE_MENTION_WEIGHT
            } else if len == 1 && QUESTION_WORDS.contains(&words[start].as_str()) {
                QUESTION_WORD_WEIGHT
            } else {
                1.0
            };
            let via = ConceptVia {
                through,
                term: words[start..start + len].join(" "),
                detail: self.concepts[concept].label.clone(),
            };
            add(concept, weight, via);
        }
        // A question naming no action reads (when it names anything at all).
        let acts = found.keys().any(|&concept| self.concepts[concept].operations_only);
        if let (false, false, Some(read)) = (acts, found.is_empty(), self.read) {
            let via = ConceptVia {
                through: Through::Lexicon,
                term: String::new(),
                detail: "a question naming no action reads".into(),
            };
            found.insert(read, (DEFAULT_READ_WEIGHT, vec![via]));
        }
        Resolved { concepts: found.into_iter().map(|(concept, (weight, via))| (concept, weight, via)).collect() }
    }

    /// The sources the question names by their id (their `source:<id>` concepts).
    pub fn named_sources(&self, resolved: &Resolved) -> BTreeSet<String> {
        resolved
            .concepts
            .iter()
            .filter_map(|(concept, _, _)| self.concepts[*concept].id.strip_prefix("source:"))
            .map(str::to_string)
            .collect()
    }

    /// Adds each node's concept score, times [`CONCEPT_WEIGHT`], into `scores` (by node index).
    pub fn score_into(&self, resolved: &Resolved, scores: &mut HashMap<usize, f32>) {
        let total: f32 = resolved.concepts.iter().map(|(concept, weight, _)| weight * self.idf[*concept]).sum();
        if total <= 0.0 {
            return;
        }
        for (concept, weight, _) in &resolved.concepts {
            let share = weight * self.idf[*concept] / total;
            for carrier in &self.carriers[*concept] {
                *scores.entry(carrier.node).or_insert(0.0) += CONCEPT_WEIGHT * share * carrier.strength;
            }
        }
    }

    /// The public form of a resolution.
    pub fn describe(&self, resolved: &Resolved) -> Vec<ResolvedConcept> {
        let mut out: Vec<ResolvedConcept> = resolved
            .concepts
            .iter()
            .map(|(concept, weight, via)| ResolvedConcept {
                concept: self.concepts[*concept].id.clone(),
                label: self.concepts[*concept].label.clone(),
                weight: *weight,
                via: via.clone(),
                carriers: self.carriers[*concept].len(),
            })
            .collect();
        out.sort_by(|a, b| a.concept.cmp(&b.concept));
        out
    }
}

/// One step of a recipe's concept: the operation, and the field, that carry it in one source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConceptStep {
    pub source: String,
    /// The operation's source key.
    pub operation: String,
    /// The field's source key, when a field carries the concept (not the operation's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// The concept a recipe answers, and per source the operation and field that carry it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecipeConcept {
    pub concept: String,
    /// What it answers, for people: `owner of Issue`.
    pub answers: String,
    pub steps: Vec<ConceptStep>,
    /// When the steps span two sources: the RESOLVES_TO edge joining them (`a ~ b (weight)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolves_to: Option<String>,
}

/// A concept a node carries, for observations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeConcept {
    pub concept: String,
    pub strength: f32,
}

/// The concepts one question resolved to: (concept index, weight, evidence).
#[derive(Clone, Debug, Default)]
pub struct Resolved {
    pub concepts: Vec<(usize, f32, Vec<ConceptVia>)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_lexicon_parses_and_every_concept_has_terms_and_carriers() {
        let lexicon = Lexicon::builtin();
        assert!(lexicon.concepts.len() >= 20);
        let mut ids = BTreeSet::new();
        for concept in &lexicon.concepts {
            assert!(ids.insert(concept.id.clone()), "duplicate concept {}", concept.id);
            assert!(!concept.terms.is_empty() && !concept.carriers.is_empty(), "{}", concept.id);
        }
        let owner = lexicon.concepts.iter().find(|concept| concept.id == "owner").unwrap();
        assert!(owner.carriers.contains("assignee") && owner.carriers.contains("maintainer"));
        assert!(owner.terms.contains(&vec!["in".to_string(), "charge".to_string()]));
    }

    #[test]
    fn words_are_normalised_like_field_names() {
        assert_eq!(normalise_words("Who owns the to-do's?"), ["who", "own", "the", "to", "do"]);
        assert_eq!(normalise_words("SupportRepId"), ["support", "rep", "id"]);
    }
}
