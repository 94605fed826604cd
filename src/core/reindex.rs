//! Re-indexing: what one planned catalog change ([`ChangePlan`], from
//! `catalog::plan_change`) does to the vector index.
//!
//! The Indexer actor carries a change out in three steps, each decided here:
//! 1. [`plan_vectors`]: of the vectors kept from earlier embeddings, which are
//!    still valid for the new descriptors (same model, same embedding text) and
//!    are reused, and which texts must go to the embedder;
//! 2. [`VectorPlan::fill`]: the embedder's answer for those texts, checked
//!    (one vector per text) and put in place;
//! 3. [`apply_change`]: the new catalog, vector index and lexical index, and
//!    which ids are now pending (indexed lexically only, without a vector)
//!    or no longer pending.
//!
//! [`apply_retry`] does step 2 and 3 for the later retry of pending ids.
//! Nothing here reads or writes the store: the actor fetches the kept vectors
//! and writes what these functions say changed.

use crate::core::catalog::{plan_change, Catalog, ChangeMode, ChangePlan};
use crate::core::descriptor::CapabilityDescriptor;
use crate::core::embedder::{text_hash, EmbedError, EmbedErrorCode};
use crate::core::graph::Preset;
use crate::core::index::VectorIndex;
use crate::core::lexical::LexicalIndex;
use crate::core::text::embedding_text;
use std::collections::BTreeSet;

/// A vector made earlier, with what it was made from.
#[derive(Clone, Debug, PartialEq)]
pub struct KeptVector {
    pub model_id: String,
    /// `text_hash(model_id, text)` of the text it embeds.
    pub text_hash: String,
    pub vector: Vec<f32>,
}

impl KeptVector {
    /// Returns whether this is still the vector `model_id` gives for the text hashed `text_hash`.
    pub fn is_valid_for(&self, model_id: &str, text_hash: &str) -> bool {
        self.model_id == model_id && self.text_hash == text_hash
    }
}

/// The vectors of a change's upserts (by position): those known, and the texts still to embed.
#[derive(Clone, Debug, PartialEq)]
pub struct VectorPlan {
    pub model_id: String,
    /// Each upsert's embedding text.
    pub texts: Vec<String>,
    /// Each upsert's `text_hash(model_id, text)`.
    pub text_hashes: Vec<String>,
    /// Each upsert's vector, when known.
    pub vectors: Vec<Option<Vec<f32>>>,
    /// The upserts whose vector the embedder must make, in order.
    pub to_embed: Vec<usize>,
    /// How many upserts reuse a kept vector.
    pub reused: usize,
}

/// Decides, for each of `upserts`, whether its kept vector (`kept`, in the
/// same order) is reused: only when `model_id` made it from the very text the
/// descriptor embeds now. Every other upsert is to be embedded.
pub fn plan_vectors(model_id: &str, upserts: &[CapabilityDescriptor], kept: Vec<Option<KeptVector>>) -> VectorPlan {
    debug_assert_eq!(upserts.len(), kept.len(), "one kept slot per upsert");
    let texts: Vec<String> = upserts.iter().map(embedding_text).collect();
    let text_hashes: Vec<String> = texts.iter().map(|text| text_hash(model_id, text)).collect();
    let mut vectors = Vec::with_capacity(texts.len());
    let mut to_embed = Vec::new();
    for (position, kept) in kept.into_iter().enumerate() {
        match kept {
            Some(kept) if kept.is_valid_for(model_id, &text_hashes[position]) => vectors.push(Some(kept.vector)),
            _ => {
                vectors.push(None);
                to_embed.push(position);
            }
        }
    }
    let reused = texts.len() - to_embed.len();
    VectorPlan { model_id: model_id.to_string(), texts, text_hashes, vectors, to_embed, reused }
}

impl VectorPlan {
    /// Returns the texts the embedder must embed, in the order of `to_embed`.
    pub fn texts_to_embed(&self) -> Vec<String> {
        self.to_embed.iter().map(|&position| self.texts[position].clone()).collect()
    }

