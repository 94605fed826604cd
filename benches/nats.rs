//! The load benchmark over loopback NATS (issue 5's targets): a real
//! nats-server with JetStream, `capdex serve` in-process on its actix System
//! (one thread, as in production), 1,000 synthetic capabilities registered
//! through `capabilities.upsert`, the configured embedder (the default:
//! static; before 2026-12-05, the built-in one).
//!
//! Measures, from a separate client:
//! - a bare async-nats echo responder (its own thread and current-thread
//!   runtime, like capdex): latency with one request in flight, throughput with 64;
//! - `capdex.v1.discover`: p50/p99 with one in flight, requests/s with 64 in flight;
//! - outcome ingestion on core NATS (`capdex.v1.outcome` requests, each
//!   answered once durable), with many in flight; with an external node
//!   (`CAPDEX_BENCH_SERVE_BIN`) also the node's CPU time per outcome, which
//!   other processes' load does not change the way it changes events/s;
//! - alert latency: per fresh scope, 7 failed outcomes (acknowledged), then
//!   the time from publishing the 8th, which crosses the threshold, until its
//!   alert event arrives on `capdex.v1.alert.>`;
//! - outcome ingestion via JetStream (`capdex.v1.js.outcome`, stored by
//!   JetStream, then recorded and acknowledged by the node's durable consumer),
//!   from the first publish until the consumer has acknowledged the last one.
//!
//! Run with `cargo bench --bench nats` (needs nats-server: `CAPDEX_NATS_SERVER`,
//! `.venv/bin/nats-server` or `PATH`). Without `--bench` or `--full` (e.g.
//! `cargo test --benches`) it runs once on a small catalog as a smoke test.
//! With `CAPDEX_BENCH_SERVE_BIN=<path to a capdex binary>` the node is that
//! binary's `capdex serve` instead of in-process (e.g. a release build driven
//! by a debug build of this client: `cargo test --bench nats -- --full`).

#[path = "../tests/it/support/nats_server.rs"]
mod nats_server;

/// The allocator the `capdex` binary runs on (see `src/main.rs`), so an
/// in-process node measures as a served one does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use bytes::Bytes;
use futures::StreamExt;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Sizes of one run.
struct Plan {
    capabilities: usize,
    latency_requests: usize,
    throughput_requests: usize,
    outcomes: usize,
    /// Scopes driven into an alert, one latency each.
    alert_scopes: usize,
}

