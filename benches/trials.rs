//! Crash and fault trials (issue 24): real `nats-server` and `capdex serve`
//! processes, each fault repeated with seeded random kill points, and a table
//! per path of what was acknowledged, lost and doubled, and how long recovery
//! took.
//!
//! Paths (`--paths a,b`; all by default):
//! - `kill9`: load (outcomes, registrations, dispatches to a real HTTP handler
//!   on 127.0.0.1 that counts its calls per (executionId, stepId)), `kill -9`
//!   of capdex at a random point, restart on the same data dir. Then every
//!   acknowledged outcome is counted exactly once (the KPI sample count is
//!   checked against the ledger, after the unacknowledged ones are retried:
//!   a retry of a kept one must be a duplicate), every acknowledged
//!   registration is listed, every acknowledged dispatch re-drives to its
//!   stored result, and no handler ran twice for one key.
//! - `nats`: the same load while nats-server is killed (`kill -9`) and started
//!   again after a random outage; recovery is the time from the server
//!   accepting connections again to capdex answering a discovery; nothing
//!   acknowledged is lost.
//! - `sigterm`: a burst of requests capdex has received (a `$SRV.PING` after
//!   them proves it), SIGTERM at a random point: every one is answered, the
//!   process exits 0, the restart holds what was acknowledged.
//! - `diskfull`: the data dir on a small tmpfs (mounted by the bench; it needs
//!   root, else the path is reported as skipped), filled to a random point
//!   under `data_dir_min_free_bytes` (down to 0 bytes free): writes are
//!   refused with `storage_full`, reads answer, writes resume once the filler
//!   is removed, and a `kill -9` and restart find everything acknowledged.
//! - `corrupt`: a copy of a good data dir damaged at random (truncated or
//!   overwritten at a random offset, a file removed, `conf` overwritten):
//!   `capdex serve` either refuses, naming the problem and the recovery, or
//!   starts with everything it held (the damage hit unused space); a panic,
//!   an unclear refusal or a start with missing data is a failure.
//! - `second`: a second `capdex serve` on the data dir of one under load is
//!   refused naming the dir and the first one's pid; the first one keeps
//!   answering without an error.
//!
//! Run: `scripts/trials.sh` or `cargo bench --bench trials -- [--trials N]
//! [--seed S] [--paths kill9,nats,...]` (20 trials per path; `CAPDEX_TRIALS`
//! and `CAPDEX_TRIALS_SEED` too). Without `--bench` (`cargo test --benches`)
//! it runs 2 trials per path as a smoke test. The node is this build's
//! `capdex`, or `CAPDEX_BENCH_SERVE_BIN`; nats-server is `CAPDEX_NATS_SERVER`,
//! `.venv/bin/nats-server` or `PATH`. The seed is printed; the same seed gives
//! the same kill points, damages and loads (timing still varies).
//! Exits 1 if anything acknowledged was lost or doubled, or a trial failed.

#[path = "../tests/it/support/nats_server.rs"]
mod nats_server;

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PATHS: [&str; 6] = ["kill9", "nats", "sigterm", "diskfull", "corrupt", "second"];
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|arg| arg == "--bench" || arg == "--full");
    let value = |flag: &str| args.iter().position(|arg| arg == flag).and_then(|i| args.get(i + 1)).cloned();
    let trials: usize = value("--trials")
        .or_else(|| std::env::var("CAPDEX_TRIALS").ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(if full { 20 } else { 2 });
    let seed: u64 = value("--seed")
        .or_else(|| std::env::var("CAPDEX_TRIALS_SEED").ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs());
    let paths: Vec<String> = value("--paths")
        .map(|list| list.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| PATHS.iter().map(|p| p.to_string()).collect());
    for path in &paths {
        assert!(PATHS.contains(&path.as_str()), "unknown path {path}; the paths are {PATHS:?}");
    }
    let binary: PathBuf = std::env::var_os("CAPDEX_BENCH_SERVE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_capdex")));
    println!(
        "capdex crash and fault trials: {trials} trials per path, seed {seed} (rerun with --seed {seed}), node {}",
        binary.display()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut reports = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let rng = Rng(seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let started = Instant::now();
        let report = runtime.block_on(async {
            match path.as_str() {
                "kill9" => kill9(&binary, trials, rng).await,
                "nats" => nats_restart(&binary, trials, rng).await,
                "sigterm" => sigterm(&binary, trials, rng).await,
                "diskfull" => disk_full(&binary, trials, rng).await,
                "corrupt" => corrupt(&binary, trials, rng).await,
                _ => second(&binary, trials, rng).await,
            }
        });
        println!("  {path}: done in {:.0} s", started.elapsed().as_secs_f64());
        reports.push(report);
    }
    print_table(&reports);
    let bad = reports.iter().any(|r| r.lost > 0 || r.doubled > 0 || !r.failures.is_empty());
    if bad {
        std::process::exit(1);
    }
}

/// A seeded generator (splitmix64): the same seed gives the same trials.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `low..high`.
    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low).max(1)
    }

    fn fork(&mut self) -> Rng {
        Rng(self.next())
    }
}

/// What one path found.
#[derive(Default)]
struct Report {
    path: &'static str,
    trials: usize,
    acknowledged: Counts,
    lost: u64,
    doubled: u64,
    failures: Vec<String>,
    /// NATS restart: from the server's return to capdex's first answer.
    recovery: Vec<Duration>,
    /// Anything else worth a line (refusals by kind, skipped, ...).
    notes: BTreeMap<String, u64>,
    skipped: Option<String>,
}

