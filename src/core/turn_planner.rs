//! The turn planner: before a turn, decides which tools the agent is offered
//! (`discovered` or `all`), what happens when discovery fails (`fail_open` or
//! `fail_closed`), and how the turn's lifecycle reads; and adaptive
//! execution, which switches a degraded scope's plans to the full toolset.
//!
//! Rules, in order ([`plan`]):
//! 1. The request's overrides win over the configured defaults.
//! 2. Adaptive execution: when the scope is degraded ([`AdaptivePolicy`]),
//!    `discovered` becomes `all` and `fail_closed` becomes `fail_open`,
//!    unless the request pinned `toolFailureMode: fail_closed`.
//! 3. With `discovered`: the tools are the discovered capabilities of a tool
//!    kind. If discovery failed, `fail_open` falls back to all tools and
//!    `fail_closed` refuses the turn. If discovery found no tool, `fail_open`
//!    falls back to all tools; that is *degraded* only when discovery found
//!    other capabilities: a turn that needs no capability at all (chit-chat)
//!    gets the fallback without being counted as degraded.
//!
//! The lifecycle is `planned → executing → [degraded →] completed | errored`,
//! with `recovered` before `completed` when a degraded turn succeeds.

use crate::core::descriptor::CapabilityKind;
use crate::core::kpi_window::{OutcomeSource, OutcomeStatus, ToolSelectionMode};
// Adaptive execution's settings and state live beside the KPI window that moves them;
// the planner reads them, and callers name them from here too.
pub use crate::core::kpi_window::{AdaptivePolicy, AdaptiveState};
use serde::{Deserialize, Serialize};

/// What happens when discovery cannot help.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFailureMode {
    FailOpen,
    FailClosed,
}

/// The stages of a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LifecycleState {
    Planned,
    Executing,
    Degraded,
    Recovered,
    Completed,
    Errored,
}

impl LifecycleState {
    /// Whether `self → next` is a transition of the lifecycle.
    pub fn can_move_to(self, next: LifecycleState) -> bool {
        use LifecycleState::*;
        matches!(
            (self, next),
            (Planned, Executing)
                | (Executing, Degraded | Completed | Errored)
                | (Degraded, Recovered | Errored | Completed)
                | (Recovered, Completed)
        )
    }
}

/// The planner's configured defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannerDefaults {
    pub tool_failure_mode: ToolFailureMode,
    pub tool_selection_mode: ToolSelectionMode,
}

impl Default for PlannerDefaults {
    fn default() -> Self {
        PlannerDefaults {
            tool_failure_mode: ToolFailureMode::FailOpen,
            tool_selection_mode: ToolSelectionMode::Discovered,
        }
    }
}

/// A `taskOutcome` override: a status or a score in [0, 1].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TaskOutcome {
    Status(OutcomeStatus),
    Score(f32),
}

/// Per-request overrides (the design's `customFlags`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanOverrides {
    #[serde(default)]
    pub tool_failure_mode: Option<ToolFailureMode>,
    #[serde(default)]
    pub tool_selection_mode: Option<ToolSelectionMode>,
    /// `tool`, `skill`, ... or `any`; checked by the gateway.
    #[serde(default)]
    pub capability_discovery_kind: Option<String>,
    #[serde(default)]
    pub task_outcome: Option<TaskOutcome>,
    #[serde(default)]
    pub task_success: Option<bool>,
}

/// What discovery gave the planner.
#[derive(Clone, Debug, PartialEq)]
pub enum DiscoveryOutcome {
    /// Discovery failed (after its retries), with the reason.
    Failed(String),
    /// The relevant capability ids, best first, and which of them are tools.
    Found { capability_ids: Vec<String>, tool_ids: Vec<String> },
}

impl DiscoveryOutcome {
    /// Discovery found `capability_ids` (best first); the tools among them
    /// are those of kind `tool` or `emergent-tool` (ids are `<kind>:<name>`).
    pub fn found(capability_ids: Vec<String>) -> DiscoveryOutcome {
        let tool_ids = capability_ids.iter().filter(|id| is_tool_id(id)).cloned().collect();
        DiscoveryOutcome::Found { capability_ids, tool_ids }
    }
}

fn is_tool_id(id: &str) -> bool {
    let kind = id.split_once(':').and_then(|(kind, _)| CapabilityKind::parse(kind));
    matches!(kind, Some(CapabilityKind::Tool | CapabilityKind::EmergentTool))
}

