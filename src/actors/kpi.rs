//! KpiTelemetry: keeps a rolling window of task outcomes per scope
//! (`core::kpi_window`), answers each outcome with the scope's KPI and, when
//! the policy says so, an alert or recovery event; keeps per-capability
//! outcome statistics (`core::outcome_prior`) and publishes the ranking
//! prior they give to the Discoverer. Windows, their alert and adaptive state,
//! and the statistics are stored in sled.
//!
//! Write path of one outcome (`RecordOutcome`):
//! 1. the report is validated whole (`OutcomeReport::validate`), and the
//!    store is checked to accept writes (`Store::kpi_failed`); a refused
//!    report changes nothing;
//! 2. the sample is applied to the scope's window and state in memory, and
//!    each listed capability is credited with its score;
//! 3. the writes (the sample into its ring slot, the state if it changed,
//!    the statistics) are queued with `Store::commit_kpi`, in mailbox order;
//!    the group-commit thread applies each round as one atomic sled batch,
//!    in that order, then flushes;
//! 4. the caller waits for that flush (`AppliedOutcome::once_durable`) before
//!    acknowledging: an acknowledged outcome survives a crash. A batch that
//!    cannot be applied fails its outcomes and every later one until restart,
//!    so memory that ran ahead of the disk is never acknowledged.
//!
//! A retried turn (same `turnId` still in the window) is not counted again,
//! nor credited to its capabilities again.

use crate::actors::outcome_learner::OutcomeToLearn;
use crate::actors::Inspect;
use crate::config::KpiSettings;
use crate::core::console::model::{KpiOverview, ScopeOverview, RECENT_ALERTS, SPARKLINE_SLICES};
use crate::core::kpi_window::{
    check_capability_id, record, AlertEvent, Kpi, KpiWindow, OutcomeError, OutcomeReport, OutcomeStatus, ScopeMeta,
};
use crate::core::outcome_prior::{distinct_ids, Credited, OutcomePrior, OutcomeStats};
use crate::store::{Durable, KpiOp, Store, StoreError};
use actix::prelude::*;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages the mailbox holds before senders wait.
pub const MAILBOX_CAPACITY: usize = 1 << 16;

/// Records one outcome observed at `at_ms` (milliseconds since the epoch).
/// The answer must be awaited with [`AppliedOutcome::once_durable`] before the
/// outcome is acknowledged.
#[derive(Message, Debug)]
#[rtype(result = "Result<AppliedOutcome, KpiError>")]
pub struct RecordOutcome {
    pub report: OutcomeReport,
    pub at_ms: u64,
}

/// [`RecordOutcome`] for an outcome read from the JetStream outcome stream:
/// its id (with its stream sequence) is stored as processed in the same
/// group-commit round as its writes (`KpiOp::OutcomeProcessed`), after them,
/// so one flush makes both durable and the id is never durable without the
/// sample. A refused (invalid) outcome marks nothing.
#[derive(Message, Debug)]
#[rtype(result = "Result<AppliedOutcome, KpiError>")]
pub struct RecordStreamOutcome {
    pub report: OutcomeReport,
    pub at_ms: u64,
    pub outcome_id: String,
    pub sequence: u64,
}

/// The result of calling one capability (a dispatch), observed at `at_ms`:
/// credited to the capability's statistics as 1 (success) or 0 (failure).
/// The answer resolves once the statistics are durable.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Durable, KpiError>")]
pub struct CapabilityResult {
    pub capability_id: String,
    pub success: bool,
    pub at_ms: u64,
}

/// The ranking prior from the latest outcome statistics, sent to the Discoverer.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct PriorPublished {
    pub prior: Arc<OutcomePrior>,
}

/// An applied outcome whose write may not be durable yet.
///
/// The wait happens in the caller, not in the actor: an actix context polls
/// every future it has spawned whenever it wakes, so thousands of outcomes
/// waiting for a flush inside the actor would cost quadratic time.
#[derive(Debug)]
pub struct AppliedOutcome {
    update: KpiUpdate,
    durable: Durable,
}

