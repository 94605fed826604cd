//! Dispatch state shared by several nodes: what the Dispatcher asks of it
//! ([`SharedDispatch`], implemented over JetStream key-value buckets by the
//! gateway), and the pure rules of using it.
//!
//! When several nodes serve one cluster, a node's sled is only its cache; the
//! truth of every piece of state that decides whether a call may run lives in
//! the shared state:
//! - a re-drive key is claimed with a create-only write, so of five concurrent
//!   duplicates on three nodes one claims it and the others wait for its result
//!   ([`Settled`]);
//! - an approval is used with a write that expects the revision it was read at,
//!   so two nodes running the same approved call cannot both win;
//! - a rate window is one record per (capability, agent): admitted calls
//!   counted per slot of a sixtieth of the window ([`admit_slots`]), so its
//!   size never depends on the limit; it is written back expecting its
//!   revision, and retried a few times on a conflict ([`RATE_ATTEMPTS`]);
//! - capability records and bindings are published before a node applies
//!   them (a new slug create-only, so two nodes cannot both register it), and
//!   every node applies what the others published.

use crate::core::dispatch::approval::Approval;
use crate::core::dispatch::rate_limit::RateRefusal;
use crate::core::dispatch::redrive::{CacheEntry, Claim};
use crate::core::dispatch::registry::{Binding, CapabilityRecord};
use futures::future::LocalBoxFuture;

/// The shared state could not be asked (the cluster is unreachable, a write
/// timed out): the call is refused as `unavailable`, which a client may retry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the cluster's shared state is unavailable: {0}")]
pub struct SharedError(pub String);

/// What a shared operation answers, later.
pub type SharedFuture<T> = LocalBoxFuture<'static, Result<T, SharedError>>;

/// A value and the revision it was read at.
#[derive(Clone, Debug, PartialEq)]
pub struct Versioned<T> {
    pub value: T,
    pub revision: u64,
}

/// What a re-drive key held once it stopped being in progress, or when the wait ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Settled {
    /// Its call succeeded (the entry holds the result) — or the key belongs to another call.
    Entry(Box<CacheEntry>),
    /// Its call failed and freed the key: this call may claim it.
    Released,
    /// Still in progress when the wait ended: its owner is gone or slow, the outcome unknown.
    StillRunning(Box<CacheEntry>),
}

/// The state several nodes share for dispatch.
pub trait SharedDispatch {
    /// Claims a re-drive key with `entry` (in progress), create-only.
    fn claim(&self, key: &[u8], entry: &CacheEntry) -> SharedFuture<Claim>;
    /// Waits up to `within_ms` for a key in progress to settle.
    fn settle(&self, key: &[u8], within_ms: u64) -> SharedFuture<Settled>;
    /// Stores a claimed key's result.
    fn complete(&self, key: &[u8], entry: &CacheEntry) -> SharedFuture<()>;
    /// Frees a claimed key (its call failed, so a re-drive may run it again).
    fn release(&self, key: &[u8]) -> SharedFuture<()>;

    /// An approval as the cluster knows it.
    fn approval(&self, id: &str) -> SharedFuture<Option<Versioned<Approval>>>;
    /// Writes an approval: create-only when `revision` is `None`, else only if it
    /// is still at `revision`. Answers false when it held something else.
    fn put_approval(&self, approval: &Approval, revision: Option<u64>) -> SharedFuture<bool>;

    /// The rate window of (slug, agent) ([`admit_slots`]).
    fn rate_window(&self, slug: &str, agent: &str) -> SharedFuture<Option<Versioned<SlotCounts>>>;
    /// Writes a rate window, expecting `revision` (`None`: the window did not exist).
    fn put_rate_window(
        &self,
        slug: &str,
        agent: &str,
        slots: &[(u64, u32)],
        revision: Option<u64>,
    ) -> SharedFuture<bool>;

    /// Publishes a capability record before this node applies it: create-only
    /// for a new registration (false: the slug is registered in the cluster).
    fn publish_record(&self, record: &CapabilityRecord, create_only: bool) -> SharedFuture<bool>;
    /// Publishes a binding before this node applies it (create-only: only if
    /// the cluster holds none for its agent and capability; false then).
    fn publish_binding(&self, binding: &Binding, create_only: bool) -> SharedFuture<bool>;
}

/// How many times a rate window is read, admitted and written back before a
/// call is refused as `unavailable` because of contention on it.
pub const RATE_ATTEMPTS: usize = 8;

/// A change to the registry that another node published.
#[derive(Clone, Debug, PartialEq)]
pub enum RegistryChange {
    Record(Box<CapabilityRecord>),
    Binding(Binding),
}

/// Slots a shared rate window is counted in: a window of one minute is kept
/// as at most 61 per-second counts, whatever its limit.
pub const RATE_SLOTS: u64 = 60;

