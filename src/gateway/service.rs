//! The NATS micro service: connects, registers the `capdex` service (so
//! `$SRV.PING`, `$SRV.INFO` and `$SRV.STATS` answer, see `micro.rs`), serves
//! its endpoints in the default queue group (so several nodes share the load),
//! and publishes KPI and alert events.
//!
//! The service calls back into capdex through the [`Api`] trait, so this
//! module knows nothing of actors. Requests are handled concurrently, each on
//! its own local task: a slow request never holds up the others. On shutdown
//! the endpoints are unsubscribed first (other nodes take the new requests),
//! the requests already received are answered (up to `drain_timeout_ms`), and
//! only then is the client flushed.

use crate::config::NatsSettings;
use crate::core::discovery::DiscoveryResult;
use crate::core::kpi_window::OutcomeReport;
use crate::core::registration::RegistrationPayload;
use crate::gateway::errors::{ErrorKind, GatewayError};
use crate::gateway::micro::{Endpoint, EndpointStats, MicroService, ServiceConfig};
use crate::gateway::subjects::Subjects;
use crate::gateway::wire::{
    bind_identity, ApiError, Codec, DiscoverReply, DiscoverRequest, ListRequest, OutcomeReply, PlanReply, PlanRequest,
    RecordedOutcome, RegistrationReply, RemoveRequest, SearchRequest,
};
use crate::gateway::wire::{ScgDepositRequest, ScgMapRequest, ScgObserveRequest, ScgRouteRequest};
use async_nats::HeaderMap;
use futures::future::LocalBoxFuture;
use futures::StreamExt;
use serde::Serialize;
use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The longest each shutdown step (stop the service, flush) may take.
const SHUTDOWN_STEP: std::time::Duration = std::time::Duration::from_secs(2);

/// A discovery and the descriptors of its Tier 1 capabilities ([`Api::discover_described`]).
pub type DescribedDiscovery = (DiscoveryResult, Vec<crate::core::descriptor::CapabilityDescriptor>);

/// What the service asks of the rest of capdex.
pub trait Api: 'static {
    fn discover(&self, request: DiscoverRequest) -> LocalBoxFuture<'static, Result<DiscoveryResult, ApiError>>;
    /// Plans a turn: runs the discovery of `request` and the turn planner for `request.plan`.
    fn plan(&self, request: DiscoverRequest) -> LocalBoxFuture<'static, Result<PlanReply, ApiError>>;
    /// Records an outcome and replies once it is durable; returns the scope's
    /// KPI and any alert it raised.
    fn outcome(&self, report: OutcomeReport) -> LocalBoxFuture<'static, Result<RecordedOutcome, ApiError>>;
    fn dispatch(&self, request: serde_json::Value) -> LocalBoxFuture<'static, Result<serde_json::Value, ApiError>>;
    /// Upserts a runtime's batch of capabilities.
    fn register(&self, payload: RegistrationPayload) -> LocalBoxFuture<'static, Result<RegistrationReply, ApiError>>;
    /// Removes capabilities a runtime registered.
    fn unregister(&self, request: RemoveRequest) -> LocalBoxFuture<'static, Result<RegistrationReply, ApiError>>;
    /// Runs the `discover_capabilities` meta-tool: Tier 1 results, `totalIndexed`
    /// and the discovered tools' function definitions.
    fn search(
        &self,
        request: DiscoverRequest,
    ) -> LocalBoxFuture<'static, Result<crate::core::meta_tool::SearchAnswer, ApiError>>;
    /// Lists what is indexed.
    fn list(&self, request: ListRequest) -> LocalBoxFuture<'static, Result<serde_json::Value, ApiError>>;
    /// Maps a source into the Source Capability Graph.
    fn scg_map(
        &self,
        request: ScgMapRequest,
    ) -> LocalBoxFuture<'static, Result<crate::core::scg::pipeline::MapReport, ApiError>>;
    /// Ranks route recipes for a query.
    fn scg_route(
        &self,
        request: ScgRouteRequest,
    ) -> LocalBoxFuture<'static, Result<crate::core::scg::route::RouteAnswer, ApiError>>;
    /// Reads a node's neighbourhood.
    fn scg_observe(
        &self,
        request: ScgObserveRequest,
    ) -> LocalBoxFuture<'static, Result<crate::core::scg::route::Observation, ApiError>>;
    /// Deposits a memory note.
    fn scg_deposit(
        &self,
        request: ScgDepositRequest,
    ) -> LocalBoxFuture<'static, Result<crate::core::scg::memory::Deposited, ApiError>>;
    /// [`Api::discover`], its reply encoded with `codec`: an implementation
    /// may rank and encode off the service's thread, which then only sends the bytes.
    fn discover_encoded(
        &self,
        request: DiscoverRequest,
        codec: Codec,
    ) -> LocalBoxFuture<'static, Result<Vec<u8>, ApiError>> {
        let answer = self.discover(request);
        Box::pin(async move { codec.encode(&answer.await?) })
    }
    /// [`Api::search`], its reply encoded with `codec` (see [`Api::discover_encoded`]).
    fn search_encoded(
        &self,
        request: DiscoverRequest,
        codec: Codec,
    ) -> LocalBoxFuture<'static, Result<Vec<u8>, ApiError>> {
        let answer = self.search(request);
        Box::pin(async move { codec.encode(&answer.await?) })
    }
    /// [`Api::discover`] with the descriptors of its Tier 1 capabilities, in
    /// Tier 1 order, from the catalog it was ranked on (for the MCP face).
    fn discover_described(
        &self,
        request: DiscoverRequest,
    ) -> LocalBoxFuture<'static, Result<DescribedDiscovery, ApiError>> {
        let _ = request;
        Box::pin(async { Err(ApiError::not_implemented("described discovery is not served here")) })
    }
    /// Registry, bindings, approvals and provenance of the dispatch pipeline.
    fn dispatch_admin(
        &self,
        request: crate::gateway::wire::DispatchAdmin,
    ) -> LocalBoxFuture<'static, Result<serde_json::Value, ApiError>> {
        let _ = request;
        Box::pin(async { Err(ApiError::not_implemented("dispatch administration is not served here")) })
    }
    /// Every KPI scope with its alert state and sparkline, and the recent alerts (for the console).
    fn kpi_overview(&self) -> LocalBoxFuture<'static, Result<crate::core::console::model::KpiOverview, ApiError>> {
        Box::pin(async { Err(ApiError::not_implemented("the KPI overview is not served here")) })
    }
    /// The catalog with each capability's dispatch figures and outcome prior (for the console).
    fn catalog_overview(
        &self,
    ) -> LocalBoxFuture<'static, Result<crate::core::console::model::CatalogOverview, ApiError>> {
        Box::pin(async { Err(ApiError::not_implemented("the catalog overview is not served here")) })
    }
    /// Live sources: add, remove, list, load.
    fn sources(
        &self,
        request: crate::gateway::wire::SourcesRequest,
    ) -> LocalBoxFuture<'static, Result<serde_json::Value, ApiError>> {
        let _ = request;
        Box::pin(async { Err(ApiError::not_implemented("live sources are not served here")) })
    }
}

