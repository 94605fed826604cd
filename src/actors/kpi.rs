//! KpiTelemetry: keeps a rolling window of task outcomes per scope
//! (`core::kpi_window`), answers each outcome with the scope's KPI and, when
//! the policy says so, an alert or recovery event; windows are stored in sled.

use crate::actors::Observe;
use crate::config::KpiSettings;
use crate::core::kpi_window::{AlertEvent, AlertState, Kpi, KpiWindow, OutcomeError, OutcomeReport, Sample};
use crate::store::{Store, StoreError};
use actix::prelude::*;
use std::collections::HashMap;

/// Records one outcome observed at `at_ms` (milliseconds since the epoch).
#[derive(Message, Debug)]
#[rtype(result = "Result<KpiUpdate, KpiError>")]
pub struct RecordOutcome {
    pub report: OutcomeReport,
    pub at_ms: u64,
}

/// The scope's KPI after an outcome, and the alert it raised, if any.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KpiUpdate {
    pub kpi: Kpi,
    pub alert: Option<AlertEvent>,
}

#[derive(Debug, thiserror::Error)]
pub enum KpiError {
    #[error(transparent)]
    Outcome(#[from] OutcomeError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Every scope's current KPI.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KpiSnapshot {
    pub kpis: Vec<Kpi>,
    pub outcomes: u64,
}

pub struct KpiTelemetry {
    store: Store,
    settings: KpiSettings,
    windows: HashMap<String, KpiWindow>,
    alert_states: HashMap<String, AlertState>,
    outcomes: u64,
}

impl KpiTelemetry {
    /// Restores the stored windows.
    pub fn load(store: Store, settings: KpiSettings) -> Result<KpiTelemetry, StoreError> {
        let windows = store.kpi_windows()?.into_iter().collect();
        Ok(KpiTelemetry { store, settings, windows, alert_states: HashMap::new(), outcomes: 0 })
    }
}

impl Actor for KpiTelemetry {
    type Context = Context<Self>;
}

impl Handler<RecordOutcome> for KpiTelemetry {
    type Result = Result<KpiUpdate, KpiError>;

    fn handle(&mut self, msg: RecordOutcome, _: &mut Context<Self>) -> Self::Result {
        let report = msg.report;
        let sample = Sample::new(report.status, report.score, msg.at_ms)?;
        let scope_key = self.settings.scope.scope_key(report.organization_id.as_deref(), report.persona_id.as_deref());
        let capacity = self.settings.rolling_window_size;
        let window = self
            .windows
            .entry(scope_key.clone())
            .or_insert_with(|| KpiWindow::new(capacity).expect("window size is validated"));
        window.push(sample);
        self.store.put_kpi_window(&scope_key, window)?;
        let kpi = window.kpi(&scope_key);
        let state = self.alert_states.entry(scope_key).or_default();
        let alert = self.settings.alerts.evaluate(&kpi, state, msg.at_ms);
        self.outcomes += 1;
        let status =
            serde_json::to_value(sample.status).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        metrics::counter!("capdex_outcomes_total", "status" => status).increment(1);
        if let Some(alert) = &alert {
            metrics::counter!("capdex_kpi_alerts_total", "severity" => alert.severity.clone()).increment(1);
        }
        Ok(KpiUpdate { kpi, alert })
    }
}

impl Handler<Observe<KpiSnapshot>> for KpiTelemetry {
    type Result = MessageResult<Observe<KpiSnapshot>>;

    fn handle(&mut self, _: Observe<KpiSnapshot>, _: &mut Context<Self>) -> Self::Result {
        let mut kpis: Vec<Kpi> = self.windows.iter().map(|(scope, window)| window.kpi(scope)).collect();
        kpis.sort_by(|a, b| a.scope_key.cmp(&b.scope_key));
        MessageResult(KpiSnapshot { kpis, outcomes: self.outcomes })
    }
}
