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

use crate::core::limits::{Limits, YamlRefusal};
use model::{SourceGraph, SourceKind};
use serde_json::Value;

/// The largest source text accepted, in bytes.
pub const MAX_SOURCE_BYTES: usize = 32 * 1024 * 1024;
/// The most nodes one source may produce; more is refused rather than truncated.
pub const MAX_NODES_PER_SOURCE: usize = 250_000;

/// Why a source could not be mapped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MapError {
    /// The source id is not an SCG id ([`source_id_problem`]).
    #[error("sourceId {0}")]
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
    /// Over one of `[limits]`: nesting, YAML aliases, tools per source, operations per spec.
    #[error("{0}")]
    Limit(crate::core::limits::LimitExceeded),
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
            MapError::Limit(exceeded) => exceeded.limit.code(),
        }
    }
}

/// What is wrong with an SCG id (a mapped source's id, usable in source keys
/// `<id>#<Name>`; a workspace; a memory label's id), as it reads after the
/// field, if anything: it is 1 or more of `[A-Za-z0-9._-]`, at most
/// `max_id_bytes` bytes (`[limits]`, the refusal naming it).
pub fn source_id_problem(source_id: &str, max_id_bytes: usize) -> Option<String> {
    if source_id.is_empty()
        || !source_id.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
    {
        return Some(format!("{source_id:?} is invalid: use 1 or more of [A-Za-z0-9._-]"));
    }
    let exceeded = crate::core::subject_token::check_len(source_id, max_id_bytes).err()?;
    Some(crate::core::subject_token::too_long_text(&exceeded))
}

/// Returns whether `source_id` is an SCG id of at most `max_id_bytes` bytes ([`source_id_problem`]).
pub fn valid_source_id(source_id: &str, max_id_bytes: usize) -> bool {
    source_id_problem(source_id, max_id_bytes).is_none()
}

/// Checks an SCG source id within `max_id_bytes`.
pub fn check_source_id(source_id: &str, max_id_bytes: usize) -> Result<(), MapError> {
    source_id_problem(source_id, max_id_bytes).map_or(Ok(()), |problem| Err(MapError::InvalidSourceId(problem)))
}

/// Parses JSON, or YAML when the text is not JSON, within the default [`Limits`].
pub fn parse_document(text: &str) -> Result<Value, MapError> {
    parse_document_limited(text, &Limits::default())
}

/// Parses JSON (its depth checked first), or YAML when the text is not JSON
/// (its aliases checked first, its depth after), within `limits`.
pub fn parse_document_limited(text: &str, limits: &Limits) -> Result<Value, MapError> {
    let trimmed = text.trim_start();
    let looks_json = trimmed.starts_with('{') || trimmed.starts_with('[');
    if looks_json {
        crate::core::limits::check_json(text.as_bytes(), limits).map_err(MapError::Limit)?;
    }
    match serde_json::from_str::<Value>(text) {
        Ok(value) => Ok(value),
        Err(json_error) => {
            if looks_json {
                return Err(MapError::Syntax(json_error.to_string()));
            }
            crate::core::limits::parse_yaml(text, limits).map_err(|refusal| match refusal {
                YamlRefusal::Limit(exceeded) => MapError::Limit(exceeded),
                YamlRefusal::Syntax(problem) => MapError::Syntax(problem),
            })
        }
    }
}

/// Checks the tools an MCP tool list offers, or the operations an OpenAPI
/// document offers, against `limits`.
pub fn check_counts(kind: SourceKind, document: &Value, limits: &Limits) -> Result<(), MapError> {
    use crate::core::limits::{check, Limit};
    let counted = match kind {
        SourceKind::Mcp => {
            let tools = document.get("tools").or_else(|| document.pointer("/result/tools")).unwrap_or(document);
            check(Limit::ToolsPerSource, tools.as_array().map_or(0, Vec::len), limits.max_tools_per_source)
        }
        SourceKind::Openapi => {
            let operations = document.get("paths").and_then(Value::as_object).map_or(0, |paths| {
                paths
                    .values()
                    .filter_map(Value::as_object)
                    .map(|item| item.keys().filter(|key| openapi::is_method(key)).count())
                    .sum()
            });
            check(Limit::OperationsPerSpec, operations, limits.max_operations_per_spec)
        }
        SourceKind::Sql => Ok(()),
    };
    counted.map_err(MapError::Limit)
}

