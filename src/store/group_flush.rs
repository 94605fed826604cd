//! Group commit: callers that must not answer before their writes are
//! durable wait on [`GroupFlush::commit`] (or [`GroupFlush::durable`]); one
//! background thread applies the queued KPI writes and flushes sled for every
//! caller that registered before the round began.
//!
//! Write path of one round:
//! 1. take every queued write and every waiter, in the order they were queued;
//! 2. apply the writes as one `sled::Batch` (atomic: after a crash sled holds
//!    all of a batch or none of it, and batches land in order; the round's KPI
//!    samples are one round-log value in it, see [`apply`]), then the
//!    round's processed-outcome marks (`KpiOp::OutcomeProcessed`) as a second
//!    batch on the `jetstream` tree: sled recovers a prefix of its log, so a
//!    mark is never durable without the samples before it;
//! 3. flush sled, which makes the batch and every write issued before step 1
//!    durable;
//! 4. resolve the waiters.
//!
//! Why it is correct: a caller registers *after* its direct writes returned
//! and *together with* its queued writes, and the thread takes both *before*
//! it applies and flushes. Callers that register while a round runs share the
//! next one, so under load one batch and one fsync serve thousands.
//!
//! The durable mark: at most every [`MARK_EVERY`], a round also writes the
//! next mark number into sled (tree `meta`) before its flush, and once the
//! flush returned, the same number to `capdex.mark` beside sled's files (and
//! so does the thread's last round when the store closes). The file never
//! names a mark sled has not made durable, so a data dir whose sled mark is
//! below its file's lost part of its log (a cut or damaged tail that sled's
//! recovery took for a crash): [`super::Store::open`] refuses it.
//!
//! A batch that cannot be applied poisons the queue for good: that round's
//! waiters and every later one get the error, so nothing is acknowledged
//! after a lost write, and a restart reloads what is on disk. A failed flush
//! is reported to its round only (its writes are in sled and a later flush
//! covers them).

use super::{KpiOp, RingEntry};
use futures::channel::oneshot;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Logged samples after which the pending ones are folded into their ring slots.
const FOLD_AFTER_SAMPLES: usize = 1 << 17;
/// Round logs after which the pending samples are folded into their ring slots
/// (fewer under test, so a test reaches a fold quickly).
pub(super) const FOLD_AFTER_ROUNDS: usize = if cfg!(test) { 16 } else { 1024 };

/// The samples of the rounds logged since the last fold: the newest entry
/// of each ring slot, and the logs that hold them.
#[derive(Default)]
struct RoundLogs {
    /// The next round log's number.
    next_round: u64,
    pending: HashMap<(Arc<str>, u32), RingEntry>,
    logs: Vec<Vec<u8>>,
    n_logged: usize,
    /// Reused for every round's log value.
    buffer: Vec<u8>,
}

type Waiter = oneshot::Sender<Result<(), String>>;

/// The longest a round goes without also writing the durable mark.
const MARK_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// The durable mark of one database: its tree, the file beside sled's, the
/// last number written, and whether writing is allowed (the space guard).
pub(crate) struct Mark {
    pub(crate) tree: sled::Tree,
    pub(crate) file: std::path::PathBuf,
    pub(crate) last: u64,
    pub(crate) writable: Box<dyn Fn() -> bool + Send>,
}

impl Mark {
    /// Writes the next number into sled (made durable by the caller's flush).
    fn stage(&mut self) -> Option<u64> {
        if !(self.writable)() {
            return None;
        }
        let next = self.last + 1;
        self.tree.insert(super::MARK_KEY, &next.to_be_bytes()).ok()?;
        Some(next)
    }

    /// Records `number`, now durable in sled, in the file (write, then rename).
    fn record(&mut self, number: u64) {
        self.last = number;
        let temporary = self.file.with_extension("mark.tmp");
        if std::fs::write(&temporary, number.to_string()).is_ok() {
            let _ = std::fs::rename(&temporary, &self.file);
        }
    }
}

