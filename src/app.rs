//! Wiring: opens the store, starts the actors, and runs the CLI's jobs
//! (`discover` once, or `serve` on NATS) on an actix System.
//!
//! Runtime model: everything runs inside `actix_rt::System` (a single-threaded
//! tokio runtime with a LocalSet); CPU- and disk-bound actors run on
//! `SyncArbiter` threads. The gateway's tasks are local tasks on that System;
//! its discover, search and plan requests rank (and encode) on the
//! DiscoveryWorker threads.

use crate::actors::discoverer::Discover;
use crate::actors::dispatcher::Dispatch;
use crate::actors::indexer::{IndexEvent, SyncCapabilities, SyncReport};
use crate::actors::kpi::{KpiError, RecordOutcome, ViewScope};
use crate::actors::outcome_learner::TurnPlanned;
use crate::actors::scanner::{self, ScanManifests, ScanOutcome};
use crate::actors::scg::{DepositNote, ObserveNode, Route as ScgRoute, ScgError, SourcesOf};
use crate::actors::{spawn_all, Actors};
use crate::clock::epoch_ms;
use crate::config::Settings;
use crate::core::discovery::{DiscoveryFilter, DiscoveryResult};
use crate::core::kpi_window::{OutcomeError, OutcomeReport};
use crate::core::registration::{normalise_catalog, normalise_registration, Normalised, RegistrationPayload};
use crate::core::turn_planner::{self, DiscoveryOutcome, PlannerDefaults};
use crate::gateway::errors::ErrorKind;
use crate::gateway::service::{Api, Gateway};
use crate::gateway::wire::{runtime_id, ListRequest, RegistrationReply, RemoveRequest};
use crate::gateway::wire::{ApiError, Codec, DiscoverRequest, PlanReply, RecordedOutcome};
use crate::registration::{apply_remove, apply_upsert};
use crate::source_catalog::{Publication, SourceCatalog};
use crate::store::{Store, StoreError};
use anyhow::Context as _;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use std::time::Duration;

/// Opens the store and starts the actors.
pub async fn start(settings: &Settings) -> anyhow::Result<Actors> {
    start_with_events(settings, None).await
}

/// Like [`start`], sending index change events to `events`.
pub async fn start_with_events(
    settings: &Settings,
    events: Option<tokio::sync::mpsc::UnboundedSender<IndexEvent>>,
) -> anyhow::Result<Actors> {
    Ok(start_with_store(settings, events).await?.0)
}

/// Like [`start_with_events`], also returning the store (for the JetStream bookkeeping).
pub async fn start_with_store(
    settings: &Settings,
    events: Option<tokio::sync::mpsc::UnboundedSender<IndexEvent>>,
) -> anyhow::Result<(Actors, Store)> {
    std::fs::create_dir_all(&settings.data_dir)
        .with_context(|| format!("failed to create data_dir {}", settings.data_dir.display()))?;
    let store = Store::open(&settings.data_dir)?;
    store.set_min_free_bytes(settings.data_dir_min_free_bytes);
    let actors =
        spawn_all(settings, store.clone(), events).await.map_err(|err| unreadable(err.into(), &settings.data_dir))?;
    // Mapped sources stay discoverable across restarts; so do their dispatch records.
    SourceCatalog::of(&actors)
        .restore()
        .await
        .map_err(|err| anyhow::anyhow!("failed to restore the sources: {err}"))
        .map_err(|err| unreadable(err, &settings.data_dir))?;
    Ok((actors, store))
}

/// A start that failed reading the data dir back: says so, and how to recover
/// (a value that does not decode is never skipped, so nothing starts silently empty).
fn unreadable(err: anyhow::Error, data_dir: &std::path::Path) -> anyhow::Error {
    let corrupt = err.chain().any(|cause| cause.downcast_ref::<StoreError>().is_some_and(StoreError::is_corruption))
        || err.to_string().contains("failed to decode");
    if corrupt {
        let hint = format!(
            "the data dir {} holds a value capdex cannot read back. {}",
            data_dir.display(),
            crate::store::recovery(data_dir)
        );
        return err.context(hint);
    }
    err
}

/// Scans the capability folders and syncs them into the index.
pub async fn scan(actors: &Actors) -> anyhow::Result<ScanOutcome> {
    Ok(actors.scanner.send(ScanManifests).await.context("scanner stopped")??)
}

/// Runs one discovery.
pub async fn discover(actors: &Actors, query: &str, filter: DiscoveryFilter) -> anyhow::Result<DiscoveryResult> {
    discover_explained(actors, query, filter, false).await
}

/// Runs one discovery, explaining each Tier 1 entry when `explain` is true.
pub async fn discover_explained(
    actors: &Actors,
    query: &str,
    filter: DiscoveryFilter,
    explain: bool,
) -> anyhow::Result<DiscoveryResult> {
    Ok(actors
        .discoverer
        .send(Discover { query: query.to_string(), filter, config: None, explain })
        .await
        .context("discoverer stopped")??)
}

