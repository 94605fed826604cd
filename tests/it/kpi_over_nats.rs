//! Task outcomes and turn plans over a real nats-server: acknowledged
//! outcomes survive `kill -9` exactly once, `capdex kpi` reads the windows
//! back, and plans fall back, adapt to a degraded scope and recover.

use crate::cli::{capdex, examples_dir};
use crate::serve_over_nats::{body, request};
use crate::support::nats_server::NatsServer;
use crate::support::serving::{serve_at, KillOnDrop};
use futures::StreamExt;
use serde_json::{json, Value};
use std::path::Path;

const SCOPES: [&str; 3] = ["p0", "p1", "p2"];
const PER_SCOPE: u64 = 80;

fn outcome(persona: &str, turn: u64, status: &str) -> Vec<u8> {
    json!({"turnId": format!("{persona}-t{turn}"), "organizationId": "acme", "personaId": persona, "status": status})
        .to_string()
        .into_bytes()
}

async fn serve(nats: &NatsServer, caps: &Path, data: &Path, env: &[(&str, &str)]) -> (KillOnDrop, async_nats::Client) {
    serve_at(nats, caps, data, false, env).await
}

#[tokio::test]
async fn acknowledged_outcomes_survive_kill_9_exactly_once() {
    let nats = NatsServer::start();
    let caps = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let env = [("CAPDEX_KPI_ROLLING_WINDOW_SIZE", "1000")];
    let (child, client) = serve(&nats, caps.path(), data.path(), &env).await;

    // 240 outcomes, 16 in flight at a time, each acknowledged before we count it.
    let sends = SCOPES.iter().flat_map(|persona| (0..PER_SCOPE).map(move |turn| (*persona, turn)));
    let acknowledged: Vec<Value> = futures::stream::iter(sends)
        .map(|(persona, turn)| {
            let client = client.clone();
            async move { body(&request(&client, "capdex.v1.outcome", outcome(persona, turn, "success")).await) }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert_eq!(acknowledged.len() as u64, PER_SCOPE * SCOPES.len() as u64);
    assert!(acknowledged.iter().all(|reply| reply["accepted"] == true && reply["duplicate"] == false));
    child.kill_9();

    let (child, client) = serve(&nats, caps.path(), data.path(), &env).await;
    for persona in SCOPES {
        // A retry of an acknowledged turn is not counted twice, before or after the crash.
        let retry = body(&request(&client, "capdex.v1.outcome", outcome(persona, 17, "success")).await);
        assert_eq!(retry["duplicate"], true, "{retry}");
        assert_eq!(retry["kpi"]["sampleCount"].as_u64(), Some(PER_SCOPE), "{retry}");
        let next = body(&request(&client, "capdex.v1.outcome", outcome(persona, PER_SCOPE, "failed")).await);
        assert_eq!(next["kpi"]["sampleCount"].as_u64(), Some(PER_SCOPE + 1), "{next}");
        assert_eq!(next["kpi"]["scopeKey"], format!("acme/{persona}"));
    }
    child.kill_9();

    let output = capdex()
        .args(["kpi", "--json", "--data-dir"])
        .arg(data.path())
        .env("CAPDEX_KPI_ROLLING_WINDOW_SIZE", "1000")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let kpis: Value = serde_json::from_slice(&output.stdout).unwrap();
    let counts: Vec<(String, u64, u64)> = kpis
        .as_array()
        .unwrap()
        .iter()
        .map(|kpi| {
            let scope = kpi["scopeKey"].as_str().unwrap().to_string();
            (scope, kpi["sampleCount"].as_u64().unwrap(), kpi["failedCount"].as_u64().unwrap())
        })
        .collect();
    let expected: Vec<(String, u64, u64)> =
        SCOPES.iter().map(|persona| (format!("acme/{persona}"), PER_SCOPE + 1, 1)).collect();
    assert_eq!(counts, expected);
}

fn plan_request(message: &str, extra: Value) -> Vec<u8> {
    let mut request = json!({ "message": message, "organizationId": "acme", "personaId": "bot" });
    request.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    request.to_string().into_bytes()
}

/// With the chatter gate on (`CAPDEX_DISCOVERY_CHATTER_GATE`), a chatty turn's plan needs no
/// capability (not degraded) because the gate emptied Tier 1, and a request keeps its tool.
#[tokio::test]
async fn with_the_chatter_gate_a_chatty_turn_needs_no_capability() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let env = [("CAPDEX_DISCOVERY_CHATTER_GATE", "true")];
    let (_serving, client) = serve(&nats, &examples_dir(), data.path(), &env).await;
    let plan = |message: &'static str| {
        let client = client.clone();
        async move { body(&request(&client, "capdex.v1.plan", plan_request(message, json!({}))).await) }
    };
    let chat = plan("thank you, I really appreciate it, see you tomorrow").await;
    assert_eq!(chat["discovery"]["diagnostics"]["chatter"]["nothingFits"], true, "{chat}");
    assert_eq!(chat["discovery"]["tier1"], json!([]), "{chat}");
    assert_eq!(chat["plan"]["fallbackReason"], "no_capability_needed", "{chat}");
    assert_eq!(chat["plan"]["needsCapabilities"], false);
    assert_eq!(chat["plan"]["executionLifecycle"], json!(["planned", "executing"]), "not degraded");
    let search = plan("search the web for AI news").await;
    assert_eq!(search["discovery"]["diagnostics"]["chatter"]["nothingFits"], false, "{search}");
    assert_eq!(search["plan"]["selectedToolIds"][0], "tool:web-search", "{search}");
}