/// A shared rate window: admitted calls counted per slot (`slot` is
/// `wall_ms / slot_ms`), oldest first.
pub type SlotCounts = Vec<(u64, u32)>;

/// The next shared rate window when a call at `now_ms` is admitted, or the
/// refusal. A slot counts while any moment of it lies in the window ending
/// now, so the limit is never exceeded in any window (every admitted call in
/// it is counted) and a call is refused at most one slot (`window_ms /
/// RATE_SLOTS`) too early: it is always admitted when fewer than `limit` calls
/// were admitted in the last `window_ms + slot_ms` (proptest below).
pub fn admit_slots(slots: &[(u64, u32)], limit: u32, window_ms: u64, now_ms: u64) -> Result<SlotCounts, RateRefusal> {
    let window_ms = window_ms.max(1);
    let slot_ms = (window_ms / RATE_SLOTS).max(1);
    let counts_until = |slot: u64| (slot + 1).saturating_mul(slot_ms).saturating_add(window_ms);
    let mut live: std::collections::BTreeMap<u64, u32> = std::collections::BTreeMap::new();
    for &(slot, count) in slots.iter().filter(|&&(slot, _)| counts_until(slot) > now_ms) {
        let held = live.entry(slot).or_default();
        *held = held.saturating_add(count);
    }
    let total: u64 = live.values().map(|&count| u64::from(count)).sum();
    if total >= u64::from(limit) {
        // Admitted again once enough of the oldest slots stop counting.
        let mut remaining = total;
        let mut free_at = now_ms;
        for (&slot, &count) in &live {
            remaining -= u64::from(count);
            free_at = counts_until(slot);
            if remaining < u64::from(limit) {
                break;
            }
        }
        return Err(RateRefusal { limit, retry_after_ms: free_at.saturating_sub(now_ms) });
    }
    *live.entry(now_ms / slot_ms).or_default() += 1;
    Ok(live.into_iter().collect())
}

/// How long a call waits for a duplicate of its key running on another node:
/// the capability's timeout and a grace for the result to be stored.
pub fn settle_wait_ms(timeout_ms: u64) -> u64 {
    timeout_ms.saturating_add(SETTLE_GRACE_MS)
}

/// Time for a finished call's result to reach the shared state after its timeout.
pub const SETTLE_GRACE_MS: u64 = 2_000;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_shared_window_admits_up_to_its_limit_and_says_when_to_retry() {
        // A window of 6,000 ms has slots of 100 ms.
        let slots = admit_slots(&[], 2, 6_000, 10).unwrap();
        let slots = admit_slots(&slots, 2, 6_000, 150).unwrap();
        assert_eq!(slots, vec![(0, 1), (1, 1)]);
        // Slot 0 counts until 100 + 6,000.
        assert_eq!(admit_slots(&slots, 2, 6_000, 200), Err(RateRefusal { limit: 2, retry_after_ms: 5_900 }));
        assert_eq!(admit_slots(&slots, 2, 6_000, 6_100).unwrap(), vec![(1, 1), (61, 1)], "slot 0 left the window");
        assert_eq!(admit_slots(&slots, 3, 6_000, 200).unwrap(), vec![(0, 1), (1, 1), (2, 1)]);
    }

    #[test]
    fn its_size_does_not_grow_with_the_limit() {
        let mut slots = Vec::new();
        for t in 0..100_000u64 {
            slots = admit_slots(&slots, 1_000_000, 60_000, t).unwrap();
        }
        assert!(slots.len() <= RATE_SLOTS as usize + 1, "{} slots", slots.len());
    }

    proptest! {
        /// Nodes taking turns on one shared window never admit more than the
        /// limit in any window, and refuse only when the limit was reached within
        /// the window and one slot before it.
        #[test]
        fn never_over_the_limit_and_at_most_one_slot_early(
            steps in proptest::collection::vec((0u64..120, 1u32..5), 1..300),
        ) {
            let (window, slot) = (6_000u64, 100u64);
            let mut shared: SlotCounts = Vec::new();
            let mut admitted: Vec<u64> = Vec::new();
            let mut now = 0;
            for (dt, limit) in steps {
                now += dt;
                let recent = admitted.iter().filter(|&&t| t + window + slot > now).count();
                match admit_slots(&shared, limit, window, now) {
                    Ok(next) => {
                        shared = next;
                        admitted.push(now);
                        let in_window = admitted.iter().filter(|&&t| t + window > now).count();
                        prop_assert!(in_window <= limit as usize, "{in_window} > {limit} at {now}");
                    }
                    Err(refusal) => {
                        prop_assert!(recent >= limit as usize, "refused with {recent} < {limit} recent calls");
                        prop_assert!(refusal.retry_after_ms <= window + slot);
                    }
                }
            }
        }
    }
}
