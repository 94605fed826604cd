//! The store: capdex's durable state, on sled. The only module that imports sled.
//!
//! Trees and what they hold (values are msgpack, via rmp-serde, with named fields):
//!
//! | tree | key | value |
//! |---|---|---|
//! | `descriptors` | capability id | [`StoredDescriptor`]: origin and descriptor |
//! | `presets` | origin | its presets |
//! | `embeddings` | capability id | [`StoredEmbedding`] (model id, text hash, vector) |
//! | `kpi` | `r\0<scope>\0<slot, 4 bytes big-endian>` | a [`RingEntry`]: one sample of the scope's window and its sequence number |
//! | `kpi` | `l\0<round, 8 bytes big-endian>` | a round log: the samples of one group-commit round (with their scope and sequence number), not yet folded into their ring slots ([`log_sample`] gives the layout) |
//! | `kpi` | `m\0<scope>` | the scope's [`ScopeMeta`] (alert and adaptive state) |
//! | `kpi` | `c\0<capability id>`, `g` | a capability's outcome statistics, all capabilities' ([`DecayedStat`]) |
//! | `dispatch_results` | idempotency key | the reply first given for it |
//! | `scg_sources`, `scg_links` | see [`scg`] | the Source Capability Graph |
//! | `sources` | see [`sources`] | live sources: settings as given and their last tools |
//! | `jetstream` | see [`sequence`] | node name, last applied index mutation, processed outcome ids |
//! | `meta` | `durable_mark` | the last durable mark (8 bytes big-endian), also in `capdex.mark` beside sled's files once flushed (`group_flush.rs`) |
//! | `dispatch_*` | see [`dispatch`] | registry, bindings, approvals, re-drive cache, provenance |
//!
//! [`retention`] prunes the trees that grow (provenance, re-drive results,
//! approvals, processed outcome ids) by age and count, and measures them.
//!
//! A KPI window is a ring of `rolling_window_size` slots per scope: sample
//! number `seq` lives in slot `seq % rolling_window_size`, so an outcome is one
//! insert that overwrites the sample it evicts, never a rewrite of the window.
//! KPI writes are not applied by the caller: [`Store::commit_kpi`] queues them
//! for the group-commit thread, which applies each round as one atomic
//! `sled::Batch` in queue order and flushes (`group_flush.rs`). A restart reads
//! every ring back ordered by `seq` ([`Store::load_kpi`] also rewrites a ring
//! laid out for another window size, and the one-key-per-sample `w\0` layout of
//! earlier versions).
//! Under load the group-commit thread does not insert each sample into its slot:
//! a round's samples are one round-log value, and every 1,024 rounds (or 131,072
//! samples) a round folds the logs into the ring, writing each slot once with
//! its newest sample. Slots and logs together always hold every sample of each
//! window; [`Store::load_kpi`] folds the logs it finds (a data dir of an earlier
//! version has none and opens as before).
//!
//! Guarantees: a write returns after sled has it in its page cache; callers
//! that promise durability (dispatch results, acknowledged outcomes) call
//! [`Store::flush`] or await [`Store::durable`] (group commit) before acknowledging.

mod catalog_epoch;
pub mod dispatch;
pub mod learning;
pub mod retention;
pub mod scg;
pub mod sequence;
mod snapshot;
pub use snapshot::{SnapshotFile, CATALOG_SNAPSHOT_FILE, LEXICAL_SNAPSHOT_FILE};
pub mod sources;

use crate::core::descriptor::CapabilityDescriptor;
use crate::core::index::Quantised;
mod group_flush;

use crate::core::graph::Preset;
use crate::core::kpi_window::{Sample, ScopeMeta};
use crate::core::outcome_prior::{DecayedStat, OutcomeStats};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A store operation that failed, naming what was attempted.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("failed to open store at {path}: {source}")]
    Open { path: PathBuf, source: sled::Error },
    #[error(
        "the data dir {path} is in use by another capdex process ({holder}): stop that process first, \
         or give this one a data dir of its own (--data-dir or CAPDEX_DATA_DIR)"
    )]
    Locked { path: PathBuf, holder: String },
    #[error(
        "the data dir {path} is corrupted or truncated ({problem}); capdex will not start on it. {}",
        recovery(path)
    )]
    Corrupt { path: PathBuf, problem: String },
    #[error(
        "the data dir {path} is full: {free_bytes} bytes free, under data_dir_min_free_bytes ({min_free_bytes}); \
         writes are refused until space is freed (reads keep working)"
    )]
    Full { path: PathBuf, free_bytes: u64, min_free_bytes: u64 },
    #[error("failed to {action} in tree {tree}: {source}")]
    Sled { action: &'static str, tree: &'static str, source: sled::Error },
    #[error("failed to encode a value for tree {tree}: {source}")]
    Encode { tree: &'static str, source: rmp_serde::encode::Error },
    #[error("failed to decode key {key:?} of tree {tree}: {source}")]
    Decode { tree: &'static str, key: String, source: rmp_serde::decode::Error },
    #[error("failed to make writes durable: {message}")]
    Durable { message: String },
    #[error("malformed key {key:?} in tree {tree}")]
    Key { tree: &'static str, key: String },
    #[error("malformed value of key {key:?} in tree {tree}: {problem}")]
    Value { tree: &'static str, key: String, problem: &'static str },
}

/// How to recover from a data dir capdex cannot read (`docs/operations.md`).
pub fn recovery(path: &Path) -> String {
    format!(
        "To recover: stop capdex, move the dir aside (mv {0} {0}.corrupt) and start again on an empty data dir: \
         capdex rebuilds it from the capability folders and, with [jetstream] on, from JetStream (the index stream's \
         registrations, the outcome stream, and the buckets of dispatch records, bindings, approvals, re-drive \
         records, SCG and live sources); what only this dir held (KPI windows of capdex.v1.outcome requests, \
         provenance) is lost. See docs/operations.md",
        path.display()
    )
}

impl StoreError {
    /// Whether the error says the data dir's content cannot be read back
    /// (a corrupted or truncated file, or a value that does not decode).
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            StoreError::Corrupt { .. }
                | StoreError::Decode { .. }
                | StoreError::Key { .. }
                | StoreError::Value { .. }
                | StoreError::Sled { source: sled::Error::Corruption { .. }, .. }
        )
    }
}

/// Resolves once the writes made before [`Store::durable`] was called are durable.
#[derive(Debug)]
#[must_use = "a write is durable only once this resolves"]
pub struct Durable {
    receiver: futures::channel::oneshot::Receiver<Result<(), String>>,
}

impl std::future::Future for Durable {
    type Output = Result<(), StoreError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.receiver).poll(cx).map(|received| match received {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(StoreError::Durable { message }),
            Err(_) => Err(StoreError::Durable { message: "the flush thread stopped".into() }),
        })
    }
}

/// One scope's window as stored: samples with their sequence numbers, oldest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredScope {
    pub scope_key: String,
    pub samples: Vec<(u64, Sample)>,
    pub meta: Option<ScopeMeta>,
}

/// One sample as stored in its ring slot.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RingEntry {
    pub seq: u64,
    pub sample: Sample,
}