impl AppliedOutcome {
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

/// The per-scope Prometheus gauges (only for the first `metrics_max_scopes` scopes).
struct ScopeGauges {
    samples: metrics::Gauge,
    success_rate: metrics::Gauge,
    average_score: metrics::Gauge,
    weighted_success_rate: metrics::Gauge,
    alerting: metrics::Gauge,
    adaptive_degraded: metrics::Gauge,
}

impl ScopeGauges {
    fn register(scope_key: &str) -> ScopeGauges {
        let gauge = |name: &'static str| metrics::gauge!(name, "scope" => scope_key.to_string());
        ScopeGauges {
            samples: gauge("capdex_kpi_samples"),
            success_rate: gauge("capdex_kpi_success_rate"),
            average_score: gauge("capdex_kpi_average_score"),
            weighted_success_rate: gauge("capdex_kpi_weighted_success_rate"),
            alerting: gauge("capdex_kpi_alerting"),
            adaptive_degraded: gauge("capdex_kpi_adaptive_degraded"),
        }
    }

    fn set(&self, kpi: &Kpi, meta: &ScopeMeta) {
        self.samples.set(kpi.sample_count as f64);
        self.success_rate.set(f64::from(kpi.success_rate));
        self.average_score.set(f64::from(kpi.average_score));
        self.weighted_success_rate.set(f64::from(kpi.weighted_success_rate));
        self.alerting.set(if meta.alert.degraded { 1.0 } else { 0.0 });
        self.adaptive_degraded.set(if meta.adaptive.degraded { 1.0 } else { 0.0 });
    }
}

/// One scope in memory: its window, meta, and the sequence number of its next sample.
struct Scope {
    key: Arc<str>,
    window: KpiWindow,
    meta: ScopeMeta,
    next_seq: u64,
    gauges: Option<ScopeGauges>,
    /// The newest sample's time: when the scope was last updated, for retention.
    last_at_ms: u64,
    /// The actor's update counter when the scope last took a sample (0 for a
    /// restored one): orders scopes updated in the same millisecond.
    touched: u64,
}

/// Outcome counters, registered once instead of looked up per outcome.
struct Counters {
    success: metrics::Counter,
    partial: metrics::Counter,
    failed: metrics::Counter,
    duplicate: metrics::Counter,
}

pub struct KpiTelemetry {
    store: Store,
    settings: KpiSettings,
    scopes: HashMap<Arc<str>, Scope>,
    outcomes: u64,
    /// Scopes in alert and scopes planned adaptively, kept for the gauges.
    alerting: usize,
    adaptive_degraded: usize,
    scopes_with_gauges: usize,
    counters: Counters,
    /// Reused for every outcome: the scope key and the queued writes.
    scope_key: String,
    ops: Vec<KpiOp>,
    stats: OutcomeStats,
    /// Where the prior goes, and when it last went.
    prior_sinks: Vec<Recipient<PriorPublished>>,
    /// The outcome learner, sent each new outcome of a turn that names capabilities.
    learning_sink: Option<Recipient<OutcomeToLearn>>,
    prior_dirty: bool,
    prior_scheduled: bool,
    prior_published_at: Option<Instant>,
    /// The newest observation time seen: "now" for the prior's decay.
    latest_ms: u64,
    /// The newest alert and recovery events raised since the node started,
    /// newest first, at most [`RECENT_ALERTS`].
    recent_alerts: VecDeque<AlertEvent>,
    /// Counts the samples taken, to order scope updates (`Scope::touched`).
    updates: u64,
}

impl KpiTelemetry {
    /// Restores the stored windows and statistics under the current window
    /// settings (a store laid out for another window size is rewritten).
    pub fn load(store: Store, settings: KpiSettings) -> Result<KpiTelemetry, StoreError> {
        let stored = store.load_kpi(settings.window.capacity())?;
        let mut telemetry = KpiTelemetry {
            store,
            scopes: HashMap::with_capacity(stored.scopes.len()),
            outcomes: 0,
            alerting: 0,
            adaptive_degraded: 0,
            scopes_with_gauges: 0,
            counters: Counters {
                success: metrics::counter!("capdex_outcomes_total", "status" => "success"),
                partial: metrics::counter!("capdex_outcomes_total", "status" => "partial"),
                failed: metrics::counter!("capdex_outcomes_total", "status" => "failed"),
                duplicate: metrics::counter!("capdex_outcomes_duplicate_total"),
            },
            scope_key: String::new(),
            ops: Vec::new(),
            latest_ms: stored.prior.global.at_ms,
            stats: stored.prior,
            prior_sinks: Vec::new(),
            learning_sink: None,
            prior_dirty: true,
            prior_scheduled: false,
            prior_published_at: None,
            recent_alerts: VecDeque::with_capacity(RECENT_ALERTS),
            updates: 0,
            settings,
        };
        for stored in stored.scopes {
            let next_seq = stored.samples.last().map_or(0, |(seq, _)| seq + 1);
            let (window, dropped) =
                KpiWindow::restore(telemetry.settings.window, stored.samples.iter().map(|(_, sample)| *sample));
            debug_assert_eq!(dropped, 0, "load_kpi keeps at most capacity samples");
            let meta = stored.meta.unwrap_or_default();
            let key: Arc<str> = Arc::from(stored.scope_key);
            let gauges = telemetry.gauges_for(&key);
            if let Some(gauges) = &gauges {
                let now_ms = window.samples().last().map_or(0, |s| s.at_ms);
                gauges.set(&window.kpi(&key, now_ms), &meta);
            }
            telemetry.alerting += usize::from(meta.alert.degraded);
            telemetry.adaptive_degraded += usize::from(meta.adaptive.degraded);
            let last_at_ms = window.samples().map(|sample| sample.at_ms).max().unwrap_or(0);
            let scope = Scope { key: key.clone(), window, meta, next_seq, gauges, last_at_ms, touched: 0 };
            telemetry.scopes.insert(key, scope);
        }
        telemetry.publish_gauges();
        Ok(telemetry)
    }

