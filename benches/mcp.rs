//! The MCP face's latency (issue 20's target): with 1,000 synthetic
//! capabilities, the `discover_capabilities` round trip over stdio (`capdex
//! mcp`, a child process) and over streamable HTTP (`capdex serve` with
//! `[mcp] listen`), measured in one run beside the same discovery over NATS
//! (`capdex.v1.discover` on that same `capdex serve`). One request in flight,
//! the same queries on every transport; clients are rmcp's (stdio, HTTP) and
//! async-nats, in this process.
//!
//! Both nodes are the `capdex` binary this bench was built with (release for
//! `cargo bench --bench mcp`). The serve node gets its capabilities through
//! `capabilities.upsert`; the stdio node's data dir is indexed from the same
//! catalog first (`capdex index --sources`).
//!
//! Run with `cargo bench --bench mcp` (needs nats-server: `CAPDEX_NATS_SERVER`,
//! `.venv/bin/nats-server` or `PATH`). Without `--bench` or `--full` it runs a
//! small smoke test.

#[path = "../tests/it/support/nats_server.rs"]
mod nats_server;

use rmcp::model::CallToolRequestParams;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench" || arg == "--full");
    let (capabilities, requests) = if full { (1000, 5000) } else { (50, 50) };
    capdex::tls::install_provider();
    let nats = nats_server::NatsServer::start();
    let serve_data = tempfile::tempdir().expect("a data dir");
    let stdio_data = tempfile::tempdir().expect("a data dir");
    let empty = tempfile::tempdir().expect("an empty capability dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let capdex = env!("CARGO_BIN_EXE_capdex");
    let base_env = |data: &std::path::Path| {
        vec![
            ("CAPDEX_DATA_DIR".to_string(), data.display().to_string()),
            ("CAPDEX_CAPABILITY_DIRS".to_string(), empty.path().display().to_string()),
            ("CAPDEX_WATCH".to_string(), "false".to_string()),
            // The built-in embedder, as in the figures of docs/performance.md.
            ("CAPDEX_EMBEDDER_BACKEND".to_string(), "builtin".to_string()),
            ("CAPDEX_METRICS_LISTEN_ADDR".to_string(), String::new()),
            ("CAPDEX_LOG".to_string(), "warn".to_string()),
        ]
    };
    let mut serve = std::process::Command::new(capdex)
        .arg("serve")
        .envs(base_env(serve_data.path()))
        .env("CAPDEX_NATS_URL", nats.url())
        .env("CAPDEX_MCP_LISTEN", &listen)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("capdex serve starts");

    let catalog = tools(capabilities);
    let sources = stdio_data.path().join("sources.json");
    std::fs::write(&sources, json!({ "tools": catalog }).to_string()).unwrap();
    let indexed = std::process::Command::new(capdex)
        .args(["index", "--sources"])
        .arg(&sources)
        .envs(base_env(&stdio_data.path().join("state")))
        .output()
        .expect("capdex index runs");
    assert!(indexed.status.success(), "{}", String::from_utf8_lossy(&indexed.stderr));

    let queries = capdex::bench::synthetic_queries(256);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let nats_client = async_nats::connect(nats.url()).await.expect("bench client connects");
        wait_for_capdex(&nats_client).await;
        register(&nats_client, &catalog).await;
        println!(
            "capdex mcp bench: {capabilities} capabilities, built-in embedder, loopback, one request in flight, {} mode",
            if full { "full" } else { "smoke" }
        );

        let mut stdio_command = tokio::process::Command::new(capdex);
        stdio_command.arg("mcp").envs(base_env(&stdio_data.path().join("state")));
        let (transport, _stderr) = rmcp::transport::TokioChildProcess::builder(stdio_command)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("capdex mcp starts");
        let stdio = ().serve(transport).await.expect("the stdio handshake");
        let http_transport =
            rmcp::transport::StreamableHttpClientTransport::from_uri(format!("http://{listen}/mcp"));
        let http = ().serve(http_transport).await.expect("the HTTP handshake");

        // Every transport sees each query once before timing (warm caches, connections).
        for query in &queries {
            discover_mcp(&stdio, query, capabilities).await;
            discover_mcp(&http, query, capabilities).await;
            discover_nats(&nats_client, query).await;
        }
        let mut timings: [Vec<Duration>; 3] = Default::default();
        for i in 0..requests {
            let query = &queries[i % queries.len()];
            let started = Instant::now();
            discover_mcp(&stdio, query, capabilities).await;
            timings[0].push(started.elapsed());
            let started = Instant::now();
            discover_mcp(&http, query, capabilities).await;
            timings[1].push(started.elapsed());
            let started = Instant::now();
            discover_nats(&nats_client, query).await;
            timings[2].push(started.elapsed());
        }
        for (name, latencies) in
            ["MCP stdio (capdex mcp)", "MCP streamable HTTP (capdex serve)", "NATS capdex.v1.discover"]
                .iter()
                .zip(timings.iter_mut())
        {
            latencies.sort();
            println!(
                "  {name:<36} p50 {:>7.1} µs  p99 {:>7.1} µs  ({} requests)",
                percentile(latencies, 0.50).as_secs_f64() * 1e6,
                percentile(latencies, 0.99).as_secs_f64() * 1e6,
                latencies.len()
            );
        }
        if full {
            let met = percentile(&timings[0], 0.50) <= Duration::from_millis(1);
            println!("  target: stdio p50 <= 1 ms {}", if met { "met" } else { "NOT met" });
        }
        let _ = stdio.cancel().await;
        let _ = http.cancel().await;
    });
    let _ = serve.kill();
    let _ = serve.wait();
    bridge_cost(&base_env(&stdio_data.path().join("bridge")), &sources, &queries, requests);
}

