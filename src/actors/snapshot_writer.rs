//! Writes the restart snapshots off the Indexer's thread: the lexical index's
//! (`core::lexical`'s snapshot module) and the catalog's
//! (`core::catalog_snapshot`: descriptors and vectors). The newest catalog
//! offered is written once changes have stopped for [`QUIET`], or at once
//! when asked to flush.
//!
//! The Indexer offers every catalog it publishes; a lexical index already
//! written is not written again, nor a catalog whose store epoch was, and an
//! offer replaces an older one still waiting, so a burst of changes costs one
//! write of each. A write that fails is logged and dropped: the next restart
//! reads the store and builds the index, as it would without the files.

use crate::core::catalog::Catalog;
use crate::core::catalog_snapshot::{self, CatalogEpoch, CatalogSnapshotHeader};
use crate::core::index::VectorIndex;
use crate::core::lexical::snapshot::Fingerprint;
use crate::core::lexical::LexicalIndex;
use crate::store::Store;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long the catalog must stay unchanged before its snapshot is written.
pub const QUIET: Duration = Duration::from_secs(2);

/// A catalog offered for writing, with its indexes.
struct Offer {
    catalog: Arc<Catalog>,
    index: Arc<VectorIndex>,
    lexical: Arc<LexicalIndex>,
    /// The store's catalog epoch the catalog is (`None`: no catalog snapshot).
    epoch: Option<CatalogEpoch>,
    /// When it was offered.
    at: Instant,
    /// The fingerprint of its stored descriptors, when the offer knew it.
    made_from: Option<Fingerprint>,
}

#[derive(Default)]
struct State {
    /// The newest offer not yet written.
    pending: Option<Offer>,
    /// The generation of the last lexical index written (or being written).
    written: u64,
    /// The epoch of the last catalog written (or being written).
    written_epoch: Option<CatalogEpoch>,
    writing: bool,
    flush: bool,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The writer thread's handle: dropping it writes what is pending and ends the thread.
pub struct SnapshotWriter {
    shared: Arc<Shared>,
    model_id: Arc<str>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SnapshotWriter {
    /// Starts the writer over `store`, for vectors of `model_id`. `written`
    /// is the generation of a lexical index and `written_epoch` the epoch of
    /// a catalog the files already hold (loaded from them), so they are not
    /// written again.
    pub fn start(store: Store, model_id: &str, written: u64, written_epoch: Option<CatalogEpoch>) -> SnapshotWriter {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { written, written_epoch, ..State::default() }),
            changed: Condvar::new(),
        });
        let model_id: Arc<str> = model_id.into();
        let thread = std::thread::Builder::new()
            .name("capdex-snapshots".into())
            .spawn({
                let (shared, model_id) = (shared.clone(), model_id.clone());
                move || run(&shared, &store, &model_id)
            })
            .map_err(|err| tracing::warn!(%err, "the snapshot writer did not start; restarts read the store"))
            .ok();
        SnapshotWriter { shared, model_id, thread }
    }

    /// The embedding model whose vectors the catalog snapshot holds.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// Offers `catalog` and its indexes to be written once changes stop,
    /// `epoch` naming the store state it is (the store's hand-out, or `None`);
    /// the fingerprint the files name is computed from `catalog` with the
    /// store's encoding.
    pub fn offer(
        &self,
        catalog: Arc<Catalog>,
        index: Arc<VectorIndex>,
        lexical: Arc<LexicalIndex>,
        epoch: Option<CatalogEpoch>,
    ) {
        self.offer_made_from(catalog, index, lexical, epoch, None);
    }

    /// Like [`SnapshotWriter::offer`], naming `made_from` when given: the
    /// fingerprint the store gave for the very bytes the catalog was read
    /// from (at start), which stays right even for descriptors stored by an
    /// earlier version in an encoding this one would not write.
    pub fn offer_made_from(
        &self,
        catalog: Arc<Catalog>,
        index: Arc<VectorIndex>,
        lexical: Arc<LexicalIndex>,
        epoch: Option<CatalogEpoch>,
        made_from: Option<Fingerprint>,
    ) {
        let mut state = self.shared.lock();
        let epoch_written = epoch.is_none() || state.written_epoch == epoch;
        if state.written == lexical.generation() && epoch_written {
            return;
        }
        // The same index offered again (a catalog version that changed only
        // vectors) keeps the fingerprint its first offer knew.
        let made_from = made_from.or_else(|| {
            let pending = state.pending.as_ref()?;
            (pending.lexical.generation() == lexical.generation()).then_some(pending.made_from)?
        });
        state.pending = Some(Offer { catalog, index, lexical, epoch, at: Instant::now(), made_from });
        self.shared.changed.notify_all();
    }

    /// Writes what is pending now, and returns once nothing is pending or being written.
    pub fn flush(&self) {
        if self.thread.is_none() {
            return;
        }
        let mut state = self.shared.lock();
        state.flush = true;
        self.shared.changed.notify_all();
        while state.pending.is_some() || state.writing {
            state = self.shared.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        state.flush = false;
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        self.flush();
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(shared: &Shared, store: &Store, model_id: &str) {
    let mut state = shared.lock();
    loop {
        if state.stop {
            return;
        }
        let Some(Offer { at: offered, .. }) = &state.pending else {
            state = shared.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
            continue;
        };
        let waited = offered.elapsed();
        if waited < QUIET && !state.flush && !state.stop {
            state = shared.changed.wait_timeout(state, QUIET - waited).unwrap_or_else(PoisonError::into_inner).0;
            continue;
        }
        let Offer { catalog, index, lexical, epoch, made_from, .. } = state.pending.take().expect("checked above");
        let lexical_due = state.written != lexical.generation();
        let catalog_due = epoch.filter(|epoch| state.written_epoch != Some(*epoch));
        state.written = lexical.generation();
        state.written_epoch = epoch.or(state.written_epoch);
        state.writing = true;
        drop(state);
        // A write that panicked must still end `writing`, or a flush (and the
        // drop at shutdown) would wait for it for ever.
        let wrote = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let job = Job { catalog: &catalog, index: &index, lexical: &lexical, made_from, model_id };
            write(store, &job, lexical_due, catalog_due);
        }));
        if wrote.is_err() {
            tracing::error!("writing the snapshots panicked; the next restart reads the store");
        }
        state = shared.lock();
        state.writing = false;
        shared.changed.notify_all();
    }
}

