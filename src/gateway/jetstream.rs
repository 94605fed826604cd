//! JetStream: the index mutation log and the outcome stream that let several
//! capdex nodes on one NATS share state.
//!
//! - The index log (stream `jetstream.index_stream`, subject `<prefix>.js.index`,
//!   file storage, limits retention): every node appends the upserts and removals
//!   its clients ask for, and every node follows the whole log in order with an
//!   ordered consumer, starting after the last sequence it applied.
//! - The outcome stream (stream `jetstream.outcome_stream`, subject
//!   `<prefix>.js.outcome`): runtimes publish outcomes with JetStream; every node
//!   reads them through its own durable pull consumer and acknowledges each
//!   one only after its handler says it is durable.
//!
//! This module moves bytes; what a message means is decided by the caller
//! (`app.rs`), so the gateway stays ignorant of actors and the store.

use crate::config::JetStreamSettings;
use crate::gateway::patience::{self, Setback};
use crate::gateway::subjects::Subjects;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;
use std::future::Future;
use std::time::Duration;

/// The header that carries a message's id (JetStream deduplicates on it).
pub const MESSAGE_ID_HEADER: &str = "Nats-Msg-Id";

/// The most index mutations applied as one batch (one index build).
pub const INDEX_BATCH: usize = 512;
/// How long to wait before following a stream again after its subscription failed.
const RESUBSCRIBE_BACKOFF: Duration = Duration::from_millis(500);
/// How long the server waits for an outcome's ack before delivering it again.
const OUTCOME_ACK_WAIT: Duration = Duration::from_secs(5);

/// A JetStream operation that failed, naming what was attempted.
#[derive(Debug, thiserror::Error)]
pub enum JetStreamError {
    #[error("JetStream is not available: {0}")]
    Unavailable(String),
    #[error("failed to create or open stream {stream}: {message}")]
    Stream { stream: String, message: String },
    #[error("failed to create consumer {consumer} on stream {stream}: {message}")]
    Consumer { stream: String, consumer: String, message: String },
    #[error("failed to read messages of stream {stream}: {message}")]
    Messages { stream: String, message: String },
    #[error("failed to publish to {subject}: {message}")]
    Publish { subject: String, message: String },
}

/// A failed opening step, to be tried again.
fn not_yet(err: impl std::fmt::Display) -> Setback<String> {
    Setback::NotYet(err.to_string())
}

/// One entry of the index log: a client's upsert or removal, exactly as it was
/// requested; every node normalises and applies it the same way.
#[derive(Clone, Debug, serde::Deserialize, Serialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum IndexMutation {
    Upsert { payload: crate::core::registration::RegistrationPayload },
    Remove { request: crate::gateway::wire::RemoveRequest },
}

/// One message read from a stream.
#[derive(Clone, Debug)]
pub struct StreamMessage {
    /// Its stream sequence.
    pub sequence: u64,
    /// When JetStream stored it, in milliseconds since the epoch: the same on every node.
    pub published_ms: u64,
    /// Its `Nats-Msg-Id`, when the publisher gave one.
    pub message_id: Option<String>,
    pub payload: Bytes,
}

/// What to do with an outcome message once its handler is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Recorded (or refused for good): acknowledge, so it is not delivered again.
    Ack,
    /// Not recorded this time (e.g. a store error): deliver it again later.
    Retry,
}

/// Events kept per events stream (the oldest go first); they only need to
/// outlive the duplicate window.
const EVENTS_STREAM_MAX_MESSAGES: i64 = 100_000;

/// The streams, on one NATS connection. Cheap to clone.
#[derive(Clone)]
pub struct JetStream {
    context: jetstream::Context,
    client: async_nats::Client,
    settings: JetStreamSettings,
    index_subject: String,
    outcome_subject: String,
}

impl JetStream {
    /// Creates the two streams if they do not exist (an existing stream is
    /// used as it is) and returns a handle on them.
    pub async fn open(
        client: async_nats::Client,
        settings: &JetStreamSettings,
        subjects: &Subjects,
    ) -> Result<JetStream, JetStreamError> {
        let context = jetstream::new(client.clone());
        let patience = Duration::from_millis(settings.open_timeout_ms);
        patience::wait_for_jetstream(&context, patience).await.map_err(JetStreamError::Unavailable)?;
        let js = JetStream {
            context,
            client,
            settings: settings.clone(),
            index_subject: subjects.js_index(),
            outcome_subject: subjects.js_outcome(),
        };
        js.ensure_stream(&settings.index_stream, &js.index_subject, settings.index_max_age_ms, settings.index_max_msgs)
            .await?;
        js.ensure_stream(
            &settings.outcome_stream,
            &js.outcome_subject,
            settings.outcome_max_age_ms,
            settings.outcome_max_msgs,
        )
        .await?;
        let prefix = subjects.prefix();
        for (suffix, kind) in [("KPI", "kpi.*"), ("ALERTS", "alert.*.*")] {
            let name = format!("{}_{suffix}", settings.events_stream);
            js.ensure_events_stream(&name, &format!("{prefix}.js.events.{kind}"), &format!("{prefix}.{kind}")).await?;
        }
        Ok(js)
    }