/// The largest sources or catalog file read, in bytes.
pub const MAX_SOURCES_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// What kind of file `load_file` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileShape {
    /// `{tools, skills, extensions, channels, presets}`.
    Sources,
    /// An array of descriptors.
    Catalog,
}

/// Reads a sources or catalog file and indexes it as the origin `file:<path>`,
/// each name at most `max_id_bytes` (`[limits]`); returns the sync report and
/// the items left out.
pub async fn load_file(
    actors: &Actors,
    path: &std::path::Path,
    shape: FileShape,
    max_id_bytes: usize,
) -> anyhow::Result<(SyncReport, Normalised)> {
    let size = std::fs::metadata(path).with_context(|| format!("failed to read {}", path.display()))?.len();
    anyhow::ensure!(
        size <= MAX_SOURCES_FILE_BYTES,
        "{} is {size} bytes, more than the {MAX_SOURCES_FILE_BYTES} allowed",
        path.display()
    );
    let text = std::fs::read_to_string(path).with_context(|| format!("failed to read {}", path.display()))?;
    let normalised = match shape {
        FileShape::Sources => {
            let payload: RegistrationPayload = serde_json::from_str(&text).with_context(|| {
                format!("{} is not a sources file ({{tools, skills, extensions, channels, presets}})", path.display())
            })?;
            normalise_registration(&payload, max_id_bytes)
        }
        FileShape::Catalog => {
            let items: Vec<serde_json::Value> = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a catalog (an array of descriptors)", path.display()))?;
            normalise_catalog(&items, max_id_bytes)
        }
    };
    let mut sync = SyncCapabilities::replace(&format!("file:{}", path.display()), normalised.descriptors.clone());
    sync.presets = Some(normalised.presets.clone());
    let report = actors.indexer.send(sync).await.context("indexer stopped")??;
    Ok((report, normalised))
}

/// Drops capabilities indexed from files (origin `file:*`) other than `keep`,
/// so a command line's files are exactly what a run sees.
pub async fn drop_other_files(actors: &Actors, keep: &[std::path::PathBuf]) -> anyhow::Result<()> {
    let keep: Vec<String> = keep.iter().map(|path| format!("file:{}", path.display())).collect();
    let catalog =
        actors.discoverer.send(crate::actors::discoverer::CurrentCatalog).await.context("discoverer stopped")?;
    let stale: std::collections::BTreeSet<String> = catalog
        .origins
        .values()
        .chain(catalog.presets.keys())
        .filter(|o| o.starts_with("file:") && !keep.contains(o))
        .cloned()
        .collect();
    for origin in stale {
        let mut sync = SyncCapabilities::replace(&origin, Vec::new());
        sync.presets = Some(Vec::new());
        actors.indexer.send(sync).await.context("indexer stopped")??;
    }
    Ok(())
}

/// The gateway's view of the actors.
#[derive(Clone)]
struct ActorApi {
    actors: Actors,
    planner: PlannerDefaults,
    adaptive: crate::core::turn_planner::AdaptivePolicy,
    discovery_retries: Retries,
    /// The configured discovery settings, which a request's `config` overrides.
    discovery: crate::core::discovery::DiscoveryConfig,
    /// Set when index mutations go through the JetStream index log.
    replication: Option<std::rc::Rc<crate::replication::Replication>>,
    /// The live sources (`sources.*`).
    live: Option<crate::live::LiveSources>,
    /// `[limits]`: among others the longest runtime id and capability name a
    /// registration gives, and the most ids a query excludes.
    limits: crate::core::limits::Limits,
}

/// How often a failed discovery is tried again before a plan falls back, and the pause between tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Retries {
    max_retries: u32,
    backoff: Duration,
}

/// Runs `attempt` until it succeeds or `retries.max_retries` retries have failed; returns the last result.
async fn with_retries<T, F, Fut>(retries: Retries, mut attempt: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut result = attempt().await;
    for _ in 0..retries.max_retries {
        if result.is_ok() {
            break;
        }
        actix_rt::time::sleep(retries.backoff).await;
        result = attempt().await;
    }
    result
}

/// The settings of one query: the configured ones with the request's
/// overrides, or `None` (the router's own) when it gives none.
fn per_query_config(
    base: &crate::core::discovery::DiscoveryConfig,
    request: &DiscoverRequest,
) -> Result<Option<crate::core::discovery::DiscoveryConfig>, ApiError> {
    match &request.config {
        Some(overrides) if !overrides.is_empty() => {
            overrides.apply(base).map(Some).map_err(|problem| ApiError::bad_request(format!("config.{problem}")))
        }
        _ => Ok(None),
    }
}