/// One write to the `kpi` tree, queued by [`Store::commit_kpi`] and applied
/// by the group-commit thread in queue order.
#[derive(Clone, Debug, PartialEq)]
pub enum KpiOp {
    /// Sample number `seq` of a scope, into ring slot `seq % capacity`.
    Sample { scope_key: Arc<str>, seq: u64, capacity: usize, sample: Sample },
    /// A scope's alert and adaptive state.
    Meta { scope_key: Arc<str>, meta: ScopeMeta },
    /// A capability's outcome statistics.
    Capability { capability_id: String, stat: DecayedStat },
    /// A capability whose statistics were forgotten.
    ForgetCapability { capability_id: String },
    /// A scope pruned by retention: its ring slots and its meta are removed,
    /// and its samples still in round logs are never folded back (the round
    /// that applies this folds every log first, so no log outlives it).
    ForgetScope { scope_key: Arc<str> },
    /// The statistics of every capability together.
    PriorGlobal { stat: DecayedStat },
    /// An outcome from the JetStream outcome stream, recorded: its id (with
    /// its stream sequence) into the `jetstream` tree ([`sequence`]). The
    /// group-commit thread writes these after the round's `kpi` batch and
    /// before its flush, so the id is never durable without the sample.
    OutcomeProcessed { outcome_id: String, sequence: u64, at_ms: u64 },
}

impl KpiOp {
    /// Returns the key and the msgpack value (`None` removes the key).
    pub(crate) fn encode(&self) -> Result<(Vec<u8>, Option<Vec<u8>>), rmp_serde::encode::Error> {
        Ok(match self {
            KpiOp::Sample { scope_key, seq, capacity, sample } => {
                let slot = ring_slot(*seq, *capacity);
                let entry = RingEntry { seq: *seq, sample: *sample };
                (ring_key(scope_key, slot), Some(rmp_serde::to_vec_named(&entry)?))
            }
            KpiOp::Meta { scope_key, meta } => (meta_key(scope_key), Some(rmp_serde::to_vec_named(meta)?)),
            KpiOp::Capability { capability_id, stat } => {
                (capability_key(capability_id), Some(rmp_serde::to_vec_named(stat)?))
            }
            KpiOp::ForgetCapability { capability_id } => (capability_key(capability_id), None),
            // Its ring slots are removed by the group-commit thread (`group_flush::apply`).
            KpiOp::ForgetScope { scope_key } => (meta_key(scope_key), None),
            KpiOp::PriorGlobal { stat } => (PRIOR_GLOBAL_KEY.to_vec(), Some(rmp_serde::to_vec_named(stat)?)),
            KpiOp::OutcomeProcessed { outcome_id, sequence, at_ms } => {
                (sequence::outcome_key(outcome_id), Some(sequence::outcome_value(*sequence, *at_ms)))
            }
        })
    }
}

/// Everything the KPI actor keeps: windows with their state, and outcome statistics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredKpi {
    pub scopes: Vec<StoredScope>,
    pub prior: OutcomeStats,
}

/// A descriptor as stored, with the origin that holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredDescriptor {
    pub origin: String,
    pub descriptor: CapabilityDescriptor,
}

/// An embedding as stored: valid while model and text hash still match.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredEmbedding {
    pub model_id: String,
    pub text_hash: String,
    pub vector: Vec<f32>,
}

/// The first byte of a quantised embedding: a byte msgpack never uses, so
/// it tells the two encodings apart (earlier releases stored a msgpack map).
const QUANTISED_EMBEDDING: u8 = 0xc1;

/// `0xc1`, the model id and the text hash (each a little-endian `u16` length
/// and its bytes), the step (`f32`, little-endian), then one byte per dimension.
fn encode_embedding(embedding: &StoredEmbedding) -> Vec<u8> {
    let quantised = Quantised::of(&embedding.vector);
    let mut bytes = Vec::with_capacity(
        1 + 2 + embedding.model_id.len() + 2 + embedding.text_hash.len() + 4 + quantised.codes.len(),
    );
    bytes.push(QUANTISED_EMBEDDING);
    for text in [&embedding.model_id, &embedding.text_hash] {
        // Ids and hashes are short; a longer one is cut at a character boundary
        // (it then never matches, and the vector is made again).
        let mut end = text.len().min(usize::from(u16::MAX));
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        bytes.extend_from_slice(&(end as u16).to_le_bytes());
        bytes.extend_from_slice(&text.as_bytes()[..end]);
    }
    bytes.extend_from_slice(&quantised.scale.to_le_bytes());
    bytes.extend(quantised.codes.iter().map(|code| code.to_le_bytes()[0]));
    bytes
}

/// Reads either encoding of an embedding: the quantised one, or an earlier
/// release's msgpack `{modelId, textHash, vector}` (quantised when indexed).
fn decode_embedding(key: &str, bytes: &[u8]) -> Result<StoredEmbedding, StoreError> {
    let Some(QuantisedEmbedding { model_id, text_hash, scale, codes }) = quantised_embedding(key, bytes)? else {
        return rmp_serde::from_slice(bytes).map_err(|source| StoreError::Decode {
            tree: EMBEDDINGS,
            key: key.to_string(),
            source,
        });
    };
    let text = |text: &[u8]| {
        String::from_utf8(text.to_vec()).map_err(|_| StoreError::Value {
            tree: EMBEDDINGS,
            key: key.to_string(),
            problem: "a text that is not UTF-8",
        })
    };
    let quantised = Quantised { codes: codes.iter().map(|byte| i8::from_le_bytes([*byte])).collect(), scale };
    Ok(StoredEmbedding { model_id: text(model_id)?, text_hash: text(text_hash)?, vector: quantised.to_f32() })
}

/// The parts of a quantised embedding, borrowed from its bytes.
struct QuantisedEmbedding<'a> {
    model_id: &'a [u8],
    text_hash: &'a [u8],
    scale: f32,
    codes: &'a [u8],
}

/// Splits a quantised embedding into its parts; `None` for an earlier
/// release's msgpack encoding.
fn quantised_embedding<'a>(key: &str, bytes: &'a [u8]) -> Result<Option<QuantisedEmbedding<'a>>, StoreError> {
    let malformed = |problem| StoreError::Value { tree: EMBEDDINGS, key: key.to_string(), problem };
    let Some((&QUANTISED_EMBEDDING, mut rest)) = bytes.split_first() else {
        return Ok(None);
    };
    let mut text = || -> Result<&'a [u8], StoreError> {
        let (length, tail) = rest.split_first_chunk::<2>().ok_or(malformed("truncated"))?;
        let length = usize::from(u16::from_le_bytes(*length));
        let (text, tail) = tail.split_at_checked(length).ok_or(malformed("truncated"))?;
        rest = tail;
        Ok(text)
    };
    let (model_id, text_hash) = (text()?, text()?);
    let (scale, codes) = rest.split_first_chunk::<4>().ok_or(malformed("truncated"))?;
    let scale = f32::from_le_bytes(*scale);
    if !scale.is_finite() || scale < 0.0 {
        return Err(malformed("a step that is not a finite, non-negative number"));
    }
    Ok(Some(QuantisedEmbedding { model_id, text_hash, scale, codes }))
}

const DESCRIPTORS: &str = "descriptors";
const EMBEDDINGS: &str = "embeddings";
const PRESETS: &str = "presets";
const KPI: &str = "kpi";
const DISPATCH_RESULTS: &str = "dispatch_results";
const TEXT_EMBEDDINGS: &str = "text_embeddings";

/// Typed access to capdex's sled database. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    db: sled::Db,
    descriptors: sled::Tree,
    embeddings: sled::Tree,
    kpi: sled::Tree,
    dispatch_results: sled::Tree,
    presets: sled::Tree,
    /// Vectors by `core::embedder::text_hash` (model and text), for `capdex eval`.
    text_embeddings: sled::Tree,
    dispatch: dispatch::DispatchTrees,
    group_flush: Arc<group_flush::GroupFlush>,
    space: Arc<SpaceGuard>,
    /// The catalog trees' epoch (`catalog_epoch.rs`): every write to
    /// `descriptors` and `embeddings` goes through it.
    catalog_epoch: Arc<catalog_epoch::EpochCell>,
}