    /// A stream in memory that keeps the first copy of each event (by
    /// `Nats-Msg-Id`, within the duplicate window) and republishes it on
    /// `destination`: the subject with the `js.events` tokens taken out, so
    /// the two never overlap (the server refuses a republish cycle).
    async fn ensure_events_stream(&self, name: &str, subject: &str, destination: &str) -> Result<(), JetStreamError> {
        let wildcards = destination.split('.').filter(|token| *token == "*").count();
        let mut mapped = destination.to_string();
        for index in 1..=wildcards {
            mapped = mapped.replacen('*', &format!("{{{{wildcard({index})}}}}"), 1);
        }
        let window = Duration::from_millis(self.settings.duplicate_window_ms);
        let config = stream::Config {
            name: name.to_string(),
            subjects: vec![subject.to_string()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::Memory,
            max_age: window * 2,
            max_messages: EVENTS_STREAM_MAX_MESSAGES,
            discard: stream::DiscardPolicy::Old,
            num_replicas: self.settings.replicas,
            duplicate_window: window,
            republish: Some(stream::Republish {
                source: subject.to_string(),
                destination: mapped,
                headers_only: false,
            }),
            ..Default::default()
        };
        self.create_stream(config).await
    }

    /// A file stream keeping messages for `max_age_ms` and at most `max_msgs`
    /// (0: no limit; the oldest go first). A stream that exists with other
    /// limits gets these, so a changed setting applies on the next start.
    async fn ensure_stream(
        &self,
        name: &str,
        subject: &str,
        max_age_ms: u64,
        max_msgs: u64,
    ) -> Result<(), JetStreamError> {
        let config = stream::Config {
            name: name.to_string(),
            subjects: vec![subject.to_string()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            max_age: Duration::from_millis(max_age_ms),
            max_messages: if max_msgs == 0 { -1 } else { i64::try_from(max_msgs).unwrap_or(i64::MAX) },
            discard: stream::DiscardPolicy::Old,
            num_replicas: self.settings.replicas,
            duplicate_window: Duration::from_millis(self.settings.duplicate_window_ms),
            ..Default::default()
        };
        self.create_stream(config.clone()).await?;
        let held = self
            .patiently(name, || async {
                let mut stream = self.context.get_stream(name).await.map_err(not_yet)?;
                stream.info().await.map(|info| info.config.clone()).map_err(not_yet)
            })
            .await?;
        if held.max_age != config.max_age || held.max_messages != config.max_messages {
            let mut limited = held;
            (limited.max_age, limited.max_messages) = (config.max_age, config.max_messages);
            self.patiently(name, || async {
                self.context.update_stream(limited.clone()).await.map(drop).map_err(not_yet)
            })
            .await?;
        }
        Ok(())
    }

    /// Creates the stream `config` describes unless it exists (an existing one
    /// is used as it is), waiting while a cluster is not ready or places a
    /// replicated stream that other nodes are creating at the same time
    /// (`jetstream.open_timeout_ms`, [`patience::until_ready`]).
    async fn create_stream(&self, config: stream::Config) -> Result<(), JetStreamError> {
        self.patiently(&config.name, || async {
            self.context.get_or_create_stream(config.clone()).await.map(drop).map_err(|err| {
                let refused = match err.kind() {
                    jetstream::context::CreateStreamErrorKind::JetStream(api) => patience::is_refusal(api.error_code()),
                    _ => false,
                };
                if refused {
                    Setback::Final(err.to_string())
                } else {
                    not_yet(err)
                }
            })
        })
        .await
    }

    /// Runs one step of opening stream `name` until it succeeds, fails for
    /// good, or `jetstream.open_timeout_ms` has passed (JetStream itself was
    /// found when the node connected, so a failure is taken for a cluster not
    /// ready yet unless the step says otherwise).
    async fn patiently<T, Fut>(&self, name: &str, step: impl FnMut() -> Fut) -> Result<T, JetStreamError>
    where
        Fut: Future<Output = Result<T, Setback<String>>>,
    {
        let patience = Duration::from_millis(self.settings.open_timeout_ms);
        patience::until_ready(name, patience, step)
            .await
            .map_err(|message| JetStreamError::Stream { stream: name.to_string(), message })
    }

    /// Appends an index mutation and returns its stream sequence once
    /// JetStream has stored it.
    pub async fn publish_index(&self, message_id: &str, payload: Vec<u8>) -> Result<u64, JetStreamError> {
        let subject = &self.index_subject;
        let failed = |message: String| JetStreamError::Publish { subject: subject.clone(), message };
        let publish = jetstream::message::PublishMessage::build().payload(payload.into()).message_id(message_id);
        let ack = self
            .context
            .send_publish(subject.clone(), publish)
            .await
            .map_err(|err| failed(err.to_string()))?
            .await
            .map_err(|err| failed(err.to_string()))?;
        Ok(ack.sequence)
    }

    /// Returns the index log's last sequence (0 when it is empty).
    pub async fn index_last_sequence(&self) -> Result<u64, JetStreamError> {
        let stream_err =
            |message: String| JetStreamError::Stream { stream: self.settings.index_stream.clone(), message };
        let stream =
            self.context.get_stream(&self.settings.index_stream).await.map_err(|e| stream_err(e.to_string()))?;
        let info = stream.get_info().await.map_err(|e| stream_err(e.to_string()))?;
        Ok(info.state.last_sequence)
    }

    /// Follows the index log from the message after `after_sequence`, in
    /// order, calling `apply` on each batch of messages (those already
    /// delivered, at most [`INDEX_BATCH`]: one while the log is quiet, many
    /// while a node catches up) and waiting for it before the next. Runs until
    /// the connection is gone for good; a broken subscription is resumed after
    /// the last message given to `apply`.
    pub async fn follow_index<F, Fut>(&self, after_sequence: u64, mut apply: F)
    where
        F: FnMut(Vec<StreamMessage>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut last = after_sequence;
        loop {
            match self.index_messages(last).await {
                Ok(messages) => {
                    let mut batches = messages.ready_chunks(INDEX_BATCH);
                    'read: while let Some(batch) = batches.next().await {
                        let mut read = Vec::with_capacity(batch.len());
                        let mut failed = None;
                        for next in batch {
                            match next {
                                Ok(message) => {
                                    let Some(message) = stream_message(&message) else { continue };
                                    if message.sequence > last {
                                        last = message.sequence;
                                        read.push(message);
                                    }
                                }
                                Err(err) => {
                                    failed = Some(err);
                                    break;
                                }
                            }
                        }
                        if !read.is_empty() {
                            apply(read).await;
                        }
                        if let Some(err) = failed {
                            tracing::warn!(%err, stream = %self.settings.index_stream, "index log read failed");
                            break 'read;
                        }
                    }
                }
                Err(err) => tracing::warn!(%err, "cannot follow the index log"),
            }
            tokio::time::sleep(RESUBSCRIBE_BACKOFF).await;
        }
    }

    async fn index_messages(&self, after_sequence: u64) -> Result<consumer::pull::Ordered, JetStreamError> {
        let name = &self.settings.index_stream;
        let stream = self
            .context
            .get_stream(name)
            .await
            .map_err(|err| JetStreamError::Stream { stream: name.clone(), message: err.to_string() })?;
        let deliver_policy = if after_sequence == 0 {
            consumer::DeliverPolicy::All
        } else {
            consumer::DeliverPolicy::ByStartSequence { start_sequence: after_sequence + 1 }
        };
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: self.index_subject.clone(),
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|err| JetStreamError::Consumer {
                stream: name.clone(),
                consumer: "(ordered)".into(),
                message: err.to_string(),
            })?;
        consumer
            .messages()
            .await
            .map_err(|err| JetStreamError::Messages { stream: name.clone(), message: err.to_string() })
    }

