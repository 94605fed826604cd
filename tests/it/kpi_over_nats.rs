//! Task outcomes and turn plans over a real nats-server: acknowledged
//! outcomes survive `kill -9` exactly once, `capdex kpi` reads the windows
//! back, and plans fall back, adapt to a degraded scope and recover.

use crate::cli::{capdex, examples_dir};
use crate::serve_over_nats::{body, request, serve_at};
use crate::support::nats_server::NatsServer;
use futures::StreamExt;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Child;

const SCOPES: [&str; 3] = ["p0", "p1", "p2"];
const PER_SCOPE: u64 = 80;

fn outcome(persona: &str, turn: u64, status: &str) -> Vec<u8> {
    json!({"turnId": format!("{persona}-t{turn}"), "organizationId": "acme", "personaId": persona, "status": status})
        .to_string()
        .into_bytes()
}

/// A `capdex serve` that is killed (SIGKILL) when dropped, also when a test fails.
struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn serve(nats: &NatsServer, caps: &Path, data: &Path, env: &[(&str, &str)]) -> (Serving, async_nats::Client) {
    let (child, client) = serve_at(nats, caps, data, false, env).await;
    (Serving(child), client)
}

fn kill_9(mut serving: Serving) {
    serving.0.kill().expect("SIGKILL capdex serve");
    serving.0.wait().unwrap();
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
    kill_9(child);

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
    kill_9(child);

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
    assert_eq!(discover["tier1"][0]["id"], "tool:web-search", "{discover}");
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