/// The bytes of pages sled keeps in memory (its default is 1 GiB). capdex
/// reads the catalog trees once, at start, into its own structures, and the
/// hot trees afterwards (KPI rings, re-drive records) are small: a large
/// cache only held a second copy of the catalog (a restart at 100,000
/// capabilities stood at 1.3 GB resident, most of it sled's cache).
const CACHE_CAPACITY_BYTES: u64 = 64 * 1024 * 1024;

/// How often sled's own flusher thread wakes (its default is 500 ms). That
/// thread is the only place sled 0.34 reclaims log segments: each wake it
/// rewrites the live pages of half-dead segments for up to half of the period,
/// then sleeps. Under steady churn at the default, dead pages piled up faster
/// than those bursts freed them and the file grew without end; at 50 ms a
/// stand-alone replay of capdex's write mix (its per-tree census,
/// docs/performance.md) held level at 8 to 10 MB where 500 ms climbed past 25 MB
/// in 90 seconds. capdex's durability does not rest on this thread (acknowledged
/// writes are flushed by the group commit). The price is the reclaiming work
/// itself: outcomes over core NATS, each waiting for its group-commit flush,
/// ran 3.7 % slower in the NATS bench (docs/performance.md).
const SLED_FLUSH_EVERY_MS: u64 = 50;

/// The file beside sled's where the flush thread records the last durable mark (`group_flush.rs`).
pub const MARK_FILE: &str = "capdex.mark";
/// The tree and key of the durable mark in sled.
const META: &str = "meta";
pub(crate) const MARK_KEY: &[u8] = b"durable_mark";

/// The file next to sled's own where the process that opened the data dir writes its pid.
pub const PID_FILE: &str = "capdex.pid";

/// Free bytes the data dir keeps by default before writes are refused ([`Store::set_min_free_bytes`]).
pub const DEFAULT_MIN_FREE_BYTES: u64 = 32 * 1024 * 1024;

