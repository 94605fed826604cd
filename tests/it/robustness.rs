//! Robustness of `capdex serve` against a real nats-server: true `$SRV.STATS`
//! figures after good and bad requests, error replies for payloads over the
//! limit, malformed payloads and unknown fields, a slow request that does not
//! hold up fast ones, reconnection after the NATS server is killed and
//! restarted, and SIGTERM draining a request in flight.
//!
//! The slow request is real work, not a delay knob: upserting the 906 tools,
//! skills and extensions of `tests/fixtures/catalog/synthcat-1000.sources.json`
//! (about 1 s in a debug build, while a discover takes milliseconds).

use crate::cli::examples_dir;
use crate::serve_over_nats::{body, request};
use crate::support::fixture;
use crate::support::nats_server::NatsServer;
use crate::support::serving::{serve_at, KillOnDrop};
use futures::{FutureExt, StreamExt};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

async fn serve(nats: &NatsServer, env: &[(&str, &str)]) -> (KillOnDrop, async_nats::Client) {
    let data = tempfile::tempdir().unwrap();
    let (served, client) = serve_at(nats, &examples_dir(), data.path(), false, env).await;
    (served.keeping(data), client)
}

/// The tools, skills and extensions of synthcat-1000 as one upsert (just under 1 MiB).
fn big_upsert() -> Vec<u8> {
    let path = fixture("catalog/synthcat-1000.sources.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
    let catalog: Value = serde_json::from_str(&text).unwrap();
    let payload = json!({
        "runtimeId": "big-runtime",
        "tools": catalog["tools"],
        "skills": catalog["skills"],
        "extensions": catalog["extensions"],
    });
    serde_json::to_vec(&payload).unwrap()
}

fn error_of(reply: &async_nats::Message) -> (String, Value) {
    let headers = reply.headers.clone().unwrap_or_else(|| panic!("an error reply has headers: {:?}", reply.payload));
    let status = headers.get("Nats-Service-Error-Code").map(|v| v.as_str().to_string()).unwrap_or_default();
    assert!(headers.get("Nats-Service-Error").is_some_and(|v| !v.as_str().is_empty()));
    let error = body(reply);
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{error}");
    (status, error)
}

fn endpoint_stats(stats: &Value, subject: &str) -> Value {
    stats["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["subject"] == subject)
        .unwrap_or_else(|| panic!("{subject} in {stats}"))
        .clone()
}

#[tokio::test]
async fn srv_stats_count_good_and_bad_requests_and_every_bad_payload_gets_an_error_reply() {
    let nats = NatsServer::start();
    let (_served, client) = serve(&nats, &[("CAPDEX_NATS_MAX_PAYLOAD_BYTES", "4096")]).await;

    let ping = body(&request(&client, "$SRV.PING.capdex", Vec::new()).await);
    assert_eq!(ping["type"], "io.nats.micro.v1.ping_response");
    let id = ping["id"].as_str().unwrap().to_string();
    let info = body(&request(&client, &format!("$SRV.INFO.capdex.{id}"), Vec::new()).await);
    assert_eq!(info["type"], "io.nats.micro.v1.info_response");
    let endpoints = info["endpoints"].as_array().unwrap();
    let names: Vec<&str> = endpoints.iter().filter_map(|e| e["name"].as_str()).collect();
    for name in ["discover", "outcome", "dispatch", "capabilities-upsert", "capabilities-remove", "capabilities-list"] {
        assert!(names.contains(&name), "{name} missing from {info}");
    }
    assert!(endpoints.iter().all(|e| e["queue_group"] == "q"), "{info}");

    for good in [json!({"message": "send a message on telegram"}), json!({"query": "weather forecast"})] {
        let reply = request(&client, "capdex.v1.discover", good.to_string().into_bytes()).await;
        assert!(reply.headers.as_ref().is_none_or(|h| h.get("Nats-Service-Error").is_none()), "{good}");
    }
    let over_limit = json!({"message": "x".repeat(5000)}).to_string().into_bytes();
    for (bad, want_status, want_code) in [
        (b"{not json".to_vec(), "400", "bad_request"),
        (br#"{"message": "x", "bogus": true}"#.to_vec(), "400", "bad_request"),
        (over_limit, "413", "payload_too_large"),
    ] {
        let reply = request(&client, "capdex.v1.discover", bad).await;
        let (status, error) = error_of(&reply);
        assert_eq!((status.as_str(), error["code"].as_str().unwrap()), (want_status, want_code), "{error}");
    }
    let stats = body(&request(&client, "$SRV.STATS.capdex", Vec::new()).await);
    assert_eq!(stats["type"], "io.nats.micro.v1.stats_response");
    assert!(stats["started"].as_str().unwrap().ends_with('Z'), "{stats}");
    let discover = endpoint_stats(&stats, "capdex.v1.discover");
    assert_eq!(discover["num_requests"], 5, "{discover}");
    assert_eq!(discover["num_errors"], 3, "{discover}");
    assert!(discover["last_error"].as_str().unwrap().contains("payload_too_large"), "{discover}");
    let processing = discover["processing_time"].as_u64().unwrap();
    assert!(processing > 0 && discover["average_processing_time"].as_u64().unwrap() == processing / 5);
    assert_eq!(endpoint_stats(&stats, "capdex.v1.outcome")["num_requests"], 0);

    // Every request endpoint refuses malformed payloads, unknown fields and
    // payloads over the limit with an error reply, and counts them.
    let subjects = [
        ("capdex.v1.discover", json!({"message": "hi", "unknownField": 1})),
        ("capdex.v1.search", json!({"query": "hi", "unknownField": 1})),
        ("capdex.v1.plan", json!({"message": "hi", "unknownField": 1})),
        ("capdex.v1.outcome", json!({"status": "success", "unknownField": 1})),
        ("capdex.v1.dispatch", json!({"capabilityId": "tool:echo", "arguments": {"text": "a"}, "unknownField": 1})),
        ("capdex.v1.capabilities.upsert", json!({"tools": [], "unknownField": 1})),
        ("capdex.v1.capabilities.remove", json!({"ids": [], "unknownField": 1})),
        ("capdex.v1.capabilities.list", json!({"unknownField": 1})),
    ];
    for (subject, unknown_field) in subjects {
        for bad in [b"[1, 2".to_vec(), unknown_field.to_string().into_bytes(), vec![b' '; 4097]] {
            let reply = request(&client, subject, bad.clone()).await;
            let (status, error) = error_of(&reply);
            assert!(
                ["400", "413"].contains(&status.as_str()),
                "{subject} {}: {status} {error}",
                String::from_utf8_lossy(&bad[..bad.len().min(80)])
            );
        }
        let stats = body(&request(&client, "$SRV.STATS.capdex", Vec::new()).await);
        let endpoint = endpoint_stats(&stats, subject);
        let expected = if subject == "capdex.v1.discover" { (8, 6) } else { (3, 3) };
        assert_eq!(
            (endpoint["num_requests"].as_u64().unwrap(), endpoint["num_errors"].as_u64().unwrap()),
            expected,
            "{endpoint}"
        );
    }

    // A msgpack request gets its error reply in msgpack.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Content-Type", "application/msgpack");
    let packed = rmp_serde::to_vec_named(&json!({"message": "x", "bogus": 1})).unwrap();
    let reply = client.request_with_headers("capdex.v1.discover", headers, packed.into()).await.unwrap();
    let reply_headers = reply.headers.clone().unwrap();
    assert_eq!(reply_headers.get("Content-Type").map(|v| v.as_str()), Some("application/msgpack"));
    assert_eq!(reply_headers.get("Nats-Service-Error-Code").map(|v| v.as_str()), Some("400"));
    let error: Value = rmp_serde::from_slice(&reply.payload).unwrap();
    assert_eq!(error["code"], "bad_request");
}

#[tokio::test]
async fn a_slow_request_does_not_hold_up_fast_ones() {
    let nats = NatsServer::start();
    let (_served, client) = serve(&nats, &[]).await;
    let slow = client.request("capdex.v1.capabilities.upsert", big_upsert().into()).boxed();
    let mut slow = std::pin::pin!(tokio::time::timeout(Duration::from_secs(120), slow));
    // Give the big request a head start so it is in flight before the others.
    if let Some(done) = (&mut slow).now_or_never() {
        panic!("the big upsert cannot have finished before being polled twice: {done:?}");
    }
    client.flush().await.unwrap();
    let in_flight = async {
        let discover = body(
            &request(
                &client,
                "capdex.v1.discover",
                json!({"message": "send a message on telegram"}).to_string().into(),
            )
            .await,
        );
        assert!(discover["tier1"].as_array().is_some_and(|tier1| !tier1.is_empty()), "{discover}");
        let echo = body(
            &request(
                &client,
                "capdex.v1.dispatch",
                json!({"slug": "echo", "agentId": "agent-1", "arguments": {"text": "fast"}}).to_string().into(),
            )
            .await,
        );
        assert_eq!(echo["data"]["text"], "fast", "{echo}");
        body(&request(&client, "$SRV.PING.capdex", Vec::new()).await)
    };
    // The fast requests are answered while the slow one is still running.
    let answered_first = tokio::select! {
        biased;
        ping = in_flight => { assert_eq!(ping["name"], "capdex"); true }
        _ = &mut slow => false,
    };
    assert!(answered_first, "the big upsert finished before three small requests were answered");
    let reply = slow.await.expect("the big upsert is answered within 120 s").expect("request succeeds");
    let reply = body(&reply);
    assert_eq!(reply["added"].as_array().map(Vec::len), Some(906), "{}", &reply.to_string()[..200]);
}

#[tokio::test]
async fn capdex_reconnects_and_answers_again_after_the_nats_server_restarts() {
    let mut nats = NatsServer::start();
    let (mut served, client) = serve(&nats, &[]).await;
    let discover = json!({"message": "send a message on telegram"}).to_string();
    assert_eq!(
        body(&request(&client, "capdex.v1.discover", discover.clone().into()).await)["tier1"][0]["id"],
        "channel:telegram"
    );

    nats.kill();
    // capdex keeps running while the server is down.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(served.child.try_wait().unwrap().is_none(), "capdex serve exited when NATS went away");
    nats.restart();

    // capdex reconnects and re-subscribes by itself (its reconnect backoff is
    // at most 500 ms, `gateway::connect`); so does the test's client.
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        let attempt =
            tokio::time::timeout(Duration::from_secs(2), client.request("capdex.v1.discover", discover.clone().into()))
                .await;
        if let Ok(Ok(reply)) = attempt {
            break body(&reply);
        }
        assert!(Instant::now() < deadline, "capdex did not answer within 30 s of the NATS server restarting");
        assert!(served.child.try_wait().unwrap().is_none(), "capdex serve exited");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(answer["tier1"][0]["id"], "channel:telegram", "{answer}");
    // The service-discovery subjects are back too, and the endpoints keep counting.
    let stats = body(&request(&client, "$SRV.STATS.capdex", Vec::new()).await);
    assert!(endpoint_stats(&stats, "capdex.v1.discover")["num_requests"].as_u64().unwrap() >= 2, "{stats}");
    let outcome = body(
        &request(
            &client,
            "capdex.v1.outcome",
            json!({"turnId": "after-restart", "status": "success"}).to_string().into(),
        )
        .await,
    );
    assert_eq!(outcome["accepted"], true, "{outcome}");
}

#[tokio::test]
async fn sigterm_answers_the_requests_in_flight_then_exits_0() {
    let nats = NatsServer::start();
    let (mut served, client) = serve(&nats, &[]).await;
    // Published by hand, then followed by a ping of capdex itself: messages to
    // one connection arrive in order, so the ping's answer proves capdex has
    // received the upsert before the SIGTERM.
    let mut index_events = client.subscribe("capdex.v1.events.index").await.unwrap();
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.unwrap();
    client.publish_with_reply("capdex.v1.capabilities.upsert", inbox, big_upsert().into()).await.unwrap();
    let ping = body(&request(&client, "$SRV.PING.capdex", Vec::new()).await);
    assert_eq!(ping["name"], "capdex");
    let pid = served.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());

    let reply = tokio::time::timeout(Duration::from_secs(120), replies.next())
        .await
        .expect("the request in flight is answered within 120 s")
        .expect("a reply");
    assert!(reply.headers.as_ref().is_none_or(|h| h.get("Nats-Service-Error").is_none()), "{:?}", reply.payload);
    assert_eq!(body(&reply)["added"].as_array().map(Vec::len), Some(906));
    // The index change it made is still announced before capdex exits.
    let event = tokio::time::timeout(Duration::from_secs(30), index_events.next())
        .await
        .expect("the index event is published before exiting")
        .unwrap();
    let event = body(&event);
    assert_eq!(event["origin"], "runtime:big-runtime");
    assert_eq!(event["added"].as_array().map(Vec::len), Some(906));
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = served.child.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline, "capdex serve still running 30 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "capdex serve exited with {exit} on SIGTERM");
    // No node is left to answer.
    let after = tokio::time::timeout(
        Duration::from_secs(5),
        client.request("capdex.v1.discover", json!({"message": "hi"}).to_string().into()),
    )
    .await;
    assert!(matches!(after, Ok(Err(_))), "nobody answers after the drain: {after:?}");
}
