//! ScgGraph: the SCG actor that holds the Source Capability Graph. It runs the
//! last two phases of mapping a source (link, finalize) on what the ScgMapper
//! (`mapper.rs`) parsed, is the only writer of the SCG trees, and answers
//! [`Route`], [`ObserveNode`] and [`DepositNote`] from its cached [`RouteIndex`].
//! [`SourceOf`], [`PutSource`] and [`PutNote`] read and apply the shared copy of
//! sources and notes other nodes mapped and deposited (`shared_state`).
//!
//! It runs on the System's arbiter, like the Indexer, because it holds the
//! store: a `SyncArbiter` thread is never joined at exit and would keep sled
//! from flushing other actors' writes. Link and finalize therefore run on the
//! System thread (tens of milliseconds for the shared specs in release; see
//! `benches/scg.rs`), while parsing, the larger cost, does not.

use crate::actors::embedder::{EmbedTexts, EmbeddedTexts};
use crate::actors::scg::mapper::Parsed;
use crate::actors::scg::progress::{now_ms, Progress, ScgError};
use crate::actors::Inspect;
#[cfg(test)]
use crate::core::embedder::HashingEmbedder;
use crate::core::embedder::{Embed, PrecomputedEmbedder, TextRole};
use crate::core::scg::align::{Links, TypeAligner};
use crate::core::scg::memory::{self, Deposit, Deposited, MemoryError, Note};
use crate::core::scg::model::{replace_source, Replaced};
use crate::core::scg::model::{EdgeKind, SourceGraph};
use crate::core::scg::pipeline::{kind_counts, LinkCounts, MapReport, Phase, ScgEvent};
use crate::core::scg::route::{MemoryView, Observation, RouteAnswer, RouteIndex, Scope};
use crate::core::scg::shared::{self, Apply};
use crate::store::scg::{ScgStore, StoredLinks, StoredSource};
use crate::store::StoreError;
use actix::prelude::*;
use std::sync::Arc;
use tokio::sync::broadcast;

/// A loaded graph: every stored source, current links, the route index and memory notes.
struct Loaded {
    sources: Vec<StoredSource>,
    index: Arc<RouteIndex>,
    notes: Vec<Note>,
    /// Each note's vector, in the order of `notes` (the in-process embedder's).
    note_vectors: Vec<Vec<f32>>,
    /// The links `index` was built with, to build it again with the configured embedder.
    links: Links,
    /// Whether `index` was built with the configured (remote) embedder's vectors.
    semantic: bool,
}

/// The embedder the SCG routes with, shared with the closures that embed notes.
pub type SharedEmbedder = std::sync::Arc<dyn Embed + Send + Sync>;

/// Holds the SCG: link, finalize, route, observe, deposit.
pub struct ScgGraph {
    store: ScgStore,
    embedder: SharedEmbedder,
    half_life_ms: u64,
    events: broadcast::Sender<ScgEvent>,
    loaded: Option<Loaded>,
    /// The configured embedder when it is slow (`local`, `http`): the discovery Embedder
    /// actor, on its own thread. Routes then embed there, never on this actor's thread.
    remote: Option<Recipient<EmbedTexts>>,
    /// Bumped whenever a new index is installed, so a late remote build is dropped.
    generation: u64,
    /// Whether a remote build of the current generation's index is under way.
    upgrading: bool,
    /// `[limits]`: the longest id of a deposit's label, its most anchors.
    limits: crate::core::limits::Limits,
}

impl Actor for ScgGraph {
    type Context = Context<Self>;
}

/// What the graph holds, as far as loaded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScgGraphStats {
    /// Whether the stored graph has been loaded (it is, on the first request).
    pub loaded: bool,
    pub sources: usize,
    pub nodes: usize,
    pub recipes: usize,
    pub notes: usize,
}

impl Handler<Inspect<ScgGraphStats>> for ScgGraph {
    type Result = MessageResult<Inspect<ScgGraphStats>>;

