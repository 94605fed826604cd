//! Rolling task-outcome windows, their KPIs, and alert decisions.
//!
//! A [`KpiWindow`] keeps the last `rolling_window_size` outcomes of one scope.
//! Its [`Kpi`] carries counts, the plain success rate, the mean score and a
//! recency-weighted success rate: the mean score with weights that halve every
//! `window / 4` samples going back, so a recent slump shows before it has
//! filled the window. [`AlertPolicy::evaluate`] turns a KPI into an alert or a
//! recovery, with a per-scope cooldown.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// How a turn ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeStatus {
    Success,
    Partial,
    Failed,
}

impl OutcomeStatus {
    /// The score a status stands for when no score is given.
    pub fn score(self) -> f32 {
        match self {
            OutcomeStatus::Success => 1.0,
            OutcomeStatus::Partial => 0.5,
            OutcomeStatus::Failed => 0.0,
        }
    }

    /// The status a bare score stands for: ≥ 0.75 success, ≥ 0.25 partial.
    pub fn from_score(score: f32) -> OutcomeStatus {
        if score >= 0.75 {
            OutcomeStatus::Success
        } else if score >= 0.25 {
            OutcomeStatus::Partial
        } else {
            OutcomeStatus::Failed
        }
    }
}

/// How outcomes are grouped into windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeMode {
    Global,
    Organization,
    OrganizationPersona,
}

impl ScopeMode {
    /// Returns the scope key of an outcome: `global`, `<org>` or `<org>/<persona>`.
    /// Missing ids fall back to the coarser scope (`global` with no organization).
    pub fn scope_key(self, organization_id: Option<&str>, persona_id: Option<&str>) -> String {
        let organization = organization_id.filter(|id| !id.is_empty());
        let persona = persona_id.filter(|id| !id.is_empty());
        match (self, organization, persona) {
            (ScopeMode::Global, _, _) | (_, None, _) => "global".to_string(),
            (ScopeMode::Organization, Some(org), _) | (ScopeMode::OrganizationPersona, Some(org), None) => {
                org.to_string()
            }
            (ScopeMode::OrganizationPersona, Some(org), Some(persona)) => format!("{org}/{persona}"),
        }
    }
}

/// Who judged an outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeSource {
    Heuristic,
    RequestOverride,
}

/// Which tools a turn was offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolSelectionMode {
    Discovered,
    All,
}

/// A turn's outcome as a runtime reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutcomeReport {
    #[serde(default)]
    pub turn_id: Option<String>,
    #[serde(default)]
    pub organization_id: Option<String>,
    #[serde(default)]
    pub persona_id: Option<String>,
    #[serde(default)]
    pub status: Option<OutcomeStatus>,
    #[serde(default)]
    pub score: Option<f32>,
    #[serde(default)]
    pub source: Option<OutcomeSource>,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub tool_selection_mode: Option<ToolSelectionMode>,
}

/// One scored task outcome.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    pub status: OutcomeStatus,
    pub score: f32,
    pub at_ms: u64,
}

/// Rejections of an outcome.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OutcomeError {
    #[error("score must be a number in [0, 1], got {0}")]
    ScoreOutOfRange(f32),
    #[error("an outcome needs a status or a score")]
    Missing,
}

impl Sample {
    /// Builds a sample from a status and/or a score; the score wins when both are given.
    pub fn new(status: Option<OutcomeStatus>, score: Option<f32>, at_ms: u64) -> Result<Sample, OutcomeError> {
        match (status, score) {
            (_, Some(score)) if !(score.is_finite() && (0.0..=1.0).contains(&score)) => {
                Err(OutcomeError::ScoreOutOfRange(score))
            }
            (Some(status), Some(score)) => Ok(Sample { status, score, at_ms }),
            (None, Some(score)) => Ok(Sample { status: OutcomeStatus::from_score(score), score, at_ms }),
            (Some(status), None) => Ok(Sample { status, score: status.score(), at_ms }),
            (None, None) => Err(OutcomeError::Missing),
        }
    }
}

/// The KPI of one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Kpi {
    pub scope_key: String,
    pub sample_count: usize,
    pub success_count: usize,
    pub partial_count: usize,
    pub failed_count: usize,
    pub success_rate: f32,
    pub average_score: f32,
    pub weighted_success_rate: f32,
    pub updated_at_ms: u64,
}

