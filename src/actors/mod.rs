//! The actix actors: thin shells that unpack a message, call `core`, and send
//! the result on. One file per actor; messages live beside their handler.
//!
//! Flow: Scanner → Indexer (with Embedder) → GraphBuilder → Discoverer;
//! Indexer → Discoverer (catalog snapshots); KpiTelemetry → Discoverer (outcome prior);
//! KpiTelemetry → OutcomeLearner (outcomes of planned turns) → SnapshotCell (learnt vectors).
//! Everything runs on the actix System's single arbiter thread except the
//! `SyncArbiter` actors (CPU and disk bound): the Embedder, Scanner,
//! GraphBuilder and ScgMapper; and the DiscoveryWorkers (a pool of
//! `[discovery] workers` threads), which run the NATS service's discoveries
//! on every core from the `SnapshotCell` (`snapshot.rs`) while the System's thread
//! does the NATS I/O.

pub mod discoverer;
pub mod discovery_worker;
pub mod dispatcher;
pub mod embedder;
pub mod graph_builder;
pub mod indexer;
pub mod kpi;
pub mod outcome_learner;
pub mod retention;
pub mod scanner;
pub mod scg;
pub mod snapshot;
pub mod snapshot_writer;
pub mod sources;
#[cfg(test)]
mod test_support;

use crate::config::Settings;
use crate::core::catalog::BUILTIN_ORIGIN;
use crate::core::dispatch_rules::Builtin;
use crate::core::embedder::EmbedError;
use crate::embedders::backend::FailingEmbedder;
use crate::store::Store;
use actix::prelude::*;
use std::marker::PhantomData;

/// Asks an actor for a snapshot of its state (`S`), for tests and operators.
pub struct Inspect<S>(PhantomData<S>);

impl<S> Inspect<S> {
    pub fn new() -> Inspect<S> {
        Inspect(PhantomData)
    }
}

impl<S> Default for Inspect<S> {
    fn default() -> Self {
        Inspect::new()
    }
}

impl<S: 'static> Message for Inspect<S> {
    type Result = S;
}

/// The addresses of every actor.
#[derive(Clone)]
pub struct Actors {
    pub scanner: Addr<scanner::Scanner>,
    pub embedder: Addr<embedder::Embedder>,
    pub indexer: Addr<indexer::Indexer>,
    pub graph_builder: Addr<graph_builder::GraphBuilder>,
    pub discoverer: Addr<discoverer::Discoverer>,
    /// The discovery worker threads, reading the same snapshots as the Discoverer.
    pub discovery: discovery_worker::DiscoveryLanes,
    pub dispatcher: Addr<dispatcher::Dispatcher>,
    pub kpi: Addr<kpi::KpiTelemetry>,
    /// Learns from the turns' outcomes, on its own thread.
    pub learner: Addr<outcome_learner::OutcomeLearner>,
    /// The Source Capability Graph: mapper and graph, with their progress events.
    pub scg: scg::ScgActors,
}

