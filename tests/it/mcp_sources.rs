//! `upstream::mcp` against real MCP servers nobody here wrote, started by the
//! tests (`support::upstreams`): `mcp-server-time` and `mcp-server-git` over
//! stdio, and `@modelcontextprotocol/server-everything` over stdio and over
//! streamable HTTP on 127.0.0.1. Tools listed, calls answered, `isError`,
//! progress, a timeout that tells the server to cancel, `tools/list_changed`,
//! a tool list over `[limits] max_tools_per_source`,
//! the SSRF guard, and a dead or dropped server noticed at once.

use crate::support::upstreams::{self, EverythingHttp};
use capdex::core::dispatch::ssrf::Cidr;
use capdex::core::sources::settings::{Connection, McpConnection, SourceSettings};
use capdex::core::sources::Invocation;
use capdex::upstream::mcp::{ConnectOptions, McpSession, Progress};
use capdex::upstream::openapi::resolve_under_roots;
use capdex::upstream::UpstreamErrorKind;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const LIST: Duration = Duration::from_secs(15);
const CALL: Duration = Duration::from_secs(15);

fn stdio(program: &Path, args: &[&str]) -> McpConnection {
    McpConnection::Stdio {
        command: program.display().to_string(),
        args: args.iter().map(|arg| arg.to_string()).collect(),
        env: Vec::new(),
        cwd: None,
    }
}

fn loopback() -> ConnectOptions {
    ConnectOptions { init_timeout: Duration::from_secs(30), allowlist: vec![Cidr::parse("127.0.0.1/32").unwrap()] }
}

async fn connect(connection: &McpConnection) -> (McpSession, mpsc::Receiver<()>) {
    McpSession::connect(connection, &loopback()).await.unwrap_or_else(|err| panic!("connect {connection:?}: {err}"))
}

fn everything_stdio() -> McpConnection {
    let (node, script) = upstreams::server_everything();
    McpConnection::Stdio {
        command: node.display().to_string(),
        args: vec![script.display().to_string(), "stdio".into()],
        env: Vec::new(),
        cwd: None,
    }
}

