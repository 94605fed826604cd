//! Several nodes, one state: wiring between the JetStream streams
//! (`gateway::jetstream`), the actors and the store.
//!
//! Index mutations (write path of a `capabilities.upsert` or `.remove` request
//! on any node):
//! 1. the request is checked (its runtime id) and appended to the index log
//!    with a `Nats-Msg-Id` unique to this process and request;
//! 2. every node, this one included, reads the log in order and applies each
//!    mutation through the Indexer, then stores the mutation's sequence
//!    (`Store::set_applied_index_sequence`);
//! 3. this node answers the request with the report of applying it, so a
//!    success reply means the mutation is in the log (every node will apply
//!    it) and in this node's index.
//!
//! On start a node follows the log from the sequence it stored and waits until
//! it has applied everything the log held before serving requests.
//! Capabilities scanned from `capability_dirs` and files loaded on the command
//! line are not in the log: they stay local to the node that reads them.
//!
//! Outcomes on the outcome stream: each node reads every outcome through its
//! own durable consumer; an outcome is acknowledged only after the KPI actor
//! has made it durable together with its id stored as processed (one
//! group-commit round, the id written after the sample), so a node that dies
//! mid-stream loses none (unacknowledged ones come again) and counts none twice
//! (a redelivered id is skipped; should only the sample have landed, the KPI
//! window's own `turnId` check refuses the repeat, and an outcome without a
//! `turnId` is given its message id as one).
//!
//! Dispatch state (`jetstream.shared_dispatch`): the Dispatcher is given the
//! key-value buckets (`gateway::kv::DispatchBuckets`) as its shared state, so
//! re-drive claims, approvals and rate windows are decided in the cluster; this
//! node follows the registry bucket (records and bindings published by any
//! node) and the approvals bucket into its store, and has caught up with the
//! registry before it serves. Records and bindings only this node's store held
//! (a node that ran alone before) are offered to the cluster create-only.

use crate::actors::dispatcher::{ApplyApproval, ApplyRegistryChange, SetShared};
use crate::actors::kpi::{KpiError, KpiTelemetry, RecordStreamOutcome};
use crate::actors::Actors;
use crate::clock::epoch_ms;
use crate::config::Settings;
use crate::core::dispatch::shared::SharedDispatch;
use crate::core::kpi_window::OutcomeReport;
use crate::gateway::jetstream::{Disposition, IndexMutation, JetStream, StreamMessage};
use crate::gateway::kv::{approval_change, keep_swept, registry_change, DispatchBuckets};
use crate::gateway::service::Gateway;
use crate::gateway::subjects::Subjects;
use crate::gateway::wire::{ApiError, RegistrationReply};
use crate::registration::{apply_batch, Mutation};
use crate::store::Store;
use anyhow::Context as _;
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// The longest a starting node waits to catch up with the index log before serving anyway.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(120);

type Waiter = oneshot::Sender<Result<RegistrationReply, ApiError>>;

/// This node's side of the index log: submits mutations and waits until they are applied here.
pub struct Replication {
    jetstream: JetStream,
    node_name: String,
    /// `<node name>.<process nonce>`: a prefix no other process uses.
    id_prefix: String,
    next_id: Cell<u64>,
    waiters: RefCell<HashMap<String, Waiter>>,
    apply_timeout: Duration,
}

impl Replication {
    /// This node's name (`jetstream.node_name`, or the one kept in the data dir).
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Appends `mutation` to the index log and returns the report of applying it on this node.
    pub async fn submit(&self, mutation: IndexMutation) -> Result<RegistrationReply, ApiError> {
        let payload = serde_json::to_vec(&mutation).map_err(|err| ApiError::internal(err.to_string()))?;
        let message_id = format!("{}.{}", self.id_prefix, self.next_id.get());
        self.next_id.set(self.next_id.get() + 1);
        let (sender, receiver) = oneshot::channel();
        self.waiters.borrow_mut().insert(message_id.clone(), sender);
        if let Err(err) = self.jetstream.publish_index(&message_id, payload).await {
            self.waiters.borrow_mut().remove(&message_id);
            return Err(ApiError::unavailable(err));
        }
        match tokio::time::timeout(self.apply_timeout, receiver).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(ApiError::internal("the index log follower stopped")),
            Err(_) => {
                self.waiters.borrow_mut().remove(&message_id);
                Err(ApiError::apply_timeout(format!(
                    "the mutation is in the index log but was not applied here within {:?}; \
                         it will be applied when this node catches up",
                    self.apply_timeout
                )))
            }
        }
    }

    fn resolve(&self, message_id: Option<&str>, reply: Result<RegistrationReply, ApiError>) {
        let waiter = message_id.and_then(|id| self.waiters.borrow_mut().remove(id));
        if let Some(waiter) = waiter {
            let _ = waiter.send(reply);
        }
    }
}

