//! The operator console's pages, timed end to end on loopback: a real
//! nats-server, `capdex serve` in this process with `[console] listen`, a
//! catalog of synthetic capabilities (`capabilities.upsert`), KPI scopes fed
//! by outcomes (three each), pending approvals, then each page fetched one at
//! a time with keep-alive: p50, p99 and max of the whole request (the page's
//! data asked of the actors, rendered, sent), whole document and the content
//! alone that live updates fetch.
//!
//! `cargo bench --bench console` runs it in full (10,000 capabilities, 1,000
//! scopes, 50 approvals, 200 requests per page); under `cargo test` (no
//! `--bench` argument) it runs once on a small catalog as a smoke test. Needs
//! nats-server (`CAPDEX_NATS_SERVER`, as the integration tests).

#[path = "../tests/it/support/nats_server.rs"]
mod nats_server;

/// The allocator the `capdex` binary runs on, so the node measures as a served one does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

struct Plan {
    capabilities: usize,
    scopes: usize,
    approvals: usize,
    requests: usize,
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench" || arg == "--full");
    let plan = if full {
        Plan { capabilities: 10_000, scopes: 1_000, approvals: 50, requests: 200 }
    } else {
        Plan { capabilities: 100, scopes: 20, approvals: 3, requests: 5 }
    };
    capdex::tls::install_provider();
    let nats = nats_server::NatsServer::start();
    let data = tempfile::tempdir().expect("a temporary data dir");
    let caps = tempfile::tempdir().expect("a temporary capability dir");
    let console = format!("127.0.0.1:{}", nats_server::free_port());
    let env: BTreeMap<String, String> = [
        ("CAPDEX_NATS_URL", nats.url()),
        ("CAPDEX_DATA_DIR", data.path().display().to_string()),
        ("CAPDEX_CAPABILITY_DIRS", caps.path().display().to_string()),
        ("CAPDEX_WATCH", "false".into()),
        // The built-in embedder, as in the figures of docs/performance.md.
        ("CAPDEX_EMBEDDER_BACKEND", "builtin".into()),
        ("CAPDEX_METRICS_LISTEN_ADDR", String::new()),
        ("CAPDEX_CONSOLE_LISTEN", console.clone()),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect();
    let settings = capdex::config::Settings::load(None, &env.into()).expect("bench settings load");
    let (stop_serving, stopped) = futures::channel::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            capdex::app::serve_until(&settings, async {
                let _ = stopped.await;
            })
            .await
            .expect("capdex serves");
        })
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let client = async_nats::connect(nats.url()).await.expect("bench client connects");
        wait_for_capdex(&client).await;
        let started = Instant::now();
        let added = register(&client, plan.capabilities).await;
        report_scopes(&client, plan.scopes).await;
        ask_approvals(&client, plan.approvals).await;
        println!(
            "capdex console bench: {} capabilities, {} KPI scopes, {} pending approvals ({} mode; set up in {:.1} s)",
            plan.capabilities,
            plan.scopes,
            plan.approvals,
            if full { "full" } else { "smoke" },
            started.elapsed().as_secs_f64()
        );
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        // (`capabilities.list` would not do: at 10k capabilities its reply is over NATS's payload limit.)
        let detail = format!("/capabilities/{}", added[added.len() / 2]);
        let pages = [
            "/approvals",
            "/kpis",
            "/capabilities",
            "/capabilities?q=send%20message&page=2",
            detail.as_str(),
            "/sources",
            "/playground?message=send%20an%20email%20to%20the%20team%20about%20the%20release",
        ];
        println!(
            "{:<62} {:>9} {:>9} {:>9} {:>9}",
            "page (whole document / content alone)", "p50 ms", "p99 ms", "max ms", "KiB"
        );
        for path in pages {
            for fragment in [false, true] {
                let (times, bytes) = fetch(&http, &format!("http://{console}{path}"), fragment, plan.requests).await;
                let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
                let shown: String = path.chars().take(48).collect();
                let more = if shown.len() < path.len() { "…" } else { "" };
                let label = format!("{shown}{more}{}", if fragment { " (content)" } else { "" });
                println!(
                    "{label:<62} {:>9.2} {:>9.2} {:>9.2} {:>9.1}",
                    at(0.5),
                    at(0.99),
                    at(1.0),
                    bytes as f64 / 1024.0
                );
            }
        }
        live_latency(&client, &http, &console, plan.requests.min(100)).await;
    });
    let _ = stop_serving.send(());
    let _ = server.join();
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

async fn ask(client: &async_nats::Client, subject: &str, body: Value) -> Value {
    let reply =
        tokio::time::timeout(Duration::from_secs(60), client.request(subject.to_string(), body.to_string().into()))
            .await
            .unwrap_or_else(|_| panic!("{subject} answered within 60 s"))
            .unwrap_or_else(|err| panic!("{subject}: {err}"));
    serde_json::from_slice(&reply.payload).expect("a JSON reply")
}

