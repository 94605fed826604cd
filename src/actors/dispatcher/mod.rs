//! Dispatcher: runs capability calls through `core::dispatch::pipeline` and
//! executes what it admits: internal capabilities in-process (built-ins, or
//! handlers given with [`Dispatcher::with_handler`]) or through an
//! [`ExecTransport`] (NATS `<prefix>.exec.<slug>`), `api` capabilities as an
//! HTTP request and `webhook` ones as a fire-and-forget POST, both behind the
//! SSRF guard and with `${env:VAR}` resolved at call time.
//!
//! Re-drive: a call with `(executionId, stepId[, turn])` to a capability that
//! is not `isIdempotent` claims its key in the create-only cache (durably)
//! before it runs, and stores a successful result (durably) before it
//! answers; a repeat gets the stored result, a concurrent duplicate waits for
//! the first, and a key left in progress by a process that died is refused
//! (its outcome is unknown), so a handler never runs twice for one step.
//!
//! Every call answers a [`CallResult`], records redacted provenance and
//! sends a [`DispatchEvent`] to every event sink. Never panics; every wait is
//! bounded by the capability's timeout.
//!
//! Test-only hook: with `CAPDEX_TEST_CRASH_AFTER_EXEC=1` the process aborts
//! right after a result is stored durably and before it is answered (used by
//! the kill -9 re-drive test).

use crate::actors::Observe;
use crate::config::DispatchSettings;
use crate::core::dispatch::approval::{self, Approval, ApprovalStatus};
use crate::core::dispatch::pipeline::{self, Admission, CallFacts, DispatchCall, ExecutionKey, Pipeline};
use crate::core::dispatch::registry::{self, Binding, CapabilityRecord, ExecutionType, FunctionDefinition};
use crate::core::dispatch::ssrf;
use crate::core::dispatch::{
    CallResult, DispatchEvent, ErrorCode, ExecFailure, ExecRequest, ExecTransport, ProvenanceRecord,
};
use crate::core::dispatch_rules::Builtin;
use crate::store::dispatch::{CacheEntry, Claim};
use crate::store::{Store, StoreError};
use actix::prelude::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Runs one capability call; always answers a [`CallResult`].
#[derive(Message, Debug)]
#[rtype(result = "CallResult")]
pub struct Dispatch {
    pub call: DispatchCall,
}

/// An in-process handler of internal capabilities.
pub type InProcessHandler = Arc<dyn Fn(&ExecRequest) -> CallResult + Send + Sync>;
/// Receives every call's event (NATS publishing, the KPI actor, ...).
pub type EventSink = Arc<dyn Fn(&DispatchEvent) + Send + Sync>;
/// Reads an environment variable for `${env:VAR}`.
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Sets the transport to handler services.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetTransport(pub Arc<dyn ExecTransport + Send + Sync>);

/// Adds an event sink.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AddEventSink(pub EventSink);

/// Why an admin request was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct AdminError {
    /// HTTP-like status (400, 404, 409, 500).
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl AdminError {
    fn new(status: u16, code: &str, message: impl Into<String>) -> AdminError {
        AdminError { status, code: code.to_string(), message: message.into() }
    }
}

impl From<StoreError> for AdminError {
    fn from(err: StoreError) -> AdminError {
        AdminError::new(500, "internal", err.to_string())
    }
}

/// Registers a new capability (`update: false`) or replaces one (`update: true`).
#[derive(Message, Debug)]
#[rtype(result = "Result<CapabilityRecord, AdminError>")]
pub struct RegisterCapability {
    pub record: CapabilityRecord,
    pub update: bool,
}

/// Lists the registry (built-ins included).
#[derive(Message, Debug, Default)]
#[rtype(result = "Vec<CapabilityRecord>")]
pub struct ListCapabilities;

/// Re-reads registry and bindings from the store (rate windows are kept).
#[derive(Message, Debug, Default)]
#[rtype(result = "Result<usize, AdminError>")]
pub struct ReloadRegistry;

