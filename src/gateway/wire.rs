//! API boundary: the v1 request and reply shapes on NATS, in JSON with
//! camelCase fields. Core types are reused where their shape is the wire shape.

use crate::core::descriptor::CapabilityKind;
use crate::core::discovery::{DiscoveryFilter, DiscoveryOverrides, DiscoveryResult};
use crate::core::kpi_window::{AlertEvent, Kpi, ToolSelectionMode};
use crate::core::limits::Limit;
use crate::core::turn_planner::{PlanError, PlanOverrides, TaskOutcome, ToolFailureMode, TurnPlan};
use crate::gateway::errors::ErrorKind;
use serde::{Deserialize, Serialize};

/// The longest discovery query accepted, in characters.
pub const MAX_QUERY_CHARS: usize = 16 * 1024;

/// `capdex.v1.discover` request.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiscoverRequest {
    /// The user's message for this turn.
    #[serde(alias = "query")]
    pub message: String,
    /// `tool`, `skill`, `extension`, `channel`, ... or `any` (the default).
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub category: Option<String>,
    #[serde(default)]
    pub only_available: bool,
    #[serde(default)]
    pub excluded_capability_ids: Vec<String>,
    /// Asks for the turn plan too (`{}` for the defaults), with the scope and overrides.
    #[serde(default)]
    pub plan: Option<PlanOptions>,
    /// Turns the outcome prior on or off for this query (default: `[discovery] outcome_prior`).
    #[serde(default)]
    pub outcome_prior: Option<bool>,
    /// Per-query settings: any of the `[discovery]` tier and ranking fields
    /// (`tier1TopK`, `tier2TokenBudget`, `lexicalWeight`, ...), each replacing the configured value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<DiscoveryOverrides>,
    /// Only the sources this workspace enabled (the rule `route` uses); capabilities
    /// of no source always pass. `None`: every source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// Explain each Tier 1 entry: the reply gains `explanations`, the signals
    /// that ranked it (`core::discovery::Explanation`). Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub explain: bool,
}

/// The turn-planning part of a request: the turn's scope and its overrides.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanOptions {
    #[serde(default)]
    pub turn_id: Option<String>,
    #[serde(default)]
    pub organization_id: Option<String>,
    #[serde(default)]
    pub persona_id: Option<String>,
    #[serde(default)]
    pub tool_failure_mode: Option<ToolFailureMode>,
    #[serde(default)]
    pub tool_selection_mode: Option<ToolSelectionMode>,
    /// `tool`, `skill`, `extension`, `channel`, ... or `any`.
    #[serde(default)]
    pub capability_discovery_kind: Option<String>,
    /// `success`, `partial`, `failed` or a score in [0, 1].
    #[serde(default)]
    pub task_outcome: Option<TaskOutcome>,
    #[serde(default)]
    pub task_success: Option<bool>,
}

impl PlanOptions {
    /// The planner's overrides.
    pub fn overrides(&self) -> PlanOverrides {
        PlanOverrides {
            tool_failure_mode: self.tool_failure_mode,
            tool_selection_mode: self.tool_selection_mode,
            capability_discovery_kind: self.capability_discovery_kind.clone(),
            task_outcome: self.task_outcome,
            task_success: self.task_success,
        }
    }
}

/// `capdex.v1.plan` request: a discovery query with the plan options at the top level.
///
/// It repeats the fields of [`DiscoverRequest`] and [`PlanOptions`] rather than
/// flattening them, because serde's `flatten` cannot be combined with
/// `deny_unknown_fields`, and unknown fields must be refused.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanRequest {
    #[serde(alias = "query")]
    pub message: String,
    #[serde(default)]
    pub category: Option<String>,
    #[serde(default)]
    pub only_available: bool,
    #[serde(default)]
    pub excluded_capability_ids: Vec<String>,
    #[serde(default)]
    pub turn_id: Option<String>,
    #[serde(default)]
    pub organization_id: Option<String>,
    #[serde(default)]
    pub persona_id: Option<String>,
    #[serde(default)]
    pub tool_failure_mode: Option<ToolFailureMode>,
    #[serde(default)]
    pub tool_selection_mode: Option<ToolSelectionMode>,
    #[serde(default)]
    pub capability_discovery_kind: Option<String>,
    #[serde(default)]
    pub task_outcome: Option<TaskOutcome>,
    #[serde(default)]
    pub task_success: Option<bool>,
    /// Turns the outcome prior on or off for this turn's discovery.
    #[serde(default)]
    pub outcome_prior: Option<bool>,
    /// Per-query discovery settings, as in [`DiscoverRequest::config`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<DiscoveryOverrides>,
    /// Only the sources this workspace enabled, as in [`DiscoverRequest::workspace`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

