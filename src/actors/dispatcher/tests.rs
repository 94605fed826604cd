//! The Dispatcher through its messages, under an actix System with a real
//! sled store in a temporary directory: a plain call, re-drive replays (after
//! a restart too), a concurrent duplicate, a key left in progress by a dead
//! process, an approval asked for then used, and refusals.

use super::*;
use crate::core::dispatch::pipeline::BindingMode;
use crate::core::dispatch::registry::tests::record;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

fn settings() -> DispatchSettings {
    DispatchSettings {
        default_timeout_ms: 5_000,
        approval_ttl_ms: 60_000,
        binding_mode: BindingMode::Open,
        rate_window_ms: 60_000,
        ssrf_allowlist: Vec::new(),
        env_allow: crate::core::dispatch::env_template::EnvAllow::default(),
        max_id_bytes: crate::core::limits::Limits::default().max_id_bytes,
    }
}

/// An in-process handler `h` that counts its runs and answers `{n, q}`.
fn counting(runs: &Arc<AtomicU64>) -> InProcessHandler {
    let runs = runs.clone();
    Arc::new(move |request: &ExecRequest| {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        CallResult::ok(json!({"n": n, "q": request.arguments["q"]}))
    })
}

/// A dispatcher on `store` whose handler `h` counts into `runs`; its events are collected in `events`.
fn start(store: &Store, runs: &Arc<AtomicU64>, events: &Arc<Mutex<Vec<DispatchEvent>>>) -> Addr<Dispatcher> {
    let events = events.clone();
    let sink: EventSink = Arc::new(move |event: &DispatchEvent| events.lock().unwrap().push(event.clone()));
    Dispatcher::new(store.clone(), settings()).unwrap().with_handler("h", counting(runs)).with_event_sink(sink).start()
}

fn call(slug: &str, q: &str, step: Option<&str>) -> Dispatch {
    Dispatch {
        call: DispatchCall {
            slug: slug.into(),
            arguments: json!({"q": q}),
            agent_id: "agent".into(),
            execution_id: step.map(|_| "run-1".to_string()),
            step_id: step.map(str::to_string),
            turn: None,
            approval_id: None,
        },
    }
}

async fn register(dispatcher: &Addr<Dispatcher>, record: CapabilityRecord) {
    dispatcher.send(RegisterCapability { record, update: false }).await.unwrap().unwrap();
}

async fn stats(dispatcher: &Addr<Dispatcher>) -> DispatcherStats {
    dispatcher.send(Inspect::<DispatcherStats>::new()).await.unwrap()
}

fn fixture() -> (tempfile::TempDir, Store, Arc<AtomicU64>, Arc<Mutex<Vec<DispatchEvent>>>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    (dir, store, Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(Vec::new())))
}

#[actix::test]
async fn a_plain_call_runs_its_handler_and_records_provenance_and_an_event() {
    let (_dir, store, runs, events) = fixture();
    let dispatcher = start(&store, &runs, &events);
    register(&dispatcher, record("lookup")).await;
    let result = dispatcher.send(call("lookup", "x", None)).await.unwrap();
    assert_eq!(result, CallResult::ok(json!({"n": 1, "q": "x"})));
    let mut echo = call("echo", "hi", None);
    echo.call.arguments = json!({"text": "hi"});
    let echoed = dispatcher.send(echo).await.unwrap();
    assert!(echoed.success, "the built-in echo runs in-process: {echoed:?}");
    assert_eq!(stats(&dispatcher).await, DispatcherStats { executed: 2, ..DispatcherStats::default() });
    let events = events.lock().unwrap().clone();
    assert_eq!(
        events.iter().map(|e| (e.slug.as_str(), e.handler_ran)).collect::<Vec<_>>(),
        [("lookup", true), ("echo", true)]
    );
    let provenance = dispatcher.send(ListProvenance { limit: 10 }).await.unwrap().unwrap();
    assert_eq!(provenance.len(), 2);
    assert_eq!(provenance[0].slug, "lookup");
}

