//! `capdex bench --soak MINUTES`: bounded growth under steady mixed load.
//!
//! It starts a real `nats-server` (JetStream, its store in a temporary dir)
//! and a real `capdex serve` (this binary, a fresh data dir) with short
//! retention limits ([`RETENTION`], printed with the report), so every store
//! that grows reaches its steady state within the warm-up. Then:
//! 1. a ramp measures the capacity: [`WORKERS`] closed-loop clients run the
//!    mixed load for [`SoakOptions::ramp`] and count operations per second;
//! 2. the soak runs the same mix open-loop at half of that rate; every
//!    [`SAMPLE_EVERY`] it reads the service's resident set size and the data
//!    dir's bytes (and `nats-server`'s RSS and store dir, where JetStream keeps
//!    its streams and buckets), and every report interval (a minute) it prints
//!    their mean (capdex's, and its highest sample) over the interval, the
//!    bytes of capdex's stores (the `capdex_store_bytes` gauges at its metrics
//!    endpoint) and the p99 latency of the requests answered in it;
//! 3. at the end it prints, over the intervals after the warm-up, the max/min
//!    ratio of the per-minute means of RSS and of data-dir bytes, and whether
//!    both stayed within 5 % (the verdict), and beside them the ratio of the
//!    highest sample to the lowest, second by second.
//!
//! Why the verdict reads means: a point sample reads the moment, and both
//! figures move within a minute for reasons that are not growth (sled's
//! cache and its log segments are paged in and out, one 512 KiB segment at a
//! time; the allocator returns freed pages as they empty). The per-minute mean
//! is what a dashboard plots (`avg_over_time`); growth moves it, a moment does
//! not. The sample ratio is printed so the moments stay visible.
//!
//! The mix, per ten operations: four discoveries, two outcomes over core NATS,
//! one outcome through the JetStream outcome stream, one registration (an
//! upsert of one of [`TOOLS`] tools, its description changed), one dispatch of
//! the built-in echo registered as not idempotent (`soak_step`) with a fresh
//! executionId (a provenance record and a re-drive result), and one approval round (a call that asks for approval, the
//! approval, the approved call: three requests). Outcomes go to [`SCOPES`]
//! organisations, so the KPI windows are a fixed set of rings.