/// Sets an agent's binding; answers the `${env:VAR}` names that are not set.
#[derive(Message, Debug)]
#[rtype(result = "Result<Vec<String>, AdminError>")]
pub struct SetBinding(pub Binding);

/// Lists bindings, of one agent or all.
#[derive(Message, Debug, Default)]
#[rtype(result = "Result<Vec<Binding>, AdminError>")]
pub struct ListBindings {
    pub agent_id: Option<String>,
}

/// Approves or rejects a pending approval.
#[derive(Message, Debug)]
#[rtype(result = "Result<Approval, AdminError>")]
pub struct DecideApproval {
    pub id: String,
    pub approve: bool,
}

/// Lists approvals (only pending, unexpired ones when `pending_only`).
#[derive(Message, Debug, Default)]
#[rtype(result = "Result<Vec<Approval>, AdminError>")]
pub struct ListApprovals {
    pub pending_only: bool,
}

/// The newest provenance records.
#[derive(Message, Debug)]
#[rtype(result = "Result<Vec<ProvenanceRecord>, AdminError>")]
pub struct ListProvenance {
    pub limit: usize,
}

/// What the dispatcher has done.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DispatcherStats {
    /// Handlers run (in-process, over the transport, or HTTP).
    pub executed: u64,
    /// Stored results given again (re-drives and concurrent duplicates).
    pub replayed: u64,
    /// Calls refused before running.
    pub refused: u64,
    /// Calls that ran and failed.
    pub failed: u64,
    /// Approvals created.
    pub approvals_requested: u64,
}

/// The handler name of the built-in echo capability.
pub const ECHO_HANDLER: &str = "builtin:echo";

/// Registry records of capdex's built-ins (slug `echo`).
pub fn builtin_records() -> Vec<CapabilityRecord> {
    let echo = Builtin::Echo.descriptor();
    vec![CapabilityRecord {
        slug: "echo".into(),
        name: echo.display_name,
        description: echo.description.clone(),
        category: echo.category,
        execution_type: ExecutionType::Internal,
        handler: ECHO_HANDLER.into(),
        function_definition: FunctionDefinition {
            name: "echo".into(),
            description: echo.description,
            parameters: echo.full_schema.unwrap_or_else(|| json!({"type": "object"})),
        },
        requires_approval: false,
        approval_timeout_ms: None,
        rate_limit: None,
        is_idempotent: true,
        is_active: true,
        processes_pii: false,
        redaction: None,
        timeout_ms: None,
        policy_version: 1,
    }]
}

pub struct Dispatcher {
    store: Store,
    settings: DispatchSettings,
    pipeline: Pipeline,
    handlers: HashMap<String, InProcessHandler>,
    transport: Option<Arc<dyn ExecTransport + Send + Sync>>,
    sinks: Vec<EventSink>,
    env: EnvLookup,
    inflight: HashMap<Vec<u8>, Vec<futures::channel::oneshot::Sender<CallResult>>>,
    boot_id: String,
    epoch: Instant,
    crash_after_exec: bool,
    stats: DispatcherStats,
}

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Bytes no one can guess: time, process, an address and a counter, hashed.
fn unpredictable_seed() -> Vec<u8> {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let mut seed = hasher.finish().to_le_bytes().to_vec();
    seed.extend_from_slice(&nanos.to_le_bytes());
    seed.extend_from_slice(&std::process::id().to_le_bytes());
    seed
}

