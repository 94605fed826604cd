//! JetStream key-value buckets: the state several nodes share besides the
//! streams of `jetstream.rs` (dispatch registry and bindings, approvals,
//! re-drive claims, rate windows, SCG sources and memory, live source
//! definitions). Each bucket is the truth for its state; a node's sled trees
//! are its local materialisation of it.
//!
//! A [`Bucket`] moves bytes under keys: get with the revision, create-only
//! writes, writes that expect a revision (compare-and-swap), deletes, and
//! [`Bucket::follow`], which gives every key's current value and then each
//! change, in order, resuming after a broken watch. Keys are made of
//! [`key_token`]s, so any id (a slug, an agent id) is a valid key. What a value
//! means is decided by the caller.

use crate::core::dispatch::approval::Approval;
use crate::core::dispatch::redrive::{CacheEntry, Claim};
use crate::core::dispatch::registry::{Binding, CapabilityRecord};
use crate::core::dispatch::shared::{
    self, RegistryChange, Settled, SharedDispatch, SharedError, SharedFuture, SlotCounts,
};
use crate::core::retention::{approval_record, redrive_record, Limits, Record, StoreSize, Swept};
use crate::gateway::patience::{self, Setback};
use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures::StreamExt;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How many times an operation is tried before it fails: enough to ride over
/// a stream leader's election after a server of the cluster went away, and a
/// restarted server's replica catching up ([`backoff`] waits 0.1 + 0.2 + 0.4 +
/// 0.8 + 1.6 + 1.6 s between the seven).
const ATTEMPTS: u32 = 7;
/// The header JetStream marks a deleted or purged key with.
const KV_OPERATION: &str = "KV-Operation";

/// The wait after the `attempt`-th failed try (1-based): 0.1, 0.2, 0.4, 0.8, then 1.6 s.
fn backoff(attempt: u32) -> Duration {
    patience::backoff(attempt.saturating_sub(1))
}

/// How long to wait before watching a bucket again after its watch failed.
const REWATCH_BACKOFF: Duration = Duration::from_millis(500);

/// How long a count sweep waits for the next entry of its read before it
/// stops (the rest waits for the next sweep).
const SWEEP_READ_WAIT: Duration = Duration::from_secs(5);

/// A key-value operation that failed, naming the bucket (and key).
#[derive(Debug, Clone, thiserror::Error)]
pub enum KvError {
    #[error("failed to create or open key-value bucket {bucket}: {message}")]
    Open { bucket: String, message: String },
    #[error("key-value bucket {bucket} failed on key {key}: {message}")]
    Operation { bucket: String, key: String, message: String },
}

/// How a bucket is made when it does not exist yet (an existing one is used as it is).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketSpec {
    pub name: String,
    /// Replicas of its stream (1..5; more than 1 needs a JetStream cluster).
    pub replicas: usize,
    /// How long a value is kept after its last write; zero keeps it.
    pub max_age: Duration,
    pub description: String,
    /// How long opening it waits while the JetStream cluster is not ready
    /// (`jetstream.open_timeout_ms`, `gateway::patience`).
    pub patience: Duration,
}

/// A value and the revision it was written at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub value: Bytes,
    pub revision: u64,
}

/// What a write expects to find under its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Nothing (create-only).
    Absent,
    /// The value written at this revision (compare-and-swap).
    Revision(u64),
    /// Anything.
    Any,
}

/// One change read by [`Bucket::follow`]: a value written, or a key deleted (`value: None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub key: String,
    pub value: Option<Bytes>,
    pub revision: u64,
    /// How many changes the watch knew were still to come when it read this
    /// one: 0 means this node has caught up with the bucket as it was.
    pub pending: u64,
}

/// A key-value bucket on one NATS connection. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Bucket {
    store: kv::Store,
    name: String,
}

/// A string as a key token: ASCII letters, digits, `-` and `_` stay, every
/// other byte becomes `=XX` (its hex), so distinct strings give distinct
/// tokens and every token is a valid key part (never empty, no `.`).
pub fn key_token(text: &str) -> String {
    if text.is_empty() {
        return "=".into();
    }
    let mut token = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
            token.push(byte as char);
        } else {
            token.push_str(&format!("={byte:02X}"));
        }
    }
    token
}

