//! The pipeline's decision steps, in the design's order: registry lookup
//! (`unknown_capability`), active (`capability_inactive`), agent binding
//! (`capability_disabled_for_agent`), rate limit (`rate_limited`), approval
//! gate (`requires_approval`), argument validation (`invalid_args`). What is
//! admitted is then run by the shell (`execution_error`, `invalid_binding`),
//! which records provenance and an event with [`finish`].

use crate::core::dispatch::approval::{self, Approval};
use crate::core::dispatch::env_template::{self, EnvAllow, EnvRefusal};
use crate::core::dispatch::rate_limit::{RateLimiter, RateRefusal};
use crate::core::dispatch::redact;
use crate::core::dispatch::registry::{valid_id, Binding, CapabilityRecord, HttpConfig};
use crate::core::dispatch::{CallResult, DispatchEvent, ErrorCode, ProvenanceRecord};
use crate::core::subject_token;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// A call as capdex receives it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DispatchCall {
    #[serde(alias = "capabilityId")]
    pub slug: String,
    #[serde(default)]
    pub arguments: Value,
    pub agent_id: String,
    /// With `stepId` (and optionally `turn`): the re-drive key; a repeat returns the stored result.
    #[serde(default)]
    pub execution_id: Option<String>,
    #[serde(default)]
    pub step_id: Option<String>,
    #[serde(default)]
    pub turn: Option<u32>,
    /// The approval that permits this call (for capabilities that require one).
    #[serde(default)]
    pub approval_id: Option<String>,
}

/// `(executionId, stepId[, turn])`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExecutionKey {
    pub execution_id: String,
    pub step_id: String,
    pub turn: Option<u32>,
}

impl ExecutionKey {
    /// The key as stored: the parts joined by NUL (ids never hold control characters).
    pub fn storage_key(&self) -> Vec<u8> {
        let mut key = format!("{}\0{}", self.execution_id, self.step_id);
        if let Some(turn) = self.turn {
            key.push_str(&format!("\0turn={turn}"));
        }
        key.into_bytes()
    }
}

impl std::fmt::Display for ExecutionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.execution_id, self.step_id)?;
        if let Some(turn) = self.turn {
            write!(f, ":turn={turn}")?;
        }
        Ok(())
    }
}

impl DispatchCall {
    /// Checks the request's own fields, each id within `max_id_bytes`
    /// (`[limits]`); `Err` is the `invalid_request` answer.
    pub fn check(&mut self, max_id_bytes: usize) -> Result<Option<ExecutionKey>, Box<CallResult>> {
        let bad = |message: String| Err(Box::new(CallResult::fail(ErrorCode::InvalidRequest, message)));
        // The longest slug: a source capability id (a source id, `#`, a tool name).
        if let Some(problem) = crate::core::limits::capability_id_too_long(&self.slug, max_id_bytes) {
            return bad(format!("slug {problem}"));
        }
        // The slug may name a source capability (`<source_id>#<Name>`): its source id is the token.
        let slug_token = self.slug.split_once('#').map_or(self.slug.as_str(), |(source, _)| source);
        if let Err(err) = subject_token::check("slug", slug_token, max_id_bytes) {
            return bad(err.to_string());
        }
        if let Err(err) = subject_token::check("agentId", &self.agent_id, max_id_bytes) {
            return bad(err.to_string());
        }
        if let Some(Err(err)) =
            self.approval_id.as_deref().map(|id| subject_token::check("approvalId", id, max_id_bytes))
        {
            return bad(err.to_string());
        }
        if self.arguments.is_null() {
            self.arguments = json!({});
        }
        for (field, id) in [("executionId", &self.execution_id), ("stepId", &self.step_id)] {
            let Some(id) = id else { continue };
            if let Err(exceeded) = subject_token::check_len(id, max_id_bytes) {
                return bad(format!("{field} {}", subject_token::too_long_text(&exceeded)));
            }
            if !valid_id(id) {
                return bad(format!("{field} must not be empty nor hold control characters"));
            }
        }
        match (&self.execution_id, &self.step_id) {
            (Some(execution_id), Some(step_id)) => {
                Ok(Some(ExecutionKey { execution_id: execution_id.clone(), step_id: step_id.clone(), turn: self.turn }))
            }
            (None, None) if self.turn.is_none() => Ok(None),
            _ => bad("executionId and stepId go together (and turn needs both)".into()),
        }
    }
}

