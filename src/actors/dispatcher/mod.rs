//! Dispatcher: runs capability calls through `core::dispatch` and performs
//! what the core decides. A call's re-drive key is judged by
//! `core::dispatch::redrive`, the pipeline admits or refuses it
//! (`core::dispatch::pipeline`), and `core::dispatch::plan` says what to do:
//! answer, store a new approval, or mark the call's approval used and run it
//! in-process (built-ins, or handlers given with [`Dispatcher::with_handler`]),
//! through an [`ExecTransport`] (NATS `<prefix>.exec.<slug>`), as HTTP
//! (`api`, `webhook`: see `http.rs`), or through the live sources' sessions
//! ([`SourceCalls`], set with [`SetSourceCalls`]) for the records of sources
//! ([`SetSourceRecords`], kept in memory beside the stored registry). The
//! administration is in `admin.rs`.
//!
//! One record answers to its slug, its discovery id (`tool:<slug>`) and, for
//! a source's, its capability id or function name; the call is named by the
//! record's slug from then on. The registry's discoverable records are synced
//! into the Indexer (origin `dispatch`) on [`SetCatalog`] and after every
//! register, update and reload.
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

mod admin;
mod http;
#[cfg(test)]
mod tests;

pub use admin::{
    AdminError, DecideApproval, ListApprovals, ListBindings, ListCapabilities, ListProvenance, RegisterCapability,
    ReloadRegistry, SetBinding,
};

use crate::actors::indexer::SyncCapabilities;
use crate::actors::Inspect;
use crate::config::DispatchSettings;
use crate::core::catalog::DISPATCH_ORIGIN;
use crate::core::dispatch::approval::{self, Approval};
use crate::core::dispatch::figures::{CallSeen, Counted, DispatchFigures};
use crate::core::dispatch::pipeline::{
    self, AdmissionDecision, CallFacts, DispatchCall, ExecutionKey, Pipeline, RateGate, Tally,
};
use crate::core::dispatch::plan::{self, Executor, Plan, PlanFacts, Runners};
use crate::core::dispatch::rate_limit::RateRefusal;
use crate::core::dispatch::redrive::Claim;
use crate::core::dispatch::redrive::{self, CacheEntry, Completion, InFlight, KeyState, Verdict};
use crate::core::dispatch::registry::{CapabilityRecord, ExecutionType, FunctionDefinition};
use crate::core::dispatch::shared::{self, RegistryChange, Settled, SharedDispatch, SharedError, Versioned};
use crate::core::dispatch::ssrf;
use crate::core::dispatch::{CallResult, DispatchEvent, ErrorCode, ExecFailure, ExecRequest, ExecTransport};
use crate::core::dispatch_rules::Builtin;
use crate::core::sources::{SourceCall, SourceCalls};
use crate::store::{Store, StoreError};
use actix::prelude::*;
use futures::channel::oneshot;
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

/// Sets what runs source capabilities (the live sources' sessions).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetSourceCalls(pub Arc<dyn SourceCalls + Send + Sync>);

/// Replaces the records of one source in the pipeline's registry (in memory;
/// not the stored registry of `capability.register`); no records withdraws them.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct SetSourceRecords {
    pub source_id: String,
    pub records: Vec<CapabilityRecord>,
}

/// Withdraws every record of one source.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct RemoveSourceRecords {
    pub source_id: String,
}

/// The state several nodes share (JetStream key-value buckets): from now on
/// re-drive claims, approvals, rate windows and registry changes go through it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetShared(pub Arc<dyn SharedDispatch + Send + Sync>);

/// A registry change another node published: applied to this node's store and pipeline.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ApplyRegistryChange(pub RegistryChange);

/// An approval as the cluster holds it: kept in this node's store, so it is listed here.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ApplyApproval(pub Approval);

/// Sets the catalog the discoverable registry is synced into (origin
/// `dispatch`), and syncs it; answers once the Indexer has applied it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetCatalog(pub Recipient<SyncCapabilities>);

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
            parameters: echo.full_schema.map(|schema| schema.value()).unwrap_or_else(|| json!({"type": "object"})),
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
        hidden: false,
        invocation: None,
    }]
}

