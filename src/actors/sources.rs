//! SourceManager: keeps the live sources (MCP servers, OpenAPI documents, SQL
//! schemas), their state and their connections.
//!
//! A source is added (`sources.add`, the config's `[[sources]]`, or read back
//! from the store on start), stored as given (templates unresolved), then
//! connected through a [`Connector`]: its tools are published whole into the
//! SCG, the catalog and the dispatch registry by a [`Publisher`]. A lazy
//! source is published from the tools it declared or last synced, marked
//! loadable, and connected only when loaded or called; it is disconnected
//! again after `idleTimeoutMs` without calls.
//!
//! An upstream that dies is marked down at once (calls answer `unavailable`
//! with its last error) and reconnected with backoff
//! (`core::sources::settings::reconnect_delay_ms`); `tools/list_changed`
//! re-syncs it, and an OpenAPI URL is fetched again every
//! `refreshIntervalMs` (with `If-None-Match`).
//!
//! Calls do not pass through this actor's mailbox: [`LiveSources`] holds the
//! links and implements `SourceCalls` for the Dispatcher, so a call costs a
//! map lookup; only a call to a loadable source asks the actor to load it.
//! Every change is sent as a [`SourceEvent`] on a broadcast channel (the
//! gateway publishes them on `events.sources`).

use crate::actors::Inspect;
use crate::core::dispatch::{CallResult, ErrorCode};
use crate::core::sources::settings::{
    reconnect_delay_ms, SettingsError, SourceKind, SourceSettings, SourceState, SourceStatus,
};
use crate::core::sources::{SourceCall, SourceCalls, SourceTool};
use crate::store::sources::SourcesStore;
use crate::store::StoreError;
use actix::prelude::*;
use futures::future::{BoxFuture, LocalBoxFuture};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

/// What the store keeps of a source: its settings as given, and what its last sync found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceRecord {
    pub settings: SourceSettings,
    #[serde(default)]
    pub tools: Vec<SourceTool>,
    /// The text the SCG maps (an MCP tool list, an OpenAPI document, DDL), from the last sync.
    #[serde(default)]
    pub document: Option<String>,
    #[serde(default)]
    pub last_sync_ms: Option<u64>,
}

/// A progress notification of a running call.
pub type ProgressSink = Arc<dyn Fn(Value) + Send + Sync>;

/// A live connection to one source.
pub trait Link: Send + Sync {
    /// Calls a tool or operation; always answers, within `timeout_ms`.
    fn call(
        &self,
        name: &str,
        arguments: Value,
        timeout_ms: u64,
        progress: ProgressSink,
    ) -> BoxFuture<'static, CallResult>;
    /// Resolves when the upstream is gone (a child that exited, a closed session).
    fn closed(&self) -> BoxFuture<'static, ()>;
    /// Resolves at the upstream's next `notifications/tools/list_changed`; never for a source without them.
    fn tools_changed(&self) -> BoxFuture<'static, ()>;
    /// Lists the tools again (after a `tools_changed`, or an OpenAPI URL's
    /// refresh with `If-None-Match`); `None` when nothing changed.
    fn list_tools(&self) -> BoxFuture<'static, Result<Option<Synced>, String>>;
}

/// What a connect or a sync found.
pub struct Synced {
    pub tools: Vec<SourceTool>,
    /// The text the SCG maps.
    pub document: String,
}

/// A source reached: what it offers and, for callable sources, the link to call it on.
pub struct Connected {
    pub synced: Synced,
    pub link: Option<Arc<dyn Link>>,
}

/// Connects sources (over `upstream`, wired in `live`).
pub trait Connector {
    /// Connects to (or reads) a source.
    fn connect(&self, settings: &SourceSettings) -> LocalBoxFuture<'static, Result<Connected, String>>;
}

/// Publishes a source's tools into the SCG, the catalog and the dispatch registry, whole (`source_catalog`, wired in `app`).
pub trait Publisher {
    fn publish(
        &self,
        settings: &SourceSettings,
        document: &str,
        tools: &[SourceTool],
        loadable: bool,
    ) -> LocalBoxFuture<'static, Result<(), String>>;
    fn withdraw(&self, source_id: &str) -> LocalBoxFuture<'static, Result<(), String>>;
}

