//! Live sources end to end, through `capdex serve` over a real nats-server,
//! with upstreams nobody here wrote (`mcp-server-time`, `mcp-server-git`,
//! `@modelcontextprotocol/server-everything` over stdio and streamable HTTP)
//! and an HTTP API written here on 127.0.0.1 described by an OpenAPI document:
//! add a source → its tools are discoverable within a second → a call through
//! capdex returns the upstream's answer → the upstream is killed: calls fail
//! fast and clearly → it comes back: calls work again, capdex never restarted.
//! Also: a command that does not exist, a restart of capdex, lazy sources,
//! removal, and `events.sources`.

use crate::cli::examples_dir;
use crate::support::nats_server::NatsServer;
use crate::support::serving::{serve_at, KillOnDrop};
use crate::support::upstreams;
use futures::StreamExt;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a test waits for a Python MCP server to be connected (or refused) by a
/// starting capdex: beyond capdex's own initialize timeout (20 s), since such a
/// server's start alone takes seconds when the suite loads both cores.
const UPSTREAM_START: Duration = Duration::from_secs(45);

/// Sends a request; answers its body and the error code header, if any.
async fn call(client: &async_nats::Client, subject: &str, payload: Value) -> (Value, Option<String>) {
    let reply = tokio::time::timeout(
        Duration::from_secs(60),
        client.request(subject.to_string(), payload.to_string().into_bytes().into()),
    )
    .await
    .unwrap_or_else(|_| panic!("{subject} answered within 60 s"))
    .unwrap_or_else(|err| panic!("{subject}: {err}"));
    let status = reply.headers.as_ref().and_then(|h| h.get("Nats-Service-Error-Code")).map(|v| v.to_string());
    (serde_json::from_slice(&reply.payload).expect("a JSON reply"), status)
}

async fn ok(client: &async_nats::Client, subject: &str, payload: Value) -> Value {
    let (reply, status) = call(client, subject, payload.clone()).await;
    assert!(status.is_none(), "{subject} {payload} failed: {reply}");
    reply
}

async fn dispatch(client: &async_nats::Client, id: &str, arguments: Value) -> Value {
    ok(client, "capdex.v1.dispatch", json!({"slug": id, "arguments": arguments, "agentId": "live-test"})).await
}

async fn discovered_ids(client: &async_nats::Client, message: &str) -> Vec<String> {
    let result = ok(client, "capdex.v1.discover", json!({ "message": message })).await;
    result["tier1"].as_array().unwrap().iter().map(|entry| entry["id"].as_str().unwrap().to_string()).collect()
}

async fn source_status(client: &async_nats::Client, id: &str) -> Value {
    let list = ok(client, "capdex.v1.sources.list", json!({})).await;
    list["sources"].as_array().unwrap().iter().find(|source| source["id"] == id).cloned().unwrap_or(Value::Null)
}

