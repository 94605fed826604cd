//! The `discover_capabilities` meta-tool and `list_discovered_tools`.
//!
//! Agents get one extra tool for active search when the passive tiers miss
//! something. Its handler runs the same discovery pipeline and answers with the
//! Tier 1 results (relevance in [0, 1]) and `totalIndexed`.
//! `list_discovered_tools` turns a discovery into the tool list a runtime hands
//! its model: the OpenAI-compatible function definitions of the Tier 1 and
//! Tier 2 tools, plus the meta-tool itself, which is always included, and
//! `load_capability_extension` when one of them is loadable (its source is a
//! lazy one not connected now).

use crate::core::catalog::Catalog;
use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind, DefinitionRef};
use crate::core::discovery::DiscoveryResult;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// The meta-tool's function name.
pub const META_TOOL_NAME: &str = "discover_capabilities";

/// Returns the OpenAI-compatible function definition of `discover_capabilities`.
pub fn meta_tool_definition() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": META_TOOL_NAME,
            "description": "Search the capabilities (tools, skills, extensions, channels) available to you \
                            when the ones listed do not cover the task. Returns the most relevant ones with a relevance in [0, 1].",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What you need to do, in plain words"},
                    "kind": {"type": "string", "enum": ["tool", "skill", "extension", "channel", "any"],
                             "description": "Only this kind of capability (default any)"},
                    "category": {"type": "string", "description": "Only this category"}
                },
                "required": ["query"],
                "additionalProperties": false
            }
        }
    })
}

/// The function name of the meta-tool that connects a loadable capability's source.
pub const LOAD_TOOL_NAME: &str = "load_capability_extension";

/// Returns the OpenAI-compatible function definition of `load_capability_extension`
/// (answered by `capdex.v1.sources.load`).
pub fn load_tool_definition() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": LOAD_TOOL_NAME,
            "description": "Start the source of a capability marked loadable (its server is not running yet), \
                            so that it and the other capabilities of its source can be called. \
                            Calling a loadable capability also starts it, so this is only needed to start it ahead.",
            "parameters": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "The capability's id (<source>#<name>) or its source's id"}
                },
                "required": ["id"],
                "additionalProperties": false
            }
        }
    })
}

/// True for a capability of a lazy source that is not connected now.
pub fn is_loadable(descriptor: &CapabilityDescriptor) -> bool {
    matches!(descriptor.definition_ref, DefinitionRef::Source { loadable: true, .. })
}

/// One capability in the meta-tool's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FoundCapability {
    pub id: String,
    pub name: String,
    pub kind: CapabilityKind,
    pub description: String,
    pub category: String,
    pub relevance: f32,
    pub available: bool,
    /// The source it belongs to, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_id: Option<String>,
    /// Its source is not connected now: a call (or `load_capability_extension`) starts it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub loadable: bool,
}

/// The meta-tool's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SearchAnswer {
    pub capabilities: Vec<FoundCapability>,
    pub total_indexed: usize,
    /// `list_discovered_tools` for the same discovery.
    pub tools: Vec<Value>,
}

/// Builds the meta-tool's answer from a discovery over `catalog`.
pub fn search_answer(result: &DiscoveryResult, catalog: &Catalog) -> SearchAnswer {
    let capabilities = result
        .tier1
        .iter()
        .filter_map(|entry| {
            catalog.get(&entry.id).map(|descriptor| FoundCapability {
                id: descriptor.id.clone(),
                name: descriptor.display_name.clone(),
                kind: descriptor.kind,
                description: descriptor.description.clone(),
                category: descriptor.category.clone(),
                relevance: entry.relevance.clamp(0.0, 1.0),
                available: descriptor.available,
                source_id: descriptor.definition_ref.source_id().map(str::to_string),
                loadable: is_loadable(descriptor),
            })
        })
        .collect();
    SearchAnswer { capabilities, total_indexed: catalog.len(), tools: list_discovered_tools(result, catalog) }
}

/// Returns the function definitions of the Tier 1 and Tier 2 tools of
/// `result` (each once, best first), then the meta-tool, then
/// `load_capability_extension` when one of the tools is loadable.
pub fn list_discovered_tools(result: &DiscoveryResult, catalog: &Catalog) -> Vec<Value> {
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let ids = result.tier1.iter().map(|e| e.id.as_str()).chain(result.tier2.iter().map(|e| e.id.as_str()));
    let listed: Vec<&CapabilityDescriptor> = ids
        .filter(|id| seen.insert(id))
        .filter_map(|id| catalog.get(id))
        .filter(|descriptor| descriptor.kind == CapabilityKind::Tool)
        .collect();
    let any_loadable = listed.iter().any(|descriptor| is_loadable(descriptor));
    let mut tools: Vec<Value> = listed.into_iter().map(function_definition).collect();
    tools.push(meta_tool_definition());
    if any_loadable {
        tools.push(load_tool_definition());
    }
    tools
}