    /// Tracks the outcome prior of at most `max_capabilities` capabilities
    /// (`[retention] outcome_prior_max_count`; see `OutcomeStats`).
    pub fn with_max_tracked_capabilities(mut self, max_capabilities: usize) -> KpiTelemetry {
        self.stats.max_capabilities = max_capabilities;
        self
    }

    /// Sends every ranking prior to `sink` (the Discoverer), first when the actor starts.
    pub fn with_prior_sink(mut self, sink: Recipient<PriorPublished>) -> KpiTelemetry {
        self.prior_sinks.push(sink);
        self
    }

    /// Sends each new outcome that names a `turnId` and capabilities to `sink`
    /// (the OutcomeLearner); dropped, and counted, when its mailbox is full.
    pub fn with_learning_sink(mut self, sink: Recipient<OutcomeToLearn>) -> KpiTelemetry {
        self.learning_sink = Some(sink);
        self
    }

    fn gauges_for(&mut self, scope_key: &str) -> Option<ScopeGauges> {
        (self.scopes_with_gauges < self.settings.metrics_max_scopes).then(|| {
            self.scopes_with_gauges += 1;
            ScopeGauges::register(scope_key)
        })
    }

    fn publish_gauges(&self) {
        metrics::gauge!("capdex_kpi_scopes").set(self.scopes.len() as f64);
        metrics::gauge!("capdex_kpi_scopes_alerting").set(self.alerting as f64);
        metrics::gauge!("capdex_kpi_scopes_adaptive_degraded").set(self.adaptive_degraded as f64);
    }