/// Whether an agent without a binding may call a capability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingMode {
    /// No binding: allowed with the capability's own limits (the design's default).
    Open,
    /// No binding: `capability_disabled_for_agent`.
    Strict,
}

/// How the rate step of an admission is decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateGate {
    /// By this node's own sliding windows, at `mono_ms` (a monotonic clock).
    Local { mono_ms: u64 },
    /// Already, by the cluster's shared window (see `shared::admit_shared`).
    Decided(Result<(), RateRefusal>),
}

/// What the pipeline decided.
#[derive(Debug)]
pub enum AdmissionDecision {
    Refused(CallResult),
    /// The capability needs an approval and the call carries none: the shell
    /// creates one ([`approval::pending`]) and answers [`requires_approval`].
    NeedsApproval(Arc<CapabilityRecord>),
    Run(Admitted),
}

/// A call that may run.
#[derive(Clone, Debug)]
pub struct Admitted {
    pub record: Arc<CapabilityRecord>,
    pub binding: Option<Binding>,
    /// The approval this run uses up.
    pub approval_id: Option<String>,
}

/// The registry, bindings, rate windows and compiled argument schemas.
pub struct Pipeline {
    /// Every record by slug: the loaded registry and every source's records.
    registry: HashMap<String, Arc<CapabilityRecord>>,
    /// The records `load_registry` gave (built-ins and the stored registry).
    loaded: Vec<Arc<CapabilityRecord>>,
    /// Each source's records, by source id (in memory only).
    sources: std::collections::BTreeMap<String, Vec<Arc<CapabilityRecord>>>,
    /// The function names of source records (what `search` offers a model), to their slugs;
    /// a name two records share, or a slug holds, is left out.
    function_names: HashMap<String, String>,
    bindings: HashMap<(String, String), Binding>,
    limiter: RateLimiter,
    validators: HashMap<String, (u64, Arc<jsonschema::Validator>)>,
    mode: BindingMode,
}

impl Pipeline {
    pub fn new(mode: BindingMode, rate_window_ms: u64) -> Pipeline {
        Pipeline {
            registry: HashMap::new(),
            loaded: Vec::new(),
            sources: std::collections::BTreeMap::new(),
            function_names: HashMap::new(),
            bindings: HashMap::new(),
            limiter: RateLimiter::new(rate_window_ms),
            validators: HashMap::new(),
            mode,
        }
    }

    /// Replaces the registry. Rate windows are kept: they belong to (slug, agent), not to a load.
    /// Source records stay.
    pub fn load_registry(&mut self, records: impl IntoIterator<Item = CapabilityRecord>) {
        self.loaded = records.into_iter().map(Arc::new).collect();
        self.rebuild();
    }

    /// Replaces the records of source `source_id` (none withdraws them). Their
    /// compiled schemas are dropped, so a re-published schema is the one checked.
    pub fn set_source_records(&mut self, source_id: &str, records: Vec<CapabilityRecord>) {
        let old = self.sources.remove(source_id).unwrap_or_default();
        for record in old.iter().map(|r| r.slug.as_str()).chain(records.iter().map(|r| r.slug.as_str())) {
            self.validators.remove(record);
        }
        if !records.is_empty() {
            self.sources.insert(source_id.to_string(), records.into_iter().map(Arc::new).collect());
        }
        self.rebuild();
    }

    /// Returns the ids of the sources that have records.
    pub fn source_ids(&self) -> Vec<String> {
        self.sources.keys().cloned().collect()
    }

