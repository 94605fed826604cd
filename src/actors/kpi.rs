//! KpiTelemetry: keeps a rolling window of task outcomes per scope
//! (`core::kpi_window`), answers each outcome with the scope's KPI and, when
//! the policy says so, an alert or recovery event; windows and their alert
//! and adaptive state are stored in sled.
//!
//! Write path of one outcome (`RecordOutcome`):
//! 1. the report is validated whole (`OutcomeReport::validate`); a refused
//!    report changes nothing;
//! 2. the sample is applied to a copy of the scope's window and state;
//! 3. the change is written to sled (in the mailbox's order, so writes land
//!    in arrival order; `Store::write_kpi`);
//! 4. only then is the copy committed in memory (after a store error the
//!    sample may still be on disk; a retry with its `turnId` is not counted twice);
//! 5. the caller waits for a flush covering the write (`Recorded::once_durable`,
//!    a group commit shared by concurrent outcomes) before acknowledging: an
//!    acknowledged outcome survives a crash.
//!
//! A retried turn (same `turnId` still in the window) is not counted again.

use crate::actors::Observe;
use crate::config::KpiSettings;
use crate::core::kpi_window::{record, AlertEvent, Kpi, KpiWindow, OutcomeError, OutcomeReport, ScopeMeta};
use crate::store::{Durable, KpiWrite, Store, StoreError};
use actix::prelude::*;
use std::collections::{HashMap, VecDeque};

/// Records one outcome observed at `at_ms` (milliseconds since the epoch).
/// The answer must be awaited with [`Recorded::once_durable`] before the
/// outcome is acknowledged.
#[derive(Message, Debug)]
#[rtype(result = "Result<Recorded, KpiError>")]
pub struct RecordOutcome {
    pub report: OutcomeReport,
    pub at_ms: u64,
}

/// An applied outcome whose write may not be durable yet.
///
/// The wait happens in the caller, not in the actor: an actix context polls
/// every future it has spawned whenever it wakes, so thousands of outcomes
/// waiting for a flush inside the actor would cost quadratic time.
#[derive(Debug)]
pub struct Recorded {
    update: KpiUpdate,
    durable: Durable,
}

impl Recorded {
    /// Returns the update once the outcome's write is durable.
    pub async fn once_durable(self) -> Result<KpiUpdate, KpiError> {
        self.durable.await?;
        Ok(self.update)
    }
}

/// Asks for a scope's KPI and whether adaptive execution applies to it now.
#[derive(Message, Debug)]
#[rtype(result = "ScopeView")]
pub struct ViewScope {
    pub organization_id: Option<String>,
    pub persona_id: Option<String>,
    pub at_ms: u64,
}

/// A scope as the turn planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeView {
    pub kpi: Kpi,
    pub adaptive_applies: bool,
}

/// The scope's KPI after an outcome, and the alert it raised, if any.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KpiUpdate {
    pub kpi: Kpi,
    pub alert: Option<AlertEvent>,
    /// The outcome repeated a turn already in the window and was not counted again.
    pub duplicate: bool,
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

/// One scope in memory: its window, meta, and the sequence numbers of its stored samples.
struct Scope {
    window: KpiWindow,
    meta: ScopeMeta,
    /// Stored sequence numbers of the window's samples, oldest first.
    seqs: VecDeque<u64>,
    next_seq: u64,
}

pub struct KpiTelemetry {
    store: Store,
    settings: KpiSettings,
    scopes: HashMap<String, Scope>,
    outcomes: u64,
    /// Scopes in alert and scopes planned adaptively, kept for the gauges.
    alerting: usize,
    adaptive_degraded: usize,
}

impl KpiTelemetry {
    /// Restores the stored windows under the current window settings,
    /// removing samples a smaller `rolling_window_size` no longer keeps.
    pub fn load(store: Store, settings: KpiSettings) -> Result<KpiTelemetry, StoreError> {
        let mut scopes = HashMap::new();
        for stored in store.kpi_scopes()? {
            let next_seq = stored.samples.last().map_or(0, |(seq, _)| seq + 1);
            let mut seqs: VecDeque<u64> = stored.samples.iter().map(|(seq, _)| *seq).collect();
            let (window, dropped) =
                KpiWindow::restore(settings.window, stored.samples.iter().map(|(_, sample)| *sample));
            let removed: Vec<u64> = seqs.drain(..dropped).collect();
            if !removed.is_empty() {
                store.write_kpi(&KpiWrite {
                    scope_key: &stored.scope_key,
                    append: None,
                    remove: &removed,
                    meta: None,
                })?;
            }
            let meta = stored.meta.unwrap_or_default();
            scopes.insert(stored.scope_key, Scope { window, meta, seqs, next_seq });
        }
        let alerting = scopes.values().filter(|scope| scope.meta.alert.degraded).count();
        let adaptive_degraded = scopes.values().filter(|scope| scope.meta.adaptive.degraded).count();
        let telemetry = KpiTelemetry { store, settings, scopes, outcomes: 0, alerting, adaptive_degraded };
        telemetry.publish_gauges();
        Ok(telemetry)
    }

