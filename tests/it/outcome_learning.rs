//! Learning from outcomes while serving, over a real nats-server with the
//! real binary and its default embedder: turns planned with a `turnId` whose
//! outcomes name the capability that did the job teach discovery how users
//! ask for it; discovery uses what it learnt only once its trials gain (from
//! 30 trials on), and it comes back after a restart.

use crate::serve_over_nats::{body, request};
use crate::support::nats_server::NatsServer;
use crate::support::serving::serve_at;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// Tools whose descriptions use none of the words their users ask with.
const TOOLS: [(&str, &str); 6] = [
    ("ledger", "Record payments against open accounts payable entries and report balances"),
    ("plumber-finder", "Find a plumber near you and book a visit"),
    ("electrician-finder", "Find an electrician near you and book a visit"),
    ("gardener-finder", "Find a gardener near you and book a visit"),
    ("weather", "Tell the weather forecast for a city"),
    ("notes", "Write a note into the notebook"),
];

/// How users of the ledger ask: in their own slang, each tradesperson's "tab",
/// a word no description uses. (Asked in plain words, "what do I still owe the
/// plumber", the table of 2026-12-06 with WordNet's definitions in its corpus
/// already ranks the ledger first, so there is nothing left to learn.)
const ASKED: [&str; 24] = [
    "what's on the plumber's tab",
    "square up the electrician's tab",
    "close out the gardener's tab",
    "plumber's tab, what's left on it",
    "how big is the electrician's tab",
    "is the gardener's tab squared",
    "run down the plumber's tab",
    "knock the electrician's tab down to zero",
    "what's left on the gardener's tab",
    "square the plumber's tab",
    "electrician's tab, anything on it",
    "wipe the gardener's tab clean",
    "how much went off the plumber's tab last month",
    "is anything still on the electrician's tab",
    "show me the gardener's tab",
    "clear the plumber's tab",
    "how far down is the electrician's tab",
    "put the gardener's tab to rest",
    "plumber tab status",
    "electrician tab, is it squared",
    "gardener tab, what's on it",
    "the tab for the plumbing job",
    "the tab for the wiring work",
    "the tab for the garden work",
];

/// Asked after learning, of a tradesperson no outcome mentioned, in the
/// users' slang, which the default embedder does not bridge to the ledger's
/// description by itself.
const NEW_REQUEST: &str = "how big is the roofer's tab";

fn write_tools(dir: &Path) {
    for (name, description) in TOOLS {
        let folder = dir.join(name);
        std::fs::create_dir_all(&folder).unwrap();
        let manifest = format!(
            "id: \"tool:{name}\"\nkind: \"tool\"\nname: \"{name}\"\ndescription: \"{description}\"\ncategory: \"ops\"\n"
        );
        std::fs::write(folder.join("CAPABILITY.yaml"), manifest).unwrap();
    }
}

async fn call(client: &async_nats::Client, subject: &str, payload: Value) -> Value {
    body(&request(client, subject, payload.to_string().into_bytes()).await)
}

/// The ids discovery ranks first for `message` (Tier 1 with no relevance floor, best first).
async fn ranked(client: &async_nats::Client, message: &str) -> Vec<String> {
    let request = json!({ "message": message, "config": {"tier1MinRelevance": 0.0} });
    let reply = call(client, "capdex.v1.discover", request).await;
    reply["tier1"]
        .as_array()
        .unwrap_or_else(|| panic!("no tier1: {reply}"))
        .iter()
        .map(|entry| entry["id"].as_str().unwrap().to_string())
        .collect()
}

/// Waits (at most 20 s) until `message` ranks `id` first; returns the last ranking.
async fn until_first(client: &async_nats::Client, message: &str, id: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ranking = ranked(client, message).await;
        if ranking.first().map(String::as_str) == Some(id) || Instant::now() > deadline {
            return ranking;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn successful_turns_teach_discovery_how_users_ask_and_it_is_kept() {
    let nats = NatsServer::start();
    let caps = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    write_tools(caps.path());
    let (serving, client) = serve_at(&nats, caps.path(), data.path(), false, &[]).await;
    let before = ranked(&client, NEW_REQUEST).await;
    let learning = || async {
        let reply = call(&client, "capdex.v1.discover", json!({ "message": NEW_REQUEST })).await;
        reply["diagnostics"]["outcomeLearning"].clone()
    };
    assert!(learning().await.is_null(), "ranked as configured before any trial");
    assert_ne!(before.first().map(String::as_str), Some("tool:ledger"), "the words do not reach it: {before:?}");

    // An outcome of a turn nobody planned here, or of a failed turn, teaches nothing.
    let stray = json!({"turnId": "never-planned", "status": "success", "capabilities": ["tool:ledger"]});
    assert_eq!(call(&client, "capdex.v1.outcome", stray).await["accepted"], true);
    // Twice over: the trials decide from 30 on (`core::outcome_learning::MIN_TRIALS`).
    for (turn, asked) in ASKED.iter().chain(ASKED.iter()).enumerate() {
        let plan = call(&client, "capdex.v1.plan", json!({ "message": asked, "turnId": format!("t{turn}") })).await;
        assert!(plan["plan"].is_object(), "{plan}");
        let outcome = json!({"turnId": format!("t{turn}"), "status": "success", "capabilities": ["tool:ledger"]});
        assert_eq!(call(&client, "capdex.v1.outcome", outcome).await["accepted"], true);
    }
    let after = until_first(&client, NEW_REQUEST, "tool:ledger").await;
    assert_eq!(after.first().map(String::as_str), Some("tool:ledger"), "{before:?} → {after:?}");
    let decided = learning().await;
    let memory = decided["memoryOwnWeight"].as_f64().is_some() || decided["memoryWords"] == true;
    assert!(memory, "the reply says the memory is used: {decided}");
    // What it learnt moves the ledger, not the rest: a request of another kind ranks as before.
    assert_eq!(ranked(&client, "weather forecast for Lisbon").await[0], "tool:weather");
    drop(serving);

    let (_serving, client) = serve_at(&nats, caps.path(), data.path(), false, &[]).await;
    let again = until_first(&client, NEW_REQUEST, "tool:ledger").await;
    assert_eq!(again.first().map(String::as_str), Some("tool:ledger"), "kept in the data dir: {again:?}");

    // Switched off, discovery ranks as it did before learning.
    drop(_serving);
    let off = [("CAPDEX_DISCOVERY_OUTCOME_LEARNING", "false")];
    let (_serving, client) = serve_at(&nats, caps.path(), data.path(), false, &off).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(ranked(&client, NEW_REQUEST).await, before);
}
