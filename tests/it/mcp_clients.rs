//! capdex's MCP face against clients nobody here wrote: the official MCP
//! Python SDK (`mcp` from PyPI, `tests/mcp_clients/capdex_client.py`) over
//! stdio (`capdex mcp`) and over streamable HTTP (`capdex serve` with
//! `[mcp] listen`), and the MCP Inspector's CLI mode where Node.js is present.
//!
//! The interpreter is `CAPDEX_PYTHON`, else `<crate>/.venv/bin/python`; it
//! must import `mcp`. The Inspector is `node_modules/.bin/mcp-inspector` under `CAPDEX_NPM_TOOLS`
//! (else `.npm-tools`; `scripts/test.sh` installs it, pinned); its test is skipped only without Node.js.

use crate::cli::{capdex, examples_dir};
use crate::support::nats_server::NatsServer;
use crate::support::serving::serve_at;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn python() -> PathBuf {
    let python = std::env::var_os("CAPDEX_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    let check = Command::new(&python).args(["-c", "import mcp"]).output();
    assert!(
        matches!(&check, Ok(output) if output.status.success()),
        "{} cannot import the MCP SDK ({check:?}); .venv/bin/pip install mcp, or set CAPDEX_PYTHON",
        python.display()
    );
    python
}

fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_clients/capdex_client.py")
}

