//! OutcomeLearner: learns from the turns' outcomes while capdex serves
//! (`core::outcome_learning`), on a thread of its own.
//!
//! - A planned turn with a `turnId` ([`TurnPlanned`], from the plan path)
//!   leaves its message here.
//! - The KPI actor sends each new outcome that names a `turnId` and
//!   capabilities ([`OutcomeToLearn`]); a successful one is embedded (by the
//!   Embedder), tried and remembered against the snapshot discovery serves,
//!   and the memory's entries and the trials are written to the store
//!   (`store::learning`).
//! - What the trials chose is published into the [`SnapshotCell`]
//!   (`publish_learned`), fitted to the vector index served; a new catalog is
//!   fitted again on the next tick.
//!
//! Both messages are sent with `try_send` into a bounded mailbox: when the
//! learner falls behind, outcomes go unlearnt (counted), never does a sender wait.

use crate::actors::embedder::EmbedTexts;
use crate::actors::snapshot::SnapshotCell;
use crate::actors::Inspect;
use crate::config::OutcomeLearningSettings;
use crate::core::discovery::DiscoveryConfig;
use crate::core::embedder::TextRole;
use crate::core::outcome_learning::{OutcomeLearning, Serving, TurnMessages};
use crate::core::outcome_trust::Learning;
use crate::core::retrieval::{query_texts, Indexes, Query};
use crate::store::learning::{LearningStore, LearntModel};
use actix::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages the learner's mailbox holds; more are dropped by their senders.
pub const MAILBOX_CAPACITY: usize = 4096;

/// How often a new catalog publication is looked for, to fit the memory to it.
const TICK: Duration = Duration::from_secs(1);

/// A turn was planned: its message, kept for its outcome.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct TurnPlanned {
    pub turn_id: String,
    pub message: String,
}

/// A new (not repeated) outcome of turn `turn_id`, scored `score`, naming `capabilities`.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct OutcomeToLearn {
    pub turn_id: String,
    pub capabilities: Vec<String>,
    pub score: f32,
}

/// What the learner has done, for tests and the logs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LearnerStats {
    /// Turns whose message is kept.
    pub turns: usize,
    /// Capabilities with remembered requests.
    pub remembered: usize,
    pub trials: u64,
    /// Successful outcomes learnt.
    pub learnt: u64,
    /// Outcomes of a turn not planned here (or no longer kept).
    pub without_turn: u64,
    /// The learning the trials chose, if any.
    pub chosen: Option<Learning>,
    /// Whether discovery ranks with it now.
    pub in_use: bool,
}

pub struct OutcomeLearner {
    learning: OutcomeLearning,
    turns: TurnMessages,
    snapshots: Arc<SnapshotCell>,
    embedder: Recipient<EmbedTexts>,
    config: DiscoveryConfig,
    settings: OutcomeLearningSettings,
    store: Option<LearningStore>,
    last_refit: Option<Instant>,
    stats: LearnerStats,
}

impl OutcomeLearner {
    /// A learner serving `snapshots`, with what `store` kept for `model`
    /// (`None`: nothing is kept). `prior`: whether discovery applies the outcome prior.
    pub fn new(
        settings: OutcomeLearningSettings,
        config: DiscoveryConfig,
        prior: bool,
        snapshots: Arc<SnapshotCell>,
        embedder: Recipient<EmbedTexts>,
        model: LearntModel,
        store: Option<LearningStore>,
    ) -> Result<OutcomeLearner, crate::store::StoreError> {
        let learning = match &store {
            Some(store) => {
                let kept = store.load(&model)?;
                if kept.refused > 0 {
                    tracing::warn!(refused = kept.refused, "outcome memory entries that do not decode were dropped");
                }
                OutcomeLearning::restore(kept.memory, kept.trust, prior)
            }
            None => OutcomeLearning::new(model.dimensions, prior),
        };
        Ok(OutcomeLearner {
            learning,
            turns: TurnMessages::new(settings.turns),
            snapshots,
            embedder,
            config,
            settings,
            store,
            last_refit: None,
            stats: LearnerStats::default(),
        })
    }

