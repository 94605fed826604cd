//! `capdex serve` against a real nats-server: discovery, errors, outcomes,
//! KPI and alert events, dispatch, and the micro-service endpoints.

use crate::cli::examples_dir;
use crate::support::nats_server::NatsServer;
use crate::support::serving::{serve_at, KillOnDrop};
use futures::StreamExt;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

async fn serve(nats: &NatsServer) -> (KillOnDrop, async_nats::Client) {
    serve_dir(nats, &examples_dir(), false).await
}

async fn serve_dir(nats: &NatsServer, dir: &std::path::Path, watch: bool) -> (KillOnDrop, async_nats::Client) {
    let data = tempfile::tempdir().unwrap();
    let (served, client) = serve_at(nats, dir, data.path(), watch, &[]).await;
    (served.keeping(data), client)
}

pub(crate) async fn request(client: &async_nats::Client, subject: &str, payload: Vec<u8>) -> async_nats::Message {
    tokio::time::timeout(Duration::from_secs(10), client.request(subject.to_string(), payload.into()))
        .await
        .expect("reply within 10 s")
        .expect("request succeeds")
}

pub(crate) fn body(message: &async_nats::Message) -> Value {
    serde_json::from_slice(&message.payload)
        .unwrap_or_else(|err| panic!("reply is not JSON ({err}): {:?}", message.payload))
}

#[tokio::test]
async fn discover_answers_and_bad_input_gets_an_error_reply() {
    let nats = NatsServer::start();
    let (_served, client) = serve(&nats).await;

    let reply = request(
        &client,
        "capdex.v1.discover",
        json!({"message": "send a message on telegram"}).to_string().into_bytes(),
    )
    .await;
    assert!(reply.headers.as_ref().is_none_or(|h| h.get("Nats-Service-Error").is_none()));
    let result = body(&reply);
    assert_eq!(result["tier1"][0]["id"], "channel:telegram", "{result}");
    assert!(result["tokenEstimate"]["totalTokens"].as_u64().unwrap() <= 3000);

    for bad in [
        b"{not json".to_vec(),
        br#"{"message": "x", "bogus": true}"#.to_vec(),
        br#"{"message": ""}"#.to_vec(),
        br#"{"message":"x","kind":"gadget"}"#.to_vec(),
        br#"{"message":"x","config":{"topK":3}}"#.to_vec(),
        br#"{"message":"x","config":{"tier1TopK":1,"tier2TopK":2}}"#.to_vec(),
        br#"{"message":"x","config":{"lexicalWeight":1.5}}"#.to_vec(),
    ] {
        let reply = request(&client, "capdex.v1.discover", bad.clone()).await;
        let headers = reply.headers.clone().expect("error replies carry headers");
        assert_eq!(
            headers.get("Nats-Service-Error-Code").map(|v| v.as_str()),
            Some("400"),
            "{}",
            String::from_utf8_lossy(&bad)
        );
        assert!(headers.get("Nats-Service-Error").is_some());
        let error = body(&reply);
        assert_eq!(error["code"], "bad_request", "{error}");
        assert!(!error["message"].as_str().unwrap().is_empty());
    }

    // Still serving after the bad requests.
    let reply = request(
        &client,
        "capdex.v1.discover",
        json!({"query": "check the weather forecast", "kind": "skill"}).to_string().into_bytes(),
    )
    .await;
    let result = body(&reply);
    assert!(
        result["tier1"].as_array().unwrap().iter().all(|e| e["id"].as_str().unwrap().starts_with("skill:")),
        "{result}"
    );

    // Per-query settings: one Tier 1 entry, no Tier 2.
    let reply = request(
        &client,
        "capdex.v1.discover",
        json!({"message": "send a message on telegram", "config": {"tier1TopK": 1, "tier2TopK": 0}})
            .to_string()
            .into_bytes(),
    )
    .await;
    let result = body(&reply);
    assert_eq!(result["tier1"].as_array().unwrap().len(), 1, "{result}");
    assert_eq!(result["tier1"][0]["id"], "channel:telegram", "{result}");
    assert!(result["tier2"].as_array().unwrap().is_empty(), "{result}");

    let info = body(&request(&client, "$SRV.INFO.capdex", Vec::new()).await);
    let subjects: Vec<&str> =
        info["endpoints"].as_array().unwrap().iter().map(|e| e["subject"].as_str().unwrap()).collect();
    assert!(subjects.contains(&"capdex.v1.discover") && subjects.contains(&"capdex.v1.outcome"), "{info}");
    let stats = body(&request(&client, "$SRV.STATS.capdex", Vec::new()).await);
    let discover =
        stats["endpoints"].as_array().unwrap().iter().find(|e| e["subject"] == "capdex.v1.discover").unwrap().clone();
    assert_eq!(discover["num_requests"].as_u64(), Some(10), "{stats}");
}

