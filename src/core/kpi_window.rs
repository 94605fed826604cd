//! Rolling task-outcome windows, their KPIs, and alert decisions.
//!
//! An [`OutcomeReport`] is validated whole into a [`Sample`] before anything
//! changes ([`OutcomeReport::validate`]). A [`KpiWindow`] keeps, per scope,
//! the last `capacity` samples that are also within the optional time horizon
//! ([`WindowSpec`]); which samples are live is decided in one place,
//! [`horizon_start_ms`]. Its [`Kpi`] carries counts, the plain success rate,
//! the mean score, and the recency-weighted success rate (see
//! [`KpiWindow::kpi`] for its exact definition). [`AlertPolicy::evaluate`]
//! turns a KPI into an alert or a recovery, with a per-scope cooldown;
//! [`AdaptivePolicy::update`] moves a scope into or out of adaptive execution
//! (which the turn planner applies); and [`record`] applies one sample to a
//! scope's window and state.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

use crate::core::limits::{Limit, LimitExceeded, Limits};
/// A score at or above this is a success when no status is given.
pub const SUCCESS_MIN_SCORE: f32 = 0.7;
/// A score at or above this (and below [`SUCCESS_MIN_SCORE`]) is a partial success.
pub const PARTIAL_MIN_SCORE: f32 = 0.3;

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

    /// The status a bare score stands for: ≥ 0.7 success, ≥ 0.3 partial, else failed
    /// (the design's bands for a numeric `taskOutcome`).
    pub fn from_score(score: f32) -> OutcomeStatus {
        if score >= SUCCESS_MIN_SCORE {
            OutcomeStatus::Success
        } else if score >= PARTIAL_MIN_SCORE {
            OutcomeStatus::Partial
        } else {
            OutcomeStatus::Failed
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeStatus::Success => "success",
            OutcomeStatus::Partial => "partial",
            OutcomeStatus::Failed => "failed",
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
        let mut scope_key = String::new();
        self.write_scope_key(organization_id, persona_id, &mut scope_key);
        scope_key
    }

    /// Writes [`ScopeMode::scope_key`] into `out` (cleared first), so a hot
    /// path can look a scope up without allocating.
    pub fn write_scope_key(self, organization_id: Option<&str>, persona_id: Option<&str>, out: &mut String) {
        let organization = organization_id.filter(|id| !id.is_empty());
        let persona = persona_id.filter(|id| !id.is_empty());
        out.clear();
        match (self, organization, persona) {
            (ScopeMode::Global, _, _) | (_, None, _) => out.push_str("global"),
            (ScopeMode::Organization, Some(org), _) | (ScopeMode::OrganizationPersona, Some(org), None) => {
                out.push_str(org)
            }
            (ScopeMode::OrganizationPersona, Some(org), Some(persona)) => {
                out.push_str(org);
                out.push('/');
                out.push_str(persona);
            }
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

/// One scored task outcome. `turn` is a 64-bit FNV-1a hash of the `turnId`,
/// used to count a retried outcome once.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    pub status: OutcomeStatus,
    pub score: f32,
    pub at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u64>,
}

/// Rejections of an outcome.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OutcomeError {
    #[error("score must be a number in [0, 1], got {0}")]
    ScoreOutOfRange(f32),
    #[error("an outcome needs a status or a score")]
    Missing,
    #[error("status {status} contradicts score {score} (a {status} scores {band})")]
    Contradiction { status: &'static str, score: f32, band: &'static str },
    #[error("{field} {problem}")]
    BadId { field: &'static str, problem: String },
    /// Over `limits.max_capabilities_per_outcome` (a 413 `too_many_capabilities` on NATS).
    #[error("capabilities lists {}", crate::core::limits::too_many_text(.0, "ids"))]
    TooManyCapabilities(LimitExceeded),
}

/// The limits an outcome is checked against (from `[limits]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutcomeLimits {
    /// `limits.max_id_bytes`: `turnId`, `organizationId`, `personaId`; a
    /// capability id may be [`crate::core::limits::max_capability_id_bytes`] of it.
    pub max_id_bytes: usize,
    /// `limits.max_capabilities_per_outcome`: the most ids `capabilities` lists.
    pub max_capabilities: usize,
}

impl From<&Limits> for OutcomeLimits {
    fn from(limits: &Limits) -> OutcomeLimits {
        OutcomeLimits { max_id_bytes: limits.max_id_bytes, max_capabilities: limits.max_capabilities_per_outcome }
    }
}

impl Default for OutcomeLimits {
    fn default() -> OutcomeLimits {
        OutcomeLimits::from(&Limits::default())
    }
}

impl Sample {
    /// Builds a sample from a status and/or a score. When both are given they
    /// must agree on the band ([`OutcomeStatus::from_score`]).
    pub fn new(status: Option<OutcomeStatus>, score: Option<f32>, at_ms: u64) -> Result<Sample, OutcomeError> {
        match (status, score) {
            (_, Some(score)) if !(score.is_finite() && (0.0..=1.0).contains(&score)) => {
                Err(OutcomeError::ScoreOutOfRange(score))
            }
            (Some(status), Some(score)) if OutcomeStatus::from_score(score) != status => {
                Err(OutcomeError::Contradiction { status: status.as_str(), score, band: band(status) })
            }
            (Some(status), Some(score)) => Ok(Sample { status, score, at_ms, turn: None }),
            (None, Some(score)) => Ok(Sample { status: OutcomeStatus::from_score(score), score, at_ms, turn: None }),
            (Some(status), None) => Ok(Sample { status, score: status.score(), at_ms, turn: None }),
            (None, None) => Err(OutcomeError::Missing),
        }
    }
}

fn band(status: OutcomeStatus) -> &'static str {
    match status {
        OutcomeStatus::Success => "at least 0.7",
        OutcomeStatus::Partial => "from 0.3 up to 0.7",
        OutcomeStatus::Failed => "below 0.3",
    }
}