    /// Validates and applies one outcome, and queues its writes.
    fn apply(&mut self, report: &OutcomeReport, at_ms: u64) -> Result<(KpiUpdate, bool), KpiError> {
        let sample = report.validate(at_ms, self.settings.outcome_limits)?;
        if let Some(message) = self.store.kpi_failed() {
            return Err(StoreError::Durable { message }.into());
        }
        self.store.check_space()?;
        self.settings.scope.write_scope_key(
            report.organization_id.as_deref(),
            report.persona_id.as_deref(),
            &mut self.scope_key,
        );
        let is_new = !self.scopes.contains_key(self.scope_key.as_str());
        if is_new {
            let key: Arc<str> = Arc::from(self.scope_key.as_str());
            let gauges = self.gauges_for(&key);
            let window = KpiWindow::new(self.settings.window);
            let scope = Scope {
                key: key.clone(),
                window,
                meta: ScopeMeta::default(),
                next_seq: 0,
                gauges,
                last_at_ms: 0,
                touched: 0,
            };
            self.scopes.insert(key, scope);
        }
        let scope = self.scopes.get_mut(self.scope_key.as_str()).expect("the scope was just ensured");
        let flags = |meta: &ScopeMeta| (usize::from(meta.alert.degraded), usize::from(meta.adaptive.degraded));
        let (alert_before, adaptive_before) = flags(&scope.meta);
        let recorded = record(
            &scope.key,
            &mut scope.window,
            &mut scope.meta,
            sample,
            &self.settings.alerts,
            &self.settings.adaptive,
        );
        if recorded.duplicate {
            self.counters.duplicate.increment(1);
            return Ok((KpiUpdate { kpi: recorded.kpi, alert: None, duplicate: true }, false));
        }
        let stored_sample = *scope.window.samples().last().expect("a sample was just appended");
        self.ops.push(KpiOp::Sample {
            scope_key: scope.key.clone(),
            seq: scope.next_seq,
            capacity: self.settings.window.capacity(),
            sample: stored_sample,
        });
        scope.next_seq += 1;
        self.updates += 1;
        scope.last_at_ms = scope.last_at_ms.max(stored_sample.at_ms);
        scope.touched = self.updates;
        if recorded.meta_changed {
            self.ops.push(KpiOp::Meta { scope_key: scope.key.clone(), meta: scope.meta.clone() });
        }
        if let Some(gauges) = &scope.gauges {
            gauges.set(&recorded.kpi, &scope.meta);
        }
        let (alert_after, adaptive_after) = flags(&scope.meta);
        self.alerting = self.alerting + alert_after - alert_before;
        self.adaptive_degraded = self.adaptive_degraded + adaptive_after - adaptive_before;
        let mut credited = false;
        for capability_id in distinct_ids(&report.capabilities) {
            credited |= self.credit(capability_id, sample.score, sample.at_ms);
        }
        if credited {
            self.ops.push(KpiOp::PriorGlobal { stat: self.stats.global });
        }
        if let (Some(sink), Some(turn_id)) = (&self.learning_sink, &report.turn_id) {
            if !report.capabilities.is_empty() {
                let capabilities = distinct_ids(&report.capabilities).map(str::to_string).collect();
                let outcome = OutcomeToLearn { turn_id: turn_id.clone(), capabilities, score: sample.score };
                if sink.try_send(outcome).is_err() {
                    metrics::counter!("capdex_outcome_learning_skipped_total", "reason" => "busy").increment(1);
                }
            }
        }
        self.outcomes += 1;
        match sample.status {
            OutcomeStatus::Success => self.counters.success.increment(1),
            OutcomeStatus::Partial => self.counters.partial.increment(1),
            OutcomeStatus::Failed => self.counters.failed.increment(1),
        }
        if let Some(alert) = &recorded.alert {
            metrics::counter!("capdex_kpi_alerts_total", "severity" => alert.severity.clone()).increment(1);
            self.recent_alerts.truncate(RECENT_ALERTS - 1);
            self.recent_alerts.push_front(alert.clone());
        }
        if recorded.meta_changed || is_new {
            self.publish_gauges();
        }
        Ok((KpiUpdate { kpi: recorded.kpi, alert: recorded.alert, duplicate: false }, credited))
    }

    /// Credits one capability and queues its new statistics; returns whether anything changed.
    fn credit(&mut self, capability_id: &str, score: f32, at_ms: u64) -> bool {
        self.latest_ms = self.latest_ms.max(at_ms);
        match self.stats.credit(capability_id, score, at_ms, self.settings.prior.half_life_ms) {
            Credited::Updated(stat) => {
                self.ops.push(KpiOp::Capability { capability_id: capability_id.to_string(), stat });
                true
            }
            Credited::Ignored => {
                metrics::counter!("capdex_outcome_prior_ignored_total").increment(1);
                false
            }
        }
    }

    /// Publishes the prior now, or schedules it so that sinks get at most one
    /// per `prior_publish_interval_ms` (0 publishes after every change).
    fn prior_changed(&mut self, ctx: &mut Context<Self>) {
        self.prior_dirty = true;
        if self.prior_scheduled || self.prior_sinks.is_empty() {
            return;
        }
        let interval = Duration::from_millis(self.settings.prior_publish_interval_ms);
        match self.prior_published_at.map(|at| at.elapsed()) {
            Some(elapsed) if elapsed < interval => {
                self.prior_scheduled = true;
                ctx.run_later(interval - elapsed, |actor, _| {
                    actor.prior_scheduled = false;
                    actor.publish_prior();
                });
            }
            _ => self.publish_prior(),
        }
    }

    /// Forgets stale statistics and sends the prior as of the newest observation.
    fn publish_prior(&mut self) {
        if !self.prior_dirty {
            return;
        }
        self.prior_dirty = false;
        self.prior_published_at = Some(Instant::now());
        let half_life_ms = self.settings.prior.half_life_ms;
        let forgotten = self.stats.prune(self.latest_ms, half_life_ms);
        if !forgotten.is_empty() {
            // Nobody waits on forgetting: a crash before it lands only keeps a stat that decays anyway.
            let ops = forgotten.into_iter().map(|capability_id| KpiOp::ForgetCapability { capability_id });
            drop(self.store.commit_kpi(ops));
        }
        let prior = Arc::new(self.stats.snapshot(&self.settings.prior, self.latest_ms));
        metrics::gauge!("capdex_outcome_prior_capabilities").set(prior.len() as f64);
        metrics::gauge!("capdex_outcome_prior_tracked").set(self.stats.capabilities.len() as f64);
        for sink in &self.prior_sinks {
            sink.do_send(PriorPublished { prior: prior.clone() });
        }
    }
}

impl Actor for KpiTelemetry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Every gateway request is a task that sends here; with actix's default
        // mailbox of 16, thousands of outcomes in flight park and wake their
        // senders over and over (a profile of benches/kpi.rs spent a third of
        // its time there). Back-pressure comes from NATS and the group commit.
        ctx.set_mailbox_capacity(MAILBOX_CAPACITY);
        // The restored statistics reach the Discoverer before any query can use them.
        self.publish_prior();
    }
}

