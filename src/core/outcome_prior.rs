//! The outcome prior: per-capability success statistics from task outcomes
//! and dispatch results ([`OutcomeStats`]), turned into a bounded, decaying
//! prior ([`OutcomePrior`]) that nudges discovery's relevance; configured by
//! `[discovery] outcome_prior_*` ([`OutcomePriorSettings`]).
//!
//! Statistics: every capability listed in an outcome's
//! `capabilities` is credited with the outcome's score; a dispatch result
//! counts 1 (success) or 0 (failure). Scores and counts decay with time: an
//! observation `Δt` old weighs `0.5^(Δt / half_life_ms)` ([`DecayedStat`]), so
//! with the default half-life of 7 days a week-old failure counts half.
//!
//! Prior ([`OutcomeStats::snapshot`]): with `m` the decayed mean score of
//! every observation (all capabilities), a capability with decayed score sum
//! `s` over decayed weight `n` gets the Beta-smoothed mean
//! `p = (s + k·m) / (n + k)` (`k` = `pseudo_count` observations at the mean),
//! and the adjustment `a = X · (p − m) / m` when `p < m`, `X · (p − m) / (1 − m)`
//! otherwise, which is in `[−X, X]` (`X` = `strength`). Discovery multiplies
//! a hit's relevance by `1 + a` (clamped to [0, 1]) after fusion and graph
//! re-ranking and before tiering ([`OutcomePrior::apply`]).
//!
//! Neutral cases: no data gives `a = 0` for everyone; so do outcomes that
//! treat every capability alike (every `p` equals `m`), e.g. a provider
//! outage that fails every turn. Only capabilities that do *better or worse
//! than the rest* move. A hit that names a capability exactly (id or name)
//! is never adjusted.
//!
//! Near-duplicates ([`NearDuplicates`], from the outcome memory's
//! neighbourhood, [`crate::core::outcome_memory::Neighbourhood`]): a
//! capability the prior says nothing about borrows the adjustments of the
//! remembered capabilities whose own vectors are nearly its own, weighted as
//! the memory weighs them (`w`, `W = Σ w`): `a = min(W, 1) · Σ w·a_s / W`.
//! Another server's copy of a tool that did the job is then not sunk below it
//! for having no outcomes of its own ([`OutcomePrior::with_near`]).

use crate::core::retrieval::RankedHit;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// The most capabilities an [`OutcomeStats`] tracks unless told otherwise
/// (`[retention] outcome_prior_max_count`, which `capdex serve` gives it).
pub const DEFAULT_MAX_TRACKED_CAPABILITIES: usize = 100_000;
/// A tracked capability whose decayed weight falls below this is forgotten.
pub const FORGET_BELOW_WEIGHT: f64 = 1e-3;

/// How strongly and for how long outcomes shape the ranking. Defaults are
/// small on purpose: at most ±10% of relevance.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutcomePriorSettings {
    /// Whether discovery applies the prior (per query, `outcomePrior` overrides it).
    pub enabled: bool,
    /// The largest relative change of a relevance, in [0, 0.5].
    pub strength: f32,
    /// Time for an observation's weight to halve, in milliseconds (> 0).
    pub half_life_ms: u64,
    /// Observations at the mean that smooth each capability's rate (> 0).
    pub pseudo_count: f32,
}

impl Default for OutcomePriorSettings {
    fn default() -> Self {
        OutcomePriorSettings { enabled: true, strength: 0.1, half_life_ms: 7 * 86_400_000, pseudo_count: 5.0 }
    }
}

impl OutcomePriorSettings {
    /// Checks every range; returns the offending field (config key) and problem.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(self.strength.is_finite() && (0.0..=0.5).contains(&self.strength)) {
            return Err(("outcome_prior_strength", format!("must be a number in [0, 0.5], got {}", self.strength)));
        }
        if self.half_life_ms == 0 || self.half_life_ms > 10 * 365 * 86_400_000 {
            return Err((
                "outcome_prior_half_life_ms",
                format!("must be in 1..=315360000000 (ten years), got {}", self.half_life_ms),
            ));
        }
        if !(self.pseudo_count.is_finite() && (0.01..=10_000.0).contains(&self.pseudo_count)) {
            return Err((
                "outcome_prior_pseudo_count",
                format!("must be a number in [0.01, 10000], got {}", self.pseudo_count),
            ));
        }
        Ok(())
    }
}