/// Why a plan fell back to all tools; serialized as its snake_case name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FallbackReason {
    /// Discovery failed and the failure mode is `fail_open`.
    DiscoveryFailed,
    /// Discovery found capabilities, but no tool among them.
    NoToolMatched,
    /// Discovery found nothing relevant: the turn needs no capability (not degraded).
    NoCapabilityNeeded,
    /// Adaptive execution switched a degraded scope's plan.
    AdaptiveDegradedScope,
}

impl FallbackReason {
    /// Every reason, in declaration order.
    pub const ALL: [FallbackReason; 4] = [
        FallbackReason::DiscoveryFailed,
        FallbackReason::NoToolMatched,
        FallbackReason::NoCapabilityNeeded,
        FallbackReason::AdaptiveDegradedScope,
    ];

    /// The wire name (the same string serde writes), also the `fallback_reason` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackReason::DiscoveryFailed => "discovery_failed",
            FallbackReason::NoToolMatched => "no_tool_matched",
            FallbackReason::NoCapabilityNeeded => "no_capability_needed",
            FallbackReason::AdaptiveDegradedScope => "adaptive_degraded_scope",
        }
    }
}

/// The outcome a request pinned, reported with `source: request_override`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutcomeOverride {
    pub status: OutcomeStatus,
    pub score: f32,
    pub source: OutcomeSource,
}

/// The plan for one turn.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnPlan {
    pub tool_failure_mode: ToolFailureMode,
    pub tool_selection_mode: ToolSelectionMode,
    pub capability_discovery_kind: String,
    /// The tools to offer with `discovered`; empty with `all` (every tool).
    pub selected_tool_ids: Vec<String>,
    /// Whether the plan fell back to all tools (or adapted to a degraded scope).
    pub fallback_applied: bool,
    /// Why the plan fell back, when it did.
    pub fallback_reason: Option<FallbackReason>,
    /// Whether adaptive execution changed the plan.
    pub adaptive_applied: bool,
    /// Whether discovery found any relevant capability.
    pub needs_capabilities: bool,
    /// The lifecycle so far, ending in the outcome's states when the request pinned one.
    pub execution_lifecycle: Vec<LifecycleState>,
    pub outcome_override: Option<OutcomeOverride>,
}

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("discovery failed and the tool failure mode is fail_closed: {0}")]
    DiscoveryFailed(String),
    #[error("taskOutcome score must be a number in [0, 1], got {0}")]
    BadTaskOutcome(f32),
    #[error("taskOutcome {0} contradicts taskSuccess {1}")]
    Contradiction(&'static str, bool),
}

/// Resolves the `taskOutcome` / `taskSuccess` overrides into one outcome.
pub fn outcome_override(overrides: &PlanOverrides) -> Result<Option<OutcomeOverride>, PlanError> {
    let from_outcome = match overrides.task_outcome {
        None => None,
        Some(TaskOutcome::Status(status)) => Some((status, status.score())),
        Some(TaskOutcome::Score(score)) if score.is_finite() && (0.0..=1.0).contains(&score) => {
            Some((OutcomeStatus::from_score(score), score))
        }
        Some(TaskOutcome::Score(score)) => return Err(PlanError::BadTaskOutcome(score)),
    };
    let resolved = match (from_outcome, overrides.task_success) {
        (Some((status, _)), Some(success)) if (status == OutcomeStatus::Success) != success => {
            return Err(PlanError::Contradiction(status.as_str(), success))
        }
        (Some(pair), _) => Some(pair),
        (None, Some(true)) => Some((OutcomeStatus::Success, 1.0)),
        (None, Some(false)) => Some((OutcomeStatus::Failed, 0.0)),
        (None, None) => None,
    };
    Ok(resolved.map(|(status, score)| OutcomeOverride { status, score, source: OutcomeSource::RequestOverride }))
}