impl PlanRequest {
    /// Splits the request into its discovery query (validated against
    /// `limits`, its workspace within `max_id_bytes`) and plan options.
    pub fn into_discover(self, limits: &crate::core::limits::Limits) -> Result<DiscoverRequest, ApiError> {
        let options = PlanOptions {
            turn_id: self.turn_id,
            organization_id: self.organization_id,
            persona_id: self.persona_id,
            tool_failure_mode: self.tool_failure_mode,
            tool_selection_mode: self.tool_selection_mode,
            capability_discovery_kind: self.capability_discovery_kind,
            task_outcome: self.task_outcome,
            task_success: self.task_success,
        };
        let request = DiscoverRequest {
            message: self.message,
            kind: None,
            category: self.category,
            only_available: self.only_available,
            excluded_capability_ids: self.excluded_capability_ids,
            plan: Some(options),
            outcome_prior: self.outcome_prior,
            config: self.config,
            workspace: self.workspace,
            explain: false,
        };
        request.filter(limits)?;
        request.workspace(limits.max_id_bytes)?;
        Ok(request)
    }
}

/// A `capdex.v1.discover` reply: the discovery result, and the plan when asked for.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoverReply {
    #[serde(flatten)]
    pub result: DiscoveryResult,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<TurnPlan>,
}

/// A `capdex.v1.plan` reply.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanReply {
    pub plan: TurnPlan,
    /// The scope's KPI the plan was made with.
    pub kpi: Kpi,
    /// The discovery context for the prompt; `null` when discovery failed.
    pub discovery: Option<DiscoveryResult>,
    pub discovery_error: Option<String>,
}

/// What recording an outcome gave.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedOutcome {
    pub kpi: Kpi,
    pub alert: Option<AlertEvent>,
    pub duplicate: bool,
}

impl DiscoverRequest {
    /// Validates the request and returns the core filter: `excludedCapabilityIds`
    /// lists at most `limits.max_excluded_capabilities` ids (a 413
    /// `too_many_excluded`), each a capability id's length at most.
    pub fn filter(&self, limits: &crate::core::limits::Limits) -> Result<DiscoveryFilter, ApiError> {
        if self.message.trim().is_empty() {
            return Err(ApiError::bad_request("message must not be empty"));
        }
        if self.message.chars().count() > MAX_QUERY_CHARS {
            return Err(ApiError::bad_request(format!("message is longer than {MAX_QUERY_CHARS} characters")));
        }
        let plan_kind = self.plan.as_ref().and_then(|plan| plan.capability_discovery_kind.as_deref());
        let kind_text = match (self.kind.as_deref(), plan_kind) {
            (Some(kind), Some(plan_kind)) if kind != plan_kind => {
                return Err(ApiError::bad_request(format!(
                    "kind {kind:?} and plan.capabilityDiscoveryKind {plan_kind:?} disagree"
                )))
            }
            (kind, plan_kind) => kind.or(plan_kind),
        };
        let kind = match kind_text {
            None | Some("any") => None,
            Some(text) => Some(
                CapabilityKind::parse(text).ok_or_else(|| ApiError::bad_request(format!("unknown kind {text:?}")))?,
            ),
        };
        let excluded = self.excluded_capability_ids.len();
        crate::core::limits::check(Limit::ExcludedCapabilities, excluded, limits.max_excluded_capabilities).map_err(
            |exceeded| {
                ApiError::new(
                    ErrorKind::TooLarge(exceeded.limit.code()),
                    format!("excludedCapabilityIds lists {}", crate::core::limits::too_many_text(&exceeded, "ids")),
                )
            },
        )?;
        for id in &self.excluded_capability_ids {
            if let Some(problem) = crate::core::limits::capability_id_too_long(id, limits.max_id_bytes) {
                return Err(ApiError::bad_request(format!("excludedCapabilityIds[] {problem}")));
            }
        }
        Ok(DiscoveryFilter {
            kind,
            category: self.category.clone(),
            only_available: self.only_available,
            excluded_capability_ids: self.excluded_capability_ids.iter().cloned().collect(),
            outcome_prior: self.outcome_prior,
            // Filled in from `workspace` by the caller, which asks the SCG.
            sources: None,
        })
    }

    /// Returns the request's workspace, checked like the SCG's workspace
    /// names (`core::scg::source_id_problem`: at most `max_id_bytes`, `[limits]`).
    pub fn workspace(&self, max_id_bytes: usize) -> Result<Option<&str>, ApiError> {
        check_workspace(self.workspace.as_deref(), max_id_bytes)?;
        Ok(self.workspace.as_deref())
    }
}

