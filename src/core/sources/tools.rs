//! The tools a source text offers ([`tools_of`]): one [`SourceTool`] per
//! capability node the SCG mapper makes of the same text, under the same name
//! (the MCP tool name; the OpenAPI `operationId`, else `METHOD /path`;
//! `select_<table>` for SQL), so discovery, the SCG and dispatch share one id.
//!
//! - MCP: the tool's `inputSchema` as given, called with `tools/call`.
//! - OpenAPI 3.x and Swagger 2: an input schema of the path-level and
//!   operation parameters (path, query, header; cookies are skipped) and the
//!   JSON request body (its object properties, else one `body` property), with
//!   local `$ref`s inlined through [`Resolver`] (its hop limit, cycles cut,
//!   [`MAX_COMPOSITION_DEPTH`] levels, at most [`MAX_INLINED_VALUES`] values a
//!   tool); called as [`HttpOperation`] on `servers[0].url` (Swagger:
//!   `schemes`/`host`/`basePath`).
//! - SQL: `select_<table>` with every column an optional filter; never called.
//!
//! Hostile input gives a [`MapError`], never a panic.

use super::{HttpOperation, Invocation, OperationParam, ParamLocation, SourceTool};
use crate::core::limits::{Limit, Limits};
use crate::core::scg::model::SourceKind;
use crate::core::scg::schema::{description, Resolver, MAX_COMPOSITION_DEPTH};
use crate::core::scg::{
    check_counts, check_refs, mcp, openapi, parse_document_limited, sql, MapError, MAX_SOURCE_BYTES,
};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// The most JSON values one tool's inlined input schema may hold; deeper or
/// wider parts become `{}` (any value).
pub const MAX_INLINED_VALUES: usize = 20_000;

const METHODS: [&str; 8] = ["get", "put", "post", "delete", "patch", "head", "options", "trace"];

/// Returns the tools `text` (a source of `kind`) offers, in the mapper's order, one per name.
pub fn tools_of(kind: SourceKind, text: &str) -> Result<Vec<SourceTool>, MapError> {
    tools_of_limited(kind, text, &Limits::default())
}

/// [`tools_of`] within `limits`: nesting, YAML aliases, tools per source, operations per spec.
pub fn tools_of_limited(kind: SourceKind, text: &str, limits: &Limits) -> Result<Vec<SourceTool>, MapError> {
    if text.len() > MAX_SOURCE_BYTES {
        return Err(MapError::TooLarge { size: text.len(), max: MAX_SOURCE_BYTES });
    }
    let document = || -> Result<Value, MapError> {
        let document = parse_document_limited(text, limits)?;
        check_counts(kind, &document, limits)?;
        check_refs(&document, limits)?;
        Ok(document)
    };
    let mut tools = match kind {
        SourceKind::Mcp => mcp_tools(&document()?)?,
        SourceKind::Openapi => openapi_tools(&document()?)?,
        SourceKind::Sql => {
            let tools = sql_tools(text)?;
            crate::core::limits::check(Limit::ToolsPerSource, tools.len(), limits.max_tools_per_source)
                .map_err(MapError::Limit)?;
            tools
        }
    };
    // The mapper keeps the first node of a name; so do we.
    let mut seen = BTreeSet::new();
    tools.retain(|tool| seen.insert(tool.name.clone()));
    Ok(tools)
}

fn mcp_tools(document: &Value) -> Result<Vec<SourceTool>, MapError> {
    let tools = mcp::tool_array(document)?;
    let mut out = Vec::with_capacity(tools.len());
    for tool in tools {
        let Some(name) = tool.get("name").and_then(Value::as_str).filter(|name| mcp::valid_name(name)) else {
            continue;
        };
        let title = tool
            .get("title")
            .or_else(|| tool.pointer("/annotations/title"))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|title| !title.is_empty())
            .map(str::to_string);
        let input_schema = match tool.get("inputSchema") {
            Some(schema @ Value::Object(_)) => schema.clone(),
            _ => json!({"type": "object"}),
        };
        out.push(SourceTool {
            name: name.to_string(),
            title,
            description: tool.get("description").and_then(Value::as_str).unwrap_or_default().trim().to_string(),
            input_schema,
            output_schema: tool.get("outputSchema").filter(|schema| schema.is_object()).cloned(),
            invocation: Invocation::Mcp { tool: name.to_string() },
        });
    }
    Ok(out)
}

