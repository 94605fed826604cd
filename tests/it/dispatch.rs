//! The dispatch pipeline over NATS against a real nats-server, real
//! `capdex serve`, handler services in the test (queue group on
//! `capdex.v1.exec.<slug>`) and a real HTTP server on 127.0.0.1: every error
//! code, per-agent rate limits across registry reloads, approvals that
//! complete, env bindings, the SSRF guard, webhooks, provenance redaction,
//! re-drive and concurrent duplicates, and a crash between the handler's
//! success and the reply.

use crate::cli::capdex;
use crate::support::nats_server::NatsServer;
use crate::support::serving::{wait_until_serving, KillOnDrop};
use futures::StreamExt;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Starts `capdex serve` on `data` (no capability folders) with `env`, its stderr in a log file
/// of `data`, and waits for `$SRV.PING`.
pub(crate) async fn serve(nats: &NatsServer, data: &Path, env: &[(&str, &str)]) -> (KillOnDrop, async_nats::Client) {
    let log = data.join(format!("capdex-{}.log", next_log()));
    let mut command = capdex();
    command
        .arg("serve")
        .env("CAPDEX_NATS_URL", nats.url())
        .env("CAPDEX_DATA_DIR", data)
        .env("CAPDEX_CAPABILITY_DIRS", data.join("no-capabilities"))
        .env("CAPDEX_WATCH", "false")
        .env("CAPDEX_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut serving = KillOnDrop::new(command.spawn().expect("capdex serve starts")).with_log(log);
    let client = async_nats::connect(nats.url()).await.expect("test client connects");
    wait_until_serving(&mut serving, &client).await;
    (serving, client)
}

/// Numbers the log files of the `capdex serve` processes a test starts (a restart gets its own).
fn next_log() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub(crate) async fn ask(client: &async_nats::Client, subject: &str, payload: Value) -> Value {
    let reply =
        tokio::time::timeout(Duration::from_secs(15), client.request(subject.to_string(), payload.to_string().into()))
            .await
            .expect("reply within 15 s")
            .expect("request succeeds");
    serde_json::from_slice(&reply.payload).unwrap_or_else(|err| panic!("not JSON ({err}): {:?}", reply.payload))
}

pub(crate) async fn call(client: &async_nats::Client, call: Value) -> Value {
    ask(client, "capdex.v1.dispatch", call).await
}

pub(crate) fn code(result: &Value) -> &str {
    result["error"]["code"].as_str().unwrap_or("")
}

pub(crate) fn record(slug: &str, extra: Value) -> Value {
    let mut record = json!({
        "slug": slug, "name": slug, "description": "test capability", "category": "test",
        "executionType": "internal", "handler": "svc",
        "functionDefinition": {"name": slug, "description": "test",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}},
    });
    for (key, value) in extra.as_object().unwrap() {
        record[key] = value.clone();
    }
    record
}

pub(crate) async fn register(client: &async_nats::Client, record: Value) {
    let answer = ask(client, "capdex.v1.capability.register", record).await;
    assert!(answer["policyVersion"].as_u64().is_some(), "{answer}");
}

async fn bind(client: &async_nats::Client, binding: Value) -> Value {
    let answer = ask(client, "capdex.v1.binding.set", binding).await;
    assert!(answer["binding"].is_object(), "{answer}");
    answer
}

/// A handler service for `slug` in queue group `handlers`: counts calls, waits
/// `delay`, and answers `{success: true, data: {n, arguments, email?}}`.
pub(crate) async fn handler(client: &async_nats::Client, slug: &str, count: Arc<AtomicU64>, delay: Duration) {
    let mut requests =
        client.queue_subscribe(format!("capdex.v1.exec.{slug}"), "handlers".into()).await.expect("subscribe");
    client.flush().await.unwrap();
    let client = client.clone();
    tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            let request: Value = serde_json::from_slice(&message.payload).expect("an ExecRequest");
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(delay).await;
            let reply = json!({"success": true, "data": {"n": n, "arguments": request["arguments"],
                "contact": "erin.private@example.net"}});
            if let Some(inbox) = message.reply {
                let _ = client.publish(inbox, reply.to_string().into()).await;
            }
        }
    });
}

/// One request an HTTP test server saw.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    authorization: String,
    body: String,
}

