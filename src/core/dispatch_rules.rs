//! Built-in capabilities (run by capdex itself, in-process) and argument
//! validation against a JSON Schema. The capability-call pipeline that uses
//! them is `core::dispatch`; the built-ins enter its registry through
//! `actors::dispatcher::builtin_records` (slug `echo`, descriptor `tool:echo`).

use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind, DefinitionRef};
use serde_json::{json, Value};

/// Why arguments were refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DispatchError {
    #[error("arguments do not match the input schema of {id}: {}", problems.join("; "))]
    InvalidArguments { id: String, problems: Vec<String> },
    #[error("the input schema of {id} is not a valid JSON schema: {problem}")]
    InvalidSchema { id: String, problem: String },
}

impl DispatchError {
    /// Returns the stable machine-readable code of the refusal.
    pub fn code(&self) -> &'static str {
        match self {
            DispatchError::InvalidArguments { .. } => "invalid_args",
            DispatchError::InvalidSchema { .. } => "invalid_schema",
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
                full_schema: Some(
                    json!({
                        "type": "object",
                        "properties": {"text": {"type": "string", "description": "Text to echo back"}},
                        "required": ["text"],
                        "additionalProperties": false
                    })
                    .into(),
                ),
                full_content: None,
                definition_ref: DefinitionRef::Builtin,
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

    #[test]
    fn echo_runs_and_arguments_are_validated() {
        let echo = Builtin::Echo.descriptor();
        assert_eq!(Builtin::find("tool:echo"), Some(Builtin::Echo));
        assert_eq!(Builtin::Echo.run(&json!({"text": "hi"})), json!({"text": "hi"}));
        let schema = echo.full_schema.unwrap().value();
        assert_eq!(validate_arguments("tool:echo", &schema, &json!({"text": "a"})), Ok(()));
        let err = validate_arguments("tool:echo", &schema, &json!({"text": 3})).unwrap_err();
        assert_eq!(err.code(), "invalid_args");
        match err {
            DispatchError::InvalidArguments { problems, .. } => {
                assert!(problems[0].starts_with("/text"), "{problems:?}")
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(validate_arguments("x", &json!({"type": 5}), &json!({})).unwrap_err().code(), "invalid_schema");
    }
}
