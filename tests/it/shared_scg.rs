//! Several nodes, one Source Capability Graph and one set of live sources:
//! three `capdex serve` processes on one nats-server with JetStream, requests
//! spread by the queue group. A source mapped through one node is routed by
//! the others; a memory note deposited through one biases routes on the
//! others; a live source added through one is listed, discovered and called
//! through the others (each connects to the upstream itself) and removed
//! everywhere by a remove through any; a node started later, or restarted
//! after missing changes, catches up before it serves.
//!
//! Each test prints how long a change took to be seen through another node
//! (`shared-state latency`), measured from the reply of the request that made it.

use crate::cli::examples_dir;
use crate::multinode::wait_for_nodes;
use crate::support::fixture;
use crate::support::nats_server::NatsServer;
use crate::support::serving::KillOnDrop;
use crate::support::upstreams;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The value of the environment variable a shared source's settings name as a template.
const SECRET: &str = "sk-shared-2b9e7d41";

/// How long a change may take to show up through another node.
const EVENTUALLY: Duration = Duration::from_secs(10);

/// One `capdex serve` node with its own data dir, killed (SIGKILL) when dropped.
struct Node {
    child: Option<KillOnDrop>,
    name: &'static str,
    data: tempfile::TempDir,
}

impl Node {
    fn new(name: &'static str) -> Node {
        Node { name, data: tempfile::tempdir().unwrap(), child: None }
    }

    fn start(&mut self, nats: &NatsServer) {
        // The stdio MCP servers the live sources start are found on PATH, as an operator installs them.
        let python_bin = upstreams::mcp_server_time().parent().unwrap().to_path_buf();
        let path = format!("{}:{}", python_bin.display(), std::env::var("PATH").unwrap_or_default());
        let child = crate::cli::capdex()
            .arg("serve")
            .env("CAPDEX_NATS_URL", nats.url())
            .env("CAPDEX_DATA_DIR", self.data.path())
            .env("CAPDEX_CAPABILITY_DIRS", examples_dir())
            .env("CAPDEX_WATCH", "false")
            .env("CAPDEX_JETSTREAM_NODE_NAME", self.name)
            .env("CAPDEX_METRICS_LISTEN_ADDR", "")
            .env("PATH", path)
            .env("CAPDEX_SECRET_SHARED_TEST", SECRET)
            .stdout(Stdio::null())
            .spawn()
            .expect("capdex serve starts");
        self.child = Some(KillOnDrop::new(child));
    }

    fn kill_9(&mut self) {
        if let Some(child) = self.child.take() {
            child.kill_9();
        }
    }
}

/// One reply: the node that sent it, its body, and its error code, if any.
struct Reply {
    node: String,
    body: Value,
    error: Option<String>,
}

async fn ask(client: &async_nats::Client, subject: &str, payload: &Value) -> Reply {
    let reply =
        tokio::time::timeout(Duration::from_secs(60), client.request(subject.to_string(), payload.to_string().into()))
            .await
            .unwrap_or_else(|_| panic!("{subject} answered within 60 s"))
            .unwrap_or_else(|err| panic!("{subject}: {err}"));
    let header = |name: &str| {
        reply.headers.as_ref().and_then(|headers| headers.get(name)).map(|value| value.as_str().to_string())
    };
    let node = header("Capdex-Node").expect("replies name their node");
    let error = header("Nats-Service-Error-Code");
    Reply { node, body: serde_json::from_slice(&reply.payload).expect("a JSON reply"), error }
}

async fn ok(client: &async_nats::Client, subject: &str, payload: Value) -> Reply {
    let reply = ask(client, subject, &payload).await;
    assert!(reply.error.is_none(), "{subject} {payload} failed on {}: {}", reply.node, reply.body);
    reply
}