/// Returns the MCP `tools/list` document (`{tools: [...]}`) of known tools, which
/// the SCG's MCP mapper reads and [`tools_of`] reads back under the same names.
pub fn mcp_document(tools: &[SourceTool]) -> Value {
    let tools: Vec<Value> = tools
        .iter()
        .map(|tool| {
            let mut entry =
                json!({"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema});
            if let Some(title) = &tool.title {
                entry["title"] = json!(title);
            }
            if let Some(output) = &tool.output_schema {
                entry["outputSchema"] = output.clone();
            }
            entry
        })
        .collect();
    json!({"tools": tools})
}

fn sql_tools(text: &str) -> Result<Vec<SourceTool>, MapError> {
    let tables = sql::parse_tables(text)?;
    Ok(tables
        .iter()
        .map(|table| {
            let mut properties = Map::new();
            for column in &table.columns {
                let mut doc = column.data_type.clone();
                if table.primary_key.contains(&column.name) {
                    doc.push_str(", primary key");
                }
                properties.insert(column.name.clone(), json!({"description": doc.trim()}));
            }
            let columns: Vec<&str> = table.columns.iter().map(|column| column.name.as_str()).collect();
            SourceTool {
                name: format!("select_{}", table.name),
                title: None,
                description: format!(
                    "Select rows from table {} filtered on any of its columns: {}",
                    table.name,
                    columns.join(", ")
                ),
                input_schema: json!({"type": "object", "properties": properties}),
                output_schema: None,
                invocation: Invocation::NotCallable,
            }
        })
        .collect())
}

fn openapi_tools(document: &Value) -> Result<Vec<SourceTool>, MapError> {
    let is_swagger2 = openapi::is_swagger2(document)?;
    let resolver = Resolver::new(document);
    let base_url = if is_swagger2 { swagger_base_url(document) } else { server_url(document) };
    let mut out = Vec::new();
    let paths = document.get("paths").and_then(Value::as_object);
    for (path, item) in paths.into_iter().flatten() {
        let item = resolver.resolve(item);
        let path_parameters = item.get("parameters").and_then(Value::as_array).cloned().unwrap_or_default();
        for method in METHODS {
            let Some(operation) = item.get(method).filter(|operation| operation.is_object()) else {
                continue;
            };
            let name = openapi::operation_name(method, path, operation);
            let mut inliner = Inliner::new(resolver);
            let mut properties = Map::new();
            let mut required: Vec<String> = Vec::new();
            let mut params: Vec<OperationParam> = Vec::new();
            let mut body: Option<(Value, bool)> = None;
            // Operation parameters override path-level ones with the same name and location.
            let mut parameters: Vec<(String, String, &Value)> = Vec::new();
            let operation_parameters = operation.get("parameters").and_then(Value::as_array);
            for parameter in path_parameters.iter().chain(operation_parameters.into_iter().flatten()) {
                let parameter = resolver.resolve(parameter);
                let (Some(param_name), Some(location)) =
                    (parameter.get("name").and_then(Value::as_str), parameter.get("in").and_then(Value::as_str))
                else {
                    continue;
                };
                parameters.retain(|(held_location, held_name, _)| {
                    (held_location, held_name) != (&location.to_string(), &param_name.to_string())
                });
                parameters.push((location.to_string(), param_name.to_string(), parameter));
            }
            for (location, param_name, parameter) in &parameters {
                let location = match location.as_str() {
                    "path" => ParamLocation::Path,
                    "query" => ParamLocation::Query,
                    "header" => ParamLocation::Header,
                    "body" => {
                        let schema = parameter.get("schema").unwrap_or(&Value::Null);
                        let is_required = parameter.get("required").and_then(Value::as_bool).unwrap_or(false);
                        body = Some((inliner.inline(schema), is_required));
                        continue;
                    }
                    _ => continue,
                };
                let is_required = location == ParamLocation::Path
                    || parameter.get("required").and_then(Value::as_bool).unwrap_or(false);
                if properties.contains_key(param_name) {
                    continue;
                }
                properties.insert(param_name.clone(), parameter_schema(&mut inliner, parameter));
                if is_required {
                    required.push(param_name.clone());
                }
                params.push(OperationParam { name: param_name.clone(), location, required: is_required });
            }
            if let Some(request_body) = operation.get("requestBody") {
                let request_body = resolver.resolve(request_body);
                if let Some(schema) = json_media_schema(request_body) {
                    let is_required = request_body.get("required").and_then(Value::as_bool).unwrap_or(false);
                    body = Some((inliner.inline(schema), is_required));
                }
            }
            let json_body = body.is_some();
            if let Some((schema, body_required)) = body {
                add_body(&mut properties, &mut required, schema, body_required);
            }
            let mut input_schema = json!({"type": "object", "properties": properties});
            if !required.is_empty() {
                input_schema["required"] = json!(required);
            }
            let summary = operation.get("summary").and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty());
            let description = description(operation).unwrap_or_default();
            out.push(SourceTool {
                name,
                title: summary.map(str::to_string),
                description: if description.is_empty() {
                    format!("{} {path}", method.to_ascii_uppercase())
                } else {
                    description
                },
                input_schema,
                output_schema: None,
                invocation: Invocation::Http(HttpOperation {
                    method: method.to_ascii_uppercase(),
                    base_url: base_url.clone(),
                    path: path.clone(),
                    params,
                    json_body,
                }),
            });
        }
    }
    Ok(out)
}

/// Merges a JSON body into the arguments: an object's properties (those no
/// parameter took), else one `body` property.
fn add_body(properties: &mut Map<String, Value>, required: &mut Vec<String>, schema: Value, body_required: bool) {
    let body_properties = schema.get("properties").and_then(Value::as_object);
    match body_properties {
        Some(body_properties) => {
            let body_required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|names| names.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for (name, property) in body_properties {
                if properties.contains_key(name) {
                    continue;
                }
                properties.insert(name.clone(), property.clone());
                if body_required.contains(&name.as_str()) {
                    required.push(name.clone());
                }
            }
        }
        None if !properties.contains_key("body") => {
            properties.insert("body".into(), schema);
            if body_required {
                required.push("body".into());
            }
        }
        None => {}
    }
}

/// A parameter's schema: OpenAPI 3's `schema`, or Swagger 2's inline type keys; with its description.
fn parameter_schema<'a>(inliner: &mut Inliner<'a>, parameter: &'a Value) -> Value {
    let mut schema = match parameter.get("schema") {
        Some(schema) => inliner.inline(schema),
        None => {
            let mut inline = Map::new();
            for key in ["type", "format", "items", "enum", "default", "minimum", "maximum", "pattern"] {
                if let Some(value) = parameter.get(key) {
                    inline.insert(key.to_string(), inliner.inline(value));
                }
            }
            Value::Object(inline)
        }
    };
    if let (Some(doc), Some(object)) = (parameter.get("description").and_then(Value::as_str), schema.as_object_mut()) {
        object.entry("description").or_insert_with(|| json!(doc));
    }
    schema
}