impl ActorApi {
    /// Runs `request`'s discovery on a discovery worker and `finish` there, on its result and
    /// the catalog it was ranked on.
    fn on_worker<R: Send + 'static>(
        &self,
        request: DiscoverRequest,
        finish: impl FnOnce(DiscoveryResult, &crate::core::catalog::Catalog) -> Result<R, ApiError> + Send + 'static,
    ) -> LocalBoxFuture<'static, Result<R, ApiError>> {
        let lanes = self.actors.discovery.clone();
        let config = per_query_config(&self.discovery, &request);
        let scg = self.actors.scg.graph.clone();
        let limits = self.limits;
        async move {
            let mut filter = request.filter(&limits)?;
            filter.sources = workspace_sources(&scg, &request, limits.max_id_bytes).await?;
            let config = config?;
            let discover = Discover { query: request.message, filter, config, explain: request.explain };
            let finish = move |result: Result<DiscoveryResult, crate::actors::discoverer::DiscovererError>,
                               catalog: &crate::core::catalog::Catalog| {
                finish(result.map_err(|err| ApiError::internal(err.to_string()))?, catalog)
            };
            lanes.run(discover, Box::new(finish)).await.map_err(ApiError::unavailable)?
        }
        .boxed_local()
    }
}

impl Api for ActorApi {
    fn register(&self, payload: RegistrationPayload) -> LocalBoxFuture<'static, Result<RegistrationReply, ApiError>> {
        if let Some(replication) = self.replication.clone() {
            let max_id_bytes = self.limits.max_id_bytes;
            return async move {
                runtime_id(payload.runtime_id.as_deref(), max_id_bytes)?;
                replication.submit(crate::gateway::jetstream::IndexMutation::Upsert { payload }).await
            }
            .boxed_local();
        }
        apply_upsert(self.actors.indexer.clone(), payload, self.limits.max_id_bytes).boxed_local()
    }

    fn unregister(&self, request: RemoveRequest) -> LocalBoxFuture<'static, Result<RegistrationReply, ApiError>> {
        if let Some(replication) = self.replication.clone() {
            let max_id_bytes = self.limits.max_id_bytes;
            return async move {
                runtime_id(request.runtime_id.as_deref(), max_id_bytes)?;
                replication.submit(crate::gateway::jetstream::IndexMutation::Remove { request }).await
            }
            .boxed_local();
        }
        apply_remove(self.actors.indexer.clone(), request, self.limits.max_id_bytes).boxed_local()
    }

    fn search(
        &self,
        request: DiscoverRequest,
    ) -> LocalBoxFuture<'static, Result<crate::core::meta_tool::SearchAnswer, ApiError>> {
        // Ranked and answered from one snapshot: the catalog is the one the query was ranked on.
        self.on_worker(request, |result, catalog| Ok(crate::core::meta_tool::search_answer(&result, catalog)))
    }

    fn search_encoded(
        &self,
        request: DiscoverRequest,
        codec: Codec,
    ) -> LocalBoxFuture<'static, Result<Vec<u8>, ApiError>> {
        self.on_worker(request, move |result, catalog| {
            codec.encode(&crate::core::meta_tool::search_answer(&result, catalog))
        })
    }

    fn list(&self, request: ListRequest) -> LocalBoxFuture<'static, Result<serde_json::Value, ApiError>> {
        let discoverer = self.actors.discoverer.clone();
        async move {
            let kind = match request.kind.as_deref() {
                None | Some("any") => None,
                Some(text) => Some(
                    crate::core::descriptor::CapabilityKind::parse(text)
                        .ok_or_else(|| ApiError::bad_request(format!("unknown kind {text:?}")))?,
                ),
            };
            let limit = request.page_size()?;
            let catalog = discoverer
                .send(crate::actors::discoverer::CurrentCatalog)
                .await
                .map_err(ApiError::unavailable)?;
            // The catalog is ordered by id: a page is the matches after `after`, `limit` of them.
            let lower = match request.after.as_deref() {
                Some(after) => std::ops::Bound::Excluded(after),
                None => std::ops::Bound::Unbounded,
            };
            let mut matches = catalog
                .descriptors
                .range::<str, _>((lower, std::ops::Bound::Unbounded))
                .map(|(_, d)| d)
                .filter(|d| kind.is_none_or(|k| d.kind == k))
                .filter(|d| request.origin.as_deref().is_none_or(|o| catalog.origin(&d.id) == o));
            let page: Vec<&crate::core::descriptor::CapabilityDescriptor> = matches.by_ref().take(limit).collect();
            let next = match (matches.next(), page.last()) {
                (Some(_), Some(last)) => Some(last.id.clone()),
                _ => None,
            };
            let capabilities: Vec<serde_json::Value> = page
                .iter()
                .map(|d| {
                    serde_json::json!({"id": d.id, "kind": d.kind, "name": d.name, "category": d.category,
                        "available": d.available, "origin": catalog.origin(&d.id)})
                })
                .collect();
            let mut reply =
                serde_json::json!({"version": catalog.version, "totalIndexed": catalog.len(), "capabilities": capabilities});
            if let Some(next) = next {
                reply["next"] = serde_json::Value::String(next);
            }
            Ok(reply)
        }
        .boxed_local()
    }

    fn discover(&self, request: DiscoverRequest) -> LocalBoxFuture<'static, Result<DiscoveryResult, ApiError>> {
        self.on_worker(request, |result, _| Ok(result))
    }

    fn discover_encoded(
        &self,
        request: DiscoverRequest,
        codec: Codec,
    ) -> LocalBoxFuture<'static, Result<Vec<u8>, ApiError>> {
        self.on_worker(request, move |result, _| codec.encode(&result))
    }

    fn discover_described(
        &self,
        request: DiscoverRequest,
    ) -> LocalBoxFuture<'static, Result<crate::gateway::service::DescribedDiscovery, ApiError>> {
        self.on_worker(request, |result, catalog| {
            let descriptors = result.tier1.iter().filter_map(|entry| catalog.get(&entry.id).cloned()).collect();
            Ok((result, descriptors))
        })
    }

    fn plan(&self, request: DiscoverRequest) -> LocalBoxFuture<'static, Result<PlanReply, ApiError>> {
        let (lanes, kpi, learner) =
            (self.actors.discovery.clone(), self.actors.kpi.clone(), self.actors.learner.clone());
        let (defaults, adaptive) = (self.planner.clone(), self.adaptive.clone());
        let retries = self.discovery_retries;
        let config = per_query_config(&self.discovery, &request);
        let scg = self.actors.scg.graph.clone();
        let limits = self.limits;
        async move {
            let mut filter = request.filter(&limits)?;
            filter.sources = workspace_sources(&scg, &request, limits.max_id_bytes).await?;
            let config = config?;
            let options = request.plan.clone().unwrap_or_default();
            let at_ms = epoch_ms();
            let view = kpi
                .send(ViewScope {
                    organization_id: options.organization_id.clone(),
                    persona_id: options.persona_id.clone(),
                    at_ms,
                })
                .await
                .map_err(ApiError::unavailable)?;
            let discover = Discover { query: request.message, filter, config, explain: request.explain };
            let discovered = with_retries(retries, || async {
                match lanes.run(discover.clone(), Box::new(|result, _| result.map_err(|err| err.to_string()))).await {
                    Ok(result) => result,
                    Err(err) => Err(format!("the discovery workers are unavailable: {err}")),
                }
            })
            .await;
            // The turn's message, for the outcome learner when the turn's outcome comes.
            if let (Ok(_), Some(turn_id)) = (&discovered, &options.turn_id) {
                let turn = TurnPlanned { turn_id: turn_id.clone(), message: discover.query.clone() };
                if learner.try_send(turn).is_err() {
                    metrics::counter!("capdex_outcome_learning_skipped_total", "reason" => "busy").increment(1);
                }
            }
            let discovery_outcome = match &discovered {
                Ok(result) => DiscoveryOutcome::found(result.tier1.iter().map(|entry| entry.id.clone()).collect()),
                Err(reason) => DiscoveryOutcome::Failed(reason.clone()),
            };
            let adapt = view.adaptive_applies.then_some(&adaptive);
            let plan = turn_planner::plan(&defaults, &options.overrides(), &discovery_outcome, adapt)
                .map_err(ApiError::from)?;
            metrics::counter!(
                "capdex_plans_total",
                "selection_mode" => if plan.tool_selection_mode == crate::core::kpi_window::ToolSelectionMode::All { "all" } else { "discovered" },
                "fallback_reason" => plan.fallback_reason.map_or("none", |reason| reason.as_str()),
            )
            .increment(1);
            let (discovery, discovery_error) = match discovered {
                Ok(result) => (Some(result), None),
                Err(reason) => (None, Some(reason)),
            };
            Ok(PlanReply { plan, kpi: view.kpi, discovery, discovery_error })
        }
        .boxed_local()
    }

    fn outcome(&self, report: OutcomeReport) -> LocalBoxFuture<'static, Result<RecordedOutcome, ApiError>> {
        let kpi = self.actors.kpi.clone();
        async move {
            let recorded =
                kpi.send(RecordOutcome { report, at_ms: epoch_ms() }).await.map_err(ApiError::unavailable)?;
            let update = match recorded {
                Ok(recorded) => recorded.once_durable().await,
                Err(err) => Err(err),
            }
            .map_err(|err| match err {
                KpiError::Outcome(OutcomeError::TooManyCapabilities(exceeded)) => ApiError::from(exceeded),
                KpiError::Outcome(problem) => ApiError::bad_request(problem.to_string()),
                KpiError::Store(full @ StoreError::Full { .. }) => {
                    ApiError::new(ErrorKind::StorageFull, full.to_string())
                }
                other => ApiError::internal(other.to_string()),
            })?;
            Ok(RecordedOutcome { kpi: update.kpi, alert: update.alert, duplicate: update.duplicate })
        }
        .boxed_local()
    }

    fn scg_map(
        &self,
        request: crate::gateway::wire::ScgMapRequest,
    ) -> LocalBoxFuture<'static, Result<crate::core::scg::pipeline::MapReport, ApiError>> {
        // Mapped operations become discoverable and dispatchable under the id `route` returns.
        let catalog = SourceCatalog::of(&self.actors);
        async move {
            let published = catalog
                .publish_source(Publication::of_map(request)?)
                .await
                .map_err(|err| ApiError::new(err.kind(), err.to_string()))?;
            Ok(published.report)
        }
        .boxed_local()
    }

    fn scg_route(
        &self,
        request: crate::gateway::wire::ScgRouteRequest,
    ) -> LocalBoxFuture<'static, Result<crate::core::scg::route::RouteAnswer, ApiError>> {
        let graph = self.actors.scg.graph.clone();
        let max_id_bytes = self.limits.max_id_bytes;
        async move {
            let k = request.k()?;
            crate::gateway::wire::check_workspace(request.workspace.as_deref(), max_id_bytes)?;
            let route = ScgRoute { query: request.query, k, workspace: request.workspace };
            graph.send(route).await.map_err(scg_unavailable)?.map_err(scg_error)
        }
        .boxed_local()
    }

    fn scg_observe(
        &self,
        request: crate::gateway::wire::ScgObserveRequest,
    ) -> LocalBoxFuture<'static, Result<crate::core::scg::route::Observation, ApiError>> {
        let graph = self.actors.scg.graph.clone();
        let max_id_bytes = self.limits.max_id_bytes;
        async move {
            let edge_kinds = request.edge_kinds(max_id_bytes)?;
            crate::gateway::wire::check_workspace(request.workspace.as_deref(), max_id_bytes)?;
            let observe = ObserveNode { node: request.node, edge_kinds, workspace: request.workspace };
            graph.send(observe).await.map_err(scg_unavailable)?.map_err(scg_error)
        }
        .boxed_local()
    }

    fn scg_deposit(
        &self,
        request: crate::gateway::wire::ScgDepositRequest,
    ) -> LocalBoxFuture<'static, Result<crate::core::scg::memory::Deposited, ApiError>> {
        let graph = self.actors.scg.graph.clone();
        async move {
            let deposit = request.deposit()?;
            let note = DepositNote { deposit, workspace: request.workspace };
            graph.send(note).await.map_err(scg_unavailable)?.map_err(scg_error)
        }
        .boxed_local()
    }

    fn dispatch(&self, request: serde_json::Value) -> LocalBoxFuture<'static, Result<serde_json::Value, ApiError>> {
        let dispatcher = self.actors.dispatcher.clone();
        async move {
            let call: crate::core::dispatch::pipeline::DispatchCall = serde_json::from_value(request)
                .map_err(|err| ApiError::bad_request(format!("malformed dispatch request: {err}")))?;
            let result = dispatcher.send(Dispatch { call }).await.map_err(ApiError::unavailable)?;
            serde_json::to_value(result).map_err(|err| ApiError::internal(err.to_string()))
        }
        .boxed_local()
    }

    fn dispatch_admin(
        &self,
        request: crate::gateway::wire::DispatchAdmin,
    ) -> LocalBoxFuture<'static, Result<serde_json::Value, ApiError>> {
        crate::dispatch_cli::admin(self.actors.dispatcher.clone(), request).boxed_local()
    }

    fn sources(
        &self,
        request: crate::gateway::wire::SourcesRequest,
    ) -> LocalBoxFuture<'static, Result<serde_json::Value, ApiError>> {
        crate::live::handle(self.live.clone(), request).boxed_local()
    }

    fn kpi_overview(&self) -> LocalBoxFuture<'static, Result<crate::core::console::model::KpiOverview, ApiError>> {
        let overview = self.actors.kpi.send(crate::actors::kpi::InspectOverview(epoch_ms()));
        async move { overview.await.map_err(ApiError::unavailable) }.boxed_local()
    }

    fn catalog_overview(
        &self,
    ) -> LocalBoxFuture<'static, Result<crate::core::console::model::CatalogOverview, ApiError>> {
        let catalog = self.actors.discoverer.send(crate::actors::discoverer::CurrentCatalog);
        let figures = self.actors.dispatcher.send(crate::actors::dispatcher::InspectFigures);
        let prior = self.actors.kpi.send(crate::actors::kpi::InspectPrior(epoch_ms()));
        async move {
            let (catalog, figures, prior) = futures::join!(catalog, figures, prior);
            Ok(crate::core::console::model::CatalogOverview {
                catalog: catalog.map_err(ApiError::unavailable)?,
                figures: figures.map_err(ApiError::unavailable)?,
                prior: prior.map_err(ApiError::unavailable)?,
            })
        }
        .boxed_local()
    }
}