impl Dispatcher {
    /// Loads the registry and bindings from the store; built-ins are added
    /// (the echo handler runs in-process).
    pub fn new(store: Store, settings: DispatchSettings) -> Result<Dispatcher, StoreError> {
        let mut pipeline = Pipeline::new(settings.binding_mode, settings.rate_window_ms);
        pipeline.load_registry(Self::registry_of(&store)?);
        pipeline.load_bindings(store.bindings()?);
        let echo: InProcessHandler =
            Arc::new(|request: &ExecRequest| CallResult::ok(Builtin::Echo.run(&request.arguments)));
        Ok(Dispatcher {
            store,
            settings,
            pipeline,
            handlers: HashMap::from([(ECHO_HANDLER.to_string(), echo)]),
            transport: None,
            sinks: Vec::new(),
            env: Arc::new(|name: &str| std::env::var(name).ok()),
            inflight: HashMap::new(),
            boot_id: approval::approval_id(&unpredictable_seed()),
            epoch: Instant::now(),
            crash_after_exec: std::env::var("CAPDEX_TEST_CRASH_AFTER_EXEC").is_ok_and(|v| v == "1"),
            stats: DispatcherStats::default(),
        })
    }

    fn registry_of(store: &Store) -> Result<Vec<CapabilityRecord>, StoreError> {
        let mut records = builtin_records();
        records.extend(store.capability_records()?);
        Ok(records)
    }

    /// Runs internal capabilities whose `handler` is `name` in-process.
    pub fn with_handler(mut self, name: &str, handler: InProcessHandler) -> Dispatcher {
        self.handlers.insert(name.to_string(), handler);
        self
    }

    pub fn with_transport(mut self, transport: Arc<dyn ExecTransport + Send + Sync>) -> Dispatcher {
        self.transport = Some(transport);
        self
    }

    pub fn with_event_sink(mut self, sink: EventSink) -> Dispatcher {
        self.sinks.push(sink);
        self
    }

    /// Replaces how `${env:VAR}` is read (default: the process environment).
    pub fn with_env(mut self, env: EnvLookup) -> Dispatcher {
        self.env = env;
        self
    }

    fn mono_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn timeout_ms(&self, record: &CapabilityRecord) -> u64 {
        record.timeout_ms.unwrap_or(self.settings.default_timeout_ms)
    }

    /// Records provenance, sends the event and counts; returns the answer.
    fn finish(&mut self, facts: CallFacts<'_>, result: CallResult) -> CallResult {
        let ran = facts.record.is_some() && !facts.replayed;
        let finished = pipeline::finish(facts, result);
        if let Err(err) = self.store.append_provenance(&finished.provenance) {
            tracing::warn!(%err, slug = %finished.event.slug, "failed to record provenance");
        }
        for sink in &self.sinks {
            sink(&finished.event);
        }
        let code = finished.event.error_code.clone();
        match (&code, finished.event.replayed) {
            (_, true) => self.stats.replayed += 1,
            (None, false) => self.stats.executed += 1,
            (Some(code), false)
                if ran && (code == "execution_error" || code == "invalid_binding" || code == "target_refused") =>
            {
                self.stats.failed += 1
            }
            (Some(_), false) => self.stats.refused += 1,
        }
        metrics::counter!("capdex_dispatch_total", "code" => code.unwrap_or_else(|| "success".into())).increment(1);
        finished.result
    }

    fn answer_now(
        &mut self,
        call: &DispatchCall,
        key: Option<&ExecutionKey>,
        result: CallResult,
        replayed: bool,
        started: Instant,
    ) -> CallResult {
        let record = self.pipeline.record(&call.slug).cloned();
        self.finish(
            CallFacts {
                call,
                record: record.as_deref(),
                execution_key: key,
                approval_id: None,
                secrets: &[],
                replayed,
                latency_us: started.elapsed().as_micros() as u64,
                at_ms: wall_ms(),
            },
            result,
        )
    }

    fn exec_request(call: &DispatchCall, binding: Option<&Binding>) -> ExecRequest {
        ExecRequest {
            slug: call.slug.clone(),
            arguments: call.arguments.clone(),
            agent_id: call.agent_id.clone(),
            execution_id: call.execution_id.clone(),
            step_id: call.step_id.clone(),
            turn: call.turn,
            custom_config: binding.map_or(Value::Null, |b| b.custom_config.clone()),
        }
    }
}