impl Handler<RecordOutcome> for KpiTelemetry {
    type Result = Result<AppliedOutcome, KpiError>;

    fn handle(&mut self, msg: RecordOutcome, ctx: &mut Context<Self>) -> Self::Result {
        let (update, credited) = self.apply(&msg.report, msg.at_ms).inspect_err(|_| self.ops.clear())?;
        // Registered with the writes (and for a duplicate, after the write it repeats).
        let durable = self.store.commit_kpi(self.ops.drain(..));
        if credited {
            self.prior_changed(ctx);
        }
        Ok(AppliedOutcome { update, durable })
    }
}

impl Handler<RecordStreamOutcome> for KpiTelemetry {
    type Result = Result<AppliedOutcome, KpiError>;

    fn handle(&mut self, msg: RecordStreamOutcome, ctx: &mut Context<Self>) -> Self::Result {
        let (update, credited) = self.apply(&msg.report, msg.at_ms).inspect_err(|_| self.ops.clear())?;
        self.ops.push(KpiOp::OutcomeProcessed { outcome_id: msg.outcome_id, sequence: msg.sequence, at_ms: msg.at_ms });
        let durable = self.store.commit_kpi(self.ops.drain(..));
        if credited {
            self.prior_changed(ctx);
        }
        Ok(AppliedOutcome { update, durable })
    }
}

impl Handler<CapabilityResult> for KpiTelemetry {
    type Result = Result<Durable, KpiError>;

    fn handle(&mut self, msg: CapabilityResult, ctx: &mut Context<Self>) -> Self::Result {
        check_capability_id(&msg.capability_id, self.settings.outcome_limits.max_id_bytes)?;
        if let Some(message) = self.store.kpi_failed() {
            return Err(StoreError::Durable { message }.into());
        }
        let score = if msg.success { 1.0 } else { 0.0 };
        if self.credit(&msg.capability_id, score, msg.at_ms) {
            self.ops.push(KpiOp::PriorGlobal { stat: self.stats.global });
            self.prior_changed(ctx);
        }
        Ok(self.store.commit_kpi(self.ops.drain(..)))
    }
}

impl Handler<ViewScope> for KpiTelemetry {
    type Result = MessageResult<ViewScope>;