    fn publish_gauges(&self) {
        metrics::gauge!("capdex_kpi_scopes").set(self.scopes.len() as f64);
        metrics::gauge!("capdex_kpi_scopes_alerting").set(self.alerting as f64);
        metrics::gauge!("capdex_kpi_scopes_adaptive_degraded").set(self.adaptive_degraded as f64);
    }

    /// Validates, applies and stores one outcome; memory changes only after the store accepted it.
    fn apply(&mut self, report: &OutcomeReport, at_ms: u64) -> Result<KpiUpdate, KpiError> {
        let sample = report.validate(at_ms)?;
        let scope_key = self.settings.scope.scope_key(report.organization_id.as_deref(), report.persona_id.as_deref());
        let existing = self.scopes.get(&scope_key);
        let is_new = existing.is_none();
        let mut window = existing.map_or_else(|| KpiWindow::new(self.settings.window), |scope| scope.window.clone());
        let mut meta = existing.map(|scope| scope.meta.clone()).unwrap_or_default();
        let next_seq = existing.map_or(0, |scope| scope.next_seq);
        let recorded =
            record(&scope_key, &mut window, &mut meta, sample, &self.settings.alerts, &self.settings.adaptive);
        if recorded.duplicate {
            metrics::counter!("capdex_outcomes_duplicate_total").increment(1);
            return Ok(KpiUpdate { kpi: recorded.kpi, alert: None, duplicate: true });
        }
        let removed: Vec<u64> =
            existing.map(|scope| scope.seqs.iter().take(recorded.evicted).copied().collect()).unwrap_or_default();
        debug_assert_eq!(removed.len(), recorded.evicted);
        self.store.write_kpi(&KpiWrite {
            scope_key: &scope_key,
            append: window.samples().last().map(|stored| (next_seq, stored)),
            remove: &removed,
            meta: recorded.meta_changed.then_some(&meta),
        })?;
        let scope = self.scopes.entry(scope_key).or_insert_with(|| Scope {
            window: KpiWindow::new(self.settings.window),
            meta: ScopeMeta::default(),
            seqs: VecDeque::new(),
            next_seq: 0,
        });
        scope.seqs.drain(..recorded.evicted);
        scope.seqs.push_back(next_seq);
        scope.next_seq = next_seq + 1;
        let flags = |meta: &ScopeMeta| (usize::from(meta.alert.degraded), usize::from(meta.adaptive.degraded));
        let ((alert_before, adaptive_before), (alert_after, adaptive_after)) = (flags(&scope.meta), flags(&meta));
        self.alerting = self.alerting + alert_after - alert_before;
        self.adaptive_degraded = self.adaptive_degraded + adaptive_after - adaptive_before;
        scope.window = window;
        scope.meta = meta;
        debug_assert_eq!(scope.seqs.len(), scope.window.len());
        self.outcomes += 1;
        metrics::counter!("capdex_outcomes_total", "status" => sample.status.as_str()).increment(1);
        if let Some(alert) = &recorded.alert {
            metrics::counter!("capdex_kpi_alerts_total", "severity" => alert.severity.clone()).increment(1);
        }
        if recorded.meta_changed || is_new {
            self.publish_gauges();
        }
        Ok(KpiUpdate { kpi: recorded.kpi, alert: recorded.alert, duplicate: false })
    }
}

impl Actor for KpiTelemetry {
    type Context = Context<Self>;
}

impl Handler<RecordOutcome> for KpiTelemetry {
    type Result = Result<Recorded, KpiError>;

    fn handle(&mut self, msg: RecordOutcome, _: &mut Context<Self>) -> Self::Result {
        let update = self.apply(&msg.report, msg.at_ms)?;
        // Registered after the write (and for a duplicate, after the write it repeats).
        Ok(Recorded { update, durable: self.store.durable() })
    }
}

impl Handler<ViewScope> for KpiTelemetry {
    type Result = MessageResult<ViewScope>;

    fn handle(&mut self, msg: ViewScope, _: &mut Context<Self>) -> Self::Result {
        let scope_key = self.settings.scope.scope_key(msg.organization_id.as_deref(), msg.persona_id.as_deref());
        let view = match self.scopes.get(&scope_key) {
            Some(scope) => {
                let kpi = scope.window.kpi(&scope_key, msg.at_ms);
                let adaptive_applies = self.settings.adaptive.applies(&kpi, &scope.meta.adaptive);
                ScopeView { kpi, adaptive_applies }
            }
            None => ScopeView {
                kpi: KpiWindow::new(self.settings.window).kpi(&scope_key, msg.at_ms),
                adaptive_applies: false,
            },
        };
        MessageResult(view)
    }
}

