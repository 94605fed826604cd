//! Live sources' figures (issue 19), printed (not criterion), in-process on a
//! real sled store with a real MCP server (`benches/fixtures/fifty_tools.py`,
//! fifty tools on the official Python SDK, over stdio):
//!
//! 1. the upstream's own start-up: start the program, `initialize`, and list
//!    its fifty tools, with capdex's MCP client alone (`upstream::mcp`);
//! 2. `sources.add` of the same server until all fifty are discoverable (in the
//!    catalog discovery serves, and found by a query): the same start-up plus
//!    capdex's mapping, indexing and publishing; the difference is capdex's part;
//! 3. one call through capdex (the Dispatcher: pipeline, schema validation,
//!    provenance, `SourceCalls`) against the same call made directly on an
//!    MCP session to the same server, alternating, one at a time: p50 and p99
//!    of each, and the added latency (p50 of the through-capdex calls minus
//!    p50 of the direct ones; the same for p99).
//!
//! `cargo bench --bench live_sources` runs it in full (release); under `cargo
//! test` (no `--bench` argument) it runs a few rounds as a smoke test. It
//! needs Python with the `mcp` package: `CAPDEX_PYTHON`, else `.venv/bin/python`.

use capdex::actors::discoverer::{CurrentCatalog, Discover};
use capdex::actors::dispatcher::Dispatch;
use capdex::config::{Environment, Settings};
use capdex::core::discovery::DiscoveryFilter;
use capdex::core::dispatch::pipeline::DispatchCall;
use capdex::core::sources::settings::McpConnection;
use capdex::gateway::wire::SourcesRequest;
use capdex::upstream::mcp::{ConnectOptions, McpSession};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var_os("CAPDEX_PYTHON").map(PathBuf::from).unwrap_or_else(|| root.join(".venv/bin/python"));
    assert!(python.is_file(), "{} is missing: run scripts/test.sh (it installs the mcp package)", python.display());
    python
}

fn server_script() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/benches/fixtures/fifty_tools.py").to_string()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn summary(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(|a, b| a.total_cmp(b));
    (percentile(&values, 0.5), percentile(&values, 0.99))
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let (adds, calls) = if full { (7, 3000) } else { (1, 20) };
    let data = tempfile::tempdir().expect("a temp dir");
    let environment: Environment =
        [("CAPDEX_DATA_DIR", data.path().to_str().unwrap()), ("CAPDEX_CAPABILITY_DIRS", "")].into_iter().collect();
    let settings = Settings::load(None, &environment).expect("the built-in settings load");
    let python = python();
    let script = server_script();
    let connection = McpConnection::Stdio {
        command: python.display().to_string(),
        args: vec![script.clone()],
        env: vec![],
        cwd: None,
    };

    actix_rt::System::new().block_on(async move {
        // 1 and 2, alternating: the upstream alone, then through capdex.
        let (actors, store) = capdex::app::start_with_store(&settings, None).await.expect("capdex starts");
        let live = capdex::live::start(&settings, &store, &actors).expect("live sources start");
        let mut startup_ms = Vec::new();
        let mut add_ms = Vec::new();
        for round in 0..adds {
            let started = Instant::now();
            let (session, _changes) = McpSession::connect(&connection, &ConnectOptions::default()).await.expect("connects");
            let tools = session.list_tools(Duration::from_secs(30)).await.expect("lists");
            assert_eq!(tools.len(), 50);
            startup_ms.push(started.elapsed().as_secs_f64() * 1e3);
            drop(session);

            let id = format!("fifty{round}");
            let started = Instant::now();
            let body = json!({"id": id, "kind": "mcp", "command": python, "args": [script]});
            let added = capdex::live::handle(Some(live.clone()), SourcesRequest::Add(body)).await.expect("added");
            assert_eq!(added["source"]["toolCount"], 50, "{added}");
            let catalog = actors.discoverer.send(CurrentCatalog).await.expect("the discoverer answers");
            let offered = catalog.descriptors.keys().filter(|key| key.starts_with(&format!("{id}#"))).count();
            assert_eq!(offered, 50, "all fifty are in the catalog discovery serves");
            let found = actors
                .discoverer
                .send(Discover {
                    query: "archive a shipment by its reference".into(),
                    filter: DiscoveryFilter { category: Some(id.clone()), ..DiscoveryFilter::default() },
                    config: None,
                    explain: false,
                })
                .await
                .expect("the discoverer answers")
                .expect("a discovery");
            assert!(found.tier1.iter().any(|entry| entry.id == format!("{id}#archive_shipment")), "{:?}", found.tier1);
            add_ms.push(started.elapsed().as_secs_f64() * 1e3);
        }
        let (startup_p50, _) = summary(startup_ms.clone());
        let (add_p50, _) = summary(add_ms.clone());
        println!("upstream start-up (start, initialize, tools/list of 50), alone: n={adds} p50={startup_p50:.1} ms all={startup_ms:.1?}");
        println!("sources.add → all 50 discoverable: n={adds} p50={add_p50:.1} ms all={add_ms:.1?}");
        println!("capdex's part (p50 difference): {:.1} ms (target ≤ 500 ms)", add_p50 - startup_p50);

        // 3. One call at a time, alternating through capdex and direct.
        let (direct, _changes) = McpSession::connect(&connection, &ConnectOptions::default()).await.expect("connects");
        let mut through_us = Vec::new();
        let mut direct_us = Vec::new();
        for i in 0..calls {
            let arguments = json!({"reference": format!("r-{i}")});
            let started = Instant::now();
            let answer = direct.call_tool("get_invoice", arguments.clone(), Duration::from_secs(10), None).await;
            direct_us.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(answer.success, "{answer:?}");
            let call = DispatchCall {
                slug: "fifty0#get_invoice".into(),
                arguments,
                agent_id: format!("bench-{}", i % 100),
                execution_id: None,
                step_id: None,
                turn: None,
                approval_id: None,
            };
            let started = Instant::now();
            let answer = actors.dispatcher.send(Dispatch { call }).await.expect("the dispatcher answers");
            through_us.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(answer.success, "{answer:?}");
        }
        let (direct_p50, direct_p99) = summary(direct_us);
        let (through_p50, through_p99) = summary(through_us);
        println!("call get_invoice directly: n={calls} p50={direct_p50:.0} µs p99={direct_p99:.0} µs");
        println!("call get_invoice through capdex: n={calls} p50={through_p50:.0} µs p99={through_p99:.0} µs");
        println!(
            "added latency: p50={:.0} µs (target ≤ 200) p99={:.0} µs (target ≤ 1000)",
            through_p50 - direct_p50,
            through_p99 - direct_p99
        );
        drop(live);
        actix_rt::System::current().stop();
    });
}