    fn handle(&mut self, msg: ViewScope, _: &mut Context<Self>) -> Self::Result {
        let scope_key = self.settings.scope.scope_key(msg.organization_id.as_deref(), msg.persona_id.as_deref());
        let view = match self.scopes.get(scope_key.as_str()) {
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

/// Prunes the scopes over `[retention] kpi_max_age_ms` and `kpi_max_count` at
/// `now_ms`: a scope not updated within the age goes, then the least recently
/// updated ones beyond the count (`core::retention::plan`). A pruned scope's
/// window and state leave memory and the store together (`KpiOp::ForgetScope`);
/// an outcome for it later starts it again.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<PrunedScopes, KpiError>")]
pub struct PruneScopes {
    pub now_ms: u64,
    pub limits: crate::core::retention::Limits,
}

/// What [`PruneScopes`] did; await `durable` before measuring the store.
#[derive(Debug)]
pub struct PrunedScopes {
    pub pruned: u64,
    /// Scopes kept.
    pub scopes: u64,
    pub durable: Durable,
}

impl Handler<PruneScopes> for KpiTelemetry {
    type Result = Result<PrunedScopes, KpiError>;

    fn handle(&mut self, msg: PruneScopes, _: &mut Context<Self>) -> Self::Result {
        use crate::core::retention::{plan, Record};
        let mut by_age: Vec<(u64, u64, Arc<str>)> =
            self.scopes.values().map(|scope| (scope.last_at_ms, scope.touched, scope.key.clone())).collect();
        // Oldest first, so the plan's ties (by index) fall to the least recently updated.
        by_age.sort_unstable();
        let records: Vec<Record> = by_age.iter().map(|(at_ms, _, _)| Record { at_ms: *at_ms, exempt: false }).collect();
        let doomed = plan(&records, msg.now_ms, msg.limits);
        let mut ops = Vec::with_capacity(doomed.len());
        for at in &doomed {
            let scope_key = &by_age[*at].2;
            if let Some(scope) = self.scopes.remove(scope_key) {
                self.alerting -= usize::from(scope.meta.alert.degraded);
                self.adaptive_degraded -= usize::from(scope.meta.adaptive.degraded);
                ops.push(KpiOp::ForgetScope { scope_key: scope.key });
            }
        }
        if !doomed.is_empty() {
            self.publish_gauges();
        }
        let durable = self.store.commit_kpi(ops);
        Ok(PrunedScopes { pruned: doomed.len() as u64, scopes: self.scopes.len() as u64, durable })
    }
}

/// Asks for every scope's KPI at `at_ms`.
pub struct InspectAt(pub u64);

impl Message for InspectAt {
    type Result = KpiSnapshot;
}

impl Handler<InspectAt> for KpiTelemetry {
    type Result = MessageResult<InspectAt>;

    fn handle(&mut self, msg: InspectAt, _: &mut Context<Self>) -> Self::Result {
        let mut kpis: Vec<Kpi> = self.scopes.values().map(|scope| scope.window.kpi(&scope.key, msg.0)).collect();
        kpis.sort_by(|a, b| a.scope_key.cmp(&b.scope_key));
        MessageResult(KpiSnapshot { kpis, outcomes: self.outcomes })
    }
}

impl Handler<Inspect<KpiSnapshot>> for KpiTelemetry {
    type Result = MessageResult<Inspect<KpiSnapshot>>;

    /// Every scope's KPI as of its newest sample (no horizon applied past it).
    fn handle(&mut self, _: Inspect<KpiSnapshot>, _: &mut Context<Self>) -> Self::Result {
        let mut kpis: Vec<Kpi> = self
            .scopes
            .values()
            .map(|scope| scope.window.kpi(&scope.key, scope.window.samples().last().map_or(0, |s| s.at_ms)))
            .collect();
        kpis.sort_by(|a, b| a.scope_key.cmp(&b.scope_key));
        MessageResult(KpiSnapshot { kpis, outcomes: self.outcomes })
    }
}

/// Asks for every scope's KPI at `at_ms` with its alert state and sparkline,
/// and the alerts raised recently (the console's overview).
pub struct InspectOverview(pub u64);

impl Message for InspectOverview {
    type Result = KpiOverview;
}

impl Handler<InspectOverview> for KpiTelemetry {
    type Result = MessageResult<InspectOverview>;

    /// One pass over each scope's live samples for its KPI and one for its
    /// sparkline, then a sort by scope key.
    fn handle(&mut self, msg: InspectOverview, _: &mut Context<Self>) -> Self::Result {
        let now_ms = msg.0;
        let adaptive = &self.settings.adaptive;
        let mut scopes: Vec<ScopeOverview> = self
            .scopes
            .values()
            .map(|scope| {
                let kpi = scope.window.kpi(&scope.key, now_ms);
                ScopeOverview {
                    alerting: scope.meta.alert.degraded,
                    adaptive_degraded: adaptive.applies(&kpi, &scope.meta.adaptive),
                    sparkline: scope.window.sparkline(now_ms, SPARKLINE_SLICES),
                    kpi,
                }
            })
            .collect();
        scopes.sort_unstable_by(|a, b| a.kpi.scope_key.cmp(&b.kpi.scope_key));
        MessageResult(KpiOverview {
            scopes,
            recent_alerts: self.recent_alerts.iter().cloned().collect(),
            outcomes: self.outcomes,
            at_ms: now_ms,
        })
    }
}

/// Asks for the prior as of `at_ms` from the current statistics (for tests and operators).
pub struct InspectPrior(pub u64);

impl Message for InspectPrior {
    type Result = OutcomePrior;
}

impl Handler<InspectPrior> for KpiTelemetry {
    type Result = MessageResult<InspectPrior>;

    fn handle(&mut self, msg: InspectPrior, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats.snapshot(&self.settings.prior, msg.0))
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
        let snapshot = kpi.send(Inspect::<KpiSnapshot>::new()).await.unwrap();
        assert_eq!(snapshot.kpis.len(), 1);
        assert_eq!(snapshot.kpis[0].sample_count, 8);
        // The alert state came back too: still within the cooldown, no second alert.
        let update = record(&kpi, failed("t10"), 3_000).await.unwrap();
        assert_eq!(update.alert, None);
        assert_eq!(update.kpi.sample_count, 9);
    }

    #[actix::test]
    async fn a_stream_outcome_is_marked_processed_once_durable_and_a_refused_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let kpi = KpiTelemetry::load(store.clone(), settings()).unwrap().start();
        let stream = |report, outcome_id: &str, sequence| RecordStreamOutcome {
            report,
            at_ms: 1_000 + sequence,
            outcome_id: outcome_id.into(),
            sequence,
        };
        let recorded = kpi.send(stream(failed("t1"), "js-1", 1)).await.unwrap().unwrap();
        let update = recorded.once_durable().await.unwrap();
        assert_eq!((update.kpi.sample_count, update.duplicate), (1, false));
        assert!(store.outcome_processed("js-1").unwrap());
        // A repeat of the turn under another id is not counted, but its id is marked.
        let update = kpi.send(stream(failed("t1"), "js-2", 2)).await.unwrap().unwrap().once_durable().await.unwrap();
        assert_eq!((update.kpi.sample_count, update.duplicate), (1, true));
        assert!(store.outcome_processed("js-2").unwrap());
        // An invalid outcome changes nothing and marks nothing.
        let bad = OutcomeReport { score: Some(2.0), ..failed("t3") };
        assert!(matches!(kpi.send(stream(bad, "js-3", 3)).await.unwrap(), Err(KpiError::Outcome(_))));
        kpi.send(stream(failed("t4"), "js-4", 4)).await.unwrap().unwrap().once_durable().await.unwrap();
        assert!(!store.outcome_processed("js-3").unwrap());
        assert!(store.outcome_processed("js-4").unwrap());
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

    /// Applies an outcome in memory only (its writes are dropped), for tests that need many.
    fn apply_only(telemetry: &mut KpiTelemetry, report: &OutcomeReport, at_ms: u64) -> KpiUpdate {
        let (update, _) = telemetry.apply(report, at_ms).unwrap();
        telemetry.ops.clear();
        update
    }

    #[actix::test]
    async fn the_overview_has_every_scope_its_alert_state_and_the_newest_alerts_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut telemetry = KpiTelemetry::load(Store::open(dir.path()).unwrap(), settings()).unwrap();
        // 60 organizations fail 8 times each: every one raises one alert, in order.
        let mut raised = Vec::new();
        for org in 0..60u64 {
            for i in 0..8u64 {
                let report =
                    OutcomeReport { organization_id: Some(format!("org{org:02}")), ..failed(&format!("t{i}")) };
                raised.extend(apply_only(&mut telemetry, &report, 1_000 + org * 10 + i).alert);
            }
        }
        assert_eq!(raised.len(), 60);
        let healthy = OutcomeReport {
            organization_id: Some("fine".into()),
            status: Some(OutcomeStatus::Success),
            ..Default::default()
        };
        apply_only(&mut telemetry, &healthy, 5_000);
        let kpi = telemetry.start();
        let overview = kpi.send(InspectOverview(5_000)).await.unwrap();
        assert_eq!((overview.scopes.len(), overview.outcomes, overview.at_ms), (61, 481, 5_000));
        let keys: Vec<&str> = overview.scopes.iter().map(|s| s.kpi.scope_key.as_str()).collect();
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]), "sorted by scope key");
        let fine = overview.scopes.iter().find(|s| s.kpi.scope_key == "fine").unwrap();
        assert!(!fine.alerting && !fine.adaptive_degraded);
        assert_eq!(fine.sparkline.len(), SPARKLINE_SLICES);
        assert_eq!(fine.sparkline.iter().flatten().collect::<Vec<_>>(), vec![&1.0]);
        let failing = overview.scopes.iter().find(|s| s.kpi.scope_key == "org00").unwrap();
        assert!(failing.alerting && failing.adaptive_degraded, "{failing:?}");
        assert_eq!(failing.sparkline.iter().flatten().copied().collect::<Vec<f32>>(), vec![0.0]);
        // The ring keeps the newest RECENT_ALERTS, newest first.
        let newest: Vec<AlertEvent> = raised.iter().rev().take(RECENT_ALERTS).cloned().collect();
        assert_eq!(overview.recent_alerts, newest);
    }

    /// The console asks for this on every page load: 1,000 scopes of full windows must stay cheap.
    #[actix::test]
    async fn the_overview_covers_a_thousand_full_scopes() {
        let dir = tempfile::tempdir().unwrap();
        let settings = settings();
        let capacity = settings.window.capacity() as u64;
        let mut telemetry = KpiTelemetry::load(Store::open(dir.path()).unwrap(), settings).unwrap();
        for org in 0..1_000u64 {
            for i in 0..capacity {
                let status = if (org + i) % 3 == 0 { OutcomeStatus::Failed } else { OutcomeStatus::Success };
                let report = OutcomeReport {
                    organization_id: Some(format!("org{org}")),
                    status: Some(status),
                    ..Default::default()
                };
                apply_only(&mut telemetry, &report, 1_000_000 + i * 1_000);
            }
        }
        let kpi = telemetry.start();
        let now_ms = 1_000_000 + capacity * 1_000;
        // (Its time is measured by `cargo bench --bench console`, the /kpis page at 1,000 scopes.)
        let overview = kpi.send(InspectOverview(now_ms)).await.unwrap();
        assert_eq!(overview.scopes.len(), 1_000);
        assert!(overview.scopes.iter().all(|s| s.kpi.sample_count == capacity as usize));
        let keys: Vec<_> = overview.scopes.iter().map(|s| s.kpi.scope_key.clone()).collect();
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]), "sorted by scope key, each once");
    }

    /// Collects the priors a KpiTelemetry publishes.
    struct Collector(std::rc::Rc<std::cell::RefCell<Vec<Arc<OutcomePrior>>>>);

    impl Actor for Collector {
        type Context = Context<Self>;
    }

    impl Handler<PriorPublished> for Collector {
        type Result = ();

        fn handle(&mut self, msg: PriorPublished, _: &mut Context<Self>) {
            self.0.borrow_mut().push(msg.prior);
        }
    }

    /// Answered after every prior sent before it (one mailbox, in order).
    #[derive(Message)]
    #[rtype(result = "()")]
    struct Drained;

    impl Handler<Drained> for Collector {
        type Result = ();

        fn handle(&mut self, _: Drained, _: &mut Context<Self>) {}
    }

    fn using(turn: &str, capability: &str, status: OutcomeStatus) -> OutcomeReport {
        OutcomeReport { capabilities: vec![capability.into(), capability.into()], status: Some(status), ..failed(turn) }
    }

    #[actix::test]
    async fn failing_capabilities_sink_the_proven_rise_and_both_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let published = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut settings = settings();
        settings.prior_publish_interval_ms = 0;
        let prior_at = |kpi: Addr<KpiTelemetry>, at_ms| async move { kpi.send(InspectPrior(at_ms)).await.unwrap() };
        let before = {
            let collector = Collector(published.clone()).start();
            let store = Store::open(dir.path()).unwrap();
            let sink = collector.clone().recipient();
            let kpi = KpiTelemetry::load(store, settings.clone()).unwrap().with_prior_sink(sink).start();
            for turn in 0..6 {
                record(&kpi, using(&format!("f{turn}"), "tool:flaky", OutcomeStatus::Failed), 10 + turn).await.unwrap();
                record(&kpi, using(&format!("p{turn}"), "tool:proven", OutcomeStatus::Success), 10 + turn)
                    .await
                    .unwrap();
            }
            let result = CapabilityResult { capability_id: "tool:proven".into(), success: true, at_ms: 20 };
            kpi.send(result).await.unwrap().unwrap().await.unwrap();
            let bad = CapabilityResult { capability_id: String::new(), success: true, at_ms: 20 };
            assert!(matches!(kpi.send(bad).await.unwrap(), Err(KpiError::Outcome(_))));
            let before = prior_at(kpi.clone(), 20).await;
            // A retried turn is not credited again.
            let retry = record(&kpi, using("f0", "tool:flaky", OutcomeStatus::Failed), 21).await.unwrap();
            assert!(retry.duplicate);
            assert_eq!(prior_at(kpi.clone(), 20).await, before);
            collector.send(Drained).await.unwrap();
            before
        };
        let (flaky, proven) = (before.adjustment("tool:flaky"), before.adjustment("tool:proven"));
        assert!(flaky < 0.0 && proven > 0.0, "{flaky} {proven}");
        assert!(flaky >= -settings.prior.strength && proven <= settings.prior.strength);
        // Each credited outcome was published (interval 0), the last one equal to the prior now.
        let (n_published, last) = (published.borrow().len(), published.borrow().last().cloned());
        assert!(n_published >= 13, "{n_published}");
        assert_eq!(*last.unwrap(), before);
        let kpi = KpiTelemetry::load(reopen(dir.path()).await, settings).unwrap().start();
        assert_eq!(prior_at(kpi, 20).await, before, "the statistics came back from sled");
    }
}