/// A minimal HTTP/1.1 server on 127.0.0.1 that records every request and
/// answers `{"path", "authorization", "body"}` (echoing the credential, as a hostile endpoint might).
fn http_server() -> (u16, Arc<Mutex<Vec<Seen>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            let (mut length, mut authorization) = (0usize, String::new());
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                    break;
                }
                let (name, value) = header.split_once(':').unwrap_or(("", ""));
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    "authorization" => authorization = value.trim().to_string(),
                    _ => {}
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let body = String::from_utf8_lossy(&body).into_owned();
            let answer = json!({"path": path, "authorization": authorization, "body": body}).to_string();
            record.lock().unwrap().push(Seen { path, authorization, body });
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (port, seen)
}

#[tokio::test]
async fn every_refusal_has_its_code_and_registrations_are_checked() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client) = serve(&nats, data.path(), &[]).await;
    let count = Arc::new(AtomicU64::new(0));
    handler(&client, "lookup", count.clone(), Duration::ZERO).await;
    handler(&client, "limited", Arc::new(AtomicU64::new(0)), Duration::ZERO).await;
    register(&client, record("lookup", json!({}))).await;
    register(&client, record("off", json!({"isActive": false}))).await;
    register(&client, record("limited", json!({"rateLimit": 1}))).await;
    register(&client, record("gated", json!({"requiresApproval": true}))).await;
    register(&client, record("nobody_home", json!({"timeoutMs": 2000}))).await;
    register(&client, record("api_env", json!({"executionType": "api", "handler": "http://127.0.0.1:9/x"}))).await;
    bind(
        &client,
        json!({"agentId": "a", "slug": "api_env",
        "customConfig": {"headers": {"Authorization": "Bearer ${env:CAPDEX_SECRET_IT_DISPATCH_UNSET}"}}}),
    )
    .await;
    bind(&client, json!({"agentId": "blocked", "slug": "lookup", "isEnabled": false})).await;

    let args = json!({"q": "x"});
    let go =
        |slug: &str, agent: &str, arguments: Value| json!({"slug": slug, "agentId": agent, "arguments": arguments});
    let ok = call(&client, go("lookup", "a", args.clone())).await;
    assert_eq!(ok["success"], true, "{ok}");
    assert_eq!(ok["data"]["n"], 1);
    assert_eq!(code(&call(&client, go("missing", "a", args.clone())).await), "unknown_capability");
    assert_eq!(code(&call(&client, go("off", "a", args.clone())).await), "capability_inactive");
    assert_eq!(code(&call(&client, go("lookup", "blocked", args.clone())).await), "capability_disabled_for_agent");
    assert_eq!(call(&client, go("limited", "a", args.clone())).await["success"], true);
    let limited = call(&client, go("limited", "a", args.clone())).await;
    assert_eq!(code(&limited), "rate_limited", "{limited}");
    let gated = call(&client, go("gated", "a", args.clone())).await;
    assert_eq!(code(&gated), "requires_approval");
    assert_eq!(gated["skipFollowup"], true);
    let invalid = call(&client, go("lookup", "a", json!({"q": 5}))).await;
    assert_eq!(code(&invalid), "invalid_args");
    assert!(invalid["error"]["message"].as_str().unwrap().starts_with("/q: "), "{invalid}");
    let no_handler = call(&client, go("nobody_home", "a", args.clone())).await;
    assert_eq!(code(&no_handler), "execution_error", "{no_handler}");
    assert_eq!(code(&call(&client, go("api_env", "a", args.clone())).await), "invalid_binding");
    assert_eq!(code(&call(&client, json!({"slug": "lookup", "arguments": args})).await), "", "no agentId: not a call");
    assert_eq!(
        code(&call(&client, json!({"slug": "lookup", "agentId": "a", "executionId": "e"})).await),
        "invalid_request"
    );
    assert_eq!(count.load(Ordering::SeqCst), 1, "only the admitted call reached the handler");

    let mismatch = ask(&client, "capdex.v1.capability.register", {
        let mut r = record("renamed", json!({}));
        r["functionDefinition"]["name"] = json!("other");
        r
    })
    .await;
    assert_eq!(mismatch["code"], "slug_mismatch", "{mismatch}");
    let pii = ask(&client, "capdex.v1.capability.register", record("pii", json!({"processesPii": true}))).await;
    assert_eq!(pii["code"], "pii_without_redaction", "{pii}");
    let twice = ask(&client, "capdex.v1.capability.register", record("lookup", json!({}))).await;
    assert_eq!(twice["code"], "already_registered");
    let listed = ask(&client, "capdex.v1.capability.list", json!({})).await;
    let slugs: Vec<&str> =
        listed["capabilities"].as_array().unwrap().iter().map(|r| r["slug"].as_str().unwrap()).collect();
    assert!(slugs.contains(&"echo") && slugs.contains(&"lookup") && !slugs.contains(&"pii"), "{slugs:?}");
}

