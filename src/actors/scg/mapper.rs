//! ScgMapper: the SCG actor that runs the first three phases of mapping a
//! source (connect, introspect, parse) and hands the [`Parsed`] graph on to the
//! ScgGraph actor (`graph.rs`). A `SyncArbiter` actor: reading and parsing a
//! source is CPU and disk work, kept off the System's thread.

use crate::actors::scg::progress::{Progress, ScgError};
use crate::actors::Inspect;
use crate::core::scg::model::{SourceGraph, SourceKind};
use crate::core::scg::pipeline::{check_connection, path_allowed, ConnectReport, Phase, ScgEvent};
use crate::core::scg::{check_source_id, map_source_limited, source_id_problem, MapError, MAX_SOURCE_BYTES};
use crate::core::sources::tools::tools_of_limited;
use crate::core::sources::SourceTool;
use actix::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tokio::sync::broadcast;

/// Where a source's text comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum SourceText {
    /// The document itself, sent with the request.
    Inline(String),
    /// A file on the server, read only below `scg.map_path_roots`.
    Path(PathBuf),
}

/// A request to map one source.
#[derive(Clone, Debug)]
pub struct MapRequest {
    pub source_id: String,
    pub kind: Option<SourceKind>,
    pub text: SourceText,
    /// Workspaces that enable the source (added to those that already did).
    pub workspaces: Vec<String>,
    /// The connector descriptor; checked, counted and dropped in connect.
    pub connection: Option<serde_json::Value>,
}

/// What the mapper hands to the graph.
#[derive(Debug)]
pub struct Parsed {
    pub graph: SourceGraph,
    /// The tools the same text offers, one per capability node (`core::sources::tools`).
    pub tools: Vec<SourceTool>,
    pub workspaces: Vec<String>,
    pub connection: ConnectReport,
    pub phase_ms: BTreeMap<String, f64>,
}

/// Runs connect, introspect and parse.
pub struct ScgMapper {
    path_roots: Vec<PathBuf>,
    events: broadcast::Sender<ScgEvent>,
    stats: ScgMapperStats,
    /// `[limits]`: nesting, YAML aliases, tools per source, operations per spec.
    limits: crate::core::limits::Limits,
}

impl ScgMapper {
    /// A mapper that reads sources by path only below `path_roots` and sends its phase events to `events`.
    pub fn new(path_roots: Vec<PathBuf>, events: broadcast::Sender<ScgEvent>) -> ScgMapper {
        ScgMapper {
            path_roots,
            events,
            stats: ScgMapperStats::default(),
            limits: crate::core::limits::Limits::default(),
        }
    }

    /// The same mapper, parsing sources within `limits`.
    pub fn with_limits(self, limits: crate::core::limits::Limits) -> ScgMapper {
        ScgMapper { limits, ..self }
    }
}

impl Actor for ScgMapper {
    type Context = SyncContext<Self>;
}

/// Runs connect → introspect → parse for one source.
#[derive(Message)]
#[rtype(result = "Result<Parsed, ScgError>")]
pub struct Introspect(pub MapRequest);

/// What the mapper has done so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScgMapperStats {
    /// Sources parsed and handed on.
    pub parsed: u64,
    /// Requests that failed in connect, introspect or parse.
    pub failed: u64,
}

impl Handler<Introspect> for ScgMapper {
    type Result = Result<Parsed, ScgError>;

    fn handle(&mut self, Introspect(request): Introspect, _: &mut SyncContext<Self>) -> Self::Result {
        let parsed = self.introspect(request);
        match &parsed {
            Ok(_) => self.stats.parsed += 1,
            Err(_) => self.stats.failed += 1,
        }
        parsed
    }
}

impl Handler<Inspect<ScgMapperStats>> for ScgMapper {
    type Result = MessageResult<Inspect<ScgMapperStats>>;

