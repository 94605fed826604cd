//! Identity from the connection (`docs/security.md`): a real nats-server with
//! the shipped `config/nats-server.conf` (one user per role: capdex, the agents
//! alpha and beta, the approver ops), a real `capdex serve` with the plain
//! subjects off (`CAPDEX_NATS_PLAIN_SUBJECTS=false`), and a runtime logged in
//! as agent alpha that tries every escalation: act as beta, use beta's rate
//! limit, bindings and approvals, read beta's replies, approve its own call.
//! None may succeed; the allowed paths are checked beside them, so the test
//! fails if a refusal comes from something else than the rule it names.

use crate::dispatch::{code, handler, record, register};
use crate::security::{client_with_errors_at, expect_violation, start_capdex, start_shipped_server};
use crate::support::serving::wait_until_serving;
use serde_json::{json, Value};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

type Errors = tokio::sync::mpsc::UnboundedReceiver<String>;

/// Sends `payload` on `subject` and returns the JSON reply, or `None` when no
/// reply comes within 2 s (a request the server refused to route).
async fn try_ask(client: &async_nats::Client, subject: &str, payload: Value) -> Option<Value> {
    let request = client.request(subject.to_string(), payload.to_string().into());
    match tokio::time::timeout(Duration::from_secs(2), request).await {
        Ok(Ok(reply)) => Some(serde_json::from_slice(&reply.payload).unwrap_or(Value::Null)),
        _ => None,
    }
}

async fn ask(client: &async_nats::Client, subject: &str, payload: Value) -> Value {
    try_ask(client, subject, payload.clone()).await.unwrap_or_else(|| panic!("no reply on {subject} to {payload}"))
}