/// Checks the longest `$ref` chain of an OpenAPI document or MCP tool list
/// against `limits.max_ref_hops`.
pub fn check_refs(document: &Value, limits: &Limits) -> Result<(), MapError> {
    crate::core::limits::check(
        crate::core::limits::Limit::RefHops,
        schema::longest_ref_chain(document),
        limits.max_ref_hops,
    )
    .map_err(MapError::Limit)
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
    map_source_limited(source_id, kind, text, &Limits::default())
}

/// [`map_source`] within `limits` (the source id's bytes, nesting, aliases,
/// tools per source, operations per spec).
pub fn map_source_limited(
    source_id: &str,
    kind: Option<SourceKind>,
    text: &str,
    limits: &Limits,
) -> Result<SourceGraph, MapError> {
    check_source_id(source_id, limits.max_id_bytes)?;
    if text.len() > MAX_SOURCE_BYTES {
        return Err(MapError::TooLarge { size: text.len(), max: MAX_SOURCE_BYTES });
    }
    let kind = match kind {
        Some(kind) => kind,
        None => infer_kind(text)?,
    };
    let graph = match kind {
        SourceKind::Openapi | SourceKind::Mcp => {
            let document = parse_document_limited(text, limits)?;
            check_counts(kind, &document, limits)?;
            check_refs(&document, limits)?;
            match kind {
                SourceKind::Openapi => openapi::map(source_id, &document)?,
                _ => mcp::map(source_id, &document)?,
            }
        }
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
    fn tools_operations_and_nesting_are_refused_one_over_their_limits() {
        use crate::core::limits::{Limit, LimitExceeded};
        let limits =
            Limits { max_tools_per_source: 2, max_operations_per_spec: 2, max_json_depth: 6, ..Limits::default() };
        let tools = |n: usize| {
            let tools: Vec<String> = (0..n).map(|i| format!(r#"{{"name": "t{i}", "description": "t"}}"#)).collect();
            format!(r#"{{"tools": [{}]}}"#, tools.join(", "))
        };
        assert!(map_source_limited("m", Some(SourceKind::Mcp), &tools(2), &limits).is_ok());
        let over = map_source_limited("m", Some(SourceKind::Mcp), &tools(3), &limits).unwrap_err();
        assert_eq!(over, MapError::Limit(LimitExceeded { limit: Limit::ToolsPerSource, found: 3, max: 2 }));
        assert_eq!(over.code(), "too_many_tools");
        let spec = |n: usize| {
            let paths: Vec<String> = (0..n).map(|i| format!(r#""/p{i}": {{"get": {{}}, "x-note": {{}}}}"#)).collect();
            format!(
                r#"{{"openapi": "3.0.0", "info": {{"title": "t", "version": "1"}}, "paths": {{{}}}}}"#,
                paths.join(", ")
            )
        };
        assert!(map_source_limited("o", Some(SourceKind::Openapi), &spec(2), &limits).is_ok());
        let over = map_source_limited("o", Some(SourceKind::Openapi), &spec(3), &limits).unwrap_err();
        assert_eq!(over, MapError::Limit(LimitExceeded { limit: Limit::OperationsPerSpec, found: 3, max: 2 }));
        let deep = |depth: usize| {
            format!("{}{}", r#"{"tools": ["#.to_string() + &"[".repeat(depth - 2), "]".repeat(depth - 2) + "]}")
        };
        assert!(!matches!(parse_document_limited(&deep(6), &limits), Err(MapError::Limit(_))));
        assert_eq!(
            parse_document_limited(&deep(7), &limits),
            Err(MapError::Limit(LimitExceeded { limit: Limit::JsonDepth, found: 7, max: 6 }))
        );
    }

    /// A chain of `$ref`s as long as the limit maps (as an OpenAPI document
    /// and as an MCP tool list); one hop more is refused naming the setting
    /// (`sources::tools` checks its entry point the same way); a cycle ends
    /// where it repeats.
    #[test]
    fn ref_chains_are_refused_one_hop_over_their_limit() {
        use crate::core::limits::{Limit, LimitExceeded};
        let limits = Limits { max_ref_hops: 3, ..Limits::default() };
        // The operation's body is `$ref` S0, S0 is `$ref` S1, ... S(hops-1) is an object: `hops` hops.
        let schemas = |hops: usize| {
            let mut schemas: Vec<String> =
                (0..hops - 1).map(|i| format!(r##""S{i}": {{"$ref": "#/components/schemas/S{}"}}"##, i + 1)).collect();
            schemas
                .push(format!(r#""S{}": {{"type": "object", "properties": {{"a": {{"type": "string"}}}}}}"#, hops - 1));
            schemas.join(", ")
        };
        let spec = |hops: usize| {
            format!(
                r##"{{"openapi": "3.0.0", "info": {{"title": "t", "version": "1"}},
                "paths": {{"/p": {{"post": {{"operationId": "make", "requestBody": {{"content": {{"application/json":
                {{"schema": {{"$ref": "#/components/schemas/S0"}}}}}}}}, "responses": {{}}}}}}}},
                "components": {{"schemas": {{{}}}}}}}"##,
                schemas(hops)
            )
        };
        let tools = |hops: usize| {
            format!(
                r##"{{"tools": [{{"name": "make", "description": "d", "inputSchema": {{"$ref": "#/components/schemas/S0"}}}}],
                "components": {{"schemas": {{{}}}}}}}"##,
                schemas(hops)
            )
        };
        let over = MapError::Limit(LimitExceeded { limit: Limit::RefHops, found: 4, max: 3 });
        let texts: [(SourceKind, &dyn Fn(usize) -> String); 2] =
            [(SourceKind::Openapi, &spec), (SourceKind::Mcp, &tools)];
        for (kind, text) in texts {
            assert!(map_source_limited("s", Some(kind), &text(3), &limits).is_ok(), "{kind:?}");
            assert_eq!(map_source_limited("s", Some(kind), &text(4), &limits).unwrap_err(), over, "{kind:?}");
        }
        assert_eq!(over.code(), "ref_chain_too_long");
        assert!(over.to_string().contains("limits.max_ref_hops"), "{over}");
        let cycle = serde_json::json!({"a": {"$ref": "#/b"}, "b": {"$ref": "#/c"}, "c": {"$ref": "#/a"}});
        assert_eq!(schema::longest_ref_chain(&cycle), 3);
        assert_eq!(schema::longest_ref_chain(&serde_json::json!({"x": {"$ref": "#/missing"}})), 1);
        assert_eq!(schema::longest_ref_chain(&serde_json::json!({"x": 1})), 0);
    }

    #[test]
    fn source_ids_are_refused_one_byte_over_max_id_bytes_naming_the_setting() {
        let text = r#"{"tools": [{"name": "t", "description": "t"}]}"#;
        for max in [64, 70, 256] {
            let limits = Limits { max_id_bytes: max, ..Limits::default() };
            let at = format!("{}.b-c_{}", "a".repeat(max - 10), "z".repeat(5));
            assert_eq!(at.len(), max);
            assert!(map_source_limited(&at, Some(SourceKind::Mcp), text, &limits).is_ok(), "{max}");
            let over = map_source_limited(&format!("{at}z"), Some(SourceKind::Mcp), text, &limits).unwrap_err();
            assert_eq!(over.code(), "invalid_source_id");
            assert_eq!(
                over.to_string(),
                format!("sourceId is {} bytes, over limits.max_id_bytes: at most {max}", max + 1)
            );
            assert!(valid_source_id(&at, max) && !valid_source_id(&format!("{at}z"), max));
        }
        for bad in ["", "a#b", "a b", "a/b", "é"] {
            let problem = source_id_problem(bad, 128).unwrap();
            assert!(problem.contains("[A-Za-z0-9._-]"), "{bad:?}: {problem}");
        }
    }

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