    fn handle(&mut self, _: Inspect<ScgGraphStats>, _: &mut Context<Self>) -> Self::Result {
        let stats = self.loaded.as_ref().map_or_else(ScgGraphStats::default, |loaded| {
            let (nodes, _, recipes) = loaded.index.counts();
            ScgGraphStats { loaded: true, sources: loaded.sources.len(), nodes, recipes, notes: loaded.notes.len() }
        });
        MessageResult(stats)
    }
}

impl ScgGraph {
    /// A graph actor over `store`; `embedder` vectors route queries and notes,
    /// notes fade with `half_life_ms`, and phase events go to `events`. The
    /// stored sources are loaded on the first message.
    pub fn new(
        store: ScgStore,
        embedder: SharedEmbedder,
        half_life_ms: u64,
        events: broadcast::Sender<ScgEvent>,
    ) -> ScgGraph {
        ScgGraph {
            store,
            embedder,
            half_life_ms,
            events,
            loaded: None,
            remote: None,
            generation: 0,
            upgrading: false,
            limits: crate::core::limits::Limits::default(),
        }
    }

    /// Checks deposits against `limits` (`max_id_bytes`, `max_anchors`).
    pub fn with_limits(mut self, limits: crate::core::limits::Limits) -> ScgGraph {
        self.limits = limits;
        self
    }

    /// Routes with the configured embedder behind `remote` (the Embedder actor): the first
    /// route after a change embeds the graph's texts there and builds the index from them;
    /// until then, and whenever the embedder fails, routes use the in-process embedder's index.
    pub fn with_remote_embedder(mut self, remote: Recipient<EmbedTexts>) -> ScgGraph {
        self.remote = Some(remote);
        self
    }

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
            let note_vectors = notes.iter().map(|note| RouteIndex::note_vector(note, &*self.embedder)).collect();
            self.generation += 1;
            self.loaded = Some(Loaded { sources, index, notes, note_vectors, links, semantic: false });
        }
        Ok(self.loaded.as_mut().expect("loaded above"))
    }

    fn build_index(&self, sources: &[StoredSource], links: &Links) -> RouteIndex {
        let graphs: Vec<SourceGraph> = sources.iter().map(|source| source.graph.clone()).collect();
        RouteIndex::build(&graphs, links, Some(&*self.embedder as &dyn Embed))
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
        let Parsed { graph, workspaces, connection, mut phase_ms, .. } = parsed;
        let progress = Progress { events: self.events.clone(), source_id: graph.source_id.clone() };
        let source_id = graph.source_id.clone();
        let (node_counts, edge_counts) = kind_counts(&graph);
        let (nodes, edges, kind, drift_hash) =
            (graph.nodes.len(), graph.edges.len(), graph.kind, graph.drift_hash.clone());
        // Link over what is stored, with this source in place of its earlier map.
        let stored = self.loaded()?.sources.clone();
        let Replaced { sources, at, changed } = replace_source(stored, graph, workspaces, now_ms());
        let enabled = sources[at].workspaces.clone();
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
        self.install(sources, links, index);
        Ok(report)
    }
}

impl ScgGraph {
    /// Links `sources` anew after `change` to the store, stores the links,
    /// and installs them with a new index (the memory notes stay).
    fn relink(
        &mut self,
        sources: Vec<StoredSource>,
        change: impl FnOnce(&ScgStore) -> Result<(), StoreError>,
    ) -> Result<(), ScgError> {
        let links = link(&sources);
        change(&self.store)?;
        self.store.put_links(&stored_links(&sources, &links))?;
        self.store.flush()?;
        let index = self.build_index(&sources, &links);
        self.install(sources, links, index);
        Ok(())
    }