/// Makes the plan for one turn; see the module docs for the rules. `adapt`
/// is the adaptive policy when the turn's scope is degraded, else `None`.
///
/// # Examples
///
/// ```
/// use capdex::core::turn_planner::*;
/// use capdex::core::kpi_window::ToolSelectionMode;
/// let found = DiscoveryOutcome::Found { capability_ids: vec!["tool:web-search".into()], tool_ids: vec!["tool:web-search".into()] };
/// let plan = plan(&PlannerDefaults::default(), &PlanOverrides::default(), &found, None).unwrap();
/// assert_eq!(plan.tool_selection_mode, ToolSelectionMode::Discovered);
/// assert_eq!(plan.selected_tool_ids, vec!["tool:web-search".to_string()]);
/// ```
pub fn plan(
    defaults: &PlannerDefaults,
    overrides: &PlanOverrides,
    discovery: &DiscoveryOutcome,
    adapt: Option<&AdaptivePolicy>,
) -> Result<TurnPlan, PlanError> {
    let outcome_override = outcome_override(overrides)?;
    let mut failure_mode = overrides.tool_failure_mode.unwrap_or(defaults.tool_failure_mode);
    let mut selection_mode = overrides.tool_selection_mode.unwrap_or(defaults.tool_selection_mode);
    let mut adaptive_applied = false;
    if let Some(policy) = adapt {
        if policy.force_all_tools_when_degraded && selection_mode == ToolSelectionMode::Discovered {
            selection_mode = ToolSelectionMode::All;
            adaptive_applied = true;
        }
        let pinned_closed = overrides.tool_failure_mode == Some(ToolFailureMode::FailClosed);
        if policy.force_fail_open_when_degraded && failure_mode == ToolFailureMode::FailClosed && !pinned_closed {
            failure_mode = ToolFailureMode::FailOpen;
            adaptive_applied = true;
        }
    }
    let needs_capabilities = match discovery {
        DiscoveryOutcome::Failed(_) => true,
        DiscoveryOutcome::Found { capability_ids, .. } => !capability_ids.is_empty(),
    };
    let (mut selected_tool_ids, mut fallback_reason, mut degraded) = (Vec::new(), None, adaptive_applied);
    if adaptive_applied {
        fallback_reason = Some(FallbackReason::AdaptiveDegradedScope);
    }
    if selection_mode == ToolSelectionMode::Discovered {
        let open = failure_mode == ToolFailureMode::FailOpen;
        match discovery {
            DiscoveryOutcome::Failed(reason) if !open => return Err(PlanError::DiscoveryFailed(reason.clone())),
            DiscoveryOutcome::Failed(_) => {
                (selection_mode, fallback_reason, degraded) =
                    (ToolSelectionMode::All, Some(FallbackReason::DiscoveryFailed), true)
            }
            DiscoveryOutcome::Found { tool_ids, .. } if !tool_ids.is_empty() => selected_tool_ids = tool_ids.clone(),
            DiscoveryOutcome::Found { .. } if !open => {}
            DiscoveryOutcome::Found { .. } if needs_capabilities => {
                (selection_mode, fallback_reason, degraded) =
                    (ToolSelectionMode::All, Some(FallbackReason::NoToolMatched), true)
            }
            DiscoveryOutcome::Found { .. } => {
                (selection_mode, fallback_reason) = (ToolSelectionMode::All, Some(FallbackReason::NoCapabilityNeeded))
            }
        }
    }
    let mut execution_lifecycle = vec![LifecycleState::Planned, LifecycleState::Executing];
    if degraded {
        execution_lifecycle.push(LifecycleState::Degraded);
    }
    if let Some(outcome) = outcome_override {
        execution_lifecycle.extend(finish(degraded, outcome.status));
    }
    debug_assert!(execution_lifecycle.windows(2).all(|pair| pair[0].can_move_to(pair[1])));
    Ok(TurnPlan {
        tool_failure_mode: failure_mode,
        tool_selection_mode: selection_mode,
        capability_discovery_kind: overrides.capability_discovery_kind.clone().unwrap_or_else(|| "any".to_string()),
        selected_tool_ids,
        fallback_applied: fallback_reason.is_some(),
        fallback_reason,
        adaptive_applied,
        needs_capabilities,
        execution_lifecycle,
        outcome_override,
    })
}

