//! Several nodes, one SCG and one set of live sources: wiring between the
//! JetStream key-value buckets (`gateway::kv`), the SCG actors, the catalog
//! and the SourceManager. Started by `capdex serve` when `jetstream.enabled`.
//!
//! | bucket | key | value |
//! |---|---|---|
//! | `jetstream.scg_bucket` | `source.<key_token(source id)>` | [`SharedSource`]: the stored graph (workspaces, map time) and the tools its text offers, rmp-serde with field names |
//! | `jetstream.scg_bucket` | `note.<key_token(note id)>` | a memory [`Note`] as merged over every node's deposits, rmp-serde with field names |
//! | `jetstream.sources_bucket` | `source.<key_token(source id)>` | a live source's settings as the user gave them (`${env:VAR}` templates unresolved), JSON |
//!
//! A graph can be large and is only read by capdex, so it travels as
//! MessagePack with field names (a third smaller than JSON, floats exact, and
//! a field added later reads as its default); a source definition is small and
//! a person may read it with `nats kv get`, so it is the JSON `sources.add` takes.
//!
//! Write path of `map` and `memory.deposit` on any node:
//! 1. the node maps (deposits) as a single node does: sled and its route index;
//! 2. it folds its result into the bucket's value with a revision-checked
//!    write (`core::scg::shared::fold_source`, `fold_note`), retried when
//!    another node wrote meanwhile, so a concurrent map keeps both nodes'
//!    workspaces and a concurrent deposit counts twice;
//! 3. it puts the folded value into its own graph and answers.
//!
//! `sources.add` checks the settings, writes them to the sources bucket, then
//! adds the source on this node; `sources.remove` deletes the key, then removes
//! the source here. A failed bucket write answers `unavailable` (retryable).
//!
//! Every node follows both buckets (`Bucket::follow`) and applies each change
//! through actor messages: a source into the SCG, the catalog and the dispatch
//! records (`SourceCatalog::put_shared`), a note into the ScgGraph, a live
//! source into its own SourceManager (which connects to the upstream itself).
//! A change a node holds already changes nothing, so its own writes come back
//! as no-ops. On start a node waits, bounded by [`CATCH_UP_LIMIT`], until it
//! has applied both buckets up to their last revision before it serves.
//! Cross-source links are not shared: each node computes them from the sources.
//! Sources declared in a node's `[[sources]]` stay as its file says.

mod scg;
mod sources;

use crate::actors::Actors;
use crate::clock::epoch_ms;
use crate::config::Settings;
use crate::core::kpi_window::OutcomeReport;
use crate::core::registration::RegistrationPayload;
use crate::core::retention::Record;
use crate::gateway::kv::{keep_swept, Bucket, BucketSpec, Change, Expect, KvError};
use crate::gateway::service::{Api, DescribedDiscovery, Gateway};
use crate::gateway::wire::{
    ApiError, Codec, DiscoverRequest, ListRequest, PlanReply, RecordedOutcome, RegistrationReply, RemoveRequest,
    ScgDepositRequest, ScgMapRequest, ScgObserveRequest, ScgRouteRequest, SourcesRequest,
};
use crate::live::LiveSources;
use crate::store::Store;
use anyhow::Context as _;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

pub use crate::core::scg::memory::Note;
pub use crate::core::scg::shared::SharedSource;
pub use scg::{note_key, scg_key, source_key, ScgKey, NOTE_PREFIX};
pub use sources::definition_key;

/// The longest a starting node waits to apply what the buckets held before serving anyway.
pub const CATCH_UP_LIMIT: Duration = Duration::from_secs(60);

/// How often a folded write is tried again when another node wrote the key meanwhile.
const MAX_WRITE_TRIES: usize = 8;

/// This node's side of the shared SCG and live source definitions.
pub struct Shared {
    scg: scg::ScgShare,
    sources: sources::SourcesShare,
}