    /// Puts the embedder's `answer` for [`VectorPlan::texts_to_embed`] in place.
    /// Returns the positions that got a vector (an empty vector gives none), or
    /// the error to report, leaving them unknown.
    pub fn fill(&mut self, answer: Result<Vec<Vec<f32>>, EmbedError>) -> Result<Vec<usize>, EmbedError> {
        let answer = checked_vectors(answer, self.to_embed.len())?;
        let mut filled = Vec::with_capacity(answer.len());
        for (&position, vector) in self.to_embed.iter().zip(answer) {
            if !vector.is_empty() {
                self.vectors[position] = Some(vector);
                filled.push(position);
            }
        }
        Ok(filled)
    }

    /// Returns the vector at `position` as it is to be kept, if known.
    pub fn kept(&self, position: usize) -> Option<KeptVector> {
        let vector = self.vectors[position].clone()?;
        Some(KeptVector { model_id: self.model_id.clone(), text_hash: self.text_hashes[position].clone(), vector })
    }
}

/// Checks the embedder's answer: one vector per text of `expected`, or the error to report.
pub fn checked_vectors(
    answer: Result<Vec<Vec<f32>>, EmbedError>,
    expected: usize,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    let vectors = answer?;
    if vectors.len() != expected {
        return Err(EmbedError::new(
            EmbedErrorCode::BadResponse,
            format!("the embedder returned {} vectors for {expected} texts", vectors.len()),
        ));
    }
    Ok(vectors)
}

/// A change carried out on copies of the catalog and the vector index.
#[derive(Debug, Default)]
pub struct AppliedChange {
    /// The new catalog (one version up), vector index and lexical index; `None` when nothing changed.
    pub next: Option<(Catalog, VectorIndex, LexicalIndex)>,
    /// Ids that were not in the catalog before.
    pub added: Vec<String>,
    /// Ids whose descriptor was replaced.
    pub updated: Vec<String>,
    /// Upserts indexed without a vector (none known, or one that does not fit): now pending.
    pub pending_added: Vec<String>,
    /// Ids no longer pending: given a vector now, or removed.
    pub pending_resolved: Vec<String>,
    /// The origin's presets to store, when they changed (empty: it has none any more).
    pub presets: Option<Vec<Preset>>,
    /// Whether the change changed anything (a new catalog version follows).
    pub changed: bool,
}

/// Carries out `plan` by `origin` on copies of `base_catalog` and
/// `base_index`: removals go, each upsert enters the catalog (with its
/// `vectors` entry in the index, or pending without one), and `presets`, when
/// given and different from what `origin` holds, replace its presets.
pub fn apply_change(
    base_catalog: &Catalog,
    base_index: &VectorIndex,
    origin: &str,
    plan: &ChangePlan,
    vectors: Vec<Option<Vec<f32>>>,
    presets: Option<Vec<Preset>>,
) -> AppliedChange {
    let presets_change = presets
        .as_ref()
        .is_some_and(|presets| base_catalog.presets.get(origin).map_or(!presets.is_empty(), |held| held != presets));
    if plan.upserts.is_empty() && plan.removals.is_empty() && !presets_change {
        // Nothing changes (a rescan that found what is held): no copy of a
        // catalog that may hold a hundred thousand descriptors.
        return AppliedChange::default();
    }
    let mut catalog = base_catalog.clone();
    let mut index = base_index.clone();
    let mut applied = apply_plan(&mut catalog, &mut index, origin, plan, vectors, presets);
    if applied.changed {
        applied.next = Some(finish(catalog, index, base_catalog.version));
    }
    applied
}

/// One change of a batch: its origin, plan, the vector of each upsert, and its presets.
pub struct BatchChange<'a> {
    pub origin: &'a str,
    pub plan: &'a ChangePlan,
    pub vectors: Vec<Option<Vec<f32>>>,
    pub presets: Option<Vec<Preset>>,
}

