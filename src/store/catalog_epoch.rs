//! The catalog trees' epoch: what lets a restart trust the catalog snapshot
//! (`core::catalog_snapshot`) without reading the trees it caches.
//!
//! The rule, kept here for every write to the descriptor and embedding trees:
//! **once an epoch has been handed out, no catalog write lands until a newer
//! epoch has been stored before it.** An epoch is handed out to name a
//! snapshot (by the catalog's only writer, the Indexer, when its catalog in
//! memory is what the trees hold), and at every open (a file from an earlier
//! process may name the current one).
//!
//! Why an equal epoch at start means equal trees: the snapshot file naming
//! epoch `E` is written only after a flush made `E` and every write before it
//! durable. A write after `E` was handed out is preceded by storing `E + 1`,
//! on the same thread, so sled's log holds the new epoch before the write;
//! sled recovers a prefix of its log after a crash, so trees holding that
//! write hold `E + 1` too. A write that fails part way leaves the trees and
//! the catalog in memory apart: no epoch is handed out again by this process
//! (hand-outs return `None`), so no snapshot names that state.

use super::{StoreError, META};
use crate::core::catalog_snapshot::CatalogEpoch;
use std::sync::{Mutex, PoisonError};

const EPOCH_KEY: &[u8] = b"catalog_epoch";

#[derive(Debug)]
struct State {
    current: CatalogEpoch,
    handed_out: bool,
    diverged: bool,
}

#[derive(Debug)]
pub(crate) struct EpochCell {
    meta: sled::Tree,
    state: Mutex<State>,
}

impl EpochCell {
    /// Reads the stored epoch, or stores a first one (a random store id,
    /// counter 0) in a store that has none.
    pub(crate) fn open(meta: sled::Tree) -> Result<EpochCell, StoreError> {
        let stored = meta
            .get(EPOCH_KEY)
            .map_err(|source| StoreError::Sled { action: "get", tree: META, source })?
            .and_then(|bytes| CatalogEpoch::from_bytes(&bytes));
        let current = match stored {
            Some(epoch) => epoch,
            None => {
                let first = CatalogEpoch { store: random_id(), counter: 0 };
                meta.insert(EPOCH_KEY, &first.to_bytes()).map_err(|source| StoreError::Sled {
                    action: "insert",
                    tree: META,
                    source,
                })?;
                first
            }
        };
        Ok(EpochCell { meta, state: Mutex::new(State { current, handed_out: true, diverged: false }) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs one catalog write, storing a newer epoch first when the current
    /// one was handed out (the write is refused when that cannot be stored).
    pub(crate) fn write<T>(&self, write: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut state = self.lock();
        if state.handed_out {
            let next = CatalogEpoch { counter: state.current.counter.wrapping_add(1), ..state.current };
            self.meta.insert(EPOCH_KEY, &next.to_bytes()).map_err(|source| StoreError::Sled {
                action: "insert",
                tree: META,
                source,
            })?;
            state.current = next;
            state.handed_out = false;
        }
        let written = write();
        if written.is_err() {
            state.diverged = true;
        }
        written
    }

    /// The current epoch, to name a snapshot of what the trees hold now;
    /// `None` once a write failed part way in this process.
    pub(crate) fn hand_out(&self) -> Option<CatalogEpoch> {
        let mut state = self.lock();
        state.handed_out = true;
        (!state.diverged).then_some(state.current)
    }
}

/// A store id unlikely to repeat: std's random hasher keys over the time and pid.
fn random_id() -> u64 {
    use std::hash::BuildHasher;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos());
    std::collections::hash_map::RandomState::new().hash_one((now, std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(dir: &std::path::Path) -> (sled::Db, sled::Tree) {
        let db = sled::open(dir).unwrap();
        let tree = db.open_tree(META).unwrap();
        (db, tree)
    }

    fn ok() -> Result<(), StoreError> {
        Ok(())
    }

    #[test]
    fn a_write_after_a_hand_out_moves_the_epoch_once_and_a_reopen_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let (db, tree) = meta(dir.path());
        let cell = EpochCell::open(tree.clone()).unwrap();
        let first = cell.hand_out().unwrap();
        // Handed out: the same until a write.
        assert_eq!(cell.hand_out(), Some(first));
        cell.write(ok).unwrap();
        cell.write(ok).unwrap();
        let second = cell.hand_out().unwrap();
        assert_eq!((second.store, second.counter), (first.store, first.counter + 1));
        cell.write(ok).unwrap();
        let third = cell.hand_out().unwrap();
        assert_eq!(third.counter, first.counter + 2);
        drop(cell);
        // Reopened: the stored epoch, counted as handed out (an older file may name it).
        let reopened = EpochCell::open(tree).unwrap();
        assert_eq!(reopened.lock().current, third);
        reopened.write(ok).unwrap();
        assert_eq!(reopened.hand_out().unwrap().counter, third.counter + 1);
        drop(db);
    }

    #[test]
    fn two_stores_have_different_ids() {
        let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = EpochCell::open(meta(one.path()).1).unwrap().hand_out().unwrap();
        let second = EpochCell::open(meta(two.path()).1).unwrap().hand_out().unwrap();
        assert_ne!(first.store, second.store);
    }

    #[test]
    fn after_a_failed_write_no_epoch_is_handed_out_and_writes_still_move_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_db, tree) = meta(dir.path());
        let cell = EpochCell::open(tree).unwrap();
        let before = cell.hand_out().unwrap();
        let failed = cell.write(|| Err::<(), _>(StoreError::Durable { message: "disk gone".into() }));
        assert!(failed.is_err());
        assert_eq!(cell.hand_out(), None);
        cell.write(ok).unwrap();
        assert_eq!(cell.hand_out(), None);
        assert!(cell.lock().current.counter > before.counter);
    }
}