/// Asks for every scope's KPI at `at_ms`.
pub struct ObserveAt(pub u64);

impl Message for ObserveAt {
    type Result = KpiSnapshot;
}

impl Handler<ObserveAt> for KpiTelemetry {
    type Result = MessageResult<ObserveAt>;

    fn handle(&mut self, msg: ObserveAt, _: &mut Context<Self>) -> Self::Result {
        let mut kpis: Vec<Kpi> = self.scopes.iter().map(|(key, scope)| scope.window.kpi(key, msg.0)).collect();
        kpis.sort_by(|a, b| a.scope_key.cmp(&b.scope_key));
        MessageResult(KpiSnapshot { kpis, outcomes: self.outcomes })
    }
}

impl Handler<Observe<KpiSnapshot>> for KpiTelemetry {
    type Result = MessageResult<Observe<KpiSnapshot>>;

    /// Every scope's KPI as of its newest sample (no horizon applied past it).
    fn handle(&mut self, _: Observe<KpiSnapshot>, _: &mut Context<Self>) -> Self::Result {
        let mut kpis: Vec<Kpi> = self
            .scopes
            .iter()
            .map(|(key, scope)| scope.window.kpi(key, scope.window.samples().last().map_or(0, |s| s.at_ms)))
            .collect();
        kpis.sort_by(|a, b| a.scope_key.cmp(&b.scope_key));
        MessageResult(KpiSnapshot { kpis, outcomes: self.outcomes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;
    use crate::core::kpi_window::OutcomeStatus;

    fn settings() -> KpiSettings {
        Settings::load(None, &Default::default()).unwrap().kpi
    }

    async fn record(kpi: &Addr<KpiTelemetry>, report: OutcomeReport, at_ms: u64) -> Result<KpiUpdate, KpiError> {
        kpi.send(RecordOutcome { report, at_ms }).await.unwrap()?.once_durable().await
    }

    /// Opens the store again once the stopped actor has let go of it.
    async fn reopen(dir: &std::path::Path) -> Store {
        for _ in 0..500 {
            if let Ok(store) = Store::open(dir) {
                return store;
            }
            actix_rt::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the store at {} stayed locked", dir.display());
    }

    fn failed(turn: &str) -> OutcomeReport {
        OutcomeReport {
            turn_id: Some(turn.into()),
            organization_id: Some("acme".into()),
            status: Some(OutcomeStatus::Failed),
            ..Default::default()
        }
    }

    #[actix::test]
    async fn outcomes_survive_a_restart_with_their_alert_state() {
        let dir = tempfile::tempdir().unwrap();
        {
            let kpi = KpiTelemetry::load(Store::open(dir.path()).unwrap(), settings()).unwrap().start();
            for i in 0..8 {
                let update = record(&kpi, failed(&format!("t{i}")), 1_000 + i).await.unwrap();
                assert_eq!(update.alert.is_some(), i == 7, "{update:?}");
            }
            let again = record(&kpi, failed("t3"), 2_000).await.unwrap();
            assert!(again.duplicate && again.kpi.sample_count == 8);
            let bad = OutcomeReport { score: Some(f32::NAN), ..failed("t9") };
            assert!(record(&kpi, bad, 2_001).await.is_err());
            let view = kpi.send(ViewScope { organization_id: Some("acme".into()), persona_id: None, at_ms: 2_002 });
            assert!(view.await.unwrap().adaptive_applies);
        }
        let kpi = KpiTelemetry::load(reopen(dir.path()).await, settings()).unwrap().start();
        let snapshot = kpi.send(Observe::<KpiSnapshot>::new()).await.unwrap();
        assert_eq!(snapshot.kpis.len(), 1);
        assert_eq!(snapshot.kpis[0].sample_count, 8);
        // The alert state came back too: still within the cooldown, no second alert.
        let update = record(&kpi, failed("t10"), 3_000).await.unwrap();
        assert_eq!(update.alert, None);
        assert_eq!(update.kpi.sample_count, 9);
    }

    #[actix::test]
    async fn a_smaller_window_trims_what_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        {
            let kpi = KpiTelemetry::load(Store::open(dir.path()).unwrap(), settings()).unwrap().start();
            for i in 0..20 {
                record(&kpi, failed(&format!("t{i}")), i).await.unwrap();
            }
        }
        let mut small = settings();
        small.window = crate::core::kpi_window::WindowSpec::new(5, 0).unwrap();
        let store = reopen(dir.path()).await;
        drop(KpiTelemetry::load(store.clone(), small).unwrap());
        let scopes = store.kpi_scopes().unwrap();
        assert_eq!(scopes[0].samples.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(), vec![15, 16, 17, 18, 19]);
    }
}
