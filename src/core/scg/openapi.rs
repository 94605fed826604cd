//! Maps an OpenAPI 3.x or Swagger 2 document into a [`SourceGraph`].
//!
//! - one `entity_type` per named schema (`components.schemas` or `definitions`), with
//!   `HAS_FIELD` to every field path the [`Resolver`] finds (composition merged, nesting dotted);
//! - one `capability` per operation (`operationId`, else `METHOD /path`), `exposes`d by the source;
//! - inputs (path-level and operation parameters, the request body's properties, Swagger `in: body`)
//!   become the capability's own fields with `SUPPORTS_QUERY`;
//! - the success response becomes `PRODUCES`: to a named schema's top-level fields when the body is
//!   one (or an array of one, or a one-property envelope around one), else to the capability's own
//!   `response.*` fields;
//! - a one-step recipe per capability and, per entity type, a recipe through its best producer.
//!
//! Security schemes are never read, so no credential enters the graph.

use super::model::{EdgeKind, GraphBuilder, NodeKind, SourceGraph, SourceKind};
use super::schema::{description, Resolver};
use super::MapError;
use serde_json::Value;
use std::collections::BTreeMap;

const METHODS: [&str; 8] = ["get", "put", "post", "delete", "patch", "head", "options", "trace"];

/// Whether a path item's key is an operation's method.
pub fn is_method(key: &str) -> bool {
    METHODS.contains(&key)
}

/// The capability name of an operation: its `operationId`, else `METHOD /path`
/// (`core::sources::tools` names an operation's tool with it too).
pub fn operation_name(method: &str, path: &str, operation: &Value) -> String {
    operation
        .get("operationId")
        .and_then(Value::as_str)
        .filter(|id| !id.trim().is_empty() && !id.contains('#'))
        .map(str::to_string)
        .unwrap_or_else(|| format!("{} {path}", method.to_ascii_uppercase()))
}

/// Checks the document's version: true for Swagger 2, false for OpenAPI 3.x, else a `MapError`
/// (`core::sources::tools` reads documents with the same rule).
pub fn is_swagger2(document: &Value) -> Result<bool, MapError> {
    let version = document
        .get("openapi")
        .or_else(|| document.get("swagger"))
        .and_then(Value::as_str)
        .ok_or_else(|| MapError::NotOpenApi("no `openapi` or `swagger` version string".into()))?;
    let swagger2 = document.get("swagger").is_some();
    if !(version.starts_with('3') || (swagger2 && version.starts_with('2'))) {
        return Err(MapError::NotOpenApi(format!("unsupported version {version:?}")));
    }
    Ok(swagger2)
}

