//! Retention: the sweep that keeps every store that grows within its
//! `[retention]` limits, continuously, and sets the store-size gauges.
//!
//! A thin shell: every `sweep_interval_ms` (and once at start) it runs the
//! store's sweeps (`store::retention`: provenance, re-drive results,
//! approvals, processed outcome ids) on tokio's blocking pool, so a scan of a
//! large tree never holds the System thread, then asks the ScgGraph, the only
//! writer of the memory notes, to prune them ([`PruneNotes`]), and
//! KpiTelemetry, the only writer of the KPI windows, to prune its scopes
//! ([`PruneScopes`]; the `kpi` tree is measured once that is durable). What to
//! prune is decided by `core::retention::plan`. One sweep runs at a time.
//!
//! Gauges, per `store` label: `capdex_store_entries` and `capdex_store_bytes`
//! (keys and values) for the pruned stores and for the others that matter to
//! size (`descriptors`, `embeddings`, `registry`, `bindings`), and
//! `capdex_store_disk_bytes` (sled's files); `capdex_retention_pruned_total`
//! counts what each store's sweeps pruned.

use crate::actors::kpi::PruneScopes;
use crate::actors::scg::graph::{PruneNotes, ScgGraph};
use crate::config::RetentionSettings;
use crate::core::retention::{StoreSize, Swept};
use crate::store::{Store, StoreError};
use actix::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The stores whose size is only measured, not pruned: `(label, tree)`.
const MEASURED: [(&str, &str); 4] = [
    ("descriptors", "descriptors"),
    ("embeddings", "embeddings"),
    ("registry", "dispatch_registry"),
    ("bindings", "dispatch_bindings"),
];

/// What one sweep found and did.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepReport {
    /// Each pruned store's sweep, by label (`provenance`, `redrive`, `approvals`, `outcome_ids`, `memory`,
    /// and `kpi`: its `pruned` counts scopes, its size is the `kpi` tree's).
    pub swept: BTreeMap<String, Swept>,
    /// The measured stores' sizes, by label.
    pub sizes: BTreeMap<String, StoreSize>,
    /// The bytes sled's files take on disk.
    pub disk_bytes: u64,
}

/// The sweep actor; start it with [`Retention::new`] and `.start()`.
pub struct Retention {
    store: Store,
    graph: Addr<ScgGraph>,
    kpi: Recipient<PruneScopes>,
    settings: RetentionSettings,
    running: bool,
    /// Held by a sweep from start to end: sweeps take turns, so a report's
    /// sizes are never read while another sweep is deleting.
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Retention {
    pub fn new(
        store: Store,
        graph: Addr<ScgGraph>,
        kpi: Recipient<PruneScopes>,
        settings: RetentionSettings,
    ) -> Retention {
        Retention { store, graph, kpi, settings, running: false, turn: Arc::default() }
    }
}

/// Runs the store's sweeps at `now_ms` (blocking: call it off the System thread).
fn sweep_store(store: &Store, settings: &RetentionSettings, now_ms: u64) -> Result<SweepReport, StoreError> {
    let mut report = SweepReport::default();
    let mut swept = |label: &str, result: Result<Swept, StoreError>| -> Result<(), StoreError> {
        report.swept.insert(label.to_string(), result?);
        Ok(())
    };
    swept("provenance", store.sweep_provenance(now_ms, settings.provenance))?;
    swept("redrive", store.sweep_redrive(now_ms, settings.redrive))?;
    swept("approvals", store.sweep_approvals(now_ms, settings.approvals))?;
    swept("outcome_ids", store.sweep_outcome_ids(now_ms, settings.outcome_ids))?;
    for (label, tree) in MEASURED {
        report.sizes.insert(label.to_string(), store.tree_size(tree)?);
    }
    report.disk_bytes = store.disk_bytes()?;
    Ok(report)
}

/// One whole sweep, after any running one: the store's on the blocking pool,
/// then the memory notes, then the KPI scopes.
async fn sweep(
    turn: Arc<tokio::sync::Mutex<()>>,
    store: Store,
    graph: Addr<ScgGraph>,
    kpi: Recipient<PruneScopes>,
    settings: RetentionSettings,
) -> Result<SweepReport, String> {
    let _turn = turn.lock_owned().await;
    let now_ms = crate::clock::epoch_ms();
    let swept_store = store.clone();
    let mut report = tokio::task::spawn_blocking(move || sweep_store(&swept_store, &settings, now_ms))
        .await
        .map_err(|err| format!("the sweep stopped: {err}"))?
        .map_err(|err| err.to_string())?;
    let notes = graph
        .send(PruneNotes { now_ms, limits: settings.memory })
        .await
        .map_err(|err| format!("the SCG graph is gone: {err}"))?
        .map_err(|err| err.to_string())?;
    report.swept.insert("memory".into(), notes);
    let scopes = kpi
        .send(PruneScopes { now_ms, limits: settings.kpi })
        .await
        .map_err(|err| format!("the KPI telemetry is gone: {err}"))?
        .map_err(|err| err.to_string())?;
    scopes.durable.await.map_err(|err| err.to_string())?;
    let size = tokio::task::spawn_blocking(move || store.tree_size("kpi"))
        .await
        .map_err(|err| format!("the sweep stopped: {err}"))?
        .map_err(|err| err.to_string())?;
    report.swept.insert("kpi".into(), Swept { pruned: scopes.pruned, size });
    publish(&report);
    Ok(report)
}

/// Sets the gauges from a sweep.
fn publish(report: &SweepReport) {
    let sizes = report.swept.iter().map(|(label, swept)| (label, &swept.size)).chain(report.sizes.iter());
    for (label, size) in sizes {
        metrics::gauge!("capdex_store_entries", "store" => label.clone()).set(size.entries as f64);
        metrics::gauge!("capdex_store_bytes", "store" => label.clone()).set(size.bytes as f64);
    }
    for (label, swept) in &report.swept {
        metrics::counter!("capdex_retention_pruned_total", "store" => label.clone()).increment(swept.pruned);
    }
    metrics::gauge!("capdex_store_disk_bytes").set(report.disk_bytes as f64);
    if crate::allocations::counting() {
        metrics::gauge!("capdex_heap_live_bytes").set(crate::allocations::live_bytes() as f64);
    }
}

impl Retention {
    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.running {
            return;
        }
        self.running = true;
        let job = sweep(self.turn.clone(), self.store.clone(), self.graph.clone(), self.kpi.clone(), self.settings);
        ctx.spawn(job.into_actor(self).map(|result, act, _| {
            act.running = false;
            match result {
                Ok(report) => {
                    let pruned: u64 = report.swept.values().map(|swept| swept.pruned).sum();
                    tracing::debug!(pruned, disk_bytes = report.disk_bytes, "retention sweep");
                }
                Err(err) => tracing::warn!(%err, "the retention sweep failed; it runs again at the next interval"),
            }
        }));
    }
}