fn text_of(data: &Value) -> String {
    data["content"].as_array().into_iter().flatten().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_server_lists_its_tools_and_answers_calls() {
    let (session, _changes) = connect(&stdio(&upstreams::mcp_server_time(), &["--local-timezone", "UTC"])).await;
    let tools = session.list_tools(LIST).await.unwrap();
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_str()).collect();
    assert!(names.contains(&"get_current_time") && names.contains(&"convert_time"), "{names:?}");
    let get = tools.iter().find(|tool| tool.name == "get_current_time").unwrap();
    assert_eq!(get.invocation, Invocation::Mcp { tool: "get_current_time".into() });
    assert_eq!(get.input_schema["properties"]["timezone"]["type"], "string", "{}", get.input_schema);
    assert!(get.description.contains("time"), "{}", get.description);
    // `[limits] max_tools_per_source`: a list of that many tools passes, one more is refused naming it.
    let at = session.clone().with_max_tools(tools.len()).list_tools(LIST).await.unwrap();
    assert_eq!(at.len(), tools.len());
    let over = session.clone().with_max_tools(tools.len() - 1).list_tools(LIST).await.unwrap_err();
    assert_eq!(over.kind, UpstreamErrorKind::TooLarge, "{over}");
    assert!(over.message.contains("limits.max_tools_per_source"), "{over}");

    let result = session.call_tool("get_current_time", json!({"timezone": "Europe/Paris"}), CALL, None).await;
    assert!(result.success, "{result:?}");
    let data = result.data.unwrap();
    assert_eq!(data["structuredContent"]["timezone"], "Europe/Paris", "{data}");
    assert!(text_of(&data).contains("Europe/Paris"), "{data}");

    let converted = session
        .call_tool(
            "convert_time",
            json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
            CALL,
            None,
        )
        .await;
    assert!(converted.success, "{converted:?}");
    assert!(converted.data.unwrap()["structuredContent"]["target"]["datetime"].as_str().unwrap().contains("T21:00"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_is_error_result_fails_with_the_servers_text() {
    let (session, _changes) = connect(&stdio(&upstreams::mcp_server_time(), &[])).await;
    let result = session.call_tool("get_current_time", json!({"timezone": "Not/AZone"}), CALL, None).await;
    assert_eq!(result.code(), Some("execution_error"), "{result:?}");
    let message = &result.error.as_ref().unwrap().message;
    assert!(message.contains("Invalid timezone") && message.contains("Not/AZone"), "{message}");

    let unknown = session.call_tool("no_such_tool", json!({}), CALL, None).await;
    assert_eq!(unknown.code(), Some("execution_error"), "{unknown:?}");
    assert!(unknown.error.unwrap().message.contains("-32602"));
    let not_object = session.call_tool("get_current_time", json!(["UTC"]), CALL, None).await;
    assert_eq!(not_object.code(), Some("invalid_args"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_git_server_reads_a_real_repository() {
    let repo = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let status = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(repo.path())
            .stdout(std::process::Stdio::null())
            .status()
            .expect("git runs");
        assert!(status.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(repo.path().join("README"), "hello\n").unwrap();
    git(&["add", "README"]);
    git(&["commit", "-q", "-m", "first commit from the test"]);
    std::fs::write(repo.path().join("new.txt"), "untracked\n").unwrap();

    let repo_path = repo.path().display().to_string();
    let (session, _changes) = connect(&stdio(&upstreams::mcp_server_git(), &["--repository", &repo_path])).await;
    let tools = session.list_tools(LIST).await.unwrap();
    assert!(tools.iter().any(|tool| tool.name == "git_status") && tools.len() >= 10, "{tools:?}");

    let status = session.call_tool("git_status", json!({"repo_path": repo_path}), CALL, None).await;
    assert!(status.success, "{status:?}");
    assert!(text_of(status.data.as_ref().unwrap()).contains("new.txt"), "{status:?}");
    let log = session.call_tool("git_log", json!({"repo_path": repo_path}), CALL, None).await;
    assert!(text_of(log.data.as_ref().unwrap()).contains("first commit from the test"), "{log:?}");

    let outside = session.call_tool("git_status", json!({"repo_path": "/"}), CALL, None).await;
    assert_eq!(outside.code(), Some("execution_error"), "{outside:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_reports_tool_list_changes_and_progress() {
    let (session, mut changes) = connect(&everything_stdio()).await;
    // It registers its client-dependent tools once initialized, and says so.
    tokio::time::timeout(Duration::from_secs(10), changes.recv())
        .await
        .expect("notifications/tools/list_changed within 10 s")
        .expect("the channel stays open while the session lives");
    let tools = session.list_tools(LIST).await.unwrap();
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_str()).collect();
    assert!(names.contains(&"echo") && names.contains(&"trigger-long-running-operation"), "{names:?}");
    let long = tools.iter().find(|tool| tool.name == "trigger-long-running-operation").unwrap();
    assert_eq!(long.title.as_deref(), Some("Trigger Long Running Operation Tool"));

    let (progress_tx, mut progress_rx) = mpsc::channel::<Progress>(64);
    let result = session
        .call_tool("trigger-long-running-operation", json!({"duration": 1, "steps": 4}), CALL, Some(progress_tx))
        .await;
    assert!(result.success, "{result:?}");
    assert!(text_of(result.data.as_ref().unwrap()).contains("Steps: 4"), "{result:?}");
    let mut seen = Vec::new();
    while let Ok(progress) = progress_rx.try_recv() {
        seen.push(progress);
    }
    assert!(seen.len() >= 3, "progress seen: {seen:?}");
    assert!(seen.iter().all(|p| p.total == Some(4.0)), "{seen:?}");
    // rmcp handles notifications in tasks of their own, so the last one may be
    // handled after the answer, when the call no longer listens: progress is advisory.
    assert!(seen.windows(2).all(|pair| pair[0].progress < pair[1].progress), "{seen:?}");

    let structured = session.call_tool("get-structured-content", json!({"location": "Chicago"}), CALL, None).await;
    assert!(structured.success, "{structured:?}");
    assert!(structured.data.unwrap()["structuredContent"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_answers_at_once_and_tells_the_server_to_cancel() {
    // The server's stdin is copied to a file (`tee`), to see what it was told.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stdin.jsonl");
    let (node, script) = upstreams::server_everything();
    let shell = format!("tee '{}' | exec '{}' '{}' stdio", log.display(), node.display(), script.display());
    let connection =
        McpConnection::Stdio { command: "sh".into(), args: vec!["-c".into(), shell], env: Vec::new(), cwd: None };
    let (session, _changes) = connect(&connection).await;

    let started = Instant::now();
    let result = session
        .call_tool(
            "trigger-long-running-operation",
            json!({"duration": 30, "steps": 30}),
            Duration::from_millis(800),
            None,
        )
        .await;
    assert_eq!(result.code(), Some("execution_error"), "{result:?}");
    assert!(result.error.as_ref().unwrap().message.contains("cancelled"), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());

    // The session still serves, and the server was sent notifications/cancelled for that request.
    let echo = session.call_tool("echo", json!({"message": "still here"}), CALL, None).await;
    assert!(echo.success && text_of(echo.data.as_ref().unwrap()).contains("still here"), "{echo:?}");
    let sent = std::fs::read_to_string(&log).unwrap();
    let messages: Vec<Value> = sent.lines().filter_map(|line| serde_json::from_str(line).ok()).collect();
    let call = messages
        .iter()
        .find(|m| m["method"] == "tools/call" && m["params"]["name"] == "trigger-long-running-operation")
        .unwrap_or_else(|| panic!("no tools/call in {sent}"));
    assert!(
        messages.iter().any(|m| m["method"] == "notifications/cancelled" && m["params"]["requestId"] == call["id"]),
        "no notifications/cancelled for request {} in {sent}",
        call["id"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_noticed_at_once() {
    let (session, _changes) = connect(&everything_stdio()).await;
    let pid = session.process_id().expect("a stdio session knows its child");
    let in_flight = {
        let session = session.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let result = session
                .call_tool(
                    "trigger-long-running-operation",
                    json!({"duration": 60, "steps": 60}),
                    Duration::from_secs(60),
                    None,
                )
                .await;
            (result, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(status.success());

    let reason = tokio::time::timeout(Duration::from_secs(5), session.closed()).await.expect("closed within 5 s");
    assert!(reason.contains("closed"), "{reason}");
    assert!(session.is_closed());
    let (result, elapsed) = in_flight.await.unwrap();
    assert_eq!(result.code(), Some("unavailable"), "{result:?}");
    assert!(elapsed < Duration::from_secs(6), "the in-flight call waited {elapsed:?}");
    let started = Instant::now();
    let after = session.call_tool("echo", json!({"message": "x"}), CALL, None).await;
    assert_eq!(after.code(), Some("unavailable"), "{after:?}");
    assert!(started.elapsed() < Duration::from_millis(500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_session_ends_the_child() {
    let (session, _changes) = connect(&stdio(&upstreams::mcp_server_time(), &[])).await;
    let pid = session.process_id().unwrap();
    let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    assert!(proc_dir.exists());
    drop(session);
    let deadline = Instant::now() + Duration::from_secs(10);
    // A reaped child leaves /proc; a zombie would still show a status of Z.
    while proc_dir.exists()
        && !std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default().contains(") Z")
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stat = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
    assert!(stat.is_empty() || stat.contains(") Z"), "the child still runs: {stat}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_cannot_start_or_speak_mcp_is_a_typed_error() {
    let missing = stdio(Path::new("/nonexistent/capdex-no-such-server"), &[]);
    let err = McpSession::connect(&missing, &loopback()).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Spawn, "{err}");

    // `cat` echoes the client's own initialize request back: not an answer.
    let options = ConnectOptions { init_timeout: Duration::from_secs(3), ..loopback() };
    let started = Instant::now();
    let err = McpSession::connect(&stdio(Path::new("cat"), &[]), &options).await.unwrap_err();
    assert!(matches!(err.kind, UpstreamErrorKind::Connect | UpstreamErrorKind::Timeout), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // A program that exits at once, with its last words in the error.
    let dies = McpConnection::Stdio {
        command: "sh".into(),
        args: vec!["-c".into(), "echo 'fatal: no config' >&2; exit 3".into()],
        env: Vec::new(),
        cwd: None,
    };
    let err = McpSession::connect(&dies, &options).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Connect, "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_streamable_http() {
    let server = EverythingHttp::start();
    let connection =
        McpConnection::Http { url: server.url.clone(), headers: vec![("X-Capdex-Test".into(), "1".into())] };

    // Loopback is refused unless allowlisted.
    let refused = McpSession::connect(&connection, &ConnectOptions::default()).await.unwrap_err();
    assert_eq!(refused.kind, UpstreamErrorKind::TargetRefused, "{refused}");

    let (session, _changes) = connect(&connection).await;
    let tools = session.list_tools(LIST).await.unwrap();
    assert!(tools.iter().any(|tool| tool.name == "get-sum"), "{tools:?}");
    let sum = session.call_tool("get-sum", json!({"a": 2, "b": 40}), CALL, None).await;
    assert!(sum.success, "{sum:?}");
    assert!(text_of(sum.data.as_ref().unwrap()).contains("42"), "{sum:?}");

    let (progress_tx, mut progress_rx) = mpsc::channel::<Progress>(64);
    let long = session
        .call_tool("trigger-long-running-operation", json!({"duration": 1, "steps": 2}), CALL, Some(progress_tx))
        .await;
    assert!(long.success, "{long:?}");
    assert!(progress_rx.try_recv().is_ok(), "progress arrives over HTTP too");

    let bad = session.call_tool("get-sum", json!({"a": "two"}), CALL, None).await;
    assert!(!bad.success, "{bad:?}");
}

fn paged(total: usize, page: usize, endless: bool) -> McpConnection {
    let script = crate::support::fixture("servers/paged_mcp_server.py");
    let mut args = vec![script.display().to_string(), total.to_string(), page.to_string()];
    if endless {
        args.push("--endless".into());
    }
    McpConnection::Stdio {
        command: upstreams::python_with_mcp().display().to_string(),
        args,
        env: Vec::new(),
        cwd: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_of_tools_is_listed_and_endless_paging_is_cut() {
    let (session, _changes) = connect(&paged(25, 10, false)).await;
    let tools = session.list_tools(LIST).await.unwrap();
    let names: Vec<String> = tools.iter().map(|tool| tool.name.clone()).collect();
    let expected: Vec<String> = (0..25).map(|i| format!("tool_{i:03}")).collect();
    assert_eq!(names, expected);
    assert_eq!(tools[24].description, "tool number 24");

    let (endless, _changes) = connect(&paged(0, 3, true)).await;
    let started = Instant::now();
    let err = endless.list_tools(Duration::from_secs(60)).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Protocol, "{err}");
    assert!(err.message.contains("within 100 pages, over limits.max_tool_pages"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());

    // limits.max_tool_pages: three pages (25 tools, 10 a page) are listed at 3 and refused at 2.
    let (session, _changes) = connect(&paged(25, 10, false)).await;
    assert_eq!(session.with_max_pages(3).list_tools(LIST).await.unwrap().len(), 25, "at the limit");
    let (session, _changes) = connect(&paged(25, 10, false)).await;
    let err = session.with_max_pages(2).list_tools(LIST).await.unwrap_err();
    assert!(err.message.contains("within 2 pages, over limits.max_tool_pages"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_http_server_makes_calls_unavailable_fast() {
    let server = EverythingHttp::start();
    let connection = McpConnection::Http { url: server.url.clone(), headers: Vec::new() };
    let (session, _changes) = connect(&connection).await;
    assert!(session.call_tool("echo", json!({"message": "up"}), CALL, None).await.success);
    drop(server);
    let started = Instant::now();
    let result = session.call_tool("echo", json!({"message": "down"}), CALL, None).await;
    assert!(!result.success, "{result:?}");
    assert_eq!(result.code(), Some("unavailable"), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    let reason = tokio::time::timeout(Duration::from_secs(5), session.closed()).await.expect("closed within 5 s");
    assert!(session.is_closed(), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_gets_only_the_declared_environment_and_its_cwd() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("work")).unwrap();
    let (node, script) = upstreams::server_everything();
    // The settings as a user declares them, the token a template resolved at connect time.
    let settings: SourceSettings = serde_json::from_value(json!({
        "id": "everything",
        "kind": "mcp",
        "command": "sh",
        "args": ["-c", format!("pwd > where.txt; exec '{}' '{}' stdio", node.display(), script.display())],
        "env": {"SOURCE_TOKEN": "Bearer ${env:EVERYTHING_TOKEN}"},
        "cwd": "work",
    }))
    .unwrap();
    settings.validate().unwrap();
    let resolved = settings
        .resolve(&capdex::core::dispatch::env_template::EnvAllow::any(), &|name| {
            (name == "EVERYTHING_TOKEN").then(|| "s3cr3t".to_string())
        })
        .unwrap();
    assert_eq!(resolved.secrets, vec!["s3cr3t"]);
    let Connection::Mcp(McpConnection::Stdio { command, args, env, cwd: Some(cwd) }) = resolved.connection else {
        panic!("a stdio connection with a cwd")
    };
    // The shell checks the cwd against its allowed roots, and passes it canonical.
    let cwd = resolve_under_roots(&cwd, &[dir.path().to_path_buf()]).await.unwrap();
    let connection = McpConnection::Stdio { command, args, env, cwd: Some(cwd.display().to_string()) };

    let (session, _changes) = connect(&connection).await;
    let result = session.call_tool("get-env", json!({}), CALL, None).await;
    assert!(result.success, "{result:?}");
    let env: Value = serde_json::from_str(&text_of(result.data.as_ref().unwrap())).unwrap();
    assert_eq!(env["SOURCE_TOKEN"], "Bearer s3cr3t");
    assert!(env.get("PATH").is_some(), "PATH is passed on: {env}");
    // cargo gives the test its CARGO_* variables: capdex's own environment, not the source's.
    let own: Vec<String> = std::env::vars()
        .map(|(name, _)| name)
        .filter(|name| name.starts_with("CARGO") || name.starts_with("CAPDEX_"))
        .collect();
    assert!(!own.is_empty());
    for name in own {
        assert!(env.get(&name).is_none(), "capdex's {name} leaked to the source: {env}");
    }
    let written = std::fs::read_to_string(cwd.join("where.txt")).unwrap();
    assert_eq!(std::path::Path::new(written.trim()), cwd.as_path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_each_get_their_own_progress() {
    let (session, _changes) = connect(&everything_stdio()).await;
    let calls = [3.0, 5.0].map(|steps| {
        let session = session.clone();
        tokio::spawn(async move {
            let (progress_tx, mut progress_rx) = mpsc::channel::<Progress>(64);
            let result = session
                .call_tool(
                    "trigger-long-running-operation",
                    json!({"duration": 1, "steps": steps}),
                    CALL,
                    Some(progress_tx),
                )
                .await;
            let mut totals = Vec::new();
            while let Ok(progress) = progress_rx.try_recv() {
                totals.push(progress.total);
            }
            (steps, result, totals)
        })
    });
    for call in calls {
        let (steps, result, totals) = call.await.unwrap();
        assert!(result.success, "{result:?}");
        assert!(totals.len() as f64 >= steps - 1.0, "{steps} steps, progress totals {totals:?}");
        assert!(totals.iter().all(|total| *total == Some(steps)), "{steps} steps, progress totals {totals:?}");
    }
}
