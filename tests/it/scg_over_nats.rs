//! The Source Capability Graph over NATS, against a real nats-server and `capdex serve`:
//! `capdex.v1.map` (documents and allowed paths, progress events on
//! `capdex.v1.events.scg`, credentials kept out of the graph), `capdex.v1.route`
//! (scoping, k), `capdex.v1.observe` (survey, filter, scope) and
//! `capdex.v1.memory.deposit` (bias up and down, shown by observe, persisted).

use crate::cli::examples_dir;
use crate::serve_over_nats::{body, request};
use crate::support::fixture;
use crate::support::nats_server::NatsServer;
use crate::support::serving::serve_at;
use futures::StreamExt;
use serde_json::{json, Value};
use std::time::Duration;

const SECRET: &str = "sk-live-7f3a9c1e5b2d4f60";

async fn call(client: &async_nats::Client, subject: &str, payload: Value) -> (Value, Option<String>) {
    let reply = request(client, subject, payload.to_string().into_bytes()).await;
    let status = reply
        .headers
        .as_ref()
        .and_then(|headers| headers.get("Nats-Service-Error-Code"))
        .map(|value| value.as_str().to_string());
    (body(&reply), status)
}

async fn ok(client: &async_nats::Client, subject: &str, payload: Value) -> Value {
    let (reply, status) = call(client, subject, payload.clone()).await;
    assert!(status.is_none(), "{subject} {payload} failed: {reply}");
    reply
}

async fn refused(client: &async_nats::Client, subject: &str, payload: Value, status: &str, code: &str) {
    let (reply, got) = call(client, subject, payload.clone()).await;
    assert_eq!(got.as_deref(), Some(status), "{subject} {payload}: {reply}");
    assert_eq!(reply["code"], code, "{subject} {payload}: {reply}");
}

