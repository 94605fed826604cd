//! Retention's deletes: each store that grows read as `core::retention`
//! records, pruned as [`plan`] decides, and measured for the gauges.
//!
//! A sweep reads each record's time from its time fields alone (a small
//! struct per store, below: no strings, arguments or results decoded) and
//! keeps no key but those it deletes ([`sweep_tree`]).
//!
//! | store | tree (keys) | time of a record | exempt (never pruned) |
//! |---|---|---|---|
//! | `provenance` | `dispatch_provenance` | `atMs` of the call | nothing |
//! | `redrive` | `dispatch_cache` | `startedAtMs` | a key still in progress (no stored result) |
//! | `approvals` | `dispatch_approvals` | `decidedAtMs`, else the later of creation and expiry | pending or approved, before its expiry |
//! | `outcome_ids` | `jetstream` (`o\0<id>`) | the outcome's stream time | nothing |
//!
//! A record is deleted with compare-and-swap against the value the sweep read
//! again just before, and only if that value is still not exempt, so a record
//! the Dispatcher changed meanwhile (an approval decided, a claim completed) is
//! judged as it now is. A value that does not decode is kept (exempt) and
//! counted: retention never deletes what it cannot judge. Memory notes are
//! pruned by the ScgGraph actor, their only writer (`ScgStore::prune_notes`).

use super::dispatch::{APPROVALS, CACHE, PROVENANCE};
use super::{sequence, Store, StoreError};
use crate::core::dispatch::approval::{Approval, ApprovalStatus};
use crate::core::dispatch::redrive::CacheEntry;
use crate::core::dispatch::ProvenanceRecord;
use crate::core::retention::{
    approval_record, approval_times, count_cut, redrive_record, Limits, Record, StoreSize, Swept,
};

/// How a sweep reads a record: `glance` from a value's time fields alone (the
/// scans of every record), `read` from the whole value (the check just before
/// a delete). A value `read` cannot decode is kept, whatever `glance` said.
pub(crate) struct Reader<G, R> {
    pub(crate) glance: G,
    pub(crate) read: R,
}

/// Sweeps the records of `tree` under `prefix`: prunes what
/// [`crate::core::retention::plan`] would (age, then count), and returns the
/// sweep.
///
/// It never holds every key: a first scan deletes the records the age limit
/// prunes (it keeps their keys only) and keeps the times of the others; when
/// the count limit still binds, a second scan applies
/// [`crate::core::retention::count_cut`] in the same order. Each delete
/// re-reads the value and compares-and-swaps it, so a record changed meanwhile
/// is judged as it now is.
pub(crate) fn sweep_tree(
    tree: &sled::Tree,
    name: &'static str,
    prefix: &[u8],
    now_ms: u64,
    limits: Limits,
    reader: Reader<impl Fn(&[u8]) -> Record, impl Fn(&[u8]) -> Record>,
) -> Result<Swept, StoreError> {
    let failed = |action: &'static str| move |source| StoreError::Sled { action, tree: name, source };
    let mut size = StoreSize::default();
    let mut expired = Vec::new();
    let mut times = Vec::new();
    for entry in tree.scan_prefix(prefix) {
        let (key, value) = entry.map_err(failed("iterate"))?;
        size.entries += 1;
        size.bytes += (key.len() + value.len()) as u64;
        if !limits.is_on() {
            continue;
        }
        let record = (reader.glance)(&value);
        if limits.expired(record, now_ms) {
            expired.push(key);
        } else if !record.exempt {
            times.push(record.at_ms);
        }
    }
    let kept = size.entries as usize - expired.len();
    let mut pruned = 0;
    let mut prune = |key: &[u8], still: &dyn Fn(Record) -> bool, size: &mut StoreSize| -> Result<(), StoreError> {
        let Some(value) = tree.get(key).map_err(failed("get"))? else { return Ok(()) };
        if !still((reader.read)(&value)) {
            return Ok(());
        }
        let swapped = tree.compare_and_swap(key, Some(&value), None as Option<&[u8]>).map_err(failed("remove"))?;
        if swapped.is_ok() {
            pruned += 1;
            size.entries -= 1;
            size.bytes -= (key.len() + value.len()) as u64;
        }
        Ok(())
    };
    for key in &expired {
        prune(key, &|record| limits.expired(record, now_ms), &mut size)?;
    }
    drop(expired);
    if let Some(mut cut) = count_cut(&mut times, kept, limits) {
        drop(times);
        for entry in tree.scan_prefix(prefix) {
            let (key, value) = entry.map_err(failed("iterate"))?;
            let record = (reader.glance)(&value);
            if !limits.expired(record, now_ms) && cut.take(record) {
                prune(&key, &|record| !record.exempt, &mut size)?;
            }
        }
    }
    Ok(Swept { pruned, size })
}

