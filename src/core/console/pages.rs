//! The console's pages, rendered from plain data. Each function returns the
//! content of `<main>`; [`super::html::document`] wraps it into a page, and
//! the live updates fetch the content alone.

use super::html::{escape, millis, percent, relative, sparkline, url_encode, Html};
use super::model::{CapabilityFigures, CatalogOverview, KpiOverview};
use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind};
use crate::core::discovery::DiscoveryResult;
use serde::Deserialize;
use std::collections::BTreeSet;

/// An approval as `approval.list` gives it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ApprovalRow {
    pub id: String,
    pub slug: String,
    pub agent_id: String,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub status: String,
    pub decided_at_ms: Option<u64>,
    /// The call's arguments, already redacted by the dispatch pipeline.
    pub arguments: Option<serde_json::Value>,
    pub decided_by: Option<String>,
}

impl ApprovalRow {
    /// Pending and not expired at `now_ms`: it can still be decided.
    pub fn is_open(&self, now_ms: u64) -> bool {
        self.status == "pending" && self.expires_at_ms > now_ms
    }
}

/// A live source as `sources.list` gives it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SourceRow {
    pub id: String,
    pub kind: String,
    pub state: String,
    pub tool_count: u64,
    pub last_sync_ms: Option<u64>,
    pub last_error: Option<String>,
    pub lazy: bool,
}

/// The most characters of an approval's arguments shown.
const MAX_ARGUMENTS_SHOWN: usize = 2_000;

/// The approvals page: the open ones with approve and reject buttons, then the decided ones, newest first.
pub fn approvals(rows: &[ApprovalRow], now_ms: u64, csrf: &str) -> String {
    let mut open: Vec<&ApprovalRow> = rows.iter().filter(|a| a.is_open(now_ms)).collect();
    open.sort_by(|a, b| b.created_at_ms.cmp(&a.created_at_ms).then_with(|| a.id.cmp(&b.id)));
    let mut closed: Vec<&ApprovalRow> = rows.iter().filter(|a| !a.is_open(now_ms)).collect();
    closed.sort_by_key(|a| std::cmp::Reverse(a.decided_at_ms.unwrap_or(a.expires_at_ms)));
    let mut page = Html::with_capacity(2048 + rows.len() * 512);
    page.fmt(format_args!(
        "<h1>Approvals</h1><section id=\"pending\"><h2>Pending <span class=\"count\">{}</span></h2>",
        open.len()
    ));
    if open.is_empty() {
        page.raw("<p class=\"empty\">No call is waiting for a decision.</p>");
    } else {
        page.raw("<table class=\"approvals\"><thead><tr><th>Capability</th><th>Agent</th><th>Arguments</th><th>Asked</th><th>Expires</th><th></th></tr></thead><tbody>");
        for approval in open {
            let id = escape(&approval.id);
            page.fmt(format_args!("<tr class=\"approval pending\" id=\"approval-{id}\" data-approval=\"{id}\">"));
            page.element("td", "slug", &approval.slug).element("td", "agent", &approval.agent_id);
            page.raw("<td><pre class=\"arguments\">")
                .text(&arguments_text(approval.arguments.as_ref()))
                .raw("</pre></td>");
            page.element("td", "", &relative(approval.created_at_ms, now_ms));
            page.element("td", "", &relative(approval.expires_at_ms, now_ms));
            page.raw("<td class=\"actions\">");
            for (action, label) in [("approve", "Approve"), ("reject", "Reject")] {
                page.fmt(format_args!(
                    "<form method=\"post\" action=\"/approvals/{}/{action}\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><button type=\"submit\" class=\"{action}\">{label}</button></form>",
                    escape(&url_encode(&approval.id)),
                    escape(csrf)
                ));
            }
            page.raw("</td></tr>");
        }
        page.raw("</tbody></table>");
    }
    page.fmt(format_args!(
        "</section><section id=\"decided\"><h2>Decided <span class=\"count\">{}</span></h2>",
        closed.len()
    ));
    if closed.is_empty() {
        page.raw("<p class=\"empty\">Nothing decided yet.</p>");
    } else {
        page.raw("<table class=\"approvals\"><thead><tr><th>Capability</th><th>Agent</th><th>Status</th><th>By</th><th>When</th></tr></thead><tbody>");
        for approval in closed {
            let status = if approval.status == "pending" { "expired" } else { approval.status.as_str() };
            page.fmt(format_args!(
                "<tr class=\"approval {}\" id=\"approval-{}\">",
                escape(status),
                escape(&approval.id)
            ));
            page.element("td", "slug", &approval.slug).element("td", "agent", &approval.agent_id);
            page.element("td", "status", status);
            page.element("td", "by", approval.decided_by.as_deref().unwrap_or("–"));
            let when = approval.decided_at_ms.unwrap_or(approval.expires_at_ms);
            page.element("td", "", &relative(when, now_ms));
            page.raw("</tr>");
        }
        page.raw("</tbody></table>");
    }
    page.raw("</section>");
    page.finish()
}