/// Opens the streams, follows the index log (waiting until this node has
/// caught up), and starts reading the outcome stream. Must run on the System's LocalSet.
pub async fn start(
    settings: &Settings,
    gateway: &Gateway,
    actors: &Actors,
    store: &Store,
) -> anyhow::Result<Rc<Replication>> {
    let jetstream = JetStream::open(gateway.client().clone(), &settings.jetstream, gateway.subjects())
        .await
        .context("JetStream is needed by several nodes (run nats-server with -js), or set jetstream.enabled = false")?;
    let node_name = if settings.jetstream.node_name.is_empty() {
        store.node_name(generated_name)?
    } else {
        settings.jetstream.node_name.clone()
    };
    let replication = Rc::new(Replication {
        jetstream: jetstream.clone(),
        node_name: node_name.clone(),
        id_prefix: format!("{node_name}.{}", generated_name()),
        next_id: Cell::new(0),
        waiters: RefCell::new(HashMap::new()),
        apply_timeout: Duration::from_millis(settings.jetstream.apply_timeout_ms),
    });

    let applied = store.applied_index_sequence()?;
    let target = jetstream.index_last_sequence().await?;
    let (applied_tx, mut applied_rx) = tokio::sync::watch::channel(applied);
    let max_id_bytes = settings.limits.max_id_bytes;
    let follower = {
        let (replication, store, indexer) = (replication.clone(), store.clone(), actors.indexer.clone());
        async move {
            replication
                .jetstream
                .follow_index(applied, |messages| {
                    let (replication, store, indexer) = (replication.clone(), store.clone(), indexer.clone());
                    let applied_tx = applied_tx.clone();
                    async move {
                        let sequence = messages.last().map_or(0, |message| message.sequence);
                        let replies = apply_mutations(&indexer, &messages, max_id_bytes).await;
                        if let Err(err) = store.set_applied_index_sequence(sequence) {
                            tracing::error!(%err, sequence, "failed to store the applied index sequence");
                        }
                        for (message, reply) in messages.iter().zip(replies) {
                            if let Err(err) = &reply {
                                let (code, sequence) = (err.code(), message.sequence);
                                tracing::warn!(sequence, %code, message = %err.message, "index mutation not applied");
                            }
                            replication.resolve(message.message_id.as_deref(), reply);
                        }
                        let _ = applied_tx.send(sequence);
                    }
                })
                .await
        }
    };
    tokio::task::spawn_local(follower);
    if applied < target {
        tracing::info!(from = applied, to = target, "catching up with the index log");
        let caught_up = tokio::time::timeout(CATCH_UP_LIMIT, applied_rx.wait_for(|seq| *seq >= target)).await;
        if caught_up.is_err() {
            tracing::warn!(target, "not caught up with the index log within {CATCH_UP_LIMIT:?}; serving anyway");
        }
    }

    let consumer = {
        let (kpi, store, subjects) = (actors.kpi.clone(), store.clone(), gateway.subjects().clone());
        let node_name = node_name.clone();
        async move {
            let handle =
                |message| ingest_outcome(kpi.clone(), store.clone(), jetstream.clone(), subjects.clone(), message);
            jetstream.consume_outcomes(&node_name, handle).await
        }
    };
    tokio::task::spawn_local(consumer);
    tracing::info!(node = %node_name, applied = target.max(applied), "following the index log and the outcome stream");
    if settings.jetstream.shared_dispatch {
        share_dispatch(settings, gateway, actors, store).await?;
    }
    Ok(replication)
}

