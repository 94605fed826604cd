//! Retention: the sweep that keeps every store that grows within its
//! `[retention]` limits, continuously, and sets the store-size gauges.
//!
//! A thin shell: every `sweep_interval_ms` (and once at start) it runs the
//! store's sweeps (`store::retention`: provenance, re-drive results,
//! approvals, processed outcome ids) on tokio's blocking pool, so a scan of a
//! large tree never holds the System thread, then asks the ScgGraph, the only
//! writer of the memory notes, to prune them ([`PruneNotes`]). What to prune
//! is decided by `core::retention::plan`. One sweep runs at a time.
//!
//! Gauges, per `store` label: `capdex_store_entries` and `capdex_store_bytes`
//! (keys and values) for the pruned stores and for the others that matter to
//! size (`descriptors`, `embeddings`, `kpi`, `registry`, `bindings`), and
//! `capdex_store_disk_bytes` (sled's files); `capdex_retention_pruned_total`
//! counts what each store's sweeps pruned.

use crate::actors::scg::graph::{PruneNotes, ScgGraph};
use crate::config::RetentionSettings;
use crate::core::retention::{StoreSize, Swept};
use crate::store::{Store, StoreError};
use actix::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The stores whose size is only measured, not pruned: `(label, tree)`.
const MEASURED: [(&str, &str); 5] = [
    ("descriptors", "descriptors"),
    ("embeddings", "embeddings"),
    ("kpi", "kpi"),
    ("registry", "dispatch_registry"),
    ("bindings", "dispatch_bindings"),
];

/// What one sweep found and did.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepReport {
    /// Each pruned store's sweep, by label (`provenance`, `redrive`, `approvals`, `outcome_ids`, `memory`).
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
    settings: RetentionSettings,
    running: bool,
    /// Held by a sweep from start to end: sweeps take turns, so a report's
    /// sizes are never read while another sweep is deleting.
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Retention {
    pub fn new(store: Store, graph: Addr<ScgGraph>, settings: RetentionSettings) -> Retention {
        Retention { store, graph, settings, running: false, turn: Arc::default() }
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
/// then the memory notes.
async fn sweep(
    turn: Arc<tokio::sync::Mutex<()>>,
    store: Store,
    graph: Addr<ScgGraph>,
    settings: RetentionSettings,
) -> Result<SweepReport, String> {
    let _turn = turn.lock_owned().await;
    let now_ms = crate::clock::epoch_ms();
    let mut report = tokio::task::spawn_blocking(move || sweep_store(&store, &settings, now_ms))
        .await
        .map_err(|err| format!("the sweep stopped: {err}"))?
        .map_err(|err| err.to_string())?;
    let notes = graph
        .send(PruneNotes { now_ms, limits: settings.memory })
        .await
        .map_err(|err| format!("the SCG graph is gone: {err}"))?
        .map_err(|err| err.to_string())?;
    report.swept.insert("memory".into(), notes);
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
}

impl Retention {
    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.running {
            return;
        }
        self.running = true;
        let job = sweep(self.turn.clone(), self.store.clone(), self.graph.clone(), self.settings);
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
        Box::pin(sweep(self.turn.clone(), self.store.clone(), self.graph.clone(), self.settings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dispatch::ProvenanceRecord;
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
        }
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
        let graph =
            crate::actors::scg::spawn(&crate::config::Settings::load(None, &Default::default()).unwrap(), &store, None)
                .unwrap()
                .graph;
        let retention =
            Retention::new(store.clone(), graph, settings(Limits { max_age_ms: 60_000, max_count: 2 })).start();
        let report = retention.send(SweepNow).await.unwrap().unwrap();
        assert_eq!(report.swept["provenance"].size.entries, 2);
        assert_eq!(report.swept["memory"].size.entries, 2);
        let notes: Vec<String> = scg.notes().unwrap().into_iter().map(|note| note.id).collect();
        assert_eq!(notes, vec!["n3", "n4"]);
        for label in ["redrive", "approvals", "outcome_ids"] {
            assert_eq!(report.swept[label], Swept::default(), "{label}");
        }
        for (label, _) in MEASURED {
            assert!(report.sizes.contains_key(label), "{label}");
        }
        assert!(report.disk_bytes > 0);
    }
}