/// A connected gateway.
pub struct Gateway {
    client: async_nats::Client,
    settings: NatsSettings,
    subjects: Subjects,
    /// Sent back as the `Capdex-Node` header of every reply, when set.
    node_name: Option<String>,
    /// The nesting a request body may have (`[limits]`).
    limits: crate::core::limits::Limits,
}

/// The reply header naming the node that answered (set with several nodes).
pub const NODE_HEADER: &str = "Capdex-Node";

impl Gateway {
    /// Connects to the configured NATS server, or to the first of the
    /// configured servers that answers (see [`crate::gateway::connect`]).
    pub async fn connect(settings: &NatsSettings) -> Result<Gateway, GatewayError> {
        let client = crate::gateway::connect::connect_options(settings)
            .await?
            .connect(settings.servers.as_slice())
            .await
            .map_err(|source| GatewayError::Connect { url: settings.url.clone(), source })?;
        Ok(Gateway {
            client,
            settings: settings.clone(),
            subjects: Subjects::new(&settings.subject_prefix),
            node_name: None,
            limits: crate::core::limits::Limits::default(),
        })
    }

    pub fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// Sets the limits every request body is checked against before it is decoded (`[limits]`).
    pub fn set_limits(&mut self, limits: crate::core::limits::Limits) {
        self.limits = limits;
    }

    /// Names this node in the `Capdex-Node` header of every reply.
    pub fn set_node_name(&mut self, node_name: &str) {
        self.node_name = Some(node_name.to_string());
    }