/// What to run for an admitted call.
enum Work {
    /// Already decided (in-process handler ran, or a binding was refused).
    Done(CallResult),
    Transport {
        transport: Arc<dyn ExecTransport + Send + Sync>,
        slug: String,
        payload: Vec<u8>,
        timeout_ms: u64,
    },
    Http {
        target: pipeline::HttpTarget,
        body: Value,
        webhook: bool,
        allowlist: Vec<ssrf::Cidr>,
        timeout_ms: u64,
    },
}

async fn run_work(work: Work) -> CallResult {
    match work {
        Work::Done(result) => result,
        Work::Transport { transport, slug, payload, timeout_ms } => {
            let request = transport.request(&slug, payload, timeout_ms);
            match actix_rt::time::timeout(Duration::from_millis(timeout_ms), request).await {
                Err(_) => CallResult::fail(ErrorCode::ExecutionError, ExecFailure::TimedOut(timeout_ms).to_string()),
                Ok(Err(failure)) => CallResult::fail(ErrorCode::ExecutionError, failure.to_string()),
                Ok(Ok(bytes)) => CallResult::from_handler_reply(&bytes)
                    .unwrap_or_else(|problem| CallResult::fail(ErrorCode::ExecutionError, problem)),
            }
        }
        Work::Http { target, body, webhook, allowlist, timeout_ms } => {
            let timeout = Duration::from_millis(timeout_ms);
            match actix_rt::time::timeout(timeout, http_call(target, body, webhook, allowlist, timeout)).await {
                Ok(result) => result,
                Err(_) => CallResult::fail(ErrorCode::ExecutionError, format!("no answer within {timeout_ms} ms")),
            }
        }
    }
}