/// How often the free space of the data dir is measured again.
const SPACE_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// Opens sled under `dir`. sled lets go of its file lock only when its own
/// background threads have let go of the database, a little after the last
/// handle of the previous opening dropped (in this process or one that just
/// exited), so a held lock is tried again for up to two seconds before it is
/// an error (another process really using the data dir, named by its pid file).
/// A data dir sled cannot read back (a truncated or corrupted file, or its
/// log gone while its config is there) is refused, never opened empty.
fn open_db(dir: &Path) -> Result<sled::Db, StoreError> {
    if dir.join("conf").is_file() && !dir.join("db").exists() {
        return Err(StoreError::Corrupt {
            path: dir.to_path_buf(),
            problem: "sled's log file `db` is missing while its `conf` is there".into(),
        });
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match sled::Config::new()
            .path(dir)
            .mode(sled::Mode::HighThroughput)
            .cache_capacity(CACHE_CAPACITY_BYTES)
            .flush_every_ms(Some(SLED_FLUSH_EVERY_MS))
            .open()
        {
            Err(sled::Error::Io(err)) if err.to_string().contains("could not acquire lock") => {
                if std::time::Instant::now() >= deadline {
                    return Err(StoreError::Locked { path: dir.to_path_buf(), holder: holder(dir) });
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(sled::Error::Corruption { at, .. }) => {
                let problem = match at {
                    Some(at) => format!("sled found a record it cannot read back at {at:?}"),
                    None => "sled's snapshot does not match its log".into(),
                };
                return Err(StoreError::Corrupt { path: dir.to_path_buf(), problem });
            }
            Err(source) => return Err(StoreError::Open { path: dir.to_path_buf(), source }),
            Ok(db) => return Ok(db),
        }
    }
}

/// The durable mark sled holds, checked against the one `capdex.mark`
/// recorded after a flush: sled holding less lost part of its log.
fn durable_mark(dir: &Path, meta: &sled::Tree) -> Result<u64, StoreError> {
    let stored = meta
        .get(MARK_KEY)
        .map_err(|source| StoreError::Sled { action: "get", tree: META, source })?
        .and_then(|bytes| <[u8; 8]>::try_from(bytes.as_ref()).ok())
        .map_or(0, u64::from_be_bytes);
    let recorded = std::fs::read_to_string(dir.join(MARK_FILE)).ok().and_then(|text| text.trim().parse::<u64>().ok());
    match recorded {
        Some(recorded) if recorded > stored => Err(StoreError::Corrupt {
            path: dir.to_path_buf(),
            problem: format!(
                "sled opened only part of its log: it holds durable mark {stored}, but mark {recorded} had been made \
                 durable ({MARK_FILE}); the rest of the log was cut or damaged"
            ),
        }),
        recorded => Ok(stored.max(recorded.unwrap_or(0))),
    }
}

/// Who holds the data dir, as its pid file says.
fn holder(dir: &Path) -> String {
    let file = dir.join(PID_FILE);
    match std::fs::read_to_string(&file).ok().and_then(|text| text.trim().parse::<u32>().ok()) {
        Some(pid) => format!("pid {pid}, from {}", file.display()),
        None => format!("its pid is unknown: {} is missing", file.display()),
    }
}

/// The free space of the data dir, measured at most every [`SPACE_CHECK_EVERY`].
#[derive(Debug)]
struct SpaceGuard {
    dir: PathBuf,
    min_free_bytes: std::sync::atomic::AtomicU64,
    /// When it was last measured, and the free bytes then.
    last: std::sync::Mutex<Option<(std::time::Instant, u64)>>,
}

impl SpaceGuard {
    fn check(&self) -> Result<(), StoreError> {
        let min_free_bytes = self.min_free_bytes.load(std::sync::atomic::Ordering::Relaxed);
        if min_free_bytes == 0 {
            return Ok(());
        }
        let mut last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let free_bytes = match *last {
            Some((at, free)) if at.elapsed() < SPACE_CHECK_EVERY => free,
            _ => {
                // A file system that cannot say is not refused.
                let free = fs2::available_space(&self.dir).unwrap_or(u64::MAX);
                *last = Some((std::time::Instant::now(), free));
                free
            }
        };
        if free_bytes < min_free_bytes {
            return Err(StoreError::Full { path: self.dir.clone(), free_bytes, min_free_bytes });
        }
        Ok(())
    }
}

impl Store {
    /// Opens (or creates) the store under `dir`, and writes this process's pid
    /// next to it ([`PID_FILE`]) so a second process can name the holder.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let open_err = |source| StoreError::Open { path: dir.to_path_buf(), source };
        // sled's settings are in `open_db`. (Its `Mode::HighThroughput` there is
        // stored by sled 0.34.7 but read nowhere: it changes nothing.)
        let db = open_db(dir)?;
        // Best effort: a missing pid file only makes a refusal less precise.
        let _ = std::fs::write(dir.join(PID_FILE), format!("{}\n", std::process::id()));
        let tree = |name: &'static str| db.open_tree(name).map_err(open_err);
        let meta = tree(META)?;
        let mark = durable_mark(dir, &meta)?;
        let catalog_epoch = Arc::new(catalog_epoch::EpochCell::open(meta.clone())?);
        let space = Arc::new(SpaceGuard {
            dir: dir.to_path_buf(),
            min_free_bytes: DEFAULT_MIN_FREE_BYTES.into(),
            last: std::sync::Mutex::new(None),
        });
        let guard = space.clone();
        let mark = group_flush::Mark {
            tree: meta,
            file: dir.join(MARK_FILE),
            last: mark,
            writable: Box::new(move || guard.check().is_ok()),
        };
        Ok(Store {
            descriptors: tree(DESCRIPTORS)?,
            embeddings: tree(EMBEDDINGS)?,
            kpi: tree(KPI)?,
            dispatch_results: tree(DISPATCH_RESULTS)?,
            presets: tree(PRESETS)?,
            text_embeddings: tree(TEXT_EMBEDDINGS)?,
            dispatch: dispatch::DispatchTrees::open(&db).map_err(open_err)?,
            group_flush: Arc::new(group_flush::GroupFlush::start(db.clone(), tree(KPI)?, tree(sequence::TREE)?, mark)),
            space,
            catalog_epoch,
            db,
        })
    }

    /// Sets the free bytes the data dir keeps: below them, writes that
    /// acknowledge something (outcomes, registrations, dispatch claims,
    /// bindings, approvals) are refused with [`StoreError::Full`] before sled
    /// runs out of space (a write sled cannot make stops its log for good).
    /// 0 turns the check off.
    pub fn set_min_free_bytes(&self, bytes: u64) {
        self.space.min_free_bytes.store(bytes, std::sync::atomic::Ordering::Relaxed);
        *self.space.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Refuses a write while the data dir is under its free-space reserve.
    pub fn check_space(&self) -> Result<(), StoreError> {
        self.space.check()
    }

    /// Returns every stored descriptor with its origin, in id order.
    pub fn descriptors(&self) -> Result<Vec<StoredDescriptor>, StoreError> {
        all(&self.descriptors, DESCRIPTORS).map(|rows| rows.into_iter().map(|(_, d)| d).collect())
    }

    pub fn put_descriptor(&self, origin: &str, descriptor: &CapabilityDescriptor) -> Result<(), StoreError> {
        self.check_space()?;
        self.catalog_epoch.write(|| {
            put(
                &self.descriptors,
                DESCRIPTORS,
                &descriptor.id,
                &StoredDescriptor { origin: origin.to_string(), descriptor: descriptor.clone() },
            )
        })
    }

    /// Returns every origin's presets.
    pub fn presets(&self) -> Result<Vec<(String, Vec<Preset>)>, StoreError> {
        all(&self.presets, PRESETS)
    }

    /// Stores an origin's presets; an empty list removes them.
    pub fn put_presets(&self, origin: &str, presets: &[Preset]) -> Result<(), StoreError> {
        if presets.is_empty() {
            self.presets.remove(origin).map_err(|source| StoreError::Sled {
                action: "remove",
                tree: PRESETS,
                source,
            })?;
            return Ok(());
        }
        put(&self.presets, PRESETS, origin, &presets.to_vec())
    }

    /// Removes a descriptor and its embedding.
    pub fn remove_capability(&self, id: &str) -> Result<(), StoreError> {
        self.catalog_epoch.write(|| {
            self.descriptors.remove(id).map_err(|source| StoreError::Sled {
                action: "remove",
                tree: DESCRIPTORS,
                source,
            })?;
            self.embeddings.remove(id).map_err(|source| StoreError::Sled {
                action: "remove",
                tree: EMBEDDINGS,
                source,
            })?;
            Ok(())
        })
    }

    pub fn embedding(&self, id: &str) -> Result<Option<StoredEmbedding>, StoreError> {
        let Some(bytes) = self.embeddings.get(id.as_bytes()).map_err(|source| StoreError::Sled {
            action: "get",
            tree: EMBEDDINGS,
            source,
        })?
        else {
            return Ok(None);
        };
        decode_embedding(id, &bytes).map(Some)
    }

    /// Every stored embedding in id order, read as they lie in the tree (a
    /// restart reads them all: one pass, not a lookup per id).
    pub fn embeddings_in_id_order(&self) -> impl Iterator<Item = Result<(String, StoredEmbedding), StoreError>> + '_ {
        self.embeddings.iter().map(|entry| {
            let (key, bytes) =
                entry.map_err(|source| StoreError::Sled { action: "iterate", tree: EMBEDDINGS, source })?;
            let key = String::from_utf8(key.to_vec())
                .map_err(|_| StoreError::Key { tree: EMBEDDINGS, key: String::from_utf8_lossy(&key).into_owned() })?;
            let embedding = decode_embedding(&key, &bytes)?;
            Ok((key, embedding))
        })
    }

    /// Every stored embedding made by `model_id`, in id order, as the index
    /// keeps it: `visit(id, codes, step)`, the codes read in place (a restart
    /// reads them all; nothing is widened to `f32`). An embedding of another
    /// model is passed over (its capability is embedded again); returns how
    /// many were.
    pub fn visit_embeddings(
        &self,
        model_id: &str,
        mut visit: impl FnMut(&str, &[i8], f32),
    ) -> Result<usize, StoreError> {
        let mut codes = Vec::new();
        let mut other_model = 0;
        for entry in self.embeddings.iter() {
            let (key, bytes) =
                entry.map_err(|source| StoreError::Sled { action: "iterate", tree: EMBEDDINGS, source })?;
            let key = std::str::from_utf8(&key)
                .map_err(|_| StoreError::Key { tree: EMBEDDINGS, key: String::from_utf8_lossy(&key).into_owned() })?;
            let scale = match quantised_embedding(key, &bytes)? {
                Some(QuantisedEmbedding { model_id: made_by, scale, codes: stored, .. }) => {
                    if made_by != model_id.as_bytes() {
                        other_model += 1;
                        continue;
                    }
                    codes.clear();
                    codes.extend(stored.iter().map(|byte| i8::from_le_bytes([*byte])));
                    scale
                }
                None => {
                    let legacy = decode_embedding(key, &bytes)?;
                    if legacy.model_id != model_id {
                        other_model += 1;
                        continue;
                    }
                    let quantised = Quantised::of(&legacy.vector);
                    codes.clone_from(&quantised.codes);
                    quantised.scale
                }
            };
            visit(key, &codes, scale);
        }
        Ok(other_model)
    }

    /// Stores an embedding quantised as the vector index keeps it
    /// ([`Quantised`]): a byte per dimension instead of five.
    pub fn put_embedding(&self, id: &str, embedding: &StoredEmbedding) -> Result<(), StoreError> {
        let bytes = encode_embedding(embedding);
        self.catalog_epoch.write(|| {
            self.embeddings.insert(id.as_bytes(), bytes).map_err(|source| StoreError::Sled {
                action: "insert",
                tree: EMBEDDINGS,
                source,
            })?;
            Ok(())
        })
    }

    /// The cached vector of a text, by its `core::embedder::text_hash`.
    pub fn text_embedding(&self, text_hash: &str) -> Result<Option<Vec<f32>>, StoreError> {
        get(&self.text_embeddings, TEXT_EMBEDDINGS, text_hash)
    }

    pub fn put_text_embedding(&self, text_hash: &str, vector: &[f32]) -> Result<(), StoreError> {
        put(&self.text_embeddings, TEXT_EMBEDDINGS, text_hash, &vector)
    }

    /// Returns every stored KPI scope, in scope-key order, samples ordered by
    /// sequence number, without changing anything.
    pub fn kpi_scopes(&self) -> Result<Vec<StoredScope>, StoreError> {
        Ok(self.read_kpi()?.0.scopes)
    }

    /// Returns everything the KPI actor stored, each window cut to its newest
    /// `capacity` samples. A scope stored in another layout (another window
    /// size, or one key per sample) is rewritten as a ring of `capacity` slots
    /// in one batch, and flushed, before this returns.
    pub fn load_kpi(&self, capacity: usize) -> Result<StoredKpi, StoreError> {
        let capacity = capacity.max(1);
        let (mut stored, keys) = self.read_kpi()?;
        let mut batch = sled::Batch::default();
        let mut rewritten = false;
        for (scope, keys) in stored.scopes.iter_mut().zip(keys) {
            let keep_from = scope.samples.len().saturating_sub(capacity);
            let laid_out = keys.len() == scope.samples.len()
                && keep_from == 0
                && scope
                    .samples
                    .iter()
                    .zip(&keys)
                    .all(|((seq, _), key)| *key == ring_key(&scope.scope_key, ring_slot(*seq, capacity)));
            if laid_out {
                continue;
            }
            rewritten = true;
            scope.samples.drain(..keep_from);
            for key in keys {
                batch.remove(key);
            }
            for (seq, sample) in &scope.samples {
                let entry = RingEntry { seq: *seq, sample: *sample };
                let bytes =
                    rmp_serde::to_vec_named(&entry).map_err(|source| StoreError::Encode { tree: KPI, source })?;
                batch.insert(ring_key(&scope.scope_key, ring_slot(*seq, capacity)), bytes);
            }
        }
        if rewritten {
            self.kpi.apply_batch(batch).map_err(|source| StoreError::Sled { action: "rewrite", tree: KPI, source })?;
            self.flush()?;
        }
        Ok(stored)
    }

    /// Reads the `kpi` tree: scopes with their samples ordered by `seq`, and
    /// beside each scope the keys its samples are stored under (same order).
    fn read_kpi(&self) -> Result<(StoredKpi, Vec<SampleKeys>), StoreError> {
        let mut scopes: Vec<(StoredScope, SampleKeys)> = Vec::new();
        let scope_of = |scopes: &mut Vec<(StoredScope, SampleKeys)>, scope_key: &str| -> usize {
            match scopes.binary_search_by(|(scope, _)| scope.scope_key.as_str().cmp(scope_key)) {
                Ok(at) => at,
                Err(at) => {
                    let scope = StoredScope { scope_key: scope_key.to_string(), ..Default::default() };
                    scopes.insert(at, (scope, Vec::new()));
                    at
                }
            }
        };
        let mut prior = OutcomeStats::default();
        for entry in self.kpi.iter() {
            let (key, bytes) = entry.map_err(|source| StoreError::Sled { action: "iterate", tree: KPI, source })?;
            let bad_key = || StoreError::Key { tree: KPI, key: String::from_utf8_lossy(&key).into_owned() };
            let decode_err =
                |source| StoreError::Decode { tree: KPI, key: String::from_utf8_lossy(&key).into_owned(), source };
            match key.split_first() {
                // Earlier versions: one key per sample, `w\0<scope>\0<seq>`.
                Some((b'w', rest)) if rest.len() > 9 && rest[0] == 0 && rest[rest.len() - 9] == 0 => {
                    let scope_key = std::str::from_utf8(&rest[1..rest.len() - 9]).map_err(|_| bad_key())?;
                    let seq = u64::from_be_bytes(rest[rest.len() - 8..].try_into().map_err(|_| bad_key())?);
                    let sample: Sample = rmp_serde::from_slice(&bytes).map_err(decode_err)?;
                    let at = scope_of(&mut scopes, scope_key);
                    scopes[at].0.samples.push((seq, sample));
                    scopes[at].1.push(key.to_vec());
                }
                Some((b'r', rest)) if rest.len() > 5 && rest[0] == 0 && rest[rest.len() - 5] == 0 => {
                    let scope_key = std::str::from_utf8(&rest[1..rest.len() - 5]).map_err(|_| bad_key())?;
                    let entry: RingEntry = rmp_serde::from_slice(&bytes).map_err(decode_err)?;
                    let at = scope_of(&mut scopes, scope_key);
                    scopes[at].0.samples.push((entry.seq, entry.sample));
                    scopes[at].1.push(key.to_vec());
                }
                // A round's samples, not yet folded into their ring slots (`log_key`).
                Some((b'l', rest)) if rest.len() == 9 && rest[0] == 0 => {
                    let bad_value = |problem| StoreError::Value {
                        tree: KPI,
                        key: String::from_utf8_lossy(&key).into_owned(),
                        problem,
                    };
                    for (scope_key, entry) in decode_log(&bytes).map_err(bad_value)? {
                        let at = scope_of(&mut scopes, scope_key);
                        scopes[at].0.samples.push((entry.seq, entry.sample));
                        scopes[at].1.push(key.to_vec());
                    }
                }
                Some((b'm', rest)) if rest.first() == Some(&0) => {
                    let scope_key = std::str::from_utf8(&rest[1..]).map_err(|_| bad_key())?;
                    let meta: ScopeMeta = rmp_serde::from_slice(&bytes).map_err(decode_err)?;
                    let at = scope_of(&mut scopes, scope_key);
                    scopes[at].0.meta = Some(meta);
                }
                Some((b'c', rest)) if rest.first() == Some(&0) => {
                    let capability_id = std::str::from_utf8(&rest[1..]).map_err(|_| bad_key())?;
                    let stat: DecayedStat = rmp_serde::from_slice(&bytes).map_err(decode_err)?;
                    prior.capabilities.insert(capability_id.to_string(), stat);
                }
                _ if key.as_ref() == PRIOR_GLOBAL_KEY => {
                    prior.global = rmp_serde::from_slice(&bytes).map_err(decode_err)?;
                }
                _ => return Err(bad_key()),
            }
        }
        let mut stored = StoredKpi { scopes: Vec::with_capacity(scopes.len()), prior };
        let mut keys = Vec::with_capacity(scopes.len());
        for (mut scope, scope_keys) in scopes {
            // Ring slots are in slot order; the window is in sequence order.
            let mut rows: Vec<((u64, Sample), Vec<u8>)> = scope.samples.into_iter().zip(scope_keys).collect();
            rows.sort_by_key(|((seq, _), _)| *seq);
            let (mut samples, scope_keys): (Vec<_>, Vec<_>) = rows.into_iter().unzip();
            // A sample can be both in its ring slot and in a round log not yet
            // removed; older samples that a logged one overwrote in its slot are
            // still listed, and fall out of the window as the newest `capacity`
            // are kept (every sample of the window is stored somewhere). Then the
            // keys no longer pair with the samples, so `load_kpi` rewrites the scope.
            samples.dedup_by_key(|(seq, _)| *seq);
            scope.samples = samples;
            stored.scopes.push(scope);
            keys.push(scope_keys);
        }
        Ok((stored, keys))
    }

    /// Queues KPI writes after every one queued before, and returns a future
    /// that resolves once they are durable (group commit). Fails at once,
    /// applying nothing, once an earlier batch could not be applied
    /// ([`Store::kpi_failed`]).
    pub fn commit_kpi(&self, ops: impl IntoIterator<Item = KpiOp>) -> Durable {
        Durable { receiver: self.group_flush.commit(ops) }
    }

    /// Why queued KPI writes are refused, once a batch could not be applied (until restart).
    pub fn kpi_failed(&self) -> Option<String> {
        self.group_flush.failed()
    }

    /// Returns a future that resolves once every write made before the call
    /// is durable. Concurrent callers share one flush (group commit).
    pub fn durable(&self) -> Durable {
        Durable { receiver: self.group_flush.durable() }
    }

    pub fn dispatch_result<T: DeserializeOwned>(&self, idempotency_key: &str) -> Result<Option<T>, StoreError> {
        get(&self.dispatch_results, DISPATCH_RESULTS, idempotency_key)
    }

    pub fn put_dispatch_result<T: Serialize>(&self, idempotency_key: &str, result: &T) -> Result<(), StoreError> {
        put(&self.dispatch_results, DISPATCH_RESULTS, idempotency_key, result)
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(|_| ()).map_err(|source| StoreError::Sled { action: "flush", tree: "(all)", source })
    }
}

const PRIOR_GLOBAL_KEY: &[u8] = b"g";

/// The key of round log number `round`: `l\0<round, 8 bytes big-endian>`.
pub(crate) const LOG_PREFIX: &[u8] = b"l\0";

pub(crate) fn log_key(round: u64) -> Vec<u8> {
    [LOG_PREFIX, &round.to_be_bytes()].concat()
}

/// The version byte that opens a round log.
const LOG_VERSION: u8 = 1;

/// Starts a round log (`log_key`): the version byte, then [`log_sample`]s.
pub(crate) fn log_start(log: &mut Vec<u8>) {
    log.clear();
    log.push(LOG_VERSION);
}

/// Appends one sample to a round log: the scope key (u16 length, bytes), the
/// sequence number, the status (0 success, 1 partial, 2 failed), the score
/// (f32 bits), the time, and the turn (0, or 1 and the value); integers
/// big-endian. Fixed-width fields: no allocation, no serde per sample.
pub(crate) fn log_sample(log: &mut Vec<u8>, scope_key: &str, seq: u64, sample: &Sample) {
    use crate::core::kpi_window::OutcomeStatus;
    // A scope key is at most two ids of `[limits] max_id_bytes` (at most 256) bytes, far below u16::MAX.
    debug_assert!(scope_key.len() <= usize::from(u16::MAX));
    let scope_bytes = &scope_key.as_bytes()[..scope_key.len().min(usize::from(u16::MAX))];
    log.extend_from_slice(&(scope_bytes.len() as u16).to_be_bytes());
    log.extend_from_slice(scope_bytes);
    log.extend_from_slice(&seq.to_be_bytes());
    log.push(match sample.status {
        OutcomeStatus::Success => 0,
        OutcomeStatus::Partial => 1,
        OutcomeStatus::Failed => 2,
    });
    log.extend_from_slice(&sample.score.to_bits().to_be_bytes());
    log.extend_from_slice(&sample.at_ms.to_be_bytes());
    match sample.turn {
        Some(turn) => {
            log.push(1);
            log.extend_from_slice(&turn.to_be_bytes());
        }
        None => log.push(0),
    }
}

/// Reads a round log back: each sample with its scope key, or what is wrong with it.
fn decode_log(bytes: &[u8]) -> Result<Vec<(&str, RingEntry)>, &'static str> {
    use crate::core::kpi_window::OutcomeStatus;
    fn take<const N: usize>(rest: &mut &[u8]) -> Result<[u8; N], &'static str> {
        let (head, tail) = rest.split_first_chunk::<N>().ok_or("truncated round log")?;
        *rest = tail;
        Ok(*head)
    }
    let Some((&LOG_VERSION, mut rest)) = bytes.split_first() else {
        return Err("unknown round log version");
    };
    let mut entries = Vec::new();
    while !rest.is_empty() {
        let scope_len = usize::from(u16::from_be_bytes(take::<2>(&mut rest)?));
        let (scope, tail) = rest.split_at_checked(scope_len).ok_or("truncated round log")?;
        rest = tail;
        let scope = std::str::from_utf8(scope).map_err(|_| "scope key is not UTF-8")?;
        let seq = u64::from_be_bytes(take::<8>(&mut rest)?);
        let status = match take::<1>(&mut rest)?[0] {
            0 => OutcomeStatus::Success,
            1 => OutcomeStatus::Partial,
            2 => OutcomeStatus::Failed,
            _ => return Err("unknown status in round log"),
        };
        let score = f32::from_bits(u32::from_be_bytes(take::<4>(&mut rest)?));
        let at_ms = u64::from_be_bytes(take::<8>(&mut rest)?);
        let turn = match take::<1>(&mut rest)?[0] {
            0 => None,
            1 => Some(u64::from_be_bytes(take::<8>(&mut rest)?)),
            _ => return Err("bad turn flag in round log"),
        };
        entries.push((scope, RingEntry { seq, sample: Sample { status, score, at_ms, turn } }));
    }
    Ok(entries)
}