    /// Reads the outcome stream through this node's durable consumer
    /// `<outcome_consumer>-<node_name>`, up to `outcome_max_in_flight` messages
    /// at once, acknowledging each as `handle` says. Runs until the connection
    /// is gone for good. Unacknowledged messages are delivered again (to this
    /// node, after a restart or after the ack wait).
    pub async fn consume_outcomes<F, Fut>(&self, node_name: &str, handle: F)
    where
        F: Fn(StreamMessage) -> Fut,
        Fut: Future<Output = Disposition>,
    {
        let durable = format!("{}-{node_name}", self.settings.outcome_consumer);
        loop {
            match self.outcome_messages(&durable).await {
                Ok(messages) => {
                    let mut failed = None;
                    messages
                        .take_while(|next| {
                            let ok = next.is_ok();
                            if let Err(err) = next {
                                failed = Some(err.to_string());
                            }
                            std::future::ready(ok)
                        })
                        .for_each_concurrent(self.settings.outcome_max_in_flight, |next| {
                            let handle = &handle;
                            async move {
                                let Ok(message) = next else { return };
                                let Some(read) = stream_message(&message) else { return };
                                let sequence = read.sequence;
                                let sent = match handle(read).await {
                                    Disposition::Ack => message.ack().await,
                                    Disposition::Retry => {
                                        message.ack_with(jetstream::AckKind::Nak(Some(RESUBSCRIBE_BACKOFF))).await
                                    }
                                };
                                if let Err(err) = sent {
                                    tracing::warn!(%err, sequence, "failed to acknowledge an outcome");
                                }
                            }
                        })
                        .await;
                    if let Some(err) = failed {
                        tracing::warn!(%err, consumer = %durable, "outcome stream read failed");
                    }
                }
                Err(err) => tracing::warn!(%err, "cannot read the outcome stream"),
            }
            tokio::time::sleep(RESUBSCRIBE_BACKOFF).await;
        }
    }