/// The largest HTTP response body read, in bytes.
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// One `api` or `webhook` call: resolve, check every address, then connect
/// only to the checked addresses (no redirects), so DNS cannot change the target.
async fn http_call(
    target: pipeline::HttpTarget,
    body: Value,
    webhook: bool,
    allowlist: Vec<ssrf::Cidr>,
    timeout: Duration,
) -> CallResult {
    let invalid = |message: &str| CallResult::fail(ErrorCode::InvalidBinding, message.to_string());
    let Ok(url) = reqwest::Url::parse(&target.url) else {
        return invalid("the target URL is not a valid URL");
    };
    if !matches!(url.scheme(), "http" | "https") {
        return invalid("the target URL must be http or https");
    }
    let (Some(host), Some(port)) = (url.host_str().map(str::to_string), url.port_or_known_default()) else {
        return invalid("the target URL has no host");
    };
    let lookup_host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let addrs: Vec<std::net::SocketAddr> = match tokio::net::lookup_host((lookup_host.as_str(), port)).await {
        Ok(addrs) => addrs.collect(),
        Err(err) => {
            return CallResult::fail(ErrorCode::ExecutionError, format!("cannot resolve the target host: {err}"))
        }
    };
    let ips: Vec<std::net::IpAddr> = addrs.iter().map(|a| a.ip()).collect();
    if let Err(refusal) = ssrf::check_addresses(&ips, &allowlist) {
        return CallResult::fail(ErrorCode::TargetRefused, refusal.to_string());
    }
    let client = match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .resolve_to_addrs(&lookup_host, &addrs)
        .build()
    {
        Ok(client) => client,
        Err(err) => return CallResult::fail(ErrorCode::ExecutionError, format!("cannot build the HTTP client: {err}")),
    };
    let mut request = client.post(url).json(&body);
    for (name, value) in &target.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    if webhook {
        actix_rt::spawn(async move {
            match request.send().await {
                Ok(response) if !response.status().is_success() => {
                    tracing::warn!(status = %response.status(), "a webhook answered with an error status")
                }
                Ok(_) => {}
                Err(err) => tracing::warn!(err = %err.without_url(), "a webhook POST failed"),
            }
        });
        return CallResult::ok(json!({"accepted": true}));
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => {
            return CallResult::fail(ErrorCode::ExecutionError, format!("the request failed: {}", err.without_url()))
        }
    };
    let status = response.status();
    let bytes = match read_limited(response).await {
        Ok(bytes) => bytes,
        Err(problem) => return CallResult::fail(ErrorCode::ExecutionError, problem),
    };
    let data = serde_json::from_slice::<Value>(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    if !status.is_success() {
        return CallResult::fail(ErrorCode::ExecutionError, format!("the endpoint answered HTTP {}", status.as_u16()));
    }
    CallResult::ok(data)
}

async fn read_limited(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    while let Some(chunk) =
        response.chunk().await.map_err(|err| format!("reading the response failed: {}", err.without_url()))?
    {
        if bytes.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(format!("the response is larger than {MAX_RESPONSE_BYTES} bytes"));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

impl Actor for Dispatcher {
    type Context = Context<Self>;
}

impl Handler<Dispatch> for Dispatcher {
    type Result = ResponseActFuture<Self, CallResult>;

    fn handle(&mut self, msg: Dispatch, _: &mut Context<Self>) -> Self::Result {
        let started = Instant::now();
        let mut call = msg.call;
        let key = match call.check() {
            Ok(key) => key,
            Err(result) => return Box::pin(fut::ready(self.answer_now(&call, None, *result, false, started))),
        };
        // The re-drive cache wraps the pipeline, as in the design: a stored result is returned first.
        let cached_key = key.filter(|_| self.pipeline.record(&call.slug).is_some_and(|r| !r.is_idempotent));
        let mut claimed: Option<(ExecutionKey, Vec<u8>)> = None;
        if let Some(key) = cached_key {
            let storage = key.storage_key();
            if let Some(waiters) = self.inflight.get_mut(&storage) {
                let (tx, rx) = futures::channel::oneshot::channel();
                waiters.push(tx);
                return Box::pin(rx.into_actor(self).map(move |first, act, _| {
                    let result = first.unwrap_or_else(|_| {
                        CallResult::fail(ErrorCode::ExecutionError, "the first call of this step was abandoned")
                    });
                    act.answer_now(&call, Some(&key), result, true, started)
                }));
            }
            let digest = approval::args_digest(&call.arguments);
            let entry = CacheEntry {
                slug: call.slug.clone(),
                agent_id: call.agent_id.clone(),
                args_digest: digest.clone(),
                owner: self.boot_id.clone(),
                started_at_ms: wall_ms(),
                result: None,
            };
            match self.store.claim_execution(&storage, &entry) {
                Err(err) => {
                    let result =
                        CallResult::fail(ErrorCode::ExecutionError, format!("the re-drive cache failed: {err}"));
                    return Box::pin(fut::ready(self.answer_now(&call, Some(&key), result, false, started)));
                }
                Ok(Claim::Existing(found)) => {
                    let found = *found;
                    let result = if found.slug != call.slug
                        || found.agent_id != call.agent_id
                        || found.args_digest != digest
                    {
                        CallResult::fail(
                            ErrorCode::InvalidRequest,
                            format!(
                                "step {key} already belongs to another call (capability, agent or arguments differ)"
                            ),
                        )
                    } else if let Some(stored) = found.result {
                        stored
                    } else {
                        CallResult::fail(
                            ErrorCode::ExecutionError,
                            format!("an earlier attempt of step {key} was interrupted; its outcome is unknown, so it is not run again"),
                        )
                    };
                    return Box::pin(fut::ready(self.answer_now(&call, Some(&key), result, true, started)));
                }
                Ok(Claim::Claimed) => {
                    self.inflight.insert(storage.clone(), Vec::new());
                    claimed = Some((key, storage));
                }
            }
        }
        let approval = match &call.approval_id {
            Some(id) => match self.store.approval(id) {
                Ok(found) => found,
                Err(err) => {
                    tracing::warn!(%err, "failed to read an approval");
                    None
                }
            },
            None => None,
        };
        let admission = self.pipeline.admit(&call, approval.as_ref(), self.mono_ms(), wall_ms());
        let mut secrets = Vec::new();
        let mut approval_used = None;
        let mut durable_first = claimed.is_some();
        let (record, work) = match admission {
            Admission::Refused(result) => (self.pipeline.record(&call.slug).cloned(), Work::Done(result)),
            Admission::NeedsApproval(record) => {
                let ttl = record.approval_timeout_ms.unwrap_or(self.settings.approval_ttl_ms);
                let approval = approval::pending(
                    approval::approval_id(&unpredictable_seed()),
                    &call.slug,
                    &call.agent_id,
                    &call.arguments,
                    record.policy_version,
                    wall_ms(),
                    ttl,
                );
                let result = match self.store.put_approval(&approval) {
                    Ok(()) => {
                        self.stats.approvals_requested += 1;
                        durable_first = true;
                        pipeline::requires_approval(&approval, &format!("approval.{}.approve", approval.id))
                    }
                    Err(err) => {
                        CallResult::fail(ErrorCode::ExecutionError, format!("failed to store the approval: {err}"))
                    }
                };
                (Some(record), Work::Done(result))
            }
            Admission::Run(admitted) => {
                if let Some(id) = &admitted.approval_id {
                    if let Some(mut used) = approval.clone() {
                        used.status = ApprovalStatus::Used;
                        if let Err(err) = self.store.put_approval(&used) {
                            let result = CallResult::fail(
                                ErrorCode::ExecutionError,
                                format!("failed to use the approval: {err}"),
                            );
                            return Box::pin(fut::ready(self.answer_now(
                                &call,
                                claimed.as_ref().map(|c| &c.0),
                                result,
                                false,
                                started,
                            )));
                        }
                        durable_first = true;
                        approval_used = Some(id.clone());
                    }
                }
                let record = admitted.record.clone();
                let work = match record.execution_type {
                    ExecutionType::Internal => match self.handlers.get(&record.handler) {
                        Some(handler) => {
                            let request = Self::exec_request(&call, admitted.binding.as_ref());
                            let handler = handler.clone();
                            // Our own code, but a panic must still not take the actor down.
                            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&request)));
                            Work::Done(ran.unwrap_or_else(|_| {
                                CallResult::fail(ErrorCode::ExecutionError, "the in-process handler panicked")
                            }))
                        }
                        None => match &self.transport {
                            Some(transport) => {
                                match serde_json::to_vec(&Self::exec_request(&call, admitted.binding.as_ref())) {
                                    Ok(payload) => Work::Transport {
                                        transport: transport.clone(),
                                        slug: record.slug.clone(),
                                        payload,
                                        timeout_ms: self.timeout_ms(&record),
                                    },
                                    Err(err) => {
                                        Work::Done(CallResult::fail(ErrorCode::ExecutionError, err.to_string()))
                                    }
                                }
                            }
                            None => Work::Done(CallResult::fail(
                                ErrorCode::ExecutionError,
                                format!("no transport to handler services; {} cannot run here", record.slug),
                            )),
                        },
                    },
                    ExecutionType::Api | ExecutionType::Webhook => {
                        let env = self.env.clone();
                        match pipeline::http_target(&record, admitted.binding.as_ref(), &|name| env(name)) {
                            Ok(target) => {
                                secrets = target.secrets.clone();
                                Work::Http {
                                    target,
                                    body: call.arguments.clone(),
                                    webhook: record.execution_type == ExecutionType::Webhook,
                                    allowlist: self.settings.ssrf_allowlist.clone(),
                                    timeout_ms: self.timeout_ms(&record),
                                }
                            }
                            Err(result) => Work::Done(*result),
                        }
                    }
                };
                (Some(record), work)
            }
        };
        // Fast path: nothing to wait for.
        if !durable_first {
            if let Work::Done(result) = work {
                let at_ms = wall_ms();
                let facts = CallFacts {
                    call: &call,
                    record: record.as_deref(),
                    execution_key: None,
                    approval_id: None,
                    secrets: &[],
                    replayed: false,
                    latency_us: started.elapsed().as_micros() as u64,
                    at_ms,
                };
                return Box::pin(fut::ready(self.finish(facts, result)));
            }
        }
        let store = self.store.clone();
        let crash_after_exec = self.crash_after_exec;
        let claim = claimed.clone();
        let boot_id = self.boot_id.clone();
        let digest = claim.as_ref().map(|_| approval::args_digest(&call.arguments));
        let (slug, agent_id) = (call.slug.clone(), call.agent_id.clone());
        let run = async move {
            if durable_first {
                // The claim and a used approval are durable before the handler runs.
                if let Err(err) = store.durable().await {
                    if let Some((_, storage)) = &claim {
                        let _ = store.release_execution(storage);
                    }
                    return CallResult::fail(ErrorCode::ExecutionError, format!("the store is not durable: {err}"));
                }
            }
            let result = run_work(work).await;
            if let Some((_, storage)) = &claim {
                if result.success {
                    let entry = CacheEntry {
                        slug,
                        agent_id,
                        args_digest: digest.unwrap_or_default(),
                        owner: boot_id,
                        started_at_ms: wall_ms(),
                        result: Some(result.clone()),
                    };
                    let stored = match store.complete_execution(storage, &entry) {
                        Ok(()) => store.durable().await,
                        Err(err) => Err(err),
                    };
                    if let Err(err) = stored {
                        tracing::warn!(%err, "failed to store a result in the re-drive cache");
                    } else if crash_after_exec {
                        tracing::error!("CAPDEX_TEST_CRASH_AFTER_EXEC=1: aborting after storing the result");
                        std::process::abort();
                    }
                } else if let Err(err) = store.release_execution(storage) {
                    tracing::warn!(%err, "failed to release a re-drive key");
                }
            }
            result
        };
        Box::pin(run.into_actor(self).map(move |result, act, _| {
            let key = claimed.as_ref().map(|c| &c.0);
            if let Some((_, storage)) = &claimed {
                for waiter in act.inflight.remove(storage).unwrap_or_default() {
                    let _ = waiter.send(result.clone());
                }
            }
            let facts = CallFacts {
                call: &call,
                record: record.as_deref(),
                execution_key: key,
                approval_id: approval_used.as_deref(),
                secrets: &secrets,
                replayed: false,
                latency_us: started.elapsed().as_micros() as u64,
                at_ms: wall_ms(),
            };
            act.finish(facts, result)
        }))
    }
}