/// The sources a request's workspace enabled (through the SCG, the rule `route` uses); `None` without one.
async fn workspace_sources(
    scg: &actix::Addr<crate::actors::scg::ScgGraph>,
    request: &DiscoverRequest,
    max_id_bytes: usize,
) -> Result<Option<Vec<String>>, ApiError> {
    let Some(workspace) = request.workspace(max_id_bytes)? else { return Ok(None) };
    let of = SourcesOf { workspace: Some(workspace.to_string()) };
    scg.send(of).await.map_err(scg_unavailable)?.map_err(scg_error)
}

fn scg_error(err: ScgError) -> ApiError {
    ApiError::new(err.kind(), err.to_string())
}

fn scg_unavailable(err: actix::MailboxError) -> ApiError {
    ApiError::unavailable(err)
}

/// Returns every stored scope's KPI at `now_ms`, read from the data dir
/// without changing it. Fails while another capdex process holds the data dir.
pub fn stored_kpis(settings: &Settings, now_ms: u64) -> anyhow::Result<Vec<crate::core::kpi_window::Kpi>> {
    // A data dir held by `capdex serve` is refused naming its pid (then use `capdex kpi --watch`).
    let store = Store::open(&settings.data_dir)?;
    let scopes = store.kpi_scopes()?;
    Ok(scopes
        .into_iter()
        .map(|scope| {
            let samples = scope.samples.into_iter().map(|(_, sample)| sample);
            let (window, _) = crate::core::kpi_window::KpiWindow::restore(settings.kpi.window, samples);
            window.kpi(&scope.scope_key, now_ms)
        })
        .collect())
}

