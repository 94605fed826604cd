//! Dispatch rules: may this call run, and what does a built-in return.
//!
//! The skeleton pipeline is: resolve the capability → check it is available →
//! validate the arguments against its input JSON schema → run it (built-ins
//! only, for now). Every refusal is a typed [`DispatchError`] with a stable code.

use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind, SourceRef};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A request to run one capability.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DispatchRequest {
    pub capability_id: String,
    #[serde(default)]
    pub arguments: Value,
    /// Repeating a key returns the first result instead of running again.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// The longest idempotency key accepted, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 200;

/// Why a call was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DispatchError {
    #[error("unknown capability {0}")]
    UnknownCapability(String),
    #[error("capability {0} is not available")]
    NotAvailable(String),
    #[error("arguments do not match the input schema of {id}: {}", problems.join("; "))]
    InvalidArguments { id: String, problems: Vec<String> },
    #[error("the input schema of {id} is not a valid JSON schema: {problem}")]
    InvalidSchema { id: String, problem: String },
    #[error("capability {0} has no executor on this node")]
    NotExecutable(String),
    #[error("idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes")]
    BadIdempotencyKey,
}

impl DispatchError {
    /// Returns the stable machine-readable code of the refusal.
    pub fn code(&self) -> &'static str {
        match self {
            DispatchError::UnknownCapability(_) => "unknown_capability",
            DispatchError::NotAvailable(_) => "not_available",
            DispatchError::InvalidArguments { .. } => "invalid_arguments",
            DispatchError::InvalidSchema { .. } => "invalid_schema",
            DispatchError::NotExecutable(_) => "not_executable",
            DispatchError::BadIdempotencyKey => "bad_idempotency_key",
        }
    }
}

/// Capabilities capdex runs itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    Echo,
}

impl Builtin {
    pub const ALL: [Builtin; 1] = [Builtin::Echo];

    pub fn id(self) -> &'static str {
        match self {
            Builtin::Echo => "tool:echo",
        }
    }

    /// Returns the built-in with `id`, if any.
    pub fn find(id: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|builtin| builtin.id() == id)
    }

    /// Returns the descriptor capdex indexes for this built-in.
    pub fn descriptor(self) -> CapabilityDescriptor {
        match self {
            Builtin::Echo => CapabilityDescriptor {
                id: "tool:echo".into(),
                kind: CapabilityKind::Tool,
                name: "echo".into(),
                display_name: "Echo".into(),
                description:
                    "Echoes the given text back unchanged; a built-in capability for testing the dispatch pipeline."
                        .into(),
                category: "developer-tools".into(),
                tags: vec!["echo".into(), "test".into(), "debug".into()],
                required_secrets: vec![],
                required_tools: vec![],
                available: true,
                has_side_effects: Some(false),
                full_schema: Some(json!({
                    "type": "object",
                    "properties": {"text": {"type": "string", "description": "Text to echo back"}},
                    "required": ["text"],
                    "additionalProperties": false
                })),
                full_content: None,
                source_ref: SourceRef::Builtin,
            },
        }
    }

    /// Runs the built-in on validated arguments.
    pub fn run(self, arguments: &Value) -> Value {
        match self {
            Builtin::Echo => json!({ "text": arguments.get("text").cloned().unwrap_or(Value::Null) }),
        }
    }
}

/// Checks a request against the capability it names; returns the built-in to run.
pub fn check(request: &DispatchRequest, descriptor: Option<&CapabilityDescriptor>) -> Result<Builtin, DispatchError> {
    if let Some(key) = &request.idempotency_key {
        if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
            return Err(DispatchError::BadIdempotencyKey);
        }
    }
    let id = &request.capability_id;
    let descriptor = descriptor.ok_or_else(|| DispatchError::UnknownCapability(id.clone()))?;
    if !descriptor.available {
        return Err(DispatchError::NotAvailable(id.clone()));
    }
    if let Some(schema) = &descriptor.full_schema {
        validate_arguments(id, schema, &request.arguments)?;
    }
    Builtin::find(id).ok_or_else(|| DispatchError::NotExecutable(id.clone()))
}

/// Validates `arguments` against a JSON schema, listing every problem with its path.
pub fn validate_arguments(id: &str, schema: &Value, arguments: &Value) -> Result<(), DispatchError> {
    let validator = jsonschema::validator_for(schema)
        .map_err(|err| DispatchError::InvalidSchema { id: id.to_string(), problem: err.to_string() })?;
    let problems: Vec<String> = validator
        .iter_errors(arguments)
        .take(20)
        .map(|err| {
            let path = err.instance_path().to_string();
            if path.is_empty() {
                err.to_string()
            } else {
                format!("{path}: {err}")
            }
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(DispatchError::InvalidArguments { id: id.to_string(), problems })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str, arguments: Value) -> DispatchRequest {
        DispatchRequest { capability_id: id.into(), arguments, idempotency_key: None }
    }

    #[test]
    fn echo_runs_on_valid_arguments() {
        let echo = Builtin::Echo.descriptor();
        let builtin = check(&request("tool:echo", json!({"text": "hi"})), Some(&echo)).unwrap();
        assert_eq!(builtin.run(&json!({"text": "hi"})), json!({"text": "hi"}));
    }

    #[test]
    fn refusals_have_codes() {
        let echo = Builtin::Echo.descriptor();
        let code = |req: DispatchRequest, d: Option<&CapabilityDescriptor>| check(&req, d).unwrap_err().code();
        assert_eq!(code(request("tool:nope", json!({})), None), "unknown_capability");
        assert_eq!(code(request("tool:echo", json!({"text": 3})), Some(&echo)), "invalid_arguments");
        assert_eq!(code(request("tool:echo", json!({"text": "a", "extra": 1})), Some(&echo)), "invalid_arguments");
        let mut off = echo.clone();
        off.available = false;
        assert_eq!(code(request("tool:echo", json!({"text": "a"})), Some(&off)), "not_available");
        let mut other = echo.clone();
        other.id = "tool:other".into();
        assert_eq!(code(request("tool:other", json!({"text": "a"})), Some(&other)), "not_executable");
        let mut keyed = request("tool:echo", json!({"text": "a"}));
        keyed.idempotency_key = Some(String::new());
        assert_eq!(code(keyed, Some(&echo)), "bad_idempotency_key");
        match check(&request("tool:echo", json!({"text": 3})), Some(&echo)) {
            Err(DispatchError::InvalidArguments { problems, .. }) => {
                assert!(problems[0].starts_with("/text"), "{problems:?}")
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