impl Handler<SetTransport> for Dispatcher {
    type Result = ();

    fn handle(&mut self, msg: SetTransport, _: &mut Context<Self>) {
        self.transport = Some(msg.0);
    }
}

impl Handler<AddEventSink> for Dispatcher {
    type Result = ();

    fn handle(&mut self, msg: AddEventSink, _: &mut Context<Self>) {
        self.sinks.push(msg.0);
    }
}

impl Handler<RegisterCapability> for Dispatcher {
    type Result = Result<CapabilityRecord, AdminError>;

    fn handle(&mut self, msg: RegisterCapability, _: &mut Context<Self>) -> Self::Result {
        let mut record = msg.record;
        if builtin_records().iter().any(|b| b.slug == record.slug) {
            return Err(AdminError::new(409, "builtin", format!("{} is a built-in capability", record.slug)));
        }
        registry::validate_record(&record).map_err(|err| AdminError::new(400, err.code(), err.to_string()))?;
        let existing = self.store.capability_record(&record.slug)?;
        record.policy_version = match (&existing, msg.update) {
            (Some(_), false) => {
                return Err(AdminError::new(
                    409,
                    "already_registered",
                    format!("{} is registered; update it", record.slug),
                ))
            }
            (None, true) => {
                return Err(AdminError::new(
                    404,
                    "unknown_capability",
                    format!("no capability {} is registered", record.slug),
                ))
            }
            (None, false) => 1,
            (Some(old), true) => old.policy_version + 1,
        };
        self.store.put_capability_record(&record)?;
        self.store.flush()?;
        // A registry reload: rate windows stay.
        self.pipeline.load_registry(Self::registry_of(&self.store)?);
        Ok(record)
    }
}

