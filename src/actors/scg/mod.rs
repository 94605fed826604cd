//! The Source Capability Graph actors, one file each:
//!
//! - [`ScgMapper`] (`mapper.rs`, a `SyncArbiter` actor, CPU and disk bound) runs the
//!   first three phases of the map pipeline: connect, introspect, parse.
//! - [`ScgGraph`] (`graph.rs`, on the System's arbiter, and the only writer of the
//!   SCG trees) runs link and finalize, and answers route, observe and memory deposits.
//!
//! [`map`] chains the two. Every phase sends a [`ScgEvent`] when it starts and when it
//! ends on a broadcast channel ([`ScgActors::events`], `progress.rs`); `capdex serve`
//! publishes them on `<prefix>.events.scg` and `capdex map` prints them.

pub mod graph;
pub mod mapper;
pub mod progress;

pub use graph::{
    DepositNote, Finalize, ObserveNode, PutNote, PutSource, RemoveSource, Route, ScgGraph, ScgGraphStats, SourceKinds,
    SourceOf, SourcesOf,
};
pub use mapper::{Introspect, MapRequest, Parsed, ScgMapper, ScgMapperStats, SourceText};
pub use progress::ScgError;

use crate::config::EmbedderBackend;
use crate::config::Settings;
use crate::core::embedder::HashingEmbedder;
use crate::core::scg::pipeline::{MapReport, ScgEvent};
use crate::core::static_embedder::StaticEmbedder;
use crate::store::scg::ScgStore;
use crate::store::{Store, StoreError};
use actix::prelude::*;
use tokio::sync::broadcast;

/// Events buffered per subscriber before the slowest one starts missing them.
const EVENT_BUFFER: usize = 256;

/// The SCG actors and their event channel.
#[derive(Clone)]
pub struct ScgActors {
    pub mapper: Addr<ScgMapper>,
    pub graph: Addr<ScgGraph>,
    pub events: broadcast::Sender<ScgEvent>,
}

/// Starts the SCG actors on the current actix System.
/// `remote` is the discovery Embedder actor; routes embed there when the configured embedder
/// is `local` or `http` (slow, or a network call), so never on the graph actor's thread.
pub fn spawn(
    settings: &Settings,
    store: &Store,
    remote: Option<Recipient<crate::actors::embedder::EmbedTexts>>,
) -> Result<ScgActors, StoreError> {
    let scg = ScgStore::open(store)?;
    let (events, _) = broadcast::channel(EVENT_BUFFER);
    let roots = settings.scg.map_path_roots.clone();
    let mapper_events = events.clone();
    let limits = settings.limits;
    let mapper =
        SyncArbiter::start(1, move || ScgMapper::new(roots.clone(), mapper_events.clone()).with_limits(limits));
    let dimensions = settings.embedder_dimensions;
    let half_life_ms = settings.scg.memory_half_life_ms;
    let graph_events = events.clone();
    // The configured embedder when it runs in process without files (builtin, static): a
    // route embeds its query on this thread. `local` and `http` run on the Embedder actor's
    // thread (`remote`); until their index is built, and when they fail, routes use the builtin one.
    let embedder: graph::SharedEmbedder = match settings.embedder.backend {
        EmbedderBackend::Static => std::sync::Arc::new(StaticEmbedder::new()),
        _ => std::sync::Arc::new(HashingEmbedder::new(dimensions).expect("dimensions are validated in config")),
    };
    let mut graph = ScgGraph::new(scg, embedder, half_life_ms, graph_events).with_limits(limits);
    if let (EmbedderBackend::Local | EmbedderBackend::Http, Some(remote)) = (settings.embedder.backend, remote) {
        graph = graph.with_remote_embedder(remote);
    }
    let graph = graph.start();
    Ok(ScgActors { mapper, graph, events })
}

/// Maps one source: connect → introspect → parse on the mapper, then link → finalize on the graph.
pub async fn map(actors: &ScgActors, request: MapRequest) -> Result<MapReport, ScgError> {
    let unavailable = |err: MailboxError| ScgError::Unavailable(err.to_string());
    let parsed = actors.mapper.send(Introspect(request)).await.map_err(unavailable)??;
    actors.graph.send(Finalize(parsed)).await.map_err(unavailable)?
}