pub struct Dispatcher {
    store: Store,
    settings: DispatchSettings,
    pipeline: Pipeline,
    handlers: HashMap<String, InProcessHandler>,
    transport: Option<Arc<dyn ExecTransport + Send + Sync>>,
    source_calls: Option<Arc<dyn SourceCalls + Send + Sync>>,
    /// The cluster's shared state; `None` on one node alone.
    shared: Option<Arc<dyn SharedDispatch + Send + Sync>>,
    /// Where the discoverable registry is synced (origin `dispatch`).
    catalog: Option<Recipient<SyncCapabilities>>,
    sinks: Vec<EventSink>,
    env: EnvLookup,
    /// Keys claimed by calls running now, with their concurrent duplicates.
    in_flight: InFlight<oneshot::Sender<CallResult>>,
    boot_id: String,
    epoch: Instant,
    crash_after_exec: bool,
    stats: DispatcherStats,
    /// Calls, errors and latencies per capability since the node started.
    figures: DispatchFigures,
}

pub(super) fn wall_ms() -> u64 {
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
            source_calls: None,
            shared: None,
            catalog: None,
            sinks: Vec::new(),
            env: Arc::new(|name: &str| std::env::var(name).ok()),
            in_flight: InFlight::default(),
            boot_id: approval::approval_id(&unpredictable_seed()),
            epoch: Instant::now(),
            crash_after_exec: std::env::var("CAPDEX_TEST_CRASH_AFTER_EXEC").is_ok_and(|v| v == "1"),
            stats: DispatcherStats::default(),
            figures: DispatchFigures::default(),
        })
    }

    /// Keeps the figures of at most `max_capabilities` capabilities
    /// (`[retention] dispatch_figures_max_count`; see `DispatchFigures`).
    pub fn with_figures_capacity(mut self, max_capabilities: usize) -> Dispatcher {
        self.figures = DispatchFigures::new(max_capabilities);
        self
    }

    pub(super) fn registry_of(store: &Store) -> Result<Vec<CapabilityRecord>, StoreError> {
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

    pub fn with_source_calls(mut self, calls: Arc<dyn SourceCalls + Send + Sync>) -> Dispatcher {
        self.source_calls = Some(calls);
        self
    }

    fn mono_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Syncs the discoverable stored records into the catalog (origin
    /// `dispatch`, replace mode); resolves once the Indexer has applied it.
    pub(super) fn sync_catalog(&self) -> futures::future::BoxFuture<'static, ()> {
        let Some(catalog) = self.catalog.clone() else { return Box::pin(async {}) };
        let builtins: Vec<String> = builtin_records().into_iter().map(|record| record.slug).collect();
        let descriptors = match self.store.capability_records() {
            Ok(records) => records
                .iter()
                .filter(|record| record.is_discoverable() && !builtins.contains(&record.slug))
                .map(CapabilityRecord::descriptor)
                .collect(),
            Err(err) => {
                tracing::warn!(%err, "cannot read the registry to offer it to discovery");
                return Box::pin(async {});
            }
        };
        let sync = catalog.send(SyncCapabilities::replace(DISPATCH_ORIGIN, descriptors));
        Box::pin(async move {
            match sync.await {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => tracing::warn!(%err, "the registry was not offered to discovery"),
                Err(err) => tracing::warn!(%err, "the indexer stopped"),
            }
        })
    }
}

/// A re-drive key this call claimed.
struct Claimed {
    key: ExecutionKey,
    storage: Vec<u8>,
    /// The in-progress entry it was claimed with.
    entry: CacheEntry,
}

/// What runs for a call, once the plan's store writes are done.
enum Job {
    /// Already decided (a refusal, an approval request, a binding that cannot run).
    Done(CallResult),
    InProcess(InProcessHandler, ExecRequest),
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
    Source(Arc<dyn SourceCalls + Send + Sync>, SourceCall),
}

/// A performed plan: the job and what its answer records.
struct Work {
    job: Job,
    /// A new or used approval must be durable before the job runs.
    durable_first: bool,
    approval_used: Option<String>,
    /// Resolved `${env:VAR}` values, scrubbed from everything recorded.
    secrets: Vec<String>,
    /// An approval to write to the shared state before the job runs: a new
    /// one (create-only, no revision) or a used one (expecting the revision it
    /// was read at, so only one node can use it).
    shared_approval: Option<(Approval, Option<u64>)>,
}

/// What a call learnt from the shared state before its admission.
#[derive(Default)]
struct Prelude {
    /// Its re-drive key's state in the cluster, and the entry it claimed it with.
    key: Option<(KeyState, CacheEntry)>,
    /// The approval it names, with its revision.
    approval: Option<Result<Option<Versioned<Approval>>, SharedError>>,
    /// The shared rate window's decision.
    rate: Option<Result<Result<(), RateRefusal>, SharedError>>,
}

/// How many more times (a second apart) a result is written to the cluster after its write failed.
const COMPLETE_RETRIES: usize = 60;