/// Prints every KPI and alert event published on NATS until SIGINT or
/// SIGTERM, one JSON line each (an alert has a `severity`).
pub async fn watch_kpis(settings: &Settings) -> anyhow::Result<()> {
    let gateway = Gateway::connect(&settings.nats).await?;
    let print = |payload: &[u8]| println!("{}", String::from_utf8_lossy(payload));
    let alerts = format!("{}.alert.>", gateway.subjects().prefix());
    futures::future::try_join(
        gateway.watch(&gateway.subjects().kpi_all(), shutdown_signal(), print),
        gateway.watch(&alerts, shutdown_signal(), print),
    )
    .await?;
    Ok(())
}

/// Sends a live-sources request to the `capdex serve` on the configured NATS
/// (`capdex source ...`) and returns its answer.
pub async fn sources_request(
    settings: &Settings,
    request: crate::gateway::wire::SourcesRequest,
) -> anyhow::Result<serde_json::Value> {
    use crate::gateway::wire::SourcesRequest;
    let gateway = Gateway::connect(&settings.nats).await?;
    let subjects = gateway.subjects();
    let (subject, body) = match request {
        SourcesRequest::Add(body) => (subjects.sources_add(), body),
        SourcesRequest::Remove(body) => (subjects.sources_remove(), body),
        SourcesRequest::List => (subjects.sources_list(), serde_json::json!({})),
        SourcesRequest::Load(body) => (subjects.sources_load(), body),
    };
    // An add or load waits for the source's first sync, which may start a program.
    let timeout = std::time::Duration::from_secs(60);
    Ok(gateway.request_json(&subject, &body, timeout).await?)
}

