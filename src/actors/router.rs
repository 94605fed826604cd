//! Router: answers discovery queries. It holds the latest catalog, vector
//! index, lexical index and graph snapshots (published by the Indexer and GraphBuilder), asks the
//! Embedder for the query vector, and calls `core::discovery::discover`.

use crate::actors::embedder::EmbedTexts;
use crate::actors::graph_builder::GraphPublished;
use crate::actors::indexer::CatalogPublished;
use crate::actors::kpi::PriorPublished;
use crate::actors::Observe;
use crate::core::capability_prior::PriorSnapshot;
use crate::core::catalog::Catalog;
use crate::core::discovery::{discover_with_prior, DiscoveryConfig, DiscoveryFilter, DiscoveryResult};
use crate::core::graph::CapabilityGraph;
use crate::core::index::VectorIndex;
use crate::core::lexical::LexicalIndex;
use crate::core::retrieval::{query_texts, Indexes, Query};
use crate::core::tiers::TokenBudget;
use actix::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
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
    catalog: Arc<Catalog>,
    index: Arc<VectorIndex>,
    lexical: Arc<LexicalIndex>,
    graph: Arc<CapabilityGraph>,
    graph_version: u64,
    /// Tier 0 per (filter, budget), valid for `tier0_version` only.
    tier0_cache: HashMap<String, String>,
    tier0_version: u64,
    queries: u64,
    /// The outcome prior from KpiTelemetry, and whether queries apply it by default.
    prior: Arc<PriorSnapshot>,
    prior_enabled: bool,
}

impl Router {
    pub fn new(config: DiscoveryConfig, embedder: Recipient<EmbedTexts>) -> Router {
        Router {
            config,
            embedder,
            catalog: Arc::new(Catalog::default()),
            index: Arc::new(VectorIndex::default()),
            lexical: Arc::new(LexicalIndex::default()),
            graph: Arc::new(CapabilityGraph::default()),
            graph_version: 0,
            tier0_cache: HashMap::new(),
            tier0_version: 0,
            queries: 0,
            prior: Arc::new(PriorSnapshot::neutral()),
            prior_enabled: false,
        }
    }

    /// Applies the outcome prior to queries unless they say otherwise (`[discovery] outcome_prior`).
    pub fn with_outcome_prior(mut self, enabled: bool) -> Router {
        self.prior_enabled = enabled;
        self
    }

    /// Returns Tier 0 for `filter`, cached per catalog version; the cache key
    /// holds the whole filter, so one query's exclusions never leak into another's.
    fn tier0(&mut self, filter: &DiscoveryFilter, budget: TokenBudget) -> String {
        if self.tier0_version != self.catalog.version {
            self.tier0_cache.clear();
            self.tier0_version = self.catalog.version;
        }
        let key = format!("{}|{}", budget.max_tokens(), serde_json::to_string(filter).unwrap_or_default());
        if let Some(text) = self.tier0_cache.get(&key) {
            return text.clone();
        }
        let text = self.catalog.tier0(filter, budget);
        if self.tier0_cache.len() >= 1024 {
            self.tier0_cache.clear();
        }
        self.tier0_cache.insert(key, text.clone());
        text
    }
}

impl Actor for Router {
    type Context = Context<Self>;
}

impl Handler<CatalogPublished> for Router {
    type Result = ();

    fn handle(&mut self, msg: CatalogPublished, _: &mut Context<Self>) {
        self.catalog = msg.catalog;
        self.index = msg.index;
        self.lexical = msg.lexical;
    }
}

impl Handler<GraphPublished> for Router {
    type Result = ();

    fn handle(&mut self, msg: GraphPublished, _: &mut Context<Self>) {
        if msg.version >= self.graph_version {
            self.graph = msg.graph;
            self.graph_version = msg.version;
        }
    }
}

impl Handler<PriorPublished> for Router {
    type Result = ();

    fn handle(&mut self, msg: PriorPublished, _: &mut Context<Self>) {
        self.prior = msg.prior;
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
            let config = match msg.config {
                Some(config) => {
                    config.validate()?;
                    config
                }
                None => actor.config.clone(),
            };
            let embedded = embedded.map_err(|err| RouterError::Embedder(err.to_string()))?;
            let embed_us = started.elapsed().as_secs_f64() * 1e6;
            // Best effort: without vectors, rank by the lexical and graph signals and say so.
            let query = match embedded.vectors {
                Ok(vectors) if vectors.len() == texts.len() => Query::new(texts, vectors),
                Ok(vectors) => Query::without_vectors(
                    texts.clone(),
                    format!("embedder_bad_response: {} vectors for {} texts", vectors.len(), texts.len()),
                ),
                Err(err) => Query::without_vectors(texts, err.to_string()),
            };
            let tier0 = actor.tier0(&msg.filter, TokenBudget::new(config.tier0_token_budget));
            let indexes = Indexes {
                catalog: &actor.catalog,
                vectors: &actor.index,
                lexical: &actor.lexical,
                graph: &actor.graph,
            };
            let prior = msg.filter.outcome_prior.unwrap_or(actor.prior_enabled).then_some(&*actor.prior);
            let mut result = discover_with_prior(&query, &indexes, &config, &msg.filter, tier0, prior);
            result.diagnostics.timings.embed_us = embed_us;
            actor.queries += 1;
            metrics::counter!("capdex_discover_requests_total").increment(1);
            metrics::histogram!("capdex_discover_duration_seconds").record(started.elapsed().as_secs_f64());
            Ok(result)
        }))
    }
}

impl Handler<CurrentCatalog> for Router {
    type Result = MessageResult<CurrentCatalog>;

    fn handle(&mut self, _: CurrentCatalog, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.catalog.clone())
    }
}

impl Handler<Observe<RouterStats>> for Router {
    type Result = MessageResult<Observe<RouterStats>>;

    fn handle(&mut self, _: Observe<RouterStats>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(RouterStats {
            catalog_version: self.catalog.version,
            graph_version: self.graph_version,
            capabilities: self.catalog.len(),
            queries: self.queries,
        })
    }
}