#[derive(Default)]
struct Queue {
    ops: Vec<KpiOp>,
    waiters: Vec<Waiter>,
    stopping: bool,
    /// Why a batch could not be applied; once set, nothing is applied or acknowledged.
    failed: Option<String>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// The flushing thread of one sled database; stops (after its last round) when dropped.
pub(crate) struct GroupFlush {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for GroupFlush {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupFlush")
    }
}

impl GroupFlush {
    /// Starts the thread that applies writes to `kpi` (and processed-outcome
    /// marks to `jetstream`) and flushes `db`.
    pub(crate) fn start(db: sled::Db, kpi: sled::Tree, jetstream: sled::Tree, mark: Mark) -> GroupFlush {
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), wake: Condvar::new() });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("capdex-flush".into())
            .spawn(move || {
                // Rounds already logged (by a process that stopped before folding them) keep their numbers.
                let last_round = kpi.scan_prefix(super::LOG_PREFIX).keys().next_back().and_then(Result::ok);
                let next_round = last_round
                    .and_then(|key| key.get(super::LOG_PREFIX.len()..)?.try_into().ok())
                    .map_or(0, |round: [u8; 8]| u64::from_be_bytes(round) + 1);
                let round_logs = RoundLogs { next_round, ..RoundLogs::default() };
                run(&thread_shared, &db, &kpi, &jetstream, round_logs, mark)
            })
            .expect("the flush thread starts");
        GroupFlush { shared, thread: Mutex::new(Some(thread)) }
    }

    /// Returns a receiver that resolves once every write issued before this
    /// call is durable, or with the error.
    pub(crate) fn durable(&self) -> oneshot::Receiver<Result<(), String>> {
        self.commit(std::iter::empty())
    }

    /// Queues `ops` after every write queued so far and returns a receiver
    /// that resolves once they (and every write issued before) are durable.
    pub(crate) fn commit(&self, ops: impl IntoIterator<Item = KpiOp>) -> oneshot::Receiver<Result<(), String>> {
        let (sender, receiver) = oneshot::channel();
        let mut queue = self.lock();
        if let Some(message) = &queue.failed {
            let _ = sender.send(Err(message.clone()));
            return receiver;
        }
        // The thread sleeps only on an empty queue, so only the first caller of a round wakes it.
        let idle = queue.waiters.is_empty() && queue.ops.is_empty();
        queue.ops.extend(ops);
        queue.waiters.push(sender);
        drop(queue);
        if idle {
            self.shared.wake.notify_one();
        }
        receiver
    }

    /// Why queued writes can no longer be applied, if they cannot.
    pub(crate) fn failed(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.shared.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for GroupFlush {
    fn drop(&mut self) {
        self.lock().stopping = true;
        self.shared.wake.notify_one();
        // Joining releases the thread's handle on the database, so it can be reopened at once.
        let thread = self.thread.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

fn run(
    shared: &Shared,
    db: &sled::Db,
    kpi: &sled::Tree,
    jetstream: &sled::Tree,
    mut round_logs: RoundLogs,
    mut mark: Mark,
) {
    let mut marked = Instant::now();
    loop {
        let (ops, waiters) = {
            let mut queue = shared.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            while queue.waiters.is_empty() && queue.ops.is_empty() && !queue.stopping {
                queue = shared.wake.wait(queue).unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            if queue.waiters.is_empty() && queue.ops.is_empty() {
                drop(queue);
                // The last round: the mark then covers everything written.
                if let Some(number) = mark.stage() {
                    if db.flush().is_ok() {
                        mark.record(number);
                    }
                }
                return;
            }
            (std::mem::take(&mut queue.ops), std::mem::take(&mut queue.waiters))
        };
        let started = Instant::now();
        let n_ops = ops.len();
        let staged = if marked.elapsed() >= MARK_EVERY { mark.stage() } else { None };
        let result = match apply(kpi, jetstream, ops, &mut round_logs) {
            Ok(()) => db.flush().map(|_| ()).map_err(|err| err.to_string()),
            Err(message) => {
                poison(shared, &message);
                Err(message)
            }
        };
        if let (Some(number), Ok(())) = (staged, &result) {
            mark.record(number);
            marked = Instant::now();
        }
        metrics::histogram!("capdex_store_flush_duration_seconds").record(started.elapsed().as_secs_f64());
        metrics::histogram!("capdex_store_flush_callers").record(waiters.len() as f64);
        metrics::histogram!("capdex_store_flush_writes").record(n_ops as f64);
        for waiter in waiters {
            // A caller that stopped waiting is no error.
            let _ = waiter.send(result.clone());
        }
    }
}

/// Marks the queue failed for good and answers every caller queued meanwhile:
/// their writes come after the lost batch and will never be applied.
fn poison(shared: &Shared, message: &str) {
    metrics::counter!("capdex_store_write_errors_total").increment(1);
    tracing::error!(%message, "KPI writes could not be applied; outcomes are refused until restart");
    let mut queue = shared.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    queue.failed = Some(message.to_string());
    queue.ops.clear();
    for waiter in queue.waiters.drain(..) {
        let _ = waiter.send(Err(message.to_string()));
    }
}

/// Applies one round's writes as one atomic batch, in queue order (a later
/// write to a key wins), then its processed-outcome marks as a second batch.
///
/// Samples do not go to their ring slots one insert each: the round's samples
/// are one value, a round log (`store::log_key`), in the same batch. Every
/// `FOLD_AFTER_ROUNDS` logs or `FOLD_AFTER_SAMPLES` samples, a round instead
/// folds them: the newest entry of each ring slot written since the last fold
/// goes to its slot (a slot overwritten several times is written once) and the
/// logs are removed, in that round's one atomic batch. A crash leaves logs and
/// slots that together hold every sample of each window, and
/// `Store::load_kpi` folds what it finds.
fn apply(kpi: &sled::Tree, jetstream: &sled::Tree, ops: Vec<KpiOp>, round_logs: &mut RoundLogs) -> Result<(), String> {
    if ops.is_empty() {
        return Ok(());
    }
    let (mut batch, mut marks, mut n_marks) = (sled::Batch::default(), sled::Batch::default(), 0);
    let (mut n_samples, mut n_forgotten) = (0, 0);
    super::log_start(&mut round_logs.buffer);
    for op in &ops {
        let target = match op {
            KpiOp::ForgetScope { scope_key } => {
                // Its samples queued so far (this round's and the logged ones)
                // are never folded; a sample queued after this starts the
                // scope again and is folded over these removals.
                round_logs.pending.retain(|(pending_scope, _), _| pending_scope != scope_key);
                for slot in kpi.scan_prefix(super::ring_prefix(scope_key)).keys() {
                    batch.remove(slot.map_err(|err| format!("failed to read the KPI ring of a pruned scope: {err}"))?);
                }
                n_forgotten += 1;
                &mut batch
            }
            KpiOp::Sample { scope_key, seq, capacity, sample } => {
                super::log_sample(&mut round_logs.buffer, scope_key, *seq, sample);
                let slot = super::ring_slot(*seq, *capacity);
                round_logs.pending.insert((scope_key.clone(), slot), RingEntry { seq: *seq, sample: *sample });
                n_samples += 1;
                continue;
            }
            KpiOp::OutcomeProcessed { .. } => {
                n_marks += 1;
                &mut marks
            }
            _ => &mut batch,
        };
        match op.encode() {
            Ok((key, Some(value))) => target.insert(key, value),
            Ok((key, None)) => target.remove(key),
            Err(err) => return Err(format!("failed to encode a KPI write: {err}")),
        }
    }
    if n_samples > 0 || n_forgotten > 0 {
        round_logs.n_logged += n_samples;
        // A round that forgets a scope folds: its logs still hold the scope's
        // samples, and a restart would fold them back (`Store::load_kpi`).
        let fold = n_forgotten > 0
            || round_logs.n_logged >= FOLD_AFTER_SAMPLES
            || round_logs.logs.len() + 1 >= FOLD_AFTER_ROUNDS;
        if fold {
            for ((scope_key, slot), entry) in round_logs.pending.drain() {
                let value =
                    rmp_serde::to_vec_named(&entry).map_err(|err| format!("failed to encode a KPI write: {err}"))?;
                batch.insert(super::ring_key(&scope_key, slot), value);
            }
            for log in round_logs.logs.drain(..) {
                batch.remove(log);
            }
            round_logs.n_logged = 0;
        } else {
            let log = super::log_key(round_logs.next_round);
            round_logs.next_round += 1;
            batch.insert(log.clone(), round_logs.buffer.as_slice());
            round_logs.logs.push(log);
        }
    }
    kpi.apply_batch(batch).map_err(|err| format!("failed to apply {} KPI writes: {err}", ops.len() - n_marks))?;
    if n_marks > 0 {
        jetstream.apply_batch(marks).map_err(|err| format!("failed to mark {n_marks} outcomes processed: {err}"))?;
    }
    Ok(())
}