/// The OpenAI-compatible function definition of a tool; a tool without an
/// input schema takes an empty object. A source's tool is named by its
/// capability id made a valid function name (`petstore#findPets` →
/// `petstore_findPets`), which `capdex.v1.dispatch` also takes.
pub fn function_definition(descriptor: &CapabilityDescriptor) -> Value {
    let parameters = descriptor
        .full_schema
        .as_ref()
        .map(|schema| schema.value())
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    let name = match descriptor.definition_ref.source_id() {
        Some(_) => crate::core::sources::records::function_name(&descriptor.id),
        None => descriptor.name.clone(),
    };
    json!({
        "type": "function",
        "function": {"name": name, "description": descriptor.description, "parameters": parameters}
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dispatch_rules::Builtin;
    use crate::core::tiers::{Tier1Entry, Tier2Entry};

    #[test]
    fn a_source_tool_is_offered_under_a_valid_function_name() {
        let mut operation = Builtin::Echo.descriptor();
        operation.id = "petstore#GET /pets".into();
        operation.name = "GET /pets".into();
        operation.definition_ref =
            crate::core::descriptor::DefinitionRef::Source { source_id: "petstore".into(), loadable: false };
        assert_eq!(function_definition(&operation)["function"]["name"], "petstore_GET__pets");
        assert_eq!(function_definition(&Builtin::Echo.descriptor())["function"]["name"], "echo");
    }

    fn catalog() -> Catalog {
        let mut catalog = Catalog::default();
        let echo = Builtin::Echo.descriptor();
        let mut skill = echo.clone();
        skill.id = "skill:notes".into();
        skill.kind = CapabilityKind::Skill;
        skill.name = "notes".into();
        for descriptor in [echo, skill] {
            catalog.descriptors.insert(descriptor.id.clone(), descriptor);
        }
        catalog
    }

    fn result() -> DiscoveryResult {
        DiscoveryResult {
            tier1: vec![
                Tier1Entry { id: "skill:notes".into(), relevance: 0.8, summary_text: String::new() },
                Tier1Entry { id: "tool:echo".into(), relevance: 1.2, summary_text: String::new() },
            ],
            tier2: vec![Tier2Entry { id: "tool:echo".into(), full_text: String::new() }],
            ..DiscoveryResult::default()
        }
    }

    #[test]
    fn answer_carries_tier1_with_relevance_and_the_tools() {
        let answer = search_answer(&result(), &catalog());
        assert_eq!(answer.total_indexed, 2);
        assert_eq!(answer.capabilities.len(), 2);
        assert_eq!(answer.capabilities[1].relevance, 1.0, "relevance stays in [0, 1]");
        let names: Vec<&str> = answer.tools.iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, vec!["echo", META_TOOL_NAME], "tools once each, skills left out, the meta-tool last");
        assert_eq!(answer.tools[0]["function"]["parameters"]["required"], json!(["text"]));
    }

    #[test]
    fn a_loadable_tool_brings_the_load_tool_and_says_so() {
        let mut catalog = catalog();
        let mut lazy = Builtin::Echo.descriptor();
        lazy.id = "clock#now".into();
        lazy.name = "now".into();
        lazy.definition_ref = DefinitionRef::Source { source_id: "clock".into(), loadable: true };
        catalog.descriptors.insert(lazy.id.clone(), lazy);
        let mut found = result();
        let answer = search_answer(&found, &catalog);
        assert!(!answer.tools.contains(&load_tool_definition()), "nothing loadable found, no load tool");
        found.tier1.push(Tier1Entry { id: "clock#now".into(), relevance: 0.5, summary_text: String::new() });
        let answer = search_answer(&found, &catalog);
        assert_eq!(answer.tools.last(), Some(&load_tool_definition()));
        let clock = answer.capabilities.iter().find(|c| c.id == "clock#now").unwrap();
        assert_eq!((clock.source_id.as_deref(), clock.loadable), (Some("clock"), true));
        let json = serde_json::to_value(&answer.capabilities[0]).unwrap();
        assert!(json.get("loadable").is_none() && json.get("sourceId").is_none(), "{json}");
    }

    #[test]
    fn the_meta_tool_is_listed_even_when_nothing_is_found() {
        let tools = list_discovered_tools(&DiscoveryResult::default(), &catalog());
        assert_eq!(tools, vec![meta_tool_definition()]);
        let definition = meta_tool_definition();
        assert_eq!(definition["function"]["parameters"]["required"], json!(["query"]));
    }
}