/// The last `capacity` outcomes of one scope.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KpiWindow {
    capacity: usize,
    samples: VecDeque<Sample>,
}

impl KpiWindow {
    /// Returns an empty window, `None` for a zero capacity.
    pub fn new(capacity: usize) -> Option<KpiWindow> {
        (capacity > 0).then(|| KpiWindow { capacity, samples: VecDeque::with_capacity(capacity) })
    }

    /// Appends a sample, dropping the oldest when full.
    pub fn push(&mut self, sample: Sample) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
        debug_assert!(self.samples.len() <= self.capacity);
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    pub fn samples(&self) -> impl Iterator<Item = &Sample> {
        self.samples.iter()
    }

    /// Computes the KPI of the window.
    pub fn kpi(&self, scope_key: &str) -> Kpi {
        let n = self.samples.len();
        let count = |status| self.samples.iter().filter(|s| s.status == status).count();
        let success_count = count(OutcomeStatus::Success);
        let half_life = (self.capacity as f32 / 4.0).max(1.0);
        let (mut weighted, mut weights) = (0.0f32, 0.0f32);
        for (age, sample) in self.samples.iter().rev().enumerate() {
            let weight = 0.5f32.powf(age as f32 / half_life);
            weighted += weight * sample.score;
            weights += weight;
        }
        let ratio = |a: f32, b: f32| if b > 0.0 { a / b } else { 0.0 };
        Kpi {
            scope_key: scope_key.to_string(),
            sample_count: n,
            success_count,
            partial_count: count(OutcomeStatus::Partial),
            failed_count: count(OutcomeStatus::Failed),
            success_rate: ratio(success_count as f32, n as f32),
            average_score: ratio(self.samples.iter().map(|s| s.score).sum(), n as f32),
            weighted_success_rate: ratio(weighted, weights),
            updated_at_ms: self.samples.back().map_or(0, |s| s.at_ms),
        }
    }
}

/// When a KPI raises an alert. Defaults are the design's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertPolicy {
    pub enabled: bool,
    pub below_weighted_success_rate: f32,
    pub min_samples: usize,
    pub cooldown_ms: u64,
}

impl Default for AlertPolicy {
    fn default() -> Self {
        AlertPolicy { enabled: true, below_weighted_success_rate: 0.55, min_samples: 8, cooldown_ms: 60_000 }
    }
}

/// Per-scope memory of the alerting state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertState {
    pub degraded: bool,
    pub last_alert_at_ms: Option<u64>,
}

/// An alert or recovery event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertEvent {
    pub severity: String,
    pub reason: String,
    pub threshold: f32,
    pub value: f32,
    pub scope_key: String,
    pub sample_count: usize,
    pub at_ms: u64,
}