impl OutcomeReport {
    /// Checks every field and returns the sample the report stands for; it
    /// changes nothing, so a refused report leaves no trace. `organizationId`
    /// and `personaId` are subject tokens of at most `limits.max_id_bytes`,
    /// `turnId` is at most as long, each listed capability id at most
    /// [`crate::core::limits::max_capability_id_bytes`], and `capabilities`
    /// lists at most `limits.max_capabilities` ids.
    ///
    /// # Examples
    ///
    /// ```
    /// use capdex::core::kpi_window::{OutcomeLimits, OutcomeReport, OutcomeStatus};
    /// let report = OutcomeReport { status: Some(OutcomeStatus::Partial), ..Default::default() };
    /// assert_eq!(report.validate(7, OutcomeLimits::default()).unwrap().score, 0.5);
    /// assert!(OutcomeReport::default().validate(7, OutcomeLimits::default()).is_err());
    /// ```
    pub fn validate(&self, at_ms: u64, limits: OutcomeLimits) -> Result<Sample, OutcomeError> {
        let max_id_bytes = limits.max_id_bytes;
        check_id("turnId", self.turn_id.as_deref(), max_id_bytes)?;
        check_id("organizationId", self.organization_id.as_deref(), max_id_bytes)?;
        check_id("personaId", self.persona_id.as_deref(), max_id_bytes)?;
        // Both become the `kpi.<scope>` subject's token.
        for (field, id) in [("organizationId", &self.organization_id), ("personaId", &self.persona_id)] {
            if let Some(Err(err)) = id.as_deref().map(|id| crate::core::subject_token::check(field, id, max_id_bytes)) {
                return Err(OutcomeError::BadId { field, problem: crate::core::subject_token::problem_text(&err) });
            }
        }
        crate::core::limits::check(Limit::CapabilitiesPerOutcome, self.capabilities.len(), limits.max_capabilities)
            .map_err(OutcomeError::TooManyCapabilities)?;
        for id in &self.capabilities {
            check_capability("capabilities[]", id, max_id_bytes)?;
        }
        let mut sample = Sample::new(self.status, self.score, at_ms)?;
        sample.turn = self.turn_id.as_deref().map(fnv1a64);
        Ok(sample)
    }
}

/// Checks a capability id as every `capabilities[]` entry of an outcome is checked.
pub fn check_capability_id(capability_id: &str, max_id_bytes: usize) -> Result<(), OutcomeError> {
    check_capability("capabilityId", capability_id, max_id_bytes)
}

/// A capability id: an id (below) of at most
/// [`crate::core::limits::max_capability_id_bytes`] bytes.
fn check_capability(field: &'static str, id: &str, max_id_bytes: usize) -> Result<(), OutcomeError> {
    if let Some(problem) = crate::core::limits::capability_id_too_long(id, max_id_bytes) {
        return Err(OutcomeError::BadId { field, problem });
    }
    check_id(field, Some(id), usize::MAX)
}

/// Ids are non-empty, at most `max_id_bytes` bytes (`[limits]`), and free of
/// control characters.
fn check_id(field: &'static str, id: Option<&str>, max_id_bytes: usize) -> Result<(), OutcomeError> {
    let Some(id) = id else { return Ok(()) };
    let problem = if id.is_empty() {
        "must not be empty".to_string()
    } else if let Err(exceeded) = crate::core::subject_token::check_len(id, max_id_bytes) {
        crate::core::subject_token::too_long_text(&exceeded)
    } else if id.chars().any(char::is_control) {
        "must not contain control characters".to_string()
    } else {
        return Ok(());
    };
    Err(OutcomeError::BadId { field, problem })
}

fn fnv1a64(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

/// The shape of every window: how many samples it keeps, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowSpec {
    capacity: usize,
    horizon_ms: u64,
}

impl WindowSpec {
    /// Returns a spec, `None` for a zero capacity. A zero `horizon_ms` keeps samples regardless of age.
    pub fn new(capacity: usize, horizon_ms: u64) -> Option<WindowSpec> {
        (capacity > 0).then_some(WindowSpec { capacity, horizon_ms })
    }

    pub fn capacity(self) -> usize {
        self.capacity
    }

    pub fn horizon_ms(self) -> u64 {
        self.horizon_ms
    }
}

/// Returns the oldest timestamp still inside the horizon at `now_ms`: a
/// sample is live exactly when `sample.at_ms >= horizon_start_ms(..)`.
/// With the horizon off (`0`) every sample is live. This is the only place
/// that decides whether a sample is stale.
pub fn horizon_start_ms(now_ms: u64, horizon_ms: u64) -> u64 {
    if horizon_ms == 0 {
        0
    } else {
        now_ms.saturating_sub(horizon_ms)
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

/// What [`KpiWindow::push`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Appended; `evicted` samples left from the front (too many or too old).
    Appended { evicted: usize },
    /// A sample of the same turn is already in the window: nothing changed.
    Duplicate,
}

/// The live samples of one scope, oldest first, timestamps never decreasing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KpiWindow {
    spec: WindowSpec,
    samples: VecDeque<Sample>,
}