/// Polls `check` every 50 ms for at most `limit`; answers the time it took.
async fn within<F, Fut>(limit: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "{what} did not happen within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// A stdio command that writes its pid to `pid_file`, then becomes `program args...`,
/// so a test can kill the upstream capdex started.
fn pid_recording(program: &Path, args: &[&str], pid_file: &Path) -> Value {
    let mut line = format!("echo $$ > '{}'; exec '{}'", pid_file.display(), program.display());
    for arg in args {
        line.push_str(&format!(" '{arg}'"));
    }
    json!(["-c", line])
}

fn read_pid(pid_file: &Path) -> Option<u32> {
    std::fs::read_to_string(pid_file).ok()?.trim().parse().ok()
}

fn kill_9(pid: u32) {
    let status = std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    assert!(status.success(), "kill -9 {pid}");
}

async fn serve(nats: &NatsServer, data: &Path, env: &[(&str, &str)]) -> (KillOnDrop, async_nats::Client) {
    let python_bin = upstreams::mcp_server_time().parent().unwrap().to_path_buf();
    let path = format!("{}:{}", python_bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut all = vec![("PATH", path.as_str()), ("CAPDEX_METRICS_LISTEN_ADDR", "")];
    all.extend_from_slice(env);
    serve_at(nats, &examples_dir(), data, false, &all).await
}

#[tokio::test]
async fn an_mcp_server_is_found_called_lost_and_found_again() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_served, client) = serve(&nats, data.path(), &[]).await;
    let mut events = client.subscribe("capdex.v1.events.sources").await.unwrap();
    let pid_file = data.path().join("time.pid");
    let args = pid_recording(&upstreams::mcp_server_time(), &["--local-timezone", "UTC"], &pid_file);

    let added =
        ok(&client, "capdex.v1.sources.add", json!({"id": "time", "kind": "mcp", "command": "sh", "args": args})).await;
    assert_eq!(added["source"]["state"], "connected", "{added}");
    assert_eq!(added["source"]["toolCount"], 2, "{added}");
    // Discoverable once added (the reply comes after the catalog took them), under the SCG's ids.
    let ids = discovered_ids(&client, "what time is it now in Tokyo").await;
    assert!(ids.contains(&"time#get_current_time".to_string()), "{ids:?}");
    let route = ok(&client, "capdex.v1.route", json!({"query": "current time in a timezone"})).await;
    assert!(route.to_string().contains("time#get_current_time"), "route names the same id: {route}");

    let answer = dispatch(&client, "time#get_current_time", json!({"timezone": "Asia/Tokyo"})).await;
    assert_eq!(answer["success"], true, "{answer}");
    assert_eq!(answer["data"]["structuredContent"]["timezone"], "Asia/Tokyo", "{answer}");
    // An upstream error (isError) is a dispatch error carrying its text.
    let refused = dispatch(&client, "time#get_current_time", json!({"timezone": "Not/AZone"})).await;
    assert_eq!(refused["error"]["code"], "execution_error", "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("Not/AZone"), "{refused}");
    // Schema validation applies before the upstream is reached.
    let invalid = dispatch(&client, "time#get_current_time", json!({})).await;
    assert_eq!(invalid["error"]["code"], "invalid_args", "{invalid}");

    // The upstream dies: calls fail at once, naming the source and what happened.
    let first_pid = read_pid(&pid_file).expect("the upstream recorded its pid");
    kill_9(first_pid);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let down = dispatch(&client, "time#get_current_time", json!({"timezone": "UTC"})).await;
    assert!(started.elapsed() < Duration::from_secs(1), "a call to a dead source fails fast: {:?}", started.elapsed());
    assert_eq!(down["error"]["code"], "unavailable", "{down}");
    assert!(down["error"]["message"].as_str().unwrap().contains("time"), "{down}");
    // Nothing else is affected.
    assert_eq!(dispatch(&client, "echo", json!({"text": "still here"})).await["success"], true);

    // It comes back by itself (reconnect with backoff), with a new process.
    within(UPSTREAM_START, "the source reconnecting", || async {
        source_status(&client, "time").await["state"] == "connected"
    })
    .await;
    assert_ne!(read_pid(&pid_file), Some(first_pid), "a new upstream process");
    let again = dispatch(&client, "time#get_current_time", json!({"timezone": "Europe/Paris"})).await;
    assert_eq!(again["success"], true, "{again}");

    // The changes were published.
    let mut kinds = Vec::new();
    while let Ok(Some(message)) = tokio::time::timeout(Duration::from_millis(200), events.next()).await {
        let event: Value = serde_json::from_slice(&message.payload).unwrap();
        assert_eq!(event["source"], "time", "{event}");
        kinds.push(event["type"].as_str().unwrap().to_string());
    }
    for expected in ["added", "connected", "disconnected"] {
        assert!(kinds.iter().any(|kind| kind == expected), "{expected} in {kinds:?}");
    }

    // Removed: neither discoverable nor callable, and its process ends.
    let current = read_pid(&pid_file).unwrap();
    ok(&client, "capdex.v1.sources.remove", json!({"id": "time"})).await;
    let ids = discovered_ids(&client, "what time is it now in Tokyo").await;
    assert!(!ids.iter().any(|id| id.starts_with("time#")), "{ids:?}");
    let gone = dispatch(&client, "time#get_current_time", json!({"timezone": "UTC"})).await;
    assert_eq!(gone["error"]["code"], "unknown_capability", "{gone}");
    within(Duration::from_secs(10), "the removed source's process ending", || async {
        !Path::new(&format!("/proc/{current}")).exists()
    })
    .await;
}

#[tokio::test]
async fn a_missing_command_is_shown_and_breaks_nothing_and_sources_survive_a_restart() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (served, client) = serve(&nats, data.path(), &[]).await;
    let ghost = ok(
        &client,
        "capdex.v1.sources.add",
        json!({"id": "ghost", "kind": "mcp", "command": "no-such-mcp-server-here"}),
    )
    .await;
    assert_eq!(ghost["source"]["state"], "failed", "{ghost}");
    assert!(ghost["source"]["lastError"].as_str().unwrap().contains("no-such-mcp-server-here"), "{ghost}");
    let listed = source_status(&client, "ghost").await;
    assert!(listed["lastError"].as_str().unwrap().contains("no-such-mcp-server-here"), "{listed}");
    // Bad settings are refused with the field at fault, and nothing is stored.
    let (bad, status) =
        call(&client, "capdex.v1.sources.add", json!({"id": "Bad Id", "kind": "mcp", "command": "x"})).await;
    assert_eq!((status.as_deref(), bad["code"].as_str()), (Some("400"), Some("invalid_source")), "{bad}");
    let (unknown, status) = call(&client, "capdex.v1.sources.load", json!({"id": "nope"})).await;
    assert_eq!((status.as_deref(), unknown["code"].as_str()), (Some("404"), Some("unknown_source")), "{unknown}");
    // Discovery and dispatch are unaffected.
    assert!(!discovered_ids(&client, "echo some text back").await.is_empty());
    assert_eq!(dispatch(&client, "echo", json!({"text": "hi"})).await["success"], true);

    let time = upstreams::mcp_server_time();
    ok(&client, "capdex.v1.sources.add", json!({"id": "time", "kind": "mcp", "command": time, "callTimeoutMs": 5000}))
        .await;
    drop(served);
    let (_served, client) = serve(&nats, data.path(), &[]).await;
    // Both come back from the store: the live one reconnects, the ghost keeps its error.
    within(UPSTREAM_START, "the stored source reconnecting", || async {
        source_status(&client, "time").await["state"] == "connected"
    })
    .await;
    assert_eq!(source_status(&client, "ghost").await["state"], "failed");
    let answer = dispatch(&client, "time#get_current_time", json!({"timezone": "UTC"})).await;
    assert_eq!(answer["success"], true, "{answer}");
}