    /// Whether the memory's vectors may be fitted again now (at most once per `refit_interval_ms`).
    fn may_refit(&mut self) -> bool {
        let interval = Duration::from_millis(self.settings.refit_interval_ms);
        let may = self.last_refit.is_none_or(|last| last.elapsed() >= interval);
        if may {
            self.last_refit = Some(Instant::now());
        }
        may
    }

    /// Learns one successful turn: `texts` (its message and clauses) embedded as `vectors`.
    fn learn(&mut self, texts: Vec<String>, vectors: Vec<Vec<f32>>, succeeded: &[String]) {
        let snapshot = self.snapshots.load();
        if snapshot.catalog.len() > self.settings.max_capabilities {
            metrics::counter!("capdex_outcome_learning_skipped_total", "reason" => "catalog_too_large").increment(1);
            return;
        }
        let query = Query::new(texts, vectors);
        let may_refit = self.may_refit();
        let indexes = Indexes {
            catalog: &snapshot.catalog,
            vectors: &snapshot.index,
            lexical: &snapshot.lexical,
            graph: &snapshot.graph,
        };
        let serving = Serving::new(indexes, &snapshot.index, &self.config, Some(&snapshot.prior));
        let (trial, remembered) = self.learning.learn(&query, succeeded, &serving, may_refit);
        if let Some(trial) = &trial {
            let unseen = if trial.unseen { "true" } else { "false" };
            metrics::counter!("capdex_outcome_learning_trials_total", "unseen" => unseen).increment(1);
        }
        if remembered.is_empty() {
            return;
        }
        self.stats.learnt += 1;
        metrics::counter!("capdex_outcome_learning_learnt_total").increment(1);
        if let Some(store) = &self.store {
            if let Err(err) = store.save(self.learning.memory(), &remembered, &self.learning.trust().state()) {
                tracing::warn!(error = %err, "the outcome memory could not be stored");
            }
        }
        self.publish(false);
    }

    /// Publishes what discovery should use now with the served index.
    fn publish(&mut self, tick: bool) {
        let snapshot = self.snapshots.load();
        if !self.settings.enabled || snapshot.catalog.len() > self.settings.max_capabilities {
            self.snapshots.publish_learned(None);
            return;
        }
        let current = snapshot.learned.clone();
        let fitted_to_served = current.as_ref().is_some_and(|learned| Arc::ptr_eq(&learned.base, &snapshot.index));
        // On a tick, only a new publication of the catalog needs a fit.
        if tick && fitted_to_served {
            return;
        }
        // The memory is fitted again as it grows by the trials (`learn`); here only for a new index.
        let published = Indexes {
            catalog: &snapshot.catalog,
            vectors: &snapshot.index,
            lexical: &snapshot.lexical,
            graph: &snapshot.graph,
        };
        let learned = self.learning.learned(&snapshot.index, &published, false);
        let unchanged = match (&current, &learned) {
            (Some(current), Some(learned)) => {
                let same_vectors = match (&current.vectors, &learned.vectors) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                };
                let same_near = match (&current.near, &learned.near) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                };
                let same_lexical = match (&current.lexical, &learned.lexical) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                };
                same_vectors
                    && same_near
                    && same_lexical
                    && current.lexical_base == learned.lexical_base
                    && current.learning == learned.learning
                    && Arc::ptr_eq(&current.base, &learned.base)
            }
            (None, None) => true,
            _ => false,
        };
        if !unchanged {
            let chosen = learned.as_ref().map(|learned| learned.learning);
            if chosen != current.as_ref().map(|current| current.learning) {
                let trials = self.learning.trust().trials();
                tracing::info!(learning = ?chosen, trials, "what discovery uses of the outcomes changed");
            }
            self.snapshots.publish_learned(learned.map(Arc::new));
        }
        let served = self.snapshots.load();
        metrics::gauge!("capdex_outcome_learning_in_use").set(if served.uses_learned() { 1.0 } else { 0.0 });
        let borrowing =
            served.learned.as_deref().and_then(|learned| learned.near.as_deref()).map_or(0, |near| near.len());
        metrics::gauge!("capdex_outcome_learning_near_duplicates").set(borrowing as f64);
    }
}