/// Where a claimed re-drive key is settled: this node's store, or the cluster's shared state.
#[derive(Clone)]
enum Keys {
    Local(Store),
    Shared(Arc<dyn SharedDispatch + Send + Sync>),
}

impl Keys {
    async fn complete(&self, storage: &[u8], done: &CacheEntry) -> Result<(), String> {
        match self {
            Keys::Local(store) => match store.complete_execution(storage, done) {
                Ok(()) => store.durable().await.map_err(|err| err.to_string()),
                Err(err) => Err(err.to_string()),
            },
            Keys::Shared(shared) => match shared.complete(storage, done).await {
                Ok(()) => Ok(()),
                Err(err) => {
                    // The handler ran: its result must reach the cluster, or every
                    // duplicate waits and is answered "outcome unknown". Keep trying
                    // in the background; the call itself is answered now.
                    let (shared, storage, done) = (shared.clone(), storage.to_vec(), done.clone());
                    actix_rt::spawn(async move {
                        for _ in 0..COMPLETE_RETRIES {
                            actix_rt::time::sleep(Duration::from_secs(1)).await;
                            if shared.complete(&storage, &done).await.is_ok() {
                                return;
                            }
                        }
                        tracing::error!("a stored result never reached the cluster; its duplicates will be refused");
                    });
                    Err(err.to_string())
                }
            },
        }
    }

    async fn release(&self, storage: &[u8]) -> Result<(), String> {
        match self {
            Keys::Local(store) => store.release_execution(storage).map_err(|err| err.to_string()),
            Keys::Shared(shared) => shared.release(storage).await.map_err(|err| err.to_string()),
        }
    }
}

/// What a run's answer records besides the call, fixed before it runs.
struct Trail {
    /// The capability as admitted (a reload while it runs does not change its redaction).
    record: Option<Arc<CapabilityRecord>>,
    approval_used: Option<String>,
    secrets: Vec<String>,
}

impl Work {
    fn of(job: Job) -> Work {
        Work { job, durable_first: false, approval_used: None, secrets: Vec::new(), shared_approval: None }
    }

    fn done(result: CallResult) -> Work {
        Work::of(Job::Done(result))
    }
}

impl Job {
    /// Runs a job that needs no waiting now; gives back any other.
    fn run_now(self) -> Result<CallResult, Box<Job>> {
        match self {
            Job::Done(result) => Ok(result),
            Job::InProcess(handler, request) => Ok(run_in_process(&handler, &request)),
            other => Err(Box::new(other)),
        }
    }

    async fn run(self) -> CallResult {
        match self {
            Job::Done(result) => result,
            Job::InProcess(handler, request) => run_in_process(&handler, &request),
            Job::Transport { transport, slug, payload, timeout_ms } => {
                let request = transport.request(&slug, payload, timeout_ms);
                match actix_rt::time::timeout(Duration::from_millis(timeout_ms), request).await {
                    Err(_) => {
                        CallResult::fail(ErrorCode::ExecutionError, ExecFailure::TimedOut(timeout_ms).to_string())
                    }
                    Ok(Err(failure)) => CallResult::fail(ErrorCode::ExecutionError, failure.to_string()),
                    Ok(Ok(bytes)) => CallResult::from_handler_reply(&bytes)
                        .unwrap_or_else(|problem| CallResult::fail(ErrorCode::ExecutionError, problem)),
                }
            }
            Job::Http { target, body, webhook, allowlist, timeout_ms } => {
                http::call(target, body, webhook, allowlist, timeout_ms).await
            }
            Job::Source(calls, call) => {
                let (timeout_ms, source_id) = (call.timeout_ms, call.source_id.clone());
                match actix_rt::time::timeout(Duration::from_millis(timeout_ms), calls.call(call)).await {
                    Ok(result) => result,
                    Err(_) => CallResult::fail(
                        ErrorCode::ExecutionError,
                        format!("source {source_id} did not answer within {timeout_ms} ms"),
                    ),
                }
            }
        }
    }
}

fn run_in_process(handler: &InProcessHandler, request: &ExecRequest) -> CallResult {
    // Our own code, but a panic must still not take the actor down.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(request)))
        .unwrap_or_else(|_| CallResult::fail(ErrorCode::ExecutionError, "the in-process handler panicked"))
}