    /// The connection, for the JetStream streams (`gateway::jetstream`).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Serves the endpoints until `shutdown` resolves, then stops the service
    /// (no new requests) and flushes what was published.
    /// Events of type `E` received on `events` are published on `events.index`.
    pub async fn serve<A: Api, E: Serialize + 'static>(
        &self,
        api: A,
        mut index_events: tokio::sync::mpsc::UnboundedReceiver<E>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), GatewayError> {
        let name = self.settings.service_name.clone();
        let service = MicroService::start(
            self.client.clone(),
            ServiceConfig {
                name: name.clone(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                description: "capdex: capability discovery and dispatch for AI agents".to_string(),
            },
        )
        .await
        .map_err(|source| GatewayError::Service { name: name.clone(), source })?;
        let api = Rc::new(api);
        let shared = Rc::new(Shared {
            client: self.client.clone(),
            subjects: self.subjects.clone(),
            max_payload_bytes: self.settings.max_payload_bytes,
            node_name: self.node_name.clone(),
            limits: self.limits,
        });
        let in_flight = Rc::new(InFlight::default());
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut endpoint_loops = Vec::new();
        // The plain subjects whose caller the payload names (`agentId`, `by`):
        // for trusted single-tenant setups only, off with `[nats] plain_subjects = false`.
        let plain: Vec<(String, EndpointKind)> = if self.settings.plain_subjects {
            vec![
                (self.subjects.dispatch(), EndpointKind::Dispatch),
                (self.subjects.approval_wildcard("approve"), EndpointKind::Admin(AdminOp::Approve)),
                (self.subjects.approval_wildcard("reject"), EndpointKind::Admin(AdminOp::Reject)),
            ]
        } else {
            tracing::info!("plain dispatch and approval subjects are off: only per-agent and per-approver subjects");
            Vec::new()
        };
        for (subject, endpoint_kind) in plain.into_iter().chain([
            (self.subjects.discover(), EndpointKind::Discover),
            (self.subjects.outcome(), EndpointKind::Outcome),
            (self.subjects.agent_wildcard("dispatch"), EndpointKind::AgentDispatch),
            (self.subjects.agent_wildcard("binding.list"), EndpointKind::Admin(AdminOp::AgentBindings)),
            (self.subjects.agent_wildcard("approval.list"), EndpointKind::Admin(AdminOp::AgentApprovals)),
            (self.subjects.approver_wildcard("approve"), EndpointKind::Admin(AdminOp::ApproverApprove)),
            (self.subjects.approver_wildcard("reject"), EndpointKind::Admin(AdminOp::ApproverReject)),
            (self.subjects.capabilities_upsert(), EndpointKind::Upsert),
            (self.subjects.capabilities_remove(), EndpointKind::Remove),
            (self.subjects.capabilities_list(), EndpointKind::List),
            (self.subjects.plan(), EndpointKind::Plan),
            (self.subjects.search(), EndpointKind::Search),
            (self.subjects.scg_map(), EndpointKind::ScgMap),
            (self.subjects.scg_route(), EndpointKind::ScgRoute),
            (self.subjects.scg_observe(), EndpointKind::ScgObserve),
            (self.subjects.scg_memory_deposit(), EndpointKind::ScgDeposit),
            (self.subjects.capability_register(), EndpointKind::Admin(AdminOp::Register)),
            (self.subjects.capability_update(), EndpointKind::Admin(AdminOp::Update)),
            (self.subjects.capability_list(), EndpointKind::Admin(AdminOp::List)),
            (self.subjects.capability_reload(), EndpointKind::Admin(AdminOp::Reload)),
            (self.subjects.binding_set(), EndpointKind::Admin(AdminOp::SetBinding)),
            (self.subjects.binding_list(), EndpointKind::Admin(AdminOp::ListBindings)),
            (self.subjects.approval_list(), EndpointKind::Admin(AdminOp::ListApprovals)),
            (self.subjects.provenance_list(), EndpointKind::Admin(AdminOp::ListProvenance)),
            (self.subjects.sources_add(), EndpointKind::Sources(SourcesOp::Add)),
            (self.subjects.sources_remove(), EndpointKind::Sources(SourcesOp::Remove)),
            (self.subjects.sources_list(), EndpointKind::Sources(SourcesOp::List)),
            (self.subjects.sources_load(), EndpointKind::Sources(SourcesOp::Load)),
        ]) {
            let endpoint = service
                .endpoint(endpoint_kind.name(), &subject)
                .await
                .map_err(|source| GatewayError::Endpoint { subject: subject.clone(), source })?;
            endpoint_loops.push(tokio::task::spawn_local(serve_endpoint(
                endpoint_kind,
                endpoint,
                api.clone(),
                shared.clone(),
                in_flight.clone(),
                stop_rx.clone(),
            )));
        }
        let events_client = self.client.clone();
        let events_subject = self.subjects.events_index();
        let (events_stop_tx, mut events_stop_rx) = tokio::sync::watch::channel(false);
        let events_loop = tokio::task::spawn_local(async move {
            loop {
                tokio::select! {
                    event = index_events.recv() => match event {
                        Some(event) => publish(&events_client, events_subject.clone(), &event).await,
                        None => return,
                    },
                    _ = events_stop_rx.wait_for(|stopped| *stopped) => break,
                }
            }
            // The changes made by the requests drained at shutdown are still announced.
            while let Ok(event) = index_events.try_recv() {
                publish(&events_client, events_subject.clone(), &event).await;
            }
        });
        tracing::info!(url = %self.settings.url, prefix = %self.subjects.prefix(), id = %service.id(), "serving on NATS");
        shutdown.await;
        tracing::info!(in_flight = in_flight.count.get(), "stopping the NATS service: no new requests");
        // A barrier: this instance pings itself through the server. Messages on
        // one connection arrive in order, so once the ping comes back every
        // request the server routed here before the signal has been read into
        // its endpoint's queue, and the drain below answers it. (async-nats's
        // flush does not wait for the server, and it drops a drained
        // subscription one read cycle after sending the UNSUB.)
        let barrier = format!("{}.PING.{}.{}", crate::gateway::micro::SERVICE_PREFIX, name, service.id());
        match tokio::time::timeout(SHUTDOWN_STEP, self.client.request(barrier, bytes::Bytes::new())).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => tracing::warn!(%err, "the shutdown barrier failed; draining anyway"),
            Err(_) => tracing::warn!("the shutdown barrier took over {SHUTDOWN_STEP:?}; draining anyway"),
        }
        let _ = stop_tx.send(true);
        // Each loop unsubscribes, then hands out what it had already received.
        for endpoint_loop in endpoint_loops {
            let _ = endpoint_loop.await;
        }
        let drain_timeout = Duration::from_millis(self.settings.drain_timeout_ms);
        if tokio::time::timeout(drain_timeout, in_flight.idle()).await.is_err() {
            tracing::warn!(
                unanswered = in_flight.count.get(),
                "requests still in flight after {drain_timeout:?}; exiting without their replies"
            );
        }
        service.stop();
        let _ = events_stop_tx.send(true);
        if tokio::time::timeout(SHUTDOWN_STEP, events_loop).await.is_err() {
            tracing::warn!("index events not all published within {SHUTDOWN_STEP:?} on shutdown");
        }
        // Bounded, so a lost NATS server cannot keep the process from exiting.
        match tokio::time::timeout(SHUTDOWN_STEP, self.client.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "failed to flush NATS on shutdown"),
            Err(_) => tracing::warn!("NATS did not flush within {SHUTDOWN_STEP:?} on shutdown"),
        }
        tracing::info!("NATS service stopped");
        Ok(())
    }
}