impl KpiWindow {
    /// Returns an empty window.
    pub fn new(spec: WindowSpec) -> KpiWindow {
        KpiWindow { spec, samples: VecDeque::with_capacity(spec.capacity.min(1024)) }
    }

    /// Rebuilds a window from stored samples (oldest first) under `spec`,
    /// keeping the newest `capacity` of them; returns how many were dropped
    /// from the front.
    pub fn restore(spec: WindowSpec, stored: impl IntoIterator<Item = Sample>) -> (KpiWindow, usize) {
        let mut window = KpiWindow::new(spec);
        let mut dropped = 0;
        for sample in stored {
            window.append(sample);
            if window.samples.len() > spec.capacity {
                window.samples.pop_front();
                dropped += 1;
            }
        }
        (window, dropped)
    }

    pub fn spec(&self) -> WindowSpec {
        self.spec
    }

    /// Appends a sample observed at `sample.at_ms` (also "now"), first
    /// dropping stale samples, then the oldest while over capacity. A sample
    /// whose turn is among the live samples is refused as a duplicate.
    pub fn push(&mut self, sample: Sample) -> Pushed {
        let live = self.first_live(sample.at_ms);
        if sample.turn.is_some() && self.samples.range(live..).any(|s| s.turn == sample.turn) {
            return Pushed::Duplicate;
        }
        let mut evicted = self.evict(sample.at_ms);
        self.append(sample);
        if self.samples.len() > self.spec.capacity {
            self.samples.pop_front();
            evicted += 1;
        }
        debug_assert!(self.samples.len() <= self.spec.capacity);
        Pushed::Appended { evicted }
    }

    /// Drops the samples that are stale at `now_ms`; returns how many.
    pub fn evict(&mut self, now_ms: u64) -> usize {
        let stale = self.first_live(now_ms);
        self.samples.drain(..stale);
        stale
    }

    /// Appends, clamping a timestamp that went backwards (a clock step) to the
    /// newest one so the window stays ordered by time.
    fn append(&mut self, mut sample: Sample) {
        if let Some(last) = self.samples.back() {
            sample.at_ms = sample.at_ms.max(last.at_ms);
        }
        self.samples.push_back(sample);
    }

    /// The index of the first sample live at `now_ms`.
    fn first_live(&self, now_ms: u64) -> usize {
        let start = horizon_start_ms(now_ms, self.spec.horizon_ms);
        self.samples.partition_point(|s| s.at_ms < start)
    }

    /// Every stored sample, oldest first (stale ones included until the next push).
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    pub fn samples(&self) -> impl Iterator<Item = &Sample> {
        self.samples.iter()
    }

    /// Computes the KPI of the samples live at `now_ms`.
    ///
    /// `successRate` is successes / samples and `averageScore` the mean score.
    /// `weightedSuccessRate` is the mean score weighted by recency: the
    /// newest sample weighs 1, and each step back in the window multiplies
    /// the weight by `0.5^(1/h)` with `h = max(1, capacity / 4)`, so weights
    /// halve every quarter window (25 samples at the default size of 100):
    /// `Σ wᵢ·scoreᵢ / Σ wᵢ`. A recent slump therefore shows long before it
    /// fills the window, and a recovery lifts it as fast. All rates are in
    /// [0, 1], and 0 for an empty window.
    pub fn kpi(&self, scope_key: &str, now_ms: u64) -> Kpi {
        let live = self.samples.range(self.first_live(now_ms)..);
        let n = live.len();
        let (mut success_count, mut partial_count, mut failed_count, mut score_sum) = (0, 0, 0, 0.0f64);
        let decay = 0.5f64.powf(1.0 / (self.spec.capacity as f64 / 4.0).max(1.0));
        let (mut weight, mut weighted, mut weights) = (1.0f64, 0.0f64, 0.0f64);
        for sample in live.clone().rev() {
            match sample.status {
                OutcomeStatus::Success => success_count += 1,
                OutcomeStatus::Partial => partial_count += 1,
                OutcomeStatus::Failed => failed_count += 1,
            }
            score_sum += f64::from(sample.score);
            weighted += weight * f64::from(sample.score);
            weights += weight;
            weight *= decay;
        }
        let ratio = |a: f64, b: f64| if b > 0.0 { (a / b).clamp(0.0, 1.0) as f32 } else { 0.0 };
        Kpi {
            scope_key: scope_key.to_string(),
            sample_count: n,
            success_count,
            partial_count,
            failed_count,
            success_rate: ratio(success_count as f64, n as f64),
            average_score: ratio(score_sum, n as f64),
            weighted_success_rate: ratio(weighted, weights),
            updated_at_ms: live.last().map_or(0, |s| s.at_ms),
        }
    }