/// A change of a source, published on `events.sources`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceEvent {
    /// `added`, `connected`, `synced`, `disconnected`, `failed`, `idle`, `removed` or `progress`.
    #[serde(rename = "type")]
    pub kind: String,
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<SourceState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_count: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A progress notification of a call (`type: progress`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
    pub at_ms: u64,
}

/// Why a sources request was refused.
#[derive(Debug, thiserror::Error)]
pub enum SourcesError {
    #[error("{0}")]
    Invalid(String),
    #[error("no source {0:?}")]
    NotFound(String),
    #[error("{0}")]
    Store(#[from] StoreError),
}

impl From<SettingsError> for SourcesError {
    fn from(err: SettingsError) -> SourcesError {
        SourcesError::Invalid(format!("{}: {}", err.field, err.problem))
    }
}

/// One source's entry in the calls table.
#[derive(Clone)]
enum Live {
    Up {
        link: Arc<dyn Link>,
        last_used_ms: Arc<AtomicU64>,
    },
    Down {
        error: String,
    },
    /// A lazy source not connected now: a call loads it first.
    Loadable,
}

/// The links calls run on, shared by the SourceManager (the only writer) and the Dispatcher.
pub struct LiveSources {
    entries: RwLock<HashMap<String, Live>>,
    manager: OnceLock<Addr<SourceManager>>,
    events: tokio::sync::broadcast::Sender<SourceEvent>,
    epoch: std::time::Instant,
}

impl LiveSources {
    fn new(events: tokio::sync::broadcast::Sender<SourceEvent>) -> LiveSources {
        LiveSources { entries: RwLock::default(), manager: OnceLock::new(), events, epoch: std::time::Instant::now() }
    }

    fn set(&self, id: &str, live: Option<Live>) {
        let mut entries = self.entries.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        match live {
            Some(live) => entries.insert(id.to_string(), live),
            None => entries.remove(id),
        };
    }

    fn get(&self, id: &str) -> Option<Live> {
        self.entries.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(id).cloned()
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn run(
        self: Arc<Self>,
        call: SourceCall,
        link: Arc<dyn Link>,
        last_used_ms: Arc<AtomicU64>,
    ) -> BoxFuture<'static, CallResult> {
        last_used_ms.store(self.now_ms(), Ordering::Relaxed);
        let events = self.events.clone();
        let source = call.source_id.clone();
        let progress: ProgressSink = Arc::new(move |progress: Value| {
            let _ = events.send(SourceEvent {
                kind: "progress".into(),
                source: source.clone(),
                state: None,
                tool_count: None,
                error: None,
                progress: Some(progress),
                at_ms: crate::clock::epoch_ms(),
            });
        });
        let running = link.call(&call.name, call.arguments, call.timeout_ms, progress);
        Box::pin(async move {
            let result = running.await;
            last_used_ms.store(self.now_ms(), Ordering::Relaxed);
            result
        })
    }
}

fn unavailable(source_id: &str, why: &str) -> CallResult {
    CallResult::fail(ErrorCode::Unavailable, format!("source {source_id} is unavailable: {why}"))
}

/// The Dispatcher's way to run calls on live sources.
#[derive(Clone)]
pub struct SourceCaller(pub Arc<LiveSources>);

impl SourceCalls for SourceCaller {
    fn call(&self, call: SourceCall) -> BoxFuture<'static, CallResult> {
        let live = self.0.clone();
        match live.get(&call.source_id) {
            Some(Live::Up { link, last_used_ms }) => live.run(call, link, last_used_ms),
            Some(Live::Down { error }) => Box::pin(futures::future::ready(unavailable(&call.source_id, &error))),
            None => Box::pin(futures::future::ready(unavailable(&call.source_id, "it is not connected"))),
            Some(Live::Loadable) => {
                let Some(manager) = live.manager.get().cloned() else {
                    return Box::pin(futures::future::ready(unavailable(&call.source_id, "it cannot be loaded here")));
                };
                let timeout = Duration::from_millis(call.timeout_ms);
                Box::pin(async move {
                    let loading = manager.send(LoadSource { id: call.source_id.clone() });
                    match tokio::time::timeout(timeout, loading).await {
                        Err(_) => unavailable(&call.source_id, "it did not connect within the call's timeout"),
                        Ok(Err(_)) => unavailable(&call.source_id, "capdex is stopping"),
                        Ok(Ok(Err(err))) => unavailable(&call.source_id, &err.to_string()),
                        Ok(Ok(Ok(_))) => match live.get(&call.source_id) {
                            Some(Live::Up { link, last_used_ms }) => live.clone().run(call, link, last_used_ms).await,
                            Some(Live::Down { error }) => unavailable(&call.source_id, &error),
                            _ => unavailable(&call.source_id, "it did not connect"),
                        },
                    }
                })
            }
        }
    }
}