#[tokio::test]
async fn rate_limits_are_per_agent_and_survive_registry_reloads() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client) = serve(&nats, data.path(), &[]).await;
    handler(&client, "search", Arc::new(AtomicU64::new(0)), Duration::ZERO).await;
    register(&client, record("search", json!({"rateLimit": 2}))).await;
    bind(&client, json!({"agentId": "vip", "slug": "search", "customRateLimit": 4})).await;
    let go = |agent: &str| json!({"slug": "search", "agentId": agent, "arguments": {"q": "x"}});
    let ok = |results: Vec<Value>| results.iter().filter(|r| r["success"] == true).count();
    let mut a = Vec::new();
    for _ in 0..2 {
        a.push(call(&client, go("a")).await);
    }
    assert_eq!(ok(a), 2);
    // An update is a registry reload (and bumps the policy version); an explicit reload too.
    let updated =
        ask(&client, "capdex.v1.capability.update", record("search", json!({"rateLimit": 2, "description": "v2"})))
            .await;
    assert_eq!(updated["policyVersion"], 2, "{updated}");
    assert_eq!(
        ask(&client, "capdex.v1.capability.reload", json!({})).await["capabilities"].as_u64().map(|n| n >= 2),
        Some(true)
    );
    let after = call(&client, go("a")).await;
    assert_eq!(code(&after), "rate_limited", "the window survived the reloads: {after}");
    let mut vip = Vec::new();
    for _ in 0..5 {
        vip.push(call(&client, go("vip")).await);
    }
    assert_eq!(ok(vip.clone()), 4, "the vip's own limit, not a's: {vip:?}");
    assert_eq!(code(&vip[4]), "rate_limited");
    assert_eq!(ok(vec![call(&client, go("b")).await, call(&client, go("b")).await, call(&client, go("b")).await]), 2);
}