    /// The window's recent history at `now_ms` in `slices` equal slices of
    /// time, oldest first: each slice's mean per-sample score, `None` where a
    /// slice holds no live sample.
    ///
    /// The per-sample score is the one `averageScore` and
    /// `weightedSuccessRate` (the rate alerts and adaptive execution watch)
    /// use: the reported score, or 1 for a success, 0.5 for a partial success
    /// and 0 for a failure when only a status was given. So a slice's value is
    /// that slice's `averageScore`, in [0, 1].
    ///
    /// The span sliced is the window's time span ending at `now_ms`: the
    /// horizon (`[now - horizon, now]`) when there is one, else from the
    /// oldest live sample to `now_ms`. The span's `now - start + 1`
    /// milliseconds are cut into equal parts by age: a sample `age` ms old
    /// (`now_ms - at_ms`) is in the slice `⌊age·slices / (now - start + 1)⌋`
    /// back from the last, so a sample at `now_ms` is always in the last slice,
    /// and so is one stamped after it (a clock step). No live samples give all
    /// `None`; zero slices an empty vector. It reads every live sample once
    /// and allocates only the result.
    pub fn sparkline(&self, now_ms: u64, slices: usize) -> Vec<Option<f32>> {
        let live = self.samples.range(self.first_live(now_ms)..);
        let start = match (self.spec.horizon_ms, live.clone().next()) {
            (_, None) => return vec![None; slices],
            (0, Some(oldest)) => oldest.at_ms.min(now_ms),
            (horizon_ms, Some(_)) => horizon_start_ms(now_ms, horizon_ms),
        };
        if slices == 0 {
            return Vec::new();
        }
        let mut sums = vec![(0.0f64, 0u32); slices];
        // `now_ms - start + 1` instants, cut into `slices` equal parts counted back from now.
        let instants = u128::from(now_ms - start) + 1;
        for sample in live {
            let age = u128::from(now_ms - sample.at_ms.min(now_ms));
            let back = ((age * slices as u128) / instants) as usize;
            let (sum, count) = &mut sums[slices - 1 - back.min(slices - 1)];
            *sum += f64::from(sample.score);
            *count += 1;
        }
        sums.into_iter()
            .map(|(sum, count)| (count > 0).then(|| (sum / f64::from(count)).clamp(0.0, 1.0) as f32))
            .collect()
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
    ///
    /// An alert needs at least `min_samples` samples and a weighted success
    /// rate below the threshold, and at most one alert per `cooldown_ms` per
    /// scope; it is `critical` below half the threshold, else `warning`. A
    /// degraded scope whose rate climbs back to the threshold gets one
    /// `recovered` event (no cooldown, never before an alert).
    pub fn evaluate(&self, kpi: &Kpi, state: &mut AlertState, now_ms: u64) -> Option<AlertEvent> {
        if !self.enabled || kpi.sample_count < self.min_samples {
            return None;
        }
        let value = kpi.weighted_success_rate;
        let threshold = self.below_weighted_success_rate;
        debug_assert!(threshold.is_finite(), "thresholds are validated in config");
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

/// Adaptive execution settings. Defaults are the design's; `recover_*` adds
/// hysteresis: a degraded scope returns to normal only once its weighted
/// success rate reaches `recover_weighted_success_rate` (above the entry
/// threshold), or when fewer than `min_samples` recent samples remain.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdaptivePolicy {
    pub enabled: bool,
    pub min_samples: usize,
    pub min_weighted_success_rate: f32,
    pub recover_weighted_success_rate: f32,
    pub force_all_tools_when_degraded: bool,
    pub force_fail_open_when_degraded: bool,
}

impl Default for AdaptivePolicy {
    fn default() -> Self {
        AdaptivePolicy {
            enabled: true,
            min_samples: 5,
            min_weighted_success_rate: 0.7,
            recover_weighted_success_rate: 0.8,
            force_all_tools_when_degraded: true,
            force_fail_open_when_degraded: true,
        }
    }
}

/// A scope's adaptive-execution state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdaptiveState {
    pub degraded: bool,
    pub since_ms: Option<u64>,
}

impl AdaptivePolicy {
    /// Moves `state` after a new KPI: into degraded when there are at least
    /// `min_samples` samples and the weighted rate is below the minimum; back
    /// out at the recovery rate or with too few samples. Returns whether it moved.
    pub fn update(&self, kpi: &Kpi, state: &mut AdaptiveState, now_ms: u64) -> bool {
        let enough = kpi.sample_count >= self.min_samples;
        let rate = kpi.weighted_success_rate;
        let degraded = if !self.enabled {
            false
        } else if state.degraded {
            enough && rate < self.recover_weighted_success_rate
        } else {
            enough && rate < self.min_weighted_success_rate
        };
        if degraded == state.degraded {
            return false;
        }
        *state = AdaptiveState { degraded, since_ms: degraded.then_some(now_ms) };
        true
    }

    /// Whether plans for the scope are adapted now. Stale samples may have
    /// left the window since the last outcome, so the KPI is checked again.
    pub fn applies(&self, kpi: &Kpi, state: &AdaptiveState) -> bool {
        self.enabled && state.degraded && kpi.sample_count >= self.min_samples
    }
}

/// A scope's alerting and adaptive-execution memory, stored beside its window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScopeMeta {
    pub alert: AlertState,
    pub adaptive: AdaptiveState,
}

/// What recording one sample did to a scope.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    pub kpi: Kpi,
    pub alert: Option<AlertEvent>,
    /// How many samples left the window's front.
    pub evicted: usize,
    /// Whether the scope's [`ScopeMeta`] changed (and must be stored).
    pub meta_changed: bool,
    /// The sample was a retry of a turn already counted: nothing changed.
    pub duplicate: bool,
}