/// One source as the actor keeps it.
struct Source {
    record: SourceRecord,
    status: SourceStatus,
    /// Bumped on every (re)connect and removal, so a late answer of an older one is ignored.
    generation: u64,
    attempt: u32,
    /// The task watching its link (closing, tool-list changes); it holds a
    /// handle on the session, so it is cancelled before the link is dropped.
    watch: Option<SpawnHandle>,
    /// Callers waiting for the connect in progress.
    waiters: Vec<tokio::sync::oneshot::Sender<Result<SourceStatus, String>>>,
}

/// Settings of the manager itself.
#[derive(Clone, Debug)]
pub struct ManagerSettings {
    /// How often idle lazy sources are looked for.
    pub idle_sweep: Duration,
}

impl Default for ManagerSettings {
    fn default() -> Self {
        ManagerSettings { idle_sweep: Duration::from_secs(1) }
    }
}

/// The live sources' actor.
pub struct SourceManager {
    sources: BTreeMap<String, Source>,
    store: SourcesStore,
    connector: Rc<dyn Connector>,
    publisher: Rc<dyn Publisher>,
    live: Arc<LiveSources>,
    events: tokio::sync::broadcast::Sender<SourceEvent>,
    settings: ManagerSettings,
    next_generation: u64,
}

impl SourceManager {
    pub fn new(
        store: SourcesStore,
        connector: Rc<dyn Connector>,
        publisher: Rc<dyn Publisher>,
        settings: ManagerSettings,
    ) -> SourceManager {
        let (events, _) = tokio::sync::broadcast::channel(1024);
        let live = Arc::new(LiveSources::new(events.clone()));
        SourceManager {
            sources: BTreeMap::new(),
            store,
            connector,
            publisher,
            live,
            events,
            settings,
            next_generation: 1,
        }
    }

    /// What the Dispatcher runs source calls through.
    pub fn caller(&self) -> SourceCaller {
        SourceCaller(self.live.clone())
    }

    /// Every change of a source, and calls' progress.
    pub fn events(&self) -> tokio::sync::broadcast::Sender<SourceEvent> {
        self.events.clone()
    }

    fn emit(&self, kind: &str, source: &Source, error: Option<String>) {
        let _ = self.events.send(SourceEvent {
            kind: kind.into(),
            source: source.status.id.clone(),
            state: Some(source.status.state),
            tool_count: Some(source.status.tool_count),
            error,
            progress: None,
            at_ms: crate::clock::epoch_ms(),
        });
        self.gauges();
    }

    fn gauges(&self) {
        let connected = self.sources.values().filter(|s| s.status.state == SourceState::Connected).count();
        metrics::gauge!("capdex_sources_connected").set(connected as f64);
        for source in self.sources.values() {
            metrics::gauge!("capdex_source_tools", "source" => source.status.id.clone())
                .set(source.status.tool_count as f64);
        }
    }