#[actix::test]
async fn a_re_drive_replays_the_stored_result_without_running_the_handler_even_after_a_restart() {
    let (_dir, store, runs, events) = fixture();
    let dispatcher = start(&store, &runs, &events);
    register(&dispatcher, record("refund")).await;
    let first = dispatcher.send(call("refund", "o-1", Some("step-1"))).await.unwrap();
    let again = dispatcher.send(call("refund", "o-1", Some("step-1"))).await.unwrap();
    assert_eq!((first.clone(), again), (CallResult::ok(json!({"n": 1, "q": "o-1"})), first.clone()));
    let other = dispatcher.send(call("refund", "o-2", Some("step-1"))).await.unwrap();
    assert_eq!(other.code(), Some("invalid_request"), "the step belongs to the first call: {other:?}");
    assert_eq!(stats(&dispatcher).await, DispatcherStats { executed: 1, replayed: 2, ..DispatcherStats::default() });
    let restarted = start(&store, &runs, &events);
    assert_eq!(restarted.send(call("refund", "o-1", Some("step-1"))).await.unwrap(), first);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once for the step");
    let replays: Vec<bool> = events.lock().unwrap().iter().map(|e| e.replayed).collect();
    assert_eq!(replays, [false, true, true, true]);
}

#[actix::test]
async fn a_key_left_in_progress_by_a_dead_process_is_refused_and_not_run() {
    let (_dir, store, runs, events) = fixture();
    let dispatcher = start(&store, &runs, &events);
    register(&dispatcher, record("refund")).await;
    let Dispatch { call: abandoned } = call("refund", "o-1", Some("step-1"));
    let storage = ExecutionKey { execution_id: "run-1".into(), step_id: "step-1".into(), turn: None }.storage_key();
    let entry = redrive::claim_entry(&abandoned, "a-process-that-died", 1);
    assert_eq!(store.claim_execution(&storage, &entry).unwrap(), redrive::Claim::Claimed);
    let refused = dispatcher.send(call("refund", "o-1", Some("step-1"))).await.unwrap();
    assert_eq!(refused.code(), Some("execution_error"));
    assert!(refused.error.unwrap().message.contains("outcome is unknown"));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A transport whose first request waits for `gate`; counts requests.
struct GatedTransport {
    gate: Mutex<Option<oneshot::Receiver<()>>>,
    requests: Arc<AtomicU64>,
}

impl ExecTransport for GatedTransport {
    fn request(
        &self,
        _slug: &str,
        payload: Vec<u8>,
        _timeout_ms: u64,
    ) -> futures::future::LocalBoxFuture<'static, Result<Vec<u8>, ExecFailure>> {
        let n = self.requests.fetch_add(1, Ordering::SeqCst) + 1;
        let gate = self.gate.lock().unwrap().take();
        Box::pin(async move {
            if let Some(gate) = gate {
                gate.await.map_err(|_| ExecFailure::Transport("the gate was dropped".into()))?;
            }
            let request: ExecRequest = serde_json::from_slice(&payload).unwrap();
            Ok(json!({"success": true, "data": {"n": n, "q": request.arguments["q"]}}).to_string().into_bytes())
        })
    }
}

#[actix::test]
async fn a_concurrent_duplicate_waits_for_the_first_call_and_gets_its_result() {
    let (_dir, store, runs, events) = fixture();
    let (open, gate) = oneshot::channel();
    let requests = Arc::new(AtomicU64::new(0));
    let transport = GatedTransport { gate: Mutex::new(Some(gate)), requests: requests.clone() };
    let dispatcher = start(&store, &runs, &events);
    dispatcher.send(SetTransport(Arc::new(transport))).await.unwrap();
    let mut remote = record("refund");
    remote.handler = "elsewhere".into();
    register(&dispatcher, remote).await;
    let first = dispatcher.send(call("refund", "o-1", Some("step-1")));
    let duplicate = dispatcher.send(call("refund", "o-1", Some("step-1")));
    // The mailbox is in order: once this answers, both calls were handled while the first waits at the gate.
    assert_eq!(stats(&dispatcher).await, DispatcherStats::default());
    open.send(()).unwrap();
    let (first, duplicate) = futures::join!(first, duplicate);
    assert_eq!(first.unwrap(), CallResult::ok(json!({"n": 1, "q": "o-1"})));
    assert_eq!(duplicate.unwrap(), CallResult::ok(json!({"n": 1, "q": "o-1"})));
    assert_eq!(requests.load(Ordering::SeqCst), 1, "one request reached the handler service");
    assert_eq!(stats(&dispatcher).await, DispatcherStats { executed: 1, replayed: 1, ..DispatcherStats::default() });
}