#[tokio::test]
async fn a_live_source_s_tools_are_bounded_by_the_configured_max_tools_per_source() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let time = upstreams::mcp_server_time();
    // The time server offers two tools: at a limit of 2 it connects.
    let (served, client) = serve(&nats, data.path(), &[("CAPDEX_LIMITS_MAX_TOOLS_PER_SOURCE", "2")]).await;
    let added = ok(&client, "capdex.v1.sources.add", json!({"id": "time", "kind": "mcp", "command": time})).await;
    assert_eq!((&added["source"]["state"], &added["source"]["toolCount"]), (&json!("connected"), &json!(2)), "{added}");
    drop(served);
    // At 1 the stored source is refused, naming the setting, and nothing else is affected. It is
    // `failed` when the first node stopped before its sync was stored, `disconnected` (down after
    // a sync it remembers) when it was: either way down, for the limit.
    let (_served, client) = serve(&nats, data.path(), &[("CAPDEX_LIMITS_MAX_TOOLS_PER_SOURCE", "1")]).await;
    within(UPSTREAM_START, "the stored source failing", || async {
        let status = source_status(&client, "time").await;
        (status["state"] == "failed" || status["state"] == "disconnected") && status["lastError"].is_string()
    })
    .await;
    let status = source_status(&client, "time").await;
    assert!(status["lastError"].as_str().unwrap_or_default().contains("limits.max_tools_per_source"), "{status}");
    let gone = dispatch(&client, "time#get_current_time", json!({"timezone": "UTC"})).await;
    assert_ne!(gone["success"], true, "{gone}");
    assert_eq!(dispatch(&client, "echo", json!({"text": "still here"})).await["success"], true);
}

#[tokio::test]
async fn server_everything_over_stdio_and_streamable_http() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_served, client) = serve(&nats, data.path(), &[("CAPDEX_DISPATCH_SSRF_ALLOWLIST", "127.0.0.1/32")]).await;
    let (node, script) = upstreams::server_everything();
    let added = ok(
        &client,
        "capdex.v1.sources.add",
        json!({"id": "everything", "kind": "mcp", "command": node, "args": [script, "stdio"], "callTimeoutMs": 20000}),
    )
    .await;
    assert!(added["source"]["toolCount"].as_u64().unwrap() >= 5, "{added}");
    let echo = dispatch(&client, "everything#echo", json!({"message": "over stdio"})).await;
    assert!(echo.to_string().contains("over stdio"), "{echo}");
    // Progress notifications of a call are forwarded on events.sources.
    let mut events = client.subscribe("capdex.v1.events.sources").await.unwrap();
    let long = dispatch(&client, "everything#trigger-long-running-operation", json!({"duration": 1, "steps": 3})).await;
    assert_eq!(long["success"], true, "{long}");
    let mut progress = 0;
    while let Ok(Some(message)) = tokio::time::timeout(Duration::from_millis(300), events.next()).await {
        let event: Value = serde_json::from_slice(&message.payload).unwrap();
        if event["type"] == "progress" {
            assert_eq!(event["source"], "everything", "{event}");
            progress += 1;
        }
    }
    assert!(progress >= 2, "progress events: {progress}");

    let http = upstreams::EverythingHttp::start();
    let added = ok(&client, "capdex.v1.sources.add", json!({"id": "everyhttp", "kind": "mcp", "url": http.url})).await;
    assert_eq!(added["source"]["state"], "connected", "{added}");
    let sum = dispatch(&client, "everyhttp#get-sum", json!({"a": 2, "b": 40})).await;
    assert!(sum.to_string().contains("42"), "{sum}");
}

