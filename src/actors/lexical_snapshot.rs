//! Writes the lexical index's snapshot (`core::lexical`'s snapshot module)
//! off the Indexer's thread: the newest index offered is written once
//! changes have stopped for [`QUIET`], or at once when asked to flush.
//!
//! The Indexer offers every index it publishes; an index already written is
//! not written again, and an offer replaces an older one still waiting, so a
//! burst of changes costs one write. A write that fails is logged and
//! dropped: the next restart builds the index, as it would without a file.

use crate::core::catalog::Catalog;
use crate::core::lexical::snapshot::Fingerprint;
use crate::core::lexical::LexicalIndex;
use crate::store::Store;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long the catalog must stay unchanged before its snapshot is written.
pub const QUIET: Duration = Duration::from_secs(2);

/// An index offered for writing, with its catalog.
struct Offer {
    catalog: Arc<Catalog>,
    lexical: Arc<LexicalIndex>,
    /// When it was offered.
    at: Instant,
    /// The fingerprint of its stored descriptors, when the offer knew it.
    made_from: Option<Fingerprint>,
}

#[derive(Default)]
struct State {
    /// The newest offer not yet written.
    pending: Option<Offer>,
    /// The generation of the last index written (or being written).
    written: u64,
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
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SnapshotWriter {
    /// Starts the writer over `store`; `written` is the generation of an index
    /// the file already holds (loaded from it), so it is not written again.
    pub fn start(store: Store, written: u64) -> SnapshotWriter {
        let shared =
            Arc::new(Shared { state: Mutex::new(State { written, ..State::default() }), changed: Condvar::new() });
        let thread = std::thread::Builder::new()
            .name("capdex-lexical-snapshot".into())
            .spawn({
                let shared = shared.clone();
                move || run(&shared, &store)
            })
            .map_err(|err| tracing::warn!(%err, "the lexical snapshot writer did not start; restarts build the index"))
            .ok();
        SnapshotWriter { shared, thread }
    }

    /// Offers the index of `catalog` to be written once changes stop; the
    /// fingerprint it names is computed from `catalog` with the store's encoding.
    pub fn offer(&self, catalog: Arc<Catalog>, lexical: Arc<LexicalIndex>) {
        self.offer_made_from(catalog, lexical, None);
    }

    /// Like [`SnapshotWriter::offer`], naming `made_from` when given: the
    /// fingerprint the store gave for the very bytes the index was built from
    /// (at start), which stays right even for descriptors stored by an
    /// earlier version in an encoding this one would not write.
    pub fn offer_made_from(&self, catalog: Arc<Catalog>, lexical: Arc<LexicalIndex>, made_from: Option<Fingerprint>) {
        let mut state = self.shared.lock();
        if state.written == lexical.generation() {
            return;
        }
        // The same index offered again (a catalog version that changed only
        // vectors) keeps the fingerprint its first offer knew.
        let made_from = made_from.or_else(|| {
            let pending = state.pending.as_ref()?;
            (pending.lexical.generation() == lexical.generation()).then_some(pending.made_from)?
        });
        state.pending = Some(Offer { catalog, lexical, at: Instant::now(), made_from });
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

fn run(shared: &Shared, store: &Store) {
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
        let Offer { catalog, lexical, made_from, .. } = state.pending.take().expect("checked above");
        state.written = lexical.generation();
        state.writing = true;
        drop(state);
        // A write that panicked must still end `writing`, or a flush (and the
        // drop at shutdown) would wait for it for ever.
        let wrote = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            write(store, &catalog, &lexical, made_from);
        }));
        if wrote.is_err() {
            tracing::error!("writing the lexical snapshot panicked; the next restart builds the index");
        }
        state = shared.lock();
        state.writing = false;
        shared.changed.notify_all();
    }
}

/// Writes `lexical`'s snapshot, naming the stored bytes of `catalog`'s
/// descriptors (`made_from`, or computed from `catalog`).
fn write(store: &Store, catalog: &Catalog, lexical: &LexicalIndex, made_from: Option<Fingerprint>) {
    let started = Instant::now();
    let held = catalog
        .descriptors
        .iter()
        .map(|(id, descriptor)| (catalog.origins.get(id).map_or("", String::as_str), descriptor));
    let fingerprint = match made_from {
        Some(fingerprint) => Ok(fingerprint),
        None => Store::descriptor_fingerprint(held),
    };
    let written =
        fingerprint.and_then(|fingerprint| store.write_lexical_snapshot(&lexical.encode_snapshot(fingerprint)));
    match written {
        Ok(()) => tracing::debug!(
            capabilities = lexical.len(),
            ms = started.elapsed().as_millis() as u64,
            "lexical snapshot written"
        ),
        Err(err) => tracing::warn!(%err, "the lexical snapshot was not written; the next restart builds the index"),
    }
}
