//! One live source as a user declares it ([`SourceSettings`]): in JSON
//! (camelCase) on `capdex.v1.sources.add`, and in the config file's
//! `[[sources]]` tables (snake_case accepted too). Settings are kept as given:
//! `${env:VAR}` templates stay unresolved wherever they are persisted, and
//! [`SourceSettings::resolve`] turns them into the connection values of one
//! connect ([`ResolvedSource`]), with the secret values to scrub from logs.
//! Also the reconnect backoff ([`reconnect_delay_ms`]) and the shape of one
//! source in `sources.list` ([`SourceStatus`]).
//!
//! Paths are checked lexically here (relative, never climbing out with `..`);
//! the shell checks them again against its allowed roots on disk.

use crate::core::dispatch::env_template::{self, EnvAllow, EnvRefusal};
use crate::core::sources::{Invocation, SourceTool};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// How often an OpenAPI source's document is fetched again, unless set.
pub const DEFAULT_REFRESH_INTERVAL_MS: u64 = 300_000;
/// How long a lazy source stays connected with no call, unless set.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 600_000;
/// The longest a call to a source's capability may take, unless set.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 30_000;
/// The longest any timeout setting may be (one hour).
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;
/// The shortest refresh interval accepted (one second).
pub const MIN_REFRESH_INTERVAL_MS: u64 = 1_000;
/// The first reconnect delay; each failed attempt doubles it up to [`RECONNECT_CAP_MS`].
pub const RECONNECT_BASE_MS: u64 = 250;
/// The longest reconnect delay.
pub const RECONNECT_CAP_MS: u64 = 30_000;

/// What a source is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// An MCP server, over stdio (`command`) or streamable HTTP (`url`).
    Mcp,
    /// An OpenAPI (or Swagger) document, from a `url` or a `path`.
    Openapi,
    /// A SQL schema (a DDL file at `path`): mapped for discovery, not callable.
    Sql,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Mcp => "mcp",
            SourceKind::Openapi => "openapi",
            SourceKind::Sql => "sql",
        }
    }
}

/// How calls to an OpenAPI source authenticate. Values may be `${env:VAR}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum AuthSettings {
    /// `Authorization: Bearer <token>`.
    Bearer { token: String },
    /// A header `name: value` (an API key).
    Header { name: String, value: String },
    /// A query parameter `name=value` (an API key).
    Query { name: String, value: String },
}

/// [`AuthSettings`] with its templates resolved: what a request carries.
#[derive(Clone, PartialEq, Eq)]
pub enum ResolvedAuth {
    Bearer { token: String },
    Header { name: String, value: String },
    Query { name: String, value: String },
}

impl std::fmt::Debug for ResolvedAuth {
    /// Never prints the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResolvedAuth::Bearer { .. } => f.write_str("Bearer(<redacted>)"),
            ResolvedAuth::Header { name, .. } => write!(f, "Header({name}: <redacted>)"),
            ResolvedAuth::Query { name, .. } => write!(f, "Query({name}=<redacted>)"),
        }
    }
}

/// A tool declared in the settings of a lazy MCP source, offered for
/// discovery before the source was ever connected.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeclaredTool {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// A JSON Schema of the arguments; `{"type": "object"}` when absent.
    #[serde(default, alias = "input_schema", skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
}

impl DeclaredTool {
    /// The tool as a [`SourceTool`] called over MCP.
    pub fn to_source_tool(&self) -> SourceTool {
        SourceTool {
            name: self.name.clone(),
            title: None,
            description: self.description.clone(),
            input_schema: self.input_schema.clone().unwrap_or_else(|| serde_json::json!({"type": "object"})),
            output_schema: None,
            invocation: Invocation::Mcp { tool: self.name.clone() },
        }
    }
}

/// One source as declared. Unknown fields are refused (a typo is an error,
/// not a silently ignored setting).
///
/// # Examples
/// ```
/// use capdex::core::sources::settings::SourceSettings;
/// let settings: SourceSettings = serde_json::from_str(
///     r#"{"id": "time", "kind": "mcp", "command": "mcp-server-time", "callTimeoutMs": 5000}"#,
/// ).unwrap();
/// settings.validate().unwrap();
/// assert_eq!(settings.call_timeout_ms(), 5000);
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SourceSettings {
    /// `[a-z0-9][a-z0-9_-]{0,63}`: the `<source_id>` of its capabilities' ids.
    pub id: String,
    pub kind: SourceKind,
    /// MCP over stdio: the program to start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// MCP over stdio: its arguments (literal, never templates: a command line is visible to every local user).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// MCP over stdio: environment variables given to the program; values may be `${env:VAR}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// MCP over stdio: the working directory (relative, checked against the allowed roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// MCP over streamable HTTP: the endpoint; OpenAPI: the document's URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// MCP over streamable HTTP: headers sent with every request; values may be `${env:VAR}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// OpenAPI: the document's file; SQL: the DDL file (relative, checked against the allowed roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// OpenAPI: how calls authenticate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSettings>,
    /// OpenAPI: the server URL calls go to, instead of the document's.
    #[serde(default, alias = "base_url", skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// OpenAPI from a URL: how often the document is fetched again.
    #[serde(default, alias = "refresh_interval_ms", skip_serializing_if = "Option::is_none")]
    pub refresh_interval_ms: Option<u64>,
    /// Connect only when a call needs the source; disconnect after `idleTimeoutMs` with no call.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lazy: bool,
    #[serde(default, alias = "idle_timeout_ms", skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    #[serde(default, alias = "call_timeout_ms", skip_serializing_if = "Option::is_none")]
    pub call_timeout_ms: Option<u64>,
    /// The category of its capabilities; the source id when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// The workspaces that enable this source.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspaces: Vec<String>,
    /// A lazy MCP source's tools, offered before its first connect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<DeclaredTool>,
}

