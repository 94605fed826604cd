//! The outcome learner's durable state (`actors::outcome_learner`): what
//! the outcome memory remembered per capability, and the trials so far.
//!
//! | tree | key | value |
//! |---|---|---|
//! | `outcome_learning` | `m/` + capability id | the memory's entry: the sum of its requests' unit vectors, their number, and their words with how many held each |
//! | `outcome_learning` | `model` | the embedding model and dimension the vectors belong to |
//! | `outcome_learning` | `trust` | the trials (`core::outcome_trust::TrustState`) |
//!
//! Learning from an outcome writes its capabilities' entries and the trials
//! in one batch. The learnt state is derived from outcomes the KPI actor has
//! already made durable; it is not flushed per outcome (sled's own flusher
//! writes it within its interval), so a crash loses at most the last few
//! outcomes' learning, never an outcome.

use super::{get, StoreError};
use crate::core::outcome_memory::OutcomeMemory;
use crate::core::outcome_trust::TrustState;
use serde::{Deserialize, Serialize};

const TREE: &str = "outcome_learning";
const MEMORY_PREFIX: &str = "m/";
const MODEL: &str = "model";
const TRUST: &str = "trust";

/// The model a kept memory's vectors were made with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LearntModel {
    pub model_id: String,
    pub dimensions: usize,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    count: u32,
    sum: Vec<f32>,
    /// Kept since the memory learns words; an entry kept before has none.
    #[serde(default)]
    words: Vec<(String, u32)>,
}

/// What was kept, for the model it belongs to.
#[derive(Debug)]
pub struct KeptLearning {
    pub memory: OutcomeMemory,
    pub trust: Option<TrustState>,
    /// Entries refused (another dimension, values that are not finite).
    pub refused: usize,
}

/// Typed access to the `outcome_learning` tree of a [`super::Store`].
#[derive(Clone, Debug)]
pub struct LearningStore {
    tree: sled::Tree,
}

impl LearningStore {
    /// Opens the tree inside an open store.
    pub fn open(store: &super::Store) -> Result<LearningStore, StoreError> {
        let tree =
            store.db.open_tree(TREE).map_err(|source| StoreError::Sled { action: "open tree", tree: TREE, source })?;
        Ok(LearningStore { tree })
    }

    /// What was kept for `model`; a memory of another model (or dimension)
    /// is dropped, since its vectors mean nothing to this one.
    pub fn load(&self, model: &LearntModel) -> Result<KeptLearning, StoreError> {
        let kept: Option<LearntModel> = get(&self.tree, TREE, MODEL)?;
        if kept.as_ref() != Some(model) {
            self.tree.clear().map_err(|source| StoreError::Sled { action: "clear", tree: TREE, source })?;
            super::put(&self.tree, TREE, MODEL, model)?;
            return Ok(KeptLearning { memory: OutcomeMemory::new(model.dimensions), trust: None, refused: 0 });
        }
        let mut memory = OutcomeMemory::new(model.dimensions);
        let mut refused = 0;
        for row in self.tree.scan_prefix(MEMORY_PREFIX.as_bytes()) {
            let (key, bytes) = row.map_err(|source| StoreError::Sled { action: "iterate", tree: TREE, source })?;
            let id = String::from_utf8_lossy(&key[MEMORY_PREFIX.len()..]).into_owned();
            // An entry that does not decode is refused, not fatal: it is derived state.
            let restored = rmp_serde::from_slice::<Entry>(&bytes).is_ok_and(|entry| {
                let restored = memory.restore(&id, entry.sum, entry.count);
                if restored {
                    memory.restore_words(&id, entry.words);
                }
                restored
            });
            refused += usize::from(!restored);
        }
        Ok(KeptLearning { memory, trust: get(&self.tree, TREE, TRUST)?, refused })
    }

