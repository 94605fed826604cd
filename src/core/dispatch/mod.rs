//! The capability-call pipeline, pure: registry records and bindings
//! (`registry`), the decision steps in the design's order (`pipeline`),
//! sliding-window rate limits (`rate_limit`), approvals (`approval`),
//! per-capability call figures and latency percentiles (`figures`),
//! what the shell does with a decision and which executor runs a call
//! (`plan`), the re-drive state machine (`redrive`), `${env:VAR}` templates
//! (`env_template`), the SSRF guard on resolved addresses (`ssrf`) and PII
//! redaction (`redact`).
//!
//! `docs/design/capability-dispatch.md` is the contract. The shells
//! (`actors::dispatcher`, `store::dispatch`, `gateway`) do the I/O.

pub mod approval;
pub mod env_template;
pub mod figures;
pub mod pipeline;
pub mod plan;
pub mod rate_limit;
pub mod redact;
pub mod redrive;
pub mod registry;
pub mod shared;
pub mod ssrf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Every refusal or failure code a call can answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    UnknownCapability,
    CapabilityInactive,
    CapabilityDisabledForAgent,
    RateLimited,
    RequiresApproval,
    /// An approval id that does not permit this call (unknown, pending,
    /// rejected, used, expired, or bound to other arguments).
    ApprovalInvalid,
    InvalidArgs,
    ExecutionError,
    InvalidBinding,
    /// The target address is private, loopback, link-local, ... and not allowlisted.
    TargetRefused,
    /// The request itself is malformed (missing agent, bad execution key).
    InvalidRequest,
    /// The capability's source is not connected (down, failed, or still starting); nothing ran.
    Unavailable,
    /// A `${env:VAR}` of the binding names a variable outside `[dispatch] env_allow`.
    EnvNotAllowed,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::UnknownCapability => "unknown_capability",
            ErrorCode::CapabilityInactive => "capability_inactive",
            ErrorCode::CapabilityDisabledForAgent => "capability_disabled_for_agent",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::RequiresApproval => "requires_approval",
            ErrorCode::ApprovalInvalid => "approval_invalid",
            ErrorCode::InvalidArgs => "invalid_args",
            ErrorCode::ExecutionError => "execution_error",
            ErrorCode::InvalidBinding => "invalid_binding",
            ErrorCode::TargetRefused => "target_refused",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::EnvNotAllowed => "env_not_allowed",
        }
    }

    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 13] = [
        ErrorCode::UnknownCapability,
        ErrorCode::CapabilityInactive,
        ErrorCode::CapabilityDisabledForAgent,
        ErrorCode::RateLimited,
        ErrorCode::RequiresApproval,
        ErrorCode::ApprovalInvalid,
        ErrorCode::InvalidArgs,
        ErrorCode::ExecutionError,
        ErrorCode::InvalidBinding,
        ErrorCode::TargetRefused,
        ErrorCode::InvalidRequest,
        ErrorCode::Unavailable,
        ErrorCode::EnvNotAllowed,
    ];

    /// Reads a wire code; `None` for a code of a handler service's own.
    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|known| known.as_str() == code)
    }

    /// True for the codes that refuse a call before any handler or endpoint
    /// is called; false for `execution_error` and for a handler's own codes.
    pub fn is_refusal(code: &str) -> bool {
        match ErrorCode::parse(code) {
            Some(ErrorCode::ExecutionError) | None => false,
            Some(
                ErrorCode::UnknownCapability
                | ErrorCode::CapabilityInactive
                | ErrorCode::CapabilityDisabledForAgent
                | ErrorCode::RateLimited
                | ErrorCode::RequiresApproval
                | ErrorCode::ApprovalInvalid
                | ErrorCode::InvalidArgs
                | ErrorCode::InvalidBinding
                | ErrorCode::TargetRefused
                | ErrorCode::InvalidRequest
                | ErrorCode::Unavailable
                | ErrorCode::EnvNotAllowed,
            ) => true,
        }
    }

    /// True for the codes the execution step answers (`execution_error`,
    /// `invalid_binding`, `target_refused`, `env_not_allowed`), the others come before it.
    pub fn is_from_execution(code: &str) -> bool {
        matches!(
            ErrorCode::parse(code),
            Some(
                ErrorCode::ExecutionError
                    | ErrorCode::InvalidBinding
                    | ErrorCode::TargetRefused
                    | ErrorCode::EnvNotAllowed
            )
        )
    }
}

/// `{code, message}` of a failed call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallError {
    pub code: String,
    pub message: String,
}

/// What every call answers: `{success, data?, error?, skipFollowup?, metadata?}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallResult {
    pub success: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CallError>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_followup: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

impl CallResult {
    pub fn ok(data: Value) -> CallResult {
        CallResult { success: true, data: Some(data), error: None, skip_followup: false, metadata: None }
    }