/// The keys a scope's samples are stored under, in the order of its samples.
type SampleKeys = Vec<Vec<u8>>;

/// The ring slot of sample number `seq` in a window of `capacity`.
fn ring_slot(seq: u64, capacity: usize) -> u32 {
    (seq % capacity.max(1) as u64) as u32
}

fn ring_key(scope_key: &str, slot: u32) -> Vec<u8> {
    let mut key = Vec::with_capacity(scope_key.len() + 7);
    key.extend_from_slice(b"r\0");
    key.extend_from_slice(scope_key.as_bytes());
    key.push(0);
    key.extend_from_slice(&slot.to_be_bytes());
    key
}

/// The prefix of every ring slot key of a scope (`r\0<scope>\0`; a scope key
/// holds no control characters, so no other scope's keys share it).
fn ring_prefix(scope_key: &str) -> Vec<u8> {
    [b"r\0".as_slice(), scope_key.as_bytes(), b"\0"].concat()
}

fn capability_key(capability_id: &str) -> Vec<u8> {
    [b"c\0".as_slice(), capability_id.as_bytes()].concat()
}

fn meta_key(scope_key: &str) -> Vec<u8> {
    [b"m\0".as_slice(), scope_key.as_bytes()].concat()
}

pub(crate) fn put<T: Serialize>(tree: &sled::Tree, name: &'static str, key: &str, value: &T) -> Result<(), StoreError> {
    let bytes = rmp_serde::to_vec_named(value).map_err(|source| StoreError::Encode { tree: name, source })?;
    tree.insert(key.as_bytes(), bytes).map_err(|source| StoreError::Sled { action: "insert", tree: name, source })?;
    Ok(())
}