#[actix::test]
async fn an_approval_is_asked_for_then_approved_and_runs_the_call_once() {
    let (_dir, store, runs, events) = fixture();
    let dispatcher = start(&store, &runs, &events);
    let mut gated = record("refund");
    gated.requires_approval = true;
    register(&dispatcher, gated).await;
    let asked = dispatcher.send(call("refund", "o-1", None)).await.unwrap();
    assert_eq!((asked.code(), asked.skip_followup), (Some("requires_approval"), true));
    let id = asked.metadata.unwrap()["approvalId"].as_str().unwrap().to_string();
    let pending = dispatcher.send(ListApprovals { pending_only: true, agent_id: None }).await.unwrap().unwrap();
    assert_eq!(pending.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), [id.as_str()]);
    assert_eq!(pending[0].arguments, Some(json!({"q": "o-1"})), "a pending approval shows what it is for");
    let decide = |by: &str| DecideApproval { id: id.clone(), approve: true, by: by.to_string() };
    let refused = dispatcher.send(decide("a\u{1b}[31m")).await.unwrap().unwrap_err();
    assert_eq!(refused.code(), "bad_request", "{refused:?}");
    let approved = dispatcher.send(decide("alice")).await.unwrap().unwrap();
    assert_eq!(approved.status, approval::ApprovalStatus::Approved);
    assert_eq!(approved.decided_by.as_deref(), Some("alice"));
    let listed = dispatcher.send(ListApprovals { pending_only: false, agent_id: None }).await.unwrap().unwrap();
    assert_eq!(listed[0].decided_by.as_deref(), Some("alice"), "stored with who decided");
    assert!(dispatcher.send(ListApprovals { pending_only: true, agent_id: None }).await.unwrap().unwrap().is_empty());
    let with_approval = |q: &str| {
        let mut dispatch = call("refund", q, None);
        dispatch.call.approval_id = Some(id.clone());
        dispatch
    };
    let other_args = dispatcher.send(with_approval("o-2")).await.unwrap();
    assert_eq!(other_args.code(), Some("approval_invalid"), "{other_args:?}");
    let ran = dispatcher.send(with_approval("o-1")).await.unwrap();
    assert_eq!(ran, CallResult::ok(json!({"n": 1, "q": "o-1"})));
    let twice = dispatcher.send(with_approval("o-1")).await.unwrap();
    assert!(twice.error.unwrap().message.contains("already used"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let provenance = dispatcher.send(ListProvenance { limit: 10 }).await.unwrap().unwrap();
    let used: Vec<Option<&str>> = provenance.iter().map(|p| p.approval_id.as_deref()).collect();
    assert_eq!(used, [None, None, Some(id.as_str()), None], "the run records the approval it used");
    let counted = stats(&dispatcher).await;
    assert_eq!((counted.approvals_requested, counted.executed, counted.refused), (1, 1, 3));
}

#[actix::test]
async fn refusals_run_nothing() {
    let (_dir, store, runs, events) = fixture();
    let dispatcher = start(&store, &runs, &events);
    register(&dispatcher, record("lookup")).await;
    let code = |result: CallResult| result.code().unwrap_or("").to_string();
    assert_eq!(code(dispatcher.send(call("missing", "x", None)).await.unwrap()), "unknown_capability");
    let mut bad_args = call("lookup", "x", None);
    bad_args.call.arguments = json!({"q": 3});
    assert_eq!(code(dispatcher.send(bad_args).await.unwrap()), "invalid_args");
    let mut no_agent = call("lookup", "x", None);
    no_agent.call.agent_id = String::new();
    assert_eq!(code(dispatcher.send(no_agent).await.unwrap()), "invalid_request");
    let mut half_key = call("lookup", "x", Some("step-1"));
    half_key.call.execution_id = None;
    assert_eq!(code(dispatcher.send(half_key).await.unwrap()), "invalid_request");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(stats(&dispatcher).await, DispatcherStats { refused: 4, ..DispatcherStats::default() });
    assert!(events.lock().unwrap().iter().all(|e| !e.handler_ran && !e.replayed));
}

#[actix::test]
async fn a_capability_without_handler_or_transport_fails_and_frees_its_key() {
    let (_dir, store, runs, events) = fixture();
    let dispatcher = start(&store, &runs, &events);
    let mut remote = record("refund");
    remote.handler = "elsewhere".into();
    register(&dispatcher, remote).await;
    for _ in 0..2 {
        let failed = dispatcher.send(call("refund", "o-1", Some("step-1"))).await.unwrap();
        assert!(failed.error.unwrap().message.contains("no transport"), "run again, not replayed");
    }
    assert_eq!(stats(&dispatcher).await, DispatcherStats { failed: 2, ..DispatcherStats::default() });
}

/// Runs source calls: counts them, answers what it was asked (or never answers for `slow`).
struct FakeSessions {
    calls: Arc<Mutex<Vec<SourceCall>>>,
}

impl SourceCalls for FakeSessions {
    fn call(&self, call: SourceCall) -> futures::future::BoxFuture<'static, CallResult> {
        self.calls.lock().unwrap().push(call.clone());
        Box::pin(async move {
            if call.name == "slow" {
                futures::future::pending::<()>().await;
            }
            CallResult::ok(json!({"tool": call.name, "arguments": call.arguments}))
        })
    }
}