    /// Makes `sources` and their `index` what the graph answers from; the memory notes stay.
    fn install(&mut self, sources: Vec<StoredSource>, links: Links, index: RouteIndex) {
        let (notes, note_vectors) =
            self.loaded.take().map(|loaded| (loaded.notes, loaded.note_vectors)).unwrap_or_default();
        self.generation += 1;
        self.upgrading = false;
        self.loaded = Some(Loaded { sources, index: Arc::new(index), notes, note_vectors, links, semantic: false });
    }

    /// Answers a route from the loaded index. A semantic index routes with `remote`'s query
    /// vector (`None`: by words and concepts only); any other with the in-process embedder.
    fn route_now(&mut self, request: &Route, remote: Option<&dyn Embed>) -> Result<RouteAnswer, ScgError> {
        let (half_life_ms, embedder) = (self.half_life_ms, self.embedder.clone());
        let loaded = self.loaded()?;
        let scope = ScgGraph::scope(&loaded.sources, request.workspace.as_deref());
        let sources_in_scope = loaded.sources.iter().filter(|s| scope.permits(&s.graph.source_id)).count();
        // The notes' vectors are the in-process embedder's: a semantic index matches notes by words.
        let vectors = (!loaded.semantic).then_some(loaded.note_vectors.as_slice());
        let view = MemoryView { notes: &loaded.notes, now_ms: now_ms(), half_life_ms, vectors };
        let embedder = if loaded.semantic { remote } else { Some(&*embedder as &dyn Embed) };
        let answer = loaded.index.route_answer(&request.query, request.k, &scope, embedder, Some(view));
        Ok(RouteAnswer { sources_in_scope, ..answer })
    }
}

/// Removes a source and its links from the graph; answers whether it was there.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<bool, ScgError>")]
pub struct RemoveSource {
    pub source_id: String,
}

impl Handler<RemoveSource> for ScgGraph {
    type Result = Result<bool, ScgError>;

    fn handle(&mut self, request: RemoveSource, _: &mut Context<Self>) -> Self::Result {
        let stored = self.loaded()?.sources.clone();
        if !stored.iter().any(|source| source.graph.source_id == request.source_id) {
            return Ok(false);
        }
        let sources: Vec<StoredSource> =
            stored.into_iter().filter(|source| source.graph.source_id != request.source_id).collect();
        self.relink(sources, |store| store.remove_source(&request.source_id).map(drop))?;
        Ok(true)
    }
}

/// One stored source as this node holds it (`None`: not mapped here).
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<Option<StoredSource>, ScgError>")]
pub struct SourceOf {
    pub source_id: String,
}

impl Handler<SourceOf> for ScgGraph {
    type Result = Result<Option<StoredSource>, ScgError>;

    fn handle(&mut self, request: SourceOf, _: &mut Context<Self>) -> Self::Result {
        let loaded = self.loaded()?;
        Ok(loaded.sources.iter().find(|source| source.graph.source_id == request.source_id).cloned())
    }
}

/// Puts a stored source as it is (another node's map, read from the shared
/// copy), relinking and re-indexing; answers whether anything changed.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<bool, ScgError>")]
pub struct PutSource(pub StoredSource);

impl Handler<PutSource> for ScgGraph {
    type Result = Result<bool, ScgError>;

    fn handle(&mut self, PutSource(source): PutSource, _: &mut Context<Self>) -> Self::Result {
        let stored = self.loaded()?.sources.clone();
        let held = stored.iter().find(|held| held.graph.source_id == source.graph.source_id);
        let Apply::Put(source) = shared::source_change(held, Some(source)) else { return Ok(false) };
        let sources = shared::put_source(stored, source.clone());
        self.relink(sources, |store| store.put_source(&source))?;
        Ok(true)
    }
}

/// Puts a memory note as it is (the shared copy's, already merged), or removes
/// it (`note: None`); answers whether anything changed.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<bool, ScgError>")]
pub struct PutNote {
    pub id: String,
    pub note: Option<Note>,
}

impl Handler<PutNote> for ScgGraph {
    type Result = Result<bool, ScgError>;

