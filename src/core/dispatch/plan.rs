//! What the shell does with the pipeline's decision, pure: answer a refusal,
//! store a new approval and answer `requires_approval`, or run the call,
//! after marking its approval used, with the executor [`choose_executor`]
//! picks (an in-process handler, the exec transport, an HTTP request or a
//! webhook POST, with `${env:VAR}` resolved).
//!
//! The shell (`actors::dispatcher`) performs the plan: the store writes, the
//! durability barrier, the handler or the network.

use crate::core::dispatch::approval::{self, Approval};
use crate::core::dispatch::env_template::EnvAllow;
use crate::core::dispatch::pipeline::{self, AdmissionDecision, Admitted, DispatchCall, HttpTarget};
use crate::core::dispatch::registry::{Binding, ExecutionType};
use crate::core::dispatch::{CallResult, ErrorCode, ExecRequest};
use crate::core::sources::{Invocation, SourceCall};
use serde_json::Value;

/// How an admitted call runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Executor {
    /// The in-process handler named `handler`.
    InProcess { handler: String, request: ExecRequest },
    /// The handler service of `slug` over the exec transport; `payload` is the [`ExecRequest`] as JSON.
    Transport { slug: String, payload: Vec<u8>, timeout_ms: u64 },
    /// An `api` request (`webhook: false`, its response is the result) or a fire-and-forget webhook POST.
    Http { target: HttpTarget, body: Value, webhook: bool, timeout_ms: u64 },
    /// A source's tool, through the dispatcher's `SourceCalls` (bounded by `call.timeout_ms`).
    Source(SourceCall),
    /// Nothing can run it (no transport, an invalid binding): this is the answer.
    Unavailable(CallResult),
}

/// What the shell can run calls with.
pub struct Runners<'a> {
    /// True when an in-process handler of that name is installed.
    pub has_handler: &'a dyn Fn(&str) -> bool,
    pub has_transport: bool,
    /// Reads a variable for `${env:VAR}`.
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// The variables `${env:VAR}` may read (`[dispatch] env_allow`).
    pub env_allow: &'a EnvAllow,
    /// The timeout of a capability that sets none, in ms.
    pub default_timeout_ms: u64,
}

/// What to do with a call the pipeline decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Answer this now.
    Answer(CallResult),
    /// Store this new approval (durably), then answer [`approval_requested`].
    RequestApproval(Approval),
    /// Store `consume` (the call's approval, used) durably first if there is one, then run.
    Run { consume: Option<Approval>, executor: Box<Executor> },
}

/// Everything [`plan`] needs besides the decision.
pub struct PlanFacts<'a> {
    pub call: &'a DispatchCall,
    /// The approval `call.approval_id` names, as stored.
    pub stored_approval: Option<&'a Approval>,
    pub now_ms: u64,
    /// An approval's lifetime when its capability sets none, in ms.
    pub default_approval_ttl_ms: u64,
    pub runners: Runners<'a>,
}

/// Returns what to do with a call, given the pipeline's `decision`;
/// `new_approval_id` is asked only when an approval is created.
pub fn plan(decision: AdmissionDecision, facts: &PlanFacts<'_>, new_approval_id: impl FnOnce() -> String) -> Plan {
    match decision {
        AdmissionDecision::Refused(result) => Plan::Answer(result),
        AdmissionDecision::NeedsApproval(record) => Plan::RequestApproval(approval::request(
            new_approval_id(),
            &record,
            &facts.call.agent_id,
            &facts.call.arguments,
            facts.now_ms,
            facts.default_approval_ttl_ms,
        )),
        AdmissionDecision::Run(admitted) => {
            let consume = admitted.approval_id.as_ref().and(facts.stored_approval).map(approval::consumed);
            Plan::Run { consume, executor: Box::new(choose_executor(facts.call, &admitted, &facts.runners)) }
        }
    }
}

/// The `requires_approval` answer once `approval` is stored.
pub fn approval_requested(approval: &Approval) -> CallResult {
    pipeline::requires_approval(approval, &format!("approval.{}.approve", approval.id))
}