/// Checks a request's `workspace` (discover, plan, route, observe) like the
/// SCG's workspace names: 1 to `max_id_bytes` (`[limits]`) of `[A-Za-z0-9._-]`,
/// a long one's refusal naming the setting.
pub fn check_workspace(workspace: Option<&str>, max_id_bytes: usize) -> Result<(), ApiError> {
    match workspace.and_then(|workspace| crate::core::scg::source_id_problem(workspace, max_id_bytes)) {
        Some(problem) => Err(ApiError::bad_request(format!("workspace {problem}"))),
        None => Ok(()),
    }
}

/// An error reply: its kind and a human-readable message. The body is
/// `{"code", "message"}`; the reply also carries `Nats-Service-Error` and
/// `Nats-Service-Error-Code` headers ([`ErrorKind::status_and_code`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
}

impl Serialize for ApiError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut body = serializer.serialize_struct("ApiError", 2)?;
        body.serialize_field("code", self.code())?;
        body.serialize_field("message", &self.message)?;
        body.end()
    }
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError { kind, message: message.into() }
    }

    /// The body's `code`.
    pub fn code(&self) -> &str {
        self.kind.status_and_code().1
    }

    /// The numeric code for the `Nats-Service-Error-Code` header (HTTP-like).
    pub fn status(&self) -> u16 {
        self.kind.status_and_code().0
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::BadRequest, message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Internal, message)
    }

    /// An actor (or the index log) did not answer: `503 unavailable` with `err` as the message.
    pub fn unavailable(err: impl std::fmt::Display) -> ApiError {
        ApiError::new(ErrorKind::Unavailable, err.to_string())
    }

    /// The request is not served by this node's API: `501 not_implemented`.
    pub fn not_implemented(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::NotImplemented, message)
    }

    /// A mutation was not applied here in time: `504 apply_timeout`.
    pub fn apply_timeout(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::ApplyTimeout, message)
    }
}

impl From<PlanError> for ApiError {
    fn from(err: PlanError) -> ApiError {
        ApiError::new(ErrorKind::from(&err), err.to_string())
    }
}

/// How a payload is encoded: JSON by default, msgpack when the request says
/// `Content-Type: application/msgpack` (the reply mirrors the request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Json,
    Msgpack,
}

/// The content type that selects msgpack.
pub const MSGPACK_CONTENT_TYPE: &str = "application/msgpack";

impl Codec {
    /// Picks the codec from a `Content-Type` header value.
    pub fn from_content_type(content_type: Option<&str>) -> Codec {
        match content_type {
            Some(value) if value.trim().eq_ignore_ascii_case(MSGPACK_CONTENT_TYPE) => Codec::Msgpack,
            _ => Codec::Json,
        }
    }

    /// Decodes a request, turning every failure into a `bad_request`.
    pub fn decode<T: serde::de::DeserializeOwned>(self, payload: &[u8], max_bytes: usize) -> Result<T, ApiError> {
        if payload.len() > max_bytes {
            return Err(ApiError::new(
                ErrorKind::PayloadTooLarge,
                format!("payload is {} bytes, the limit is {max_bytes}", payload.len()),
            ));
        }
        match self {
            Codec::Json => serde_json::from_slice(payload)
                .map_err(|err| ApiError::bad_request(format!("malformed request: {err}"))),
            Codec::Msgpack => rmp_serde::from_slice(payload)
                .map_err(|err| ApiError::bad_request(format!("malformed msgpack request: {err}"))),
        }
    }

    /// Encodes a reply or event.
    pub fn encode<T: Serialize>(self, value: &T) -> Result<Vec<u8>, ApiError> {
        match self {
            Codec::Json => {
                serde_json::to_vec(value).map_err(|err| ApiError::internal(format!("failed to encode: {err}")))
            }
            Codec::Msgpack => {
                rmp_serde::to_vec_named(value).map_err(|err| ApiError::internal(format!("failed to encode: {err}")))
            }
        }
    }
}

/// Checks a request body's nesting against `limits.max_json_depth` before it
/// is decoded: over it, 413 with the limit's code (`json_too_deep`) and a
/// message naming the setting.
pub fn check_body(codec: Codec, payload: &[u8], limits: &crate::core::limits::Limits) -> Result<(), ApiError> {
    let checked = match codec {
        Codec::Json => crate::core::limits::check_json(payload, limits),
        Codec::Msgpack => crate::core::limits::check_msgpack(payload, limits),
    };
    checked.map_err(ApiError::from)
}

impl From<crate::core::limits::LimitExceeded> for ApiError {
    fn from(exceeded: crate::core::limits::LimitExceeded) -> ApiError {
        ApiError::new(ErrorKind::TooLarge(exceeded.limit.code()), exceeded.to_string())
    }
}

/// Decodes a JSON request, turning every failure into a `bad_request`.
pub fn decode<T: serde::de::DeserializeOwned>(payload: &[u8], max_bytes: usize) -> Result<T, ApiError> {
    Codec::Json.decode(payload, max_bytes)
}

