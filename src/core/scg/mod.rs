//! The Source Capability Graph (SCG): what each connected source can answer,
//! built from its schemas and tool definitions, and routing of a query to it.
//!
//! - [`model`]: node and edge kinds, content-addressed ids, recipes, drift hash;
//! - [`schema`]: the JSON Schema walker (`$ref`, `allOf` / `oneOf` / `anyOf`, nesting);
//! - [`openapi`], [`mcp`], [`sql`]: one mapper per source kind, text in, [`model::SourceGraph`] out;
//! - [`align`]: field-name normalisation, TypeAligner (RESOLVES_TO) and CONSUMES edges across sources;
//! - [`route`]: ranked RouteRecipes for a query, and a node's typed neighbourhood;
//! - [`pipeline`]: the map pipeline's phases, progress events, connector check and report;
//! - [`memory`]: deposited notes (positive or dead end) that bias routing, with time decay;
//! - [`shared`]: what the shared (JetStream) copy of mapped sources and notes means to each node.
//!
//! Everything here is pure: the caller reads files and stores graphs. No
//! credentials or record values enter the graph, only schema and tool names
//! and their descriptions.

pub mod align;
pub mod concepts;
pub mod mcp;
pub mod memory;
pub mod model;
pub mod openapi;
pub mod pipeline;
pub mod route;
pub mod schema;
pub mod shared;
pub mod sql;

use model::{SourceGraph, SourceKind};
use serde_json::Value;

/// The largest source text accepted, in bytes.
pub const MAX_SOURCE_BYTES: usize = 32 * 1024 * 1024;
/// The most nodes one source may produce; more is refused rather than truncated.
pub const MAX_NODES_PER_SOURCE: usize = 250_000;

/// Why a source could not be mapped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MapError {
    #[error("source id {0:?} is invalid: use 1-128 characters of [A-Za-z0-9._-]")]
    InvalidSourceId(String),
    #[error("source is {size} bytes, more than the {max} allowed")]
    TooLarge { size: usize, max: usize },
    #[error("source is neither JSON nor YAML: {0}")]
    Syntax(String),
    #[error("not an OpenAPI 3.x or Swagger 2 document: {0}")]
    NotOpenApi(String),
    #[error("not an MCP tools/list result: {0}")]
    NotMcp(String),
    #[error("SQL DDL at line {line}: {problem}")]
    Sql { line: usize, problem: String },
    #[error("cannot tell the source kind; pass --kind openapi|mcp|sql")]
    UnknownKind,
    #[error("source maps to more than {0} nodes")]
    TooManyNodes(usize),
}

impl MapError {
    /// Returns a stable code for callers that branch on the failure.
    pub fn code(&self) -> &'static str {
        match self {
            MapError::InvalidSourceId(_) => "invalid_source_id",
            MapError::TooLarge { .. } => "too_large",
            MapError::Syntax(_) => "syntax",
            MapError::NotOpenApi(_) => "not_openapi",
            MapError::NotMcp(_) => "not_mcp",
            MapError::Sql { .. } => "sql",
            MapError::UnknownKind => "unknown_kind",
            MapError::TooManyNodes(_) => "too_many_nodes",
        }
    }
}

/// Returns whether `source_id` is usable in source keys (`<id>#<Name>`).
pub fn valid_source_id(source_id: &str) -> bool {
    (1..=128).contains(&source_id.len())
        && source_id.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
}

/// Parses JSON, or YAML when the text is not JSON.
pub fn parse_document(text: &str) -> Result<Value, MapError> {
    match serde_json::from_str::<Value>(text) {
        Ok(value) => Ok(value),
        Err(json_error) => {
            let trimmed = text.trim_start();
            if trimmed.starts_with('{') || trimmed.starts_with('[') {
                return Err(MapError::Syntax(json_error.to_string()));
            }
            serde_norway::from_str::<Value>(text).map_err(|yaml_error| MapError::Syntax(yaml_error.to_string()))
        }
    }
}

/// Guesses the kind of a source from its text: SQL DDL, an MCP tool list, or OpenAPI.
pub fn infer_kind(text: &str) -> Result<SourceKind, MapError> {
    // Documents first: an OpenAPI description may well mention CREATE TABLE.
    if let Ok(document) = parse_document(text) {
        if document.get("openapi").is_some() || document.get("swagger").is_some() {
            return Ok(SourceKind::Openapi);
        }
        let tools = document.get("tools").or_else(|| document.get("result").and_then(|result| result.get("tools")));
        if tools.is_some_and(Value::is_array) || document.is_array() {
            return Ok(SourceKind::Mcp);
        }
    }
    if text.to_ascii_uppercase().contains("CREATE TABLE") {
        return Ok(SourceKind::Sql);
    }
    Err(MapError::UnknownKind)
}