/// The entries and bytes (keys and values) of `tree`, by a full scan.
pub(crate) fn measure_tree(tree: &sled::Tree, name: &'static str) -> Result<StoreSize, StoreError> {
    let unread = |_: &[u8]| Record::UNREADABLE;
    sweep_tree(tree, name, b"", 0, Limits::OFF, Reader { glance: unread, read: unread }).map(|swept| swept.size)
}

fn decoded<T: serde::de::DeserializeOwned>(value: &[u8]) -> Option<T> {
    rmp_serde::from_slice(value).ok()
}

// The time fields of each store's values, decoded alone: the stored values
// are msgpack maps keyed by field name (`to_vec_named`), so the fields not
// named here are skipped, not decoded. The tests check each against the whole
// value's decoding.

/// Of a [`ProvenanceRecord`].
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProvenanceTime {
    at_ms: u64,
}

/// Of a [`CacheEntry`]: its start, and whether it holds a result.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RedriveTime {
    started_at_ms: u64,
    #[serde(default)]
    result: Option<serde::de::IgnoredAny>,
}

/// Of an [`Approval`].
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ApprovalTimes {
    created_at_ms: u64,
    expires_at_ms: u64,
    status: ApprovalStatus,
    #[serde(default)]
    decided_at_ms: Option<u64>,
}

impl ApprovalTimes {
    fn record(&self, now_ms: u64) -> Record {
        approval_times(self.status, self.created_at_ms, self.expires_at_ms, self.decided_at_ms, now_ms)
    }
}

fn provenance_glance(value: &[u8]) -> Record {
    decoded::<ProvenanceTime>(value).map_or(Record::UNREADABLE, |time| Record { at_ms: time.at_ms, exempt: false })
}

fn provenance_read(value: &[u8]) -> Record {
    decoded::<ProvenanceRecord>(value)
        .map_or(Record::UNREADABLE, |record| Record { at_ms: record.at_ms, exempt: false })
}

fn redrive_glance(value: &[u8]) -> Record {
    decoded::<RedriveTime>(value)
        .map_or(Record::UNREADABLE, |time| Record { at_ms: time.started_at_ms, exempt: time.result.is_none() })
}

fn redrive_read(value: &[u8]) -> Record {
    decoded::<CacheEntry>(value).map_or(Record::UNREADABLE, |entry| redrive_record(&entry))
}

fn approval_glance(value: &[u8], now_ms: u64) -> Record {
    decoded::<ApprovalTimes>(value).map_or(Record::UNREADABLE, |times| times.record(now_ms))
}

fn approval_read(value: &[u8], now_ms: u64) -> Record {
    decoded::<Approval>(value).map_or(Record::UNREADABLE, |approval| approval_record(&approval, now_ms))
}

impl Store {
    /// Prunes provenance records over `limits`.
    pub fn sweep_provenance(&self, now_ms: u64, limits: Limits) -> Result<Swept, StoreError> {
        let reader = Reader { glance: provenance_glance, read: provenance_read };
        sweep_tree(&self.dispatch.provenance, PROVENANCE, b"", now_ms, limits, reader)
    }

    /// Prunes stored re-drive results over `limits`; keys in progress stay.
    pub fn sweep_redrive(&self, now_ms: u64, limits: Limits) -> Result<Swept, StoreError> {
        let reader = Reader { glance: redrive_glance, read: redrive_read };
        sweep_tree(&self.dispatch.cache, CACHE, b"", now_ms, limits, reader)
    }

