//! Indexer: owns the catalog, the vector index and the lexical index. A change by one
//! origin is planned by `core::catalog::plan_change`, embeddings are reused from the store
//! when model and text are unchanged (so a restart re-embeds nothing), the
//! rest go to the Embedder, and the new snapshot is published.
//!
//! Embedding is best effort: when the Embedder fails (an HTTP backend that is
//! down, say), the sync still completes: every capability enters the catalog
//! and the lexical index, those without a vector are kept *pending* (reported
//! in the [`SyncReport`]), and [`RetryEmbeddings`] (sent every
//! [`RETRY_INTERVAL`] while any are pending, and on demand) asks again.
//! Discovery meanwhile ranks them by the lexical and graph signals.
//!
//! Mailbox ordering: a sync holds the mailbox until it is applied
//! (`AtomicResponse`), so syncs never interleave. Before replying it has
//! published the catalog to its subscribers and waited for the GraphBuilder,
//! so a caller that gets the reply can query the Router straight away.

use crate::actors::embedder::EmbedTexts;
use crate::actors::graph_builder::BuildGraph;
use crate::actors::Observe;
use crate::core::catalog::{plan_change, Catalog, ChangeMode, Conflict};
use crate::core::descriptor::CapabilityDescriptor;
use crate::core::embedder::{text_hash, EmbedError, EmbedErrorCode};
use crate::core::graph::Preset;
use crate::core::index::VectorIndex;
use crate::core::lexical::LexicalIndex;
use crate::core::text::embedding_text;
use crate::store::{Store, StoreError, StoredEmbedding};
use actix::prelude::*;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How often capabilities still without a vector are sent to the Embedder again.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(30);

/// Asks the Embedder again for the vectors of every pending capability.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<RetryReport, IndexerError>")]
pub struct RetryEmbeddings;

/// What one [`RetryEmbeddings`] did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryReport {
    pub embedded: usize,
    /// Capabilities still without a vector.
    pub pending: usize,
    pub embedder_error: Option<String>,
}

/// A change by one origin: `descriptors` replace (or are merged into) what it
/// contributed, `removals` drop ids it holds, and `presets`, when given,
/// replace its presets.
#[derive(Message, Debug)]
#[rtype(result = "Result<SyncReport, IndexerError>")]
pub struct SyncCapabilities {
    pub origin: String,
    pub descriptors: Vec<CapabilityDescriptor>,
    pub mode: ChangeMode,
    pub removals: Vec<String>,
    pub presets: Option<Vec<Preset>>,
    /// Offers the source refused before they reached the index, reported in the index event.
    pub refused: Vec<Refused>,
}

/// Something a source could not offer: a manifest path or registration item, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Refused {
    pub source: String,
    pub field: String,
    pub problem: String,
}

/// Published after every change that reached the index (and for every
/// refusal), for the `capdex.v1.events.index` subject.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IndexEvent {
    pub version: u64,
    pub origin: String,
    pub added: Vec<String>,
    pub updated: Vec<String>,
    pub removed: Vec<String>,
    pub refused: Vec<Refused>,
}

impl SyncCapabilities {
    /// Everything `origin` offers now; what it offered before and not now goes.
    pub fn replace(origin: &str, descriptors: Vec<CapabilityDescriptor>) -> SyncCapabilities {
        SyncCapabilities {
            origin: origin.to_string(),
            descriptors,
            mode: ChangeMode::Replace,
            removals: Vec::new(),
            presets: None,
            refused: Vec::new(),
        }
    }

    /// Adds or updates `descriptors` for `origin`, keeping the rest.
    pub fn merge(origin: &str, descriptors: Vec<CapabilityDescriptor>) -> SyncCapabilities {
        SyncCapabilities {
            origin: origin.to_string(),
            descriptors,
            mode: ChangeMode::Merge,
            removals: Vec::new(),
            presets: None,
            refused: Vec::new(),
        }
    }

    /// Removes `ids` held by `origin`.
    pub fn remove(origin: &str, ids: Vec<String>) -> SyncCapabilities {
        SyncCapabilities {
            origin: origin.to_string(),
            descriptors: Vec::new(),
            mode: ChangeMode::Merge,
            removals: ids,
            presets: None,
            refused: Vec::new(),
        }
    }
}

/// A new catalog with its vector and lexical indexes (all of one version),
/// published after every change.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct CatalogPublished {
    pub catalog: Arc<Catalog>,
    pub index: Arc<VectorIndex>,
    pub lexical: Arc<LexicalIndex>,
}