/// The schema of the first JSON media type of a request body.
fn json_media_schema(body: &Value) -> Option<&Value> {
    let content = body.get("content")?.as_object()?;
    content.iter().find(|(media, _)| media.contains("json")).and_then(|(_, media)| media.get("schema"))
}

/// `servers[0].url` with its variables at their defaults; empty when there is none.
fn server_url(document: &Value) -> String {
    let Some(server) = document.pointer("/servers/0") else { return String::new() };
    let mut url = server.get("url").and_then(Value::as_str).unwrap_or_default().to_string();
    if let Some(variables) = server.get("variables").and_then(Value::as_object) {
        for (name, variable) in variables {
            if let Some(default) = variable.get("default").and_then(Value::as_str) {
                url = url.replace(&format!("{{{name}}}"), default);
            }
        }
    }
    url
}

/// Swagger 2's `schemes[0]://host basePath`; only `basePath` without a host.
fn swagger_base_url(document: &Value) -> String {
    let base_path = document.get("basePath").and_then(Value::as_str).unwrap_or_default();
    match document.get("host").and_then(Value::as_str) {
        Some(host) if !host.is_empty() => {
            let scheme = document.pointer("/schemes/0").and_then(Value::as_str).unwrap_or("https");
            format!("{scheme}://{host}{base_path}")
        }
        _ => base_path.to_string(),
    }
}

/// Inlines local `$ref`s so a schema stands alone (Tier 2, argument validation).
struct Inliner<'a> {
    resolver: Resolver<'a>,
    /// Values left to emit for this tool.
    budget: usize,
}