/// `capdex.v1.search` request: the `discover_capabilities` meta-tool's arguments.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SearchRequest {
    pub query: String,
    /// `tool`, `skill`, `extension`, `channel` or `any` (the default).
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub category: Option<String>,
    /// Only the sources this workspace enabled, as in [`DiscoverRequest::workspace`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

impl SearchRequest {
    /// The same query as a discovery request (validated by its `filter`).
    pub fn into_discover(self) -> DiscoverRequest {
        DiscoverRequest {
            message: self.query,
            kind: self.kind,
            category: self.category,
            workspace: self.workspace,
            ..DiscoverRequest::default()
        }
    }
}

/// `capdex.v1.capabilities.remove` request.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemoveRequest {
    #[serde(default)]
    pub runtime_id: Option<String>,
    pub ids: Vec<String>,
}

/// `capdex.v1.capabilities.list` request.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListRequest {
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub origin: Option<String>,
    /// Only capabilities whose id sorts after this one (the previous page's `next`).
    #[serde(default)]
    pub after: Option<String>,
    /// At most this many capabilities ([`LIST_PAGE_DEFAULT`] when absent, at most [`LIST_PAGE_MAX`]).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// The page size of `capabilities.list` when the request names none: small
/// enough that a page stays far under NATS's default 1 MiB payload limit.
pub const LIST_PAGE_DEFAULT: usize = 1_000;
/// The largest page `capabilities.list` answers.
pub const LIST_PAGE_MAX: usize = 5_000;

impl ListRequest {
    /// The page size asked for, checked.
    pub fn page_size(&self) -> Result<usize, ApiError> {
        match self.limit {
            None => Ok(LIST_PAGE_DEFAULT),
            Some(limit) if (1..=LIST_PAGE_MAX).contains(&limit) => Ok(limit),
            Some(limit) => Err(ApiError::bad_request(format!("limit {limit} must be 1 to {LIST_PAGE_MAX}"))),
        }
    }
}

/// The runtime id a registration belongs to: `default` when none is given;
/// letters, digits, `-` and `_`, at most `max_id_bytes` (`[limits]`).
pub fn runtime_id(given: Option<&str>, max_id_bytes: usize) -> Result<String, ApiError> {
    match given.map(str::trim) {
        None | Some("") => Ok("default".to_string()),
        Some(id) if !id.chars().all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)) => {
            Err(ApiError::bad_request(format!("runtimeId {id:?} must be letters, digits, '-' or '_'")))
        }
        Some(id) => match crate::core::subject_token::check("runtimeId", id, max_id_bytes) {
            Ok(()) => Ok(id.to_string()),
            Err(err) => Err(ApiError::bad_request(err.to_string())),
        },
    }
}

/// The reply to a registration change.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationReply {
    pub version: u64,
    pub added: Vec<String>,
    pub updated: Vec<String>,
    pub removed: Vec<String>,
    pub unchanged: usize,
    /// Items not indexed, each with its section, index or id, field and problem.
    pub diagnostics: Vec<serde_json::Value>,
}

/// `capdex.v1.outcome` reply.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutcomeReply {
    pub accepted: bool,
    /// The turn was already counted (a retry): the KPI did not change.
    pub duplicate: bool,
    pub kpi: Kpi,
}

/// `capdex.v1.map` request: one source, sent as a document or (when the server allows it) a path.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScgMapRequest {
    pub source_id: String,
    /// `openapi`, `mcp` or `sql`; inferred from the content when absent.
    #[serde(default)]
    pub kind: Option<String>,
    /// The source text as a string, or an OpenAPI / MCP document as JSON.
    #[serde(default)]
    pub document: Option<serde_json::Value>,
    /// A file on the server, read only below `scg.map_path_roots`.
    #[serde(default)]
    pub path: Option<String>,
    /// Workspaces that enable the source.
    #[serde(default)]
    pub workspaces: Vec<String>,
    /// The connector descriptor (URL, headers, credentials...): checked, counted, never stored.
    #[serde(default)]
    pub connection: Option<serde_json::Value>,
}

impl ScgMapRequest {
    /// Returns the kind, and the source text or path; exactly one of `document` and `path` must be given.
    pub fn source(&self) -> Result<(Option<crate::core::scg::model::SourceKind>, Result<String, String>), ApiError> {
        let kind = match self.kind.as_deref() {
            None => None,
            Some(text) => Some(
                crate::core::scg::model::SourceKind::parse(text)
                    .ok_or_else(|| ApiError::bad_request(format!("unknown kind {text:?}: use openapi, mcp or sql")))?,
            ),
        };
        let text = match (&self.document, &self.path) {
            (Some(serde_json::Value::String(text)), None) => Ok(text.clone()),
            (Some(document @ (serde_json::Value::Object(_) | serde_json::Value::Array(_))), None) => {
                Ok(document.to_string())
            }
            (Some(_), None) => return Err(ApiError::bad_request("document must be a string, an object or an array")),
            (None, Some(path)) if !path.trim().is_empty() => Err(path.clone()),
            _ => return Err(ApiError::bad_request("give exactly one of document and path")),
        };
        Ok((kind, text))
    }
}

