//! The store: capdex's durable state, on sled. The only module that imports sled.
//!
//! Trees and what they hold (values are msgpack, via rmp-serde, with named fields):
//!
//! | tree | key | value |
//! |---|---|---|
//! | `descriptors` | capability id | [`StoredDescriptor`]: origin and descriptor |
//! | `presets` | origin | its presets |
//! | `embeddings` | capability id | [`StoredEmbedding`] (model id, text hash, vector) |
//! | `kpi` | `w\0<scope>\0<seq, 8 bytes big-endian>` | one KPI [`Sample`] of the scope's window |
//! | `kpi` | `m\0<scope>` | the scope's [`ScopeMeta`] (alert and adaptive state) |
//! | `dispatch_results` | idempotency key | the reply first given for it |
//! | `scg_sources`, `scg_links` | see [`scg`] | the Source Capability Graph |
//! | `dispatch_*` | see [`dispatch`] | registry, bindings, approvals, re-drive cache, provenance |
//!
//! A KPI window is stored as one key per sample, numbered in arrival order,
//! so a restart reads every window back in order; each outcome appends its
//! sample, stores the scope's meta if it changed, and removes evicted samples,
//! in that order (see [`Store::write_kpi`] for why every crash prefix is sound).
//!
//! Guarantees: a write returns after sled has it in its page cache; callers
//! that promise durability (dispatch results, acknowledged outcomes) call
//! [`Store::flush`] or await [`Store::durable`] (group commit) before acknowledging.

pub mod dispatch;
pub mod scg;

use crate::core::descriptor::CapabilityDescriptor;
mod group_flush;

use crate::core::graph::Preset;
use crate::core::kpi_window::{Sample, ScopeMeta};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    #[error("failed to make writes durable: {message}")]
    Durable { message: String },
    #[error("malformed key {key:?} in tree {tree}")]
    Key { tree: &'static str, key: String },
}

/// Resolves once the writes made before [`Store::durable`] was called are durable.
#[derive(Debug)]
#[must_use = "a write is durable only once this resolves"]
pub struct Durable {
    receiver: futures::channel::oneshot::Receiver<Result<(), String>>,
}

impl std::future::Future for Durable {
    type Output = Result<(), StoreError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.receiver).poll(cx).map(|received| match received {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(StoreError::Durable { message }),
            Err(_) => Err(StoreError::Durable { message: "the flush thread stopped".into() }),
        })
    }
}

/// One scope's window as stored: samples with their sequence numbers, oldest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredScope {
    pub scope_key: String,
    pub samples: Vec<(u64, Sample)>,
    pub meta: Option<ScopeMeta>,
}

/// One outcome's change to a scope, applied by [`Store::write_kpi`].
#[derive(Clone, Debug)]
pub struct KpiWrite<'a> {
    pub scope_key: &'a str,
    /// The new sample and its sequence number.
    pub append: Option<(u64, &'a Sample)>,
    /// Sequence numbers of samples that left the window.
    pub remove: &'a [u64],
    /// The scope's new meta, when it changed.
    pub meta: Option<&'a ScopeMeta>,
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
const PRESETS: &str = "presets";
const KPI: &str = "kpi";
const DISPATCH_RESULTS: &str = "dispatch_results";

/// Typed access to capdex's sled database. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    db: sled::Db,
    descriptors: sled::Tree,
    embeddings: sled::Tree,
    kpi: sled::Tree,
    dispatch_results: sled::Tree,
    presets: sled::Tree,
    dispatch: dispatch::DispatchTrees,
    group_flush: Arc<group_flush::GroupFlush>,
}

