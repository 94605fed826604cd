//! Registry records and per-agent bindings, and the checks a registration
//! must pass: slug equals the function definition's name, a valid JSON
//! Schema, a URL handler for `api` and `webhook`, limits in range, and no
//! PII-processing capability without a redaction rule.

use crate::core::compact_json::CompactJson;
use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind, DefinitionRef};
use crate::core::dispatch::env_template::{self, EnvAllow, EnvRefusal};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// How a capability runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionType {
    /// A handler service answering `<prefix>.exec.<slug>` (or an in-process handler).
    Internal,
    /// An HTTP request whose response is the result.
    Api,
    /// A fire-and-forget HTTP POST.
    Webhook,
    /// A tool or operation of a source (`core::sources`), run through the
    /// source's session; made by capdex, never registered.
    Source,
}

impl ExecutionType {
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionType::Internal => "internal",
            ExecutionType::Api => "api",
            ExecutionType::Webhook => "webhook",
            ExecutionType::Source => "source",
        }
    }
}

/// The OpenAI-compatible function definition the model sees.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// A JSON Schema for the arguments.
    #[serde(default = "empty_object_schema")]
    pub parameters: Value,
}

fn empty_object_schema() -> Value {
    json!({"type": "object"})
}

/// How a PII-processing capability's calls are redacted in provenance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedactionRule {
    /// Keys whose values become `[redacted:<key>]`, at any depth of arguments and result.
    #[serde(default)]
    pub redact_keys: Vec<String>,
    /// Keys whose values are masked as emails (first character and TLD kept).
    #[serde(default)]
    pub email_keys: Vec<String>,
    /// Keys whose values are masked as phone numbers (last 4 digits kept).
    #[serde(default)]
    pub phone_keys: Vec<String>,
    /// Keys whose values are masked as bearer tokens.
    #[serde(default)]
    pub token_keys: Vec<String>,
    /// Replace the whole arguments by `[redacted:args]`.
    #[serde(default)]
    pub redact_all_args: bool,
    /// Replace the whole result by `[redacted:result]`.
    #[serde(default)]
    pub redact_all_result: bool,
}

fn yes() -> bool {
    true
}

/// One registered capability.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapabilityRecord {
    pub slug: String,
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub category: String,
    pub execution_type: ExecutionType,
    /// internal: the handler's name (an in-process handler of that name runs
    /// in capdex, otherwise the call goes to `<prefix>.exec.<slug>`);
    /// api and webhook: the URL; source: the source id.
    #[serde(alias = "executionHandler")]
    pub handler: String,
    pub function_definition: FunctionDefinition,
    #[serde(default)]
    pub requires_approval: bool,
    /// How long an approval stays valid, in ms (default: the `dispatch.approval_ttl_ms` setting).
    #[serde(default)]
    pub approval_timeout_ms: Option<u64>,
    /// Calls per minute per agent; `null` is unlimited.
    #[serde(default)]
    pub rate_limit: Option<u32>,
    /// True opts out of the re-drive cache (the destination deduplicates).
    #[serde(default)]
    pub is_idempotent: bool,
    #[serde(default = "yes")]
    pub is_active: bool,
    #[serde(default)]
    pub processes_pii: bool,
    /// Required when `processesPii` is true.
    #[serde(default)]
    pub redaction: Option<RedactionRule>,
    /// The longest a call may run, in ms (default: `dispatch.default_timeout_ms`).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Set by capdex: 1 on register, +1 on every update. Approvals are bound to it.
    #[serde(default)]
    pub policy_version: u64,
    /// True keeps the capability out of discovery (it stays callable).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hidden: bool,
    /// A source record's invocation (set by capdex; `None` for every other record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation: Option<crate::core::sources::Invocation>,
}

impl CapabilityRecord {
    /// Returns the descriptor that offers this record to discovery (origin
    /// `dispatch`): id `tool:<slug>`, kind tool, named by its slug (the
    /// function name a model calls) and displayed under its `name`, with the
    /// record's description and category (`general` when it has none) and the
    /// function's parameters as Tier 2.
    pub fn descriptor(&self) -> CapabilityDescriptor {
        let category = if self.category.trim().is_empty() { "general" } else { self.category.trim() };
        CapabilityDescriptor {
            id: self.discovery_id(),
            kind: CapabilityKind::Tool,
            name: self.slug.clone(),
            display_name: self.name.clone(),
            description: self.description.clone(),
            category: category.to_string(),
            tags: Vec::new(),
            required_secrets: Vec::new(),
            required_tools: Vec::new(),
            available: self.is_active,
            has_side_effects: None,
            full_schema: Some(CompactJson::new(&self.function_definition.parameters)),
            full_content: None,
            definition_ref: DefinitionRef::Tool,
        }
    }