impl AlertPolicy {
    /// Decides whether `kpi` raises an alert (or a recovery) and updates `state`.
    pub fn evaluate(&self, kpi: &Kpi, state: &mut AlertState, now_ms: u64) -> Option<AlertEvent> {
        if !self.enabled || kpi.sample_count < self.min_samples {
            return None;
        }
        let value = kpi.weighted_success_rate;
        let threshold = self.below_weighted_success_rate;
        let event = |severity: &str, reason: String| AlertEvent {
            severity: severity.to_string(),
            reason,
            threshold,
            value,
            scope_key: kpi.scope_key.clone(),
            sample_count: kpi.sample_count,
            at_ms: now_ms,
        };
        if value < threshold {
            let cooled = state.last_alert_at_ms.is_none_or(|last| now_ms.saturating_sub(last) >= self.cooldown_ms);
            if !cooled {
                return None;
            }
            state.degraded = true;
            state.last_alert_at_ms = Some(now_ms);
            let severity = if value < threshold / 2.0 { "critical" } else { "warning" };
            Some(event(severity, format!("weightedSuccessRate {value:.3} is below {threshold:.3}")))
        } else if state.degraded {
            state.degraded = false;
            Some(event("recovered", format!("weightedSuccessRate {value:.3} is back at or above {threshold:.3}")))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(status: OutcomeStatus, at_ms: u64) -> Sample {
        Sample::new(Some(status), None, at_ms).unwrap()
    }

    #[test]
    fn kpi_counts_and_rates() {
        let mut window = KpiWindow::new(4).unwrap();
        for (i, status) in [
            OutcomeStatus::Failed,
            OutcomeStatus::Success,
            OutcomeStatus::Partial,
            OutcomeStatus::Success,
            OutcomeStatus::Success,
        ]
        .into_iter()
        .enumerate()
        {
            window.push(sample(status, i as u64));
        }
        let kpi = window.kpi("global");
        assert_eq!((kpi.sample_count, kpi.success_count, kpi.partial_count, kpi.failed_count), (4, 3, 1, 0));
        assert_eq!(kpi.success_rate, 0.75);
        assert_eq!(kpi.average_score, 0.875);
        // The partial outcome is the oldest here, so recency weighting rates the window higher.
        assert!(kpi.weighted_success_rate > kpi.average_score);
        assert_eq!(kpi.updated_at_ms, 4);
    }

    #[test]
    fn scope_keys() {
        assert_eq!(ScopeMode::Global.scope_key(Some("acme"), Some("bot")), "global");
        assert_eq!(ScopeMode::Organization.scope_key(Some("acme"), Some("bot")), "acme");
        assert_eq!(ScopeMode::OrganizationPersona.scope_key(Some("acme"), Some("bot")), "acme/bot");
        assert_eq!(ScopeMode::OrganizationPersona.scope_key(Some("acme"), None), "acme");
        assert_eq!(ScopeMode::OrganizationPersona.scope_key(None, Some("bot")), "global");
    }

    #[test]
    fn bad_outcomes_are_refused() {
        assert!(matches!(Sample::new(None, Some(f32::NAN), 0), Err(OutcomeError::ScoreOutOfRange(_))));
        assert_eq!(Sample::new(None, None, 0), Err(OutcomeError::Missing));
        assert!(matches!(Sample::new(None, Some(1.5), 0), Err(OutcomeError::ScoreOutOfRange(_))));
        assert_eq!(Sample::new(None, Some(0.5), 0).unwrap().status, OutcomeStatus::Partial);
    }

    #[test]
    fn alerts_respect_min_samples_cooldown_and_recover() {
        let policy = AlertPolicy::default();
        let mut window = KpiWindow::new(100).unwrap();
        let mut state = AlertState::default();
        for i in 0..7 {
            window.push(sample(OutcomeStatus::Failed, i));
            assert_eq!(policy.evaluate(&window.kpi("g"), &mut state, i), None);
        }
        window.push(sample(OutcomeStatus::Failed, 7));
        let alert = policy.evaluate(&window.kpi("g"), &mut state, 7).unwrap();
        assert_eq!((alert.severity.as_str(), alert.sample_count), ("critical", 8));
        window.push(sample(OutcomeStatus::Failed, 8));
        assert_eq!(policy.evaluate(&window.kpi("g"), &mut state, 1_000), None, "cooldown holds");
        assert!(policy.evaluate(&window.kpi("g"), &mut state, 60_007).is_some(), "cooldown over");
        for i in 0..30 {
            window.push(sample(OutcomeStatus::Success, 70_000 + i));
        }
        let recovered = policy.evaluate(&window.kpi("g"), &mut state, 70_030).unwrap();
        assert_eq!(recovered.severity, "recovered");
        assert_eq!(policy.evaluate(&window.kpi("g"), &mut state, 70_031), None);
    }

    proptest! {
        #[test]
        fn rates_stay_in_the_unit_interval(scores in proptest::collection::vec(0.0f32..=1.0, 0..300), capacity in 1usize..120) {
            let mut window = KpiWindow::new(capacity).unwrap();
            for (i, score) in scores.iter().enumerate() {
                window.push(Sample::new(None, Some(*score), i as u64).unwrap());
            }
            let kpi = window.kpi("s");
            prop_assert!(kpi.sample_count == scores.len().min(capacity));
            prop_assert_eq!(kpi.success_count + kpi.partial_count + kpi.failed_count, kpi.sample_count);
            for rate in [kpi.success_rate, kpi.average_score, kpi.weighted_success_rate] {
                prop_assert!((0.0..=1.0 + 1e-5).contains(&rate));
            }
        }
    }
}