/// Asks `subject` until every node in `nodes` has answered once with a body
/// that `holds`; answers how long it took until the first of them did.
async fn seen_by<F>(client: &async_nats::Client, subject: &str, payload: Value, nodes: &[&str], holds: F) -> Duration
where
    F: Fn(&Value) -> bool,
{
    let started = Instant::now();
    let mut first = None;
    let mut waiting: BTreeSet<&str> = nodes.iter().copied().collect();
    while !waiting.is_empty() {
        let reply = ask(client, subject, &payload).await;
        if reply.error.is_none() && holds(&reply.body) && waiting.remove(reply.node.as_str()) {
            first.get_or_insert(started.elapsed());
        }
        assert!(
            started.elapsed() < EVENTUALLY,
            "{subject} {payload}: {waiting:?} did not see the change within {EVENTUALLY:?}; last from {}: {}",
            reply.node,
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.expect("seen once")
}

fn others<'a>(all: &[&'a str], but: &str) -> Vec<&'a str> {
    all.iter().copied().filter(|node| *node != but).collect()
}

fn recipe_keys(route: &Value) -> Vec<String> {
    route["recipes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|recipe| recipe["sourceKey"].as_str().unwrap().to_string())
        .collect()
}

fn score(route: &Value, key: &str) -> Option<f64> {
    let recipes = route["recipes"].as_array()?;
    recipes.iter().find(|recipe| recipe["sourceKey"] == key).and_then(|recipe| recipe["score"].as_f64())
}

fn millis(samples: &[Duration]) -> String {
    let mut ms: Vec<f64> = samples.iter().map(|sample| sample.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let p50 = ms[ms.len() / 2];
    format!("n={} p50={p50:.0} ms max={:.0} ms all={ms:.0?}", ms.len(), ms[ms.len() - 1])
}

/// A small SQL schema whose table is its own source id, so each map is distinct.
fn schema(table: &str) -> String {
    format!(
        "CREATE TABLE {table} (id INT PRIMARY KEY, customer_email TEXT, invoice_total NUMERIC, shipped_at TIMESTAMP);"
    )
}

#[tokio::test]
async fn a_map_and_a_note_on_one_node_are_routed_on_every_node() {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut nodes = [Node::new("a"), Node::new("b"), Node::new("c")];
    for node in nodes.iter_mut() {
        node.start(&nats);
    }
    wait_for_nodes(&client, 3).await;
    let names = ["a", "b", "c"];

    // Mapped through one node, routed through each of the others; timed from the map's reply.
    let petstore: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("openapi").join("petstore.readme-oas-examples.json")).unwrap(),
    )
    .unwrap();
    let mapped =
        ok(&client, "capdex.v1.map", json!({"sourceId": "petstore", "document": petstore, "workspaces": ["pets"]}))
            .await;
    assert_eq!(mapped.body["workspaces"], json!(["pets"]), "{}", mapped.body);
    let query = json!({"query": "find pets by status", "k": 50, "workspace": "pets"});
    let has_petstore = |route: &Value| recipe_keys(route).iter().any(|key| key.starts_with("petstore#"));
    let mut samples =
        vec![seen_by(&client, "capdex.v1.route", query.clone(), &others(&names, &mapped.node), has_petstore).await];
    for at in 0..5 {
        let table = format!("orders_{at}");
        let mapped = ok(&client, "capdex.v1.map", json!({"sourceId": table, "document": schema(&table)})).await;
        let route = json!({"query": format!("{table} invoice total"), "k": 50});
        let prefix = format!("{table}#");
        let has_table = |route: &Value| recipe_keys(route).iter().any(|key| key.starts_with(&prefix));
        samples.push(seen_by(&client, "capdex.v1.route", route, &others(&names, &mapped.node), has_table).await);
    }
    eprintln!("shared-state latency, map reply → route on another node: {}", millis(&samples));
    let bucket = async_nats::jetstream::new(client.clone()).get_key_value("CAPDEX_SCG").await.unwrap();
    let size = |key: &str| {
        let bucket = bucket.clone();
        let key = key.to_string();
        async move { bucket.get(&key).await.unwrap().expect("shared").len() }
    };
    let (petstore_bytes, table_bytes) = (size("source.petstore").await, size("source.orders_0").await);
    eprintln!("shared value sizes: petstore {petstore_bytes} bytes (spec 25,723 bytes), orders_0 {table_bytes} bytes");
    assert!(petstore_bytes > table_bytes, "{petstore_bytes} {table_bytes}");

    // The mapped operations are discoverable through every node, under the id route gives.
    let discover = json!({"message": "find pets by status"});
    let lists_pets =
        |result: &Value| result["tier1"].as_array().unwrap().iter().any(|e| e["id"] == "petstore#findPetsByStatus");
    seen_by(&client, "capdex.v1.discover", discover, &names, lists_pets).await;

    // A re-map through any node adds a workspace: every node keeps both.
    let remap =
        ok(&client, "capdex.v1.map", json!({"sourceId": "petstore", "document": petstore, "workspaces": ["ops"]}))
            .await;
    assert_eq!(remap.body["workspaces"], json!(["ops", "pets"]), "{}", remap.body);
    let in_ops = json!({"query": "find pets by status", "k": 50, "workspace": "ops"});
    seen_by(&client, "capdex.v1.route", in_ops, &names, has_petstore).await;
    seen_by(&client, "capdex.v1.route", query.clone(), &names, has_petstore).await;

    // A dead-end note deposited through one node sinks the recipe on every other node.
    let before = ok(&client, "capdex.v1.route", query.clone()).await.body;
    let top = recipe_keys(&before)[0].clone();
    let top_before = score(&before, &top).unwrap();
    let deposit =
        json!({"content": "this pathway found no pets", "polarity": "dead_end", "anchors": [top], "workspace": "pets"});
    let deposited = ok(&client, "capdex.v1.memory.deposit", deposit.clone()).await;
    assert_eq!((deposited.body["merged"].clone(), deposited.body["note"]["count"].clone()), (json!(false), json!(1)));
    let sunk = |route: &Value| score(route, &top).is_some_and(|now| now < top_before - 1e-6);
    let note_latency = seen_by(&client, "capdex.v1.route", query.clone(), &others(&names, &deposited.node), sunk).await;
    eprintln!("shared-state latency, deposit reply → biased route on another node: {note_latency:?}");
    // The same note again, through whichever node, is one note deposited twice across the cluster.
    let again = ok(&client, "capdex.v1.memory.deposit", deposit.clone()).await;
    assert_eq!((again.body["merged"].clone(), again.body["note"]["count"].clone()), (json!(true), json!(2)));
    let observed =
        |result: &Value| result["notes"].as_array().is_some_and(|notes| notes.iter().any(|n| n["count"] == 2));
    seen_by(&client, "capdex.v1.observe", json!({"node": top}), &names, observed).await;

    // A node started later catches up before it serves: alone, it routes and biases as the others did.
    let mut late = Node::new("d");
    late.start(&nats);
    wait_for_nodes(&client, 4).await;
    for node in nodes.iter_mut() {
        node.kill_9();
    }
    wait_for_nodes(&client, 1).await;
    let route = ok(&client, "capdex.v1.route", query.clone()).await;
    assert_eq!(route.node, "d");
    assert!(sunk(&route.body), "the late node has the note: {}", route.body);
    let ops =
        ok(&client, "capdex.v1.route", json!({"query": "find pets by status", "k": 50, "workspace": "ops"})).await;
    assert!(has_petstore(&ops.body), "{}", ops.body);
    let tables = ok(&client, "capdex.v1.route", json!({"query": "orders_4 invoice total", "k": 50})).await;
    assert!(recipe_keys(&tables.body).iter().any(|key| key.starts_with("orders_4#")), "{}", tables.body);
    drop(late);
}

