//! What the dispatch pipeline measured of each capability since the node
//! started: calls, errors, and latency percentiles from a log-bucket
//! histogram ([`LatencyHistogram`]) with a bounded relative error.
//!
//! Memory is bounded twice: a histogram has at most [`BUCKETS`] counters
//! (grown only as far as the slowest call needs), and [`DispatchFigures`]
//! tracks at most its `max_capabilities`; when full, the shell prunes the
//! capabilities its registry no longer holds ([`DispatchFigures::retain`])
//! and a capability that still finds no room is counted as untracked.

use crate::core::console::model::CapabilityFigures;
use std::collections::HashMap;

/// The relative error of a histogram's quantile: an estimate is within
/// `RELATIVE_ERROR` of the true value (for values up to [`MAX_TRACKED_US`]).
pub const RELATIVE_ERROR: f64 = 0.02;
/// `γ = (1 + α) / (1 - α)`: each bucket's upper bound is `γ` times its lower.
const GAMMA: f64 = (1.0 + RELATIVE_ERROR) / (1.0 - RELATIVE_ERROR);
/// The largest latency the error bound holds for: 2³⁶ µs, about 19 hours;
/// slower calls fall into the last bucket.
pub const MAX_TRACKED_US: u64 = 1 << 36;
/// Buckets: one for 0 µs, one per power `γ^k` for `k` in `0..=624` (up to
/// [`MAX_TRACKED_US`], as `⌈ln 2³⁶ / ln γ⌉ = 624`), and a last one for slower calls.
pub const BUCKETS: usize = 627;
/// How many capabilities [`DispatchFigures::default`] tracks (`capdex serve`
/// gives `[retention] dispatch_figures_max_count`).
pub const DEFAULT_MAX_CAPABILITIES: usize = 4096;

/// Latencies in microseconds, counted in logarithmic buckets.
///
/// Bucket 0 holds 0 µs; bucket `k + 1` holds `(γ^(k-1), γ^k]` µs, so every
/// value in it is within `α` ([`RELATIVE_ERROR`]) of its representative
/// `2γ^k / (γ + 1)` (exactly 1 for `k = 0`). A quantile is the representative
/// of the bucket that holds the nearest-rank sample, so it is within `α` of
/// the true nearest-rank quantile.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyHistogram {
    /// Grown on demand to the highest bucket used, never past [`BUCKETS`].
    counts: Vec<u64>,
    total: u64,
}

fn bucket_of(latency_us: u64) -> usize {
    if latency_us == 0 {
        return 0;
    }
    let k = ((latency_us as f64).ln() / GAMMA.ln()).ceil().max(0.0) as usize;
    (k + 1).min(BUCKETS - 1)
}

fn representative_us(bucket: usize) -> f64 {
    match bucket {
        0 => 0.0,
        1 => 1.0,
        _ => 2.0 * GAMMA.powi((bucket - 1) as i32) / (GAMMA + 1.0),
    }
}

impl LatencyHistogram {
    pub fn record(&mut self, latency_us: u64) {
        let bucket = bucket_of(latency_us);
        if self.counts.len() <= bucket {
            self.counts.resize(bucket + 1, 0);
        }
        self.counts[bucket] += 1;
        self.total += 1;
    }

    /// How many latencies it holds.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `q`-quantile (`q` in [0, 1], clamped) in microseconds: the
    /// estimate of the sample of rank `max(1, ⌈q·n⌉)`; `None` when empty.
    pub fn quantile_us(&self, q: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let q = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0u64;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(representative_us(bucket));
            }
        }
        self.counts.len().checked_sub(1).map(representative_us)
    }
}

/// One capability's counts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    pub calls: u64,
    pub errors: u64,
    /// Latencies of completed calls (a handler or endpoint ran).
    pub latency: LatencyHistogram,
}

impl Figures {
    /// What the console shows: counts, and p50 and p99 in milliseconds.
    pub fn summary(&self) -> CapabilityFigures {
        let ms = |q| self.latency.quantile_us(q).map(|us| us / 1_000.0);
        CapabilityFigures { calls: self.calls, errors: self.errors, p50_ms: ms(0.5), p99_ms: ms(0.99) }
    }
}

/// One answered call, as the figures count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallSeen {
    /// The call answered an error (any code, refusals included).
    pub error: bool,
    /// A handler or endpoint ran for it (not a refusal, not a replay): its latency is counted.
    pub completed: bool,
    pub latency_us: u64,
}

/// Whether [`DispatchFigures::record`] counted a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    Yes,
    /// The table is full and this capability is not in it.
    Full,
}

/// The figures of every tracked capability, by capability id.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchFigures {
    by_capability: HashMap<String, Figures>,
    max_capabilities: usize,
    /// Calls of capabilities that found no room.
    untracked_calls: u64,
}

impl Default for DispatchFigures {
    fn default() -> Self {
        DispatchFigures::new(DEFAULT_MAX_CAPABILITIES)
    }
}

