//! Router: owns what discovery serves from, the [`SnapshotCell`] holding the
//! latest catalog, vector index, lexical index, graph and outcome prior (the
//! Indexer and GraphBuilder publish into it, the KPI actor through the Router),
//! and answers discovery queries itself by asking the Embedder for the query
//! vectors and calling `core::discovery::discover_with_prior` ([`run_discovery`]).
//! The NATS service's discoveries run on the DiscoveryWorkers
//! (`discovery_worker.rs`), which read the same cell.

use crate::actors::embedder::EmbedTexts;
use crate::actors::graph_builder::GraphPublished;
use crate::actors::indexer::CatalogPublished;
use crate::actors::kpi::PriorPublished;
use crate::actors::Observe;
use crate::core::catalog::Catalog;
use crate::core::discovery::{discover_with_prior, DiscoveryConfig, DiscoveryFilter, DiscoveryResult};
use crate::core::embedder::EmbedError;
use crate::core::graph::CapabilityGraph;
use crate::core::index::VectorIndex;
use crate::core::lexical::LexicalIndex;
use crate::core::outcome_prior::OutcomePrior as PriorSnapshot;
use crate::core::retrieval::{query_texts, Indexes, Query};
use crate::core::tiers::TokenBudget;
use actix::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// One discovery query.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<DiscoveryResult, RouterError>")]
pub struct Discover {
    pub query: String,
    pub filter: DiscoveryFilter,
    /// Per-query settings; `None` uses the configured ones.
    pub config: Option<DiscoveryConfig>,
}

/// Asks for the catalog snapshot the router serves from.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Arc<Catalog>")]
pub struct CurrentCatalog;

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("the embedder did not answer: {0}")]
    Embedder(String),
    #[error("per-query settings are not valid: {0}")]
    Config(#[from] crate::core::discovery::ConfigProblem),
}

/// What the router serves from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouterStats {
    pub catalog_version: u64,
    pub graph_version: u64,
    pub capabilities: usize,
    pub queries: u64,
}

pub struct Router {
    config: DiscoveryConfig,
    embedder: Recipient<EmbedTexts>,
    /// What discovery serves from; the DiscoveryWorkers read the same cell.
    snapshots: Arc<SnapshotCell>,
    /// Whether queries apply the outcome prior by default.
    prior_enabled: bool,
}

impl Router {
    pub fn new(config: DiscoveryConfig, embedder: Recipient<EmbedTexts>) -> Router {
        Router { config, embedder, snapshots: Arc::new(SnapshotCell::default()), prior_enabled: false }
    }

    /// Applies the outcome prior to queries unless they say otherwise (`[discovery] outcome_prior`).
    pub fn with_outcome_prior(mut self, enabled: bool) -> Router {
        self.prior_enabled = enabled;
        self
    }

    /// Serves from (and publishes into) `snapshots`, shared with the Indexer,
    /// the GraphBuilder and the DiscoveryWorkers.
    pub fn with_snapshot_cell(mut self, snapshots: Arc<SnapshotCell>) -> Router {
        self.snapshots = snapshots;
        self
    }
}

/// Everything one discovery reads, of one catalog version: immutable `Arc`
/// snapshots, plus the Tier 0 texts already rendered for that catalog.
#[derive(Default)]
pub struct DiscoverySnapshot {
    pub catalog: Arc<Catalog>,
    pub index: Arc<VectorIndex>,
    pub lexical: Arc<LexicalIndex>,
    pub graph: Arc<CapabilityGraph>,
    pub graph_version: u64,
    pub prior: Arc<PriorSnapshot>,
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
}

