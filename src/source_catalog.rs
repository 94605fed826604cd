//! Wiring: publishes one source's tools into the Source Capability Graph, the
//! catalog (origin `source:<id>`) and the dispatch registry, and withdraws
//! them, so a source capability has one id (`<source_id>#<Name>`) in route,
//! discovery and dispatch (`docs/live-sources.md`).
//!
//! [`SourceCatalog::publish_source`] parses the source on the ScgMapper (the
//! `capdex.v1.map` path), replaces the source's descriptors in the Indexer,
//! stores its graph through the ScgGraph (whose flush puts both on disk), then
//! replaces its records in the Dispatcher. A source is published whole or not
//! at all: when parsing fails nothing has changed, and when storing the graph
//! fails the catalog is put back. Its input is
//! a source text (a document, or a file below `scg.map_path_roots`) or an
//! already-known tool list (a live MCP server's `tools/list`), which is mapped
//! as the MCP document `{tools: [...]}` and kept with its own invocations.
//!
//! `capdex.v1.map` (`app.rs`) publishes through it; the live sources'
//! manager is given a [`SourceCatalog`] by the wiring that starts it. The
//! catalog and the SCG are stored, the dispatch records are not:
//! [`SourceCatalog::restore`] rebuilds them from the catalog on start.
//! [`SourceCatalog::put_shared`] puts a source another node mapped
//! (`shared_state`) into all three the same way.

use crate::actors::discoverer::{CurrentCatalog, Discoverer};
use crate::actors::dispatcher::{Dispatcher, RemoveSourceRecords, SetSourceRecords};
use crate::actors::indexer::SyncCapabilities;
use crate::actors::scg::{
    Finalize, Introspect, MapRequest, PutSource, RemoveSource, ScgActors, ScgError, SourceKinds, SourceOf, SourceText,
};
use crate::actors::Actors;
use crate::core::catalog::source_origin;
use crate::core::descriptor::CapabilityDescriptor;
use crate::core::scg::model::SourceKind;
use crate::core::scg::pipeline::MapReport;
use crate::core::scg::shared::{source_change, Apply, SharedSource};
use crate::core::sources::records::{descriptor_of, record_of, tool_of_descriptor, SourceFacts};
use crate::core::sources::tools::mcp_document;
use crate::core::sources::{Invocation, SourceTool};
use crate::gateway::errors::ErrorKind;
use actix::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// What a source offers: its text, or its tools already known.
#[derive(Clone, Debug)]
pub enum SourceContent {
    /// A source text (sent along, or a file the mapper reads below `scg.map_path_roots`).
    Text(SourceText),
    /// Tools already known, mapped as the MCP document `{tools: [...]}` and kept as given.
    Tools(Vec<SourceTool>),
}

/// One source to publish.
#[derive(Clone, Debug)]
pub struct Publication {
    pub source_id: String,
    /// The kind of the text; inferred when `None`. Ignored for [`SourceContent::Tools`].
    pub kind: Option<SourceKind>,
    pub content: SourceContent,
    /// Workspaces that enable the source (added to those that already did).
    pub workspaces: Vec<String>,
    /// The descriptors' category; the source id when `None`.
    pub category: Option<String>,
    /// Tags every descriptor carries (the source id is added).
    pub tags: Vec<String>,
    /// A lazy source that is not connected now.
    pub loadable: bool,
    /// The records' call timeout, in ms (`None`: `dispatch.default_timeout_ms`).
    pub timeout_ms: Option<u64>,
    /// A connector descriptor: checked, counted and dropped by the mapper.
    pub connection: Option<serde_json::Value>,
}

impl Publication {
    /// A source text of `kind` (inferred when `None`), in no workspace, with no settings.
    pub fn text(source_id: &str, kind: Option<SourceKind>, text: SourceText) -> Publication {
        Publication {
            source_id: source_id.to_string(),
            kind,
            content: SourceContent::Text(text),
            workspaces: Vec::new(),
            category: None,
            tags: Vec::new(),
            loadable: false,
            timeout_ms: None,
            connection: None,
        }
    }

    /// What a `capdex.v1.scg.map` request asks to publish.
    pub fn of_map(request: crate::gateway::wire::ScgMapRequest) -> Result<Publication, crate::gateway::wire::ApiError> {
        let (kind, text) = request.source()?;
        let text = match text {
            Ok(document) => SourceText::Inline(document),
            Err(path) => SourceText::Path(path.into()),
        };
        let mut publication = Publication::text(&request.source_id, kind, text);
        publication.workspaces = request.workspaces;
        publication.connection = request.connection;
        Ok(publication)
    }