    async fn outcome_messages(&self, durable: &str) -> Result<consumer::pull::Stream, JetStreamError> {
        let name = &self.settings.outcome_stream;
        let stream = self
            .context
            .get_stream(name)
            .await
            .map_err(|err| JetStreamError::Stream { stream: name.clone(), message: err.to_string() })?;
        let consumer_err =
            |message: String| JetStreamError::Consumer { stream: name.clone(), consumer: durable.to_string(), message };
        let consumer: consumer::PullConsumer = stream
            .get_or_create_consumer(
                durable,
                consumer::pull::Config {
                    durable_name: Some(durable.to_string()),
                    filter_subject: self.outcome_subject.clone(),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: OUTCOME_ACK_WAIT,
                    max_ack_pending: self.settings.outcome_max_in_flight as i64 * 2,
                    ..Default::default()
                },
            )
            .await
            .map_err(|err| consumer_err(err.to_string()))?;
        consumer
            .stream()
            .max_messages_per_batch(self.settings.outcome_max_in_flight.min(1000))
            .messages()
            .await
            .map_err(|err| JetStreamError::Messages { stream: name.clone(), message: err.to_string() })
    }

    /// Publishes `event` once across nodes: as JSON to the events stream on
    /// `stream_subject` (`Subjects::js_event`) with `message_id`, which every
    /// node derives alike for one event; JetStream keeps the first copy and
    /// republishes it on the event's own subject. Logs a failure.
    pub async fn publish_event_once<T: Serialize>(&self, stream_subject: String, message_id: &str, event: &T) {
        match serde_json::to_vec(event) {
            Ok(body) => {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", message_id);
                if let Err(err) = self.client.publish_with_headers(stream_subject.clone(), headers, body.into()).await {
                    tracing::warn!(subject = %stream_subject, %err, "failed to publish an event");
                }
            }
            Err(err) => tracing::warn!(subject = %stream_subject, %err, "failed to encode an event"),
        }
    }

    /// Publishes `event` as JSON on `subject` (core NATS), logging a failure.
    pub async fn publish_event<T: Serialize>(&self, subject: String, event: &T) {
        match serde_json::to_vec(event) {
            Ok(body) => {
                if let Err(err) = self.client.publish(subject.clone(), body.into()).await {
                    tracing::warn!(%subject, %err, "failed to publish an event");
                }
            }
            Err(err) => tracing::warn!(%subject, %err, "failed to encode an event"),
        }
    }
}

fn stream_message(message: &jetstream::Message) -> Option<StreamMessage> {
    let (sequence, published_ms) = match message.info() {
        Ok(info) => (info.stream_sequence, (info.published.unix_timestamp_nanos() / 1_000_000).max(0) as u64),
        Err(err) => {
            tracing::warn!(%err, subject = %message.subject, "a JetStream message without metadata was skipped");
            return None;
        }
    };
    let message_id = message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(MESSAGE_ID_HEADER))
        .map(|value| value.as_str().to_string());
    Some(StreamMessage { sequence, published_ms, message_id, payload: message.payload.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_mutations_keep_the_request_as_sent() {
        let upsert: IndexMutation = serde_json::from_str(
            r#"{"op": "upsert", "payload": {"runtimeId": "agent-1", "tools": [{"name": "x", "description": "y"}]}}"#,
        )
        .unwrap();
        let IndexMutation::Upsert { payload } = &upsert else { panic!("{upsert:?}") };
        assert_eq!(payload.runtime_id.as_deref(), Some("agent-1"));
        let text = serde_json::to_string(&upsert).unwrap();
        assert!(text.starts_with(r#"{"op":"upsert","payload":{"runtimeId":"agent-1""#), "{text}");
        let remove: IndexMutation =
            serde_json::from_str(r#"{"op": "remove", "request": {"runtimeId": "a", "ids": ["tool:x"]}}"#).unwrap();
        assert!(matches!(remove, IndexMutation::Remove { request } if request.ids == ["tool:x"]));
        assert!(serde_json::from_str::<IndexMutation>(r#"{"op": "drop", "request": {}}"#).is_err());
    }
}
