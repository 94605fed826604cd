//! Every NATS subject capdex uses, built from one validated prefix.

/// The default prefix, `capdex.v1`.
pub const DEFAULT_PREFIX: &str = "capdex.v1";

/// Subjects under a prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    /// Returns the subjects under `prefix` (validated by the config).
    pub fn new(prefix: &str) -> Subjects {
        Subjects { prefix: prefix.to_string() }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Requests for per-turn discovery context.
    pub fn discover(&self) -> String {
        format!("{}.discover", self.prefix)
    }

    /// The `discover_capabilities` meta-tool.
    pub fn search(&self) -> String {
        format!("{}.search", self.prefix)
    }

    /// Task outcome reports.
    pub fn outcome(&self) -> String {
        format!("{}.outcome", self.prefix)
    }

    /// Capability calls.
    pub fn dispatch(&self) -> String {
        format!("{}.dispatch", self.prefix)
    }

    /// Capability registration: upsert a batch.
    pub fn capabilities_upsert(&self) -> String {
        format!("{}.capabilities.upsert", self.prefix)
    }

    /// Capability registration: remove ids.
    pub fn capabilities_remove(&self) -> String {
        format!("{}.capabilities.remove", self.prefix)
    }

    /// Capability registration: list what is indexed.
    pub fn capabilities_list(&self) -> String {
        format!("{}.capabilities.list", self.prefix)
    }

    /// Index change events.
    pub fn events_index(&self) -> String {
        format!("{}.events.index", self.prefix)
    }

    /// Turn plans.
    pub fn plan(&self) -> String {
        format!("{}.plan", self.prefix)
    }

    /// Dispatch registry: register a capability.
    pub fn capability_register(&self) -> String {
        format!("{}.capability.register", self.prefix)
    }

    /// Dispatch registry: replace a capability (its policy version goes up).
    pub fn capability_update(&self) -> String {
        format!("{}.capability.update", self.prefix)
    }

    /// Dispatch registry: list every capability record.
    pub fn capability_list(&self) -> String {
        format!("{}.capability.list", self.prefix)
    }

    /// Dispatch registry: reload registry and bindings from the store.
    pub fn capability_reload(&self) -> String {
        format!("{}.capability.reload", self.prefix)
    }

    /// Set an agent's binding to a capability.
    pub fn binding_set(&self) -> String {
        format!("{}.binding.set", self.prefix)
    }

    /// List bindings.
    pub fn binding_list(&self) -> String {
        format!("{}.binding.list", self.prefix)
    }

    /// List approvals (pending ones by default).
    pub fn approval_list(&self) -> String {
        format!("{}.approval.list", self.prefix)
    }

    /// Approve (`approve`) or reject (`reject`) approval `id`.
    pub fn approval(&self, id: &str, action: &str) -> String {
        format!("{}.approval.{}.{}", self.prefix, token(id), token(action))
    }

    /// Every approval's `action` subject (a subscription wildcard).
    pub fn approval_wildcard(&self, action: &str) -> String {
        format!("{}.approval.*.{}", self.prefix, token(action))
    }

    /// Agent `agent_id`'s own `operation` (`dispatch`, `binding.list`, `approval.list`):
    /// `<prefix>.agent.<agentId>.<operation>`. nats-server permissions give each
    /// agent's user only its own `<prefix>.agent.<agentId>.>`, so the subject
    /// proves who asks (`docs/security.md`). `agent_id` is written as is: it
    /// must pass `core::subject_token::check`, as every agent id does.
    pub fn agent(&self, agent_id: &str, operation: &str) -> String {
        format!("{}.agent.{}.{}", self.prefix, agent_id, operation)
    }

    /// Every agent's `operation` subject (a subscription wildcard).
    pub fn agent_wildcard(&self, operation: &str) -> String {
        format!("{}.agent.*.{}", self.prefix, operation)
    }

    /// Approver `approver` approves (`approve`) or rejects (`reject`) approval `id`:
    /// `<prefix>.approver.<approver>.approval.<id>.<action>`; the decision's `by` is `approver`.
    pub fn approver_decision(&self, approver: &str, id: &str, action: &str) -> String {
        format!("{}.approver.{}.approval.{}.{}", self.prefix, approver, token(id), token(action))
    }

    /// Every approver's `action` subject (a subscription wildcard).
    pub fn approver_wildcard(&self, action: &str) -> String {
        format!("{}.approver.*.approval.*.{}", self.prefix, token(action))
    }

    /// The identity a per-agent or per-approver subject names: the token after
    /// `<prefix>.agent.` or `<prefix>.approver.`; `None` for any other subject.
    pub fn identity_of<'a>(&self, subject: &'a str) -> Option<&'a str> {
        let rest = subject.strip_prefix(self.prefix.as_str())?.strip_prefix('.')?;
        let mut tokens = rest.split('.');
        match tokens.next()? {
            "agent" | "approver" => tokens.next().filter(|id| !id.is_empty()),
            _ => None,
        }
    }

    /// The newest provenance records.
    pub fn provenance_list(&self) -> String {
        format!("{}.provenance.list", self.prefix)
    }

    /// Where the handler service of an internal capability answers.
    pub fn exec(&self, slug: &str) -> String {
        format!("{}.exec.{}", self.prefix, token(slug))
    }

    /// Every dispatch's result and cost.
    pub fn events_dispatch(&self) -> String {
        format!("{}.events.dispatch", self.prefix)
    }

    /// Every scope's KPI events (a subscription wildcard).
    pub fn kpi_all(&self) -> String {
        format!("{}.kpi.>", self.prefix)
    }

    /// KPI events of one scope.
    pub fn kpi(&self, scope_key: &str) -> String {
        format!("{}.kpi.{}", self.prefix, token(scope_key))
    }

    /// Source Capability Graph: map a source (connect → introspect → parse → link → finalize).
    pub fn scg_map(&self) -> String {
        format!("{}.map", self.prefix)
    }

    /// Source Capability Graph: ranked route recipes for a query.
    pub fn scg_route(&self) -> String {
        format!("{}.route", self.prefix)
    }

    /// Source Capability Graph: a node's typed neighbourhood.
    pub fn scg_observe(&self) -> String {
        format!("{}.observe", self.prefix)
    }

    /// Source Capability Graph: deposit a memory note.
    pub fn scg_memory_deposit(&self) -> String {
        format!("{}.memory.deposit", self.prefix)
    }

    /// Source Capability Graph: map pipeline progress events.
    pub fn events_scg(&self) -> String {
        format!("{}.events.scg", self.prefix)
    }

    /// Live sources: add (or replace) a source.
    pub fn sources_add(&self) -> String {
        format!("{}.sources.add", self.prefix)
    }

    /// Live sources: remove a source and its capabilities.
    pub fn sources_remove(&self) -> String {
        format!("{}.sources.remove", self.prefix)
    }

    /// Live sources: every source with its state.
    pub fn sources_list(&self) -> String {
        format!("{}.sources.list", self.prefix)
    }

    /// Live sources: connect a lazy source now.
    pub fn sources_load(&self) -> String {
        format!("{}.sources.load", self.prefix)
    }

    /// Live sources: state changes (connected, synced, disconnected, failed, removed) and call progress.
    pub fn events_sources(&self) -> String {
        format!("{}.events.sources", self.prefix)
    }

    /// The JetStream subject of index mutations (stream `jetstream.index_stream`).
    pub fn js_index(&self) -> String {
        format!("{}.js.index", self.prefix)
    }

    /// The JetStream subject of task outcomes (stream `jetstream.outcome_stream`).
    pub fn js_outcome(&self) -> String {
        format!("{}.js.outcome", self.prefix)
    }

    /// The JetStream subjects that republish, once, events of stream outcomes
    /// (stream `jetstream.events_stream`): `<prefix>.js.events.<event subject without the prefix>`.
    pub fn js_events(&self) -> String {
        format!("{}.js.events.>", self.prefix)
    }

    /// The subject an event for `subject` (one of this prefix's subjects) is handed to the events stream on.
    pub fn js_event(&self, subject: &str) -> String {
        let rest = subject.strip_prefix(&self.prefix).unwrap_or(subject).trim_start_matches('.');
        format!("{}.js.events.{rest}", self.prefix)
    }

    /// Alert (and recovery) events of one scope.
    pub fn alert(&self, severity: &str, scope_key: &str) -> String {
        format!("{}.alert.{}.{}", self.prefix, token(severity), token(scope_key))
    }
}