/// An approval's arguments as indented JSON, cut at [`MAX_ARGUMENTS_SHOWN`] characters.
fn arguments_text(arguments: Option<&serde_json::Value>) -> String {
    let Some(arguments) = arguments else { return "(not recorded)".to_string() };
    let text = serde_json::to_string_pretty(arguments).unwrap_or_default();
    match text.char_indices().nth(MAX_ARGUMENTS_SHOWN) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// The KPI page: totals, active alerts, recent alert events, then every scope.
pub fn kpis(overview: &KpiOverview) -> String {
    let now_ms = overview.at_ms;
    let alerting: Vec<_> = overview.scopes.iter().filter(|s| s.alerting).collect();
    let mut page = Html::with_capacity(4096 + overview.scopes.len() * 900);
    page.raw("<h1>KPIs and alerts</h1>");
    page.fmt(format_args!(
        "<p class=\"totals\"><span id=\"scope-count\">{}</span> scopes · <span id=\"outcome-count\">{}</span> outcomes recorded · <span id=\"alerting-count\">{}</span> in alert</p>",
        overview.scopes.len(),
        overview.outcomes,
        alerting.len()
    ));
    page.raw("<section id=\"alerts\"><h2>Active alerts</h2>");
    if alerting.is_empty() {
        page.raw("<p class=\"empty\">No scope is in alert.</p>");
    } else {
        page.raw("<ul class=\"alerts\">");
        for scope in &alerting {
            page.raw("<li class=\"alert\">").element("strong", "", &scope.kpi.scope_key);
            page.fmt(format_args!(" weighted success {}", percent(scope.kpi.weighted_success_rate)));
            page.raw("</li>");
        }
        page.raw("</ul>");
    }
    page.raw("</section><section id=\"recent-alerts\"><h2>Recent alerts and recoveries</h2>");
    if overview.recent_alerts.is_empty() {
        page.raw("<p class=\"empty\">None since the node started.</p>");
    } else {
        page.raw("<table><thead><tr><th>When</th><th>Severity</th><th>Scope</th><th>Reason</th><th>Value</th><th>Threshold</th></tr></thead><tbody>");
        for alert in &overview.recent_alerts {
            page.fmt(format_args!("<tr class=\"severity-{}\">", escape(&alert.severity)));
            page.element("td", "", &relative(alert.at_ms, now_ms)).element("td", "severity", &alert.severity);
            page.element("td", "", &alert.scope_key).element("td", "", &alert.reason);
            page.element("td", "", &percent(alert.value)).element("td", "", &percent(alert.threshold));
            page.raw("</tr>");
        }
        page.raw("</tbody></table>");
    }
    page.raw("</section><section id=\"scopes\"><h2>Scopes</h2>");
    if overview.scopes.is_empty() {
        page.raw("<p class=\"empty\">No outcome has been reported yet.</p>");
    } else {
        page.raw("<table class=\"scopes\"><thead><tr><th>Scope</th><th>Samples</th><th>Success</th><th>Weighted</th><th>Avg score</th><th>Window</th><th>State</th><th>Updated</th></tr></thead><tbody>");
        for scope in &overview.scopes {
            let kpi = &scope.kpi;
            page.fmt(format_args!("<tr class=\"scope\" data-scope=\"{}\">", escape(&kpi.scope_key)));
            page.element("td", "scope-key", &kpi.scope_key);
            page.fmt(format_args!(
                "<td class=\"samples\">{}</td><td class=\"success\">{}</td><td class=\"weighted\">{}</td><td>{:.2}</td><td>{}</td>",
                kpi.sample_count,
                percent(kpi.success_rate),
                percent(kpi.weighted_success_rate),
                kpi.average_score,
                sparkline(&scope.sparkline)
            ));
            let state = match (scope.alerting, scope.adaptive_degraded) {
                (true, true) => "<td class=\"state alert\">alert · adaptive</td>",
                (true, false) => "<td class=\"state alert\">alert</td>",
                (false, true) => "<td class=\"state adaptive\">adaptive</td>",
                (false, false) => "<td class=\"state ok\">ok</td>",
            };
            page.raw(state).element("td", "", &relative(kpi.updated_at_ms, now_ms)).raw("</tr>");
        }
        page.raw("</tbody></table>");
    }
    page.raw("</section>");
    page.finish()
}

/// What the capabilities page is asked for (its query string).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct CatalogQuery {
    /// Words that must all appear in the id, name, category, tags or description (any case).
    pub q: String,
    pub kind: String,
    pub origin: String,
    pub category: String,
    /// 1-based.
    pub page: usize,
}