    fn rebuild(&mut self) {
        // Source records come first, so a loaded record of the same slug (never valid
        // as a slug, but stored data is not trusted) holds it.
        let sources = self.sources.values().flatten();
        self.registry = sources.chain(&self.loaded).map(|r| (r.slug.clone(), r.clone())).collect();
        let mut function_names: HashMap<String, Option<String>> = HashMap::new();
        for record in self.sources.values().flatten() {
            let name = record.function_definition.name.clone();
            let slot = function_names.entry(name).or_insert_with(|| Some(record.slug.clone()));
            if slot.as_deref() != Some(record.slug.as_str()) {
                *slot = None;
            }
        }
        let registry = &self.registry;
        self.function_names = function_names
            .into_iter()
            .filter_map(|(name, slug)| Some((name, slug?)))
            .filter(|(name, _)| !registry.contains_key(name))
            .collect();
        self.validators.retain(|slug, (version, _)| registry.get(slug).is_some_and(|r| r.policy_version == *version));
    }

    /// Returns the slug of the record a call's `slug` field names: a slug, a
    /// discovery id `tool:<slug>`, a source capability id, or the function name
    /// of a source capability; `None` for no record.
    pub fn resolve(&self, id: &str) -> Option<&str> {
        if let Some(record) = self.registry.get(id) {
            return Some(&record.slug);
        }
        if let Some(slug) = self.function_names.get(id) {
            return Some(slug);
        }
        let record = self.registry.get(id.strip_prefix("tool:")?)?;
        (record.discovery_id() == id).then_some(record.slug.as_str())
    }

    /// Replaces every binding.
    pub fn load_bindings(&mut self, bindings: impl IntoIterator<Item = Binding>) {
        self.bindings = bindings.into_iter().map(|b| ((b.agent_id.clone(), b.slug.clone()), b)).collect();
    }

    pub fn set_binding(&mut self, binding: Binding) {
        self.bindings.insert((binding.agent_id.clone(), binding.slug.clone()), binding);
    }

    pub fn record(&self, slug: &str) -> Option<&Arc<CapabilityRecord>> {
        self.registry.get(slug)
    }

    pub fn binding(&self, agent_id: &str, slug: &str) -> Option<&Binding> {
        self.bindings.get(&(agent_id.to_string(), slug.to_string()))
    }

    /// Runs the decision steps for a checked call. `approval` is the stored
    /// approval named by `call.approval_id`, if any; `mono_ms` is a monotonic
    /// clock (rate windows), `wall_ms` the wall clock (approval expiry).
    pub fn admit(
        &mut self,
        call: &DispatchCall,
        approval: Option<&Approval>,
        mono_ms: u64,
        wall_ms: u64,
    ) -> AdmissionDecision {
        self.admit_with(call, approval, RateGate::Local { mono_ms }, wall_ms)
    }

    /// The rate limit a call is held to at the rate step (`customRateLimit ??
    /// rateLimit` of its agent), or `None` when it has none or is refused
    /// before that step (unknown, inactive, disabled for its agent): a shared
    /// window is asked only for the calls that reach it.
    pub fn rate_limit_of(&self, call: &DispatchCall) -> Option<u32> {
        let record = self.registry.get(&call.slug)?;
        if !record.is_active {
            return None;
        }
        let binding = self.binding(&call.agent_id, &call.slug);
        match binding {
            Some(b) if !b.is_enabled => return None,
            None if self.mode == BindingMode::Strict => return None,
            _ => {}
        }
        binding.and_then(|b| b.custom_rate_limit).or(record.rate_limit).filter(|&n| n > 0)
    }