/// Maps a parsed OpenAPI or Swagger document.
pub fn map(source_id: &str, document: &Value) -> Result<SourceGraph, MapError> {
    let is_swagger2 = is_swagger2(document)?;
    let resolver = Resolver::new(document);
    let title = document.pointer("/info/title").and_then(Value::as_str).unwrap_or(source_id);
    let mut builder = GraphBuilder::new(source_id, title);
    let source_node = builder.source_node();

    let schemas = if is_swagger2 { document.get("definitions") } else { document.pointer("/components/schemas") };
    let schemas = schemas.and_then(Value::as_object);
    // Top-level field node ids of each entity type, for PRODUCES.
    let mut entity_fields: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, schema) in schemas.into_iter().flatten() {
        let entity_id = builder.node(name, NodeKind::EntityType, name, &description(schema).unwrap_or_default(), None);
        builder.edge(&source_node, &entity_id, EdgeKind::HasEntity);
        let entity_key = builder.key(name);
        let mut top_level = Vec::new();
        for field in resolver.field_paths(schema) {
            let doc = field_doc(&field.doc, field.refers_to.as_deref());
            let field_id =
                builder.node(&format!("{name}.{}", field.path), NodeKind::Field, &field.path, &doc, Some(&entity_key));
            builder.values(&field_id, &field.values);
            builder.edge(&entity_id, &field_id, EdgeKind::HasField);
            if !field.path.contains('.') {
                top_level.push(field_id);
            }
        }
        entity_fields.insert(name.clone(), top_level);
    }

    // Producers of each entity, to give each entity type a recipe.
    let mut producers: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    let paths = document.get("paths").and_then(Value::as_object);
    for (path, item) in paths.into_iter().flatten() {
        let item = resolver.resolve(item);
        let path_parameters = item.get("parameters").and_then(Value::as_array).cloned().unwrap_or_default();
        for method in METHODS {
            let Some(operation) = item.get(method).filter(|operation| operation.is_object()) else {
                continue;
            };
            let name = operation_name(method, path, operation);
            let summary = description(operation).unwrap_or_default();
            let doc = format!("{summary}\n{} {path}", method.to_ascii_uppercase()).trim().to_string();
            let capability_id = builder.node(&name, NodeKind::Capability, &name, &doc, None);
            let capability_key = builder.key(&name);
            builder.edge(&source_node, &capability_id, EdgeKind::Exposes);
            builder.recipe(&name, vec![capability_key.clone()], &doc);

            let add_input = |builder: &mut GraphBuilder, field: &str, doc: &str, values: &[String]| {
                let field_id =
                    builder.node(&format!("{name}.{field}"), NodeKind::Field, field, doc, Some(&capability_key));
                builder.values(&field_id, values);
                builder.edge(&capability_id, &field_id, EdgeKind::SupportsQuery);
            };
            // Operation parameters override path-level ones with the same name and location.
            let mut parameters: BTreeMap<(String, String), &Value> = BTreeMap::new();
            let operation_parameters = operation.get("parameters").and_then(Value::as_array);
            for parameter in path_parameters.iter().chain(operation_parameters.into_iter().flatten()) {
                let parameter = resolver.resolve(parameter);
                let (Some(param_name), Some(location)) =
                    (parameter.get("name").and_then(Value::as_str), parameter.get("in").and_then(Value::as_str))
                else {
                    continue;
                };
                parameters.insert((location.to_string(), param_name.to_string()), parameter);
            }
            for ((location, param_name), parameter) in &parameters {
                if location == "body" {
                    let body = parameter.get("schema").unwrap_or(&Value::Null);
                    for field in resolver.field_paths(unwrap_envelope(&resolver, body)) {
                        add_input(&mut builder, &field.path, &field.doc, &field.values);
                    }
                } else {
                    // OpenAPI 3 keeps a parameter's enum in its schema, Swagger 2 on the parameter.
                    let values = resolver.enum_values(parameter.get("schema").unwrap_or(parameter));
                    add_input(&mut builder, param_name, &description(parameter).unwrap_or_default(), &values);
                }
            }
            if let Some(body) = operation.get("requestBody") {
                let body = resolver.resolve(body);
                if let Some(schema) = media_schema(body) {
                    for field in resolver.field_paths(unwrap_envelope(&resolver, schema)) {
                        add_input(&mut builder, &field.path, &field.doc, &field.values);
                    }
                }
            }

            if let Some(schema) = success_schema(&resolver, operation, is_swagger2) {
                let inner = unwrap_envelope(&resolver, schema);
                match resolver.ref_name(inner).filter(|entity| entity_fields.contains_key(entity)) {
                    Some(entity) => {
                        for field_id in &entity_fields[&entity] {
                            builder.edge(&capability_id, field_id, EdgeKind::Produces);
                        }
                        let rank = producer_rank(method, path);
                        producers.entry(entity).or_default().push((rank, builder.key(&name)));
                    }
                    None => {
                        for field in resolver.field_paths(resolver.element(inner)) {
                            let field_id = builder.node(
                                &format!("{name}.response.{}", field.path),
                                NodeKind::Field,
                                &field.path,
                                &field.doc,
                                Some(&builder.key(&name)),
                            );
                            builder.values(&field_id, &field.values);
                            builder.edge(&capability_id, &field_id, EdgeKind::Produces);
                        }
                    }
                }
            }
        }
    }
    for (entity, mut candidates) in producers {
        candidates.sort();
        let (_, best) = &candidates[0];
        builder.recipe(&entity, vec![best.clone()], &format!("read {entity}"));
    }
    Ok(builder.finish(SourceKind::Openapi))
}

