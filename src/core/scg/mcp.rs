//! Maps an MCP `tools/list` result into a [`SourceGraph`].
//!
//! Accepts `{tools: [...]}`, a JSON-RPC reply `{result: {tools: [...]}}`, or a bare array.
//! Each named tool becomes a `capability` `exposes`d by the source; its `inputSchema`
//! properties become its own fields with `SUPPORTS_QUERY`. Its `outputSchema` becomes an
//! `entity_type` named `<Tool>Result` (its `title` when it has one), and every array of
//! objects inside it an entity type named after the property in the singular
//! (`entities` → `Entity`), so MCP sources take part in TypeAligner; the tool `PRODUCES`
//! their top-level fields. Entity types of the same name across tools are merged.

use super::model::{EdgeKind, GraphBuilder, NodeKind, SourceGraph, SourceKind};
use super::schema::{description, Resolver};
use super::MapError;
use serde_json::Value;

/// The tools of a tools/list result: a bare array, `tools`, or `result.tools`
/// (`core::sources::tools` reads them the same way).
pub fn tool_array(document: &Value) -> Result<&Vec<Value>, MapError> {
    let tools = if document.is_array() {
        document
    } else {
        document
            .get("tools")
            .or_else(|| document.pointer("/result/tools"))
            .ok_or_else(|| MapError::NotMcp("no `tools` array".into()))?
    };
    tools.as_array().ok_or_else(|| MapError::NotMcp("`tools` is not an array".into()))
}

/// Maps a parsed tools/list result.
pub fn map(source_id: &str, document: &Value) -> Result<SourceGraph, MapError> {
    let tools = tool_array(document)?;
    let title = document
        .pointer("/initialize/serverInfo/title")
        .or_else(|| document.pointer("/initialize/serverInfo/name"))
        .and_then(Value::as_str)
        .unwrap_or(source_id);
    let mut builder = GraphBuilder::new(source_id, title);
    let source_node = builder.source_node();
    for tool in tools {
        let Some(name) = tool.get("name").and_then(Value::as_str).filter(|name| valid_name(name)) else {
            continue;
        };
        let doc = description(tool).unwrap_or_default();
        let capability_id = builder.node(name, NodeKind::Capability, name, &doc, None);
        let capability_key = builder.key(name);
        builder.edge(&source_node, &capability_id, EdgeKind::Exposes);
        builder.recipe(name, vec![capability_key.clone()], &doc);
        if let Some(input) = tool.get("inputSchema") {
            let resolver = Resolver::new(input);
            for field in resolver.field_paths(input) {
                let field_id = builder.node(
                    &format!("{name}.{}", field.path),
                    NodeKind::Field,
                    &field.path,
                    &field.doc,
                    Some(&capability_key),
                );
                builder.values(&field_id, &field.values);
                builder.edge(&capability_id, &field_id, EdgeKind::SupportsQuery);
            }
        }
        if let Some(output) = tool.get("outputSchema") {
            let resolver = Resolver::new(output);
            let entity_name = output
                .get("title")
                .and_then(Value::as_str)
                .filter(|title| valid_name(title))
                .map(str::to_string)
                .unwrap_or_else(|| format!("{}Result", pascal(name)));
            add_entity(&mut builder, &resolver, &source_node, &capability_id, &entity_name, output, 0);
        }
    }
    Ok(builder.finish(SourceKind::Mcp))
}

const MAX_ENTITY_DEPTH: usize = 3;