/// Capabilities shown per page.
pub const PAGE_SIZE: usize = 50;

/// The capabilities page: the filter form, then one page of matching capabilities.
pub fn capabilities(overview: &CatalogOverview, query: &CatalogQuery) -> String {
    let catalog = &overview.catalog;
    let words: Vec<String> = query.q.split_whitespace().map(str::to_lowercase).collect();
    let kind = CapabilityKind::parse(query.kind.trim());
    let mut origins = BTreeSet::new();
    let mut categories = BTreeSet::new();
    let mut matching: Vec<&CapabilityDescriptor> = Vec::new();
    for descriptor in catalog.descriptors.values() {
        let origin = catalog.origin(&descriptor.id);
        origins.insert(origin);
        categories.insert(descriptor.category.as_str());
        let admitted = kind.is_none_or(|k| descriptor.kind == k)
            && (query.origin.is_empty() || origin == query.origin)
            && (query.category.is_empty() || descriptor.category == query.category)
            && (words.is_empty() || matches_words(descriptor, &words));
        if admitted {
            matching.push(descriptor);
        }
    }
    let pages = matching.len().div_ceil(PAGE_SIZE).max(1);
    let page_number = query.page.clamp(1, pages);
    let shown = matching.iter().skip((page_number - 1) * PAGE_SIZE).take(PAGE_SIZE);
    let mut page = Html::with_capacity(8192 + PAGE_SIZE * 700);
    page.raw(
        "<h1>Capabilities</h1><form class=\"filters\" method=\"get\" action=\"/capabilities\" id=\"catalog-filter\">",
    );
    page.raw("<input type=\"search\" name=\"q\" id=\"catalog-search\" placeholder=\"Search id, name, description, tags\" value=\"").text(&query.q).raw("\">");
    page.raw("<select name=\"kind\"><option value=\"\">any kind</option>");
    for k in CapabilityKind::ALL {
        option(&mut page, k.as_str(), kind == Some(k));
    }
    page.raw("</select><select name=\"origin\"><option value=\"\">any origin</option>");
    for origin in &origins {
        option(&mut page, origin, query.origin == *origin);
    }
    page.raw("</select><select name=\"category\"><option value=\"\">any category</option>");
    for category in &categories {
        option(&mut page, category, query.category == *category);
    }
    page.raw("</select><button type=\"submit\">Filter</button></form>");
    page.fmt(format_args!(
        "<p class=\"totals\"><span id=\"match-count\">{}</span> of {} capabilities · catalog version {} · page {page_number} of {pages}</p>",
        matching.len(),
        catalog.len(),
        catalog.version
    ));
    page.raw("<table class=\"catalog\"><thead><tr><th>Capability</th><th>Kind</th><th>Category</th><th>Origin</th><th>Calls</th><th>Errors</th><th>p50</th><th>p99</th><th>Prior</th></tr></thead><tbody>");
    let none = CapabilityFigures::default();
    for descriptor in shown {
        let figures = overview.figures.get(&descriptor.id).unwrap_or(&none);
        let unavailable = if descriptor.available { "" } else { " unavailable" };
        page.fmt(format_args!("<tr class=\"capability{unavailable}\" data-id=\"{}\">", escape(&descriptor.id)));
        page.fmt(format_args!("<td><a href=\"/capabilities/{}\">", escape(&url_encode(&descriptor.id))))
            .element("span", "name", &descriptor.display_name)
            .raw("</a> ")
            .element("code", "id", &descriptor.id)
            .raw("</td>");
        page.element("td", "", descriptor.kind.as_str()).element("td", "", &descriptor.category);
        page.element("td", "", catalog.origin(&descriptor.id));
        page.fmt(format_args!(
            "<td class=\"calls\">{}</td><td class=\"errors\">{}</td><td>{}</td><td>{}</td><td class=\"prior\">{}</td></tr>",
            figures.calls,
            figures.errors,
            millis(figures.p50_ms),
            millis(figures.p99_ms),
            prior_text(overview.prior.adjustment(&descriptor.id))
        ));
    }
    page.raw("</tbody></table>");
    if pages > 1 {
        page.raw("<nav class=\"pages\">");
        let link = |page: &mut Html, number: usize, label: &str| {
            page.fmt(format_args!(
                "<a href=\"/capabilities?q={}&amp;kind={}&amp;origin={}&amp;category={}&amp;page={number}\">{label}</a> ",
                escape(&url_encode(&query.q)),
                escape(&url_encode(&query.kind)),
                escape(&url_encode(&query.origin)),
                escape(&url_encode(&query.category)),
            ));
        };
        if page_number > 1 {
            link(&mut page, page_number - 1, "← previous");
        }
        if page_number < pages {
            link(&mut page, page_number + 1, "next →");
        }
        page.raw("</nav>");
    }
    page.finish()
}