/// Leaves a claimed key's [`Completion`] where it was claimed: a success
/// stored durably (then the test-only crash), a failure released.
async fn settle(keys: &Keys, claimed: &(Vec<u8>, CacheEntry), result: &CallResult, crash_after_exec: bool) {
    let (storage, entry) = claimed;
    match redrive::completion(entry, result) {
        Completion::Store(done) => {
            if let Err(err) = keys.complete(storage, &done).await {
                tracing::warn!(%err, "failed to store a result in the re-drive cache");
            } else if crash_after_exec {
                tracing::error!("CAPDEX_TEST_CRASH_AFTER_EXEC=1: aborting after storing the result");
                std::process::abort();
            }
        }
        Completion::Release => {
            if let Err(err) = keys.release(storage).await {
                tracing::warn!(%err, "failed to release a re-drive key");
            }
        }
    }
}

/// A re-drive key's state in the cluster: claimed by this call, or what holds
/// it. A duplicate running on another node (or not yet settled here) is waited
/// for, until `wait_ms` after that call started; a key freed meanwhile is claimed again.
async fn shared_key_state(
    shared: Arc<dyn SharedDispatch + Send + Sync>,
    storage: Vec<u8>,
    ours: CacheEntry,
    wait_ms: u64,
) -> KeyState {
    const ATTEMPTS: usize = 3;
    for _ in 0..ATTEMPTS {
        let found = match shared.claim(&storage, &ours).await {
            Ok(Claim::Claimed) => return KeyState::Claim(Claim::Claimed),
            Ok(Claim::Existing(found)) => found,
            Err(err) => return KeyState::Unavailable(err.0),
        };
        if found.result.is_some() || !redrive::same_call(&found, &ours) {
            return KeyState::Claim(Claim::Existing(found));
        }
        // Waited for from when its first call started, not from now: a retry
        // after the first call's node died is answered once that call's time is up.
        let remaining = found.started_at_ms.saturating_add(wait_ms).saturating_sub(wall_ms());
        match shared.settle(&storage, remaining).await {
            Ok(Settled::Entry(entry)) | Ok(Settled::StillRunning(entry)) => {
                return KeyState::Claim(Claim::Existing(entry))
            }
            Ok(Settled::Released) => continue,
            Err(err) => return KeyState::Unavailable(err.0),
        }
    }
    KeyState::Unavailable(format!("the step was claimed and freed {ATTEMPTS} times while this call waited"))
}

/// Takes a slot of the shared rate window of (slug, agent), or says when to retry.
async fn shared_rate(
    shared: Arc<dyn SharedDispatch + Send + Sync>,
    slug: String,
    agent: String,
    limit: u32,
    window_ms: u64,
) -> Result<Result<(), RateRefusal>, SharedError> {
    for _ in 0..shared::RATE_ATTEMPTS {
        let (slots, revision) = match shared.rate_window(&slug, &agent).await? {
            Some(window) => (window.value, Some(window.revision)),
            None => (Vec::new(), None),
        };
        match shared::admit_slots(&slots, limit, window_ms, wall_ms()) {
            Err(refusal) => return Ok(Err(refusal)),
            Ok(next) => {
                if shared.put_rate_window(&slug, &agent, &next, revision).await? {
                    return Ok(Ok(()));
                }
            }
        }
    }
    Err(SharedError(format!(
        "the rate window of {slug} for {agent} changed {} times while this call was admitted",
        shared::RATE_ATTEMPTS
    )))
}

impl Dispatcher {
    /// Records provenance, sends the event and counts; returns the answer.
    fn finish(&mut self, facts: CallFacts<'_>, result: CallResult) -> CallResult {
        let known = facts.record.is_some();
        let ran = known && !facts.replayed;
        let finished = pipeline::finish(facts, result);
        if known {
            self.count_figures(&finished.event);
        }
        if let Err(err) = self.store.append_provenance(&finished.provenance) {
            tracing::warn!(%err, slug = %finished.event.slug, "failed to record provenance");
        }
        for sink in &self.sinks {
            sink(&finished.event);
        }
        match Tally::of(&finished.event, ran) {
            Tally::Executed => self.stats.executed += 1,
            Tally::Replayed => self.stats.replayed += 1,
            Tally::Refused => self.stats.refused += 1,
            Tally::Failed => self.stats.failed += 1,
        }
        let code = finished.event.error_code.unwrap_or_else(|| "success".into());
        metrics::counter!("capdex_dispatch_total", "code" => code).increment(1);
        finished.result
    }

    /// Counts a call of a known capability in its figures (a call naming no
    /// record is not counted: anyone can name anything). When the table is
    /// full, the capabilities the registry no longer holds make room first.
    fn count_figures(&mut self, event: &DispatchEvent) {
        let seen = CallSeen { error: !event.success, completed: event.handler_ran, latency_us: event.latency_us };
        if self.figures.record(&event.capability_id, seen) == Counted::Full {
            let pipeline = &self.pipeline;
            self.figures.retain(|id| pipeline.resolve(id).is_some());
            if self.figures.record(&event.capability_id, seen) == Counted::Full {
                self.figures.count_untracked();
                metrics::counter!("capdex_dispatch_figures_untracked_total").increment(1);
            }
        }
    }