/// A time-decayed sum of scores and of weights, as of `at_ms`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DecayedStat {
    pub score_sum: f64,
    pub weight: f64,
    pub at_ms: u64,
}

impl DecayedStat {
    /// Returns the stat as of `now_ms`: both sums times `0.5^((now − at) / half_life)`.
    /// A `now_ms` before `at_ms` (a clock step) decays nothing.
    pub fn decayed(self, now_ms: u64, half_life_ms: u64) -> DecayedStat {
        if now_ms <= self.at_ms {
            return self;
        }
        let factor = 0.5f64.powf((now_ms - self.at_ms) as f64 / half_life_ms.max(1) as f64);
        DecayedStat { score_sum: self.score_sum * factor, weight: self.weight * factor, at_ms: now_ms }
    }

    /// Adds one observation of `score` (in [0, 1]) at `at_ms`.
    pub fn add(&mut self, score: f32, at_ms: u64, half_life_ms: u64) {
        let mut next = self.decayed(at_ms, half_life_ms);
        next.score_sum += f64::from(score.clamp(0.0, 1.0));
        next.weight += 1.0;
        debug_assert!(next.score_sum <= next.weight + 1e-9);
        *self = next;
    }

    /// The decayed mean score, `None` without weight.
    pub fn mean(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| (self.score_sum / self.weight).clamp(0.0, 1.0))
    }
}

/// Every tracked capability's statistics, and those of all observations together.
///
/// At most `max_capabilities` capabilities are tracked: the capability ids of
/// outcomes come from outside, so the table is bounded. When it is full, an
/// observation of a capability it does not track changes nothing
/// ([`Credited::Ignored`], counted by `capdex_outcome_prior_ignored_total`)
/// until [`OutcomeStats::prune`] forgets capabilities whose evidence has
/// decayed away; tracked capabilities keep being credited. Nothing is evicted
/// to make room, so a burst of invented ids cannot push out the evidence of
/// the capabilities already tracked. A table loaded over a lowered bound is
/// kept whole and takes no new capability until it is back under it.
#[derive(Clone, Debug, PartialEq)]
pub struct OutcomeStats {
    pub global: DecayedStat,
    pub capabilities: HashMap<String, DecayedStat>,
    /// The most capabilities tracked.
    pub max_capabilities: usize,
}

impl Default for OutcomeStats {
    fn default() -> OutcomeStats {
        OutcomeStats {
            global: DecayedStat::default(),
            capabilities: HashMap::new(),
            max_capabilities: DEFAULT_MAX_TRACKED_CAPABILITIES,
        }
    }
}

/// What one observation changed, to be stored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Credited {
    /// The capability's stat (and the global one) changed.
    Updated(DecayedStat),
    /// The capability is not tracked and the table is full: nothing changed.
    Ignored,
}

impl OutcomeStats {
    /// The same statistics, tracking at most `max_capabilities` capabilities.
    pub fn with_max_capabilities(mut self, max_capabilities: usize) -> OutcomeStats {
        self.max_capabilities = max_capabilities;
        self
    }

    /// Credits `capability_id` with `score` observed at `at_ms`; a capability
    /// not tracked when `max_capabilities` are is ignored (see the type's docs).
    pub fn credit(&mut self, capability_id: &str, score: f32, at_ms: u64, half_life_ms: u64) -> Credited {
        if !self.capabilities.contains_key(capability_id) {
            if self.capabilities.len() >= self.max_capabilities {
                return Credited::Ignored;
            }
            self.capabilities.insert(capability_id.to_string(), DecayedStat::default());
        }
        let stat = self.capabilities.get_mut(capability_id).expect("the capability was just ensured");
        stat.add(score, at_ms, half_life_ms);
        let updated = *stat;
        self.global.add(score, at_ms, half_life_ms);
        Credited::Updated(updated)
    }

    /// Forgets capabilities whose weight has decayed below [`FORGET_BELOW_WEIGHT`]
    /// by `now_ms`; returns their ids (sorted) so the store can drop them too.
    pub fn prune(&mut self, now_ms: u64, half_life_ms: u64) -> Vec<String> {
        let mut forgotten: Vec<String> = self
            .capabilities
            .iter()
            .filter(|(_, stat)| stat.decayed(now_ms, half_life_ms).weight < FORGET_BELOW_WEIGHT)
            .map(|(id, _)| id.clone())
            .collect();
        forgotten.sort();
        for id in &forgotten {
            self.capabilities.remove(id);
        }
        forgotten
    }

