//! Discoverer: answers discovery queries ([`Discover`]) by asking the Embedder
//! for the query vectors and calling `core::discovery::discover_with_prior`
//! ([`run_discovery`]) on the current [`SnapshotCell`] snapshot
//! (`snapshot.rs`). The Indexer and GraphBuilder publish into that cell
//! themselves; the Discoverer publishes what reaches it as messages (catalogs,
//! graphs, and the KPI actor's outcome prior). The NATS service's discoveries
//! run on the DiscoveryWorkers (`discovery_worker.rs`), which read the same
//! cell and call the same [`run_discovery`].
//!
//! Both ask the model for the chatter sentences' vectors once, with the
//! first query the chatter gate (`core::discovery::asks_for_nothing`)
//! applies to ([`ChatterVectors`]).
//!
//! It is not the SCG's router: `Route` and `RouteIndex` (`actors::scg`,
//! `core::scg::route`) rank recipes over the Source Capability Graph.

use crate::actors::embedder::EmbedTexts;
use crate::actors::graph_builder::GraphPublished;
use crate::actors::indexer::CatalogPublished;
use crate::actors::kpi::PriorPublished;
use crate::actors::snapshot::{DiscoverySnapshot, SnapshotCell};
use crate::actors::Inspect;
use crate::core::catalog::Catalog;
use crate::core::discovery::{discover_with_prior, DiscoveryConfig, DiscoveryFilter, DiscoveryResult};
use crate::core::embedder::{EmbedError, TextRole};
use crate::core::retrieval::{query_texts, Indexes, Query};
use crate::core::tiers::TokenBudget;
use actix::prelude::*;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// The chatter sentences' vectors (`core::nothing_fits::GENERIC_SENTENCES`)
/// by the Embedder actor's model, asked of it with the first query the
/// chatter gate applies to ([`ChatterVectors::texts_for`]) and kept: the
/// model does not change while the process serves. Clones share one copy.
#[derive(Clone, Debug, Default)]
pub struct ChatterVectors(Arc<OnceLock<Arc<Vec<Vec<f32>>>>>);

impl ChatterVectors {
    /// What is known (empty until the embedder answered once).
    pub fn get(&self) -> Arc<Vec<Vec<f32>>> {
        self.0.get().cloned().unwrap_or_default()
    }

    /// The texts to ask the embedder for a query's `texts`: those, then the
    /// chatter sentences while their vectors are not yet known.
    pub fn texts_for(&self, mut texts: Vec<String>) -> Vec<String> {
        if self.0.get().is_none() {
            texts.extend(crate::core::nothing_fits::chatter_texts());
        }
        texts
    }

    /// Takes the embedder's answer for [`ChatterVectors::texts_for`] of a
    /// query of `n_query` texts: keeps the chatter sentences' vectors when
    /// they were asked for and came (two first queries may both have asked;
    /// the first answer is kept), and returns the query's own. An answer of
    /// any other length is returned whole (the discovery says what is wrong with it).
    pub fn take(&self, answer: Result<Vec<Vec<f32>>, EmbedError>, n_query: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut vectors = answer?;
        if vectors.len() == n_query + crate::core::nothing_fits::GENERIC_SENTENCES.len() {
            let chatter = vectors.split_off(n_query);
            let _ = self.0.set(Arc::new(chatter));
        }
        Ok(vectors)
    }
}

/// The vectors of a query's texts (or why there are none), the microseconds
/// they took, and the chatter sentences' vectors by the same model (empty
/// while unknown: then the chatter gate cannot apply).
pub struct QueryVectors {
    pub vectors: Result<Vec<Vec<f32>>, EmbedError>,
    pub embed_us: f64,
    pub chatter: Arc<Vec<Vec<f32>>>,
}

/// One discovery query.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<DiscoveryResult, DiscovererError>")]
pub struct Discover {
    pub query: String,
    pub filter: DiscoveryFilter,
    /// Per-query settings; `None` uses the configured ones.
    pub config: Option<DiscoveryConfig>,
    /// Explain each Tier 1 entry (`DiscoveryResult::explanations`).
    pub explain: bool,
}

/// Asks for the catalog snapshot the Discoverer serves from.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Arc<Catalog>")]
pub struct CurrentCatalog;