#[derive(Default, Clone, Copy)]
struct Counts {
    outcomes: u64,
    registrations: u64,
    dispatches: u64,
}

impl Report {
    fn new(path: &'static str, trials: usize) -> Report {
        Report { path, trials, ..Report::default() }
    }

    fn fail(&mut self, trial: usize, what: impl Into<String>) {
        let what = what.into();
        println!("    trial {trial}: FAILURE {what}");
        self.failures.push(format!("trial {trial}: {what}"));
    }

    fn note(&mut self, what: &str) {
        *self.notes.entry(what.to_string()).or_default() += 1;
    }
}

fn print_table(reports: &[Report]) {
    println!();
    println!(
        "| path | trials | acknowledged (outcomes / registrations / dispatches) | lost | doubled | failures | recovery p50 / p99 / max | notes |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in reports {
        if let Some(why) = &r.skipped {
            println!("| {} | 0 | - | - | - | - | - | skipped: {why} |", r.path);
            continue;
        }
        let recovery = if r.recovery.is_empty() {
            "-".to_string()
        } else {
            let mut sorted = r.recovery.clone();
            sorted.sort();
            let at = |q: f64| sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1];
            format!(
                "{:.0} / {:.0} / {:.0} ms",
                at(0.5).as_secs_f64() * 1e3,
                at(0.99).as_secs_f64() * 1e3,
                sorted[sorted.len() - 1].as_secs_f64() * 1e3
            )
        };
        let notes: Vec<String> = r.notes.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        println!(
            "| {} | {} | {} / {} / {} | {} | {} | {} | {} | {} |",
            r.path,
            r.trials,
            r.acknowledged.outcomes,
            r.acknowledged.registrations,
            r.acknowledged.dispatches,
            r.lost,
            r.doubled,
            r.failures.len(),
            recovery,
            notes.join("; ")
        );
    }
    for r in reports {
        for failure in &r.failures {
            println!("  {} {failure}", r.path);
        }
    }
}

// ---------------------------------------------------------------- processes

/// One `capdex serve` child (killed on drop).
struct Node {
    child: Child,
    log: PathBuf,
}

impl Node {
    fn spawn(binary: &Path, work: &Path, data: &Path, nats_url: &str, extra: &[(&str, String)]) -> Node {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let log = work.join(format!("capdex-{}.log", NEXT.fetch_add(1, Ordering::Relaxed)));
        let mut command = Command::new(binary);
        for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("CAPDEX_") || name == "RUST_LOG") {
            command.env_remove(name);
        }
        command
            .arg("serve")
            .env("CAPDEX_NATS_URL", nats_url)
            .env("CAPDEX_DATA_DIR", data)
            .env("CAPDEX_CAPABILITY_DIRS", work.join("no-capabilities"))
            .env("CAPDEX_WATCH", "false")
            .env("CAPDEX_METRICS_LISTEN_ADDR", "")
            .env("CAPDEX_LOG", "warn")
            .env("CAPDEX_DISPATCH_SSRF_ALLOWLIST", "127.0.0.1/32")
            .env("CAPDEX_KPI_ROLLING_WINDOW_SIZE", "100000")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (name, value) in extra {
            command.env(name, value);
        }
        Node { child: command.spawn().expect("capdex serve starts"), log }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, and the exit status within `limit` (`None`: still running, then killed).
    fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status();
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                self.kill_9();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the node answers `$SRV.PING.capdex`; `Err` with its log if it exits or 60 s pass.
    async fn ready(&mut self, client: &async_nats::Client) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ping =
                tokio::time::timeout(Duration::from_millis(250), client.request("$SRV.PING.capdex", "".into())).await;
            if matches!(ping, Ok(Ok(_))) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("capdex serve exited with {status}: {}", self.log()));
            }
            if Instant::now() > deadline {
                return Err(format!("capdex serve not ready within 60 s: {}", self.log()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill_9();
    }
}

async fn connect(url: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .reconnect_delay_callback(|attempts| Duration::from_millis(if attempts <= 1 { 0 } else { 50 }))
        .connect(url)
        .await
        .expect("the bench connects to NATS")
}

/// A real HTTP handler on 127.0.0.1: counts its calls per `q` (the bench puts
/// `<executionId>/<stepId>` there), waits `delay_ms`, answers `{"key", "n"}`.
struct Handler {
    port: u16,
    calls: Arc<Mutex<HashMap<String, u64>>>,
}

impl Handler {
    fn start(delay_ms: u64) -> Handler {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let calls: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let counts = calls.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let counts = counts.clone();
                std::thread::spawn(move || serve_one(stream, &counts, delay_ms));
            }
        });
        Handler { port, calls }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/charge", self.port)
    }

    /// Keys called more than once.
    fn doubled(&self) -> Vec<(String, u64)> {
        self.calls.lock().unwrap().iter().filter(|(_, n)| **n > 1).map(|(k, n)| (k.clone(), *n)).collect()
    }
}

fn serve_one(mut stream: std::net::TcpStream, counts: &Mutex<HashMap<String, u64>>, delay_ms: u64) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut length = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 {
            // Cut before its headers ended (its sender was killed): not a call.
            return;
        }
        if header == "\r\n" {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.trim().eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<usize>().ok();
            }
        }
    }
    // A request without its whole body (its sender was killed) is not a call either.
    let Some(length) = length else { return };
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let key = serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["q"].as_str().map(str::to_string));
    let key = key.unwrap_or_default();
    let n = {
        let mut counts = counts.lock().unwrap();
        let n = counts.entry(key.clone()).or_default();
        *n += 1;
        *n
    };
    std::thread::sleep(Duration::from_millis(delay_ms));
    let answer = json!({"key": key, "n": n}).to_string();
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