#[tokio::test]
async fn approvals_run_exactly_the_approved_call_once() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client) = serve(&nats, data.path(), &[]).await;
    let count = Arc::new(AtomicU64::new(0));
    handler(&client, "refund", count.clone(), Duration::ZERO).await;
    register(&client, record("refund", json!({"requiresApproval": true}))).await;
    register(&client, record("quick", json!({"requiresApproval": true, "approvalTimeoutMs": 1}))).await;
    let go = |q: &str, approval: Option<&str>| json!({"slug": "refund", "agentId": "a", "arguments": {"q": q}, "approvalId": approval});
    let asked = call(&client, go("o-1", None)).await;
    assert_eq!(code(&asked), "requires_approval", "{asked}");
    let id = asked["metadata"]["approvalId"].as_str().unwrap().to_string();
    let pending = ask(&client, "capdex.v1.approval.list", json!({})).await;
    assert_eq!(pending["approvals"][0]["id"], id.as_str(), "{pending}");
    assert_eq!(pending["approvals"][0]["status"], "pending");
    assert_eq!(code(&call(&client, go("o-1", Some(&id))).await), "approval_invalid", "still pending");

    let approved = ask(&client, &format!("capdex.v1.approval.{id}.approve"), json!({})).await;
    assert_eq!(approved["status"], "approved", "{approved}");
    let again = ask(&client, &format!("capdex.v1.approval.{id}.reject"), json!({})).await;
    assert_eq!(again["code"], "approval_invalid", "decided once: {again}");
    let other_args = call(&client, go("o-2", Some(&id))).await;
    assert_eq!(code(&other_args), "approval_invalid", "{other_args}");
    let mut other_agent = go("o-1", Some(&id));
    other_agent["agentId"] = json!("b");
    assert_eq!(code(&call(&client, other_agent).await), "approval_invalid");
    let ran = call(&client, go("o-1", Some(&id))).await;
    assert_eq!(ran["success"], true, "{ran}");
    assert_eq!(ran["data"]["arguments"]["q"], "o-1");
    let twice = call(&client, go("o-1", Some(&id))).await;
    assert_eq!(code(&twice), "approval_invalid", "{twice}");
    assert!(twice["error"]["message"].as_str().unwrap().contains("already used"));
    assert_eq!(count.load(Ordering::SeqCst), 1, "the approved call ran once");

    let rejected = call(&client, go("o-3", None)).await;
    let rejected_id = rejected["metadata"]["approvalId"].as_str().unwrap().to_string();
    assert_eq!(
        ask(&client, &format!("capdex.v1.approval.{rejected_id}.reject"), json!({})).await["status"],
        "rejected"
    );
    let refused = call(&client, go("o-3", Some(&rejected_id))).await;
    assert!(refused["error"]["message"].as_str().unwrap().contains("rejected"), "{refused}");

    let quick = call(&client, json!({"slug": "quick", "agentId": "a", "arguments": {"q": "x"}})).await;
    let quick_id = quick["metadata"]["approvalId"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let expired = ask(&client, &format!("capdex.v1.approval.{quick_id}.approve"), json!({})).await;
    assert_eq!(expired["code"], "approval_invalid", "{expired}");
    assert!(expired["message"].as_str().unwrap().contains("expired"));
    let unknown = ask(&client, "capdex.v1.approval.nope.approve", json!({})).await;
    assert_eq!(unknown["code"], "unknown_approval");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn approvals_list_their_redacted_arguments_and_who_decided() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client) = serve(&nats, data.path(), &[]).await;
    let redaction = json!({"requiresApproval": true, "redaction": {"redactKeys": ["apiKey"]}});
    register(&client, record("refund", redaction)).await;
    let secret = "sk-live-secret-7781";
    let arguments = json!({"q": "o-1", "apiKey": secret, "note": "mail bob@corp.io, Authorization: Bearer tok-abc123"});
    let asked = call(&client, json!({"slug": "refund", "agentId": "a", "arguments": arguments})).await;
    assert_eq!(code(&asked), "requires_approval", "{asked}");
    let id = asked["metadata"]["approvalId"].as_str().unwrap().to_string();

    let pending = ask(&client, "capdex.v1.approval.list", json!({})).await;
    let listed = &pending["approvals"][0];
    assert_eq!((listed["id"].as_str(), listed["status"].as_str()), (Some(id.as_str()), Some("pending")), "{pending}");
    assert_eq!(listed["arguments"]["q"], "o-1", "a pending approval shows what it is for: {listed}");
    assert_eq!(listed["arguments"]["apiKey"], "[redacted:apiKey]", "{listed}");
    assert_eq!(listed["decidedBy"], Value::Null, "{listed}");
    let shown = pending.to_string();
    for leak in [secret, "bob@corp.io", "tok-abc123"] {
        assert!(!shown.contains(leak), "{leak} is shown: {shown}");
    }

    // `by` is checked: printable, at most `[limits] max_id_bytes` (128) bytes, and nothing else in the body.
    let approve = format!("capdex.v1.approval.{id}.approve");
    for bad in [json!({"by": "ops\u{7}"}), json!({"by": "x".repeat(129)}), json!({"by": " "}), json!({"who": "ops"})] {
        let refused = ask(&client, &approve, bad.clone()).await;
        assert_eq!(refused["code"], "bad_request", "{bad}: {refused}");
    }
    let approved = ask(&client, &approve, json!({"by": "alice@ops"})).await;
    assert_eq!((approved["status"].as_str(), approved["decidedBy"].as_str()), (Some("approved"), Some("alice@ops")));

    // Without a body, the decision is recorded as the NATS API's.
    let other = call(&client, json!({"slug": "refund", "agentId": "a", "arguments": {"q": "o-2"}})).await;
    let other_id = other["metadata"]["approvalId"].as_str().unwrap().to_string();
    let reply = tokio::time::timeout(
        Duration::from_secs(15),
        client.request(format!("capdex.v1.approval.{other_id}.reject"), Vec::new().into()),
    )
    .await
    .unwrap()
    .unwrap();
    let rejected: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!((rejected["status"].as_str(), rejected["decidedBy"].as_str()), (Some("rejected"), Some("nats")));

    let all = ask(&client, "capdex.v1.approval.list", json!({"all": true})).await;
    let decided_by = |wanted: &str| {
        let found = all["approvals"].as_array().unwrap().iter().find(|a| a["id"] == wanted).unwrap();
        (found["decidedBy"].as_str().map(str::to_string), found["arguments"].clone())
    };
    assert_eq!(decided_by(&id), (Some("alice@ops".into()), listed["arguments"].clone()));
    assert_eq!(decided_by(&other_id), (Some("nats".into()), json!({"q": "o-2"})));
}

