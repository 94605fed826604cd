//! Live sources, pure: what a source offers as callable capabilities and how
//! a call to one is described. A *source* is an MCP server (stdio or
//! streamable HTTP), an OpenAPI document (a URL or a file) or a SQL schema
//! (a DDL file); each of its tools or operations is one capability, with one
//! id everywhere (discovery, the Source Capability Graph, dispatch): its SCG
//! source key `<source_id>#<Name>` ([`capability_id`]).
//!
//! `docs/design/live-sources.md` is the contract. The shells connect
//! (`upstream`), keep sources and their state (`actors::sources`), and run
//! calls (`actors::dispatcher` through [`SourceCalls`]).

pub mod request;
pub mod settings;
pub mod tools;

use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind, DefinitionRef};
use crate::core::dispatch::registry::{CapabilityRecord, ExecutionType, FunctionDefinition};
use crate::core::dispatch::CallResult;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The one id of a source's tool or operation: its SCG source key.
///
/// # Examples
/// ```
/// assert_eq!(capdex::core::sources::capability_id("time", "get_current_time"), "time#get_current_time");
/// ```
pub fn capability_id(source_id: &str, name: &str) -> String {
    format!("{source_id}#{name}")
}

/// Splits a source capability id into `(source_id, name)`; `None` when `id` is not one.
pub fn split_capability_id(id: &str) -> Option<(&str, &str)> {
    let (source, name) = id.split_once('#')?;
    (!source.is_empty() && !name.is_empty() && !source.contains(':')).then_some((source, name))
}

/// Where a parameter of an HTTP operation goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamLocation {
    Path,
    Query,
    Header,
}

/// One parameter of an HTTP operation; its argument has the same name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationParam {
    pub name: String,
    pub location: ParamLocation,
    #[serde(default)]
    pub required: bool,
}

/// How an OpenAPI operation is called: an HTTP request built from the
/// arguments (path parameters, query, headers, and the rest as the JSON body).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpOperation {
    /// Upper-case method (`GET`, `POST`, ...).
    pub method: String,
    /// The server URL the document names (`servers[0].url`, or Swagger's
    /// `schemes`/`host`/`basePath`), resolved against the document's URL; may be empty.
    pub base_url: String,
    /// The path template, `/pets/{petId}`.
    pub path: String,
    #[serde(default)]
    pub params: Vec<OperationParam>,
    /// True when the operation takes a JSON request body: the arguments that
    /// are not parameters form it (or the argument `body`, when the body is not an object).
    #[serde(default)]
    pub json_body: bool,
}

/// How a source capability runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Invocation {
    /// `tools/call` of this name on the source's MCP session.
    Mcp { tool: String },
    /// An HTTP request.
    Http(HttpOperation),
    /// Mapped for discovery and routing only (SQL tables: capdex does not connect to databases).
    NotCallable,
}

/// One tool or operation a source offers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceTool {
    /// The SCG capability node's name: the MCP tool name, the OpenAPI
    /// `operationId` (else `METHOD /path`), `select_<table>` for SQL.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default)]
    pub description: String,
    /// A JSON Schema of the arguments (an object schema).
    pub input_schema: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    pub invocation: Invocation,
}

/// One call to a source's capability, admitted by the dispatch pipeline.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceCall {
    pub source_id: String,
    /// The tool or operation name (the part of the id after `#`).
    pub name: String,
    pub arguments: Value,
    pub agent_id: String,
    pub execution_id: Option<String>,
    /// The longest the call may take; on expiry the upstream is told to cancel.
    pub timeout_ms: u64,
}

/// Runs admitted calls on live sources (implemented by the shell that holds
/// the sessions). Answers fast with `unavailable` when the source is down.
pub trait SourceCalls {
    fn call(&self, call: SourceCall) -> futures::future::BoxFuture<'static, CallResult>;
}

/// What a source says of itself that its descriptors and records carry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SourceFacts<'a> {
    pub source_id: &'a str,
    /// The source's `category` setting; its id when `None`.
    pub category: Option<&'a str>,
    pub tags: &'a [String],
    /// A lazy source not connected now.
    pub loadable: bool,
    /// The source's call timeout, in ms (`None`: the dispatcher's default).
    pub timeout_ms: Option<u64>,
}