/// Carries out several changes in order on one copy of `base_catalog` and
/// `base_index`, as [`apply_change`] would one after the other, but builds the
/// next catalog (one version up) and its lexical index once, at the end:
/// returns what each change did (with no `next` of its own) and the next
/// state, when any changed. A node catching up with many mutations pays for
/// one index build, not one per mutation.
pub fn apply_changes(
    base_catalog: &Catalog,
    base_index: &VectorIndex,
    changes: Vec<BatchChange<'_>>,
) -> (Vec<AppliedChange>, Option<(Catalog, VectorIndex, LexicalIndex)>) {
    let mut catalog = base_catalog.clone();
    let mut index = base_index.clone();
    let applied: Vec<AppliedChange> = changes
        .into_iter()
        .map(|change| apply_plan(&mut catalog, &mut index, change.origin, change.plan, change.vectors, change.presets))
        .collect();
    let next = applied.iter().any(|change| change.changed).then(|| finish(catalog, index, base_catalog.version));
    (applied, next)
}

/// A change to plan: origin, offered descriptors, mode, removals and presets.
pub type ChangeInput = (String, Vec<CapabilityDescriptor>, ChangeMode, Vec<String>, Option<Vec<Preset>>);

/// Plans several changes in order, each against the catalog the ones before it leave.
pub fn plan_changes(catalog: &Catalog, changes: Vec<ChangeInput>) -> Vec<ChangePlan> {
    if let [(origin, incoming, mode, removals, _)] = &changes[..] {
        // One change: no copy to plan against.
        return vec![plan_change(catalog, origin, incoming.clone(), *mode, removals)];
    }
    let mut scratch = catalog.clone();
    // Planning needs descriptors and origins only; vectors go to a throwaway index.
    let mut no_vectors = VectorIndex::default();
    changes
        .into_iter()
        .map(|(origin, incoming, mode, removals, presets)| {
            let plan = plan_change(&scratch, &origin, incoming, mode, &removals);
            let none = vec![None; plan.upserts.len()];
            apply_plan(&mut scratch, &mut no_vectors, &origin, &plan, none, presets);
            plan
        })
        .collect()
}

/// The next catalog: one version up from `base_version`, with its lexical index.
fn finish(mut catalog: Catalog, index: VectorIndex, base_version: u64) -> (Catalog, VectorIndex, LexicalIndex) {
    catalog.version = base_version + 1;
    // The lexical index has corpus-wide statistics (idf, average length), so it is rebuilt whole.
    let lexical = LexicalIndex::build(catalog.descriptors.values());
    (catalog, index, lexical)
}

/// Carries out `plan` on `catalog` and `index` in place (no version, no lexical index).
fn apply_plan(
    catalog: &mut Catalog,
    index: &mut VectorIndex,
    origin: &str,
    plan: &ChangePlan,
    vectors: Vec<Option<Vec<f32>>>,
    presets: Option<Vec<Preset>>,
) -> AppliedChange {
    debug_assert_eq!(plan.upserts.len(), vectors.len(), "one vector slot per upsert");
    let mut applied = AppliedChange::default();
    for id in &plan.removals {
        catalog.descriptors.remove(id);
        catalog.origins.remove(id);
        index.remove(id);
        applied.pending_resolved.push(id.clone());
    }
    for (descriptor, vector) in plan.upserts.iter().zip(vectors) {
        match vector {
            Some(vector) if index.upsert(&descriptor.id, &vector).is_ok() => {
                applied.pending_resolved.push(descriptor.id.clone())
            }
            _ => {
                index.remove(&descriptor.id);
                applied.pending_added.push(descriptor.id.clone());
            }
        }
        let previous = catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
        catalog.origins.insert(descriptor.id.clone(), origin.to_string());
        match previous {
            Some(_) => applied.updated.push(descriptor.id.clone()),
            None => applied.added.push(descriptor.id.clone()),
        }
    }
    if let Some(presets) = presets {
        if catalog.presets.get(origin).map_or(!presets.is_empty(), |held| *held != presets) {
            if presets.is_empty() {
                catalog.presets.remove(origin);
            } else {
                catalog.presets.insert(origin.to_string(), presets.clone());
            }
            applied.presets = Some(presets);
        }
    }
    applied.changed = !plan.upserts.is_empty() || !plan.removals.is_empty() || applied.presets.is_some();
    applied
}