#[tokio::test]
async fn http_calls_resolve_env_pass_the_ssrf_guard_and_keep_secrets_out() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let secret = "tok-very-secret-4242";
    let (serving, client) = serve(
        &nats,
        data.path(),
        &[("CAPDEX_DISPATCH_SSRF_ALLOWLIST", "127.0.0.1/32"), ("CAPDEX_SECRET_IT_DISPATCH_API", secret)],
    )
    .await;
    let mut events = client.subscribe("capdex.v1.events.dispatch").await.unwrap();
    client.flush().await.unwrap();
    let (port, seen) = http_server();
    let base = format!("http://127.0.0.1:{port}");
    let pii_rule = json!({"emailKeys": ["email"], "redactKeys": ["note"]});
    register(
        &client,
        record(
            "api_call",
            json!({"executionType": "api", "handler": format!("{base}/api"),
        "processesPii": true, "redaction": pii_rule,
        "functionDefinition": {"name": "api_call", "parameters": {"type": "object"}}}),
        ),
    )
    .await;
    register(
        &client,
        record(
            "hook",
            json!({"executionType": "webhook", "handler": format!("{base}/hook"),
        "functionDefinition": {"name": "hook", "parameters": {"type": "object"}}}),
        ),
    )
    .await;
    register(
        &client,
        record(
            "elsewhere",
            json!({"executionType": "api", "handler": format!("http://127.0.0.2:{port}/x"),
        "functionDefinition": {"name": "elsewhere", "parameters": {"type": "object"}}}),
        ),
    )
    .await;
    register(
        &client,
        record(
            "metadata",
            json!({"executionType": "api", "handler": "http://169.254.169.254/latest",
        "functionDefinition": {"name": "metadata", "parameters": {"type": "object"}}}),
        ),
    )
    .await;
    let answer = bind(
        &client,
        json!({"agentId": "a", "slug": "api_call",
        "customConfig": {"headers": {"Authorization": "Bearer ${env:CAPDEX_SECRET_IT_DISPATCH_API}"}}}),
    )
    .await;
    assert_eq!(answer["warnings"]["missingEnvVars"], json!([]), "{answer}");

    let args = json!({"email": "frank.customer@example.com", "note": "a private note", "amount": 3});
    let result = call(&client, json!({"slug": "api_call", "agentId": "a", "arguments": args})).await;
    assert_eq!(result["success"], true, "{result}");
    assert_eq!(result["data"]["path"], "/api");
    let first = seen.lock().unwrap()[0].clone();
    assert_eq!(first.authorization, format!("Bearer {secret}"), "resolved at call time");
    assert_eq!(serde_json::from_str::<Value>(&first.body).unwrap(), args);

    let hook = call(&client, json!({"slug": "hook", "agentId": "a", "arguments": {"event": "done"}})).await;
    assert_eq!(hook["data"]["accepted"], true, "{hook}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.lock().unwrap().iter().any(|s| s.path == "/hook") {
        assert!(Instant::now() < deadline, "the webhook never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let refused = call(&client, json!({"slug": "elsewhere", "agentId": "a", "arguments": {}})).await;
    assert_eq!(code(&refused), "target_refused", "127.0.0.2 is loopback and not allowlisted: {refused}");
    let metadata = call(&client, json!({"slug": "metadata", "agentId": "a", "arguments": {}})).await;
    assert_eq!(code(&metadata), "target_refused", "{metadata}");
    assert!(metadata["error"]["message"].as_str().unwrap().contains("metadata"));
    assert_eq!(seen.lock().unwrap().len(), 2, "refused targets were never contacted");

    let provenance = ask(&client, "capdex.v1.provenance.list", json!({"limit": 10})).await;
    let rows = provenance["provenance"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{provenance}");
    assert_eq!(rows[0]["args"]["email"], "f***@***.com");
    assert_eq!(rows[0]["args"]["note"], "[redacted:note]");
    assert!(rows.iter().all(|r| r["resultPreview"].as_str().unwrap().chars().count() <= 480));
    let mut seen_events = Vec::new();
    while seen_events.len() < 4 {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await.expect("an event").unwrap();
        seen_events.push(serde_json::from_slice::<Value>(&event.payload).unwrap());
    }
    assert_eq!(seen_events[0]["slug"], "api_call");
    assert_eq!(seen_events[0]["success"], true);
    assert_eq!(seen_events[0]["handlerRan"], true);
    assert_eq!(seen_events[2]["errorCode"], "target_refused");
    assert_eq!(seen_events[2]["handlerRan"], false);
    let everything = format!("{provenance} {seen_events:?} {}", serving.log());
    for (name, text) in [("provenance", provenance.to_string()), ("log", serving.log())] {
        assert!(!text.contains("a private note") && !text.contains("frank.customer@example.com"), "{name}: {text}");
    }
    assert!(!everything.contains(secret), "a secret leaked into provenance, events or logs");
    assert!(!everything.contains("frank.customer@example.com") && !everything.contains("a private note"));
}

#[tokio::test]
async fn redrives_return_the_stored_result_and_concurrent_duplicates_run_once() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client) = serve(&nats, data.path(), &[]).await;
    let count = Arc::new(AtomicU64::new(0));
    handler(&client, "charge", count.clone(), Duration::from_millis(300)).await;
    handler(&client, "put_doc", count.clone(), Duration::ZERO).await;
    register(&client, record("charge", json!({}))).await;
    register(&client, record("put_doc", json!({"isIdempotent": true}))).await;
    let step = |step: &str| json!({"slug": "charge", "agentId": "wf", "arguments": {"q": "9.99"}, "executionId": "run-7", "stepId": step});
    let duplicates = futures::future::join_all((0..5).map(|_| call(&client, step("s1")))).await;
    assert!(duplicates.iter().all(|r| r["success"] == true && r["data"]["n"] == 1), "{duplicates:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1, "five concurrent duplicates ran once");
    let redrive = call(&client, step("s1")).await;
    assert_eq!(redrive["data"]["n"], 1, "{redrive}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let mut turn = step("s1");
    turn["turn"] = json!(0);
    assert_eq!(call(&client, turn.clone()).await["data"]["n"], 2, "turn 0 is its own key");
    assert_eq!(call(&client, turn).await["data"]["n"], 2);
    let mut other = step("s1");
    other["arguments"] = json!({"q": "100.00"});
    assert_eq!(code(&call(&client, other).await), "invalid_request", "a step keeps its arguments");
    assert_eq!(call(&client, step("s2")).await["data"]["n"], 3);
    let idempotent =
        |n| json!({"slug": "put_doc", "agentId": "wf", "arguments": {"q": n}, "executionId": "run-7", "stepId": "s9"});
    call(&client, idempotent("a")).await;
    call(&client, idempotent("a")).await;
    assert_eq!(count.load(Ordering::SeqCst), 5, "isIdempotent bypasses the cache");
}

#[tokio::test]
async fn a_crash_between_the_handlers_success_and_the_reply_does_not_run_it_again() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let call_once =
        json!({"slug": "transfer", "agentId": "wf", "arguments": {"q": "42"}, "executionId": "run-1", "stepId": "pay"});
    {
        let (mut serving, client) = serve(&nats, data.path(), &[("CAPDEX_TEST_CRASH_AFTER_EXEC", "1")]).await;
        handler(&client, "transfer", count.clone(), Duration::ZERO).await;
        register(&client, record("transfer", json!({}))).await;
        let request =
            async_nats::Request::new().payload(call_once.to_string().into()).timeout(Some(Duration::from_secs(3)));
        let reply = client.send_request("capdex.v1.dispatch", request).await;
        assert!(reply.is_err(), "capdex died before replying: {reply:?}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while serving.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "capdex did not die");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(count.load(Ordering::SeqCst), 1, "the handler succeeded before the crash");
    }
    let (_serving, client) = serve(&nats, data.path(), &[]).await;
    handler(&client, "transfer", count.clone(), Duration::ZERO).await;
    let redriven = call(&client, call_once).await;
    assert_eq!(redriven["success"], true, "{redriven}");
    assert_eq!(redriven["data"]["n"], 1, "the stored result of the first run");
    assert_eq!(count.load(Ordering::SeqCst), 1, "the handler ran once");
}