#[derive(Debug, thiserror::Error)]
pub enum DiscovererError {
    #[error("the embedder did not answer: {0}")]
    Embedder(String),
    #[error("per-query settings are not valid: {0}")]
    Config(#[from] crate::core::discovery::ConfigProblem),
}

/// What the Discoverer serves from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiscovererStats {
    pub catalog_version: u64,
    pub graph_version: u64,
    pub capabilities: usize,
    pub queries: u64,
}

pub struct Discoverer {
    config: DiscoveryConfig,
    embedder: Recipient<EmbedTexts>,
    /// What discovery serves from; the DiscoveryWorkers read the same cell.
    snapshots: Arc<SnapshotCell>,
    /// Whether queries apply the outcome prior by default.
    prior_enabled: bool,
    chatter: ChatterVectors,
}

impl Discoverer {
    pub fn new(config: DiscoveryConfig, embedder: Recipient<EmbedTexts>) -> Discoverer {
        Discoverer {
            config,
            embedder,
            snapshots: Arc::new(SnapshotCell::default()),
            prior_enabled: false,
            chatter: ChatterVectors::default(),
        }
    }

    /// Applies the outcome prior to queries unless they say otherwise (`[discovery] outcome_prior`).
    pub fn with_outcome_prior(mut self, enabled: bool) -> Discoverer {
        self.prior_enabled = enabled;
        self
    }

    /// Serves from (and publishes into) `snapshots`, shared with the Indexer,
    /// the GraphBuilder and the DiscoveryWorkers.
    pub fn with_snapshot_cell(mut self, snapshots: Arc<SnapshotCell>) -> Discoverer {
        self.snapshots = snapshots;
        self
    }
}

/// Runs one discovery on `snapshot`: the query `texts` (the message and its
/// clauses, `query_texts`) with what the embedder gave for them. Shared by
/// the Discoverer and the DiscoveryWorkers, so both answer alike.
pub fn run_discovery(
    snapshot: &DiscoverySnapshot,
    defaults: &DiscoveryConfig,
    prior_enabled: bool,
    discover: &Discover,
    texts: Vec<String>,
    embedded: QueryVectors,
) -> Result<DiscoveryResult, DiscovererError> {
    let QueryVectors { vectors, embed_us, chatter } = embedded;
    let started = Instant::now();
    let config = match &discover.config {
        Some(config) => {
            config.validate()?;
            config
        }
        None => defaults,
    };
    // Best effort: without vectors, rank by the lexical and graph signals and say so.
    let query = match vectors {
        Ok(vectors) if vectors.len() == texts.len() => Query::new(texts, vectors),
        Ok(vectors) => Query::without_vectors(
            texts.clone(),
            format!("embedder_bad_response: {} vectors for {} texts", vectors.len(), texts.len()),
        ),
        Err(err) => Query::without_vectors(texts, err.to_string()),
    };
    let query = if config.chatter_gate { query.with_chatter(&chatter) } else { query };
    let tier0 = snapshot.tier0(&discover.filter, TokenBudget::new(config.tier0_token_budget));
    let indexes = Indexes {
        catalog: &snapshot.catalog,
        vectors: snapshot.vectors(),
        lexical: snapshot.lexical(),
        graph: &snapshot.graph,
    };
    // The prior as the request says, else as the outcome learner's trials decided, else as configured.
    let served_prior = snapshot.served_prior();
    let prior = discover.filter.outcome_prior.unwrap_or(snapshot.applies_prior(prior_enabled)).then_some(&served_prior);
    let mut result = discover_with_prior(&query, &indexes, config, &discover.filter, tier0, prior, discover.explain);
    result.diagnostics.timings.embed_us = embed_us;
    result.diagnostics.outcome_learning = snapshot.learned().map(|learned| learned.learning);
    metrics::counter!("capdex_discover_requests_total").increment(1);
    metrics::histogram!("capdex_discover_duration_seconds").record(started.elapsed().as_secs_f64() + embed_us / 1e6);
    Ok(result)
}

impl Actor for Discoverer {
    type Context = Context<Self>;
}

impl Handler<CatalogPublished> for Discoverer {
    type Result = ();

    fn handle(&mut self, msg: CatalogPublished, _: &mut Context<Self>) {
        self.snapshots.publish_catalog(&msg.catalog, &msg.index, &msg.lexical);
    }
}