    /// Answers a call that ran nothing (or waited), now.
    fn answer_now(
        &mut self,
        call: &DispatchCall,
        key: Option<&ExecutionKey>,
        result: CallResult,
        replayed: bool,
        started: Instant,
    ) -> CallResult {
        let record = self.pipeline.record(&call.slug).cloned();
        let facts = CallFacts {
            call,
            record: record.as_deref(),
            execution_key: key,
            approval_id: None,
            secrets: &[],
            replayed,
            latency_us: started.elapsed().as_micros() as u64,
            at_ms: wall_ms(),
        };
        self.finish(facts, result)
    }

    fn answer(
        &mut self,
        call: &DispatchCall,
        key: Option<&ExecutionKey>,
        result: CallResult,
        replayed: bool,
        started: Instant,
    ) -> ResponseActFuture<Self, CallResult> {
        Box::pin(fut::ready(self.answer_now(call, key, result, replayed, started)))
    }

    /// What the re-drive core needs to know of `storage`: running here, else what the store's claim found.
    fn key_state(&self, storage: &[u8], entry: &CacheEntry) -> KeyState {
        if self.in_flight.contains(storage) {
            return KeyState::InFlight;
        }
        match self.store.claim_execution(storage, entry) {
            Ok(claim) => KeyState::Claim(claim),
            // Nothing was written: the caller may retry once space is freed.
            Err(err @ crate::store::StoreError::Full { .. }) => KeyState::Unavailable(err.to_string()),
            Err(err) => KeyState::Unreadable(err.to_string()),
        }
    }

    /// Answers a concurrent duplicate with the result of the first call of its key.
    fn wait_for_first(
        &mut self,
        call: DispatchCall,
        key: ExecutionKey,
        storage: &[u8],
        started: Instant,
    ) -> ResponseActFuture<Self, CallResult> {
        let (waiter, first) = oneshot::channel();
        // A refused waiter is dropped, so `first` answers `abandoned`.
        let _ = self.in_flight.join(storage, waiter);
        Box::pin(first.into_actor(self).map(move |first, act, _| {
            let result = first.unwrap_or_else(|_| redrive::abandoned());
            act.answer_now(&call, Some(&key), result, true, started)
        }))
    }

    /// The approval the call names, as stored (a read failure counts as none, which the pipeline refuses).
    fn stored_approval(&self, call: &DispatchCall) -> Option<Approval> {
        let id = call.approval_id.as_ref()?;
        self.store.approval(id).unwrap_or_else(|err| {
            tracing::warn!(%err, "failed to read an approval");
            None
        })
    }

    fn plan(&self, decision: AdmissionDecision, call: &DispatchCall, stored_approval: Option<&Approval>) -> Plan {
        let handlers = &self.handlers;
        let env = &self.env;
        let facts = PlanFacts {
            call,
            stored_approval,
            now_ms: wall_ms(),
            default_approval_ttl_ms: self.settings.approval_ttl_ms,
            runners: Runners {
                has_handler: &|name| handlers.contains_key(name),
                has_transport: self.transport.is_some(),
                env: &|name| env(name),
                env_allow: &self.settings.env_allow,
                default_timeout_ms: self.settings.default_timeout_ms,
            },
        };
        plan::plan(decision, &facts, || approval::approval_id(&unpredictable_seed()))
    }

    /// Does the plan's store writes; returns what is left to run. With shared
    /// state, a new or used approval is also written there before the job runs
    /// (a used one expecting `approval_revision`, the revision it was read at).
    fn perform(&mut self, plan: Plan, approval_revision: Option<u64>) -> Work {
        let shared = self.shared.is_some();
        match plan {
            Plan::Answer(result) => Work::done(result),
            Plan::RequestApproval(approval) => match self.store.put_approval(&approval) {
                Ok(()) => {
                    self.stats.approvals_requested += 1;
                    let result = plan::approval_requested(&approval);
                    let shared_approval = shared.then_some((approval, None));
                    Work { durable_first: true, shared_approval, ..Work::done(result) }
                }
                Err(err) => Work::done(CallResult::fail(
                    ErrorCode::ExecutionError,
                    format!("failed to store the approval: {err}"),
                )),
            },
            Plan::Run { consume, executor } => {
                let mut work = self.work_for(*executor);
                if let Some(used) = consume {
                    if let Err(err) = self.store.put_approval(&used) {
                        let message = format!("failed to use the approval: {err}");
                        return Work::done(CallResult::fail(ErrorCode::ExecutionError, message));
                    }
                    work.durable_first = true;
                    work.approval_used = Some(used.id.clone());
                    if shared {
                        work.shared_approval = Some((used, approval_revision));
                    }
                }
                work
            }
        }
    }