fn option(page: &mut Html, value: &str, selected: bool) {
    page.raw("<option value=\"")
        .text(value)
        .raw(if selected { "\" selected>" } else { "\">" })
        .text(value)
        .raw("</option>");
}

/// True when every word occurs in the descriptor's id, name, category, tags or description.
fn matches_words(descriptor: &CapabilityDescriptor, words: &[String]) -> bool {
    let fields =
        [&descriptor.id, &descriptor.name, &descriptor.display_name, &descriptor.category, &descriptor.description];
    words.iter().all(|word| {
        fields.iter().any(|field| contains_ignore_case(field, word))
            || descriptor.tags.iter().any(|tag| contains_ignore_case(tag, word))
    })
}

/// `haystack` contains `needle` (already lowercase), ignoring case; no allocation for ASCII text.
fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    if haystack.is_ascii() && needle.is_ascii() {
        let (h, n) = (haystack.as_bytes(), needle.as_bytes());
        n.is_empty() || h.windows(n.len()).any(|window| window.eq_ignore_ascii_case(n))
    } else {
        haystack.to_lowercase().contains(needle)
    }
}

/// The outcome prior's relative change of relevance, signed, or `–` when neutral.
fn prior_text(adjustment: f32) -> String {
    if adjustment.abs() < 0.0005 || !adjustment.is_finite() {
        "–".to_string()
    } else {
        format!("{:+.1}%", adjustment * 100.0)
    }
}

