//! Benchmarks of the dispatch pipeline, printed as figures (not criterion):
//!
//! 1. pipeline overhead without a handler, pure core: `Pipeline::admit` +
//!    `pipeline::finish` (registry, binding, rate window, JSON Schema
//!    validation, redaction, provenance record and event), p50/p99;
//! 2. the same through the Dispatcher actor with a real sled store and a
//!    no-op in-process handler (adds the mailbox and the provenance insert),
//!    one call at a time, p50/p99;
//! 3. throughput to an in-process internal handler, 64 calls in flight;
//! 4. the same over NATS: internal calls sent on `capdex.v1.exec.<slug>` to a
//!    handler service (queue group) on a real nats-server, 64 in flight, and
//!    one at a time (p50/p99);
//! 5. the Dispatcher of part 2 with the cluster's shared state (JetStream
//!    key-value buckets on the same nats-server, as `capdex serve` runs by
//!    default): a call with no key and no limit (nothing asked of the
//!    cluster), a rate-limited call (its window read and written back), and a
//!    call with a re-drive key (claimed, then its result stored), one at a time
//!    and 64 in flight.
//!
//! `cargo bench --bench dispatch` runs it in full (release); under `cargo test`
//! (no `--bench` argument) it runs each part a few times as a smoke test.
//! Part 4 needs nats-server (`CAPDEX_NATS_SERVER`, as the integration tests).

#[path = "../tests/it/support/nats_server.rs"]
mod nats_server;

use actix::Actor;
use capdex::actors::dispatcher::{Dispatch, Dispatcher};
use capdex::config::Settings;
use capdex::core::dispatch::pipeline::{self, AdmissionDecision, BindingMode, CallFacts, DispatchCall, Pipeline};
use capdex::core::dispatch::registry::CapabilityRecord;
use capdex::core::dispatch::CallResult;
use capdex::store::Store;
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn record(slug: &str, handler: &str) -> CapabilityRecord {
    serde_json::from_value(json!({
        "slug": slug, "name": slug, "executionType": "internal", "handler": handler,
        "functionDefinition": {"name": slug, "parameters": {"type": "object",
            "properties": {"order_id": {"type": "string", "minLength": 1}, "amount": {"type": "number"}},
            "required": ["order_id"], "additionalProperties": false}},
        "rateLimit": 10000, "policyVersion": 1
    }))
    .expect("a valid record")
}

