//! The NATS micro service: connects, registers the `capdex` service (so
//! `$SRV.PING`, `$SRV.INFO` and `$SRV.STATS` answer), serves its endpoints in
//! the default queue group (so several nodes share the load), and publishes
//! KPI and alert events.
//!
//! The service calls back into capdex through the [`Api`] trait, so this
//! module knows nothing of actors. Requests are handled concurrently, each on
//! its own local task: a slow request never holds up the others.

use crate::config::NatsSettings;
use crate::core::discovery::DiscoveryResult;
use crate::core::kpi_window::OutcomeReport;
use crate::core::sources::SourcesPayload;
use crate::gateway::subjects::Subjects;
use crate::gateway::wire::{
    ApiError, Codec, DiscoverReply, DiscoverRequest, ListRequest, OutcomeReply, PlanReply, PlanRequest,
    RecordedOutcome, RegistrationReply, RemoveRequest, SearchRequest,
};
use async_nats::service::{Request, ServiceExt};
use async_nats::HeaderMap;
use futures::future::LocalBoxFuture;
use futures::StreamExt;
use serde::Serialize;
use std::future::Future;
use std::rc::Rc;

/// The longest each shutdown step (stop the service, flush) may take.
const SHUTDOWN_STEP: std::time::Duration = std::time::Duration::from_secs(2);

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
    fn register(&self, payload: SourcesPayload) -> LocalBoxFuture<'static, Result<RegistrationReply, ApiError>>;
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
    /// Registry, bindings, approvals and provenance of the dispatch pipeline.
    fn dispatch_admin(
        &self,
        request: crate::gateway::wire::DispatchAdmin,
    ) -> LocalBoxFuture<'static, Result<serde_json::Value, ApiError>> {
        let _ = request;
        Box::pin(async { Err(ApiError::new(501, "not_implemented", "dispatch administration is not served here")) })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("failed to connect to NATS at {url}: {source}")]
    Connect { url: String, source: async_nats::ConnectError },
    #[error("failed to start the NATS service {name}: {source}")]
    Service { name: String, source: async_nats::Error },
    #[error("failed to subscribe to {subject}: {source}")]
    Subscribe { subject: String, source: async_nats::SubscribeError },
    #[error("failed to add endpoint {subject}: {source}")]
    Endpoint { subject: String, source: async_nats::Error },
}

/// A connected gateway.
pub struct Gateway {
    client: async_nats::Client,
    settings: NatsSettings,
    subjects: Subjects,
}

impl Gateway {
    /// Connects to the configured NATS server.
    pub async fn connect(settings: &NatsSettings) -> Result<Gateway, GatewayError> {
        let client = async_nats::ConnectOptions::new()
            .name(format!("{}-{}", settings.service_name, std::process::id()))
            .connect(&settings.url)
            .await
            .map_err(|source| GatewayError::Connect { url: settings.url.clone(), source })?;
        Ok(Gateway { client, settings: settings.clone(), subjects: Subjects::new(&settings.subject_prefix) })
    }

