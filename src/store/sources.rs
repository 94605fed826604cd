//! Live sources' durable state: each source's settings as the user gave
//! them (`${env:VAR}` templates unresolved, so no secret is ever stored
//! resolved) and the tools its last sync found, so a lazy source is
//! discoverable before it is started and every source comes back after a
//! restart.
//!
//! | tree | key | value |
//! |---|---|---|
//! | `sources` | source id | the source's record (`actors::sources` defines it: settings, last tools, last sync) |
//!
//! One value per source, so adding, re-syncing or removing a source is one
//! atomic insert or remove.

use super::{all, get, put, Store, StoreError};
use serde::de::DeserializeOwned;
use serde::Serialize;

const SOURCES: &str = "sources";

/// Typed access to the `sources` tree of a [`Store`].
#[derive(Clone, Debug)]
pub struct SourcesStore {
    tree: sled::Tree,
}

impl SourcesStore {
    /// Opens the `sources` tree inside an open store.
    pub fn open(store: &Store) -> Result<SourcesStore, StoreError> {
        let tree = store.db.open_tree(SOURCES).map_err(|source| StoreError::Sled {
            action: "open tree",
            tree: SOURCES,
            source,
        })?;
        Ok(SourcesStore { tree })
    }

    /// Every stored source, in id order.
    pub fn all<T: DeserializeOwned>(&self) -> Result<Vec<(String, T)>, StoreError> {
        all(&self.tree, SOURCES)
    }

    /// One stored source.
    pub fn get<T: DeserializeOwned>(&self, id: &str) -> Result<Option<T>, StoreError> {
        get(&self.tree, SOURCES, id)
    }

    /// Stores a source's record, replacing the earlier one.
    pub fn put<T: Serialize>(&self, id: &str, record: &T) -> Result<(), StoreError> {
        put(&self.tree, SOURCES, id, record)
    }

    /// Removes a source; returns whether it was there.
    pub fn remove(&self, id: &str) -> Result<bool, StoreError> {
        self.tree.remove(id.as_bytes()).map(|old| old.is_some()).map_err(|source| StoreError::Sled {
            action: "remove",
            tree: SOURCES,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Record {
        command: String,
        token: String,
    }

    #[test]
    fn records_survive_a_reopen_and_removal_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let record = Record { command: "mcp-server-time".into(), token: "${env:TOKEN}".into() };
        {
            let store = Store::open(dir.path()).unwrap();
            let sources = SourcesStore::open(&store).unwrap();
            sources.put("time", &record).unwrap();
            sources.put("git", &Record { command: "mcp-server-git".into(), token: String::new() }).unwrap();
            assert!(sources.remove("git").unwrap());
            assert!(!sources.remove("git").unwrap());
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let sources = SourcesStore::open(&store).unwrap();
        assert_eq!(sources.all::<Record>().unwrap(), vec![("time".to_string(), record)]);
        assert!(sources.get::<Record>("git").unwrap().is_none());
    }
}