/// What one sync did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncReport {
    /// Ids that were not indexed before.
    pub added: Vec<String>,
    /// Ids whose descriptor changed.
    pub updated: Vec<String>,
    /// Ids dropped.
    pub removed_ids: Vec<String>,
    pub upserted: usize,
    pub removed: usize,
    pub unchanged: usize,
    /// Upserts whose vector was computed now.
    pub embedded: usize,
    /// Upserts whose stored vector was still valid.
    pub reused: usize,
    /// Capabilities (of this sync or earlier ones) indexed without a vector, to be embedded later.
    pub pending: usize,
    /// Why the embedder gave no vectors, when it did not (`code: message`).
    pub embedder_error: Option<String>,
    pub conflicts: Vec<Conflict>,
    pub version: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum IndexerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the embedder did not answer: {0}")]
    Embedder(String),
    #[error("the embedder returned {actual} vectors for {expected} texts")]
    EmbedderCount { expected: usize, actual: usize },
    #[error(transparent)]
    Index(#[from] crate::core::index::IndexError),
    #[error("applying the change failed: {0}")]
    Apply(String),
}

/// What the indexer holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IndexerStats {
    pub version: u64,
    pub capabilities: usize,
    pub syncs: u64,
    pub embedded_total: u64,
    pub reused_total: u64,
    /// Capabilities indexed without a vector for now.
    pub pending: usize,
}

pub struct Indexer {
    store: Store,
    embedder: Recipient<EmbedTexts>,
    graph_builder: Recipient<BuildGraph>,
    subscribers: Vec<Recipient<CatalogPublished>>,
    catalog: Arc<Catalog>,
    index: Arc<VectorIndex>,
    /// The catalog version the GraphBuilder was last asked to build.
    graph_version: u64,
    /// Where index events go (the gateway, when serving).
    events: Option<tokio::sync::mpsc::UnboundedSender<IndexEvent>>,
    lexical: Arc<LexicalIndex>,
    /// Where discovery reads its snapshots, written before a change is replied to.
    snapshots: Option<Arc<crate::actors::router::SnapshotCell>>,
    /// Ids in the catalog without a vector in the index (the embedder failed).
    pending: BTreeSet<String>,
    stats: IndexerStats,
}

impl Indexer {
    /// Builds an indexer over what the store holds, for the embedder model
    /// `model_id` of `dimensions` (0: not known yet). Every stored descriptor
    /// is indexed; one whose stored vector was made by another model (or does
    /// not fit) is pending until the Embedder gives it a new one.
    pub fn load(
        store: Store,
        embedder: Recipient<EmbedTexts>,
        graph_builder: Recipient<BuildGraph>,
        subscribers: Vec<Recipient<CatalogPublished>>,
        model_id: &str,
        dimensions: usize,
    ) -> Result<Indexer, StoreError> {
        let mut catalog = Catalog::default();
        let mut index = VectorIndex::new(dimensions);
        let mut pending = BTreeSet::new();
        for stored in store.descriptors()? {
            let descriptor = stored.descriptor;
            let vector_fits = match store.embedding(&descriptor.id)? {
                Some(embedding) if embedding.model_id == model_id => {
                    index.upsert(&descriptor.id, &embedding.vector).is_ok()
                }
                _ => false,
            };
            if !vector_fits {
                pending.insert(descriptor.id.clone());
            }
            catalog.origins.insert(descriptor.id.clone(), stored.origin);
            catalog.descriptors.insert(descriptor.id.clone(), descriptor);
        }
        catalog.presets = store.presets()?.into_iter().collect();
        // Versions count changes within a process; a restored catalog starts a new count at 1.
        catalog.version = u64::from(!catalog.is_empty());
        let stats = IndexerStats {
            version: catalog.version,
            capabilities: catalog.len(),
            pending: pending.len(),
            ..IndexerStats::default()
        };
        let graph_version = catalog.version;
        // The lexical index has corpus-wide statistics (idf, average length), so it is rebuilt whole.
        let lexical = LexicalIndex::build(catalog.descriptors.values());
        Ok(Indexer {
            store,
            embedder,
            graph_builder,
            subscribers,
            catalog: Arc::new(catalog),
            index: Arc::new(index),
            graph_version,
            events: None,
            lexical: Arc::new(lexical),
            snapshots: None,
            pending,
            stats,
        })
    }

    /// Sends an [`IndexEvent`] for every change to `events`.
    pub fn with_events(mut self, events: tokio::sync::mpsc::UnboundedSender<IndexEvent>) -> Indexer {
        self.events = Some(events);
        self
    }