    /// [`Pipeline::admit`], with the rate step decided by `rate`: this node's
    /// limiter, or a shared window already asked ([`Pipeline::rate_limit_of`]).
    pub fn admit_with(
        &mut self,
        call: &DispatchCall,
        approval: Option<&Approval>,
        rate: RateGate,
        wall_ms: u64,
    ) -> AdmissionDecision {
        let refuse = |code: ErrorCode, message: String| AdmissionDecision::Refused(CallResult::fail(code, message));
        let slug = &call.slug;
        let Some(record) = self.registry.get(slug).cloned() else {
            return refuse(ErrorCode::UnknownCapability, format!("no capability {slug} is registered"));
        };
        if !record.is_active {
            return refuse(ErrorCode::CapabilityInactive, format!("capability {slug} is not active"));
        }
        let binding = self.binding(&call.agent_id, slug).cloned();
        match &binding {
            Some(b) if !b.is_enabled => {
                return refuse(
                    ErrorCode::CapabilityDisabledForAgent,
                    format!("capability {slug} is disabled for agent {}", call.agent_id),
                )
            }
            None if self.mode == BindingMode::Strict => {
                return refuse(
                    ErrorCode::CapabilityDisabledForAgent,
                    format!("agent {} has no binding to capability {slug}", call.agent_id),
                )
            }
            _ => {}
        }
        let limit = binding.as_ref().and_then(|b| b.custom_rate_limit).or(record.rate_limit);
        let rate = match rate {
            RateGate::Local { mono_ms } => self.limiter.admit(slug, &call.agent_id, limit, mono_ms),
            RateGate::Decided(decided) => decided,
        };
        if let Err(refusal) = rate {
            let mut result = CallResult::fail(
                ErrorCode::RateLimited,
                format!("Rate limit exceeded for capability {slug} ({}/min)", refusal.limit),
            );
            result.metadata = Some(json!({"retryAfterMs": refusal.retry_after_ms, "limit": refusal.limit}));
            return AdmissionDecision::Refused(result);
        }
        let mut approval_id = None;
        if record.requires_approval {
            match (&call.approval_id, approval) {
                (None, _) => return AdmissionDecision::NeedsApproval(record),
                (Some(id), None) => {
                    return refuse(
                        ErrorCode::ApprovalInvalid,
                        approval::ApprovalProblem::Unknown(id.clone()).to_string(),
                    )
                }
                (Some(id), Some(approval)) => {
                    if let Err(problem) = approval::permits(
                        approval,
                        slug,
                        &call.agent_id,
                        &call.arguments,
                        record.policy_version,
                        wall_ms,
                    ) {
                        return refuse(ErrorCode::ApprovalInvalid, problem.to_string());
                    }
                    approval_id = Some(id.clone());
                }
            }
        }
        let validator = match self.validator(&record) {
            Ok(validator) => validator,
            Err(problem) => return refuse(ErrorCode::InvalidArgs, problem),
        };
        let problems: Vec<String> = validator
            .iter_errors(&call.arguments)
            .take(20)
            .map(|err| {
                let path = err.instance_path().to_string();
                format!("{}: {err}", if path.is_empty() { "/" } else { &path })
            })
            .collect();
        if !problems.is_empty() {
            let mut result = CallResult::fail(ErrorCode::InvalidArgs, problems.join("; "));
            result.metadata = Some(json!({"problems": problems}));
            return AdmissionDecision::Refused(result);
        }
        AdmissionDecision::Run(Admitted { record, binding, approval_id })
    }

    fn validator(&mut self, record: &CapabilityRecord) -> Result<Arc<jsonschema::Validator>, String> {
        if let Some((version, validator)) = self.validators.get(&record.slug) {
            if *version == record.policy_version {
                return Ok(validator.clone());
            }
        }
        let validator = jsonschema::validator_for(&record.function_definition.parameters)
            .map_err(|err| format!("the parameters of {} are not a valid JSON Schema: {err}", record.slug))?;
        let validator = Arc::new(validator);
        self.validators.insert(record.slug.clone(), (record.policy_version, validator.clone()));
        Ok(validator)
    }

    /// How many (slug, agent) rate windows are held.
    pub fn rate_windows(&self) -> usize {
        self.limiter.len()
    }
}

/// The `requires_approval` answer for a new pending approval.
pub fn requires_approval(approval: &Approval, approve_subject: &str) -> CallResult {
    let mut result = CallResult::fail(
        ErrorCode::RequiresApproval,
        format!("capability {} needs an approval; decide it on {approve_subject}", approval.slug),
    );
    result.skip_followup = true;
    result.metadata = Some(json!({"approvalId": approval.id, "expiresAtMs": approval.expires_at_ms}));
    result
}

/// Where and how an `api` or `webhook` call goes, with `${env:VAR}` resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpTarget {
    pub url: String,
    pub headers: Vec<(String, String)>,
    /// The values the templates resolved to: never recorded anywhere.
    pub secrets: Vec<String>,
}

