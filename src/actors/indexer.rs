//! Indexer: owns the catalog, the vector index and the lexical index. A change by one
//! origin is planned by `core::catalog::plan_change`; `core::reindex` decides which
//! vectors kept in the store are reused (model and text unchanged, so a restart
//! re-embeds nothing), which texts go to the Embedder, and what the new catalog and
//! indexes are; this actor fetches, asks, writes to the store and publishes.
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
//! so a caller that gets the reply can query the Discoverer straight away.

use crate::actors::embedder::{EmbedTexts, EmbeddedTexts};
use crate::actors::graph_builder::BuildGraph;
use crate::actors::snapshot::SnapshotCell;
use crate::actors::snapshot_writer::SnapshotWriter;
use crate::actors::Inspect;
use crate::core::catalog::{plan_change, Catalog, ChangeMode, ChangePlan, Conflict};
use crate::core::catalog_snapshot::{self, CatalogEpoch};
use crate::core::descriptor::CapabilityDescriptor;
use crate::core::embedder::TextRole;
use crate::core::graph::Preset;
use crate::core::index::{QuantisedLoader, VectorIndex};
use crate::core::lexical::snapshot::{Fingerprint, SnapshotError};
use crate::core::lexical::LexicalIndex;
use crate::core::reindex::{
    apply_change, apply_changes, apply_retry, plan_changes, plan_vectors, restore_indexed, retry_targets,
    AppliedChange, AppliedRetry, BatchChange, KeptVector, Restored,
};
use crate::store::{Store, StoreError, StoredDescriptor, StoredEmbedding};
use actix::prelude::*;
use futures::future::OptionFuture;
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

/// A refusal: an offer that was not indexed, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Refused {
    /// The manifest path or registration item refused (wire name `source`, kept for clients).
    #[serde(rename = "source")]
    pub item: String,
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

