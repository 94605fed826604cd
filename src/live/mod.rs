//! Wiring of live sources: the SourceManager's [`Publisher`] over
//! `source_catalog`, its [`Connector`] over `upstream`, its start (the
//! stored sources and the config's `[[sources]]`), and the answers to
//! `capdex.v1.sources.*`.

mod connector;

use crate::actors::sources::{
    AddSource, Connector, ListSources, LoadSource, ManagerSettings, Publisher, RemoveSource, SourceEvent,
    SourceManager, SourcesError,
};
use crate::actors::Actors;
use crate::config::Settings;
use crate::core::scg::model::SourceKind as ScgKind;
use crate::core::sources::settings::{SourceKind, SourceSettings};
use crate::core::sources::SourceTool;
use crate::gateway::errors::ErrorKind;
use crate::gateway::wire::ApiError;
use crate::gateway::wire::SourcesRequest;
use crate::source_catalog::{Publication, SourceCatalog, SourceContent};
use crate::store::sources::SourcesStore;
use crate::store::Store;
use actix::prelude::*;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use std::rc::Rc;

/// Publishes through [`SourceCatalog`]: MCP tools as given, OpenAPI and SQL from their text.
struct CatalogPublisher(SourceCatalog);

impl Publisher for CatalogPublisher {
    fn publish(
        &self,
        settings: &SourceSettings,
        document: &str,
        tools: &[SourceTool],
        loadable: bool,
    ) -> LocalBoxFuture<'static, Result<(), String>> {
        let content = match settings.kind {
            SourceKind::Mcp => SourceContent::Tools(tools.to_vec()),
            SourceKind::Openapi | SourceKind::Sql if loadable && document.is_empty() => {
                SourceContent::Tools(tools.to_vec())
            }
            SourceKind::Openapi | SourceKind::Sql => {
                SourceContent::Text(crate::actors::scg::SourceText::Inline(document.to_string()))
            }
        };
        let kind = match (&content, settings.kind) {
            (SourceContent::Tools(_), _) | (_, SourceKind::Mcp) => Some(ScgKind::Mcp),
            (_, SourceKind::Openapi) => Some(ScgKind::Openapi),
            (_, SourceKind::Sql) => Some(ScgKind::Sql),
        };
        let publication = Publication {
            source_id: settings.id.clone(),
            kind,
            content,
            workspaces: settings.workspaces.clone(),
            category: settings.category.clone(),
            tags: settings.tags.clone(),
            loadable,
            timeout_ms: Some(settings.call_timeout_ms()),
            connection: None,
        };
        let catalog = self.0.clone();
        async move { catalog.publish_source(publication).await.map(|_| ()).map_err(|err| err.to_string()) }
            .boxed_local()
    }

    fn withdraw(&self, source_id: &str) -> LocalBoxFuture<'static, Result<(), String>> {
        let catalog = self.0.clone();
        let source_id = source_id.to_string();
        async move { catalog.withdraw_source(&source_id).await.map(|_| ()).map_err(|err| err.to_string()) }
            .boxed_local()
    }
}

/// The running live sources: the manager and its events.
#[derive(Clone)]
pub struct LiveSources {
    pub manager: Addr<SourceManager>,
    pub events: tokio::sync::broadcast::Sender<SourceEvent>,
    /// The variables a client's source may read (`[dispatch] env_allow`).
    pub env_allow: crate::core::dispatch::env_template::EnvAllow,
}

/// Refuses a client's source whose `${env:VAR}` reads a variable outside
/// `[dispatch] env_allow` (`env_not_allowed`, naming the field and the variable).
pub fn check_client_env(settings: &SourceSettings, live: &LiveSources) -> Result<(), ApiError> {
    settings
        .check_env(&live.env_allow)
        .map_err(|err| ApiError::new(ErrorKind::Invalid("env_not_allowed"), format!("{}: {}", err.field, err.problem)))
}

/// Starts the SourceManager, gives the Dispatcher its calls, and adds the
/// stored sources and the config's `[[sources]]` (without waiting for them to connect).
pub fn start(settings: &Settings, store: &Store, actors: &Actors) -> Result<LiveSources, crate::store::StoreError> {
    let sources = SourcesStore::open(store)?;
    let stored = crate::actors::sources::stored_sources(&sources)?;
    let connector: Rc<dyn Connector> = Rc::new(connector::UpstreamConnector::new(settings));
    let publisher: Rc<dyn Publisher> = Rc::new(CatalogPublisher(SourceCatalog::of(actors)));
    let manager = SourceManager::new(sources, connector, publisher, ManagerSettings::default());
    let events = manager.events();
    actors.dispatcher.do_send(crate::actors::dispatcher::SetSourceCalls(std::sync::Arc::new(manager.caller())));
    let manager = manager.start();
    // The config's sources replace stored ones of the same id; the others come back as they were.
    let declared: std::collections::BTreeSet<&str> = settings.sources.iter().map(|s| s.id.as_str()).collect();
    for source in stored.into_iter().filter(|source| !declared.contains(source.id.as_str())) {
        manager.do_send(AddSource { settings: source, persist: false });
    }
    for source in &settings.sources {
        manager.do_send(AddSource { settings: source.clone(), persist: true });
    }
    Ok(LiveSources { manager, events, env_allow: settings.dispatch.env_allow.clone() })
}

fn api_error(err: SourcesError) -> ApiError {
    match err {
        SourcesError::Invalid(message) => ApiError::new(ErrorKind::Invalid("invalid_source"), message),
        SourcesError::NotFound(id) => ApiError::new(ErrorKind::NotFound("unknown_source"), format!("no source {id:?}")),
        SourcesError::Store(err) => ApiError::new(ErrorKind::Storage, err.to_string()),
    }
}

fn id_of(body: &serde_json::Value) -> Result<String, ApiError> {
    body.get("id")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| ApiError::new(ErrorKind::Invalid("invalid_source"), "the request needs an \"id\" string"))
}

/// Answers `capdex.v1.sources.add|remove|list|load`.
pub async fn handle(live: Option<LiveSources>, request: SourcesRequest) -> Result<serde_json::Value, ApiError> {
    let Some(live) = live else {
        return Err(ApiError::not_implemented("live sources are not served by this node"));
    };
    let gone = |err: MailboxError| ApiError::unavailable(err);
    match request {
        SourcesRequest::Add(body) => {
            let settings: SourceSettings = serde_json::from_value(body).map_err(|err| {
                ApiError::new(ErrorKind::Invalid("invalid_source"), format!("source settings: {err}"))
            })?;
            check_client_env(&settings, &live)?;
            let status = live.manager.send(AddSource { settings, persist: true }).await.map_err(gone)?;
            Ok(serde_json::json!({ "source": status.map_err(api_error)? }))
        }
        SourcesRequest::Remove(body) => {
            let id = id_of(&body)?;
            live.manager.send(RemoveSource { id: id.clone() }).await.map_err(gone)?.map_err(api_error)?;
            Ok(serde_json::json!({ "removed": id }))
        }
        SourcesRequest::List => {
            let sources = live.manager.send(ListSources).await.map_err(gone)?;
            Ok(serde_json::json!({ "sources": sources }))
        }
        SourcesRequest::Load(body) => {
            // A source id, or the id of one of its capabilities (`load_capability_extension`).
            let id = id_of(&body)?;
            let id =
                crate::core::sources::split_capability_id(&id).map_or(id.clone(), |(source, _)| source.to_string());
            let status = live.manager.send(LoadSource { id }).await.map_err(gone)?;
            Ok(serde_json::json!({ "source": status.map_err(api_error)? }))
        }
    }
}