/// Errors while starting the actors.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("failed to load state from the store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("failed to index the built-in capabilities: {0}")]
    Builtins(String),
    #[error("the embedder cannot be used")]
    Embedder(#[from] EmbedError),
    #[error("failed to start the discovery threads: {0}")]
    Threads(#[from] std::io::Error),
}

/// Starts every actor on the current actix System and indexes the built-ins.
/// Index changes are sent to `index_events` when given. Must run inside a running System.
pub async fn spawn_all(
    settings: &Settings,
    store: Store,
    index_events: Option<tokio::sync::mpsc::UnboundedSender<indexer::IndexEvent>>,
) -> Result<Actors, SpawnError> {
    // Built here so a configuration problem (a missing key variable, model
    // files) stops the start; the model then moves to the Embedder's thread.
    let model = crate::embedders::backend::build(&settings.embedder)?;
    let (model_id, dimensions) = (model.model_id(), model.dimensions());
    let model = std::sync::Mutex::new(Some(model));
    let embedder_settings = settings.embedder.clone();
    let failing_id = model_id.clone();
    let batch_size = settings.embedder.batch_size;
    let embedder = SyncArbiter::start(1, move || {
        let model = model.lock().ok().and_then(|mut slot| slot.take()).unwrap_or_else(|| {
            // The thread was restarted after a panic: build the model again.
            crate::embedders::backend::build(&embedder_settings)
                .unwrap_or_else(|error| Box::new(FailingEmbedder { model_id: failing_id.clone(), error }))
        });
        embedder::Embedder::new(model).with_batch_size(batch_size)
    });
    // What discovery serves from: the Indexer and GraphBuilder publish into it before they reply.
    let snapshots = std::sync::Arc::new(snapshot::SnapshotCell::default());
    let discoverer = discoverer::Discoverer::new(settings.discovery.clone(), embedder.clone().recipient())
        .with_outcome_prior(settings.kpi.prior.enabled)
        .with_snapshot_cell(snapshots.clone())
        .start();
    let discovery = spawn_discovery_workers(settings, &snapshots, &embedder)?;
    // On its own thread, like the Embedder: building the graph of a large catalog is CPU work.
    let discoverer_for_graph = discoverer.clone().recipient();
    let snapshots_for_graph = snapshots.clone();
    let graph_builder = SyncArbiter::start(1, move || {
        graph_builder::GraphBuilder::new(Vec::new(), vec![discoverer_for_graph.clone()])
            .with_snapshot_cell(snapshots_for_graph.clone())
    });
    let dispatcher = dispatcher::Dispatcher::new(store.clone(), settings.dispatch.clone())?
        .with_figures_capacity(settings.retention.dispatch_figures_max_count)
        .start();
    let mut indexer = indexer::Indexer::load(
        store.clone(),
        embedder.clone().recipient(),
        graph_builder.clone().recipient(),
        vec![discoverer.clone().recipient()],
        &model_id,
        dimensions,
    )?;
    if let Some(events) = index_events {
        indexer = indexer.with_events(events);
    }
    indexer = indexer.with_snapshot_cell(snapshots.clone());
    let indexer = indexer.start();
    let scan_dirs = settings.capability_dirs.clone();
    let indexer_for_scanner = indexer.clone().recipient();
    let scan_limits = settings.scan_limits;
    let scanner = SyncArbiter::start(1, move || {
        scanner::Scanner::new(scan_dirs.clone(), scan_limits, indexer_for_scanner.clone())
    });
    let scg = scg::spawn(settings, &store, Some(embedder.clone().recipient()))?;
    let learner = outcome_learner::OutcomeLearner::new(
        settings.outcome_learning,
        settings.discovery.clone(),
        settings.kpi.prior.enabled,
        snapshots,
        embedder.clone().recipient(),
        crate::store::learning::LearntModel { model_id: model_id.clone(), dimensions },
        Some(crate::store::learning::LearningStore::open(&store)?),
    )?;
    // On a thread of its own: a trial ranks a message ten times.
    let learner = outcome_learner::OutcomeLearner::start_in_arbiter(&Arbiter::new().handle(), |_| learner);
    let kpi = kpi::KpiTelemetry::load(store, settings.kpi.clone())?
        .with_max_tracked_capabilities(settings.retention.outcome_prior_max_count)
        .with_prior_sink(discoverer.clone().recipient())
        .with_learning_sink(learner.clone().recipient())
        .start();
    // Dispatch results that reached a handler feed the per-capability success statistics,
    // under the discovery id, so the outcome prior applies to what discovery ranks.
    let kpi_for_dispatch = kpi.clone();
    dispatcher.do_send(dispatcher::AddEventSink(std::sync::Arc::new(
        move |event: &crate::core::dispatch::DispatchEvent| {
            if event.handler_ran {
                kpi_for_dispatch.do_send(kpi::CapabilityResult {
                    capability_id: event.capability_id.clone(),
                    success: event.success,
                    at_ms: event.at_ms,
                });
            }
        },
    )));
    let builtins: Vec<_> = Builtin::ALL.iter().map(|builtin| builtin.descriptor()).collect();
    indexer
        .send(indexer::SyncCapabilities::replace(BUILTIN_ORIGIN, builtins))
        .await
        .map_err(|err| SpawnError::Builtins(err.to_string()))?
        .map_err(|err| SpawnError::Builtins(err.to_string()))?;
    // The dispatch registry's discoverable records, now and after every change.
    dispatcher
        .send(dispatcher::SetCatalog(indexer.clone().recipient()))
        .await
        .map_err(|err| SpawnError::Builtins(err.to_string()))?;
    Ok(Actors { scanner, embedder, indexer, graph_builder, discoverer, discovery, dispatcher, kpi, learner, scg })
}

/// Starts `settings.discovery_workers` discovery threads on `snapshots`. With
/// the built-in or the static embedder each thread embeds queries with its own
/// copy (both are pure and cheap: the static table is shared by the process);
/// a model (`local`) or a service (`http`) stays behind the Embedder actor.
fn spawn_discovery_workers(
    settings: &Settings,
    snapshots: &std::sync::Arc<snapshot::SnapshotCell>,
    embedder: &Addr<embedder::Embedder>,
) -> Result<discovery_worker::DiscoveryLanes, SpawnError> {
    let in_process = settings.embedder.backend.is_in_process();
    if in_process {
        // Fails here, not on a worker thread, if the settings cannot build it.
        crate::embedders::backend::build(&settings.embedder)?;
    }
    let threads = settings.discovery_workers.max(1);
    let (snapshots, config, prior_enabled) =
        (snapshots.clone(), settings.discovery.clone(), settings.kpi.prior.enabled);
    let (embedder_settings, batch_size) = (settings.embedder.clone(), settings.embedder.batch_size);
    let factory = move || {
        let model = in_process.then(|| crate::embedders::backend::build(&embedder_settings).ok()).flatten();
        discovery_worker::DiscoveryWorker::new(snapshots.clone(), config.clone(), prior_enabled, model, batch_size)
    };
    let embedder = (!in_process).then(|| embedder.clone().recipient());
    let lanes = discovery_worker::DiscoveryLanes::start(threads, factory, embedder).map_err(SpawnError::from)?;
    Ok(lanes.with_chatter_gate(settings.discovery.chatter_gate))
}