    /// True when the registry offers this record to discovery: active, not hidden, not a source's.
    pub fn is_discoverable(&self) -> bool {
        self.is_active && !self.hidden && self.execution_type != ExecutionType::Source
    }

    /// Returns the capability's one discovery id: `tool:<slug>`, or a source
    /// capability's own id (`<source_id>#<Name>`, its slug).
    pub fn discovery_id(&self) -> String {
        match self.execution_type {
            ExecutionType::Source => self.slug.clone(),
            _ => format!("tool:{}", self.slug),
        }
    }
}

/// An agent's binding to a capability.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Binding {
    pub agent_id: String,
    pub slug: String,
    #[serde(default = "yes")]
    pub is_enabled: bool,
    /// Overrides the capability's `rateLimit` for this agent; `null` uses it.
    #[serde(default)]
    pub custom_rate_limit: Option<u32>,
    /// Per-agent JSON (for api/webhook: `url`, `headers`, values may hold `${env:VAR}`).
    #[serde(default)]
    pub custom_config: Value,
}

/// Why a registration or binding was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct RegistrationError {
    pub field: String,
    pub problem: String,
}

impl RegistrationError {
    /// The stable code: `slug_mismatch`, `pii_without_redaction` or `invalid_registration`.
    pub fn code(&self) -> &'static str {
        match self.field.as_str() {
            "functionDefinition.name" => "slug_mismatch",
            "redaction" => "pii_without_redaction",
            _ => "invalid_registration",
        }
    }
}

fn refuse(field: &str, problem: impl Into<String>) -> RegistrationError {
    RegistrationError { field: field.to_string(), problem: problem.into() }
}

/// Most calls per minute a rate limit may allow.
pub const MAX_RATE_LIMIT: u32 = 10_000;
/// Longest approval timeout, in ms (one hour).
pub const MAX_APPROVAL_TIMEOUT_MS: u64 = 3_600_000;
/// Longest call timeout, in ms.
pub const MAX_CALL_TIMEOUT_MS: u64 = 600_000;

/// A slug: 1 to 64 of `A-Z a-z 0-9 _ -` (an OpenAI function name, and a NATS subject token).
pub fn valid_slug(slug: &str) -> bool {
    (1..=64).contains(&slug.len()) && slug.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// An id (execution, step): not empty, no control characters; its length is
/// checked against `[limits] max_id_bytes` (`subject_token::check_len`).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && !id.chars().any(char::is_control)
}

/// `http://` or `https://` followed by a host.
pub fn looks_like_http_url(text: &str) -> bool {
    let rest = text.strip_prefix("https://").or_else(|| text.strip_prefix("http://"));
    rest.is_some_and(|rest| rest.split(['/', '?', '#']).next().is_some_and(|host| !host.is_empty()))
}

fn check_limit(field: &str, limit: Option<u32>) -> Result<(), RegistrationError> {
    match limit {
        Some(n) if !(1..=MAX_RATE_LIMIT).contains(&n) => {
            Err(refuse(field, format!("must be 1..={MAX_RATE_LIMIT} or null, got {n}")))
        }
        _ => Ok(()),
    }
}