/// Resolves the target of an `api`/`webhook` call at call time: the binding's
/// `url` (else the capability's handler) and `headers`; a missing variable or a
/// malformed config is `invalid_binding`, a variable outside `allow`
/// `env_not_allowed` (fail closed, and the refused variable is never read).
pub fn http_target(
    record: &CapabilityRecord,
    binding: Option<&Binding>,
    allow: &EnvAllow,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<HttpTarget, Box<CallResult>> {
    let invalid = |message: String| Box::new(CallResult::fail(ErrorCode::InvalidBinding, message));
    let refused = |refusal: EnvRefusal, place: String| {
        let code = match refusal {
            EnvRefusal::NotAllowed(_) => ErrorCode::EnvNotAllowed,
            EnvRefusal::Missing(_) => ErrorCode::InvalidBinding,
        };
        Box::new(CallResult::fail(code, format!("{refusal} ({place})")))
    };
    let config = HttpConfig::parse(binding.map_or(&Value::Null, |b| &b.custom_config))
        .map_err(|problem| invalid(format!("customConfig of {}: {problem}", record.slug)))?;
    let mut secrets = Vec::new();
    let url_template = config.url.as_deref().unwrap_or(&record.handler);
    let url = env_template::resolve(url_template, allow, lookup, &mut secrets)
        .map_err(|refusal| refused(refusal, format!("url of {}", record.slug)))?;
    let mut headers = Vec::with_capacity(config.headers.len());
    for (name, value) in &config.headers {
        let value = env_template::resolve(value, allow, lookup, &mut secrets)
            .map_err(|refusal| refused(refusal, format!("header {name} of {}", record.slug)))?;
        headers.push((name.clone(), value));
    }
    Ok(HttpTarget { url, headers, secrets })
}

/// What a finished call leaves behind.
pub struct Finished {
    /// The answer, with secrets scrubbed from its error message.
    pub result: CallResult,
    pub provenance: ProvenanceRecord,
    pub event: DispatchEvent,
}

/// Everything [`finish`] needs to know about a call.
pub struct CallFacts<'a> {
    pub call: &'a DispatchCall,
    pub record: Option<&'a CapabilityRecord>,
    pub execution_key: Option<&'a ExecutionKey>,
    pub approval_id: Option<&'a str>,
    pub secrets: &'a [String],
    pub replayed: bool,
    pub latency_us: u64,
    pub at_ms: u64,
}

/// Builds the redacted provenance record and the event of a call, and scrubs
/// secret values from the answer's error message.
pub fn finish(facts: CallFacts<'_>, mut result: CallResult) -> Finished {
    if let Some(error) = &mut result.error {
        error.message = redact::scrub_text(&error.message, facts.secrets);
    }
    let shown = serde_json::to_value(&result).unwrap_or(Value::Null);
    let (args, result_preview) = redact::redact_for_provenance(
        facts.record.and_then(|r| r.redaction.as_ref()),
        &facts.call.arguments,
        &shown,
        facts.secrets,
    );
    let error_code = result.code().map(str::to_string);
    let provenance = ProvenanceRecord {
        at_ms: facts.at_ms,
        slug: facts.call.slug.clone(),
        agent_id: facts.call.agent_id.clone(),
        execution_key: facts.execution_key.map(ToString::to_string),
        approval_id: facts.approval_id.map(str::to_string),
        args,
        result_preview,
        success: result.success,
        error_code: error_code.clone(),
        replayed: facts.replayed,
        latency_us: facts.latency_us,
    };
    let event = DispatchEvent {
        slug: facts.call.slug.clone(),
        capability_id: facts.record.map_or_else(|| facts.call.slug.clone(), CapabilityRecord::discovery_id),
        agent_id: facts.call.agent_id.clone(),
        success: result.success,
        error_code,
        execution_type: facts.record.map_or("", |r| r.execution_type.as_str()).to_string(),
        replayed: facts.replayed,
        handler_ran: !facts.replayed
            && facts.record.is_some()
            && result.code().is_none_or(|code| !ErrorCode::is_refusal(code)),
        latency_us: facts.latency_us,
        cost_usd: 0.0,
        at_ms: facts.at_ms,
    };
    Finished { result, provenance, event }
}