impl Store {
    /// Opens (or creates) the store under `dir`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let open_err = |source| StoreError::Open { path: dir.to_path_buf(), source };
        // HighThroughput: capdex's steady load is small writes (one per outcome)
        // behind frequent flushes; benches/kpi.rs measured it faster than the default.
        let db = sled::Config::new().path(dir).mode(sled::Mode::HighThroughput).open().map_err(open_err)?;
        let tree = |name: &'static str| db.open_tree(name).map_err(open_err);
        Ok(Store {
            descriptors: tree(DESCRIPTORS)?,
            embeddings: tree(EMBEDDINGS)?,
            kpi: tree(KPI)?,
            dispatch_results: tree(DISPATCH_RESULTS)?,
            presets: tree(PRESETS)?,
            dispatch: dispatch::DispatchTrees::open(&db).map_err(open_err)?,
            group_flush: Arc::new(group_flush::GroupFlush::start(db.clone())),
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

    /// Returns every stored KPI scope, in scope-key order, samples oldest first.
    pub fn kpi_scopes(&self) -> Result<Vec<StoredScope>, StoreError> {
        let mut scopes: Vec<StoredScope> = Vec::new();
        let scope_of = |scopes: &mut Vec<StoredScope>, scope_key: &str| -> usize {
            match scopes.binary_search_by(|scope| scope.scope_key.as_str().cmp(scope_key)) {
                Ok(at) => at,
                Err(at) => {
                    scopes.insert(at, StoredScope { scope_key: scope_key.to_string(), ..Default::default() });
                    at
                }
            }
        };
        for entry in self.kpi.iter() {
            let (key, bytes) = entry.map_err(|source| StoreError::Sled { action: "iterate", tree: KPI, source })?;
            let bad_key = || StoreError::Key { tree: KPI, key: String::from_utf8_lossy(&key).into_owned() };
            let decode_err =
                |source| StoreError::Decode { tree: KPI, key: String::from_utf8_lossy(&key).into_owned(), source };
            match key.split_first() {
                Some((b'w', rest)) if rest.len() > 9 && rest[0] == 0 && rest[rest.len() - 9] == 0 => {
                    let scope_key = std::str::from_utf8(&rest[1..rest.len() - 9]).map_err(|_| bad_key())?;
                    let seq = u64::from_be_bytes(rest[rest.len() - 8..].try_into().map_err(|_| bad_key())?);
                    let sample: Sample = rmp_serde::from_slice(&bytes).map_err(decode_err)?;
                    let at = scope_of(&mut scopes, scope_key);
                    scopes[at].samples.push((seq, sample));
                }
                Some((b'm', rest)) if rest.first() == Some(&0) => {
                    let scope_key = std::str::from_utf8(&rest[1..]).map_err(|_| bad_key())?;
                    let meta: ScopeMeta = rmp_serde::from_slice(&bytes).map_err(decode_err)?;
                    let at = scope_of(&mut scopes, scope_key);
                    scopes[at].meta = Some(meta);
                }
                _ => return Err(bad_key()),
            }
        }
        Ok(scopes)
    }

    /// Applies one outcome's change to a scope: the new sample first, then
    /// the meta, then the removals of evicted samples.
    ///
    /// These are plain inserts, not one `sled::Batch`: a batch takes sled's
    /// global write lock, which waits for every running flush, and so would
    /// serialise outcomes behind fsyncs and defeat the group commit. sled
    /// recovers a prefix of the writes, and the order above keeps every prefix
    /// sound: a crash may keep the sample without its meta (the next outcome
    /// re-evaluates it) or without the removals (a restore trims the window
    /// to its capacity and horizon).
    pub fn write_kpi(&self, write: &KpiWrite<'_>) -> Result<(), StoreError> {
        let insert = |key: Vec<u8>, bytes: Vec<u8>| {
            self.kpi.insert(key, bytes).map(|_| ()).map_err(|source| StoreError::Sled {
                action: "insert",
                tree: KPI,
                source,
            })
        };
        if let Some((seq, sample)) = write.append {
            let bytes = rmp_serde::to_vec_named(sample).map_err(|source| StoreError::Encode { tree: KPI, source })?;
            insert(sample_key(write.scope_key, seq), bytes)?;
        }
        if let Some(meta) = write.meta {
            let bytes = rmp_serde::to_vec_named(meta).map_err(|source| StoreError::Encode { tree: KPI, source })?;
            insert(meta_key(write.scope_key), bytes)?;
        }
        for seq in write.remove {
            self.kpi.remove(sample_key(write.scope_key, *seq)).map_err(|source| StoreError::Sled {
                action: "remove",
                tree: KPI,
                source,
            })?;
        }
        Ok(())
    }

    /// Returns a future that resolves once every write made before the call
    /// is durable. Concurrent callers share one flush (group commit).
    pub fn durable(&self) -> Durable {
        Durable { receiver: self.group_flush.durable() }
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

fn sample_key(scope_key: &str, seq: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(scope_key.len() + 11);
    key.extend_from_slice(b"w\0");
    key.extend_from_slice(scope_key.as_bytes());
    key.push(0);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

fn meta_key(scope_key: &str) -> Vec<u8> {
    [b"m\0".as_slice(), scope_key.as_bytes()].concat()
}

pub(crate) fn put<T: Serialize>(tree: &sled::Tree, name: &'static str, key: &str, value: &T) -> Result<(), StoreError> {
    let bytes = rmp_serde::to_vec_named(value).map_err(|source| StoreError::Encode { tree: name, source })?;
    tree.insert(key.as_bytes(), bytes).map_err(|source| StoreError::Sled { action: "insert", tree: name, source })?;
    Ok(())
}

pub(crate) fn get<T: DeserializeOwned>(
    tree: &sled::Tree,
    name: &'static str,
    key: &str,
) -> Result<Option<T>, StoreError> {
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

pub(crate) fn all<T: DeserializeOwned>(tree: &sled::Tree, name: &'static str) -> Result<Vec<(String, T)>, StoreError> {
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
    use crate::core::kpi_window::OutcomeStatus;

    #[test]
    fn values_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let descriptor = Builtin::Echo.descriptor();
        let embedding = StoredEmbedding { model_id: "m".into(), text_hash: "h".into(), vector: vec![0.5, -0.5] };
        let samples: Vec<Sample> =
            (0..4).map(|at| Sample::new(Some(OutcomeStatus::Success), None, at).unwrap()).collect();
        let meta = ScopeMeta {
            alert: crate::core::kpi_window::AlertState { degraded: true, last_alert_at_ms: Some(3) },
            ..Default::default()
        };
        {
            let store = Store::open(dir.path()).unwrap();
            store.put_descriptor("builtin", &descriptor).unwrap();
            store
                .put_presets("runtime:a", &[Preset { name: "p".into(), capability_ids: vec!["tool:echo".into()] }])
                .unwrap();
            store.put_embedding(&descriptor.id, &embedding).unwrap();
            for (seq, sample) in samples.iter().enumerate() {
                // Seq 300 sorts after 2 only with big-endian keys; the window keeps 1.. after seq 0 leaves.
                let seq = [0u64, 1, 2, 300][seq];
                let remove: &[u64] = if seq == 300 { &[0] } else { &[] };
                let meta = (seq == 2).then_some(&meta);
                store
                    .write_kpi(&KpiWrite { scope_key: "acme/bot", append: Some((seq, sample)), remove, meta })
                    .unwrap();
            }
            store
                .write_kpi(&KpiWrite { scope_key: "global", append: Some((7, &samples[0])), remove: &[], meta: None })
                .unwrap();
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
        let scopes = store.kpi_scopes().unwrap();
        assert_eq!(scopes.len(), 2);
        assert_eq!(scopes[0].scope_key, "acme/bot");
        assert_eq!(scopes[0].samples, vec![(1, samples[1]), (2, samples[2]), (300, samples[3])]);
        assert_eq!(scopes[0].meta, Some(meta));
        assert_eq!(scopes[1].samples, vec![(7, samples[0])]);
        assert_eq!(scopes[1].meta, None);
        assert_eq!(store.dispatch_result::<serde_json::Value>("k1").unwrap(), Some(serde_json::json!({"text": "hi"})));
        store.remove_capability(&descriptor.id).unwrap();
        assert!(store.descriptors().unwrap().is_empty());
        assert_eq!(store.embedding(&descriptor.id).unwrap(), None);
    }

    #[test]
    fn durable_resolves_after_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.put_dispatch_result("k", &1u8).unwrap();
        let waits: Vec<_> = (0..10).map(|_| store.durable()).collect();
        for wait in waits {
            futures::executor::block_on(wait).unwrap();
        }
    }

    #[test]
    fn garbage_decodes_to_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.embeddings.insert("x", &b"\xff\x00garbage"[..]).unwrap();
        assert!(matches!(store.embedding("x"), Err(StoreError::Decode { .. })));
    }
}