    fn generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// Starts (or restarts) a source: publishes a lazy one as loadable, connects any other.
    fn start(&mut self, id: &str, ctx: &mut Context<Self>) {
        let generation = self.generation();
        let Some(source) = self.sources.get_mut(id) else { return };
        source.generation = generation;
        if source.record.settings.lazy {
            self.go_idle(id, ctx);
        } else {
            self.connect(id, ctx);
        }
    }

    /// Publishes a lazy source's known tools as loadable; nothing runs.
    fn go_idle(&mut self, id: &str, ctx: &mut Context<Self>) {
        self.release(id, ctx);
        let Some(source) = self.sources.get_mut(id) else { return };
        source.status.state = SourceState::Idle;
        source.status.loadable = true;
        let (tools, document) = known_tools(&source.record);
        source.status.tool_count = tools.len();
        self.live.set(id, Some(Live::Loadable));
        let publish = self.publisher.publish(&source.record.settings, &document, &tools, true);
        let generation = source.generation;
        let id = id.to_string();
        ctx.spawn(publish.into_actor(self).map(move |published, act, _| {
            let Some(source) = act.sources.get_mut(&id).filter(|s| s.generation == generation) else { return };
            if let Err(err) = published {
                source.status.last_error = Some(err);
            }
            let status = source.status.clone();
            for waiter in source.waiters.drain(..) {
                let _ = waiter.send(Ok(status.clone()));
            }
            let source = &act.sources[&id];
            act.emit("idle", source, None);
        }));
    }

    /// Connects a source now; waiters are answered when it is synced or has failed.
    fn connect(&mut self, id: &str, ctx: &mut Context<Self>) {
        let Some(source) = self.sources.get_mut(id) else { return };
        source.status.state = SourceState::Connecting;
        let generation = source.generation;
        let connecting = self.connector.connect(&source.record.settings);
        let id = id.to_string();
        ctx.spawn(
            connecting
                .into_actor(self)
                .then(move |connected, act, ctx| act.connected(&id, generation, connected, ctx).into_actor(act)),
        );
    }