    /// Stores the entries of `ids` in `memory` and the trials, in one batch.
    pub fn save(&self, memory: &OutcomeMemory, ids: &[String], trust: &TrustState) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for id in ids {
            if let Some((sum, count)) = memory.entry(id) {
                let entry = Entry { count, sum: sum.to_vec(), words: memory.words(id).to_vec() };
                batch.insert(format!("{MEMORY_PREFIX}{id}").as_bytes(), encode(&entry)?);
            }
        }
        batch.insert(TRUST.as_bytes(), encode(trust)?);
        self.tree.apply_batch(batch).map_err(|source| StoreError::Sled { action: "apply batch", tree: TREE, source })
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    rmp_serde::to_vec_named(value).map_err(|source| StoreError::Encode { tree: TREE, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::outcome_trust::OutcomeTrust;

    #[test]
    fn the_memory_and_trials_come_back_for_their_model_only() {
        let dir = tempfile::tempdir().unwrap();
        let model = LearntModel { model_id: "static".into(), dimensions: 3 };
        let mut memory = OutcomeMemory::new(3);
        memory.remember("tool:a", &[1.0, 0.0, 0.0]);
        memory.remember_words("tool:a", &["weather".into(), "berlin".into()]);
        memory.remember("tool:a", &[0.0, 2.0, 0.0]);
        memory.remember_words("tool:a", &["weather".into()]);
        memory.remember("tool:b", &[0.0, 0.0, 1.0]);
        let mut trust = OutcomeTrust::default();
        assert!(trust.record(0.5, &[0.6; crate::core::outcome_trust::TRIED.len()], true));
        {
            let store = super::super::Store::open(dir.path()).unwrap();
            let learning = LearningStore::open(&store).unwrap();
            assert!(learning.load(&model).unwrap().memory.is_empty(), "nothing kept yet");
            learning.save(&memory, &["tool:a".into(), "tool:b".into(), "tool:none".into()], &trust.state()).unwrap();
            store.flush().unwrap();
        }
        let store = super::super::Store::open(dir.path()).unwrap();
        let learning = LearningStore::open(&store).unwrap();
        let kept = learning.load(&model).unwrap();
        assert_eq!(kept.memory.len(), 2);
        assert_eq!(kept.memory.entry("tool:a"), memory.entry("tool:a"));
        assert_eq!(kept.memory.words("tool:a"), memory.words("tool:a"));
        assert_eq!(kept.memory.learned_words(), memory.learned_words());
        assert_eq!(kept.trust, Some(trust.state()));
        assert_eq!(kept.refused, 0);
        // An entry kept before the memory learnt words comes back without any.
        #[derive(Serialize)]
        struct Unworded {
            count: u32,
            sum: Vec<f32>,
        }
        learning.tree.insert("m/tool:c", encode(&Unworded { count: 1, sum: vec![0.0, 1.0, 0.0] }).unwrap()).unwrap();
        let kept = learning.load(&model).unwrap();
        assert_eq!((kept.memory.count("tool:c"), kept.memory.words("tool:c").len(), kept.refused), (1, 0, 0));
        learning.tree.remove("m/tool:c").unwrap();
        // Trials kept before the unseen ones were counted apart still load (the memory with
        // them); the learner then starts its trials again.
        #[derive(Serialize)]
        struct Older {
            learnings: Vec<crate::core::outcome_trust::Learning>,
            gains: Vec<(f64, f64)>,
            trials: u64,
        }
        let state = trust.state();
        let older = Older { learnings: state.learnings.clone(), gains: state.gains.clone(), trials: state.trials };
        learning.tree.insert(TRUST, encode(&older).unwrap()).unwrap();
        let kept = learning.load(&model).unwrap();
        assert_eq!(kept.memory.len(), 2);
        let older = kept.trust.expect("an older state decodes");
        assert_eq!((older.unseen_gains.len(), older.unseen_trials), (0, 0));
        assert!(OutcomeTrust::from_state(older, &state.learnings).is_none());
        // Trials kept before the memory's words were a part of their own: learnings of two
        // fields decode (the memory's vectors alone) and are not taken back either.
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct WordlessLearning {
            prior: bool,
            memory_own_weight: Option<f32>,
        }
        #[derive(Serialize)]
        struct KeptBeforeWords<'a> {
            learnings: Vec<WordlessLearning>,
            gains: &'a [(f64, f64)],
            trials: u64,
            unseen_gains: &'a [(f64, f64)],
            unseen_trials: u64,
        }
        let kept_before = KeptBeforeWords {
            learnings: state
                .learnings
                .iter()
                .map(|learning| WordlessLearning {
                    prior: learning.prior,
                    memory_own_weight: learning.memory_own_weight,
                })
                .collect(),
            gains: &state.gains,
            trials: state.trials,
            unseen_gains: &state.unseen_gains,
            unseen_trials: state.unseen_trials,
        };
        learning.tree.insert(TRUST, encode(&kept_before).unwrap()).unwrap();
        let decoded = learning.load(&model).unwrap().trust.expect("learnings kept before the words decode");
        assert!(decoded.learnings.iter().all(|learning| !learning.memory_words));
        assert!(OutcomeTrust::from_state(decoded, &state.learnings).is_none());
        // A damaged entry is refused, the rest kept.
        learning.tree.insert("m/tool:bad", b"not msgpack".as_slice()).unwrap();
        assert_eq!(learning.load(&model).unwrap().refused, 1);
        // Another model: what was kept is dropped.
        let other = LearntModel { model_id: "builtin".into(), dimensions: 3 };
        assert!(learning.load(&other).unwrap().memory.is_empty());
        assert!(learning.load(&model).unwrap().memory.is_empty(), "and stays dropped");
    }
}