impl Actor for OutcomeLearner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(MAILBOX_CAPACITY);
        ctx.run_interval(TICK, |actor, _| actor.publish(true));
    }
}

impl Handler<TurnPlanned> for OutcomeLearner {
    type Result = ();

    fn handle(&mut self, msg: TurnPlanned, _: &mut Context<Self>) {
        if self.settings.enabled {
            self.turns.insert(&msg.turn_id, &msg.message);
        }
    }
}

impl Handler<OutcomeToLearn> for OutcomeLearner {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, msg: OutcomeToLearn, _: &mut Context<Self>) -> Self::Result {
        let message = self.turns.take(&msg.turn_id);
        let Some(message) = message.filter(|_| self.settings.enabled) else {
            self.stats.without_turn += 1;
            return Box::pin(fut::ready(()));
        };
        // Only what did the job is learnt: a failed turn says nothing of which capability was wrong.
        if msg.score < 0.5 || msg.capabilities.is_empty() {
            return Box::pin(fut::ready(()));
        }
        let texts = query_texts(&message);
        let request = self.embedder.send(EmbedTexts { texts: texts.clone(), role: TextRole::Query });
        Box::pin(request.into_actor(self).map(move |embedded, actor, _| match embedded {
            Ok(answer) => match answer.vectors {
                Ok(vectors) if vectors.len() == texts.len() => actor.learn(texts, vectors, &msg.capabilities),
                Ok(_) | Err(_) => {
                    metrics::counter!("capdex_outcome_learning_skipped_total", "reason" => "embedder").increment(1);
                }
            },
            Err(_) => {
                metrics::counter!("capdex_outcome_learning_skipped_total", "reason" => "embedder").increment(1);
            }
        }))
    }
}

impl Handler<Inspect<LearnerStats>> for OutcomeLearner {
    type Result = MessageResult<Inspect<LearnerStats>>;

