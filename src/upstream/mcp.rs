//! An MCP client session on one source ([`McpSession`], over `rmcp`): a
//! child process over stdio (started with the declared env only, killed
//! when the last handle drops) or a streamable HTTP endpoint (through the
//! SSRF guard). It runs the `initialize` handshake within a timeout, lists
//! tools following pagination to the end (at most `[limits] max_tool_pages` pages),
//! reports `notifications/tools/list_changed` on a channel, calls tools with
//! a timeout (on expiry the upstream gets `notifications/cancelled` for the
//! request) and a progress sink, and knows at once when the session ends
//! ([`McpSession::closed`]), so callers answer `unavailable` without waiting.
//!
//! Progress is advisory: a progress notification handled before the call's
//! sink is registered (in the instant between sending the request and
//! registering) or after its answer (rmcp handles each notification in a
//! task of its own, so the last one can trail the answer) is dropped.

use super::guard::SsrfGuard;
use super::{truncate, UpstreamError, UpstreamErrorKind};
use crate::core::dispatch::ssrf::Cidr;
use crate::core::dispatch::{CallResult, ErrorCode};
use crate::core::sources::settings::McpConnection;
use crate::core::sources::{Invocation, SourceTool};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientCapabilities, ClientConfig, ClientRequest, Implementation,
    ListToolsRequest, PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerResult,
};
use rmcp::service::{
    NotificationContext, PeerRequestOptions, QuitReason, RunningService, RunningServiceCancellationToken,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, Peer, RoleClient, ServiceError, ServiceExt};
use serde_json::{json, Map, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use tokio::sync::{mpsc, watch};

/// The most pages `list_tools` follows.
/// The longest tool description kept, in characters (a source's text is not trusted to be short).
pub const MAX_DESCRIPTION_CHARS: usize = 8_192;
/// How much of an upstream's error text a failed call carries, in characters.
const ERROR_TEXT_CHARS: usize = 2_000;
/// How many lines of a stdio server's stderr are kept to explain its end.
const STDERR_LINES: usize = 20;
/// The environment variables a stdio server inherits from capdex (the rest of
/// capdex's environment, where its own secrets live, is not passed on).
const INHERITED_ENV: &[&str] = &["PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// How to connect.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// The longest the process start or HTTP connect plus `initialize` may take.
    pub init_timeout: Duration,
    /// The SSRF allowlist of a streamable HTTP endpoint.
    pub allowlist: Vec<Cidr>,
}

impl Default for ConnectOptions {
    fn default() -> ConnectOptions {
        ConnectOptions { init_timeout: Duration::from_secs(20), allowlist: Vec::new() }
    }
}

/// One progress notification of a call.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub progress: f64,
    pub total: Option<f64>,
    pub message: Option<String>,
}

/// Receives one `()` per `notifications/tools/list_changed` (coalesced while unread).
pub type ToolsChanged = mpsc::Receiver<()>;

/// A live MCP session. Clones share it; the session (and a stdio child) ends
/// when the last clone drops.
///
/// # Examples
/// ```no_run
/// use capdex::core::sources::settings::McpConnection;
/// use capdex::upstream::mcp::{ConnectOptions, McpSession};
/// use std::time::Duration;
/// # async fn run() -> Result<(), capdex::upstream::UpstreamError> {
/// let time = McpConnection::Stdio { command: "mcp-server-time".into(), args: vec![], env: vec![], cwd: None };
/// let (session, mut tools_changed) = McpSession::connect(&time, &ConnectOptions::default()).await?;
/// let tools = session.list_tools(Duration::from_secs(10)).await?;
/// let result = session
///     .call_tool("get_current_time", serde_json::json!({"timezone": "UTC"}), Duration::from_secs(5), None)
///     .await;
/// tokio::select! {
///     _ = tools_changed.recv() => { /* list the tools again */ }
///     reason = session.closed() => { /* reconnect with backoff; calls answer `unavailable` meanwhile */ }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct McpSession {
    peer: Peer<RoleClient>,
    closed: watch::Receiver<Option<String>>,
    progress_sinks: ProgressSinks,
    shared: Arc<SessionShared>,
    /// The most tools `list_tools` accepts (`[limits] max_tools_per_source`).
    max_tools: usize,
    /// The most pages `list_tools` follows (`[limits] max_tool_pages`).
    max_pages: usize,
}