    /// Tools already known (a live MCP server's `tools/list`).
    pub fn tools(source_id: &str, tools: Vec<SourceTool>) -> Publication {
        Publication {
            content: SourceContent::Tools(tools),
            kind: Some(SourceKind::Mcp),
            ..Publication::text(source_id, None, SourceText::Inline(String::new()))
        }
    }
}

/// What a publication did.
#[derive(Clone, Debug, PartialEq)]
pub struct Published {
    /// The SCG's map report (what `capdex.v1.map` answers).
    pub report: MapReport,
    /// The capability ids now offered, in the mapper's order.
    pub capability_ids: Vec<String>,
    /// The tools offered under those ids.
    pub tools: Vec<SourceTool>,
}

/// Why a source was not published or withdrawn.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Mapping failed: nothing changed.
    #[error(transparent)]
    Scg(#[from] ScgError),
    /// The SCG has the source, but the catalog did not take its descriptors.
    #[error("source {source_id} is mapped but not offered to discovery: {problem}")]
    Catalog { source_id: String, problem: String },
}

impl PublishError {
    /// Returns its kind, for the gateway's table.
    pub fn kind(&self) -> ErrorKind {
        match self {
            PublishError::Scg(err) => err.kind(),
            PublishError::Catalog { .. } => ErrorKind::Internal,
        }
    }
}

/// The actors a source is published into.
#[derive(Clone)]
pub struct SourceCatalog {
    scg: ScgActors,
    discoverer: Addr<Discoverer>,
    indexer: Recipient<SyncCapabilities>,
    dispatcher: Addr<Dispatcher>,
}

impl SourceCatalog {
    /// Publishes into `actors`' SCG, Indexer and Dispatcher.
    pub fn of(actors: &Actors) -> SourceCatalog {
        SourceCatalog {
            scg: actors.scg.clone(),
            discoverer: actors.discoverer.clone(),
            indexer: actors.indexer.clone().recipient(),
            dispatcher: actors.dispatcher.clone(),
        }
    }

    /// Maps one source into the SCG, then offers its tools to discovery
    /// (origin `source:<id>`, replacing what it offered) and to dispatch.
    pub async fn publish_source(&self, publication: Publication) -> Result<Published, PublishError> {
        let Publication { source_id, kind, content, workspaces, category, tags, loadable, timeout_ms, connection } =
            publication;
        let (kind, text, given) = match content {
            SourceContent::Text(text) => (kind, text, None),
            SourceContent::Tools(tools) => {
                (Some(SourceKind::Mcp), SourceText::Inline(mcp_document(&tools).to_string()), Some(tools))
            }
        };
        let unavailable = |err: MailboxError| ScgError::Unavailable(err.to_string());
        let request = MapRequest { source_id: source_id.clone(), kind, text, workspaces, connection };
        let parsed = self.scg.mapper.send(Introspect(request)).await.map_err(unavailable)??;
        let tools = match given {
            // The given tools, under the names the mapper kept (one per name).
            Some(given) => {
                let mapped: BTreeSet<&str> = parsed.tools.iter().map(|tool| tool.name.as_str()).collect();
                let mut seen = BTreeSet::new();
                given
                    .into_iter()
                    .filter(|tool| mapped.contains(tool.name.as_str()) && seen.insert(tool.name.clone()))
                    .collect()
            }
            None => parsed.tools.clone(),
        };
        let facts =
            SourceFacts { source_id: &source_id, category: category.as_deref(), tags: &tags, loadable, timeout_ms };
        let descriptors: Vec<_> = tools.iter().map(|tool| descriptor_of(&facts, tool)).collect();
        let capability_ids = descriptors.iter().map(|descriptor| descriptor.id.clone()).collect();
        let records = tools.iter().map(|tool| record_of(&facts, tool)).collect();
        // The catalog first: the SCG's finalize flushes the store, so both are on disk when it answers.
        let earlier = self.offered(&source_id).await?;
        self.offer(&source_id, descriptors).await?;
        let report = match self.scg.graph.send(Finalize(parsed)).await.map_err(unavailable) {
            Ok(Ok(report)) => report,
            Ok(Err(err)) | Err(err) => {
                // Finalize fails only on the store: put the catalog back as it was.
                if let Err(undo) = self.offer(&source_id, earlier).await {
                    tracing::warn!(%undo, "a failed publication could not be undone in the catalog");
                }
                return Err(err.into());
            }
        };
        self.dispatcher
            .send(SetSourceRecords { source_id: source_id.clone(), records })
            .await
            .map_err(|err| PublishError::Catalog { source_id, problem: format!("the dispatcher stopped: {err}") })?;
        Ok(Published { report, capability_ids, tools })
    }

