//! One catalog over NATS, against a real nats-server and `capdex serve`: a
//! capability has one id in discovery, the Source Capability Graph and
//! dispatch (`docs/live-sources.md`). Registered capabilities are discoverable
//! (unless hidden) and their dispatch results move them in discovery; mapped
//! operations are discoverable and routable under the id dispatch takes; a
//! workspace sees only the sources it enabled.

use crate::dispatch::{ask, call, code, record, register, serve};
use crate::support::fixture;
use crate::support::nats_server::NatsServer;
use futures::StreamExt;
use serde_json::{json, Value};
use std::time::Duration;

/// The Tier 1 `(id, relevance)` of `message`, with the outcome prior as asked.
async fn tier1(client: &async_nats::Client, message: &str, extra: Value) -> Vec<(String, f64)> {
    let mut request = json!({"message": message});
    for (key, value) in extra.as_object().unwrap() {
        request[key] = value.clone();
    }
    let reply = ask(client, "capdex.v1.discover", request).await;
    reply["tier1"]
        .as_array()
        .unwrap_or_else(|| panic!("no tier1: {reply}"))
        .iter()
        .map(|entry| (entry["id"].as_str().unwrap().to_string(), entry["relevance"].as_f64().unwrap()))
        .collect()
}

/// The Tier 0 map of `message` in `workspace`.
async fn tier0(client: &async_nats::Client, message: &str, workspace: &str) -> String {
    let reply = ask(client, "capdex.v1.discover", json!({"message": message, "workspace": workspace})).await;
    reply["tier0"].as_str().unwrap_or_else(|| panic!("no tier0: {reply}")).to_string()
}

fn position(ranking: &[(String, f64)], id: &str) -> Option<usize> {
    ranking.iter().position(|(entry, _)| entry == id)
}

/// The ids `capabilities.list` shows for `origin`.
async fn listed(client: &async_nats::Client, origin: &str) -> Vec<String> {
    let reply = ask(client, "capdex.v1.capabilities.list", json!({"origin": origin})).await;
    reply["capabilities"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap().to_string()).collect()
}

/// A handler service for `slug` that always answers `success` (or always fails with its own code).
async fn handler(client: &async_nats::Client, slug: &str, succeed: bool) {
    let mut requests = client.queue_subscribe(format!("capdex.v1.exec.{slug}"), "h".into()).await.unwrap();
    client.flush().await.unwrap();
    let client = client.clone();
    tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            let reply = if succeed {
                json!({"success": true, "data": {"reconciled": 3}})
            } else {
                json!({"success": false, "error": {"code": "ledger_locked", "message": "the ledger is locked"}})
            };
            if let Some(inbox) = message.reply {
                let _ = client.publish(inbox, reply.to_string().into()).await;
            }
        }
    });
}

fn ledger(slug: &str, description: &str, extra: Value) -> Value {
    let mut ledger = record(slug, extra);
    ledger["name"] = json!(slug.replace('_', " "));
    ledger["description"] = json!(description);
    ledger["category"] = json!("finance");
    ledger
}