use crate::config::NatsSettings;
use crate::gateway::service::Gateway;
use serde::Serialize;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the service's RSS and the data dir's bytes are read (or every
/// report interval, when that is shorter).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Closed-loop clients of the capacity ramp.
const WORKERS: usize = 32;
/// Most operations in flight during the soak; one more is counted as shed.
const MAX_IN_FLIGHT: usize = 512;
/// Tools the registrations cycle through.
const TOOLS: usize = 200;
/// Organisations the outcomes are reported for.
const SCOPES: usize = 50;
/// The retention the soak's service runs with (`CAPDEX_RETENTION_*`, `CAPDEX_JETSTREAM_*`).
///
/// Two minutes of age for every store capdex keeps and counts of a few
/// thousand, so every store reaches its steady state (about 3.5 MB of records,
/// a 10 to 16 MB data dir, by the soak's rate) within the warm-up. At that size sled's file moves in
/// steps of its 512 KiB log segments, 3 to 5 % of it each, which is why the verdict
/// reads per-minute means of samples taken every second. (With the counts at
/// their defaults, so the age binds, the stores held 47 MB and the service
/// 230 MB, its p99 rising as sled's cache overflowed: docs/performance.md.)
///
/// The sweep runs every second. A sweep deletes at once what came in over a
/// limit since the last one, so what matters is that inflow against the records
/// kept: in service, a minute of calls against the default counts of a million
/// is 6 % of them at a thousand calls a second; at the soak's rate and counts,
/// five seconds of provenance records were 1.4 times the count (that store
/// swung between its count and 2.4 times it, the approvals between theirs and
/// 2.2 times), and sled's file followed in a sawtooth of 21 to 29 segments
/// (sampled four times a second) whose per-minute means wandered by 5.8 % with
/// no trend. Swept every second the inflow is about a quarter of the count and
/// the file held one length (docs/performance.md, "The sweep's cadence").
/// The JetStream streams keep 5,000 messages, and the approval and re-drive
/// buckets two minutes, as capdex's own stores (they live in `nats-server`'s
/// store, whose RSS and bytes the report shows beside capdex's).
pub const RETENTION: [(&str, &str); 16] = [
    ("CAPDEX_RETENTION_SWEEP_INTERVAL_MS", "1000"),
    ("CAPDEX_RETENTION_PROVENANCE_MAX_AGE_MS", "120000"),
    ("CAPDEX_RETENTION_PROVENANCE_MAX_COUNT", "5000"),
    ("CAPDEX_RETENTION_REDRIVE_MAX_AGE_MS", "120000"),
    ("CAPDEX_RETENTION_REDRIVE_MAX_COUNT", "5000"),
    ("CAPDEX_RETENTION_APPROVALS_MAX_AGE_MS", "120000"),
    ("CAPDEX_RETENTION_APPROVALS_MAX_COUNT", "2000"),
    ("CAPDEX_RETENTION_MEMORY_MAX_AGE_MS", "120000"),
    ("CAPDEX_RETENTION_MEMORY_MAX_COUNT", "1000"),
    ("CAPDEX_RETENTION_OUTCOME_IDS_MAX_AGE_MS", "120000"),
    ("CAPDEX_RETENTION_OUTCOME_IDS_MAX_COUNT", "5000"),
    ("CAPDEX_JETSTREAM_INDEX_MAX_MSGS", "5000"),
    ("CAPDEX_JETSTREAM_OUTCOME_MAX_MSGS", "5000"),
    ("CAPDEX_JETSTREAM_APPROVALS_MAX_AGE_MS", "120000"),
    ("CAPDEX_JETSTREAM_REDRIVE_MAX_AGE_MS", "120000"),
    ("CAPDEX_KPI_ROLLING_WINDOW_SIZE", "200"),
];

/// What to run.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    /// How long the soak runs after the ramp.
    pub duration: Duration,
    /// How often a line is reported (a minute, shorter in tests).
    pub report_every: Duration,
    /// How long the capacity ramp runs.
    pub ramp: Duration,
    /// The warm-up: the report intervals scheduled to end within it are left out of
    /// the flatness figures. `None`: a third of the intervals, at most five minutes.
    pub warmup: Option<Duration>,
    /// The soak's rate in operations a second; `None`: half the capacity the ramp
    /// measured (the ramp runs either way, and its capacity is reported).
    pub rate: Option<f64>,
    /// The `nats-server` binary.
    pub nats_server: PathBuf,
    /// The `capdex` binary to serve with.
    pub capdex: PathBuf,
    /// The NATS client settings (the URL is replaced by the soak's server).
    pub nats: NatsSettings,
}

/// One report interval.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SoakInterval {
    /// Seconds since the soak (after the ramp) began, at the interval's end.
    pub at_s: f64,
    /// The mean of the interval's samples (one every [`SAMPLE_EVERY`]), and the highest and lowest.
    pub rss_bytes: u64,
    pub rss_max_bytes: u64,
    pub rss_min_bytes: u64,
    pub data_dir_bytes: u64,
    pub data_dir_max_bytes: u64,
    pub data_dir_min_bytes: u64,
    /// `nats-server`'s RSS and its store dir's bytes (JetStream streams and
    /// buckets), means of the interval's samples.
    pub nats_rss_bytes: u64,
    pub nats_dir_bytes: u64,
    /// The sum of the service's `capdex_store_bytes` gauges (keys and values of
    /// every measured store, from its last sweep): what capdex keeps, beside the
    /// bytes sled's files take.
    pub store_bytes: u64,
    /// The service's live heap (`capdex_heap_live_bytes`, from its last
    /// retention sweep: the bytes allocated and not freed), beside RSS, which
    /// also counts what the allocator holds freed.
    pub heap_bytes: u64,
    pub p99_ms: f64,
    /// Requests answered in the interval, and those that failed.
    pub requests: u64,
    pub errors: u64,
    /// Operations not started because [`MAX_IN_FLIGHT`] were in flight.
    pub shed: u64,
}

/// The soak's report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SoakReport {
    /// Operations per second the ramp reached, and the rate the soak ran at.
    pub capacity_ops: f64,
    pub target_ops: f64,
    pub retention: Vec<String>,
    pub intervals: Vec<SoakInterval>,
    /// Intervals counted as warm-up (not in the ratios).
    pub warmup_intervals: usize,
    /// Max/min of the per-interval means after the warm-up.
    pub rss_ratio: f64,
    pub data_dir_ratio: f64,
    /// The highest sample over the lowest after the warm-up (moments, not the verdict).
    pub rss_sample_ratio: f64,
    pub data_dir_sample_ratio: f64,
    /// Both ratios of means at most 1.05.
    pub flat: bool,
    /// Ended early by Ctrl-C or SIGTERM (the figures are those measured until then).
    pub interrupted: bool,
}

