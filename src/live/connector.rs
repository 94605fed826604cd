//! The SourceManager's [`Connector`] over `upstream`: an MCP session (stdio
//! or streamable HTTP), an OpenAPI document (a URL, fetched again with
//! `If-None-Match`, or a file below `scg.map_path_roots`) with a pooled HTTP
//! client for its operations, or a SQL schema (a file, not callable).
//!
//! `${env:VAR}` values are resolved when a source connects; an OpenAPI
//! source's auth again at every call, so a rotated secret applies at once.

use crate::actors::sources::{Connected, Connector, Link, ProgressSink, Synced};
use crate::config::Settings;
use crate::core::dispatch::env_template::EnvAllow;
use crate::core::dispatch::ssrf::Cidr;
use crate::core::dispatch::{CallResult, ErrorCode};
use crate::core::limits::Limits;
use crate::core::scg::model::SourceKind as ScgKind;
use crate::core::sources::request::build_request;
use crate::core::sources::settings::{Connection, DocumentLocation, SettingsErrorKind, SourceSettings};
use crate::core::sources::tools::{mcp_document, tools_of_limited};
use crate::core::sources::{HttpOperation, Invocation};
use crate::upstream::http::{HttpExecutor, DEFAULT_MAX_RESPONSE_BYTES};
use crate::upstream::mcp::{ConnectOptions, McpSession, ToolsChanged};
use crate::upstream::openapi::{read_file_under_roots, DocumentFetcher, Fetched, DEFAULT_MAX_DOCUMENT_BYTES};
use futures::future::{BoxFuture, LocalBoxFuture};
use futures::FutureExt;
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a tools/list or a document fetch may take.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads a variable for `${env:VAR}` (the process environment).
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Connects sources with the SSRF allowlist of `[dispatch]` and the file roots of `[scg]`.
pub struct UpstreamConnector {
    allowlist: Vec<Cidr>,
    roots: Vec<PathBuf>,
    /// What a client's source may read through `${env:VAR}` (`[dispatch] env_allow`).
    env_allow: EnvAllow,
    /// The operator's `[[sources]]`, as written: exactly these may read any variable.
    declared: Vec<SourceSettings>,
    /// `[limits]`: a source's tools, and the nesting, aliases, operations and `$ref` chains of its document.
    limits: Limits,
}

impl UpstreamConnector {
    pub fn new(settings: &Settings) -> UpstreamConnector {
        UpstreamConnector {
            allowlist: settings.dispatch.ssrf_allowlist.clone(),
            roots: settings.scg.map_path_roots.clone(),
            env_allow: settings.dispatch.env_allow.clone(),
            declared: settings.sources.clone(),
            limits: settings.limits,
        }
    }

    /// What `settings` may read: any variable when the operator's config file
    /// declares exactly these settings, else `[dispatch] env_allow` (a client's
    /// `sources.add`, even one reusing a declared id with other values).
    fn env_allow_for(&self, settings: &SourceSettings) -> EnvAllow {
        if self.declared.iter().any(|declared| declared == settings) {
            EnvAllow::any()
        } else {
            self.env_allow.clone()
        }
    }
}