    fn handle(&mut self, PutNote { id, note }: PutNote, _: &mut Context<Self>) -> Self::Result {
        let (store, embedder) = (self.store.clone(), self.embedder.clone());
        let loaded = self.loaded()?;
        let at = loaded.notes.binary_search_by(|held| held.id.cmp(&id));
        let held = at.ok().map(|at| &loaded.notes[at]);
        match shared::note_change(held, note.filter(|note| note.id == id)) {
            Apply::Nothing => Ok(false),
            Apply::Put(note) => {
                store.put_note(&note)?;
                store.flush()?;
                let vector = RouteIndex::note_vector(&note, &*embedder);
                match at {
                    Ok(at) => {
                        loaded.notes[at] = note;
                        loaded.note_vectors[at] = vector;
                    }
                    Err(at) => {
                        loaded.notes.insert(at, note);
                        loaded.note_vectors.insert(at, vector);
                    }
                }
                Ok(true)
            }
            Apply::Remove => {
                store.remove_note(&id)?;
                store.flush()?;
                if let Ok(at) = at {
                    loaded.notes.remove(at);
                    loaded.note_vectors.remove(at);
                }
                Ok(true)
            }
        }
    }
}

/// Prunes the memory notes over `limits` at `now_ms` (by their last deposit,
/// `core::retention::plan`) from the store and the loaded graph; answers the
/// sweep with the notes' size after it. The retention sweep sends it.
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "Result<crate::core::retention::Swept, ScgError>")]
pub struct PruneNotes {
    pub now_ms: u64,
    pub limits: crate::core::retention::Limits,
}

impl Handler<PruneNotes> for ScgGraph {
    type Result = Result<crate::core::retention::Swept, ScgError>;

    fn handle(&mut self, PruneNotes { now_ms, limits }: PruneNotes, _: &mut Context<Self>) -> Self::Result {
        use crate::core::retention::{plan, Record, Swept};
        let store = self.store.clone();
        let loaded = self.loaded()?;
        let records: Vec<Record> =
            loaded.notes.iter().map(|note| Record { at_ms: note.last_at_ms, exempt: false }).collect();
        let pruned = plan(&records, now_ms, limits);
        for &at in pruned.iter().rev() {
            store.remove_note(&loaded.notes[at].id)?;
            loaded.notes.remove(at);
            loaded.note_vectors.remove(at);
        }
        if !pruned.is_empty() {
            store.flush()?;
        }
        Ok(Swept { pruned: pruned.len() as u64, size: store.memory_size()? })
    }
}

/// The kind of every stored source, by source id.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<std::collections::BTreeMap<String, crate::core::scg::model::SourceKind>, ScgError>")]
pub struct SourceKinds;

impl Handler<SourceKinds> for ScgGraph {
    type Result = Result<std::collections::BTreeMap<String, crate::core::scg::model::SourceKind>, ScgError>;

    fn handle(&mut self, _: SourceKinds, _: &mut Context<Self>) -> Self::Result {
        let loaded = self.loaded()?;
        Ok(loaded.sources.iter().map(|source| (source.graph.source_id.clone(), source.graph.kind)).collect())
    }
}

/// The sources a workspace enabled, by the rule `route` uses; `None` for no
/// workspace (every source).
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<Option<Vec<String>>, ScgError>")]
pub struct SourcesOf {
    pub workspace: Option<String>,
}

impl Handler<SourcesOf> for ScgGraph {
    type Result = Result<Option<Vec<String>>, ScgError>;

