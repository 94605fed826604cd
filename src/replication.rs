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

use crate::actors::kpi::{KpiError, KpiTelemetry, RecordStreamOutcome};
use crate::actors::Actors;
use crate::clock::epoch_ms;
use crate::config::Settings;
use crate::core::kpi_window::OutcomeReport;
use crate::gateway::jetstream::{Disposition, IndexMutation, JetStream, StreamMessage};
use crate::gateway::service::Gateway;
use crate::gateway::subjects::Subjects;
use crate::gateway::wire::{ApiError, RegistrationReply};
use crate::registration::{apply_remove, apply_upsert};
use crate::store::Store;
use anyhow::Context as _;
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
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
    let follower = {
        let (replication, store, indexer) = (replication.clone(), store.clone(), actors.indexer.clone());
        async move {
            replication
                .jetstream
                .follow_index(applied, |message| {
                    let (replication, store, indexer) = (replication.clone(), store.clone(), indexer.clone());
                    let applied_tx = applied_tx.clone();
                    async move {
                        let sequence = message.sequence;
                        let reply = apply_mutation(&indexer, &message).await;
                        if let Err(err) = &reply {
                            tracing::warn!(sequence, code = %err.code(), message = %err.message, "index mutation not applied");
                        }
                        if let Err(err) = store.set_applied_index_sequence(sequence) {
                            tracing::error!(%err, sequence, "failed to store the applied index sequence");
                        }
                        replication.resolve(message.message_id.as_deref(), reply);
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
    Ok(replication)
}

async fn apply_mutation(
    indexer: &actix::Addr<crate::actors::indexer::Indexer>,
    message: &StreamMessage,
) -> Result<RegistrationReply, ApiError> {
    let mutation: IndexMutation = serde_json::from_slice(&message.payload)
        .map_err(|err| ApiError::bad_request(format!("malformed index mutation: {err}")))?;
    match mutation {
        IndexMutation::Upsert { payload } => apply_upsert(indexer.clone(), payload).await,
        IndexMutation::Remove { request } => apply_remove(indexer.clone(), request).await,
    }
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