/// Why the soak could not run.
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    #[error("failed to start {what}: {message}")]
    Start { what: String, message: String },
    #[error("capdex serve did not answer within 60 s: {0}")]
    NotServing(String),
    #[error("setting up the load failed: {0}")]
    Setup(String),
}

/// Ctrl-C or SIGTERM.
type Stop = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16, SoakError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|err| SoakError::Start { what: "a loopback port".into(), message: err.to_string() })
}

fn start(what: &str, command: &mut Command) -> Result<Process, SoakError> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map(Process)
        .map_err(|err| SoakError::Start { what: what.to_string(), message: err.to_string() })
}

/// The resident set size of process `pid` (0 if it cannot be read).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The bytes of every file below `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => dir_bytes(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The metrics endpoint `addr`'s page (empty if unreadable).
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else { return String::new() };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(stream, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

/// The sum of the `capdex_store_bytes` gauges of the stores capdex keeps
/// itself (not the `jetstream_*` buckets, which `nats-server` keeps).
fn store_bytes(metrics: &str) -> u64 {
    sum_gauge(metrics, "capdex_store_bytes{") - sum_gauge(metrics, "capdex_store_bytes{store=\"jetstream_")
}

/// The sum of every sample of the metric whose lines start with `prefix`.
fn sum_gauge(metrics: &str, prefix: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Nearest-rank percentile of `sorted` latencies, in milliseconds.
fn percentile_ms(sorted: &[Duration], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((fraction * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1e3
}

/// The samples of one report interval.
#[derive(Default)]
struct Samples {
    sum: u128,
    count: u64,
    max: u64,
    min: Option<u64>,
}

impl Samples {
    fn add(&mut self, value: u64) {
        self.sum += u128::from(value);
        self.count += 1;
        self.max = self.max.max(value);
        self.min = Some(self.min.map_or(value, |min| min.min(value)));
    }

    /// The mean (0 without samples).
    fn mean(&self) -> u64 {
        if self.count == 0 {
            return 0;
        }
        (self.sum / u128::from(self.count)) as u64
    }

    fn min(&self) -> u64 {
        self.min.unwrap_or(0)
    }
}

/// Max/min of `values` (1 when empty or a minimum of 0).
pub fn ratio(values: impl Iterator<Item = u64>) -> f64 {
    let (min, max) = values.fold((u64::MAX, 0u64), |(min, max), v| (min.min(v), max.max(v)));
    if min == u64::MAX || min == 0 {
        return 1.0;
    }
    max as f64 / min as f64
}

/// What the load records: latencies of the current interval, and counts.
#[derive(Default)]
struct Recorder {
    latencies: Mutex<Vec<Duration>>,
    requests: AtomicU64,
    errors: AtomicU64,
}

impl Recorder {
    fn record(&self, took: Duration, ok: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Ok(mut latencies) = self.latencies.lock() {
            latencies.push(took);
        }
    }

    /// Takes the interval's latencies (sorted) and counts.
    fn take(&self) -> (Vec<Duration>, u64, u64) {
        let mut latencies = self.latencies.lock().map(|mut held| std::mem::take(&mut *held)).unwrap_or_default();
        latencies.sort_unstable();
        (latencies, self.requests.swap(0, Ordering::Relaxed), self.errors.swap(0, Ordering::Relaxed))
    }
}

/// The load's client: one NATS connection and a counter for fresh ids.
struct Load {
    gateway: Gateway,
    next: AtomicU64,
    recorder: Recorder,
    queries: Vec<String>,
}

const TIMEOUT: Duration = Duration::from_secs(10);

impl Load {
    async fn ask(&self, subject: &str, body: &Value) -> Option<Value> {
        let started = Instant::now();
        let answer = self.gateway.request_json(subject, body, TIMEOUT).await;
        self.recorder.record(started.elapsed(), answer.is_ok());
        answer.ok()
    }

    /// One operation of the mix; `n` picks which.
    async fn operation(&self, n: u64) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        match n % 10 {
            0..=3 => {
                let message = &self.queries[(id as usize) % self.queries.len()];
                self.ask("capdex.v1.discover", &json!({"message": message})).await;
            }
            4 | 5 => {
                self.ask("capdex.v1.outcome", &outcome(id)).await;
            }
            6 => {
                self.ask("capdex.v1.js.outcome", &outcome(id)).await;
            }
            7 => {
                let tool = id as usize % TOOLS;
                let body = json!({"runtimeId": "soak", "tools": [{
                    "name": format!("soak_tool_{tool}"),
                    "description": format!("Soak tool {tool}, revision {}: looks up orders, invoices and customers.", id % 7),
                }]});
                self.ask("capdex.v1.capabilities.upsert", &body).await;
            }
            8 => {
                let body = json!({"slug": "soak_step", "agentId": "soak", "arguments": {"text": format!("call {id}")},
                    "executionId": format!("soak-{id}"), "stepId": "1"});
                self.ask("capdex.v1.dispatch", &body).await;
            }
            _ => self.approval_round(id).await,
        }
    }

    /// A call that needs approval, its approval, the approved call.
    async fn approval_round(&self, id: u64) {
        let call = |approval: Option<&str>| {
            json!({"slug": "soak_gated", "agentId": "soak", "arguments": {"text": format!("gated {id}")},
                "approvalId": approval})
        };
        let Some(asked) = self.ask("capdex.v1.dispatch", &call(None)).await else { return };
        let Some(approval) = asked["metadata"]["approvalId"].as_str().map(str::to_string) else { return };
        if self.ask(&format!("capdex.v1.approval.{approval}.approve"), &json!({})).await.is_some() {
            self.ask("capdex.v1.dispatch", &call(Some(&approval))).await;
        }
    }
}

fn outcome(id: u64) -> Value {
    json!({
        "turnId": format!("soak-{id}"),
        "organizationId": format!("org-{}", id as usize % SCOPES),
        "personaId": "assistant",
        "status": if id.is_multiple_of(5) { "failed" } else { "success" },
    })
}

/// Runs the soak (blocking; it makes its own runtime). `progress` gets every
/// line as it is measured.
pub fn run(options: &SoakOptions, progress: &mut dyn FnMut(&str)) -> Result<SoakReport, SoakError> {
    let temp = |what: &str| {
        let path = std::env::temp_dir().join(format!("capdex-soak-{}-{what}", std::process::id()));
        std::fs::create_dir_all(&path)
            .map(|()| TempDir(path))
            .map_err(|err| SoakError::Start { what: format!("a temporary {what} dir"), message: err.to_string() })
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|err| SoakError::Start { what: "a runtime".into(), message: err.to_string() })?;
    // Ctrl-C or SIGTERM ends the soak early: the interval under way is reported, the
    // figures are judged on what was measured, and the children and dirs are removed.
    // Polled once here so the handlers are in place before any child starts (a signal
    // before the soak's first step ends it at that step).
    let mut stop: Stop = Box::pin(crate::app::shutdown_signal());
    let interrupted = runtime.block_on(async {
        tokio::select! {
            biased;
            () = &mut stop => true,
            () = std::future::ready(()) => false,
        }
    });
    let (nats_dir, data_dir, caps_dir) = (temp("nats")?, temp("data")?, temp("caps")?);
    let port = free_port()?;
    let metrics = format!("127.0.0.1:{}", free_port()?);
    let nats_server = start(
        "nats-server",
        Command::new(&options.nats_server)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(nats_dir.path())
            .stderr(Stdio::null()),
    )?;
    let url = format!("nats://127.0.0.1:{port}");
    let mut serve = Command::new(&options.capdex);
    for (name, _) in std::env::vars_os().filter(|(name, _)| name.to_string_lossy().starts_with("CAPDEX_")) {
        serve.env_remove(name);
    }
    serve
        .arg("serve")
        .env("CAPDEX_NATS_URL", &url)
        .env("CAPDEX_DATA_DIR", data_dir.path())
        .env("CAPDEX_CAPABILITY_DIRS", caps_dir.path())
        .env("CAPDEX_WATCH", "false")
        .env("CAPDEX_METRICS_LISTEN_ADDR", &metrics)
        .env("CAPDEX_JETSTREAM_NODE_NAME", "soak")
        .env("CAPDEX_COUNT_HEAP", "1")
        .env("CAPDEX_LOG", "warn")
        .envs(RETENTION)
        .stderr(Stdio::null());
    let serving = start("capdex serve", &mut serve)?;
    let pid = serving.0.id();
    let nats = NatsSettings { url: url.clone(), servers: vec![url], ..options.nats.clone() };
    let watched = Watched { pid, data_dir: data_dir.path(), nats_pid: nats_server.0.id(), nats_dir: nats_dir.path() };
    let report = runtime.block_on(soak(options, nats, watched, &metrics, (stop, interrupted), progress));
    drop(serving);
    report
}

/// The processes and dirs the soak reads every sample.
struct Watched<'a> {
    pid: u32,
    data_dir: &'a Path,
    nats_pid: u32,
    nats_dir: &'a Path,
}

async fn soak(
    options: &SoakOptions,
    nats: NatsSettings,
    watched: Watched<'_>,
    metrics: &str,
    (mut stop, mut interrupted): (Stop, bool),
    progress: &mut dyn FnMut(&str),
) -> Result<SoakReport, SoakError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let gateway = loop {
        match Gateway::connect(&nats).await {
            Ok(gateway) => match gateway.request_json("capdex.v1.discover", &json!({"message": "ping"}), TIMEOUT).await
            {
                Ok(_) => break gateway,
                Err(err) if Instant::now() > deadline => return Err(SoakError::NotServing(err.to_string())),
                Err(_) => {}
            },
            Err(err) if Instant::now() > deadline => return Err(SoakError::NotServing(err.to_string())),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let gated = json!({
        "slug": "soak_gated", "name": "soak_gated", "description": "echo behind an approval", "category": "test",
        "executionType": "internal", "handler": "builtin:echo", "requiresApproval": true, "isIdempotent": false,
        "functionDefinition": {"name": "soak_gated", "description": "echo behind an approval",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}},
    });
    let mut step = gated.clone();
    for (key, value) in [("slug", "soak_step"), ("name", "soak_step"), ("description", "echo, not idempotent")] {
        step[key] = json!(value);
    }
    step["functionDefinition"]["name"] = json!("soak_step");
    step["requiresApproval"] = json!(false);
    for record in [&gated, &step] {
        gateway
            .request_json("capdex.v1.capability.register", record, TIMEOUT)
            .await
            .map_err(|err| SoakError::Setup(format!("registering {}: {err}", record["slug"])))?;
    }
    let load = Arc::new(Load {
        gateway,
        next: AtomicU64::new(0),
        recorder: Recorder::default(),
        queries: crate::bench::synthetic_queries(256),
    });
    for n in 0..10 {
        load.operation(n).await;
    }
    let (_, _, errors) = load.recorder.take();
    if errors > 0 {
        return Err(SoakError::Setup(format!("{errors} of the mix's first ten operations failed")));
    }

    // The ramp: closed loop, WORKERS at a time.
    let ramp_end = Instant::now() + options.ramp;
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS as u64)
        .map(|worker| {
            let (load, done) = (load.clone(), done.clone());
            tokio::spawn(async move {
                let mut n = worker;
                while Instant::now() < ramp_end {
                    load.operation(n).await;
                    done.fetch_add(1, Ordering::Relaxed);
                    n += WORKERS as u64;
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.await;
    }
    let capacity_ops = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    let target_ops = options.rate.unwrap_or(capacity_ops / 2.0).max(1.0);
    let (ramp_latencies, _, ramp_errors) = load.recorder.take();
    let retention: Vec<String> = RETENTION.iter().map(|(name, value)| format!("{name}={value}")).collect();
    let soak_at = match options.rate {
        None => format!("soak at half: {target_ops:.0} ops/s"),
        Some(_) => format!(
            "soak at the rate asked for: {target_ops:.0} ops/s ({:.0} % of capacity)",
            100.0 * target_ops / capacity_ops
        ),
    };
    progress(&format!(
        "capacity (ramp, {WORKERS} closed-loop clients, {:.0} s): {capacity_ops:.0} ops/s (p99 {:.1} ms, {ramp_errors} errors); {soak_at}",
        options.ramp.as_secs_f64(),
        percentile_ms(&ramp_latencies, 0.99),
    ));
    progress(&format!(
        "retention for the soak (short, to reach steady state within the warm-up): {}",
        retention.join(" ")
    ));

    // The soak: open loop at target_ops.
    let in_flight = Arc::new(AtomicU64::new(0));
    let mut shed = 0u64;
    let period = Duration::from_secs_f64(1.0 / target_ops);
    let soak_start = Instant::now();
    let soak_end = soak_start + options.duration;
    let mut next_report = soak_start + options.report_every;
    let mut next_op = soak_start;
    let mut n = 0u64;
    let mut intervals = Vec::new();
    let sample_every = SAMPLE_EVERY.min(options.report_every);
    let mut next_sample = soak_start;
    let (mut rss, mut data) = (Samples::default(), Samples::default());
    let (mut nats_rss, mut nats_data) = (Samples::default(), Samples::default());
    progress("      at_s  rss_MB (max) heap_MB  data_dir_MB (max)  stores_MB  nats_MB  nats_dir_MB    p99_ms  requests  errors  shed");
    loop {
        let now = Instant::now();
        if now >= next_sample {
            rss.add(rss_bytes(watched.pid));
            data.add(dir_bytes(watched.data_dir));
            nats_rss.add(rss_bytes(watched.nats_pid));
            nats_data.add(dir_bytes(watched.nats_dir));
            while next_sample <= now {
                next_sample += sample_every;
            }
        }
        if now >= next_report || now >= soak_end || interrupted {
            let (latencies, requests, errors) = load.recorder.take();
            let (rss, data) = (std::mem::take(&mut rss), std::mem::take(&mut data));
            let (nats_rss, nats_data) = (std::mem::take(&mut nats_rss), std::mem::take(&mut nats_data));
            let page = scrape(metrics);
            let interval = SoakInterval {
                at_s: soak_start.elapsed().as_secs_f64(),
                rss_bytes: rss.mean(),
                rss_max_bytes: rss.max,
                rss_min_bytes: rss.min(),
                data_dir_bytes: data.mean(),
                data_dir_max_bytes: data.max,
                data_dir_min_bytes: data.min(),
                nats_rss_bytes: nats_rss.mean(),
                nats_dir_bytes: nats_data.mean(),
                store_bytes: store_bytes(&page),
                heap_bytes: sum_gauge(&page, "capdex_heap_live_bytes "),
                p99_ms: percentile_ms(&latencies, 0.99),
                requests,
                errors,
                shed: std::mem::take(&mut shed),
            };
            progress(&format!(
                "{:10.0} {:7.1} {:5.0} {:7.1} {:12.1} {:5.1} {:10.2} {:8.1} {:12.1} {:9.2} {:9} {:7} {:5}",
                interval.at_s,
                interval.rss_bytes as f64 / 1e6,
                interval.rss_max_bytes as f64 / 1e6,
                interval.heap_bytes as f64 / 1e6,
                interval.data_dir_bytes as f64 / 1e6,
                interval.data_dir_max_bytes as f64 / 1e6,
                interval.store_bytes as f64 / 1e6,
                interval.nats_rss_bytes as f64 / 1e6,
                interval.nats_dir_bytes as f64 / 1e6,
                interval.p99_ms,
                interval.requests,
                interval.errors,
                interval.shed
            ));
            intervals.push(interval);
            if now >= soak_end || interrupted {
                break;
            }
            next_report += options.report_every;
        }
        while next_op <= now {
            if in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT as u64 {
                shed += 1;
            } else {
                in_flight.fetch_add(1, Ordering::Relaxed);
                let (load, in_flight) = (load.clone(), in_flight.clone());
                let op = n;
                tokio::spawn(async move {
                    load.operation(op).await;
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                });
            }
            n += 1;
            next_op += period;
        }
        let wake = next_op.min(next_report).min(soak_end).min(next_sample);
        tokio::select! {
            () = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => {}
            () = &mut stop, if !interrupted => interrupted = true,
        }
    }
    if interrupted {
        progress(&format!(
            "interrupted after {:.1} of {:.1} minutes",
            soak_start.elapsed().as_secs_f64() / 60.0,
            options.duration.as_secs_f64() / 60.0
        ));
    }
    let warmup_intervals = warmup_intervals(&intervals, options.report_every, options.warmup);
    let steady = &intervals[warmup_intervals.min(intervals.len())..];
    let rss_ratio = ratio(steady.iter().map(|interval| interval.rss_bytes));
    let data_dir_ratio = ratio(steady.iter().map(|interval| interval.data_dir_bytes));
    // Every interval's highest and lowest second: their max/min is the highest second over the lowest.
    let rss_sample_ratio = ratio(steady.iter().flat_map(|interval| [interval.rss_max_bytes, interval.rss_min_bytes]));
    let data_dir_sample_ratio =
        ratio(steady.iter().flat_map(|interval| [interval.data_dir_max_bytes, interval.data_dir_min_bytes]));
    Ok(SoakReport {
        capacity_ops,
        target_ops,
        retention,
        intervals,
        warmup_intervals,
        rss_ratio,
        data_dir_ratio,
        rss_sample_ratio,
        data_dir_sample_ratio,
        flat: rss_ratio <= 1.05 && data_dir_ratio <= 1.05,
        interrupted,
    })
}

/// The intervals of the warm-up: those scheduled to end within `warmup` (an
/// interval is reported a moment after its end, so its `at_s` is not used),
/// or, when it is not given, a third of the intervals, at most five minutes' worth.
fn warmup_intervals(intervals: &[SoakInterval], report_every: Duration, warmup: Option<Duration>) -> usize {
    match warmup {
        Some(warmup) => {
            let within = (warmup.as_secs_f64() / report_every.as_secs_f64().max(1e-3) + 1e-9).floor();
            (within as usize).min(intervals.len())
        }
        None => {
            let per_interval = report_every.as_secs_f64().max(1e-3);
            (intervals.len() / 3).min((300.0 / per_interval).ceil() as usize)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_and_percentiles() {
        assert_eq!(ratio([100, 105, 102].into_iter()), 1.05);
        assert_eq!(ratio(std::iter::empty()), 1.0);
        let sorted: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&sorted, 0.99), 99.0);
        assert_eq!(percentile_ms(&[], 0.99), 0.0);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/f"), [0u8; 10]).unwrap();
        std::fs::write(dir.path().join("g"), [0u8; 5]).unwrap();
        assert_eq!(dir_bytes(dir.path()), 15);
        assert!(rss_bytes(std::process::id()) > 0);
        let metrics = "# TYPE capdex_store_bytes gauge\ncapdex_store_bytes{store=\"kpi\"} 506\ncapdex_store_bytes{store=\"provenance\"} 1196\ncapdex_store_bytes{store=\"jetstream_redrive\"} 4000\ncapdex_store_disk_bytes 9\ncapdex_heap_live_bytes 77\n";
        assert_eq!(sum_gauge(metrics, "capdex_store_bytes{"), 5702);
        assert_eq!(store_bytes(metrics), 1702, "the buckets are nats-server's");
        assert_eq!(sum_gauge(metrics, "capdex_heap_live_bytes "), 77);
    }

    #[test]
    fn samples_give_the_mean_the_highest_and_the_lowest() {
        let mut samples = Samples::default();
        assert_eq!((samples.mean(), samples.max, samples.min()), (0, 0, 0));
        for value in [120, 100, 110] {
            samples.add(value);
        }
        assert_eq!((samples.mean(), samples.max, samples.min()), (110, 120, 100));
    }

    #[test]
    fn the_warm_up_is_the_intervals_ending_within_it_or_a_third_at_most_five_minutes() {
        let interval = |at_s: f64| SoakInterval {
            at_s,
            rss_bytes: 1,
            rss_max_bytes: 1,
            rss_min_bytes: 1,
            data_dir_bytes: 1,
            data_dir_max_bytes: 1,
            data_dir_min_bytes: 1,
            nats_rss_bytes: 1,
            nats_dir_bytes: 1,
            store_bytes: 0,
            heap_bytes: 0,
            p99_ms: 0.0,
            requests: 0,
            errors: 0,
            shed: 0,
        };
        // Each reported a moment after its end, as the soak reports them.
        let intervals: Vec<SoakInterval> = (1..=40).map(|minute| interval(minute as f64 * 60.0 + 0.05)).collect();
        let minute = Duration::from_secs(60);
        let warmup = |intervals: &[SoakInterval], seconds: Option<u64>| {
            warmup_intervals(intervals, minute, seconds.map(Duration::from_secs))
        };
        assert_eq!(warmup(&intervals, None), 5, "five minutes at most");
        assert_eq!(warmup(&intervals[..9], None), 3, "a third");
        assert_eq!(warmup(&intervals, Some(600)), 10, "the last 30 of 40 minutes are judged");
        assert_eq!(warmup(&intervals, Some(0)), 0);
        assert_eq!(warmup(&intervals, Some(300)), 5, "--soak-warmup 5 leaves out five minutes");
        assert_eq!(warmup(&intervals, Some(330)), 5);
        assert_eq!(warmup(&intervals, Some(3_000)), 40);
    }
}
