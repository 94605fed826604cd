//! Dispatch state shared by three `capdex serve` nodes on one real nats-server
//! with JetStream: requests spread over the nodes by the queue group (each
//! reply names its node), and the registry, bindings, approvals, re-drive
//! records and rate windows behave as on one node.
//!
//! Before the state moved to JetStream's key-value buckets, the same requests
//! failed: a capability registered on one node was unknown on the others, an
//! approval created on one was unknown on the others, a re-drive on another
//! node ran the handler again, and a rate limit held per node.

use crate::dispatch::{ask, call, code, handler, record, register, serve};
use crate::multinode::ask as ask_node;
use crate::support::nats_server::NatsServer;
use crate::support::serving::KillOnDrop;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Three nodes on `nats`, each with its own data dir; the client of the first.
async fn three_nodes(nats: &NatsServer, dirs: &[tempfile::TempDir; 3]) -> (Vec<KillOnDrop>, async_nats::Client) {
    let mut nodes = Vec::new();
    let mut client = None;
    for (at, dir) in dirs.iter().enumerate() {
        let name = format!("node-{at}");
        let (node, node_client) = serve(nats, dir.path(), &[("CAPDEX_JETSTREAM_NODE_NAME", &name)]).await;
        nodes.push(node);
        client.get_or_insert(node_client);
    }
    (nodes, client.unwrap())
}

#[tokio::test]
async fn three_nodes_share_the_registry_approvals_redrives_and_rate_windows() {
    let nats = NatsServer::start();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (_nodes, client) = three_nodes(&nats, &dirs).await;
    let runs = Arc::new(AtomicU64::new(0));
    handler(&client, "lookup", runs.clone(), Duration::ZERO).await;

    // Registered on one node, callable on any within a second.
    let (registered_on, _) = ask_node(&client, "capdex.v1.capability.register", record("lookup", json!({}))).await;
    let registered_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(1).saturating_sub(registered_at.elapsed())).await;
    let mut answered_by = BTreeSet::new();
    for n in 0..20 {
        let (node, result) = ask_node(
            &client,
            "capdex.v1.dispatch",
            json!({"slug": "lookup", "agentId": "a", "arguments": {"q": n.to_string()}}),
        )
        .await;
        assert_eq!(result["success"], true, "call {n} on {node} (registered on {registered_on}): {result}");
        answered_by.insert(node);
    }
    assert!(answered_by.len() >= 2, "the queue group spread 20 calls over the nodes: {answered_by:?}");
    // A second registration of the slug on any node is refused.
    let (_, again) = ask_node(&client, "capdex.v1.capability.register", record("lookup", json!({}))).await;
    assert_eq!(again["code"], "already_registered", "{again}");

    // Bindings: set on one node, held on all (disabled for agent b).
    let binding = json!({"agentId": "b", "slug": "lookup", "isEnabled": false});
    assert!(ask(&client, "capdex.v1.binding.set", binding).await["binding"].is_object());
    tokio::time::sleep(Duration::from_millis(500)).await;
    for n in 0..9 {
        let result = call(&client, json!({"slug": "lookup", "agentId": "b", "arguments": {"q": n.to_string()}})).await;
        assert_eq!(code(&result), "capability_disabled_for_agent", "{result}");
    }
}