impl Handler<ListCapabilities> for Dispatcher {
    type Result = MessageResult<ListCapabilities>;

    fn handle(&mut self, _: ListCapabilities, _: &mut Context<Self>) -> Self::Result {
        let mut records: Vec<CapabilityRecord> = builtin_records();
        records.extend(self.store.capability_records().unwrap_or_default());
        MessageResult(records)
    }
}

impl Handler<ReloadRegistry> for Dispatcher {
    type Result = Result<usize, AdminError>;

    fn handle(&mut self, _: ReloadRegistry, _: &mut Context<Self>) -> Self::Result {
        let records = Self::registry_of(&self.store)?;
        let count = records.len();
        self.pipeline.load_registry(records);
        self.pipeline.load_bindings(self.store.bindings()?);
        Ok(count)
    }
}

impl Handler<SetBinding> for Dispatcher {
    type Result = Result<Vec<String>, AdminError>;

    fn handle(&mut self, msg: SetBinding, _: &mut Context<Self>) -> Self::Result {
        let binding = msg.0;
        let env = self.env.clone();
        let missing = registry::validate_binding(&binding, &|name| env(name))
            .map_err(|err| AdminError::new(400, "invalid_binding", err.to_string()))?;
        if self.pipeline.record(&binding.slug).is_none() {
            return Err(AdminError::new(
                404,
                "unknown_capability",
                format!("no capability {} is registered", binding.slug),
            ));
        }
        self.store.put_binding(&binding)?;
        self.store.flush()?;
        self.pipeline.set_binding(binding);
        Ok(missing)
    }
}