    fn handle(&mut self, request: SourcesOf, _: &mut Context<Self>) -> Self::Result {
        let loaded = self.loaded()?;
        Ok(match ScgGraph::scope(&loaded.sources, request.workspace.as_deref()) {
            Scope::All => None,
            Scope::Sources(sources) => Some(sources.into_iter().collect()),
        })
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
    type Result = ResponseActFuture<Self, Result<RouteAnswer, ScgError>>;

    fn handle(&mut self, request: Route, _: &mut Context<Self>) -> Self::Result {
        let Some(remote) = self.remote.clone() else {
            return Box::pin(fut::ready(self.route_now(&request, None)));
        };
        let (semantic, graphs) = match self.loaded() {
            Ok(loaded) if loaded.semantic => (true, Vec::new()),
            Ok(loaded) => (false, loaded.sources.iter().map(|source| source.graph.clone()).collect::<Vec<_>>()),
            Err(err) => return Box::pin(fut::ready(Err(err))),
        };
        // Another route is building the semantic index: this one uses the in-process one.
        if !semantic && self.upgrading {
            return Box::pin(fut::ready(self.route_now(&request, None)));
        }
        // The question is embedded as a query, the graph's texts as documents
        // (a model with prefixes tells the two apart).
        let question = remote.send(EmbedTexts { texts: vec![request.query.clone()], role: TextRole::Query });
        let document_texts = if semantic { Vec::new() } else { RouteIndex::embedding_texts(&graphs) };
        let documents = (!semantic).then(|| {
            self.upgrading = true;
            remote.send(EmbedTexts { texts: document_texts.clone(), role: TextRole::Document })
        });
        let both = async move {
            let question = question.await;
            let documents = match documents {
                Some(documents) => Some(documents.await),
                None => None,
            };
            (question, documents)
        };
        let query = request.query.clone();
        let generation = self.generation;
        Box::pin(both.into_actor(self).map(move |(question, documents), actor, _| {
            if !semantic && actor.generation == generation {
                actor.upgrading = false;
            }
            let table = match embedded(question, documents) {
                Ok((model_id, dimensions, vectors)) => {
                    let mut texts = vec![query];
                    texts.extend(document_texts);
                    Some(PrecomputedEmbedder::new(model_id, dimensions, &texts, vectors))
                }
                Err(err) => {
                    tracing::warn!(error = %err, "route: the embedder failed");
                    None
                }
            };
            if let (false, Some(table), Some(loaded)) = (semantic, &table, actor.loaded.as_mut()) {
                if actor.generation == generation {
                    let index = RouteIndex::build(&graphs, &loaded.links, Some(table as &dyn Embed));
                    loaded.index = Arc::new(index);
                    loaded.semantic = true;
                }
            }
            actor.route_now(&request, table.as_ref().map(|table| table as &dyn Embed))
        }))
    }
}

type Embedded = Result<EmbeddedTexts, actix::MailboxError>;

/// The question's vector then the documents' (when asked), with the model
/// that made them, or why there are none.
fn embedded(question: Embedded, documents: Option<Embedded>) -> Result<(String, usize, Vec<Vec<f32>>), String> {
    let unwrap = |reply: Embedded| match reply {
        Ok(EmbeddedTexts { model_id, dimensions, vectors: Ok(vectors) }) => Ok((model_id, dimensions, vectors)),
        Ok(EmbeddedTexts { vectors: Err(err), .. }) => Err(format!("{}: {}", err.code, err.message)),
        Err(err) => Err(format!("the embedder is unavailable: {err}")),
    };
    let (model_id, dimensions, mut vectors) = unwrap(question)?;
    if let Some(documents) = documents {
        vectors.extend(unwrap(documents)?.2);
    }
    Ok((model_id, dimensions, vectors))
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
        memory::validate(&request.deposit, &self.limits)?;
        let (store, embedder) = (self.store.clone(), self.embedder.clone());
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
        let vector = RouteIndex::note_vector(&note, &*embedder);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scg::map_source;
    use crate::core::scg::memory::Polarity;
    use crate::store::Store;
    use std::collections::BTreeMap;

    const PETS: &str = "swagger: '2.0'\ninfo: {title: Pets}\ndefinitions:\n  Pet:\n    properties:\n      name: {type: string}\n      tag: {type: string}\npaths:\n  /pets/{petId}:\n    parameters:\n      - {name: petId, in: path, required: true, type: string}\n    get:\n      operationId: showPetById\n      responses:\n        '200':\n          schema: {$ref: '#/definitions/Pet'}\n";

    fn parsed(workspace: &str) -> Parsed {
        Parsed {
            graph: map_source("pets", None, PETS).unwrap(),
            tools: Vec::new(),
            workspaces: vec![workspace.into()],
            connection: Default::default(),
            phase_ms: BTreeMap::new(),
        }
    }

    fn start(store: &Store) -> Addr<ScgGraph> {
        let (events, _) = broadcast::channel(64);
        let embedder = std::sync::Arc::new(HashingEmbedder::new(64).unwrap());
        ScgGraph::new(ScgStore::open(store).unwrap(), embedder, 86_400_000, events).start()
    }

    #[actix::test]
    async fn it_puts_shared_sources_and_notes_as_given_and_ignores_repeats() {
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let store_b = Store::open(dir_b.path()).unwrap();
        let (a, b) = (start(&Store::open(dir_a.path()).unwrap()), start(&store_b));
        a.send(Finalize(parsed("ws1"))).await.unwrap().unwrap();
        let stored = a.send(SourceOf { source_id: "pets".into() }).await.unwrap().unwrap().expect("mapped on a");
        assert_eq!(b.send(SourceOf { source_id: "pets".into() }).await.unwrap().unwrap(), None);
        assert!(b.send(PutSource(stored.clone())).await.unwrap().unwrap(), "b takes a's map");
        assert!(!b.send(PutSource(stored.clone())).await.unwrap().unwrap(), "the same map again changes nothing");
        assert_eq!(b.send(SourceOf { source_id: "pets".into() }).await.unwrap().unwrap(), Some(stored.clone()));
        let route = Route { query: "show pet by id".into(), k: 3, workspace: Some("ws1".into()) };
        let on_a = a.send(route.clone()).await.unwrap().unwrap();
        let on_b = b.send(route.clone()).await.unwrap().unwrap();
        assert_eq!(on_a.recipes, on_b.recipes, "b routes as a does");

        let deposit = Deposit {
            content: "tag is often empty".into(),
            polarity: Polarity::DeadEnd,
            anchors: vec!["pets#Pet.tag".into()],
            label: "ws:ws1".into(),
        };
        let note = a.send(DepositNote { deposit, workspace: None }).await.unwrap().unwrap().note;
        let put = PutNote { id: note.id.clone(), note: Some(note.clone()) };
        assert!(b.send(put.clone()).await.unwrap().unwrap());
        assert!(!b.send(put).await.unwrap().unwrap(), "the same note again changes nothing");
        assert_eq!(
            b.send(route.clone()).await.unwrap().unwrap().recipes,
            a.send(route).await.unwrap().unwrap().recipes
        );
        let wrong = PutNote { id: "other".into(), note: Some(note.clone()) };
        assert!(!b.send(wrong).await.unwrap().unwrap(), "a note under another id is not taken");
        assert_eq!(b.send(Inspect::<ScgGraphStats>::new()).await.unwrap().notes, 1);
        assert!(b.send(PutNote { id: note.id.clone(), note: None }).await.unwrap().unwrap(), "removed");
        assert!(!b.send(PutNote { id: note.id.clone(), note: None }).await.unwrap().unwrap(), "already gone");
        drop(b);
        let restarted = start(&store_b);
        let held = restarted.send(SourceOf { source_id: "pets".into() }).await.unwrap().unwrap();
        assert_eq!(held, Some(stored), "what b took is stored");
        let stats = restarted.send(Inspect::<ScgGraphStats>::new()).await.unwrap();
        assert_eq!((stats.sources, stats.notes), (1, 0), "what b took and removed is stored");
    }

    #[actix::test]
    async fn it_finalizes_routes_observes_and_keeps_notes_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let graph = start(&store);
        assert!(!graph.send(Inspect::<ScgGraphStats>::new()).await.unwrap().loaded);
        let report = graph.send(Finalize(parsed("ws1"))).await.unwrap().unwrap();
        assert_eq!((report.sources, report.changed, report.workspaces.clone()), (1, true, vec!["ws1".to_string()]));
        let again = graph.send(Finalize(parsed("ws2"))).await.unwrap().unwrap();
        assert_eq!((again.changed, again.workspaces), (false, vec!["ws1".to_string(), "ws2".into()]));
        let route = |workspace: Option<&str>| Route {
            query: "show pet by id".into(),
            k: 3,
            workspace: workspace.map(String::from),
        };
        let answer = graph.send(route(None)).await.unwrap().unwrap();
        assert_eq!(answer.sources_in_scope, 1);
        assert!(!answer.recipes.is_empty());
        assert_eq!(graph.send(route(Some("elsewhere"))).await.unwrap().unwrap().sources_in_scope, 0);
        let node = ObserveNode { node: "pets#Pet.tag".into(), edge_kinds: vec![], workspace: None };
        let observed = graph.send(node.clone()).await.unwrap().unwrap();
        assert_eq!(observed.node.source_key, "pets#Pet.tag");
        let hidden = graph.send(ObserveNode { workspace: Some("elsewhere".into()), ..node.clone() }).await.unwrap();
        assert_eq!(hidden.unwrap_err().status(), 404);
        let deposit = Deposit {
            content: "tag is often empty".into(),
            polarity: Polarity::DeadEnd,
            anchors: vec!["pets#Pet.tag".into()],
            label: "ws:ws1".into(),
        };
        let first = graph.send(DepositNote { deposit: deposit.clone(), workspace: None }).await.unwrap().unwrap();
        let second = graph.send(DepositNote { deposit: deposit.clone(), workspace: None }).await.unwrap().unwrap();
        assert_eq!((first.merged, second.merged, first.note.id.clone()), (false, true, second.note.id));
        let unknown = Deposit { anchors: vec!["pets#Nope".into()], ..deposit };
        let refused = graph.send(DepositNote { deposit: unknown, workspace: None }).await.unwrap().unwrap_err();
        assert_eq!(refused.status(), 404);
        let stats = graph.send(Inspect::<ScgGraphStats>::new()).await.unwrap();
        assert_eq!((stats.loaded, stats.sources, stats.notes), (true, 1, 1));
        assert!(stats.nodes > 0);
        drop(graph);
        let restarted = start(&store);
        let observed = restarted.send(node).await.unwrap().unwrap();
        assert_eq!(observed.notes.len(), 1);
        let stats = restarted.send(Inspect::<ScgGraphStats>::new()).await.unwrap();
        assert_eq!((stats.sources, stats.notes), (1, 1));
        let of = |workspace: Option<&str>| SourcesOf { workspace: workspace.map(String::from) };
        assert_eq!(restarted.send(of(Some("ws2"))).await.unwrap().unwrap(), Some(vec!["pets".to_string()]));
        assert_eq!(restarted.send(of(Some("elsewhere"))).await.unwrap().unwrap(), Some(vec![]));
        assert_eq!(restarted.send(of(None)).await.unwrap().unwrap(), None);
        let kinds = restarted.send(SourceKinds).await.unwrap().unwrap();
        assert_eq!(
            kinds.into_iter().collect::<Vec<_>>(),
            [("pets".to_string(), crate::core::scg::model::SourceKind::Openapi)]
        );
        let remove = RemoveSource { source_id: "pets".into() };
        assert!(restarted.send(remove.clone()).await.unwrap().unwrap());
        assert!(!restarted.send(remove).await.unwrap().unwrap(), "already gone");
        assert_eq!(restarted.send(route(None)).await.unwrap().unwrap().sources_in_scope, 0);
        drop(restarted);
        let again = start(&store);
        assert_eq!(again.send(Inspect::<ScgGraphStats>::new()).await.unwrap().sources, 0, "the removal is stored");
    }
}
