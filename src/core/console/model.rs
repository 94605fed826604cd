//! The data the console's pages are rendered from. `gateway::service::Api`
//! returns these; `app.rs` fills them from the actors.

use crate::core::catalog::Catalog;
use crate::core::kpi_window::{AlertEvent, Kpi};
use crate::core::outcome_prior::OutcomePrior;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

/// Every KPI scope, with its alert state and recent history.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KpiOverview {
    /// Sorted by scope key.
    pub scopes: Vec<ScopeOverview>,
    /// The newest alert and recovery events (newest first, at most [`RECENT_ALERTS`]).
    pub recent_alerts: Vec<AlertEvent>,
    /// Outcomes recorded since the node started.
    pub outcomes: u64,
    /// When this overview was taken (ms since the epoch).
    pub at_ms: u64,
}

/// How many alert events a [`KpiOverview`] keeps.
pub const RECENT_ALERTS: usize = 50;

/// How many slices a scope's sparkline has.
pub const SPARKLINE_SLICES: usize = 24;

/// One KPI scope.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScopeOverview {
    pub kpi: Kpi,
    /// The scope is in alert (degraded, not yet recovered).
    pub alerting: bool,
    /// Adaptive execution applies to the scope now.
    pub adaptive_degraded: bool,
    /// The success rate of each of [`SPARKLINE_SLICES`] equal slices of the
    /// rolling window's time span ending now, oldest first; `None` where a
    /// slice holds no sample. A slice's rate is its mean per-sample score (1
    /// for a success, 0.5 for a partial, 0 for a failure, or the reported
    /// score), the score `weightedSuccessRate` weighs: see `KpiWindow::sparkline`.
    pub sparkline: Vec<Option<f32>>,
}

/// What the dispatch pipeline measured of one capability since the node started.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapabilityFigures {
    pub calls: u64,
    /// Calls that ended in an error (any error code, refusals included).
    pub errors: u64,
    /// Latency percentiles of completed calls (a handler or endpoint ran: not
    /// refusals, not replays), in milliseconds, within 2 % of the true
    /// nearest-rank value (`core::dispatch::figures`); `None` before the first.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// The catalog as the console shows it: the discovery catalog, the dispatch
/// figures by capability id, and the current outcome prior.
#[derive(Clone, Debug)]
pub struct CatalogOverview {
    pub catalog: Arc<Catalog>,
    pub figures: HashMap<String, CapabilityFigures>,
    pub prior: OutcomePrior,
}

/// A live event the console's pages listen for, sent to browsers as a
/// server-sent event named after its topic; it carries only the NATS subject
/// (the page fetches what changed), never the event's payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedEvent {
    pub topic: &'static str,
    pub subject: String,
}

/// The console topic of an event published on `subject` under `prefix`
/// (`capdex.v1`): `kpi`, `alert`, `dispatch`, `sources`, `catalog` or
/// `approval`; `None` for subjects the console does not follow.
pub fn topic_of(prefix: &str, subject: &str) -> Option<&'static str> {
    let rest = subject.strip_prefix(prefix)?.strip_prefix('.')?;
    let mut tokens = rest.split('.');
    match (tokens.next()?, tokens.next(), tokens.next(), tokens.next()) {
        ("kpi", Some(_), None, None) => Some("kpi"),
        ("alert", Some(_), Some(_), None) => Some("alert"),
        ("events", Some("dispatch"), None, None) => Some("dispatch"),
        ("events", Some("sources"), None, None) => Some("sources"),
        ("events", Some("index"), None, None) => Some("catalog"),
        ("approval", Some(_), Some("approve" | "reject"), None) => Some("approval"),
        _ => None,
    }
}

/// The subjects (wildcards) the console follows under `prefix`: what [`topic_of`] names.
pub fn feed_subjects(prefix: &str) -> Vec<String> {
    ["kpi.*", "alert.*.*", "events.dispatch", "events.sources", "events.index", "approval.*.*"]
        .iter()
        .map(|tail| format!("{prefix}.{tail}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_follow_the_published_subjects() {
        let p = "capdex.v1";
        assert_eq!(topic_of(p, "capdex.v1.kpi.acme_bot"), Some("kpi"));
        assert_eq!(topic_of(p, "capdex.v1.alert.warning.acme"), Some("alert"));
        assert_eq!(topic_of(p, "capdex.v1.events.dispatch"), Some("dispatch"));
        assert_eq!(topic_of(p, "capdex.v1.events.sources"), Some("sources"));
        assert_eq!(topic_of(p, "capdex.v1.events.index"), Some("catalog"));
        assert_eq!(topic_of(p, "capdex.v1.approval.ab12.approve"), Some("approval"));
        assert_eq!(topic_of(p, "capdex.v1.approval.list"), None);
        assert_eq!(topic_of(p, "capdex.v1.discover"), None);
        assert_eq!(topic_of(p, "capdex.v10.kpi.x"), None);
        assert_eq!(topic_of(p, "other.kpi.x"), None);
        assert_eq!(feed_subjects(p).len(), 6);
    }
}