/// Reverses [`key_token`]; `None` for a token it cannot have made.
pub fn from_key_token(token: &str) -> Option<String> {
    if token == "=" {
        return Some(String::new());
    }
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'=' {
            let hex = token.get(at + 1..at + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl Bucket {
    /// Opens the bucket `spec` names, creating it if it does not exist; tried
    /// again over a failover, or while another node is creating it (a
    /// replicated bucket exists only once its replicas are placed).
    pub async fn open(client: &async_nats::Client, spec: &BucketSpec) -> Result<Bucket, KvError> {
        let context = jetstream::new(client.clone());
        let failed = |message| KvError::Open { bucket: spec.name.clone(), message };
        patience::wait_for_jetstream(&context, spec.patience).await.map_err(failed)?;
        let store = patience::until_ready(&spec.name, spec.patience, || async {
            Bucket::open_once(&context, spec).await.map_err(Setback::NotYet)
        })
        .await
        .map_err(failed)?;
        Ok(Bucket { store, name: spec.name.clone() })
    }

    async fn open_once(context: &jetstream::Context, spec: &BucketSpec) -> Result<kv::Store, String> {
        if let Ok(store) = context.get_key_value(&spec.name).await {
            return Ok(store);
        }
        let config = kv::Config {
            bucket: spec.name.clone(),
            description: spec.description.clone(),
            history: 1,
            max_age: spec.max_age,
            storage: stream::StorageType::File,
            num_replicas: spec.replicas,
            ..Default::default()
        };
        match context.create_key_value(config).await {
            Ok(store) => Ok(store),
            // Another node created it meanwhile.
            Err(create_err) => context.get_key_value(&spec.name).await.map_err(|_| create_err.to_string()),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn failed(&self, key: &str, err: impl std::fmt::Display) -> KvError {
        KvError::Operation { bucket: self.name.clone(), key: key.to_string(), message: err.to_string() }
    }

    /// The value under `key` and its revision; `None` when absent or deleted.
    /// Read from the stream's leader, not from any replica (a direct get may be
    /// answered by a replica still recovering after its server restarted), and
    /// tried again over a failover ([`ATTEMPTS`]).
    pub async fn get(&self, key: &str) -> Result<Option<Versioned>, KvError> {
        let subject = format!("{}{key}", self.store.prefix);
        let mut attempt = 0;
        loop {
            match self.store.stream.get_last_raw_message_by_subject(&subject).await {
                Ok(message) => {
                    let deleted = message
                        .headers
                        .get(KV_OPERATION)
                        .is_some_and(|operation| operation.as_str() == "DEL" || operation.as_str() == "PURGE");
                    return Ok((!deleted).then_some(Versioned { value: message.payload, revision: message.sequence }));
                }
                Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
                Err(err) => {
                    attempt += 1;
                    if attempt >= ATTEMPTS {
                        return Err(self.failed(key, err));
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                }
            }
        }
    }

    /// Writes `value` under `key` if it holds what `expect` says. Answers the
    /// new revision, or `None` when the key held something else (the write was
    /// not made). A write that failed in transit is tried again over a
    /// failover; should the retry find the key taken, and taken by this very
    /// value (the first attempt landed, its answer was lost), it succeeded.
    pub async fn write(&self, key: &str, value: Bytes, expect: Expect) -> Result<Option<u64>, KvError> {
        let mut attempt = 0;
        loop {
            let written = match expect {
                Expect::Any => self.store.put(key, value.clone()).await.map(Some).map_err(|err| err.to_string()),
                Expect::Absent => match self.store.create(key, value.clone()).await {
                    Ok(revision) => Ok(Some(revision)),
                    Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => Ok(None),
                    Err(err) => Err(err.to_string()),
                },
                Expect::Revision(revision) => match self.store.update(key, value.clone(), revision).await {
                    Ok(revision) => Ok(Some(revision)),
                    Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
                    Err(err) => Err(err.to_string()),
                },
            };
            match written {
                Ok(None) if attempt > 0 => {
                    return Ok(self.get(key).await?.filter(|held| held.value == value).map(|held| held.revision));
                }
                Ok(done) => return Ok(done),
                Err(err) => {
                    attempt += 1;
                    if attempt >= ATTEMPTS {
                        return Err(self.failed(key, err));
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                }
            }
        }
    }

    /// Deletes `key` (deleting an absent key is not an error), tried again over a failover.
    pub async fn delete(&self, key: &str) -> Result<(), KvError> {
        let mut attempt = 0;
        loop {
            match self.store.delete(key).await {
                Ok(()) => return Ok(()),
                Err(err) => {
                    attempt += 1;
                    if attempt >= ATTEMPTS {
                        return Err(self.failed(key, err));
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                }
            }
        }
    }

    /// Waits until `key` changes after `revision`, or `within` passes:
    /// answers its value then (`None` when deleted), or `Err(())` on timeout
    /// carried as `Ok(Err(()))`.
    pub async fn wait_change(
        &self,
        key: &str,
        revision: u64,
        within: Duration,
    ) -> Result<Result<Option<Versioned>, ()>, KvError> {
        let wait = async {
            let mut watch = self.store.watch(key).await.map_err(|err| self.failed(key, err))?;
            // The watch starts at the key's last value: check it first, so a
            // change made before the watch began is not missed.
            if let Some(current) = self.get(key).await? {
                if current.revision != revision {
                    return Ok(Some(current));
                }
            } else {
                return Ok(None);
            }
            while let Some(next) = watch.next().await {
                let entry = next.map_err(|err| self.failed(key, err))?;
                if entry.revision == revision {
                    continue;
                }
                return Ok(match entry.operation {
                    Operation::Put => Some(Versioned { value: entry.value, revision: entry.revision }),
                    Operation::Delete | Operation::Purge => None,
                });
            }
            Err(self.failed(key, "the watch ended"))
        };
        match tokio::time::timeout(within, wait).await {
            Ok(changed) => changed.map(Ok),
            Err(_) => Ok(Err(())),
        }
    }

    /// Every key's current value, then every change, in order: `apply` is
    /// awaited for each before the next. Runs until the connection is gone for
    /// good; a broken watch is resumed after the last revision given to `apply`
    /// (so nothing is skipped and nothing given twice).
    pub async fn follow<F, Fut>(&self, mut apply: F)
    where
        F: FnMut(Change) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut last = 0;
        loop {
            let watch = if last == 0 {
                self.store.watch_all_from_revision(1).await
            } else {
                self.store.watch_all_from_revision(last + 1).await
            };
            match watch {
                Ok(mut watch) => {
                    while let Some(next) = watch.next().await {
                        match next {
                            Ok(entry) => {
                                if entry.revision <= last {
                                    continue;
                                }
                                last = entry.revision;
                                let value = (entry.operation == Operation::Put).then_some(entry.value);
                                apply(Change { key: entry.key, value, revision: entry.revision, pending: entry.delta })
                                    .await;
                            }
                            Err(err) => {
                                tracing::warn!(%err, bucket = %self.name, "key-value watch failed");
                                break;
                            }
                        }
                    }
                }
                Err(err) => tracing::warn!(%err, bucket = %self.name, "cannot watch a key-value bucket"),
            }
            tokio::time::sleep(REWATCH_BACKOFF).await;
        }
    }

    /// The bucket's size, as its stream holds it: entries (every key's
    /// value, and the markers of deleted keys) and bytes.
    pub async fn size(&self) -> Result<StoreSize, KvError> {
        let mut stream = self.store.stream.clone();
        let info = stream.info().await.map_err(|err| self.failed("(info)", err))?;
        Ok(StoreSize { entries: info.state.messages, bytes: info.state.bytes })
    }

    /// Keeps the entries of `keys` (`>`: all; a wildcard such as `note.>`)
    /// within `limits`: reads them oldest write first and purges each
    /// deletion marker, and each value `judge` finds older than the age limit
    /// or among the oldest beyond the count, until the bucket holds at most
    /// `max_count` entries (of every key) and the next value is younger than
    /// the age. `judge` gives a value's [`Record`] from its key and bytes; an
    /// exempt one (still needed, or undecodable) is never purged but counts,
    /// so a bucket of such values may stay above the count. Answers what it
    /// purged and the bucket's size after.
    ///
    /// The read stops at the first value it keeps once the count is met: the
    /// rest were written later, so they are younger (a record whose time is its
    /// last write; for others the age is JetStream's own `max_age`). A purge
    /// removes the key's messages up to the revision read and no further,
    /// leaving no marker: a key written again meanwhile (an approval decided, a
    /// claim completed) keeps its new value. Any node may sweep at the same
    /// time; the second purge of a key finds nothing.
    pub async fn sweep(
        &self,
        keys: &str,
        limits: Limits,
        now_ms: u64,
        judge: impl Fn(&str, &[u8]) -> Record,
    ) -> Result<Swept, KvError> {
        let size = self.size().await?;
        let mut excess = if limits.max_count > 0 { size.entries.saturating_sub(limits.max_count as u64) } else { 0 };
        if (excess == 0 && limits.max_age_ms == 0) || size.entries == 0 {
            return Ok(Swept { pruned: 0, size });
        }
        // No key under `keys` (notes in a bucket of sources alone): no watch
        // to wait on for nothing.
        let first = self.store.stream.get_first_raw_message_by_subject(format!("{}{keys}", self.store.prefix), 1).await;
        if first.is_err_and(|err| err.kind() == LastRawMessageErrorKind::NoMessageFound) {
            return Ok(Swept { pruned: 0, size });
        }
        let mut watch = self.store.watch_from_revision(keys, 1).await.map_err(|err| self.failed(keys, err))?;
        let (mut read, mut pruned) = (0, 0);
        while read < size.entries {
            let entry = match tokio::time::timeout(SWEEP_READ_WAIT, watch.next()).await {
                Ok(Some(entry)) => entry.map_err(|err| self.failed(keys, err))?,
                Ok(None) | Err(_) => break,
            };
            read += 1;
            let record = match entry.operation {
                Operation::Put => Some(judge(&entry.key, &entry.value)),
                Operation::Delete | Operation::Purge => None,
            };
            let prune = record.is_none_or(|record| !record.exempt && (excess > 0 || limits.expired(record, now_ms)));
            if prune {
                let subject = format!("{}{}", self.store.prefix, entry.key);
                let purge = self.store.stream.purge().filter(subject).sequence(entry.revision + 1);
                let purged = purge.await.map_err(|err| self.failed(&entry.key, err))?.purged;
                pruned += purged;
                excess = excess.saturating_sub(purged);
            } else if record.is_some_and(|record| !record.exempt) && excess == 0 {
                break;
            }
            if entry.delta == 0 || (excess == 0 && limits.max_age_ms == 0) {
                break;
            }
        }
        Ok(Swept { pruned, size: self.size().await? })
    }

    /// The bucket's last revision (0 when nothing was ever written): a
    /// follower has caught up once it applied a change at or past it.
    pub async fn last_revision(&self) -> Result<u64, KvError> {
        let mut stream = self.store.stream.clone();
        let info = stream.info().await.map_err(|err| self.failed("(info)", err))?;
        Ok(info.state.last_sequence)
    }
}

/// The dispatch state several nodes share, one bucket per kind (values are JSON):
///
/// | bucket (setting) | key | value |
/// |---|---|---|
/// | `registry_bucket` | `cap.<slug>` | a capability record |
/// | `registry_bucket` | `bind.<agentId>.<slug>` | a binding |
/// | `approvals_bucket` | `<approval id>` | an approval |
/// | `redrive_bucket` | `<executionId>.<stepId>[.turn=<n>]` | a re-drive entry (in progress, or the result) |
/// | `rates_bucket` | `<slug>.<agentId>` | the window's admitted calls per slot, `[[slot, count], ...]` |
///
/// Every id is a [`key_token`].
#[derive(Clone, Debug)]
pub struct DispatchBuckets {
    pub registry: Bucket,
    pub approvals: Bucket,
    redrive: Bucket,
    rates: Bucket,
    /// The last rate window this node wrote, per key, with its revision: a
    /// window only this node uses is written back in one round trip; a write
    /// that finds another revision drops the entry, so the next read is fresh.
    rate_cache: Arc<Mutex<HashMap<String, (SlotCounts, u64)>>>,
}

/// Rate windows remembered at most; the memory is dropped whole when full.
const RATE_CACHE_ENTRIES: usize = 16_384;

impl DispatchBuckets {
    /// Opens (or creates) the four buckets `settings` names.
    pub async fn open(
        client: &async_nats::Client,
        settings: &crate::config::JetStreamSettings,
        rate_window_ms: u64,
    ) -> Result<DispatchBuckets, KvError> {
        let spec = |name: &str, max_age_ms: u64, description: &str| BucketSpec {
            name: name.to_string(),
            replicas: settings.replicas,
            max_age: Duration::from_millis(max_age_ms),
            description: description.to_string(),
            patience: Duration::from_millis(settings.open_timeout_ms),
        };
        Ok(DispatchBuckets {
            registry: Bucket::open(
                client,
                &spec(&settings.registry_bucket, 0, "capdex: capability records and bindings"),
            )
            .await?,
            approvals: Bucket::open(
                client,
                &spec(&settings.approvals_bucket, settings.approvals_max_age_ms, "capdex: approvals"),
            )
            .await?,
            redrive: Bucket::open(
                client,
                &spec(&settings.redrive_bucket, settings.redrive_max_age_ms, "capdex: re-drive claims and results"),
            )
            .await?,
            // A window is useless once it is older than itself.
            rates: Bucket::open(
                client,
                &spec(&settings.rates_bucket, rate_window_ms.max(1000) * 2, "capdex: rate windows"),
            )
            .await?,
            rate_cache: Arc::default(),
        })
    }
}

/// Runs `sweep` every `every` (the first at once) for the process's life and
/// sets, for each bucket it answers by store label, the size gauges
/// (`capdex_store_entries`, `capdex_store_bytes`) and what it purged
/// (`capdex_retention_pruned_total`). A failed sweep is logged and tried at
/// the next tick.
pub async fn keep_swept<F, Fut, const N: usize>(every: Duration, mut sweep: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<[(&'static str, Swept); N], KvError>>,
{
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match sweep().await {
            Ok(swept) => {
                for (label, swept) in swept {
                    metrics::gauge!("capdex_store_entries", "store" => label).set(swept.size.entries as f64);
                    metrics::gauge!("capdex_store_bytes", "store" => label).set(swept.size.bytes as f64);
                    metrics::counter!("capdex_retention_pruned_total", "store" => label).increment(swept.pruned);
                }
            }
            Err(err) => tracing::warn!(%err, "a key-value bucket's sweep failed; it runs again at the next interval"),
        }
    }
}

impl DispatchBuckets {
    /// Keeps the approvals and re-drive buckets within their counts
    /// ([`Bucket::sweep`]; their ages are JetStream's): a live approval
    /// (pending, or approved before its expiry at `now_ms`) and a claim in
    /// progress are never purged, nor a value that does not decode. Answers
    /// each bucket's sweep by its store label.
    pub async fn sweep(
        &self,
        now_ms: u64,
        approvals_max_count: usize,
        redrive_max_count: usize,
    ) -> Result<[(&'static str, Swept); 2], KvError> {
        let count = |max_count: usize| Limits { max_age_ms: 0, max_count };
        let approval = |_: &str, value: &[u8]| {
            serde_json::from_slice::<Approval>(value)
                .map_or(Record::UNREADABLE, |approval| approval_record(&approval, now_ms))
        };
        let redrive = |_: &str, value: &[u8]| {
            serde_json::from_slice::<CacheEntry>(value).map_or(Record::UNREADABLE, |entry| redrive_record(&entry))
        };
        Ok([
            ("jetstream_approvals", self.approvals.sweep(">", count(approvals_max_count), now_ms, approval).await?),
            ("jetstream_redrive", self.redrive.sweep(">", count(redrive_max_count), now_ms, redrive).await?),
        ])
    }
}

/// The key of a record in the registry bucket.
pub fn record_key(slug: &str) -> String {
    format!("cap.{}", key_token(slug))
}

/// The key of a binding in the registry bucket.
pub fn binding_key(agent_id: &str, slug: &str) -> String {
    format!("bind.{}.{}", key_token(agent_id), key_token(slug))
}

/// The key of a rate window in the rates bucket.
fn rate_key(slug: &str, agent: &str) -> String {
    format!("{}.{}", key_token(slug), key_token(agent))
}

/// The key of a re-drive record: each `\0`-separated part of its storage key as a token.
pub fn redrive_key(storage: &[u8]) -> String {
    String::from_utf8_lossy(storage).split('\0').map(key_token).collect::<Vec<_>>().join(".")
}

/// What a change of the registry bucket means; `None` for a deletion or a value that does not decode.
pub fn registry_change(change: &Change) -> Option<RegistryChange> {
    let value = change.value.as_ref()?;
    let decoded = if change.key.starts_with("cap.") {
        serde_json::from_slice(value).map(|record| RegistryChange::Record(Box::new(record)))
    } else if change.key.starts_with("bind.") {
        serde_json::from_slice(value).map(RegistryChange::Binding)
    } else {
        return None;
    };
    decoded.map_err(|err| tracing::warn!(%err, key = %change.key, "undecodable registry entry skipped")).ok()
}

/// The approval a change of the approvals bucket holds; `None` for a deletion or a value that does not decode.
pub fn approval_change(change: &Change) -> Option<Approval> {
    let value = change.value.as_ref()?;
    serde_json::from_slice(value)
        .map_err(|err| tracing::warn!(%err, key = %change.key, "undecodable approval skipped"))
        .ok()
}

/// The value under `key`, decoded, with its revision.
async fn get_decoded<T: serde::de::DeserializeOwned>(
    bucket: &Bucket,
    key: &str,
) -> Result<Option<shared::Versioned<T>>, SharedError> {
    match bucket.get(key).await.map_err(shared_err)? {
        Some(found) => {
            Ok(Some(shared::Versioned { value: decode(bucket, key, &found.value)?, revision: found.revision }))
        }
        None => Ok(None),
    }
}

fn shared_err(err: impl std::fmt::Display) -> SharedError {
    SharedError(err.to_string())
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Bytes, SharedError> {
    serde_json::to_vec(value).map(Bytes::from).map_err(shared_err)
}

fn decode<T: serde::de::DeserializeOwned>(bucket: &Bucket, key: &str, value: &[u8]) -> Result<T, SharedError> {
    serde_json::from_slice(value)
        .map_err(|err| SharedError(format!("{} holds an undecodable {key}: {err}", bucket.name)))
}

impl SharedDispatch for DispatchBuckets {
    fn claim(&self, key: &[u8], entry: &CacheEntry) -> SharedFuture<Claim> {
        let (bucket, key, value) = (self.redrive.clone(), redrive_key(key), encode(entry));
        Box::pin(async move {
            loop {
                if bucket.write(&key, value.clone()?, Expect::Absent).await.map_err(shared_err)?.is_some() {
                    return Ok(Claim::Claimed);
                }
                // Deleted between the two (a failed call freed it): claim again.
                if let Some(found) = bucket.get(&key).await.map_err(shared_err)? {
                    return Ok(Claim::Existing(Box::new(decode(&bucket, &key, &found.value)?)));
                }
            }
        })
    }

    fn settle(&self, key: &[u8], within_ms: u64) -> SharedFuture<Settled> {
        let (bucket, key) = (self.redrive.clone(), redrive_key(key));
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_millis(within_ms);
            loop {
                let Some(current) = bucket.get(&key).await.map_err(shared_err)? else {
                    return Ok(Settled::Released);
                };
                let entry: CacheEntry = decode(&bucket, &key, &current.value)?;
                if entry.result.is_some() {
                    return Ok(Settled::Entry(Box::new(entry)));
                }
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return Ok(Settled::StillRunning(Box::new(entry)));
                }
                match bucket.wait_change(&key, current.revision, left).await.map_err(shared_err)? {
                    Err(()) => return Ok(Settled::StillRunning(Box::new(entry))),
                    Ok(_) => continue,
                }
            }
        })
    }

    fn complete(&self, key: &[u8], entry: &CacheEntry) -> SharedFuture<()> {
        let (bucket, key, value) = (self.redrive.clone(), redrive_key(key), encode(entry));
        Box::pin(async move { bucket.write(&key, value?, Expect::Any).await.map(|_| ()).map_err(shared_err) })
    }

    fn release(&self, key: &[u8]) -> SharedFuture<()> {
        let (bucket, key) = (self.redrive.clone(), redrive_key(key));
        Box::pin(async move { bucket.delete(&key).await.map_err(shared_err) })
    }

    fn approval(&self, id: &str) -> SharedFuture<Option<shared::Versioned<Approval>>> {
        let (bucket, key) = (self.approvals.clone(), key_token(id));
        Box::pin(async move { get_decoded(&bucket, &key).await })
    }

    fn put_approval(&self, approval: &Approval, revision: Option<u64>) -> SharedFuture<bool> {
        let (bucket, key, value) = (self.approvals.clone(), key_token(&approval.id), encode(approval));
        let expect = revision.map_or(Expect::Absent, Expect::Revision);
        Box::pin(async move { Ok(bucket.write(&key, value?, expect).await.map_err(shared_err)?.is_some()) })
    }

    fn rate_window(&self, slug: &str, agent: &str) -> SharedFuture<Option<shared::Versioned<SlotCounts>>> {
        let (bucket, key) = (self.rates.clone(), rate_key(slug, agent));
        if let Some((times, revision)) = self.rate_cache.lock().ok().and_then(|cache| cache.get(&key).cloned()) {
            return Box::pin(async move { Ok(Some(shared::Versioned { value: times, revision })) });
        }
        Box::pin(async move { get_decoded(&bucket, &key).await })
    }

    fn put_rate_window(
        &self,
        slug: &str,
        agent: &str,
        slots: &[(u64, u32)],
        revision: Option<u64>,
    ) -> SharedFuture<bool> {
        let (bucket, key, cache) = (self.rates.clone(), rate_key(slug, agent), self.rate_cache.clone());
        let (value, times) = (encode(&slots), slots.to_vec());
        let expect = revision.map_or(Expect::Absent, Expect::Revision);
        Box::pin(async move {
            let written = bucket.write(&key, value?, expect).await;
            let Ok(mut cache) = cache.lock() else { return Ok(written.map_err(shared_err)?.is_some()) };
            match written {
                Ok(Some(revision)) => {
                    if cache.len() >= RATE_CACHE_ENTRIES {
                        cache.clear();
                    }
                    cache.insert(key, (times, revision));
                    Ok(true)
                }
                Ok(None) => {
                    cache.remove(&key);
                    Ok(false)
                }
                Err(err) => {
                    cache.remove(&key);
                    Err(shared_err(err))
                }
            }
        })
    }

    fn publish_record(&self, record: &CapabilityRecord, create_only: bool) -> SharedFuture<bool> {
        let (bucket, key, value) = (self.registry.clone(), record_key(&record.slug), encode(record));
        let expect = if create_only { Expect::Absent } else { Expect::Any };
        Box::pin(async move { Ok(bucket.write(&key, value?, expect).await.map_err(shared_err)?.is_some()) })
    }

    fn publish_binding(&self, binding: &Binding, create_only: bool) -> SharedFuture<bool> {
        let (bucket, key, value) =
            (self.registry.clone(), binding_key(&binding.agent_id, &binding.slug), encode(binding));
        let expect = if create_only { Expect::Absent } else { Expect::Any };
        Box::pin(async move { Ok(bucket.write(&key, value?, expect).await.map_err(shared_err)?.is_some()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn tokens_keep_plain_ids_and_escape_the_rest() {
        assert_eq!(key_token("lookup_v2-a"), "lookup_v2-a");
        assert_eq!(key_token("tool:a.b"), "tool=3Aa=2Eb");
        assert_eq!(key_token(""), "=");
        assert_eq!(from_key_token("tool=3Aa=2Eb").as_deref(), Some("tool:a.b"));
        assert_eq!(from_key_token("=zz"), None);
    }

    proptest! {
        #[test]
        fn tokens_round_trip_and_are_valid_key_parts(text in ".{0,40}") {
            let token = key_token(&text);
            prop_assert!(!token.is_empty());
            prop_assert!(token.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'='));
            prop_assert_eq!(from_key_token(&token), Some(text));
        }
    }
}
