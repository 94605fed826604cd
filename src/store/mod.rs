//! The store: capdex's durable state, on sled. The only module that imports sled.
//!
//! Trees and what they hold (values are msgpack, via rmp-serde, with named fields):
//!
//! | tree | key | value |
//! |---|---|---|
//! | `descriptors` | capability id | [`StoredDescriptor`]: origin and descriptor |
//! | `presets` | origin | its presets |
//! | `embeddings` | capability id | [`StoredEmbedding`] (model id, text hash, vector) |
//! | `kpi_windows` | scope key | [`KpiWindow`] |
//! | `dispatch_results` | idempotency key | the reply first given for it |
//! | `scg_sources`, `scg_links` | see [`scg`] | the Source Capability Graph |
//!
//! Guarantees: a write returns after sled has it in its page cache; callers
//! that promise durability (dispatch results, acknowledged outcomes) call
//! [`Store::flush`] before acknowledging.

pub mod scg;

use crate::core::descriptor::CapabilityDescriptor;
use crate::core::graph::Preset;
use crate::core::kpi_window::KpiWindow;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A store operation that failed, naming what was attempted.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("failed to open store at {path}: {source}")]
    Open { path: PathBuf, source: sled::Error },
    #[error("failed to {action} in tree {tree}: {source}")]
    Sled { action: &'static str, tree: &'static str, source: sled::Error },
    #[error("failed to encode a value for tree {tree}: {source}")]
    Encode { tree: &'static str, source: rmp_serde::encode::Error },
    #[error("failed to decode key {key:?} of tree {tree}: {source}")]
    Decode { tree: &'static str, key: String, source: rmp_serde::decode::Error },
}

/// A descriptor as stored, with the origin that holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredDescriptor {
    pub origin: String,
    pub descriptor: CapabilityDescriptor,
}

/// An embedding as stored: valid while model and text hash still match.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredEmbedding {
    pub model_id: String,
    pub text_hash: String,
    pub vector: Vec<f32>,
}

const DESCRIPTORS: &str = "descriptors";
const EMBEDDINGS: &str = "embeddings";
const KPI_WINDOWS: &str = "kpi_windows";
const PRESETS: &str = "presets";
const DISPATCH_RESULTS: &str = "dispatch_results";

/// Typed access to capdex's sled database. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    db: sled::Db,
    descriptors: sled::Tree,
    embeddings: sled::Tree,
    kpi_windows: sled::Tree,
    dispatch_results: sled::Tree,
    presets: sled::Tree,
}

impl Store {
    /// Opens (or creates) the store under `dir`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let open_err = |source| StoreError::Open { path: dir.to_path_buf(), source };
        let db = sled::Config::new().path(dir).open().map_err(open_err)?;
        let tree = |name: &'static str| db.open_tree(name).map_err(open_err);
        Ok(Store {
            descriptors: tree(DESCRIPTORS)?,
            embeddings: tree(EMBEDDINGS)?,
            kpi_windows: tree(KPI_WINDOWS)?,
            dispatch_results: tree(DISPATCH_RESULTS)?,
            presets: tree(PRESETS)?,
            db,
        })
    }

    /// Returns every stored descriptor with its origin, in id order.
    pub fn descriptors(&self) -> Result<Vec<StoredDescriptor>, StoreError> {
        all(&self.descriptors, DESCRIPTORS).map(|rows| rows.into_iter().map(|(_, d)| d).collect())
    }

    pub fn put_descriptor(&self, origin: &str, descriptor: &CapabilityDescriptor) -> Result<(), StoreError> {
        put(
            &self.descriptors,
            DESCRIPTORS,
            &descriptor.id,
            &StoredDescriptor { origin: origin.to_string(), descriptor: descriptor.clone() },
        )
    }

    /// Returns every origin's presets.
    pub fn presets(&self) -> Result<Vec<(String, Vec<Preset>)>, StoreError> {
        all(&self.presets, PRESETS)
    }

    /// Stores an origin's presets; an empty list removes them.
    pub fn put_presets(&self, origin: &str, presets: &[Preset]) -> Result<(), StoreError> {
        if presets.is_empty() {
            self.presets.remove(origin).map_err(|source| StoreError::Sled {
                action: "remove",
                tree: PRESETS,
                source,
            })?;
            return Ok(());
        }
        put(&self.presets, PRESETS, origin, &presets.to_vec())
    }

    /// Removes a descriptor and its embedding.
    pub fn remove_capability(&self, id: &str) -> Result<(), StoreError> {
        self.descriptors.remove(id).map_err(|source| StoreError::Sled {
            action: "remove",
            tree: DESCRIPTORS,
            source,
        })?;
        self.embeddings.remove(id).map_err(|source| StoreError::Sled { action: "remove", tree: EMBEDDINGS, source })?;
        Ok(())
    }

    pub fn embedding(&self, id: &str) -> Result<Option<StoredEmbedding>, StoreError> {
        get(&self.embeddings, EMBEDDINGS, id)
    }

    pub fn put_embedding(&self, id: &str, embedding: &StoredEmbedding) -> Result<(), StoreError> {
        put(&self.embeddings, EMBEDDINGS, id, embedding)
    }

    /// Returns every stored KPI window by scope key.
    pub fn kpi_windows(&self) -> Result<Vec<(String, KpiWindow)>, StoreError> {
        all(&self.kpi_windows, KPI_WINDOWS)
    }

    pub fn put_kpi_window(&self, scope_key: &str, window: &KpiWindow) -> Result<(), StoreError> {
        put(&self.kpi_windows, KPI_WINDOWS, scope_key, window)
    }

    pub fn dispatch_result<T: DeserializeOwned>(&self, idempotency_key: &str) -> Result<Option<T>, StoreError> {
        get(&self.dispatch_results, DISPATCH_RESULTS, idempotency_key)
    }

    pub fn put_dispatch_result<T: Serialize>(&self, idempotency_key: &str, result: &T) -> Result<(), StoreError> {
        put(&self.dispatch_results, DISPATCH_RESULTS, idempotency_key, result)
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(|_| ()).map_err(|source| StoreError::Sled { action: "flush", tree: "(all)", source })
    }
}

