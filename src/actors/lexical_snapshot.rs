//! Writes the lexical index's snapshot (`core::lexical`'s snapshot module)
//! off the Indexer's thread: the newest index offered is written once
//! changes have stopped for [`QUIET`], or at once when asked to flush.
//!
//! The Indexer offers every index it publishes; an index already written is
//! not written again, and an offer replaces an older one still waiting, so a
//! burst of changes costs one write. A write that fails is logged and
//! dropped: the next restart builds the index, as it would without a file.

use crate::core::catalog::Catalog;
use crate::core::lexical::LexicalIndex;
use crate::store::Store;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long the catalog must stay unchanged before its snapshot is written.
pub const QUIET: Duration = Duration::from_secs(2);

#[derive(Default)]
struct State {
    /// The newest offer not yet written, and when it came.
    pending: Option<(Arc<Catalog>, Arc<LexicalIndex>, Instant)>,
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

    /// Offers the index of `catalog` to be written once changes stop.
    pub fn offer(&self, catalog: Arc<Catalog>, lexical: Arc<LexicalIndex>) {
        let mut state = self.shared.lock();
        if state.written == lexical.generation() {
            return;
        }
        state.pending = Some((catalog, lexical, Instant::now()));
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
        let Some((_, _, offered)) = &state.pending else {
            state = shared.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
            continue;
        };
        let waited = offered.elapsed();
        if waited < QUIET && !state.flush && !state.stop {
            state = shared.changed.wait_timeout(state, QUIET - waited).unwrap_or_else(PoisonError::into_inner).0;
            continue;
        }
        let (catalog, lexical, _) = state.pending.take().expect("checked above");
        state.written = lexical.generation();
        state.writing = true;
        drop(state);
        write(store, &catalog, &lexical);
        state = shared.lock();
        state.writing = false;
        shared.changed.notify_all();
    }
}

/// Writes `lexical`'s snapshot, naming the stored bytes of `catalog`'s descriptors.
fn write(store: &Store, catalog: &Catalog, lexical: &LexicalIndex) {
    let started = Instant::now();
    let held = catalog
        .descriptors
        .iter()
        .map(|(id, descriptor)| (catalog.origins.get(id).map_or("", String::as_str), descriptor));
    let written = Store::descriptor_fingerprint(held)
        .and_then(|fingerprint| store.write_lexical_snapshot(&lexical.encode_snapshot(fingerprint)));
    match written {
        Ok(()) => tracing::debug!(
            capabilities = lexical.len(),
            ms = started.elapsed().as_millis() as u64,
            "lexical snapshot written"
        ),
        Err(err) => tracing::warn!(%err, "the lexical snapshot was not written; the next restart builds the index"),
    }
}
