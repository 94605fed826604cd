//! What discovery serves from: the [`SnapshotCell`] holding the latest
//! [`DiscoverySnapshot`] (catalog, vector index, lexical index, graph,
//! outcome prior and what the outcome learner learnt, each an immutable `Arc`).
//!
//! The Indexer and the GraphBuilder publish into the cell directly before they
//! reply (so a discovery after an upsert's reply sees the upsert), the
//! Discoverer on its messages (catalog, graph, outcome prior); the Discoverer
//! and the DiscoveryWorkers read it. It imports no actor, so every one of
//! them can import it without an import circle.

use crate::core::catalog::Catalog;
use crate::core::discovery::DiscoveryFilter;
use crate::core::graph::CapabilityGraph;
use crate::core::index::VectorIndex;
use crate::core::lexical::LexicalIndex;
use crate::core::outcome_learning::Learned;
use crate::core::outcome_prior::OutcomePrior;
use crate::core::tiers::TokenBudget;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Everything one discovery reads, of one catalog version: immutable `Arc`
/// snapshots, plus the Tier 0 texts already rendered for that catalog.
#[derive(Default)]
pub struct DiscoverySnapshot {
    pub catalog: Arc<Catalog>,
    pub index: Arc<VectorIndex>,
    pub lexical: Arc<LexicalIndex>,
    pub graph: Arc<CapabilityGraph>,
    pub graph_version: u64,
    pub prior: Arc<OutcomePrior>,
    /// What the outcome learner publishes (`core::outcome_learning`); used
    /// only with the vector index it was fitted to ([`DiscoverySnapshot::vectors`]).
    pub learned: Option<Arc<Learned>>,
    /// Tier 0 per (budget, filter), for `catalog` only (a new catalog gets a new cache);
    /// the key holds the whole filter, so one query's exclusions never leak into another's.
    tier0_cache: Arc<Mutex<HashMap<String, String>>>,
}

/// Tier 0 texts kept per catalog, at most.
const TIER0_CACHE_ENTRIES: usize = 1024;

impl DiscoverySnapshot {
    /// Returns Tier 0 for `filter`, cached per catalog.
    pub fn tier0(&self, filter: &DiscoveryFilter, budget: TokenBudget) -> String {
        let key = format!("{}|{}", budget.max_tokens(), serde_json::to_string(filter).unwrap_or_default());
        let cache = || self.tier0_cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(text) = cache().get(&key) {
            return text.clone();
        }
        // Rendered outside the lock; two workers may render the same text once each.
        let text = self.catalog.tier0(filter, budget);
        let mut cached = cache();
        if cached.len() >= TIER0_CACHE_ENTRIES {
            cached.clear();
        }
        cached.insert(key, text.clone());
        text
    }

    /// What the outcome learner learnt, when it holds for this snapshot: a
    /// learning with the memory's vectors only with the index they were fitted to.
    pub fn learned(&self) -> Option<&Learned> {
        self.learned.as_deref().filter(|learned| learned.vectors.is_none() || Arc::ptr_eq(&learned.base, &self.index))
    }

    /// The vector index to rank with: the memory's, when learnt for this index, else the index itself.
    pub fn vectors(&self) -> &VectorIndex {
        match self.learned().and_then(|learned| learned.vectors.as_deref()) {
            Some(vectors) => vectors,
            None => &self.index,
        }
    }

    /// The lexical index to rank with: the memory's learned words beside
    /// this snapshot's lexical index, when the learning uses them and they
    /// were learnt for it (and for its vector index, with the memory's
    /// vectors), else the lexical index itself.
    pub fn lexical(&self) -> &LexicalIndex {
        match self.learned().filter(|learned| learned.learning.memory_words).and_then(|learned| {
            learned.lexical.as_deref().filter(|lexical| {
                learned.lexical_base == self.lexical.generation() && lexical.len() == self.lexical.len()
            })
        }) {
            Some(lexical) => lexical,
            None => &self.lexical,
        }
    }

    /// Whether to apply the outcome prior: as the outcome learner's trials
    /// decided (whatever index the memory's vectors were fitted to), or
    /// `configured` while they have not.
    pub fn applies_prior(&self, configured: bool) -> bool {
        self.learned.as_deref().map_or(configured, |learned| learned.learning.prior)
    }

    /// The outcome prior as published, borrowed along the near-duplicates the
    /// outcome learner found when its trials chose the prior (a copy sharing
    /// the adjustments).
    pub fn served_prior(&self) -> OutcomePrior {
        match self.learned.as_deref().and_then(|learned| learned.near.clone()) {
            Some(near) => self.prior.with_near(near),
            None => (*self.prior).clone(),
        }
    }

    /// Whether discovery ranks with something the outcome learner's trials chose now.
    pub fn uses_learned(&self) -> bool {
        self.learned().is_some_and(|learned| learned.learning.prior)
            || !std::ptr::eq(self.vectors(), &*self.index)
            || !std::ptr::eq(self.lexical(), &*self.lexical)
    }

    /// A copy sharing every `Arc` (and the Tier 0 cache).
    fn share(&self) -> DiscoverySnapshot {
        DiscoverySnapshot {
            catalog: self.catalog.clone(),
            index: self.index.clone(),
            lexical: self.lexical.clone(),
            graph: self.graph.clone(),
            graph_version: self.graph_version,
            prior: self.prior.clone(),
            learned: self.learned.clone(),
            tier0_cache: self.tier0_cache.clone(),
        }
    }
}

