//! The Source Capability Graph actors.
//!
//! - [`ScgMapper`] (a `SyncArbiter` actor, CPU and disk bound) runs the first three
//!   phases of the map pipeline: connect, introspect, parse.
//! - [`ScgGraph`] (on the System's arbiter, like the Indexer, and the only writer of the
//!   SCG trees) runs link and finalize, and answers route, observe and memory deposits
//!   from its cached [`RouteIndex`]. It holds the store, so it must live where the store
//!   is dropped (and flushed) when the System ends: a `SyncArbiter` thread is never
//!   joined at exit and would keep sled from flushing other actors' writes. Link and
//!   finalize therefore run on the System thread (tens of milliseconds for the shared
//!   specs in release; see `benches/scg.rs`), while parsing, the larger cost, does not.
//!
//! [`map`] chains the two. Every phase sends a [`ScgEvent`] when it starts and when it
//! ends on a broadcast channel ([`ScgActors::events`]); `capdex serve` publishes them on
//! `<prefix>.events.scg` and `capdex map` prints them.

use crate::config::Settings;
use crate::core::embedder::{Embed, HashingEmbedder};
use crate::core::scg::align::{Links, TypeAligner};
use crate::core::scg::memory::{self, Deposit, Deposited, MemoryError, Note};
use crate::core::scg::model::{EdgeKind, SourceGraph, SourceKind};
use crate::core::scg::pipeline::{
    check_connection, kind_counts, path_allowed, ConnectError, ConnectReport, LinkCounts, MapReport, Phase, PhaseError,
    PhaseStatus, ScgEvent,
};
use crate::core::scg::route::{MemoryView, Observation, ObserveError, RouteAnswer, RouteIndex, Scope};
use crate::core::scg::{map_source, valid_source_id, MapError, MAX_SOURCE_BYTES};
use crate::store::scg::{ScgStore, StoredLinks, StoredSource};
use crate::store::{Store, StoreError};
use actix::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::broadcast;

/// Events buffered per subscriber before the slowest one starts missing them.
const EVENT_BUFFER: usize = 256;