/// One capability in full: what discovery knows of it, its dispatch figures and prior.
pub fn capability(overview: &CatalogOverview, id: &str) -> Option<String> {
    let descriptor = overview.catalog.get(id)?;
    let figures = overview.figures.get(id).cloned().unwrap_or_default();
    let mut page = Html::with_capacity(4096);
    page.raw("<p><a href=\"/capabilities\">← all capabilities</a></p>").element("h1", "", &descriptor.display_name);
    page.raw("<dl class=\"facts\">");
    let fact = |page: &mut Html, term: &str, value: &str| {
        page.element("dt", "", term).element("dd", "", value);
    };
    fact(&mut page, "Id", &descriptor.id);
    fact(&mut page, "Kind", descriptor.kind.as_str());
    fact(&mut page, "Category", &descriptor.category);
    fact(&mut page, "Origin", overview.catalog.origin(id));
    fact(&mut page, "Available", if descriptor.available { "yes" } else { "no" });
    fact(&mut page, "Tags", &descriptor.tags.join(", "));
    fact(&mut page, "Calls", &figures.calls.to_string());
    fact(&mut page, "Errors", &figures.errors.to_string());
    fact(&mut page, "Latency p50 / p99", &format!("{} / {}", millis(figures.p50_ms), millis(figures.p99_ms)));
    fact(&mut page, "Outcome prior", &prior_text(overview.prior.adjustment(id)));
    // Names of the secrets it needs (never their values: capdex does not hold them here).
    fact(&mut page, "Needs secrets", &descriptor.required_secrets.join(", "));
    page.raw("</dl>").element("h2", "", "Description").element("p", "description", &descriptor.description);
    if let Some(schema) = &descriptor.full_schema {
        page.element("h2", "", "Parameters").raw("<pre class=\"schema\">");
        page.text(&serde_json::to_string_pretty(&schema.value()).unwrap_or_default()).raw("</pre>");
    }
    Some(page.finish())
}

/// The sources page: every live source's state.
pub fn sources(rows: &[SourceRow], now_ms: u64) -> String {
    let mut page = Html::with_capacity(1024 + rows.len() * 400);
    page.fmt(format_args!(
        "<h1>Sources</h1><p class=\"totals\">{} live sources · {} connected</p>",
        rows.len(),
        rows.iter().filter(|s| s.state == "connected").count()
    ));
    if rows.is_empty() {
        page.raw("<p class=\"empty\">No live source is configured (<code>capdex source add</code> or <code>[[sources]]</code>).</p>");
        return page.finish();
    }
    page.raw("<table class=\"sources\"><thead><tr><th>Source</th><th>Kind</th><th>State</th><th>Tools</th><th>Last sync</th><th>Last error</th></tr></thead><tbody>");
    for source in rows {
        page.fmt(format_args!(
            "<tr class=\"source state-{}\" data-source=\"{}\">",
            escape(&source.state),
            escape(&source.id)
        ));
        page.element("td", "", &source.id).element("td", "", &source.kind);
        let state = if source.lazy { format!("{} (lazy)", source.state) } else { source.state.clone() };
        page.element("td", "state", &state);
        page.fmt(format_args!("<td>{}</td>", source.tool_count));
        page.element("td", "", &source.last_sync_ms.map_or("never".to_string(), |at| relative(at, now_ms)));
        page.element("td", "error", source.last_error.as_deref().unwrap_or(""));
        page.raw("</tr>");
    }
    page.raw("</tbody></table>");
    page.finish()
}

/// Why a capability ranked where it did (from a discovery asked with `explain`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Signals {
    pub id: String,
    pub lexical: f32,
    pub dense: Option<f32>,
    pub graph: f32,
    pub prior: f32,
}

/// The token budgets of the three tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    pub tier0: usize,
    pub tier1: usize,
    pub tier2: usize,
}