/// Which dispatcher counter a finished call adds to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tally {
    /// A handler ran and succeeded.
    Executed,
    /// A stored result was given again (or the key decided the call).
    Replayed,
    /// Refused before anything ran.
    Refused,
    /// A handler or endpoint was tried and failed.
    Failed,
}

impl Tally {
    /// Counts a call's `event`; `ran` is true when its capability is known and it was not a replay.
    pub fn of(event: &DispatchEvent, ran: bool) -> Tally {
        match (event.error_code.as_deref(), event.replayed) {
            (_, true) => Tally::Replayed,
            (None, false) => Tally::Executed,
            (Some(code), false) if ran && ErrorCode::is_from_execution(code) => Tally::Failed,
            (Some(_), false) => Tally::Refused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dispatch::registry::tests::record;

    fn call(slug: &str, agent: &str, args: Value) -> DispatchCall {
        DispatchCall {
            slug: slug.into(),
            arguments: args,
            agent_id: agent.into(),
            execution_id: None,
            step_id: None,
            turn: None,
            approval_id: None,
        }
    }

    fn code(decision: AdmissionDecision) -> String {
        match decision {
            AdmissionDecision::Refused(result) => result.code().unwrap().to_string(),
            AdmissionDecision::NeedsApproval(_) => "needs_approval".into(),
            AdmissionDecision::Run(_) => "run".into(),
        }
    }

    #[test]
    fn steps_run_in_the_design_order() {
        let mut pipeline = Pipeline::new(BindingMode::Open, 60_000);
        let mut inactive = record("off");
        inactive.is_active = false;
        let mut limited = record("limited");
        limited.rate_limit = Some(1);
        let mut gated = record("gated");
        gated.requires_approval = true;
        pipeline.load_registry([record("lookup"), inactive, limited, gated]);
        pipeline.set_binding(Binding {
            agent_id: "b".into(),
            slug: "lookup".into(),
            is_enabled: false,
            custom_rate_limit: None,
            custom_config: Value::Null,
        });
        let ok = json!({"q": "x"});
        let mut admit = |c: DispatchCall| code(pipeline.admit(&c, None, 0, 0));
        assert_eq!(admit(call("nope", "a", ok.clone())), "unknown_capability");
        assert_eq!(admit(call("off", "a", ok.clone())), "capability_inactive");
        assert_eq!(admit(call("lookup", "b", ok.clone())), "capability_disabled_for_agent");
        assert_eq!(admit(call("limited", "a", json!({}))), "invalid_args", "the limit counts before validation");
        assert_eq!(admit(call("limited", "a", ok.clone())), "rate_limited");
        assert_eq!(admit(call("gated", "a", json!({"q": 1}))), "needs_approval", "approval comes before validation");
        let mut with_id = call("gated", "a", ok.clone());
        with_id.approval_id = Some("x".into());
        assert_eq!(admit(with_id), "approval_invalid");
        assert_eq!(admit(call("lookup", "a", ok.clone())), "run");
        let mut strict = Pipeline::new(BindingMode::Strict, 60_000);
        strict.load_registry([record("lookup")]);
        assert_eq!(code(strict.admit(&call("lookup", "a", ok), None, 0, 0)), "capability_disabled_for_agent");
    }

    #[test]
    fn calls_resolve_slugs_discovery_ids_and_source_ids_to_one_record() {
        let mut pipeline = Pipeline::new(BindingMode::Open, 60_000);
        pipeline.load_registry([record("lookup")]);
        let mut source = record("pets#showPet");
        source.execution_type = crate::core::dispatch::registry::ExecutionType::Source;
        pipeline.set_source_records("pets", vec![source.clone()]);
        assert_eq!(pipeline.resolve("lookup"), Some("lookup"));
        assert_eq!(pipeline.resolve("tool:lookup"), Some("lookup"));
        assert_eq!(pipeline.resolve("pets#showPet"), Some("pets#showPet"));
        assert_eq!(pipeline.resolve("tool:pets#showPet"), None, "a source capability has no tool: id");
        assert_eq!(pipeline.resolve("tool:nope"), None);
        let mut named = record("pets#GET /pets");
        named.function_definition.name = "pets_GET__pets".into();
        let mut twin = record("pets#GET_/pets");
        twin.function_definition.name = "pets_GET__pets".into();
        let mut clash = record("pets#lookup");
        clash.function_definition.name = "lookup".into();
        pipeline.set_source_records("pets", vec![source.clone(), named.clone(), clash]);
        assert_eq!(pipeline.resolve("pets_GET__pets"), Some("pets#GET /pets"), "its function name");
        assert_eq!(pipeline.resolve("lookup"), Some("lookup"), "a registered slug wins over a function name");
        pipeline.set_source_records("pets", vec![source.clone(), named, twin]);
        assert_eq!(pipeline.resolve("pets_GET__pets"), None, "a name two records share names neither");
        pipeline.load_registry([record("other")]);
        assert_eq!(pipeline.resolve("pets#showPet"), Some("pets#showPet"), "a registry reload keeps sources");
        assert_eq!(pipeline.resolve("lookup"), None);
        assert_eq!(pipeline.source_ids(), ["pets"]);
        pipeline.set_source_records("pets", Vec::new());
        assert_eq!(pipeline.resolve("pets#showPet"), None);
        let long_id = format!("{}#{}", "s".repeat(128), "n".repeat(crate::core::limits::MAX_TOOL_NAME_BYTES));
        assert!(call(&long_id, "a", json!({})).check(128).is_ok(), "a source capability id of the longest names");
        let over = call(&format!("{long_id}n"), "a", json!({})).check(128).unwrap_err();
        assert_eq!(over.code(), Some("invalid_request"));
        assert!(over.error.unwrap().message.starts_with("slug is 386 bytes, over limits.max_id_bytes"));
        assert!(pipeline.source_ids().is_empty());
    }

    #[test]
    fn every_id_of_a_call_is_refused_one_byte_over_max_id_bytes_naming_the_setting() {
        let max = 12;
        let at = "a".repeat(max);
        let over = "a".repeat(max + 1);
        let with = |field: &str, id: &str| {
            let mut call = call("lookup", "agent", json!({}));
            match field {
                "slug" => call.slug = id.to_string(),
                "sourceId" => call.slug = format!("{id}#{}", "n".repeat(100)),
                "agentId" => call.agent_id = id.to_string(),
                "approvalId" => call.approval_id = Some(id.to_string()),
                "executionId" => (call.execution_id, call.step_id) = (Some(id.to_string()), Some("s".into())),
                _ => (call.execution_id, call.step_id) = (Some("e".into()), Some(id.to_string())),
            }
            call
        };
        for field in ["slug", "sourceId", "agentId", "approvalId", "executionId", "stepId"] {
            assert!(with(field, &at).check(max).is_ok(), "{field} at the limit");
            let refused = with(field, &over).check(max).unwrap_err();
            assert_eq!(refused.code(), Some("invalid_request"), "{field}");
            let message = refused.error.unwrap().message;
            assert!(message.contains("limits.max_id_bytes: at most 12"), "{field}: {message}");
            assert!(message.contains(&format!("is {} bytes", max + 1)), "{field}: {message}");
            assert!(with(field, &over).check(max + 1).is_ok(), "{field}: the setting is what is read");
        }
    }

    #[test]
    fn invalid_args_list_the_failing_paths() {
        let mut pipeline = Pipeline::new(BindingMode::Open, 60_000);
        pipeline.load_registry([record("lookup")]);
        match pipeline.admit(&call("lookup", "a", json!({"q": 3})), None, 0, 0) {
            AdmissionDecision::Refused(result) => {
                assert!(result.error.unwrap().message.starts_with("/q: "), "path first")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rate_windows_survive_a_registry_reload_and_limits_are_per_agent() {
        let mut pipeline = Pipeline::new(BindingMode::Open, 60_000);
        let mut limited = record("limited");
        limited.rate_limit = Some(2);
        pipeline.load_registry([limited.clone()]);
        pipeline.set_binding(Binding {
            agent_id: "vip".into(),
            slug: "limited".into(),
            is_enabled: true,
            custom_rate_limit: Some(4),
            custom_config: Value::Null,
        });
        let ok = json!({"q": "x"});
        let runs = |pipeline: &mut Pipeline, agent: &str, n: usize| {
            (0..n)
                .filter(|_| {
                    matches!(pipeline.admit(&call("limited", agent, ok.clone()), None, 5, 0), AdmissionDecision::Run(_))
                })
                .count()
        };
        assert_eq!(runs(&mut pipeline, "a", 1), 1);
        limited.policy_version += 1;
        pipeline.load_registry([limited]);
        assert_eq!(runs(&mut pipeline, "a", 3), 1, "one call left after the reload");
        assert_eq!(runs(&mut pipeline, "vip", 6), 4, "the vip's own limit");
    }

    #[test]
    fn http_targets_resolve_env_at_call_time() {
        let mut api = record("api");
        api.execution_type = crate::core::dispatch::registry::ExecutionType::Api;
        api.handler = "https://example.com/x".into();
        let binding = Binding {
            agent_id: "a".into(),
            slug: "api".into(),
            is_enabled: true,
            custom_rate_limit: None,
            custom_config: json!({"headers": {"Authorization": "Bearer ${env:API_TOKEN}"}}),
        };
        let set = |name: &str| (name == "API_TOKEN").then(|| "tok-123".to_string());
        let allow = EnvAllow::parse(&["API_*"]).unwrap();
        let target = http_target(&api, Some(&binding), &allow, &set).unwrap();
        assert_eq!(target.headers, vec![("Authorization".to_string(), "Bearer tok-123".to_string())]);
        assert_eq!(target.secrets, vec!["tok-123"]);
        let unset = |_: &str| None;
        assert_eq!(http_target(&api, Some(&binding), &allow, &unset).unwrap_err().code(), Some("invalid_binding"));
        let refused = http_target(&api, Some(&binding), &EnvAllow::default(), &set).unwrap_err();
        assert_eq!(refused.code(), Some("env_not_allowed"));
        let message = &refused.error.as_ref().unwrap().message;
        assert!(
            message.contains("API_TOKEN") && message.contains("env_allow") && !message.contains("tok-123"),
            "{message}"
        );
        let mut templated = api.clone();
        templated.handler = "https://${env:HOME}/x".into();
        let refused = http_target(&templated, None, &allow, &set).unwrap_err();
        assert_eq!(refused.code(), Some("env_not_allowed"), "the capability's own URL is checked too");
    }

    #[test]
    fn finish_keeps_secrets_out() {
        let c = call("lookup", "a", json!({"q": "mail me at dan@example.org"}));
        let rec = record("lookup");
        let secrets = vec!["tok-123".to_string()];
        let finished = finish(
            CallFacts {
                call: &c,
                record: Some(&rec),
                execution_key: None,
                approval_id: None,
                secrets: &secrets,
                replayed: false,
                latency_us: 7,
                at_ms: 1,
            },
            CallResult::fail(ErrorCode::ExecutionError, "GET https://x/?key=tok-123 failed"),
        );
        let all = format!(
            "{} {} {}",
            serde_json::to_string(&finished.provenance).unwrap(),
            serde_json::to_string(&finished.event).unwrap(),
            serde_json::to_string(&finished.result).unwrap()
        );
        assert!(!all.contains("tok-123") && !all.contains("dan@example.org"), "{all}");
        assert_eq!(finished.event.error_code.as_deref(), Some("execution_error"));
        assert!(finished.event.handler_ran, "an execution error is the handler's failure");
        assert_eq!(Tally::of(&finished.event, true), Tally::Failed);
        assert_eq!(Tally::of(&finished.event, false), Tally::Refused, "an unknown capability ran nothing");
        let mut event = finished.event;
        event.error_code = Some("rate_limited".into());
        assert_eq!(Tally::of(&event, true), Tally::Refused);
        event.replayed = true;
        assert_eq!(Tally::of(&event, true), Tally::Replayed);
        event.error_code = None;
        event.replayed = false;
        assert_eq!(Tally::of(&event, true), Tally::Executed);
    }
}