    /// Puts a source another node mapped (read from the shared copy) as it
    /// is: its tools into the catalog, its stored graph into the SCG, its
    /// records into the Dispatcher, as [`SourceCatalog::publish_source`] does
    /// with the descriptors' default settings. Answers false, changing
    /// nothing, when the SCG holds exactly this source already.
    pub async fn put_shared(&self, shared: SharedSource) -> Result<bool, PublishError> {
        let unavailable = |err: MailboxError| ScgError::Unavailable(err.to_string());
        let SharedSource { stored, tools } = shared;
        let source_id = stored.graph.source_id.clone();
        let held = self.scg.graph.send(SourceOf { source_id: source_id.clone() }).await.map_err(unavailable)??;
        let Apply::Put(stored) = source_change(held.as_ref(), Some(stored)) else { return Ok(false) };
        let facts = SourceFacts { source_id: &source_id, category: None, tags: &[], loadable: false, timeout_ms: None };
        let descriptors = tools.iter().map(|tool| descriptor_of(&facts, tool)).collect();
        let records = tools.iter().map(|tool| record_of(&facts, tool)).collect();
        let earlier = self.offered(&source_id).await?;
        self.offer(&source_id, descriptors).await?;
        match self.scg.graph.send(PutSource(stored)).await.map_err(unavailable) {
            Ok(Ok(_)) => {}
            Ok(Err(err)) | Err(err) => {
                if let Err(undo) = self.offer(&source_id, earlier).await {
                    tracing::warn!(%undo, "a failed shared publication could not be undone in the catalog");
                }
                return Err(err.into());
            }
        }
        self.dispatcher
            .send(SetSourceRecords { source_id: source_id.clone(), records })
            .await
            .map_err(|err| PublishError::Catalog { source_id, problem: format!("the dispatcher stopped: {err}") })?;
        Ok(true)
    }

    /// Removes a source from the SCG, the catalog and the dispatch registry;
    /// answers whether the SCG had it.
    pub async fn withdraw_source(&self, source_id: &str) -> Result<bool, PublishError> {
        let unavailable = |err: MailboxError| ScgError::Unavailable(err.to_string());
        // The catalog first: the SCG's removal flushes the store.
        self.offer(source_id, Vec::new()).await?;
        let removed =
            self.scg.graph.send(RemoveSource { source_id: source_id.to_string() }).await.map_err(unavailable)??;
        self.dispatcher.send(RemoveSourceRecords { source_id: source_id.to_string() }).await.map_err(|err| {
            PublishError::Catalog {
                source_id: source_id.to_string(),
                problem: format!("the dispatcher stopped: {err}"),
            }
        })?;
        Ok(removed)
    }

    /// After a restart: gives the Dispatcher back the records of the sources
    /// the catalog kept (mapped documents; live sources publish themselves
    /// again), and withdraws from the catalog the sources the SCG no longer
    /// has. Answers how many sources it restored.
    pub async fn restore(&self) -> Result<usize, PublishError> {
        let unavailable = |err: MailboxError| ScgError::Unavailable(err.to_string());
        let catalog = self.discoverer.send(CurrentCatalog).await.map_err(unavailable)?;
        let kinds = self.scg.graph.send(SourceKinds).await.map_err(unavailable)??;
        let mut by_source: BTreeMap<String, Vec<&CapabilityDescriptor>> = BTreeMap::new();
        for descriptor in catalog.descriptors.values() {
            let origin = catalog.origin(&descriptor.id);
            if let Some(source_id) = origin.strip_prefix("source:") {
                by_source.entry(source_id.to_string()).or_default().push(descriptor);
            }
        }
        let mut restored = 0;
        for (source_id, descriptors) in by_source {
            let Some(kind) = kinds.get(&source_id) else {
                self.offer(&source_id, Vec::new()).await?;
                continue;
            };
            let records = descriptors
                .iter()
                .filter_map(|descriptor| {
                    // SQL tables are never callable; the other kinds run through a live session.
                    let invocation = if *kind == SourceKind::Sql {
                        Invocation::NotCallable
                    } else {
                        Invocation::Mcp { tool: descriptor.name.clone() }
                    };
                    let tool = tool_of_descriptor(&source_id, descriptor, invocation)?;
                    let facts = SourceFacts {
                        source_id: &source_id,
                        category: Some(&descriptor.category),
                        tags: &descriptor.tags,
                        loadable: false,
                        timeout_ms: None,
                    };
                    let mut record = record_of(&facts, &tool);
                    if *kind == SourceKind::Openapi {
                        // The HTTP operation is not kept in the catalog; the session knows it.
                        record.invocation = None;
                    }
                    Some(record)
                })
                .collect();
            self.dispatcher.send(SetSourceRecords { source_id: source_id.clone(), records }).await.map_err(|err| {
                PublishError::Catalog { source_id, problem: format!("the dispatcher stopped: {err}") }
            })?;
            restored += 1;
        }
        Ok(restored)
    }

