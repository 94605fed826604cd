//! Several `capdex serve` nodes on a NATS cluster under a bounded mixed load,
//! for `tests/it/cluster.rs` and `benches/cluster.rs`: the nodes
//! ([`CapdexNode`], each with its own data dir, killed with SIGKILL and
//! restarted on it), a counting HTTP handler on 127.0.0.1 ([`CountingHandler`])
//! for a non-idempotent `api` capability, and load workers ([`Load`]) sending
//! `discover`, outcomes through JetStream (with `Nats-Msg-Id`) and
//! `dispatch` calls with unique `(executionId, stepId)`, each retried as a
//! client of a cluster should (see [`RETRY_POLICY`]) and recorded.

// Shared by the integration tests and a bench, each of which uses part of the API.
#![allow(dead_code)]

use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a client of a capdex cluster retries (the same request, with the same
/// ids, on whatever node answers), and what it does not. `docs/cluster.md`
/// says the same.
pub const RETRY_POLICY: &str = "retry on: no reply in time, no responders, service errors 503 unavailable and \
     504 apply_timeout, a dispatch envelope's unavailable (nothing ran), JetStream publish errors (same \
     Nats-Msg-Id); final: every other reply, including a dispatch envelope's execution_error whose outcome is unknown";

/// The slug of the non-idempotent `api` capability the load dispatches.
pub const DISPATCH_SLUG: &str = "cluster_counted_step";
/// The agent the load dispatches as.
pub const AGENT: &str = "cluster-agent";
/// The KPI window the nodes keep, larger than the outcomes a run publishes per scope.
pub const KPI_WINDOW: u64 = 100_000;

/// The `capdex` binary under test, with the settings environment cleared.
pub fn capdex() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_capdex"));
    command.current_dir(env!("CARGO_MANIFEST_DIR"));
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("CAPDEX_") || name == "RUST_LOG") {
        command.env_remove(name);
    }
    command.env("CAPDEX_LOG", "warn").env("CAPDEX_METRICS_LISTEN_ADDR", "");
    command
}

/// One `capdex serve` node: its name (`CAPDEX_JETSTREAM_NODE_NAME`, also the
/// `Capdex-Node` header and `$SRV.PING` id), its server list, its data dir.
pub struct CapdexNode {
    child: Option<Child>,
    pub name: String,
    nats_url: String,
    env: Vec<(String, String)>,
    launches: u32,
    /// Declared last so it is removed after the process is gone.
    data: tempfile::TempDir,
}

impl CapdexNode {
    /// A node named `name` connecting to `nats_url` (one URL or a comma-separated list),
    /// with `CAPDEX_JETSTREAM_REPLICAS=replicas`, the SSRF allowlist 127.0.0.1/32 and `env`.
    pub fn new(name: &str, nats_url: String, replicas: usize, env: &[(&str, &str)]) -> CapdexNode {
        let mut all: Vec<(String, String)> = vec![
            ("CAPDEX_JETSTREAM_REPLICAS".into(), replicas.to_string()),
            ("CAPDEX_DISPATCH_SSRF_ALLOWLIST".into(), "127.0.0.1/32".into()),
            ("CAPDEX_KPI_ROLLING_WINDOW_SIZE".into(), KPI_WINDOW.to_string()),
        ];
        all.extend(env.iter().map(|(name, value)| (name.to_string(), value.to_string())));
        let data = tempfile::Builder::new().prefix(&format!("capdex-node-{name}-")).tempdir().expect("a data dir");
        CapdexNode { child: None, name: name.to_string(), nats_url, env: all, launches: 0, data }
    }

