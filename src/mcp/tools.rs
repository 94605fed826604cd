//! The tools the MCP face offers: their names, descriptions, input and output
//! schemas ([`fixed_tools`], [`direct_tool`]), the arguments each takes, and
//! how a dispatch result becomes a tool result ([`call_result`]).

use crate::core::dispatch::CallResult;
use crate::core::mcp_face::DirectTool;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// `discover_capabilities` arguments.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiscoverArgs {
    pub query: String,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub category: Option<String>,
    /// Only the capabilities of sources this workspace enabled (and those of no source).
    #[serde(default)]
    pub workspace: Option<String>,
}

/// `call_capability` arguments.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CallArgs {
    pub id: String,
    #[serde(default)]
    pub arguments: Option<Value>,
    #[serde(default)]
    pub execution_id: Option<String>,
    #[serde(default)]
    pub step_id: Option<String>,
    #[serde(default)]
    pub approval_id: Option<String>,
}

fn object(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

/// The four fixed tools, in [`crate::core::mcp_face::FIXED_TOOLS`] order.
pub fn fixed_tools() -> Vec<Tool> {
    let kinds = json!(["tool", "skill", "extension", "channel", "voice", "productivity", "emergent-tool", "any"]);
    let discover = Tool::new(
        "discover_capabilities",
        "Find the capabilities (tools, skills, extensions, channels) that matter for a task. Returns the most \
         relevant ones (id, name, kind, relevance in [0, 1], summary) as structured content and the token-budgeted \
         context as text. Call one with call_capability and its id.",
        object(json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What you need to do, in plain words"},
                "kind": {"type": "string", "enum": kinds, "description": "Only this kind (default any)"},
                "category": {"type": "string", "description": "Only this category"},
                "workspace": {"type": "string", "description": "Only the sources this workspace enabled"}
            },
            "required": ["query"],
            "additionalProperties": false
        })),
    )
    .with_raw_output_schema(object(json!({
        "type": "object",
        "properties": {
            "capabilities": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"}, "name": {"type": "string"}, "kind": {"type": "string"},
                    "relevance": {"type": "number"}, "summary": {"type": "string"}
                },
                "required": ["id", "name", "kind", "relevance", "summary"]
            }},
            "tokenEstimate": {"type": "object"},
            "diagnostics": {"type": "object"}
        },
        "required": ["capabilities"]
    })))
    .with_annotations(ToolAnnotations::new().read_only(true).open_world(false));
    let call = Tool::new(
        "call_capability",
        "Call a capability by the id discover_capabilities gave, through capdex's dispatch pipeline (bindings, \
         rate limits, approvals, argument validation, provenance). A call that needs a person's approval answers \
         status requires_approval with the approval id; call again with approvalId once it is approved.",
        object(json!({
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "The capability's id or slug (tool:echo, echo, github#create_issue)"},
                "arguments": {"type": "object", "description": "The capability's arguments, per its input schema"},
                "executionId": {"type": "string", "description": "Makes the call idempotent: a repeat with the same executionId returns the stored result"},
                "stepId": {"type": "string", "description": "The step within executionId (default: the capability id)"},
                "approvalId": {"type": "string", "description": "The approved approval that permits this call"}
            },
            "required": ["id"],
            "additionalProperties": false
        })),
    )
    .with_raw_output_schema(object(json!({
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["ok", "requires_approval", "error"]},
            "success": {"type": "boolean"},
            "data": {},
            "error": {"type": "object"},
            "approvalId": {"type": "string"},
            "expiresAtMs": {"type": "integer"},
            "howToApprove": {"type": "string"}
        },
        "required": ["status", "success"]
    })))
    .with_annotations(ToolAnnotations::new().destructive(true).open_world(true));
    let route = Tool::new(
        "route_sources",
        "Rank the Source Capability Graph's recipes for a question: which connected sources (APIs, MCP servers, \
         SQL schemas) and which chain of their operations can answer it.",
        object(json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "The question"},
                "k": {"type": "integer", "minimum": 1, "maximum": 50, "description": "Recipes wanted (default 5)"},
                "workspace": {"type": "string", "description": "Only the sources this workspace enabled"}
            },
            "required": ["query"],
            "additionalProperties": false
        })),
    )
    .with_raw_output_schema(object(json!({"type": "object", "properties": {"recipes": {"type": "array"}}})))
    .with_annotations(ToolAnnotations::new().read_only(true).open_world(false));
    let outcome = Tool::new(
        "report_outcome",
        "Report how a turn's task went (status success, partial or failed, or a score in [0, 1], and the \
         capabilities used), into capdex's KPIs and outcome prior. Answers the scope's KPI.",
        object(json!({
            "type": "object",
            "properties": {
                "turnId": {"type": "string", "description": "Counts a retried report once"},
                "organizationId": {"type": "string"},
                "personaId": {"type": "string"},
                "status": {"type": "string", "enum": ["success", "partial", "failed"]},
                "score": {"type": "number", "minimum": 0, "maximum": 1},
                "source": {"type": "string"},
                "capabilities": {"type": "array", "items": {"type": "string"}},
                "toolSelectionMode": {"type": "string", "enum": ["all", "discovered"]}
            },
            "additionalProperties": false
        })),
    )
    .with_raw_output_schema(object(json!({
        "type": "object",
        "properties": {"accepted": {"type": "boolean"}, "duplicate": {"type": "boolean"}, "kpi": {"type": "object"}},
        "required": ["accepted", "duplicate", "kpi"]
    })))
    .with_annotations(ToolAnnotations::new().idempotent(true).open_world(false));
    vec![discover, call, route, outcome]
}