/// Picks how an admitted call runs: an internal capability in-process when a
/// handler of its name is installed, else over the transport; `api` and
/// `webhook` as HTTP with the binding's `${env:VAR}` resolved now.
pub fn choose_executor(call: &DispatchCall, admitted: &Admitted, runners: &Runners<'_>) -> Executor {
    let record = &admitted.record;
    let timeout_ms = record.timeout_ms.unwrap_or(runners.default_timeout_ms);
    match record.execution_type {
        ExecutionType::Internal if (runners.has_handler)(&record.handler) => Executor::InProcess {
            handler: record.handler.clone(),
            request: exec_request(call, admitted.binding.as_ref()),
        },
        ExecutionType::Internal if runners.has_transport => {
            match serde_json::to_vec(&exec_request(call, admitted.binding.as_ref())) {
                Ok(payload) => Executor::Transport { slug: record.slug.clone(), payload, timeout_ms },
                Err(err) => Executor::Unavailable(CallResult::fail(ErrorCode::ExecutionError, err.to_string())),
            }
        }
        ExecutionType::Internal => Executor::Unavailable(CallResult::fail(
            ErrorCode::ExecutionError,
            format!("no transport to handler services; {} cannot run here", record.slug),
        )),
        ExecutionType::Api | ExecutionType::Webhook => {
            match pipeline::http_target(record, admitted.binding.as_ref(), runners.env_allow, runners.env) {
                Ok(target) => Executor::Http {
                    target,
                    body: call.arguments.clone(),
                    webhook: record.execution_type == ExecutionType::Webhook,
                    timeout_ms,
                },
                Err(result) => Executor::Unavailable(*result),
            }
        }
        ExecutionType::Source => source_executor(call, record, timeout_ms),
    }
}

/// A source record's call; a tool mapped for discovery and routing only answers `unavailable`.
fn source_executor(
    call: &DispatchCall,
    record: &crate::core::dispatch::registry::CapabilityRecord,
    timeout_ms: u64,
) -> Executor {
    let name = record.slug.split_once('#').map_or(record.slug.as_str(), |(_, name)| name);
    if record.invocation == Some(Invocation::NotCallable) {
        return Executor::Unavailable(CallResult::fail(
            ErrorCode::Unavailable,
            format!(
                "{} is mapped for discovery and routing only: source {} is not callable (capdex does not connect to databases)",
                record.slug, record.handler
            ),
        ));
    }
    Executor::Source(SourceCall {
        source_id: record.handler.clone(),
        name: name.to_string(),
        arguments: call.arguments.clone(),
        agent_id: call.agent_id.clone(),
        execution_id: call.execution_id.clone(),
        timeout_ms,
    })
}