    /// The job of an executor, with this dispatcher's handlers, transport and SSRF allowlist.
    fn work_for(&self, executor: Executor) -> Work {
        let unavailable = |message: String| Work::done(CallResult::fail(ErrorCode::ExecutionError, message));
        match executor {
            Executor::InProcess { handler, request } => match self.handlers.get(&handler) {
                Some(run) => Work::of(Job::InProcess(run.clone(), request)),
                None => unavailable(format!("no in-process handler {handler}")),
            },
            Executor::Transport { slug, payload, timeout_ms } => match &self.transport {
                Some(transport) => Work::of(Job::Transport { transport: transport.clone(), slug, payload, timeout_ms }),
                None => unavailable(format!("no transport to handler services; {slug} cannot run here")),
            },
            Executor::Http { target, body, webhook, timeout_ms } => {
                let secrets = target.secrets.clone();
                let allowlist = self.settings.ssrf_allowlist.clone();
                Work { secrets, ..Work::of(Job::Http { target, body, webhook, allowlist, timeout_ms }) }
            }
            Executor::Source(call) => match &self.source_calls {
                Some(calls) => Work::of(Job::Source(calls.clone(), call)),
                None => Work::done(CallResult::fail(
                    ErrorCode::Unavailable,
                    format!(
                        "source {} is not connected: this capdex runs no live sources, so {}#{} cannot be called",
                        call.source_id, call.source_id, call.name
                    ),
                )),
            },
            Executor::Unavailable(result) => Work::done(result),
        }
    }

    /// Runs the work (after the durability barrier when a claim or an approval
    /// was written, and the shared approval write), settles the claimed key,
    /// answers its waiters and the call.
    fn run(
        &mut self,
        call: DispatchCall,
        claimed: Option<Claimed>,
        work: Work,
        started: Instant,
    ) -> ResponseActFuture<Self, CallResult> {
        let keys = match &self.shared {
            Some(shared) => Keys::Shared(shared.clone()),
            None => Keys::Local(self.store.clone()),
        };
        // With shared state the claim and the approval are durable in the
        // cluster; this node's store only caches the approval.
        let local_barrier = (work.durable_first || claimed.is_some()) && self.shared.is_none();
        let Work { job, approval_used, secrets, shared_approval, .. } = work;
        let trail = Trail { record: self.pipeline.record(&call.slug).cloned(), approval_used, secrets };
        // Fast path: nothing to wait for (no claim, no approval written, no I/O to run).
        let job = if local_barrier || claimed.is_some() || shared_approval.is_some() {
            job
        } else {
            match job.run_now() {
                Ok(result) => return Box::pin(fut::ready(self.finish_run(&call, None, &trail, started, result))),
                Err(job) => *job,
            }
        };
        let store = self.store.clone();
        let shared = self.shared.clone();
        let crash_after_exec = self.crash_after_exec;
        let claim = claimed.as_ref().map(|c| (c.storage.clone(), c.entry.clone()));
        let run = async move {
            let refused =
                match (local_barrier, &shared, &shared_approval) {
                    // The claim and a new or used approval are durable before the handler runs.
                    (true, _, _) => store.durable().await.err().map(|err| {
                        CallResult::fail(ErrorCode::ExecutionError, format!("the store is not durable: {err}"))
                    }),
                    (false, Some(shared), Some((approval, revision))) => {
                        match shared.put_approval(approval, *revision).await {
                            Ok(true) => None,
                            Ok(false) => Some(CallResult::fail(
                                ErrorCode::ApprovalInvalid,
                                match revision {
                                    Some(_) => approval::ApprovalProblem::Used(approval.id.clone()).to_string(),
                                    None => format!("approval {} already exists in the cluster", approval.id),
                                },
                            )),
                            Err(err) => Some(CallResult::fail(ErrorCode::Unavailable, err.to_string())),
                        }
                    }
                    _ => None,
                };
            if let Some(refused) = refused {
                if let Some((storage, _)) = &claim {
                    if let Err(err) = keys.release(storage).await {
                        tracing::warn!(%err, "failed to release a re-drive key");
                    }
                }
                return refused;
            }
            let result = job.run().await;
            if let Some(claim) = &claim {
                settle(&keys, claim, &result, crash_after_exec).await;
            }
            result
        };
        Box::pin(run.into_actor(self).map(move |result, act, _| {
            for waiter in claimed.as_ref().map(|c| act.in_flight.finish(&c.storage)).unwrap_or_default() {
                let _ = waiter.send(result.clone());
            }
            act.finish_run(&call, claimed.as_ref().map(|c| &c.key), &trail, started, result)
        }))
    }