impl<'a> Inliner<'a> {
    fn new(resolver: Resolver<'a>) -> Inliner<'a> {
        Inliner { resolver, budget: MAX_INLINED_VALUES }
    }

    fn inline(&mut self, schema: &'a Value) -> Value {
        let mut on_path = Vec::new();
        self.walk(schema, 0, &mut on_path).unwrap_or_else(|| json!({}))
    }

    /// Returns the value with its references inlined; past the limits an
    /// object becomes `{}` (any value) and an array is left out (`None`), so
    /// a cut only ever loosens the schema.
    fn walk(&mut self, value: &'a Value, depth: usize, on_path: &mut Vec<String>) -> Option<Value> {
        let exhausted = self.budget == 0 || depth > MAX_COMPOSITION_DEPTH;
        match value {
            Value::Object(_) if exhausted => Some(json!({})),
            Value::Array(_) if exhausted => None,
            Value::Object(object) => {
                self.budget -= 1;
                if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
                    if on_path.iter().any(|held| held == reference) {
                        // A cycle: the recursion stops at any value.
                        return Some(json!({}));
                    }
                    let target = self.resolver.resolve(value);
                    if !target.is_object() {
                        return Some(json!({}));
                    }
                    on_path.push(reference.to_string());
                    let inlined = self.walk(target, depth + 1, on_path);
                    on_path.pop();
                    return inlined;
                }
                let mut out = Map::new();
                for (key, child) in object {
                    // Examples may carry record values; they stay out, as in the SCG.
                    if matches!(key.as_str(), "example" | "examples" | "xml") {
                        continue;
                    }
                    if let Some(inlined) = self.walk(child, depth + 1, on_path) {
                        out.insert(key.clone(), inlined);
                    }
                }
                Some(Value::Object(out))
            }
            Value::Array(items) => {
                self.budget -= 1;
                Some(Value::Array(items.iter().filter_map(|item| self.walk(item, depth + 1, on_path)).collect()))
            }
            other => Some(other.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scg::map_source;
    use crate::core::scg::model::NodeKind;
    use proptest::prelude::*;

    /// The capability source keys the mapper makes of `text`, and the ids of `tools_of`.
    fn check_same_ids(kind: SourceKind, text: &str) {
        let graph = map_source("s", Some(kind), text).unwrap();
        let mapped: BTreeSet<String> = graph
            .nodes
            .iter()
            .filter(|node| node.kind == NodeKind::Capability)
            .map(|node| node.source_key.clone())
            .collect();
        let tools: BTreeSet<String> =
            tools_of(kind, text).unwrap().iter().map(|tool| super::super::capability_id("s", &tool.name)).collect();
        assert_eq!(mapped, tools);
    }

    const PETS: &str = r##"{"openapi": "3.0.3", "servers": [{"url": "https://{env}.pets.example/v1", "variables": {"env": {"default": "api"}}}],
      "components": {"schemas": {"Pet": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "owner": {"$ref": "#/components/schemas/Owner"}}},
        "Owner": {"type": "object", "properties": {"pets": {"type": "array", "items": {"$ref": "#/components/schemas/Pet"}}}}},
        "parameters": {"trace": {"name": "X-Trace", "in": "header"}}},
      "paths": {"/pets/{petId}": {
        "parameters": [{"name": "petId", "in": "path", "required": true, "schema": {"type": "integer"}}, {"$ref": "#/components/parameters/trace"}],
        "get": {"operationId": "showPet", "summary": "Show a pet", "parameters": [{"name": "session", "in": "cookie"}, {"name": "full", "in": "query", "schema": {"type": "boolean"}}]},
        "put": {"requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Pet"}}}}},
        "post": {"operationId": "tagPet", "requestBody": {"content": {"application/json": {"schema": {"type": "array", "items": {"type": "string"}}}}}}
      }}}"##;

    /// The tools of a document whose `$ref` chain is one hop over the limit
    /// are refused, naming the setting; at the limit they are listed.
    #[test]
    fn a_ref_chain_one_hop_over_its_limit_is_refused() {
        let limits = Limits { max_ref_hops: 2, ..Limits::default() };
        let list = |hops: usize| {
            let mut schemas = serde_json::Map::new();
            for i in 0..hops - 1 {
                schemas.insert(format!("S{i}"), json!({"$ref": format!("#/components/schemas/S{}", i + 1)}));
            }
            schemas.insert(format!("S{}", hops - 1), json!({"type": "object"}));
            json!({"tools": [{"name": "t", "description": "t", "inputSchema": {"$ref": "#/components/schemas/S0"}}],
                "components": {"schemas": schemas}})
            .to_string()
        };
        assert_eq!(tools_of_limited(SourceKind::Mcp, &list(2), &limits).unwrap().len(), 1);
        let over = tools_of_limited(SourceKind::Mcp, &list(3), &limits).unwrap_err();
        assert_eq!(over.code(), "ref_chain_too_long");
        assert!(over.to_string().contains("limits.max_ref_hops"), "{over}");
    }

    #[test]
    fn a_source_over_its_tool_limit_offers_none() {
        let limits = Limits { max_tools_per_source: 1, ..Limits::default() };
        let list = r#"{"tools": [{"name": "a"}, {"name": "b"}]}"#;
        assert_eq!(tools_of_limited(SourceKind::Mcp, list, &limits).unwrap_err().code(), "too_many_tools");
        let one = r#"{"tools": [{"name": "a"}]}"#;
        assert_eq!(tools_of_limited(SourceKind::Mcp, one, &limits).unwrap().len(), 1);
        let sql = "CREATE TABLE a (x INT);\nCREATE TABLE b (y INT);";
        assert!(tools_of_limited(SourceKind::Sql, sql, &limits).is_err_and(|err| err.code() == "too_many_tools"));
    }

    #[test]
    fn openapi_operations_take_parameters_and_bodies_with_refs_inlined() {
        let tools = tools_of(SourceKind::Openapi, PETS).unwrap();
        let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_str()).collect();
        assert_eq!(names, ["showPet", "PUT /pets/{petId}", "tagPet"]);
        let show = &tools[0];
        assert_eq!(show.title.as_deref(), Some("Show a pet"));
        assert_eq!(show.input_schema["required"], json!(["petId"]));
        let properties = show.input_schema["properties"].as_object().unwrap();
        assert_eq!(properties.keys().collect::<Vec<_>>(), ["petId", "X-Trace", "full"], "cookies are skipped");
        match &show.invocation {
            Invocation::Http(operation) => {
                assert_eq!(operation.base_url, "https://api.pets.example/v1");
                assert_eq!(
                    (operation.method.as_str(), operation.path.as_str(), operation.json_body),
                    ("GET", "/pets/{petId}", false)
                );
                let locations: Vec<_> =
                    operation.params.iter().map(|p| (p.name.as_str(), p.location, p.required)).collect();
                assert_eq!(
                    locations,
                    [
                        ("petId", ParamLocation::Path, true),
                        ("X-Trace", ParamLocation::Header, false),
                        ("full", ParamLocation::Query, false)
                    ]
                );
            }
            other => panic!("{other:?}"),
        }
        let put = &tools[1];
        assert_eq!(put.input_schema["required"], json!(["petId", "name"]));
        let owner = &put.input_schema["properties"]["owner"];
        assert_eq!(put.input_schema["properties"]["name"], json!({"type": "string"}));
        assert_eq!(owner["properties"]["pets"]["type"], "array", "Owner is inlined");
        assert_eq!(owner["properties"]["pets"]["items"], json!({}), "the cycle back to Pet is cut");
        assert!(!put.input_schema.to_string().contains("$ref"));
        assert!(matches!(&put.invocation, Invocation::Http(operation) if operation.json_body));
        let tag = &tools[2];
        assert_eq!(tag.input_schema["properties"]["body"]["type"], "array");
        assert!(jsonschema::validator_for(&put.input_schema).is_ok());
        check_same_ids(SourceKind::Openapi, PETS);
    }

    #[test]
    fn swagger2_bases_and_body_parameters() {
        let yaml = "swagger: '2.0'\nhost: pets.example\nbasePath: /v2\nschemes: [http]\npaths:\n  /pets:\n    post:\n      operationId: addPet\n      parameters:\n        - {name: body, in: body, required: true, schema: {type: object, required: [name], properties: {name: {type: string}}}}\n        - {name: limit, in: query, type: integer}\n";
        let tools = tools_of(SourceKind::Openapi, yaml).unwrap();
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].input_schema["required"], json!(["name"]));
        assert_eq!(tools[0].input_schema["properties"]["limit"], json!({"type": "integer"}));
        match &tools[0].invocation {
            Invocation::Http(operation) => assert_eq!(operation.base_url, "http://pets.example/v2"),
            other => panic!("{other:?}"),
        }
        check_same_ids(SourceKind::Openapi, yaml);
    }

    #[test]
    fn mcp_tools_keep_their_schema_and_sql_tables_are_not_callable() {
        let mcp = r#"{"tools": [{"name": "get_time", "title": "Time", "description": "Now", "inputSchema": {"type": "object", "properties": {"tz": {"type": "string"}}}},
            {"name": "get_time"}, {"name": "bad#name"}, {"name": "bare"}]}"#;
        let tools = tools_of(SourceKind::Mcp, mcp).unwrap();
        assert_eq!(tools.iter().map(|tool| tool.name.as_str()).collect::<Vec<_>>(), ["get_time", "bare"]);
        assert_eq!(tools[0].input_schema["properties"]["tz"]["type"], "string");
        assert_eq!(tools[1].input_schema, json!({"type": "object"}));
        assert_eq!(tools[0].invocation, Invocation::Mcp { tool: "get_time".into() });
        check_same_ids(SourceKind::Mcp, mcp);
        let ddl = "CREATE TABLE album (id INTEGER PRIMARY KEY, title TEXT NOT NULL);";
        let tables = tools_of(SourceKind::Sql, ddl).unwrap();
        assert_eq!(tables[0].name, "select_album");
        assert_eq!(tables[0].invocation, Invocation::NotCallable);
        assert!(tables[0].input_schema.get("required").is_none(), "every column is an optional filter");
        assert_eq!(tables[0].input_schema["properties"]["id"]["description"], "INTEGER, primary key");
        check_same_ids(SourceKind::Sql, ddl);
    }

    #[test]
    fn known_tools_round_trip_through_their_mcp_document() {
        let known = tools_of(SourceKind::Openapi, PETS).unwrap();
        let text = mcp_document(&known).to_string();
        let read = tools_of(SourceKind::Mcp, &text).unwrap();
        assert_eq!(read.iter().map(|t| &t.name).collect::<Vec<_>>(), known.iter().map(|t| &t.name).collect::<Vec<_>>());
        assert_eq!(read[0].input_schema, known[0].input_schema);
        assert_eq!(read[0].title, known[0].title);
        check_same_ids(SourceKind::Mcp, &text);
    }

    #[test]
    fn cuts_at_the_limits_only_loosen_the_schema() {
        let mut schema = json!({"type": "object", "required": ["leaf"], "properties": {"leaf": {"enum": ["a", "b"]}}});
        for _ in 0..(MAX_COMPOSITION_DEPTH + 4) {
            schema = json!({"type": "object", "required": ["inner"], "properties": {"inner": schema}});
        }
        let inlined = Inliner::new(Resolver::new(&Value::Null)).inline(&schema);
        assert!(jsonschema::validator_for(&inlined).is_ok(), "{inlined}");
        assert_eq!(inlined["required"], json!(["inner"]));
        let mut budgeted = Inliner::new(Resolver::new(&Value::Null));
        budgeted.budget = 3;
        let cut = budgeted.inline(&json!({"type": "object", "required": ["a"], "properties": {"a": {"enum": [1, 2]}}}));
        assert!(jsonschema::validator_for(&cut).is_ok(), "{cut}");
    }

    #[test]
    fn wrong_shapes_are_map_errors() {
        assert_eq!(tools_of(SourceKind::Mcp, r#"{"tools": 3}"#).unwrap_err().code(), "not_mcp");
        assert_eq!(tools_of(SourceKind::Openapi, r#"{"swagger": "1.2"}"#).unwrap_err().code(), "not_openapi");
        assert_eq!(tools_of(SourceKind::Openapi, "{").unwrap_err().code(), "syntax");
        assert_eq!(tools_of(SourceKind::Sql, "CREATE TABLE t (a 'x").unwrap_err().code(), "sql");
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in ".{0,400}") {
            for kind in [SourceKind::Openapi, SourceKind::Mcp, SourceKind::Sql] {
                let _ = tools_of(kind, &text);
            }
        }

        #[test]
        fn arbitrary_documents_never_panic_and_name_what_the_mapper_names(value in crate::core::scg::tests::arb_json()) {
            let text = value.to_string();
            for kind in [SourceKind::Openapi, SourceKind::Mcp] {
                match (tools_of(kind, &text), map_source("s", Some(kind), &text)) {
                    (Ok(_), Ok(_)) => check_same_ids(kind, &text),
                    (Err(_), Err(_)) => {}
                    (tools, graph) => prop_assert!(false, "tools {:?} but graph {:?}", tools.is_ok(), graph.is_ok()),
                }
            }
        }
    }
}
