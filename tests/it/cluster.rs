//! A real cluster: three nats-servers clustered over loopback routes,
//! JetStream with three replicas, three `capdex serve` nodes (each listing
//! its own server first), under a bounded mixed load (discover, outcomes
//! through JetStream with ids, dispatch of a non-idempotent `api` capability
//! with unique executionIds). One capdex node is killed with SIGKILL and
//! restarted, then one nats-server. Afterwards: no acknowledged outcome lost
//! or counted twice, no handler run twice for one (executionId, stepId), every
//! request answered or refused with a retryable error (and then answered on a
//! retry), the survivors answer throughout, the killed node catches up.
//!
//! The checks that need the dispatch state shared through JetStream (registry,
//! re-drive records) are collected and reported together at the end, each
//! marked `[shared dispatch state]`, after every other check has passed.

use crate::support::cluster_load::{
    answer_from, dispatch_record, drained, upsert, wait_for_nodes, Answer, CapdexNode, CountingHandler, Kind, Load,
    Plan, Record, AGENT, DISPATCH_SLUG,
};
use crate::support::nats_cluster::NatsCluster;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const NODES: [&str; 3] = ["c0", "c1", "c2"];
const STARTUP: Duration = Duration::from_secs(60);
/// Registered on one node, callable on any within this long (issue 21).
const REGISTRY_SPREAD: Duration = Duration::from_secs(1);

fn plan() -> Plan {
    Plan {
        discover_workers: 3,
        outcome_workers: 2,
        dispatch_workers: 3,
        pause: Duration::from_millis(40),
        attempt_timeout: Duration::from_secs(2),
        deadline: Duration::from_secs(25),
        max_per_worker: 1000,
        run_id: crate::support::cluster_load::next_run_id("it"),
    }
}

/// Blocks this worker thread for a cluster operation (it sleeps and polls synchronously).
fn blocking<T>(operation: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(operation)
}

/// Probes `dispatch` without ids and without its required arguments: a node that knows the
/// capability answers `invalid_args` (nothing runs), one that does not `unknown_capability`.
/// Returns the nodes that answered `invalid_args` within `within`.
async fn nodes_that_know(client: &async_nats::Client, within: Duration) -> BTreeMap<String, String> {
    let mut answers = BTreeMap::new();
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let probe = json!({"slug": DISPATCH_SLUG, "agentId": AGENT, "arguments": {}});
        let reply = tokio::time::timeout(
            Duration::from_secs(2),
            client.request("capdex.v1.dispatch", probe.to_string().into()),
        )
        .await;
        if let Ok(Ok(reply)) = reply {
            let node = reply.headers.as_ref().and_then(|h| h.get("Capdex-Node")).map(|v| v.as_str().to_string());
            let body: Value = serde_json::from_slice(&reply.payload).unwrap_or(Value::Null);
            if let Some(node) = node {
                answers.insert(node, body["error"]["code"].as_str().unwrap_or("").to_string());
            }
        }
        if answers.len() == NODES.len() && answers.values().all(|code| code == "invalid_args") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    answers
}

fn count(records: &[Record], kind: Kind, matches: impl Fn(&Answer) -> bool) -> usize {
    records.iter().filter(|record| record.kind == kind && matches(&record.answer)).count()
}

