//! The cluster benchmark (issue 21's targets): three nats-servers clustered
//! over loopback routes with JetStream, three `capdex serve` nodes (the
//! `capdex` binary of this build, each listing its own server first) with
//! `jetstream.replicas = 3`, a counting HTTP handler on 127.0.0.1 for a
//! non-idempotent `api` capability, and the mixed load of
//! `tests/it/support/cluster_load.rs` (discover, outcomes through JetStream
//! with ids, dispatch with unique executionIds, each retried on retryable
//! failures only).
//!
//! Measures:
//! - CPU per `discover` and per `dispatch` (user + system time of every
//!   `capdex serve` process, from `/proc/<pid>/stat`, divided by the
//!   requests), with one node and with three;
//! - while one capdex node is killed with SIGKILL (and restarted), repeated
//!   with each node in turn: the requests sent during the failover window
//!   (from the kill until 2 s after the node answers again) that failed or were
//!   answered after more than 1 s, and their p99 latency; the same while one
//!   nats-server is killed (window: until 2 s after the cluster is healthy again);
//! - catch-up: how long a node that was down during N index mutations
//!   (`capabilities.upsert`) takes from its start until it answers (it applies
//!   what it missed first), next to its start time with nothing missed.
//!
//! Run with `cargo bench --bench cluster` (5 kills of each kind, 10,000
//! mutations; needs nats-server: `CAPDEX_NATS_SERVER`, `.venv/bin/nats-server`
//! or `PATH`). Without `--bench` or `--full` (e.g. `cargo test --benches`) it
//! runs once, small, as a smoke test. `cargo test --bench cluster -- --full`
//! runs the full bench on a debug build; `--kills N` and `--mutations N` change
//! the number of kills of each kind and of index mutations.

#[path = "../tests/it/support/cluster_load.rs"]
mod cluster_load;
#[path = "../tests/it/support/nats_cluster.rs"]
mod nats_cluster;
#[path = "../tests/it/support/nats_server.rs"]
mod nats_server;

use cluster_load::{
    answer_from, dispatch, dispatch_record, quantile, request, upsert, wait_for_nodes, Answer, CapdexNode,
    CountingHandler, Kind, Load, Plan, Record,
};
use futures::StreamExt;
use nats_cluster::NatsCluster;
use serde_json::json;
use std::time::{Duration, Instant};

const NODES: [&str; 3] = ["c0", "c1", "c2"];
const STARTUP: Duration = Duration::from_secs(120);
/// Requests answered later than this count as delayed.
const DELAYED: Duration = Duration::from_secs(1);

/// Sizes of one run.
struct Sizes {
    kills: usize,
    mutations: usize,
    cpu_discovers: usize,
    cpu_dispatches: usize,
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench" || arg == "--full");
    let mut sizes = if full {
        Sizes { kills: 5, mutations: 10_000, cpu_discovers: 2000, cpu_dispatches: 1000 }
    } else {
        Sizes { kills: 1, mutations: 200, cpu_discovers: 100, cpu_dispatches: 50 }
    };
    let args: Vec<String> = std::env::args().collect();
    let given = |flag: &str| -> Option<usize> {
        let at = args.iter().position(|arg| arg == flag)?;
        let value = args.get(at + 1).unwrap_or_else(|| panic!("{flag} needs a number"));
        Some(value.parse().unwrap_or_else(|_| panic!("{flag} {value}: not a number")))
    };
    sizes.kills = given("--kills").unwrap_or(sizes.kills);
    sizes.mutations = given("--mutations").unwrap_or(sizes.mutations);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(run(&sizes, full));
}

fn plan(run_id: &str) -> Plan {
    Plan {
        discover_workers: 3,
        outcome_workers: 2,
        dispatch_workers: 3,
        pause: Duration::from_millis(40),
        attempt_timeout: Duration::from_secs(1),
        deadline: Duration::from_secs(30),
        max_per_worker: u64::MAX,
        run_id: run_id.to_string(),
    }
}