/// Applies several syncs in order as one change of the index (one build, one
/// publication, one graph): what a node catching up with the index log sends.
/// Answers each sync's report, in order; the state it leaves is the state the
/// syncs would leave one after the other.
#[derive(Message, Debug)]
#[rtype(result = "Result<Vec<SyncReport>, IndexerError>")]
pub struct SyncBatch(pub Vec<SyncCapabilities>);

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
    /// Whether the lexical index was loaded from its snapshot at start (else built).
    pub lexical_from_snapshot: bool,
    /// Whether descriptors and vectors were read from the catalog snapshot at start (else from the store's trees).
    pub catalog_from_snapshot: bool,
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
    snapshots: Option<Arc<SnapshotCell>>,
    /// Ids in the catalog without a vector in the index (the embedder failed).
    pending: BTreeSet<String>,
    stats: IndexerStats,
    /// Writes the lexical index's snapshot, so a restart loads it.
    snapshot_writer: SnapshotWriter,
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
        let started = std::time::Instant::now();
        // The store state the catalog in memory will be (no write comes
        // before the Indexer's own): what a catalog snapshot must name.
        let epoch = store.hand_out_catalog_epoch();
        let snapshot = store.read_lexical_snapshot();
        let from_file = store.read_catalog_snapshot().and_then(|bytes| {
            restore_from_catalog_snapshot(&bytes, epoch, model_id, dimensions, snapshot.as_deref())
                .map_err(|err| tracing::info!(%err, "the catalog snapshot is not used; reading the store"))
                .ok()
        });
        let catalog_from_snapshot = from_file.is_some();
        let (held, fingerprint, lexical, from_snapshot, index, not_kept, (read, vectors_done, lexical_done)) =
            match from_file {
                Some(FromSnapshot { held, fingerprint, lexical, index, timings }) => {
                    let (lexical, from_snapshot) = match lexical {
                        Some(lexical) => (lexical, true),
                        None => (LexicalIndex::build(held.iter().map(|held| &held.descriptor)), false),
                    };
                    (held, fingerprint, lexical, from_snapshot, index, 0, timings)
                }
                None => read_store(&store, model_id, dimensions, snapshot.as_deref(), started)?,
            };
        let presets = store.presets()?;
        let stored = held.into_iter().map(|held| (held.descriptor, held.origin)).collect();
        let Restored { catalog, index, pending } = restore_indexed(index, stored, presets);
        tracing::info!(
            capabilities = catalog.len(),
            pending = pending.len(),
            not_kept,
            catalog_from_snapshot,
            lexical_from_snapshot = from_snapshot,
            read_ms = read.as_millis() as u64,
            vectors_ms = vectors_done.as_millis() as u64,
            lexical_ms = lexical_done.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "catalog restored from the store"
        );
        let catalog = Arc::new(catalog);
        let lexical = Arc::new(lexical);
        let index = Arc::new(index);
        let snapshots = SnapshotWriter::start(
            store.clone(),
            model_id,
            if from_snapshot { lexical.generation() } else { 0 },
            if catalog_from_snapshot { epoch } else { None },
        );
        // What was read from the store is offered at once (written once 2 s
        // pass without a change), so even a crash before the next change
        // leaves snapshots for the restart after it; they name the bytes it was read from.
        snapshots.offer_made_from(catalog.clone(), index.clone(), lexical.clone(), epoch, Some(fingerprint));
        let stats = IndexerStats {
            version: catalog.version,
            capabilities: catalog.len(),
            pending: pending.len(),
            lexical_from_snapshot: from_snapshot,
            catalog_from_snapshot,
            ..IndexerStats::default()
        };
        let graph_version = catalog.version;
        Ok(Indexer {
            store,
            embedder,
            graph_builder,
            subscribers,
            catalog,
            index,
            graph_version,
            events: None,
            lexical,
            snapshots: None,
            snapshot_writer: snapshots,
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
    pub fn with_snapshot_cell(mut self, snapshots: Arc<SnapshotCell>) -> Indexer {
        snapshots.publish_catalog(&self.catalog, &self.index, &self.lexical);
        self.snapshots = Some(snapshots);
        self
    }

    fn publish(&self) {
        self.snapshot_writer.offer(
            self.catalog.clone(),
            self.index.clone(),
            self.lexical.clone(),
            self.store.hand_out_catalog_epoch(),
        );
        if let Some(snapshots) = &self.snapshots {
            snapshots.publish_catalog(&self.catalog, &self.index, &self.lexical);
        }
        let published = CatalogPublished {
            catalog: self.catalog.clone(),
            index: self.index.clone(),
            lexical: self.lexical.clone(),
        };
        for subscriber in &self.subscribers {
            subscriber.do_send(published.clone());
        }
    }

    /// Takes a carried-out change as the current state: pending ids, the new
    /// catalog and indexes (published), the index event and the statistics.
    fn adopt(&mut self, mut carried: Change) -> SyncReport {
        if let Some(next) = carried.applied.next.take() {
            self.take_next(next);
        }
        self.report(carried)
    }

    /// Takes a carried-out batch: its one next catalog (published once), then
    /// each change's pending ids, event and report, in order.
    fn adopt_batch(&mut self, batch: CarriedBatch) -> Vec<SyncReport> {
        if let Some(next) = batch.next {
            self.take_next(next);
        }
        batch.changes.into_iter().map(|change| self.report(change)).collect()
    }

    fn take_next(&mut self, (catalog, index, lexical): (Catalog, VectorIndex, LexicalIndex)) {
        self.lexical = Arc::new(lexical);
        self.catalog = Arc::new(catalog);
        self.index = Arc::new(index);
        self.publish();
    }

    /// A change's pending ids, index event, statistics and report, once the catalog it made is held.
    fn report(&mut self, change: Change) -> SyncReport {
        let Change { origin, plan, refused, applied, reused, embedded, embedder_error } = change;
        let AppliedChange { added, updated, pending_added, pending_resolved, changed, .. } = applied;
        for id in &pending_resolved {
            self.pending.remove(id);
        }
        self.pending.extend(pending_added);
        for conflict in &plan.conflicts {
            tracing::warn!(id = %conflict.id, problem = %conflict.problem, %origin, "capability offer not taken");
        }
        let refused = with_conflicts(refused, &plan.conflicts);
        if changed || !refused.is_empty() {
            if let Some(events) = &self.events {
                let _ = events.send(IndexEvent {
                    version: self.catalog.version,
                    origin,
                    added: added.clone(),
                    updated: updated.clone(),
                    removed: plan.removals.clone(),
                    refused,
                });
            }
        }
        self.stats.syncs += 1;
        self.stats.reused_total += reused as u64;
        self.count(embedded);
        metrics::gauge!("capdex_capabilities_indexed").set(self.catalog.len() as f64);
        SyncReport {
            added,
            updated,
            upserted: plan.upserts.len(),
            removed: plan.removals.len(),
            removed_ids: plan.removals,
            unchanged: plan.unchanged,
            embedded,
            reused,
            pending: self.pending.len(),
            embedder_error,
            conflicts: plan.conflicts,
            version: self.catalog.version,
        }
    }

    /// Takes a retry's vectors: stores them, and publishes a new catalog version when any came.
    fn adopt_retry(&mut self, retry: AppliedRetry) -> Result<RetryReport, IndexerError> {
        for (id, kept) in &retry.embedded {
            self.store.put_embedding(id, &stored_embedding(kept))?;
            self.pending.remove(id);
        }
        let embedded = retry.embedded.len();
        if embedded > 0 {
            let mut catalog = (*self.catalog).clone();
            catalog.version += 1;
            self.catalog = Arc::new(catalog);
            self.index = Arc::new(retry.index);
            self.publish();
            self.graph_version = self.catalog.version;
            self.graph_builder.do_send(BuildGraph { catalog: self.catalog.clone() });
        }
        self.count(embedded);
        Ok(RetryReport { embedded, pending: self.pending.len(), embedder_error: None })
    }

    /// Brings the statistics up to date after `embedded` new vectors.
    fn count(&mut self, embedded: usize) {
        self.stats.version = self.catalog.version;
        self.stats.capabilities = self.catalog.len();
        self.stats.embedded_total += embedded as u64;
        self.stats.pending = self.pending.len();
    }

    /// Asks the GraphBuilder for the graph of the current catalog when it has
    /// not built it yet; the returned future ends with `result` once it has answered.
    fn build_graph<T: 'static>(
        &mut self,
        result: Result<T, IndexerError>,
    ) -> impl std::future::Future<Output = Result<T, IndexerError>> + 'static {
        let build = (result.is_ok() && self.graph_version != self.catalog.version).then(|| {
            self.graph_version = self.catalog.version;
            self.graph_builder.send(BuildGraph { catalog: self.catalog.clone() })
        });
        async move {
            if let Some(Err(err)) = OptionFuture::from(build).await {
                tracing::warn!(%err, "graph builder did not answer");
            }
            result
        }
    }
}

/// The lexical index of `held` (the stored descriptors, whose stored bytes
/// have `fingerprint`): from the snapshot file when it was made from exactly
/// these and agrees with them, else built. Says which.
/// Read-time phases of a load, from its start: descriptors read, vectors
/// read, lexical index ready.
type LoadTimings = (std::time::Duration, std::time::Duration, std::time::Duration);

/// What [`Indexer::load`] takes from the store or the snapshots.
type Loaded = (Vec<StoredDescriptor>, Fingerprint, LexicalIndex, bool, VectorIndex, usize, LoadTimings);

/// A catalog read from its snapshot file.
struct FromSnapshot {
    held: Vec<StoredDescriptor>,
    fingerprint: Fingerprint,
    /// The lexical index from its own snapshot, when that one fits too.
    lexical: Option<LexicalIndex>,
    index: VectorIndex,
    timings: LoadTimings,
}