    /// Starts `capdex serve` on the node's data dir (stderr to `serve.<n>.log` there); does not wait.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "node {} already runs", self.name);
        self.launches += 1;
        let log = std::fs::File::create(self.log_path()).expect("create the node's log");
        let child = capdex()
            .arg("serve")
            .env("CAPDEX_NATS_URL", &self.nats_url)
            .env("CAPDEX_DATA_DIR", self.data.path())
            .env("CAPDEX_CAPABILITY_DIRS", self.data.path().join("no-capabilities"))
            .env("CAPDEX_WATCH", "false")
            .env("CAPDEX_JETSTREAM_NODE_NAME", &self.name)
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("capdex serve starts");
        self.child = Some(child);
    }

    /// Kills the node with SIGKILL (as a crash would) and waits for it.
    pub fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    fn log_path(&self) -> PathBuf {
        self.data.path().join(format!("serve.{}.log", self.launches))
    }

    /// The output of the node's latest launch.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Every KPI the node's data dir holds, as `scope → sampleCount`; the node must be stopped.
    pub fn stored_sample_counts(&self) -> BTreeMap<String, u64> {
        assert!(self.child.is_none(), "stop node {} before reading its store", self.name);
        let output = capdex()
            .args(["kpi", "--json", "--data-dir"])
            .arg(self.data.path())
            .env("CAPDEX_KPI_ROLLING_WINDOW_SIZE", KPI_WINDOW.to_string())
            .output()
            .expect("capdex kpi runs");
        assert!(output.status.success(), "capdex kpi: {}", String::from_utf8_lossy(&output.stderr));
        let kpis: Value = serde_json::from_slice(&output.stdout).expect("capdex kpi --json prints JSON");
        kpis.as_array()
            .expect("a JSON array")
            .iter()
            .map(|kpi| (kpi["scopeKey"].as_str().unwrap().to_string(), kpi["sampleCount"].as_u64().unwrap()))
            .collect()
    }
}

impl Drop for CapdexNode {
    fn drop(&mut self) {
        self.kill_9();
    }
}

/// The service ids of the capdex nodes answering `$SRV.PING.capdex` within 300 ms (one per node; the
/// node's name is in the `Capdex-Node` header of request replies, not in the ping).
pub async fn responders(client: &async_nats::Client) -> BTreeSet<String> {
    let inbox = client.new_inbox();
    let Ok(mut replies) = client.subscribe(inbox.clone()).await else { return BTreeSet::new() };
    if client.publish_with_reply("$SRV.PING.capdex", inbox, "".into()).await.is_err() || client.flush().await.is_err() {
        return BTreeSet::new();
    }
    let mut ids = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
    while let Ok(Some(reply)) = tokio::time::timeout_at(deadline, replies.next()).await {
        // With no capdex up, the server answers "no responders" with an empty message.
        if let Ok(ping) = serde_json::from_slice::<Value>(&reply.payload) {
            if let Some(id) = ping["id"].as_str() {
                ids.insert(id.to_string());
            }
        }
    }
    ids
}

/// Waits until exactly `count` nodes answer pings; returns how long that took.
/// Panics after `timeout`, with the end of each of `nodes`' logs (why one did not answer).
pub async fn wait_for_nodes(
    client: &async_nats::Client,
    count: usize,
    timeout: Duration,
    nodes: &[CapdexNode],
) -> Duration {
    let started = Instant::now();
    loop {
        let answering = responders(client).await.len();
        if answering == count {
            return started.elapsed();
        }
        if started.elapsed() >= timeout {
            let logs: Vec<String> = nodes
                .iter()
                .map(|node| {
                    let log = node.log();
                    let tail: Vec<&str> = log.lines().rev().take(30).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    format!("--- node {} (running: {}):\n{}", node.name, node.pid().is_some(), tail.join("\n"))
                })
                .collect();
            panic!("{count} nodes did not answer within {timeout:?}: {answering} did\n{}", logs.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `payload` on `subject` until node `node` answers it (the queue group picks the node), at most
/// `timeout`; returns its JSON body and how long that took.
pub async fn answer_from(
    client: &async_nats::Client,
    node: &str,
    subject: &str,
    payload: Value,
    timeout: Duration,
) -> (Value, Duration) {
    let started = Instant::now();
    loop {
        // A list of ten thousand capabilities takes a debug build more than a second or two.
        let reply = tokio::time::timeout(
            Duration::from_secs(10).min(timeout),
            client.request(subject.to_string(), payload.to_string().into()),
        )
        .await;
        if let Ok(Ok(reply)) = reply {
            let from = reply.headers.as_ref().and_then(|h| h.get("Capdex-Node")).map(|v| v.as_str().to_string());
            if from.as_deref() == Some(node) {
                return (serde_json::from_slice(&reply.payload).expect("a JSON reply"), started.elapsed());
            }
        }
        assert!(started.elapsed() < timeout, "{node} did not answer {subject} within {timeout:?}");
    }
}

/// A plain HTTP/1.1 handler on 127.0.0.1 for the `api` capability: each
/// request's JSON body is the call's arguments, `{executionId, stepId}`; it
/// counts every pair it receives, waits `delay` (so kills land mid-call) and
/// answers `{"ran": n}` (n: how often it saw this pair).
pub struct CountingHandler {
    pub port: u16,
    seen: Arc<Mutex<BTreeMap<(String, String), u32>>>,
    stop: Arc<AtomicBool>,
}

impl CountingHandler {
    pub fn start(delay: Duration) -> CountingHandler {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the handler");
        let port = listener.local_addr().unwrap().port();
        let seen: Arc<Mutex<BTreeMap<(String, String), u32>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (record, stopping) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let record = record.clone();
                std::thread::spawn(move || serve_one(stream, &record, delay));
            }
        });
        CountingHandler { port, seen, stop }
    }

    /// The URL the capability's `handler` names.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/step", self.port)
    }

    /// How often each `(executionId, stepId)` reached the handler so far.
    pub fn seen(&self) -> BTreeMap<(String, String), u32> {
        self.seen.lock().unwrap().clone()
    }

    /// Requests received so far.
    pub fn total(&self) -> u64 {
        self.seen.lock().unwrap().values().map(|n| u64::from(*n)).sum()
    }
}

