//! Several nodes: two `capdex serve` processes on one nats-server with
//! JetStream share runtime registrations through the index log, keep answering
//! while either is killed with SIGKILL, catch up on restart from the sequence
//! they stored, and count every outcome of the outcome stream exactly once.

use crate::cli::capdex;
use crate::serve_over_nats::body;
use crate::support::nats_server::NatsServer;
use crate::support::serving::KillOnDrop;
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// How long a change may take to show up on another node.
const EVENTUALLY: Duration = Duration::from_secs(10);
const SCOPES: [&str; 3] = ["p0", "p1", "p2"];
const PER_SCOPE: u64 = 100;

/// One `capdex serve` node with its own data dir, killed (SIGKILL) when dropped
/// (`child` comes first, so it is gone before its folders are removed).
struct Node {
    child: Option<KillOnDrop>,
    name: &'static str,
    data: tempfile::TempDir,
    caps: tempfile::TempDir,
}

impl Node {
    fn new(name: &'static str) -> Node {
        Node { name, data: tempfile::tempdir().unwrap(), caps: tempfile::tempdir().unwrap(), child: None }
    }

    fn start(&mut self, nats: &NatsServer) {
        let child = capdex()
            .arg("serve")
            .env("CAPDEX_NATS_URL", nats.url())
            .env("CAPDEX_DATA_DIR", self.data.path())
            .env("CAPDEX_CAPABILITY_DIRS", self.caps.path())
            .env("CAPDEX_WATCH", "false")
            .env("CAPDEX_JETSTREAM_NODE_NAME", self.name)
            .env("CAPDEX_KPI_ROLLING_WINDOW_SIZE", "1000")
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

    /// Every KPI this node's data dir holds, as `(scope, sampleCount)`; the node must be stopped.
    fn stored_sample_counts(&self) -> Vec<(String, u64)> {
        let output = capdex()
            .args(["kpi", "--json", "--data-dir"])
            .arg(self.data.path())
            .env("CAPDEX_KPI_ROLLING_WINDOW_SIZE", "1000")
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let kpis: Value = serde_json::from_slice(&output.stdout).unwrap();
        kpis.as_array()
            .unwrap()
            .iter()
            .map(|kpi| (kpi["scopeKey"].as_str().unwrap().to_string(), kpi["sampleCount"].as_u64().unwrap()))
            .collect()
    }
}

/// The names of the nodes answering `$SRV.PING.capdex` now.
async fn responders(client: &async_nats::Client) -> BTreeSet<String> {
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.unwrap();
    client.publish_with_reply("$SRV.PING.capdex", inbox, "".into()).await.unwrap();
    client.flush().await.unwrap();
    let mut ids = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
    while let Ok(Some(reply)) = tokio::time::timeout_at(deadline, replies.next()).await {
        // With no capdex up, the server answers "no responders" with an empty message.
        if let Ok(ping) = serde_json::from_slice::<Value>(&reply.payload) {
            ids.insert(ping["id"].as_str().unwrap().to_string());
        }
    }
    ids
}

/// Waits until exactly `count` capdex nodes answer pings.
pub(crate) async fn wait_for_nodes(client: &async_nats::Client, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while responders(client).await.len() != count {
        assert!(Instant::now() < deadline, "{count} capdex nodes did not come up within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends a request; returns the name of the node that answered and the JSON body.
pub(crate) async fn ask(client: &async_nats::Client, subject: &str, payload: Value) -> (String, Value) {
    let reply =
        tokio::time::timeout(Duration::from_secs(10), client.request(subject.to_string(), payload.to_string().into()))
            .await
            .expect("reply within 10 s")
            .expect("request succeeds");
    let node = reply
        .headers
        .as_ref()
        .and_then(|headers| headers.get("Capdex-Node"))
        .map(|value| value.as_str().to_string())
        .expect("replies name their node");
    (node, body(&reply))
}

fn tool(name: &str, description: &str) -> Value {
    json!({"runtimeId": "agent-1", "tools": [{"name": name, "description": description}]})
}

fn tier1_ids(result: &Value) -> Vec<String> {
    result["tier1"].as_array().unwrap().iter().map(|entry| entry["id"].as_str().unwrap().to_string()).collect()
}

/// Polls discover until a reply from a node other than `not_from` (when given)
/// has `id` in Tier 1; panics after [`EVENTUALLY`].
async fn discoverable(client: &async_nats::Client, query: &str, id: &str, not_from: Option<&str>) -> String {
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        let (node, result) = ask(client, "capdex.v1.discover", json!({"message": query})).await;
        if not_from != Some(node.as_str()) && tier1_ids(&result).contains(&id.to_string()) {
            return node;
        }
        assert!(
            Instant::now() < deadline,
            "{id} not discoverable through another node within {EVENTUALLY:?}: {result}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn nodes_share_registrations_survive_kill_9_and_catch_up_on_restart() {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let (mut a, mut b) = (Node::new("a"), Node::new("b"));
    a.start(&nats);
    b.start(&nats);
    wait_for_nodes(&client, 2).await;

    // Upserted through one node, discoverable through the other.
    let (upserted_by, reply) = ask(
        &client,
        "capdex.v1.capabilities.upsert",
        tool("invoice-lookup", "Look up an invoice by number and return its payment status"),
    )
    .await;
    assert_eq!(reply["added"], json!(["tool:invoice-lookup"]), "{reply}");
    let other =
        discoverable(&client, "look up invoice payment status", "tool:invoice-lookup", Some(&upserted_by)).await;
    assert_ne!(other, upserted_by);

    // Kill -9 b: a keeps answering, and takes a mutation b misses.
    b.kill_9();
    wait_for_nodes(&client, 1).await;
    let (node, reply) = ask(
        &client,
        "capdex.v1.capabilities.upsert",
        tool("weather-forecast", "Forecast the weather for a city over the next days"),
    )
    .await;
    assert_eq!((node.as_str(), &reply["added"]), ("a", &json!(["tool:weather-forecast"])), "{reply}");
    let (node, reply) =
        ask(&client, "capdex.v1.capabilities.remove", json!({"runtimeId": "agent-1", "ids": ["tool:invoice-lookup"]}))
            .await;
    assert_eq!((node.as_str(), &reply["removed"]), ("a", &json!(["tool:invoice-lookup"])), "{reply}");

    // b restarts from its stored sequence and catches up before it serves; then a dies and b answers alone.
    b.start(&nats);
    wait_for_nodes(&client, 2).await;
    a.kill_9();
    wait_for_nodes(&client, 1).await;
    let (node, result) = ask(&client, "capdex.v1.discover", json!({"message": "weather forecast for a city"})).await;
    assert_eq!(node, "b");
    assert!(tier1_ids(&result).contains(&"tool:weather-forecast".to_string()), "{result}");
    let (_, listed) = ask(&client, "capdex.v1.capabilities.list", json!({"origin": "runtime:agent-1"})).await;
    let ids: Vec<&str> = listed["capabilities"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["tool:weather-forecast"], "{listed}");

    // And a, restarted, has everything b took while it was down.
    let (node, _) = ask(
        &client,
        "capdex.v1.capabilities.upsert",
        tool("currency-convert", "Convert an amount of money between currencies"),
    )
    .await;
    assert_eq!(node, "b");
    a.start(&nats);
    wait_for_nodes(&client, 2).await;
    b.kill_9();
    wait_for_nodes(&client, 1).await;
    let (node, result) =
        ask(&client, "capdex.v1.discover", json!({"message": "convert money between currencies"})).await;
    assert_eq!(node, "a");
    assert!(tier1_ids(&result).contains(&"tool:currency-convert".to_string()), "{result}");
}

fn outcome(persona: &str, turn: u64) -> (String, Vec<u8>) {
    let turn_id = format!("{persona}-t{turn}");
    let status = if turn.is_multiple_of(5) { "failed" } else { "success" };
    let report = json!({"turnId": turn_id, "organizationId": "acme", "personaId": persona, "status": status});
    (turn_id, report.to_string().into_bytes())
}

/// Publishes outcomes `turns` of every scope with JetStream, each with its turnId as Nats-Msg-Id.
async fn publish_outcomes(jetstream: &async_nats::jetstream::Context, turns: std::ops::Range<u64>) {
    let sends = SCOPES.iter().flat_map(|persona| turns.clone().map(move |turn| outcome(persona, turn)));
    let acks: Vec<()> = futures::stream::iter(sends)
        .map(|(turn_id, payload)| async move {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", turn_id.as_str());
            let ack = jetstream.publish_with_headers("capdex.v1.js.outcome", headers, payload.into()).await.unwrap();
            ack.await.expect("JetStream stores the outcome");
        })
        .buffer_unordered(64)
        .collect()
        .await;
    assert_eq!(acks.len() as u64, turns.end.saturating_sub(turns.start) * SCOPES.len() as u64);
}

/// Waits until the durable consumer of node `name` has nothing pending or unacknowledged.
async fn drained(jetstream: &async_nats::jetstream::Context, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stream = jetstream.get_stream("CAPDEX_OUTCOMES").await.unwrap();
        let consumer: Result<async_nats::jetstream::consumer::PullConsumer, _> =
            stream.get_consumer(&format!("capdex-kpi-{name}")).await;
        if let Ok(consumer) = consumer {
            let info = consumer.get_info().await.unwrap();
            if info.num_pending == 0 && info.num_ack_pending == 0 && info.delivered.stream_sequence > 0 {
                return;
            }
        }
        assert!(Instant::now() < deadline, "node {name} did not record every outcome within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A nats-server, a client with its JetStream context, and nodes `a` and `b` serving.
async fn two_nodes() -> (NatsServer, async_nats::Client, async_nats::jetstream::Context, Node, Node) {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let jetstream = async_nats::jetstream::new(client.clone());
    let (mut a, mut b) = (Node::new("a"), Node::new("b"));
    a.start(&nats);
    b.start(&nats);
    wait_for_nodes(&client, 2).await;
    (nats, client, jetstream, a, b)
}

#[tokio::test]
async fn outcomes_on_the_stream_are_counted_exactly_once_when_a_node_dies_mid_stream() {
    let (nats, client, jetstream, mut a, mut b) = two_nodes().await;

    publish_outcomes(&jetstream, 0..PER_SCOPE / 2).await;
    // Kill a while it is working through the stream, publish the rest, and bring it back.
    a.kill_9();
    publish_outcomes(&jetstream, PER_SCOPE / 2..PER_SCOPE).await;
    // A publisher's retry within the duplicate window is dropped by JetStream.
    publish_outcomes(&jetstream, 0..3).await;
    a.start(&nats);
    wait_for_nodes(&client, 2).await;
    drained(&jetstream, "a").await;
    drained(&jetstream, "b").await;
    // Every outcome is acknowledged, so durable: SIGKILL loses none.
    a.kill_9();
    b.kill_9();

    let expected: Vec<(String, u64)> = SCOPES.iter().map(|persona| (format!("acme/{persona}"), PER_SCOPE)).collect();
    assert_eq!(a.stored_sample_counts(), expected, "node a");
    assert_eq!(b.stored_sample_counts(), expected, "node b");
}

/// Both nodes count every stream outcome, but ops hear each event once: the
/// outcome that crosses the alert threshold raises one alert, not one per node,
/// and each outcome gives one KPI event.
#[tokio::test]
async fn events_of_stream_outcomes_are_published_once_whatever_the_number_of_nodes() {
    let (_nats, client, jetstream, mut a, mut b) = two_nodes().await;
    let mut alerts = client.subscribe("capdex.v1.alert.>").await.unwrap();
    let mut kpis = client.subscribe("capdex.v1.kpi.>").await.unwrap();
    client.flush().await.unwrap();

    for turn in 0..10u64 {
        let turn_id = format!("once-{turn}");
        let report = json!({"turnId": turn_id, "organizationId": "acme", "personaId": "once", "status": "failed"});
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", turn_id.as_str());
        let ack =
            jetstream.publish_with_headers("capdex.v1.js.outcome", headers, report.to_string().into()).await.unwrap();
        ack.await.expect("JetStream stores the outcome");
    }
    drained(&jetstream, "a").await;
    drained(&jetstream, "b").await;
    // Both nodes counted all ten.
    let mut kpi_events = 0;
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(2), kpis.next()).await {
        assert_eq!(event.subject.as_str(), "capdex.v1.kpi.acme_once");
        kpi_events += 1;
    }
    assert_eq!(kpi_events, 10, "one KPI event per outcome, not one per node");
    let first = tokio::time::timeout(EVENTUALLY, alerts.next()).await.expect("an alert").unwrap();
    assert_eq!(first.subject.as_str(), "capdex.v1.alert.critical.acme_once");
    let alert: Value = serde_json::from_slice(&first.payload).unwrap();
    assert_eq!(alert["sampleCount"], 8, "{alert}");
    assert!(
        tokio::time::timeout(Duration::from_secs(2), alerts.next()).await.is_err(),
        "the alert was published once, not once per node"
    );
    a.kill_9();
    b.kill_9();
    let expected = vec![("acme/once".to_string(), 10)];
    assert_eq!(a.stored_sample_counts(), expected, "node a");
    assert_eq!(b.stored_sample_counts(), expected, "node b");
}

/// Starts `capdex serve` at `url` (and the variables `extra`) with JetStream on and ten minutes of
/// `jetstream.open_timeout_ms`, and expects it to exit with a failure within
/// 20 s (only failing fast ends in time); answers its log.
async fn fails_to_start(url: &str, extra: &[(&'static str, String)], case: &str) -> String {
    use crate::security::start_capdex;
    let mut env = vec![
        ("CAPDEX_JETSTREAM_ENABLED", "true".to_string()),
        ("CAPDEX_JETSTREAM_OPEN_TIMEOUT_MS", "600000".to_string()),
    ];
    env.extend_from_slice(extra);
    let started = Instant::now();
    let mut node = start_capdex(url, &env);
    let status = loop {
        if let Some(status) = node.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{case}: capdex still waiting:\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let log = node.log();
    assert!(!status.success(), "{case}: {log}");
    log
}

/// A node that needs JetStream (`jetstream.enabled`, the default) on a server
/// without it (after `gateway::patience::NO_RESPONDER_GRACE`, 3 s), or as an
/// account without it (at once), stops with an error that says so and how to
/// fix it: it does not wait out `jetstream.open_timeout_ms` (30 s by
/// default), which is for a cluster that is still forming.
#[tokio::test]
async fn without_jetstream_a_node_says_so_at_once_instead_of_waiting() {
    use crate::security::start_server;
    use crate::support::nats_server::free_port;
    let accountless = "accounts { A { users = [ { user: a, password: a } ] } }\n";
    for (case, account) in [("a server without JetStream", ""), ("an account without JetStream", accountless)] {
        let port = free_port();
        let store = tempfile::tempdir().unwrap();
        // The second server has JetStream, but not for account A.
        let js =
            if account.is_empty() { String::new() } else { format!("jetstream {{ store_dir: {:?} }}\n", store.path()) };
        let conf = format!("listen: 127.0.0.1:{port}\n{js}{account}");
        let _server = start_server(tempfile::tempdir().unwrap(), port, &conf, &[]);
        let credentials = [("CAPDEX_NATS_USER", "a".to_string()), ("CAPDEX_NATS_PASSWORD", "a".to_string())];
        let extra: &[(&str, String)] = if account.is_empty() { &[] } else { &credentials };
        let log = fails_to_start(&format!("nats://127.0.0.1:{port}"), extra, case).await;
        assert!(log.contains("JetStream is not available") && log.contains("-js"), "{case}: {log}");
    }
}

/// A stream another program holds on capdex's subjects is an operator's
/// mistake waiting does not mend: the node stops at once and names it, instead
/// of waiting out `jetstream.open_timeout_ms` as it does for a forming cluster.
#[tokio::test]
async fn a_stream_squatting_capdex_s_subjects_stops_a_node_at_once() {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "SQUATTER".into(),
        subjects: vec!["capdex.v1.js.index".into()],
        ..Default::default()
    })
    .await
    .expect("the squatting stream is created");
    let log = fails_to_start(&nats.url(), &[], "a squatting stream").await;
    assert!(log.contains("CAPDEX_INDEX") && log.to_lowercase().contains("overlap"), "{log}");
}