impl Connector for UpstreamConnector {
    fn connect(&self, settings: &SourceSettings) -> LocalBoxFuture<'static, Result<Connected, String>> {
        let (settings, allowlist, roots) = (settings.clone(), self.allowlist.clone(), self.roots.clone());
        let limits = self.limits;
        let env_allow = self.env_allow_for(&settings);
        async move {
            let resolved = settings.resolve(&env_allow, &env).map_err(|err| err.to_string())?;
            match resolved.connection {
                Connection::Mcp(connection) => {
                    let options = ConnectOptions { allowlist, ..ConnectOptions::default() };
                    let (session, changed) =
                        McpSession::connect(&connection, &options).await.map_err(|err| err.to_string())?;
                    let session =
                        session.with_max_tools(limits.max_tools_per_source).with_max_pages(limits.max_tool_pages);
                    let tools = session.list_tools(SYNC_TIMEOUT).await.map_err(|err| err.to_string())?;
                    let synced = Synced { document: mcp_document(&tools).to_string(), tools };
                    let link = McpLink { session, changed: Arc::new(tokio::sync::Mutex::new(changed)) };
                    Ok(Connected { synced, link: Some(Arc::new(link)) })
                }
                Connection::Openapi { document, base_url, .. } => {
                    let fetcher = DocumentFetcher::new(allowlist.clone(), DEFAULT_MAX_DOCUMENT_BYTES)
                        .map_err(|err| err.to_string())?;
                    let (text, etag, url) = match &document {
                        DocumentLocation::Url(url) => match fetcher.fetch(url, None, SYNC_TIMEOUT).await {
                            Ok(Fetched::Document { text, etag }) => (text, etag, Some(url.clone())),
                            Ok(Fetched::NotModified) => return Err("the server answered 304 to a first fetch".into()),
                            Err(err) => return Err(err.to_string()),
                        },
                        DocumentLocation::File(path) => {
                            let text = read_file_under_roots(path, &roots, DEFAULT_MAX_DOCUMENT_BYTES)
                                .await
                                .map_err(|err| err.to_string())?;
                            (text, None, None)
                        }
                    };
                    let executor =
                        HttpExecutor::new(allowlist, DEFAULT_MAX_RESPONSE_BYTES).map_err(|err| err.to_string())?;
                    let openapi = OpenApiLink {
                        settings,
                        env_allow,
                        url,
                        base_url,
                        fetcher,
                        executor,
                        state: Arc::new(Mutex::new(OpenApiState { etag, operations: HashMap::new() })),
                        limits,
                    };
                    let synced = openapi.synced(text)?;
                    Ok(Connected { synced, link: Some(Arc::new(openapi)) })
                }
                Connection::Sql { path } => {
                    let text = read_file_under_roots(&path, &roots, DEFAULT_MAX_DOCUMENT_BYTES)
                        .await
                        .map_err(|err| err.to_string())?;
                    let tools = tools_of_limited(ScgKind::Sql, &text, &limits).map_err(|err| err.to_string())?;
                    Ok(Connected { synced: Synced { tools, document: text }, link: None })
                }
            }
        }
        .boxed_local()
    }
}

/// A live MCP session.
struct McpLink {
    session: McpSession,
    changed: Arc<tokio::sync::Mutex<ToolsChanged>>,
}

impl Link for McpLink {
    fn call(
        &self,
        name: &str,
        arguments: Value,
        timeout_ms: u64,
        progress: ProgressSink,
    ) -> BoxFuture<'static, CallResult> {
        let (session, name) = (self.session.clone(), name.to_string());
        async move {
            let (sink, mut updates) = tokio::sync::mpsc::channel(16);
            let tool = name.clone();
            let forward = async move {
                while let Some(update) = updates.recv().await {
                    let crate::upstream::mcp::Progress { progress: done, total, message } = update;
                    progress(serde_json::json!({ "tool": tool, "progress": done, "total": total, "message": message }));
                }
            };
            let call = session.call_tool(&name, arguments, Duration::from_millis(timeout_ms), Some(sink));
            let (result, ()) = futures::future::join(call, forward).await;
            result
        }
        .boxed()
    }

    fn closed(&self) -> BoxFuture<'static, ()> {
        let session = self.session.clone();
        async move {
            session.closed().await;
        }
        .boxed()
    }

    fn tools_changed(&self) -> BoxFuture<'static, ()> {
        let changed = self.changed.clone();
        async move {
            if changed.lock().await.recv().await.is_none() {
                // The session ended: `closed` tells that; this never resolves.
                futures::future::pending::<()>().await;
            }
        }
        .boxed()
    }

    fn list_tools(&self) -> BoxFuture<'static, Result<Option<Synced>, String>> {
        let session = self.session.clone();
        async move {
            let tools = session.list_tools(SYNC_TIMEOUT).await.map_err(|err| err.to_string())?;
            Ok(Some(Synced { document: mcp_document(&tools).to_string(), tools }))
        }
        .boxed()
    }
}

/// What an OpenAPI source's calls read: its operations and the document's ETag.
struct OpenApiState {
    etag: Option<String>,
    operations: HashMap<String, HttpOperation>,
}

/// An OpenAPI source: its operations, called over one pooled client.
struct OpenApiLink {
    settings: SourceSettings,
    /// What its auth's `${env:VAR}` may read, checked again at every call.
    env_allow: EnvAllow,
    /// The document's URL (relative server URLs resolve against it); `None` for a file.
    url: Option<String>,
    /// The `baseUrl` setting, which replaces the document's servers.
    base_url: Option<String>,
    fetcher: DocumentFetcher,
    executor: HttpExecutor,
    state: Arc<Mutex<OpenApiState>>,
    /// `[limits]`, which every read of its document is checked against.
    limits: Limits,
}