/// Registers `n` synthetic capabilities through `capabilities.upsert`, 250 per
/// request, and returns the ids the upserts added.
async fn register(client: &async_nats::Client, n: usize) -> Vec<String> {
    let tools: Vec<Value> = capdex::bench::synthetic_catalog(n)
        .into_iter()
        .map(|descriptor| {
            let mut tool = json!({"name": descriptor.name, "description": descriptor.description});
            if let Some(schema) = descriptor.full_schema {
                tool["inputSchema"] = schema.value();
            }
            tool
        })
        .collect();
    let mut added = Vec::with_capacity(n);
    for chunk in tools.chunks(250) {
        let answer = ask(client, "capdex.v1.capabilities.upsert", json!({"runtimeId": "bench", "tools": chunk})).await;
        assert!(answer.get("code").is_none(), "upsert refused: {answer}");
        added.extend(answer["added"].as_array().into_iter().flatten().filter_map(|id| id.as_str().map(String::from)));
    }
    assert_eq!(added.len(), n, "every synthetic capability is new");
    added
}

/// Three outcomes in each of `n` scopes (one failed), many in flight.
async fn report_scopes(client: &async_nats::Client, n: usize) {
    let reports: Vec<Value> = (0..n)
        .flat_map(|scope| {
            (0..3).map(move |turn| {
                json!({"turnId": format!("s{scope}-t{turn}"), "organizationId": format!("org-{:04}", scope / 10),
                       "personaId": format!("persona-{}", scope % 10), "status": if turn == 2 { "failed" } else { "success" }})
            })
        })
        .collect();
    for chunk in reports.chunks(64) {
        let asks = chunk.iter().map(|report| ask(client, "capdex.v1.outcome", report.clone()));
        for answer in futures::future::join_all(asks).await {
            assert!(answer["kpi"].is_object(), "{answer}");
        }
    }
}

/// `n` calls of a capability that needs an approval, each left pending.
async fn ask_approvals(client: &async_nats::Client, n: usize) {
    let record = json!({
        "slug": "refund", "name": "refund", "description": "Refunds an order", "category": "payments",
        "executionType": "internal", "handler": "svc", "requiresApproval": true, "approvalTimeoutMs": 3_600_000,
        "functionDefinition": {"name": "refund", "description": "Refunds an order",
            "parameters": {"type": "object", "properties": {"order": {"type": "string"}, "apiKey": {"type": "string"}}, "required": ["order"]}},
    });
    let answer = ask(client, "capdex.v1.capability.register", record).await;
    assert!(answer["policyVersion"].as_u64().is_some(), "{answer}");
    for i in 0..n {
        let call = json!({"slug": "refund", "agentId": format!("agent-{i}"),
                          "arguments": {"order": format!("o-{i}"), "apiKey": "sk-not-shown"}});
        let answer = ask(client, "capdex.v1.dispatch", call).await;
        assert_eq!(answer["error"]["code"], "requires_approval", "{answer}");
    }
}

/// Fetches `url` `n` times one at a time (after two warm-up fetches); the sorted times and the body's size.
async fn fetch(http: &reqwest::Client, url: &str, fragment: bool, n: usize) -> (Vec<Duration>, usize) {
    let mut times = Vec::with_capacity(n);
    let mut bytes = 0;
    for i in 0..n + 2 {
        let mut request = http.get(url);
        if fragment {
            request = request.header("X-Console-Fragment", "1");
        }
        let started = Instant::now();
        let response = request.send().await.expect("the console answers");
        assert!(response.status().is_success(), "{url}: {}", response.status());
        let body = response.bytes().await.expect("a body");
        if i >= 2 {
            times.push(started.elapsed());
        }
        bytes = body.len();
    }
    times.sort();
    (times, bytes)
}

/// Live updates: the time from sending an outcome (answered once durable) until its `kpi` event
/// arrives on `/events`, then until the KPI page's content is fetched again, as `console.js` does.
async fn live_latency(client: &async_nats::Client, http: &reqwest::Client, console: &str, n: usize) {
    let mut events = http.get(format!("http://{console}/events")).send().await.expect("/events answers");
    let mut buffer = String::new();
    // The greeting comes first.
    while !buffer.contains("connected") {
        let chunk = events.chunk().await.expect("the stream reads").expect("the stream stays open");
        buffer.push_str(&String::from_utf8_lossy(&chunk));
    }
    let (mut to_event, mut to_page) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        buffer.clear();
        let started = Instant::now();
        let report =
            json!({"turnId": format!("live-{i}"), "organizationId": "live", "personaId": "bench", "status": "success"});
        let answer = ask(client, "capdex.v1.outcome", report).await;
        assert!(answer["kpi"].is_object(), "{answer}");
        while !buffer.contains("event: kpi") {
            let chunk = tokio::time::timeout(Duration::from_secs(5), events.chunk())
                .await
                .expect("the kpi event within 5 s")
                .expect("the stream reads")
                .expect("the stream stays open");
            buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
        to_event.push(started.elapsed());
        let page = http.get(format!("http://{console}/kpis")).header("X-Console-Fragment", "1").send().await.unwrap();
        let _ = page.bytes().await.unwrap();
        to_page.push(started.elapsed());
    }
    for (label, mut times) in [
        ("outcome sent → kpi event in the browser's stream", to_event),
        ("outcome sent → KPI content fetched again", to_page),
    ] {
        times.sort();
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
        println!("{label:<62} {:>9.2} {:>9.2} {:>9.2}", at(0.5), at(0.99), at(1.0));
    }
}