fn put<T: Serialize>(tree: &sled::Tree, name: &'static str, key: &str, value: &T) -> Result<(), StoreError> {
    let bytes = rmp_serde::to_vec_named(value).map_err(|source| StoreError::Encode { tree: name, source })?;
    tree.insert(key.as_bytes(), bytes).map_err(|source| StoreError::Sled { action: "insert", tree: name, source })?;
    Ok(())
}

fn get<T: DeserializeOwned>(tree: &sled::Tree, name: &'static str, key: &str) -> Result<Option<T>, StoreError> {
    let Some(bytes) =
        tree.get(key.as_bytes()).map_err(|source| StoreError::Sled { action: "get", tree: name, source })?
    else {
        return Ok(None);
    };
    rmp_serde::from_slice(&bytes).map(Some).map_err(|source| StoreError::Decode {
        tree: name,
        key: key.to_string(),
        source,
    })
}

fn all<T: DeserializeOwned>(tree: &sled::Tree, name: &'static str) -> Result<Vec<(String, T)>, StoreError> {
    let mut rows = Vec::new();
    for entry in tree.iter() {
        let (key, bytes) = entry.map_err(|source| StoreError::Sled { action: "iterate", tree: name, source })?;
        let key = String::from_utf8_lossy(&key).into_owned();
        let value = rmp_serde::from_slice(&bytes).map_err(|source| StoreError::Decode {
            tree: name,
            key: key.clone(),
            source,
        })?;
        rows.push((key, value));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dispatch_rules::Builtin;
    use crate::core::kpi_window::{OutcomeStatus, Sample};

    #[test]
    fn values_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let descriptor = Builtin::Echo.descriptor();
        let embedding = StoredEmbedding { model_id: "m".into(), text_hash: "h".into(), vector: vec![0.5, -0.5] };
        let mut window = KpiWindow::new(3).unwrap();
        window.push(Sample::new(Some(OutcomeStatus::Success), None, 1).unwrap());
        {
            let store = Store::open(dir.path()).unwrap();
            store.put_descriptor("builtin", &descriptor).unwrap();
            store
                .put_presets("runtime:a", &[Preset { name: "p".into(), capability_ids: vec!["tool:echo".into()] }])
                .unwrap();
            store.put_embedding(&descriptor.id, &embedding).unwrap();
            store.put_kpi_window("global", &window).unwrap();
            store.put_dispatch_result("k1", &serde_json::json!({"text": "hi"})).unwrap();
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store.descriptors().unwrap(),
            vec![StoredDescriptor { origin: "builtin".into(), descriptor: descriptor.clone() }]
        );
        assert_eq!(store.presets().unwrap()[0].1[0].name, "p");
        assert_eq!(store.embedding(&descriptor.id).unwrap(), Some(embedding));
        assert_eq!(store.kpi_windows().unwrap(), vec![("global".to_string(), window)]);
        assert_eq!(store.dispatch_result::<serde_json::Value>("k1").unwrap(), Some(serde_json::json!({"text": "hi"})));
        store.remove_capability(&descriptor.id).unwrap();
        assert!(store.descriptors().unwrap().is_empty());
        assert_eq!(store.embedding(&descriptor.id).unwrap(), None);
    }

    #[test]
    fn garbage_decodes_to_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.embeddings.insert("x", &b"\xff\x00garbage"[..]).unwrap();
        assert!(matches!(store.embedding("x"), Err(StoreError::Decode { .. })));
    }
}