#[tokio::test]
async fn plans_fall_back_adapt_to_a_degraded_scope_and_recover() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client) = serve(&nats, &examples_dir(), data.path(), &[]).await;
    let plan = |message: &'static str, extra: Value| {
        let client = client.clone();
        async move { body(&request(&client, "capdex.v1.plan", plan_request(message, extra)).await) }
    };

    let search = plan("search the web for AI news", json!({})).await;
    assert_eq!(search["plan"]["toolSelectionMode"], "discovered", "{search}");
    assert_eq!(search["plan"]["selectedToolIds"][0], "tool:web-search", "{search}");
    assert_eq!(search["plan"]["executionLifecycle"], json!(["planned", "executing"]));
    assert!(search["discovery"]["tier1"].as_array().unwrap().len() > 1);

    // Chit-chat needs no capability: every tool is offered, and the turn is not degraded.
    let chat = plan("good morning", json!({})).await;
    assert_eq!(chat["plan"]["fallbackReason"], "no_capability_needed", "{chat}");
    assert_eq!(chat["plan"]["needsCapabilities"], false);
    assert_eq!(chat["plan"]["executionLifecycle"], json!(["planned", "executing"]));
    let closed = plan("good morning", json!({"toolFailureMode": "fail_closed"})).await;
    assert_eq!(closed["plan"]["toolSelectionMode"], "discovered", "{closed}");
    assert_eq!(closed["plan"]["selectedToolIds"], json!([]));
    // Skills match, no tool does: fail_open falls back, degraded.
    let skills = plan("send a message on telegram", json!({"capabilityDiscoveryKind": "channel"})).await;
    assert_eq!(skills["plan"]["fallbackReason"], "no_tool_matched", "{skills}");
    assert_eq!(skills["plan"]["executionLifecycle"], json!(["planned", "executing", "degraded"]));
    let pinned = plan("search the web", json!({"taskSuccess": true, "toolSelectionMode": "all"})).await;
    assert_eq!(
        pinned["plan"]["outcomeOverride"],
        json!({"status": "success", "score": 1.0, "source": "request_override"})
    );
    let bad = plan("search the web", json!({"taskOutcome": 2.0})).await;
    assert_eq!(bad["code"], "bad_request", "{bad}");

    // Five failures degrade the scope: plans switch to all tools and fail_open, unless fail_closed is pinned.
    for turn in 0..5 {
        request(&client, "capdex.v1.outcome", outcome("bot", turn, "failed")).await;
    }
    let degraded = plan("search the web for AI news", json!({})).await;
    assert_eq!(
        (&degraded["plan"]["toolSelectionMode"], &degraded["plan"]["adaptiveApplied"]),
        (&json!("all"), &json!(true)),
        "{degraded}"
    );
    let pinned = plan("search the web for AI news", json!({"toolFailureMode": "fail_closed"})).await;
    assert_eq!(pinned["plan"]["toolFailureMode"], "fail_closed");
    let other_scope = body(
        &request(
            &client,
            "capdex.v1.plan",
            json!({"message": "search the web", "organizationId": "other"}).to_string().into_bytes(),
        )
        .await,
    );
    assert_eq!(other_scope["plan"]["adaptiveApplied"], false, "scopes adapt independently");

    // The discover request asks for the same plan.
    let discover = body(
        &request(
            &client,
            "capdex.v1.discover",
            json!({"message": "search the web for AI news", "plan": {"organizationId": "acme", "personaId": "bot"}})
                .to_string()
                .into_bytes(),
        )
        .await,
    );
    let top_two: Vec<&str> =
        discover["tier1"].as_array().unwrap().iter().take(2).map(|e| e["id"].as_str().unwrap()).collect();
    assert!(top_two.contains(&"tool:web-search"), "{discover}");
    assert_eq!(discover["plan"]["adaptiveApplied"], true, "{discover}");

    // Successes lift the weighted rate; the plan returns to discovered only at 0.8 (hysteresis).
    let mut between_thresholds_seen = false;
    for turn in 5..200 {
        let reply = body(&request(&client, "capdex.v1.outcome", outcome("bot", turn, "success")).await);
        let rate = reply["kpi"]["weightedSuccessRate"].as_f64().unwrap();
        let now = plan("search the web for AI news", json!({})).await;
        let adapted = now["plan"]["adaptiveApplied"] == true;
        assert_eq!(adapted, rate < 0.8, "rate {rate}: {now}");
        between_thresholds_seen |= adapted && rate >= 0.7;
        if !adapted {
            break;
        }
    }
    assert!(between_thresholds_seen, "the scope stayed adapted between 0.7 and 0.8");
}