/// Reads the catalog from the snapshot file `bytes` when it names the
/// store's `epoch` and the embedder's model: descriptors on this thread,
/// vectors and then the lexical snapshot (`lexical`) on another.
fn restore_from_catalog_snapshot(
    bytes: &[u8],
    epoch: Option<CatalogEpoch>,
    model_id: &str,
    dimensions: usize,
    lexical: Option<&[u8]>,
) -> Result<FromSnapshot, SnapshotError> {
    let started = std::time::Instant::now();
    let header = catalog_snapshot::header(bytes)?;
    if Some(header.epoch) != epoch {
        return Err(SnapshotError::Stale);
    }
    if header.model_id != model_id {
        return Err(SnapshotError::Disagrees(format!(
            "its vectors are {}'s, the embedder is {model_id}",
            header.model_id
        )));
    }
    let parts = catalog_snapshot::split(bytes)?;
    let (vectors, held) = std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            let vectors = parts.vectors().map(|index| (index, started.elapsed()));
            let lexical = lexical.map(LexicalIndex::decode_snapshot);
            (vectors, lexical, started.elapsed())
        });
        let held = parts.descriptors().map(|held| (held, started.elapsed()));
        (other.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)), held)
    });
    let ((index, vectors_done), lexical, lexical_decoded) = (vectors.0?, vectors.1, vectors.2);
    let (held, read) = held?;
    if dimensions != 0 && !index.is_empty() && index.dimensions() != dimensions {
        return Err(SnapshotError::Disagrees(format!(
            "its vectors have {} dimensions, the embedder gives {dimensions}",
            index.dimensions()
        )));
    }
    let held: Vec<StoredDescriptor> =
        held.into_iter().map(|(origin, descriptor)| StoredDescriptor { origin, descriptor }).collect();
    let descriptors: Vec<&CapabilityDescriptor> = held.iter().map(|held| &held.descriptor).collect();
    let lexical = match lexical {
        Some(Ok((lexical, made_from))) if made_from == header.made_from => match lexical.agrees_with(&descriptors) {
            Ok(()) => Some(lexical),
            Err(err) => {
                tracing::info!(%err, "the lexical snapshot is not used; building the index");
                None
            }
        },
        Some(Ok(_)) => {
            tracing::info!("the lexical snapshot was made from other descriptors; building the index");
            None
        }
        Some(Err(err)) => {
            tracing::info!(%err, "the lexical snapshot is not used; building the index");
            None
        }
        None => None,
    };
    drop(descriptors);
    let lexical_done = started.elapsed().max(lexical_decoded);
    Ok(FromSnapshot {
        held,
        fingerprint: header.made_from,
        lexical,
        index,
        timings: (read, vectors_done, lexical_done),
    })
}

/// Reads the catalog from the store's trees: the vectors as they lie in the
/// store (codes, not `f32`) on one thread while this one reads the
/// descriptors and takes the lexical index from its snapshot (or builds it
/// when the snapshot is missing, stale or disagrees).
fn read_store(
    store: &Store,
    model_id: &str,
    dimensions: usize,
    snapshot: Option<&[u8]>,
    started: std::time::Instant,
) -> Result<Loaded, StoreError> {
    // The snapshot's header counts the capabilities it was made for: a
    // good guess of the vectors to come, so their columns grow once.
    let expected = snapshot.and_then(|bytes| LexicalIndex::snapshot_fingerprint(bytes).ok()).map_or(0, |f| f.count);
    let (loaded, read) = std::thread::scope(|scope| {
        let vectors = scope.spawn(|| {
            let mut loader = QuantisedLoader::new(dimensions, expected as usize);
            let mut refused = 0usize;
            let loaded = store
                .visit_embeddings(model_id, |id, codes, scale| {
                    refused += usize::from(loader.push(id, codes, scale).is_err());
                })
                .map(|other_model| (loader.finish(), other_model + refused));
            (loaded, started.elapsed())
        });
        let read = store.descriptors_fingerprinted().map(|(held, fingerprint)| {
            let read = started.elapsed();
            let (lexical, from_snapshot) = restored_lexical(snapshot, &held, fingerprint);
            (held, fingerprint, lexical, from_snapshot, read, started.elapsed())
        });
        (vectors.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)), read)
    });
    let ((loaded, vectors_done), (held, fingerprint, lexical, from_snapshot, read, lexical_done)) = (loaded, read?);
    let (index, not_kept) = loaded?;
    Ok((held, fingerprint, lexical, from_snapshot, index, not_kept, (read, vectors_done, lexical_done)))
}

fn restored_lexical(
    snapshot: Option<&[u8]>,
    held: &[StoredDescriptor],
    fingerprint: Fingerprint,
) -> (LexicalIndex, bool) {
    let descriptors: Vec<&CapabilityDescriptor> = held.iter().map(|held| &held.descriptor).collect();
    if let Some(bytes) = snapshot {
        match LexicalIndex::from_snapshot(bytes, fingerprint, &descriptors) {
            Ok(lexical) => return (lexical, true),
            Err(err) => tracing::info!(%err, "the lexical snapshot is not used; building the index"),
        }
    }
    (LexicalIndex::build(descriptors), false)
}

/// A change as planned, and what carrying it out did.
struct Change {
    origin: String,
    plan: ChangePlan,
    /// Offers refused before the change reached the index.
    refused: Vec<Refused>,
    applied: AppliedChange,
    reused: usize,
    embedded: usize,
    embedder_error: Option<String>,
}

/// A batch as carried out: each change, and the one next catalog they make.
struct CarriedBatch {
    changes: Vec<Change>,
    next: Option<(Catalog, VectorIndex, LexicalIndex)>,
}

/// One planned change of a batch: origin, plan, presets, and its own refusals.
type PlannedChange = (String, ChangePlan, Option<Vec<Preset>>, Vec<Refused>);