/// Receives an endpoint's requests and handles each on its own local task,
/// until `stop` turns true; then unsubscribes and still handles the requests
/// already received.
async fn serve_endpoint<A: Api>(
    kind: EndpointKind,
    endpoint: Endpoint,
    api: Rc<A>,
    shared: Rc<Shared>,
    in_flight: Rc<InFlight>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Endpoint { mut subscriber, stats } = endpoint;
    let spawn = |message: async_nats::Message| {
        let guard = in_flight.enter();
        let (api, shared, stats) = (api.clone(), shared.clone(), stats.clone());
        tokio::task::spawn_local(async move {
            handle(kind, message, api, shared, stats).await;
            drop(guard);
        });
    };
    loop {
        tokio::select! {
            message = subscriber.next() => match message {
                Some(message) => {
                    tracing::debug!(?kind, subject = %message.subject, "request");
                    spawn(message)
                }
                None => return,
            },
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
    }
    // `drain` (not `unsubscribe`, which drops what is buffered) unsubscribes
    // and pings the server: every request the server sent before the
    // unsubscription is still delivered, then the stream ends.
    if let Err(err) = subscriber.drain().await {
        tracing::warn!(?kind, %err, "failed to drain an endpoint");
        return;
    }
    while let Ok(Some(message)) = tokio::time::timeout(SHUTDOWN_STEP, subscriber.next()).await {
        tracing::debug!(?kind, "a request received before the drain");
        spawn(message);
    }
    tracing::debug!(?kind, "endpoint drained");
}

/// Counts the requests being handled, so shutdown can wait for them.
#[derive(Default)]
struct InFlight {
    count: Cell<usize>,
    idle: tokio::sync::Notify,
}

struct InFlightGuard(Rc<InFlight>);

impl InFlight {
    fn enter(self: &Rc<Self>) -> InFlightGuard {
        self.count.set(self.count.get() + 1);
        InFlightGuard(self.clone())
    }

    /// Resolves once no request is in flight.
    async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count.get() == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let count = self.0.count.get() - 1;
        self.0.count.set(count);
        if count == 0 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Gateway {
    /// Publishes every event received on `events` as JSON on `subject`, on a local task,
    /// until the sender is gone; a lagging receiver skips what it missed.
    pub fn forward_events<E: Serialize + Clone + Send + 'static>(
        &self,
        subject: String,
        mut events: tokio::sync::broadcast::Receiver<E>,
    ) -> tokio::task::JoinHandle<()> {
        let client = self.client.clone();
        tokio::task::spawn_local(async move {
            loop {
                match events.recv().await {
                    Ok(event) => publish(&client, subject.clone(), &event).await,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(%subject, missed, "events were dropped before publishing");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        })
    }

    /// Follows the events the operator console shows (KPIs, alerts, dispatch,
    /// sources, index changes, approval decisions: `core::console::model::feed_subjects`)
    /// with plain subscriptions, so every node's console sees every node's
    /// events, and sends each on `feed` until the connection closes.
    pub async fn follow_console_events(
        &self,
        feed: tokio::sync::broadcast::Sender<crate::core::console::model::FeedEvent>,
    ) -> Result<tokio::task::JoinHandle<()>, GatewayError> {
        use crate::core::console::model::{feed_subjects, topic_of, FeedEvent};
        let prefix = self.subjects.prefix().to_string();
        let mut subscriptions = Vec::new();
        for subject in feed_subjects(&prefix) {
            let subscriber = self.client.subscribe(subject.clone()).await.map_err(|err| GatewayError::Request {
                subject: subject.clone(),
                problem: format!("cannot subscribe for the console: {err}"),
            })?;
            subscriptions.push(subscriber);
        }
        let mut all = futures::stream::select_all(subscriptions);
        Ok(tokio::task::spawn_local(async move {
            while let Some(message) = all.next().await {
                if let Some(topic) = topic_of(&prefix, message.subject.as_str()) {
                    // No browser listening is fine: the send fails and the event is dropped.
                    let _ = feed.send(FeedEvent { topic, subject: message.subject.to_string() });
                }
            }
        }))
    }

    /// Sends one JSON request to a capdex endpoint and returns its JSON
    /// answer; an error reply (`{code, message}`) is [`GatewayError::Refused`].
    pub async fn request_json(
        &self,
        subject: &str,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<serde_json::Value, GatewayError> {
        let failed = |problem: String| GatewayError::Request { subject: subject.to_string(), problem };
        let payload = serde_json::to_vec(body).map_err(|err| failed(err.to_string()))?;
        let reply = tokio::time::timeout(timeout, self.client.request(subject.to_string(), payload.into()))
            .await
            .map_err(|_| failed(format!("timed out after {timeout:?}")))?
            .map_err(|err| failed(err.to_string()))?;
        let answer: serde_json::Value =
            serde_json::from_slice(&reply.payload).map_err(|err| failed(format!("the answer is not JSON: {err}")))?;
        let is_error = reply.headers.as_ref().is_some_and(|headers| headers.get(NATS_SERVICE_ERROR).is_some());
        if is_error {
            let text = |key: &str| answer.get(key).and_then(serde_json::Value::as_str).unwrap_or("").to_string();
            return Err(GatewayError::Refused {
                subject: subject.to_string(),
                code: text("code"),
                message: text("message"),
            });
        }
        Ok(answer)
    }

    /// Calls `on_event` with the payload of every message on `subject` (a
    /// wildcard is fine) until `shutdown` resolves.
    pub async fn watch(
        &self,
        subject: &str,
        shutdown: impl Future<Output = ()>,
        mut on_event: impl FnMut(&[u8]),
    ) -> Result<(), GatewayError> {
        let mut subscription = self
            .client
            .subscribe(subject.to_string())
            .await
            .map_err(|source| GatewayError::Subscribe { subject: subject.to_string(), source })?;
        let events = async {
            while let Some(message) = subscription.next().await {
                on_event(&message.payload);
            }
        };
        futures::future::select(std::pin::pin!(events), std::pin::pin!(shutdown)).await;
        Ok(())
    }
}

struct Shared {
    client: async_nats::Client,
    subjects: Subjects,
    max_payload_bytes: usize,
    node_name: Option<String>,
    limits: crate::core::limits::Limits,
}

#[derive(Clone, Copy, Debug)]
enum EndpointKind {
    Discover,
    Outcome,
    Dispatch,
    /// `<prefix>.agent.<agentId>.dispatch`: the call's `agentId` is the subject's.
    AgentDispatch,
    Upsert,
    Remove,
    List,
    Plan,
    Search,
    ScgMap,
    ScgRoute,
    ScgObserve,
    ScgDeposit,
    Admin(AdminOp),
    Sources(SourcesOp),
}

/// The live-sources endpoints.
#[derive(Clone, Copy, Debug)]
enum SourcesOp {
    Add,
    Remove,
    List,
    Load,
}

/// The dispatch admin endpoints.
#[derive(Clone, Copy, Debug)]
enum AdminOp {
    Register,
    Update,
    List,
    Reload,
    SetBinding,
    ListBindings,
    ListApprovals,
    Approve,
    Reject,
    ListProvenance,
    /// `<prefix>.agent.<agentId>.binding.list`: that agent's bindings only.
    AgentBindings,
    /// `<prefix>.agent.<agentId>.approval.list`: that agent's approvals only.
    AgentApprovals,
    /// `<prefix>.approver.<name>.approval.<id>.approve`: decided by `<name>`.
    ApproverApprove,
    /// `<prefix>.approver.<name>.approval.<id>.reject`.
    ApproverReject,
}

impl EndpointKind {
    /// The endpoint's name in `$SRV.INFO` and `$SRV.STATS`.
    fn name(self) -> &'static str {
        match self {
            EndpointKind::Discover => "discover",
            EndpointKind::Outcome => "outcome",
            EndpointKind::Dispatch => "dispatch",
            EndpointKind::AgentDispatch => "agent-dispatch",
            EndpointKind::Upsert => "capabilities-upsert",
            EndpointKind::Remove => "capabilities-remove",
            EndpointKind::List => "capabilities-list",
            EndpointKind::Plan => "plan",
            EndpointKind::Search => "search",
            EndpointKind::ScgMap => "map",
            EndpointKind::ScgRoute => "route",
            EndpointKind::ScgObserve => "observe",
            EndpointKind::ScgDeposit => "memory-deposit",
            EndpointKind::Admin(op) => match op {
                AdminOp::Register => "capability-register",
                AdminOp::Update => "capability-update",
                AdminOp::List => "capability-list",
                AdminOp::Reload => "capability-reload",
                AdminOp::SetBinding => "binding-set",
                AdminOp::ListBindings => "binding-list",
                AdminOp::ListApprovals => "approval-list",
                AdminOp::Approve => "approval-approve",
                AdminOp::Reject => "approval-reject",
                AdminOp::ListProvenance => "provenance-list",
                AdminOp::AgentBindings => "agent-binding-list",
                AdminOp::AgentApprovals => "agent-approval-list",
                AdminOp::ApproverApprove => "approver-approve",
                AdminOp::ApproverReject => "approver-reject",
            },
            EndpointKind::Sources(op) => match op {
                SourcesOp::Add => "sources-add",
                SourcesOp::Remove => "sources-remove",
                SourcesOp::List => "sources-list",
                SourcesOp::Load => "sources-load",
            },
        }
    }
}

async fn handle<A: Api>(
    kind: EndpointKind,
    message: async_nats::Message,
    api: Rc<A>,
    shared: Rc<Shared>,
    stats: EndpointStats,
) {
    let started = Instant::now();
    let payload = message.payload.clone();
    let codec = request_codec(&message);
    let max = shared.max_payload_bytes;
    // An empty body means "no arguments" for the requests that have none required.
    let empty = payload.is_empty();
    // Who a per-agent or per-approver subject proves the caller is.
    let proven = || {
        shared
            .subjects
            .identity_of(message.subject.as_str())
            .ok_or_else(|| ApiError::bad_request(format!("{} names no agent or approver", message.subject)))
    };
    let result: Result<Vec<u8>, ApiError> = async {
        crate::gateway::wire::check_body(codec, &payload, &shared.limits)?;
        match kind {
            EndpointKind::Discover => {
                let discover: DiscoverRequest = codec.decode(&payload, max)?;
                discover.filter(&shared.limits)?;
                if discover.plan.is_some() {
                    let reply = api.plan(discover).await?;
                    codec.encode(&DiscoverReply { result: reply.discovery.unwrap_or_default(), plan: Some(reply.plan) })
                } else {
                    api.discover_encoded(discover, codec).await
                }
            }
            EndpointKind::Search => {
                let search: SearchRequest = codec.decode(&payload, max)?;
                let discover = search.into_discover();
                discover.filter(&shared.limits)?;
                api.search_encoded(discover, codec).await
            }
            EndpointKind::Plan => {
                let request: PlanRequest = codec.decode(&payload, max)?;
                codec.encode(&api.plan(request.into_discover(&shared.limits)?).await?)
            }
            EndpointKind::Outcome => outcome(api.as_ref(), &shared, codec, &payload).await,
            EndpointKind::Dispatch => {
                let call: serde_json::Value = codec.decode(&payload, max)?;
                codec.encode(&api.dispatch(call).await?)
            }
            EndpointKind::AgentDispatch => {
                let mut call: serde_json::Value = codec.decode(&payload, max)?;
                bind_identity(&mut call, "agentId", proven()?, shared.limits.max_id_bytes)?;
                codec.encode(&api.dispatch(call).await?)
            }
            EndpointKind::Upsert => {
                let batch: RegistrationPayload = codec.decode(&payload, max)?;
                let offered = batch.tools.len() + batch.skills.len() + batch.extensions.len() + batch.channels.len();
                let most = shared.limits.max_tools_per_source;
                crate::core::limits::check(crate::core::limits::Limit::ToolsPerSource, offered, most)?;
                codec.encode(&api.register(batch).await?)
            }
            EndpointKind::Remove => {
                let remove: RemoveRequest = codec.decode(&payload, max)?;
                codec.encode(&api.unregister(remove).await?)
            }
            EndpointKind::ScgMap => codec.encode(&api.scg_map(codec.decode(&payload, max)?).await?),
            EndpointKind::ScgRoute => codec.encode(&api.scg_route(codec.decode(&payload, max)?).await?),
            EndpointKind::ScgObserve => codec.encode(&api.scg_observe(codec.decode(&payload, max)?).await?),
            EndpointKind::ScgDeposit => codec.encode(&api.scg_deposit(codec.decode(&payload, max)?).await?),
            EndpointKind::List => {
                let list: ListRequest = if empty { ListRequest::default() } else { codec.decode(&payload, max)? };
                codec.encode(&api.list(list).await?)
            }
            EndpointKind::Admin(op) => {
                use crate::gateway::wire::DispatchAdmin;
                let mut body: serde_json::Value =
                    if empty { serde_json::json!({}) } else { codec.decode(&payload, max)? };
                match op {
                    AdminOp::AgentBindings | AdminOp::AgentApprovals => {
                        bind_identity(&mut body, "agentId", proven()?, shared.limits.max_id_bytes)?
                    }
                    AdminOp::ApproverApprove | AdminOp::ApproverReject => {
                        bind_identity(&mut body, "by", proven()?, shared.limits.max_id_bytes)?
                    }
                    _ => {}
                }
                // `<prefix>.approval.<id>.<action>` (or `<prefix>.approver.<name>.approval.<id>.<action>`):
                // the id is the second token from the end.
                let approval_id = || message.subject.rsplit('.').nth(1).unwrap_or_default().to_string();
                let admin = match op {
                    AdminOp::Register => DispatchAdmin::Register(body),
                    AdminOp::Update => DispatchAdmin::Update(body),
                    AdminOp::List => DispatchAdmin::List,
                    AdminOp::Reload => DispatchAdmin::Reload,
                    AdminOp::SetBinding => DispatchAdmin::SetBinding(body),
                    AdminOp::ListBindings | AdminOp::AgentBindings => DispatchAdmin::ListBindings(body),
                    AdminOp::ListApprovals | AdminOp::AgentApprovals => DispatchAdmin::ListApprovals(body),
                    AdminOp::Approve | AdminOp::Reject | AdminOp::ApproverApprove | AdminOp::ApproverReject => {
                        DispatchAdmin::Decide {
                            id: approval_id(),
                            approve: matches!(op, AdminOp::Approve | AdminOp::ApproverApprove),
                            by: crate::gateway::wire::DecideRequest::decider(body, shared.limits.max_id_bytes)?,
                        }
                    }
                    AdminOp::ListProvenance => DispatchAdmin::ListProvenance(body),
                };
                codec.encode(&api.dispatch_admin(admin).await?)
            }
            EndpointKind::Sources(op) => {
                use crate::gateway::wire::SourcesRequest;
                let body: serde_json::Value =
                    if empty { serde_json::json!({}) } else { codec.decode(&payload, max)? };
                let request = match op {
                    SourcesOp::Add => SourcesRequest::Add(body),
                    SourcesOp::Remove => SourcesRequest::Remove(body),
                    SourcesOp::List => SourcesRequest::List,
                    SourcesOp::Load => SourcesRequest::Load(body),
                };
                codec.encode(&api.sources(request).await?)
            }
        }
    }
    .await;
    respond(kind, &message, codec, result, &shared, &stats, started).await;
}

/// The codec a request asks for with its `Content-Type` header.
fn request_codec(message: &async_nats::Message) -> Codec {
    Codec::from_content_type(
        message.headers.as_ref().and_then(|headers| headers.get("Content-Type")).map(|v| v.as_str()),
    )
}

/// Records an outcome, publishes its KPI (unless a duplicate) and alert
/// events, and returns the encoded reply.
async fn outcome<A: Api>(api: &A, shared: &Shared, codec: Codec, payload: &[u8]) -> Result<Vec<u8>, ApiError> {
    let report: OutcomeReport = codec.decode(payload, shared.max_payload_bytes)?;
    let recorded = api.outcome(report).await?;
    if !recorded.duplicate {
        publish(&shared.client, shared.subjects.kpi(&recorded.kpi.scope_key), &recorded.kpi).await;
    }
    if let Some(alert) = &recorded.alert {
        publish(&shared.client, shared.subjects.alert(&alert.severity, &alert.scope_key), alert).await;
    }
    codec.encode(&OutcomeReply { accepted: true, duplicate: recorded.duplicate, kpi: recorded.kpi })
}

/// Sends the reply (or the error reply, with its headers) to a request and records it.
async fn respond(
    kind: EndpointKind,
    message: &async_nats::Message,
    codec: Codec,
    result: Result<Vec<u8>, ApiError>,
    shared: &Shared,
    stats: &EndpointStats,
    started: Instant,
) {
    let Some(reply) = message.reply.clone() else {
        if let Err(err) = &result {
            tracing::warn!(?kind, code = %err.code(), message = %err.message, "request without reply subject failed");
        }
        return;
    };
    let mut headers = HeaderMap::new();
    if codec == Codec::Msgpack {
        headers.insert("Content-Type", crate::gateway::wire::MSGPACK_CONTENT_TYPE);
    }
    if let Some(node_name) = &shared.node_name {
        headers.insert(NODE_HEADER, node_name.as_str());
    }
    // A reply over the server's payload limit would never arrive (the requester
    // would only time out): it becomes an error that says so.
    let result = result.and_then(|body| match reply_limit(&shared.client, body.len()) {
        Some(limit) => Err(ApiError::new(
            ErrorKind::TooLarge("reply_too_large"),
            format!(
                "the reply is {} bytes, over the server's payload limit of {limit}: ask for less (a page, a filter)",
                body.len()
            ),
        )),
        None => Ok(body),
    });
    let (body, error) = match result {
        Ok(body) => (body, None),
        Err(err) => {
            metrics::counter!("capdex_request_errors_total", "code" => err.code().to_string()).increment(1);
            headers.insert(NATS_SERVICE_ERROR, err.message.as_str());
            headers.insert(NATS_SERVICE_ERROR_CODE, err.status().to_string().as_str());
            let body = codec.encode(&err).unwrap_or_default();
            (body, Some(format!("{} {}: {}", err.status(), err.code(), err.message)))
        }
    };
    let sent = if headers.is_empty() {
        shared.client.publish(reply, body.into()).await
    } else {
        shared.client.publish_with_headers(reply, headers, body.into()).await
    };
    stats.record(started.elapsed(), error);
    if let Err(err) = sent {
        tracing::warn!(%err, "failed to send a reply");
    }
}

/// Bytes of a reply's payload limit kept for its headers.
const REPLY_HEADROOM: usize = 4 * 1024;

/// The server's payload limit when a reply of `len` bytes (and its headers)
/// would be over it.
fn reply_limit(client: &async_nats::Client, len: usize) -> Option<usize> {
    let limit = client.max_payload(); // an atomic the client keeps from the server's INFO
    (len > limit.saturating_sub(REPLY_HEADROOM)).then_some(limit)
}

/// The header naming an error reply's problem (ADR-32).
pub const NATS_SERVICE_ERROR: &str = "Nats-Service-Error";
/// The header carrying an error reply's numeric code (ADR-32).
pub const NATS_SERVICE_ERROR_CODE: &str = "Nats-Service-Error-Code";

async fn publish<T: Serialize>(client: &async_nats::Client, subject: String, event: &T) {
    match serde_json::to_vec(event) {
        Ok(body) => {
            if let Err(err) = client.publish(subject.clone(), body.into()).await {
                tracing::warn!(%subject, %err, "failed to publish an event");
            }
        }
        Err(err) => tracing::warn!(%subject, %err, "failed to encode an event"),
    }
}

impl Gateway {
    /// Publishes every event sent to the returned sender on
    /// `<prefix>.events.dispatch`. Must be called inside the actix System.
    pub fn dispatch_event_publisher(&self) -> tokio::sync::mpsc::UnboundedSender<crate::core::dispatch::DispatchEvent> {
        let (sender, mut events) = tokio::sync::mpsc::unbounded_channel::<crate::core::dispatch::DispatchEvent>();
        let client = self.client.clone();
        let subject = self.subjects.events_dispatch();
        tokio::task::spawn_local(async move {
            while let Some(event) = events.recv().await {
                publish(&client, subject.clone(), &event).await;
            }
        });
        sender
    }

    /// Publishes the KPI (unless a duplicate) and alert events of every outcome
    /// sent to the returned sender, as the `outcome` endpoint does for its own,
    /// for outcomes recorded elsewhere (the MCP face). Must be called inside the actix System.
    pub fn outcome_event_publisher(&self) -> tokio::sync::mpsc::UnboundedSender<RecordedOutcome> {
        let (sender, mut outcomes) = tokio::sync::mpsc::unbounded_channel::<RecordedOutcome>();
        let client = self.client.clone();
        let subjects = self.subjects.clone();
        tokio::task::spawn_local(async move {
            while let Some(recorded) = outcomes.recv().await {
                if !recorded.duplicate {
                    publish(&client, subjects.kpi(&recorded.kpi.scope_key), &recorded.kpi).await;
                }
                if let Some(alert) = &recorded.alert {
                    publish(&client, subjects.alert(&alert.severity, &alert.scope_key), alert).await;
                }
            }
        });
        sender
    }

    /// The transport to handler services: a request on `<prefix>.exec.<slug>`.
    pub fn exec_transport(&self) -> NatsExec {
        NatsExec { client: self.client.clone(), subjects: self.subjects.clone() }
    }
}

/// Sends internal capability calls to their handler services over NATS
/// (`<prefix>.exec.<slug>`, answered by a queue group of handlers).
#[derive(Clone)]
pub struct NatsExec {
    client: async_nats::Client,
    subjects: Subjects,
}

impl crate::core::dispatch::ExecTransport for NatsExec {
    fn request(
        &self,
        slug: &str,
        payload: Vec<u8>,
        timeout_ms: u64,
    ) -> LocalBoxFuture<'static, Result<Vec<u8>, crate::core::dispatch::ExecFailure>> {
        use crate::core::dispatch::ExecFailure;
        let client = self.client.clone();
        let subject = self.subjects.exec(slug);
        Box::pin(async move {
            let request = async_nats::Request::new()
                .payload(payload.into())
                .timeout(Some(std::time::Duration::from_millis(timeout_ms)));
            match client.send_request(subject.clone(), request).await {
                Ok(message) => Ok(message.payload.to_vec()),
                Err(err) => Err(match err.kind() {
                    async_nats::RequestErrorKind::NoResponders => ExecFailure::NoHandler(subject),
                    async_nats::RequestErrorKind::TimedOut => ExecFailure::TimedOut(timeout_ms),
                    _ => ExecFailure::Transport(err.to_string()),
                }),
            }
        })
    }
}
