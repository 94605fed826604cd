//! Retention's deletes: each store that grows read as `core::retention`
//! records, pruned as [`plan`] decides, and measured for the gauges.
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
use crate::core::retention::{plan, Limits, Record, StoreSize, Swept};

/// A record retention cannot judge: kept.
const UNREADABLE: Record = Record { at_ms: 0, exempt: true };

/// Reads every record of `tree` under `prefix` with `read`, prunes what
/// [`plan`] names (re-read and compare-and-swap) and returns the sweep.
pub(crate) fn sweep_tree(
    tree: &sled::Tree,
    name: &'static str,
    prefix: &[u8],
    now_ms: u64,
    limits: Limits,
    read: impl Fn(&[u8]) -> Record,
) -> Result<Swept, StoreError> {
    let failed = |action: &'static str| move |source| StoreError::Sled { action, tree: name, source };
    let mut keys = Vec::new();
    let mut records = Vec::new();
    let mut size = StoreSize::default();
    for entry in tree.scan_prefix(prefix) {
        let (key, value) = entry.map_err(failed("iterate"))?;
        size.entries += 1;
        size.bytes += (key.len() + value.len()) as u64;
        if limits.is_on() {
            records.push(read(&value));
            keys.push(key);
        }
    }
    let mut pruned = 0;
    for at in plan(&records, now_ms, limits) {
        let key = &keys[at];
        let Some(value) = tree.get(key).map_err(failed("get"))? else { continue };
        if read(&value).exempt {
            continue;
        }
        let swapped = tree.compare_and_swap(key, Some(&value), None as Option<&[u8]>).map_err(failed("remove"))?;
        if swapped.is_ok() {
            pruned += 1;
            size.entries -= 1;
            size.bytes -= (key.len() + value.len()) as u64;
        }
    }
    Ok(Swept { pruned, size })
}

/// The record retention sees of an approval at `now_ms`.
pub fn approval_record(approval: &Approval, now_ms: u64) -> Record {
    let live = matches!(approval.status, ApprovalStatus::Pending | ApprovalStatus::Approved);
    let at_ms = match (live, approval.decided_at_ms) {
        (false, Some(decided)) => decided,
        _ => approval.created_at_ms.max(approval.expires_at_ms),
    };
    Record { at_ms, exempt: live && approval.expires_at_ms > now_ms }
}

/// The record retention sees of a re-drive entry.
pub fn redrive_record(entry: &CacheEntry) -> Record {
    Record { at_ms: entry.started_at_ms, exempt: entry.result.is_none() }
}

fn decoded<T: serde::de::DeserializeOwned>(value: &[u8]) -> Option<T> {
    rmp_serde::from_slice(value).ok()
}

impl Store {
    /// Prunes provenance records over `limits`.
    pub fn sweep_provenance(&self, now_ms: u64, limits: Limits) -> Result<Swept, StoreError> {
        sweep_tree(&self.dispatch.provenance, PROVENANCE, b"", now_ms, limits, |value| {
            decoded::<ProvenanceRecord>(value)
                .map_or(UNREADABLE, |record| Record { at_ms: record.at_ms, exempt: false })
        })
    }

    /// Prunes stored re-drive results over `limits`; keys in progress stay.
    pub fn sweep_redrive(&self, now_ms: u64, limits: Limits) -> Result<Swept, StoreError> {
        sweep_tree(&self.dispatch.cache, CACHE, b"", now_ms, limits, |value| {
            decoded::<CacheEntry>(value).map_or(UNREADABLE, |entry| redrive_record(&entry))
        })
    }

    /// Prunes decided, used and expired approvals over `limits`; live ones stay.
    pub fn sweep_approvals(&self, now_ms: u64, limits: Limits) -> Result<Swept, StoreError> {
        sweep_tree(&self.dispatch.approvals, APPROVALS, b"", now_ms, limits, |value| {
            decoded::<Approval>(value).map_or(UNREADABLE, |approval| approval_record(&approval, now_ms))
        })
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
        sweep_tree(&tree, sequence::TREE, sequence::OUTCOME_PREFIX, now_ms, limits, |value| {
            sequence::outcome_time(value).map_or(UNREADABLE, |at_ms| Record { at_ms, exempt: false })
        })
    }

    /// The entries and bytes (keys and values) of tree `name`, by a full scan.
    pub fn tree_size(&self, name: &'static str) -> Result<StoreSize, StoreError> {
        let tree = self.db.open_tree(name).map_err(|source| StoreError::Sled { action: "open", tree: name, source })?;
        sweep_tree(&tree, name, b"", 0, Limits::OFF, |_| UNREADABLE).map(|swept| swept.size)
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

    #[test]
    fn an_unreadable_value_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.dispatch.provenance.insert(1u64.to_be_bytes(), b"\xc1 not msgpack".to_vec()).unwrap();
        let swept = store.sweep_provenance(u64::MAX, Limits { max_age_ms: 1, max_count: 1 }).unwrap();
        assert_eq!((swept.pruned, swept.size.entries), (0, 1));
    }
}