/// Carries out a batch of planned changes in order on one copy of the base:
/// the vectors of every upsert asked of the `embedder` at once, each change
/// applied in turn, the indexes built once, every change written to the store.
async fn carry_out_batch(
    store: Store,
    embedder: Recipient<EmbedTexts>,
    (base_catalog, base_index): (Arc<Catalog>, Arc<VectorIndex>),
    planned: Vec<PlannedChange>,
) -> Result<CarriedBatch, IndexerError> {
    let model_id = ask(embedder.clone(), Vec::new()).await?.model_id;
    let upserts: Vec<CapabilityDescriptor> =
        planned.iter().flat_map(|(_, plan, ..)| plan.upserts.iter().cloned()).collect();
    let kept = upserts.iter().map(|descriptor| Ok(store.embedding(&descriptor.id)?.map(kept_vector)));
    let mut vectors = plan_vectors(&model_id, &upserts, kept.collect::<Result<_, StoreError>>()?);
    let mut embedded_at = vec![false; upserts.len()];
    let mut embedder_error = None;
    if !vectors.to_embed.is_empty() {
        match vectors.fill(ask(embedder, vectors.texts_to_embed()).await?.vectors) {
            Ok(filled) => {
                for &position in &filled {
                    let kept = vectors.kept(position).expect("filled positions have a vector");
                    store.put_embedding(&upserts[position].id, &stored_embedding(&kept))?;
                    embedded_at[position] = true;
                }
            }
            Err(err) => embedder_error = Some(err.to_string()),
        }
    }
    let reused_at: Vec<bool> = (0..upserts.len()).map(|position| !vectors.to_embed.contains(&position)).collect();
    tokio::task::spawn_blocking(move || {
        let mut slots = vectors.vectors.into_iter();
        let mut counts = Vec::with_capacity(planned.len());
        let mut at = 0;
        let batch = planned
            .iter()
            .map(|(origin, plan, presets, _)| {
                let n = plan.upserts.len();
                counts.push((
                    reused_at[at..at + n].iter().filter(|&&r| r).count(),
                    embedded_at[at..at + n].iter().filter(|&&e| e).count(),
                ));
                at += n;
                BatchChange { origin, plan, vectors: slots.by_ref().take(n).collect(), presets: presets.clone() }
            })
            .collect();
        let (applied, next) = apply_changes(&base_catalog, &base_index, batch);
        let mut changes = Vec::with_capacity(planned.len());
        for (((origin, plan, _, refused), applied), (reused, embedded)) in planned.into_iter().zip(applied).zip(counts)
        {
            write_change(&store, &origin, &plan, &applied)?;
            let embedder_error = embedder_error.clone().filter(|_| !plan.upserts.is_empty());
            changes.push(Change { origin, plan, refused, applied, reused, embedded, embedder_error });
        }
        Ok(CarriedBatch { changes, next })
    })
    .await
    .map_err(|err| IndexerError::Apply(err.to_string()))?
}

/// Carries out `plan` by `origin` on copies of `base_catalog` and
/// `base_index`: kept vectors reused, the others asked of the `embedder`, the
/// new ones kept, the change written to the store.
async fn carry_out(
    store: Store,
    embedder: Recipient<EmbedTexts>,
    (base_catalog, base_index): (Arc<Catalog>, Arc<VectorIndex>),
    (origin, plan, presets, refused): (String, ChangePlan, Option<Vec<Preset>>, Vec<Refused>),
) -> Result<Change, IndexerError> {
    // One round trip to learn the model id.
    let model_id = ask(embedder.clone(), Vec::new()).await?.model_id;
    let kept = plan.upserts.iter().map(|descriptor| Ok(store.embedding(&descriptor.id)?.map(kept_vector)));
    let mut vectors = plan_vectors(&model_id, &plan.upserts, kept.collect::<Result<_, StoreError>>()?);
    let (mut embedded, mut embedder_error) = (0, None);
    if !vectors.to_embed.is_empty() {
        match vectors.fill(ask(embedder, vectors.texts_to_embed()).await?.vectors) {
            Ok(filled) => {
                for &position in &filled {
                    let kept = vectors.kept(position).expect("filled positions have a vector");
                    store.put_embedding(&plan.upserts[position].id, &stored_embedding(&kept))?;
                }
                embedded = filled.len();
            }
            Err(err) => embedder_error = Some(err.to_string()),
        }
    }
    let reused = vectors.reused;
    // The store writes and the index builds are CPU and disk work: on a
    // blocking thread, so the System's thread (actors and gateway) keeps answering meanwhile.
    let (origin, plan, applied) = tokio::task::spawn_blocking(move || {
        let applied = apply_change(&base_catalog, &base_index, &origin, &plan, vectors.vectors, presets);
        write_change(&store, &origin, &plan, &applied).map(|()| (origin, plan, applied))
    })
    .await
    .map_err(|err| IndexerError::Apply(err.to_string()))??;
    Ok(Change { origin, plan, refused, applied, reused, embedded, embedder_error })
}

/// Writes a change to the store: removals, then upserts, then the origin's presets if they changed.
fn write_change(store: &Store, origin: &str, plan: &ChangePlan, applied: &AppliedChange) -> Result<(), StoreError> {
    for id in &plan.removals {
        store.remove_capability(id)?;
    }
    for descriptor in &plan.upserts {
        store.put_descriptor(origin, descriptor)?;
    }
    if let Some(presets) = &applied.presets {
        store.put_presets(origin, presets)?;
    }
    Ok(())
}

/// Sends `texts` to the Embedder.
async fn ask(embedder: Recipient<EmbedTexts>, texts: Vec<String>) -> Result<EmbeddedTexts, IndexerError> {
    embedder
        .send(EmbedTexts { texts, role: TextRole::Document })
        .await
        .map_err(|err| IndexerError::Embedder(err.to_string()))
}

/// Adds the offers a plan did not take to the origin's own refusals.
fn with_conflicts(mut refused: Vec<Refused>, conflicts: &[Conflict]) -> Vec<Refused> {
    refused.extend(conflicts.iter().map(|conflict| Refused {
        item: conflict.id.clone(),
        field: "id".into(),
        problem: conflict.problem.clone(),
    }));
    refused
}