/// Checks a record before it enters the registry; its slug is at most
/// `max_id_bytes` (`[limits]`) as well as 64 bytes.
pub fn validate_record(record: &CapabilityRecord, max_id_bytes: usize) -> Result<(), RegistrationError> {
    if let Err(exceeded) = crate::core::subject_token::check_len(&record.slug, max_id_bytes) {
        return Err(refuse("slug", crate::core::subject_token::too_long_text(&exceeded)));
    }
    if !valid_slug(&record.slug) {
        return Err(refuse("slug", format!("must be 1-64 of A-Z a-z 0-9 _ -, got {:?}", record.slug)));
    }
    if record.function_definition.name != record.slug {
        return Err(refuse(
            "functionDefinition.name",
            format!("must equal the slug {:?}, got {:?}", record.slug, record.function_definition.name),
        ));
    }
    if record.name.trim().is_empty() {
        return Err(refuse("name", "must not be empty"));
    }
    if let Err(err) = jsonschema::validator_for(&record.function_definition.parameters) {
        return Err(refuse("functionDefinition.parameters", format!("is not a valid JSON Schema: {err}")));
    }
    match record.execution_type {
        ExecutionType::Internal if record.handler.trim().is_empty() => {
            return Err(refuse("handler", "an internal capability needs a handler name"))
        }
        ExecutionType::Api | ExecutionType::Webhook if !looks_like_http_url(&record.handler) => {
            return Err(refuse("handler", format!("must be an http(s) URL, got {:?}", record.handler)))
        }
        ExecutionType::Source => {
            return Err(refuse("executionType", "source capabilities are made by capdex from their source"))
        }
        _ => {}
    }
    if record.invocation.is_some() {
        return Err(refuse("invocation", "is set by capdex for source capabilities only"));
    }
    check_limit("rateLimit", record.rate_limit)?;
    if record.approval_timeout_ms.is_some_and(|ms| ms == 0 || ms > MAX_APPROVAL_TIMEOUT_MS) {
        return Err(refuse("approvalTimeoutMs", format!("must be 1..={MAX_APPROVAL_TIMEOUT_MS}")));
    }
    if record.timeout_ms.is_some_and(|ms| ms == 0 || ms > MAX_CALL_TIMEOUT_MS) {
        return Err(refuse("timeoutMs", format!("must be 1..={MAX_CALL_TIMEOUT_MS}")));
    }
    if record.processes_pii && record.redaction.is_none() {
        return Err(refuse("redaction", "a capability that processes PII needs a redaction rule"));
    }
    Ok(())
}

/// Checks a binding; returns the `${env:VAR}` names its config refers to
/// that `lookup` does not know (warnings: the calls would fail with `invalid_binding`).
pub fn validate_binding(
    binding: &Binding,
    lookup: &dyn Fn(&str) -> Option<String>,
    max_id_bytes: usize,
) -> Result<Vec<String>, RegistrationError> {
    if let Err(err) = crate::core::subject_token::check("agentId", &binding.agent_id, max_id_bytes) {
        return Err(refuse("agentId", crate::core::subject_token::problem_text(&err)));
    }
    if let Some(problem) = crate::core::limits::capability_id_too_long(&binding.slug, max_id_bytes) {
        return Err(refuse("slug", problem));
    }
    let source_capability = !binding.slug.chars().any(char::is_control)
        && crate::core::sources::split_capability_id(&binding.slug).is_some();
    if !valid_slug(&binding.slug) && !source_capability {
        return Err(refuse(
            "slug",
            format!("must be 1-64 of A-Z a-z 0-9 _ - (or a source capability id), got {:?}", binding.slug),
        ));
    }
    check_limit("customRateLimit", binding.custom_rate_limit)?;
    let config = HttpConfig::parse(&binding.custom_config).map_err(|problem| refuse("customConfig", problem))?;
    let mut missing: Vec<String> = config
        .templates()
        .flat_map(env_template::references)
        .filter(|name| lookup(name).is_none_or(|value| value.is_empty()))
        .collect();
    missing.sort();
    missing.dedup();
    Ok(missing)
}

/// A `${env:VAR}` outside `[dispatch] env_allow`, and the field holding it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {refusal}")]
pub struct EnvNotAllowed {
    pub field: String,
    pub refusal: EnvRefusal,
}

impl EnvNotAllowed {
    /// The stable code, `env_not_allowed`.
    pub fn code(&self) -> &'static str {
        self.refusal.code()
    }
}