    /// A connect's answer: publish what it found, or mark the source down and retry later.
    fn connected(
        &mut self,
        id: &str,
        generation: u64,
        connected: Result<Connected, String>,
        ctx: &mut Context<Self>,
    ) -> LocalBoxFuture<'static, ()> {
        let done = Box::pin(futures::future::ready(()));
        let Some(source) = self.sources.get_mut(id).filter(|s| s.generation == generation) else { return done };
        match connected {
            Err(error) => {
                self.down(id, error, ctx);
                done
            }
            Ok(Connected { synced, link }) => {
                source.attempt = 0;
                let publish = self.publisher.publish(&source.record.settings, &synced.document, &synced.tools, false);
                if let Some(link) = &link {
                    self.watch(id, generation, link.clone(), ctx);
                }
                let addr = ctx.address();
                let id = id.to_string();
                Box::pin(async move {
                    let published = publish.await;
                    addr.do_send(Published { id, generation, synced, link, published });
                })
            }
        }
    }

    /// Watches a link: its closing and its tool-list changes come back as messages.
    fn watch(&mut self, id: &str, generation: u64, link: Arc<dyn Link>, ctx: &mut Context<Self>) {
        let addr = ctx.address();
        let (closed, changed) = (link.closed(), link.tools_changed());
        let source_id = id.to_string();
        let handle = ctx.spawn(
            async move {
                tokio::select! {
                    _ = closed => addr.do_send(Closed { id: source_id, generation }),
                    _ = changed => addr.do_send(ToolsChanged { id: source_id, generation }),
                }
            }
            .into_actor(self),
        );
        if let Some(old) = self.sources.get_mut(id).and_then(|source| source.watch.replace(handle)) {
            ctx.cancel_future(old);
        }
    }

    /// Lets go of a source's link: stops watching it and drops it from the
    /// calls table, so the session ends (a stdio server's process is stopped).
    fn release(&mut self, id: &str, ctx: &mut Context<Self>) {
        if let Some(handle) = self.sources.get_mut(id).and_then(|source| source.watch.take()) {
            ctx.cancel_future(handle);
        }
        self.live.set(id, None);
    }

    /// Marks a source down: calls answer `unavailable` with `error`; a reconnect is scheduled.
    fn down(&mut self, id: &str, error: String, ctx: &mut Context<Self>) {
        let Some(source) = self.sources.get_mut(id) else { return };
        if source.record.settings.lazy {
            // A lazy source is loaded again by the next call that needs it.
            source.status.state = SourceState::Idle;
            source.status.loadable = true;
            source.status.last_error = Some(error.clone());
            self.live.set(id, Some(Live::Loadable));
            for waiter in source.waiters.drain(..) {
                let _ = waiter.send(Ok(source.status.clone()));
            }
            let source = &self.sources[id];
            self.emit("idle", source, Some(error));
            return;
        }
        let first_failure = source.status.state == SourceState::Connecting && source.status.last_sync_ms.is_none();
        source.status.state = if first_failure { SourceState::Failed } else { SourceState::Disconnected };
        source.status.last_error = Some(error.clone());
        self.live.set(id, Some(Live::Down { error: error.clone() }));
        for waiter in source.waiters.drain(..) {
            let _ = waiter.send(Ok(source.status.clone()));
        }
        let delay = reconnect_delay_ms(source.attempt, jitter());
        source.attempt = source.attempt.saturating_add(1);
        let generation = source.generation;
        let kind = if first_failure { "failed" } else { "disconnected" };
        tracing::warn!(source = %id, %error, retry_in_ms = delay, "a source is down");
        let source = &self.sources[id];
        self.emit(kind, source, Some(error));
        let id = id.to_string();
        ctx.run_later(Duration::from_millis(delay), move |act, ctx| {
            if act.sources.get(&id).is_some_and(|s| s.generation == generation && !s.record.settings.lazy) {
                act.connect(&id, ctx);
            }
        });
    }

    /// An OpenAPI source read from a URL is fetched again every `refreshIntervalMs`.
    fn schedule_refresh(&self, id: &str, generation: u64, ctx: &mut Context<Self>) {
        let Some(source) = self.sources.get(id) else { return };
        let settings = &source.record.settings;
        if settings.kind != SourceKind::Openapi || settings.url.is_none() {
            return;
        }
        let id = id.to_string();
        ctx.run_later(Duration::from_millis(settings.refresh_interval_ms()), move |act, ctx| {
            if act.sources.get(&id).is_none_or(|s| s.generation != generation) {
                return;
            }
            let Some(Live::Up { link, .. }) = act.live.get(&id) else { return };
            act.resync(id, generation, &link, ctx);
        });
    }

    /// Lists a link's tools again; the answer comes back as [`Resynced`].
    fn resync(&self, id: String, generation: u64, link: &Arc<dyn Link>, ctx: &mut Context<Self>) {
        let listing = link.list_tools();
        let addr = ctx.address();
        ctx.spawn(
            async move {
                let synced = match listing.await {
                    Ok(Some(synced)) => Ok(synced),
                    Ok(None) => Err(None),
                    Err(error) => Err(Some(error)),
                };
                addr.do_send(Resynced { id, generation, synced });
            }
            .into_actor(self),
        );
    }

    fn status_list(&self) -> Vec<SourceStatus> {
        self.sources.values().map(|source| source.status.clone()).collect()
    }

    fn persist(&self, id: &str) -> Result<(), StoreError> {
        match self.sources.get(id) {
            Some(source) => self.store.put(id, &source.record),
            None => self.store.remove(id).map(|_| ()),
        }
    }

    fn sweep_idle(&mut self, ctx: &mut Context<Self>) {
        let now = self.live.now_ms();
        let idle: Vec<String> = self
            .sources
            .iter()
            .filter(|(_, source)| source.record.settings.lazy && source.status.state == SourceState::Connected)
            .filter(|(id, source)| match self.live.get(id) {
                Some(Live::Up { last_used_ms, .. }) => {
                    now.saturating_sub(last_used_ms.load(Ordering::Relaxed)) >= source.record.settings.idle_timeout_ms()
                }
                _ => false,
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in idle {
            tracing::info!(source = %id, "disconnecting an idle lazy source");
            let generation = self.generation();
            if let Some(source) = self.sources.get_mut(&id) {
                source.generation = generation;
            }
            // Dropping the link ends the session (and a stdio server's process).
            self.go_idle(&id, ctx);
        }
    }
}

/// The tools a source is known to have without connecting: its last sync, else what it declared.
fn known_tools(record: &SourceRecord) -> (Vec<SourceTool>, String) {
    match (&record.document, record.tools.is_empty()) {
        (Some(document), false) => (record.tools.clone(), document.clone()),
        _ => {
            let tools = record.settings.declared_tools();
            let document = crate::core::sources::tools::mcp_document(&tools).to_string();
            (tools, document)
        }
    }
}

fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    f64::from(nanos % 1000) / 1000.0
}