fn kept_vector(stored: StoredEmbedding) -> KeptVector {
    KeptVector { model_id: stored.model_id, text_hash: stored.text_hash, vector: stored.vector }
}

fn stored_embedding(kept: &KeptVector) -> StoredEmbedding {
    StoredEmbedding { model_id: kept.model_id.clone(), text_hash: kept.text_hash.clone(), vector: kept.vector.clone() }
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
        // Snapshots of what the change applies to: the mailbox is held until
        // it is applied, so nothing else changes them meanwhile.
        let base = (self.catalog.clone(), self.index.clone());
        let change = (msg.origin, plan, msg.presets, msg.refused);
        AtomicResponse::new(Box::pin(
            carry_out(self.store.clone(), self.embedder.clone(), base, change)
                .into_actor(self)
                .map(|carried, actor, _| Ok(actor.adopt(carried?)))
                .then(|result, actor, _| actor.build_graph(result).into_actor(actor)),
        ))
    }
}

impl Handler<SyncBatch> for Indexer {
    type Result = AtomicResponse<Self, Result<Vec<SyncReport>, IndexerError>>;

    fn handle(&mut self, msg: SyncBatch, _: &mut Context<Self>) -> Self::Result {
        let mut rest = Vec::with_capacity(msg.0.len());
        let inputs = msg
            .0
            .into_iter()
            .map(|sync| {
                rest.push((sync.origin.clone(), sync.presets.clone(), sync.refused));
                (sync.origin, sync.descriptors, sync.mode, sync.removals, sync.presets)
            })
            .collect();
        let plans = plan_changes(&self.catalog, inputs);
        let planned = rest
            .into_iter()
            .zip(plans)
            .map(|((origin, presets, refused), plan)| (origin, plan, presets, refused))
            .collect();
        let base = (self.catalog.clone(), self.index.clone());
        AtomicResponse::new(Box::pin(
            carry_out_batch(self.store.clone(), self.embedder.clone(), base, planned)
                .into_actor(self)
                .map(|carried, actor, _| Ok(actor.adopt_batch(carried?)))
                .then(|result, actor, _| actor.build_graph(result).into_actor(actor)),
        ))
    }
}

impl Handler<RetryEmbeddings> for Indexer {
    type Result = AtomicResponse<Self, Result<RetryReport, IndexerError>>;

    fn handle(&mut self, _: RetryEmbeddings, _: &mut Context<Self>) -> Self::Result {
        let (ids, texts) = retry_targets(&self.pending, &self.catalog);
        if ids.is_empty() {
            let report = RetryReport { pending: self.pending.len(), ..RetryReport::default() };
            return AtomicResponse::new(Box::pin(fut::ready(Ok(report))));
        }
        let request = ask(self.embedder.clone(), texts.clone());
        AtomicResponse::new(Box::pin(request.into_actor(self).map(move |answer, actor, _| {
            let answer = answer?;
            match apply_retry(&actor.index, &answer.model_id, &ids, &texts, answer.vectors) {
                Ok(retry) => actor.adopt_retry(retry),
                Err(err) => {
                    Ok(RetryReport { embedded: 0, pending: actor.pending.len(), embedder_error: Some(err.to_string()) })
                }
            }
        })))
    }
}

/// Writes the lexical index's snapshot now if one is waiting, and answers
/// once it is on disk (at the end of `capdex index` and of `capdex serve`).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct FlushSnapshots;

impl Handler<FlushSnapshots> for Indexer {
    type Result = ();

    fn handle(&mut self, _: FlushSnapshots, _: &mut Context<Self>) {
        self.snapshot_writer.flush();
    }
}

impl Handler<Inspect<IndexerStats>> for Indexer {
    type Result = MessageResult<Inspect<IndexerStats>>;