/// The MCP tool of a capability offered in direct mode.
pub fn direct_tool(tool: &DirectTool) -> Tool {
    let description = format!("{} (capdex capability {})", tool.description, tool.capability_id);
    Tool::new(tool.tool_name.clone(), description, object(tool.input_schema.clone()))
        .with_annotations(ToolAnnotations::new().open_world(true))
}

/// A tool error: `isError` with `{code, message}` as text and structured content.
pub fn tool_error(code: &str, message: &str) -> CallToolResult {
    let body = json!({"status": "error", "success": false, "error": {"code": code, "message": message}});
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!("{code}: {message}"))]);
    result.structured_content = Some(body);
    result
}

/// A successful tool result with `value` as structured content and its JSON as text.
pub fn structured(value: Value) -> CallToolResult {
    let text = value.to_string();
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(value);
    result
}

/// How a dispatch result answers an MCP call: data as a success, a refusal
/// or handler error as a tool error with the pipeline's code and message, and
/// `requires_approval` as a structured result naming the approval and how to decide it.
pub fn call_result(result: &CallResult, how_to_approve: &str) -> CallToolResult {
    if result.success {
        let data = result.data.clone().unwrap_or(Value::Null);
        let text = match &data {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let mut answer = CallToolResult::success(vec![ContentBlock::text(text)]);
        answer.structured_content = Some(json!({"status": "ok", "success": true, "data": data}));
        return answer;
    }
    let (code, message) = match &result.error {
        Some(error) => (error.code.as_str(), error.message.as_str()),
        None => ("execution_error", "the call failed without an error"),
    };
    if code == "requires_approval" {
        let metadata = result.metadata.clone().unwrap_or(Value::Null);
        let approval_id = metadata.get("approvalId").and_then(Value::as_str).unwrap_or_default();
        let how = how_to_approve.replace("{id}", approval_id);
        let body = json!({
            "status": "requires_approval",
            "success": false,
            "approvalId": approval_id,
            "expiresAtMs": metadata.get("expiresAtMs").cloned().unwrap_or(Value::Null),
            "howToApprove": how,
            "error": {"code": code, "message": message},
        });
        let text = format!(
            "This call needs a person's approval (approval {approval_id}). {how} Then call again with approvalId."
        );
        let mut answer = CallToolResult::success(vec![ContentBlock::text(text)]);
        answer.structured_content = Some(body);
        return answer;
    }
    tool_error(code, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dispatch::ErrorCode;

    #[test]
    fn results_keep_the_pipeline_code() {
        let ok = call_result(&CallResult::ok(json!({"text": "hi"})), "");
        assert_eq!(ok.is_error, Some(false));
        assert_eq!(ok.structured_content.unwrap()["data"]["text"], "hi");
        let refused = call_result(&CallResult::fail(ErrorCode::InvalidArgs, "text must be a string"), "");
        assert_eq!(refused.is_error, Some(true));
        assert_eq!(refused.structured_content.unwrap()["error"]["code"], "invalid_args");
        let mut gated = CallResult::fail(ErrorCode::RequiresApproval, "needs an approval");
        gated.metadata = Some(json!({"approvalId": "ap1", "expiresAtMs": 5}));
        let answer = call_result(&gated, "run `capdex approval approve {id}`.");
        assert_eq!(answer.is_error, Some(false));
        let body = answer.structured_content.unwrap();
        assert_eq!((body["status"].as_str(), body["approvalId"].as_str()), (Some("requires_approval"), Some("ap1")));
        assert_eq!(body["howToApprove"], "run `capdex approval approve ap1`.");
    }

    #[test]
    fn the_fixed_tools_follow_the_core_names_and_declare_schemas() {
        let tools = fixed_tools();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, crate::core::mcp_face::FIXED_TOOLS);
        for tool in tools {
            assert_eq!(tool.input_schema["type"], "object", "{}", tool.name);
            assert!(tool.output_schema.is_some(), "{}", tool.name);
        }
    }
}