/// Returns the ids of `pending` still in `catalog`, with their embedding texts, to embed again.
pub fn retry_targets(pending: &BTreeSet<String>, catalog: &Catalog) -> (Vec<String>, Vec<String>) {
    pending.iter().filter_map(|id| catalog.get(id).map(|descriptor| (id.clone(), embedding_text(descriptor)))).unzip()
}

/// A retry's vectors put into a copy of the vector index.
#[derive(Debug)]
pub struct AppliedRetry {
    pub index: VectorIndex,
    /// The ids that got a vector, each with the vector to keep, in order.
    pub embedded: Vec<(String, KeptVector)>,
}

/// Puts the embedder's `answer` (made by `model_id`) for `ids` and their
/// `texts` into a copy of `index`; an empty vector, or one that does not fit
/// the index, leaves its id pending. Returns the error to report when the
/// answer is not one vector per text.
pub fn apply_retry(
    index: &VectorIndex,
    model_id: &str,
    ids: &[String],
    texts: &[String],
    answer: Result<Vec<Vec<f32>>, EmbedError>,
) -> Result<AppliedRetry, EmbedError> {
    let vectors = checked_vectors(answer, ids.len())?;
    let mut index = index.clone();
    let mut embedded = Vec::new();
    for ((id, text), vector) in ids.iter().zip(texts).zip(vectors) {
        if vector.is_empty() || index.upsert(id, &vector).is_err() {
            continue;
        }
        let kept = KeptVector { model_id: model_id.to_string(), text_hash: text_hash(model_id, text), vector };
        embedded.push((id.clone(), kept));
    }
    Ok(AppliedRetry { index, embedded })
}

/// The catalog and vector index rebuilt from what the store kept.
#[derive(Debug, Default)]
pub struct Restored {
    pub catalog: Catalog,
    pub index: VectorIndex,
    /// Ids in the catalog without a vector in the index.
    pub pending: BTreeSet<String>,
}

/// Rebuilds the catalog and the vector index (of `dimensions`, 0: not known
/// yet) from `stored` descriptors, each with its origin and kept vector, and
/// the `presets` of each origin. A kept vector is used when `model_id` made it
/// and it fits the index; every other descriptor is pending until embedded.
/// Versions count changes within a process: a restored catalog that holds
/// anything starts a new count at 1.
pub fn restore(
    model_id: &str,
    dimensions: usize,
    stored: impl IntoIterator<Item = (CapabilityDescriptor, String, Option<KeptVector>)>,
    presets: impl IntoIterator<Item = (String, Vec<Preset>)>,
) -> Restored {
    let mut restored = Restored { index: VectorIndex::new(dimensions), ..Restored::default() };
    let mut descriptors = Vec::new();
    let mut origins = Vec::new();
    for (descriptor, origin, kept) in stored {
        let vector_fits = match kept {
            Some(kept) if kept.model_id == model_id => restored.index.upsert(&descriptor.id, &kept.vector).is_ok(),
            _ => false,
        };
        if !vector_fits {
            restored.pending.insert(descriptor.id.clone());
        }
        origins.push((descriptor.id.clone(), origin));
        descriptors.push((descriptor.id.clone(), descriptor));
    }
    // Built in bulk (`collect` sorts, then fills every node): inserted one at
    // a time, in id order as the store gives them, a B-tree's nodes are left
    // half empty. A repeated id keeps the last, as inserting did.
    restored.catalog.origins = origins.into_iter().collect();
    restored.catalog.descriptors = descriptors.into_iter().collect();
    restored.index.shrink_to_fit();
    restored.catalog.presets = presets.into_iter().collect();
    restored.catalog.version = u64::from(!restored.catalog.is_empty());
    restored
}

