//! The docs name what the code serves: every metric the code emits is listed
//! in `ARCHITECTURE.md`, every subject of `src/gateway/subjects.rs` is in
//! `docs/api.md`.

use crate::lexer::{tokens, Kind};
use std::collections::{BTreeMap, BTreeSet};

/// Every span written in backticks, a metric's `{labels}` cut off
/// (`capdex_outcomes_total{status}` lists `capdex_outcomes_total`).
pub fn backticked(markdown: &str) -> BTreeSet<String> {
    markdown
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|span| span.split('{').next().unwrap_or(span).trim().to_string())
        .collect()
}

/// Whether `text` has the shape of a capdex metric name, `capdex_<name>_<unit>[_total]`.
fn metric_shaped(text: &str) -> bool {
    text.strip_prefix("capdex_").is_some_and(|rest| {
        !rest.is_empty() && rest.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    })
}

/// The metric names `sources` emit, however written: the literal name given
/// to `counter!`, `gauge!` or `histogram!` (with or without `metrics::`), and
/// every string literal shaped like a capdex metric name, which catches names
/// handed to the macro through a variable or a closure (as the per-scope
/// gauges of `actors/kpi.rs` are). Comments do not count.
pub fn emitted_metrics(sources: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for text in sources.values() {
        let tokens = tokens(text);
        for (at, token) in tokens.iter().enumerate() {
            match &token.kind {
                Kind::Str(text) if metric_shaped(text) => {
                    names.insert(text.clone());
                }
                Kind::Ident(name) if matches!(name.as_str(), "counter" | "gauge" | "histogram") => {
                    let call = tokens.get(at + 1).is_some_and(|t| t.is_punct("!"))
                        && tokens.get(at + 2).is_some_and(|t| t.is_punct("("));
                    if let (true, Some(Kind::Str(name))) = (call, tokens.get(at + 3).map(|t| &t.kind)) {
                        names.insert(name.clone());
                    }
                }
                _ => {}
            }
        }
    }
    names
}

/// The subjects `subjects.rs` builds, as templates: the `format!` strings that
/// start with the prefix (`{}.kpi.{}`), the prefix replaced by `DEFAULT_PREFIX`.
pub fn subject_templates(subjects_rs: &str) -> Vec<String> {
    let tokens = tokens(subjects_rs);
    let prefix = tokens
        .iter()
        .position(|t| t.is_ident("DEFAULT_PREFIX"))
        .and_then(|at| {
            tokens[at..].iter().find_map(|t| if let Kind::Str(s) = &t.kind { Some(s.clone()) } else { None })
        })
        .expect("subjects.rs defines DEFAULT_PREFIX");
    let mut templates: Vec<String> = tokens
        .iter()
        .filter_map(|t| match &t.kind {
            Kind::Str(text) => text.strip_prefix("{}.").map(|rest| format!("{prefix}.{rest}")),
            _ => None,
        })
        .collect();
    templates.sort();
    templates.dedup();
    templates
}

/// The subjects a markdown file names in backticks.
pub fn documented_subjects(markdown: &str) -> Vec<String> {
    markdown
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.contains('.') && !span.contains(' '))
        .map(str::to_string)
        .collect()
}

/// Whether the documented subject `doc` (`capdex.v1.kpi.<scope>`) is the
/// template `template` (`capdex.v1.kpi.{}`). In a template, a `{…}`
/// placeholder or `>` stands for one or more tokens and `*` for one; in the
/// doc, a `<…>` placeholder, `*` or `>` may only stand where the template has
/// one of those.
pub fn subject_matches(template: &str, doc: &str) -> bool {
    fn open(token: &str) -> bool {
        token.contains('{') || token == ">" || token == "*"
    }
    fn matches(template: &[&str], doc: &[&str]) -> bool {
        match (template.split_first(), doc.split_first()) {
            (None, None) => true,
            (Some((t, t_rest)), Some((d, d_rest))) => {
                // A literal is itself only, so a doc placeholder never stands for one.
                if !open(t) {
                    return t == d && matches(t_rest, d_rest);
                }
                if *t == "*" {
                    return matches(t_rest, d_rest);
                }
                // One or more tokens.
                (1..=doc.len()).any(|taken| matches(t_rest, &doc[taken..]))
            }
            _ => false,
        }
    }
    let template: Vec<&str> = template.split('.').collect();
    let doc: Vec<&str> = doc.split('.').collect();
    matches(&template, &doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_found_however_named() {
        let sources = BTreeMap::from([(
            "src/a.rs".to_string(),
            r#"
            metrics::counter!("capdex_a_total").increment(1);
            let gauge = |name: &'static str| metrics::gauge!(name, "scope" => s);
            gauge("capdex_b");
            histogram!("odd_name_seconds").record(1.0);
            // metrics::counter!("capdex_in_a_comment_total")
            let env = "CAPDEX_NOT_A_METRIC";
            "#
            .to_string(),
        )]);
        assert_eq!(
            emitted_metrics(&sources),
            ["capdex_a_total", "capdex_b", "odd_name_seconds"].map(String::from).into()
        );
    }

    #[test]
    fn backticked_names_lose_their_labels() {
        let listed = backticked("counts `capdex_outcomes_total{status}` and `capdex_kpi_scopes`, not capdex_bare");
        assert!(listed.contains("capdex_outcomes_total") && listed.contains("capdex_kpi_scopes"));
        assert!(!listed.contains("capdex_bare"));
    }

    #[test]
    fn subjects_match_their_documented_form() {
        let templates = subject_templates(
            r#"pub const DEFAULT_PREFIX: &str = "capdex.v1";
            fn kpi(&self, s: &str) -> String { format!("{}.kpi.{}", self.prefix, token(s)) }
            fn js_events(&self) -> String { format!("{}.js.events.>", self.prefix) }
            fn not_a_subject() { assert_eq!(x, "capdex.v1.discover"); }"#,
        );
        assert_eq!(templates, ["capdex.v1.js.events.>", "capdex.v1.kpi.{}"]);
        assert!(subject_matches("capdex.v1.kpi.{}", "capdex.v1.kpi.<scope>"));
        assert!(subject_matches("capdex.v1.approval.{}.{}", "capdex.v1.approval.<id>.approve"));
        assert!(subject_matches("capdex.v1.approval.*.{}", "capdex.v1.approval.<id>.reject"));
        assert!(subject_matches("capdex.v1.js.events.>", "capdex.v1.js.events.kpi.*"));
        assert!(subject_matches("capdex.v1.js.events.{rest}", "capdex.v1.js.events.alert.*.*"));
        assert!(!subject_matches("capdex.v1.capability.update", "capdex.v1.capability.<op>"));
        assert!(!subject_matches("capdex.v1.approval.{}.{}", "capdex.v1.approval.list"));
        assert!(!subject_matches("capdex.v1.binding.list", ".list"));
        assert!(documented_subjects("## `capdex.v1.binding.set`, `.list` and `a b`")
            .contains(&"capdex.v1.binding.set".to_string()));
    }
}