    /// Publishes every catalog into `snapshots` too, directly, so a discovery
    /// that starts after a change's reply is served from it (or a newer one).
    pub fn with_snapshot_cell(mut self, snapshots: Arc<crate::actors::router::SnapshotCell>) -> Indexer {
        snapshots.publish_catalog(&CatalogPublished {
            catalog: self.catalog.clone(),
            index: self.index.clone(),
            lexical: self.lexical.clone(),
        });
        self.snapshots = Some(snapshots);
        self
    }

    fn publish(&self) {
        let published = CatalogPublished {
            catalog: self.catalog.clone(),
            index: self.index.clone(),
            lexical: self.lexical.clone(),
        };
        if let Some(snapshots) = &self.snapshots {
            snapshots.publish_catalog(&published);
        }
        for subscriber in &self.subscribers {
            subscriber.do_send(published.clone());
        }
    }
}

/// A change applied to copies of the catalog and indexes (and written to the store).
struct Applied {
    plan: crate::core::catalog::ChangePlan,
    /// The new catalog, vector index and lexical index; `None` when nothing changed.
    next: Option<(Catalog, VectorIndex, LexicalIndex)>,
    added: Vec<String>,
    updated: Vec<String>,
    /// Upserts indexed without a vector (lexically only), now pending re-embedding.
    pending_added: Vec<String>,
    /// Ids no longer pending: embedded now, or removed.
    pending_resolved: Vec<String>,
}

/// Applies `plan` (with a vector for every upsert that could be embedded) by `origin` to copies of
/// `base_catalog` and `base_index`, writing each change to the store.
fn apply_change(
    store: &Store,
    base_catalog: &Catalog,
    base_index: &VectorIndex,
    origin: &str,
    plan: crate::core::catalog::ChangePlan,
    vectors: Vec<Option<Vec<f32>>>,
    presets: Option<Vec<Preset>>,
) -> Result<Applied, IndexerError> {
    let mut catalog = base_catalog.clone();
    let mut index = base_index.clone();
    let (mut pending_added, mut pending_resolved) = (Vec::new(), Vec::new());
    for id in &plan.removals {
        store.remove_capability(id)?;
        catalog.descriptors.remove(id);
        catalog.origins.remove(id);
        index.remove(id);
        pending_resolved.push(id.clone());
    }
    let (mut added, mut updated) = (Vec::new(), Vec::new());
    for (descriptor, vector) in plan.upserts.iter().zip(vectors) {
        // No vector (the embedder failed) or one that does not fit: indexed
        // lexically only, and pending until an embedding retry succeeds.
        match vector {
            Some(vector) if index.upsert(&descriptor.id, &vector).is_ok() => {
                pending_resolved.push(descriptor.id.clone())
            }
            _ => {
                index.remove(&descriptor.id);
                pending_added.push(descriptor.id.clone());
            }
        }
        store.put_descriptor(origin, descriptor)?;
        let previous = catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
        catalog.origins.insert(descriptor.id.clone(), origin.to_string());
        if previous.is_some() {
            updated.push(descriptor.id.clone())
        } else {
            added.push(descriptor.id.clone())
        }
    }
    let mut presets_changed = false;
    if let Some(presets) = presets {
        if catalog.presets.get(origin).map_or(!presets.is_empty(), |held| *held != presets) {
            store.put_presets(origin, &presets)?;
            if presets.is_empty() {
                catalog.presets.remove(origin);
            } else {
                catalog.presets.insert(origin.to_string(), presets);
            }
            presets_changed = true;
        }
    }
    let changed = !plan.upserts.is_empty() || !plan.removals.is_empty() || presets_changed;
    let next = changed.then(|| {
        catalog.version = base_catalog.version + 1;
        let lexical = LexicalIndex::build(catalog.descriptors.values());
        (catalog, index, lexical)
    });
    Ok(Applied { plan, next, added, updated, pending_added, pending_resolved })
}

impl Actor for Indexer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.publish();
        self.graph_builder.do_send(BuildGraph { catalog: self.catalog.clone() });
        if !self.pending.is_empty() {
            ctx.notify(RetryEmbeddings);
        }
        ctx.run_interval(RETRY_INTERVAL, |actor, ctx| {
            if !actor.pending.is_empty() {
                ctx.notify(RetryEmbeddings);
            }
        });
    }
}