    fn finish_run(
        &mut self,
        call: &DispatchCall,
        key: Option<&ExecutionKey>,
        trail: &Trail,
        started: Instant,
        result: CallResult,
    ) -> CallResult {
        let facts = CallFacts {
            call,
            record: trail.record.as_deref(),
            execution_key: key,
            approval_id: trail.approval_used.as_deref(),
            secrets: &trail.secrets,
            replayed: false,
            latency_us: started.elapsed().as_micros() as u64,
            at_ms: wall_ms(),
        };
        self.finish(facts, result)
    }
}

impl Actor for Dispatcher {
    type Context = Context<Self>;
}

impl Handler<Dispatch> for Dispatcher {
    type Result = ResponseActFuture<Self, CallResult>;

    fn handle(&mut self, msg: Dispatch, _: &mut Context<Self>) -> Self::Result {
        let started = Instant::now();
        let mut call = msg.call;
        let key = match call.check(self.settings.max_id_bytes) {
            Ok(key) => key,
            Err(result) => return self.answer(&call, None, *result, false, started),
        };
        // One record answers to its slug, its discovery id and a source capability id;
        // from here on the call names it by its slug.
        if let Some(slug) = self.pipeline.resolve(&call.slug) {
            if slug != call.slug {
                call.slug = slug.to_string();
            }
        }
        let cached = redrive::cached_key(key, self.pipeline.record(&call.slug).map(|r| &**r));
        match self.prelude(&call, cached.as_ref()) {
            None => self.admit(call, cached, started, Prelude::default()),
            Some(prelude) => Box::pin(
                prelude.into_actor(self).then(move |prelude, act, _| act.admit(call, cached, started, prelude)),
            ),
        }
    }
}

