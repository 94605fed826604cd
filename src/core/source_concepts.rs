//! Concepts in discovery, for capabilities that came from sources (origin `source:<id>`):
//! the message's words and phrases resolve to concepts of the SCG's curated lexicon
//! (`core::scg::concepts`), and among the ranked hits, a source capability whose name or
//! input fields carry them gains up to [`CONCEPT_BOOST`] of relevance (by the share of the
//! resolved concepts it carries), so `who is responsible for the ticket` raises a tracker
//! operation whose `assignee` field says so. Other capabilities, and a ranking without
//! source capabilities, are left exactly as they were.
//!
//! Only hits retrieval returned are re-ordered; nothing is added to them.

use crate::core::catalog::Catalog;
use crate::core::retrieval::RankedHit;
use crate::core::scg::concepts::{normalise_words, Lexicon, READ};
use std::collections::BTreeMap;

/// The most relevance a source capability carrying every resolved concept gains.
pub const CONCEPT_BOOST: f32 = 0.15;

/// What the message resolved to, and what each source capability gained.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceConcepts {
    /// `concept (lexicon "term")`, by concept id.
    pub resolved: Vec<String>,
    /// Per boosted capability: the relevance it gained and the concepts it carries.
    pub boosted: BTreeMap<String, (f32, Vec<String>)>,
}

/// Raises the source capabilities among `hits` (best first) that carry the concepts
/// `message` resolves to, and sorts the hits again (stable, so ties keep their order).
pub fn apply(message: &str, hits: &mut [RankedHit], catalog: &Catalog) -> SourceConcepts {
    let is_source = |id: &str| catalog.origin(id).starts_with("source:");
    if !hits.iter().any(|hit| is_source(&hit.id)) {
        return SourceConcepts::default();
    }
    let lexicon = Lexicon::builtin();
    let resolved: Vec<(usize, String)> = lexicon
        .resolve_terms(message)
        .into_iter()
        .filter(|(concept, _)| lexicon.concepts[*concept].id != READ)
        .collect();
    if resolved.is_empty() {
        return SourceConcepts::default();
    }
    let mut boosted = BTreeMap::new();
    for hit in hits.iter_mut().filter(|hit| hit.exact.is_none() && is_source(&hit.id)) {
        let Some(descriptor) = catalog.get(&hit.id) else { continue };
        let name = descriptor.id.split_once('#').map_or(descriptor.name.as_str(), |(_, name)| name);
        let words = normalise_words(name);
        let mut spellings: Vec<String> = words.clone();
        spellings.extend(words.windows(2).map(|pair| pair.join("_")));
        let fields = descriptor.parameter_names();
        let carried: Vec<String> = resolved
            .iter()
            .filter(|(concept, _)| {
                spellings.iter().chain(&fields).any(|spelling| lexicon.carried_by(*concept, spelling))
            })
            .map(|(concept, _)| lexicon.concepts[*concept].id.clone())
            .collect();
        if carried.is_empty() {
            continue;
        }
        let gain = CONCEPT_BOOST * carried.len() as f32 / resolved.len() as f32;
        let before = hit.relevance;
        hit.relevance = (hit.relevance + gain).min(1.0);
        boosted.insert(hit.id.clone(), (hit.relevance - before, carried));
    }
    if !boosted.is_empty() {
        hits.sort_by(|a, b| b.relevance.total_cmp(&a.relevance));
    }
    let resolved = resolved
        .into_iter()
        .map(|(concept, term)| format!("{} (lexicon {term:?})", lexicon.concepts[concept].id))
        .collect();
    SourceConcepts { resolved, boosted }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dispatch_rules::Builtin;
    use serde_json::json;

    fn catalog() -> Catalog {
        let mut catalog = Catalog::default();
        let entries = [
            ("tracker#getIssue", "source:tracker", json!({"properties": {"assignee": {}, "title": {}}})),
            ("tracker#getLabel", "source:tracker", json!({"properties": {"name": {}}})),
            ("tool:issue-owner", "manifests", json!({"properties": {"assignee": {}}})),
        ];
        for (id, origin, schema) in entries {
            let mut descriptor = Builtin::Echo.descriptor();
            descriptor.id = id.into();
            descriptor.name = id.rsplit('#').next().unwrap().into();
            descriptor.full_schema = Some(schema.into());
            catalog.descriptors.insert(id.into(), descriptor);
            catalog.origins.insert(id.into(), origin.into());
        }
        catalog
    }

    fn hits(ids: &[(&str, f32)]) -> Vec<RankedHit> {
        ids.iter().map(|(id, relevance)| RankedHit { id: id.to_string(), relevance: *relevance, exact: None }).collect()
    }

    #[test]
    fn a_source_capability_carrying_the_concept_rises_and_others_stay() {
        let catalog = catalog();
        let mut ranked = hits(&[("tracker#getLabel", 0.5), ("tool:issue-owner", 0.45), ("tracker#getIssue", 0.44)]);
        let concepts = apply("who is responsible for this", &mut ranked, &catalog);
        assert!(concepts.resolved.iter().any(|label| label.starts_with("owner (lexicon")), "{concepts:?}");
        assert_eq!(ranked[0].id, "tracker#getIssue", "{ranked:?}");
        let (gain, carried) = &concepts.boosted["tracker#getIssue"];
        assert!(*gain > 0.0 && *gain <= CONCEPT_BOOST + 1e-6 && carried.contains(&"owner".to_string()), "{concepts:?}");
        // A capability not from a source is never touched, even when it carries the concept.
        assert!(!concepts.boosted.contains_key("tool:issue-owner"));
        assert_eq!(ranked.iter().find(|hit| hit.id == "tool:issue-owner").unwrap().relevance, 0.45);
    }

    #[test]
    fn without_source_capabilities_or_concepts_nothing_changes() {
        let catalog = catalog();
        let before = hits(&[("tool:issue-owner", 0.5)]);
        let mut ranked = before.clone();
        assert_eq!(apply("who is responsible for this", &mut ranked, &catalog), SourceConcepts::default());
        assert_eq!(ranked, before);
        let before = hits(&[("tracker#getLabel", 0.5), ("tracker#getIssue", 0.44)]);
        let mut ranked = before.clone();
        assert_eq!(apply("xyzzy plugh", &mut ranked, &catalog), SourceConcepts::default());
        assert_eq!(ranked, before);
    }
}