impl Handler<SyncCapabilities> for Indexer {
    type Result = AtomicResponse<Self, Result<SyncReport, IndexerError>>;

    fn handle(&mut self, msg: SyncCapabilities, _: &mut Context<Self>) -> Self::Result {
        let plan = plan_change(&self.catalog, &msg.origin, msg.descriptors, msg.mode, &msg.removals);
        let origin = msg.origin;
        let presets = msg.presets;
        let mut refused = msg.refused;
        refused.extend(plan.conflicts.iter().map(|c| Refused {
            source: c.id.clone(),
            field: "id".into(),
            problem: c.problem.clone(),
        }));
        let texts: Vec<String> = plan.upserts.iter().map(embedding_text).collect();
        let embedder = self.embedder.clone();
        // One round trip to learn the model id, with the texts that might need it.
        let request = embedder.send(EmbedTexts { texts: Vec::new() });
        let store = self.store.clone();
        // Snapshots of what the change applies to: the mailbox is held until
        // it is applied, so nothing else changes them meanwhile.
        let (base_catalog, base_index) = (self.catalog.clone(), self.index.clone());
        let apply_origin = origin.clone();
        AtomicResponse::new(Box::pin(
            async move {
                let model_id = request.await.map_err(|err| IndexerError::Embedder(err.to_string()))?.model_id;
                let hashes: Vec<String> = texts.iter().map(|text| text_hash(&model_id, text)).collect();
                let mut vectors: Vec<Option<Vec<f32>>> = Vec::with_capacity(texts.len());
                let mut missing: Vec<usize> = Vec::new();
                for (i, descriptor) in plan.upserts.iter().enumerate() {
                    match store.embedding(&descriptor.id)? {
                        Some(stored) if stored.model_id == model_id && stored.text_hash == hashes[i] => vectors.push(Some(stored.vector)),
                        _ => {
                            vectors.push(None);
                            missing.push(i);
                        }
                    }
                }
                let reused = texts.len() - missing.len();
                let mut embedded_now = 0;
                let mut embed_error = None;
                if !missing.is_empty() {
                    let batch: Vec<String> = missing.iter().map(|&i| texts[i].clone()).collect();
                    let embedded = embedder.send(EmbedTexts { texts: batch }).await.map_err(|err| IndexerError::Embedder(err.to_string()))?;
                    match checked_vectors(embedded.vectors, missing.len()) {
                        Ok(list) => {
                            for (&i, vector) in missing.iter().zip(list) {
                                if vector.is_empty() {
                                    continue;
                                }
                                store.put_embedding(&plan.upserts[i].id, &StoredEmbedding { model_id: model_id.clone(), text_hash: hashes[i].clone(), vector: vector.clone() })?;
                                vectors[i] = Some(vector);
                                embedded_now += 1;
                            }
                        }
                        Err(err) => embed_error = Some(err),
                    }
                }
                // The store writes and the index builds are CPU and disk work:
                // on a blocking thread, so the System's thread (actors and
                // gateway) keeps answering meanwhile.
                let applied = tokio::task::spawn_blocking(move || {
                    apply_change(&store, &base_catalog, &base_index, &apply_origin, plan, vectors, presets)
                })
                .await
                .map_err(|err| IndexerError::Apply(err.to_string()))??;
                Ok::<_, IndexerError>((applied, reused, embedded_now, embed_error))
            }
            .into_actor(self)
            .map(move |result, actor, _ctx| {
                let (applied, reused, embedded, embed_error) = result?;
                let Applied { plan, next, added, updated, pending_added, pending_resolved } = applied;
                for id in &pending_resolved {
                    actor.pending.remove(id);
                }
                actor.pending.extend(pending_added);
                let changed = next.is_some();
                if let Some((catalog, index, lexical)) = next {
                    actor.lexical = Arc::new(lexical);
                    actor.catalog = Arc::new(catalog);
                    actor.index = Arc::new(index);
                    actor.publish();
                }
                for conflict in &plan.conflicts {
                    tracing::warn!(id = %conflict.id, problem = %conflict.problem, %origin, "capability offer not taken");
                }
                if changed || !refused.is_empty() {
                    if let Some(events) = &actor.events {
                        let _ = events.send(IndexEvent {
                            version: actor.catalog.version,
                            origin: origin.clone(),
                            added: added.clone(),
                            updated: updated.clone(),
                            removed: plan.removals.clone(),
                            refused,
                        });
                    }
                }
                actor.stats.version = actor.catalog.version;
                actor.stats.capabilities = actor.catalog.len();
                actor.stats.syncs += 1;
                actor.stats.embedded_total += embedded as u64;
                actor.stats.reused_total += reused as u64;
                actor.stats.pending = actor.pending.len();
                metrics::gauge!("capdex_capabilities_indexed").set(actor.catalog.len() as f64);
                Ok(SyncReport {
                    added,
                    updated,
                    removed_ids: plan.removals.clone(),
                    upserted: plan.upserts.len(),
                    removed: plan.removals.len(),
                    unchanged: plan.unchanged,
                    embedded,
                    reused,
                    pending: actor.pending.len(),
                    embedder_error: embed_error.map(|err| err.to_string()),
                    conflicts: plan.conflicts,
                    version: actor.catalog.version,
                })
            })
            .then(|result: Result<SyncReport, IndexerError>, actor, _ctx| {
                let build = match &result {
                    Ok(_) if actor.graph_version != actor.catalog.version => {
                        actor.graph_version = actor.catalog.version;
                        Some(actor.graph_builder.send(BuildGraph { catalog: actor.catalog.clone() }))
                    }
                    _ => None,
                };
                async move {
                    if let Some(build) = build {
                        if let Err(err) = build.await {
                            tracing::warn!(%err, "graph builder did not answer");
                        }
                    }
                    result
                }
                .into_actor(actor)
            }),
        ))
    }
}