impl OpenApiLink {
    /// Reads a document's operations into the link; answers what to publish.
    fn synced(&self, text: String) -> Result<Synced, String> {
        let mut tools = tools_of_limited(ScgKind::Openapi, &text, &self.limits).map_err(|err| err.to_string())?;
        for tool in &mut tools {
            if let Invocation::Http(operation) = &mut tool.invocation {
                operation.base_url = self.base_for(&operation.base_url);
            }
        }
        let operations = tools
            .iter()
            .filter_map(|tool| match &tool.invocation {
                Invocation::Http(operation) => Some((tool.name.clone(), operation.clone())),
                _ => None,
            })
            .collect();
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).operations = operations;
        Ok(Synced { tools, document: text })
    }

    /// The base URL calls go to: the setting, else the document's server resolved against its URL.
    fn base_for(&self, documented: &str) -> String {
        if let Some(base) = &self.base_url {
            return base.clone();
        }
        match (&self.url, reqwest::Url::parse(documented)) {
            (_, Ok(absolute)) => absolute.to_string(),
            (Some(url), Err(_)) => reqwest::Url::parse(url)
                .and_then(|url| url.join(if documented.is_empty() { "/" } else { documented }))
                .map_or_else(|_| documented.to_string(), |joined| joined.to_string()),
            (None, Err(_)) => documented.to_string(),
        }
    }
}

impl Link for OpenApiLink {
    fn call(&self, name: &str, arguments: Value, timeout_ms: u64, _: ProgressSink) -> BoxFuture<'static, CallResult> {
        let operation =
            self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).operations.get(name).cloned();
        let Some(operation) = operation else {
            let message = format!("source {} has no operation {name}", self.settings.id);
            return futures::future::ready(CallResult::fail(ErrorCode::UnknownCapability, message)).boxed();
        };
        // The auth's `${env:VAR}` values are read now, at call time.
        let auth = match self.settings.resolve(&self.env_allow, &env) {
            Ok(resolved) => match resolved.connection {
                Connection::Openapi { auth, .. } => auth,
                _ => None,
            },
            Err(err) => {
                let code = match err.kind {
                    SettingsErrorKind::EnvNotAllowed => ErrorCode::EnvNotAllowed,
                    _ => ErrorCode::InvalidBinding,
                };
                return futures::future::ready(CallResult::fail(code, err.to_string())).boxed();
            }
        };
        let plan = match build_request(&operation, &arguments, auth.as_ref()) {
            Ok(plan) => plan,
            Err(err) => return futures::future::ready(CallResult::fail(err.code(), err.to_string())).boxed(),
        };
        let executor = self.executor.clone();
        async move { executor.execute(&plan, Duration::from_millis(timeout_ms)).await }.boxed()
    }

    fn closed(&self) -> BoxFuture<'static, ()> {
        // Each call connects (or reuses a pooled connection): there is no session to lose.
        futures::future::pending().boxed()
    }

    fn tools_changed(&self) -> BoxFuture<'static, ()> {
        futures::future::pending().boxed()
    }

    fn list_tools(&self) -> BoxFuture<'static, Result<Option<Synced>, String>> {
        let Some(url) = self.url.clone() else { return futures::future::ready(Ok(None)).boxed() };
        let etag = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).etag.clone();
        let fetcher = self.fetcher.clone();
        let link = self.clone_shallow();
        async move {
            match fetcher.fetch(&url, etag.as_deref(), SYNC_TIMEOUT).await {
                Ok(Fetched::NotModified) => Ok(None),
                Ok(Fetched::Document { text, etag }) => {
                    let synced = link.synced(text)?;
                    link.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).etag = etag;
                    Ok(Some(synced))
                }
                Err(err) => Err(err.to_string()),
            }
        }
        .boxed()
    }
}

impl OpenApiLink {
    /// A handle sharing this link's state.
    fn clone_shallow(&self) -> OpenApiLink {
        OpenApiLink {
            settings: self.settings.clone(),
            env_allow: self.env_allow.clone(),
            url: self.url.clone(),
            base_url: self.base_url.clone(),
            fetcher: self.fetcher.clone(),
            executor: self.executor.clone(),
            state: self.state.clone(),
            limits: self.limits,
        }
    }
}