/// Serves on NATS until SIGINT or SIGTERM.
pub async fn serve(settings: &Settings) -> anyhow::Result<()> {
    serve_until(settings, shutdown_signal()).await
}

/// Serves on NATS until `shutdown` resolves.
pub async fn serve_until(settings: &Settings, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    if let Some(addr) = settings.metrics_listen_addr {
        crate::telemetry::init_metrics(addr).map_err(anyhow::Error::msg)?;
    }
    let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
    let (actors, store) = start_with_store(settings, Some(events_tx)).await?;
    // Held until serving ends: the sweep keeps every store within `[retention]`.
    let _retention = actix::Actor::start(crate::actors::retention::Retention::new(
        store.clone(),
        actors.scg.graph.clone(),
        actors.kpi.clone().recipient(),
        settings.retention,
    ));
    let outcome = scan(&actors).await?;
    tracing::info!(
        found = outcome.scan.descriptors.len(),
        refused = outcome.scan.refused.len(),
        embedded = outcome.sync.embedded,
        reused = outcome.sync.reused,
        "capability folders indexed"
    );
    let _watcher = if settings.watch {
        Some(
            scanner::watch(
                &settings.capability_dirs,
                Duration::from_millis(settings.watch_debounce_ms),
                actors.scanner.clone(),
            )
            .map_err(anyhow::Error::msg)?,
        )
    } else {
        None
    };
    let mut gateway = Gateway::connect(&settings.nats).await?;
    gateway.set_limits(settings.limits);
    let replication = if settings.jetstream.enabled {
        let replication = crate::replication::start(settings, &gateway, &actors, &store).await?;
        gateway.set_node_name(replication.node_name());
        Some(replication)
    } else {
        None
    };
    let _scg_events = gateway.forward_events(gateway.subjects().events_scg(), actors.scg.events.subscribe());
    let live = crate::live::start(settings, &store, &actors)?;
    let shared = match settings.jetstream.enabled {
        true => Some(crate::shared_state::start(settings, &gateway, &actors, &store, &live).await?),
        false => None,
    };
    let _source_events = gateway.forward_events(gateway.subjects().events_sources(), live.events.subscribe());
    let dispatch_events = gateway.dispatch_event_publisher();
    actors.dispatcher.do_send(crate::actors::dispatcher::SetTransport(std::sync::Arc::new(gateway.exec_transport())));
    actors.dispatcher.do_send(crate::actors::dispatcher::AddEventSink(std::sync::Arc::new(move |event| {
        let _ = dispatch_events.send(event.clone());
    })));
    let indexer = actors.indexer.clone();
    let api = crate::shared_state::SharedApi::new(actor_api(settings, actors, replication, Some(live)), shared);
    let (mcp_stop, mcp_stopped) = tokio::sync::oneshot::channel::<()>();
    let mcp_task = match settings.mcp.listen {
        Some(addr) => {
            let how = how_to_approve(settings, true);
            let mut options = crate::mcp::server::FaceOptions::new(&settings.mcp, how);
            options.outcome_events = Some(gateway.outcome_event_publisher());
            options.max_json_depth = settings.limits.max_json_depth;
            options.max_id_bytes = settings.limits.max_id_bytes;
            let bridge = crate::mcp::bridge::Bridge::spawn(api.clone());
            let face = crate::mcp::http::HttpFace::bind(addr, &settings.mcp.path, options, bridge).await?;
            Some(tokio::task::spawn_local(face.serve(async {
                let _ = mcp_stopped.await;
            })))
        }
        None => None,
    };
    let console = match settings.console.listen {
        Some(addr) => {
            let (feed, _) = tokio::sync::broadcast::channel(256);
            let _follow = gateway.follow_console_events(feed.clone()).await?;
            let budgets = crate::core::console::pages::Budgets {
                tier0: settings.discovery.tier0_token_budget,
                tier1: settings.discovery.tier1_token_budget,
                tier2: settings.discovery.tier2_token_budget,
            };
            let bridge = crate::mcp::bridge::Bridge::spawn(api.clone());
            Some(crate::console::start(&settings.console, addr, bridge, feed, budgets)?)
        }
        None => None,
    };
    let served = gateway.serve(api, events_rx, shutdown).await;
    let _ = mcp_stop.send(());
    if let Some(task) = mcp_task {
        let _ = task.await;
    }
    if let Some(console) = console {
        console.stop().await;
    }
    // The next start loads the lexical index instead of building it.
    let _ = indexer.send(crate::actors::indexer::FlushSnapshots).await;
    served?;
    Ok(())
}