fn source_state(list: &Value, id: &str) -> Option<String> {
    let sources = list["sources"].as_array()?;
    sources.iter().find(|source| source["id"] == id).map(|source| source["state"].as_str().unwrap_or("").to_string())
}

#[tokio::test]
async fn a_live_source_added_on_one_node_is_served_by_every_node() {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let (mut a, mut b, mut c) = (Node::new("a"), Node::new("b"), Node::new("c"));
    a.start(&nats);
    b.start(&nats);
    wait_for_nodes(&client, 2).await;
    let names = ["a", "b"];

    // Added through one node (templates stay templates), served by both: listed, discovered, called.
    let time = json!({"id": "time", "kind": "mcp", "command": "mcp-server-time", "args": ["--local-timezone", "UTC"],
                      "env": {"TIME_TOKEN": "${env:CAPDEX_SECRET_SHARED_TEST}"}});
    let added = ok(&client, "capdex.v1.sources.add", time.clone()).await;
    assert_eq!(added.body["source"]["state"], "connected", "{}", added.body);
    let connected = |list: &Value| source_state(list, "time").as_deref() == Some("connected");
    let listed = seen_by(&client, "capdex.v1.sources.list", json!({}), &others(&names, &added.node), connected).await;
    let finds_time =
        |result: &Value| result["tier1"].as_array().unwrap().iter().any(|entry| entry["id"] == "time#get_current_time");
    let message = json!({"message": "what time is it now in Tokyo"});
    let discovered = seen_by(&client, "capdex.v1.discover", message.clone(), &names, finds_time).await;
    let call =
        json!({"slug": "time#get_current_time", "arguments": {"timezone": "Asia/Tokyo"}, "agentId": "shared-test"});
    let answered =
        |answer: &Value| answer["success"] == true && answer["data"]["structuredContent"]["timezone"] == "Asia/Tokyo";
    seen_by(&client, "capdex.v1.dispatch", call.clone(), &names, answered).await;
    eprintln!("shared-state latency, sources.add reply → listed connected on another node: {listed:?}; discovered: {discovered:?}");

    // The bucket holds the settings as given: the template, never the secret it stands for.
    let bucket = async_nats::jetstream::new(client.clone()).get_key_value("CAPDEX_SOURCES").await.unwrap();
    let stored = bucket.get("source.time").await.unwrap().expect("the definition is shared");
    let stored = String::from_utf8(stored.to_vec()).unwrap();
    assert!(stored.contains("${env:CAPDEX_SECRET_SHARED_TEST}") && !stored.contains(SECRET), "{stored}");

    // A few more adds, timed until another node's catalog offers the source's tools.
    let mut samples = Vec::new();
    for at in 0..5 {
        let id = format!("clock{at}");
        let source =
            json!({"id": id, "kind": "mcp", "command": "mcp-server-time", "args": ["--local-timezone", "UTC"]});
        let added = ok(&client, "capdex.v1.sources.add", source).await;
        let offered = |list: &Value| list["capabilities"].as_array().is_some_and(|caps| !caps.is_empty());
        let origin = json!({"origin": format!("source:{id}")});
        samples
            .push(seen_by(&client, "capdex.v1.capabilities.list", origin, &others(&names, &added.node), offered).await);
    }
    eprintln!("shared-state latency, sources.add reply → tools in another node's catalog: {}", millis(&samples));

    // A node started later serves the source too; a removal through any node removes it everywhere.
    c.start(&nats);
    wait_for_nodes(&client, 3).await;
    a.kill_9();
    wait_for_nodes(&client, 2).await;
    let names = ["b", "c"];
    seen_by(&client, "capdex.v1.sources.list", json!({}), &["c"], connected).await;
    seen_by(&client, "capdex.v1.dispatch", call.clone(), &["c"], answered).await;
    let removed = ok(&client, "capdex.v1.sources.remove", json!({"id": "time"})).await;
    assert_eq!(removed.body["removed"], "time");
    let gone = |list: &Value| source_state(list, "time").is_none();
    seen_by(&client, "capdex.v1.sources.list", json!({}), &others(&names, &removed.node), gone).await;
    seen_by(&client, "capdex.v1.discover", message.clone(), &names, |result| !finds_time(result)).await;
    let unknown = ask(&client, "capdex.v1.sources.remove", &json!({"id": "time"})).await;
    assert_eq!(unknown.body["code"], "unknown_source", "{}", unknown.body);

    // a kept `time` in its store while it was down: restarted, it removes it before it serves.
    a.start(&nats);
    wait_for_nodes(&client, 3).await;
    b.kill_9();
    c.kill_9();
    wait_for_nodes(&client, 1).await;
    let list = ask(&client, "capdex.v1.sources.list", &json!({})).await;
    assert_eq!(list.node, "a");
    assert!(gone(&list.body), "{}", list.body);
    assert!(source_state(&list.body, "clock4").is_some(), "the sources added while it was up stay: {}", list.body);
}