/// The current [`DiscoverySnapshot`], shared by the Router and the
/// DiscoveryWorkers. The Indexer and the GraphBuilder publish into it directly
/// before they reply (so a discovery after an upsert's reply sees the upsert),
/// the Router on its messages (catalog, graph, outcome prior); a publication
/// never goes back to an older catalog or graph version.
#[derive(Default)]
pub struct SnapshotCell {
    current: RwLock<Arc<DiscoverySnapshot>>,
    /// Discoveries answered, by the Router and every worker.
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
    pub fn publish_catalog(&self, published: &CatalogPublished) {
        self.update(|current| {
            let same = Arc::ptr_eq(&current.catalog, &published.catalog)
                && Arc::ptr_eq(&current.index, &published.index)
                && Arc::ptr_eq(&current.lexical, &published.lexical);
            (!same && published.catalog.version >= current.catalog.version).then(|| DiscoverySnapshot {
                catalog: published.catalog.clone(),
                index: published.index.clone(),
                lexical: published.lexical.clone(),
                graph: current.graph.clone(),
                graph_version: current.graph_version,
                prior: current.prior.clone(),
                tier0_cache: if Arc::ptr_eq(&current.catalog, &published.catalog) {
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
    pub fn publish_prior(&self, prior: &Arc<PriorSnapshot>) {
        self.update(|current| {
            (!Arc::ptr_eq(&current.prior, prior)).then(|| DiscoverySnapshot { prior: prior.clone(), ..current.share() })
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

impl DiscoverySnapshot {
    /// A copy sharing every `Arc` (and the Tier 0 cache).
    fn share(&self) -> DiscoverySnapshot {
        DiscoverySnapshot {
            catalog: self.catalog.clone(),
            index: self.index.clone(),
            lexical: self.lexical.clone(),
            graph: self.graph.clone(),
            graph_version: self.graph_version,
            prior: self.prior.clone(),
            tier0_cache: self.tier0_cache.clone(),
        }
    }
}

/// Runs one discovery on `snapshot`: the query `texts` (the message and its
/// clauses, `query_texts`) with the embedder's answer for them, which took
/// `embed_us`. Shared by the Router and the DiscoveryWorkers, so both answer alike.
pub fn run_discovery(
    snapshot: &DiscoverySnapshot,
    defaults: &DiscoveryConfig,
    prior_enabled: bool,
    discover: &Discover,
    texts: Vec<String>,
    vectors: Result<Vec<Vec<f32>>, EmbedError>,
    embed_us: f64,
) -> Result<DiscoveryResult, RouterError> {
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
    let tier0 = snapshot.tier0(&discover.filter, TokenBudget::new(config.tier0_token_budget));
    let indexes = Indexes {
        catalog: &snapshot.catalog,
        vectors: &snapshot.index,
        lexical: &snapshot.lexical,
        graph: &snapshot.graph,
    };
    let prior = discover.filter.outcome_prior.unwrap_or(prior_enabled).then_some(&*snapshot.prior);
    let mut result = discover_with_prior(&query, &indexes, config, &discover.filter, tier0, prior);
    result.diagnostics.timings.embed_us = embed_us;
    metrics::counter!("capdex_discover_requests_total").increment(1);
    metrics::histogram!("capdex_discover_duration_seconds").record(started.elapsed().as_secs_f64() + embed_us / 1e6);
    Ok(result)
}

impl Actor for Router {
    type Context = Context<Self>;
}

impl Handler<CatalogPublished> for Router {
    type Result = ();

    fn handle(&mut self, msg: CatalogPublished, _: &mut Context<Self>) {
        self.snapshots.publish_catalog(&msg);
    }
}

impl Handler<GraphPublished> for Router {
    type Result = ();

    fn handle(&mut self, msg: GraphPublished, _: &mut Context<Self>) {
        self.snapshots.publish_graph(msg.version, &msg.graph);
    }
}

impl Handler<PriorPublished> for Router {
    type Result = ();

    fn handle(&mut self, msg: PriorPublished, _: &mut Context<Self>) {
        self.snapshots.publish_prior(&msg.prior);
    }
}

impl Handler<Discover> for Router {
    type Result = ResponseActFuture<Self, Result<DiscoveryResult, RouterError>>;

    fn handle(&mut self, msg: Discover, _: &mut Context<Self>) -> Self::Result {
        let started = Instant::now();
        // The whole message and its clauses are embedded in one request.
        let texts = query_texts(&msg.query);
        let request = self.embedder.send(EmbedTexts { texts: texts.clone() });
        Box::pin(request.into_actor(self).map(move |embedded, actor, _| {
            let embedded = embedded.map_err(|err| RouterError::Embedder(err.to_string()))?;
            let embed_us = started.elapsed().as_secs_f64() * 1e6;
            let snapshot = actor.snapshots.load();
            let result =
                run_discovery(&snapshot, &actor.config, actor.prior_enabled, &msg, texts, embedded.vectors, embed_us);
            actor.snapshots.count_query();
            result
        }))
    }
}

impl Handler<CurrentCatalog> for Router {
    type Result = MessageResult<CurrentCatalog>;

    fn handle(&mut self, _: CurrentCatalog, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.snapshots.load().catalog.clone())
    }
}

impl Handler<Observe<RouterStats>> for Router {
    type Result = MessageResult<Observe<RouterStats>>;

    fn handle(&mut self, _: Observe<RouterStats>, _: &mut Context<Self>) -> Self::Result {
        let snapshot = self.snapshots.load();
        MessageResult(RouterStats {
            catalog_version: snapshot.catalog.version,
            graph_version: snapshot.graph_version,
            capabilities: snapshot.catalog.len(),
            queries: self.snapshots.queries(),
        })
    }
}