// ---------------------------------------------------------------- requests

/// A reply: its body, and its error code (`Nats-Service-Error-Code` body's `code`) if it is an error reply.
struct Reply {
    body: Value,
    error: Option<String>,
}

async fn ask(client: &async_nats::Client, subject: &str, payload: &Value) -> Result<Reply, String> {
    ask_within(client, subject, payload, REQUEST_TIMEOUT).await
}

async fn ask_within(
    client: &async_nats::Client,
    subject: &str,
    payload: &Value,
    limit: Duration,
) -> Result<Reply, String> {
    let request = client.request(subject.to_string(), payload.to_string().into());
    let message = match tokio::time::timeout(limit, request).await {
        Ok(Ok(message)) => message,
        Ok(Err(err)) => return Err(err.to_string()),
        Err(_) => return Err("timed out".into()),
    };
    let body: Value = serde_json::from_slice(&message.payload).unwrap_or(Value::Null);
    let error = message
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Service-Error-Code"))
        .map(|_| body["code"].as_str().unwrap_or("?").to_string());
    Ok(Reply { body, error })
}

fn outcome(turn: &str) -> Value {
    json!({"turnId": turn, "organizationId": "acme", "personaId": "trials", "status": "success"})
}

fn registration(slug: &str) -> Value {
    json!({
        "slug": slug, "name": slug, "description": "a trial capability", "category": "test",
        "executionType": "internal", "handler": "svc",
        "functionDefinition": {"name": slug, "description": "trial",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}},
    })
}

fn charge_record(url: &str) -> Value {
    let mut record = registration("charge");
    record["executionType"] = json!("api");
    record["handler"] = json!(url);
    // A step left claimed by a killed node is answered "interrupted" once this
    // timeout and the settle grace have passed (the cluster cannot tell a dead
    // node from a slow one before), so the retries below wait about 4 s.
    record["timeoutMs"] = json!(2000);
    record
}

fn dispatch(execution: &str, step: &str) -> Value {
    json!({"slug": "charge", "agentId": "trials", "arguments": {"q": format!("{execution}/{step}")},
        "executionId": execution, "stepId": step})
}

/// What the bench sent and which of it was acknowledged.
#[derive(Default)]
struct Ledger {
    /// turnId: acknowledged?
    outcomes: BTreeMap<String, bool>,
    registrations: BTreeMap<String, bool>,
    /// (executionId, stepId): the `n` of the acknowledged result.
    dispatches: BTreeMap<(String, String), Option<u64>>,
    next: u64,
}

impl Ledger {
    fn counts(&self) -> Counts {
        Counts {
            outcomes: self.outcomes.values().filter(|a| **a).count() as u64,
            registrations: self.registrations.values().filter(|a| **a).count() as u64,
            dispatches: self.dispatches.values().filter(|a| a.is_some()).count() as u64,
        }
    }
}

/// The load: `workers` loops of outcomes (50%), dispatches (30%) and
/// registrations (20%), each written to the ledger before it is sent and
/// marked acknowledged when its success reply comes back. Runs until `stop`;
/// a failed request is left unacknowledged and the loop goes on.
fn start_load(
    client: &async_nats::Client,
    ledger: &Arc<Mutex<Ledger>>,
    trial: usize,
    workers: usize,
    rng: &mut Rng,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..workers)
        .map(|worker| {
            let (client, ledger, stop, mut rng) = (client.clone(), ledger.clone(), stop.clone(), rng.fork());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let pick = rng.range(0, 10);
                    let n = {
                        let mut ledger = ledger.lock().unwrap();
                        ledger.next += 1;
                        ledger.next
                    };
                    if pick < 5 {
                        let turn = format!("t{trial}-{worker}-{n}");
                        ledger.lock().unwrap().outcomes.insert(turn.clone(), false);
                        if let Ok(reply) = ask(&client, "capdex.v1.outcome", &outcome(&turn)).await {
                            if reply.body["accepted"] == true {
                                ledger.lock().unwrap().outcomes.insert(turn, true);
                            }
                        }
                    } else if pick < 8 {
                        let key = (format!("run-{trial}-{worker}"), format!("s{n}"));
                        ledger.lock().unwrap().dispatches.insert(key.clone(), None);
                        if let Ok(reply) = ask(&client, "capdex.v1.dispatch", &dispatch(&key.0, &key.1)).await {
                            if reply.body["success"] == true {
                                let n = reply.body["data"]["n"].as_u64();
                                ledger.lock().unwrap().dispatches.insert(key, n);
                            }
                        }
                    } else {
                        let slug = format!("r{trial}_{worker}_{n}");
                        ledger.lock().unwrap().registrations.insert(slug.clone(), false);
                        if let Ok(reply) = ask(&client, "capdex.v1.capability.register", &registration(&slug)).await {
                            if reply.body["policyVersion"].is_u64() {
                                ledger.lock().unwrap().registrations.insert(slug, true);
                            }
                        }
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
            })
        })
        .collect()
}