fn field_doc(doc: &str, refers_to: Option<&str>) -> String {
    match refers_to {
        Some(entity) if doc.is_empty() => format!("a {entity}"),
        Some(entity) => format!("{doc} ({entity})"),
        None => doc.to_string(),
    }
}

/// Ranks an operation as a reader of its entity: GETs first, then fewer path parameters, then shorter paths.
fn producer_rank(method: &str, path: &str) -> u32 {
    let method_rank = if method == "get" { 0 } else { 1000 };
    let n_params = path.matches('{').count() as u32;
    method_rank + n_params * 100 + path.len().min(99) as u32
}

/// Returns the schema of the first JSON-like media type of a request body or response.
fn media_schema(body: &Value) -> Option<&Value> {
    let content = body.get("content")?.as_object()?;
    let preferred = content.iter().find(|(media, _)| media.contains("json")).or_else(|| content.iter().next());
    preferred.and_then(|(_, media)| media.get("schema"))
}

/// Returns the schema of the success response (lowest 2xx, else `default`).
fn success_schema<'a>(resolver: &Resolver<'a>, operation: &'a Value, is_swagger2: bool) -> Option<&'a Value> {
    let responses = operation.get("responses")?.as_object()?;
    let mut codes: Vec<&String> = responses.keys().filter(|code| code.starts_with('2')).collect();
    codes.sort();
    let code = codes.first().copied().or_else(|| responses.keys().find(|code| code.as_str() == "default"))?;
    let response = resolver.resolve(&responses[code]);
    if is_swagger2 {
        response.get("schema")
    } else {
        media_schema(response)
    }
}