impl std::fmt::Debug for McpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpSession")
            .field("server", &self.shared.server_name)
            .field("pid", &self.shared.pid)
            .field("closed", &self.is_closed())
            .finish()
    }
}

type ProgressSinks = Arc<Mutex<HashMap<ProgressToken, mpsc::Sender<Progress>>>>;

/// What clones share; dropping the last one cancels the session's task,
/// which closes the transport (a stdio child gets EOF, then SIGTERM, then SIGKILL).
struct SessionShared {
    cancel: Mutex<Option<RunningServiceCancellationToken>>,
    closed_tx: Arc<watch::Sender<Option<String>>>,
    server_name: String,
    pid: Option<u32>,
}

impl SessionShared {
    /// Ends the session with `reason` (the first reason given is kept).
    fn end(&self, reason: String) {
        set_reason(&self.closed_tx, reason);
        if let Some(cancel) = self.cancel.lock().unwrap_or_else(|e| e.into_inner()).take() {
            cancel.cancel();
        }
    }
}

impl Drop for SessionShared {
    fn drop(&mut self) {
        self.end("the session was closed by capdex".into());
    }
}

fn set_reason(closed_tx: &watch::Sender<Option<String>>, reason: String) {
    closed_tx.send_if_modified(|closed| {
        if closed.is_some() {
            return false;
        }
        *closed = Some(reason);
        true
    });
}

#[derive(Clone)]
struct Handler {
    config: ClientConfig,
    progress_sinks: ProgressSinks,
    tools_changed: mpsc::Sender<()>,
}

impl ClientHandler for Handler {
    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        let sink = self.progress_sinks.lock().unwrap_or_else(|e| e.into_inner()).get(&params.progress_token).cloned();
        if let Some(sink) = sink {
            // Never block the session's loop on a slow reader: a full sink drops the update.
            let _ = sink.try_send(Progress { progress: params.progress, total: params.total, message: params.message });
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.tools_changed.try_send(());
    }

    fn get_info(&self) -> ClientConfig {
        self.config.clone()
    }
}