/// Registered capabilities are discoverable as `tool:<slug>` (hidden ones are
/// not, until updated), a call may name one by slug or discovery id, and the
/// results of dispatch are credited under the discovery id: with the prior
/// on, the capability that keeps failing sinks below the one that succeeds,
/// although it ranked above it before; with the prior off per query, nothing moves.
#[tokio::test]
async fn dispatch_results_move_registered_capabilities_in_discover() {
    const MESSAGE: &str = "reconcile quarterly ledger entries";
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    // Strength 0.5 and one pseudo-observation: a few calls can swap two close capabilities.
    let env = [
        ("CAPDEX_DISCOVERY_OUTCOME_PRIOR_PUBLISH_INTERVAL_MS", "0"),
        ("CAPDEX_DISCOVERY_OUTCOME_PRIOR_STRENGTH", "0.5"),
        ("CAPDEX_DISCOVERY_OUTCOME_PRIOR_PSEUDO_COUNT", "1"),
    ];
    let (_serving, client) = serve(&nats, data.path(), &env).await;
    let mut events = client.subscribe("capdex.v1.events.dispatch").await.unwrap();
    handler(&client, "ledger_flaky", false).await;
    handler(&client, "ledger_steady", true).await;
    // The flaky one matches the message better.
    register(&client, ledger("ledger_flaky", "Reconcile quarterly ledger entries with the bank statement", json!({})))
        .await;
    register(&client, ledger("ledger_steady", "Reconcile ledger entries with the bank statement", json!({}))).await;
    register(&client, ledger("ledger_quiet", "Reconcile quarterly ledger entries", json!({"hidden": true}))).await;
    let offered = listed(&client, "dispatch").await;
    assert_eq!(offered, ["tool:ledger_flaky", "tool:ledger_steady"], "hidden stays out");
    let full = ask(&client, "capdex.v1.discover", json!({"message": MESSAGE})).await;
    let tier2: Vec<&Value> =
        full["tier2"].as_array().unwrap().iter().filter(|e| e["id"] == "tool:ledger_flaky").collect();
    assert!(tier2[0]["fullText"].as_str().unwrap().contains('q'), "the parameters are its Tier 2: {full}");

    let before = tier1(&client, MESSAGE, json!({})).await;
    let (flaky, steady) = (position(&before, "tool:ledger_flaky"), position(&before, "tool:ledger_steady"));
    assert!(flaky.is_some() && flaky < steady, "the flaky one ranks first before any result: {before:?}");
    let relevance = |ranking: &[(String, f64)], id: &str| ranking[position(ranking, id).unwrap()].1;
    assert!(relevance(&before, "tool:ledger_steady") >= 0.6 * relevance(&before, "tool:ledger_flaky"), "{before:?}");
    assert!(position(&before, "tool:ledger_quiet").is_none(), "hidden: {before:?}");

    for step in 0..8 {
        // The slug, the discovery id: both name the one record.
        let failed = call(&client, json!({"slug": "tool:ledger_flaky", "agentId": "a", "arguments": {"q": "x"}})).await;
        assert_eq!(code(&failed), "ledger_locked", "{failed}");
        let id = if step % 2 == 0 { "ledger_steady" } else { "tool:ledger_steady" };
        let ok = call(&client, json!({"slug": id, "agentId": "a", "arguments": {"q": "x"}})).await;
        assert_eq!(ok["success"], true, "{ok}");
    }
    let event = tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap().unwrap();
    let event: Value = serde_json::from_slice(&event.payload).unwrap();
    assert_eq!(
        (event["slug"].as_str(), event["capabilityId"].as_str()),
        (Some("ledger_flaky"), Some("tool:ledger_flaky"))
    );
    let hidden_call =
        call(&client, json!({"slug": "tool:ledger_quiet", "agentId": "a", "arguments": {"q": "x"}})).await;
    assert_eq!(code(&hidden_call), "execution_error", "hidden is still callable (no handler here): {hidden_call}");

    // The prior is published after every change (interval 0); wait for it to arrive.
    let mut after = tier1(&client, MESSAGE, json!({})).await;
    for _ in 0..50 {
        if position(&after, "tool:ledger_steady") < position(&after, "tool:ledger_flaky") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = tier1(&client, MESSAGE, json!({})).await;
    }
    assert!(
        position(&after, "tool:ledger_steady") < position(&after, "tool:ledger_flaky"),
        "the failing capability sinks: {before:?} → {after:?}"
    );
    assert_eq!(tier1(&client, MESSAGE, json!({"outcomePrior": false})).await, before, "switched off per query");

    // An update that unhides it offers it.
    let mut quiet = ledger("ledger_quiet", "Reconcile quarterly ledger entries", json!({}));
    quiet["hidden"] = json!(false);
    let updated = ask(&client, "capdex.v1.capability.update", quiet).await;
    assert_eq!(updated["policyVersion"], 2, "{updated}");
    assert!(listed(&client, "dispatch").await.contains(&"tool:ledger_quiet".to_string()));
}