    /// The descriptors the catalog holds for `source_id` now.
    async fn offered(&self, source_id: &str) -> Result<Vec<CapabilityDescriptor>, PublishError> {
        let catalog =
            self.discoverer.send(CurrentCatalog).await.map_err(|err| ScgError::Unavailable(err.to_string()))?;
        let origin = source_origin(source_id);
        Ok(catalog.descriptors.values().filter(|d| catalog.origin(&d.id) == origin).cloned().collect())
    }

    async fn offer(&self, source_id: &str, descriptors: Vec<CapabilityDescriptor>) -> Result<(), PublishError> {
        let failed = |problem: String| PublishError::Catalog { source_id: source_id.to_string(), problem };
        let sync = SyncCapabilities::replace(&source_origin(source_id), descriptors);
        let report = self.indexer.send(sync).await.map_err(|err| failed(err.to_string()))?;
        let report = report.map_err(|err| failed(err.to_string()))?;
        if let Some(conflict) = report.conflicts.first() {
            tracing::warn!(source_id, id = %conflict.id, problem = %conflict.problem, "a source capability was not indexed");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::dispatcher::Dispatch;
    use crate::actors::scg::ScgGraphStats;
    use crate::actors::Inspect;
    use crate::config::{Environment, Settings};
    use crate::core::dispatch::pipeline::DispatchCall;
    use crate::store::Store;
    use serde_json::json;

    fn call(slug: &str) -> Dispatch {
        Dispatch {
            call: DispatchCall {
                slug: slug.into(),
                arguments: json!({"tz": "UTC"}),
                agent_id: "a".into(),
                execution_id: None,
                step_id: None,
                turn: None,
                approval_id: None,
            },
        }
    }

    #[actix::test]
    async fn known_tools_are_published_whole_and_withdrawn_whole() {
        let dir = tempfile::tempdir().unwrap();
        let env: Environment = [
            ("CAPDEX_DATA_DIR", dir.path().display().to_string()),
            ("CAPDEX_CAPABILITY_DIRS", dir.path().join("none").display().to_string()),
        ]
        .into_iter()
        .collect();
        let settings = Settings::load(None, &env).unwrap();
        let actors = crate::actors::spawn_all(&settings, Store::open(dir.path()).unwrap(), None).await.unwrap();
        let catalog = SourceCatalog::of(&actors);
        let tool = |name: &str| SourceTool {
            name: name.into(),
            title: Some("Current time".into()),
            description: "The current time in a time zone".into(),
            input_schema: json!({"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}),
            output_schema: None,
            invocation: Invocation::Mcp { tool: name.into() },
        };
        let publication = Publication {
            category: Some("clock".into()),
            tags: vec!["utc".into()],
            timeout_ms: Some(800),
            ..Publication::tools("time", vec![tool("get_time"), tool("bad#name"), tool("get_time")])
        };
        let published = catalog.publish_source(publication).await.unwrap();
        assert_eq!(published.capability_ids, ["time#get_time"], "one per name the mapper keeps");
        assert_eq!(published.report.source_id, "time");
        let current = actors.discoverer.send(CurrentCatalog).await.unwrap();
        let descriptor = current.get("time#get_time").unwrap();
        assert_eq!((descriptor.category.as_str(), current.origin("time#get_time")), ("clock", "source:time"));
        assert_eq!(descriptor.tags, ["utc", "time"]);
        assert_eq!(descriptor.full_schema.as_ref().unwrap().value()["required"], json!(["tz"]));
        let down = actors.dispatcher.send(call("time#get_time")).await.unwrap();
        assert_eq!(down.code(), Some("unavailable"), "{down:?}");

        // A text that does not map changes nothing.
        let broken = Publication::text("time", Some(SourceKind::Mcp), SourceText::Inline(r#"{"tools": 3}"#.into()));
        assert_eq!(catalog.publish_source(broken).await.unwrap_err().kind(), ErrorKind::Invalid("not_mcp"));
        assert!(actors.discoverer.send(CurrentCatalog).await.unwrap().get("time#get_time").is_some());
        assert_eq!(actors.dispatcher.send(call("time#get_time")).await.unwrap().code(), Some("unavailable"));

        assert!(catalog.withdraw_source("time").await.unwrap());
        assert!(actors.discoverer.send(CurrentCatalog).await.unwrap().get("time#get_time").is_none());
        assert_eq!(actors.dispatcher.send(call("time#get_time")).await.unwrap().code(), Some("unknown_capability"));
        assert_eq!(actors.scg.graph.send(Inspect::<ScgGraphStats>::new()).await.unwrap().sources, 0);
        assert!(!catalog.withdraw_source("time").await.unwrap(), "already gone");
    }
}