/// Blocks this worker thread for a cluster operation (it sleeps and polls synchronously).
fn blocking<T>(operation: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(operation)
}

async fn run(sizes: &Sizes, full: bool) {
    let mut cluster = blocking(|| NatsCluster::start(3));
    let handler = CountingHandler::start(Duration::from_millis(20));
    let mut nodes: Vec<CapdexNode> = (0..3).map(|i| CapdexNode::new(NODES[i], cluster.urls_from(i), 3, &[])).collect();
    nodes.iter_mut().for_each(CapdexNode::start);
    let client = async_nats::ConnectOptions::new()
        .retain_servers_order()
        .connect(cluster.urls())
        .await
        .expect("the bench client connects");
    wait_for_nodes(&client, NODES.len(), STARTUP, &nodes).await;
    println!(
        "capdex cluster bench: 3 nats-servers (R3), 3 capdex nodes ({}), {} mode",
        if cfg!(debug_assertions) { "debug build" } else { "release build" },
        if full { "full" } else { "smoke" }
    );
    register_everywhere(&client, &handler).await;
    let base = plan("bench");
    for (i, name) in ["invoice-lookup", "weather-forecast", "currency-convert"].into_iter().enumerate() {
        let description = ["Look up an invoice by number", "Forecast the weather", "Convert money between currencies"];
        assert_eq!(upsert(&client, &base, name, description[i]).await.answer, Answer::Ok);
    }

    // CPU per request, three nodes then one.
    let three = cpu_per_request(&client, &nodes, sizes, "cpu3").await;
    nodes[1].kill_9();
    nodes[2].kill_9();
    wait_for_nodes(&client, 1, STARTUP, &nodes).await;
    let one = cpu_per_request(&client, &nodes, sizes, "cpu1").await;
    nodes[1].start();
    nodes[2].start();
    wait_for_nodes(&client, NODES.len(), STARTUP, &nodes).await;
    println!(
        "CPU per discover: {:.0} µs with one node, {:.0} µs with three (all capdex processes)",
        one.0 * 1e6,
        three.0 * 1e6
    );
    println!(
        "CPU per dispatch: {:.0} µs with one node, {:.0} µs with three (all capdex processes)",
        one.1 * 1e6,
        three.1 * 1e6
    );

    // Failover: kill -9 a capdex node, each in turn.
    let mut windows = Vec::new();
    for kill in 0..sizes.kills {
        let i = kill % 3;
        let load = Load::start(&client, &plan(&format!("node{kill}")));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let killed = Instant::now();
        nodes[i].kill_9();
        tokio::time::sleep(Duration::from_secs(3)).await;
        nodes[i].start();
        wait_for_nodes(&client, NODES.len(), STARTUP, &nodes).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let window = killed..Instant::now();
        let records = load.stop().await;
        windows.push(Window::of(&records, window, &format!("capdex node {} killed", NODES[i])));
    }
    summarise("capdex node killed", &windows);

    // Failover: kill -9 a nats-server, each in turn.
    let mut windows = Vec::new();
    for kill in 0..sizes.kills {
        let i = kill % 3;
        let load = Load::start(&client, &plan(&format!("nats{kill}")));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let killed = Instant::now();
        blocking(|| cluster.kill_9(i));
        tokio::time::sleep(Duration::from_secs(3)).await;
        blocking(|| cluster.restart(i));
        wait_for_nodes(&client, NODES.len(), STARTUP, &nodes).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let window = killed..Instant::now();
        let records = load.stop().await;
        windows.push(Window::of(&records, window, &format!("nats-server {} killed", cluster.name(i))));
    }
    summarise("nats-server killed", &windows);
    let seen = handler.seen();
    let twice = seen.values().filter(|n| **n > 1).count();
    println!(
        "handler: {} (executionId, stepId) keys, {twice} run more than once over all kills{}",
        seen.len(),
        if twice > 0 { " (re-drive records are per node without the shared dispatch state)" } else { "" }
    );

    // Catch-up: a node down during the mutations, against a plain restart.
    nodes[2].kill_9();
    let started = Instant::now();
    nodes[2].start();
    wait_for_nodes(&client, NODES.len(), STARTUP, &nodes).await;
    let plain_restart = started.elapsed();
    nodes[2].kill_9();
    wait_for_nodes(&client, 2, STARTUP, &nodes).await;
    let mutating = Instant::now();
    let upserts = futures::stream::iter(0..sizes.mutations)
        .map(|n| {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let name = format!("catchup-{n}");
                upsert(&client, &base, &name, &format!("Synthetic tool number {n} registered while a node is down"))
                    .await
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<Record>>()
        .await;
    let failed = upserts.iter().filter(|r| r.answer != Answer::Ok).count();
    let mutation_time = mutating.elapsed();
    let started = Instant::now();
    nodes[2].start();
    wait_for_nodes(&client, NODES.len(), Duration::from_secs(600), &nodes).await;
    let catch_up = started.elapsed();
    println!(
        "catch-up: node down during {} index mutations ({:.0}/s through two nodes, {failed} failed) answers \
         {:.2} s after its start; {:.2} s with nothing to catch up",
        sizes.mutations,
        sizes.mutations as f64 / mutation_time.as_secs_f64(),
        catch_up.as_secs_f64(),
        plain_restart.as_secs_f64()
    );
    // The caught-up node lists every mutation.
    let payload = json!({"origin": "runtime:cluster"});
    let (listed, _) = answer_from(&client, "c2", "capdex.v1.capabilities.list", payload, Duration::from_secs(60)).await;
    let n_listed = listed["capabilities"].as_array().map_or(0, Vec::len);
    println!("catch-up: c2 lists {n_listed} runtime capabilities after its restart (expected {})", sizes.mutations + 3);
    assert_eq!(n_listed, sizes.mutations + 3, "the restarted node did not catch up");
    drop(nodes);
}

/// Registers the counted capability until every node has answered that it holds it (a node that already has it
/// answers `already_registered`): without the shared dispatch registry, each node keeps its own.
async fn register_everywhere(client: &async_nats::Client, handler: &CountingHandler) {
    let mut holding = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while holding.len() < NODES.len() {
        let reply = client
            .request("capdex.v1.capability.register", dispatch_record(&handler.url()).to_string().into())
            .await
            .expect("register answers");
        let body: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap_or_default();
        let node = reply.headers.as_ref().and_then(|h| h.get("Capdex-Node")).map(|v| v.as_str().to_string());
        if body["policyVersion"].is_u64() || body["code"] == "already_registered" {
            holding.extend(node);
        }
        assert!(Instant::now() < deadline, "the capability could not be registered on every node: {body}");
    }
}

/// CPU seconds per discover and per dispatch, summed over the running capdex processes, 16 requests in flight.
async fn cpu_per_request(client: &async_nats::Client, nodes: &[CapdexNode], sizes: &Sizes, run_id: &str) -> (f64, f64) {
    let plan = plan(run_id);
    let cpu = || -> f64 { nodes.iter().filter_map(|node| node.pid().and_then(cluster_load::cpu_secs)).sum() };
    let before = cpu();
    let discovers: Vec<Record> = futures::stream::iter(0..sizes.cpu_discovers)
        .map(|n| {
            let query = ["look up an invoice", "forecast the weather", "convert money"][n % 3];
            let payload = json!({"message": query});
            request(client, &plan, Kind::Discover, "capdex.v1.discover", payload, String::new())
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let per_discover = (cpu() - before) / sizes.cpu_discovers as f64;
    assert!(discovers.iter().all(|r| r.answer == Answer::Ok), "a discover failed");
    let before = cpu();
    let dispatches: Vec<Record> = futures::stream::iter(0..sizes.cpu_dispatches)
        .map(|n| {
            let execution_id = format!("{run_id}-{n}");
            let plan = plan.clone();
            async move { dispatch(client, &plan, &execution_id, "step-1").await }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let per_dispatch = (cpu() - before) / sizes.cpu_dispatches as f64;
    let failed: Vec<&Record> = dispatches.iter().filter(|r| r.answer != Answer::Ok).collect();
    assert!(failed.is_empty(), "{} dispatches failed, e.g. {:?}", failed.len(), failed.first());
    (per_discover, per_dispatch)
}

/// The requests of one kill's failover window.
struct Window {
    label: String,
    length: Duration,
    sent: usize,
    failed: usize,
    delayed: usize,
    latencies: Vec<Duration>,
    in_doubt: usize,
    by_kind: String,
}

impl Window {
    fn of(records: &[Record], window: std::ops::Range<Instant>, label: &str) -> Window {
        let inside: Vec<&Record> = records.iter().filter(|r| window.contains(&r.sent)).collect();
        let failed = inside.iter().filter(|r| matches!(r.answer, Answer::Refused(_) | Answer::Unanswered(_))).count();
        let delayed = inside
            .iter()
            .filter(|r| matches!(r.answer, Answer::Ok | Answer::InDoubt(_)) && r.latency > DELAYED)
            .count();
        let in_doubt = inside.iter().filter(|r| matches!(r.answer, Answer::InDoubt(_))).count();
        let by_kind = [Kind::Discover, Kind::Outcome, Kind::Dispatch]
            .iter()
            .map(|kind| {
                let of_kind: Vec<&&Record> = inside.iter().filter(|r| r.kind == *kind).collect();
                let bad = of_kind
                    .iter()
                    .filter(|r| !matches!(r.answer, Answer::Ok | Answer::InDoubt(_)) || r.latency > DELAYED)
                    .count();
                format!("{kind:?} {bad}/{}", of_kind.len())
            })
            .collect::<Vec<_>>()
            .join(", ");
        let refusals: Vec<&Answer> =
            inside.iter().filter(|r| matches!(r.answer, Answer::Refused(_))).map(|r| &r.answer).take(3).collect();
        if !refusals.is_empty() {
            println!("  {label}: refusals, e.g. {refusals:?}");
        }
        let window = Window {
            label: label.to_string(),
            length: window.end - window.start,
            sent: inside.len(),
            failed,
            delayed,
            latencies: inside.iter().map(|r| r.latency).collect(),
            in_doubt,
            by_kind,
        };
        let mut latencies = window.latencies.clone();
        println!(
            "  {}: window {:.1} s, {} requests, {} failed, {} delayed > 1 s ({}), {} in doubt, p99 {:.0} ms",
            window.label,
            window.length.as_secs_f64(),
            window.sent,
            window.failed,
            window.delayed,
            window.by_kind,
            window.in_doubt,
            quantile(&mut latencies, 0.99).as_secs_f64() * 1000.0
        );
        window
    }
}

fn summarise(label: &str, windows: &[Window]) {
    let sent: usize = windows.iter().map(|w| w.sent).sum();
    let failed: usize = windows.iter().map(|w| w.failed).sum();
    let delayed: usize = windows.iter().map(|w| w.delayed).sum();
    let mut latencies: Vec<Duration> = windows.iter().flat_map(|w| w.latencies.iter().copied()).collect();
    let p50 = quantile(&mut latencies, 0.5);
    let p99 = quantile(&mut latencies, 0.99);
    println!(
        "{label} ({} times): {sent} requests in the failover windows, {failed} failed, {delayed} delayed > 1 s; \
         latency p50 {:.0} ms, p99 {:.0} ms",
        windows.len(),
        p50.as_secs_f64() * 1000.0,
        p99.as_secs_f64() * 1000.0
    );
}
