//! Retention, pure: which records of a growing store to prune, given the
//! records, the time and the store's limits.
//!
//! Every store that grows (provenance, re-drive results, approvals, memory
//! notes, the ids of processed stream outcomes, KPI scopes) is described to [`plan`] as a
//! list of [`Record`]s: a time and whether the record is still needed
//! (`exempt`). [`plan`] never prunes an exempt record; of the others it prunes
//! every one older than `max_age_ms` and then, oldest first, as many as keep
//! the store at `max_count` records (exempt ones count, but are never the ones
//! pruned). A limit of 0 is off. The shells (`store`, the actors) read the
//! records and delete what the plan names.

use crate::core::dispatch::approval::{Approval, ApprovalStatus};
use crate::core::dispatch::redrive::CacheEntry;
use serde::Serialize;

/// One store's limits: `0` switches a limit off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Prune a record whose time is more than this many milliseconds before now.
    pub max_age_ms: u64,
    /// Keep at most this many records (exempt ones are never pruned, so a store
    /// of exempt records may hold more).
    pub max_count: usize,
}

impl Limits {
    /// No limit at all: nothing is ever pruned.
    pub const OFF: Limits = Limits { max_age_ms: 0, max_count: 0 };

    /// Whether either limit is on.
    pub fn is_on(&self) -> bool {
        self.max_age_ms > 0 || self.max_count > 0
    }

    /// Whether the age limit prunes `record` at `now_ms` (never an exempt one).
    pub fn expired(&self, record: Record, now_ms: u64) -> bool {
        !record.exempt && self.max_age_ms > 0 && now_ms.saturating_sub(record.at_ms) > self.max_age_ms
    }
}

/// What retention needs to know of one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// When the record was last changed (ms since the epoch, or any clock the
    /// caller's `now_ms` shares).
    pub at_ms: u64,
    /// Still needed (a pending approval, an unfinished re-drive): never pruned.
    pub exempt: bool,
}

impl Record {
    /// A record retention cannot judge (its value does not decode): kept.
    pub const UNREADABLE: Record = Record { at_ms: 0, exempt: true };
}

/// The count limit of [`plan`] as a cut that a second pass over the same
/// records, in the same order, applies one record at a time: for a store too
/// large to hold every record's key in memory while it decides (the first
/// pass keeps only the times; [`count_cut`] makes the cut).
///
/// Of the records the age limit keeps, [`CountCut::take`] says yes to every
/// non-exempt one older than `before_ms` and to the first `ties` non-exempt
/// ones of exactly `before_ms`: [`plan`]'s oldest-first choice, ties broken by
/// position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CountCut {
    pub before_ms: u64,
    pub ties: usize,
}

impl CountCut {
    /// Whether the next record (in the first pass's order, not expired) is
    /// pruned for the count.
    pub fn take(&mut self, record: Record) -> bool {
        if record.exempt || record.at_ms > self.before_ms {
            return false;
        }
        if record.at_ms < self.before_ms {
            return true;
        }
        if self.ties == 0 {
            return false;
        }
        self.ties -= 1;
        true
    }
}

/// The cut that brings the store to `limits.max_count`, given the times of
/// the non-exempt records the age limit keeps (`times`, any order; reordered
/// here) and how many records it keeps in all (`kept`, exempt ones
/// included). `None` when the count limit is off or already met.
pub fn count_cut(times: &mut [u64], kept: usize, limits: Limits) -> Option<CountCut> {
    if limits.max_count == 0 || kept <= limits.max_count || times.is_empty() {
        return None;
    }
    let prune = (kept - limits.max_count).min(times.len());
    let (_, &mut before_ms, _) = times.select_nth_unstable(prune - 1);
    let older = times.iter().filter(|&&at_ms| at_ms < before_ms).count();
    Some(CountCut { before_ms, ties: prune - older })
}

/// The indexes (into the caller's list) of the records to prune, ascending.
///
/// A record is pruned when it is not exempt and either older than
/// `limits.max_age_ms` (`now_ms - at_ms > max_age_ms`) or among the oldest
/// non-exempt records beyond `limits.max_count`. Ties in time are broken by
/// index (the earlier index is older), so the caller's order decides among
/// records of one millisecond.
pub fn plan(records: &[Record], now_ms: u64, limits: Limits) -> Vec<usize> {
    let mut prune = vec![false; records.len()];
    let mut kept = records.len();
    if limits.max_age_ms > 0 {
        for (at, record) in records.iter().enumerate() {
            if limits.expired(*record, now_ms) {
                prune[at] = true;
                kept -= 1;
            }
        }
    }
    if limits.max_count > 0 && kept > limits.max_count {
        let mut candidates: Vec<usize> = (0..records.len()).filter(|&at| !prune[at] && !records[at].exempt).collect();
        candidates.sort_by_key(|&at| (records[at].at_ms, at));
        for at in candidates.into_iter().take(kept - limits.max_count) {
            prune[at] = true;
        }
    }
    (0..records.len()).filter(|&at| prune[at]).collect()
}