impl Handler<ListBindings> for Dispatcher {
    type Result = Result<Vec<Binding>, AdminError>;

    fn handle(&mut self, msg: ListBindings, _: &mut Context<Self>) -> Self::Result {
        let mut bindings = self.store.bindings()?;
        if let Some(agent) = &msg.agent_id {
            bindings.retain(|b| &b.agent_id == agent);
        }
        Ok(bindings)
    }
}

impl Handler<DecideApproval> for Dispatcher {
    type Result = ResponseFuture<Result<Approval, AdminError>>;

    fn handle(&mut self, msg: DecideApproval, _: &mut Context<Self>) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move {
            let mut found = store
                .approval(&msg.id)?
                .ok_or_else(|| AdminError::new(404, "unknown_approval", format!("approval {} is unknown", msg.id)))?;
            approval::decide(&mut found, msg.approve, wall_ms())
                .map_err(|problem| AdminError::new(409, "approval_invalid", problem.to_string()))?;
            store.put_approval(&found)?;
            store.durable().await?;
            Ok(found)
        })
    }
}

impl Handler<ListApprovals> for Dispatcher {
    type Result = Result<Vec<Approval>, AdminError>;

    fn handle(&mut self, msg: ListApprovals, _: &mut Context<Self>) -> Self::Result {
        let now = wall_ms();
        let mut approvals = self.store.approvals()?;
        if msg.pending_only {
            approvals.retain(|a| a.status == ApprovalStatus::Pending && now < a.expires_at_ms);
        }
        Ok(approvals)
    }
}

impl Handler<ListProvenance> for Dispatcher {
    type Result = Result<Vec<ProvenanceRecord>, AdminError>;

    fn handle(&mut self, msg: ListProvenance, _: &mut Context<Self>) -> Self::Result {
        Ok(self.store.provenance(msg.limit)?)
    }
}

impl Handler<Observe<DispatcherStats>> for Dispatcher {
    type Result = MessageResult<Observe<DispatcherStats>>;

    fn handle(&mut self, _: Observe<DispatcherStats>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}