/// A capability that needs approval and runs the built-in echo handler.
fn register_guarded_echo(data: &Path) {
    let record = json!({
        "slug": "guarded_echo", "name": "guarded_echo", "description": "Echoes text back once a person approves",
        "category": "test", "executionType": "internal", "handler": "builtin:echo", "requiresApproval": true,
        "functionDefinition": {"name": "guarded_echo", "description": "echo with approval",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    });
    let file = data.join("guarded_echo.json");
    std::fs::write(&file, record.to_string()).unwrap();
    let output = capdex()
        .args(["capability", "register"])
        .arg(&file)
        .env("CAPDEX_DATA_DIR", data.join("state"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// Runs one scenario of the Python client and returns what it observed.
fn run_client(args: &[&str]) -> Value {
    let output = Command::new(python()).arg(client_script()).args(args).output().expect("the Python client runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the Python MCP client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|err| panic!("not JSON ({err}): {stdout}"))
}

fn stdio_args<'a>(scenario: &'a str, data: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![scenario, "--capdex", env!("CARGO_BIN_EXE_capdex"), "--data-dir", data];
    args.extend_from_slice(extra);
    args
}

/// What every transport's tour must show.
fn check_tour(seen: &Value) {
    let tools: Vec<&str> = seen["tools"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(tools, ["discover_capabilities", "call_capability", "route_sources", "report_outcome"], "{seen}");
    assert_eq!(seen["outputSchemas"].as_array().unwrap().len(), 4, "every tool declares its output schema");
    assert_eq!(seen["protocolVersion"], "2025-11-25", "the newest handshake version is negotiated");

    let discover = &seen["discover"];
    assert_eq!(discover["isError"], false, "{discover}");
    let found = discover["structured"]["capabilities"].as_array().unwrap();
    let first = found.iter().find(|entry| entry["id"] == "tool:echo").unwrap_or_else(|| panic!("{discover}"));
    assert_eq!((first["name"].as_str(), first["kind"].as_str()), (Some("echo"), Some("tool")));
    // One catalog: the capability registered for dispatch is discoverable too.
    assert!(found.iter().any(|entry| entry["id"] == "tool:guarded_echo"), "{discover}");
    let relevance = first["relevance"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&relevance) && relevance > 0.3, "{first}");
    assert!(discover["text"].as_str().unwrap().contains("Relevant capabilities:"), "the rendered tiers are the text");
    // The same budgets as capdex.v1.discover: 200 + 800 + 2,000 tokens.
    assert!(discover["structured"]["tokenEstimate"]["totalTokens"].as_u64().unwrap() <= 3000);

    assert_eq!(seen["echo"]["isError"], false, "{seen}");
    assert_eq!(seen["echo"]["structured"]["data"]["text"], "hello mcp");
    for (case, code) in
        [("badArgs", "invalid_args"), ("missingQuery", "invalid_args"), ("unknownCapability", "unknown_capability")]
    {
        assert_eq!(seen[case]["isError"], true, "{case}: {seen}");
        assert_eq!(seen[case]["structured"]["error"]["code"], code, "{case}: {seen}");
    }
    assert_eq!(seen["unknownTool"]["code"], -32602, "an unknown tool is a JSON-RPC error: {seen}");

    assert_eq!(seen["approved"]["isError"], false, "elicitation approved the call: {seen}");
    assert_eq!(seen["approved"]["structured"]["data"]["text"], "approved once");
    assert_eq!(seen["declined"]["structured"]["error"]["code"], "approval_rejected", "{seen}");
    assert_eq!(seen["cancelled"]["code"], -32001, "the client gave up and cancelled: {seen}");
    assert!(seen["cancelSeconds"].as_f64().unwrap() < 5.0, "{seen}");
    assert_eq!(seen["afterCancel"]["structured"]["data"]["text"], "still here", "the session survives a cancel");
    assert_eq!(seen["elicitations"], 3, "approve, decline, and the cancelled one");

    assert_eq!(seen["outcome"]["structured"]["accepted"], true, "{seen}");
    assert_eq!(seen["outcome"]["structured"]["kpi"]["scopeKey"], "py");
    assert_eq!(seen["outcome"]["structured"]["kpi"]["sampleCount"], 1);
    assert!(seen["route"]["structured"]["recipes"].is_array(), "{seen}");
    assert_eq!(seen["ping"], true);
}

/// The approvals recorded in the data dir (read after the session ended).
fn approvals(data: &Path) -> Vec<Value> {
    let output =
        capdex().args(["approval", "list", "--all"]).env("CAPDEX_DATA_DIR", data.join("state")).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let listed: Value = serde_json::from_slice(&output.stdout).unwrap();
    listed["approvals"].as_array().unwrap().clone()
}

#[test]
fn python_sdk_over_stdio() {
    let data = tempfile::tempdir().unwrap();
    register_guarded_echo(data.path());
    let state = data.path().join("state").display().to_string();
    let dir = examples_dir().display().to_string();
    let seen = run_client(&stdio_args("tour", &state, &["--capability-dir", &dir]));
    check_tour(&seen);
    // One agent per session, from the client's declared name; approvals are bound to it.
    let approvals = approvals(data.path());
    let statuses: Vec<(&str, &str)> =
        approvals.iter().map(|a| (a["agentId"].as_str().unwrap(), a["status"].as_str().unwrap())).collect();
    assert_eq!(statuses.len(), 3, "{approvals:?}");
    for status in ["used", "rejected", "pending"] {
        assert!(statuses.contains(&("mcp:py-tour", status)), "{status}: {statuses:?}");
    }
    // The elicited decisions are the MCP face's; the pending one is undecided.
    for approval in &approvals {
        let by = if approval["status"] == "pending" { Value::Null } else { Value::from("mcp") };
        assert_eq!(approval["decidedBy"], by, "{approval}");
    }
}

#[test]
fn python_sdk_over_stdio_approval_without_elicitation() {
    let data = tempfile::tempdir().unwrap();
    register_guarded_echo(data.path());
    let state = data.path().join("state").display().to_string();
    let asked = run_client(&stdio_args("no-elicitation", &state, &["--agent-id", "desk-agent"]));
    let call = &asked["call"]["structured"];
    assert_eq!(call["status"], "requires_approval", "{asked}");
    let approval_id = call["approvalId"].as_str().unwrap().to_string();
    assert!(call["howToApprove"].as_str().unwrap().contains(&format!("capdex approval approve {approval_id}")));
    let early =
        run_client(&stdio_args("no-elicitation", &state, &["--agent-id", "desk-agent", "--approval-id", &approval_id]));
    assert_eq!(early["call"]["structured"]["error"]["code"], "approval_invalid", "still pending: {early}");

    let approve = capdex()
        .args(["approval", "approve", &approval_id, "--by", "desk lead"])
        .env("CAPDEX_DATA_DIR", data.path().join("state"))
        .output()
        .unwrap();
    assert!(approve.status.success(), "{}", String::from_utf8_lossy(&approve.stderr));
    let approved: Value = serde_json::from_slice(&approve.stdout).unwrap();
    assert_eq!((approved["status"].as_str(), approved["decidedBy"].as_str()), (Some("approved"), Some("desk lead")));
    let other_agent =
        run_client(&stdio_args("no-elicitation", &state, &["--agent-id", "other", "--approval-id", &approval_id]));
    assert_eq!(
        other_agent["call"]["structured"]["error"]["code"], "approval_invalid",
        "bound to its agent: {other_agent}"
    );
    let approved =
        run_client(&stdio_args("no-elicitation", &state, &["--agent-id", "desk-agent", "--approval-id", &approval_id]));
    assert_eq!(approved["call"]["isError"], false, "{approved}");
    assert_eq!(approved["call"]["structured"]["data"]["text"], "approved later");
    let again =
        run_client(&stdio_args("no-elicitation", &state, &["--agent-id", "desk-agent", "--approval-id", &approval_id]));
    assert_eq!(again["call"]["structured"]["error"]["code"], "approval_invalid", "an approval permits one call");
}

fn check_direct(seen: &Value) {
    let before: Vec<&str> = seen["before"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(before.len(), 4, "{seen}");
    assert!(seen["changed"].as_u64().unwrap() >= 1, "tools/list_changed was sent: {seen}");
    let after: Vec<&str> = seen["after"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(after.contains(&"echo"), "{seen}");
    assert_eq!(seen["echo"]["isError"], false, "{seen}");
    assert_eq!(seen["echo"]["structured"]["data"]["text"], "direct call");
}

#[test]
fn python_sdk_over_stdio_direct_mode() {
    let data = tempfile::tempdir().unwrap();
    let state = data.path().join("state").display().to_string();
    check_direct(&run_client(&stdio_args("direct", &state, &["--direct"])));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_over_streamable_http() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    register_guarded_echo(data.path());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let token = "it-mcp-token-0123456789";
    let (_served, client) = serve_at(
        &nats,
        &examples_dir(),
        &data.path().join("state"),
        false,
        &[
            ("CAPDEX_MCP_LISTEN", &listen),
            ("CAPDEX_MCP_TOKEN", "${env:IT_MCP_TOKEN}"),
            ("IT_MCP_TOKEN", token),
            ("CAPDEX_MCP_TOKEN_AGENT_ID", "http-agent"),
        ],
    )
    .await;
    let url = format!("http://{listen}/mcp");

    capdex::tls::install_provider();
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    let unauthorised =
        http.post(&url).header("accept", "application/json, text/event-stream").json(&init).send().await.unwrap();
    assert_eq!(unauthorised.status().as_u16(), 401, "no token, no MCP");
    let wrong = http.post(&url).bearer_auth("nope").json(&init).send().await.unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    // Text that is not JSON: 400 with the JSON-RPC parse error, as the specification gives it.
    let garbled = http
        .post(&url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body("this is not JSON")
        .send()
        .await
        .unwrap();
    assert_eq!(garbled.status().as_u16(), 400);
    let frame: Value = garbled.json().await.unwrap();
    assert_eq!((frame["id"].clone(), frame["error"]["code"].clone()), (Value::Null, json!(-32700)), "{frame}");

    // An outcome reported over MCP raises its scope's KPI event on NATS, as over NATS.
    let mut kpi_events = client.subscribe("capdex.v1.kpi.py").await.unwrap();
    client.flush().await.unwrap();
    let (tour_url, direct_url) = (url.clone(), url.clone());
    let seen = tokio::task::spawn_blocking(move || run_client(&["tour", "--http", &tour_url, "--token", token]))
        .await
        .unwrap();
    check_tour(&seen);
    let event = tokio::time::timeout(Duration::from_secs(10), futures::StreamExt::next(&mut kpi_events))
        .await
        .expect("a KPI event within 10 s")
        .unwrap();
    let kpi: Value = serde_json::from_slice(&event.payload).unwrap();
    assert_eq!((kpi["scopeKey"].as_str(), kpi["sampleCount"].as_u64()), (Some("py"), Some(1)), "{kpi}");
    let direct = tokio::task::spawn_blocking(move || {
        run_client(&["direct", "--http", &direct_url, "--token", token, "--direct"])
    })
    .await
    .unwrap();
    check_direct(&direct);

    // The HTTP token's agent owns the session's approvals, as over NATS.
    let reply = tokio::time::timeout(
        Duration::from_secs(15),
        client.request("capdex.v1.approval.list", json!({"all": true}).to_string().into()),
    )
    .await
    .unwrap()
    .unwrap();
    let listed: Value = serde_json::from_slice(&reply.payload).unwrap();
    let agents: Vec<&str> =
        listed["approvals"].as_array().unwrap().iter().map(|a| a["agentId"].as_str().unwrap()).collect();
    assert_eq!(agents, ["http-agent"; 3], "{listed}");
}

#[test]
fn mcp_inspector_cli_lists_and_calls_tools() {
    let tools = std::env::var_os("CAPDEX_NPM_TOOLS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".npm-tools"));
    let inspector = tools.join("node_modules/.bin/mcp-inspector");
    let has_node =
        std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("node").is_file()));
    if !has_node {
        eprintln!("skipped: Node.js is not on PATH, so the MCP Inspector cannot run");
        return;
    }
    assert!(
        inspector.exists(),
        "no {}: run scripts/test.sh, or npm install --prefix .npm-tools @modelcontextprotocol/inspector@2.12.0",
        inspector.display()
    );
    let data = tempfile::tempdir().unwrap();
    let inspect = |extra: &[&str]| {
        let output = Command::new(&inspector)
            .args(["--cli", "-e", &format!("CAPDEX_DATA_DIR={}", data.path().display())])
            .args(["-e", "CAPDEX_LOG=warn", "-e", "CAPDEX_WATCH=false"])
            .args(extra)
            .args(["--", env!("CARGO_BIN_EXE_capdex"), "mcp"])
            .output()
            .expect("the inspector runs");
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(output.status.success(), "inspector failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_str::<Value>(&stdout).unwrap_or_else(|err| panic!("not JSON ({err}): {stdout}"))
    };
    let listed = inspect(&["--method", "tools/list"]);
    let names: Vec<&str> = listed["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["discover_capabilities", "call_capability", "route_sources", "report_outcome"], "{listed}");
    let called = inspect(&[
        "--method",
        "tools/call",
        "--tool-name",
        "call_capability",
        "--tool-arg",
        "id=echo",
        "--tool-arg",
        r#"arguments={"text":"from the inspector"}"#,
    ]);
    assert_eq!(called["structuredContent"]["data"]["text"], "from the inspector", "{called}");
}

#[test]
fn stdio_carries_only_json_rpc_frames_and_answers_bad_input() {
    use std::io::Write;
    let data = tempfile::tempdir().unwrap();
    let mut child = capdex()
        .arg("mcp")
        .env("CAPDEX_DATA_DIR", data.path())
        // Logs at info, which must all go to stderr.
        .env("CAPDEX_CAPABILITY_DIRS", data.path().join("missing"))
        .env("CAPDEX_LOG", "info")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let requests = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
            "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"cursor": "bogus"}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "report_outcome",
            "arguments": {"status": "great"}}}),
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "call_capability",
            "arguments": {"id": "echo", "arguments": {"text": "raw"}, "executionId": "run-1"}}}),
        json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "call_capability",
            "arguments": {"id": "echo", "arguments": {"text": "raw"}, "executionId": "run-1"}}}),
    ];
    let mut stdin = child.stdin.take().unwrap();
    for request in &requests {
        writeln!(stdin, "{request}").unwrap();
    }
    // What the specification answers with an error frame: text that is not JSON (-32700),
    // and tools/call arguments that are not an object (-32602).
    writeln!(stdin, "this is not JSON").unwrap();
    let bad_arguments = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "call_capability", "arguments": "not an object"}});
    writeln!(stdin, "{bad_arguments}").unwrap();
    writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": 8, "method": "ping"})).unwrap();
    let output = {
        // Closing stdin ends the session once every request is answered.
        std::thread::sleep(Duration::from_secs(3));
        drop(stdin);
        child.wait_with_output().unwrap()
    };
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let frames: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|err| panic!("not a JSON-RPC frame ({err}): {line}")))
        .collect();
    let by_id = |id: u64| frames.iter().find(|f| f["id"] == id).unwrap_or_else(|| panic!("no answer {id}: {stdout}"));
    assert_eq!(by_id(1)["result"]["serverInfo"]["name"], "capdex");
    assert_eq!(by_id(1)["result"]["protocolVersion"], "2025-06-18", "the client's version is kept");
    assert_eq!(by_id(2)["error"]["code"], -32602, "a cursor capdex never gave");
    assert_eq!(by_id(3)["result"], json!({}));
    assert_eq!(by_id(4)["result"]["isError"], true);
    assert_eq!(by_id(4)["result"]["structuredContent"]["error"]["code"], "invalid_args");
    // The same executionId twice: the stored result, the handler ran once.
    assert_eq!(by_id(5)["result"]["structuredContent"]["data"]["text"], "raw");
    assert_eq!(by_id(6)["result"]["structuredContent"], by_id(5)["result"]["structuredContent"]);
    assert!(
        frames.iter().any(|f| f["id"].is_null() && f["error"]["code"] == -32700),
        "a parse error is answered: {stdout}"
    );
    assert_eq!(by_id(7)["error"]["code"], -32602, "{stdout}");
    assert_eq!(by_id(8)["result"], json!({}), "the session goes on after bad input");
    assert!(String::from_utf8_lossy(&output.stderr).contains("capability folders indexed"), "logs go to stderr");
}