fn new_status(settings: &SourceSettings) -> SourceStatus {
    SourceStatus {
        id: settings.id.clone(),
        kind: settings.kind,
        state: SourceState::Connecting,
        tool_count: 0,
        last_sync_ms: None,
        last_error: None,
        lazy: settings.lazy,
        loadable: false,
    }
}

impl Actor for SourceManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let _ = self.live.manager.set(ctx.address());
        let sweep = self.settings.idle_sweep;
        ctx.run_interval(sweep, |act, ctx| act.sweep_idle(ctx));
    }
}

/// Adds (or replaces) a source; answers its status after its first connect
/// (a lazy source: at once). A source that cannot connect is kept, shown
/// `failed` with its error, and retried.
#[derive(Message)]
#[rtype(result = "Result<SourceStatus, SourcesError>")]
pub struct AddSource {
    pub settings: SourceSettings,
    /// False when the source comes back from the store (it is stored already).
    pub persist: bool,
}

impl Handler<AddSource> for SourceManager {
    type Result = ResponseActFuture<Self, Result<SourceStatus, SourcesError>>;

    fn handle(&mut self, msg: AddSource, ctx: &mut Context<Self>) -> Self::Result {
        let AddSource { settings, persist } = msg;
        if let Err(err) = settings.validate() {
            return Box::pin(fut::ready(Err(err.into())));
        }
        let id = settings.id.clone();
        // A re-add with the same settings keeps what the last sync found.
        let kept = self.store.get::<SourceRecord>(&id).ok().flatten().filter(|old| old.settings.kind == settings.kind);
        let record = SourceRecord {
            tools: kept.as_ref().map(|old| old.tools.clone()).unwrap_or_default(),
            document: kept.as_ref().and_then(|old| old.document.clone()),
            last_sync_ms: kept.as_ref().and_then(|old| old.last_sync_ms),
            settings: settings.clone(),
        };
        let mut status = new_status(&settings);
        status.last_sync_ms = record.last_sync_ms;
        let old = self
            .sources
            .insert(id.clone(), Source { record, status, generation: 0, attempt: 0, watch: None, waiters: Vec::new() });
        if let Some(old) = old {
            if let Some(handle) = old.watch {
                ctx.cancel_future(handle);
            }
            self.live.set(&id, None);
            for waiter in old.waiters {
                let _ = waiter.send(Err("the source was replaced".into()));
            }
        }
        if persist {
            if let Err(err) = self.persist(&id) {
                self.sources.remove(&id);
                return Box::pin(fut::ready(Err(err.into())));
            }
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The waiter is answered once the source is published (lazy) or connected or failed.
        self.sources.get_mut(&id).expect("inserted above").waiters.push(tx);
        self.start(&id, ctx);
        self.emit("added", &self.sources[&id], None);
        Box::pin(
            async move {
                match rx.await {
                    Ok(Ok(status)) => Ok(status),
                    Ok(Err(why)) => Err(SourcesError::Invalid(why)),
                    Err(_) => Err(SourcesError::Invalid("the source was removed while connecting".into())),
                }
            }
            .into_actor(self),
        )
    }
}

/// Removes a source, its connection and its capabilities.
#[derive(Message)]
#[rtype(result = "Result<(), SourcesError>")]
pub struct RemoveSource {
    pub id: String,
}

impl Handler<RemoveSource> for SourceManager {
    type Result = ResponseActFuture<Self, Result<(), SourcesError>>;