    pub fn subjects(&self) -> &Subjects {
        &self.subjects
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
        let service = self
            .client
            .service_builder()
            .description("capdex: capability discovery and dispatch for AI agents")
            .start(&name, env!("CARGO_PKG_VERSION"))
            .await
            .map_err(|source| GatewayError::Service { name: name.clone(), source })?;
        let api = Rc::new(api);
        let shared = Rc::new(Shared {
            client: self.client.clone(),
            subjects: self.subjects.clone(),
            max_payload_bytes: self.settings.max_payload_bytes,
        });
        let mut loops = Vec::new();
        for (subject, endpoint_kind) in [
            (self.subjects.discover(), EndpointKind::Discover),
            (self.subjects.outcome(), EndpointKind::Outcome),
            (self.subjects.dispatch(), EndpointKind::Dispatch),
            (self.subjects.capabilities_upsert(), EndpointKind::Upsert),
            (self.subjects.capabilities_remove(), EndpointKind::Remove),
            (self.subjects.capabilities_list(), EndpointKind::List),
            (self.subjects.plan(), EndpointKind::Plan),
            (self.subjects.search(), EndpointKind::Search),
            (self.subjects.capability_register(), EndpointKind::Admin(AdminOp::Register)),
            (self.subjects.capability_update(), EndpointKind::Admin(AdminOp::Update)),
            (self.subjects.capability_list(), EndpointKind::Admin(AdminOp::List)),
            (self.subjects.capability_reload(), EndpointKind::Admin(AdminOp::Reload)),
            (self.subjects.binding_set(), EndpointKind::Admin(AdminOp::SetBinding)),
            (self.subjects.binding_list(), EndpointKind::Admin(AdminOp::ListBindings)),
            (self.subjects.approval_list(), EndpointKind::Admin(AdminOp::ListApprovals)),
            (self.subjects.approval_wildcard("approve"), EndpointKind::Admin(AdminOp::Approve)),
            (self.subjects.approval_wildcard("reject"), EndpointKind::Admin(AdminOp::Reject)),
            (self.subjects.provenance_list(), EndpointKind::Admin(AdminOp::ListProvenance)),
        ] {
            let endpoint = service
                .endpoint(&subject)
                .await
                .map_err(|source| GatewayError::Endpoint { subject: subject.clone(), source })?;
            let api = api.clone();
            let shared = shared.clone();
            loops.push(tokio::task::spawn_local(async move {
                let mut endpoint = endpoint;
                while let Some(request) = endpoint.next().await {
                    tokio::task::spawn_local(handle(endpoint_kind, request, api.clone(), shared.clone()));
                }
            }));
        }
        let events_client = self.client.clone();
        let events_subject = self.subjects.events_index();
        loops.push(tokio::task::spawn_local(async move {
            while let Some(event) = index_events.recv().await {
                publish(&events_client, events_subject.clone(), &event).await;
            }
        }));
        tracing::info!(url = %self.settings.url, prefix = %self.subjects.prefix(), "serving on NATS");
        shutdown.await;
        tracing::info!("stopping the NATS service");
        // Bounded, so a lost NATS server cannot keep the process from exiting.
        match tokio::time::timeout(SHUTDOWN_STEP, service.stop()).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "failed to stop the NATS service cleanly"),
            Err(_) => tracing::warn!("the NATS service did not stop within {SHUTDOWN_STEP:?}"),
        }
        for task in loops {
            task.abort();
        }
        match tokio::time::timeout(SHUTDOWN_STEP, self.client.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "failed to flush NATS on shutdown"),
            Err(_) => tracing::warn!("NATS did not flush within {SHUTDOWN_STEP:?} on shutdown"),
        }
        Ok(())
    }
}

impl Gateway {
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
}

#[derive(Clone, Copy, Debug)]
enum EndpointKind {
    Discover,
    Outcome,
    Dispatch,
    Upsert,
    Remove,
    List,
    Plan,
    Search,
    Admin(AdminOp),
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
}