    /// Computes every capability's adjustment as of `now_ms` (see the module docs).
    pub fn snapshot(&self, settings: &OutcomePriorSettings, now_ms: u64) -> OutcomePrior {
        let strength = f64::from(settings.strength);
        let Some(mean) = self.global.decayed(now_ms, settings.half_life_ms).mean() else {
            return OutcomePrior::neutral();
        };
        let k = f64::from(settings.pseudo_count);
        let adjustments = self
            .capabilities
            .iter()
            .filter_map(|(id, stat)| {
                let stat = stat.decayed(now_ms, settings.half_life_ms);
                let smoothed = (stat.score_sum + k * mean) / (stat.weight + k);
                let gap = smoothed - mean;
                let room = if gap < 0.0 { mean } else { 1.0 - mean };
                let adjustment = if room > 1e-9 { (strength * gap / room).clamp(-strength, strength) } else { 0.0 };
                // Below a millionth the adjustment is float noise from the decay, not evidence.
                (adjustment.abs() > 1e-6).then(|| (id.clone(), adjustment as f32))
            })
            .collect();
        OutcomePrior { adjustments: Arc::new(adjustments), near: None }
    }
}

/// Returns `ids` without repeats, first occurrences in order: a capability
/// listed twice in one outcome is credited once.
pub fn distinct_ids(ids: &[String]) -> impl Iterator<Item = &str> {
    ids.iter().enumerate().filter(|(i, id)| !ids[..*i].contains(id)).map(|(_, id)| id.as_str())
}

/// For capabilities the prior says nothing about, the remembered
/// near-duplicates they borrow its adjustment from, with their weights in
/// `(0, 1]` (module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NearDuplicates {
    /// The capabilities lent from; pairs name them by position.
    sources: Vec<String>,
    by_id: HashMap<String, Vec<(u32, f32)>>,
}

impl NearDuplicates {
    /// From `(capability_id, source, weight)` pairs, `source` a position in
    /// `sources`; a pair naming no source, its own source, or a weight that
    /// is not finite and positive is left out.
    pub fn from_pairs(sources: Vec<String>, pairs: impl IntoIterator<Item = (String, u32, f32)>) -> NearDuplicates {
        let mut by_id: HashMap<String, Vec<(u32, f32)>> = HashMap::new();
        for (id, source, weight) in pairs {
            let lends = sources.get(source as usize).is_some_and(|lender| *lender != id);
            if lends && weight.is_finite() && weight > 0.0 {
                by_id.entry(id).or_default().push((source, weight));
            }
        }
        NearDuplicates { sources, by_id }
    }

    /// Number of capabilities that borrow.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// What `capability_id` borrows of `adjustments`: `min(W, 1) · Σ w·a_s / W`.
    fn borrowed(&self, capability_id: &str, adjustments: &HashMap<String, f32>) -> f32 {
        let Some(near) = self.by_id.get(capability_id) else { return 0.0 };
        let (mut weighted, mut total) = (0.0f32, 0.0f32);
        for &(source, weight) in near {
            let adjustment = adjustments.get(&self.sources[source as usize]).copied().unwrap_or(0.0);
            weighted += weight * adjustment;
            total += weight;
        }
        if total > 0.0 {
            total.min(1.0) * weighted / total
        } else {
            0.0
        }
    }
}

/// The outcome prior as of one moment (a snapshot the KPI actor publishes):
/// the adjustments discovery applies, relative changes of relevance, each in
/// `[−strength, strength]`; capabilities not listed are unchanged, unless
/// they borrow from near-duplicates ([`OutcomePrior::with_near`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutcomePrior {
    adjustments: Arc<HashMap<String, f32>>,
    near: Option<Arc<NearDuplicates>>,
}

impl OutcomePrior {
    /// A prior that changes nothing.
    pub fn neutral() -> OutcomePrior {
        OutcomePrior::default()
    }

    /// This prior, with each capability it has no adjustment for borrowing
    /// from its `near` duplicates (module docs); shares the adjustments, so
    /// it costs two reference counts.
    pub fn with_near(&self, near: Arc<NearDuplicates>) -> OutcomePrior {
        OutcomePrior { adjustments: self.adjustments.clone(), near: Some(near) }
    }