/// The descriptor of one of a source's tools, id `<source_id>#<Name>`.
pub fn descriptor_of(source: &SourceFacts<'_>, tool: &SourceTool) -> CapabilityDescriptor {
    let mut tags = source.tags.to_vec();
    if !tags.iter().any(|tag| tag == source.source_id) {
        tags.push(source.source_id.to_string());
    }
    let category = source.category.map(str::trim).filter(|category| !category.is_empty()).unwrap_or(source.source_id);
    CapabilityDescriptor {
        id: capability_id(source.source_id, &tool.name),
        kind: CapabilityKind::Tool,
        name: tool.name.clone(),
        display_name: tool.title.clone().unwrap_or_else(|| tool.name.clone()),
        description: tool.description.clone(),
        category: category.to_string(),
        tags,
        required_secrets: Vec::new(),
        required_tools: Vec::new(),
        available: true,
        has_side_effects: None,
        full_schema: Some(tool.input_schema.clone()),
        full_content: None,
        definition_ref: DefinitionRef::Source { source_id: source.source_id.to_string(), loadable: source.loadable },
    }
}

/// The dispatch record of one of a source's tools: slug = its capability id,
/// `executionType: source`, `handler` = the source id.
pub fn record_of(source: &SourceFacts<'_>, tool: &SourceTool) -> CapabilityRecord {
    let slug = capability_id(source.source_id, &tool.name);
    let parameters =
        if tool.input_schema.is_object() { tool.input_schema.clone() } else { serde_json::json!({"type": "object"}) };
    CapabilityRecord {
        name: tool.title.clone().unwrap_or_else(|| tool.name.clone()),
        description: tool.description.clone(),
        category: source.category.unwrap_or(source.source_id).to_string(),
        execution_type: ExecutionType::Source,
        handler: source.source_id.to_string(),
        function_definition: FunctionDefinition {
            name: function_name(&slug),
            description: tool.description.clone(),
            parameters,
        },
        requires_approval: false,
        approval_timeout_ms: None,
        rate_limit: None,
        is_idempotent: false,
        is_active: true,
        processes_pii: false,
        redaction: None,
        timeout_ms: source.timeout_ms,
        policy_version: 1,
        hidden: false,
        invocation: Some(tool.invocation.clone()),
        slug,
    }
}

/// An OpenAI function name (`^[a-zA-Z0-9_-]{1,64}$`) for a capability id:
/// other characters become `_`, and a longer name keeps its first 55
/// characters and a hash of the whole id.
///
/// # Examples
/// ```
/// use capdex::core::sources::function_name;
/// assert_eq!(function_name("pets#GET /pets/{id}"), "pets_GET__pets__id_");
/// ```
pub fn function_name(id: &str) -> String {
    let cleaned: String =
        id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    if (1..=64).contains(&cleaned.len()) {
        return cleaned;
    }
    // FNV-1a: stable across runs and platforms.
    let hash =
        id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3));
    format!("{}_{:08x}", &cleaned[..cleaned.len().min(55)], hash as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str) -> SourceTool {
        SourceTool {
            name: name.into(),
            title: None,
            description: "Show a pet".into(),
            input_schema: json!({"type": "object", "properties": {"petId": {"type": "integer"}}}),
            output_schema: None,
            invocation: Invocation::NotCallable,
        }
    }

    #[test]
    fn descriptors_and_records_share_the_capability_id() {
        let tags = vec!["animals".to_string()];
        let facts =
            SourceFacts { source_id: "pets", category: None, tags: &tags, loadable: true, timeout_ms: Some(900) };
        let descriptor = descriptor_of(&facts, &tool("showPet"));
        assert_eq!((descriptor.id.as_str(), descriptor.category.as_str()), ("pets#showPet", "pets"));
        assert_eq!(descriptor.tags, ["animals", "pets"]);
        assert_eq!(descriptor.full_schema.as_ref().unwrap()["properties"]["petId"]["type"], "integer");
        assert_eq!(descriptor.definition_ref, DefinitionRef::Source { source_id: "pets".into(), loadable: true });
        let record = record_of(&facts, &tool("showPet"));
        assert_eq!((record.slug.as_str(), record.handler.as_str()), ("pets#showPet", "pets"));
        assert_eq!(record.discovery_id(), descriptor.id);
        assert_eq!((record.execution_type, record.timeout_ms), (ExecutionType::Source, Some(900)));
        assert_eq!(record.function_definition.name, "pets_showPet");
        let categorised = SourceFacts { category: Some("zoo"), ..facts };
        assert_eq!(descriptor_of(&categorised, &tool("x")).category, "zoo");
    }

    #[test]
    fn function_names_are_valid_and_long_ids_stay_distinct() {
        let long_a = format!("s#{}", "a".repeat(80));
        let long_b = format!("s#{}b", "a".repeat(79));
        let (a, b) = (function_name(&long_a), function_name(&long_b));
        assert_ne!(a, b);
        for name in [a, b, function_name("s#ok"), function_name("ünï#cödé")] {
            assert!((1..=64).contains(&name.len()), "{name}");
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'), "{name}");
        }
        assert_eq!(split_capability_id("pets#showPet"), Some(("pets", "showPet")));
        assert_eq!(split_capability_id("tool:x#y"), None);
    }
}