/// The lifecycle's end after `executing` (or `degraded`) for an outcome:
/// a failed turn errors; a degraded turn that succeeds recovers first.
pub fn finish(degraded: bool, status: OutcomeStatus) -> Vec<LifecycleState> {
    match (degraded, status) {
        (_, OutcomeStatus::Failed) => vec![LifecycleState::Errored],
        (true, OutcomeStatus::Success) => vec![LifecycleState::Recovered, LifecycleState::Completed],
        _ => vec![LifecycleState::Completed],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::kpi_window::Kpi;
    use LifecycleState::*;
    use ToolFailureMode::*;
    use ToolSelectionMode::*;

    fn found(capabilities: &[&str]) -> DiscoveryOutcome {
        DiscoveryOutcome::found(capabilities.iter().map(|s| s.to_string()).collect())
    }

    fn check(overrides: PlanOverrides, discovery: DiscoveryOutcome, adapt: bool) -> Result<TurnPlan, PlanError> {
        let policy = AdaptivePolicy::default();
        plan(&PlannerDefaults::default(), &overrides, &discovery, adapt.then_some(&policy))
    }

    fn closed() -> PlanOverrides {
        PlanOverrides { tool_failure_mode: Some(FailClosed), ..Default::default() }
    }

    #[test]
    fn discovered_tools_are_offered() {
        let plan = check(PlanOverrides::default(), found(&["tool:a", "skill:b"]), false).unwrap();
        assert_eq!((plan.tool_selection_mode, plan.tool_failure_mode), (Discovered, FailOpen));
        assert_eq!(plan.selected_tool_ids, vec!["tool:a"]);
        assert!(!plan.fallback_applied && plan.needs_capabilities);
        assert_eq!(plan.execution_lifecycle, vec![Planned, Executing]);
    }

    #[test]
    fn fail_open_falls_back_and_fail_closed_refuses() {
        let failed = DiscoveryOutcome::Failed("embedder down".into());
        let plan = check(PlanOverrides::default(), failed.clone(), false).unwrap();
        assert_eq!((plan.tool_selection_mode, plan.fallback_reason), (All, Some(FallbackReason::DiscoveryFailed)));
        assert_eq!(plan.execution_lifecycle, vec![Planned, Executing, Degraded]);
        assert!(
            matches!(check(closed(), failed, false), Err(PlanError::DiscoveryFailed(reason)) if reason == "embedder down")
        );
        let plan = check(PlanOverrides::default(), found(&["skill:b"]), false).unwrap();
        assert_eq!((plan.tool_selection_mode, plan.fallback_reason), (All, Some(FallbackReason::NoToolMatched)));
        let plan = check(closed(), found(&["skill:b"]), false).unwrap();
        assert_eq!(
            (plan.tool_selection_mode, plan.selected_tool_ids.len(), plan.fallback_applied),
            (Discovered, 0, false)
        );
    }

    #[test]
    fn a_turn_that_needs_no_capability_is_not_degraded() {
        let plan = check(PlanOverrides::default(), found(&[]), false).unwrap();
        assert_eq!((plan.tool_selection_mode, plan.fallback_reason), (All, Some(FallbackReason::NoCapabilityNeeded)));
        assert!(!plan.needs_capabilities);
        assert!(!plan.execution_lifecycle.contains(&Degraded));
    }

    #[test]
    fn adaptive_execution_switches_to_all_and_fail_open_unless_pinned() {
        let defaults = PlannerDefaults { tool_failure_mode: FailClosed, tool_selection_mode: Discovered };
        let policy = AdaptivePolicy::default();
        let plan = plan(&defaults, &PlanOverrides::default(), &found(&["tool:a"]), Some(&policy)).unwrap();
        assert_eq!((plan.tool_selection_mode, plan.tool_failure_mode), (All, FailOpen));
        assert!(plan.adaptive_applied && plan.execution_lifecycle.contains(&Degraded));
        let plan = check(closed(), found(&["tool:a"]), true).unwrap();
        assert_eq!((plan.tool_selection_mode, plan.tool_failure_mode), (All, FailClosed), "fail_closed pinned");
        let plan = check(closed(), found(&["tool:a"]), false).unwrap();
        assert!(!plan.adaptive_applied);
    }

    #[test]
    fn overrides_and_pinned_outcomes() {
        let overrides = PlanOverrides {
            tool_selection_mode: Some(All),
            capability_discovery_kind: Some("skill".into()),
            task_outcome: Some(TaskOutcome::Score(0.9)),
            ..Default::default()
        };
        let plan = check(overrides, found(&["tool:a"]), false).unwrap();
        assert_eq!((plan.tool_selection_mode, plan.capability_discovery_kind.as_str()), (All, "skill"));
        assert!(plan.selected_tool_ids.is_empty() && !plan.fallback_applied);
        assert_eq!(plan.outcome_override.unwrap().status, OutcomeStatus::Success);
        assert_eq!(plan.execution_lifecycle, vec![Planned, Executing, Completed]);
        let degraded_success = PlanOverrides { task_success: Some(true), ..Default::default() };
        let plan = check(degraded_success, DiscoveryOutcome::Failed("x".into()), false).unwrap();
        assert_eq!(plan.execution_lifecycle, vec![Planned, Executing, Degraded, Recovered, Completed]);
        let failed =
            PlanOverrides { task_outcome: Some(TaskOutcome::Status(OutcomeStatus::Failed)), ..Default::default() };
        assert_eq!(check(failed, found(&["tool:a"]), false).unwrap().execution_lifecycle.last(), Some(&Errored));
        let bad = PlanOverrides { task_outcome: Some(TaskOutcome::Score(1.5)), ..Default::default() };
        assert_eq!(check(bad, found(&[]), false), Err(PlanError::BadTaskOutcome(1.5)));
        let contradiction = PlanOverrides {
            task_outcome: Some(TaskOutcome::Status(OutcomeStatus::Failed)),
            task_success: Some(true),
            ..Default::default()
        };
        assert_eq!(check(contradiction, found(&[]), false), Err(PlanError::Contradiction("failed", true)));
    }

    #[test]
    fn fallback_reasons_serialize_to_their_wire_names() {
        for reason in FallbackReason::ALL {
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
        }
        let names: Vec<&str> = FallbackReason::ALL.iter().map(|reason| reason.as_str()).collect();
        assert_eq!(names, ["discovery_failed", "no_tool_matched", "no_capability_needed", "adaptive_degraded_scope"]);
        let plan = check(PlanOverrides::default(), found(&["tool:a"]), true).unwrap();
        assert_eq!(plan.fallback_reason, Some(FallbackReason::AdaptiveDegradedScope));
        let json = serde_json::to_value(&plan).unwrap();
        assert_eq!(json["fallbackReason"], "adaptive_degraded_scope");
        let plan = check(PlanOverrides::default(), found(&["tool:a"]), false).unwrap();
        assert_eq!(serde_json::to_value(&plan).unwrap()["fallbackReason"], serde_json::Value::Null);
    }

    fn kpi(sample_count: usize, weighted_success_rate: f32) -> Kpi {
        Kpi {
            scope_key: "s".into(),
            sample_count,
            success_count: 0,
            partial_count: 0,
            failed_count: 0,
            success_rate: 0.0,
            average_score: 0.0,
            weighted_success_rate,
            updated_at_ms: 0,
        }
    }

    #[test]
    fn adaptive_state_has_hysteresis() {
        let policy = AdaptivePolicy::default();
        let mut state = AdaptiveState::default();
        assert!(!policy.update(&kpi(4, 0.1), &mut state, 1), "too few samples");
        assert!(policy.update(&kpi(5, 0.69), &mut state, 2));
        assert_eq!(state, AdaptiveState { degraded: true, since_ms: Some(2) });
        assert!(!policy.update(&kpi(6, 0.75), &mut state, 3), "between the thresholds it stays degraded");
        assert!(policy.applies(&kpi(6, 0.75), &state));
        assert!(!policy.applies(&kpi(2, 0.75), &state), "stale samples gone");
        assert!(policy.update(&kpi(7, 0.8), &mut state, 4));
        assert!(!state.degraded);
        assert!(!policy.update(&kpi(8, 0.75), &mut state, 5), "between the thresholds it stays normal");
    }

    #[test]
    fn tools_are_told_by_their_kind() {
        let DiscoveryOutcome::Found { tool_ids, .. } = DiscoveryOutcome::found(vec![
            "skill:a".into(),
            "emergent-tool:b".into(),
            "tool:c".into(),
            "toolbox".into(),
        ]) else {
            unreachable!()
        };
        assert_eq!(tool_ids, vec!["emergent-tool:b", "tool:c"]);
    }

    #[test]
    fn lifecycle_transitions() {
        assert!(Planned.can_move_to(Executing) && Degraded.can_move_to(Recovered) && Recovered.can_move_to(Completed));
        assert!(
            !Planned.can_move_to(Completed) && !Completed.can_move_to(Executing) && !Executing.can_move_to(Recovered)
        );
    }
}