/// Maps one source's text into its graph; `kind` is inferred when `None`.
pub fn map_source(source_id: &str, kind: Option<SourceKind>, text: &str) -> Result<SourceGraph, MapError> {
    if !valid_source_id(source_id) {
        return Err(MapError::InvalidSourceId(source_id.to_string()));
    }
    if text.len() > MAX_SOURCE_BYTES {
        return Err(MapError::TooLarge { size: text.len(), max: MAX_SOURCE_BYTES });
    }
    let kind = match kind {
        Some(kind) => kind,
        None => infer_kind(text)?,
    };
    let graph = match kind {
        SourceKind::Openapi => openapi::map(source_id, &parse_document(text)?)?,
        SourceKind::Mcp => mcp::map(source_id, &parse_document(text)?)?,
        SourceKind::Sql => sql::map(source_id, text)?,
    };
    if graph.nodes.len() > MAX_NODES_PER_SOURCE {
        return Err(MapError::TooManyNodes(MAX_NODES_PER_SOURCE));
    }
    Ok(graph)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn kinds_are_inferred() {
        assert_eq!(infer_kind("CREATE TABLE t (a INT);"), Ok(SourceKind::Sql));
        assert_eq!(infer_kind(r#"{"openapi": "3.0.0"}"#), Ok(SourceKind::Openapi));
        assert_eq!(infer_kind("swagger: '2.0'\npaths: {}\n"), Ok(SourceKind::Openapi));
        assert_eq!(infer_kind(r#"{"tools": []}"#), Ok(SourceKind::Mcp));
        assert_eq!(infer_kind(r#"{"x": 1}"#), Err(MapError::UnknownKind));
        assert_eq!(
            infer_kind("openapi: 3.0.0\ninfo: {description: 'mirrors CREATE TABLE statements'}\n"),
            Ok(SourceKind::Openapi)
        );
        assert_eq!(infer_kind("-- chinook\nCREATE TABLE [Album] ([AlbumId] INTEGER);"), Ok(SourceKind::Sql));
    }

    #[test]
    fn bad_ids_and_syntax_are_typed_errors() {
        assert_eq!(map_source("a#b", None, "{}").unwrap_err().code(), "invalid_source_id");
        assert_eq!(map_source("a", Some(SourceKind::Openapi), "{").unwrap_err().code(), "syntax");
        assert_eq!(map_source("a", Some(SourceKind::Openapi), "[1]").unwrap_err().code(), "not_openapi");
        assert_eq!(map_source("a", Some(SourceKind::Mcp), r#"{"tools": 3}"#).unwrap_err().code(), "not_mcp");
        let deep = "[".repeat(10_000);
        assert!(map_source("a", Some(SourceKind::Openapi), &deep).is_err());
    }

    #[test]
    fn yaml_swagger2_maps_like_json() {
        let yaml = "swagger: '2.0'\ninfo: {title: Pets}\ndefinitions:\n  Pet:\n    properties:\n      name: {type: string}\n      tag: {type: string}\npaths:\n  /pets/{petId}:\n    parameters:\n      - {name: petId, in: path, required: true, type: string}\n    get:\n      operationId: showPetById\n      responses:\n        '200':\n          schema: {$ref: '#/definitions/Pet'}\n";
        let from_yaml = map_source("pets", None, yaml).unwrap();
        let json = serde_json::to_string(&parse_document(yaml).unwrap()).unwrap();
        let from_json = map_source("pets", None, &json).unwrap();
        assert_eq!(from_yaml, from_json);
        let keys: Vec<&str> = from_yaml.nodes.iter().map(|node| node.source_key.as_str()).collect();
        assert!(keys.contains(&"pets#showPetById.petId") && keys.contains(&"pets#Pet.tag"), "{keys:?}");
        assert_eq!(from_yaml.count_edges(model::EdgeKind::Produces), 2);
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in ".{0,400}") {
            for kind in [None, Some(SourceKind::Openapi), Some(SourceKind::Mcp), Some(SourceKind::Sql)] {
                let _ = map_source("s", kind, &text);
            }
        }

        #[test]
        fn arbitrary_json_never_panics(value in arb_json()) {
            let text = value.to_string();
            let _ = map_source("s", Some(SourceKind::Openapi), &text);
            let _ = map_source("s", Some(SourceKind::Mcp), &text);
        }
    }

    pub(crate) fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            "[a-z$#/]{0,12}".prop_map(Value::String),
            prop_oneof![Just("#/components/schemas/A"), Just("#/definitions/A"), Just("#")]
                .prop_map(|reference| serde_json::json!({"$ref": reference})),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("openapi".to_string()),
                        Just("paths".to_string()),
                        Just("components".to_string()),
                        Just("schemas".to_string()),
                        Just("A".to_string()),
                        Just("properties".to_string()),
                        Just("allOf".to_string()),
                        Just("get".to_string()),
                        Just("/p".to_string()),
                        Just("responses".to_string()),
                        Just("tools".to_string()),
                        Just("name".to_string()),
                        Just("inputSchema".to_string()),
                        "[a-z]{1,4}"
                    ],
                    inner,
                    0..5
                )
                .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }
}