    pub fn fail(code: ErrorCode, message: impl Into<String>) -> CallResult {
        CallResult::fail_with(code.as_str(), message)
    }

    pub fn fail_with(code: &str, message: impl Into<String>) -> CallResult {
        CallResult {
            success: false,
            data: None,
            error: Some(CallError { code: code.to_string(), message: message.into() }),
            skip_followup: false,
            metadata: None,
        }
    }

    /// The error code, if the call failed.
    pub fn code(&self) -> Option<&str> {
        self.error.as_ref().map(|e| e.code.as_str())
    }

    /// Reads a handler's reply: an envelope, or an error naming what is wrong.
    pub fn from_handler_reply(bytes: &[u8]) -> Result<CallResult, String> {
        let result: CallResult = serde_json::from_slice(bytes)
            .map_err(|err| format!("the handler's reply is not a result envelope: {err}"))?;
        if result.success == result.error.is_some() {
            return Err("the handler's reply must carry an error exactly when success is false".into());
        }
        Ok(result)
    }
}

/// What is published on `<prefix>.events.dispatch` for every call: the
/// result and its cost, never arguments, data or secrets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DispatchEvent {
    /// The capability's slug, as the registry knows it.
    pub slug: String,
    /// The capability's discovery id (`tool:<slug>`, or a source capability's
    /// own id): what the outcome prior credits.
    #[serde(default)]
    pub capability_id: String,
    pub agent_id: String,
    pub success: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// `internal`, `api` or `webhook`; empty when the capability is unknown.
    pub execution_type: String,
    /// True when the result is the stored one of an earlier call of the same step.
    pub replayed: bool,
    /// True when a handler or endpoint was called for this event (not a
    /// refusal, not a replay): what per-capability success statistics count.
    pub handler_ran: bool,
    /// Time spent in capdex and the handler, in microseconds.
    pub latency_us: u64,
    /// Cost of the call in USD (0 for capability calls, as in the design's cost log).
    pub cost_usd: f64,
    pub at_ms: u64,
}

/// A call's audit row: redacted arguments and a redacted result preview of at most 480 characters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvenanceRecord {
    pub at_ms: u64,
    pub slug: String,
    pub agent_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    pub args: Value,
    pub result_preview: String,
    pub success: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    pub replayed: bool,
    pub latency_us: u64,
}

impl ProvenanceRecord {
    /// A successful call of `lookup` by agent `a` at `at_ms`, for tests anywhere in the crate.
    #[cfg(test)]
    pub(crate) fn test_record(at_ms: u64) -> ProvenanceRecord {
        ProvenanceRecord {
            at_ms,
            slug: "lookup".into(),
            agent_id: "a".into(),
            execution_key: None,
            approval_id: None,
            args: Value::Object(Default::default()),
            result_preview: "{}".into(),
            success: true,
            error_code: None,
            replayed: false,
            latency_us: 1,
        }
    }
}

/// What a handler service receives on `<prefix>.exec.<slug>` (JSON), and an in-process handler as its argument.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecRequest {
    pub slug: String,
    pub arguments: Value,
    pub agent_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// The agent's binding config as stored (`${env:VAR}` templates unresolved).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub custom_config: Value,
}

/// Why a request to a handler service got no reply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecFailure {
    #[error("no handler service answers {0}")]
    NoHandler(String),
    #[error("the handler did not answer within {0} ms")]
    TimedOut(u64),
    #[error("the request to the handler failed: {0}")]
    Transport(String),
}

/// Sends a call to the handler service of an internal capability (the
/// gateway implements it over NATS; benches and tests may bring their own).
pub trait ExecTransport {
    /// Sends `payload` (an [`ExecRequest`] as JSON) to the handler of `slug`; returns its reply.
    fn request(
        &self,
        slug: &str,
        payload: Vec<u8>,
        timeout_ms: u64,
    ) -> futures::future::LocalBoxFuture<'static, Result<Vec<u8>, ExecFailure>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_parse_back_and_only_execution_errors_are_not_refusals() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            assert_eq!(ErrorCode::is_refusal(code.as_str()), code != ErrorCode::ExecutionError, "{code:?}");
        }
        let names: std::collections::BTreeSet<&str> = ErrorCode::ALL.iter().map(|code| code.as_str()).collect();
        assert_eq!(names.len(), ErrorCode::ALL.len(), "codes are distinct");
        let from_execution: Vec<&str> =
            ErrorCode::ALL.iter().map(|code| code.as_str()).filter(|code| ErrorCode::is_from_execution(code)).collect();
        assert_eq!(from_execution, ["execution_error", "invalid_binding", "target_refused", "env_not_allowed"]);
        assert_eq!(ErrorCode::parse("out_of_stock"), None);
        assert!(!ErrorCode::is_refusal("out_of_stock"), "a handler's own code is not a refusal");
    }
}