/// Looks through `{data: X}`-style envelopes: an object whose only property names a schema or array.
fn unwrap_envelope<'a>(resolver: &Resolver<'a>, schema: &'a Value) -> &'a Value {
    let resolved = resolver.resolve(schema);
    if resolver.ref_name(schema).is_some() {
        return schema;
    }
    let properties = resolver.properties(resolved);
    if let [only] = properties.as_slice() {
        if resolver.ref_name(only.schema).is_some() {
            return only.schema;
        }
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scg::model::node_id;
    use serde_json::json;

    fn edge(graph: &SourceGraph, from: (&str, NodeKind), to: (&str, NodeKind), kind: EdgeKind) -> bool {
        let (source, target) = (node_id(from.0, from.1), node_id(to.0, to.1));
        graph.edges.iter().any(|edge| edge.source == source && edge.target == target && edge.kind == kind)
    }

    fn openapi3() -> Value {
        json!({
            "openapi": "3.0.3", "info": {"title": "Tracker"},
            "components": {
                "schemas": {
                    "Base": {"properties": {"gid": {"type": "string"}}},
                    "Task": {"allOf": [{"$ref": "#/components/schemas/Base"}, {"properties": {
                        "name": {}, "assignee": {"$ref": "#/components/schemas/User"},
                        "meta": {"type": "object", "properties": {"depth": {}}}}}]},
                    "User": {"properties": {"gid": {}, "email": {}}}
                },
                "parameters": {"pretty": {"name": "opt_pretty", "in": "query"}},
                "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}}
            },
            "paths": {"/tasks/{task_gid}": {
                "parameters": [{"name": "task_gid", "in": "path", "required": true}, {"$ref": "#/components/parameters/pretty"}],
                "get": {"operationId": "getTask", "summary": "Get a task",
                    "responses": {"200": {"content": {"application/json": {"schema":
                        {"properties": {"data": {"$ref": "#/components/schemas/Task"}}}}}}}},
                "put": {"operationId": "updateTask",
                    "requestBody": {"content": {"application/json": {"schema": {"properties": {"data": {"$ref": "#/components/schemas/Task"}}}}}},
                    "responses": {"204": {"description": "ok"}}},
                "delete": {"responses": {"200": {"content": {"application/json": {"schema": {"properties": {"deleted": {}, "at": {}}}}}}}}
            }}
        })
    }

    #[test]
    fn openapi3_maps_refs_composition_parameters_bodies_and_responses() {
        let graph = map("t", &openapi3()).unwrap();
        let names: Vec<&str> =
            graph.nodes.iter().filter(|n| n.kind == NodeKind::Field).map(|n| n.source_key.as_str()).collect();
        for key in [
            "t#Task.gid",
            "t#Task.name",
            "t#Task.assignee",
            "t#Task.meta.depth",
            "t#getTask.task_gid",
            "t#getTask.opt_pretty",
            "t#updateTask.name",
        ] {
            assert!(names.contains(&key), "missing {key} in {names:?}");
        }
        assert!(edge(
            &graph,
            ("t#getTask", NodeKind::Capability),
            ("t#Task.assignee", NodeKind::Field),
            EdgeKind::Produces
        ));
        assert!(edge(&graph, ("t", NodeKind::Source), ("t#getTask", NodeKind::Capability), EdgeKind::Exposes));
        assert!(edge(
            &graph,
            ("t#getTask", NodeKind::Capability),
            ("t#getTask.task_gid", NodeKind::Field),
            EdgeKind::SupportsQuery
        ));
        assert!(edge(
            &graph,
            ("t#DELETE /tasks/{task_gid}", NodeKind::Capability),
            ("t#DELETE /tasks/{task_gid}.response.deleted", NodeKind::Field),
            EdgeKind::Produces
        ));
        assert!(graph.recipes.iter().any(|recipe| recipe.source_key == "t#Task" && recipe.steps == ["t#getTask"]));
        let text = serde_json::to_string(&graph).unwrap();
        assert!(!text.contains("bearer"), "security schemes must not enter the graph");
    }

    #[test]
    fn swagger2_body_parameters_and_definitions() {
        let document = json!({"swagger": "2.0", "definitions": {"Pet": {"properties": {"id": {}, "tag": {}}}},
            "paths": {"/pets": {"post": {"operationId": "addPet",
                "parameters": [{"name": "body", "in": "body", "schema": {"$ref": "#/definitions/Pet"}}],
                "responses": {"200": {"schema": {"type": "array", "items": {"$ref": "#/definitions/Pet"}}}}}}}});
        let graph = map("p", &document).unwrap();
        assert!(edge(
            &graph,
            ("p#addPet", NodeKind::Capability),
            ("p#addPet.tag", NodeKind::Field),
            EdgeKind::SupportsQuery
        ));
        assert!(edge(&graph, ("p#addPet", NodeKind::Capability), ("p#Pet.tag", NodeKind::Field), EdgeKind::Produces));
    }

    #[test]
    fn remapping_gives_the_same_ids_and_hash() {
        let first = map("t", &openapi3()).unwrap();
        let second = map("t", &openapi3()).unwrap();
        assert_eq!(first, second);
        let mut changed = openapi3();
        changed["components"]["schemas"]["User"]["properties"]["login"] = json!({});
        assert_ne!(map("t", &changed).unwrap().drift_hash, first.drift_hash);
    }

    #[test]
    fn versions_are_checked() {
        assert!(matches!(map("t", &json!({"openapi": 3})), Err(MapError::NotOpenApi(_))));
        assert!(matches!(map("t", &json!({"swagger": "1.2"})), Err(MapError::NotOpenApi(_))));
        assert!(map("t", &json!({"openapi": "3.1.0"})).is_ok());
    }
}