    fn handle(&mut self, _: Inspect<ScgMapperStats>, _: &mut SyncContext<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}

impl ScgMapper {
    /// Runs connect → introspect → parse, each between its phase events.
    fn introspect(&self, request: MapRequest) -> Result<Parsed, ScgError> {
        let progress = Progress { events: self.events.clone(), source_id: request.source_id.clone() };
        let mut phase_ms = BTreeMap::new();
        let MapRequest { source_id, kind, text, workspaces, connection } = request;
        let connect = progress.phase(Phase::Connect, &mut phase_ms, || {
            check_source_id(&source_id, self.limits.max_id_bytes)?;
            for workspace in &workspaces {
                if let Some(problem) = source_id_problem(workspace, self.limits.max_id_bytes) {
                    return Err(ScgError::BadRequest(format!("workspaces[] {problem}")));
                }
            }
            // The descriptor is checked and counted, then dropped here: it never reaches a mapper.
            let report = check_connection(connection.as_ref())?;
            drop(connection);
            let counts = [("keys", report.keys as u64), ("credentialFields", report.credential_fields as u64)];
            Ok((report, counts.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
        })?;
        let text = progress.phase(Phase::Introspect, &mut phase_ms, || {
            let text = match text {
                SourceText::Inline(text) => text,
                SourceText::Path(path) => self.read(&path)?,
            };
            if text.len() > MAX_SOURCE_BYTES {
                return Err(MapError::TooLarge { size: text.len(), max: MAX_SOURCE_BYTES }.into());
            }
            let bytes = text.len() as u64;
            Ok((text, [("bytes".to_string(), bytes)].into()))
        })?;
        let (graph, tools) = progress.phase(Phase::Parse, &mut phase_ms, || {
            let graph = map_source_limited(&source_id, kind, &text, &self.limits)?;
            let tools = tools_of_limited(graph.kind, &text, &self.limits)?;
            let counts = [
                ("nodes".to_string(), graph.nodes.len() as u64),
                ("edges".to_string(), graph.edges.len() as u64),
                ("tools".to_string(), tools.len() as u64),
            ];
            Ok(((graph, tools), counts.into()))
        })?;
        Ok(Parsed { graph, tools, workspaces, connection: connect, phase_ms })
    }
}

impl ScgMapper {
    fn read(&self, path: &std::path::Path) -> Result<String, ScgError> {
        if self.path_roots.is_empty() {
            return Err(ScgError::PathNotAllowed("scg.map_path_roots is empty; send the document instead".into()));
        }
        let unreadable = |problem: String| ScgError::Unreadable { path: path.display().to_string(), problem };
        let canonical = path.canonicalize().map_err(|err| unreadable(err.to_string()))?;
        let roots: Vec<PathBuf> = self.path_roots.iter().filter_map(|root| root.canonicalize().ok()).collect();
        if !path_allowed(&canonical, &roots) {
            return Err(ScgError::PathNotAllowed(format!("{} is outside scg.map_path_roots", path.display())));
        }
        let metadata = std::fs::metadata(&canonical).map_err(|err| unreadable(err.to_string()))?;
        if !metadata.is_file() {
            return Err(unreadable("not a regular file".into()));
        }
        if metadata.len() > MAX_SOURCE_BYTES as u64 {
            return Err(MapError::TooLarge { size: metadata.len() as usize, max: MAX_SOURCE_BYTES }.into());
        }
        std::fs::read_to_string(&canonical).map_err(|err| unreadable(format!("{err} (is it UTF-8 text?)")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scg::pipeline::PhaseStatus;

    const PETS: &str = "swagger: '2.0'\ninfo: {title: Pets}\ndefinitions:\n  Pet:\n    properties:\n      name: {type: string}\n      tag: {type: string}\npaths:\n  /pets/{petId}:\n    parameters:\n      - {name: petId, in: path, required: true, type: string}\n    get:\n      operationId: showPetById\n      responses:\n        '200':\n          schema: {$ref: '#/definitions/Pet'}\n";

    fn request(source_id: &str, text: SourceText) -> MapRequest {
        MapRequest { source_id: source_id.into(), kind: None, text, workspaces: vec!["ws1".into()], connection: None }
    }

    #[actix::test]
    async fn it_parses_between_phase_events_and_refuses_paths_without_roots() {
        let (events, mut received) = broadcast::channel(64);
        let mapper = SyncArbiter::start(1, move || ScgMapper::new(Vec::new(), events.clone()));
        let parsed = mapper.send(Introspect(request("pets", SourceText::Inline(PETS.into())))).await.unwrap().unwrap();
        assert_eq!(parsed.graph.source_id, "pets");
        assert_eq!(parsed.tools.iter().map(|tool| tool.name.as_str()).collect::<Vec<_>>(), ["showPetById"]);
        assert!(!parsed.graph.nodes.is_empty());
        assert_eq!(parsed.workspaces, ["ws1"]);
        assert_eq!(parsed.phase_ms.keys().map(String::as_str).collect::<Vec<_>>(), ["connect", "introspect", "parse"]);
        let mut seen = Vec::new();
        while let Ok(event) = received.try_recv() {
            seen.push((event.phase, event.status));
        }
        let expected: Vec<_> = [Phase::Connect, Phase::Introspect, Phase::Parse]
            .into_iter()
            .flat_map(|phase| [(phase, PhaseStatus::Started), (phase, PhaseStatus::Done)])
            .collect();
        assert_eq!(seen, expected);
        let by_path = request("pets", SourceText::Path("/etc/hostname".into()));
        let refused = mapper.send(Introspect(by_path)).await.unwrap().unwrap_err();
        assert_eq!((refused.code(), refused.status()), ("path_not_allowed", 403));
        let bad_id = mapper.send(Introspect(request("a#b", SourceText::Inline(PETS.into())))).await.unwrap();
        assert_eq!(bad_id.unwrap_err().code(), "invalid_source_id");
        let stats = mapper.send(Inspect::<ScgMapperStats>::new()).await.unwrap();
        assert_eq!(stats, ScgMapperStats { parsed: 1, failed: 2 });
    }
}