#[tokio::test]
async fn bad_outcomes_are_refused_whole_and_kpi_watch_follows_events() {
    let nats = NatsServer::start();
    let caps = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let (_serving, client) =
        serve(&nats, caps.path(), data.path(), &[("CAPDEX_METRICS_LISTEN_ADDR", metrics_addr.as_str())]).await;
    for bad in [
        json!({"organizationId": "acme", "status": "success", "score": 0.1}),
        json!({"organizationId": "acme", "status": "done"}),
        json!({"organizationId": "acme", "score": "0.5"}),
        json!({"organizationId": "", "status": "failed"}),
        json!({"organizationId": "acme", "status": "failed", "capabilities": [""]}),
        json!({"organizationId": "acme", "status": "failed", "toolSelectionMode": "some"}),
        json!({"organizationId": "acme", "status": "failed", "mood": "bad"}),
        json!({"organizationId": "acme"}),
    ] {
        let reply = body(&request(&client, "capdex.v1.outcome", bad.to_string().into_bytes()).await);
        assert_eq!(reply["code"], "bad_request", "{bad} → {reply}");
    }
    // Nothing of the refused outcomes was applied: the scope's first good outcome is its first sample.
    let good = json!({"organizationId": "acme", "status": "partial", "source": "request_override", "toolSelectionMode": "all"});
    let reply = body(&request(&client, "capdex.v1.outcome", good.to_string().into_bytes()).await);
    assert_eq!(reply["kpi"]["sampleCount"], 1, "{reply}");

    let mut watch = KillOnDrop::new(
        capdex()
            .args(["kpi", "--watch"])
            .env("CAPDEX_NATS_URL", nats.url())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = watch.child.stdout.take().unwrap();
    let (lines, mut received) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    // The watcher subscribes asynchronously: keep reporting until it prints an event.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let line = loop {
        request(&client, "capdex.v1.outcome", good.to_string().into_bytes()).await;
        if let Ok(Some(line)) = tokio::time::timeout(std::time::Duration::from_millis(200), received.recv()).await {
            break line;
        }
        assert!(std::time::Instant::now() < deadline, "capdex kpi --watch printed nothing within 20 s");
    };
    let event: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(event["scopeKey"], "acme", "{event}");
    assert!(event["sampleCount"].as_u64().unwrap() >= 2);

    let metrics = scrape(&metrics_addr);
    for expected in [
        "capdex_outcomes_total{status=\"partial\"}",
        "capdex_kpi_scopes 1",
        "capdex_kpi_scopes_alerting 0",
        "capdex_kpi_weighted_success_rate{scope=\"acme\"} 0.5",
        "capdex_kpi_success_rate{scope=\"acme\"} 0",
    ] {
        assert!(metrics.contains(expected), "{expected} missing from /metrics:\n{metrics}");
    }
}