    fn handle(&mut self, _: Inspect<IndexerStats>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::embedder::Embedder;
    use crate::actors::graph_builder::{GraphBuilder, GraphBuilderStats};
    use crate::actors::test_support::tool;
    use crate::core::catalog::{BUILTIN_ORIGIN, MANIFESTS_ORIGIN};
    use crate::core::embedder::{Embed, EmbedError, EmbedErrorCode, HashingEmbedder};
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::mpsc::UnboundedReceiver;

    /// The built-in hashing embedder, failing while `down` is set.
    struct Switchable {
        model: HashingEmbedder,
        down: Arc<AtomicBool>,
    }

    impl Embed for Switchable {
        fn model_id(&self) -> String {
            self.model.model_id()
        }

        fn dimensions(&self) -> usize {
            self.model.dimensions()
        }

        fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(EmbedError::new(EmbedErrorCode::Unavailable, "connection refused"));
            }
            Embed::embed_batch(&self.model, texts)
        }
    }

    struct Harness {
        indexer: Addr<Indexer>,
        graph_builder: Addr<GraphBuilder>,
        cell: Arc<SnapshotCell>,
        events: UnboundedReceiver<IndexEvent>,
        down: Arc<AtomicBool>,
    }

    /// Starts an Indexer over `store` with a real Embedder and GraphBuilder, publishing into a cell.
    fn start(store: &Store) -> Harness {
        start_with_embedder(store, true)
    }

    /// As [`start`], with the embedder up or down from the first message on (a restart
    /// retries pending vectors at once, so a test that compares them keeps it down).
    fn start_with_embedder(store: &Store, up: bool) -> Harness {
        let down = Arc::new(AtomicBool::new(!up));
        let switch = down.clone();
        let embedder = SyncArbiter::start(1, move || {
            Embedder::new(Box::new(Switchable { model: HashingEmbedder::default(), down: switch.clone() }))
        });
        let cell = Arc::new(SnapshotCell::default());
        let graph_cell = cell.clone();
        let graph_builder = SyncArbiter::start(1, move || {
            GraphBuilder::new(Vec::new(), Vec::new()).with_snapshot_cell(graph_cell.clone())
        });
        let model = HashingEmbedder::default();
        let (sender, events) = tokio::sync::mpsc::unbounded_channel();
        let indexer = Indexer::load(
            store.clone(),
            embedder.recipient(),
            graph_builder.clone().recipient(),
            Vec::new(),
            &model.model_id(),
            model.dimensions(),
        )
        .unwrap()
        .with_events(sender)
        .with_snapshot_cell(cell.clone())
        .start();
        Harness { indexer, graph_builder, cell, events, down }
    }

    async fn sync(harness: &Harness, change: SyncCapabilities) -> SyncReport {
        harness.indexer.send(change).await.unwrap().unwrap()
    }

    async fn stats(harness: &Harness) -> IndexerStats {
        harness.indexer.send(Inspect::<IndexerStats>::new()).await.unwrap()
    }

    #[actix::test]
    async fn a_sync_is_indexed_published_and_graphed_before_its_reply() {
        let dir = tempfile::tempdir().unwrap();
        let mut harness = start(&Store::open(dir.path()).unwrap());
        let offer = vec![tool("gauge", "Read the gauge of a coil"), tool("valve", "Open a valve")];
        let report = sync(&harness, SyncCapabilities::merge("runtime:r", offer)).await;
        assert_eq!(report.added, vec!["tool:gauge".to_string(), "tool:valve".into()]);
        assert_eq!((report.upserted, report.embedded, report.reused, report.pending), (2, 2, 0, 0));
        assert_eq!(report.version, 1);
        let current = harness.cell.load();
        assert_eq!((current.catalog.version, current.graph_version), (1, 1));
        assert!(current.index.contains("tool:gauge") && current.lexical.len() == 2);
        let graph = harness.graph_builder.send(Inspect::<GraphBuilderStats>::new()).await.unwrap();
        assert_eq!(graph.version, 1);
        let event = harness.events.try_recv().unwrap();
        assert_eq!((event.version, event.origin.as_str(), event.added.len()), (1, "runtime:r", 2));
        let stats = stats(&harness).await;
        assert_eq!((stats.version, stats.capabilities, stats.syncs, stats.embedded_total), (1, 2, 1, 2));
    }

    #[actix::test]
    async fn kept_vectors_are_reused_and_a_restart_embeds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let harness = start(&store);
        let gauge = tool("gauge", "Read the gauge of a coil");
        sync(&harness, SyncCapabilities::replace(MANIFESTS_ORIGIN, vec![gauge.clone()])).await;
        let again = sync(&harness, SyncCapabilities::replace(MANIFESTS_ORIGIN, vec![gauge.clone()])).await;
        assert_eq!((again.unchanged, again.upserted, again.version), (1, 0, 1));
        // A stronger origin taking over the same text reuses the stored vector.
        let taken = sync(&harness, SyncCapabilities::merge("runtime:r", vec![gauge.clone()])).await;
        assert_eq!((taken.updated.len(), taken.reused, taken.embedded), (1, 1, 0));
        // A new text is embedded again.
        let changed = tool("gauge", "Read the pressure gauge of a coil");
        let report = sync(&harness, SyncCapabilities::merge("runtime:r", vec![changed])).await;
        assert_eq!((report.reused, report.embedded, report.version), (0, 1, 3));
        drop(harness);
        let restarted = start(&store);
        let stats = stats(&restarted).await;
        assert_eq!((stats.version, stats.capabilities, stats.pending, stats.embedded_total), (1, 1, 0, 0));
        assert!(restarted.cell.load().index.contains("tool:gauge"));
    }

    #[actix::test]
    async fn a_restart_takes_the_lexical_index_from_its_snapshot_only_while_it_is_current() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let harness = start(&store);
        let offer = vec![
            tool("gauge", "Read the gauge of a coil"),
            tool("valve", "Open or close a valve"),
            tool("pump", "Start the pump of a coil"),
        ];
        sync(&harness, SyncCapabilities::merge("runtime:r", offer)).await;
        harness.indexer.send(FlushSnapshots).await.unwrap();
        assert!(!stats(&harness).await.lexical_from_snapshot);
        let built = harness.cell.load().lexical.clone();
        drop(harness);
        let restarted = start(&store);
        assert!(stats(&restarted).await.lexical_from_snapshot);
        let loaded = restarted.cell.load().lexical.clone();
        let scores = |index: &LexicalIndex, query: &str| {
            let mut scores: Vec<(u32, u32)> =
                index.score(query).scores.into_iter().map(|(doc, score)| (doc, score.to_bits())).collect();
            scores.sort_unstable();
            scores
        };
        for query in ["gauge of a coil", "open valve", "pump", "nothing at all"] {
            assert_eq!(scores(&built, query), scores(&loaded, query), "{query}");
        }
        assert_eq!(loaded.exact_matches("gauge"), built.exact_matches("gauge"));
        // A change the snapshot never saw (written by another process, say): built again.
        store.put_descriptor("runtime:r", &tool("fan", "Spin the fan")).unwrap();
        drop(restarted);
        let changed = start(&store);
        assert!(!stats(&changed).await.lexical_from_snapshot);
        assert_eq!(changed.cell.load().lexical.len(), 4);
    }

    #[actix::test]
    async fn a_restart_reads_the_catalog_from_its_snapshot_as_the_store_would_give_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let harness = start(&store);
        let offer = vec![tool("gauge", "Read the gauge of a coil"), tool("valve", "Open or close a valve")];
        sync(&harness, SyncCapabilities::merge("runtime:r", offer)).await;
        sync(&harness, SyncCapabilities::merge("runtime:s", vec![tool("pump", "Start the pump")])).await;
        // One without a vector: pending after the restart as before it.
        harness.down.store(true, Ordering::SeqCst);
        sync(&harness, SyncCapabilities::merge("runtime:s", vec![tool("fan", "Spin the fan")])).await;
        harness.indexer.send(FlushSnapshots).await.unwrap();
        let before = harness.cell.load();
        drop(harness);

        // The embedder stays down: a restart retries the pending vector at once,
        // and what is compared here is what was stored.
        let from_file = start_with_embedder(&store, false);
        let loaded = stats(&from_file).await;
        assert!(loaded.catalog_from_snapshot && loaded.lexical_from_snapshot);
        assert_eq!((loaded.capabilities, loaded.pending, loaded.embedded_total), (4, 1, 0));
        let after = from_file.cell.load();
        assert_eq!(after.catalog.descriptors, before.catalog.descriptors);
        assert_eq!(after.catalog.origins, before.catalog.origins);
        assert_eq!(after.index.len(), 3);
        for id in ["tool:gauge", "tool:valve", "tool:pump", "tool:fan"] {
            assert_eq!(after.index.stored_vector(id), before.index.stored_vector(id), "{id}");
        }
        drop(from_file);

        // The same store read from its trees gives the same catalog.
        std::fs::remove_file(dir.path().join(crate::store::CATALOG_SNAPSHOT_FILE)).unwrap();
        let from_trees = start_with_embedder(&store, false);
        assert!(!stats(&from_trees).await.catalog_from_snapshot);
        let read = from_trees.cell.load();
        assert_eq!(read.catalog.descriptors, after.catalog.descriptors);
        assert_eq!(read.catalog.origins, after.catalog.origins);
        for id in ["tool:gauge", "tool:valve", "tool:pump", "tool:fan"] {
            assert_eq!(read.index.stored_vector(id), after.index.stored_vector(id), "{id}");
        }
    }

    #[actix::test]
    async fn a_catalog_snapshot_older_than_the_store_is_never_used() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let harness = start(&store);
        sync(&harness, SyncCapabilities::merge("runtime:r", vec![tool("gauge", "Read the gauge of a coil")])).await;
        harness.indexer.send(FlushSnapshots).await.unwrap();
        let file = dir.path().join(crate::store::CATALOG_SNAPSHOT_FILE);
        let old = std::fs::read(&file).unwrap();
        // Acknowledged changes after it: a new tool, and a new text for the old one.
        sync(&harness, SyncCapabilities::merge("runtime:r", vec![tool("valve", "Open a valve")])).await;
        sync(&harness, SyncCapabilities::merge("runtime:r", vec![tool("gauge", "Read the pressure gauge")])).await;
        drop(harness);
        // As if the process had died before writing the newer snapshot.
        std::fs::write(&file, &old).unwrap();
        let restarted = start(&store);
        assert!(!stats(&restarted).await.catalog_from_snapshot);
        let current = restarted.cell.load();
        assert_eq!(current.catalog.len(), 2);
        assert_eq!(current.catalog.get("tool:gauge").unwrap().description, "Read the pressure gauge");
        drop(restarted);
        // A write by anything else (another process on the dir, say) after a start: not used either.
        let restarted = start(&store);
        restarted.indexer.send(FlushSnapshots).await.unwrap();
        drop(restarted);
        let restarted = start(&store);
        assert!(stats(&restarted).await.catalog_from_snapshot);
        drop(restarted);
        store.remove_capability("tool:valve").unwrap();
        let after_removal = start(&store);
        assert!(!stats(&after_removal).await.catalog_from_snapshot);
        assert_eq!(after_removal.cell.load().catalog.len(), 1);
    }

    #[actix::test]
    async fn a_catalog_snapshot_of_another_embedding_model_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let harness = start(&store);
        sync(&harness, SyncCapabilities::merge("runtime:r", vec![tool("gauge", "Read the gauge of a coil")])).await;
        harness.indexer.send(FlushSnapshots).await.unwrap();
        drop(harness);
        let file = dir.path().join(crate::store::CATALOG_SNAPSHOT_FILE);
        let bytes = std::fs::read(&file).unwrap();
        let header = crate::core::catalog_snapshot::header(&bytes).unwrap();
        let other = restore_from_catalog_snapshot(&bytes, Some(header.epoch), "another-model", 0, None);
        assert!(matches!(other, Err(SnapshotError::Disagrees(_))));
        let same = restore_from_catalog_snapshot(&bytes, Some(header.epoch), &header.model_id, 0, None);
        assert_eq!(same.unwrap().held.len(), 1);
        let stale = CatalogEpoch { counter: header.epoch.counter + 1, ..header.epoch };
        let refused = restore_from_catalog_snapshot(&bytes, Some(stale), &header.model_id, 0, None);
        assert!(matches!(refused, Err(SnapshotError::Stale)));
    }

    #[actix::test]
    async fn descriptors_stored_in_another_encoding_still_restart_from_the_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        // As an earlier version might have stored them: with a field this one
        // no longer has. They decode as before, but this version would encode
        // them otherwise, so only the stored bytes' own fingerprint names them.
        for name in ["gauge", "valve"] {
            let held = StoredDescriptor { origin: "runtime:r".into(), descriptor: tool(name, "an old entry") };
            let mut value = serde_json::to_value(&held).unwrap();
            value["descriptor"]["retiredField"] = serde_json::json!(1);
            store.put_descriptor_bytes(&held.descriptor.id, rmp_serde::to_vec_named(&value).unwrap());
        }
        let first = start(&store);
        assert!(!stats(&first).await.lexical_from_snapshot);
        first.indexer.send(FlushSnapshots).await.unwrap();
        drop(first);
        let second = start(&store);
        assert!(stats(&second).await.lexical_from_snapshot);
        assert_eq!(second.cell.load().lexical.len(), 2);
    }

    #[actix::test]
    async fn without_an_embedder_the_sync_completes_and_a_retry_embeds_later() {
        let dir = tempfile::tempdir().unwrap();
        let harness = start(&Store::open(dir.path()).unwrap());
        harness.down.store(true, Ordering::SeqCst);
        let report = sync(&harness, SyncCapabilities::merge("runtime:r", vec![tool("gauge", "Read a gauge")])).await;
        assert_eq!((report.added.len(), report.embedded, report.pending), (1, 0, 1));
        assert!(report.embedder_error.unwrap().ends_with("connection refused"));
        let current = harness.cell.load();
        assert!(current.catalog.get("tool:gauge").is_some() && !current.index.contains("tool:gauge"));
        let failed = harness.indexer.send(RetryEmbeddings).await.unwrap().unwrap();
        assert_eq!((failed.embedded, failed.pending), (0, 1));
        assert!(failed.embedder_error.is_some());
        harness.down.store(false, Ordering::SeqCst);
        let retried = harness.indexer.send(RetryEmbeddings).await.unwrap().unwrap();
        assert_eq!(retried, RetryReport { embedded: 1, pending: 0, embedder_error: None });
        let current = harness.cell.load();
        assert!(current.index.contains("tool:gauge"));
        assert_eq!(current.catalog.version, report.version + 1);
        let idle = harness.indexer.send(RetryEmbeddings).await.unwrap().unwrap();
        assert_eq!(idle, RetryReport::default());
        assert_eq!(stats(&harness).await.pending, 0);
    }

    #[actix::test]
    async fn conflicts_are_refused_removals_and_presets_are_applied() {
        let dir = tempfile::tempdir().unwrap();
        let mut harness = start(&Store::open(dir.path()).unwrap());
        sync(&harness, SyncCapabilities::replace(BUILTIN_ORIGIN, vec![tool("echo", "Echo text back")])).await;
        let _ = harness.events.try_recv();
        let offer = vec![tool("echo", "Another echo"), tool("valve", "Open a valve"), tool("valve", "Twice")];
        let report = sync(&harness, SyncCapabilities::merge("runtime:r", offer)).await;
        assert_eq!(report.added, vec!["tool:valve".to_string()]);
        let refused: Vec<&str> = report.conflicts.iter().map(|conflict| conflict.id.as_str()).collect();
        assert_eq!(refused, ["tool:echo", "tool:valve"]);
        let event = harness.events.try_recv().unwrap();
        assert_eq!(event.refused.len(), 2);
        assert_eq!(event.refused[0].field, "id");
        let not_held = sync(&harness, SyncCapabilities::remove("runtime:r", vec!["tool:echo".into()])).await;
        assert_eq!((not_held.removed, not_held.conflicts.len(), not_held.version), (0, 1, report.version));
        let mut change = SyncCapabilities::remove("runtime:r", vec!["tool:valve".into()]);
        change.presets = Some(vec![Preset { name: "pair".into(), capability_ids: vec!["tool:echo".into()] }]);
        let removed = sync(&harness, change).await;
        assert_eq!(
            (removed.removed_ids.clone(), removed.version),
            (vec!["tool:valve".to_string()], report.version + 1)
        );
        let current = harness.cell.load();
        assert_eq!(current.catalog.presets["runtime:r"].len(), 1);
        assert!(current.catalog.get("tool:valve").is_none() && !current.index.contains("tool:valve"));
    }

    #[actix::test]
    async fn a_batch_leaves_what_its_syncs_leave_in_turn_with_one_build() {
        let changes = || {
            let mut with_presets = SyncCapabilities::merge("runtime:b", vec![tool("pump", "Start the pump")]);
            with_presets.presets = Some(vec![Preset { name: "p".into(), capability_ids: vec!["tool:gauge".into()] }]);
            vec![
                SyncCapabilities::merge(
                    "runtime:a",
                    vec![tool("gauge", "Read the gauge"), tool("valve", "Open a valve")],
                ),
                with_presets,
                SyncCapabilities::merge("runtime:b", vec![tool("valve", "Taken by a already")]),
                SyncCapabilities::remove("runtime:a", vec!["tool:valve".into()]),
                SyncCapabilities::merge("runtime:a", vec![tool("gauge", "Read the gauge, changed")]),
            ]
        };
        let one_dir = tempfile::tempdir().unwrap();
        let mut one = start(&Store::open(one_dir.path()).unwrap());
        let mut in_turn = Vec::new();
        for change in changes() {
            in_turn.push(sync(&one, change).await);
        }
        let batch_dir = tempfile::tempdir().unwrap();
        let batch_store = Store::open(batch_dir.path()).unwrap();
        let mut batched = start(&batch_store);
        let reports = batched.indexer.send(SyncBatch(changes())).await.unwrap().unwrap();
        assert_eq!(reports.len(), in_turn.len());
        for (batch, single) in reports.iter().zip(&in_turn) {
            assert_eq!(
                (&batch.added, &batch.updated, &batch.removed_ids, batch.unchanged, &batch.conflicts),
                (&single.added, &single.updated, &single.removed_ids, single.unchanged, &single.conflicts)
            );
        }
        let (a, b) = (one.cell.load(), batched.cell.load());
        assert_eq!(a.catalog.descriptors, b.catalog.descriptors);
        assert_eq!(a.catalog.origins, b.catalog.origins);
        assert_eq!(a.catalog.presets, b.catalog.presets);
        assert_eq!((a.catalog.version, b.catalog.version), (4, 1), "one version and one build for the batch");
        assert_eq!(b.graph_version, 1);
        assert!(b.index.contains("tool:gauge") && b.index.contains("tool:pump") && !b.index.contains("tool:valve"));
        // One event per sync, as in turn.
        let count = |events: &mut UnboundedReceiver<IndexEvent>| std::iter::from_fn(|| events.try_recv().ok()).count();
        assert_eq!(count(&mut batched.events), count(&mut one.events));
        // What the batch wrote is what a restart loads.
        drop(batched);
        let reopened = start(&batch_store);
        let restored = reopened.cell.load();
        assert_eq!(restored.catalog.descriptors, a.catalog.descriptors);
        assert_eq!(restored.catalog.presets, a.catalog.presets);
    }
}