const PETSTORE: &str = "openapi/petstore.readme-oas-examples.json";

/// `capdex.v1.map` publishes a document's operations: `discover` offers
/// `<source>#<operationId>` with its full schema in Tier 2, `route` returns
/// the same id, `search` offers it under a function name dispatch takes too,
/// and a `dispatch` of it answers `unavailable` naming the source
/// (a mapped document has no live connection). A map that fails changes nothing;
/// a restart keeps all three.
#[tokio::test]
async fn scg_mapped_operations_are_discoverable_routable_and_dispatchable_by_one_id() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (serving, client) = serve(&nats, data.path(), &[]).await;
    let document = std::fs::read_to_string(fixture(PETSTORE)).unwrap();
    let report = ask(&client, "capdex.v1.map", json!({"sourceId": "petstore", "document": document})).await;
    assert_eq!(report["sourceId"], "petstore", "{report}");
    let offered = listed(&client, "source:petstore").await;
    assert_eq!(offered.len(), 20, "{offered:?}");
    assert!(offered.contains(&"petstore#findPetsByStatus".to_string()), "{offered:?}");

    let found = ask(&client, "capdex.v1.discover", json!({"message": "find pets by status"})).await;
    let id = "petstore#findPetsByStatus";
    assert_eq!(found["tier1"][0]["id"], id, "{found}");
    let detail = found["tier2"].as_array().unwrap().iter().find(|entry| entry["id"] == id);
    let detail = detail.unwrap_or_else(|| panic!("no Tier 2 for {id}: {found}"))["fullText"].as_str().unwrap();
    assert!(detail.contains("status (array, required)"), "the full schema: {detail}");

    let routed = ask(&client, "capdex.v1.route", json!({"query": "find pets by status", "k": 3})).await;
    let steps: Vec<&str> = routed["recipes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|recipe| recipe["steps"].as_array().unwrap().iter().filter_map(Value::as_str))
        .collect();
    assert!(steps.contains(&id), "route names the same id: {routed}");

    let arguments = json!({"status": ["available"]});
    let unavailable = call(&client, json!({"slug": id, "agentId": "a", "arguments": arguments})).await;
    assert_eq!(code(&unavailable), "unavailable", "{unavailable}");
    assert!(unavailable["error"]["message"].as_str().unwrap().contains("petstore"), "{unavailable}");
    // `search` offers it to a model under a valid function name, which dispatch takes too.
    let searched = ask(&client, "capdex.v1.search", json!({"query": "find pets by status"})).await;
    let names: Vec<&str> =
        searched["tools"].as_array().unwrap().iter().filter_map(|tool| tool["function"]["name"].as_str()).collect();
    assert!(names.contains(&"petstore_findPetsByStatus"), "{searched}");
    let by_name =
        call(&client, json!({"slug": "petstore_findPetsByStatus", "agentId": "a", "arguments": arguments})).await;
    assert_eq!(code(&by_name), "unavailable", "{by_name}");
    let bad = call(&client, json!({"slug": id, "agentId": "a", "arguments": {"status": 7}})).await;
    assert_eq!(code(&bad), "invalid_args", "its schema is checked first: {bad}");

    // A map that fails leaves the published source as it was.
    let broken = ask(&client, "capdex.v1.map", json!({"sourceId": "petstore", "document": "{\"openapi\": 3}"})).await;
    assert_eq!(broken["code"], "not_openapi", "{broken}");
    assert_eq!(listed(&client, "source:petstore").await, offered);
    let still = call(&client, json!({"slug": id, "agentId": "a", "arguments": arguments})).await;
    assert_eq!(code(&still), "unavailable", "{still}");

    // After a restart the catalog, the SCG and the dispatch records agree again.
    drop(serving);
    let (_serving, client) = serve(&nats, data.path(), &[]).await;
    assert_eq!(listed(&client, "source:petstore").await, offered);
    let restarted = call(&client, json!({"slug": id, "agentId": "a", "arguments": arguments})).await;
    assert_eq!(code(&restarted), "unavailable", "{restarted}");
    assert_eq!(
        code(&call(&client, json!({"slug": id, "agentId": "a", "arguments": {"status": 7}})).await),
        "invalid_args"
    );
}