/// GET /metrics from the Prometheus listener.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// The outcome that crosses the alert threshold (8th failure) raises exactly
/// one alert for its own scope, over NATS, for 20 scopes in a row. (Its
/// latency is a figure of `benches/nats.rs`, not of a test.)
#[tokio::test]
async fn each_scope_alerts_on_the_outcome_that_crosses_the_threshold() {
    let nats = NatsServer::start();
    let caps = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client) = serve(&nats, caps.path(), data.path(), &[]).await;
    let mut alerts = client.subscribe("capdex.v1.alert.>").await.unwrap();
    client.flush().await.unwrap();
    for scope in 0..20 {
        let persona = format!("latency{scope}");
        for turn in 0..7 {
            request(&client, "capdex.v1.outcome", outcome(&persona, turn, "failed")).await;
        }
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(100), alerts.next()).await.is_err(),
            "no alert before the threshold is crossed"
        );
        client.publish("capdex.v1.outcome", outcome(&persona, 7, "failed").into()).await.unwrap();
        let alert = tokio::time::timeout(std::time::Duration::from_secs(5), alerts.next()).await.unwrap().unwrap();
        assert_eq!(alert.subject.as_str(), format!("capdex.v1.alert.critical.acme_{persona}"));
    }
}

/// Tier 1 of `message` as (id, relevance), with `outcomePrior` when given.
async fn tier1(client: &async_nats::Client, message: &str, prior: Option<bool>) -> Vec<(String, f64)> {
    let mut request = json!({ "message": message });
    if let Some(prior) = prior {
        request["outcomePrior"] = json!(prior);
    }
    let reply = body(&request_to(client, "capdex.v1.discover", request).await);
    reply["tier1"]
        .as_array()
        .unwrap_or_else(|| panic!("no tier1: {reply}"))
        .iter()
        .map(|entry| (entry["id"].as_str().unwrap().to_string(), entry["relevance"].as_f64().unwrap()))
        .collect()
}

async fn request_to(client: &async_nats::Client, subject: &'static str, payload: Value) -> async_nats::Message {
    request(client, subject, payload.to_string().into_bytes()).await
}

/// Outcomes feed the ranking over NATS, with the default strength: a
/// capability that keeps appearing in failed turns sinks below one that keeps
/// succeeding; `"outcomePrior": false` ranks as before; the statistics survive a restart.
#[tokio::test]
async fn a_capability_in_failed_turns_sinks_below_a_proven_one() {
    const MESSAGE: &str = "send a message to the team";
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let env = [("CAPDEX_DISCOVERY_OUTCOME_PRIOR_PUBLISH_INTERVAL_MS", "0")];
    let (serving, client) = serve(&nats, &examples_dir(), data.path(), &env).await;
    let before = tier1(&client, MESSAGE, None).await;
    let (flaky, proven) = (before[0].0.clone(), before[1].0.clone());
    // The fixture: two close capabilities, so that ±10 % can swap them.
    assert!(before[1].1 >= before[0].1 * 0.9 / 1.1, "{before:?}");
    for turn in 0..10 {
        let failed = json!({"turnId": format!("f{turn}"), "organizationId": "acme", "status": "failed", "capabilities": [flaky]});
        let succeeded = json!({"turnId": format!("s{turn}"), "organizationId": "acme", "status": "success", "capabilities": [proven]});
        for outcome in [failed, succeeded] {
            let reply = body(&request_to(&client, "capdex.v1.outcome", outcome).await);
            assert_eq!(reply["accepted"], true, "{reply}");
        }
    }
    let position = |ranking: &[(String, f64)], id: &str| ranking.iter().position(|(entry, _)| entry == id);
    let after = tier1(&client, MESSAGE, None).await;
    assert!(position(&after, &proven) < position(&after, &flaky), "{before:?} → {after:?}");
    let relevance = |ranking: &[(String, f64)], id: &str| ranking[position(ranking, id).unwrap()].1;
    assert!(relevance(&after, &flaky) >= relevance(&before, &flaky) * 0.9 - 1e-6, "bounded: {after:?}");
    assert_eq!(tier1(&client, MESSAGE, Some(false)).await, before, "switched off per query");
    // Outcomes that list no capability change no ranking.
    let plain = json!({"turnId": "n1", "organizationId": "acme", "status": "failed"});
    request_to(&client, "capdex.v1.outcome", plain).await;
    assert_eq!(tier1(&client, MESSAGE, None).await, after);
    drop(serving);

    let (_serving, client) = serve(&nats, &examples_dir(), data.path(), &[]).await;
    assert_eq!(tier1(&client, MESSAGE, None).await, after, "the statistics came back from sled");
}