#[tokio::test]
async fn an_approval_made_on_one_node_is_approved_through_another_and_runs_once() {
    let nats = NatsServer::start();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (_nodes, client) = three_nodes(&nats, &dirs).await;
    let runs = Arc::new(AtomicU64::new(0));
    handler(&client, "refund", runs.clone(), Duration::from_millis(50)).await;
    register(&client, record("refund", json!({"requiresApproval": true}))).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut created_on = BTreeMap::new();
    for n in 0..10 {
        let go = json!({"slug": "refund", "agentId": "a", "arguments": {"q": format!("o-{n}")}});
        let (node, asked) = ask_node(&client, "capdex.v1.dispatch", go).await;
        assert_eq!(code(&asked), "requires_approval", "{asked}");
        created_on.insert(n, (node, asked["metadata"]["approvalId"].as_str().unwrap().to_string()));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut decided_elsewhere = 0;
    for (n, (node, id)) in &created_on {
        let by = json!({"by": format!("op-{n}")});
        let (decided_on, approved) = ask_node(&client, &format!("capdex.v1.approval.{id}.approve"), by).await;
        assert_eq!(approved["status"], "approved", "approval {n} made on {node}, approved on {decided_on}: {approved}");
        assert_eq!(approved["decidedBy"], format!("op-{n}"), "{approved}");
        decided_elsewhere += usize::from(&decided_on != node);
    }
    assert!(decided_elsewhere > 0, "some approvals were decided through another node");
    // Every approved call is sent three times at once: each runs once.
    let attempts = created_on.iter().flat_map(|(n, (_, id))| {
        let go = json!({"slug": "refund", "agentId": "a", "arguments": {"q": format!("o-{n}")}, "approvalId": id});
        (0..3).map(move |_| go.clone())
    });
    let results = futures::future::join_all(attempts.map(|go| call(&client, go))).await;
    let succeeded = results.iter().filter(|r| r["success"] == true).count();
    assert_eq!(succeeded, 10, "{results:#?}");
    for refused in results.iter().filter(|r| r["success"] != true) {
        assert_eq!(code(refused), "approval_invalid", "{refused}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 10, "each approved call ran exactly once");
    let listed = ask(&client, "capdex.v1.approval.list", json!({})).await;
    assert!(listed["approvals"].as_array().is_some(), "{listed}");
    // Whichever node lists them, the approvals show their arguments and who decided, from the bucket.
    let deadline = Instant::now() + Duration::from_secs(10);
    for _ in 0..3 {
        loop {
            let (node, all) = ask_node(&client, "capdex.v1.approval.list", json!({"all": true})).await;
            let shown: BTreeMap<String, (Value, Value)> = all["approvals"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| (a["id"].as_str().unwrap().to_string(), (a["arguments"].clone(), a["decidedBy"].clone())))
                .collect();
            let complete = created_on
                .iter()
                .all(|(n, (_, id))| shown.get(id) == Some(&(json!({"q": format!("o-{n}")}), json!(format!("op-{n}")))));
            if complete {
                break;
            }
            assert!(Instant::now() < deadline, "{node} lists {shown:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test]
async fn concurrent_duplicates_spread_over_three_nodes_run_the_handler_once() {
    let nats = NatsServer::start();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (_nodes, client) = three_nodes(&nats, &dirs).await;
    let runs = Arc::new(AtomicU64::new(0));
    handler(&client, "charge", runs.clone(), Duration::from_millis(200)).await;
    register(&client, record("charge", json!({}))).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut nodes = BTreeSet::new();
    for step in 0..10 {
        let go = json!({"slug": "charge", "agentId": "wf", "arguments": {"q": "9.99"},
            "executionId": "run-1", "stepId": format!("s{step}")});
        let duplicates =
            futures::future::join_all((0..5).map(|_| ask_node(&client, "capdex.v1.dispatch", go.clone()))).await;
        let first = &duplicates[0].1;
        for (node, result) in &duplicates {
            assert_eq!(result["success"], true, "step {step} on {node}: {result}");
            assert_eq!(result["data"], first["data"], "every duplicate answers the one result");
            nodes.insert(node.clone());
        }
        assert_eq!(runs.load(Ordering::SeqCst), step + 1, "five duplicates of step {step} ran once");
        // A re-drive later, on whichever node, replays it.
        let (_, redrive) = ask_node(&client, "capdex.v1.dispatch", go).await;
        assert_eq!(redrive["data"], first["data"], "{redrive}");
    }
    assert!(nodes.len() >= 2, "duplicates were answered by several nodes: {nodes:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 10);
}

#[tokio::test]
async fn a_rate_limit_holds_across_the_nodes() {
    let nats = NatsServer::start();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (_nodes, client) = three_nodes(&nats, &dirs).await;
    let runs = Arc::new(AtomicU64::new(0));
    handler(&client, "search", runs.clone(), Duration::ZERO).await;
    register(&client, record("search", json!({"rateLimit": 6}))).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let go = |n: usize| json!({"slug": "search", "agentId": "a", "arguments": {"q": n.to_string()}});
    let results = futures::future::join_all((0..30).map(|n| ask_node(&client, "capdex.v1.dispatch", go(n)))).await;
    let admitted = results.iter().filter(|(_, r)| r["success"] == true).count();
    let nodes: BTreeSet<&str> = results.iter().map(|(node, _)| node.as_str()).collect();
    for (node, refused) in results.iter().filter(|(_, r)| r["success"] != true) {
        assert_eq!(code(refused), "rate_limited", "{node}: {refused}");
    }
    assert_eq!(admitted, 6, "6 per minute across {nodes:?}");
    // Another agent has its own window.
    let other = call(&client, json!({"slug": "search", "agentId": "b", "arguments": {"q": "x"}})).await;
    assert_eq!(other["success"], true, "{other}");
}

#[tokio::test]
async fn a_step_left_running_by_a_killed_node_is_not_run_again_by_another() {
    let nats = NatsServer::start();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (first, client) = serve(&nats, dirs[0].path(), &[("CAPDEX_JETSTREAM_NODE_NAME", "first")]).await;
    let runs = Arc::new(AtomicU64::new(0));
    // The handler holds the call long enough for its node to be killed mid-call.
    handler(&client, "transfer", runs.clone(), Duration::from_secs(3)).await;
    register(&client, record("transfer", json!({"timeoutMs": 1000}))).await;
    let go =
        json!({"slug": "transfer", "agentId": "wf", "arguments": {"q": "100"}, "executionId": "run-9", "stepId": "s1"});
    let pending = {
        let client = client.clone();
        let go = go.clone();
        tokio::spawn(async move { client.request("capdex.v1.dispatch", go.to_string().into()).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while runs.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the handler was not reached");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_second, _) = serve(&nats, dirs[1].path(), &[("CAPDEX_JETSTREAM_NODE_NAME", "second")]).await;
    first.kill_9();
    pending.abort();
    // The re-drive reaches the survivor: the step was claimed by a node that died
    // mid-call, its outcome is unknown, so it is answered, not run again.
    // Each attempt may take the capability's timeout (1 s), the settle grace
    // (2 s) and some slack; one that takes longer was lost.
    let attempt_limit = Duration::from_millis(1_000 + capdex::core::dispatch::shared::SETTLE_GRACE_MS + 3_000);
    let started = Instant::now();
    let reply = loop {
        let request = client.request("capdex.v1.dispatch", go.to_string().into());
        match tokio::time::timeout(attempt_limit, request).await {
            Ok(Ok(reply)) => break reply,
            // Lost to the killed node (the server may not have dropped its
            // subscription yet), or the second node still subscribing: ask again.
            outcome => {
                assert!(started.elapsed() < Duration::from_secs(30), "{outcome:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let node = reply.headers.as_ref().and_then(|h| h.get("Capdex-Node")).map(|v| v.as_str().to_string());
    let redrive: Value = serde_json::from_slice(&reply.payload).unwrap();
    let node = node.unwrap_or_default();
    assert_eq!(node, "second");
    assert_eq!(redrive["success"], false, "{redrive}");
    assert!(redrive["error"]["message"].as_str().unwrap().contains("outcome is unknown"), "{redrive}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}