    fn handle(&mut self, msg: RemoveSource, ctx: &mut Context<Self>) -> Self::Result {
        self.release(&msg.id, ctx);
        let Some(mut source) = self.sources.remove(&msg.id) else {
            return Box::pin(fut::ready(Err(SourcesError::NotFound(msg.id))));
        };
        for waiter in source.waiters.drain(..) {
            let _ = waiter.send(Err("the source was removed".into()));
        }
        if let Err(err) = self.persist(&msg.id) {
            return Box::pin(fut::ready(Err(err.into())));
        }
        metrics::gauge!("capdex_source_tools", "source" => msg.id.clone()).set(0.0);
        source.status.state = SourceState::Disconnected;
        source.status.tool_count = 0;
        self.emit("removed", &source, None);
        let withdraw = self.publisher.withdraw(&msg.id);
        Box::pin(withdraw.into_actor(self).map(|withdrawn, _, _| withdrawn.map_err(SourcesError::Invalid)))
    }
}

/// Every source's status, in id order.
#[derive(Message)]
#[rtype(result = "Vec<SourceStatus>")]
pub struct ListSources;

impl Handler<ListSources> for SourceManager {
    type Result = MessageResult<ListSources>;

    fn handle(&mut self, _: ListSources, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.status_list())
    }
}

/// Connects a lazy source now (a no-op for a connected one); answers once it is synced or failed.
#[derive(Message)]
#[rtype(result = "Result<SourceStatus, SourcesError>")]
pub struct LoadSource {
    pub id: String,
}

impl Handler<LoadSource> for SourceManager {
    type Result = ResponseActFuture<Self, Result<SourceStatus, SourcesError>>;

    fn handle(&mut self, msg: LoadSource, ctx: &mut Context<Self>) -> Self::Result {
        let Some(source) = self.sources.get_mut(&msg.id) else {
            return Box::pin(fut::ready(Err(SourcesError::NotFound(msg.id))));
        };
        if source.status.state == SourceState::Connected {
            return Box::pin(fut::ready(Ok(source.status.clone())));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        source.waiters.push(tx);
        if source.status.state != SourceState::Connecting {
            self.connect(&msg.id, ctx);
        }
        Box::pin(
            async move {
                match rx.await {
                    Ok(Ok(status)) if status.state == SourceState::Connected => Ok(status),
                    Ok(Ok(status)) => {
                        Err(SourcesError::Invalid(status.last_error.unwrap_or_else(|| "it did not connect".into())))
                    }
                    Ok(Err(why)) => Err(SourcesError::Invalid(why)),
                    Err(_) => Err(SourcesError::Invalid("the source was removed while connecting".into())),
                }
            }
            .into_actor(self),
        )
    }
}

/// A connect's tools were published (or not).
#[derive(Message)]
#[rtype(result = "()")]
struct Published {
    id: String,
    generation: u64,
    synced: Synced,
    link: Option<Arc<dyn Link>>,
    published: Result<(), String>,
}

impl Handler<Published> for SourceManager {
    type Result = ();