/// `capdex.v1.route` request.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScgRouteRequest {
    pub query: String,
    /// Recipes wanted, 1 to 50 (default 5).
    #[serde(default)]
    pub k: Option<usize>,
    /// Only the sources this workspace enabled (none: no recipes); absent sees every source.
    #[serde(default)]
    pub workspace: Option<String>,
}

impl ScgRouteRequest {
    /// Validates the query and returns k.
    pub fn k(&self) -> Result<usize, ApiError> {
        use crate::core::scg::route::{DEFAULT_K, MAX_K};
        if self.query.trim().is_empty() {
            return Err(ApiError::bad_request("query must not be empty"));
        }
        if self.query.chars().count() > MAX_QUERY_CHARS {
            return Err(ApiError::bad_request(format!("query is longer than {MAX_QUERY_CHARS} characters")));
        }
        match self.k {
            None => Ok(DEFAULT_K),
            Some(k) if (1..=MAX_K).contains(&k) => Ok(k),
            Some(k) => Err(ApiError::bad_request(format!("k must be in 1..={MAX_K}, got {k}"))),
        }
    }
}

/// `capdex.v1.observe` request.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScgObserveRequest {
    /// A node id (16 hex digits) or source key (`<source_id>#<Name>`).
    pub node: String,
    /// Only these edge kinds; empty gives a survey for a large node.
    #[serde(default)]
    pub edge_kinds: Vec<String>,
    #[serde(default)]
    pub workspace: Option<String>,
}

impl ScgObserveRequest {
    /// Checks the node (no longer than a capability id: a source key is a
    /// source id, `#` and a name) and parses the edge kinds.
    pub fn edge_kinds(&self, max_id_bytes: usize) -> Result<Vec<crate::core::scg::model::EdgeKind>, ApiError> {
        if self.node.trim().is_empty() {
            return Err(ApiError::bad_request("node must not be empty"));
        }
        if let Some(problem) = crate::core::limits::capability_id_too_long(&self.node, max_id_bytes) {
            return Err(ApiError::bad_request(format!("node {problem}")));
        }
        self.edge_kinds
            .iter()
            .map(|text| {
                crate::core::scg::model::EdgeKind::parse(text)
                    .ok_or_else(|| ApiError::bad_request(format!("unknown edge kind {text:?}")))
            })
            .collect()
    }
}

/// `capdex.v1.memory.deposit` request: bound to a workspace or a session, not both.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScgDepositRequest {
    pub content: String,
    /// `positive` or `dead_end`.
    pub polarity: crate::core::scg::memory::Polarity,
    /// Node ids or source keys of nodes or recipes.
    pub anchors: Vec<String>,
    #[serde(default)]
    pub workspace: Option<String>,
    #[serde(default)]
    pub session: Option<String>,
}