impl DispatchFigures {
    /// An empty table that tracks at most `max_capabilities` capabilities.
    pub fn new(max_capabilities: usize) -> DispatchFigures {
        DispatchFigures { by_capability: HashMap::new(), max_capabilities, untracked_calls: 0 }
    }

    /// Counts one call of `capability_id`; a new capability takes a place only while there is room.
    pub fn record(&mut self, capability_id: &str, call: CallSeen) -> Counted {
        if !self.by_capability.contains_key(capability_id) {
            if self.by_capability.len() >= self.max_capabilities {
                return Counted::Full;
            }
            self.by_capability.insert(capability_id.to_string(), Figures::default());
        }
        let Some(figures) = self.by_capability.get_mut(capability_id) else { return Counted::Full };
        figures.calls += 1;
        figures.errors += u64::from(call.error);
        if call.completed {
            figures.latency.record(call.latency_us);
        }
        Counted::Yes
    }

    /// Counts a call that found no room (after [`DispatchFigures::record`] answered [`Counted::Full`]).
    pub fn count_untracked(&mut self) {
        self.untracked_calls += 1;
    }

    /// Keeps only the capabilities `keep` accepts (the ones the registry still holds).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.by_capability.retain(|id, _| keep(id));
    }

    pub fn len(&self) -> usize {
        self.by_capability.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_capability.is_empty()
    }

    pub fn untracked_calls(&self) -> u64 {
        self.untracked_calls
    }

    pub fn get(&self, capability_id: &str) -> Option<&Figures> {
        self.by_capability.get(capability_id)
    }

    /// Every tracked capability's summary, by capability id.
    pub fn summaries(&self) -> HashMap<String, CapabilityFigures> {
        self.by_capability.iter().map(|(id, figures)| (id.clone(), figures.summary())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seen(error: bool, completed: bool, latency_us: u64) -> CallSeen {
        CallSeen { error, completed, latency_us }
    }

    #[test]
    fn the_bucket_count_covers_the_tracked_range() {
        let needed = ((MAX_TRACKED_US as f64).ln() / GAMMA.ln()).ceil() as usize + 2;
        assert_eq!(needed, BUCKETS - 1, "the last bucket only for slower calls");
        assert!(bucket_of(MAX_TRACKED_US) < BUCKETS - 1);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!((bucket_of(0), bucket_of(1)), (0, 1));
        let mut histogram = LatencyHistogram::default();
        histogram.record(u64::MAX);
        assert_eq!(histogram.counts.len(), BUCKETS, "never past BUCKETS");
    }

    #[test]
    fn figures_count_calls_errors_and_completed_latencies() {
        let mut figures = DispatchFigures::new(2);
        assert_eq!(figures.record("tool:a", seen(false, true, 1_000)), Counted::Yes);
        figures.record("tool:a", seen(true, true, 3_000));
        // A refusal is an error whose latency is not a call's.
        figures.record("tool:a", seen(true, false, 5));
        figures.record("tool:b", seen(false, true, 0));
        assert_eq!(figures.record("tool:c", seen(false, true, 1)), Counted::Full);
        figures.count_untracked();
        let a = figures.get("tool:a").unwrap().summary();
        assert_eq!((a.calls, a.errors), (3, 2));
        let (p50, p99) = (a.p50_ms.unwrap(), a.p99_ms.unwrap());
        assert!((p50 - 1.0).abs() <= 0.02 && (p99 - 3.0).abs() <= 0.06, "{a:?}");
        assert_eq!(figures.get("tool:b").unwrap().summary().p50_ms, Some(0.0));
        assert_eq!(figures.untracked_calls(), 1);
        // Pruned with the registry, the place is free again.
        figures.retain(|id| id != "tool:b");
        assert_eq!(figures.record("tool:c", seen(false, false, 1)), Counted::Yes);
        let c = figures.summaries().remove("tool:c").unwrap();
        assert_eq!(c, CapabilityFigures { calls: 1, errors: 0, p50_ms: None, p99_ms: None });
        assert_eq!(figures.len(), 2);
    }

    proptest! {
        /// Every quantile is within the relative error of the exact nearest-rank quantile.
        #[test]
        fn quantiles_stay_within_the_relative_error(
            latencies in proptest::collection::vec(
                prop_oneof![0u64..50, 0u64..100_000, 0u64..MAX_TRACKED_US], 1..400),
            q in 0.0f64..=1.0,
        ) {
            let mut histogram = LatencyHistogram::default();
            for latency in &latencies {
                histogram.record(*latency);
            }
            let mut sorted = latencies.clone();
            sorted.sort_unstable();
            let n = sorted.len();
            for q in [q, 0.5, 0.99, 0.0, 1.0] {
                let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
                let exact = sorted[rank - 1] as f64;
                let estimate = histogram.quantile_us(q).unwrap();
                prop_assert!(
                    (estimate - exact).abs() <= RELATIVE_ERROR * exact * (1.0 + 1e-9),
                    "q {} exact {} estimate {}", q, exact, estimate
                );
            }
            prop_assert_eq!(histogram.count(), n as u64);
            prop_assert!(histogram.counts.len() <= BUCKETS);
        }
    }
}