async fn handle<A: Api>(kind: EndpointKind, request: Request, api: Rc<A>, shared: Rc<Shared>) {
    let payload = request.message.payload.clone();
    let content_type = request
        .message
        .headers
        .as_ref()
        .and_then(|headers| headers.get("Content-Type"))
        .map(|v| v.as_str().to_string());
    let codec = Codec::from_content_type(content_type.as_deref());
    let max = shared.max_payload_bytes;
    // An empty body means "no arguments" for the requests that have none required.
    let empty = payload.is_empty();
    let result: Result<Vec<u8>, ApiError> = async {
        match kind {
            EndpointKind::Discover => {
                let discover: DiscoverRequest = codec.decode(&payload, max)?;
                discover.filter()?;
                if discover.plan.is_some() {
                    let reply = api.plan(discover).await?;
                    codec.encode(&DiscoverReply { result: reply.discovery.unwrap_or_default(), plan: Some(reply.plan) })
                } else {
                    codec.encode(&api.discover(discover).await?)
                }
            }
            EndpointKind::Search => {
                let search: SearchRequest = codec.decode(&payload, max)?;
                let discover = search.into_discover();
                discover.filter()?;
                codec.encode(&api.search(discover).await?)
            }
            EndpointKind::Plan => {
                let request: PlanRequest = codec.decode(&payload, max)?;
                codec.encode(&api.plan(request.into_discover()?).await?)
            }
            EndpointKind::Outcome => {
                let report: OutcomeReport = codec.decode(&payload, max)?;
                let recorded = api.outcome(report).await?;
                if !recorded.duplicate {
                    publish(&shared.client, shared.subjects.kpi(&recorded.kpi.scope_key), &recorded.kpi).await;
                }
                if let Some(alert) = &recorded.alert {
                    publish(&shared.client, shared.subjects.alert(&alert.severity, &alert.scope_key), alert).await;
                }
                codec.encode(&OutcomeReply { accepted: true, duplicate: recorded.duplicate, kpi: recorded.kpi })
            }
            EndpointKind::Dispatch => {
                let call: serde_json::Value = codec.decode(&payload, max)?;
                codec.encode(&api.dispatch(call).await?)
            }
            EndpointKind::Upsert => {
                let batch: SourcesPayload = codec.decode(&payload, max)?;
                codec.encode(&api.register(batch).await?)
            }
            EndpointKind::Remove => {
                let remove: RemoveRequest = codec.decode(&payload, max)?;
                codec.encode(&api.unregister(remove).await?)
            }
            EndpointKind::List => {
                let list: ListRequest = if empty { ListRequest::default() } else { codec.decode(&payload, max)? };
                codec.encode(&api.list(list).await?)
            }
            EndpointKind::Admin(op) => {
                use crate::gateway::wire::DispatchAdmin;
                let body: serde_json::Value =
                    if empty { serde_json::json!({}) } else { codec.decode(&payload, max)? };
                // `<prefix>.approval.<id>.<action>`: the id is the second token from the end.
                let approval_id = || request.message.subject.rsplit('.').nth(1).unwrap_or_default().to_string();
                let admin = match op {
                    AdminOp::Register => DispatchAdmin::Register(body),
                    AdminOp::Update => DispatchAdmin::Update(body),
                    AdminOp::List => DispatchAdmin::List,
                    AdminOp::Reload => DispatchAdmin::Reload,
                    AdminOp::SetBinding => DispatchAdmin::SetBinding(body),
                    AdminOp::ListBindings => DispatchAdmin::ListBindings(body),
                    AdminOp::ListApprovals => DispatchAdmin::ListApprovals(body),
                    AdminOp::Approve => DispatchAdmin::Decide { id: approval_id(), approve: true },
                    AdminOp::Reject => DispatchAdmin::Decide { id: approval_id(), approve: false },
                    AdminOp::ListProvenance => DispatchAdmin::ListProvenance(body),
                };
                codec.encode(&api.dispatch_admin(admin).await?)
            }
        }
    }
    .await;
    if request.message.reply.is_none() {
        if let Err(err) = &result {
            tracing::warn!(?kind, code = %err.code, message = %err.message, "request without reply subject failed");
        }
        return;
    }
    let mut headers = HeaderMap::new();
    if codec == Codec::Msgpack {
        headers.insert("Content-Type", crate::gateway::wire::MSGPACK_CONTENT_TYPE);
    }
    let sent = match result {
        Ok(body) => request.respond_with_headers(Ok(body.into()), headers).await,
        Err(err) => {
            metrics::counter!("capdex_request_errors_total", "code" => err.code.clone()).increment(1);
            headers.insert(async_nats::service::NATS_SERVICE_ERROR, err.message.as_str());
            headers.insert(async_nats::service::NATS_SERVICE_ERROR_CODE, err.status.to_string().as_str());
            let body = codec.encode(&err).unwrap_or_default();
            request.respond_with_headers(Ok(body.into()), headers).await
        }
    };
    if let Err(err) = sent {
        tracing::warn!(%err, "failed to send a reply");
    }
}

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