/// Two sources in two workspaces: a workspace's `discover`, `search` and
/// `plan` see its own source's capabilities and never the other's; a
/// workspace that enabled neither sees neither; capabilities of no source
/// pass everywhere; without a workspace both sources are seen.
#[tokio::test]
async fn discover_in_a_workspace_sees_only_the_sources_it_enabled() {
    const MESSAGE: &str = "find pets by status and get the current time, or echo it";
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client) = serve(&nats, data.path(), &[]).await;
    let pets = std::fs::read_to_string(fixture(PETSTORE)).unwrap();
    let time = std::fs::read_to_string(fixture("mcp/time.json")).unwrap();
    for (source, document, workspace) in [("petstore", pets, "ws-pets"), ("time", time, "ws-time")] {
        let report =
            ask(&client, "capdex.v1.map", json!({"sourceId": source, "document": document, "workspaces": [workspace]}))
                .await;
        assert_eq!(report["sourceId"], source, "{report}");
    }
    let sources_of = |ranking: &[(String, f64)]| -> Vec<String> {
        let mut sources: Vec<String> =
            ranking.iter().filter_map(|(id, _)| id.split_once('#').map(|(source, _)| source.to_string())).collect();
        sources.sort();
        sources.dedup();
        sources
    };
    let everything = tier1(&client, MESSAGE, json!({})).await;
    assert_eq!(sources_of(&everything), ["petstore", "time"], "{everything:?}");
    for (workspace, expected) in [("ws-pets", vec!["petstore"]), ("ws-time", vec!["time"]), ("ws-none", vec![])] {
        let ranking = tier1(&client, MESSAGE, json!({"workspace": workspace})).await;
        assert_eq!(sources_of(&ranking), expected, "{workspace}: {ranking:?}");
        assert!(position(&ranking, "tool:echo").is_some(), "no source, always passes: {ranking:?}");
        let search =
            ask(&client, "capdex.v1.search", json!({"query": MESSAGE, "workspace": workspace})).await.to_string();
        for other in ["petstore#", "time#"] {
            let allowed = expected.iter().any(|source| other.starts_with(source));
            assert_eq!(search.contains(other), allowed, "search in {workspace}: {search}");
        }
        let plan = ask(&client, "capdex.v1.plan", json!({"message": MESSAGE, "workspace": workspace})).await;
        let planned: Vec<(String, f64)> = plan["discovery"]["tier1"]
            .as_array()
            .unwrap_or_else(|| panic!("no discovery in the plan: {plan}"))
            .iter()
            .map(|entry| (entry["id"].as_str().unwrap().to_string(), 0.0))
            .collect();
        assert_eq!(sources_of(&planned), expected, "plan in {workspace}: {plan}");
    }
    // Tier 0 (the category map) keeps to the workspace too.
    let (pets_map, time_map) = (tier0(&client, MESSAGE, "ws-pets").await, tier0(&client, MESSAGE, "ws-time").await);
    let (pets_map, time_map) = (pets_map.to_lowercase(), time_map.to_lowercase());
    assert!(pets_map.contains("petstore") && !pets_map.contains("convert_time"), "{pets_map}");
    assert!(time_map.contains("convert_time") && !time_map.contains("petstore"), "{time_map}");
    let refused = ask(&client, "capdex.v1.discover", json!({"message": MESSAGE, "workspace": "a b"})).await;
    assert_eq!(refused["code"], "bad_request", "{refused}");
}