    /// Prunes decided, used and expired approvals over `limits`; live ones stay.
    pub fn sweep_approvals(&self, now_ms: u64, limits: Limits) -> Result<Swept, StoreError> {
        let reader = Reader {
            glance: |value: &[u8]| approval_glance(value, now_ms),
            read: |value: &[u8]| approval_read(value, now_ms),
        };
        sweep_tree(&self.dispatch.approvals, APPROVALS, b"", now_ms, limits, reader)
    }

    /// Prunes the ids of processed stream outcomes over `limits`. An id an
    /// earlier version stored without its time is given `now_ms` first, so it
    /// ages from the first sweep that sees it.
    pub fn sweep_outcome_ids(&self, now_ms: u64, limits: Limits) -> Result<Swept, StoreError> {
        let tree = self.db.open_tree(sequence::TREE).map_err(|source| StoreError::Sled {
            action: "open",
            tree: sequence::TREE,
            source,
        })?;
        for entry in tree.scan_prefix(sequence::OUTCOME_PREFIX) {
            let (key, value) =
                entry.map_err(|source| StoreError::Sled { action: "iterate", tree: sequence::TREE, source })?;
            if value.len() == 8 {
                let dated = [value.as_ref(), &now_ms.to_be_bytes()].concat();
                let _ = tree.compare_and_swap(&key, Some(&value), Some(dated)).map_err(|source| StoreError::Sled {
                    action: "insert",
                    tree: sequence::TREE,
                    source,
                })?;
            }
        }
        let time = |value: &[u8]| {
            sequence::outcome_time(value).map_or(Record::UNREADABLE, |at_ms| Record { at_ms, exempt: false })
        };
        sweep_tree(&tree, sequence::TREE, sequence::OUTCOME_PREFIX, now_ms, limits, Reader { glance: time, read: time })
    }

    /// The entries and bytes (keys and values) of tree `name`, by a full scan.
    pub fn tree_size(&self, name: &'static str) -> Result<StoreSize, StoreError> {
        let tree = self.db.open_tree(name).map_err(|source| StoreError::Sled { action: "open", tree: name, source })?;
        measure_tree(&tree, name)
    }