/// A small HTTP API on 127.0.0.1 with its OpenAPI document (ETag-versioned)
/// and a record of the requests its operations received.
struct PetApi {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
    version: Arc<Mutex<u32>>,
}

impl PetApi {
    fn start() -> PetApi {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let version = Arc::new(Mutex::new(1));
        let (seen, current) = (requests.clone(), version.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let (seen, current) = (seen.clone(), current.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut head = String::new();
                    let mut line = String::new();
                    let mut length = 0;
                    while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = value.trim().parse().unwrap_or(0);
                        }
                        head.push_str(&line);
                        line.clear();
                    }
                    let mut body = vec![0; length];
                    let _ = reader.read_exact(&mut body);
                    let first = head.lines().next().unwrap_or("").to_string();
                    let (status, extra, text) = if first.starts_with("GET /openapi.json") {
                        let version = *current.lock().unwrap();
                        let etag = format!("\"v{version}\"");
                        if head.contains(&format!("If-None-Match: {etag}"))
                            || head.contains(&format!("if-none-match: {etag}"))
                        {
                            ("304 Not Modified", format!("ETag: {etag}\r\n"), String::new())
                        } else {
                            ("200 OK", format!("ETag: {etag}\r\n"), pet_document(port, version))
                        }
                    } else {
                        seen.lock().unwrap().push(format!("{first} {}", String::from_utf8_lossy(&body)));
                        let auth =
                            head.lines().find(|l| l.to_ascii_lowercase().starts_with("authorization:")).unwrap_or("");
                        ("200 OK", String::new(), json!({"received": first, "auth": auth.trim()}).to_string())
                    };
                    let response = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
                        text.len()
                    );
                    let _ = stream.write_all(response.as_bytes());
                });
            }
        });
        PetApi { port, requests, version }
    }
}

fn pet_document(port: u16, version: u32) -> String {
    let mut paths = json!({
        "/pets/{petId}": {"get": {
            "operationId": "getPet", "summary": "Fetch one pet of the shelter by its id",
            "parameters": [{"name": "petId", "in": "path", "required": true, "schema": {"type": "string"}},
                           {"name": "verbose", "in": "query", "schema": {"type": "boolean"}}],
            "responses": {"200": {"description": "the pet"}}}},
        "/pets": {"post": {
            "operationId": "adoptPet", "summary": "Register a new pet for adoption at the shelter",
            "requestBody": {"content": {"application/json": {"schema": {"type": "object",
                "properties": {"name": {"type": "string"}, "species": {"type": "string"}}, "required": ["name"]}}}},
            "responses": {"200": {"description": "registered"}}}}
    });
    if version > 1 {
        paths["/vets"] = json!({"get": {"operationId": "listVets", "summary": "List the veterinarians on call",
            "responses": {"200": {"description": "vets"}}}});
    }
    json!({"openapi": "3.0.3", "info": {"title": "Pet shelter", "version": "1"},
           "servers": [{"url": format!("http://127.0.0.1:{port}/api")}], "paths": paths})
    .to_string()
}

