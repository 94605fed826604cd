//! Benchmarks of task outcomes: through the pure KPI core (`kpi_window::record`
//! on a 100-sample window), and through the KpiTelemetry actor in-process with
//! a real sled store, where every reply waits for its outcome to be durable
//! (group commit): 10,000 outcomes in flight per iteration over 100 scopes,
//! and one at a time (a flush per outcome).
//!
//! Run with `cargo bench --bench kpi`; `cargo test --all-targets` runs each once as a smoke test.

use actix::Actor;
use capdex::actors::kpi::{KpiTelemetry, RecordOutcome};
use capdex::config::Settings;
use capdex::core::kpi_window::{record, KpiWindow, OutcomeReport, OutcomeStatus, ScopeMeta};
use capdex::store::Store;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

const IN_FLIGHT: u64 = 10_000;
const SCOPES: u64 = 100;

fn report(i: u64) -> OutcomeReport {
    OutcomeReport {
        turn_id: Some(format!("turn-{i}")),
        organization_id: Some(format!("org-{}", i % SCOPES)),
        persona_id: Some("assistant".into()),
        status: Some(if i.is_multiple_of(4) { OutcomeStatus::Failed } else { OutcomeStatus::Success }),
        capabilities: vec!["tool:web-search".into()],
        ..Default::default()
    }
}

fn benches(c: &mut Criterion) {
    let settings = Settings::load(None, &Default::default()).expect("the built-in settings load").kpi;

    let mut group = c.benchmark_group("capdex::core::kpi_window");
    group.throughput(Throughput::Elements(1));
    let mut window = KpiWindow::new(settings.window);
    let mut meta = ScopeMeta::default();
    let mut i = 0u64;
    group.bench_function("validate_and_record_window_100", |b| {
        b.iter(|| {
            i += 1;
            let sample =
                report(i).validate(i, capdex::core::kpi_window::OutcomeLimits::default()).expect("a valid report");
            record("org/assistant", &mut window, &mut meta, black_box(sample), &settings.alerts, &settings.adaptive)
        })
    });
    group.finish();

    let dir = tempfile::tempdir().expect("a temporary data dir");
    let system = actix_rt::System::new();
    let kpi = system.block_on(async {
        KpiTelemetry::load(Store::open(dir.path()).expect("the store opens"), settings.clone())
            .expect("the actor loads")
            .start()
    });
    let mut group = c.benchmark_group("capdex::actors::kpi");
    group.sample_size(10);
    group.throughput(Throughput::Elements(IN_FLIGHT));
    let mut next = 0u64;
    group.bench_function("record_outcome_durable_10000_in_flight", |b| {
        b.iter(|| {
            let first = next;
            next += IN_FLIGHT;
            system.block_on(async {
                let sends = (first..first + IN_FLIGHT).map(|i| kpi.send(RecordOutcome { report: report(i), at_ms: i }));
                let acknowledged = sends.map(|send| async {
                    let recorded = send.await.expect("the actor answers").expect("the outcome is recorded");
                    recorded.once_durable().await.expect("the outcome is durable")
                });
                futures::future::join_all(acknowledged).await
            })
        })
    });
    // One outcome at a time: each pays a whole flush, the latency a lone caller sees.
    group.throughput(Throughput::Elements(1));
    group.bench_function("record_outcome_durable_1_in_flight", |b| {
        b.iter(|| {
            next += 1;
            system.block_on(async {
                let recorded = kpi.send(RecordOutcome { report: report(next), at_ms: next }).await;
                recorded.expect("the actor answers").expect("the outcome is recorded").once_durable().await
            })
        })
    });
    group.finish();
}

criterion_group!(kpi_benches, benches);
criterion_main!(kpi_benches);