    fn handle(&mut self, _: Inspect<LearnerStats>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(LearnerStats {
            turns: self.turns.len(),
            remembered: self.learning.memory().len(),
            trials: self.learning.trust().trials(),
            chosen: self.learning.trust().chosen(),
            in_use: self.snapshots.load().uses_learned(),
            ..self.stats.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::embedder::Embedder;
    use crate::actors::test_support::tool;
    use crate::core::catalog::Catalog;
    use crate::core::embedder::{Embed, HashingEmbedder};
    use crate::core::graph::CapabilityGraph;
    use crate::core::index::VectorIndex;
    use crate::core::lexical::LexicalIndex;
    use crate::core::outcome_learning::tests::ASKED;
    use crate::core::text::embedding_text;
    use crate::store::Store;

    const SETTINGS: OutcomeLearningSettings =
        OutcomeLearningSettings { enabled: true, turns: 100, max_capabilities: 1000, refit_interval_ms: 0 };

    /// A cell serving a few tools, as the Indexer and GraphBuilder publish them.
    fn served() -> Arc<SnapshotCell> {
        let embedder = HashingEmbedder::default();
        let descriptors = vec![
            tool("ledger", "Record payments against open accounts payable entries"),
            tool("plumbing", "Find a plumber near you and book a visit"),
            tool("weather", "Tell the weather forecast for a city"),
        ];
        let mut catalog = Catalog { version: 1, ..Catalog::default() };
        let mut index = VectorIndex::new(embedder.dimensions());
        for descriptor in &descriptors {
            index.upsert(&descriptor.id, &embedder.embed(&embedding_text(descriptor))).unwrap();
            catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
        }
        let cell = Arc::new(SnapshotCell::default());
        let graph = Arc::new(CapabilityGraph::build_from(catalog.descriptors.values(), &[]));
        cell.publish_catalog(&Arc::new(catalog), &Arc::new(index), &Arc::new(LexicalIndex::build(&descriptors)));
        cell.publish_graph(1, &graph);
        cell
    }

    fn learner(cell: &Arc<SnapshotCell>, store: Option<LearningStore>) -> Addr<OutcomeLearner> {
        let embedder = SyncArbiter::start(1, || Embedder::new(Box::new(HashingEmbedder::default())));
        let model = LearntModel { model_id: HashingEmbedder::default().model_id(), dimensions: 512 };
        let config = DiscoveryConfig { use_graph_reranking: false, ..DiscoveryConfig::default() };
        OutcomeLearner::new(SETTINGS, config, false, cell.clone(), embedder.recipient(), model, store).unwrap().start()
    }

    async fn teach(learner: &Addr<OutcomeLearner>, rounds: usize) {
        for round in 0..rounds {
            for (i, asked) in ASKED.iter().enumerate() {
                let turn_id = format!("r{round}t{i}");
                learner.send(TurnPlanned { turn_id: turn_id.clone(), message: asked.to_string() }).await.unwrap();
                let outcome = OutcomeToLearn { turn_id, capabilities: vec!["tool:ledger".into()], score: 1.0 };
                learner.send(outcome).await.unwrap();
            }
        }
    }

    #[actix::test]
    async fn successes_of_planned_turns_are_learnt_and_used_once_the_trials_gain() {
        let cell = served();
        let data = tempfile::tempdir().unwrap();
        let store = Store::open(data.path()).unwrap();
        let learner = learner(&cell, Some(LearningStore::open(&store).unwrap()));
        // Outcomes of unplanned turns, and failed turns, teach nothing.
        let stray = OutcomeToLearn { turn_id: "nobody".into(), capabilities: vec!["tool:ledger".into()], score: 1.0 };
        learner.send(stray).await.unwrap();
        learner.send(TurnPlanned { turn_id: "f".into(), message: ASKED[0].into() }).await.unwrap();
        let failed = OutcomeToLearn { turn_id: "f".into(), capabilities: vec!["tool:ledger".into()], score: 0.0 };
        learner.send(failed).await.unwrap();
        let stats = learner.send(Inspect::<LearnerStats>::new()).await.unwrap();
        assert_eq!((stats.without_turn, stats.learnt, stats.remembered, stats.turns), (1, 0, 0, 0));

        teach(&learner, 6).await;
        let stats = learner.send(Inspect::<LearnerStats>::new()).await.unwrap();
        assert_eq!((stats.learnt, stats.remembered, stats.trials), (36, 1, 35));
        assert!(stats.chosen.is_some() && stats.in_use, "{stats:?}");
        assert!(cell.load().uses_learned());

        // A new catalog publication is served without the learnt vectors until they are fitted to it.
        let snapshot = cell.load();
        let mut catalog = (*snapshot.catalog).clone();
        catalog.version += 1;
        let republished = Arc::new((*snapshot.index).clone());
        cell.publish_catalog(&Arc::new(catalog), &republished, &snapshot.lexical);
        assert!(!cell.load().uses_learned());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !cell.load().uses_learned() && std::time::Instant::now() < deadline {
            actix::clock::sleep(Duration::from_millis(50)).await;
        }
        assert!(cell.load().uses_learned(), "fitted again on the tick");

        // What was learnt comes back from the store.
        store.flush().unwrap();
        let again = learner_with_kept(&store).await;
        assert_eq!((again.remembered, again.trials, again.chosen), (1, 35, stats.chosen));
    }

    async fn learner_with_kept(store: &Store) -> LearnerStats {
        let cell = served();
        let learner = learner(&cell, Some(LearningStore::open(store).unwrap()));
        learner.send(Inspect::<LearnerStats>::new()).await.unwrap()
    }

    #[actix::test]
    async fn switched_off_it_keeps_no_turn_and_publishes_nothing() {
        let cell = served();
        let embedder = SyncArbiter::start(1, || Embedder::new(Box::new(HashingEmbedder::default())));
        let model = LearntModel { model_id: "hashing".into(), dimensions: 512 };
        let off = OutcomeLearningSettings { enabled: false, ..SETTINGS };
        let learner = OutcomeLearner::new(
            off,
            DiscoveryConfig::default(),
            false,
            cell.clone(),
            embedder.recipient(),
            model,
            None,
        )
        .unwrap()
        .start();
        teach(&learner, 2).await;
        let stats = learner.send(Inspect::<LearnerStats>::new()).await.unwrap();
        assert_eq!((stats.turns, stats.learnt, stats.without_turn, stats.in_use), (0, 0, 12, false));
    }
}