    fn handle(&mut self, msg: Published, ctx: &mut Context<Self>) {
        let Published { id, generation, synced, link, published } = msg;
        let Some(source) = self.sources.get_mut(&id).filter(|s| s.generation == generation) else { return };
        if let Err(error) = published {
            // The source's text did not map: nothing of it was published.
            self.down(&id, format!("its tools could not be published: {error}"), ctx);
            return;
        }
        let now = crate::clock::epoch_ms();
        source.record.tools = synced.tools;
        source.record.document = Some(synced.document);
        source.record.last_sync_ms = Some(now);
        source.status.state = SourceState::Connected;
        source.status.loadable = false;
        source.status.tool_count = source.record.tools.len();
        source.status.last_sync_ms = Some(now);
        source.status.last_error = None;
        match link {
            Some(link) => {
                let last_used_ms = Arc::new(AtomicU64::new(self.live.now_ms()));
                self.live.set(&id, Some(Live::Up { link, last_used_ms }));
            }
            None => self.live.set(&id, Some(Live::Down { error: "it is mapped for discovery only".into() })),
        }
        let status = source.status.clone();
        for waiter in source.waiters.drain(..) {
            let _ = waiter.send(Ok(status.clone()));
        }
        if let Err(err) = self.persist(&id) {
            tracing::warn!(source = %id, %err, "failed to store a source's tools");
        }
        tracing::info!(source = %id, tools = status.tool_count, "source synced");
        self.emit("connected", &self.sources[&id], None);
        self.schedule_refresh(&id, generation, ctx);
    }
}

/// The upstream of a source is gone.
#[derive(Message)]
#[rtype(result = "()")]
struct Closed {
    id: String,
    generation: u64,
}

impl Handler<Closed> for SourceManager {
    type Result = ();

    fn handle(&mut self, msg: Closed, ctx: &mut Context<Self>) {
        if self.sources.get(&msg.id).is_some_and(|s| s.generation == msg.generation) {
            self.down(&msg.id, "the upstream closed the connection".into(), ctx);
        }
    }
}

/// A source said its tool list changed.
#[derive(Message)]
#[rtype(result = "()")]
struct ToolsChanged {
    id: String,
    generation: u64,
}

impl Handler<ToolsChanged> for SourceManager {
    type Result = ();

    fn handle(&mut self, msg: ToolsChanged, ctx: &mut Context<Self>) {
        let Some(Live::Up { link, .. }) = self.live.get(&msg.id) else { return };
        if self.sources.get(&msg.id).is_none_or(|s| s.generation != msg.generation) {
            return;
        }
        // Keep watching this link, then list its tools again.
        self.watch(&msg.id, msg.generation, link.clone(), ctx);
        self.resync(msg.id, msg.generation, &link, ctx);
    }
}

/// A re-sync's answer: new tools, no change (`Err(None)`), or an error.
#[derive(Message)]
#[rtype(result = "()")]
struct Resynced {
    id: String,
    generation: u64,
    synced: Result<Synced, Option<String>>,
}

impl Handler<Resynced> for SourceManager {
    type Result = ();

    fn handle(&mut self, msg: Resynced, ctx: &mut Context<Self>) {
        let Resynced { id, generation, synced } = msg;
        let Some(source) = self.sources.get_mut(&id).filter(|s| s.generation == generation) else { return };
        match synced {
            Err(None) => self.schedule_refresh(&id, generation, ctx),
            Err(Some(error)) => {
                tracing::warn!(source = %id, %error, "a source's re-sync failed; its last tools stay");
                source.status.last_error = Some(error.clone());
                let source = &self.sources[&id];
                self.emit("synced", source, Some(error));
                self.schedule_refresh(&id, generation, ctx);
            }
            Ok(synced) => {
                let link = match self.live.get(&id) {
                    Some(Live::Up { link, .. }) => Some(link),
                    _ => None,
                };
                let publish = self.publisher.publish(&source.record.settings, &synced.document, &synced.tools, false);
                let addr = ctx.address();
                ctx.spawn(
                    async move {
                        let published = publish.await;
                        addr.do_send(Published { id, generation, synced, link, published });
                    }
                    .into_actor(self),
                );
            }
        }
    }
}

/// A snapshot for tests and operators.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceManagerStats {
    pub sources: Vec<SourceStatus>,
}

impl Handler<Inspect<SourceManagerStats>> for SourceManager {
    type Result = MessageResult<Inspect<SourceManagerStats>>;

    fn handle(&mut self, _: Inspect<SourceManagerStats>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(SourceManagerStats { sources: self.status_list() })
    }
}

/// Reads the stored sources back, to add them again on start.
pub fn stored_sources(store: &SourcesStore) -> Result<Vec<SourceSettings>, StoreError> {
    Ok(store.all::<SourceRecord>()?.into_iter().map(|(_, record)| record.settings).collect())
}