/// What one write works from.
struct Job<'a> {
    catalog: &'a Catalog,
    index: &'a VectorIndex,
    lexical: &'a LexicalIndex,
    made_from: Option<Fingerprint>,
    model_id: &'a str,
}

/// Writes the lexical snapshot when `lexical_due`, and the catalog snapshot
/// naming `catalog_due` when given, both naming the stored bytes of the
/// catalog's descriptors (`made_from`, or computed from the catalog).
fn write(store: &Store, job: &Job<'_>, lexical_due: bool, catalog_due: Option<CatalogEpoch>) {
    let started = Instant::now();
    let catalog = job.catalog;
    let held = || {
        catalog
            .descriptors
            .iter()
            .map(|(id, descriptor)| (catalog.origins.get(id).map_or("", String::as_str), descriptor))
    };
    let fingerprint = match job.made_from {
        Some(fingerprint) => fingerprint,
        None => match Store::descriptor_fingerprint(held()) {
            Ok(fingerprint) => fingerprint,
            Err(err) => {
                tracing::warn!(%err, "the snapshots were not written; the next restart reads the store");
                return;
            }
        },
    };
    if lexical_due {
        match store.write_lexical_snapshot(&job.lexical.encode_snapshot(fingerprint)) {
            Ok(()) => tracing::debug!(
                capabilities = job.lexical.len(),
                ms = started.elapsed().as_millis() as u64,
                "lexical snapshot written"
            ),
            Err(err) => tracing::warn!(%err, "the lexical snapshot was not written; the next restart builds the index"),
        }
    }
    if let Some(epoch) = catalog_due {
        let header = CatalogSnapshotHeader { epoch, made_from: fingerprint, model_id: job.model_id.to_string() };
        let written = catalog_snapshot::encode(&header, held(), job.index)
            .map_err(|err| err.to_string())
            .and_then(|bytes| store.write_catalog_snapshot(&bytes).map_err(|err| err.to_string()));
        match written {
            Ok(()) => tracing::debug!(
                capabilities = catalog.len(),
                ms = started.elapsed().as_millis() as u64,
                "catalog snapshot written"
            ),
            Err(err) => tracing::warn!(%err, "the catalog snapshot was not written; the next restart reads the store"),
        }
    }
}