/// Applies one sample to a scope: window, KPI, alert and adaptive state.
pub fn record(
    scope_key: &str,
    window: &mut KpiWindow,
    meta: &mut ScopeMeta,
    sample: Sample,
    alerts: &AlertPolicy,
    adaptive: &AdaptivePolicy,
) -> Recorded {
    let now_ms = sample.at_ms;
    match window.push(sample) {
        Pushed::Duplicate => Recorded {
            kpi: window.kpi(scope_key, now_ms),
            alert: None,
            evicted: 0,
            meta_changed: false,
            duplicate: true,
        },
        Pushed::Appended { evicted } => {
            let kpi = window.kpi(scope_key, now_ms);
            let before = meta.clone();
            let alert = alerts.evaluate(&kpi, &mut meta.alert, now_ms);
            adaptive.update(&kpi, &mut meta.adaptive, now_ms);
            let meta_changed = *meta != before;
            Recorded { kpi, alert, evicted, meta_changed, duplicate: false }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(capacity: usize) -> WindowSpec {
        WindowSpec::new(capacity, 0).unwrap()
    }

    fn sample(status: OutcomeStatus, at_ms: u64) -> Sample {
        Sample::new(Some(status), None, at_ms).unwrap()
    }

    #[test]
    fn kpi_counts_and_rates() {
        let mut window = KpiWindow::new(spec(4));
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
        let kpi = window.kpi("global", 4);
        assert_eq!((kpi.sample_count, kpi.success_count, kpi.partial_count, kpi.failed_count), (4, 3, 1, 0));
        assert_eq!(kpi.success_rate, 0.75);
        assert_eq!(kpi.average_score, 0.875);
        // The partial outcome is the oldest here, so recency weighting rates the window higher.
        assert!(kpi.weighted_success_rate > kpi.average_score);
        assert_eq!(kpi.updated_at_ms, 4);
    }

    #[test]
    fn weighted_rate_follows_the_documented_formula() {
        // Capacity 8: h = 2, so weights go 1, 2^-1/2, 2^-1, ... newest first.
        let mut window = KpiWindow::new(spec(8));
        window.push(sample(OutcomeStatus::Success, 0));
        window.push(sample(OutcomeStatus::Failed, 1));
        let w = 0.5f64.sqrt();
        let expected = (w * 1.0) / (1.0 + w);
        assert!((f64::from(window.kpi("s", 1).weighted_success_rate) - expected).abs() < 1e-6);
        // A slump after many successes shows in the weighted rate before the average.
        let mut window = KpiWindow::new(spec(100));
        for i in 0..80 {
            window.push(sample(OutcomeStatus::Success, i));
        }
        for i in 80..100 {
            window.push(sample(OutcomeStatus::Failed, i));
        }
        let kpi = window.kpi("s", 100);
        assert_eq!(kpi.average_score, 0.8);
        assert!(kpi.weighted_success_rate < 0.55, "{kpi:?}");
    }

    #[test]
    fn the_horizon_drops_stale_samples() {
        let mut window = KpiWindow::new(WindowSpec::new(10, 1_000).unwrap());
        window.push(sample(OutcomeStatus::Failed, 0));
        window.push(sample(OutcomeStatus::Failed, 500));
        assert_eq!(window.kpi("s", 999).sample_count, 2);
        assert_eq!(window.kpi("s", 1_000).sample_count, 2, "at exactly the horizon a sample is live");
        assert_eq!(window.kpi("s", 1_001).sample_count, 1);
        assert_eq!(window.push(sample(OutcomeStatus::Success, 1_600)), Pushed::Appended { evicted: 2 });
        assert_eq!(window.kpi("s", 1_600).success_rate, 1.0);
        assert_eq!(window.kpi("s", 5_000).sample_count, 0);
        assert_eq!(window.kpi("s", 5_000).weighted_success_rate, 0.0);
    }

    #[test]
    fn retried_turns_count_once() {
        let mut window = KpiWindow::new(spec(10));
        let report = OutcomeReport { turn_id: Some("t1".into()), score: Some(0.9), ..Default::default() };
        assert_eq!(window.push(report.validate(1, OutcomeLimits::default()).unwrap()), Pushed::Appended { evicted: 0 });
        assert_eq!(window.push(report.validate(2, OutcomeLimits::default()).unwrap()), Pushed::Duplicate);
        let other = OutcomeReport { turn_id: Some("t2".into()), score: Some(0.9), ..Default::default() };
        assert_eq!(window.push(other.validate(3, OutcomeLimits::default()).unwrap()), Pushed::Appended { evicted: 0 });
        assert_eq!(window.kpi("s", 3).sample_count, 2);
        // Only live samples count: past the horizon the same turn is a new sample.
        let mut window = KpiWindow::new(WindowSpec::new(10, 100).unwrap());
        window.push(report.validate(1, OutcomeLimits::default()).unwrap());
        assert_eq!(window.push(report.validate(101, OutcomeLimits::default()).unwrap()), Pushed::Duplicate);
        assert_eq!(
            window.push(report.validate(102, OutcomeLimits::default()).unwrap()),
            Pushed::Appended { evicted: 1 }
        );
    }

    #[test]
    fn clock_steps_back_keep_the_window_ordered() {
        let mut window = KpiWindow::new(spec(3));
        window.push(sample(OutcomeStatus::Success, 100));
        window.push(sample(OutcomeStatus::Success, 40));
        assert_eq!(window.samples().map(|s| s.at_ms).collect::<Vec<_>>(), vec![100, 100]);
    }

    #[test]
    fn restore_keeps_the_newest_under_a_smaller_capacity() {
        let stored: Vec<Sample> = (0..5).map(|i| sample(OutcomeStatus::Success, i)).collect();
        let (window, dropped) = KpiWindow::restore(spec(3), stored);
        assert_eq!(dropped, 2);
        assert_eq!(window.samples().map(|s| s.at_ms).collect::<Vec<_>>(), vec![2, 3, 4]);
    }

    #[test]
    fn scope_keys() {
        assert_eq!(ScopeMode::Global.scope_key(Some("acme"), Some("bot")), "global");
        assert_eq!(ScopeMode::Organization.scope_key(Some("acme"), Some("bot")), "acme");
        assert_eq!(ScopeMode::OrganizationPersona.scope_key(Some("acme"), Some("bot")), "acme/bot");
        assert_eq!(ScopeMode::OrganizationPersona.scope_key(Some("acme"), None), "acme");
        assert_eq!(ScopeMode::OrganizationPersona.scope_key(None, Some("bot")), "global");
    }

    fn refused(report: OutcomeReport) -> String {
        report.validate(0, OutcomeLimits::default()).unwrap_err().to_string()
    }

    #[test]
    fn bad_outcomes_are_refused() {
        assert!(matches!(Sample::new(None, Some(f32::NAN), 0), Err(OutcomeError::ScoreOutOfRange(_))));
        assert_eq!(Sample::new(None, None, 0), Err(OutcomeError::Missing));
        assert!(matches!(Sample::new(None, Some(1.5), 0), Err(OutcomeError::ScoreOutOfRange(_))));
        assert!(matches!(Sample::new(None, Some(-0.1), 0), Err(OutcomeError::ScoreOutOfRange(_))));
        assert_eq!(Sample::new(None, Some(0.5), 0).unwrap().status, OutcomeStatus::Partial);
        assert_eq!(Sample::new(None, Some(0.7), 0).unwrap().status, OutcomeStatus::Success);
        assert_eq!(Sample::new(None, Some(0.29), 0).unwrap().status, OutcomeStatus::Failed);
        assert!(Sample::new(Some(OutcomeStatus::Success), Some(0.85), 0).is_ok());
        let contradiction = |status| OutcomeReport { status: Some(status), score: Some(0.1), ..Default::default() };
        assert!(refused(contradiction(OutcomeStatus::Success)).contains("contradicts"));
        let base = OutcomeReport { status: Some(OutcomeStatus::Success), ..Default::default() };
        assert!(refused(OutcomeReport { turn_id: Some(String::new()), ..base.clone() }).starts_with("turnId"));
        let long = "x".repeat(Limits::default().max_id_bytes + 1);
        assert!(refused(OutcomeReport { organization_id: Some(long), ..base.clone() }).starts_with("organizationId"));
        assert!(refused(OutcomeReport { persona_id: Some("a\nb".into()), ..base.clone() }).starts_with("personaId"));
        assert!(refused(OutcomeReport { capabilities: vec![String::new()], ..base.clone() }).starts_with("capab"));
        let many = vec!["tool:x".to_string(); Limits::default().max_capabilities_per_outcome + 1];
        assert!(refused(OutcomeReport { capabilities: many, ..base.clone() }).contains("limit"));
        assert!(base.validate(0, OutcomeLimits::default()).is_ok());
    }

    #[test]
    fn organization_and_persona_ids_one_byte_over_max_id_bytes_are_refused_naming_the_setting() {
        let base = OutcomeReport { status: Some(OutcomeStatus::Success), ..Default::default() };
        let max = 9;
        for field in ["organizationId", "personaId"] {
            let with = |id: String| match field {
                "organizationId" => OutcomeReport { organization_id: Some(id), ..base.clone() },
                _ => OutcomeReport { persona_id: Some(id), ..base.clone() },
            };
            let limits = |max_id_bytes| OutcomeLimits { max_id_bytes, ..OutcomeLimits::default() };
            assert!(with("o".repeat(max)).validate(0, limits(max)).is_ok(), "{field}");
            let err = with("o".repeat(max + 1)).validate(0, limits(max)).unwrap_err().to_string();
            assert!(err.starts_with(field), "{err}");
            assert!(err.contains("is 10 bytes, over limits.max_id_bytes: at most 9"), "{err}");
            assert!(with("o".repeat(max + 1)).validate(0, limits(max + 1)).is_ok(), "{field}: the setting is read");
        }
    }

    #[test]
    fn turn_ids_and_listed_capability_ids_are_refused_one_byte_over_max_id_bytes_naming_the_setting() {
        let base = OutcomeReport { status: Some(OutcomeStatus::Success), ..Default::default() };
        for max in [64, 70, 256] {
            let limits = OutcomeLimits { max_id_bytes: max, ..OutcomeLimits::default() };
            let turn = |len: usize| OutcomeReport {
                turn_id: Some("é".repeat(len / 2) + &"t".repeat(len % 2)),
                ..base.clone()
            };
            assert!(turn(max).validate(0, limits).is_ok(), "a turnId of {max} bytes");
            let err = turn(max + 1).validate(0, limits).unwrap_err().to_string();
            assert_eq!(err, format!("turnId is {} bytes, over limits.max_id_bytes: at most {max}", max + 1));
            // A capability id: a source id, '#' and a tool name, each at its longest.
            let longest = format!("{}#{}", "s".repeat(max), "n".repeat(crate::core::limits::MAX_TOOL_NAME_BYTES));
            let listing =
                |id: &str| OutcomeReport { capabilities: vec!["tool:x".into(), id.to_string()], ..base.clone() };
            assert!(listing(&longest).validate(0, limits).is_ok(), "{} bytes", longest.len());
            assert_eq!(check_capability_id(&longest, max), Ok(()));
            let over = format!("{longest}n");
            let err = listing(&over).validate(0, limits).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("capabilities[] is {} bytes, over limits.max_id_bytes", over.len())),
                "{err}"
            );
            let err = check_capability_id(&over, max).unwrap_err().to_string();
            assert!(err.starts_with("capabilityId is") && err.contains("limits.max_id_bytes"), "{err}");
        }
    }

    #[test]
    fn an_outcome_may_list_max_capabilities_per_outcome_ids_and_one_more_is_refused_naming_the_setting() {
        let base = OutcomeReport { status: Some(OutcomeStatus::Success), ..Default::default() };
        for max in [1, 3, 256] {
            let limits = OutcomeLimits { max_capabilities: max, ..OutcomeLimits::default() };
            let listing = |n: usize| OutcomeReport {
                capabilities: (0..n).map(|i| format!("tool:t{i}")).collect(),
                ..base.clone()
            };
            assert!(listing(max).validate(0, limits).is_ok(), "{max} ids");
            let err = listing(max + 1).validate(0, limits).unwrap_err();
            assert_eq!(
                err,
                OutcomeError::TooManyCapabilities(LimitExceeded {
                    limit: Limit::CapabilitiesPerOutcome,
                    found: max + 1,
                    max
                })
            );
            assert_eq!(
                err.to_string(),
                format!("capabilities lists {} ids, over limits.max_capabilities_per_outcome: at most {max}", max + 1)
            );
        }
    }

    #[test]
    fn alerts_respect_min_samples_cooldown_and_recover() {
        let policy = AlertPolicy::default();
        let mut window = KpiWindow::new(spec(100));
        let mut state = AlertState::default();
        for i in 0..7 {
            window.push(sample(OutcomeStatus::Failed, i));
            assert_eq!(policy.evaluate(&window.kpi("g", i), &mut state, i), None);
        }
        window.push(sample(OutcomeStatus::Failed, 7));
        let alert = policy.evaluate(&window.kpi("g", 7), &mut state, 7).unwrap();
        assert_eq!((alert.severity.as_str(), alert.sample_count), ("critical", 8));
        window.push(sample(OutcomeStatus::Failed, 8));
        assert_eq!(policy.evaluate(&window.kpi("g", 8), &mut state, 1_000), None, "cooldown holds");
        assert!(policy.evaluate(&window.kpi("g", 8), &mut state, 60_007).is_some(), "cooldown over");
        for i in 0..30 {
            window.push(sample(OutcomeStatus::Success, 70_000 + i));
        }
        let recovered = policy.evaluate(&window.kpi("g", 70_030), &mut state, 70_030).unwrap();
        assert_eq!(recovered.severity, "recovered");
        assert_eq!(policy.evaluate(&window.kpi("g", 70_031), &mut state, 70_031), None);
    }

    #[test]
    fn a_warning_between_half_and_the_threshold() {
        let policy = AlertPolicy::default();
        let mut window = KpiWindow::new(spec(100));
        for i in 0..10 {
            window.push(sample(OutcomeStatus::Partial, i));
        }
        let alert = policy.evaluate(&window.kpi("g", 10), &mut AlertState::default(), 10).unwrap();
        assert_eq!(alert.severity, "warning");
    }

    #[test]
    fn a_sparkline_slices_the_horizon_ending_now() {
        // A horizon of 2.4 s in 24 slices: 100 ms each, the last one ending at now.
        let mut window = KpiWindow::new(WindowSpec::new(100, 2_400).unwrap());
        window.push(sample(OutcomeStatus::Failed, 1_000));
        window.push(sample(OutcomeStatus::Success, 1_150));
        window.push(sample(OutcomeStatus::Success, 1_160));
        window.push(sample(OutcomeStatus::Failed, 1_170));
        window.push(sample(OutcomeStatus::Partial, 3_399));
        let line = window.sparkline(3_400, 24);
        assert_eq!(line.len(), 24);
        let mut expected = vec![None; 24];
        expected[0] = Some(0.0);
        expected[1] = Some(2.0 / 3.0);
        expected[23] = Some(0.5);
        assert_eq!(line, expected);
        // Later, the oldest sample is stale and everything moves left.
        let line = window.sparkline(3_500, 24);
        assert_eq!((line[0], line[22], line[23]), (Some(2.0 / 3.0), Some(0.5), None));
        // A reported score counts as itself, as in averageScore.
        let mut window = KpiWindow::new(spec(10));
        window.push(Sample::new(None, Some(0.9), 5).unwrap());
        assert_eq!(window.sparkline(5, 4), vec![None, None, None, Some(0.9)]);
    }

    #[test]
    fn a_sparkline_without_a_horizon_spans_the_oldest_sample_to_now() {
        let mut window = KpiWindow::new(spec(10));
        assert_eq!(window.sparkline(100, 3), vec![None, None, None], "empty");
        window.push(sample(OutcomeStatus::Success, 10));
        window.push(sample(OutcomeStatus::Failed, 20));
        // Span 10..=99: 90 instants, 30 per slice.
        assert_eq!(window.sparkline(99, 3), vec![Some(0.5), None, None]);
        // One instant from the oldest to now: every live sample is in the last slice.
        assert_eq!(window.sparkline(10, 2), vec![None, Some(0.5)]);
        assert_eq!(window.sparkline(100, 0), Vec::<Option<f32>>::new());
        // A sample stamped after now (a clock step) counts in the last slice.
        assert_eq!(window.sparkline(15, 2), vec![Some(1.0), Some(0.0)]);
    }

    proptest! {
        /// A sparkline holds exactly the live samples, each in the slice of
        /// `slices` equal parts of the span its age falls in, and one slice
        /// is the KPI's average score.
        #[test]
        fn a_sparkline_is_the_mean_score_of_each_slice(
            steps in proptest::collection::vec((0u64..400, 0.0f32..=1.0), 0..120),
            capacity in 1usize..60,
            horizon_ms in prop_oneof![Just(0u64), 1u64..5_000],
            read_after in 0u64..3_000,
            slices in 1usize..40,
        ) {
            let mut window = KpiWindow::new(WindowSpec::new(capacity, horizon_ms).unwrap());
            let mut now = 0u64;
            for (gap, score) in steps {
                now += gap;
                window.push(Sample::new(None, Some(score), now).unwrap());
            }
            let now = now + read_after;
            let line = window.sparkline(now, slices);
            prop_assert_eq!(line.len(), slices);
            let live: Vec<&Sample> = window.samples().filter(|s| s.at_ms >= horizon_start_ms(now, horizon_ms)).collect();
            let start = if horizon_ms == 0 { live.first().map_or(now, |s| s.at_ms) } else { horizon_start_ms(now, horizon_ms) };
            let instants = now - start + 1;
            for (i, value) in line.iter().enumerate() {
                // The naive model: the j-th slice back from now holds the ages
                // [j·instants/slices, (j+1)·instants/slices).
                let j = (slices - 1 - i) as u64;
                let inside: Vec<f64> = live
                    .iter()
                    .filter(|s| {
                        let age = (now - s.at_ms) * slices as u64;
                        j * instants <= age && age < (j + 1) * instants
                    })
                    .map(|s| f64::from(s.score))
                    .collect();
                match value {
                    None => prop_assert!(inside.is_empty(), "slice {} holds {:?}", i, inside),
                    Some(mean) => {
                        prop_assert!(!inside.is_empty(), "slice {} is empty", i);
                        let expected = inside.iter().sum::<f64>() / inside.len() as f64;
                        prop_assert!((f64::from(*mean) - expected).abs() < 1e-5, "{} vs {}", mean, expected);
                        prop_assert!((0.0..=1.0).contains(mean));
                    }
                }
            }
            let one = window.sparkline(now, 1);
            let kpi = window.kpi("s", now);
            match one[0] {
                None => prop_assert_eq!(kpi.sample_count, 0),
                Some(mean) => prop_assert!((mean - kpi.average_score).abs() < 1e-5),
            }
        }

        #[test]
        fn rates_stay_in_the_unit_interval(scores in proptest::collection::vec(0.0f32..=1.0, 0..300), capacity in 1usize..120) {
            let mut window = KpiWindow::new(spec(capacity));
            for (i, score) in scores.iter().enumerate() {
                window.push(Sample::new(None, Some(*score), i as u64).unwrap());
            }
            let kpi = window.kpi("s", scores.len() as u64);
            prop_assert!(kpi.sample_count == scores.len().min(capacity));
            prop_assert_eq!(kpi.success_count + kpi.partial_count + kpi.failed_count, kpi.sample_count);
            for rate in [kpi.success_rate, kpi.average_score, kpi.weighted_success_rate] {
                prop_assert!((0.0..=1.0).contains(&rate));
            }
        }

        /// Every window holds exactly the samples a naive model keeps: the
        /// newest `capacity` of those within the horizon, in order.
        #[test]
        fn every_window_contains_only_its_samples_within_horizon(
            steps in proptest::collection::vec((0u64..400, 0.0f32..=1.0), 1..200),
            capacity in 1usize..50,
            horizon_ms in prop_oneof![Just(0u64), 1u64..3_000],
            read_after in 0u64..5_000,
        ) {
            let spec = WindowSpec::new(capacity, horizon_ms).unwrap();
            let mut window = KpiWindow::new(spec);
            let mut model: Vec<Sample> = Vec::new();
            let mut now = 0u64;
            for (gap, score) in steps {
                now += gap;
                let sample = Sample::new(None, Some(score), now).unwrap();
                let pushed = window.push(sample);
                prop_assert!(pushed != Pushed::Duplicate);
                model.push(sample);
                let start = horizon_start_ms(now, horizon_ms);
                for s in window.samples() {
                    prop_assert!(s.at_ms >= start && s.at_ms <= now);
                }
                let live: Vec<&Sample> = model.iter().filter(|s| s.at_ms >= start).collect();
                let expected: Vec<&Sample> = live[live.len().saturating_sub(capacity)..].to_vec();
                prop_assert_eq!(window.samples().collect::<Vec<_>>(), expected);
            }
            let later = now + read_after;
            let kpi = window.kpi("s", later);
            let start = horizon_start_ms(later, horizon_ms);
            prop_assert_eq!(kpi.sample_count, window.samples().filter(|s| s.at_ms >= start).count());
            for rate in [kpi.success_rate, kpi.average_score, kpi.weighted_success_rate] {
                prop_assert!((0.0..=1.0).contains(&rate));
            }
        }
    }
}