/// What the bridge between rmcp's `Send` handlers and capdex's thread-local
/// `Api` costs: the round trip of an empty job from a task spawned the way
/// rmcp spawns its handlers, and a discovery through the bridge, in-process
/// on an actix System (no transport, no JSON-RPC).
fn bridge_cost(env: &[(String, String)], sources: &std::path::Path, queries: &[String], requests: usize) {
    let environment: capdex::config::Environment = env.iter().cloned().collect();
    let settings = capdex::config::Settings::load(None, &environment).expect("bench settings load");
    let sources = sources.to_path_buf();
    let queries = queries.to_vec();
    actix_rt::System::new().block_on(async move {
        let actors = capdex::app::start(&settings).await.expect("the actors start");
        capdex::app::load_file(&actors, &sources, capdex::app::FileShape::Sources, settings.limits.max_id_bytes)
            .await
            .expect("the catalog loads");
        let bridge = capdex::app::mcp_bridge(&settings, actors, None);
        let timed = tokio::spawn(async move {
            let mut hop = Vec::with_capacity(requests);
            let mut discover = Vec::with_capacity(requests);
            for i in 0..requests + 200 {
                let started = Instant::now();
                bridge.call(|_api| Box::pin(async { Ok(()) })).await.expect("an empty job");
                let hop_time = started.elapsed();
                let request = capdex::gateway::wire::DiscoverRequest {
                    message: queries[i % queries.len()].clone(),
                    ..Default::default()
                };
                let started = Instant::now();
                bridge.call(move |api| api.discover_described(request)).await.expect("a discovery");
                if i >= 200 {
                    hop.push(hop_time);
                    discover.push(started.elapsed());
                }
            }
            (hop, discover)
        });
        let (mut hop, mut discover) = timed.await.expect("the timing task");
        hop.sort();
        discover.sort();
        for (name, latencies) in [("bridge hop (empty job)", &hop), ("discovery through the bridge", &discover)] {
            println!(
                "  {name:<36} p50 {:>7.1} µs  p99 {:>7.1} µs  (in-process, {} requests)",
                percentile(latencies, 0.50).as_secs_f64() * 1e6,
                percentile(latencies, 0.99).as_secs_f64() * 1e6,
                latencies.len()
            );
        }
    });
}

/// The synthetic catalog as registration tools.
fn tools(n: usize) -> Vec<Value> {
    capdex::bench::synthetic_catalog(n)
        .into_iter()
        .map(|descriptor| {
            let mut tool = json!({"name": descriptor.name, "description": descriptor.description});
            if let Some(schema) = descriptor.full_schema {
                tool["inputSchema"] = schema.value();
            }
            tool
        })
        .collect()
}

async fn discover_mcp(client: &rmcp::service::RunningService<rmcp::RoleClient, ()>, query: &str, capabilities: usize) {
    let arguments = json!({ "query": query });
    let params = CallToolRequestParams::new("discover_capabilities")
        .with_arguments(arguments.as_object().cloned().unwrap_or_default());
    let result = client.call_tool(params).await.expect("discover_capabilities answers");
    let body = result.structured_content.expect("structured content");
    let indexed = body["diagnostics"]["totalIndexed"].as_u64().unwrap_or_default() as usize;
    assert!(indexed > capabilities, "the node indexed {indexed}");
}

async fn discover_nats(client: &async_nats::Client, query: &str) {
    let payload = json!({ "message": query }).to_string();
    let reply = client.request("capdex.v1.discover", payload.into()).await.expect("capdex.v1.discover answers");
    assert!(reply.headers.is_none_or(|headers| headers.get("Nats-Service-Error").is_none()));
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
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

/// Registers the catalog through `capabilities.upsert`, 250 per request.
async fn register(client: &async_nats::Client, tools: &[Value]) {
    for chunk in tools.chunks(250) {
        let payload = json!({"runtimeId": "bench", "tools": chunk}).to_string();
        let reply = tokio::time::timeout(
            Duration::from_secs(60),
            client.request("capdex.v1.capabilities.upsert", payload.into()),
        )
        .await
        .expect("upsert within 60 s")
        .expect("upsert answers");
        let answer: Value = serde_json::from_slice(&reply.payload).expect("a JSON reply");
        assert!(answer["version"].as_u64().is_some(), "{answer}");
    }
}