fn source_record(source_id: &str, name: &str, timeout_ms: Option<u64>) -> CapabilityRecord {
    let tool = crate::core::sources::SourceTool {
        name: name.into(),
        title: None,
        description: String::new(),
        input_schema: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        output_schema: None,
        invocation: crate::core::sources::Invocation::Mcp { tool: name.into() },
    };
    let facts = crate::core::sources::records::SourceFacts {
        source_id,
        category: None,
        tags: &[],
        loadable: false,
        timeout_ms,
    };
    crate::core::sources::records::record_of(&facts, &tool)
}

#[actix::test]
async fn source_records_run_through_the_source_calls_within_their_timeout() {
    let (_dir, store, runs, events) = fixture();
    let dispatcher = start(&store, &runs, &events);
    let records = vec![source_record("time", "now", None), source_record("time", "slow", Some(50))];
    dispatcher.send(SetSourceRecords { source_id: "time".into(), records }).await.unwrap();
    let down = dispatcher.send(call("time#now", "x", None)).await.unwrap();
    assert_eq!(down.code(), Some("unavailable"), "no sessions: {down:?}");
    assert!(down.error.unwrap().message.contains("time"), "the message names the source");
    let calls = Arc::new(Mutex::new(Vec::new()));
    dispatcher.send(SetSourceCalls(Arc::new(FakeSessions { calls: calls.clone() }))).await.unwrap();
    let ran = dispatcher.send(call("time#now", "x", None)).await.unwrap();
    assert_eq!(ran, CallResult::ok(json!({"tool": "now", "arguments": {"q": "x"}})));
    let seen = calls.lock().unwrap().clone();
    assert_eq!((seen[0].source_id.as_str(), seen[0].agent_id.as_str(), seen[0].timeout_ms), ("time", "agent", 5_000));
    let slow = dispatcher.send(call("time#slow", "x", None)).await.unwrap();
    assert_eq!(slow.code(), Some("execution_error"), "bounded by the source's timeout: {slow:?}");
    let mut bad = call("time#now", "x", None);
    bad.call.arguments = json!({"q": 3});
    assert_eq!(dispatcher.send(bad).await.unwrap().code(), Some("invalid_args"), "the schema is checked");
    {
        let events = events.lock().unwrap();
        let ran = events.iter().find(|event| event.success).unwrap();
        assert_eq!(
            (ran.slug.as_str(), ran.capability_id.as_str(), ran.execution_type.as_str()),
            ("time#now", "time#now", "source")
        );
    }
    dispatcher.send(RemoveSourceRecords { source_id: "time".into() }).await.unwrap();
    let gone = dispatcher.send(call("time#now", "x", None)).await.unwrap();
    assert_eq!(gone.code(), Some("unknown_capability"));
    // A registry reload keeps sources; registering over them is refused.
    dispatcher
        .send(SetSourceRecords { source_id: "time".into(), records: vec![source_record("time", "now", None)] })
        .await
        .unwrap();
    dispatcher.send(ReloadRegistry).await.unwrap().unwrap();
    assert!(dispatcher.send(call("time#now", "x", None)).await.unwrap().success);
    let mut forged = source_record("time", "now", None);
    forged.slug = "forged".into();
    forged.function_definition.name = "forged".into();
    let refused = dispatcher.send(RegisterCapability { record: forged, update: false }).await.unwrap();
    assert_eq!(refused.unwrap_err().code(), "invalid_registration");
}