impl ScgDepositRequest {
    /// Returns the deposit, labelled `ws:<workspace>` or `session:<session>`.
    pub fn deposit(&self) -> Result<crate::core::scg::memory::Deposit, ApiError> {
        let label = match (&self.workspace, &self.session) {
            (Some(workspace), None) => format!("ws:{workspace}"),
            (None, Some(session)) => format!("session:{session}"),
            _ => return Err(ApiError::bad_request("give exactly one of workspace and session")),
        };
        Ok(crate::core::scg::memory::Deposit {
            content: self.content.clone(),
            polarity: self.polarity,
            anchors: self.anchors.clone(),
            label,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::limits::Limits;

    #[test]
    fn requests_decode_and_validate() {
        let request: DiscoverRequest =
            decode(br#"{"message":"send a telegram","kind":"channel","onlyAvailable":true}"#, 1024).unwrap();
        assert_eq!(request.filter(&Limits::default()).unwrap().kind, Some(CapabilityKind::Channel));
        let request: DiscoverRequest = decode(br#"{"query":"x"}"#, 1024).unwrap();
        assert_eq!(request.message, "x");
        assert_eq!(decode::<DiscoverRequest>(b"{not json", 1024).unwrap_err().kind, ErrorKind::BadRequest);
        assert_eq!(
            decode::<DiscoverRequest>(br#"{"message":"x","bogus":1}"#, 1024).unwrap_err().kind,
            ErrorKind::BadRequest
        );
        assert_eq!(decode::<DiscoverRequest>(&[b' '; 2000], 1024).unwrap_err().kind, ErrorKind::PayloadTooLarge);
        let bad_kind = DiscoverRequest { message: "x".into(), kind: Some("gadget".into()), ..Default::default() };
        assert_eq!(bad_kind.filter(&Limits::default()).unwrap_err().kind, ErrorKind::BadRequest);
        assert_eq!(DiscoverRequest::default().filter(&Limits::default()).unwrap_err().kind, ErrorKind::BadRequest);
        let packed = rmp_serde::to_vec_named(&serde_json::json!({"message": "hi"})).unwrap();
        let request: DiscoverRequest =
            Codec::from_content_type(Some("application/msgpack")).decode(&packed, 1024).unwrap();
        assert_eq!(request.message, "hi");
        assert_eq!(runtime_id(None, 128).unwrap(), "default");
        assert!(runtime_id(Some("a b"), 128).is_err());
        for bad in ["a.b", "a*", ">", &"r".repeat(129)] {
            let err = runtime_id(Some(bad), 128).unwrap_err();
            assert!(err.message.contains("runtimeId"), "{}", err.message);
        }
        assert_eq!(runtime_id(Some(&"r".repeat(10)), 10).unwrap(), "r".repeat(10));
        let over = runtime_id(Some(&"r".repeat(11)), 10).unwrap_err();
        assert_eq!(over.code(), "bad_request");
        assert_eq!(over.message, "runtimeId is 11 bytes, over limits.max_id_bytes: at most 10");
        let with_plan: DiscoverRequest = decode(
            br#"{"message":"x","plan":{"organizationId":"acme","toolFailureMode":"fail_closed","taskOutcome":0.4,"capabilityDiscoveryKind":"skill"}}"#,
            1024,
        )
        .unwrap();
        assert_eq!(with_plan.filter(&Limits::default()).unwrap().kind, Some(CapabilityKind::Skill));
        let overrides = with_plan.plan.as_ref().unwrap().overrides();
        assert_eq!(
            (overrides.tool_failure_mode, overrides.task_outcome),
            (Some(ToolFailureMode::FailClosed), Some(TaskOutcome::Score(0.4)))
        );
        assert_eq!(
            decode::<DiscoverRequest>(br#"{"message":"x","plan":{"bogus":1}}"#, 1024).unwrap_err().kind,
            ErrorKind::BadRequest
        );
        let disagree = DiscoverRequest { kind: Some("tool".into()), ..with_plan };
        assert_eq!(disagree.filter(&Limits::default()).unwrap_err().kind, ErrorKind::BadRequest);
        let plan: PlanRequest =
            decode(br#"{"message":"x","taskOutcome":"partial","toolSelectionMode":"all"}"#, 1024).unwrap();
        assert!(plan.clone().into_discover(&Limits::default()).unwrap().plan.is_some());
        let in_workspace = |workspace: String| PlanRequest { workspace: Some(workspace), ..plan.clone() };
        let at_70 = Limits { max_id_bytes: 70, ..Limits::default() };
        assert!(in_workspace("w".repeat(70)).into_discover(&at_70).is_ok());
        let over = in_workspace("w".repeat(71)).into_discover(&at_70).unwrap_err();
        assert_eq!(over.kind, ErrorKind::BadRequest);
        assert_eq!(over.message, "workspace is 71 bytes, over limits.max_id_bytes: at most 70");
        assert_eq!(check_workspace(None, 70), Ok(()));
        assert_eq!(check_workspace(Some(&"w".repeat(70)), 70), Ok(()));
        assert_eq!(check_workspace(Some(&"w".repeat(71)), 70).unwrap_err().message, over.message);
        assert_eq!(check_workspace(Some("a b"), 70).unwrap_err().kind, ErrorKind::BadRequest);
        assert_eq!(
            decode::<PlanRequest>(br#"{"message":"x","toolFailureMode":"sometimes"}"#, 1024).unwrap_err().kind,
            ErrorKind::BadRequest
        );
    }

    #[test]
    fn a_query_excludes_max_excluded_capabilities_ids_and_one_more_is_refused_naming_the_setting() {
        let limits = Limits { max_excluded_capabilities: 3, max_id_bytes: 64, ..Limits::default() };
        let excluding = |ids: Vec<String>| DiscoverRequest {
            message: "x".into(),
            excluded_capability_ids: ids,
            ..DiscoverRequest::default()
        };
        let three = excluding(vec!["tool:c".into(), "tool:a".into(), "tool:a".into()]);
        let filter = three.filter(&limits).unwrap();
        assert_eq!(filter.excluded_capability_ids.iter().collect::<Vec<_>>(), ["tool:a", "tool:c"]);
        let four = excluding((0..4).map(|i| format!("tool:t{i}")).collect());
        let over = four.filter(&limits).unwrap_err();
        assert_eq!((over.status(), over.code()), (413, "too_many_excluded"));
        assert_eq!(over.message, "excludedCapabilityIds lists 4 ids, over limits.max_excluded_capabilities: at most 3");
        let plan = PlanRequest {
            message: "x".into(),
            excluded_capability_ids: four.excluded_capability_ids,
            ..PlanRequest::default()
        };
        assert_eq!(plan.into_discover(&limits).unwrap_err().code(), "too_many_excluded", "plan checks it too");
        let none = Limits { max_excluded_capabilities: 0, ..limits };
        assert!(excluding(vec![]).filter(&none).is_ok());
        assert_eq!(excluding(vec!["tool:a".into()]).filter(&none).unwrap_err().code(), "too_many_excluded");
        // Each id at most a capability id's longest: a source id, '#', a tool name.
        let longest = crate::core::limits::max_capability_id_bytes(64);
        assert!(excluding(vec!["x".repeat(longest)]).filter(&limits).is_ok());
        let long = excluding(vec!["x".repeat(longest + 1)]).filter(&limits).unwrap_err();
        assert_eq!(long.code(), "bad_request");
        assert!(
            long.message
                .starts_with(&format!("excludedCapabilityIds[] is {} bytes, over limits.max_id_bytes", longest + 1)),
            "{}",
            long.message
        );
    }

    #[test]
    fn a_subject_s_identity_is_the_body_s_or_the_body_is_refused() {
        use serde_json::json;
        let mut call = json!({"slug": "refund"});
        bind_identity(&mut call, "agentId", "alpha", 128).unwrap();
        assert_eq!(call["agentId"], "alpha", "an absent agentId is the subject's");
        let mut null = json!({"agentId": null});
        bind_identity(&mut null, "agentId", "alpha", 128).unwrap();
        assert_eq!(null["agentId"], "alpha");
        let mut same = json!({"agentId": "alpha"});
        bind_identity(&mut same, "agentId", "alpha", 128).unwrap();
        for other in [json!({"agentId": "beta"}), json!({"agentId": 7}), json!({"agentId": "Alpha"})] {
            let mut body = other.clone();
            let err = bind_identity(&mut body, "agentId", "alpha", 128).unwrap_err();
            assert_eq!((err.status(), err.code()), (403, "identity_mismatch"), "{other}");
            assert_eq!(body, other, "a refused body is unchanged");
        }
        assert_eq!(bind_identity(&mut json!([1]), "agentId", "alpha", 128).unwrap_err().code(), "bad_request");
        assert_eq!(bind_identity(&mut json!({}), "by", "a b", 128).unwrap_err().code(), "bad_request");
        assert!(bind_identity(&mut json!({}), "agentId", "alpha", 5).is_ok(), "at the limit");
        let over = bind_identity(&mut json!({}), "agentId", "alphas", 5).unwrap_err();
        assert_eq!(
            (over.code(), over.message.as_str()),
            ("bad_request", "agentId is 6 bytes, over limits.max_id_bytes: at most 5")
        );
    }

    #[test]
    fn a_decision_names_who_decides_or_is_the_nats_api_s() {
        use serde_json::json;
        assert_eq!(DecideRequest::decider(json!({}), 128).unwrap(), NATS_DECIDER);
        assert_eq!(DecideRequest::decider(json!({"by": null}), 128).unwrap(), NATS_DECIDER);
        assert_eq!(DecideRequest::decider(json!({"by": "alice@ops"}), 128).unwrap(), "alice@ops");
        assert_eq!(DecideRequest::decider(json!({"by": "x".repeat(70)}), 70).unwrap(), "x".repeat(70));
        let over = DecideRequest::decider(json!({"by": "x".repeat(71)}), 70).unwrap_err();
        assert_eq!(over.message, "by is 71 bytes, over limits.max_id_bytes: at most 70");
        for bad in [
            json!({"by": "a\tb"}),
            json!({"by": "x".repeat(129)}),
            json!({"by": ""}),
            json!({"by": 3}),
            json!({"who": "a"}),
        ] {
            let err = DecideRequest::decider(bad.clone(), 128).unwrap_err();
            assert_eq!((err.status(), err.code()), (400, "bad_request"), "{bad}");
        }
    }

    #[test]
    fn error_bodies_are_code_then_message() {
        /// The body as it was written before kinds: two string fields, in this order.
        #[derive(Serialize)]
        struct Body<'a> {
            code: &'a str,
            message: &'a str,
        }
        let cases = [
            ApiError::unavailable("mailbox closed"),
            ApiError::bad_request("message must not be empty"),
            ApiError::from(PlanError::DiscoveryFailed("down".into())),
            ApiError::new(ErrorKind::TooLarge("too_large"), "big"),
            ApiError::new(ErrorKind::Conflict("builtin"), "tool:echo is a built-in capability"),
        ];
        for err in cases {
            let body = Body { code: err.code(), message: &err.message };
            assert_eq!(Codec::Json.encode(&err).unwrap(), Codec::Json.encode(&body).unwrap(), "{err:?}");
            assert_eq!(Codec::Msgpack.encode(&err).unwrap(), Codec::Msgpack.encode(&body).unwrap(), "{err:?}");
        }
        let err = ApiError::unavailable("mailbox closed");
        assert_eq!((err.status(), err.code()), (503, "unavailable"));
        assert_eq!(serde_json::to_string(&err).unwrap(), r#"{"code":"unavailable","message":"mailbox closed"}"#);
        let err = ApiError::from(PlanError::DiscoveryFailed("down".into()));
        assert_eq!((err.status(), err.code()), (503, "discovery_failed"));
        assert_eq!(err.message, "discovery failed and the tool failure mode is fail_closed: down");
    }
}

/// A dispatch admin request: the registry, bindings, approvals and provenance.
#[derive(Clone, Debug, PartialEq)]
pub enum DispatchAdmin {
    /// `capability.register`: a capability record.
    Register(serde_json::Value),
    /// `capability.update`: a whole capability record.
    Update(serde_json::Value),
    /// `capability.list`.
    List,
    /// `capability.reload`.
    Reload,
    /// `binding.set`: a binding.
    SetBinding(serde_json::Value),
    /// `binding.list`: `{agentId?}`.
    ListBindings(serde_json::Value),
    /// `approval.list`: `{all?: bool}`.
    ListApprovals(serde_json::Value),
    /// `approval.<id>.approve` / `approval.<id>.reject`; `by` is who decides
    /// (the body's `by`, else `nats`; `cli` or `--by` from the CLI, `mcp` from the MCP face).
    Decide { id: String, approve: bool, by: String },
    /// `provenance.list`: `{limit?}`.
    ListProvenance(serde_json::Value),
}

/// The optional body of `approval.<id>.approve|reject`: `{"by": "..."}`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DecideRequest {
    #[serde(default)]
    pub by: Option<String>,
}

/// Who decides an approval over NATS when the request does not say.
pub const NATS_DECIDER: &str = "nats";

impl DecideRequest {
    /// Reads the body (an empty body is `{}`) and returns who decides: its
    /// `by`, checked (`core::dispatch::approval::check_decider`: not blank, at
    /// most `max_id_bytes` bytes (`[limits]`), printable), else [`NATS_DECIDER`].
    pub fn decider(body: serde_json::Value, max_id_bytes: usize) -> Result<String, ApiError> {
        let request: DecideRequest = serde_json::from_value(body)
            .map_err(|err| ApiError::bad_request(format!("malformed approval decision: {err}")))?;
        match request.by {
            None => Ok(NATS_DECIDER.to_string()),
            Some(by) => {
                crate::core::dispatch::approval::check_decider(&by, max_id_bytes)
                    .map_err(|problem| ApiError::bad_request(problem.to_string()))?;
                Ok(by)
            }
        }
    }
}

/// Binds a request body to the identity its subject proves
/// (`<prefix>.agent.<agentId>.*`, `<prefix>.approver.<name>.*`): the body's
/// `field` (`agentId`, `by`) is set to `proven` when absent or null, and a
/// body that names anyone else is refused (403 `identity_mismatch`), never
/// silently re-addressed. `proven` must be a subject token of at most
/// `max_id_bytes` (`subject_token::check`).
pub fn bind_identity(
    body: &mut serde_json::Value,
    field: &str,
    proven: &str,
    max_id_bytes: usize,
) -> Result<(), ApiError> {
    crate::core::subject_token::check(field, proven, max_id_bytes)
        .map_err(|problem| ApiError::bad_request(problem.to_string()))?;
    let Some(object) = body.as_object_mut() else {
        return Err(ApiError::bad_request(format!("the request must be a JSON object with an optional {field}")));
    };
    match object.get(field) {
        None | Some(serde_json::Value::Null) => {
            object.insert(field.to_string(), serde_json::Value::String(proven.to_string()));
            Ok(())
        }
        Some(serde_json::Value::String(named)) if named == proven => Ok(()),
        Some(named) => Err(ApiError::new(
            ErrorKind::Forbidden("identity_mismatch"),
            format!("{field} {named} is not {proven:?}, the identity this subject is restricted to"),
        )),
    }
}

/// A live-sources request, its body as JSON (the settings are checked by `core::sources`).
#[derive(Clone, Debug, PartialEq)]
pub enum SourcesRequest {
    /// `sources.add`: one source's settings.
    Add(serde_json::Value),
    /// `sources.remove`: `{id}`.
    Remove(serde_json::Value),
    /// `sources.list`.
    List,
    /// `sources.load`: `{id}`.
    Load(serde_json::Value),
}