/// Stops the load: sets `stop`, and aborts what is still waiting for a reply.
async fn stop_load(stop: &AtomicBool, tasks: Vec<tokio::task::JoinHandle<()>>, wait: bool) {
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        if wait {
            let _ = task.await;
        } else {
            task.abort();
            let _ = task.await;
        }
    }
}

/// Checks a restarted (or recovered) node against the ledger and settles it:
/// every unacknowledged outcome is retried (a retry of one that was kept is
/// a duplicate) and the KPI sample count must be exactly the outcomes kept;
/// every acknowledged registration is listed once; every acknowledged
/// dispatch re-drives to its result and every unacknowledged one is asked
/// once more; no handler ran twice for one key. Adds to `report`.
async fn verify(
    client: &async_nats::Client,
    ledger: &Mutex<Ledger>,
    handler: &Handler,
    report: &mut Report,
    trial: usize,
) {
    // Outcomes: the count before the retries, through a new probe outcome.
    let (acked, unknown): (Vec<String>, Vec<String>) = {
        let ledger = ledger.lock().unwrap();
        let acked = ledger.outcomes.iter().filter(|(_, a)| **a).map(|(t, _)| t.clone()).collect();
        let unknown = ledger.outcomes.iter().filter(|(_, a)| !**a).map(|(t, _)| t.clone()).collect();
        (acked, unknown)
    };
    let probe = format!("probe-{trial}-{}", report.path);
    let counted = match ask(client, "capdex.v1.outcome", &outcome(&probe)).await {
        Ok(reply) if reply.body["accepted"] == true => reply.body["kpi"]["sampleCount"].as_u64().unwrap_or(0),
        other => {
            report.fail(trial, format!("the probe outcome was not accepted: {:?}", other.map(|r| r.body)));
            return;
        }
    };
    let mut kept_unknown = 0;
    for turn in &unknown {
        match ask(client, "capdex.v1.outcome", &outcome(turn)).await {
            Ok(reply) if reply.body["accepted"] == true => {
                if reply.body["duplicate"] == true {
                    kept_unknown += 1;
                }
            }
            other => report.fail(trial, format!("retry of {turn}: {:?}", other.map(|r| r.body))),
        }
    }
    let expected = acked.len() as u64 + kept_unknown + 1;
    if counted < expected {
        report.lost += expected - counted;
        report.fail(trial, format!("KPI samples {counted}, expected {expected}: {} outcomes lost", expected - counted));
    } else if counted > expected {
        report.doubled += counted - expected;
        report.fail(trial, format!("KPI samples {counted}, expected {expected}: {} counted twice", counted - expected));
    }
    // A sample of the acknowledged ones, retried: each must be a duplicate.
    for turn in acked.iter().rev().take(5) {
        if let Ok(reply) = ask(client, "capdex.v1.outcome", &outcome(turn)).await {
            if reply.body["duplicate"] != true {
                report.lost += 1;
                report.fail(trial, format!("acknowledged outcome {turn} was not kept: {}", reply.body));
            }
        }
    }
    {
        let mut ledger = ledger.lock().unwrap();
        for turn in unknown.into_iter().chain([probe]) {
            ledger.outcomes.insert(turn, true);
        }
    }

    // Registrations.
    match ask(client, "capdex.v1.capability.list", &json!({})).await {
        Ok(reply) => {
            let listed: Vec<String> = reply.body["capabilities"]
                .as_array()
                .map(|a| a.iter().filter_map(|r| r["slug"].as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            let unique: BTreeSet<&String> = listed.iter().collect();
            if unique.len() != listed.len() {
                report.doubled += (listed.len() - unique.len()) as u64;
                report.fail(trial, "a slug is listed twice");
            }
            let ledger = ledger.lock().unwrap();
            for (slug, acked) in &ledger.registrations {
                if *acked && !unique.contains(slug) {
                    report.lost += 1;
                    report.fail(trial, format!("acknowledged registration {slug} is gone"));
                }
            }
        }
        Err(err) => report.fail(trial, format!("capability.list: {err}")),
    }
    // Dispatches: acknowledged ones replay their result; the others are asked once more.
    let keys: Vec<((String, String), Option<u64>)> =
        ledger.lock().unwrap().dispatches.iter().map(|(k, v)| (k.clone(), *v)).collect();
    let keys: Vec<((String, String), Option<u64>)> = keys
        .into_iter()
        .filter(|((execution, _), _)| {
            execution.contains(&format!("-{trial}-")) || execution == &format!("full-{trial}")
        })
        .collect();
    let calls: Vec<Value> = keys.iter().map(|((execution, step), _)| dispatch(execution, step)).collect();
    let answers = futures::future::join_all(
        calls.iter().map(|call| ask_within(client, "capdex.v1.dispatch", call, Duration::from_secs(30))),
    )
    .await;
    for (((execution, step), acked), answer) in keys.into_iter().zip(answers) {
        match (acked, answer) {
            (Some(n), Ok(reply)) => {
                if reply.body["success"] != true || reply.body["data"]["n"].as_u64() != Some(n) {
                    report.lost += 1;
                    report.fail(trial, format!("acknowledged dispatch {execution}/{step} re-drove to {}", reply.body));
                }
            }
            (None, Ok(reply)) => {
                let code = reply.body["error"]["code"].as_str().unwrap_or("");
                report.note(if reply.body["success"] == true {
                    "unacknowledged dispatch: ran or replayed on retry"
                } else if reply.body["error"]["message"].as_str().is_some_and(|m| m.contains("unknown")) {
                    "unacknowledged dispatch: interrupted, not run again"
                } else {
                    "unacknowledged dispatch: refused on retry"
                });
                if reply.body["success"] == true {
                    ledger.lock().unwrap().dispatches.insert((execution, step), reply.body["data"]["n"].as_u64());
                } else if code.is_empty() {
                    report.fail(trial, format!("retry of {execution}/{step}: {}", reply.body));
                }
            }
            (_, Err(err)) => report.fail(trial, format!("dispatch {execution}/{step}: {err}")),
        }
    }
    for (key, n) in handler.doubled() {
        if !report.failures.iter().any(|f| f.contains(&key)) {
            report.doubled += 1;
            report.fail(trial, format!("the handler ran {n} times for {key}"));
        }
    }
}

struct Rig {
    _work: tempfile::TempDir,
    work: PathBuf,
    data: PathBuf,
    nats: nats_server::NatsServer,
    handler: Handler,
    ledger: Arc<Mutex<Ledger>>,
}

impl Rig {
    fn new(handler_delay_ms: u64) -> Rig {
        let work = tempfile::Builder::new().prefix("capdex-trials-").tempdir().unwrap();
        let path = work.path().to_path_buf();
        Rig {
            data: path.join("data"),
            work: path,
            _work: work,
            nats: nats_server::NatsServer::start(),
            handler: Handler::start(handler_delay_ms),
            ledger: Arc::default(),
        }
    }

    fn spawn(&self, binary: &Path, extra: &[(&str, String)]) -> Node {
        Node::spawn(binary, &self.work, &self.data, &self.nats.url(), extra)
    }

    async fn setup(&self, client: &async_nats::Client) {
        let reply = ask(client, "capdex.v1.capability.register", &charge_record(&self.handler.url())).await.unwrap();
        assert!(reply.body["policyVersion"].is_u64(), "the trial capability registers: {}", reply.body);
    }
}

// ---------------------------------------------------------------- paths

async fn kill9(binary: &Path, trials: usize, mut rng: Rng) -> Report {
    let mut report = Report::new("kill9", trials);
    let rig = Rig::new(20);
    let client = connect(&rig.nats.url()).await;
    let mut node = rig.spawn(binary, &[]);
    node.ready(&client).await.unwrap();
    rig.setup(&client).await;
    for trial in 1..=trials {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = start_load(&client, &rig.ledger, trial, 8, &mut rng, &stop);
        let kill_after = rng.range(150, 1500);
        tokio::time::sleep(Duration::from_millis(kill_after)).await;
        node.kill_9();
        stop_load(&stop, tasks, false).await;
        node = rig.spawn(binary, &[]);
        if let Err(err) = node.ready(&client).await {
            report.fail(trial, err);
            return report;
        }
        verify(&client, &rig.ledger, &rig.handler, &mut report, trial).await;
        let counts = rig.ledger.lock().unwrap().counts();
        println!(
            "    trial {trial}: kill -9 after {kill_after} ms; acknowledged so far {} outcomes, {} registrations, {} dispatches",
            counts.outcomes, counts.registrations, counts.dispatches
        );
    }
    report.acknowledged = rig.ledger.lock().unwrap().counts();
    report
}

async fn nats_restart(binary: &Path, trials: usize, mut rng: Rng) -> Report {
    let mut report = Report::new("nats", trials);
    let mut rig = Rig::new(20);
    let client = connect(&rig.nats.url()).await;
    let mut node = rig.spawn(binary, &[]);
    node.ready(&client).await.unwrap();
    rig.setup(&client).await;
    let discover = json!({"message": "charge a card"});
    for trial in 1..=trials {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = start_load(&client, &rig.ledger, trial, 8, &mut rng, &stop);
        let kill_after = rng.range(150, 1000);
        let outage = rng.range(100, 1500);
        tokio::time::sleep(Duration::from_millis(kill_after)).await;
        rig.nats.kill();
        tokio::time::sleep(Duration::from_millis(outage)).await;
        rig.nats.restart();
        let back = Instant::now();
        // A fresh connection, so the bench's own reconnection is not measured.
        let probe = connect(&rig.nats.url()).await;
        let recovered = loop {
            let attempt = tokio::time::timeout(
                Duration::from_millis(200),
                probe.request("capdex.v1.discover", discover.to_string().into()),
            )
            .await;
            if let Ok(Ok(message)) = attempt {
                if message.headers.as_ref().is_none_or(|h| h.get("Nats-Service-Error").is_none()) {
                    break Some(back.elapsed());
                }
            }
            if back.elapsed() > Duration::from_secs(30) {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        match recovered {
            Some(took) => {
                report.recovery.push(took);
                if took > Duration::from_secs(2) {
                    report.fail(
                        trial,
                        format!("capdex answered {:.0} ms after NATS returned (> 2 s)", took.as_secs_f64() * 1e3),
                    );
                }
            }
            None => {
                report.fail(trial, "capdex did not answer within 30 s of NATS returning");
                stop_load(&stop, tasks, false).await;
                return report;
            }
        }
        if node.child.try_wait().unwrap().is_some() {
            report.fail(trial, format!("capdex exited while NATS was away: {}", node.log()));
            return report;
        }
        // The load goes on a little over the restored connection, then is settled.
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop_load(&stop, tasks, true).await;
        verify(&client, &rig.ledger, &rig.handler, &mut report, trial).await;
        println!(
            "    trial {trial}: NATS killed after {kill_after} ms, down {outage} ms; capdex answered {:.0} ms after it returned",
            report.recovery.last().unwrap().as_secs_f64() * 1e3
        );
    }
    report.acknowledged = rig.ledger.lock().unwrap().counts();
    report
}

async fn sigterm(binary: &Path, trials: usize, mut rng: Rng) -> Report {
    let mut report = Report::new("sigterm", trials);
    let rig = Rig::new(150);
    let client = connect(&rig.nats.url()).await;
    let mut node = rig.spawn(binary, &[]);
    node.ready(&client).await.unwrap();
    rig.setup(&client).await;
    for trial in 1..=trials {
        let burst = rng.range(10, 80) as usize;
        let mut pending = Vec::new();
        for i in 0..burst {
            let (subject, payload, kind) = match rng.range(0, 4) {
                0 => {
                    let turn = format!("t{trial}-{i}");
                    rig.ledger.lock().unwrap().outcomes.insert(turn.clone(), false);
                    ("capdex.v1.outcome", outcome(&turn), 0)
                }
                1 => {
                    let key = (format!("run-{trial}-0"), format!("s{i}"));
                    rig.ledger.lock().unwrap().dispatches.insert(key.clone(), None);
                    ("capdex.v1.dispatch", dispatch(&key.0, &key.1), 1)
                }
                2 => {
                    let slug = format!("r{trial}_{i}");
                    rig.ledger.lock().unwrap().registrations.insert(slug.clone(), false);
                    ("capdex.v1.capability.register", registration(&slug), 2)
                }
                _ => ("capdex.v1.discover", json!({"message": format!("charge card {i}")}), 3),
            };
            let inbox = client.new_inbox();
            let subscriber = client.subscribe(inbox.clone()).await.unwrap();
            client.publish_with_reply(subject, inbox, payload.to_string().into()).await.unwrap();
            pending.push((subscriber, payload, kind));
        }
        // capdex has received every one of them once it answers this ping.
        client.flush().await.unwrap();
        if let Err(err) = ask(&client, "$SRV.PING.capdex", &json!({})).await {
            report.fail(trial, format!("ping before SIGTERM: {err}"));
        }
        let delay = rng.range(0, 100);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let pid = node.pid();
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        let mut unanswered = 0;
        for (mut subscriber, payload, kind) in pending {
            use futures::StreamExt;
            match tokio::time::timeout(Duration::from_secs(30), subscriber.next()).await {
                Ok(Some(message)) => {
                    let body: Value = serde_json::from_slice(&message.payload).unwrap_or(Value::Null);
                    let error = message.headers.as_ref().is_some_and(|h| h.get("Nats-Service-Error").is_some());
                    if error || message.payload.is_empty() {
                        unanswered += 1;
                        report.fail(trial, format!("an in-flight request got {body} ({:?})", message.headers));
                        continue;
                    }
                    let mut ledger = rig.ledger.lock().unwrap();
                    match kind {
                        0 if body["accepted"] == true => {
                            ledger.outcomes.insert(payload["turnId"].as_str().unwrap().to_string(), true);
                        }
                        1 if body["success"] == true => {
                            let execution = payload["executionId"].as_str().unwrap().to_string();
                            let step = payload["stepId"].as_str().unwrap().to_string();
                            ledger.dispatches.insert((execution, step), body["data"]["n"].as_u64());
                        }
                        2 if body["policyVersion"].is_u64() => {
                            ledger.registrations.insert(payload["slug"].as_str().unwrap().to_string(), true);
                        }
                        3 if body["tier1"].is_array() => {}
                        _ => {
                            drop(ledger);
                            report.fail(trial, format!("an in-flight request was answered {body}"));
                        }
                    }
                }
                _ => {
                    unanswered += 1;
                    report.fail(trial, "an in-flight request was not answered");
                }
            }
        }
        report.lost += unanswered;
        let exit = node.terminate(Duration::from_secs(30));
        match exit {
            Some(status) if status.success() => {}
            other => report.fail(trial, format!("exit after SIGTERM: {other:?}: {}", node.log())),
        }
        node = rig.spawn(binary, &[]);
        if let Err(err) = node.ready(&client).await {
            report.fail(trial, err);
            return report;
        }
        verify(&client, &rig.ledger, &rig.handler, &mut report, trial).await;
        println!("    trial {trial}: {burst} requests in flight, SIGTERM {delay} ms after capdex had them all; exit 0");
    }
    report.acknowledged = rig.ledger.lock().unwrap().counts();
    report
}

/// Mounts a tmpfs of `bytes` at `at` (`Err` when this user cannot).
fn mount_tmpfs(at: &Path, bytes: u64) -> Result<(), String> {
    std::fs::create_dir_all(at).unwrap();
    let output = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
        .arg(at)
        .output()
        .map_err(|err| format!("mount: {err}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("mount -t tmpfs failed: {}", String::from_utf8_lossy(&output.stderr).trim()))
    }
}

async fn disk_full(binary: &Path, trials: usize, mut rng: Rng) -> Report {
    let mut report = Report::new("diskfull", trials);
    let mut rig = Rig::new(5);
    let mount = rig.work.join("tmpfs");
    const RESERVE: u64 = 4 << 20;
    if let Err(why) = mount_tmpfs(&mount, 64 << 20) {
        report.skipped = Some(format!("{why} (needs root; tests/it/faults.rs covers the refusal without a mount)"));
        return report;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mount.clone());
    rig.data = mount.join("data");
    let env = [("CAPDEX_DATA_DIR_MIN_FREE_BYTES", RESERVE.to_string())];
    let client = connect(&rig.nats.url()).await;
    let mut node = rig.spawn(binary, &env);
    node.ready(&client).await.unwrap();
    rig.setup(&client).await;
    let filler = mount.join("filler");
    for trial in 1..=trials {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = start_load(&client, &rig.ledger, trial, 4, &mut rng, &stop);
        tokio::time::sleep(Duration::from_millis(rng.range(100, 600))).await;
        stop_load(&stop, tasks, true).await;
        // Fill the file system to a random point under the reserve, down to its last byte.
        let leave = rng.range(0, RESERVE);
        let free = fs2::available_space(&mount).unwrap();
        let file = std::fs::File::create(&filler).unwrap();
        let _ = fs2::FileExt::allocate(&file, free.saturating_sub(leave));
        drop(file);
        let left = fs2::available_space(&mount).unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        for (subject, payload) in [
            ("capdex.v1.outcome", outcome(&format!("full-{trial}"))),
            ("capdex.v1.capability.register", registration(&format!("full_{trial}"))),
        ] {
            match ask(&client, subject, &payload).await {
                Ok(reply) if reply.error.as_deref() == Some("storage_full") => {
                    report.note(&format!("{subject} refused with storage_full"))
                }
                Ok(reply) => report.fail(trial, format!("{subject} with {left} bytes free: {}", reply.body)),
                Err(err) => report.fail(trial, format!("{subject} while full: {err}")),
            }
        }
        // A dispatch's re-drive claim is in JetStream (shared state), so the
        // call may run; then it must re-drive to its result after the restart.
        let key = (format!("full-{trial}"), "s".to_string());
        rig.ledger.lock().unwrap().dispatches.insert(key.clone(), None);
        match ask(&client, "capdex.v1.dispatch", &dispatch(&key.0, &key.1)).await {
            Ok(reply) if reply.body["success"] == true => {
                report.note("dispatch ran while full (claim in JetStream)");
                rig.ledger.lock().unwrap().dispatches.insert(key, reply.body["data"]["n"].as_u64());
            }
            Ok(reply) if reply.body["error"]["code"] == "unavailable" => report.note("dispatch refused while full"),
            other => report.fail(trial, format!("dispatch while full: {:?}", other.map(|r| r.body))),
        }
        for (subject, payload) in
            [("capdex.v1.discover", json!({"message": "charge"})), ("capdex.v1.capability.list", json!({}))]
        {
            match ask(&client, subject, &payload).await {
                Ok(reply) if reply.error.is_none() => report.note("reads answered while full"),
                other => report.fail(trial, format!("read {subject} while full: {:?}", other.map(|r| r.body))),
            }
        }
        std::fs::remove_file(&filler).unwrap();
        // Writing resumes once space returns.
        let back = Instant::now();
        let resumed = loop {
            let turn = format!("resumed-{trial}-{}", back.elapsed().as_millis());
            rig.ledger.lock().unwrap().outcomes.insert(turn.clone(), false);
            if let Ok(reply) = ask(&client, "capdex.v1.outcome", &outcome(&turn)).await {
                if reply.body["accepted"] == true {
                    rig.ledger.lock().unwrap().outcomes.insert(turn, true);
                    break Some(back.elapsed());
                }
            }
            if back.elapsed() > Duration::from_secs(5) {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if resumed.is_none() {
            report.fail(trial, "writes did not resume within 5 s of the space returning");
        }
        // A crash now: the restart must find everything acknowledged.
        node.kill_9();
        node = rig.spawn(binary, &env);
        if let Err(err) = node.ready(&client).await {
            report.fail(trial, err);
            return report;
        }
        verify(&client, &rig.ledger, &rig.handler, &mut report, trial).await;
        println!(
            "    trial {trial}: filled to {left} bytes free; writes refused, reads answered, writes resumed {:.0} ms after the space returned",
            resumed.unwrap_or_default().as_secs_f64() * 1e3
        );
    }
    report.acknowledged = rig.ledger.lock().unwrap().counts();
    report
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Damages the data dir `dir` at random; says how.
fn damage(dir: &Path, rng: &mut Rng) -> String {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .collect();
    let db = dir.join("db");
    let len = std::fs::metadata(&db).map_or(0, |m| m.len());
    match rng.range(0, 5) {
        0 => {
            let at = rng.range(0, len);
            std::fs::OpenOptions::new().write(true).open(&db).unwrap().set_len(at).unwrap();
            format!("db truncated to {at} of {len} bytes")
        }
        1 | 2 => {
            use std::io::{Seek, SeekFrom};
            let at = rng.range(0, len);
            let n = rng.range(1, 4096);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            let mut file = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
            file.seek(SeekFrom::Start(at)).unwrap();
            file.write_all(&bytes).unwrap();
            format!("{n} random bytes written into db at {at} of {len}")
        }
        3 => {
            let victim = &files[rng.range(0, files.len() as u64) as usize];
            std::fs::remove_file(victim).unwrap();
            format!("{} removed", victim.file_name().unwrap().to_string_lossy())
        }
        _ => {
            let victim = files.iter().find(|f| f.file_name().is_some_and(|n| n.to_string_lossy().starts_with("snap.")));
            match victim {
                Some(snap) => {
                    let len = std::fs::metadata(snap).unwrap().len();
                    let at = rng.range(0, len);
                    std::fs::OpenOptions::new().write(true).open(snap).unwrap().set_len(at).unwrap();
                    format!("snapshot truncated to {at} of {len} bytes")
                }
                None => {
                    std::fs::write(dir.join("conf"), b"not a sled config").unwrap();
                    "conf overwritten".into()
                }
            }
        }
    }
}

async fn corrupt(binary: &Path, trials: usize, mut rng: Rng) -> Report {
    let mut report = Report::new("corrupt", trials);
    let rig = Rig::new(0);
    let client = connect(&rig.nats.url()).await;
    // A good data dir: load, then a clean stop.
    {
        let mut node = rig.spawn(binary, &[]);
        node.ready(&client).await.unwrap();
        rig.setup(&client).await;
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = start_load(&client, &rig.ledger, 0, 4, &mut rng, &stop);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        stop_load(&stop, tasks, true).await;
        let _ = node.terminate(Duration::from_secs(30));
    }
    let expected = rig.ledger.lock().unwrap().counts();
    let good = rig.data.clone();
    for trial in 1..=trials {
        let copy = rig.work.join(format!("damaged-{trial}"));
        copy_dir(&good, &copy);
        let how = damage(&copy, &mut rng);
        let mut node = Node::spawn(binary, &rig.work, &copy, &rig.nats.url(), &[]);
        let started = node.ready(&client).await;
        match started {
            Err(_) => {
                let log = node.log();
                let clear = log.contains("corrupted or truncated") && log.contains("docs/operations.md");
                if log.contains("panicked") {
                    report.fail(trial, format!("{how}: a panic: {log}"));
                } else if !clear {
                    report.fail(trial, format!("{how}: refused without naming the problem and the recovery: {log}"));
                } else {
                    report.note("refused, naming the problem and the recovery");
                }
                println!("    trial {trial}: {how}: refused");
            }
            Ok(()) => {
                // It started: it must hold everything the good dir held.
                let probe = format!("probe-{trial}");
                let counted = ask(&client, "capdex.v1.outcome", &outcome(&probe))
                    .await
                    .ok()
                    .and_then(|r| r.body["kpi"]["sampleCount"].as_u64())
                    .unwrap_or(0);
                let listed = ask(&client, "capdex.v1.capability.list", &json!({}))
                    .await
                    .ok()
                    .and_then(|r| r.body["capabilities"].as_array().map(Vec::len))
                    .unwrap_or(0) as u64;
                if counted != expected.outcomes + 1 || listed < expected.registrations + 1 {
                    report.lost += (expected.outcomes + 1).saturating_sub(counted);
                    report.fail(
                        trial,
                        format!(
                            "{how}: started with {counted} samples (expected {}) and {listed} records (expected at least {})",
                            expected.outcomes + 1,
                            expected.registrations + 1
                        ),
                    );
                } else {
                    report.note("started with everything (the damage hit unused space)");
                }
                println!("    trial {trial}: {how}: started, {counted} samples, {listed} records");
            }
        }
        node.kill_9();
        let _ = std::fs::remove_dir_all(&copy);
    }
    report.acknowledged = expected;
    report
}

async fn second(binary: &Path, trials: usize, mut rng: Rng) -> Report {
    let mut report = Report::new("second", trials);
    let rig = Rig::new(5);
    let client = connect(&rig.nats.url()).await;
    let mut first = rig.spawn(binary, &[]);
    first.ready(&client).await.unwrap();
    rig.setup(&client).await;
    for trial in 1..=trials {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = start_load(&client, &rig.ledger, trial, 4, &mut rng, &stop);
        tokio::time::sleep(Duration::from_millis(rng.range(50, 500))).await;
        let before = rig.ledger.lock().unwrap().counts();
        let mut other = rig.spawn(binary, &[]);
        let deadline = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Ok(Some(status)) = other.child.try_wait() {
                break Some(status);
            }
            if Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        stop_load(&stop, tasks, true).await;
        let log = other.log();
        let named = log.contains("is in use by another capdex process")
            && log.contains(&rig.data.display().to_string())
            && log.contains(&format!("pid {}", first.pid()));
        match status {
            Some(status) if !status.success() && named && !log.contains("panicked") => {
                report.note("refused, naming the dir and the holder's pid")
            }
            other => report.fail(trial, format!("the second process: {other:?}: {log}")),
        }
        // The first one kept answering everything.
        let after = rig.ledger.lock().unwrap().counts();
        let sent = rig.ledger.lock().unwrap();
        let unacked = sent.outcomes.values().filter(|a| !**a).count()
            + sent.registrations.values().filter(|a| !**a).count()
            + sent.dispatches.values().filter(|a| a.is_none()).count();
        drop(sent);
        if unacked > 0 {
            report.fail(trial, format!("{unacked} requests to the first process were not acknowledged"));
        }
        if first.child.try_wait().unwrap().is_some() {
            report.fail(trial, "the first process exited");
            return report;
        }
        println!(
            "    trial {trial}: second process refused; the first acknowledged {} more requests meanwhile",
            (after.outcomes + after.registrations + after.dispatches)
                .saturating_sub(before.outcomes + before.registrations + before.dispatches)
        );
    }
    first.kill_9();
    let mut node = rig.spawn(binary, &[]);
    match node.ready(&client).await {
        Ok(()) => verify(&client, &rig.ledger, &rig.handler, &mut report, trials).await,
        Err(err) => report.fail(trials, err),
    }
    report.acknowledged = rig.ledger.lock().unwrap().counts();
    report
}