/// Gives the Dispatcher the cluster's dispatch state and follows the registry
/// and approvals buckets into this node; returns once the registry is caught up.
async fn share_dispatch(settings: &Settings, gateway: &Gateway, actors: &Actors, store: &Store) -> anyhow::Result<()> {
    let buckets = DispatchBuckets::open(gateway.client(), &settings.jetstream, settings.dispatch.rate_window_ms)
        .await
        .context("cannot open the key-value buckets of the dispatch state")?;
    // A node that ran alone offers what only it knows, create-only: the cluster's copy wins.
    let mut offered = Vec::new();
    for record in store.capability_records()? {
        offered.push(buckets.publish_record(&record, true).await.map(|_| ()));
    }
    for binding in store.bindings()? {
        offered.push(buckets.publish_binding(&binding, true).await.map(|_| ()));
    }
    for approval in store.approvals()? {
        offered.push(buckets.put_approval(&approval, None).await.map(|_| ()));
    }
    if let Some(Err(err)) = offered.into_iter().find(Result::is_err) {
        tracing::warn!(%err, "this node's dispatch state was not all offered to the cluster");
    }
    let shared: Arc<dyn SharedDispatch + Send + Sync> = Arc::new(buckets.clone());
    actors.dispatcher.send(SetShared(shared)).await.context("the Dispatcher stopped")?;

    let target = buckets.registry.last_revision().await?;
    let (applied_tx, mut applied_rx) = tokio::sync::watch::channel(0u64);
    let registry = buckets.registry.clone();
    let dispatcher = actors.dispatcher.clone();
    tokio::task::spawn_local(async move {
        registry
            .follow(|change| {
                let dispatcher = dispatcher.clone();
                let applied_tx = applied_tx.clone();
                async move {
                    if let Some(change) = registry_change(&change) {
                        let _ = dispatcher.send(ApplyRegistryChange(change)).await;
                    }
                    let _ = applied_tx.send(change.revision);
                }
            })
            .await
    });
    let approvals = buckets.approvals.clone();
    let dispatcher = actors.dispatcher.clone();
    tokio::task::spawn_local(async move {
        approvals
            .follow(|change| {
                let dispatcher = dispatcher.clone();
                async move {
                    if let Some(approval) = approval_change(&change) {
                        let _ = dispatcher.send(ApplyApproval(approval)).await;
                    }
                }
            })
            .await
    });
    // Their ages are JetStream's; their counts, and the gauges, capdex's.
    let (swept, every) = (buckets.clone(), Duration::from_millis(settings.retention.sweep_interval_ms));
    let (approvals, redrive) = (settings.jetstream.approvals_max_count, settings.jetstream.redrive_max_count);
    tokio::task::spawn_local(async move { keep_swept(every, || swept.sweep(epoch_ms(), approvals, redrive)).await });
    if target > 0 {
        let caught_up = tokio::time::timeout(CATCH_UP_LIMIT, applied_rx.wait_for(|revision| *revision >= target)).await;
        if caught_up.is_err() {
            tracing::warn!(target, "not caught up with the registry bucket within {CATCH_UP_LIMIT:?}; serving anyway");
        }
    }
    tracing::info!(registry = target, "dispatch state shared through the key-value buckets");
    Ok(())
}

/// Applies a batch of index log messages in order, as one change of the
/// index; answers each one's reply (a malformed message gets its error).
async fn apply_mutations(
    indexer: &actix::Addr<crate::actors::indexer::Indexer>,
    messages: &[StreamMessage],
    max_id_bytes: usize,
) -> Vec<Result<RegistrationReply, ApiError>> {
    let mut decoded = Vec::with_capacity(messages.len());
    let mut mutations = Vec::new();
    for message in messages {
        match serde_json::from_slice::<IndexMutation>(&message.payload) {
            Ok(IndexMutation::Upsert { payload }) => {
                mutations.push(Mutation::Upsert(payload));
                decoded.push(None);
            }
            Ok(IndexMutation::Remove { request }) => {
                mutations.push(Mutation::Remove(request));
                decoded.push(None);
            }
            Err(err) => decoded.push(Some(Err(ApiError::bad_request(format!("malformed index mutation: {err}"))))),
        }
    }
    let mut applied = apply_batch(indexer.clone(), mutations, max_id_bytes).await.into_iter();
    decoded.into_iter().map(|reply| reply.unwrap_or_else(|| applied.next().expect("one reply per mutation"))).collect()
}