pub(crate) fn get<T: DeserializeOwned>(
    tree: &sled::Tree,
    name: &'static str,
    key: &str,
) -> Result<Option<T>, StoreError> {
    let Some(bytes) =
        tree.get(key.as_bytes()).map_err(|source| StoreError::Sled { action: "get", tree: name, source })?
    else {
        return Ok(None);
    };
    rmp_serde::from_slice(&bytes).map(Some).map_err(|source| StoreError::Decode {
        tree: name,
        key: key.to_string(),
        source,
    })
}

pub(crate) fn all<T: DeserializeOwned>(tree: &sled::Tree, name: &'static str) -> Result<Vec<(String, T)>, StoreError> {
    let mut rows = Vec::new();
    for entry in tree.iter() {
        let (key, bytes) = entry.map_err(|source| StoreError::Sled { action: "iterate", tree: name, source })?;
        let key = String::from_utf8_lossy(&key).into_owned();
        let value = rmp_serde::from_slice(&bytes).map_err(|source| StoreError::Decode {
            tree: name,
            key: key.clone(),
            source,
        })?;
        rows.push((key, value));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dispatch_rules::Builtin;
    use crate::core::kpi_window::OutcomeStatus;

    #[test]
    fn a_forgotten_scope_leaves_slots_logs_and_state_and_a_later_sample_starts_it_again() {
        let dir = tempfile::tempdir().unwrap();
        let sample = |at| Sample::new(Some(OutcomeStatus::Success), None, at).unwrap();
        let (gone, kept): (Arc<str>, Arc<str>) = (Arc::from("gone"), Arc::from("kept"));
        let op = |scope: &Arc<str>, seq: u64| KpiOp::Sample {
            scope_key: scope.clone(),
            seq,
            capacity: 3,
            sample: sample(seq),
        };
        {
            let store = Store::open(dir.path()).unwrap();
            // A fold writes slots, later rounds only round logs: the scope is in both.
            let fold_rounds = group_flush::FOLD_AFTER_ROUNDS as u64;
            for seq in 0..fold_rounds + 2 {
                futures::executor::block_on(store.commit_kpi([op(&gone, seq), op(&kept, seq)])).unwrap();
            }
            let meta = KpiOp::Meta { scope_key: gone.clone(), meta: ScopeMeta::default() };
            futures::executor::block_on(store.commit_kpi([meta])).unwrap();
            assert!(store.kpi.scan_prefix(LOG_PREFIX).next().is_some(), "samples wait in round logs");
            // One round: a sample before the forget goes with it, one after starts the scope again.
            let forget = KpiOp::ForgetScope { scope_key: gone.clone() };
            futures::executor::block_on(store.commit_kpi([op(&gone, 99), forget, op(&kept, 99)])).unwrap();
            assert!(store.kpi.scan_prefix(LOG_PREFIX).next().is_none(), "a forgetting round folds every log");
            let scopes: Vec<String> = store.kpi_scopes().unwrap().into_iter().map(|scope| scope.scope_key).collect();
            assert_eq!(scopes, ["kept"]);
            assert!(store.kpi.get(meta_key("gone")).unwrap().is_none(), "its state went too");
            let forget = KpiOp::ForgetScope { scope_key: gone.clone() };
            futures::executor::block_on(store.commit_kpi([forget, op(&gone, 0)])).unwrap();
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let loaded = store.load_kpi(3).unwrap();
        let scopes: Vec<(String, Vec<u64>)> = loaded
            .scopes
            .into_iter()
            .map(|scope| (scope.scope_key, scope.samples.into_iter().map(|(seq, _)| seq).collect()))
            .collect();
        let fold_rounds = group_flush::FOLD_AFTER_ROUNDS as u64;
        assert_eq!(
            scopes,
            [("gone".to_string(), vec![0]), ("kept".to_string(), vec![fold_rounds, fold_rounds + 1, 99])]
        );
    }

    #[test]
    fn values_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let descriptor = Builtin::Echo.descriptor();
        let embedding = StoredEmbedding { model_id: "m".into(), text_hash: "h".into(), vector: vec![0.5, -0.5] };
        let samples: Vec<Sample> =
            (0..4).map(|at| Sample::new(Some(OutcomeStatus::Success), None, at).unwrap()).collect();
        let meta = ScopeMeta {
            alert: crate::core::kpi_window::AlertState { degraded: true, last_alert_at_ms: Some(3) },
            ..Default::default()
        };
        {
            let store = Store::open(dir.path()).unwrap();
            store.put_descriptor("builtin", &descriptor).unwrap();
            store
                .put_presets("runtime:a", &[Preset { name: "p".into(), capability_ids: vec!["tool:echo".into()] }])
                .unwrap();
            store.put_embedding(&descriptor.id, &embedding).unwrap();
            // A ring of 3: sample 3 overwrites sample 0's slot; the commit is durable once it resolves.
            let scope: Arc<str> = Arc::from("acme/bot");
            let mut ops: Vec<KpiOp> = samples
                .iter()
                .enumerate()
                .map(|(seq, sample)| KpiOp::Sample {
                    scope_key: scope.clone(),
                    seq: seq as u64,
                    capacity: 3,
                    sample: *sample,
                })
                .collect();
            ops.insert(3, KpiOp::Meta { scope_key: scope.clone(), meta: meta.clone() });
            ops.push(KpiOp::Sample { scope_key: Arc::from("global"), seq: 7, capacity: 3, sample: samples[0] });
            ops.push(KpiOp::Capability { capability_id: "tool:a".into(), stat: stat(0.0) });
            ops.push(KpiOp::Capability { capability_id: "tool:b".into(), stat: stat(1.0) });
            ops.push(KpiOp::ForgetCapability { capability_id: "tool:b".into() });
            ops.push(KpiOp::PriorGlobal { stat: stat(0.5) });
            futures::executor::block_on(store.commit_kpi(ops)).unwrap();
            assert_eq!(store.kpi_failed(), None);
            store.put_dispatch_result("k1", &serde_json::json!({"text": "hi"})).unwrap();
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store.descriptors().unwrap(),
            vec![StoredDescriptor { origin: "builtin".into(), descriptor: descriptor.clone() }]
        );
        assert_eq!(store.presets().unwrap()[0].1[0].name, "p");
        // Kept quantised: read back as the index holds it.
        let quantised = StoredEmbedding { vector: Quantised::of(&embedding.vector).to_f32(), ..embedding.clone() };
        assert_eq!(store.embedding(&descriptor.id).unwrap(), Some(quantised));
        let scopes = store.kpi_scopes().unwrap();
        assert_eq!(scopes.len(), 2);
        assert_eq!(scopes[0].scope_key, "acme/bot");
        // The round log still lists sample 0, which sample 3 overwrote in its slot.
        let all: Vec<_> = samples.iter().enumerate().map(|(seq, sample)| (seq as u64, *sample)).collect();
        assert_eq!(scopes[0].samples, all, "ordered by seq");
        assert_eq!(scopes[0].meta, Some(meta));
        assert_eq!(scopes[1].samples, vec![(7, samples[0])]);
        assert_eq!(scopes[1].meta, None);
        let loaded = store.load_kpi(3).unwrap();
        assert_eq!(loaded.scopes[0].samples, all[1..], "the window is the newest 3");
        assert_eq!(loaded.scopes[1], scopes[1]);
        assert!(store.kpi.scan_prefix(LOG_PREFIX).next().is_none(), "loading folded the round log");
        assert_eq!(store.kpi_scopes().unwrap(), loaded.scopes, "into ring slots");
        assert_eq!(store.load_kpi(3).unwrap().scopes, loaded.scopes, "a ring of the configured size is read as it is");
        assert_eq!(loaded.prior.capabilities.into_iter().collect::<Vec<_>>(), vec![("tool:a".to_string(), stat(0.0))]);
        assert_eq!(loaded.prior.global, stat(0.5));
        assert_eq!(store.dispatch_result::<serde_json::Value>("k1").unwrap(), Some(serde_json::json!({"text": "hi"})));
        store.remove_capability(&descriptor.id).unwrap();
        assert!(store.descriptors().unwrap().is_empty());
        assert_eq!(store.embedding(&descriptor.id).unwrap(), None);
    }

    #[test]
    fn processed_outcome_marks_land_with_their_round() {
        let dir = tempfile::tempdir().unwrap();
        let sample = Sample::new(Some(OutcomeStatus::Success), None, 5).unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let ops = vec![
                KpiOp::Sample { scope_key: Arc::from("acme"), seq: 0, capacity: 3, sample },
                KpiOp::OutcomeProcessed { outcome_id: "js-1".into(), sequence: 11, at_ms: 5 },
            ];
            futures::executor::block_on(store.commit_kpi(ops)).unwrap();
            assert!(store.outcome_processed("js-1").unwrap(), "the mark is in the jetstream tree");
            assert!(!store.outcome_processed("js-2").unwrap());
        }
        // Durable once the commit resolved: no flush in between.
        let store = Store::open(dir.path()).unwrap();
        assert!(store.outcome_processed("js-1").unwrap());
        let scopes = store.kpi_scopes().unwrap();
        assert_eq!(scopes.len(), 1, "the mark is not read back as a KPI key");
        assert_eq!(scopes[0].samples, vec![(0, sample)]);
    }

    fn stat(score_sum: f64) -> DecayedStat {
        DecayedStat { score_sum, weight: 1.0, at_ms: 9 }
    }

    fn sample_keys(store: &Store) -> Vec<Vec<u8>> {
        store.kpi.iter().keys().map(|key| key.unwrap().to_vec()).filter(|key| key[0] != b'm').collect()
    }

    #[test]
    fn load_rewrites_other_layouts_as_a_ring_of_the_configured_size() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let samples: Vec<Sample> =
            (0..6).map(|at| Sample::new(Some(OutcomeStatus::Failed), None, at * 10).unwrap()).collect();
        // The layout of earlier versions: one key per sample, `w\0<scope>\0<seq>`.
        for (seq, sample) in samples.iter().enumerate() {
            let key = [b"w\0s\0".as_slice(), &(seq as u64).to_be_bytes()].concat();
            store.kpi.insert(key, rmp_serde::to_vec_named(sample).unwrap()).unwrap();
        }
        let seqs = |stored: &StoredKpi| stored.scopes[0].samples.iter().map(|(seq, _)| *seq).collect::<Vec<_>>();
        let loaded = store.load_kpi(4).unwrap();
        assert_eq!(seqs(&loaded), vec![2, 3, 4, 5]);
        assert_eq!(loaded.scopes[0].samples[0].1, samples[2]);
        // Sequence numbers 2..=5 in slots 2, 3, 0, 1: every slot of the ring once, nothing else.
        assert_eq!(sample_keys(&store), (0..4).map(|slot| ring_key("s", slot)).collect::<Vec<_>>());
        assert_eq!(store.kpi_scopes().unwrap(), loaded.scopes, "reading again finds the same window");
        // A smaller window keeps the newest, a larger one moves them to their new slots.
        assert_eq!(seqs(&store.load_kpi(2).unwrap()), vec![4, 5]);
        assert_eq!(sample_keys(&store).len(), 2);
        assert_eq!(seqs(&store.load_kpi(100).unwrap()), vec![4, 5]);
        assert_eq!(sample_keys(&store), vec![ring_key("s", 4), ring_key("s", 5)]);
    }

    #[test]
    fn durable_resolves_after_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.put_dispatch_result("k", &1u8).unwrap();
        let waits: Vec<_> = (0..10).map(|_| store.durable()).collect();
        for wait in waits {
            futures::executor::block_on(wait).unwrap();
        }
    }

    #[test]
    fn an_embedding_is_kept_in_a_byte_per_dimension_and_earlier_ones_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let vector: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) / 70.0).collect();
        let embedding = StoredEmbedding { model_id: "builtin-fnv1a-512".into(), text_hash: "h".repeat(16), vector };
        store.put_embedding("a", &embedding).unwrap();
        let stored = store.embeddings.get("a").unwrap().unwrap();
        assert_eq!(stored.len(), 1 + 2 + 17 + 2 + 16 + 4 + 512);
        let read = store.embedding("a").unwrap().unwrap();
        assert_eq!(Quantised::of(&read.vector), Quantised::of(&embedding.vector), "the same codes and step");
        assert_eq!((read.model_id.as_str(), read.text_hash.as_str()), ("builtin-fnv1a-512", "hhhhhhhhhhhhhhhh"));
        // An earlier release's msgpack map reads as it was written.
        let legacy = StoredEmbedding { model_id: "m".into(), text_hash: "t".into(), vector: vec![0.25, -1.0] };
        store.embeddings.insert("b", rmp_serde::to_vec_named(&legacy).unwrap()).unwrap();
        assert_eq!(store.embedding("b").unwrap(), Some(legacy));
        // Every cut of a quantised value before its codes is refused, never a panic.
        for end in 1..(1 + 2 + 17 + 2 + 16 + 4) {
            store.embeddings.insert("c", &stored[..end]).unwrap();
            assert!(matches!(store.embedding("c"), Err(StoreError::Value { .. })), "cut at {end}");
        }
    }

    #[test]
    fn garbage_decodes_to_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.embeddings.insert("x", &b"\xff\x00garbage"[..]).unwrap();
        assert!(matches!(store.embedding("x"), Err(StoreError::Decode { .. })));
        let sample = Sample::new(Some(OutcomeStatus::Partial), Some(0.5), 7).unwrap();
        let mut log = Vec::new();
        log_start(&mut log);
        log_sample(&mut log, "acme", 3, &sample);
        // A log of the version byte alone is an empty round; every other cut is refused.
        for cut in (0..log.len()).filter(|cut| *cut != 1) {
            store.kpi.insert(log_key(0), &log[..cut]).unwrap();
            assert!(matches!(store.kpi_scopes(), Err(StoreError::Value { .. })), "cut at {cut}");
        }
        store.kpi.insert(log_key(0), log).unwrap();
        assert_eq!(store.kpi_scopes().unwrap()[0].samples, vec![(3, sample)]);
    }

    /// Commits `n_rounds` rounds of one sample each to scope `s` (ring of 3).
    fn commit_rounds(store: &Store, seqs: std::ops::Range<u64>) -> Vec<(u64, Sample)> {
        seqs.map(|seq| {
            let turn = Some(seq * 7);
            let sample = Sample { turn, ..Sample::new(Some(OutcomeStatus::Failed), None, seq).unwrap() };
            let op = KpiOp::Sample { scope_key: Arc::from("s"), seq, capacity: 3, sample };
            futures::executor::block_on(store.commit_kpi([op])).unwrap();
            (seq, sample)
        })
        .collect()
    }

    #[test]
    fn rounds_are_logged_then_folded_into_ring_slots_and_a_restart_finds_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let logs = |store: &Store| store.kpi.scan_prefix(LOG_PREFIX).count();
        let committed = {
            let store = Store::open(dir.path()).unwrap();
            let first = commit_rounds(&store, 0..5);
            assert_eq!(logs(&store), 5, "one log per round, no ring slot yet");
            assert_eq!(sample_keys(&store).len(), 5);
            // The fold round writes each slot once and removes the logs.
            let mut committed = [first, commit_rounds(&store, 5..group_flush::FOLD_AFTER_ROUNDS as u64)].concat();
            assert_eq!(logs(&store), 0);
            assert_eq!(sample_keys(&store), (0..3).map(|slot| ring_key("s", slot)).collect::<Vec<_>>());
            // Logged again after the fold; the process stops without folding them.
            let n = committed.len() as u64;
            committed.extend(commit_rounds(&store, n..n + 2));
            assert_eq!(logs(&store), 2);
            committed
        };
        let store = Store::open(dir.path()).unwrap();
        let window = committed[committed.len() - 3..].to_vec();
        let loaded = store.load_kpi(3).unwrap();
        assert_eq!(loaded.scopes[0].samples, window);
        assert_eq!(logs(&store), 0);
        assert_eq!(store.kpi_scopes().unwrap()[0].samples, window);
        // Round numbers go on after a restart.
        let n = committed.len() as u64;
        let next = commit_rounds(&store, n..n + 1);
        // Until the next fold, the sample its log overwrites in its slot is still listed.
        assert_eq!(store.kpi_scopes().unwrap()[0].samples, [&window[..], &next[..]].concat());
        assert_eq!(store.load_kpi(3).unwrap().scopes[0].samples, [&window[1..], &next[..]].concat());
    }
}