/// Why settings were refused: the field (`id`, `env.TOKEN`, `auth.token`, ...) and the problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("source setting {field}: {problem}")]
pub struct SettingsError {
    pub kind: SettingsErrorKind,
    pub field: String,
    pub problem: String,
}

/// What kind of problem a [`SettingsError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettingsErrorKind {
    /// The settings themselves are wrong (`validate`).
    Invalid,
    /// A `${env:VAR}` names a variable that is unset or empty (`resolve`).
    MissingEnv,
    /// A `${env:VAR}` names a variable outside `[dispatch] env_allow` (`check_env`, `resolve`).
    EnvNotAllowed,
}

impl SettingsErrorKind {
    /// The wire code: `invalid_settings`, `missing_env` or `env_not_allowed`.
    pub fn as_str(self) -> &'static str {
        match self {
            SettingsErrorKind::Invalid => "invalid_settings",
            SettingsErrorKind::MissingEnv => "missing_env",
            SettingsErrorKind::EnvNotAllowed => "env_not_allowed",
        }
    }
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> SettingsError {
    SettingsError { kind: SettingsErrorKind::Invalid, field: field.into(), problem: problem.into() }
}

/// Where an OpenAPI document is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DocumentLocation {
    /// An `http`/`https` URL.
    Url(String),
    /// A file, relative to the shell's allowed roots.
    File(String),
}

/// How to reach an MCP server, templates resolved.
#[derive(Clone, PartialEq, Eq)]
pub enum McpConnection {
    Stdio { command: String, args: Vec<String>, env: Vec<(String, String)>, cwd: Option<String> },
    Http { url: String, headers: Vec<(String, String)> },
}

impl std::fmt::Debug for McpConnection {
    /// Never prints resolved env or header values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpConnection::Stdio { command, args, env, cwd } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.iter().map(|(name, _)| name).collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
            McpConnection::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.iter().map(|(name, _)| name).collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// What one connect uses, templates resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Connection {
    Mcp(McpConnection),
    Openapi { document: DocumentLocation, auth: Option<ResolvedAuth>, base_url: Option<String> },
    Sql { path: String },
}

/// [`SourceSettings::resolve`]'s answer: the connection, and every secret
/// value a template resolved to (scrub them from anything recorded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedSource {
    pub connection: Connection,
    pub secrets: Vec<String>,
}

impl SourceSettings {
    /// The call timeout in force.
    pub fn call_timeout_ms(&self) -> u64 {
        self.call_timeout_ms.unwrap_or(DEFAULT_CALL_TIMEOUT_MS)
    }

    /// The idle timeout in force (meaningful for lazy sources).
    pub fn idle_timeout_ms(&self) -> u64 {
        self.idle_timeout_ms.unwrap_or(DEFAULT_IDLE_TIMEOUT_MS)
    }

    /// The refresh interval in force (meaningful for OpenAPI sources with a URL).
    pub fn refresh_interval_ms(&self) -> u64 {
        self.refresh_interval_ms.unwrap_or(DEFAULT_REFRESH_INTERVAL_MS)
    }

    /// The category of its capabilities: the setting, else the source id.
    pub fn category(&self) -> &str {
        self.category.as_deref().unwrap_or(&self.id)
    }

    /// The tools declared for a lazy source, as [`SourceTool`]s.
    pub fn declared_tools(&self) -> Vec<SourceTool> {
        self.tools.iter().map(DeclaredTool::to_source_tool).collect()
    }