/// Why an SCG request failed; [`ScgError::code`] and [`ScgError::status`] go on the wire.
#[derive(Debug, thiserror::Error)]
pub enum ScgError {
    #[error("{0}")]
    Map(#[from] MapError),
    #[error("connection: {0}")]
    Connect(#[from] ConnectError),
    #[error("{0}")]
    Memory(#[from] MemoryError),
    #[error("{0}")]
    Observe(#[from] ObserveError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("reading sources by path is not allowed: {0}")]
    PathNotAllowed(String),
    #[error("cannot read {path}: {problem}")]
    Unreadable { path: String, problem: String },
    #[error("{0}")]
    BadRequest(String),
    #[error("the SCG actors stopped: {0}")]
    Unavailable(String),
}

impl ScgError {
    /// Returns a stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ScgError::Map(err) => err.code(),
            ScgError::Connect(_) => "bad_connection",
            ScgError::Memory(err) => err.code(),
            ScgError::Observe(_) => "not_found",
            ScgError::Store(_) => "store",
            ScgError::PathNotAllowed(_) => "path_not_allowed",
            ScgError::Unreadable { .. } => "unreadable",
            ScgError::BadRequest(_) => "bad_request",
            ScgError::Unavailable(_) => "unavailable",
        }
    }

    /// Returns the HTTP-like status for `Nats-Service-Error-Code`.
    pub fn status(&self) -> u16 {
        match self {
            ScgError::Map(MapError::TooLarge { .. }) => 413,
            ScgError::Map(_) | ScgError::Connect(_) | ScgError::BadRequest(_) | ScgError::Unreadable { .. } => 400,
            ScgError::Memory(MemoryError::UnknownAnchor(_)) | ScgError::Observe(_) => 404,
            ScgError::Memory(_) => 400,
            ScgError::PathNotAllowed(_) => 403,
            ScgError::Store(_) => 500,
            ScgError::Unavailable(_) => 503,
        }
    }
}

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
    pub workspaces: Vec<String>,
    pub connection: ConnectReport,
    pub phase_ms: BTreeMap<String, f64>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// Sends phase events for one source.
#[derive(Clone)]
struct Progress {
    events: broadcast::Sender<ScgEvent>,
    source_id: String,
}

impl Progress {
    fn send(
        &self,
        phase: Phase,
        status: PhaseStatus,
        elapsed_ms: Option<f64>,
        counts: BTreeMap<String, u64>,
        error: Option<&ScgError>,
    ) {
        // No subscriber is fine: nobody is listening.
        let _ = self.events.send(ScgEvent {
            source_id: self.source_id.clone(),
            phase,
            status,
            at_ms: now_ms(),
            elapsed_ms,
            counts,
            error: error.map(|err| PhaseError { code: err.code().to_string(), message: err.to_string() }),
        });
    }

    /// Runs one phase between its started and done (or failed) events; records its time.
    fn phase<T>(
        &self,
        phase: Phase,
        phase_ms: &mut BTreeMap<String, f64>,
        run: impl FnOnce() -> Result<(T, BTreeMap<String, u64>), ScgError>,
    ) -> Result<T, ScgError> {
        self.send(phase, PhaseStatus::Started, None, BTreeMap::new(), None);
        let started = Instant::now();
        let result = run();
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        phase_ms.insert(phase.as_str().to_string(), elapsed);
        match result {
            Ok((value, counts)) => {
                self.send(phase, PhaseStatus::Done, Some(elapsed), counts, None);
                Ok(value)
            }
            Err(err) => {
                self.send(phase, PhaseStatus::Failed, Some(elapsed), BTreeMap::new(), Some(&err));
                Err(err)
            }
        }
    }
}

/// Runs connect, introspect and parse.
pub struct ScgMapper {
    path_roots: Vec<PathBuf>,
    events: broadcast::Sender<ScgEvent>,
}

impl Actor for ScgMapper {
    type Context = SyncContext<Self>;
}

/// Runs connect → introspect → parse for one source.
#[derive(Message)]
#[rtype(result = "Result<Parsed, ScgError>")]
pub struct Introspect(pub MapRequest);

impl Handler<Introspect> for ScgMapper {
    type Result = Result<Parsed, ScgError>;

    fn handle(&mut self, Introspect(request): Introspect, _: &mut SyncContext<Self>) -> Self::Result {
        let progress = Progress { events: self.events.clone(), source_id: request.source_id.clone() };
        let mut phase_ms = BTreeMap::new();
        let MapRequest { source_id, kind, text, workspaces, connection } = request;
        let connect = progress.phase(Phase::Connect, &mut phase_ms, || {
            if !valid_source_id(&source_id) {
                return Err(MapError::InvalidSourceId(source_id.clone()).into());
            }
            for workspace in &workspaces {
                if !valid_source_id(workspace) {
                    return Err(ScgError::BadRequest(format!(
                        "workspace {workspace:?} is invalid: use 1-128 characters of [A-Za-z0-9._-]"
                    )));
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
        let graph = progress.phase(Phase::Parse, &mut phase_ms, || {
            let graph = map_source(&source_id, kind, &text)?;
            let counts =
                [("nodes".to_string(), graph.nodes.len() as u64), ("edges".to_string(), graph.edges.len() as u64)];
            Ok((graph, counts.into()))
        })?;
        Ok(Parsed { graph, workspaces, connection: connect, phase_ms })
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

/// A loaded graph: every stored source, current links, the route index and memory notes.
struct Loaded {
    sources: Vec<StoredSource>,
    index: Arc<RouteIndex>,
    notes: Vec<Note>,
    /// Each note's vector, in the order of `notes`.
    note_vectors: Vec<Vec<f32>>,
}

/// Holds the SCG: link, finalize, route, observe, deposit.
pub struct ScgGraph {
    store: ScgStore,
    embedder: HashingEmbedder,
    half_life_ms: u64,
    events: broadcast::Sender<ScgEvent>,
    loaded: Option<Loaded>,
}

impl Actor for ScgGraph {
    type Context = Context<Self>;
}

impl ScgGraph {
    fn loaded(&mut self) -> Result<&mut Loaded, ScgError> {
        if self.loaded.is_none() {
            let sources = self.store.sources()?;
            let links = match self.store.links()? {
                Some(stored) if stored.is_current(&sources) => stored.links,
                _ => {
                    let links = link(&sources);
                    self.store.put_links(&stored_links(&sources, &links))?;
                    links
                }
            };
            let index = Arc::new(self.build_index(&sources, &links));
            let notes = self.store.notes()?;
            let note_vectors = notes.iter().map(|note| RouteIndex::note_vector(note, &self.embedder)).collect();
            self.loaded = Some(Loaded { sources, index, notes, note_vectors });
        }
        Ok(self.loaded.as_mut().expect("loaded above"))
    }

    fn build_index(&self, sources: &[StoredSource], links: &Links) -> RouteIndex {
        let graphs: Vec<SourceGraph> = sources.iter().map(|source| source.graph.clone()).collect();
        RouteIndex::build(&graphs, links, Some(&self.embedder as &dyn Embed))
    }

    fn scope(sources: &[StoredSource], workspace: Option<&str>) -> Scope {
        match workspace {
            None => Scope::All,
            Some(workspace) => Scope::Sources(
                sources
                    .iter()
                    .filter(|source| source.workspaces.iter().any(|enabled| enabled == workspace))
                    .map(|source| source.graph.source_id.clone())
                    .collect(),
            ),
        }
    }
}

fn link(sources: &[StoredSource]) -> Links {
    let graphs: Vec<&SourceGraph> = sources.iter().map(|source| &source.graph).collect();
    TypeAligner.link(&graphs)
}

fn stored_links(sources: &[StoredSource], links: &Links) -> StoredLinks {
    let computed_from =
        sources.iter().map(|source| (source.graph.source_id.clone(), source.graph.drift_hash.clone())).collect();
    StoredLinks { links: links.clone(), computed_from }
}

/// Runs link → finalize for a parsed source, replacing any earlier map of it.
#[derive(Message)]
#[rtype(result = "Result<MapReport, ScgError>")]
pub struct Finalize(pub Parsed);

impl Handler<Finalize> for ScgGraph {
    type Result = Result<MapReport, ScgError>;

    fn handle(&mut self, Finalize(parsed): Finalize, _: &mut Context<Self>) -> Self::Result {
        let Parsed { graph, workspaces, connection, mut phase_ms } = parsed;
        let progress = Progress { events: self.events.clone(), source_id: graph.source_id.clone() };
        let source_id = graph.source_id.clone();
        let (node_counts, edge_counts) = kind_counts(&graph);
        let (nodes, edges, kind, drift_hash) =
            (graph.nodes.len(), graph.edges.len(), graph.kind, graph.drift_hash.clone());
        // Link over what is stored, with this source in place of its earlier map.
        let stored = self.loaded()?.sources.clone();
        let previous = stored.iter().find(|source| source.graph.source_id == source_id);
        let changed = previous.is_none_or(|previous| previous.graph.drift_hash != drift_hash);
        let mut enabled: Vec<String> = previous.map(|previous| previous.workspaces.clone()).unwrap_or_default();
        enabled.extend(workspaces);
        enabled.sort();
        enabled.dedup();
        let record = StoredSource { graph, workspaces: enabled.clone(), mapped_at_ms: now_ms() };
        let mut sources: Vec<StoredSource> =
            stored.into_iter().filter(|source| source.graph.source_id != source_id).collect();
        let at = sources.partition_point(|source| source.graph.source_id < source_id);
        sources.insert(at, record);
        let links = progress.phase(Phase::Link, &mut phase_ms, || {
            let links = link(&sources);
            let counts = LinkCounts::of(&links);
            let counts = [
                ("entityResolvesTo", counts.entity_resolves_to),
                ("fieldResolvesTo", counts.field_resolves_to),
                ("consumes", counts.consumes),
                ("pairsCompared", counts.pairs_compared),
            ];
            Ok((links, counts.into_iter().map(|(k, v)| (k.to_string(), v as u64)).collect()))
        })?;
        let index = progress.phase(Phase::Finalize, &mut phase_ms, || {
            // The source is one value, so its old nodes go in the same insert; links name
            // the drift hashes they came from, so a reader never pairs them with another map.
            self.store.put_source(&sources[at])?;
            self.store.put_links(&stored_links(&sources, &links))?;
            self.store.flush()?;
            let index = self.build_index(&sources, &links);
            let (n_nodes, n_edges, n_recipes) = index.counts();
            let counts = [("nodes", n_nodes), ("edges", n_edges), ("recipes", n_recipes), ("sources", sources.len())];
            Ok((index, counts.into_iter().map(|(k, v)| (k.to_string(), v as u64)).collect()))
        })?;
        let report = MapReport {
            source_id,
            kind,
            drift_hash,
            changed,
            workspaces: enabled,
            nodes,
            edges,
            node_counts,
            edge_counts,
            sources: sources.len(),
            links: LinkCounts::of(&links),
            connection,
            phase_ms,
        };
        let (notes, note_vectors) =
            self.loaded.take().map(|loaded| (loaded.notes, loaded.note_vectors)).unwrap_or_default();
        self.loaded = Some(Loaded { sources, index: Arc::new(index), notes, note_vectors });
        Ok(report)
    }
}

/// Ranks recipes for a query.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<RouteAnswer, ScgError>")]
pub struct Route {
    pub query: String,
    pub k: usize,
    /// Only sources this workspace enabled; `None` sees every source.
    pub workspace: Option<String>,
}

impl Handler<Route> for ScgGraph {
    type Result = Result<RouteAnswer, ScgError>;

    fn handle(&mut self, request: Route, _: &mut Context<Self>) -> Self::Result {
        let (half_life_ms, embedder) = (self.half_life_ms, self.embedder);
        let loaded = self.loaded()?;
        let scope = ScgGraph::scope(&loaded.sources, request.workspace.as_deref());
        let sources_in_scope = loaded.sources.iter().filter(|s| scope.permits(&s.graph.source_id)).count();
        let view =
            MemoryView { notes: &loaded.notes, now_ms: now_ms(), half_life_ms, vectors: Some(&loaded.note_vectors) };
        let recipes = loaded.index.route_with_memory(
            &request.query,
            request.k,
            &scope,
            Some(&embedder as &dyn Embed),
            Some(view),
        );
        Ok(RouteAnswer { recipes, sources_in_scope })
    }
}

/// Reads a node's neighbourhood.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<Observation, ScgError>")]
pub struct ObserveNode {
    pub node: String,
    pub edge_kinds: Vec<EdgeKind>,
    pub workspace: Option<String>,
}

impl Handler<ObserveNode> for ScgGraph {
    type Result = Result<Observation, ScgError>;

    fn handle(&mut self, request: ObserveNode, _: &mut Context<Self>) -> Self::Result {
        let half_life_ms = self.half_life_ms;
        let loaded = self.loaded()?;
        let scope = ScgGraph::scope(&loaded.sources, request.workspace.as_deref());
        let mut observation = loaded.index.observe(&request.node, &request.edge_kinds, &scope)?;
        observation.notes = memory::notes_at(&loaded.notes, &observation.node.source_key, now_ms(), half_life_ms)
            .into_iter()
            .map(|note| {
                // Anchors in sources the request cannot see are not shown.
                let mut note = note.clone();
                note.anchors.retain(|anchor| scope.permits(anchor.split('#').next().unwrap_or(anchor)));
                note
            })
            .collect();
        Ok(observation)
    }
}

/// Deposits a memory note; the reply comes once it is on disk.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<Deposited, ScgError>")]
pub struct DepositNote {
    pub deposit: Deposit,
    /// A workspace-bound deposit may anchor only nodes of that workspace's sources.
    pub workspace: Option<String>,
}

impl Handler<DepositNote> for ScgGraph {
    type Result = Result<Deposited, ScgError>;

    fn handle(&mut self, request: DepositNote, _: &mut Context<Self>) -> Self::Result {
        memory::validate(&request.deposit)?;
        let (store, embedder) = (self.store.clone(), self.embedder);
        let loaded = self.loaded()?;
        let scope = ScgGraph::scope(&loaded.sources, request.workspace.as_deref());
        let mut anchors = Vec::new();
        for anchor in &request.deposit.anchors {
            let node = loaded
                .index
                .find(anchor)
                .filter(|node| scope.permits(&node.source_id))
                .ok_or_else(|| MemoryError::UnknownAnchor(anchor.clone()))?;
            anchors.push(node.source_key.clone());
        }
        let id = memory::note_id(&request.deposit.content, request.deposit.polarity);
        let existing = store.note(&id)?;
        let merged = existing.is_some();
        let note = memory::merge(existing, &request.deposit, &anchors, now_ms());
        store.put_note(&note)?;
        store.flush()?;
        let vector = RouteIndex::note_vector(&note, &embedder);
        match loaded.notes.binary_search_by(|held| held.id.cmp(&note.id)) {
            Ok(at) => {
                loaded.notes[at] = note.clone();
                loaded.note_vectors[at] = vector;
            }
            Err(at) => {
                loaded.notes.insert(at, note.clone());
                loaded.note_vectors.insert(at, vector);
            }
        }
        Ok(Deposited { note, merged })
    }
}

/// The SCG actors and their event channel.
#[derive(Clone)]
pub struct ScgActors {
    pub mapper: Addr<ScgMapper>,
    pub graph: Addr<ScgGraph>,
    pub events: broadcast::Sender<ScgEvent>,
}

/// Starts the SCG actors on the current actix System.
pub fn spawn(settings: &Settings, store: &Store) -> Result<ScgActors, StoreError> {
    let scg = ScgStore::open(store)?;
    let (events, _) = broadcast::channel(EVENT_BUFFER);
    let roots = settings.scg.map_path_roots.clone();
    let mapper_events = events.clone();
    let mapper = SyncArbiter::start(1, move || ScgMapper { path_roots: roots.clone(), events: mapper_events.clone() });
    let dimensions = settings.embedder_dimensions;
    let half_life_ms = settings.scg.memory_half_life_ms;
    let graph_events = events.clone();
    let graph = ScgGraph {
        store: scg,
        embedder: HashingEmbedder::new(dimensions).expect("dimensions are validated in config"),
        half_life_ms,
        events: graph_events,
        loaded: None,
    }
    .start();
    Ok(ScgActors { mapper, graph, events })
}

/// Maps one source: connect → introspect → parse on the mapper, then link → finalize on the graph.
pub async fn map(actors: &ScgActors, request: MapRequest) -> Result<MapReport, ScgError> {
    let unavailable = |err: MailboxError| ScgError::Unavailable(err.to_string());
    let parsed = actors.mapper.send(Introspect(request)).await.map_err(unavailable)??;
    actors.graph.send(Finalize(parsed)).await.map_err(unavailable)?
}