/// What a handler receives for `call`.
pub fn exec_request(call: &DispatchCall, binding: Option<&Binding>) -> ExecRequest {
    ExecRequest {
        slug: call.slug.clone(),
        arguments: call.arguments.clone(),
        agent_id: call.agent_id.clone(),
        execution_id: call.execution_id.clone(),
        step_id: call.step_id.clone(),
        turn: call.turn,
        custom_config: binding.map_or(Value::Null, |b| b.custom_config.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dispatch::approval::ApprovalStatus;
    use crate::core::dispatch::pipeline::{BindingMode, Pipeline};
    use crate::core::dispatch::registry::tests::record;
    use serde_json::json;
    use std::sync::Arc;

    fn call(slug: &str, approval_id: Option<&str>) -> DispatchCall {
        DispatchCall {
            slug: slug.into(),
            arguments: json!({"q": "x"}),
            agent_id: "a".into(),
            execution_id: None,
            step_id: None,
            turn: None,
            approval_id: approval_id.map(str::to_string),
        }
    }

    fn admitted(record: crate::core::dispatch::registry::CapabilityRecord, config: Value) -> Admitted {
        let binding = Binding {
            agent_id: "a".into(),
            slug: record.slug.clone(),
            is_enabled: true,
            custom_rate_limit: None,
            custom_config: config,
        };
        Admitted { record: Arc::new(record), binding: Some(binding), approval_id: None }
    }

    /// The executor kind chosen with `handler` installed or not and a transport or not.
    fn check(execution_type: ExecutionType, handler: bool, transport: bool, expect: &str) {
        let mut rec = record("lookup");
        rec.execution_type = execution_type;
        rec.handler = match execution_type {
            ExecutionType::Internal => "svc".into(),
            ExecutionType::Api | ExecutionType::Webhook => "https://example.com/${env:CAPDEX_SECRET_PATH_PART}".into(),
            ExecutionType::Source => "pets".into(),
        };
        if execution_type == ExecutionType::Source {
            rec.slug = "pets#showPet".into();
            rec.invocation =
                Some(if handler { Invocation::NotCallable } else { Invocation::Mcp { tool: "showPet".into() } });
        }
        let has_handler = move |name: &str| handler && name == "svc";
        let env = |name: &str| (name == "CAPDEX_SECRET_PATH_PART").then(|| "x".to_string());
        let runners = Runners {
            has_handler: &has_handler,
            has_transport: transport,
            env: &env,
            env_allow: &EnvAllow::default(),
            default_timeout_ms: 50,
        };
        let chosen = match choose_executor(&call("lookup", None), &admitted(rec, json!({})), &runners) {
            Executor::InProcess { .. } => "in_process".to_string(),
            Executor::Transport { timeout_ms, .. } => format!("transport {timeout_ms}"),
            Executor::Http { webhook, target, .. } => format!("http {webhook} {}", target.url),
            Executor::Source(call) => format!("source {} {} {}", call.source_id, call.name, call.timeout_ms),
            Executor::Unavailable(result) => result.code().unwrap_or("").to_string(),
        };
        assert_eq!(chosen, expect);
    }

    #[test]
    fn executors() {
        check(ExecutionType::Internal, true, true, "in_process");
        check(ExecutionType::Internal, true, false, "in_process");
        check(ExecutionType::Internal, false, true, "transport 50");
        check(ExecutionType::Internal, false, false, "execution_error");
        check(ExecutionType::Api, false, false, "http false https://example.com/x");
        check(ExecutionType::Webhook, true, true, "http true https://example.com/x");
        check(ExecutionType::Source, false, false, "source pets showPet 50");
        check(ExecutionType::Source, true, true, "unavailable");
    }

    #[test]
    fn an_unset_env_var_is_an_invalid_binding_and_the_capability_timeout_wins() {
        let mut api = record("api");
        api.execution_type = ExecutionType::Api;
        api.handler = "https://example.com".into();
        let none = |_: &str| None;
        let no_handler = |_: &str| false;
        let runners = Runners {
            has_handler: &no_handler,
            has_transport: true,
            env: &none,
            env_allow: &EnvAllow::default(),
            default_timeout_ms: 50,
        };
        let unset = admitted(api.clone(), json!({"headers": {"X-Key": "${env:CAPDEX_SECRET_UNSET}"}}));
        match choose_executor(&call("api", None), &unset, &runners) {
            Executor::Unavailable(result) => assert_eq!(result.code(), Some("invalid_binding")),
            other => panic!("{other:?}"),
        }
        let outside = admitted(api.clone(), json!({"headers": {"X-Key": "${env:HOME}"}}));
        match choose_executor(&call("api", None), &outside, &runners) {
            Executor::Unavailable(result) => assert_eq!(result.code(), Some("env_not_allowed")),
            other => panic!("{other:?}"),
        }
        api.timeout_ms = Some(9);
        match choose_executor(&call("api", None), &admitted(api, json!({})), &runners) {
            Executor::Http { timeout_ms, .. } => assert_eq!(timeout_ms, 9),
            other => panic!("{other:?}"),
        }
    }

    fn only_svc(name: &str) -> bool {
        name == "svc"
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn default_allow() -> &'static EnvAllow {
        static ALLOW: std::sync::OnceLock<EnvAllow> = std::sync::OnceLock::new();
        ALLOW.get_or_init(EnvAllow::default)
    }

    fn facts<'a>(call: &'a DispatchCall, stored_approval: Option<&'a Approval>) -> PlanFacts<'a> {
        PlanFacts {
            call,
            stored_approval,
            now_ms: 1_000,
            default_approval_ttl_ms: 500,
            runners: Runners {
                has_handler: &only_svc,
                has_transport: false,
                env: &no_env,
                env_allow: default_allow(),
                default_timeout_ms: 50,
            },
        }
    }

    #[test]
    fn an_approval_is_requested_then_consumed_by_the_approved_call() {
        let mut pipeline = Pipeline::new(BindingMode::Open, 60_000);
        let mut gated = record("refund");
        gated.requires_approval = true;
        gated.handler = "svc".into();
        pipeline.load_registry([gated]);
        let first = call("refund", None);
        let asked = match plan(pipeline.admit(&first, None, 0, 1_000), &facts(&first, None), || "ap1".into()) {
            Plan::RequestApproval(approval) => approval,
            other => panic!("{other:?}"),
        };
        assert_eq!((asked.id.as_str(), asked.expires_at_ms, asked.status), ("ap1", 1_500, ApprovalStatus::Pending));
        let answer = approval_requested(&asked);
        assert_eq!(answer.code(), Some("requires_approval"));
        assert!(answer.error.unwrap().message.contains("approval.ap1.approve"));
        let mut approved = asked.clone();
        approval::decide(&mut approved, true, 1_100, "ops").unwrap();
        let retry = call("refund", Some("ap1"));
        let decision = pipeline.admit(&retry, Some(&approved), 0, 1_200);
        match plan(decision, &facts(&retry, Some(&approved)), || panic!("no new approval on the approved retry")) {
            Plan::Run { consume: Some(used), executor } => match *executor {
                Executor::InProcess { handler, .. } => {
                    assert_eq!((used.id.as_str(), used.status, handler.as_str()), ("ap1", ApprovalStatus::Used, "svc"))
                }
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
        let used = approval::consumed(&approved);
        match plan(pipeline.admit(&retry, Some(&used), 0, 1_200), &facts(&retry, Some(&used)), || "ap2".into()) {
            Plan::Answer(result) => assert_eq!(result.code(), Some("approval_invalid")),
            other => panic!("{other:?}"),
        }
    }
}