/// The record retention sees of an approval at `now_ms`: its decision's time
/// (else the later of its creation and its expiry); exempt while it can still
/// be used (pending or approved, before its expiry). From its time fields
/// alone, so a sweep that decodes only those ([`approval_record`] for a whole
/// approval) judges it the same.
pub fn approval_times(
    status: ApprovalStatus,
    created_at_ms: u64,
    expires_at_ms: u64,
    decided_at_ms: Option<u64>,
    now_ms: u64,
) -> Record {
    let live = matches!(status, ApprovalStatus::Pending | ApprovalStatus::Approved);
    let at_ms = match (live, decided_at_ms) {
        (false, Some(decided)) => decided,
        _ => created_at_ms.max(expires_at_ms),
    };
    Record { at_ms, exempt: live && expires_at_ms > now_ms }
}

/// The record retention sees of an approval at `now_ms` ([`approval_times`]).
pub fn approval_record(approval: &Approval, now_ms: u64) -> Record {
    approval_times(approval.status, approval.created_at_ms, approval.expires_at_ms, approval.decided_at_ms, now_ms)
}

/// The record retention sees of a re-drive entry: the call's start; exempt
/// while in progress (no result stored).
pub fn redrive_record(entry: &CacheEntry) -> Record {
    Record { at_ms: entry.started_at_ms, exempt: entry.result.is_none() }
}

/// One store's size, as the gauges report it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreSize {
    pub entries: u64,
    /// Bytes of keys and values (what sled holds, before its own overhead).
    pub bytes: u64,
}