fn call(slug: &str, i: u64) -> DispatchCall {
    DispatchCall {
        slug: slug.into(),
        arguments: json!({"order_id": format!("o-{i}"), "amount": 12.5}),
        // Many agents, so the 10,000/min limit never refuses.
        agent_id: format!("agent-{}", i % 1000),
        execution_id: None,
        step_id: None,
        turn: None,
        approval_id: None,
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(name: &str, mut micros: Vec<f64>) {
    micros.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{name}: n={} p50={:.1} µs p99={:.1} µs max={:.1} µs",
        micros.len(),
        percentile(&micros, 0.5),
        percentile(&micros, 0.99),
        micros[micros.len() - 1]
    );
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let n: u64 = if full { 20_000 } else { 50 };
    let settings = Settings::load(None, &Default::default()).expect("the built-in settings load");

    // 1. Pure core.
    let mut core = Pipeline::new(BindingMode::Open, 60_000);
    core.load_registry([record("lookup_order", "noop")]);
    let mut latencies = Vec::with_capacity(n as usize);
    for i in 0..n {
        let c = call("lookup_order", i);
        let started = Instant::now();
        let admitted = core.admit(&c, None, i / 100, 0);
        let result = match admitted {
            AdmissionDecision::Run(run) => {
                let finished = pipeline::finish(
                    CallFacts {
                        call: &c,
                        record: Some(&run.record),
                        execution_key: None,
                        approval_id: None,
                        secrets: &[],
                        replayed: false,
                        latency_us: 0,
                        at_ms: i,
                    },
                    CallResult::ok(Value::Null),
                );
                finished.result
            }
            other => panic!("refused: {other:?}"),
        };
        latencies.push(started.elapsed().as_secs_f64() * 1e6);
        assert!(result.success);
    }
    report("core pipeline overhead (admit + finish, no handler)", latencies);

    // 2 and 3. The actor with a real store and a no-op in-process handler.
    let dir = tempfile::tempdir().expect("a temporary data dir");
    let system = actix_rt::System::new();
    let store = Store::open(dir.path()).expect("the store opens");
    store.put_capability_record(&record("lookup_order", "noop")).expect("stored");
    let noop: capdex::actors::dispatcher::InProcessHandler = Arc::new(|_| CallResult::ok(json!({"ok": true})));
    let dispatcher = system.block_on(async {
        Dispatcher::new(store, settings.dispatch.clone()).expect("loads").with_handler("noop", noop).start()
    });
    let mut latencies = Vec::with_capacity(n as usize);
    system.block_on(async {
        for i in 0..n {
            let started = Instant::now();
            let result = dispatcher.send(Dispatch { call: call("lookup_order", i) }).await.expect("answers");
            latencies.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(result.success, "{result:?}");
        }
    });
    report("actor + store, in-process no-op handler, one at a time", latencies);
    let started = Instant::now();
    system.block_on(async {
        for batch in (0..n).collect::<Vec<_>>().chunks(64) {
            let sends = batch.iter().map(|&i| dispatcher.send(Dispatch { call: call("lookup_order", i) }));
            for result in futures::future::join_all(sends).await {
                assert!(result.expect("answers").success);
            }
        }
    });
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "in-process internal handler, 64 in flight: {n} dispatches in {:.3} s = {:.0} dispatches/s",
        seconds,
        n as f64 / seconds
    );

    // 4. Over NATS.
    let nats = nats_server::NatsServer::start();
    let url = nats.url();
    let handler_url = url.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async move {
            let client = async_nats::connect(handler_url).await.expect("the handler connects");
            let mut requests =
                client.queue_subscribe("capdex.v1.exec.remote_lookup", "handlers".into()).await.expect("subscribes");
            client.flush().await.expect("flushes");
            ready_tx.send(()).expect("ready");
            let reply = bytes::Bytes::from(json!({"success": true, "data": {"ok": true}}).to_string());
            while let Some(message) = requests.next().await {
                if let Some(inbox) = message.reply {
                    let _ = client.publish(inbox, reply.clone()).await;
                }
            }
        })
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).expect("the handler service is up");
    let mut env = BTreeMap::new();
    env.insert("CAPDEX_NATS_URL".to_string(), url);
    let nats_settings = Settings::load(None, &env.into()).expect("settings");
    let dir = tempfile::tempdir().expect("a temporary data dir");
    let store = Store::open(dir.path()).expect("the store opens");
    store.put_capability_record(&record("remote_lookup", "remote")).expect("stored");
    let remote = system.block_on(async {
        let gateway = capdex::gateway::service::Gateway::connect(&nats_settings.nats).await.expect("connects");
        let transport = Arc::new(gateway.exec_transport());
        std::mem::forget(gateway);
        Dispatcher::new(store, nats_settings.dispatch.clone()).expect("loads").with_transport(transport).start()
    });
    let mut latencies = Vec::with_capacity(n as usize);
    system.block_on(async {
        for i in 0..n {
            let started = Instant::now();
            let result = remote.send(Dispatch { call: call("remote_lookup", i) }).await.expect("answers");
            latencies.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(result.success, "{result:?}");
        }
    });
    report("over NATS (exec handler service), one at a time", latencies);
    let started = Instant::now();
    system.block_on(async {
        for batch in (0..n).collect::<Vec<_>>().chunks(64) {
            let sends = batch.iter().map(|&i| remote.send(Dispatch { call: call("remote_lookup", i) }));
            for result in futures::future::join_all(sends).await {
                let result = result.expect("answers");
                assert!(result.success, "{result:?}");
            }
        }
    });
    let seconds = started.elapsed().as_secs_f64();
    println!("over NATS, 64 in flight: {n} dispatches in {:.3} s = {:.0} dispatches/s", seconds, n as f64 / seconds);

    // 5. Shared state.
    let dir = tempfile::tempdir().expect("a temporary data dir");
    let store = Store::open(dir.path()).expect("the store opens");
    let mut unlimited = record("plain", "noop");
    unlimited.rate_limit = None;
    store.put_capability_record(&unlimited).expect("stored");
    store.put_capability_record(&record("limited", "noop")).expect("stored");
    let noop: capdex::actors::dispatcher::InProcessHandler = Arc::new(|_| CallResult::ok(json!({"ok": true})));
    let shared = system.block_on(async {
        let gateway = capdex::gateway::service::Gateway::connect(&nats_settings.nats).await.expect("connects");
        let buckets = capdex::gateway::kv::DispatchBuckets::open(
            gateway.client(),
            &nats_settings.jetstream,
            nats_settings.dispatch.rate_window_ms,
        )
        .await
        .expect("the buckets open (nats-server with JetStream)");
        std::mem::forget(gateway);
        let dispatcher =
            Dispatcher::new(store, nats_settings.dispatch.clone()).expect("loads").with_handler("noop", noop).start();
        dispatcher.send(capdex::actors::dispatcher::SetShared(Arc::new(buckets))).await.expect("set");
        dispatcher
    });
    let keyed = |slug: &str, i: u64| {
        let mut c = call(slug, i);
        c.execution_id = Some(format!("bench-{}", std::process::id()));
        c.step_id = Some(format!("s{i}"));
        c
    };
    type MakeCall = Box<dyn Fn(u64) -> DispatchCall>;
    let kinds: Vec<(&str, MakeCall)> = vec![
        ("no key, no limit", Box::new(|i| call("plain", i))),
        ("rate-limited (shared window)", Box::new(|i| call("limited", i))),
        ("re-drive key (shared claim)", Box::new(move |i| keyed("plain", i))),
    ];
    for (round, (kind, make)) in kinds.iter().enumerate() {
        let offset = (round as u64 + 1) * 10 * n;
        let mut latencies = Vec::with_capacity(n as usize);
        system.block_on(async {
            for i in 0..n {
                let started = Instant::now();
                let result = shared.send(Dispatch { call: make(offset + i) }).await.expect("answers");
                latencies.push(started.elapsed().as_secs_f64() * 1e6);
                assert!(result.success, "{result:?}");
            }
        });
        report(&format!("shared state, {kind}, one at a time"), latencies);
        let started = Instant::now();
        system.block_on(async {
            for batch in (0..n).collect::<Vec<_>>().chunks(64) {
                let sends = batch.iter().map(|&i| shared.send(Dispatch { call: make(offset + n + i) }));
                for result in futures::future::join_all(sends).await {
                    let result = result.expect("answers");
                    assert!(result.success, "{result:?}");
                }
            }
        });
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "shared state, {kind}, 64 in flight: {n} dispatches in {seconds:.3} s = {:.0} dispatches/s",
            n as f64 / seconds
        );
    }
}
