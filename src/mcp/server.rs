//! The MCP server handler: one [`Session`] per MCP session (one per stdio
//! process, one per HTTP session), answering `initialize`, `tools/list` and
//! `tools/call` through the [`Bridge`] to capdex's `Api`.
//!
//! A session acts as one agent id, fixed at `initialize` ([`FaceOptions::agent_for`]):
//! so bindings, rate limits, approvals, provenance and KPI scopes apply per
//! agent, as over NATS. Protocol versions are the handshake ones, up to
//! 2025-11-25: per-session identity and direct mode need a session, which the
//! stateless 2026-07-28 revision removes; clients of that revision fall back to
//! the handshake (rmcp's `server/discover` advertises only these versions).

use crate::config::McpSettings;
use crate::core::discovery::DiscoveryResult;
use crate::core::dispatch::CallResult;
use crate::core::kpi_window::OutcomeReport;
use crate::core::mcp_face::{self, DirectCandidate, DirectTool, SessionInterest};
use crate::gateway::wire::{ApiError, DiscoverRequest, DispatchAdmin, RecordedOutcome, ScgRouteRequest};
use crate::mcp::bridge::Bridge;
use crate::mcp::tools::{self, CallArgs, DiscoverArgs};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ElicitRequestParams, ElicitationAction, Implementation,
    InitializeRequestParams, InitializeResult, JsonObject, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{ElicitationMode, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest capdex waits for a person to answer an approval elicitation.
const ELICITATION_TIMEOUT: Duration = Duration::from_secs(600);

/// What every session of one MCP face shares.
#[derive(Clone, Debug)]
pub struct FaceOptions {
    /// The agent id every session acts as, when configured.
    pub agent_id: Option<String>,
    /// The bearer token of HTTP sessions, and the agent id it gives.
    pub token: Option<String>,
    pub token_agent_id: Option<String>,
    /// Direct mode for every session.
    pub direct: bool,
    pub direct_max_tools: usize,
    /// How a person approves an approval, `{id}` standing for its id.
    pub how_to_approve: String,
    /// Where recorded outcomes go to have their KPI and alert events published (with NATS).
    pub outcome_events: Option<tokio::sync::mpsc::UnboundedSender<RecordedOutcome>>,
    /// `limits.max_json_depth`: a JSON-RPC message nested deeper is refused before it is parsed.
    pub max_json_depth: usize,
    /// `limits.max_id_bytes`: the longest agent id a client's name gives.
    pub max_id_bytes: usize,
}

impl FaceOptions {
    /// The options of `[mcp]`, with `how_to_approve` for this process.
    pub fn new(settings: &McpSettings, how_to_approve: String) -> FaceOptions {
        FaceOptions {
            agent_id: settings.agent_id.clone(),
            token: settings.token.as_ref().map(|token| token.expose().to_string()),
            token_agent_id: settings.token_agent_id.clone(),
            direct: settings.direct,
            direct_max_tools: settings.direct_max_tools,
            how_to_approve,
            outcome_events: None,
            max_json_depth: crate::core::limits::DEFAULT_MAX_DEPTH,
            max_id_bytes: crate::core::limits::Limits::default().max_id_bytes,
        }
    }

    /// The agent a session acts as: the token's agent (HTTP with the
    /// configured token and `token_agent_id`), else the configured
    /// `agent_id`, else `mcp:<the client's declared name>`.
    pub fn agent_for(&self, bearer: Option<&str>, client_name: &str) -> String {
        if let (Some(token), Some(agent), Some(given)) = (&self.token, &self.token_agent_id, bearer) {
            if token == given {
                return agent.clone();
            }
        }
        if let Some(agent) = &self.agent_id {
            return agent.clone();
        }
        // An agent id is a subject token: the client's name with `.`, `*`, `>`
        // and whitespace as `_`, control characters dropped, within `max_id_bytes`.
        let mut name = String::new();
        for c in client_name.trim().chars().filter(|c| !c.is_control()) {
            let c = if crate::core::subject_token::forbidden(c) { '_' } else { c };
            if "mcp:".len() + name.len() + c.len_utf8() > self.max_id_bytes {
                break;
            }
            name.push(c);
        }
        if name.is_empty() {
            "mcp".to_string()
        } else {
            format!("mcp:{name}")
        }
    }
}

/// One MCP session's handler.
#[derive(Clone)]
pub struct Session {
    options: Arc<FaceOptions>,
    bridge: Bridge,
    state: Arc<Mutex<SessionState>>,
}

#[derive(Default)]
struct SessionState {
    agent_id: Option<String>,
    direct: bool,
    interest: SessionInterest,
    offered: Vec<DirectTool>,
}

impl Session {
    /// A new session; `direct` turns direct mode on for it (besides the options).
    pub fn new(options: Arc<FaceOptions>, bridge: Bridge, direct: bool) -> Session {
        let state = SessionState { direct: direct || options.direct, ..SessionState::default() };
        Session { options, bridge, state: Arc::new(Mutex::new(state)) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SessionState> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn agent_id(&self) -> String {
        self.lock().agent_id.clone().unwrap_or_else(|| self.options.agent_for(None, ""))
    }

    async fn discover(&self, args: DiscoverArgs, context: &RequestContext<RoleServer>) -> CallToolResult {
        let request = DiscoverRequest {
            message: args.query,
            kind: args.kind,
            category: args.category,
            workspace: args.workspace,
            ..DiscoverRequest::default()
        };
        let (result, descriptors) = match self.bridge.call(move |api| api.discover_described(request)).await {
            Ok(answer) => answer,
            Err(err) => return api_error(&err),
        };
        let capabilities = tier1(&result, &descriptors);
        if self.lock().direct {
            self.offer(&result, &descriptors, context).await;
        }
        let body = json!({
            "capabilities": capabilities,
            "tokenEstimate": result.token_estimate,
            "diagnostics": result.diagnostics,
        });
        let mut answer = CallToolResult::success(vec![rmcp::model::ContentBlock::text(result.rendered.clone())]);
        answer.structured_content = Some(body);
        answer
    }

    /// Direct mode: takes a discovery's tools into the session's interest and
    /// tells the client when the offered set changed.
    async fn offer(
        &self,
        result: &DiscoveryResult,
        descriptors: &[crate::core::descriptor::CapabilityDescriptor],
        context: &RequestContext<RoleServer>,
    ) {
        let found = result.tier1.iter().filter_map(|entry| {
            let descriptor = descriptors.iter().find(|d| d.id == entry.id)?;
            (descriptor.kind == crate::core::descriptor::CapabilityKind::Tool).then(|| {
                let candidate = DirectCandidate {
                    capability_id: descriptor.id.clone(),
                    name: descriptor.name.clone(),
                    description: descriptor.description.clone(),
                    input_schema: descriptor.full_schema.as_ref().map(|schema| schema.value()),
                };
                (entry.relevance, candidate)
            })
        });
        let changed = {
            let mut state = self.lock();
            state.interest.observe(found.collect::<Vec<_>>());
            let offered = mcp_face::direct_tools(&state.interest.top(self.options.direct_max_tools));
            let changed = offered != state.offered;
            state.offered = offered;
            changed
        };
        if changed {
            if let Err(err) = context.peer.notify_tool_list_changed().await {
                tracing::debug!(%err, "could not send tools/list_changed");
            }
        }
    }

    async fn call_capability(&self, args: CallArgs, context: &RequestContext<RoleServer>) -> CallToolResult {
        let step_id = args.step_id.clone().or_else(|| args.execution_id.as_ref().map(|_| args.id.clone()));
        let mut call = json!({
            "slug": args.id,
            "arguments": args.arguments.unwrap_or_else(|| json!({})),
            "agentId": self.agent_id(),
            "executionId": args.execution_id,
            "stepId": step_id,
            "approvalId": args.approval_id,
        });
        let result = match self.dispatch(call.clone()).await {
            Ok(result) => result,
            Err(refused) => return refused.answer(),
        };
        if result.code() != Some("requires_approval")
            || !context.peer.supported_elicitation_modes().contains(&ElicitationMode::Form)
        {
            return tools::call_result(&result, &self.options.how_to_approve);
        }
        let approval_id = result
            .metadata
            .as_ref()
            .and_then(|m| m.get("approvalId"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let message = format!(
            "The agent asks to run capability {} with arguments {}. Approve this one call?",
            call["slug"].as_str().unwrap_or_default(),
            call["arguments"]
        );
        let schema = serde_json::from_value(json!({
            "type": "object",
            "properties": {"approve": {"type": "boolean", "title": "Approve", "description": "Run this call once"}},
            "required": ["approve"]
        }));
        let Ok(requested_schema) = schema else {
            return tools::call_result(&result, &self.options.how_to_approve);
        };
        let params = ElicitRequestParams::FormElicitationParams { meta: None, message, requested_schema };
        let answer = match context.peer.create_elicitation_with_timeout(params, Some(ELICITATION_TIMEOUT)).await {
            Ok(answer) => answer,
            Err(err) => {
                tracing::debug!(%err, "approval elicitation failed; answering requires_approval");
                return tools::call_result(&result, &self.options.how_to_approve);
            }
        };
        let approved = answer.action == ElicitationAction::Accept
            && answer.content.as_ref().and_then(|c| c.get("approve")).and_then(Value::as_bool) != Some(false);
        let decided = DispatchAdmin::Decide { id: approval_id.clone(), approve: approved, by: "mcp".to_string() };
        match answer.action {
            ElicitationAction::Cancel => return tools::call_result(&result, &self.options.how_to_approve),
            _ => {
                if let Err(err) = self.bridge.call(move |api| api.dispatch_admin(decided)).await {
                    return api_error(&err);
                }
            }
        }
        if !approved {
            return tools::tool_error("approval_rejected", &format!("the user declined approval {approval_id}"));
        }
        call["approvalId"] = Value::String(approval_id);
        match self.dispatch(call).await {
            Ok(result) => tools::call_result(&result, &self.options.how_to_approve),
            Err(refused) => refused.answer(),
        }
    }

    async fn dispatch(&self, call: Value) -> Result<CallResult, Refusal> {
        let value = self.bridge.call(move |api| api.dispatch(call)).await.map_err(|err| refusal(&err))?;
        serde_json::from_value(value).map_err(|err| Refusal { code: "internal".into(), message: err.to_string() })
    }

    async fn call_direct(&self, tool: DirectTool, arguments: JsonObject) -> CallToolResult {
        let call = json!({"slug": tool.dispatch_id, "arguments": Value::Object(arguments), "agentId": self.agent_id()});
        match self.dispatch(call).await {
            Ok(result) => tools::call_result(&result, &self.options.how_to_approve),
            Err(refused) => refused.answer(),
        }
    }

    async fn call(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let arguments = request.arguments.unwrap_or_default();
        let name = request.name.as_ref();
        let answer = match name {
            "discover_capabilities" => match parse::<DiscoverArgs>(arguments) {
                Ok(args) => self.discover(args, context).await,
                Err(refused) => refused.answer(),
            },
            "call_capability" => match parse::<CallArgs>(arguments) {
                Ok(args) => self.call_capability(args, context).await,
                Err(refused) => refused.answer(),
            },
            "route_sources" => match parse::<ScgRouteRequest>(arguments) {
                Ok(route) => match self.bridge.call(move |api| api.scg_route(route)).await {
                    Ok(answer) => tools::structured(serde_json::to_value(answer).unwrap_or(Value::Null)),
                    Err(err) => api_error(&err),
                },
                Err(refused) => refused.answer(),
            },
            "report_outcome" => match parse::<OutcomeReport>(arguments) {
                Ok(report) => match self.bridge.call(move |api| api.outcome(report)).await {
                    Ok(recorded) => {
                        if let Some(events) = &self.options.outcome_events {
                            let _ = events.send(recorded.clone());
                        }
                        tools::structured(json!({
                        "accepted": true,
                        "duplicate": recorded.duplicate,
                        "kpi": recorded.kpi,
                        "alert": recorded.alert,
                        }))
                    }
                    Err(err) => api_error(&err),
                },
                Err(refused) => refused.answer(),
            },
            other => {
                let direct = self.lock().offered.iter().find(|tool| tool.tool_name == other).cloned();
                match direct {
                    Some(tool) => self.call_direct(tool, arguments).await,
                    None => return Err(McpError::invalid_params(format!("unknown tool {other:?}"), None)),
                }
            }
        };
        let label = if mcp_face::FIXED_TOOLS.contains(&name) { name.to_string() } else { "direct".to_string() };
        let code = answer
            .structured_content
            .as_ref()
            .and_then(|body| body.get("error"))
            .and_then(|error| error.get("code"))
            .and_then(Value::as_str)
            .unwrap_or("success")
            .to_string();
        metrics::counter!("capdex_mcp_calls_total", "tool" => label, "code" => code).increment(1);
        Ok(answer)
    }
}

/// A tool error before it becomes a result: the code and the message.
struct Refusal {
    code: String,
    message: String,
}

impl Refusal {
    fn answer(self) -> CallToolResult {
        tools::tool_error(&self.code, &self.message)
    }
}

/// Tool arguments into `T`; a mismatch is an `invalid_args` tool error.
fn parse<T: serde::de::DeserializeOwned>(arguments: JsonObject) -> Result<T, Refusal> {
    serde_json::from_value(Value::Object(arguments))
        .map_err(|err| Refusal { code: "invalid_args".into(), message: err.to_string() })
}

fn refusal(err: &ApiError) -> Refusal {
    Refusal { code: err.code().to_string(), message: err.message.clone() }
}

fn api_error(err: &ApiError) -> CallToolResult {
    refusal(err).answer()
}

/// The Tier 1 capabilities as `discover_capabilities` returns them.
fn tier1(result: &DiscoveryResult, descriptors: &[crate::core::descriptor::CapabilityDescriptor]) -> Vec<Value> {
    result
        .tier1
        .iter()
        .map(|entry| {
            let descriptor = descriptors.iter().find(|d| d.id == entry.id);
            json!({
                "id": entry.id,
                "name": descriptor.map_or(entry.id.as_str(), |d| d.name.as_str()),
                "kind": descriptor.map_or(Value::Null, |d| json!(d.kind)),
                "relevance": entry.relevance.clamp(0.0, 1.0),
                "summary": entry.summary_text,
            })
        })
        .collect()
}

/// The bearer token of an HTTP request's parts, if any.
fn bearer(context: &RequestContext<RoleServer>) -> Option<String> {
    let parts = context.extensions.get::<hyper::http::request::Parts>()?;
    let header = parts.headers.get(hyper::header::AUTHORIZATION)?.to_str().ok()?;
    header.strip_prefix("Bearer ").map(|token| token.trim().to_string())
}

/// True when an HTTP request asked for direct mode (`?direct=true`).
fn asks_direct(context: &RequestContext<RoleServer>) -> bool {
    context
        .extensions
        .get::<hyper::http::request::Parts>()
        .and_then(|parts| parts.uri.query())
        .is_some_and(|query| query.split('&').any(|pair| pair == "direct=true" || pair == "direct=1"))
}

impl ServerHandler for Session {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build())
            .with_server_info(
                Implementation::new("capdex", env!("CARGO_PKG_VERSION"))
                    .with_title("capdex: capability discovery and safe dispatch"),
            )
            .with_instructions(
                "Call discover_capabilities with what you need to do; it returns the relevant capabilities and their \
                 context. Run one with call_capability (its id and arguments). route_sources finds which connected \
                 source answers a question; report_outcome tells capdex how the turn went.",
            )
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        let agent = self.options.agent_for(bearer(&context).as_deref(), &request.client_info.name);
        {
            let mut state = self.lock();
            state.agent_id = Some(agent);
            state.direct |= asks_direct(&context);
        }
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut all = tools::fixed_tools();
        all.extend(self.lock().offered.iter().map(tools::direct_tool));
        let cursor = request.as_ref().and_then(|params| params.cursor.as_deref());
        let (range, next) =
            mcp_face::page(all.len(), cursor).map_err(|err| McpError::invalid_params(err.to_string(), None))?;
        let mut result = ListToolsResult::with_all_items(all.drain(range).collect());
        result.next_cursor = next;
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let cancelled = context.ct.clone();
        tokio::select! {
            answer = self.call(request, &context) => answer.map(CallToolResponse::from),
            _ = cancelled.cancelled() => Err(McpError::internal_error("the request was cancelled", None)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> FaceOptions {
        FaceOptions {
            agent_id: None,
            token: Some("0123456789abcdef".into()),
            token_agent_id: Some("desk".into()),
            direct: false,
            direct_max_tools: 8,
            how_to_approve: String::new(),
            outcome_events: None,
            max_json_depth: 64,
            max_id_bytes: 128,
        }
    }

    #[test]
    fn a_session_acts_as_the_token_then_the_config_then_the_client() {
        let options = options();
        assert_eq!(options.agent_for(Some("0123456789abcdef"), "claude"), "desk");
        assert_eq!(options.agent_for(Some("wrong"), "claude"), "mcp:claude");
        assert_eq!(options.agent_for(None, " \n"), "mcp");
        assert_eq!(options.agent_for(None, "My Client v1.2 *"), "mcp:My_Client_v1_2__");
        let long = options.agent_for(None, &"é".repeat(200));
        assert!(crate::core::subject_token::is_token(&long, 128), "{long}");
        assert_eq!(long.len(), 128, "as long as limits.max_id_bytes allows: {long}");
        let short = FaceOptions { max_id_bytes: 10, ..options.clone() };
        assert_eq!(short.agent_for(None, "abcdefghijkl"), "mcp:abcdef", "within the configured limits.max_id_bytes");
        let fixed = FaceOptions { agent_id: Some("ci".into()), ..options };
        assert_eq!(fixed.agent_for(None, "claude"), "ci");
        assert_eq!(fixed.agent_for(Some("0123456789abcdef"), "claude"), "desk");
    }
}