/// Checks a discover reply's `explanations` against its Tier 1 (JSON or msgpack alike).
fn check_explanations(result: &Value) {
    let tier1 = result["tier1"].as_array().unwrap_or_else(|| panic!("no tier1: {result}"));
    let explanations = result["explanations"].as_array().unwrap_or_else(|| panic!("no explanations: {result}"));
    assert!(!tier1.is_empty(), "{result}");
    assert_eq!(explanations.len(), tier1.len(), "{result}");
    for (explanation, entry) in explanations.iter().zip(tier1) {
        assert_eq!(explanation["id"], entry["id"], "{result}");
        assert_eq!(explanation["relevance"], entry["relevance"], "{result}");
        for key in ["lexical", "graph", "prior", "fused"] {
            assert!(explanation[key].is_number(), "{key}: {explanation}");
        }
        assert!(explanation["dense"].is_number() || explanation["dense"].is_null(), "{explanation}");
        assert!(explanation["part"].is_u64() && explanation["exact"].is_boolean(), "{explanation}");
        let number = |key: &str| explanation[key].as_f64().unwrap();
        let rebuilt = ((number("fused") + number("graph")) * (1.0 + number("prior"))).clamp(0.0, 1.0);
        assert!((rebuilt - number("relevance")).abs() < 1e-4, "{explanation} rebuilds to {rebuilt}");
    }
    let first = &explanations[0];
    assert!(first["fused"].as_f64().unwrap() > 0.0 && first["lexical"].as_f64().unwrap() > 0.0, "{first}");
    assert!(first["dense"].as_f64().is_some(), "the built-in embedder gives a cosine: {first}");
}