#[actix::test]
async fn a_call_names_its_record_by_slug_or_discovery_id_and_events_carry_the_discovery_id() {
    let (_dir, store, runs, events) = fixture();
    let dispatcher = start(&store, &runs, &events);
    register(&dispatcher, record("lookup")).await;
    for id in ["lookup", "tool:lookup"] {
        assert!(dispatcher.send(call(id, "x", None)).await.unwrap().success, "{id}");
    }
    let unknown = dispatcher.send(call("tool:nope", "x", None)).await.unwrap();
    assert_eq!(unknown.code(), Some("unknown_capability"));
    let events = events.lock().unwrap().clone();
    let seen: Vec<(&str, &str)> = events.iter().map(|e| (e.slug.as_str(), e.capability_id.as_str())).collect();
    assert_eq!(seen, [("lookup", "tool:lookup"), ("lookup", "tool:lookup"), ("tool:nope", "tool:nope")]);
    let provenance = dispatcher.send(ListProvenance { limit: 10 }).await.unwrap().unwrap();
    assert!(provenance.iter().filter(|row| row.success).all(|row| row.slug == "lookup"), "{provenance:?}");
}

#[actix::test]
async fn figures_count_each_known_capability_s_calls_errors_and_latencies() {
    let (_dir, store, runs, events) = fixture();
    let dispatcher = start(&store, &runs, &events);
    register(&dispatcher, record("lookup")).await;
    for q in ["a", "b", "c"] {
        assert!(dispatcher.send(call("lookup", q, None)).await.unwrap().success);
    }
    let mut bad_args = call("lookup", "x", None);
    bad_args.call.arguments = json!({"q": 3});
    assert_eq!(dispatcher.send(bad_args).await.unwrap().code(), Some("invalid_args"));
    assert_eq!(dispatcher.send(call("missing", "x", None)).await.unwrap().code(), Some("unknown_capability"));
    let figures = dispatcher.send(InspectFigures).await.unwrap();
    assert_eq!(figures.keys().collect::<Vec<_>>(), ["tool:lookup"], "an unknown name is not tracked");
    let lookup = &figures["tool:lookup"];
    assert_eq!((lookup.calls, lookup.errors), (4, 1));
    let (p50, p99) = (lookup.p50_ms.unwrap(), lookup.p99_ms.unwrap());
    assert!(p50 >= 0.0 && p50 <= p99 && p99 < 5_000.0, "{lookup:?}");
}