#[tokio::test]
async fn an_openapi_url_is_mapped_called_with_auth_and_refreshed() {
    let api = PetApi::start();
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_served, client) = serve(
        &nats,
        data.path(),
        &[("CAPDEX_DISPATCH_SSRF_ALLOWLIST", "127.0.0.1/32"), ("CAPDEX_SECRET_PET_TOKEN", "tok-123")],
    )
    .await;
    let added = ok(
        &client,
        "capdex.v1.sources.add",
        json!({"id": "pets", "kind": "openapi", "url": format!("http://127.0.0.1:{}/openapi.json", api.port),
               "auth": {"type": "bearer", "token": "${env:CAPDEX_SECRET_PET_TOKEN}"}, "refreshIntervalMs": 1000}),
    )
    .await;
    assert_eq!(added["source"]["toolCount"], 2, "{added}");
    let ids = discovered_ids(&client, "fetch a pet of the shelter").await;
    assert!(ids.contains(&"pets#getPet".to_string()), "{ids:?}");

    let got = dispatch(&client, "pets#getPet", json!({"petId": "a/b", "verbose": true})).await;
    assert_eq!(got["success"], true, "{got}");
    assert_eq!(got["data"]["received"], "GET /api/pets/a%2Fb?verbose=true HTTP/1.1", "{got}");
    assert_eq!(got["data"]["auth"], "authorization: Bearer tok-123", "{got}");
    let adopted = dispatch(&client, "pets#adoptPet", json!({"name": "Rex", "species": "dog"})).await;
    assert_eq!(adopted["success"], true, "{adopted}");
    let requests = api.requests.lock().unwrap().clone();
    assert!(requests.iter().any(|r| r.starts_with("POST /api/pets") && r.contains("\"Rex\"")), "{requests:?}");
    // The secret never reaches provenance.
    let provenance = ok(&client, "capdex.v1.provenance.list", json!({"limit": 10})).await;
    assert!(!provenance.to_string().contains("tok-123"), "{provenance}");

    // The document changes: the next refresh (If-None-Match) brings the new operation.
    *api.version.lock().unwrap() = 2;
    within(Duration::from_secs(10), "the refreshed document's operation", || async {
        discovered_ids(&client, "list the veterinarians on call").await.contains(&"pets#listVets".to_string())
    })
    .await;
}

#[tokio::test]
async fn a_lazy_source_is_discoverable_before_it_runs_loads_on_a_call_and_unloads_when_idle() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_served, client) = serve(&nats, data.path(), &[]).await;
    let pid_file = data.path().join("lazy.pid");
    let args = pid_recording(&upstreams::mcp_server_time(), &[], &pid_file);
    let added = ok(
        &client,
        "capdex.v1.sources.add",
        json!({"id": "clock", "kind": "mcp", "command": "sh", "args": args, "lazy": true, "idleTimeoutMs": 1500,
               "tools": [{"name": "get_current_time", "description": "Get the current time in a timezone",
                          "inputSchema": {"type": "object", "properties": {"timezone": {"type": "string"}}}}]}),
    )
    .await;
    assert_eq!((added["source"]["state"].as_str(), added["source"]["loadable"].as_bool()), (Some("idle"), Some(true)));
    let found = ok(&client, "capdex.v1.discover", json!({"message": "current time in a timezone"})).await;
    assert!(found.to_string().contains("clock#get_current_time"), "{found}");
    assert!(read_pid(&pid_file).is_none(), "a lazy source is not started before it is needed");

    // A call loads it first.
    let answer = dispatch(&client, "clock#get_current_time", json!({"timezone": "UTC"})).await;
    assert_eq!(answer["success"], true, "{answer}");
    let pid = read_pid(&pid_file).expect("started by the call");
    assert_eq!(source_status(&client, "clock").await["state"], "connected");
    // Idle for longer than idleTimeoutMs: disconnected, its process gone, still discoverable.
    within(Duration::from_secs(10), "the idle source unloading", || async {
        source_status(&client, "clock").await["state"] == "idle"
    })
    .await;
    within(Duration::from_secs(10), "the idle source's process ending", || async {
        !Path::new(&format!("/proc/{pid}")).exists()
    })
    .await;
    // sources.load connects it again.
    let loaded = ok(&client, "capdex.v1.sources.load", json!({"id": "clock"})).await;
    assert_eq!(loaded["source"]["state"], "connected", "{loaded}");
}

#[tokio::test]
async fn mcp_server_git_on_a_repository_made_here() {
    let repo = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let status = std::process::Command::new("git").args(args).current_dir(repo.path()).status().unwrap();
        assert!(status.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(repo.path().join("notes.txt"), "hello").unwrap();
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_served, client) = serve(&nats, data.path(), &[]).await;
    let added = ok(
        &client,
        "capdex.v1.sources.add",
        json!({"id": "git", "kind": "mcp", "command": upstreams::mcp_server_git(),
               "args": ["--repository", repo.path()]}),
    )
    .await;
    assert!(added["source"]["toolCount"].as_u64().unwrap() >= 5, "{added}");
    let status = dispatch(&client, "git#git_status", json!({"repo_path": repo.path()})).await;
    assert!(status.to_string().contains("notes.txt"), "{status}");
}