/// What one sweep of one store did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Swept {
    /// Records pruned.
    pub pruned: u64,
    /// The store's size after the sweep.
    pub size: StoreSize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(at_ms: u64) -> Record {
        Record { at_ms, exempt: false }
    }

    #[test]
    fn off_prunes_nothing() {
        let records: Vec<Record> = (0..10).map(r).collect();
        assert!(plan(&records, 1_000_000, Limits::OFF).is_empty());
    }

    #[test]
    fn age_prunes_what_is_older_than_the_limit_and_keeps_the_boundary() {
        let records = [r(100), r(200), r(300)];
        // now - 200 = 100 is not more than 100: kept.
        assert_eq!(plan(&records, 300, Limits { max_age_ms: 100, max_count: 0 }), vec![0]);
    }

    #[test]
    fn count_prunes_the_oldest_whatever_their_order() {
        let records = [r(30), r(10), r(20), r(40)];
        assert_eq!(plan(&records, 40, Limits { max_age_ms: 0, max_count: 2 }), vec![1, 2]);
    }

    #[test]
    fn exempt_records_stay_and_count() {
        let records = [Record { at_ms: 1, exempt: true }, r(2), r(3), r(4)];
        // Age prunes 2 and 3 (older than 1 ms at now 5), never the exempt one.
        assert_eq!(plan(&records, 5, Limits { max_age_ms: 1, max_count: 0 }), vec![1, 2]);
        // Count 2: the exempt one counts, so the two oldest others go.
        assert_eq!(plan(&records, 5, Limits { max_age_ms: 0, max_count: 2 }), vec![1, 2]);
        // Count 1 cannot be reached without the exempt one: every other goes.
        assert_eq!(plan(&records, 5, Limits { max_age_ms: 0, max_count: 1 }), vec![1, 2, 3]);
    }

    /// The naive model: sort, drop the old, drop the oldest beyond the count.
    fn model(records: &[Record], now_ms: u64, limits: Limits) -> Vec<usize> {
        let too_old =
            |record: &Record| limits.max_age_ms > 0 && now_ms.saturating_sub(record.at_ms) > limits.max_age_ms;
        let mut pruned: Vec<usize> =
            (0..records.len()).filter(|&at| !records[at].exempt && too_old(&records[at])).collect();
        if limits.max_count > 0 {
            let mut left: Vec<usize> = (0..records.len()).filter(|at| !pruned.contains(at)).collect();
            while left.len() > limits.max_count {
                let oldest =
                    left.iter().copied().filter(|&at| !records[at].exempt).min_by_key(|&at| (records[at].at_ms, at));
                match oldest {
                    Some(at) => {
                        pruned.push(at);
                        left.retain(|&x| x != at);
                    }
                    None => break,
                }
            }
        }
        pruned.sort_unstable();
        pruned
    }

    /// What `store::retention` does: a first pass keeps the times of the
    /// records the age limit keeps, a second applies the cut in order.
    fn two_passes(records: &[Record], now_ms: u64, limits: Limits) -> Vec<usize> {
        if !limits.is_on() {
            return Vec::new();
        }
        let mut pruned: Vec<usize> = (0..records.len()).filter(|&at| limits.expired(records[at], now_ms)).collect();
        let mut times: Vec<u64> = records
            .iter()
            .filter(|record| !record.exempt && !limits.expired(**record, now_ms))
            .map(|record| record.at_ms)
            .collect();
        if let Some(mut cut) = count_cut(&mut times, records.len() - pruned.len(), limits) {
            for (at, record) in records.iter().enumerate() {
                if !limits.expired(*record, now_ms) && cut.take(*record) {
                    pruned.push(at);
                }
            }
        }
        pruned.sort_unstable();
        pruned
    }

    #[test]
    fn a_cut_takes_the_older_and_as_many_ties_as_it_holds() {
        let mut times = vec![30, 10, 20, 20, 40];
        let limits = Limits { max_age_ms: 0, max_count: 3 };
        assert_eq!(count_cut(&mut times, 5, limits), Some(CountCut { before_ms: 20, ties: 1 }));
        assert_eq!(count_cut(&mut [10, 20], 2, limits), None, "within the count");
        assert_eq!(count_cut(&mut [], 9, limits), None, "nothing prunable");
        let mut cut = CountCut { before_ms: 20, ties: 1 };
        let taken: Vec<bool> = [30, 10, 20, 20, 40].into_iter().map(|at_ms| cut.take(r(at_ms))).collect();
        assert_eq!(taken, [false, true, true, false, false]);
    }

    fn records() -> impl Strategy<Value = Vec<Record>> {
        proptest::collection::vec((0u64..50, proptest::bool::weighted(0.2)), 0..40)
            .prop_map(|rows| rows.into_iter().map(|(at_ms, exempt)| Record { at_ms, exempt }).collect())
    }

    proptest! {
        #[test]
        fn plan_matches_the_naive_model(records in records(), now in 0u64..80, age in 0u64..40, count in 0usize..20) {
            let limits = Limits { max_age_ms: age, max_count: count };
            prop_assert_eq!(plan(&records, now, limits), model(&records, now, limits));
        }

        #[test]
        fn two_passes_prune_what_the_plan_prunes(records in records(), now in 0u64..80, age in 0u64..40, count in 0usize..20) {
            let limits = Limits { max_age_ms: age, max_count: count };
            prop_assert_eq!(two_passes(&records, now, limits), plan(&records, now, limits));
        }

        #[test]
        fn limits_hold_and_nothing_exempt_is_pruned(records in records(), now in 0u64..80, age in 0u64..40, count in 0usize..20) {
            let limits = Limits { max_age_ms: age, max_count: count };
            let pruned = plan(&records, now, limits);
            prop_assert!(pruned.iter().all(|&at| !records[at].exempt));
            let kept: Vec<&Record> = (0..records.len()).filter(|at| !pruned.contains(at)).map(|at| &records[at]).collect();
            let exempt = records.iter().filter(|record| record.exempt).count();
            if count > 0 {
                prop_assert!(kept.len() <= count.max(exempt));
            }
            if age > 0 {
                prop_assert!(kept.iter().all(|record| record.exempt || now.saturating_sub(record.at_ms) <= age));
            }
            // Nothing is pruned that neither limit asks for.
            if age > 0 && count == 0 {
                prop_assert!(pruned.iter().all(|&at| now.saturating_sub(records[at].at_ms) > age));
            }
            // Every kept non-exempt record is at least as new as every record pruned for the count.
            if age == 0 && count > 0 {
                let newest_pruned = pruned.iter().map(|&at| (records[at].at_ms, at)).max();
                let oldest_kept = (0..records.len()).filter(|at| !pruned.contains(at) && !records[*at].exempt).map(|at| (records[at].at_ms, at)).min();
                if let (Some(pruned), Some(kept)) = (newest_pruned, oldest_kept) {
                    prop_assert!(pruned < kept);
                }
            }
        }
    }
}