    /// The bytes sled's files take on disk.
    pub fn disk_bytes(&self) -> Result<u64, StoreError> {
        self.db.size_on_disk().map_err(|source| StoreError::Sled { action: "measure", tree: "(all)", source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dispatch::approval::pending;
    use crate::core::dispatch::CallResult;
    use crate::store::KpiOp;
    use serde_json::json;

    fn times(store: &Store) -> Vec<u64> {
        store.provenance(usize::MAX).unwrap().iter().map(|r| r.at_ms).collect()
    }

    #[test]
    fn provenance_is_pruned_by_age_and_by_count() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for at in [10, 20, 30, 40, 50] {
            store.append_provenance(&ProvenanceRecord::test_record(at)).unwrap();
        }
        let swept = store.sweep_provenance(100, Limits::OFF).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (0, 5));
        assert_eq!(swept.size, store.tree_size(PROVENANCE).unwrap());
        // Older than 65 ms at 100: 10, 20 and 30.
        let swept = store.sweep_provenance(100, Limits { max_age_ms: 65, max_count: 0 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (3, 2));
        assert_eq!(times(&store), vec![40, 50]);
        store.append_provenance(&ProvenanceRecord::test_record(60)).unwrap();
        let swept = store.sweep_provenance(100, Limits { max_age_ms: 0, max_count: 1 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (2, 1));
        assert_eq!(times(&store), vec![60]);
        assert_eq!(swept.size, store.tree_size(PROVENANCE).unwrap());
    }

    fn entry(started_at_ms: u64, done: bool) -> CacheEntry {
        CacheEntry {
            slug: "lookup".into(),
            agent_id: "a".into(),
            args_digest: "d".into(),
            owner: "p".into(),
            started_at_ms,
            result: done.then(|| CallResult::ok(json!({"n": 1}))),
        }
    }

    #[test]
    fn redrive_results_are_pruned_by_age_and_count_but_keys_in_progress_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for (key, at, done) in [("e1", 10, true), ("e2", 20, false), ("e3", 30, true), ("e4", 40, true)] {
            store.claim_execution(key.as_bytes(), &entry(at, false)).unwrap();
            if done {
                store.complete_execution(key.as_bytes(), &entry(at, true)).unwrap();
            }
        }
        let swept = store.sweep_redrive(100, Limits { max_age_ms: 75, max_count: 0 }).unwrap();
        // e1 (90 ms old) goes; e2 is older than 75 ms too but still in progress.
        assert_eq!((swept.pruned, swept.size.entries), (1, 3));
        let swept = store.sweep_redrive(100, Limits { max_age_ms: 0, max_count: 2 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (1, 2));
        let claimed = |key: &str| store.claim_execution(key.as_bytes(), &entry(0, false)).unwrap();
        assert!(matches!(claimed("e2"), Claim::Existing(_)), "in progress: kept");
        assert!(matches!(claimed("e4"), Claim::Existing(_)), "the newest result: kept");
        assert_eq!(claimed("e3"), Claim::Claimed, "pruned for the count: runs again");
    }

    use crate::store::dispatch::Claim;

    #[test]
    fn approvals_are_pruned_by_age_and_count_but_live_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let decided = |id: &str, status: ApprovalStatus, at: u64| {
            let mut approval = pending(id.into(), "refund", "a", &json!({}), 1, at, 1000);
            approval.status = status;
            approval.decided_at_ms = Some(at);
            approval
        };
        for approval in [
            decided("used", ApprovalStatus::Used, 10),
            decided("rejected", ApprovalStatus::Rejected, 20),
            decided("approved", ApprovalStatus::Approved, 30),
            pending("pending".into(), "refund", "a", &json!({}), 1, 5, 1000),
            pending("expired".into(), "refund", "a", &json!({}), 1, 5, 10),
        ] {
            store.put_approval(&approval).unwrap();
        }
        let ids = |store: &Store| store.approvals().unwrap().into_iter().map(|a| a.id).collect::<Vec<_>>();
        // At 100 with 50 ms: used, rejected and the expired pending one go; the
        // approved one (expiry 1005) and the pending one stay, however old.
        let swept = store.sweep_approvals(100, Limits { max_age_ms: 50, max_count: 0 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (3, 2));
        assert_eq!(ids(&store), vec!["approved", "pending"]);
        // Count 1 cannot prune a live one.
        let swept = store.sweep_approvals(100, Limits { max_age_ms: 0, max_count: 1 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (0, 2));
        // Past their expiry they are pruned by count, oldest first.
        let swept = store.sweep_approvals(2000, Limits { max_age_ms: 0, max_count: 1 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (1, 1));
        assert_eq!(ids(&store).len(), 1);
    }

    #[test]
    fn processed_outcome_ids_are_pruned_by_age_and_count_and_old_ones_get_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        // As an earlier version stored it: the sequence alone.
        store.mark_outcome_processed("old", 1).unwrap();
        futures::executor::block_on(store.commit_kpi([
            KpiOp::OutcomeProcessed { outcome_id: "t10".into(), sequence: 2, at_ms: 10 },
            KpiOp::OutcomeProcessed { outcome_id: "t20".into(), sequence: 3, at_ms: 20 },
            KpiOp::OutcomeProcessed { outcome_id: "t30".into(), sequence: 4, at_ms: 30 },
        ]))
        .unwrap();
        // At 100 with 85 ms: t10 goes; "old" is dated 100 by this sweep and stays.
        let swept = store.sweep_outcome_ids(100, Limits { max_age_ms: 85, max_count: 0 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (1, 3));
        assert!(!store.outcome_processed("t10").unwrap());
        let swept = store.sweep_outcome_ids(100, Limits { max_age_ms: 0, max_count: 2 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (1, 2));
        assert!(!store.outcome_processed("t20").unwrap());
        assert!(store.outcome_processed("t30").unwrap() && store.outcome_processed("old").unwrap());
        // The node name and the applied sequence are not outcome ids.
        store.set_applied_index_sequence(9).unwrap();
        store.sweep_outcome_ids(10_000, Limits { max_age_ms: 1, max_count: 0 }).unwrap();
        assert_eq!(store.applied_index_sequence().unwrap(), 9);
        assert!(store.disk_bytes().unwrap() > 0);
    }

    /// Each store's glance (its time fields alone) sees what the whole value's
    /// decoding sees, for values as the store writes them.
    #[test]
    fn a_glance_sees_what_the_whole_value_says() {
        for at in [0, 1, 1_700_000_000_000, u64::MAX] {
            let mut record = ProvenanceRecord::test_record(at);
            record.args = json!({"nested": {"list": [1, "two", null]}, "text": "x".repeat(300)});
            record.approval_id = Some("ap-1".into());
            let bytes = encoded(&record);
            assert_eq!(provenance_glance(&bytes), provenance_read(&bytes));
            assert_eq!(provenance_glance(&bytes), Record { at_ms: at, exempt: false });
        }
        for done in [false, true] {
            let bytes = encoded(&entry(42, done));
            assert_eq!(redrive_glance(&bytes), redrive_read(&bytes));
            assert_eq!(redrive_glance(&bytes).exempt, !done);
        }
        let statuses =
            [ApprovalStatus::Pending, ApprovalStatus::Approved, ApprovalStatus::Rejected, ApprovalStatus::Used];
        for status in statuses {
            for decided_at_ms in [None, Some(150)] {
                for now_ms in [50, 500] {
                    let mut approval = pending("ap-1".into(), "lookup", "a", &json!({"q": 1}), 7, 100, 200);
                    approval.status = status;
                    approval.decided_at_ms = decided_at_ms;
                    approval.arguments = Some(json!({"q": "y".repeat(100)}));
                    let bytes = encoded(&approval);
                    assert_eq!(approval_glance(&bytes, now_ms), approval_read(&bytes, now_ms), "{status:?}");
                }
            }
        }
        for junk in [&b""[..], b"\xc1 not msgpack", b"\x81\xa4atMs\xa3ten"] {
            assert_eq!(provenance_glance(junk), Record::UNREADABLE);
            assert_eq!(redrive_glance(junk), Record::UNREADABLE);
            assert_eq!(approval_glance(junk, 0), Record::UNREADABLE);
        }
    }

    /// A value whose time fields decode but whose whole does not is judged
    /// by the glance and then kept by the check before the delete.
    #[test]
    fn a_value_that_only_glances_well_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let only_time = rmp_serde::to_vec_named(&json!({"atMs": 1})).unwrap();
        assert_eq!(provenance_glance(&only_time), Record { at_ms: 1, exempt: false });
        store.dispatch.provenance.insert(1u64.to_be_bytes(), only_time).unwrap();
        store.append_provenance(&ProvenanceRecord::test_record(2)).unwrap();
        let swept = store.sweep_provenance(1_000, Limits { max_age_ms: 1, max_count: 0 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (1, 1));
        let swept = store.sweep_provenance(1_000, Limits { max_age_ms: 0, max_count: 1 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (0, 1));
    }

    /// A count sweep over more records than one scan's worth of ties: the
    /// second scan takes exactly the oldest beyond the count.
    #[test]
    fn a_count_sweep_keeps_exactly_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for at in (0..200).map(|n| n / 10) {
            store.append_provenance(&ProvenanceRecord::test_record(at)).unwrap();
        }
        let swept = store.sweep_provenance(100, Limits { max_age_ms: 0, max_count: 55 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (145, 55));
        let mut kept = times(&store);
        kept.sort_unstable();
        assert_eq!(kept.first(), Some(&14), "five of the ten at 14 ms, then every later one");
        assert_eq!(kept.iter().filter(|&&at| at == 14).count(), 5);
        assert_eq!(swept.size, store.tree_size(PROVENANCE).unwrap());
    }

    /// A value as the stores write it.
    fn encoded<T: serde::Serialize>(value: &T) -> Vec<u8> {
        rmp_serde::to_vec_named(value).unwrap()
    }

    #[test]
    fn an_unreadable_value_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.dispatch.provenance.insert(1u64.to_be_bytes(), b"\xc1 not msgpack".to_vec()).unwrap();
        let swept = store.sweep_provenance(u64::MAX, Limits { max_age_ms: 1, max_count: 1 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (0, 1));
    }
}