/// The `Api` the gateway and the MCP face call, over `actors`.
fn actor_api(
    settings: &Settings,
    actors: Actors,
    replication: Option<std::rc::Rc<crate::replication::Replication>>,
    live: Option<crate::live::LiveSources>,
) -> ActorApi {
    ActorApi {
        actors,
        planner: settings.planner.clone(),
        adaptive: settings.kpi.adaptive.clone(),
        discovery_retries: Retries {
            max_retries: settings.planner_discovery_max_retries,
            backoff: Duration::from_millis(settings.planner_discovery_retry_backoff_ms),
        },
        discovery: settings.discovery.clone(),
        replication,
        live,
        limits: settings.limits,
    }
}

/// A `Send` handle on the `Api` over `actors`, on the current (System's) thread, for the MCP face.
pub fn mcp_bridge(
    settings: &Settings,
    actors: Actors,
    live: Option<crate::live::LiveSources>,
) -> crate::mcp::bridge::Bridge {
    crate::mcp::bridge::Bridge::spawn(actor_api(settings, actors, None, live))
}

/// How a person approves an approval, `{id}` standing for its id: over NATS
/// while `capdex serve` runs, else with the CLI on the data dir.
fn how_to_approve(settings: &Settings, serving_nats: bool) -> String {
    let subject = format!("{}.approval.{{id}}.approve", settings.nats.subject_prefix);
    if serving_nats {
        format!("A person approves it with a request on NATS subject {subject} (e.g. `nats req {subject} ''`).")
    } else {
        format!(
            "A person approves it with `capdex approval approve {{id}}` on this data dir once this MCP session has \
             ended, or on NATS subject {subject} while `capdex serve` runs on it."
        )
    }
}