/// Opens the buckets, follows them, and waits (at most [`CATCH_UP_LIMIT`])
/// until this node has applied what they held. Must run on the System's LocalSet.
pub async fn start(
    settings: &Settings,
    gateway: &Gateway,
    actors: &Actors,
    store: &Store,
    live: &LiveSources,
) -> anyhow::Result<Rc<Shared>> {
    let spec = |name: &str, description: &str| BucketSpec {
        name: name.to_string(),
        replicas: settings.jetstream.replicas,
        max_age: Duration::ZERO,
        description: description.to_string(),
        patience: Duration::from_millis(settings.jetstream.open_timeout_ms),
    };
    let hint = "JetStream is needed by several nodes (run nats-server with -js), or set jetstream.enabled = false";
    let scg_spec = spec(&settings.jetstream.scg_bucket, "capdex: mapped SCG sources and memory notes");
    let scg_bucket = Bucket::open(gateway.client(), &scg_spec).await.context(hint)?;
    let sources_spec = spec(&settings.jetstream.sources_bucket, "capdex: live source definitions");
    let sources_bucket = Bucket::open(gateway.client(), &sources_spec).await.context(hint)?;
    let shared = Rc::new(Shared {
        scg: scg::ScgShare::new(scg_bucket, actors),
        sources: sources::SourcesShare::new(sources_bucket, settings, store, live)?,
    });
    // Memory notes age in the bucket as in each node's store ([retention]
    // memory_*); the sources beside them stay until removed.
    let (notes, limits) = (shared.scg.bucket().clone(), settings.retention.memory);
    let every = Duration::from_millis(settings.retention.sweep_interval_ms);
    tokio::task::spawn_local(async move {
        let note = |_: &str, value: &[u8]| {
            ValueCodec::MsgPack
                .decode::<Note>(value)
                .map_or(Record::UNREADABLE, |note| Record { at_ms: note.last_at_ms, exempt: false })
        };
        keep_swept(every, || async {
            Ok([("jetstream_scg", notes.sweep(&format!("{NOTE_PREFIX}>"), limits, epoch_ms(), note).await?)])
        })
        .await
    });
    let (scg, sources) = (shared.scg.clone(), shared.sources.clone());
    let caught_up = futures::future::join(
        follow(shared.scg.bucket().clone(), move |change| scg.clone().apply(change)),
        follow(shared.sources.bucket().clone(), move |change| sources.clone().apply(change)),
    );
    let (scg_at, sources_at) = caught_up.await;
    let (scg_at, sources_at) = (scg_at?, sources_at?);
    tracing::info!(scg = scg_at, sources = sources_at, "following the shared SCG and live source definitions");
    Ok(shared)
}

/// Follows `bucket` on a local task, applying each change with `apply`, and
/// waits until the changes up to the bucket's last revision (read now) are
/// applied, at most [`CATCH_UP_LIMIT`]; answers that revision.
async fn follow<F, Fut>(bucket: Bucket, mut apply: F) -> Result<u64, KvError>
where
    F: FnMut(Change) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let target = bucket.last_revision().await?;
    let (applied_tx, mut applied_rx) = tokio::sync::watch::channel(false);
    let name = bucket.name().to_string();
    tokio::task::spawn_local(async move {
        bucket
            .follow(move |change| {
                let caught_up = change.revision >= target || change.pending == 0;
                let applied = apply(change);
                let applied_tx = applied_tx.clone();
                async move {
                    applied.await;
                    if caught_up {
                        applied_tx.send_replace(true);
                    }
                }
            })
            .await
    });
    if target > 0 && tokio::time::timeout(CATCH_UP_LIMIT, applied_rx.wait_for(|done| *done)).await.is_err() {
        tracing::warn!(bucket = %name, target, "not caught up within {CATCH_UP_LIMIT:?}; serving anyway");
    }
    Ok(target)
}

/// How a bucket's values are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ValueCodec {
    /// MessagePack with field names (`rmp_serde::to_vec_named`).
    MsgPack,
    Json,
}