/// Checks the Embedder's answer: one vector per text, or the error to report.
fn checked_vectors(vectors: Result<Vec<Vec<f32>>, EmbedError>, expected: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
    let vectors = vectors?;
    if vectors.len() != expected {
        return Err(EmbedError::new(
            EmbedErrorCode::BadResponse,
            format!("the embedder returned {} vectors for {expected} texts", vectors.len()),
        ));
    }
    Ok(vectors)
}

impl Handler<RetryEmbeddings> for Indexer {
    type Result = AtomicResponse<Self, Result<RetryReport, IndexerError>>;

    fn handle(&mut self, _: RetryEmbeddings, _: &mut Context<Self>) -> Self::Result {
        let ids: Vec<String> = self.pending.iter().filter(|id| self.catalog.get(id).is_some()).cloned().collect();
        if ids.is_empty() {
            let report = RetryReport { pending: self.pending.len(), ..RetryReport::default() };
            return AtomicResponse::new(Box::pin(fut::ready(Ok(report))));
        }
        let texts: Vec<String> = ids.iter().filter_map(|id| self.catalog.get(id)).map(embedding_text).collect();
        let request = self.embedder.send(EmbedTexts { texts: texts.clone() });
        AtomicResponse::new(Box::pin(
            async move { request.await.map_err(|err| IndexerError::Embedder(err.to_string())) }.into_actor(self).map(
                move |answer, actor, _ctx| {
                    let answer = answer?;
                    let vectors = match checked_vectors(answer.vectors, ids.len()) {
                        Ok(vectors) => vectors,
                        Err(err) => {
                            return Ok(RetryReport {
                                embedded: 0,
                                pending: actor.pending.len(),
                                embedder_error: Some(err.to_string()),
                            })
                        }
                    };
                    let mut index = (*actor.index).clone();
                    let mut embedded = 0;
                    for ((id, text), vector) in ids.iter().zip(&texts).zip(vectors) {
                        if vector.is_empty() || index.upsert(id, &vector).is_err() {
                            continue;
                        }
                        let text_hash = text_hash(&answer.model_id, text);
                        actor.store.put_embedding(
                            id,
                            &StoredEmbedding { model_id: answer.model_id.clone(), text_hash, vector },
                        )?;
                        actor.pending.remove(id);
                        embedded += 1;
                    }
                    if embedded > 0 {
                        let mut catalog = (*actor.catalog).clone();
                        catalog.version += 1;
                        actor.catalog = Arc::new(catalog);
                        actor.index = Arc::new(index);
                        actor.publish();
                        actor.graph_version = actor.catalog.version;
                        actor.graph_builder.do_send(BuildGraph { catalog: actor.catalog.clone() });
                    }
                    actor.stats.version = actor.catalog.version;
                    actor.stats.embedded_total += embedded as u64;
                    actor.stats.pending = actor.pending.len();
                    Ok(RetryReport { embedded, pending: actor.pending.len(), embedder_error: None })
                },
            ),
        ))
    }
}

impl Handler<Observe<IndexerStats>> for Indexer {
    type Result = MessageResult<Observe<IndexerStats>>;

    fn handle(&mut self, _: Observe<IndexerStats>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}