fn not_final(records: &[Record], kinds: &[Kind]) -> Vec<String> {
    records
        .iter()
        .filter(|record| kinds.contains(&record.kind))
        .filter(|record| matches!(record.answer, Answer::Refused(_) | Answer::Unanswered(_)))
        .map(|record| format!("{:?} {} after {} sends: {:?}", record.kind, record.key, record.attempts, record.answer))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_server_cluster_with_three_nodes_survives_kill_9_of_a_node_and_of_a_nats_server() {
    let mut cluster = blocking(|| NatsCluster::start(3));
    let handler = CountingHandler::start(Duration::from_millis(30));
    let mut nodes: Vec<CapdexNode> =
        (0..3).map(|i| CapdexNode::new(NODES[i], cluster.urls_from(i), 3, &[("CAPDEX_LOG", "info")])).collect();
    nodes.iter_mut().for_each(CapdexNode::start);
    // The test's client lives on n1 (then n2), never on n0, the server it kills.
    let client = async_nats::ConnectOptions::new()
        .retain_servers_order()
        .connect(vec![cluster.url(1), cluster.url(2)])
        .await
        .expect("the test client connects");
    let jetstream = async_nats::jetstream::new(client.clone());
    let waited = tokio::time::timeout(STARTUP, wait_for_nodes(&client, NODES.len(), STARTUP * 2, &nodes)).await;
    if waited.is_err() {
        let logs: Vec<String> = nodes.iter().map(|node| node.log()).collect();
        panic!("the nodes did not all answer within {STARTUP:?}; their logs:\n{}", logs.join("\n----\n"));
    }

    // The streams exist with three replicas, one on each server.
    for name in ["CAPDEX_INDEX", "CAPDEX_OUTCOMES", "CAPDEX_EVENTS_KPI", "CAPDEX_EVENTS_ALERTS"] {
        let info = jetstream.get_stream(name).await.unwrap().info().await.unwrap().clone();
        assert_eq!(info.config.num_replicas, 3, "{name}");
        let cluster_info = info.cluster.expect("a clustered stream says where it lives");
        assert_eq!(cluster_info.replicas.len(), 2, "{name}: a leader and two replicas: {cluster_info:?}");
    }

    let mut shared_state_problems: Vec<String> = Vec::new();
    let plan = plan();
    let answer = crate::dispatch::ask(&client, "capdex.v1.capability.register", dispatch_record(&handler.url())).await;
    assert!(answer["policyVersion"].as_u64().is_some(), "register: {answer}");
    let known = nodes_that_know(&client, REGISTRY_SPREAD).await;
    if known.len() < NODES.len() || known.values().any(|code| code != "invalid_args") {
        shared_state_problems.push(format!(
            "registered on one node, the capability is not callable on every node within {REGISTRY_SPREAD:?}: {known:?}"
        ));
    }
    // Something to discover, upserted before the load.
    assert_eq!(upsert(&client, &plan, "invoice-lookup", "Look up an invoice by number").await.answer, Answer::Ok);

    let started = Instant::now();
    let load = Load::start(&client, &plan);
    tokio::time::sleep(Duration::from_secs(3)).await;

    // (a) kill -9 a capdex node; survivors take index mutations it misses.
    let node_killed_at = started.elapsed();
    nodes[1].kill_9();
    let mut missed = Vec::new();
    for k in 0..3 {
        let name = format!("catchup-{k}");
        let record = upsert(&client, &plan, &name, &format!("A tool registered while c1 is down, number {k}")).await;
        assert_eq!(record.answer, Answer::Ok, "{record:?}");
        missed.push(format!("tool:{name}"));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    nodes[1].start();
    let waited = tokio::time::timeout(STARTUP, wait_for_nodes(&client, NODES.len(), STARTUP * 2, &nodes)).await;
    let Ok(back_after) = waited else {
        panic!("c1 did not come back within {STARTUP:?}; its log:\n{}", nodes[1].log())
    };
    let node_back_at = started.elapsed();
    // The restarted node applied what it missed before it answered.
    let (listed, _) = answer_from(
        &client,
        "c1",
        "capdex.v1.capabilities.list",
        json!({"origin": "runtime:cluster"}),
        Duration::from_secs(20),
    )
    .await;
    let ids: Vec<&str> = listed["capabilities"].as_array().unwrap().iter().filter_map(|c| c["id"].as_str()).collect();
    for id in &missed {
        assert!(ids.contains(&id.as_str()), "restarted c1 lacks {id}: {listed}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // (b) kill -9 a nats-server: c0, whose first server it is, fails over to another one.
    let nats_killed_at = started.elapsed();
    blocking(|| cluster.kill_9(0));
    // c0 answers again while n0, its first server, is down: it reconnected to another server.
    let discover = json!({"message": "look up an invoice"});
    let (_, c0_failover) = answer_from(&client, "c0", "capdex.v1.discover", discover, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    blocking(|| cluster.restart(0));
    let nats_back_at = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let records = load.stop().await;
    let load_ran = started.elapsed();
    eprintln!(
        "cluster test: load ran {load_ran:?}, c1 killed at {node_killed_at:?} and back at {node_back_at:?} \
         (answering {back_after:?} after its start), n0 killed at {nats_killed_at:?} and healthy again at \
         {nats_back_at:?}, c0 failed over in {c0_failover:?}; {} requests",
        records.len()
    );

    // Every request was answered, after retries of retryable failures only.
    let unanswered = not_final(&records, &[Kind::Discover, Kind::Outcome]);
    assert!(unanswered.is_empty(), "discover/outcome requests without a final answer: {unanswered:#?}");
    for kind in [Kind::Discover, Kind::Outcome, Kind::Dispatch] {
        assert!(records.iter().filter(|r| r.kind == kind).count() >= 20, "too few {kind:?} requests ran");
    }

    // The survivors answered throughout: in every window of three seconds of
    // the load, some discover sent then was answered within 2 s (the benchmark
    // measures the delays themselves; two cores shared with the rest of the
    // suite stall a whole second now and then).
    // Up to the last discover sent: the load stops sending before `stop` has
    // waited for what was still in flight.
    let sent_until = records.iter().filter(|r| r.kind == Kind::Discover).map(|r| r.sent - started).max();
    let seconds = sent_until.unwrap_or_default().as_secs().saturating_sub(2);
    for second in 0..seconds {
        let slot = Duration::from_secs(second)..Duration::from_secs(second + 3);
        let answered = records.iter().any(|r| {
            r.kind == Kind::Discover
                && slot.contains(&(r.sent - started))
                && r.answer == Answer::Ok
                && r.latency <= Duration::from_secs(2)
        });
        if !answered {
            let seen: Vec<String> = records
                .iter()
                .filter(|r| r.kind == Kind::Discover && slot.contains(&(r.sent - started)))
                .map(|r| format!("{:?} {:?} {:?} x{}", r.sent - started, r.latency, r.answer, r.attempts))
                .collect();
            panic!(
                "no discover sent in seconds {second}..{} of the load was answered within 2 s (node killed at {node_killed_at:?}, \
                 back at {node_back_at:?}; nats-server killed at {nats_killed_at:?}, back at {nats_back_at:?}): {seen:#?}",
                second + 3
            );
        }
    }

    // No acknowledged outcome lost or counted twice, on any node (the restarted one too).
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for record in records.iter().filter(|r| r.kind == Kind::Outcome && r.answer == Answer::Ok) {
        *expected.entry(record.scope.clone()).or_default() += 1;
    }
    for name in NODES {
        drained(&jetstream, name, Duration::from_secs(60)).await;
    }

    // The dispatch checks.
    let dispatches: Vec<&Record> = records.iter().filter(|r| r.kind == Kind::Dispatch).collect();
    let refused = not_final(&records, &[Kind::Dispatch]);
    if !refused.is_empty() {
        shared_state_problems.push(format!(
            "{} of {} dispatches were refused or unanswered (first five): {:#?}",
            refused.len(),
            dispatches.len(),
            &refused[..refused.len().min(5)]
        ));
    }
    let seen = handler.seen();
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    if !twice.is_empty() {
        shared_state_problems.push(format!("handler ran more than once for {} keys: {twice:?}", twice.len()));
    }
    let lost: Vec<&String> = dispatches
        .iter()
        .filter(|r| r.answer == Answer::Ok && seen.get(&(r.key.clone(), "step-1".to_string())) != Some(&1))
        .map(|r| &r.key)
        .collect();
    if !lost.is_empty() {
        shared_state_problems.push(format!("{} successful dispatches did not run exactly once: {lost:?}", lost.len()));
    }
    let in_doubt = count(&records, Kind::Dispatch, |a| matches!(a, Answer::InDoubt(_)));
    eprintln!(
        "cluster test: {} dispatches ({} ok, {in_doubt} in doubt), handler saw {} calls",
        dispatches.len(),
        count(&records, Kind::Dispatch, |a| *a == Answer::Ok),
        handler.total()
    );

    for node in &mut nodes {
        node.kill_9();
    }
    for node in &nodes {
        let stored = node.stored_sample_counts();
        let ours: BTreeMap<String, u64> =
            stored.into_iter().filter(|(scope, _)| expected.contains_key(scope)).collect();
        assert_eq!(ours, expected, "node {}: KPI sample counts differ from the acknowledged outcomes", node.name);
    }

    assert!(
        shared_state_problems.is_empty(),
        "[shared dispatch state] {} check(s) failed:\n{}",
        shared_state_problems.len(),
        shared_state_problems.join("\n")
    );
}