fn add_entity(
    builder: &mut GraphBuilder,
    resolver: &Resolver<'_>,
    source_node: &str,
    capability_id: &str,
    entity_name: &str,
    schema: &Value,
    depth: usize,
) {
    let properties = resolver.properties(schema);
    if properties.is_empty() || depth > MAX_ENTITY_DEPTH {
        return;
    }
    let entity_id =
        builder.node(entity_name, NodeKind::EntityType, entity_name, &description(schema).unwrap_or_default(), None);
    let entity_key = builder.key(entity_name);
    builder.edge(source_node, &entity_id, EdgeKind::HasEntity);
    for property in properties {
        let field_id = builder.node(
            &format!("{entity_name}.{}", property.name),
            NodeKind::Field,
            &property.name,
            &property.doc,
            Some(&entity_key),
        );
        builder.values(&field_id, &resolver.enum_values(property.schema));
        builder.edge(&entity_id, &field_id, EdgeKind::HasField);
        builder.edge(capability_id, &field_id, EdgeKind::Produces);
        let resolved = resolver.resolve(property.schema);
        if let Some(items) = resolved.get("items") {
            let element = resolver.resolve(items);
            if !resolver.properties(element).is_empty() {
                let element_name = pascal(&singular(&property.name));
                add_entity(builder, resolver, source_node, capability_id, &element_name, element, depth + 1);
            }
        }
    }
}

/// A tool name the mapper keeps (others are skipped).
pub fn valid_name(name: &str) -> bool {
    !name.trim().is_empty() && name.len() <= 256 && !name.contains('#')
}

/// Returns `create_entities` as `CreateEntities`.
fn pascal(name: &str) -> String {
    name.split(|c: char| !c.is_alphanumeric())
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map(|first| first.to_uppercase().chain(chars).collect::<String>()).unwrap_or_default()
        })
        .collect()
}

/// Returns a plural English noun in the singular (`entities` → `entity`, `relations` → `relation`).
pub fn singular(word: &str) -> String {
    if let Some(stem) = word.strip_suffix("ies").filter(|stem| stem.len() >= 2) {
        return format!("{stem}y");
    }
    for suffix in ["sses", "shes", "ches", "xes"] {
        if word.ends_with(suffix) {
            return word[..word.len() - 2].to_string();
        }
    }
    match word.strip_suffix('s') {
        Some(stem) if stem.len() >= 2 && !stem.ends_with('s') && !stem.ends_with('u') && !stem.ends_with('i') => {
            stem.to_string()
        }
        _ => word.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tools_become_capabilities_with_inputs_and_output_entities() {
        let document = json!({"tools": [
            {"name": "create_entities", "description": "Create entities",
             "inputSchema": {"type": "object", "properties": {"entities": {"type": "array", "items": {"type": "object",
                 "properties": {"name": {}, "entityType": {}}}}}},
             "outputSchema": {"type": "object", "properties": {"entities": {"type": "array", "items": {"type": "object",
                 "properties": {"name": {}, "entityType": {}, "observations": {}}}}}}},
            {"name": "bad#name"},
            {"description": "no name"}
        ]});
        let graph = map("mem", &document).unwrap();
        let keys: Vec<&str> = graph.nodes.iter().map(|node| node.source_key.as_str()).collect();
        for key in [
            "mem#create_entities",
            "mem#create_entities.entities.name",
            "mem#CreateEntitiesResult",
            "mem#Entity.entityType",
        ] {
            assert!(keys.contains(&key), "missing {key} in {keys:?}");
        }
        assert_eq!(graph.count_nodes(NodeKind::Capability), 1);
        assert_eq!(graph.count_nodes(NodeKind::EntityType), 2);
        assert!(graph.count_edges(EdgeKind::Produces) >= 4);
    }

    #[test]
    fn shapes_are_checked() {
        assert!(map("m", &json!({"result": {"tools": []}})).is_ok());
        assert!(map("m", &json!([])).is_ok());
        assert!(matches!(map("m", &json!({"tools": {}})), Err(MapError::NotMcp(_))));
        assert!(matches!(map("m", &json!({})), Err(MapError::NotMcp(_))));
    }

    #[test]
    fn singulars() {
        for (plural, one) in [
            ("entities", "entity"),
            ("relations", "relation"),
            ("boxes", "box"),
            ("status", "status"),
            ("class", "class"),
            ("s", "s"),
        ] {
            assert_eq!(singular(plural), one);
        }
    }
}