impl McpSession {
    /// Starts the program or reaches the endpoint, and runs `initialize`,
    /// all within `options.init_timeout`. Answers the session and the
    /// receiver of its tool-list changes.
    pub async fn connect(
        connection: &McpConnection,
        options: &ConnectOptions,
    ) -> Result<(McpSession, ToolsChanged), UpstreamError> {
        let (tools_changed_tx, tools_changed) = mpsc::channel(1);
        let progress_sinks: ProgressSinks = Arc::default();
        let handler = Handler {
            config: ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new("capdex", env!("CARGO_PKG_VERSION")),
            ),
            progress_sinks: progress_sinks.clone(),
            tools_changed: tools_changed_tx,
        };
        let init_timeout_ms = options.init_timeout.as_millis();
        let timed_out = || {
            UpstreamError::new(
                UpstreamErrorKind::Timeout,
                format!("no answer to initialize within {init_timeout_ms} ms"),
            )
        };
        let stderr_tail: Arc<Mutex<VecDeque<String>>> = Arc::default();
        let (running, pid) = match connection {
            McpConnection::Stdio { command, args, env, cwd } => {
                if command.trim().is_empty() {
                    return Err(UpstreamError::new(UpstreamErrorKind::InvalidTarget, "the command is empty"));
                }
                let mut process = tokio::process::Command::new(command);
                process.args(args).env_clear().kill_on_drop(true);
                for name in INHERITED_ENV {
                    if let Some(value) = std::env::var_os(name) {
                        process.env(name, value);
                    }
                }
                process.envs(env.iter().map(|(name, value)| (name, value)));
                if let Some(cwd) = cwd {
                    process.current_dir(cwd);
                }
                let (transport, stderr) =
                    TokioChildProcess::builder(process).stderr(std::process::Stdio::piped()).spawn().map_err(
                        |err| UpstreamError::new(UpstreamErrorKind::Spawn, format!("cannot start {command:?}: {err}")),
                    )?;
                let pid = transport.id();
                if let Some(stderr) = stderr {
                    let tail = stderr_tail.clone();
                    tokio::spawn(async move {
                        let mut lines = tokio::io::BufReader::new(stderr).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                            if tail.len() == STDERR_LINES {
                                tail.pop_front();
                            }
                            tail.push_back(truncate(&line, 300));
                        }
                    });
                }
                let running = match tokio::time::timeout(options.init_timeout, handler.serve(transport)).await {
                    Err(_) => return Err(timed_out()),
                    Ok(Err(err)) => {
                        let stderr = stderr_text(&stderr_tail);
                        return Err(UpstreamError::new(
                            UpstreamErrorKind::Connect,
                            truncate(&format!("{command:?} did not complete initialize: {err}{stderr}"), 1_000),
                        ));
                    }
                    Ok(Ok(running)) => running,
                };
                (running, pid)
            }
            McpConnection::Http { url, headers } => {
                let guard = SsrfGuard::new(options.allowlist.clone());
                guard.check_url(url)?;
                let client = guard.client_builder().connect_timeout(options.init_timeout).build().map_err(|err| {
                    UpstreamError::new(UpstreamErrorKind::Connect, format!("cannot build the HTTP client: {err}"))
                })?;
                let mut custom_headers = HashMap::new();
                for (name, value) in headers {
                    let name = reqwest::header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                        UpstreamError::new(UpstreamErrorKind::InvalidTarget, format!("{name:?} is not a header name"))
                    })?;
                    let value = reqwest::header::HeaderValue::from_str(value).map_err(|_| {
                        UpstreamError::new(
                            UpstreamErrorKind::InvalidTarget,
                            format!("the header {name} has an invalid value"),
                        )
                    })?;
                    custom_headers.insert(name, value);
                }
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom_headers);
                let transport = StreamableHttpClientTransport::with_client(client, config);
                let running = match tokio::time::timeout(options.init_timeout, handler.serve(transport)).await {
                    Err(_) => return Err(timed_out()),
                    Ok(Err(err)) => {
                        let mut message = format!("{url} did not complete initialize: {err}");
                        if let Some(refusal) = super::guard::refusal_in(&err) {
                            return Err(UpstreamError::new(UpstreamErrorKind::TargetRefused, refusal.to_string()));
                        }
                        if message.contains("not allowlisted") {
                            return Err(UpstreamError::new(UpstreamErrorKind::TargetRefused, truncate(&message, 500)));
                        }
                        message = truncate(&message, 1_000);
                        return Err(UpstreamError::new(UpstreamErrorKind::Connect, message));
                    }
                    Ok(Ok(running)) => running,
                };
                (running, None)
            }
        };
        Ok((McpSession::watch(running, progress_sinks, stderr_tail, pid), tools_changed))
    }

    /// Hands the running service to a task that reports its end on a watch channel.
    fn watch(
        running: RunningService<RoleClient, Handler>,
        progress_sinks: ProgressSinks,
        stderr_tail: Arc<Mutex<VecDeque<String>>>,
        pid: Option<u32>,
    ) -> McpSession {
        let peer = running.peer().clone();
        let server_name = peer
            .peer_info()
            .and_then(|info| info.server_info.as_ref().map(|implementation| implementation.name.clone()))
            .unwrap_or_default();
        let cancel = running.cancellation_token();
        let (closed_tx, closed) = watch::channel(None);
        let closed_tx = Arc::new(closed_tx);
        let task_closed_tx = closed_tx.clone();
        tokio::spawn(async move {
            let reason = match running.waiting().await {
                Ok(QuitReason::Closed) => "the source closed the session".to_string(),
                Ok(QuitReason::Cancelled) => "the session was closed by capdex".to_string(),
                Ok(QuitReason::JoinError(err)) | Err(err) => format!("the session failed: {err}"),
                Ok(_) => "the session ended".to_string(),
            };
            // Give the stderr reader a moment to take the dying process's last words.
            tokio::time::sleep(Duration::from_millis(50)).await;
            set_reason(&task_closed_tx, format!("{reason}{}", stderr_text(&stderr_tail)));
        });
        McpSession {
            peer,
            closed,
            progress_sinks,
            shared: Arc::new(SessionShared { cancel: Mutex::new(Some(cancel)), closed_tx, server_name, pid }),
            max_tools: crate::core::limits::Limits::default().max_tools_per_source,
            max_pages: crate::core::limits::Limits::default().max_tool_pages,
        }
    }

    /// The same session, its tool lists refused beyond `max_tools` tools
    /// (`[limits] max_tools_per_source`; the default's otherwise).
    pub fn with_max_tools(mut self, max_tools: usize) -> McpSession {
        self.max_tools = max_tools;
        self
    }

    /// The same session, following at most `max_pages` pages of `tools/list`
    /// (`[limits] max_tool_pages`; the default's otherwise).
    pub fn with_max_pages(mut self, max_pages: usize) -> McpSession {
        self.max_pages = max_pages.max(1);
        self
    }

    /// The name the server gave in `initialize` (may be empty).
    pub fn server_name(&self) -> &str {
        &self.shared.server_name
    }

    /// The process id of a stdio server.
    pub fn process_id(&self) -> Option<u32> {
        self.shared.pid
    }

    /// True once the session is over.
    pub fn is_closed(&self) -> bool {
        self.closed.borrow().is_some() || self.peer.is_transport_closed()
    }

    /// Resolves when the session is over, with why (and a stdio server's last stderr lines).
    pub async fn closed(&self) -> String {
        let mut closed = self.closed.clone();
        let reason = match closed.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "the session ended".to_string(),
        };
        reason
    }

    /// Every tool the server offers, following `nextCursor` (at most
    /// `max_tool_pages` pages ([`McpSession::with_max_pages`]; beyond them a
    /// protocol error naming the setting); more tools than the session's
    /// `max_tools_per_source` ([`McpSession::with_max_tools`]) is a
    /// `too_large` refusal naming the setting), all within `timeout`.
    /// Tools with an empty name, one over 256 bytes, a `#` in it, or a name seen
    /// before are left out; descriptions are cut to [`MAX_DESCRIPTION_CHARS`].
    pub async fn list_tools(&self, timeout: Duration) -> Result<Vec<SourceTool>, UpstreamError> {
        let timeout_ms = timeout.as_millis();
        match tokio::time::timeout(timeout, self.list_all_pages(timeout)).await {
            Ok(result) => result,
            Err(_) => {
                Err(UpstreamError::new(UpstreamErrorKind::Timeout, format!("tools/list took over {timeout_ms} ms")))
            }
        }
    }

    async fn list_all_pages(&self, timeout: Duration) -> Result<Vec<SourceTool>, UpstreamError> {
        let mut tools: Vec<SourceTool> = Vec::new();
        let mut names = std::collections::HashSet::new();
        let mut cursor: Option<String> = None;
        for _ in 0..self.max_pages {
            let params = PaginatedRequestParams::default().with_cursor(cursor.take());
            let request: ClientRequest = ListToolsRequest::with_param(params).into();
            let handle = self
                .peer
                .send_request_with_option(request, PeerRequestOptions::with_timeout(timeout))
                .await
                .map_err(|err| self.service_error(err, "tools/list"))?;
            let page = match handle.await_response().await.map_err(|err| self.service_error(err, "tools/list"))? {
                ServerResult::ListToolsResult(page) => page,
                _ => return Err(UpstreamError::new(UpstreamErrorKind::Protocol, "tools/list answered something else")),
            };
            for tool in page.tools {
                let name = tool.name.to_string();
                let too_long = name.len() > crate::core::limits::MAX_TOOL_NAME_BYTES;
                if name.is_empty() || too_long || name.contains('#') || !names.insert(name.clone()) {
                    tracing::warn!(tool = %truncate(&name, 100), "a source offered a tool with an unusable or repeated name");
                    continue;
                }
                if tools.len() == self.max_tools {
                    return Err(UpstreamError::new(
                        UpstreamErrorKind::TooLarge,
                        format!(
                            "the source offers over {} tools, more than limits.max_tools_per_source allows",
                            self.max_tools
                        ),
                    ));
                }
                let title = tool.title.clone().or_else(|| tool.annotations.as_ref().and_then(|a| a.title.clone()));
                tools.push(SourceTool {
                    invocation: Invocation::Mcp { tool: name.clone() },
                    name,
                    title: title.map(|title| truncate(&title, 256)),
                    description: truncate(tool.description.as_deref().unwrap_or_default(), MAX_DESCRIPTION_CHARS),
                    input_schema: Value::Object((*tool.input_schema).clone()),
                    output_schema: tool.output_schema.as_ref().map(|schema| Value::Object((**schema).clone())),
                });
            }
            match page.next_cursor {
                Some(next) if !next.is_empty() => cursor = Some(next),
                _ => return Ok(tools),
            }
        }
        Err(UpstreamError::new(
            UpstreamErrorKind::Protocol,
            format!("tools/list did not end within {} pages, over limits.max_tool_pages", self.max_pages),
        ))
    }

    /// Calls tool `name` with `arguments` (an object, or null for none).
    /// Success keeps `content` and `structuredContent` as `data`; an
    /// `isError` result is an `execution_error` carrying the upstream's text;
    /// on `timeout` the upstream is told to cancel and the call answers an
    /// `execution_error`; a session that is or goes down answers `unavailable`.
    /// Progress notifications of this call go to `progress`.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        timeout: Duration,
        progress: Option<mpsc::Sender<Progress>>,
    ) -> CallResult {
        if self.is_closed() {
            return self.unavailable().await;
        }
        let arguments: Option<Map<String, Value>> = match arguments {
            Value::Object(map) => Some(map),
            Value::Null => None,
            _ => return CallResult::fail(ErrorCode::InvalidArgs, "the arguments must be a JSON object"),
        };
        let mut params = CallToolRequestParams::new(name.to_string());
        params.arguments = arguments;
        let request: ClientRequest = CallToolRequest::new(params).into();
        let timeout_ms = timeout.as_millis();
        let call = async {
            let handle = self.peer.send_request_with_option(request, PeerRequestOptions::with_timeout(timeout)).await?;
            let _registration = progress
                .map(|sink| ProgressRegistration::new(&self.progress_sinks, handle.progress_token.clone(), sink));
            handle.await_response().await
        };
        // The request's own timeout sends `notifications/cancelled`; the outer
        // bound only guards against a send that never completes.
        let answer = tokio::select! {
            answer = tokio::time::timeout(timeout + Duration::from_secs(1), call) => answer,
            reason = self.closed() => return CallResult::fail(ErrorCode::Unavailable, format!("the source went down during the call: {reason}")),
        };
        match answer {
            Err(_) => CallResult::fail(ErrorCode::ExecutionError, format!("no answer within {timeout_ms} ms")),
            Ok(Err(ServiceError::Timeout { .. })) => CallResult::fail(
                ErrorCode::ExecutionError,
                format!("no answer within {timeout_ms} ms; the call was cancelled on the source"),
            ),
            Ok(Err(err)) => self.service_error(err, "tools/call").to_call_result(),
            Ok(Ok(ServerResult::CallToolResult(result))) => {
                let content = serde_json::to_value(&result.content).unwrap_or_else(|_| json!([]));
                if result.is_error == Some(true) {
                    let text = content_text(&content);
                    let text = if text.is_empty() { "the tool reported an error".to_string() } else { text };
                    return CallResult::fail(ErrorCode::ExecutionError, truncate(&text, ERROR_TEXT_CHARS));
                }
                let mut data = json!({"content": content});
                if let Some(structured) = result.structured_content {
                    data["structuredContent"] = structured;
                }
                CallResult::ok(data)
            }
            Ok(Ok(ServerResult::EmptyResult(_))) => CallResult::ok(json!({"content": []})),
            Ok(Ok(_)) => {
                CallResult::fail(ErrorCode::ExecutionError, "tools/call answered something other than a tool result")
            }
        }
    }

    /// Ends the session now (every clone sees it closed).
    pub fn close(&self) {
        self.shared.end("the session was closed by capdex".into());
    }

    async fn unavailable(&self) -> CallResult {
        let reason = tokio::time::timeout(Duration::from_millis(200), self.closed())
            .await
            .unwrap_or_else(|_| "the session is closed".to_string());
        CallResult::fail(ErrorCode::Unavailable, format!("the source is not connected: {reason}"))
    }

    /// Maps an rmcp error; a transport failure ends the session (the upstream
    /// is gone or unreachable), so `closed` fires and the owner reconnects.
    fn service_error(&self, err: ServiceError, doing: &str) -> UpstreamError {
        let error = Self::map_service_error(err, doing);
        if error.kind == UpstreamErrorKind::Closed {
            self.shared.end(format!("the source stopped answering: {}", error.message));
        }
        error
    }

    fn map_service_error(err: ServiceError, doing: &str) -> UpstreamError {
        match err {
            ServiceError::McpError(data) => UpstreamError::new(
                UpstreamErrorKind::Protocol,
                truncate(
                    &format!("{doing} was refused by the source (error {}): {}", data.code.0, data.message),
                    ERROR_TEXT_CHARS,
                ),
            ),
            ServiceError::Timeout { timeout } => {
                UpstreamError::new(UpstreamErrorKind::Timeout, format!("{doing} took over {} ms", timeout.as_millis()))
            }
            ServiceError::TransportClosed => {
                UpstreamError::new(UpstreamErrorKind::Closed, format!("{doing}: the session is closed"))
            }
            ServiceError::TransportSend(err) => {
                UpstreamError::new(UpstreamErrorKind::Closed, truncate(&format!("{doing}: sending failed: {err}"), 500))
            }
            other => {
                UpstreamError::new(UpstreamErrorKind::Protocol, truncate(&format!("{doing} failed: {other}"), 500))
            }
        }
    }
}

