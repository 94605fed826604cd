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

pub mod records;
pub mod request;
pub mod settings;
pub mod shared;
pub mod tools;

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