/// The first byte of a MessagePack value compressed with LZ4 (a mapped
/// graph repeats its names and types, so it shrinks several times and a large
/// specification fits one NATS message).
const LZ4_MSGPACK: u8 = b'Z';

impl ValueCodec {
    fn encode<T: Serialize>(self, value: &T) -> Result<Vec<u8>, String> {
        match self {
            ValueCodec::MsgPack => {
                let packed = rmp_serde::to_vec_named(value).map_err(|err| err.to_string())?;
                let mut out = vec![LZ4_MSGPACK];
                out.extend(lz4_flex::block::compress_prepend_size(&packed));
                Ok(out)
            }
            ValueCodec::Json => serde_json::to_vec(value).map_err(|err| err.to_string()),
        }
    }

    fn decode<T: DeserializeOwned>(self, bytes: &[u8]) -> Result<T, String> {
        match self {
            ValueCodec::MsgPack => match bytes.split_first() {
                Some((&LZ4_MSGPACK, compressed)) => {
                    let packed =
                        lz4_flex::block::decompress_size_prepended(compressed).map_err(|err| err.to_string())?;
                    rmp_serde::from_slice(&packed).map_err(|err| err.to_string())
                }
                _ => rmp_serde::from_slice(bytes).map_err(|err| err.to_string()),
            },
            ValueCodec::Json => serde_json::from_slice(bytes).map_err(|err| err.to_string()),
        }
    }
}

/// The answer when this node applied a change but could not share it: retryable.
fn not_shared(bucket: &str, err: impl std::fmt::Display) -> ApiError {
    ApiError::unavailable(format!(
        "applied on this node but not shared through key-value bucket {bucket} ({err}); send the request again"
    ))
}

/// Writes `fold(what the key holds)` under `key` with a revision check, and
/// again on a conflict; answers the value written. A value that does not
/// decode counts as none (the write replaces it).
async fn write_folded<T: Serialize + DeserializeOwned>(
    bucket: &Bucket,
    key: &str,
    codec: ValueCodec,
    fold: impl Fn(Option<T>) -> T,
) -> Result<T, ApiError> {
    for _ in 0..MAX_WRITE_TRIES {
        let current = bucket.get(key).await.map_err(|err| not_shared(bucket.name(), err))?;
        let (held, expect) = match current {
            Some(current) => (codec.decode(&current.value).ok(), Expect::Revision(current.revision)),
            None => (None, Expect::Absent),
        };
        let value = fold(held);
        let bytes = codec.encode(&value).map_err(ApiError::internal)?;
        let written = bucket.write(key, bytes.into(), expect).await.map_err(|err| not_shared(bucket.name(), err))?;
        if written.is_some() {
            return Ok(value);
        }
    }
    Err(not_shared(bucket.name(), format!("key {key} changed under {MAX_WRITE_TRIES} tries in a row")))
}

/// The `Api` of a node: `inner` for everything, with `map`, `memory.deposit`
/// and `sources.*` going through the buckets when `shared` is set (exactly
/// `inner` otherwise).
#[derive(Clone)]
pub struct SharedApi<A> {
    inner: A,
    shared: Option<Rc<Shared>>,
}

impl<A: Api + Clone> SharedApi<A> {
    pub fn new(inner: A, shared: Option<Rc<Shared>>) -> SharedApi<A> {
        SharedApi { inner, shared }
    }
}

type Reply<T> = LocalBoxFuture<'static, Result<T, ApiError>>;

impl<A: Api + Clone> Api for SharedApi<A> {
    fn discover(&self, request: DiscoverRequest) -> Reply<crate::core::discovery::DiscoveryResult> {
        self.inner.discover(request)
    }

    fn plan(&self, request: DiscoverRequest) -> Reply<PlanReply> {
        self.inner.plan(request)
    }

    fn outcome(&self, report: OutcomeReport) -> Reply<RecordedOutcome> {
        self.inner.outcome(report)
    }

    fn dispatch(&self, request: serde_json::Value) -> Reply<serde_json::Value> {
        self.inner.dispatch(request)
    }