/// The playground: the message form, and for an asked message the tiers as an agent gets them.
pub fn playground(
    message: &str,
    answer: Option<Result<(&DiscoveryResult, &[Signals]), &str>>,
    budgets: Budgets,
) -> String {
    let mut page = Html::with_capacity(8192);
    page.raw("<h1>Discovery playground</h1><form method=\"get\" action=\"/playground\" id=\"playground-form\">");
    page.raw("<textarea name=\"message\" id=\"playground-message\" rows=\"3\" placeholder=\"A user's message, as an agent would send it\">").text(message).raw("</textarea>");
    page.raw("<button type=\"submit\">Discover</button></form>");
    let (result, signals) = match answer {
        None => return page.finish(),
        Some(Err(problem)) => {
            page.raw("<p class=\"error\" id=\"playground-error\">").text(problem).raw("</p>");
            return page.finish();
        }
        Some(Ok(answer)) => answer,
    };
    let tokens = &result.token_estimate;
    page.raw("<section id=\"budgets\"><h2>Tokens against budgets</h2><table><tbody>");
    for (tier, used, budget) in [
        ("Tier 0", tokens.tier0_tokens, budgets.tier0),
        ("Tier 1", tokens.tier1_tokens, budgets.tier1),
        ("Tier 2", tokens.tier2_tokens, budgets.tier2),
    ] {
        let over = if used > budget { " over" } else { "" };
        page.fmt(format_args!("<tr class=\"budget{over}\"><th>{tier}</th><td>{used} / {budget}</td><td><meter min=\"0\" max=\"{budget}\" value=\"{used}\"></meter></td></tr>"));
    }
    page.fmt(format_args!(
        "<tr><th>Total</th><td id=\"total-tokens\">{} / {}</td><td></td></tr></tbody></table>",
        tokens.total_tokens,
        budgets.tier0 + budgets.tier1 + budgets.tier2
    ));
    let diagnostics = &result.diagnostics;
    page.raw("<p class=\"diagnostics\">").text(&format!(
        "{} indexed · {} scanned · embedder {} · {:.0} µs",
        diagnostics.total_indexed, diagnostics.candidates_scanned, diagnostics.embedder, diagnostics.timings.total_us
    ));
    page.raw("</p></section><section id=\"tier1\"><h2>Tier 1</h2>");
    if result.tier1.is_empty() {
        page.raw("<p class=\"empty\" id=\"nothing-fits\">No capability fits this message.</p>");
    } else {
        page.raw("<table class=\"tier1\"><thead><tr><th>#</th><th>Capability</th><th>Relevance</th><th>Lexical</th><th>Dense</th><th>Graph</th><th>Prior</th><th>Summary</th></tr></thead><tbody>");
        for (rank, entry) in result.tier1.iter().enumerate() {
            let signal = signals.iter().find(|s| s.id == entry.id);
            page.fmt(format_args!("<tr class=\"tier1-entry\" data-id=\"{}\"><td>{}</td>", escape(&entry.id), rank + 1));
            page.element("td", "id", &entry.id);
            page.fmt(format_args!("<td class=\"relevance\">{:.3}</td>", entry.relevance));
            match signal {
                Some(s) => page.fmt(format_args!(
                    "<td class=\"lexical\">{:.3}</td><td class=\"dense\">{}</td><td class=\"graph\">{:+.3}</td><td class=\"prior\">{}</td>",
                    s.lexical,
                    s.dense.map_or("–".to_string(), |d| format!("{d:.3}")),
                    s.graph,
                    prior_text(s.prior)
                )),
                None => page.raw("<td>–</td><td>–</td><td>–</td><td>–</td>"),
            };
            page.element("td", "summary", &entry.summary_text).raw("</tr>");
        }
        page.raw("</tbody></table>");
    }
    page.raw("</section><section id=\"tier0\"><h2>Tier 0</h2><pre>").text(&result.tier0).raw("</pre></section>");
    page.raw("<section id=\"tier2\"><h2>Tier 2</h2>");
    for entry in &result.tier2 {
        page.element("h3", "", &entry.id).raw("<pre class=\"tier2-entry\">").text(&entry.full_text).raw("</pre>");
    }
    page.raw("</section><section id=\"rendered\"><h2>As the agent receives it</h2><pre>")
        .text(&result.rendered)
        .raw("</pre></section>");
    page.finish()
}