/// `capdex mcp`: the same actors as `serve`, on the data dir and without
/// NATS, serving one MCP session on stdio until the client closes it (or SIGINT).
/// No metrics listener: a `capdex serve` on this host may hold its port.
pub async fn serve_mcp_stdio(settings: &Settings, direct: bool) -> anyhow::Result<()> {
    let (actors, store) = start_with_store(settings, None).await?;
    let outcome = scan(&actors).await?;
    tracing::info!(
        found = outcome.scan.descriptors.len(),
        refused = outcome.scan.refused.len(),
        "capability folders indexed"
    );
    let _watcher = if settings.watch {
        Some(
            scanner::watch(
                &settings.capability_dirs,
                Duration::from_millis(settings.watch_debounce_ms),
                actors.scanner.clone(),
            )
            .map_err(anyhow::Error::msg)?,
        )
    } else {
        None
    };
    let mut options = crate::mcp::server::FaceOptions::new(&settings.mcp, how_to_approve(settings, false));
    options.max_json_depth = settings.limits.max_json_depth;
    options.max_id_bytes = settings.limits.max_id_bytes;
    // Live sources too: an MCP client that launches capdex gets the servers and APIs it was given.
    let live = crate::live::start(settings, &store, &actors)?;
    let indexer = actors.indexer.clone();
    let bridge = mcp_bridge(settings, actors, Some(live));
    crate::mcp::serve_stdio(options, bridge, direct, shutdown_signal()).await?;
    let _ = indexer.send(crate::actors::indexer::FlushSnapshots).await;
    Ok(())
}

/// Ctrl-C or SIGTERM, whichever comes first.
pub(crate) async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::warn!(%err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = terminate => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[actix_rt::test]
    async fn discovery_is_retried_before_a_plan_falls_back() {
        let retries = Retries { max_retries: 1, backoff: Duration::from_millis(5) };
        let calls = Cell::new(0);
        let flaky = || {
            calls.set(calls.get() + 1);
            let call = calls.get();
            async move {
                if call == 1 {
                    Err("embedder busy".to_string())
                } else {
                    Ok(call)
                }
            }
        };
        assert_eq!(with_retries(retries, flaky).await, Ok(2));
        calls.set(0);
        let failing = || {
            calls.set(calls.get() + 1);
            async { Err::<u32, _>("embedder down".to_string()) }
        };
        assert_eq!(with_retries(retries, failing).await, Err("embedder down".to_string()));
        assert_eq!(calls.get(), 2, "one try and one retry");
    }

    #[actix_rt::test]
    async fn the_console_s_overviews_come_from_the_kpi_actor_the_dispatcher_and_the_catalog() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::load(None, &Default::default()).unwrap();
        settings.data_dir = dir.path().join("data");
        settings.capability_dirs = Vec::new();
        let api = actor_api(&settings, start(&settings).await.unwrap(), None, None);
        let report = OutcomeReport {
            organization_id: Some("acme".into()),
            status: Some(crate::core::kpi_window::OutcomeStatus::Success),
            capabilities: vec!["tool:echo".into()],
            ..Default::default()
        };
        api.outcome(report).await.unwrap();
        let echo = serde_json::json!({"slug": "echo", "agentId": "a", "arguments": {"text": "hi"}});
        assert_eq!(api.dispatch(echo).await.unwrap()["success"], true);
        let refused = serde_json::json!({"slug": "echo", "agentId": "a", "arguments": {"text": 3}});
        assert_eq!(api.dispatch(refused).await.unwrap()["success"], false);

        let kpi = api.kpi_overview().await.unwrap();
        assert_eq!((kpi.scopes.len(), kpi.outcomes), (1, 1));
        let acme = &kpi.scopes[0];
        assert_eq!((acme.kpi.scope_key.as_str(), acme.kpi.success_rate), ("acme", 1.0));
        assert_eq!(acme.sparkline.len(), crate::core::console::model::SPARKLINE_SLICES);
        assert_eq!(acme.sparkline.iter().flatten().collect::<Vec<_>>(), [&1.0], "{:?}", acme.sparkline);
        assert!(kpi.recent_alerts.is_empty());

        let catalog = api.catalog_overview().await.unwrap();
        assert!(catalog.catalog.descriptors.contains_key("tool:echo"));
        let echo = &catalog.figures["tool:echo"];
        assert_eq!((echo.calls, echo.errors), (2, 1));
        assert!(echo.p50_ms.is_some(), "{echo:?}");
        assert!(catalog.prior.len() <= 1);
    }
}