/// The escalations tried and whether each succeeded.
#[derive(Default)]
struct Trials(Vec<(&'static str, bool)>);

impl Trials {
    fn record(&mut self, what: &'static str, succeeded: bool) {
        self.0.push((what, succeeded));
    }

    /// A publish the server must refuse: no reply, and a permissions violation.
    async fn denied(&mut self, what: &'static str, client: &async_nats::Client, errors: &mut Errors, subject: &str) {
        let reply =
            try_ask(client, subject, json!({"slug": "search", "agentId": "beta", "arguments": {"q": "x"}})).await;
        expect_violation(errors, what).await;
        self.record(what, reply.is_some());
    }
}

#[tokio::test]
async fn an_agent_is_what_nats_proves_and_no_escalation_succeeds() {
    let (_server, url) = start_shipped_server();
    let mut served = start_capdex(
        &url,
        &[
            ("CAPDEX_NATS_USER", "capdex".into()),
            ("CAPDEX_NATS_PASSWORD", "capdex-pw-1".into()),
            ("CAPDEX_NATS_PLAIN_SUBJECTS", "false".into()),
        ],
    );
    // The operator (capdex's own user may use every capdex subject) sets up the capabilities.
    let (admin, _admin_errors) = client_with_errors_at(&url, "capdex", "capdex-pw-1", None).await;
    wait_until_serving(&mut served, &admin).await;
    for slug in ["search", "refund"] {
        handler(&admin, slug, Arc::new(AtomicU64::new(0)), Duration::ZERO).await;
    }
    register(&admin, record("search", json!({"rateLimit": 1}))).await;
    register(&admin, record("refund", json!({"requiresApproval": true}))).await;
    let bound =
        ask(&admin, "capdex.v1.binding.set", json!({"agentId": "beta", "slug": "search", "customRateLimit": 5}));
    assert!(bound.await["binding"].is_object());

    let (alpha, mut alpha_errors) =
        client_with_errors_at(&url, "agent-alpha", "alpha-pw-4", Some("_INBOX.agent.alpha")).await;
    let (beta, _beta_errors) = client_with_errors_at(&url, "agent-beta", "beta-pw-5", Some("_INBOX.agent.beta")).await;
    let (approver, _approver_errors) =
        client_with_errors_at(&url, "approver-ops", "approver-pw-6", Some("_INBOX.approver.ops")).await;
    let call =
        |slug: &str, approval: Option<&str>| json!({"slug": slug, "arguments": {"q": "o-1"}, "approvalId": approval});
    let mut trials = Trials::default();

    // The plain subjects are off: even capdex's own user finds no responder there.
    let plain = try_ask(&admin, "capdex.v1.dispatch", json!({"slug": "search", "agentId": "beta"})).await;
    assert!(plain.is_none(), "plain dispatch is off: {plain:?}");
    let plain_approval = try_ask(&admin, "capdex.v1.approval.x.approve", json!({})).await;
    assert!(plain_approval.is_none(), "plain approval decisions are off: {plain_approval:?}");

    // Acting as beta: on the plain subject, on beta's subject, by naming beta in the payload.
    trials.denied("dispatch as beta on capdex.v1.dispatch", &alpha, &mut alpha_errors, "capdex.v1.dispatch").await;
    let subject = "capdex.v1.agent.beta.dispatch";
    trials.denied("dispatch on beta's subject", &alpha, &mut alpha_errors, subject).await;
    let claimed = ask(
        &alpha,
        "capdex.v1.agent.alpha.dispatch",
        json!({"slug": "search", "agentId": "beta",
        "arguments": {"q": "x"}}),
    )
    .await;
    assert_eq!(claimed["code"], "identity_mismatch", "{claimed}");
    trials.record("agentId beta in the payload on alpha's subject", claimed["success"] == true);

    // Rate limits: alpha has the capability's limit (1), beta its binding's (5).
    let first = ask(&alpha, "capdex.v1.agent.alpha.dispatch", call("search", None)).await;
    assert_eq!(first["success"], true, "alpha's own call runs: {first}");
    assert_eq!(first["data"]["arguments"]["q"], "o-1");
    let second = ask(&alpha, "capdex.v1.agent.alpha.dispatch", call("search", None)).await;
    assert_eq!(code(&second), "rate_limited", "{second}");
    trials.record("a second call within beta's rate limit", second["success"] == true);
    for n in 0..3 {
        let own = ask(&beta, "capdex.v1.agent.beta.dispatch", call("search", None)).await;
        assert_eq!(own["success"], true, "beta's call {n} within its own limit: {own}");
    }

    // Bindings: alpha cannot read beta's, nor every agent's.
    let listed = ask(&alpha, "capdex.v1.agent.alpha.binding.list", json!({"agentId": "beta"})).await;
    assert_eq!(listed["code"], "identity_mismatch", "{listed}");
    trials.record("list beta's bindings by naming beta", listed["bindings"].is_array());
    let own = ask(&alpha, "capdex.v1.agent.alpha.binding.list", json!({})).await;
    assert_eq!(own["bindings"], json!([]), "alpha has no bindings: {own}");
    trials.record("beta's binding among alpha's", own["bindings"] != json!([]));
    let theirs = ask(&beta, "capdex.v1.agent.beta.binding.list", json!({})).await;
    assert_eq!(theirs["bindings"][0]["customRateLimit"], 5, "{theirs}");
    trials.denied("list every binding", &alpha, &mut alpha_errors, "capdex.v1.binding.list").await;

    // Approvals: beta's call waits for one; alpha can neither see nor use it.
    let asked = ask(&beta, "capdex.v1.agent.beta.dispatch", call("refund", None)).await;
    assert_eq!(code(&asked), "requires_approval", "{asked}");
    let beta_approval = asked["metadata"]["approvalId"].as_str().unwrap().to_string();
    let seen = ask(&alpha, "capdex.v1.agent.alpha.approval.list", json!({})).await;
    assert_eq!(seen["approvals"], json!([]), "{seen}");
    trials.record("beta's approval among alpha's", seen["approvals"] != json!([]));
    let named = ask(&alpha, "capdex.v1.agent.alpha.approval.list", json!({"agentId": "beta"})).await;
    assert_eq!(named["code"], "identity_mismatch", "{named}");
    trials.record("list beta's approvals by naming beta", named["approvals"].is_array());
    trials.denied("list every approval", &alpha, &mut alpha_errors, "capdex.v1.approval.list").await;
    let pending = ask(&approver, "capdex.v1.approval.list", json!({})).await;
    assert_eq!(pending["approvals"][0]["id"], beta_approval.as_str(), "the approver sees it: {pending}");
    let decided =
        ask(&approver, &format!("capdex.v1.approver.ops.approval.{beta_approval}.approve"), json!({"by": null})).await;
    assert_eq!(decided["decidedBy"], "ops", "decidedBy is the approver NATS proved: {decided}");
    let stolen = ask(&alpha, "capdex.v1.agent.alpha.dispatch", call("refund", Some(&beta_approval))).await;
    assert_eq!(code(&stolen), "approval_invalid", "{stolen}");
    trials.record("use beta's approval", stolen["success"] == true);
    let used = ask(&beta, "capdex.v1.agent.beta.dispatch", call("refund", Some(&beta_approval))).await;
    assert_eq!(used["success"], true, "beta's approved call runs: {used}");

    // Approving its own call: alpha has no decision subject at all.
    let own_call = ask(&alpha, "capdex.v1.agent.alpha.dispatch", call("refund", None)).await;
    assert_eq!(code(&own_call), "requires_approval", "{own_call}");
    let own_approval = own_call["metadata"]["approvalId"].as_str().unwrap().to_string();
    for (what, subject) in [
        ("approve its own call on the plain subject", format!("capdex.v1.approval.{own_approval}.approve")),
        ("approve its own call as approver alpha", format!("capdex.v1.approver.alpha.approval.{own_approval}.approve")),
        ("approve its own call as approver ops", format!("capdex.v1.approver.ops.approval.{own_approval}.approve")),
    ] {
        trials.denied(what, &alpha, &mut alpha_errors, &subject).await;
    }
    let still = ask(&approver, "capdex.v1.approval.list", json!({})).await;
    assert_eq!(still["approvals"][0]["id"], own_approval.as_str(), "still pending: {still}");
    assert_eq!(still["approvals"][0]["status"], "pending");
    let forged =
        ask(&approver, &format!("capdex.v1.approver.ops.approval.{own_approval}.approve"), json!({"by": "alpha"}))
            .await;
    assert_eq!(forged["code"], "identity_mismatch", "an approver cannot sign as someone else: {forged}");

    // capdex itself refuses a decider who is the calling agent, whatever the subjects allow:
    // a call made as agent ops, decided by approver ops.
    let as_ops = ask(&admin, "capdex.v1.agent.ops.dispatch", call("refund", None)).await;
    let ops_approval = as_ops["metadata"]["approvalId"].as_str().unwrap().to_string();
    let self_approved =
        ask(&approver, &format!("capdex.v1.approver.ops.approval.{ops_approval}.approve"), json!({})).await;
    assert_eq!(self_approved["code"], "self_approval", "{self_approved}");
    trials.record("approve a call made as the approver's own agent id", self_approved["status"] == "approved");

    // Reading beta's replies or the dispatch events.
    for (what, subject) in
        [("read beta's replies", "_INBOX.agent.beta.>"), ("read the dispatch events", "capdex.v1.events.dispatch")]
    {
        let _subscription = alpha.subscribe(subject).await.unwrap();
        alpha.flush().await.unwrap();
        expect_violation(&mut alpha_errors, what).await;
        trials.record(what, false);
    }

    let succeeded: Vec<&str> = trials.0.iter().filter(|(_, ok)| *ok).map(|(what, _)| *what).collect();
    eprintln!("escalations tried: {}, succeeded: {}", trials.0.len(), succeeded.len());
    for (what, ok) in &trials.0 {
        eprintln!("  {} {what}", if *ok { "SUCCEEDED" } else { "refused" });
    }
    assert!(trials.0.len() >= 15, "every escalation was tried");
    assert!(succeeded.is_empty(), "escalations succeeded: {succeeded:?}");
}