/// A call's progress sink, registered while the call runs.
struct ProgressRegistration {
    sinks: ProgressSinks,
    token: ProgressToken,
}

impl ProgressRegistration {
    fn new(sinks: &ProgressSinks, token: ProgressToken, sink: mpsc::Sender<Progress>) -> ProgressRegistration {
        sinks.lock().unwrap_or_else(|e| e.into_inner()).insert(token.clone(), sink);
        ProgressRegistration { sinks: sinks.clone(), token }
    }
}

impl Drop for ProgressRegistration {
    fn drop(&mut self) {
        self.sinks.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.token);
    }
}

/// The text blocks of a tool result's content, joined by newlines.
fn content_text(content: &Value) -> String {
    content
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|block| block.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

fn stderr_text(tail: &Arc<Mutex<VecDeque<String>>>) -> String {
    let tail = tail.lock().unwrap_or_else(|e| e.into_inner());
    if tail.is_empty() {
        String::new()
    } else {
        format!(" (stderr: {})", tail.iter().cloned().collect::<Vec<_>>().join(" | "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_is_the_text_blocks() {
        let content = json!([
            {"type": "text", "text": "first"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "text", "text": "second"}
        ]);
        assert_eq!(content_text(&content), "first\nsecond");
        assert_eq!(content_text(&json!([])), "");
        assert_eq!(content_text(&json!("not an array")), "");
    }
}