/// Like [`restore`], over an `index` already loaded with the kept vectors
/// (read in bulk, beside the descriptors): a descriptor without a row is
/// pending, and a row without a descriptor (a capability removed while its
/// vector's removal did not reach the disk) is dropped.
pub fn restore_indexed(
    mut index: VectorIndex,
    mut stored: Vec<(CapabilityDescriptor, String)>,
    presets: impl IntoIterator<Item = (String, Vec<Preset>)>,
) -> Restored {
    let mut restored = Restored::default();
    // The maps are built in bulk (collected: sorted, then every node filled;
    // inserted one at a time, a B-tree's nodes stay a third to a half empty),
    // and the descriptors' entries reuse `stored`'s own memory on the way, so
    // a restart of a large catalog faults in no copy of it.
    let mut origins = Vec::with_capacity(stored.len());
    for (descriptor, origin) in &mut stored {
        if !index.contains(&descriptor.id) {
            restored.pending.insert(descriptor.id.clone());
        }
        origins.push((descriptor.id.clone(), std::mem::take(origin)));
    }
    restored.catalog.origins = origins.into_iter().collect();
    restored.catalog.descriptors =
        stored.into_iter().map(|(descriptor, _)| (descriptor.id.clone(), descriptor)).collect();
    if index.len() + restored.pending.len() != restored.catalog.len() {
        let orphans: Vec<String> = (0..index.len())
            .map(|row| index.id(row))
            .filter(|id| !restored.catalog.descriptors.contains_key(*id))
            .map(str::to_string)
            .collect();
        for id in orphans {
            index.remove(&id);
        }
    }
    index.shrink_to_fit();
    restored.index = index;
    restored.catalog.presets = presets.into_iter().collect();
    restored.catalog.version = u64::from(!restored.catalog.is_empty());
    restored
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::catalog::{plan_change, ChangeMode};
    use proptest::prelude::*;

    fn tool(name: &str, description: &str) -> CapabilityDescriptor {
        crate::core::descriptor::test_tool(name, description)
    }

    fn kept_for(model_id: &str, descriptor: &CapabilityDescriptor, vector: Vec<f32>) -> KeptVector {
        KeptVector { model_id: model_id.into(), text_hash: text_hash(model_id, &embedding_text(descriptor)), vector }
    }

    #[test]
    fn restoring_over_a_loaded_index_marks_the_missing_pending_and_drops_orphans() {
        let (a, b) = (tool("a", "one"), tool("b", "two"));
        let mut index = VectorIndex::new(2);
        index.upsert(&a.id, &[1.0, 0.0]).unwrap();
        index.upsert("gone", &[0.0, 1.0]).unwrap();
        let stored = vec![(a.clone(), "runtime:r".to_string()), (b.clone(), "runtime:r".to_string())];
        let restored = restore_indexed(index, stored.clone(), vec![]);
        assert_eq!(restored.pending, BTreeSet::from([b.id.clone()]));
        assert_eq!((restored.index.len(), restored.index.contains("gone")), (1, false));
        assert_eq!(restored.catalog.len(), 2);
        let by_upserts = restore(
            "m",
            2,
            stored.into_iter().map(|(descriptor, origin)| {
                let kept = (descriptor.id == a.id).then(|| KeptVector {
                    model_id: "m".into(),
                    text_hash: String::new(),
                    vector: vec![1.0, 0.0],
                });
                (descriptor, origin, kept)
            }),
            vec![],
        );
        assert_eq!((by_upserts.pending, by_upserts.catalog.version), (restored.pending, restored.catalog.version));
        assert_eq!(by_upserts.index.stored_vector(&a.id), restored.index.stored_vector(&a.id));
    }

    #[test]
    fn a_kept_vector_is_reused_only_for_the_same_model_and_text() {
        let weather = tool("weather", "Tell the forecast");
        let changed = tool("weather", "Tell the forecast for a city");
        let check = |kept: Option<KeptVector>, descriptor: &CapabilityDescriptor, reused: bool| {
            let plan = plan_vectors("m1", std::slice::from_ref(descriptor), vec![kept]);
            assert_eq!(
                (plan.reused, plan.to_embed.is_empty(), plan.vectors[0].is_some()),
                (usize::from(reused), reused, reused)
            );
        };
        check(Some(kept_for("m1", &weather, vec![1.0, 0.0])), &weather, true);
        check(Some(kept_for("m0", &weather, vec![1.0, 0.0])), &weather, false);
        check(Some(kept_for("m1", &weather, vec![1.0, 0.0])), &changed, false);
        check(None, &weather, false);
    }

    #[test]
    fn fill_checks_the_count_and_skips_empty_vectors() {
        let upserts = [tool("a", "one"), tool("b", "two"), tool("c", "three")];
        let kept = vec![None, Some(kept_for("m", &upserts[1], vec![0.0, 1.0])), None];
        let mut plan = plan_vectors("m", &upserts, kept);
        assert_eq!(plan.to_embed, vec![0, 2]);
        assert_eq!(plan.texts_to_embed(), vec![plan.texts[0].clone(), plan.texts[2].clone()]);
        let short = plan.clone().fill(Ok(vec![vec![1.0, 0.0]])).unwrap_err();
        assert_eq!(short.code, EmbedErrorCode::BadResponse);
        let failed = EmbedError::new(EmbedErrorCode::Unavailable, "down");
        assert_eq!(plan.clone().fill(Err(failed.clone())).unwrap_err(), failed);
        assert_eq!(plan.fill(Ok(vec![vec![1.0, 0.0], vec![]])).unwrap(), vec![0]);
        assert_eq!(plan.kept(0), Some(kept_for("m", &upserts[0], vec![1.0, 0.0])));
        assert_eq!(plan.kept(2), None);
    }

    #[test]
    fn apply_change_adds_updates_removes_and_tracks_pending() {
        let mut catalog = Catalog::default();
        let mut index = VectorIndex::new(2);
        for descriptor in [tool("a", "one"), tool("b", "two")] {
            index.upsert(&descriptor.id, &[1.0, 0.0]).unwrap();
            catalog.origins.insert(descriptor.id.clone(), "runtime:r".into());
            catalog.descriptors.insert(descriptor.id.clone(), descriptor);
        }
        catalog.version = 4;
        let incoming = vec![tool("a", "one, changed"), tool("c", "three"), tool("d", "four")];
        let plan = plan_change(&catalog, "runtime:r", incoming, ChangeMode::Replace, &[]);
        // c gets a vector, a has none (pending), d's does not fit the index (pending).
        let vectors = vec![None, Some(vec![0.0, 1.0]), Some(vec![1.0, 0.0, 0.0])];
        let applied = apply_change(&catalog, &index, "runtime:r", &plan, vectors, None);
        assert_eq!(applied.added, vec!["tool:c".to_string(), "tool:d".into()]);
        assert_eq!(applied.updated, vec!["tool:a".to_string()]);
        assert_eq!(applied.pending_added, vec!["tool:a".to_string(), "tool:d".into()]);
        assert_eq!(applied.pending_resolved, vec!["tool:b".to_string(), "tool:c".into()]);
        let (next, next_index, lexical) = applied.next.unwrap();
        assert_eq!(next.version, 5);
        assert_eq!(next.descriptors.keys().collect::<Vec<_>>(), ["tool:a", "tool:c", "tool:d"]);
        assert!(next_index.contains("tool:c") && !next_index.contains("tool:a") && !next_index.contains("tool:b"));
        assert_eq!(lexical.len(), 3);
        // The base copies are untouched.
        assert_eq!((catalog.version, catalog.len(), index.len()), (4, 2, 2));
    }

    #[test]
    fn apply_change_without_a_change_gives_no_new_version() {
        let catalog = Catalog::default();
        let index = VectorIndex::new(2);
        let nothing = apply_change(&catalog, &index, "runtime:r", &ChangePlan::default(), vec![], Some(vec![]));
        assert!(nothing.next.is_none() && nothing.presets.is_none());
        let preset = Preset { name: "p".into(), capability_ids: vec!["tool:a".into()] };
        let presets = apply_change(&catalog, &index, "runtime:r", &ChangePlan::default(), vec![], Some(vec![preset]));
        assert_eq!(presets.presets.as_ref().map(Vec::len), Some(1));
        assert_eq!(presets.next.unwrap().0.presets["runtime:r"].len(), 1);
    }

    #[test]
    fn a_retry_embeds_what_fits_and_keeps_it_with_its_hash() {
        let mut catalog = Catalog::default();
        for descriptor in [tool("a", "one"), tool("b", "two")] {
            catalog.descriptors.insert(descriptor.id.clone(), descriptor);
        }
        let pending: BTreeSet<String> = ["tool:a", "tool:b", "tool:gone"].map(String::from).into();
        let (ids, texts) = retry_targets(&pending, &catalog);
        assert_eq!(ids, vec!["tool:a".to_string(), "tool:b".into()]);
        let index = VectorIndex::new(2);
        let retry = apply_retry(&index, "m", &ids, &texts, Ok(vec![vec![1.0, 0.0], vec![1.0]])).unwrap();
        assert_eq!(
            retry.embedded,
            vec![("tool:a".to_string(), kept_for("m", &catalog.descriptors["tool:a"], vec![1.0, 0.0]))]
        );
        assert!(retry.index.contains("tool:a") && !retry.index.contains("tool:b") && index.is_empty());
        assert_eq!(apply_retry(&index, "m", &ids, &texts, Ok(vec![])).unwrap_err().code, EmbedErrorCode::BadResponse);
    }

    #[test]
    fn restore_uses_vectors_of_the_model_that_fit() {
        let (a, b, c, d) = (tool("a", "one"), tool("b", "two"), tool("c", "three"), tool("d", "four"));
        let stored = vec![
            (a.clone(), "manifests".to_string(), Some(kept_for("m", &a, vec![1.0, 0.0]))),
            (b.clone(), "manifests".to_string(), Some(kept_for("old", &b, vec![1.0, 0.0]))),
            (c.clone(), "runtime:r".to_string(), Some(kept_for("m", &c, vec![1.0, 0.0, 0.0]))),
            (d, "runtime:r".to_string(), None),
        ];
        let restored = restore("m", 2, stored, vec![]);
        assert_eq!(restored.catalog.version, 1);
        assert_eq!(restored.catalog.origin("tool:c"), "runtime:r");
        assert!(restored.index.contains("tool:a") && restored.index.len() == 1);
        assert_eq!(restored.pending.into_iter().collect::<Vec<_>>(), ["tool:b", "tool:c", "tool:d"]);
        assert_eq!(restore("m", 2, vec![], vec![]).catalog.version, 0);
    }

    proptest! {
        /// A batch is the same as its changes one after the other: the same
        /// plans, the same per-change reports, the same final catalog and vectors.
        #[test]
        fn a_batch_equals_its_changes_in_turn(
            changes in proptest::collection::vec(
                (0u8..3, proptest::collection::vec((0u8..6, 0u8..3, proptest::bool::ANY), 0..4), proptest::bool::ANY,
                 proptest::collection::vec(0u8..6, 0..2)),
                1..12,
            ),
        ) {
            let changes: Vec<_> = changes
                .into_iter()
                .map(|(origin, offers, replace, removals)| {
                    let descriptors = offers
                        .iter()
                        .map(|&(id, text, _)| tool(&format!("t{id}"), &format!("text {text}")))
                        .collect::<Vec<_>>();
                    let vectors: Vec<Option<Vec<f32>>> = offers
                        .iter()
                        .map(|&(id, _, known)| known.then(|| vec![1.0, f32::from(id)]))
                        .collect();
                    let mode = if replace { ChangeMode::Replace } else { ChangeMode::Merge };
                    let removals = removals.iter().map(|id| format!("tool:t{id}")).collect::<Vec<_>>();
                    (format!("runtime:r{origin}"), descriptors, mode, removals, vectors)
                })
                .collect();
            // The vector of an upsert, by its position among the offers of its change.
            let vectors_for = |plan: &ChangePlan, offered: &[CapabilityDescriptor], vectors: &[Option<Vec<f32>>]| {
                plan.upserts
                    .iter()
                    .map(|up| offered.iter().position(|d| d.id == up.id).and_then(|at| vectors[at].clone()))
                    .collect::<Vec<_>>()
            };
            let (mut catalog, mut index) = (Catalog::default(), VectorIndex::new(2));
            let mut one_by_one = Vec::new();
            for (origin, descriptors, mode, removals, vectors) in &changes {
                let plan = plan_change(&catalog, origin, descriptors.clone(), *mode, removals);
                let applied = apply_change(&catalog, &index, origin, &plan, vectors_for(&plan, descriptors, vectors), None);
                one_by_one.push((plan, applied.added.clone(), applied.updated.clone(), applied.pending_added.clone()));
                if let Some((next, next_index, _)) = applied.next {
                    catalog = next;
                    index = next_index;
                }
            }
            let inputs = changes
                .iter()
                .map(|(origin, descriptors, mode, removals, _)| (origin.clone(), descriptors.clone(), *mode, removals.clone(), None))
                .collect();
            let plans = plan_changes(&Catalog::default(), inputs);
            let batch = changes
                .iter()
                .zip(&plans)
                .map(|((origin, descriptors, _, _, vectors), plan)| BatchChange {
                    origin,
                    plan,
                    vectors: vectors_for(plan, descriptors, vectors),
                    presets: None,
                })
                .collect();
            let (applied, next) = apply_changes(&Catalog::default(), &VectorIndex::new(2), batch);
            for ((plan, added, updated, pending), (batch_plan, batch_applied)) in one_by_one.iter().zip(plans.iter().zip(&applied)) {
                prop_assert_eq!(plan, batch_plan);
                prop_assert_eq!(added, &batch_applied.added);
                prop_assert_eq!(updated, &batch_applied.updated);
                prop_assert_eq!(pending, &batch_applied.pending_added);
            }
            match next {
                Some((batch_catalog, batch_index, lexical)) => {
                    prop_assert_eq!(&batch_catalog.descriptors, &catalog.descriptors);
                    prop_assert_eq!(&batch_catalog.origins, &catalog.origins);
                    prop_assert_eq!(batch_catalog.version, 1, "one version for the whole batch");
                    prop_assert_eq!(lexical.len(), catalog.len());
                    for id in catalog.descriptors.keys() {
                        prop_assert_eq!(batch_index.contains(id), index.contains(id), "{}", id);
                    }
                }
                None => prop_assert!(catalog.descriptors.is_empty() && catalog.version == 0),
            }
        }
    }

    proptest! {
        /// Whatever was kept, a vector is reused exactly when its model and text
        /// hash match, every other upsert is embedded, and after a full answer
        /// every upsert has a vector.
        #[test]
        fn reuse_is_exactly_the_valid_kept_vectors(
            slots in proptest::collection::vec((0usize..3, 0usize..3, 0usize..3, any::<bool>()), 0..12),
        ) {
            let models = ["m0", "m1", "m2"];
            let descriptions = ["read a gauge", "send a message", "look up an invoice"];
            let upserts: Vec<_> = slots.iter().enumerate()
                .map(|(position, &(_, _, text, _))| tool(&format!("t{position}"), descriptions[text]))
                .collect();
            // What was kept: made by some model from some (maybe other) text, or nothing.
            let kept: Vec<Option<KeptVector>> = slots.iter().enumerate()
                .map(|(position, &(model, text, _, present))| present.then(|| {
                    let made_from = tool(&format!("t{position}"), descriptions[text]);
                    kept_for(models[model], &made_from, vec![position as f32, 1.0])
                }))
                .collect();
            let mut plan = plan_vectors("m1", &upserts, kept.clone());
            prop_assert_eq!(plan.reused + plan.to_embed.len(), upserts.len());
            for (position, kept) in kept.iter().enumerate() {
                let hash = text_hash("m1", &embedding_text(&upserts[position]));
                let valid = kept.as_ref().is_some_and(|kept| kept.model_id == "m1" && kept.text_hash == hash);
                prop_assert_eq!(plan.vectors[position].is_some(), valid);
                prop_assert_eq!(plan.to_embed.contains(&position), !valid);
                if valid {
                    prop_assert_eq!(&plan.kept(position), kept);
                }
            }
            let answer = plan.to_embed.iter().map(|&position| vec![0.5, position as f32]).collect();
            let filled = plan.fill(Ok(answer)).unwrap();
            prop_assert_eq!(filled, plan.to_embed.clone());
            prop_assert!(plan.vectors.iter().all(Option::is_some));
        }
    }
}
