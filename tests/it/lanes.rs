//! Discovery on several worker threads (`[discovery] workers`): every change
//! is seen by the first discovery after its reply, whichever worker ranks it;
//! concurrent discoveries give the answers one at a time gives; `$SRV.STATS`
//! counts every request once.

use crate::serve_over_nats::{body, request};
use crate::support::nats_server::NatsServer;
use crate::support::serving::serve_at;
use futures::StreamExt;
use serde_json::{json, Value};

fn tier1_ids(result: &Value) -> Vec<String> {
    result["tier1"].as_array().unwrap().iter().map(|entry| entry["id"].as_str().unwrap().to_string()).collect()
}

async fn discover(client: &async_nats::Client, message: &str) -> Value {
    body(&request(client, "capdex.v1.discover", json!({"message": message}).to_string().into_bytes()).await)
}

#[tokio::test]
async fn every_worker_sees_each_change_once_it_is_replied_to() {
    let nats = NatsServer::start();
    let (caps, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env = [("CAPDEX_DISCOVERY_WORKERS", "4")];
    let (_served, client) = serve_at(&nats, caps.path(), data.path(), false, &env).await;
    let mut requests = 0u64;
    for round in 0..12 {
        let name = format!("flux{round}probe");
        let upsert = json!({"runtimeId": "lanes", "tools": [
            {"name": name, "description": format!("Measure the {name} of a reactor coil")}
        ]});
        let reply = body(&request(&client, "capdex.v1.capabilities.upsert", upsert.to_string().into_bytes()).await);
        assert_eq!(reply["added"], json!([format!("tool:{name}")]), "{reply}");
        let id = format!("tool:{name}");
        // Sent right after the reply, to whichever worker is free: each must see the upsert.
        for _ in 0..4 {
            let found = discover(&client, &format!("measure the {name}")).await;
            assert_eq!(tier1_ids(&found).first(), Some(&id), "round {round}: {found}");
            requests += 1;
        }
        let search = body(
            &request(&client, "capdex.v1.search", json!({"query": format!("measure {name}")}).to_string().into_bytes())
                .await,
        );
        assert_eq!(search["capabilities"][0]["id"], id.as_str(), "{search}");
        let remove = json!({"runtimeId": "lanes", "ids": [id]});
        let removed = body(&request(&client, "capdex.v1.capabilities.remove", remove.to_string().into_bytes()).await);
        assert_eq!(removed["removed"], json!([id]), "{removed}");
        for _ in 0..4 {
            let gone = discover(&client, &format!("measure the {name}")).await;
            assert!(!tier1_ids(&gone).contains(&id), "round {round}: {gone}");
            requests += 1;
        }
        // Kept for the next rounds, so the catalog grows by one each round.
        let keep = json!({"runtimeId": format!("keep{round}"), "tools": [
            {"name": format!("coil{round}gauge"), "description": "Read a coil gauge"}
        ]});
        request(&client, "capdex.v1.capabilities.upsert", keep.to_string().into_bytes()).await;
    }

    // 64 in flight across the workers: the same answers as one at a time.
    let messages: Vec<String> = (0..12).map(|round| format!("read the coil{round}gauge")).collect();
    let mut expected = Vec::new();
    for message in &messages {
        expected.push(tier1_ids(&discover(&client, message).await));
        requests += 1;
    }
    let concurrent: Vec<(usize, Vec<String>)> = futures::stream::iter((0..384).map(|i| {
        let (client, message) = (client.clone(), messages[i % messages.len()].clone());
        async move { (i % 12, tier1_ids(&discover(&client, &message).await)) }
    }))
    .buffer_unordered(64)
    .collect()
    .await;
    requests += concurrent.len() as u64;
    for (which, ids) in &concurrent {
        assert_eq!(ids, &expected[*which], "{}", messages[*which]);
        assert!(!ids.is_empty());
    }

    let stats = body(&request(&client, "$SRV.STATS.capdex", Vec::new()).await);
    let endpoint = |subject: &str| {
        stats["endpoints"].as_array().unwrap().iter().find(|e| e["subject"] == subject).unwrap().clone()
    };
    let discover_stats = endpoint("capdex.v1.discover");
    assert_eq!(discover_stats["num_requests"].as_u64(), Some(requests), "{stats}");
    assert_eq!(discover_stats["num_errors"].as_u64(), Some(0), "{stats}");
    assert_eq!(endpoint("capdex.v1.search")["num_requests"].as_u64(), Some(12), "{stats}");
}