#[tokio::test]
async fn discover_explains_its_ranking_when_asked() {
    let nats = NatsServer::start();
    let (_served, client) = serve(&nats).await;
    let message = "send a message on telegram";

    let plain =
        body(&request(&client, "capdex.v1.discover", json!({"message": message}).to_string().into_bytes()).await);
    assert!(plain.get("explanations").is_none(), "only when asked: {plain}");
    let off = json!({"message": message, "explain": false}).to_string().into_bytes();
    assert!(body(&request(&client, "capdex.v1.discover", off).await).get("explanations").is_none());

    let asked = json!({"message": message, "explain": true}).to_string().into_bytes();
    let explained = body(&request(&client, "capdex.v1.discover", asked).await);
    assert_eq!(explained["tier1"][0]["id"], "channel:telegram", "{explained}");
    check_explanations(&explained);
    // Apart from the explanations (and the timings), the reply is the plain one.
    let without = |mut result: Value| {
        let object = result.as_object_mut().unwrap();
        object.remove("explanations");
        object.get_mut("diagnostics").unwrap().as_object_mut().unwrap().remove("timings");
        result
    };
    assert_eq!(without(explained.clone()), without(plain.clone()));

    // msgpack: the same explanations.
    let packed = request_msgpack(&client, "capdex.v1.discover", &json!({"message": message, "explain": true})).await;
    assert_eq!(packed.headers.as_ref().unwrap().get("Content-Type").unwrap().as_str(), "application/msgpack");
    let packed: Value = rmp_serde::from_slice(&packed.payload).unwrap();
    check_explanations(&packed);
    // msgpack keeps each f32 as is, JSON its shortest decimal: equal as f32.
    let as_f32 = |value: &Value| value.as_f64().map(|number| number as f32);
    for (packed, json) in
        packed["explanations"].as_array().unwrap().iter().zip(explained["explanations"].as_array().unwrap())
    {
        assert_eq!(packed["id"], json["id"]);
        for key in ["relevance", "lexical", "dense", "graph", "prior", "fused"] {
            assert_eq!(as_f32(&packed[key]), as_f32(&json[key]), "{key}: {packed} {json}");
        }
    }

    // With the turn plan in the same request, the discovery is explained too.
    let with_plan = json!({"message": message, "explain": true, "plan": {}}).to_string().into_bytes();
    let planned = body(&request(&client, "capdex.v1.discover", with_plan).await);
    assert!(planned["plan"].is_object(), "{planned}");
    check_explanations(&planned);

    // `explain` must be a bool.
    let bad = request(&client, "capdex.v1.discover", br#"{"message":"x","explain":"yes"}"#.to_vec()).await;
    assert_eq!(body(&bad)["code"], "bad_request");
}

#[tokio::test]
async fn outcomes_publish_kpis_and_alerts() {
    let nats = NatsServer::start();
    let (_served, client) = serve(&nats).await;
    let mut kpis = client.subscribe("capdex.v1.kpi.>").await.unwrap();
    let mut alerts = client.subscribe("capdex.v1.alert.>").await.unwrap();
    client.flush().await.unwrap();

    for i in 0..8 {
        let outcome = json!({"turnId": format!("t{i}"), "organizationId": "acme", "personaId": "bot", "status": "failed", "capabilities": ["channel:telegram"]});
        let reply = body(&request(&client, "capdex.v1.outcome", outcome.to_string().into_bytes()).await);
        assert_eq!((&reply["accepted"], &reply["duplicate"]), (&json!(true), &json!(false)));
        assert_eq!(reply["kpi"]["sampleCount"].as_u64(), Some(i + 1));
    }
    let kpi = tokio::time::timeout(Duration::from_secs(5), kpis.next()).await.unwrap().unwrap();
    assert_eq!(kpi.subject.as_str(), "capdex.v1.kpi.acme_bot");
    let kpi = body(&kpi);
    assert_eq!(kpi["scopeKey"], "acme/bot");
    for field in [
        "sampleCount",
        "successCount",
        "partialCount",
        "failedCount",
        "successRate",
        "averageScore",
        "weightedSuccessRate",
    ] {
        assert!(kpi.get(field).is_some(), "{field} missing in {kpi}");
    }
    let alert =
        tokio::time::timeout(Duration::from_secs(5), alerts.next()).await.expect("an alert after 8 failures").unwrap();
    assert_eq!(alert.subject.as_str(), "capdex.v1.alert.critical.acme_bot");
    let alert = body(&alert);
    assert_eq!(alert["sampleCount"].as_u64(), Some(8));
    assert_eq!(alert["threshold"].as_f64().map(|t| (t * 100.0).round()), Some(55.0));

    let bad = request(&client, "capdex.v1.outcome", json!({"score": 1.5}).to_string().into_bytes()).await;
    assert_eq!(body(&bad)["code"], "bad_request");
}

#[tokio::test]
async fn dispatch_runs_echo_and_validates() {
    let nats = NatsServer::start();
    let (_served, client) = serve(&nats).await;
    let call = json!({"slug": "echo", "arguments": {"text": "hello"}, "agentId": "agent-1"});
    let first = body(&request(&client, "capdex.v1.dispatch", call.to_string().into_bytes()).await);
    assert_eq!(first, json!({"success": true, "data": {"text": "hello"}}), "{first}");

    let invalid = body(
        &request(
            &client,
            "capdex.v1.dispatch",
            json!({"slug": "echo", "arguments": {"text": 7}, "agentId": "agent-1"}).to_string().into_bytes(),
        )
        .await,
    );
    assert_eq!(invalid["error"]["code"], "invalid_args", "{invalid}");
    let unknown = body(
        &request(&client, "capdex.v1.dispatch", json!({"slug": "nope", "agentId": "a"}).to_string().into_bytes()).await,
    );
    assert_eq!(unknown["error"]["code"], "unknown_capability");
    let malformed = request(&client, "capdex.v1.dispatch", b"{\"slug\": 3}".to_vec()).await;
    assert_eq!(body(&malformed)["code"], "bad_request");
}

async fn top_ids(client: &async_nats::Client, message: &str) -> Vec<String> {
    let reply = request(client, "capdex.v1.discover", json!({ "message": message }).to_string().into_bytes()).await;
    body(&reply)["tier1"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn manifest_folders_are_hot_reloaded() {
    let nats = NatsServer::start();
    let caps = tempfile::tempdir().unwrap();
    let (_served, client) = serve_dir(&nats, caps.path(), true).await;
    let query = "translate a document into klingon";
    assert!(!top_ids(&client, query).await.contains(&"tool:klingon-translator".to_string()));

    let folder = caps.path().join("klingon");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("CAPABILITY.yaml"),
        "name: klingon-translator\nkind: tool\ndescription: Translate a document into Klingon\n",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !top_ids(&client, query).await.contains(&"tool:klingon-translator".to_string()) {
        assert!(Instant::now() < deadline, "a new capability folder was not indexed within 15 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    std::fs::remove_dir_all(&folder).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while top_ids(&client, query).await.contains(&"tool:klingon-translator".to_string()) {
        assert!(Instant::now() < deadline, "a removed capability folder stayed in the index for 15 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn sigterm_stops_the_service_cleanly() {
    let nats = NatsServer::start();
    let (mut served, _client) = serve(&nats).await;
    let pid = served.child.id().to_string();
    let status = std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(exit) = served.child.try_wait().unwrap() {
            assert!(exit.success(), "capdex serve exited with {exit} on SIGTERM");
            break;
        }
        assert!(Instant::now() < deadline, "capdex serve still running 10 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn request_msgpack(client: &async_nats::Client, subject: &str, value: &Value) -> async_nats::Message {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Content-Type", "application/msgpack");
    let payload = rmp_serde::to_vec_named(value).unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        client.request_with_headers(subject.to_string(), headers, payload.into()),
    )
    .await
    .expect("reply within 10 s")
    .expect("request succeeds")
}

#[tokio::test]
async fn runtimes_register_list_and_remove_capabilities() {
    let nats = NatsServer::start();
    let caps = tempfile::tempdir().unwrap();
    let (_served, client) = serve_dir(&nats, caps.path(), false).await;
    let mut events = client.subscribe("capdex.v1.events.index").await.unwrap();
    client.flush().await.unwrap();

    let batch = json!({
        "runtimeId": "agent-1",
        "tools": [
            {"name": "invoice-lookup", "description": "Look up an invoice by number and return its status",
             "inputSchema": {"type": "object", "properties": {"number": {"type": "string"}}, "required": ["number"]}},
            {"description": "a tool without a name"}
        ],
        "skills": [{"name": "refund-policy", "description": "Explain the refund policy", "content": "# Refunds\nWithin 30 days."}],
        "extensions": [{"name": "stripe-pack", "description": "Stripe payments pack", "available": true}],
        "channels": [{"platform": "zulip", "displayName": "Zulip"}],
        "presets": [{"presetName": "billing", "capabilityIds": ["tool:invoice-lookup", "skill:refund-policy"]}]
    });
    let reply = body(&request(&client, "capdex.v1.capabilities.upsert", batch.to_string().into_bytes()).await);
    assert_eq!(reply["added"].as_array().unwrap().len(), 4, "{reply}");
    assert!(reply["version"].as_u64().unwrap() >= 2);
    assert_eq!(reply["diagnostics"][0]["section"], "tools", "{reply}");
    assert_eq!(reply["diagnostics"][0]["field"], "name");

    let event = tokio::time::timeout(Duration::from_secs(5), events.next()).await.expect("an index event").unwrap();
    let event = body(&event);
    assert_eq!(event["origin"], "runtime:agent-1");
    assert_eq!(event["added"].as_array().unwrap().len(), 4);

    assert_eq!(
        top_ids(&client, "look up the status of invoice 42").await.first().map(String::as_str),
        Some("tool:invoice-lookup")
    );
    let again = body(&request(&client, "capdex.v1.capabilities.upsert", batch.to_string().into_bytes()).await);
    assert_eq!(again["unchanged"].as_u64(), Some(4), "{again}");

    let listed =
        body(&request(&client, "capdex.v1.capabilities.list", br#"{"origin": "runtime:agent-1"}"#.to_vec()).await);
    let ids: Vec<&str> = listed["capabilities"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 4, "{listed}");
    assert!(listed.get("next").is_none(), "one page holds them all: {listed}");
    // Page by page (`limit`, then `after` the previous page's `next`): the same ids, in order, once each.
    let mut paged = Vec::new();
    let mut after = serde_json::Value::Null;
    for _ in 0..10 {
        let ask = json!({"origin": "runtime:agent-1", "limit": 3, "after": after});
        let page = body(&request(&client, "capdex.v1.capabilities.list", ask.to_string().into_bytes()).await);
        let items = page["capabilities"].as_array().unwrap();
        assert!(!items.is_empty() && items.len() <= 3, "{page}");
        paged.extend(items.iter().map(|c| c["id"].as_str().unwrap().to_string()));
        match page.get("next") {
            Some(next) => after = next.clone(),
            None => break,
        }
    }
    assert_eq!(paged, ids, "pages of 3");
    for limit in [0, 5_001] {
        let refused = body(
            &request(&client, "capdex.v1.capabilities.list", json!({"limit": limit}).to_string().into_bytes()).await,
        );
        assert_eq!(refused["code"], "bad_request", "{refused}");
    }

    // Another runtime cannot remove agent-1's capabilities; agent-1 can, in msgpack.
    let foreign = body(
        &request(
            &client,
            "capdex.v1.capabilities.remove",
            br#"{"runtimeId": "agent-2", "ids": ["tool:invoice-lookup"]}"#.to_vec(),
        )
        .await,
    );
    assert!(foreign["removed"].as_array().unwrap().is_empty(), "{foreign}");
    let removed = request_msgpack(
        &client,
        "capdex.v1.capabilities.remove",
        &json!({"runtimeId": "agent-1", "ids": ["tool:invoice-lookup"]}),
    )
    .await;
    assert_eq!(removed.headers.as_ref().unwrap().get("Content-Type").unwrap().as_str(), "application/msgpack");
    let removed: Value = rmp_serde::from_slice(&removed.payload).unwrap();
    assert_eq!(removed["removed"], json!(["tool:invoice-lookup"]));
    assert!(!top_ids(&client, "look up the status of invoice 42").await.contains(&"tool:invoice-lookup".to_string()));

    let discover =
        request_msgpack(&client, "capdex.v1.discover", &json!({"message": "explain the refund policy"})).await;
    let result: Value = rmp_serde::from_slice(&discover.payload).unwrap();
    assert_eq!(result["tier1"][0]["id"], "skill:refund-policy", "{result}");

    let bad = request(&client, "capdex.v1.capabilities.upsert", br#"{"tools": [], "unknown": 1}"#.to_vec()).await;
    assert_eq!(body(&bad)["code"], "bad_request");
}

#[tokio::test]
async fn a_reply_over_the_payload_limit_is_an_error_not_a_silence() {
    // A server that takes 64 KiB messages, and more capabilities than one such reply lists.
    let nats = NatsServer::start_with_config("max_payload: 65536\n");
    let (_served, client) = serve(&nats).await;
    for batch in 0..4 {
        let tools: Vec<Value> = (0..200)
            .map(|i| {
                json!({"name": format!("bulk-tool-with-a-rather-long-name-{batch}-{i:03}"),
                            "description": "lists nothing in particular"})
            })
            .collect();
        let added = body(
            &request(
                &client,
                "capdex.v1.capabilities.upsert",
                json!({"runtimeId": "bulk", "tools": tools}).to_string().into_bytes(),
            )
            .await,
        );
        assert_eq!(added["added"].as_array().map(Vec::len), Some(200), "{added}");
    }
    // All 800 in one page would be over 64 KiB: the requester hears why at once, not a timeout.
    let whole = request(&client, "capdex.v1.capabilities.list", br#"{"origin": "runtime:bulk"}"#.to_vec()).await;
    let refused = body(&whole);
    assert_eq!(refused["code"], "reply_too_large", "{refused}");
    assert_eq!(
        whole.headers.unwrap().get("Nats-Service-Error-Code").map(|v| v.as_str().to_string()).as_deref(),
        Some("413")
    );
    // Smaller pages arrive.
    let page = body(
        &request(&client, "capdex.v1.capabilities.list", br#"{"origin": "runtime:bulk", "limit": 100}"#.to_vec()).await,
    );
    assert_eq!(page["capabilities"].as_array().map(Vec::len), Some(100), "{page}");
    assert!(page["next"].is_string(), "{page}");
}

#[tokio::test]
async fn hot_reload_edits_invalidations_and_restores() {
    let nats = NatsServer::start();
    let caps = tempfile::tempdir().unwrap();
    let folder = caps.path().join("forecast");
    std::fs::create_dir_all(&folder).unwrap();
    let good = "name: forecast\nkind: tool\ndescription: Weather forecast for a city\n";
    std::fs::write(folder.join("CAPABILITY.yaml"), good).unwrap();
    let (_served, client) = serve_dir(&nats, caps.path(), true).await;
    let mut events = client.subscribe("capdex.v1.events.index").await.unwrap();
    client.flush().await.unwrap();
    let summary = |client: async_nats::Client| async move {
        let reply =
            request(&client, "capdex.v1.discover", json!({"message": "forecast"}).to_string().into_bytes()).await;
        body(&reply)["tier1"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == "tool:forecast")
            .map(|e| e["summaryText"].as_str().unwrap().to_string())
    };
    let wait_for = |expected: Option<&'static str>| {
        let client = client.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let got = summary(client.clone()).await;
                let ok = match expected {
                    Some(text) => got.as_deref().is_some_and(|s| s.contains(text)),
                    None => got.is_none(),
                };
                if ok {
                    return;
                }
                assert!(Instant::now() < deadline, "waited 15 s for {expected:?}, have {got:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    wait_for(Some("Weather forecast")).await;

    // Edit: the new description reaches the index.
    std::fs::write(
        folder.join("CAPABILITY.yaml"),
        "name: forecast\nkind: tool\ndescription: Forecast of rain and sun\n",
    )
    .unwrap();
    wait_for(Some("Forecast of rain")).await;

    // Invalidate: the last good version stays, and the refusal is reported.
    std::fs::write(folder.join("CAPABILITY.yaml"), "name: forecast\nkind: tool\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let event =
            tokio::time::timeout(Duration::from_secs(15), events.next()).await.expect("an index event").unwrap();
        let event = body(&event);
        if event["refused"].as_array().is_some_and(|r| r.iter().any(|r| r["field"] == "description")) {
            break;
        }
        assert!(Instant::now() < deadline, "no refusal event");
    }
    assert!(summary(client.clone()).await.is_some_and(|s| s.contains("Forecast of rain")));

    // Restore with a SKILL-less edit of schema.json: a new parameter shows up.
    std::fs::write(
        folder.join("CAPABILITY.yaml"),
        "name: forecast\nkind: tool\ndescription: Forecast of rain and sun\n",
    )
    .unwrap();
    std::fs::write(folder.join("schema.json"), r#"{"type":"object","properties":{"city":{"type":"string"}}}"#).unwrap();
    wait_for(Some("Params: city")).await;

    // Delete: gone from the index.
    std::fs::remove_dir_all(&folder).unwrap();
    wait_for(None).await;
}

#[tokio::test]
async fn the_discover_capabilities_meta_tool_answers_on_search() {
    let nats = NatsServer::start();
    let (_served, client) = serve(&nats).await;
    let answer = body(
        &request(
            &client,
            "capdex.v1.search",
            json!({"query": "echo some text back", "kind": "tool"}).to_string().into_bytes(),
        )
        .await,
    );
    assert_eq!(answer["capabilities"][0]["id"], "tool:echo", "{answer}");
    let relevance = answer["capabilities"][0]["relevance"].as_f64().unwrap();
    assert!((0.3..=1.0).contains(&relevance), "{answer}");
    assert!(answer["totalIndexed"].as_u64().unwrap() >= 42, "{answer}");
    let tools: Vec<&str> =
        answer["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(tools.first(), Some(&"echo"), "{answer}");
    assert_eq!(tools.last(), Some(&"discover_capabilities"), "{answer}");
    assert!(answer["capabilities"].as_array().unwrap().iter().all(|c| c["kind"] == "tool"));

    let bad =
        request(&client, "capdex.v1.search", json!({"query": "x", "kind": "gadget"}).to_string().into_bytes()).await;
    assert_eq!(body(&bad)["code"], "bad_request");
}