    fn register(&self, payload: RegistrationPayload) -> Reply<RegistrationReply> {
        self.inner.register(payload)
    }

    fn unregister(&self, request: RemoveRequest) -> Reply<RegistrationReply> {
        self.inner.unregister(request)
    }

    fn search(&self, request: DiscoverRequest) -> Reply<crate::core::meta_tool::SearchAnswer> {
        self.inner.search(request)
    }

    fn list(&self, request: ListRequest) -> Reply<serde_json::Value> {
        self.inner.list(request)
    }

    fn scg_map(&self, request: ScgMapRequest) -> Reply<crate::core::scg::pipeline::MapReport> {
        match &self.shared {
            Some(shared) => shared.scg.clone().map(request).boxed_local(),
            None => self.inner.scg_map(request),
        }
    }

    fn scg_route(&self, request: ScgRouteRequest) -> Reply<crate::core::scg::route::RouteAnswer> {
        self.inner.scg_route(request)
    }

    fn scg_observe(&self, request: ScgObserveRequest) -> Reply<crate::core::scg::route::Observation> {
        self.inner.scg_observe(request)
    }

    fn scg_deposit(&self, request: ScgDepositRequest) -> Reply<crate::core::scg::memory::Deposited> {
        match &self.shared {
            Some(shared) => shared.scg.clone().deposit(request).boxed_local(),
            None => self.inner.scg_deposit(request),
        }
    }

    fn discover_encoded(&self, request: DiscoverRequest, codec: Codec) -> Reply<Vec<u8>> {
        self.inner.discover_encoded(request, codec)
    }

    fn search_encoded(&self, request: DiscoverRequest, codec: Codec) -> Reply<Vec<u8>> {
        self.inner.search_encoded(request, codec)
    }

    fn discover_described(&self, request: DiscoverRequest) -> Reply<DescribedDiscovery> {
        self.inner.discover_described(request)
    }

    fn dispatch_admin(&self, request: crate::gateway::wire::DispatchAdmin) -> Reply<serde_json::Value> {
        self.inner.dispatch_admin(request)
    }

    fn kpi_overview(&self) -> Reply<crate::core::console::model::KpiOverview> {
        self.inner.kpi_overview()
    }

    fn catalog_overview(&self) -> Reply<crate::core::console::model::CatalogOverview> {
        self.inner.catalog_overview()
    }

    fn sources(&self, request: SourcesRequest) -> Reply<serde_json::Value> {
        match (&self.shared, request) {
            (Some(shared), SourcesRequest::Add(body)) => {
                shared.sources.clone().add(body, self.inner.clone()).boxed_local()
            }
            (Some(shared), SourcesRequest::Remove(body)) => {
                shared.sources.clone().remove(body, self.inner.clone()).boxed_local()
            }
            (_, request) => self.inner.sources(request),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scg::model::{Edge, EdgeKind, SourceGraph, SourceKind, StoredSource};

    #[test]
    fn a_shared_source_survives_its_codec_exactly() {
        let graph = SourceGraph {
            source_id: "db".into(),
            kind: SourceKind::Sql,
            drift_hash: "h".into(),
            nodes: vec![],
            edges: vec![Edge {
                source: "a".into(),
                target: "b".into(),
                kind: EdgeKind::Consumes,
                weight: 0.1f32 + 0.2f32,
                evidence: vec!["e".into()],
            }],
            recipes: vec![],
        };
        let shared = SharedSource {
            stored: StoredSource { graph, workspaces: vec!["w".into()], mapped_at_ms: 3 },
            tools: vec![],
        };
        let bytes = ValueCodec::MsgPack.encode(&shared).unwrap();
        assert_eq!(ValueCodec::MsgPack.decode::<SharedSource>(&bytes).unwrap(), shared, "equal, floats and all");
        assert!(ValueCodec::MsgPack.decode::<SharedSource>(b"\x01junk").is_err());
        assert!(ValueCodec::Json.decode::<SharedSource>(b"{").is_err());
    }
}