/// The current [`DiscoverySnapshot`], shared by the Discoverer and the
/// DiscoveryWorkers; a publication never goes back to an older catalog or
/// graph version.
#[derive(Default)]
pub struct SnapshotCell {
    current: RwLock<Arc<DiscoverySnapshot>>,
    /// Discoveries answered, by the Discoverer and every worker.
    queries: AtomicU64,
}

impl SnapshotCell {
    /// The snapshot to serve one discovery from.
    pub fn load(&self) -> Arc<DiscoverySnapshot> {
        self.current.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    fn update(&self, change: impl FnOnce(&DiscoverySnapshot) -> Option<DiscoverySnapshot>) {
        let mut current = self.current.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(next) = change(&current) {
            *current = Arc::new(next);
        }
    }

    /// Publishes a catalog with its vector and lexical indexes, unless an
    /// older version than the one served or the very same snapshot.
    pub fn publish_catalog(&self, catalog: &Arc<Catalog>, index: &Arc<VectorIndex>, lexical: &Arc<LexicalIndex>) {
        self.update(|current| {
            let same = Arc::ptr_eq(&current.catalog, catalog)
                && Arc::ptr_eq(&current.index, index)
                && Arc::ptr_eq(&current.lexical, lexical);
            (!same && catalog.version >= current.catalog.version).then(|| DiscoverySnapshot {
                catalog: catalog.clone(),
                index: index.clone(),
                lexical: lexical.clone(),
                graph: current.graph.clone(),
                graph_version: current.graph_version,
                prior: current.prior.clone(),
                learned: current.learned.clone(),
                tier0_cache: if Arc::ptr_eq(&current.catalog, catalog) {
                    current.tier0_cache.clone()
                } else {
                    Arc::default()
                },
            })
        });
    }

    /// Publishes the graph of catalog `version`, unless older than the one served.
    pub fn publish_graph(&self, version: u64, graph: &Arc<CapabilityGraph>) {
        self.update(|current| {
            (!Arc::ptr_eq(&current.graph, graph) && version >= current.graph_version).then(|| DiscoverySnapshot {
                graph: graph.clone(),
                graph_version: version,
                ..current.share()
            })
        });
    }

    /// Publishes the outcome prior.
    pub fn publish_prior(&self, prior: &Arc<OutcomePrior>) {
        self.update(|current| {
            (!Arc::ptr_eq(&current.prior, prior)).then(|| DiscoverySnapshot { prior: prior.clone(), ..current.share() })
        });
    }

    /// Publishes what the outcome learner learnt (`None`: nothing is used).
    pub fn publish_learned(&self, learned: Option<Arc<Learned>>) {
        self.update(|current| {
            let same = match (&current.learned, &learned) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
            (!same).then(|| DiscoverySnapshot { learned, ..current.share() })
        });
    }

    /// Counts one discovery answered.
    pub fn count_query(&self) {
        self.queries.fetch_add(1, Ordering::Relaxed);
    }

    /// Discoveries answered so far.
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::outcome_prior::tests::proven_and_failed;
    use crate::core::outcome_prior::NearDuplicates;
    use crate::core::outcome_trust::Learning;

    #[test]
    fn discovery_ranks_with_the_learned_words_alone_when_the_trials_chose_them() {
        let lexical = Arc::new(LexicalIndex::default());
        let learned_lexical = Arc::new(LexicalIndex::default());
        let learned = |learning: Learning, lexical_base: u64| Learned {
            base: Arc::new(VectorIndex::new(2)),
            vectors: None,
            lexical: Some(learned_lexical.clone()),
            lexical_base,
            learning,
            near: None,
        };
        let snapshot = |learned: Learned| DiscoverySnapshot {
            lexical: lexical.clone(),
            learned: Some(Arc::new(learned)),
            ..DiscoverySnapshot::default()
        };
        let words = snapshot(learned(Learning::words(false), lexical.generation()));
        assert!(std::ptr::eq(words.lexical(), &*learned_lexical), "the words, with the index's own vectors");
        assert!(std::ptr::eq(words.vectors(), &*words.index));
        assert!(words.uses_learned());
        // Beside another lexical index (a catalog published since), or for a learning without
        // the words, the published lexical index.
        let stale = snapshot(learned(Learning::words(false), lexical.generation() + 1));
        assert!(std::ptr::eq(stale.lexical(), &*lexical) && !stale.uses_learned());
        let prior = snapshot(learned(Learning::PRIOR, lexical.generation()));
        assert!(std::ptr::eq(prior.lexical(), &*lexical) && prior.uses_learned());
    }

    #[test]
    fn discovery_borrows_the_prior_along_the_near_duplicates_the_learner_published() {
        let prior = Arc::new(proven_and_failed("tool:seen", "tool:other"));
        let before = DiscoverySnapshot { prior: prior.clone(), ..DiscoverySnapshot::default() };
        assert_eq!(before.served_prior().adjustment("tool:copy"), 0.0, "nothing learnt: nothing borrowed");
        let near = NearDuplicates::from_pairs(vec!["tool:seen".into()], [("tool:copy".into(), 0, 1.0)]);
        let learned = Learned {
            base: Arc::new(VectorIndex::new(2)),
            vectors: None,
            lexical: None,
            lexical_base: 0,
            learning: Learning::PRIOR,
            near: Some(Arc::new(near)),
        };
        let after = DiscoverySnapshot { prior, learned: Some(Arc::new(learned)), ..DiscoverySnapshot::default() };
        let served = after.served_prior();
        assert!(served.adjustment("tool:seen") > 0.0);
        assert_eq!(served.adjustment("tool:copy"), served.adjustment("tool:seen"));
        assert_eq!(served.adjustment("tool:other"), after.prior.adjustment("tool:other"));
    }
}