impl Dispatcher {
    /// What a call must ask the shared state before its admission: its
    /// re-drive claim first (a call answered by its key takes no rate slot),
    /// then its rate window, then its approval. `None` when there is nothing
    /// to ask (one node alone, or a call with no key, limit or approval).
    fn prelude(
        &self,
        call: &DispatchCall,
        cached: Option<&ExecutionKey>,
    ) -> Option<futures::future::LocalBoxFuture<'static, Prelude>> {
        let shared = self.shared.clone()?;
        let rate_limit = self.pipeline.rate_limit_of(call);
        // A duplicate of a call running here waits for it (in `admit`, right
        // after this) without asking the cluster, and takes no rate slot.
        if cached.is_some_and(|key| self.in_flight.contains(&key.storage_key())) {
            return None;
        }
        if cached.is_none() && rate_limit.is_none() && call.approval_id.is_none() {
            return None;
        }
        let claim = cached.map(|key| (key.storage_key(), redrive::claim_entry(call, &self.boot_id, wall_ms())));
        let wait_ms = shared::settle_wait_ms(self.timeout_of(&call.slug));
        let window_ms = self.settings.rate_window_ms;
        let (slug, agent, approval_id) = (call.slug.clone(), call.agent_id.clone(), call.approval_id.clone());
        Some(Box::pin(async move {
            let mut prelude = Prelude::default();
            if let Some((storage, entry)) = claim {
                let state = shared_key_state(shared.clone(), storage, entry.clone(), wait_ms).await;
                let runs = state == KeyState::Claim(Claim::Claimed);
                prelude.key = Some((state, entry));
                if !runs {
                    return prelude;
                }
            }
            if let Some(limit) = rate_limit {
                prelude.rate = Some(shared_rate(shared.clone(), slug, agent, limit, window_ms).await);
            }
            if let Some(id) = approval_id {
                prelude.approval = Some(shared.approval(&id).await);
            }
            prelude
        }))
    }

    /// The longest a call of `slug` may run.
    fn timeout_of(&self, slug: &str) -> u64 {
        self.pipeline.record(slug).and_then(|record| record.timeout_ms).unwrap_or(self.settings.default_timeout_ms)
    }

    /// Admits a call (its key, the pipeline, the plan) and runs it; `prelude`
    /// holds what the shared state said, if it was asked.
    fn admit(
        &mut self,
        call: DispatchCall,
        cached: Option<ExecutionKey>,
        started: Instant,
        prelude: Prelude,
    ) -> ResponseActFuture<Self, CallResult> {
        // The re-drive cache wraps the pipeline, as in the design: a stored result is returned first.
        let mut claimed = None;
        if let Some(key) = cached {
            let storage = key.storage_key();
            let (state, entry) = match prelude.key {
                Some((state, entry)) => (state, entry),
                None => {
                    let entry = redrive::claim_entry(&call, &self.boot_id, wall_ms());
                    (self.key_state(&storage, &entry), entry)
                }
            };
            match redrive::verdict(&key, &entry, state) {
                Verdict::Run => claimed = Some(Claimed { key, storage, entry }),
                Verdict::Wait => return self.wait_for_first(call, key, &storage, started),
                Verdict::Answer(answered) => {
                    let (result, replayed) = answered.into_result();
                    return self.answer(&call, Some(&key), result, replayed, started);
                }
            }
        }
        if let Some(claimed) = &claimed {
            self.in_flight.start(claimed.storage.clone());
        }
        let unavailable = |err: SharedError| Work::done(CallResult::fail(ErrorCode::Unavailable, err.to_string()));
        let rate = match prelude.rate {
            None => RateGate::Local { mono_ms: self.mono_ms() },
            Some(Ok(decided)) => RateGate::Decided(decided),
            Some(Err(err)) => return self.run(call, claimed, unavailable(err), started),
        };
        let (stored_approval, approval_revision) = match prelude.approval {
            None => (self.stored_approval(&call), None),
            Some(Ok(Some(found))) => {
                // Cached here, so this node lists it too.
                if let Err(err) = self.store.put_approval(&found.value) {
                    tracing::warn!(%err, "failed to keep an approval of the cluster");
                }
                (Some(found.value), Some(found.revision))
            }
            Some(Ok(None)) => (None, None),
            Some(Err(err)) => return self.run(call, claimed, unavailable(err), started),
        };
        let decision = self.pipeline.admit_with(&call, stored_approval.as_ref(), rate, wall_ms());
        let plan = self.plan(decision, &call, stored_approval.as_ref());
        let work = self.perform(plan, approval_revision);
        self.run(call, claimed, work, started)
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

impl Handler<SetSourceCalls> for Dispatcher {
    type Result = ();

    fn handle(&mut self, msg: SetSourceCalls, _: &mut Context<Self>) {
        self.source_calls = Some(msg.0);
    }
}

impl Handler<SetSourceRecords> for Dispatcher {
    type Result = ();

    fn handle(&mut self, msg: SetSourceRecords, _: &mut Context<Self>) {
        self.pipeline.set_source_records(&msg.source_id, msg.records);
    }
}

impl Handler<RemoveSourceRecords> for Dispatcher {
    type Result = ();

    fn handle(&mut self, msg: RemoveSourceRecords, _: &mut Context<Self>) {
        self.pipeline.set_source_records(&msg.source_id, Vec::new());
    }
}

impl Handler<SetCatalog> for Dispatcher {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: SetCatalog, _: &mut Context<Self>) -> Self::Result {
        self.catalog = Some(msg.0);
        self.sync_catalog()
    }
}

impl Handler<Inspect<DispatcherStats>> for Dispatcher {
    type Result = MessageResult<Inspect<DispatcherStats>>;

    fn handle(&mut self, _: Inspect<DispatcherStats>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}

/// Asks for the calls, errors and latency percentiles of every capability
/// called since the node started, by capability id (`tool:<slug>`, or a
/// source capability's id).
#[derive(Message, Debug, Default)]
#[rtype(result = "HashMap<String, crate::core::console::model::CapabilityFigures>")]
pub struct InspectFigures;

impl Handler<InspectFigures> for Dispatcher {
    type Result = MessageResult<InspectFigures>;

    fn handle(&mut self, _: InspectFigures, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.figures.summaries())
    }
}

impl Handler<SetShared> for Dispatcher {
    type Result = ();

    fn handle(&mut self, msg: SetShared, _: &mut Context<Self>) {
        self.shared = Some(msg.0);
    }
}

impl Handler<ApplyApproval> for Dispatcher {
    type Result = ();

    fn handle(&mut self, msg: ApplyApproval, _: &mut Context<Self>) {
        let approval = msg.0;
        let known = self.store.approval(&approval.id).ok().flatten();
        if known.as_ref() != Some(&approval) {
            if let Err(err) = self.store.put_approval(&approval) {
                tracing::warn!(%err, id = %approval.id, "failed to keep an approval of the cluster");
            }
        }
    }
}