impl Drop for CountingHandler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Reads one request (headers, then `Content-Length` bytes), counts its pair, answers, closes.
fn serve_one(stream: std::net::TcpStream, seen: &Mutex<BTreeMap<(String, String), u32>>, delay: Duration) {
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    let mut length = 0usize;
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let arguments: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let key = (
        arguments["executionId"].as_str().unwrap_or("").to_string(),
        arguments["stepId"].as_str().unwrap_or("").to_string(),
    );
    let ran = {
        let mut seen = seen.lock().unwrap();
        let count = seen.entry(key).or_insert(0);
        *count += 1;
        *count
    };
    std::thread::sleep(delay);
    let answer = json!({"ran": ran}).to_string();
    let _ = write!(
        writer,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

/// The capability record of the non-idempotent `api` step (for `capability.register`).
pub fn dispatch_record(handler_url: &str) -> Value {
    json!({
        "slug": DISPATCH_SLUG, "name": "Counted step", "description": "a non-idempotent step the cluster test counts",
        "category": "test", "executionType": "api", "handler": handler_url, "isIdempotent": false,
        "timeoutMs": 5000,
        "functionDefinition": {"name": DISPATCH_SLUG, "description": "counted step",
            "parameters": {"type": "object",
                "properties": {"executionId": {"type": "string"}, "stepId": {"type": "string"}},
                "required": ["executionId", "stepId"]}},
    })
}

/// The kind of a load request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Discover,
    Outcome,
    Dispatch,
    Upsert,
}

/// How a request ended, after its retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Answered with success (an outcome: acknowledged by JetStream).
    Ok,
    /// A dispatch answered `execution_error` "outcome unknown": the step may or may not have run, and will not run
    /// again for this (executionId, stepId).
    InDoubt(String),
    /// A final refusal the client must not retry: its code and message.
    Refused(String),
    /// No final answer before the request's deadline: the last retryable failure.
    Unanswered(String),
}

/// One load request: when it was first sent, how long until its final answer, how many sends.
#[derive(Clone, Debug)]
pub struct Record {
    pub kind: Kind,
    pub sent: Instant,
    pub latency: Duration,
    pub attempts: u32,
    pub answer: Answer,
    /// The node that gave the final answer (requests), if it said.
    pub node: Option<String>,
    /// The request's key: the outcome's `Nats-Msg-Id` and scope, or the dispatch's executionId.
    pub key: String,
    pub scope: String,
}

/// Rates and bounds of a load (per worker: one request at a time, then `pause`).
#[derive(Clone, Debug)]
pub struct Plan {
    pub discover_workers: usize,
    pub outcome_workers: usize,
    pub dispatch_workers: usize,
    pub pause: Duration,
    /// How long one send waits for its reply before it is retried.
    pub attempt_timeout: Duration,
    /// How long a request is retried before it counts as unanswered.
    pub deadline: Duration,
    /// At most this many requests per worker.
    pub max_per_worker: u64,
    /// Prefix of the executionIds and outcome ids (unique per run).
    pub run_id: String,
}