fn score(route: &Value, key: &str) -> Option<f64> {
    route["recipes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|recipe| recipe["sourceKey"] == key)
        .map(|r| r["score"].as_f64().unwrap())
}

#[tokio::test]
async fn map_route_observe_and_memory_over_nats() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let roots = fixture("openapi");
    let env = [("CAPDEX_SCG_MAP_PATH_ROOTS", roots.to_str().unwrap())];
    let (served, client) = serve_at(&nats, &examples_dir(), data.path(), false, &env).await;
    let mut events = client.subscribe("capdex.v1.events.scg").await.unwrap();
    client.flush().await.unwrap();

    // A document in the request, with a connector descriptor full of credentials and a
    // security scheme and parameter example carrying the same secret.
    let mut petstore: Value =
        serde_json::from_str(&std::fs::read_to_string(roots.join("petstore.readme-oas-examples.json")).unwrap())
            .unwrap();
    petstore["components"]["securitySchemes"]["leaky"] =
        json!({"type": "apiKey", "in": "header", "name": "X-Api-Key", "x-default": SECRET});
    let connection = json!({"baseUrl": "http://127.0.0.1:9/api", "headers": {"Authorization": format!("Bearer {SECRET}")},
                            "apiKey": SECRET, "oauth": {"clientSecret": SECRET}});
    let report = ok(
        &client,
        "capdex.v1.map",
        json!({"sourceId": "petstore", "document": petstore, "workspaces": ["pets"], "connection": connection}),
    )
    .await;
    assert_eq!(report["kind"], "openapi");
    assert_eq!(report["changed"], true);
    assert_eq!(report["connection"]["credentialFields"], 4, "{report}");
    assert!(report["nodeCounts"]["capability"].as_u64().unwrap() > 10, "{report}");
    let phases: Vec<&str> = report["phaseMs"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(phases.len(), 5, "{report}");

    // Progress: started and done for each of the five phases, in pipeline order.
    let mut seen = Vec::new();
    while seen.len() < 10 {
        let message = tokio::time::timeout(Duration::from_secs(10), events.next()).await.expect("an event").unwrap();
        let event: Value = serde_json::from_slice(&message.payload).unwrap();
        assert_eq!(event["sourceId"], "petstore");
        assert!(!String::from_utf8_lossy(&message.payload).contains(SECRET), "an event carries the secret");
        seen.push(format!("{}:{}", event["phase"].as_str().unwrap(), event["status"].as_str().unwrap()));
    }
    let expected: Vec<String> = ["connect", "introspect", "parse", "link", "finalize"]
        .iter()
        .flat_map(|phase| [format!("{phase}:started"), format!("{phase}:done")])
        .collect();
    assert_eq!(seen, expected);

    // A path below scg.map_path_roots is read on the server; others are refused.
    let gitea = ok(
        &client,
        "capdex.v1.map",
        json!({"sourceId": "gitea", "path": roots.join("gitea.io.json").to_str().unwrap(), "workspaces": ["dev"]}),
    )
    .await;
    assert_eq!(gitea["sources"], 2);
    refused(&client, "capdex.v1.map", json!({"sourceId": "x", "path": "/etc/passwd"}), "403", "path_not_allowed").await;
    let escape = roots.join("../sql/chinook.sqlite-ddl.sql");
    refused(&client, "capdex.v1.map", json!({"sourceId": "x", "path": escape}), "403", "path_not_allowed").await;
    refused(&client, "capdex.v1.map", json!({"sourceId": "a#b", "document": "{}"}), "400", "invalid_source_id").await;
    refused(&client, "capdex.v1.map", json!({"sourceId": "x", "document": "CREATE TABLE (;"}), "400", "sql").await;
    refused(&client, "capdex.v1.map", json!({"sourceId": "x"}), "400", "bad_request").await;
    // Failed phases are reported as events too, with the error code.
    let mut failures = Vec::new();
    while failures.len() < 3 {
        let message = tokio::time::timeout(Duration::from_secs(10), events.next()).await.expect("an event").unwrap();
        let event: Value = serde_json::from_slice(&message.payload).unwrap();
        if event["status"] == "failed" {
            failures.push(format!("{}:{}", event["phase"].as_str().unwrap(), event["error"]["code"].as_str().unwrap()));
        }
    }
    assert_eq!(failures, ["introspect:path_not_allowed", "introspect:path_not_allowed", "connect:invalid_source_id"]);
    refused(
        &client,
        "capdex.v1.map",
        json!({"sourceId": "x", "document": "{}", "connection": "token"}),
        "400",
        "bad_connection",
    )
    .await;

    // Route: default k, bounds, scope.
    let all = ok(&client, "capdex.v1.route", json!({"query": "find pets by status"})).await;
    let recipes = all["recipes"].as_array().unwrap();
    assert!(!recipes.is_empty() && recipes.len() <= 5, "{all}");
    assert!(recipes[0]["sourceKey"].as_str().unwrap().starts_with("petstore#"), "{all}");
    let dev =
        ok(&client, "capdex.v1.route", json!({"query": "find pets by status", "workspace": "dev", "k": 50})).await;
    assert!(dev["recipes"].as_array().unwrap().iter().all(|recipe| {
        recipe["steps"].as_array().unwrap().iter().all(|step| step.as_str().unwrap().starts_with("gitea#"))
    }));
    let nobody = ok(&client, "capdex.v1.route", json!({"query": "find pets by status", "workspace": "nobody"})).await;
    assert_eq!(nobody["recipes"], json!([]));
    for k in [0, 51] {
        refused(&client, "capdex.v1.route", json!({"query": "pets", "k": k}), "400", "bad_request").await;
    }
    refused(&client, "capdex.v1.route", json!({"query": "  "}), "400", "bad_request").await;

    // Observe: a survey for a large node, then a filter; scoped.
    let survey = ok(&client, "capdex.v1.observe", json!({"node": "gitea"})).await;
    assert!(survey["nEdges"].as_u64().unwrap() > 40 && survey["edges"].is_null(), "{survey}");
    let counts: u64 = survey["survey"].as_array().unwrap().iter().map(|row| row["count"].as_u64().unwrap()).sum();
    assert_eq!(counts, survey["nEdges"].as_u64().unwrap());
    let exposes = ok(&client, "capdex.v1.observe", json!({"node": "gitea", "edgeKinds": ["exposes"]})).await;
    let listed = exposes["edges"].as_array().unwrap();
    assert!(!listed.is_empty() && listed.iter().all(|edge| edge["kind"] == "exposes" && edge["direction"] == "out"));
    refused(&client, "capdex.v1.observe", json!({"node": "gitea", "workspace": "pets"}), "404", "not_found").await;
    refused(&client, "capdex.v1.observe", json!({"node": "gitea", "edgeKinds": ["LIKES"]}), "400", "bad_request").await;

    // Memory: a positive note lifts a recipe, a dead end sinks another; observe shows them.
    let query = json!({"query": "find pets by status", "k": 50, "workspace": "pets"});
    let before = ok(&client, "capdex.v1.route", query.clone()).await;
    // Two recipes neither of which is a step of the other, so each note touches only its own.
    let ranked = before["recipes"].as_array().unwrap();
    let steps = |recipe: &Value| -> Vec<String> {
        recipe["steps"].as_array().unwrap().iter().map(|step| step.as_str().unwrap().to_string()).collect()
    };
    let down_recipe = &ranked[0];
    let down = down_recipe["sourceKey"].as_str().unwrap().to_string();
    let up_recipe = ranked
        .iter()
        .rev()
        .find(|recipe| {
            let key = recipe["sourceKey"].as_str().unwrap().to_string();
            !steps(recipe).contains(&down) && !steps(down_recipe).contains(&key) && key != down
        })
        .expect("two unrelated recipes");
    let up = up_recipe["sourceKey"].as_str().unwrap().to_string();
    let (up, down) = (up.as_str(), down.as_str());
    let deposit = |content: &str, polarity: &str, anchor: &str| json!({"content": content, "polarity": polarity, "anchors": [anchor], "workspace": "pets"});
    let note = ok(&client, "capdex.v1.memory.deposit", deposit("this pathway found the pets", "positive", up)).await;
    assert_eq!(note["merged"], false);
    assert_eq!(note["note"]["labels"], json!(["ws:pets"]));
    ok(&client, "capdex.v1.memory.deposit", deposit("this pathway found no pets", "dead_end", down)).await;
    let again = ok(&client, "capdex.v1.memory.deposit", deposit("this pathway found the pets", "positive", up)).await;
    assert_eq!((again["merged"].clone(), again["note"]["count"].clone()), (json!(true), json!(2)));
    let after = ok(&client, "capdex.v1.route", query.clone()).await;
    assert!(score(&after, up).unwrap() > score(&before, up).unwrap(), "{before}\n{after}");
    assert!(score(&after, down).unwrap() < score(&before, down).unwrap(), "{before}\n{after}");
    let observed = ok(&client, "capdex.v1.observe", json!({"node": up})).await;
    assert_eq!(observed["notes"][0]["polarity"], "positive", "{observed}");
    refused(
        &client,
        "capdex.v1.memory.deposit",
        json!({"content": "x", "polarity": "positive", "anchors": [up], "workspace": "pets", "session": "s"}),
        "400",
        "bad_request",
    )
    .await;
    refused(&client, "capdex.v1.memory.deposit", deposit("x", "positive", "petstore#nothing"), "404", "unknown_anchor")
        .await;
    // A workspace-bound deposit cannot anchor a source the workspace did not enable.
    refused(
        &client,
        "capdex.v1.memory.deposit",
        deposit("x", "positive", "gitea#issueGetComments"),
        "404",
        "unknown_anchor",
    )
    .await;
    refused(
        &client,
        "capdex.v1.memory.deposit",
        json!({"content": "x", "polarity": "maybe", "anchors": [up], "session": "s"}),
        "400",
        "bad_request",
    )
    .await;
    let session = json!({"content": "gitea comments work", "polarity": "positive", "anchors": ["gitea#issueGetComments"], "session": "chat-1"});
    assert_eq!(ok(&client, "capdex.v1.memory.deposit", session).await["note"]["labels"], json!(["session:chat-1"]));

    // No credential reaches any reply.
    for node in ["petstore", "petstore#Pet", up, down] {
        let observed = ok(&client, "capdex.v1.observe", json!({"node": node, "edgeKinds": []})).await;
        assert!(!observed.to_string().contains(SECRET), "{node}: {observed}");
    }
    assert!(!after.to_string().contains(SECRET));

    // Everything persists: after a restart the notes still bias routes and show in observe,
    // and no stored byte holds the secret.
    drop(served);
    let mut stored = Vec::new();
    for entry in walk(data.path()) {
        stored.extend(std::fs::read(entry).unwrap());
    }
    assert!(!stored.windows(SECRET.len()).any(|window| window == SECRET.as_bytes()), "the secret is in the data dir");
    assert!(
        stored.windows(b"findPetsByTags".len()).any(|window| window == b"findPetsByTags"),
        "the data dir holds the graph"
    );
    let (_served, client) = serve_at(&nats, &examples_dir(), data.path(), false, &env).await;
    let restarted = ok(&client, "capdex.v1.route", query).await;
    assert!((score(&restarted, up).unwrap() - score(&after, up).unwrap()).abs() < 1e-3, "{restarted}\n{after}");
    let observed = ok(&client, "capdex.v1.observe", json!({"node": down})).await;
    assert_eq!(observed["notes"][0]["polarity"], "dead_end", "{observed}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