    /// Checks every field; the error names the first wrong one.
    pub fn validate(&self) -> Result<(), SettingsError> {
        check_id(&self.id)?;
        let mcp = self.kind == SourceKind::Mcp;
        let openapi = self.kind == SourceKind::Openapi;
        let kind = self.kind.as_str();
        let only_for = |field: &str, present: bool, allowed: bool, which: &str| {
            if present && !allowed {
                Err(invalid(field, format!("only {which} sources take it, not {kind}")))
            } else {
                Ok(())
            }
        };
        let stdio = mcp && self.command.is_some();
        only_for("command", self.command.is_some(), mcp, "mcp")?;
        only_for("args", !self.args.is_empty(), stdio, "mcp stdio (with a command)")?;
        only_for("env", !self.env.is_empty(), stdio, "mcp stdio (with a command)")?;
        only_for("cwd", self.cwd.is_some(), stdio, "mcp stdio (with a command)")?;
        only_for("url", self.url.is_some(), mcp || openapi, "mcp and openapi")?;
        only_for("headers", !self.headers.is_empty(), mcp && self.url.is_some(), "mcp streamable HTTP (with a url)")?;
        only_for("path", self.path.is_some(), !mcp, "openapi and sql")?;
        only_for("auth", self.auth.is_some(), openapi, "openapi")?;
        only_for("baseUrl", self.base_url.is_some(), openapi, "openapi")?;
        only_for("refreshIntervalMs", self.refresh_interval_ms.is_some(), openapi, "openapi")?;
        only_for("tools", !self.tools.is_empty(), mcp && self.lazy, "lazy mcp")?;
        only_for("idleTimeoutMs", self.idle_timeout_ms.is_some(), self.lazy, "lazy")?;
        match self.kind {
            SourceKind::Mcp => match (&self.command, &self.url) {
                (Some(_), Some(_)) => return Err(invalid("url", "an mcp source has a command or a url, not both")),
                (None, None) => return Err(invalid("command", "an mcp source needs a command (stdio) or a url")),
                (Some(command), None) => {
                    check_text("command", command, 4096)?;
                    for (idx, arg) in self.args.iter().enumerate() {
                        if arg.contains('\0') || arg.len() > 4096 {
                            return Err(invalid(format!("args[{idx}]"), "an argument holds a NUL or is too long"));
                        }
                    }
                    for (name, value) in &self.env {
                        check_env_name(name)?;
                        if value.contains('\0') {
                            return Err(invalid(format!("env.{name}"), "a value holds a NUL"));
                        }
                    }
                    if let Some(cwd) = &self.cwd {
                        check_relative_path("cwd", cwd)?;
                    }
                }
                (None, Some(url)) => {
                    check_http_url("url", url)?;
                    for (name, value) in &self.headers {
                        check_header("headers", name, value)?;
                    }
                }
            },
            SourceKind::Openapi => {
                match (&self.url, &self.path) {
                    (Some(_), Some(_)) => {
                        return Err(invalid("path", "an openapi source has a url or a path, not both"))
                    }
                    (None, None) => return Err(invalid("url", "an openapi source needs a url or a path")),
                    (Some(url), None) => check_http_url("url", url)?,
                    (None, Some(path)) => check_relative_path("path", path)?,
                }
                if let Some(base_url) = &self.base_url {
                    check_http_url("baseUrl", base_url)?;
                }
                match &self.auth {
                    Some(AuthSettings::Bearer { token }) => check_value("auth.token", token)?,
                    Some(AuthSettings::Header { name, value }) => check_header("auth", name, value)?,
                    Some(AuthSettings::Query { name, value }) => {
                        if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
                            return Err(invalid(
                                "auth.name",
                                "a query parameter name is 1 to 256 printable characters",
                            ));
                        }
                        check_value("auth.value", value)?;
                    }
                    None => {}
                }
                if let Some(refresh) = self.refresh_interval_ms {
                    if !(MIN_REFRESH_INTERVAL_MS..=86_400_000).contains(&refresh) {
                        return Err(invalid("refreshIntervalMs", "must lie between 1000 and 86400000"));
                    }
                }
            }
            SourceKind::Sql => match &self.path {
                Some(path) => check_relative_path("path", path)?,
                None => return Err(invalid("path", "a sql source needs the path of its DDL file")),
            },
        }
        for (field, value) in [("idleTimeoutMs", self.idle_timeout_ms), ("callTimeoutMs", self.call_timeout_ms)] {
            if let Some(ms) = value {
                if ms == 0 || ms > MAX_TIMEOUT_MS {
                    return Err(invalid(field, format!("must lie between 1 and {MAX_TIMEOUT_MS}")));
                }
            }
        }
        if let Some(category) = &self.category {
            check_label("category", category)?;
        }
        for (idx, tag) in self.tags.iter().enumerate() {
            check_label(&format!("tags[{idx}]"), tag)?;
        }
        for (idx, workspace) in self.workspaces.iter().enumerate() {
            check_label(&format!("workspaces[{idx}]"), workspace)?;
        }
        let mut names = std::collections::BTreeSet::new();
        for (idx, tool) in self.tools.iter().enumerate() {
            check_label(&format!("tools[{idx}].name"), &tool.name)?;
            if tool.name.contains('#') {
                return Err(invalid(format!("tools[{idx}].name"), "a tool name cannot hold '#'"));
            }
            if !names.insert(tool.name.as_str()) {
                return Err(invalid(format!("tools[{idx}].name"), format!("{:?} is declared twice", tool.name)));
            }
            if tool.input_schema.as_ref().is_some_and(|schema| !schema.is_object()) {
                return Err(invalid(format!("tools[{idx}].inputSchema"), "must be a JSON Schema object"));
            }
        }
        Ok(())
    }

    /// Every field that may hold `${env:VAR}` templates, with its text.
    fn templates(&self) -> Vec<(String, &str)> {
        let mut templates: Vec<(String, &str)> = Vec::new();
        templates.extend(self.env.iter().map(|(name, value)| (format!("env.{name}"), value.as_str())));
        templates.extend(self.headers.iter().map(|(name, value)| (format!("headers.{name}"), value.as_str())));
        match &self.auth {
            None => {}
            Some(AuthSettings::Bearer { token }) => templates.push(("auth.token".into(), token)),
            Some(AuthSettings::Header { value, .. } | AuthSettings::Query { value, .. }) => {
                templates.push(("auth.value".into(), value))
            }
        }
        templates
    }

    /// Refuses a `${env:VAR}` (env, header and auth values) that `allow`
    /// does not permit, naming its field: checked when a client adds a source,
    /// so it is refused at once rather than at connect time.
    pub fn check_env(&self, allow: &EnvAllow) -> Result<(), SettingsError> {
        for (field, text) in self.templates() {
            if let Some(refusal) = allow.refused_in(text) {
                return Err(SettingsError {
                    kind: SettingsErrorKind::EnvNotAllowed,
                    field,
                    problem: refusal.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Resolves every `${env:VAR}` (env and header values, auth values) with
    /// `lookup`, reading only the names `allow` permits (the operator's
    /// `[[sources]]` pass [`EnvAllow::any`]). Call [`SourceSettings::validate`] first.
    pub fn resolve(
        &self,
        allow: &EnvAllow,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ResolvedSource, SettingsError> {
        let mut secrets = Vec::new();
        let mut resolve = |field: String, text: &str| {
            env_template::resolve(text, allow, lookup, &mut secrets).map_err(|refusal| SettingsError {
                kind: match refusal {
                    EnvRefusal::Missing(_) => SettingsErrorKind::MissingEnv,
                    EnvRefusal::NotAllowed(_) => SettingsErrorKind::EnvNotAllowed,
                },
                field,
                problem: refusal.to_string(),
            })
        };
        let connection = match self.kind {
            SourceKind::Mcp => match (&self.command, &self.url) {
                (Some(command), _) => {
                    let mut env = Vec::with_capacity(self.env.len());
                    for (name, value) in &self.env {
                        env.push((name.clone(), resolve(format!("env.{name}"), value)?));
                    }
                    Connection::Mcp(McpConnection::Stdio {
                        command: command.clone(),
                        args: self.args.clone(),
                        env,
                        cwd: self.cwd.clone(),
                    })
                }
                (None, url) => {
                    let mut headers = Vec::with_capacity(self.headers.len());
                    for (name, value) in &self.headers {
                        headers.push((name.clone(), resolve(format!("headers.{name}"), value)?));
                    }
                    Connection::Mcp(McpConnection::Http { url: url.clone().unwrap_or_default(), headers })
                }
            },
            SourceKind::Openapi => {
                let document = match (&self.url, &self.path) {
                    (Some(url), _) => DocumentLocation::Url(url.clone()),
                    (None, path) => DocumentLocation::File(path.clone().unwrap_or_default()),
                };
                let auth = match &self.auth {
                    None => None,
                    Some(AuthSettings::Bearer { token }) => {
                        Some(ResolvedAuth::Bearer { token: resolve("auth.token".into(), token)? })
                    }
                    Some(AuthSettings::Header { name, value }) => {
                        Some(ResolvedAuth::Header { name: name.clone(), value: resolve("auth.value".into(), value)? })
                    }
                    Some(AuthSettings::Query { name, value }) => {
                        Some(ResolvedAuth::Query { name: name.clone(), value: resolve("auth.value".into(), value)? })
                    }
                };
                Connection::Openapi { document, auth, base_url: self.base_url.clone() }
            }
            SourceKind::Sql => Connection::Sql { path: self.path.clone().unwrap_or_default() },
        };
        Ok(ResolvedSource { connection, secrets })
    }
}

/// True for a valid source id: `[a-z0-9][a-z0-9_-]{0,63}`.
pub fn is_valid_source_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 64
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn check_id(id: &str) -> Result<(), SettingsError> {
    if is_valid_source_id(id) {
        Ok(())
    } else {
        Err(invalid("id", format!("{id:?} must match [a-z0-9][a-z0-9_-]{{0,63}}")))
    }
}

fn check_text(field: &str, text: &str, max_len: usize) -> Result<(), SettingsError> {
    if text.trim().is_empty() {
        return Err(invalid(field, "is empty"));
    }
    if text.len() > max_len || text.chars().any(char::is_control) {
        return Err(invalid(field, format!("holds a control character or is longer than {max_len} bytes")));
    }
    Ok(())
}

fn check_label(field: &str, text: &str) -> Result<(), SettingsError> {
    check_text(field, text, 256)
}

/// A value that may be a template: non-empty, no control characters (it ends up in a header or query).
fn check_value(field: &str, value: &str) -> Result<(), SettingsError> {
    check_text(field, value, 8192)
}

fn check_env_name(name: &str) -> Result<(), SettingsError> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') && name.len() <= 256 {
        Ok(())
    } else {
        Err(invalid(format!("env.{name}"), "a variable name is [A-Za-z_][A-Za-z0-9_]*"))
    }
}

/// True for an HTTP header name (an RFC 9110 token).
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn check_header(field: &str, name: &str, value: &str) -> Result<(), SettingsError> {
    if !is_header_name(name) {
        return Err(invalid(format!("{field}.{name}"), "is not a valid header name"));
    }
    check_value(&format!("{field}.{name}"), value)
}

/// Lexical check of an `http(s)://host...` URL: scheme, a host, no spaces or control characters.
fn check_http_url(field: &str, url: &str) -> Result<(), SettingsError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| invalid(field, "must be an http:// or https:// URL"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    if host.is_empty() || host.starts_with(':') {
        return Err(invalid(field, "has no host"));
    }
    if url.len() > 4096 || url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(invalid(field, "holds whitespace or a control character, or is too long"));
    }
    Ok(())
}

/// Lexical check of a path: relative, not empty, and never climbing above its root with `..`.
///
/// # Examples
/// ```
/// use capdex::core::sources::settings::is_contained_relative_path;
/// assert!(is_contained_relative_path("specs/petstore.yaml"));
/// assert!(is_contained_relative_path("a/../b.sql"));
/// assert!(!is_contained_relative_path("../secrets"));
/// assert!(!is_contained_relative_path("/etc/passwd"));
/// ```
pub fn is_contained_relative_path(path: &str) -> bool {
    if path.is_empty() || path.starts_with('/') || path.starts_with('\\') || path.contains('\0') {
        return false;
    }
    // A Windows drive (`C:`) is absolute too.
    if path.len() >= 2 && path.as_bytes()[1] == b':' {
        return false;
    }
    let mut depth: i64 = 0;
    for component in path.split(['/', '\\']) {
        match component {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => depth += 1,
        }
    }
    true
}

fn check_relative_path(field: &str, path: &str) -> Result<(), SettingsError> {
    if is_contained_relative_path(path) && path.len() <= 4096 {
        Ok(())
    } else {
        Err(invalid(field, format!("{path:?} must be a relative path that does not climb out with '..'")))
    }
}

/// The delay before reconnect attempt `attempt` (0 for the first retry):
/// [`RECONNECT_BASE_MS`] doubling per attempt up to [`RECONNECT_CAP_MS`], then
/// scaled by `jitter` (clamped to `[0, 1]`) into `[delay / 2, delay]`, so
/// sources that failed together do not reconnect together.
///
/// # Examples
/// ```
/// use capdex::core::sources::settings::reconnect_delay_ms;
/// assert_eq!(reconnect_delay_ms(0, 1.0), 250);
/// assert_eq!(reconnect_delay_ms(3, 1.0), 2000);
/// assert_eq!(reconnect_delay_ms(40, 1.0), 30_000);
/// assert_eq!(reconnect_delay_ms(40, 0.0), 15_000);
/// ```
pub fn reconnect_delay_ms(attempt: u32, jitter: f64) -> u64 {
    let doubled = RECONNECT_BASE_MS.checked_shl(attempt.min(32)).unwrap_or(u64::MAX);
    let delay = doubled.min(RECONNECT_CAP_MS);
    let jitter = if jitter.is_nan() { 1.0 } else { jitter.clamp(0.0, 1.0) };
    let half = delay / 2;
    half + ((delay - half) as f64 * jitter).round() as u64
}

/// Where a source is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceState {
    /// Connecting (or fetching its document) for the first time or again.
    Connecting,
    /// Connected, its tools synced.
    Connected,
    /// Lost; reconnecting with backoff.
    Disconnected,
    /// Given up on until its settings change (bad settings, refused target, ...).
    Failed,
    /// A lazy source not connected now (never needed yet, or idle too long).
    Idle,
}

/// One source in `sources.list`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    pub id: String,
    pub kind: SourceKind,
    pub state: SourceState,
    pub tool_count: usize,
    /// When its tools were last synced (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_ms: Option<u64>,
    /// The last connect or sync error (secrets scrubbed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub lazy: bool,
    /// True when a call would connect it first (a lazy source not connected now).
    pub loadable: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(json: &str) -> SourceSettings {
        serde_json::from_str(json).unwrap_or_else(|err| panic!("{json}: {err}"))
    }

    /// Parses and validates `json`; `expect` is `Ok` or the failing field.
    fn check(json: &str, expect: Result<(), &str>) {
        let got = parse(json).validate().map_err(|err| err.field);
        assert_eq!(got, expect.map_err(str::to_string), "{json}");
    }

    #[test]
    fn valid_settings_of_every_kind_pass() {
        check(r#"{"id":"time","kind":"mcp","command":"mcp-server-time","args":["--local-timezone","UTC"]}"#, Ok(()));
        check(
            r#"{"id":"git","kind":"mcp","command":"uvx","env":{"TOKEN":"${env:GIT_TOKEN}"},"cwd":"repos/a"}"#,
            Ok(()),
        );
        check(
            r#"{"id":"every","kind":"mcp","url":"http://127.0.0.1:3001/mcp","headers":{"X-Key":"${env:K}"}}"#,
            Ok(()),
        );
        check(
            r#"{"id":"pets","kind":"openapi","url":"https://x.test/openapi.json","auth":{"type":"bearer","token":"${env:T}"},"refreshIntervalMs":60000}"#,
            Ok(()),
        );
        check(
            r#"{"id":"pets2","kind":"openapi","path":"specs/pets.yaml","baseUrl":"http://127.0.0.1:8080/v1","auth":{"type":"query","name":"api_key","value":"k"}}"#,
            Ok(()),
        );
        check(
            r#"{"id":"db","kind":"sql","path":"schema.sql","category":"data","tags":["sql"],"workspaces":["w1"]}"#,
            Ok(()),
        );
        check(
            r#"{"id":"lazy1","kind":"mcp","command":"x","lazy":true,"idleTimeoutMs":1000,"tools":[{"name":"t","description":"d","inputSchema":{"type":"object"}}]}"#,
            Ok(()),
        );
    }

    #[test]
    fn a_wrong_field_is_named() {
        check(r#"{"id":"Bad","kind":"mcp","command":"x"}"#, Err("id"));
        check(r#"{"id":"-x","kind":"mcp","command":"x"}"#, Err("id"));
        check(&format!(r#"{{"id":"{}","kind":"mcp","command":"x"}}"#, "a".repeat(65)), Err("id"));
        check(r#"{"id":"a","kind":"mcp"}"#, Err("command"));
        check(r#"{"id":"a","kind":"mcp","command":"x","url":"http://h/"}"#, Err("url"));
        check(r#"{"id":"a","kind":"mcp","url":"ftp://h/"}"#, Err("url"));
        check(r#"{"id":"a","kind":"mcp","url":"http:///x"}"#, Err("url"));
        check(r#"{"id":"a","kind":"mcp","command":"x","cwd":"../up"}"#, Err("cwd"));
        check(r#"{"id":"a","kind":"mcp","command":"x","cwd":"/abs"}"#, Err("cwd"));
        check(r#"{"id":"a","kind":"mcp","command":"x","env":{"1BAD":"v"}}"#, Err("env.1BAD"));
        check(r#"{"id":"a","kind":"mcp","url":"http://h/","headers":{"Bad Name":"v"}}"#, Err("headers.Bad Name"));
        check(r#"{"id":"a","kind":"mcp","url":"http://h/","headers":{"X":"a\nb"}}"#, Err("headers.X"));
        check(r#"{"id":"a","kind":"mcp","url":"http://h/","args":["x"]}"#, Err("args"));
        check(r#"{"id":"a","kind":"mcp","command":"x","auth":{"type":"bearer","token":"t"}}"#, Err("auth"));
        check(r#"{"id":"a","kind":"openapi"}"#, Err("url"));
        check(r#"{"id":"a","kind":"openapi","path":"a/../../b.json"}"#, Err("path"));
        check(r#"{"id":"a","kind":"openapi","url":"http://h/x","path":"p"}"#, Err("path"));
        check(r#"{"id":"a","kind":"openapi","url":"http://h/x","baseUrl":"h/v1"}"#, Err("baseUrl"));
        check(r#"{"id":"a","kind":"openapi","url":"http://h/x","refreshIntervalMs":10}"#, Err("refreshIntervalMs"));
        check(
            r#"{"id":"a","kind":"openapi","url":"http://h/x","auth":{"type":"bearer","token":""}}"#,
            Err("auth.token"),
        );
        check(r#"{"id":"a","kind":"sql"}"#, Err("path"));
        check(r#"{"id":"a","kind":"sql","path":"s.sql","callTimeoutMs":0}"#, Err("callTimeoutMs"));
        check(r#"{"id":"a","kind":"mcp","command":"x","idleTimeoutMs":5}"#, Err("idleTimeoutMs"));
        check(r#"{"id":"a","kind":"mcp","command":"x","tools":[{"name":"t"}]}"#, Err("tools"));
        check(
            r#"{"id":"a","kind":"mcp","command":"x","lazy":true,"tools":[{"name":"t"},{"name":"t"}]}"#,
            Err("tools[1].name"),
        );
        check(
            r#"{"id":"a","kind":"mcp","command":"x","lazy":true,"tools":[{"name":"t","inputSchema":3}]}"#,
            Err("tools[0].inputSchema"),
        );
        check(r#"{"id":"a","kind":"mcp","command":"x","tags":[""]}"#, Err("tags[0]"));
    }

    #[test]
    fn unknown_fields_and_kinds_are_refused_and_snake_case_is_accepted() {
        assert!(serde_json::from_str::<SourceSettings>(r#"{"id":"a","kind":"mcp","comand":"x"}"#).is_err());
        assert!(serde_json::from_str::<SourceSettings>(r#"{"id":"a","kind":"grpc"}"#).is_err());
        assert!(
            serde_json::from_str::<SourceSettings>(r#"{"id":"a","kind":"openapi","auth":{"type":"basic"}}"#).is_err()
        );
        let from_toml: SourceSettings = toml::from_str(
            "id = \"pets\"\nkind = \"openapi\"\nurl = \"http://h/o.json\"\nbase_url = \"http://h/v1\"\n\
             refresh_interval_ms = 2000\ncall_timeout_ms = 100\nauth = { type = \"header\", name = \"X-Key\", value = \"${env:K}\" }\n",
        )
        .unwrap();
        from_toml.validate().unwrap();
        assert_eq!(from_toml.base_url.as_deref(), Some("http://h/v1"));
        assert_eq!((from_toml.refresh_interval_ms(), from_toml.call_timeout_ms()), (2000, 100));
        // Persisted as given: the template survives a round trip.
        let json = serde_json::to_string(&from_toml).unwrap();
        assert!(json.contains("${env:K}") && json.contains("\"baseUrl\""), "{json}");
        assert_eq!(serde_json::from_str::<SourceSettings>(&json).unwrap(), from_toml);
    }

    #[test]
    fn defaults_apply() {
        let settings = parse(r#"{"id":"a","kind":"openapi","url":"http://h/x"}"#);
        assert_eq!(settings.refresh_interval_ms(), DEFAULT_REFRESH_INTERVAL_MS);
        assert_eq!(settings.call_timeout_ms(), DEFAULT_CALL_TIMEOUT_MS);
        assert_eq!(settings.idle_timeout_ms(), DEFAULT_IDLE_TIMEOUT_MS);
        assert_eq!(settings.category(), "a");
        let lazy = parse(r#"{"id":"l","kind":"mcp","command":"x","lazy":true,"tools":[{"name":"t"}]}"#);
        let tools = lazy.declared_tools();
        assert_eq!(tools[0].invocation, Invocation::Mcp { tool: "t".into() });
        assert_eq!(tools[0].input_schema, serde_json::json!({"type": "object"}));
    }

    #[test]
    fn resolve_fills_templates_and_lists_the_secrets() {
        let lookup = |name: &str| match name {
            "TOKEN" => Some("s3cr3t".to_string()),
            "KEY" => Some("k3y".to_string()),
            _ => None,
        };
        let stdio = parse(
            r#"{"id":"a","kind":"mcp","command":"srv","args":["${env:TOKEN}"],"env":{"A":"x-${env:TOKEN}","B":"plain"}}"#,
        );
        let resolved = stdio.resolve(&EnvAllow::any(), &lookup).unwrap();
        assert_eq!(
            resolved.connection,
            Connection::Mcp(McpConnection::Stdio {
                command: "srv".into(),
                args: vec!["${env:TOKEN}".into()],
                env: vec![("A".into(), "x-s3cr3t".into()), ("B".into(), "plain".into())],
                cwd: None,
            })
        );
        assert_eq!(resolved.secrets, vec!["s3cr3t"]);
        let debug = format!("{:?}", resolved.connection);
        assert!(!debug.contains("s3cr3t"), "{debug}");

        let api = parse(
            r#"{"id":"a","kind":"openapi","url":"http://h/o","auth":{"type":"header","name":"X-Key","value":"${env:KEY}"}}"#,
        );
        let resolved = api.resolve(&EnvAllow::any(), &lookup).unwrap();
        let Connection::Openapi { auth: Some(auth), document, .. } = &resolved.connection else { panic!() };
        assert_eq!(auth, &ResolvedAuth::Header { name: "X-Key".into(), value: "k3y".into() });
        assert_eq!(document, &DocumentLocation::Url("http://h/o".into()));
        assert!(!format!("{auth:?}").contains("k3y"));

        let missing =
            parse(r#"{"id":"a","kind":"mcp","url":"http://h/","headers":{"Authorization":"Bearer ${env:NOPE}"}}"#);
        let err = missing.resolve(&EnvAllow::any(), &lookup).unwrap_err();
        assert_eq!((err.kind, err.field.as_str()), (SettingsErrorKind::MissingEnv, "headers.Authorization"));
        assert!(err.to_string().contains("NOPE"), "{err}");
    }

    #[test]
    fn client_templates_read_only_allowlisted_names() {
        let lookup = |_: &str| Some("v".to_string());
        let allow = EnvAllow::default();
        for (text, field) in [
            (
                r#"{"id":"a","kind":"mcp","command":"srv","env":{"A":"${env:CAPDEX_SECRET_A}","B":"${env:HOME}"}}"#,
                "env.B",
            ),
            (
                r#"{"id":"a","kind":"mcp","url":"http://h/","headers":{"X":"${env:AWS_SECRET_ACCESS_KEY}"}}"#,
                "headers.X",
            ),
            (
                r#"{"id":"a","kind":"openapi","url":"http://h/o","auth":{"type":"bearer","token":"${env:PATH}"}}"#,
                "auth.token",
            ),
            (
                r#"{"id":"a","kind":"openapi","url":"http://h/o","auth":{"type":"query","name":"k","value":"${env:USER}"}}"#,
                "auth.value",
            ),
        ] {
            let settings = parse(text);
            let err = settings.check_env(&allow).unwrap_err();
            assert_eq!((err.kind, err.field.as_str()), (SettingsErrorKind::EnvNotAllowed, field), "{text}");
            assert!(err.to_string().contains("env_allow"), "{err}");
            let err = settings.resolve(&allow, &lookup).unwrap_err();
            assert_eq!((err.kind.as_str(), err.field.as_str()), ("env_not_allowed", field), "at call time too");
            assert!(settings.resolve(&EnvAllow::any(), &lookup).is_ok(), "the operator's config reads any name");
        }
        let fine = parse(r#"{"id":"a","kind":"mcp","command":"srv","env":{"A":"${env:CAPDEX_SECRET_A}"}}"#);
        assert_eq!(fine.check_env(&allow), Ok(()));
    }

    #[test]
    fn the_backoff_doubles_to_its_cap() {
        let delays: Vec<u64> = (0..10).map(|attempt| reconnect_delay_ms(attempt, 1.0)).collect();
        assert_eq!(delays, vec![250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
        assert_eq!(reconnect_delay_ms(0, 0.0), 125);
        assert_eq!(reconnect_delay_ms(u32::MAX, f64::NAN), RECONNECT_CAP_MS);
    }

    #[test]
    fn a_status_serialises_in_camel_case() {
        let status = SourceStatus {
            id: "time".into(),
            kind: SourceKind::Mcp,
            state: SourceState::Idle,
            tool_count: 2,
            last_sync_ms: Some(5),
            last_error: None,
            lazy: true,
            loadable: true,
        };
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            serde_json::json!({"id":"time","kind":"mcp","state":"idle","toolCount":2,"lastSyncMs":5,"lazy":true,"loadable":true})
        );
    }

    proptest! {
        /// The delay never exceeds the cap, never falls below half the undelayed
        /// value, and does not shrink from one attempt to the next at equal jitter.
        #[test]
        fn backoff_is_bounded_and_monotone(attempt in 0u32..100, jitter in 0.0f64..=1.0) {
            let delay = reconnect_delay_ms(attempt, jitter);
            prop_assert!(delay <= RECONNECT_CAP_MS);
            prop_assert!(delay >= RECONNECT_BASE_MS / 2);
            prop_assert!(reconnect_delay_ms(attempt + 1, jitter) >= delay);
        }

        /// Hostile field values give an answer (accepted or a named field), never a panic.
        #[test]
        fn any_settings_validate_and_resolve_without_panicking(
            id in "\\PC{0,8}",
            text in proptest::collection::vec("\\PC{0,12}", 4),
            kind in 0usize..4,
        ) {
            let mut settings = SourceSettings {
                id,
                kind: [SourceKind::Mcp, SourceKind::Mcp, SourceKind::Openapi, SourceKind::Sql][kind],
                command: None, args: vec![text[0].clone()], env: BTreeMap::from([(text[1].clone(), text[2].clone())]),
                cwd: None, url: None, headers: BTreeMap::new(), path: None, auth: None, base_url: None,
                refresh_interval_ms: None, lazy: false, idle_timeout_ms: None, call_timeout_ms: None,
                category: None, tags: vec![], workspaces: vec![], tools: vec![],
            };
            match kind {
                0 => { settings.command = Some(text[3].clone()); settings.cwd = Some(text[0].clone()); }
                1 => { settings.url = Some(format!("http://{}", text[3])); settings.headers = settings.env.clone();
                       settings.env.clear(); settings.args.clear(); }
                2 => { settings.url = Some(text[3].clone()); settings.base_url = Some(text[0].clone());
                       settings.auth = Some(AuthSettings::Query { name: text[1].clone(), value: text[2].clone() });
                       settings.env.clear(); settings.args.clear(); }
                _ => { settings.path = Some(text[3].clone()); settings.env.clear(); settings.args.clear(); }
            }
            if let Err(err) = settings.validate() {
                prop_assert!(!err.field.is_empty());
            } else {
                let _ = settings.resolve(&EnvAllow::any(), &|_| Some("v".to_string()));
            }
        }

        /// A path made of normal components and `..` passes exactly when no
        /// prefix climbs above the root.
        #[test]
        fn relative_paths_never_escape(parts in proptest::collection::vec(prop_oneof!["[a-z]{1,4}", Just("..".to_string()), Just(".".to_string())], 1..8)) {
            let path = parts.join("/");
            let mut depth = 0i64;
            let mut escapes = false;
            for part in &parts {
                match part.as_str() {
                    ".." => { depth -= 1; escapes |= depth < 0; }
                    "." => {}
                    _ => depth += 1,
                }
            }
            prop_assert_eq!(is_contained_relative_path(&path), !escapes);
            let absolute = format!("/{path}");
            prop_assert!(!is_contained_relative_path(&absolute));
        }
    }
}