const IN_FLIGHT: usize = 64;
const OUTCOME_IN_FLIGHT: usize = 1024;
const NODE_NAME: &str = "bench";

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench" || arg == "--full");
    let plan = if full {
        Plan {
            capabilities: 1000,
            latency_requests: 5000,
            throughput_requests: 100_000,
            outcomes: 100_000,
            alert_scopes: 200,
        }
    } else {
        Plan { capabilities: 50, latency_requests: 50, throughput_requests: 500, outcomes: 500, alert_scopes: 5 }
    };
    let nats = nats_server::NatsServer::start();
    let data = tempfile::tempdir().expect("a temporary data dir");
    let caps = tempfile::tempdir().expect("a temporary capability dir");
    let env: BTreeMap<String, String> = [
        ("CAPDEX_NATS_URL", nats.url()),
        ("CAPDEX_DATA_DIR", data.path().display().to_string()),
        ("CAPDEX_CAPABILITY_DIRS", caps.path().display().to_string()),
        ("CAPDEX_WATCH", "false".into()),
        ("CAPDEX_METRICS_LISTEN_ADDR", String::new()),
        ("CAPDEX_JETSTREAM_NODE_NAME", NODE_NAME.into()),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect();
    let serve_bin = std::env::var_os("CAPDEX_BENCH_SERVE_BIN");
    let mut external = serve_bin.as_ref().map(|bin| {
        std::process::Command::new(bin)
            .arg("serve")
            .env_remove("CAPDEX_BENCH_SERVE_BIN")
            .envs(&env)
            .env("CAPDEX_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("CAPDEX_BENCH_SERVE_BIN runs")
    });
    // capdex serve, in-process, on its own thread (unless an external binary serves).
    let (stop_serving, stopped) = futures::channel::oneshot::channel::<()>();
    let server = external.is_none().then(|| {
        let settings = capdex::config::Settings::load(None, &env.clone().into()).expect("bench settings load");
        std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                capdex::app::serve_until(&settings, async {
                    let _ = stopped.await;
                })
                .await
                .expect("capdex serves");
            })
        })
    });
    // A bare echo responder, for comparison, on its own thread and current-thread runtime.
    let echo_url = nats.url();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let client = async_nats::connect(echo_url).await.expect("echo responder connects");
            let mut requests = client.subscribe("bench.echo").await.unwrap();
            while let Some(request) = requests.next().await {
                if let Some(reply) = request.reply {
                    let _ = client.publish(reply, request.payload).await;
                }
            }
        })
    });

    let serve_pid = external.as_ref().map(|child| child.id());
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let client = async_nats::connect(nats.url()).await.expect("bench client connects");
        wait_for_capdex(&client).await;
        register(&client, plan.capabilities).await;
        println!(
            "capdex nats bench: {} capabilities, default embedder, loopback, {} mode, node {}",
            plan.capabilities,
            if full { "full" } else { "smoke" },
            serve_bin.as_ref().map_or("in-process".to_string(), |bin| format!("{}", bin.to_string_lossy()))
        );

        let echo = vec![Bytes::from_static(b"{\"message\":\"ping\"}")];
        let latency = latencies(&client, "bench.echo", &echo, plan.latency_requests).await;
        let rate = throughput(&client, "bench.echo", &echo, plan.throughput_requests).await;
        report("echo (bare async-nats)", &latency, rate);

        let queries: Vec<Bytes> = capdex::bench::synthetic_queries(256)
            .into_iter()
            .map(|query| Bytes::from(json!({ "message": query }).to_string()))
            .collect();
        let latency = latencies(&client, "capdex.v1.discover", &queries, plan.latency_requests).await;
        let cpu_before = [serve_cpu_secs(serve_pid), serve_cpu_secs(nats.pid()), serve_cpu_secs(Some(std::process::id()))];
        let rate = throughput(&client, "capdex.v1.discover", &queries, plan.throughput_requests).await;
        report("capdex.v1.discover", &latency, rate);
        let cpu_after = [serve_cpu_secs(serve_pid), serve_cpu_secs(nats.pid()), serve_cpu_secs(Some(std::process::id()))];
        let per_request: Vec<String> = ["capdex serve", "nats-server", "bench client"]
            .iter()
            .zip(cpu_before.iter().zip(&cpu_after))
            .filter_map(|(name, (before, after))| {
                Some(format!("{name} {:.1} µs", (after.as_ref()? - before.as_ref()?) * 1e6 / plan.throughput_requests as f64))
            })
            .collect();
        println!("  CPU per request at {IN_FLIGHT} in flight: {}", per_request.join(", "));
        if full {
            println!(
                "  targets: p50 <= 1 ms {}, p99 <= 5 ms {}, >= 20,000 req/s {}",
                verdict(percentile(&latency, 0.50) <= Duration::from_millis(1)),
                verdict(percentile(&latency, 0.99) <= Duration::from_millis(5)),
                verdict(rate >= 20_000.0)
            );
        }

        let cpu_before = serve_cpu_secs(serve_pid);
        let core_rate = core_outcomes(&client, plan.outcomes).await;
        println!(
            "outcome ingestion, core NATS (capdex.v1.outcome, durable before reply, {OUTCOME_IN_FLIGHT} in flight): {core_rate:.0} events/s{}{}",
            if full { format!(" (target >= 50,000: {})", verdict(core_rate >= 50_000.0)) } else { String::new() },
            cpu_per_outcome(cpu_before, serve_cpu_secs(serve_pid), plan.outcomes)
        );
        let cpu_before = serve_cpu_secs(serve_pid);
        let (publish_rate, ingest_rate) = jetstream_outcomes(&client, plan.outcomes).await;
        println!(
            "outcome ingestion, JetStream (capdex.v1.js.outcome): published and stored {publish_rate:.0} events/s; \
             recorded and acknowledged by the node {ingest_rate:.0} events/s end to end{}",
            cpu_per_outcome(cpu_before, serve_cpu_secs(serve_pid), plan.outcomes)
        );
        let alerts = alert_latencies(&client, plan.alert_scopes).await;
        println!(
            "alert latency (outcome crossing the threshold → alert event, over NATS, {} scopes): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms{}",
            alerts.len(),
            percentile(&alerts, 0.50).as_secs_f64() * 1e3,
            percentile(&alerts, 0.99).as_secs_f64() * 1e3,
            alerts.last().map_or(0.0, |max| max.as_secs_f64() * 1e3),
            if full {
                format!(" (target p99 <= 50 ms: {})", verdict(percentile(&alerts, 0.99) <= Duration::from_millis(50)))
            } else {
                String::new()
            }
        );
    });
    let _ = stop_serving.send(());
    if let Some(server) = server {
        server.join().expect("capdex stops");
    }
    if let Some(child) = external.as_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// CPU seconds (user + system, all threads) a process (the external `capdex