/// Refuses a record whose `handler` (an `api`/`webhook` URL) reads a
/// variable `allow` does not permit; the call would be refused anyway.
pub fn check_record_env(record: &CapabilityRecord, allow: &EnvAllow) -> Result<(), EnvNotAllowed> {
    match record.execution_type {
        ExecutionType::Api | ExecutionType::Webhook => match allow.refused_in(&record.handler) {
            Some(refusal) => Err(EnvNotAllowed { field: "handler".into(), refusal }),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Refuses a binding whose `customConfig` `url` or header values read a
/// variable `allow` does not permit (a config that does not parse is
/// [`validate_binding`]'s to refuse).
pub fn check_binding_env(binding: &Binding, allow: &EnvAllow) -> Result<(), EnvNotAllowed> {
    let Ok(config) = HttpConfig::parse(&binding.custom_config) else { return Ok(()) };
    let fields = config
        .url
        .iter()
        .map(|url| ("customConfig.url".to_string(), url.as_str()))
        .chain(config.headers.iter().map(|(name, value)| (format!("customConfig.headers.{name}"), value.as_str())));
    for (field, text) in fields {
        if let Some(refusal) = allow.refused_in(text) {
            return Err(EnvNotAllowed { field, refusal });
        }
    }
    Ok(())
}

/// The part of a binding's `customConfig` the HTTP executors read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HttpConfig {
    /// Overrides the capability's URL (may hold `${env:VAR}`).
    pub url: Option<String>,
    /// Extra request headers (values may hold `${env:VAR}`).
    pub headers: Vec<(String, String)>,
}

impl HttpConfig {
    /// Reads `{url?: string, headers?: {name: string}}` from a config (other keys are left alone).
    pub fn parse(config: &Value) -> Result<HttpConfig, String> {
        let object = match config {
            Value::Null => return Ok(HttpConfig::default()),
            Value::Object(object) => object,
            _ => return Err("must be a JSON object or null".into()),
        };
        let url = match object.get("url") {
            None | Some(Value::Null) => None,
            Some(Value::String(url)) => Some(url.clone()),
            Some(_) => return Err("url must be a string".into()),
        };
        let headers = match object.get("headers") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(headers)) => headers
                .iter()
                .map(|(name, value)| match value {
                    Value::String(value) if valid_header_name(name) => Ok((name.clone(), value.clone())),
                    Value::String(_) => Err(format!("header name {name:?} is not a valid token")),
                    _ => Err(format!("header {name} must be a string")),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("headers must be an object of strings".into()),
        };
        Ok(HttpConfig { url, headers })
    }

    fn templates(&self) -> impl Iterator<Item = &str> {
        self.url.iter().map(String::as_str).chain(self.headers.iter().map(|(_, v)| v.as_str()))
    }
}

fn valid_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn record(slug: &str) -> CapabilityRecord {
        CapabilityRecord {
            slug: slug.into(),
            name: slug.into(),
            description: String::new(),
            category: "test".into(),
            execution_type: ExecutionType::Internal,
            handler: "h".into(),
            function_definition: FunctionDefinition {
                name: slug.into(),
                description: String::new(),
                parameters: json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}),
            },
            requires_approval: false,
            approval_timeout_ms: None,
            rate_limit: None,
            is_idempotent: false,
            is_active: true,
            processes_pii: false,
            redaction: None,
            timeout_ms: None,
            policy_version: 1,
            hidden: false,
            invocation: None,
        }
    }

    #[test]
    fn registrations_are_checked() {
        assert_eq!(validate_record(&record("lookup_order"), 128), Ok(()));
        let mut bad = record("lookup_order");
        bad.function_definition.name = "lookupOrder".into();
        assert_eq!(validate_record(&bad, 128).unwrap_err().code(), "slug_mismatch");
        let mut pii = record("read_memory");
        pii.processes_pii = true;
        assert_eq!(validate_record(&pii, 128).unwrap_err().code(), "pii_without_redaction");
        pii.redaction = Some(RedactionRule::default());
        assert_eq!(validate_record(&pii, 128), Ok(()));
        let mut api = record("call_api");
        api.execution_type = ExecutionType::Api;
        assert_eq!(validate_record(&api, 128).unwrap_err().field, "handler");
        api.handler = "https://api.example.com/x".into();
        assert_eq!(validate_record(&api, 128), Ok(()));
        let mut limited = record("x");
        limited.rate_limit = Some(0);
        assert_eq!(validate_record(&limited, 128).unwrap_err().field, "rateLimit");
        let mut schema = record("x");
        schema.function_definition.parameters = json!({"type": 17});
        assert_eq!(validate_record(&schema, 128).unwrap_err().field, "functionDefinition.parameters");
        assert_eq!(validate_record(&record("a.b"), 128).unwrap_err().field, "slug");
        let mut source = record("x");
        source.execution_type = ExecutionType::Source;
        assert_eq!(validate_record(&source, 128).unwrap_err().field, "executionType", "never registered");
        let mut invoked = record("x");
        invoked.invocation = Some(crate::core::sources::Invocation::NotCallable);
        assert_eq!(validate_record(&invoked, 128).unwrap_err().field, "invocation");
        assert_eq!(record("x").discovery_id(), "tool:x");
        let descriptor = record("x").descriptor();
        assert_eq!((descriptor.id.as_str(), descriptor.category.as_str()), ("tool:x", "test"));
        assert_eq!(descriptor.full_schema.unwrap().value(), record("x").function_definition.parameters);
        assert!(record("x").is_discoverable());
        let mut quiet = record("x");
        quiet.hidden = true;
        assert!(!quiet.is_discoverable());
        let hidden: CapabilityRecord =
            serde_json::from_value(json!({"slug": "h", "name": "h", "executionType": "internal", "handler": "svc",
                "functionDefinition": {"name": "h"}, "hidden": true}))
            .unwrap();
        assert!(hidden.hidden);
        assert!(!serde_json::to_string(&record("x")).unwrap().contains("hidden"), "false is left out");
    }

    #[test]
    fn a_slug_and_an_agent_id_one_byte_over_max_id_bytes_are_refused_naming_the_setting() {
        let max = 20;
        assert_eq!(validate_record(&record(&"s".repeat(max)), max), Ok(()));
        let err = validate_record(&record(&"s".repeat(max + 1)), max).unwrap_err();
        assert_eq!((err.field.as_str(), err.code()), ("slug", "invalid_registration"));
        assert!(err.to_string().contains("is 21 bytes, over limits.max_id_bytes: at most 20"), "{err}");
        assert_eq!(validate_record(&record(&"s".repeat(max + 1)), max + 1), Ok(()), "the setting is read");
        let lookup = |_: &str| None;
        let binding = |agent_id: String| Binding {
            agent_id,
            slug: "x".into(),
            is_enabled: true,
            custom_rate_limit: None,
            custom_config: json!({}),
        };
        assert_eq!(validate_binding(&binding("a".repeat(max)), &lookup, max), Ok(vec![]));
        let err = validate_binding(&binding("a".repeat(max + 1)), &lookup, max).unwrap_err();
        assert_eq!(err.field, "agentId");
        assert!(err.to_string().contains("over limits.max_id_bytes: at most 20"), "{err}");
    }

    #[test]
    fn bindings_report_missing_env_vars() {
        let binding = Binding {
            agent_id: "a".into(),
            slug: "x".into(),
            is_enabled: true,
            custom_rate_limit: Some(3),
            custom_config: json!({"url": "https://${env:HOST_A}/x", "headers": {"Authorization": "Bearer ${env:TOKEN_B}"}}),
        };
        let lookup = |name: &str| (name == "HOST_A").then(|| "h".to_string());
        assert_eq!(validate_binding(&binding, &lookup, 128), Ok(vec!["TOKEN_B".to_string()]));
        let mut bad = binding.clone();
        bad.custom_config = json!({"headers": {"X": 1}});
        assert_eq!(validate_binding(&bad, &lookup, 128).unwrap_err().field, "customConfig");
        bad.custom_config = json!(3);
        assert!(validate_binding(&bad, &lookup, 128).is_err());
    }

    #[test]
    fn templates_outside_the_allowlist_are_refused_at_registration() {
        let allow = EnvAllow::default();
        let mut binding = Binding {
            agent_id: "a".into(),
            slug: "x".into(),
            is_enabled: true,
            custom_rate_limit: None,
            custom_config: json!({"url": "https://h/${env:CAPDEX_SECRET_PATH}", "headers": {"X-Key": "${env:HOME}"}}),
        };
        let err = check_binding_env(&binding, &allow).unwrap_err();
        assert_eq!((err.field.as_str(), err.code()), ("customConfig.headers.X-Key", "env_not_allowed"));
        assert!(err.to_string().contains("HOME") && err.to_string().contains("env_allow"), "{err}");
        binding.custom_config = json!({"url": "https://${env:AWS_SECRET_ACCESS_KEY}/"});
        assert_eq!(check_binding_env(&binding, &allow).unwrap_err().field, "customConfig.url");
        binding.custom_config = json!({"headers": {"Authorization": "Bearer ${env:CAPDEX_SECRET_X}"}});
        assert_eq!(check_binding_env(&binding, &allow), Ok(()));
        assert_eq!(
            check_binding_env(&binding, &EnvAllow::parse::<&str>(&[]).unwrap()).unwrap_err().field,
            "customConfig.headers.Authorization"
        );
        let mut api = record("api");
        api.execution_type = ExecutionType::Api;
        api.handler = "https://${env:HOME}/x".into();
        assert_eq!(check_record_env(&api, &allow).unwrap_err().field, "handler");
        api.handler = "https://${env:CAPDEX_SECRET_HOST}/x".into();
        assert_eq!(check_record_env(&api, &allow), Ok(()));
    }
}