impl Handler<GraphPublished> for Discoverer {
    type Result = ();

    fn handle(&mut self, msg: GraphPublished, _: &mut Context<Self>) {
        self.snapshots.publish_graph(msg.version, &msg.graph);
    }
}

impl Handler<PriorPublished> for Discoverer {
    type Result = ();

    fn handle(&mut self, msg: PriorPublished, _: &mut Context<Self>) {
        self.snapshots.publish_prior(&msg.prior);
    }
}

impl Handler<Discover> for Discoverer {
    type Result = ResponseActFuture<Self, Result<DiscoveryResult, DiscovererError>>;

    fn handle(&mut self, msg: Discover, _: &mut Context<Self>) -> Self::Result {
        let started = Instant::now();
        // The whole message and its clauses are embedded in one request.
        let texts = query_texts(&msg.query);
        // The chatter sentences are asked for with the first query the gate applies to.
        let gate = msg.config.as_ref().unwrap_or(&self.config).chatter_gate;
        let asked = texts.clone();
        let asked = if gate { self.chatter.texts_for(asked) } else { asked };
        let request = self.embedder.send(EmbedTexts { texts: asked, role: TextRole::Query });
        Box::pin(request.into_actor(self).map(move |embedded, actor, _| {
            let embedded = embedded.map_err(|err| DiscovererError::Embedder(err.to_string()))?;
            let embed_us = started.elapsed().as_secs_f64() * 1e6;
            let snapshot = actor.snapshots.load();
            let vectors = actor.chatter.take(embedded.vectors, texts.len());
            let embedded = QueryVectors { vectors, embed_us, chatter: actor.chatter.get() };
            let result = run_discovery(&snapshot, &actor.config, actor.prior_enabled, &msg, texts, embedded);
            actor.snapshots.count_query();
            result
        }))
    }
}

impl Handler<CurrentCatalog> for Discoverer {
    type Result = MessageResult<CurrentCatalog>;

    fn handle(&mut self, _: CurrentCatalog, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.snapshots.load().catalog.clone())
    }
}

impl Handler<Inspect<DiscovererStats>> for Discoverer {
    type Result = MessageResult<Inspect<DiscovererStats>>;

