//! The Source Capability Graph's durable state: one record per mapped source and
//! the cross-source links computed over all of them.
//!
//! | tree | key | value |
//! |---|---|---|
//! | `scg_sources` | source id | [`StoredSource`]: the whole graph, its workspaces, when it was mapped |
//! | `scg_links` | `all` | [`StoredLinks`]: RESOLVES_TO and CONSUMES across sources, with the drift hashes they were computed from |
//! | `scg_memory` | note id | a memory [`Note`] (polarity, anchors, labels, deposit times) |
//!
//! A source's graph is one value, so re-mapping replaces its old nodes, edges and
//! recipes in one atomic insert. Links name the drift hashes they were computed
//! from; readers recompute them when those no longer match ([`StoredLinks::is_current`]).

use super::{all, get, put, Store, StoreError};
use crate::core::scg::align::Links;
use crate::core::scg::memory::Note;
pub use crate::core::scg::model::StoredSource;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

const SCG_SOURCES: &str = "scg_sources";
const SCG_LINKS: &str = "scg_links";
const LINKS_KEY: &str = "all";
const SCG_MEMORY: &str = "scg_memory";

/// Cross-source links and the sources (id → drift hash) they were computed from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredLinks {
    pub links: Links,
    pub computed_from: BTreeMap<String, String>,
}

impl StoredLinks {
    /// Returns whether these links were computed from exactly these sources at these drift hashes.
    pub fn is_current(&self, sources: &[StoredSource]) -> bool {
        let now: BTreeMap<String, String> =
            sources.iter().map(|source| (source.graph.source_id.clone(), source.graph.drift_hash.clone())).collect();
        now == self.computed_from
    }
}

/// Typed access to the SCG trees of a [`Store`].
#[derive(Clone, Debug)]
pub struct ScgStore {
    store: Store,
    sources: sled::Tree,
    links: sled::Tree,
    memory: sled::Tree,
}

impl ScgStore {
    /// Opens the SCG trees inside an open store.
    pub fn open(store: &Store) -> Result<ScgStore, StoreError> {
        let tree = |name: &'static str| {
            store.db.open_tree(name).map_err(|source| StoreError::Sled { action: "open tree", tree: name, source })
        };
        Ok(ScgStore {
            sources: tree(SCG_SOURCES)?,
            links: tree(SCG_LINKS)?,
            memory: tree(SCG_MEMORY)?,
            store: store.clone(),
        })
    }

    /// Returns every mapped source, in id order.
    pub fn sources(&self) -> Result<Vec<StoredSource>, StoreError> {
        all(&self.sources, SCG_SOURCES).map(|rows| rows.into_iter().map(|(_, source)| source).collect())
    }

    /// Returns one mapped source.
    pub fn source(&self, source_id: &str) -> Result<Option<StoredSource>, StoreError> {
        get(&self.sources, SCG_SOURCES, source_id)
    }

    /// Stores a source, replacing any earlier map of it in one insert.
    pub fn put_source(&self, source: &StoredSource) -> Result<(), StoreError> {
        put(&self.sources, SCG_SOURCES, &source.graph.source_id, source)
    }

    /// Removes a source; returns whether it was there.
    pub fn remove_source(&self, source_id: &str) -> Result<bool, StoreError> {
        self.sources.remove(source_id).map(|old| old.is_some()).map_err(|source| StoreError::Sled {
            action: "remove",
            tree: SCG_SOURCES,
            source,
        })
    }

    /// Returns the stored links, if any.
    pub fn links(&self) -> Result<Option<StoredLinks>, StoreError> {
        get(&self.links, SCG_LINKS, LINKS_KEY)
    }

    /// Stores the links.
    pub fn put_links(&self, links: &StoredLinks) -> Result<(), StoreError> {
        put(&self.links, SCG_LINKS, LINKS_KEY, links)
    }

    /// Returns every memory note, in id order.
    pub fn notes(&self) -> Result<Vec<Note>, StoreError> {
        all(&self.memory, SCG_MEMORY).map(|rows| rows.into_iter().map(|(_, note)| note).collect())
    }

    /// Returns one memory note.
    pub fn note(&self, id: &str) -> Result<Option<Note>, StoreError> {
        get(&self.memory, SCG_MEMORY, id)
    }

    /// Stores a memory note under its id, replacing the one it merged.
    pub fn put_note(&self, note: &Note) -> Result<(), StoreError> {
        put(&self.memory, SCG_MEMORY, &note.id, note)
    }

    /// Removes a memory note; returns whether it was there.
    pub fn remove_note(&self, id: &str) -> Result<bool, StoreError> {
        self.memory.remove(id).map(|old| old.is_some()).map_err(|source| StoreError::Sled {
            action: "remove",
            tree: SCG_MEMORY,
            source,
        })
    }

    /// The memory notes' entries and bytes (keys and values).
    pub fn memory_size(&self) -> Result<crate::core::retention::StoreSize, StoreError> {
        super::retention::measure_tree(&self.memory, SCG_MEMORY)
    }

    /// Flushes to disk.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.store.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scg::map_source;

    #[test]
    fn sources_and_links_survive_a_reopen_and_remaps_replace() {
        let dir = tempfile::tempdir().unwrap();
        let first = map_source("db", None, "CREATE TABLE a (x INT, y INT);").unwrap();
        let second = map_source("db", None, "CREATE TABLE a (x INT);").unwrap();
        {
            let scg = ScgStore::open(&Store::open(dir.path()).unwrap()).unwrap();
            let stored = StoredSource { graph: first.clone(), workspaces: vec!["ws".into()], mapped_at_ms: 1 };
            scg.put_source(&stored).unwrap();
            scg.put_source(&StoredSource { graph: second.clone(), ..stored }).unwrap();
            let links = StoredLinks {
                links: Links::default(),
                computed_from: [("db".to_string(), second.drift_hash.clone())].into(),
            };
            scg.put_links(&links).unwrap();
            scg.flush().unwrap();
        }
        let scg = ScgStore::open(&Store::open(dir.path()).unwrap()).unwrap();
        let sources = scg.sources().unwrap();
        assert_eq!(sources.len(), 1);
        assert_eq!(sources[0].graph, second);
        assert_eq!(sources[0].workspaces, ["ws"]);
        assert!(scg.links().unwrap().unwrap().is_current(&sources));
        assert!(scg.remove_source("db").unwrap());
        let deposit = crate::core::scg::memory::Deposit {
            content: "x".into(),
            polarity: crate::core::scg::memory::Polarity::DeadEnd,
            anchors: vec!["db#a".into()],
            label: "session:s".into(),
        };
        let note = crate::core::scg::memory::merge(None, &deposit, &["db#a".into()], 5);
        scg.put_note(&note).unwrap();
        assert_eq!(scg.note(&note.id).unwrap(), Some(note.clone()));
        assert_eq!(scg.notes().unwrap(), std::slice::from_ref(&note));
        assert!(scg.remove_note(&note.id).unwrap());
        assert!(!scg.remove_note(&note.id).unwrap(), "already gone");
        assert_eq!(scg.notes().unwrap(), []);
        assert!(!scg.links().unwrap().unwrap().is_current(&scg.sources().unwrap()));
    }
}
