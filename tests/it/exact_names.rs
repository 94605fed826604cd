//! Exact-name queries over the real 343-entry AgentOS catalog
//! (`tests/fixtures/catalog/agentos-catalog.json`): a message that is exactly
//! a capability's id, name or display name ranks a capability of that
//! spelling first, every time.

use crate::support::fixture;
use capdex::core::catalog::Catalog;
use capdex::core::descriptor::{CapabilityDescriptor, CapabilityKind, DefinitionRef};
use capdex::core::discovery::DiscoveryFilter;
use capdex::core::embedder::{Embed, HashingEmbedder};
use capdex::core::graph::CapabilityGraph;
use capdex::core::index::VectorIndex;
use capdex::core::lexical::{loose_key, LexicalIndex};
use capdex::core::retrieval::{query_texts, rank, Indexes, Query};
use capdex::core::text::embedding_text;
use serde_json::Value;

fn catalog_entries() -> Vec<CapabilityDescriptor> {
    let path = fixture("catalog/agentos-catalog.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    let entries: Vec<Value> = serde_json::from_str(&text).unwrap();
    entries
        .iter()
        .map(|entry| {
            let text = |key: &str| entry[key].as_str().unwrap_or_default().to_string();
            let list = |key: &str| -> Vec<String> {
                entry[key]
                    .as_array()
                    .map(|items| items.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                    .unwrap_or_default()
            };
            CapabilityDescriptor {
                id: text("id"),
                kind: CapabilityKind::parse(&text("kind")).unwrap(),
                name: text("name"),
                display_name: text("displayName"),
                description: text("description"),
                category: text("category"),
                tags: list("tags"),
                required_secrets: list("requiredSecrets"),
                required_tools: list("requiredTools"),
                available: true,
                has_side_effects: None,
                full_schema: None,
                full_content: entry["skillContent"].as_str().map(str::to_string),
                definition_ref: DefinitionRef::Builtin,
            }
        })
        .collect()
}

#[test]
fn exact_ids_names_and_display_names_rank_first_over_the_real_catalog() {
    let descriptors = catalog_entries();
    assert_eq!(descriptors.len(), 343);
    let embedder = HashingEmbedder::default();
    let mut catalog = Catalog::default();
    let mut vectors = VectorIndex::new(embedder.dimensions());
    for descriptor in &descriptors {
        vectors.upsert(&descriptor.id, &embedder.embed(&embedding_text(descriptor))).unwrap();
        catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
    }
    let lexical = LexicalIndex::build(&descriptors);
    let graph = CapabilityGraph::build(&descriptors, &[]);
    let indexes = Indexes { catalog: &catalog, vectors: &vectors, lexical: &lexical, graph: &graph };
    let top = |message: &str| -> CapabilityDescriptor {
        let texts = query_texts(message);
        let query = Query::new(texts.clone(), embedder.embed_batch(&texts));
        let ranking = rank(&query, &indexes, &DiscoveryFilter::default(), 10, Some(0.15));
        let first = &ranking.hits.first().unwrap_or_else(|| panic!("{message:?} found nothing")).id;
        catalog.get(first).unwrap().clone()
    };
    let mut checked = 0;
    for descriptor in &descriptors {
        assert_eq!(top(&descriptor.id).id, descriptor.id, "query {:?}", descriptor.id);
        // Several entries share a name (an extension and a skill both called `github`): any of them is right.
        let by_name = top(&descriptor.name);
        assert!(
            [&by_name.name, &by_name.display_name]
                .iter()
                .any(|spelling| loose_key(spelling) == loose_key(&descriptor.name)),
            "query {:?} ranked {} first",
            descriptor.name,
            by_name.id
        );
        if !descriptor.display_name.is_empty() {
            let by_display_name = top(&descriptor.display_name);
            assert!(
                [&by_display_name.name, &by_display_name.display_name]
                    .iter()
                    .any(|spelling| loose_key(spelling) == loose_key(&descriptor.display_name)),
                "query {:?} ranked {} first",
                descriptor.display_name,
                by_display_name.id
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 343);
}