/// serve`, nats-server or this client) has used so far, from `/proc/<pid>/stat` (in USER_HZ = 100 ticks).
/// The outcome sections print it per outcome: a figure that, unlike events/s,
/// does not depend on how much CPU other processes on the machine take.
fn serve_cpu_secs(pid: Option<u32>) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    // The fields after the command name (which may hold spaces) in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index).and_then(|field| field.parse::<u64>().ok());
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    Some((ticks(11)? + ticks(12)?) as f64 / 100.0)
}

fn cpu_per_outcome(before: Option<f64>, after: Option<f64>, outcomes: usize) -> String {
    match (before, after) {
        (Some(before), Some(after)) => {
            format!("; capdex serve CPU {:.1} µs per outcome", (after - before) * 1e6 / outcomes as f64)
        }
        _ => String::new(),
    }
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

async fn wait_for_capdex(client: &async_nats::Client) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ping =
            tokio::time::timeout(Duration::from_millis(500), client.request("$SRV.PING.capdex", "".into())).await;
        if matches!(ping, Ok(Ok(_))) {
            return;
        }
        assert!(Instant::now() < deadline, "capdex did not answer $SRV.PING within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Registers `n` synthetic capabilities through `capabilities.upsert`, 250 per request.
async fn register(client: &async_nats::Client, n: usize) {
    let tools: Vec<serde_json::Value> = capdex::bench::synthetic_catalog(n)
        .into_iter()
        .map(|descriptor| {
            let mut tool = json!({"name": descriptor.name, "description": descriptor.description});
            if let Some(schema) = descriptor.full_schema {
                tool["inputSchema"] = schema.value();
            }
            tool
        })
        .collect();
    for chunk in tools.chunks(250) {
        let payload = json!({"runtimeId": "bench", "tools": chunk}).to_string();
        let reply = tokio::time::timeout(
            Duration::from_secs(60),
            client.request("capdex.v1.capabilities.upsert", payload.into()),
        )
        .await
        .expect("upsert answered within 60 s")
        .expect("upsert succeeds");
        let body: serde_json::Value = serde_json::from_slice(&reply.payload).expect("upsert reply is JSON");
        assert!(body.get("code").is_none(), "upsert refused: {body}");
    }
}

/// Sends `n` requests one at a time (after a warm-up) and returns their latencies, sorted.
async fn latencies(client: &async_nats::Client, subject: &str, payloads: &[Bytes], n: usize) -> Vec<Duration> {
    for payload in payloads.iter().cycle().take(n.min(200)) {
        client.request(subject.to_string(), payload.clone()).await.expect("warm-up request");
    }
    let mut times = Vec::with_capacity(n);
    for payload in payloads.iter().cycle().take(n) {
        let started = Instant::now();
        let reply = client.request(subject.to_string(), payload.clone()).await.expect("request");
        times.push(started.elapsed());
        assert!(reply.headers.as_ref().is_none_or(|h| h.get("Nats-Service-Error").is_none()), "error reply");
    }
    times.sort();
    times
}

/// Sends `n` requests with [`IN_FLIGHT`] in flight; returns requests per second.
async fn throughput(client: &async_nats::Client, subject: &str, payloads: &[Bytes], n: usize) -> f64 {
    let started = Instant::now();
    let replies: Vec<usize> = futures::stream::iter(payloads.iter().cycle().take(n).cloned())
        .map(|payload| {
            let client = client.clone();
            let subject = subject.to_string();
            async move {
                let reply = client.request(subject, payload).await.expect("every request is answered");
                let error = reply.headers.as_ref().and_then(|headers| headers.get("Nats-Service-Error"));
                assert!(error.is_none(), "an error reply: {error:?}");
                reply.payload.len()
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    println!("  {subject}: {:.0} bytes per reply on average", replies.iter().sum::<usize>() as f64 / n.max(1) as f64);
    rate
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn report(what: &str, latency: &[Duration], throughput: f64) {
    println!(
        "{what}: one in flight p50 {:.0} µs, p99 {:.0} µs ({} requests); {IN_FLIGHT} in flight {throughput:.0} req/s",
        percentile(latency, 0.50).as_secs_f64() * 1e6,
        percentile(latency, 0.99).as_secs_f64() * 1e6,
        latency.len()
    );
}

fn outcome(i: usize, prefix: &str) -> Bytes {
    let report = json!({
        "turnId": format!("{prefix}-{i}"),
        "organizationId": format!("org-{}", i % 100),
        "personaId": "assistant",
        "status": if i.is_multiple_of(4) { "failed" } else { "success" },
    });
    Bytes::from(report.to_string())
}

/// Sends `n` outcome requests; returns outcomes per second (each acknowledged once durable).
async fn core_outcomes(client: &async_nats::Client, n: usize) -> f64 {
    let payloads: Vec<Bytes> = (0..n).map(|i| outcome(i, "core")).collect();
    let started = Instant::now();
    let accepted = futures::stream::iter(payloads)
        .map(|payload| {
            let client = client.clone();
            async move {
                let reply = client.request("capdex.v1.outcome", payload).await.expect("outcome answered");
                serde_json::from_slice::<serde_json::Value>(&reply.payload).is_ok_and(|body| body["accepted"] == true)
            }
        })
        .buffer_unordered(OUTCOME_IN_FLIGHT)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    assert_eq!(accepted, n, "every outcome is accepted");
    n as f64 / started.elapsed().as_secs_f64()
}

/// Publishes `n` outcomes with JetStream; returns (stored per second, recorded and acked per second).
async fn jetstream_outcomes(client: &async_nats::Client, n: usize) -> (f64, f64) {
    let jetstream = async_nats::jetstream::new(client.clone());
    let payloads: Vec<(String, Bytes)> = (0..n).map(|i| (format!("js-{i}"), outcome(i, "js"))).collect();
    let started = Instant::now();
    let stored = futures::stream::iter(payloads)
        .map(|(id, payload)| {
            let jetstream = jetstream.clone();
            async move {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", id.as_str());
                let ack = jetstream.publish_with_headers("capdex.v1.js.outcome", headers, payload).await;
                match ack {
                    Ok(ack) => ack.await.is_ok(),
                    Err(_) => false,
                }
            }
        })
        .buffer_unordered(OUTCOME_IN_FLIGHT)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    assert_eq!(stored, n, "JetStream stores every outcome");
    let publish_rate = n as f64 / started.elapsed().as_secs_f64();
    let stream = jetstream.get_stream("CAPDEX_OUTCOMES").await.expect("the outcome stream exists");
    let consumer: async_nats::jetstream::consumer::PullConsumer =
        stream.get_consumer(&format!("capdex-kpi-{NODE_NAME}")).await.expect("the node's consumer exists");
    let last = stream.get_info().await.expect("stream info").state.last_sequence;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let info = consumer.get_info().await.expect("consumer info");
        if info.ack_floor.stream_sequence >= last {
            break;
        }
        assert!(Instant::now() < deadline, "the node did not acknowledge every outcome within 600 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (publish_rate, n as f64 / started.elapsed().as_secs_f64())
}

/// Drives `scopes` fresh scopes into an alert; returns the latencies from the
/// crossing outcome's publish to its alert event, sorted.
async fn alert_latencies(client: &async_nats::Client, scopes: usize) -> Vec<Duration> {
    let mut alerts = client.subscribe("capdex.v1.alert.>").await.expect("subscribes to alerts");
    client.flush().await.expect("the subscription reaches the server");
    let failed = |scope: usize, turn: usize| {
        let report = json!({
            "turnId": format!("alert-{scope}-{turn}"),
            "organizationId": "alerting",
            "personaId": format!("persona-{scope}"),
            "status": "failed",
        });
        Bytes::from(report.to_string())
    };
    let mut latencies = Vec::with_capacity(scopes);
    for scope in 0..scopes {
        for turn in 0..7 {
            client.request("capdex.v1.outcome", failed(scope, turn)).await.expect("outcome answered");
        }
        let expected = format!("persona-{scope}");
        let started = Instant::now();
        client.publish("capdex.v1.outcome", failed(scope, 7)).await.expect("publishes");
        loop {
            let alert = tokio::time::timeout(Duration::from_secs(10), alerts.next())
                .await
                .expect("an alert within 10 s")
                .expect("the alert subscription stays open");
            if alert.subject.ends_with(&expected) {
                break;
            }
        }
        latencies.push(started.elapsed());
    }
    latencies.sort();
    latencies
}