    /// Returns the relative change of `capability_id`'s relevance: its own,
    /// else what it borrows from its near-duplicates, else 0.
    pub fn adjustment(&self, capability_id: &str) -> f32 {
        match (self.adjustments.get(capability_id), &self.near) {
            (Some(adjustment), _) => *adjustment,
            (None, Some(near)) => near.borrowed(capability_id, &self.adjustments),
            (None, None) => 0.0,
        }
    }

    /// Whether the prior has an adjustment of its own for `capability_id`
    /// (something was learnt about it, not borrowed).
    pub fn knows(&self, capability_id: &str) -> bool {
        self.adjustments.contains_key(capability_id)
    }

    /// How many capabilities it adjusts.
    pub fn len(&self) -> usize {
        self.adjustments.len()
    }

    pub fn is_empty(&self) -> bool {
        self.adjustments.is_empty()
    }

    /// Multiplies each hit's relevance by `1 + adjustment` (clamped to [0, 1]),
    /// except exact-name hits, and re-sorts best first; ties keep their order,
    /// so a neutral prior leaves `hits` exactly as they were.
    ///
    /// # Examples
    ///
    /// ```
    /// use capdex::core::outcome_prior::{OutcomeStats, OutcomePriorSettings};
    /// use capdex::core::retrieval::RankedHit;
    /// let settings = OutcomePriorSettings::default();
    /// let mut stats = OutcomeStats::default();
    /// for at_ms in 0..20 {
    ///     stats.credit("tool:flaky", 0.0, at_ms, settings.half_life_ms);
    ///     stats.credit("tool:solid", 1.0, at_ms, settings.half_life_ms);
    /// }
    /// let hit = |id: &str, relevance| RankedHit { id: id.into(), relevance, exact: None };
    /// let mut hits = vec![hit("tool:flaky", 0.80), hit("tool:solid", 0.75)];
    /// stats.snapshot(&settings, 20).apply(&mut hits);
    /// assert_eq!(hits[0].id, "tool:solid");
    /// ```
    pub fn apply(&self, hits: &mut [RankedHit]) {
        if self.adjustments.is_empty() {
            return;
        }
        for hit in hits.iter_mut().filter(|hit| hit.exact.is_none()) {
            let adjustment = self.adjustment(&hit.id);
            if adjustment != 0.0 {
                hit.relevance = (hit.relevance * (1.0 + adjustment)).clamp(0.0, 1.0);
            }
        }
        hits.sort_by(|a, b| b.relevance.total_cmp(&a.relevance));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The prior after ten turns that `proven` did and `failed` did not (default settings).
    pub(crate) fn proven_and_failed(proven: &str, failed: &str) -> OutcomePrior {
        let settings = OutcomePriorSettings::default();
        let mut stats = OutcomeStats::default();
        for turn in 0..10 {
            stats.credit(proven, 1.0, turn, settings.half_life_ms);
            stats.credit(failed, 0.0, turn, settings.half_life_ms);
        }
        stats.snapshot(&settings, 10)
    }

    const DAY: u64 = 86_400_000;

    fn hit(id: &str, relevance: f32) -> RankedHit {
        RankedHit { id: id.into(), relevance, exact: None }
    }

    fn ids(hits: &[RankedHit]) -> Vec<&str> {
        hits.iter().map(|hit| hit.id.as_str()).collect()
    }

    #[test]
    fn no_data_is_neutral() {
        let snapshot = OutcomeStats::default().snapshot(&OutcomePriorSettings::default(), 5);
        assert!(snapshot.is_empty());
        let mut hits = vec![hit("a", 0.5), hit("b", 0.5), hit("c", 0.7)];
        snapshot.apply(&mut hits);
        assert_eq!(ids(&hits), vec!["a", "b", "c"], "a neutral prior does not even re-sort");
    }

    #[test]
    fn a_capability_the_prior_says_nothing_about_borrows_from_its_near_duplicates() {
        let prior = proven_and_failed("tool:proven", "tool:flaky");
        let proven = prior.adjustment("tool:proven");
        assert!(proven > 0.0 && prior.adjustment("tool:flaky") < 0.0);
        let sources = ["tool:proven", "tool:flaky", "tool:self"].map(String::from).to_vec();
        let pairs = [
            ("tool:copy", 0, 1.0),
            ("tool:half-copy", 0, 0.5),
            ("tool:between", 0, 0.5),
            ("tool:between", 1, 1.0),
            ("tool:flaky", 0, 1.0),
            ("tool:self", 2, 1.0),
            ("tool:nan", 0, f32::NAN),
            ("tool:zero", 0, 0.0),
            ("tool:nowhere", 3, 1.0),
        ];
        let near =
            NearDuplicates::from_pairs(sources, pairs.map(|(id, source, weight)| (id.to_string(), source, weight)));
        assert_eq!(near.len(), 4, "itself, no source, and weights that are not positive are left out");
        let with_near = prior.with_near(Arc::new(near));
        assert_eq!(with_near.adjustment("tool:copy"), proven);
        assert!((with_near.adjustment("tool:half-copy") - 0.5 * proven).abs() < 1e-6, "weight below 1: the rest is 0");
        let between = (0.5 * proven + prior.adjustment("tool:flaky")) / 1.5;
        assert!((with_near.adjustment("tool:between") - between).abs() < 1e-6);
        assert_eq!(with_near.adjustment("tool:flaky"), prior.adjustment("tool:flaky"), "its own first");
        assert_eq!(with_near.adjustment("tool:other"), 0.0);
        assert!(with_near.knows("tool:proven") && !with_near.knows("tool:copy"));
        // The copy is no longer sunk below the proven capability it duplicates.
        let mut hits = vec![hit("tool:copy", 0.6), hit("tool:proven", 0.6), hit("tool:plain", 0.62)];
        prior.apply(&mut hits);
        assert_eq!(ids(&hits), vec!["tool:proven", "tool:plain", "tool:copy"]);
        let mut hits = vec![hit("tool:copy", 0.6), hit("tool:proven", 0.6), hit("tool:plain", 0.62)];
        with_near.apply(&mut hits);
        assert_eq!(ids(&hits), vec!["tool:copy", "tool:proven", "tool:plain"]);
    }

    #[test]
    fn outcomes_that_treat_everyone_alike_are_neutral() {
        let settings = OutcomePriorSettings::default();
        for score in [0.0, 0.4, 1.0] {
            let mut stats = OutcomeStats::default();
            for at_ms in 0..30 {
                stats.credit("a", score, at_ms * 1_000, settings.half_life_ms);
                stats.credit(if at_ms % 3 == 0 { "b" } else { "c" }, score, at_ms * 1_000, settings.half_life_ms);
            }
            assert!(stats.snapshot(&settings, 30_000).is_empty(), "score {score}");
        }
    }

    #[test]
    fn a_capability_in_failed_turns_sinks_below_a_proven_one() {
        let settings = OutcomePriorSettings::default();
        let snapshot = proven_and_failed("tool:proven", "tool:flaky");
        let (flaky, proven) = (snapshot.adjustment("tool:flaky"), snapshot.adjustment("tool:proven"));
        assert!(flaky < 0.0 && proven > 0.0, "{flaky} {proven}");
        assert!(flaky >= -settings.strength && proven <= settings.strength);
        // k = 5, m = 0.5: p = 5·0.5 / 15 = 1/6 and 12.5 / 15 = 5/6, so a = ∓0.1 · (1/3) / 0.5.
        assert!((flaky + 0.1 * 2.0 / 3.0).abs() < 1e-6, "{flaky}");
        let mut hits = vec![hit("tool:flaky", 0.80), hit("tool:other", 0.78), hit("tool:proven", 0.76)];
        snapshot.apply(&mut hits);
        assert_eq!(ids(&hits), vec!["tool:proven", "tool:other", "tool:flaky"]);
        // An exact-name hit keeps its place whatever its record.
        let mut exact = vec![RankedHit { exact: Some(crate::core::lexical::ExactMatch::Id), ..hit("tool:flaky", 1.0) }];
        snapshot.apply(&mut exact);
        assert_eq!(exact[0].relevance, 1.0);
    }

    #[test]
    fn evidence_decays_with_the_half_life() {
        let settings = OutcomePriorSettings::default();
        let mut stat = DecayedStat::default();
        stat.add(1.0, 0, settings.half_life_ms);
        stat.add(0.0, 0, settings.half_life_ms);
        let week_later = stat.decayed(7 * DAY, settings.half_life_ms);
        assert!((week_later.weight - 1.0).abs() < 1e-9 && (week_later.score_sum - 0.5).abs() < 1e-9);
        assert_eq!(stat.decayed(0, settings.half_life_ms), stat, "a clock step back decays nothing");
        // Old evidence fades towards neutral: the same record counts less a month later.
        let mut stats = OutcomeStats::default();
        for turn in 0..10 {
            stats.credit("bad", 0.0, turn, settings.half_life_ms);
            stats.credit("good", 1.0, turn, settings.half_life_ms);
        }
        let fresh = stats.snapshot(&settings, 10).adjustment("bad");
        let old = stats.snapshot(&settings, 30 * DAY).adjustment("bad");
        assert!(fresh < old && old < 0.0, "{fresh} {old}");
        assert_eq!(stats.prune(10, settings.half_life_ms), Vec::<String>::new());
        assert_eq!(stats.prune(200 * DAY, settings.half_life_ms), vec!["bad".to_string(), "good".to_string()]);
        assert!(stats.capabilities.is_empty());
    }

    #[test]
    fn at_most_max_capabilities_are_tracked_and_room_comes_back_when_evidence_decays() {
        let settings = OutcomePriorSettings::default();
        let half_life = settings.half_life_ms;
        let mut stats = OutcomeStats::default().with_max_capabilities(3);
        for id in ["a", "b", "c"] {
            assert!(matches!(stats.credit(id, 1.0, 0, half_life), Credited::Updated(_)), "{id}: at the bound");
        }
        let global = stats.global;
        assert_eq!(stats.credit("d", 0.0, 1, half_life), Credited::Ignored, "one over the bound");
        assert_eq!((stats.capabilities.len(), stats.global), (3, global), "an ignored observation changes nothing");
        assert!(matches!(stats.credit("a", 0.0, 2, half_life), Credited::Updated(_)), "tracked ones still count");
        // "b" and "c" decay away; "a" is credited again late: pruning makes room for "d".
        stats.credit("a", 1.0, 200 * DAY, half_life);
        assert_eq!(stats.prune(200 * DAY, half_life), vec!["b".to_string(), "c".to_string()]);
        assert!(matches!(stats.credit("d", 1.0, 200 * DAY, half_life), Credited::Updated(_)));
        assert_eq!(OutcomeStats::default().max_capabilities, DEFAULT_MAX_TRACKED_CAPABILITIES);
    }

    #[test]
    fn settings_are_validated() {
        assert!(OutcomePriorSettings::default().validate().is_ok());
        let bad = |settings: OutcomePriorSettings| settings.validate().unwrap_err().0;
        assert_eq!(bad(OutcomePriorSettings { strength: f32::NAN, ..Default::default() }), "outcome_prior_strength");
        assert_eq!(bad(OutcomePriorSettings { strength: 0.9, ..Default::default() }), "outcome_prior_strength");
        assert_eq!(bad(OutcomePriorSettings { half_life_ms: 0, ..Default::default() }), "outcome_prior_half_life_ms");
        assert_eq!(bad(OutcomePriorSettings { pseudo_count: 0.0, ..Default::default() }), "outcome_prior_pseudo_count");
    }

    proptest! {
        /// Adjustments stay within ±strength, and relevance within [0, 1], whatever the record.
        #[test]
        fn the_prior_is_bounded(
            observations in proptest::collection::vec((0usize..6, 0.0f32..=1.0, 0u64..(30 * DAY)), 0..200),
            strength in 0.0f32..=0.5,
            relevances in proptest::collection::vec(0.0f32..=1.0, 6),
        ) {
            let settings = OutcomePriorSettings { strength, ..Default::default() };
            let mut stats = OutcomeStats::default();
            let mut sorted = observations.clone();
            sorted.sort_by_key(|(_, _, at_ms)| *at_ms);
            for (capability, score, at_ms) in sorted {
                stats.credit(&format!("c{capability}"), score, at_ms, settings.half_life_ms);
            }
            let snapshot = stats.snapshot(&settings, 30 * DAY);
            // A ranking comes best first.
            let mut hits: Vec<RankedHit> =
                relevances.iter().enumerate().map(|(i, relevance)| hit(&format!("c{i}"), *relevance)).collect();
            hits.sort_by(|a, b| b.relevance.total_cmp(&a.relevance));
            for hit in &hits {
                let adjustment = snapshot.adjustment(&hit.id);
                prop_assert!(adjustment.abs() <= strength + 1e-6);
            }
            snapshot.apply(&mut hits);
            for pair in hits.windows(2) {
                prop_assert!(pair[0].relevance >= pair[1].relevance);
            }
            for hit in &hits {
                prop_assert!((0.0..=1.0).contains(&hit.relevance));
            }
        }
    }
}