/// Records one outcome from the stream; see the module docs for why it is counted once.
async fn ingest_outcome(
    kpi: actix::Addr<KpiTelemetry>,
    store: Store,
    jetstream: JetStream,
    subjects: Subjects,
    message: StreamMessage,
) -> Disposition {
    let outcome_id = message.message_id.clone().unwrap_or_else(|| format!("seq-{}", message.sequence));
    match store.outcome_processed(&outcome_id) {
        Ok(true) => {
            metrics::counter!("capdex_outcomes_redelivered_total").increment(1);
            return Disposition::Ack;
        }
        Ok(false) => {}
        Err(err) => {
            tracing::warn!(%err, %outcome_id, "cannot check an outcome; it will come again");
            return Disposition::Retry;
        }
    }
    let decoded: Result<OutcomeReport, String> = serde_json::from_slice(&message.payload)
        .map_err(|err| err.to_string())
        .or_else(|json_err| rmp_serde::from_slice(&message.payload).map_err(|_| json_err));
    let mut report = match decoded {
        Ok(report) => report,
        Err(err) => {
            metrics::counter!("capdex_outcomes_refused_total", "reason" => "malformed").increment(1);
            tracing::warn!(%outcome_id, %err, "malformed outcome on the stream dropped");
            return Disposition::Ack;
        }
    };
    if report.turn_id.is_none() {
        report.turn_id = Some(outcome_id.clone());
    }
    // The stream's timestamp, not this node's clock: every node then sees the
    // same times (cooldowns, horizon), so all make the same KPI and alert events.
    let at_ms = if message.published_ms > 0 { message.published_ms } else { epoch_ms() };
    let sequence = message.sequence;
    let record = RecordStreamOutcome { report, at_ms, outcome_id: outcome_id.clone(), sequence };
    let recorded = match kpi.send(record).await {
        Ok(recorded) => recorded,
        Err(err) => {
            tracing::warn!(%err, %outcome_id, "the KPI actor is unavailable; the outcome will come again");
            return Disposition::Retry;
        }
    };
    // The processed id is queued with the sample's writes and lands after them
    // in the same group-commit round: sled recovers a prefix of its log, so the
    // id is never durable without the sample (were it, a crash between the two
    // would make the redelivery look processed and the outcome would be lost).
    // One flush makes both durable; the ack waits for it.
    let recorded = match recorded {
        Ok(recorded) => recorded.once_durable().await,
        Err(err) => Err(err),
    };
    let update = match recorded {
        Ok(update) => update,
        Err(KpiError::Outcome(problem)) => {
            metrics::counter!("capdex_outcomes_refused_total", "reason" => "invalid").increment(1);
            tracing::warn!(%outcome_id, %problem, "invalid outcome on the stream dropped");
            return Disposition::Ack;
        }
        Err(err) => {
            tracing::warn!(%err, %outcome_id, "outcome not recorded; it will come again");
            return Disposition::Retry;
        }
    };
    // Every node records this outcome; its events are published once (the
    // events stream keeps the first copy of each id, made of the sequence).
    if !update.duplicate {
        let subject = subjects.js_event(&subjects.kpi(&update.kpi.scope_key));
        jetstream.publish_event_once(subject, &format!("kpi-{}", message.sequence), &update.kpi).await;
    }
    if let Some(alert) = &update.alert {
        let subject = subjects.js_event(&subjects.alert(&alert.severity, &alert.scope_key));
        jetstream.publish_event_once(subject, &format!("alert-{}", message.sequence), alert).await;
    }
    Disposition::Ack
}

/// A name unlikely to repeat: nanoseconds since the epoch and the process id, in hex.
fn generated_name() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}{:x}", nanos as u64, std::process::id())
}