/// Makes a subject token of any text: characters other than letters, digits,
/// `-` and `_` become `_` (so `acme/bot` is `acme_bot`), and empty becomes `_`.
pub fn token(text: &str) -> String {
    let cleaned: String =
        text.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    if cleaned.is_empty() {
        "_".to_string()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_live_under_the_prefix() {
        let subjects = Subjects::new(DEFAULT_PREFIX);
        assert_eq!(subjects.discover(), "capdex.v1.discover");
        assert_eq!(subjects.outcome(), "capdex.v1.outcome");
        assert_eq!(subjects.plan(), "capdex.v1.plan");
        assert_eq!(subjects.kpi_all(), "capdex.v1.kpi.>");
        assert_eq!(subjects.kpi("acme/bot"), "capdex.v1.kpi.acme_bot");
        assert_eq!(subjects.alert("warning", "a.b *>"), "capdex.v1.alert.warning.a_b___");
        assert_eq!(token(""), "_");
        assert_eq!(subjects.scg_route(), "capdex.v1.route");
        assert_eq!(subjects.scg_memory_deposit(), "capdex.v1.memory.deposit");
        assert_eq!(subjects.events_scg(), "capdex.v1.events.scg");
        assert_eq!(subjects.js_index(), "capdex.v1.js.index");
        assert_eq!(subjects.js_outcome(), "capdex.v1.js.outcome");
        assert_eq!(subjects.js_event(&subjects.alert("critical", "acme")), "capdex.v1.js.events.alert.critical.acme");
        assert_eq!(subjects.js_events(), "capdex.v1.js.events.>");
        assert_eq!(subjects.approval("ab12", "approve"), "capdex.v1.approval.ab12.approve");
        assert_eq!(subjects.exec("lookup_order"), "capdex.v1.exec.lookup_order");
        assert_eq!(subjects.events_dispatch(), "capdex.v1.events.dispatch");
        assert_eq!(subjects.sources_add(), "capdex.v1.sources.add");
        assert_eq!(subjects.events_sources(), "capdex.v1.events.sources");
        assert_eq!(subjects.agent("alpha", "dispatch"), "capdex.v1.agent.alpha.dispatch");
        assert_eq!(subjects.agent("acme/bot", "binding.list"), "capdex.v1.agent.acme/bot.binding.list");
        assert_eq!(subjects.agent_wildcard("approval.list"), "capdex.v1.agent.*.approval.list");
        assert_eq!(
            subjects.approver_decision("ops", "ab12", "approve"),
            "capdex.v1.approver.ops.approval.ab12.approve"
        );
        assert_eq!(subjects.approver_wildcard("reject"), "capdex.v1.approver.*.approval.*.reject");
    }

    #[test]
    fn the_identity_is_the_token_after_agent_or_approver() {
        let subjects = Subjects::new(DEFAULT_PREFIX);
        assert_eq!(subjects.identity_of("capdex.v1.agent.alpha.dispatch"), Some("alpha"));
        assert_eq!(subjects.identity_of(&subjects.approver_decision("ops", "x", "approve")), Some("ops"));
        assert_eq!(subjects.identity_of("capdex.v1.dispatch"), None);
        assert_eq!(subjects.identity_of("capdex.v1.agent"), None);
        assert_eq!(subjects.identity_of("capdex.v1.agent..dispatch"), None);
        assert_eq!(subjects.identity_of("capdex.v2.agent.alpha.dispatch"), None);
        assert_eq!(subjects.identity_of("capdex.v1x.agent.alpha.dispatch"), None);
    }
}