impl Actor for Retention {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.tick(ctx);
        ctx.run_interval(Duration::from_millis(self.settings.sweep_interval_ms), Retention::tick);
    }
}

/// Runs one sweep now (after any running one) and answers its report.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<SweepReport, String>")]
pub struct SweepNow;

impl Handler<SweepNow> for Retention {
    type Result = ResponseFuture<Result<SweepReport, String>>;

    fn handle(&mut self, _: SweepNow, _: &mut Context<Self>) -> Self::Result {
        Box::pin(sweep(self.turn.clone(), self.store.clone(), self.graph.clone(), self.kpi.clone(), self.settings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::kpi::{KpiSnapshot, KpiTelemetry, RecordOutcome};
    use crate::core::dispatch::ProvenanceRecord;
    use crate::core::kpi_window::{OutcomeReport, OutcomeStatus};
    use crate::core::retention::Limits;
    use crate::core::scg::memory::{Note, Polarity};
    use crate::store::scg::ScgStore;

    fn settings(limits: Limits) -> RetentionSettings {
        RetentionSettings {
            sweep_interval_ms: 3_600_000,
            provenance: limits,
            redrive: limits,
            approvals: limits,
            memory: limits,
            outcome_ids: limits,
            kpi: limits,
            outcome_prior_max_count: 100,
            dispatch_figures_max_count: 100,
        }
    }

    fn kpi_telemetry(store: &Store) -> Addr<KpiTelemetry> {
        let settings = crate::config::Settings::load(None, &Default::default()).unwrap();
        KpiTelemetry::load(store.clone(), settings.kpi).unwrap().start()
    }

    fn graph(store: &Store) -> Addr<ScgGraph> {
        crate::actors::scg::spawn(&crate::config::Settings::load(None, &Default::default()).unwrap(), store, None)
            .unwrap()
            .graph
    }

    async fn outcome(kpi: &Addr<KpiTelemetry>, organization: &str, turn: &str, at_ms: u64) {
        let report = OutcomeReport {
            turn_id: Some(turn.into()),
            organization_id: Some(organization.into()),
            status: Some(OutcomeStatus::Success),
            ..Default::default()
        };
        kpi.send(RecordOutcome { report, at_ms }).await.unwrap().unwrap().once_durable().await.unwrap();
    }

    fn stored_scopes(store: &Store) -> Vec<(String, usize)> {
        let mut scopes: Vec<(String, usize)> =
            store.kpi_scopes().unwrap().into_iter().map(|scope| (scope.scope_key, scope.samples.len())).collect();
        scopes.sort();
        scopes
    }

    #[actix::test]
    async fn kpi_scopes_are_pruned_least_recently_updated_first_by_count_and_by_age() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let kpi = kpi_telemetry(&store);
        let now = crate::clock::epoch_ms();
        // Updated in the order o1, o2, o3, o4, then o1 again: o2 and o3 are the least recently updated.
        for (organization, at) in [("o1", 400_000), ("o2", 300_000), ("o3", 200_000), ("o4", 100_000), ("o1", 10)] {
            outcome(&kpi, organization, &format!("{organization}-{at}"), now - at).await;
        }
        assert_eq!(stored_scopes(&store).len(), 4);
        let by_count = settings(Limits::OFF);
        let by_count = RetentionSettings { kpi: Limits { max_age_ms: 0, max_count: 2 }, ..by_count };
        // One sweep, called as the actor calls it (a started actor also sweeps at start).
        let sweep_with = |settings: RetentionSettings| {
            sweep(Arc::default(), store.clone(), graph(&store), kpi.clone().recipient(), settings)
        };
        let report = sweep_with(by_count).await.unwrap();
        assert_eq!(report.swept["kpi"].pruned, 2);
        assert_eq!(report.swept["kpi"].size, store.tree_size("kpi").unwrap(), "the gauge is the kpi tree's size");
        assert_eq!(stored_scopes(&store), [("o1".to_string(), 2), ("o4".to_string(), 1)]);
        let in_memory: Vec<String> = kpi
            .send(crate::actors::Inspect::<KpiSnapshot>::new())
            .await
            .unwrap()
            .kpis
            .into_iter()
            .map(|kpi| kpi.scope_key)
            .collect();
        assert_eq!(in_memory, ["o1", "o4"], "memory and store agree");
        let again = sweep_with(by_count).await.unwrap();
        assert_eq!(again.swept["kpi"].pruned, 0, "at the count, nothing more goes");
        // A pruned scope's samples never come back: not from a reload, not under a new outcome.
        outcome(&kpi, "o2", "o2-new", now).await;
        assert_eq!(store.load_kpi(100).unwrap().scopes.len(), 3);
        assert!(stored_scopes(&store).contains(&("o2".to_string(), 1)), "{:?}", stored_scopes(&store));
        // By age: o4's newest sample is 100 s old, over 50 s; o1 and o2 are younger.
        let by_age = RetentionSettings { kpi: Limits { max_age_ms: 50_000, max_count: 0 }, ..settings(Limits::OFF) };
        let report = sweep_with(by_age).await.unwrap();
        assert_eq!(report.swept["kpi"].pruned, 1);
        assert_eq!(stored_scopes(&store), [("o1".to_string(), 2), ("o2".to_string(), 1)]);
    }

    #[actix::test]
    async fn a_sweep_prunes_provenance_and_memory_notes_and_reports_every_size() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let now = crate::clock::epoch_ms();
        for at in 0..5 {
            store.append_provenance(&ProvenanceRecord::test_record(now - 10_000 + at)).unwrap();
        }
        let scg = ScgStore::open(&store).unwrap();
        for (id, at) in [("n1", now - 10_000), ("n2", now - 5), ("n3", now - 4), ("n4", now - 3)] {
            scg.put_note(&Note {
                id: id.into(),
                content: format!("note {id}"),
                polarity: Polarity::Positive,
                anchors: vec![],
                labels: vec![],
                first_at_ms: at,
                last_at_ms: at,
                count: 1,
            })
            .unwrap();
        }
        let limits = settings(Limits { max_age_ms: 60_000, max_count: 2 });
        let retention = Retention::new(store.clone(), graph(&store), kpi_telemetry(&store).recipient(), limits).start();
        let report = retention.send(SweepNow).await.unwrap().unwrap();
        assert_eq!(report.swept["provenance"].size.entries, 2);
        assert_eq!(report.swept["memory"].size.entries, 2);
        let notes: Vec<String> = scg.notes().unwrap().into_iter().map(|note| note.id).collect();
        assert_eq!(notes, vec!["n3", "n4"]);
        for label in ["redrive", "approvals", "outcome_ids"] {
            assert_eq!(report.swept[label], Swept::default(), "{label}");
        }
        assert_eq!(report.swept["kpi"].pruned, 0);
        for (label, _) in MEASURED {
            assert!(report.sizes.contains_key(label), "{label}");
        }
        assert!(report.disk_bytes > 0);
    }
}