    fn handle(&mut self, _: Inspect<DiscovererStats>, _: &mut Context<Self>) -> Self::Result {
        let snapshot = self.snapshots.load();
        MessageResult(DiscovererStats {
            catalog_version: snapshot.catalog.version,
            graph_version: snapshot.graph_version,
            capabilities: snapshot.catalog.len(),
            queries: self.snapshots.queries(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::embedder::Embedder;
    use crate::actors::test_support::tool;
    use crate::core::embedder::{Embed, EmbedErrorCode, HashingEmbedder};
    use crate::core::graph::CapabilityGraph;
    use crate::core::index::VectorIndex;
    use crate::core::lexical::LexicalIndex;
    use crate::core::outcome_prior::OutcomePrior;
    use crate::core::text::embedding_text;
    use crate::embedders::backend::FailingEmbedder;

    #[test]
    fn chatter_vectors_are_asked_once_and_split_off_every_answer_that_carries_them() {
        let chatter = ChatterVectors::default();
        let query = vec!["hello".to_string(), "there".to_string()];
        let asked = chatter.texts_for(query.clone());
        assert_eq!(asked.len(), 2 + crate::core::nothing_fits::GENERIC_SENTENCES.len());
        let answer = |n: usize| Ok((0..n).map(|i| vec![i as f32]).collect::<Vec<_>>());
        // Two first queries asked at once: both answers lose the sentences' vectors, the first is kept.
        assert_eq!(chatter.take(answer(asked.len()), 2).unwrap(), vec![vec![0.0], vec![1.0]]);
        assert_eq!(chatter.take(answer(asked.len()), 2).unwrap().len(), 2);
        assert_eq!(chatter.get().len(), crate::core::nothing_fits::GENERIC_SENTENCES.len());
        assert_eq!(chatter.get()[0], vec![2.0]);
        // Once known they are not asked again, and an answer is the query's own.
        assert_eq!(chatter.texts_for(query.clone()), query);
        assert_eq!(chatter.take(answer(2), 2).unwrap().len(), 2);
        // A short answer is handed on whole; an error stays an error.
        assert_eq!(chatter.take(answer(1), 2).unwrap().len(), 1);
        let failed = EmbedError::new(EmbedErrorCode::Unavailable, "down");
        assert!(chatter.take(Err(failed), 2).is_err());
    }

    /// A catalog of a few tools as `version`, with its indexes, as the Indexer publishes it.
    fn published(version: u64) -> CatalogPublished {
        let embedder = HashingEmbedder::default();
        let descriptors = vec![
            tool("invoice-lookup", "Look up an invoice by number and return its status"),
            tool("weather", "Tell the weather forecast for a city"),
            tool("send-message", "Send a message to a team channel"),
        ];
        let mut catalog = Catalog { version, ..Catalog::default() };
        let mut index = VectorIndex::new(embedder.dimensions());
        for descriptor in &descriptors {
            index.upsert(&descriptor.id, &embedder.embed(&embedding_text(descriptor))).unwrap();
            catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
        }
        let lexical = Arc::new(LexicalIndex::build(&descriptors));
        CatalogPublished { catalog: Arc::new(catalog), index: Arc::new(index), lexical }
    }

    fn discover(query: &str) -> Discover {
        Discover { query: query.to_string(), filter: DiscoveryFilter::default(), config: None, explain: false }
    }

    #[actix::test]
    async fn it_serves_what_it_is_sent_and_counts_queries() {
        let embedder = SyncArbiter::start(1, || Embedder::new(Box::new(HashingEmbedder::default())));
        let discoverer = Discoverer::new(DiscoveryConfig::default(), embedder.recipient()).start();
        let empty = discoverer.send(CurrentCatalog).await.unwrap();
        assert!(empty.is_empty());
        let catalog = published(2);
        discoverer.send(catalog.clone()).await.unwrap();
        let graph = Arc::new(CapabilityGraph::build_from(catalog.catalog.descriptors.values(), &[]));
        discoverer.send(GraphPublished { version: 2, graph }).await.unwrap();
        discoverer.send(PriorPublished { prior: Arc::new(OutcomePrior::neutral()) }).await.unwrap();
        // An older catalog never replaces a newer one.
        discoverer.send(published(1)).await.unwrap();
        let current = discoverer.send(CurrentCatalog).await.unwrap();
        assert!(Arc::ptr_eq(&current, &catalog.catalog));
        let result = discoverer.send(discover("look up invoice 42")).await.unwrap().unwrap();
        assert_eq!(result.diagnostics.embedder, "ok");
        assert_eq!(result.tier1.first().map(|entry| entry.id.as_str()), Some("tool:invoice-lookup"));
        let bad = DiscoveryConfig { tier1_min_relevance: 2.0, ..DiscoveryConfig::default() };
        let refused = discoverer.send(Discover { config: Some(bad), ..discover("weather") }).await.unwrap();
        assert!(matches!(refused, Err(DiscovererError::Config(_))));
        let stats = discoverer.send(Inspect::<DiscovererStats>::new()).await.unwrap();
        assert_eq!(stats, DiscovererStats { catalog_version: 2, graph_version: 2, capabilities: 3, queries: 2 });
    }

    #[actix::test]
    async fn without_query_vectors_it_ranks_lexically_and_says_why() {
        let embedder = SyncArbiter::start(1, || {
            Embedder::new(Box::new(FailingEmbedder {
                model_id: "remote".into(),
                error: EmbedError::new(EmbedErrorCode::Unavailable, "connection refused"),
            }))
        });
        let cell = Arc::new(SnapshotCell::default());
        let catalog = published(1);
        cell.publish_catalog(&catalog.catalog, &catalog.index, &catalog.lexical);
        let discoverer =
            Discoverer::new(DiscoveryConfig::default(), embedder.recipient()).with_snapshot_cell(cell.clone()).start();
        let result = discoverer.send(discover("weather forecast for a city")).await.unwrap().unwrap();
        assert!(result.diagnostics.embedder.starts_with("unavailable: "), "{:?}", result.diagnostics);
        assert_eq!(result.tier1.first().map(|entry| entry.id.as_str()), Some("tool:weather"));
        assert_eq!(cell.queries(), 1);
    }
}