/// A running load; [`Load::stop`] ends it and returns every request's record.
pub struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<Vec<Record>>>,
}

const DISCOVER_QUERIES: [&str; 4] =
    ["look up an invoice by number", "forecast the weather", "convert money between currencies", "counted step"];

impl Load {
    /// Starts the workers on the current tokio runtime.
    pub fn start(client: &async_nats::Client, plan: &Plan) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        let counts = [
            (Kind::Discover, plan.discover_workers),
            (Kind::Outcome, plan.outcome_workers),
            (Kind::Dispatch, plan.dispatch_workers),
        ];
        for (kind, n) in counts {
            for worker in 0..n {
                let (client, plan, stop) = (client.clone(), plan.clone(), stop.clone());
                workers.push(tokio::spawn(async move {
                    let jetstream = async_nats::jetstream::new(client.clone());
                    let mut records = Vec::new();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) && n < plan.max_per_worker {
                        let record = match kind {
                            Kind::Discover => {
                                let query = DISCOVER_QUERIES[n as usize % DISCOVER_QUERIES.len()];
                                let payload = json!({"message": query});
                                request(&client, &plan, kind, "capdex.v1.discover", payload, String::new()).await
                            }
                            Kind::Outcome => {
                                let scope = format!("{}-o{worker}", plan.run_id);
                                let id = format!("{scope}-{n}");
                                publish_outcome(&jetstream, &plan, &scope, &id).await
                            }
                            Kind::Dispatch => {
                                let execution_id = format!("{}-d{worker}-{n}", plan.run_id);
                                dispatch(&client, &plan, &execution_id, "step-1").await
                            }
                            Kind::Upsert => unreachable!("no upsert workers"),
                        };
                        records.push(record);
                        n += 1;
                        tokio::time::sleep(plan.pause).await;
                    }
                    records
                }));
            }
        }
        Load { stop, workers }
    }

    /// Stops the workers (each finishes its request) and returns all records.
    pub async fn stop(self) -> Vec<Record> {
        self.stop.store(true, Ordering::Relaxed);
        let mut records = Vec::new();
        for worker in self.workers {
            records.extend(worker.await.expect("a load worker panicked"));
        }
        records
    }
}

/// Whether a service error code is worth sending the same request again for.
pub fn retryable_code(code: &str) -> bool {
    matches!(code, "unavailable" | "apply_timeout")
}