/// The sign-in page (a whole document: no navigation before signing in).
pub fn sign_in(problem: Option<&str>) -> String {
    let mut page = Html::with_capacity(1024);
    page.raw("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign in · capdex</title><link rel=\"stylesheet\" href=\"/static/console.css\"></head><body class=\"sign-in\"><main><h1>capdex console</h1>");
    if let Some(problem) = problem {
        page.element("p", "error", problem);
    }
    page.raw("<form method=\"post\" action=\"/login\"><label>Console token <input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"current-password\" autofocus></label><button type=\"submit\">Sign in</button></form></main></body></html>\n");
    page.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::catalog::Catalog;
    use crate::core::console::model::ScopeOverview;
    use crate::core::kpi_window::{AlertEvent, Kpi};
    use crate::core::outcome_prior::OutcomePrior;
    use std::collections::HashMap;
    use std::sync::Arc;

    fn descriptor(id: &str, name: &str, category: &str) -> CapabilityDescriptor {
        let mut d: CapabilityDescriptor = serde_json::from_value(serde_json::json!({
            "id": id, "kind": "tool", "name": name, "displayName": name, "description": format!("{name} does things"),
            "category": category, "tags": ["alpha"], "requiredSecrets": [], "requiredTools": [], "available": true,
            "sourceRef": {"type": "tool"}
        }))
        .unwrap_or_else(|err| panic!("descriptor fixture: {err}"));
        d.id = id.to_string();
        d
    }

    fn overview(n: usize) -> CatalogOverview {
        let mut catalog = Catalog::default();
        for i in 0..n {
            let d = descriptor(&format!("tool:t{i:05}"), &format!("Tool {i}"), if i % 2 == 0 { "even" } else { "odd" });
            catalog.descriptors.insert(d.id.clone(), d);
        }
        CatalogOverview { catalog: Arc::new(catalog), figures: HashMap::new(), prior: OutcomePrior::neutral() }
    }

    #[test]
    fn a_capability_named_like_markup_renders_as_text() {
        let mut given = overview(0);
        let d = descriptor("tool:<script>alert(1)</script>", "<script>alert(1)</script>", "<b>x</b>");
        Arc::make_mut(&mut given.catalog).descriptors.insert(d.id.clone(), d);
        let page = capabilities(&given, &CatalogQuery::default());
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        let detail = capability(&given, "tool:<script>alert(1)</script>").unwrap();
        assert!(!detail.contains("<script>") && !detail.contains("<b>"));
    }

    #[test]
    fn the_catalog_filters_and_pages() {
        let given = overview(120);
        let all = capabilities(&given, &CatalogQuery::default());
        assert!(all.contains("<span id=\"match-count\">120</span> of 120"));
        assert_eq!(all.matches("class=\"capability\"").count(), PAGE_SIZE);
        assert!(all.contains("page 1 of 3"));
        let third = capabilities(&given, &CatalogQuery { page: 3, ..Default::default() });
        assert_eq!(third.matches("class=\"capability\"").count(), 20);
        let odd = capabilities(&given, &CatalogQuery { category: "odd".into(), ..Default::default() });
        assert!(odd.contains("<span id=\"match-count\">60</span>"));
        let searched = capabilities(&given, &CatalogQuery { q: "TOOL 11".into(), ..Default::default() });
        // "tool" and "11" in any field: Tool 11, Tool 110..119.
        assert!(searched.contains("<span id=\"match-count\">11</span>"), "{searched}");
        let none = capabilities(&given, &CatalogQuery { kind: "skill".into(), ..Default::default() });
        assert!(none.contains("<span id=\"match-count\">0</span>"));
        assert!(capability(&given, "tool:missing").is_none());
    }

    fn approval(id: &str, status: &str, expires_at_ms: u64) -> ApprovalRow {
        ApprovalRow {
            id: id.into(),
            slug: "pay".into(),
            agent_id: "agent-<1>".into(),
            created_at_ms: 1_000,
            expires_at_ms,
            status: status.into(),
            arguments: Some(serde_json::json!({"amount": 5, "token": "[redacted]"})),
            ..Default::default()
        }
    }

    #[test]
    fn open_approvals_get_buttons_with_the_csrf_token_and_decided_ones_say_who() {
        let mut decided = approval("a2", "approved", 90_000);
        decided.decided_by = Some("console".into());
        decided.decided_at_ms = Some(5_000);
        let rows = [approval("a1", "pending", 90_000), decided, approval("a3", "pending", 2_000)];
        let page = approvals(&rows, 10_000, "tok\"en");
        assert!(page.contains("action=\"/approvals/a1/approve\""));
        assert!(page.contains("action=\"/approvals/a1/reject\""));
        assert!(!page.contains("/approvals/a3/approve"), "an expired approval cannot be decided");
        assert!(page.contains("value=\"tok&quot;en\""));
        assert!(page.contains("agent-&lt;1&gt;"));
        assert!(page.contains("&quot;token&quot;: &quot;[redacted]&quot;"));
        assert!(page.contains("<td class=\"by\">console</td>"));
        assert!(page.contains("class=\"approval expired\""));
    }

    #[test]
    fn kpis_show_alerts_and_every_scope() {
        let kpi = |key: &str, rate: f32| Kpi {
            scope_key: key.into(),
            sample_count: 10,
            success_count: 5,
            partial_count: 0,
            failed_count: 5,
            success_rate: rate,
            average_score: rate,
            weighted_success_rate: rate,
            updated_at_ms: 1_000,
        };
        let overview = KpiOverview {
            scopes: vec![
                ScopeOverview {
                    kpi: kpi("acme/<bot>", 0.2),
                    alerting: true,
                    adaptive_degraded: true,
                    sparkline: vec![Some(1.0), None, Some(0.2)],
                },
                ScopeOverview { kpi: kpi("beta", 0.9), alerting: false, adaptive_degraded: false, sparkline: vec![] },
            ],
            recent_alerts: vec![AlertEvent {
                severity: "critical".into(),
                reason: "weighted success below threshold".into(),
                threshold: 0.7,
                value: 0.2,
                scope_key: "acme/<bot>".into(),
                sample_count: 10,
                at_ms: 2_000,
            }],
            outcomes: 20,
            at_ms: 3_000,
        };
        let page = kpis(&overview);
        assert!(page.contains("<span id=\"alerting-count\">1</span>"));
        assert!(page.contains("acme/&lt;bot&gt;") && !page.contains("<bot>"));
        assert_eq!(page.matches("class=\"scope\"").count(), 2);
        assert!(page.contains("alert · adaptive") && page.contains("severity-critical"));
        assert!(kpis(&KpiOverview::default()).contains("No outcome has been reported yet."));
    }

    #[test]
    fn sources_show_state_and_last_error() {
        let rows = [SourceRow {
            id: "time".into(),
            kind: "mcpStdio".into(),
            state: "failed".into(),
            last_error: Some("spawn <x> failed".into()),
            ..Default::default()
        }];
        let page = sources(&rows, 0);
        assert!(page.contains("state-failed") && page.contains("spawn &lt;x&gt; failed"));
        assert!(sources(&[], 0).contains("No live source"));
    }

    #[test]
    fn the_playground_shows_tiers_signals_and_budgets() {
        let budgets = Budgets { tier0: 200, tier1: 800, tier2: 2000 };
        assert!(!playground("", None, budgets).contains("tier1"));
        let mut result = DiscoveryResult::default();
        result.tier1.push(crate::core::tiers::Tier1Entry {
            id: "tool:a".into(),
            relevance: 0.8,
            summary_text: "does <a>".into(),
        });
        result.token_estimate.tier1_tokens = 900;
        let signals = [Signals { id: "tool:a".into(), lexical: 0.5, dense: Some(0.7), graph: 0.01, prior: 0.05 }];
        let page = playground("send <mail>", Some(Ok((&result, &signals))), budgets);
        assert!(page.contains("send &lt;mail&gt;"));
        assert!(page.contains("<td class=\"dense\">0.700</td>") && page.contains("+5.0%"));
        assert!(page.contains("budget over"), "a tier over its budget is marked");
        let empty = playground("hello", Some(Ok((&DiscoveryResult::default(), &[]))), budgets);
        assert!(empty.contains("nothing-fits"));
        assert!(playground("x", Some(Err("embedder <down>")), budgets).contains("embedder &lt;down&gt;"));
    }
}