/// Sends a request until it gets a final answer or `plan.deadline` passes.
pub async fn request(
    client: &async_nats::Client,
    plan: &Plan,
    kind: Kind,
    subject: &str,
    payload: Value,
    key: String,
) -> Record {
    let sent = Instant::now();
    let mut attempts = 0;
    let payload = bytes::Bytes::from(payload.to_string());
    loop {
        attempts += 1;
        let reply =
            tokio::time::timeout(plan.attempt_timeout, client.request(subject.to_string(), payload.clone())).await;
        let (answer, node) = match reply {
            Err(_) => (Answer::Unanswered(format!("no reply within {:?}", plan.attempt_timeout)), None),
            Ok(Err(err)) => (Answer::Unanswered(format!("request failed: {err}")), None),
            Ok(Ok(message)) => classify_reply(&message),
        };
        let finished = !matches!(answer, Answer::Unanswered(_));
        if finished || sent.elapsed() >= plan.deadline {
            return Record { kind, sent, latency: sent.elapsed(), attempts, answer, node, key, scope: String::new() };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A reply's answer (retryable service errors are [`Answer::Unanswered`]) and node.
fn classify_reply(message: &async_nats::Message) -> (Answer, Option<String>) {
    let headers = message.headers.as_ref();
    let node = headers.and_then(|h| h.get("Capdex-Node")).map(|value| value.as_str().to_string());
    let body: Value = serde_json::from_slice(&message.payload).unwrap_or(Value::Null);
    if let Some(status) = message.status {
        // No responders (503) and other NATS statuses come without a body.
        return (Answer::Unanswered(format!("NATS status {status}")), node);
    }
    if headers.and_then(|h| h.get("Nats-Service-Error-Code")).is_some() {
        let code = body["code"].as_str().unwrap_or("").to_string();
        let text = format!("{code}: {}", body["message"].as_str().unwrap_or(""));
        return (if retryable_code(&code) { Answer::Unanswered(text) } else { Answer::Refused(text) }, node);
    }
    if body["success"] == false {
        let code = body["error"]["code"].as_str().unwrap_or("");
        let text = format!("{code}: {}", body["error"]["message"].as_str().unwrap_or(""));
        if code == "execution_error" && text.contains("outcome is unknown") {
            return (Answer::InDoubt(text), node);
        }
        // A dispatch whose shared state could not be asked ran nothing: resend it (docs/api.md).
        return (if retryable_code(code) { Answer::Unanswered(text) } else { Answer::Refused(text) }, node);
    }
    (Answer::Ok, node)
}

/// Dispatches the counted step once for `(execution_id, step_id)`, retrying as [`request`] does.
pub async fn dispatch(client: &async_nats::Client, plan: &Plan, execution_id: &str, step_id: &str) -> Record {
    let call = json!({"slug": DISPATCH_SLUG, "agentId": AGENT,
        "arguments": {"executionId": execution_id, "stepId": step_id},
        "executionId": execution_id, "stepId": step_id});
    request(client, plan, Kind::Dispatch, "capdex.v1.dispatch", call, execution_id.to_string()).await
}

/// Publishes one successful outcome of `scope` with JetStream (`Nats-Msg-Id: id`), retrying until acknowledged.
pub async fn publish_outcome(jetstream: &async_nats::jetstream::Context, plan: &Plan, scope: &str, id: &str) -> Record {
    let sent = Instant::now();
    let report = json!({"turnId": id, "organizationId": "cluster", "personaId": scope, "status": "success"});
    let payload = bytes::Bytes::from(report.to_string());
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", id);
        let acked = tokio::time::timeout(plan.attempt_timeout, async {
            let ack = jetstream.publish_with_headers("capdex.v1.js.outcome", headers, payload.clone()).await?;
            ack.await.map_err(async_nats::Error::from)
        })
        .await;
        let answer = match acked {
            Ok(Ok(_)) => Answer::Ok,
            Ok(Err(err)) => Answer::Unanswered(format!("publish failed: {err}")),
            Err(_) => Answer::Unanswered(format!("no ack within {:?}", plan.attempt_timeout)),
        };
        if answer == Answer::Ok || sent.elapsed() >= plan.deadline {
            return Record {
                kind: Kind::Outcome,
                sent,
                latency: sent.elapsed(),
                attempts,
                answer,
                node: None,
                key: id.to_string(),
                scope: format!("cluster/{scope}"),
            };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Upserts one tool for runtime `cluster` through any node, retrying as [`request`] does.
pub async fn upsert(client: &async_nats::Client, plan: &Plan, name: &str, description: &str) -> Record {
    let payload = json!({"runtimeId": "cluster", "tools": [{"name": name, "description": description}]});
    request(client, plan, Kind::Upsert, "capdex.v1.capabilities.upsert", payload, name.to_string()).await
}

/// Waits until node `name`'s durable KPI consumer has nothing pending or unacknowledged (at most `timeout`).
pub async fn drained(jetstream: &async_nats::jetstream::Context, name: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(mut stream) = jetstream.get_stream("CAPDEX_OUTCOMES").await {
            let consumer: Result<async_nats::jetstream::consumer::PullConsumer, _> =
                stream.get_consumer(&format!("capdex-kpi-{name}")).await;
            let last = stream.info().await.map(|info| info.state.last_sequence).unwrap_or(0);
            if let Ok(mut consumer) = consumer {
                if let Ok(info) = consumer.info().await {
                    if info.num_pending == 0 && info.num_ack_pending == 0 && info.ack_floor.stream_sequence >= last {
                        return;
                    }
                }
            }
        }
        assert!(Instant::now() < deadline, "node {name} did not record every outcome within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `q`-quantile (0..=1) of `values` (nearest rank), or zero when there are none.
pub fn quantile(values: &mut [Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort();
    let rank = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// CPU seconds (user + system, all threads) process `pid` has used, from `/proc/<pid>/stat` (USER_HZ = 100).
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index).and_then(|field| field.parse::<u64>().ok());
    Some((ticks(11)? + ticks(12)?) as f64 / 100.0)
}

/// A counter of ids unique within the process (for run ids).
pub fn next_run_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let millis = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
    format!("{prefix}{millis}x{}", NEXT.fetch_add(1, Ordering::Relaxed))
}
