//! The pure parts of capdex's MCP face (`src/mcp`): the names of the tools it
//! offers, direct mode's choice and naming of capabilities (the ones most
//! relevant to a session so far, under their own names, namespaced where two
//! collide), the dispatch id of a discovery id, and `tools/list` pagination.
//!
//! Nothing here knows the protocol library; `src/mcp` turns these into MCP tools.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The four tools the MCP face always offers, in the order `tools/list` gives them.
pub const FIXED_TOOLS: [&str; 4] = ["discover_capabilities", "call_capability", "route_sources", "report_outcome"];

/// The longest tool name offered: many clients refuse names over 64 characters.
pub const MAX_TOOL_NAME_CHARS: usize = 64;

/// How many tools one `tools/list` page holds.
pub const PAGE_SIZE: usize = 100;

/// A capability direct mode may offer as a tool of its own.
#[derive(Clone, Debug, PartialEq)]
pub struct DirectCandidate {
    /// The discovery id (`tool:echo`, `github#create_issue`).
    pub capability_id: String,
    /// The capability's own name (`echo`, `create_issue`).
    pub name: String,
    pub description: String,
    /// The input JSON schema; `None` takes an empty object.
    pub input_schema: Option<Value>,
}

/// A capability offered as a tool: its MCP name and what a call goes to.
#[derive(Clone, Debug, PartialEq)]
pub struct DirectTool {
    pub tool_name: String,
    pub capability_id: String,
    /// What the dispatch call's `slug` carries ([`dispatch_id`]).
    pub dispatch_id: String,
    pub description: String,
    /// Always a JSON object schema.
    pub input_schema: Value,
}

/// The dispatch id of a discovery id: `tool:<slug>` is called by its slug (a
/// dispatch registry slug), a source capability `<source>#<Name>` by itself.
///
/// # Examples
///
/// ```
/// use capdex::core::mcp_face::dispatch_id;
/// assert_eq!(dispatch_id("tool:echo"), "echo");
/// assert_eq!(dispatch_id("github#create_issue"), "github#create_issue");
/// ```
pub fn dispatch_id(capability_id: &str) -> String {
    match capability_id.strip_prefix("tool:") {
        Some(slug) if !slug.is_empty() => slug.to_string(),
        _ => capability_id.to_string(),
    }
}

/// `text` as an MCP tool name: letters, digits, `_`, `-` and `.` kept, any
/// other character made `_`, at most [`MAX_TOOL_NAME_CHARS`]; `tool` when nothing is left.
pub fn tool_name(text: &str) -> String {
    let name: String = text
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "_-.".contains(c) { c } else { '_' })
        .take(MAX_TOOL_NAME_CHARS)
        .collect();
    if name.trim_matches('_').is_empty() {
        "tool".to_string()
    } else {
        name
    }
}

/// The namespace of a discovery id: the source of `<source>#<Name>`, else the part before `:`.
fn namespace(capability_id: &str) -> &str {
    match capability_id.split_once('#') {
        Some((source, _)) => source,
        None => capability_id.split_once(':').map_or("capdex", |(kind, _)| kind),
    }
}

/// Names the candidates as tools: each under its own name, except where two
/// share a name (or one shares a fixed tool's name), then as
/// `<namespace>__<name>`, and where even that collides, with `_2`, `_3`, ...
/// by id order. Names are unique, valid, and independent of the input order
/// (a capability id appears once: later repeats are dropped).
pub fn direct_tools(candidates: &[DirectCandidate]) -> Vec<DirectTool> {
    let mut by_id: BTreeMap<&str, &DirectCandidate> = BTreeMap::new();
    for candidate in candidates {
        by_id.entry(candidate.capability_id.as_str()).or_insert(candidate);
    }
    let mut plain_counts: BTreeMap<String, usize> = BTreeMap::new();
    for candidate in by_id.values() {
        *plain_counts.entry(tool_name(&candidate.name)).or_default() += 1;
    }
    let mut taken: BTreeSet<String> = FIXED_TOOLS.iter().map(|name| name.to_string()).collect();
    // Plain names first, so a namespaced name never takes a plain one's place.
    let mut names: BTreeMap<&str, String> = BTreeMap::new();
    for (id, candidate) in &by_id {
        let plain = tool_name(&candidate.name);
        if plain_counts[&plain] == 1 && !taken.contains(&plain) {
            taken.insert(plain.clone());
            names.insert(id, plain);
        }
    }
    for (id, candidate) in &by_id {
        if names.contains_key(id) {
            continue;
        }
        let base = tool_name(&format!("{}__{}", namespace(id), candidate.name));
        let mut name = base.clone();
        let mut n = 2;
        while taken.contains(&name) {
            let suffix = format!("_{n}");
            let keep = MAX_TOOL_NAME_CHARS.saturating_sub(suffix.len());
            name = format!("{}{suffix}", base.chars().take(keep).collect::<String>());
            n += 1;
        }
        taken.insert(name.clone());
        names.insert(id, name);
    }
    by_id
        .into_iter()
        .map(|(id, candidate)| DirectTool {
            tool_name: names[id].clone(),
            capability_id: id.to_string(),
            dispatch_id: dispatch_id(id),
            description: candidate.description.clone(),
            input_schema: object_schema(candidate.input_schema.as_ref()),
        })
        .collect()
}

/// `schema` when it is a JSON object schema, else an empty object's schema.
fn object_schema(schema: Option<&Value>) -> Value {
    match schema {
        Some(Value::Object(map)) if map.get("type").is_none_or(|kind| kind == "object") => {
            let mut map = map.clone();
            map.insert("type".into(), Value::String("object".into()));
            Value::Object(map)
        }
        _ => serde_json::json!({"type": "object", "properties": {}}),
    }
}

/// The capabilities a session found relevant so far: each id with the best
/// relevance a discovery gave it, and its candidate.
#[derive(Clone, Debug, Default)]
pub struct SessionInterest {
    best: BTreeMap<String, (f32, DirectCandidate)>,
}

impl SessionInterest {
    /// Takes in one discovery's Tier 1 capabilities with their relevance.
    pub fn observe(&mut self, found: impl IntoIterator<Item = (f32, DirectCandidate)>) {
        for (relevance, candidate) in found {
            let relevance = if relevance.is_finite() { relevance.clamp(0.0, 1.0) } else { 0.0 };
            match self.best.get_mut(&candidate.capability_id) {
                Some((best, kept)) => {
                    if relevance > *best {
                        *best = relevance;
                    }
                    *kept = candidate;
                }
                None => {
                    self.best.insert(candidate.capability_id.clone(), (relevance, candidate));
                }
            }
        }
    }

    /// The `limit` most relevant capabilities, best first, ties by id.
    pub fn top(&self, limit: usize) -> Vec<DirectCandidate> {
        let mut ranked: Vec<(&f32, &String, &DirectCandidate)> =
            self.best.iter().map(|(id, (relevance, candidate))| (relevance, id, candidate)).collect();
        ranked.sort_by(|a, b| b.0.total_cmp(a.0).then_with(|| a.1.cmp(b.1)));
        ranked.into_iter().take(limit).map(|(_, _, candidate)| candidate.clone()).collect()
    }
}

/// A `tools/list` cursor that this server did not hand out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid cursor {0:?}")]
pub struct BadCursor(pub String);

/// The page of `total` items that `cursor` starts, [`PAGE_SIZE`] long, and
/// the cursor of the next page when one follows. A cursor is the decimal
/// offset of its page's first item.
pub fn page(total: usize, cursor: Option<&str>) -> Result<(std::ops::Range<usize>, Option<String>), BadCursor> {
    let start = match cursor {
        None => 0,
        Some(text) => match text.parse::<usize>() {
            Ok(start) if start < total && start % PAGE_SIZE == 0 => start,
            _ => return Err(BadCursor(text.to_string())),
        },
    };
    let end = (start + PAGE_SIZE).min(total);
    Ok((start..end, (end < total).then(|| end.to_string())))
}

/// The error frame of a message over [`MAX_MESSAGE_BYTES`] (`-32600`, id null).
pub fn oversized() -> Value {
    rpc_error(Value::Null, -32600, format!("Invalid Request: the message is over {MAX_MESSAGE_BYTES} bytes"))
}

fn rpc_error(id: Value, code: i64, message: String) -> Value {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// The largest JSON-RPC message the face reads from a client, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Checks one message a client sent before the SDK reads it, and answers the
/// JSON-RPC error frame to send instead when the SDK would not answer it as
/// the specification says: text that is not JSON (`-32700`, id null), a
/// message over [`MAX_MESSAGE_BYTES`] (`-32600`), or a `tools/call` whose
/// `arguments` is not an object (`-32602`, with the request's id), or one
/// nested deeper than `max_json_depth` (`limits.max_json_depth`: `-32600`,
/// id null, measured on the raw text before it is parsed).
/// `None`: hand the message to the SDK.
pub fn precheck(message: &str, max_json_depth: usize) -> Option<Value> {
    if message.len() > MAX_MESSAGE_BYTES {
        return Some(oversized());
    }
    let depth = crate::core::limits::json_depth(message.as_bytes());
    if let Err(over) = crate::core::limits::check(crate::core::limits::Limit::JsonDepth, depth, max_json_depth) {
        return Some(rpc_error(Value::Null, -32600, format!("Invalid Request: {over} ({})", over.limit.code())));
    }
    let parsed: Value = match serde_json::from_str(message) {
        Ok(parsed) => parsed,
        Err(err) => return Some(rpc_error(Value::Null, -32700, format!("Parse error: {err}"))),
    };
    let is_call = parsed.get("method").and_then(Value::as_str) == Some("tools/call");
    match parsed.pointer("/params/arguments") {
        Some(arguments) if is_call && !arguments.is_object() && !arguments.is_null() => {
            let id = parsed.get("id").cloned().unwrap_or(Value::Null);
            Some(rpc_error(id, -32602, "Invalid params: tools/call arguments must be an object".into()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn candidate(id: &str, name: &str) -> DirectCandidate {
        DirectCandidate {
            capability_id: id.into(),
            name: name.into(),
            description: format!("{name} things"),
            input_schema: None,
        }
    }

    fn check(candidates: &[DirectCandidate], expect: &[(&str, &str)]) {
        let tools = direct_tools(candidates);
        let got: Vec<(&str, &str)> = tools.iter().map(|t| (t.capability_id.as_str(), t.tool_name.as_str())).collect();
        assert_eq!(got, expect);
    }

    #[test]
    fn names_are_plain_unless_they_collide() {
        check(&[candidate("tool:echo", "echo")], &[("tool:echo", "echo")]);
        check(
            &[candidate("github#create_issue", "create_issue"), candidate("jira#create_issue", "create_issue")],
            &[("github#create_issue", "github__create_issue"), ("jira#create_issue", "jira__create_issue")],
        );
        check(&[candidate("tool:x", "call_capability")], &[("tool:x", "tool__call_capability")]);
        check(&[candidate("tool:x", "send mail!")], &[("tool:x", "send_mail_")]);
        check(
            &[candidate("a#b c", "b c"), candidate("a#b_c", "b_c"), candidate("tool:a__b_c", "a__b_c")],
            &[("a#b c", "a__b_c_2"), ("a#b_c", "a__b_c_3"), ("tool:a__b_c", "a__b_c")],
        );
    }

    #[test]
    fn dispatch_ids_and_schemas() {
        assert_eq!(dispatch_id("tool:"), "tool:");
        assert_eq!(dispatch_id("skill:notes"), "skill:notes");
        let mut with_schema = candidate("tool:echo", "echo");
        with_schema.input_schema = Some(serde_json::json!({"properties": {"text": {"type": "string"}}}));
        let tool = &direct_tools(&[with_schema])[0];
        assert_eq!(tool.dispatch_id, "echo");
        assert_eq!(tool.input_schema["type"], "object");
        assert_eq!(tool.input_schema["properties"]["text"]["type"], "string");
        let mut array = candidate("tool:a", "a");
        array.input_schema = Some(serde_json::json!({"type": "array"}));
        assert_eq!(direct_tools(&[array])[0].input_schema, serde_json::json!({"type": "object", "properties": {}}));
    }

    #[test]
    fn interest_keeps_the_best_relevance_per_capability() {
        let mut interest = SessionInterest::default();
        interest.observe([(0.4, candidate("tool:a", "a")), (0.9, candidate("tool:b", "b"))]);
        interest.observe([
            (0.95, candidate("tool:a", "a")),
            (0.1, candidate("tool:c", "c")),
            (f32::NAN, candidate("tool:d", "d")),
        ]);
        let ids: Vec<String> = interest.top(3).into_iter().map(|c| c.capability_id).collect();
        assert_eq!(ids, ["tool:a", "tool:b", "tool:c"]);
        assert_eq!(interest.top(0), vec![]);
    }

    #[test]
    fn pages_follow_their_cursors() {
        assert_eq!(page(4, None), Ok((0..4, None)));
        assert_eq!(page(0, None), Ok((0..0, None)));
        assert_eq!(page(250, None), Ok((0..100, Some("100".into()))));
        assert_eq!(page(250, Some("200")), Ok((200..250, None)));
        for bad in ["250", "7", "-1", "x", ""] {
            assert_eq!(page(250, Some(bad)), Err(BadCursor(bad.into())), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn direct_names_are_unique_valid_and_order_free(
            pairs in proptest::collection::vec(("[a-c]{1,2}[#:][a-c _]{0,3}", "[a-c _]{0,3}"), 0..12)
        ) {
            let candidates: Vec<DirectCandidate> = pairs.iter().map(|(id, name)| candidate(id, name)).collect();
            let tools = direct_tools(&candidates);
            let names: BTreeSet<&str> = tools.iter().map(|t| t.tool_name.as_str()).collect();
            prop_assert_eq!(names.len(), tools.len());
            for tool in &tools {
                prop_assert!(!FIXED_TOOLS.contains(&tool.tool_name.as_str()));
                prop_assert!(tool.tool_name.len() <= MAX_TOOL_NAME_CHARS);
                prop_assert!(tool.tool_name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)));
            }
            let ids: BTreeSet<&str> = candidates.iter().map(|c| c.capability_id.as_str()).collect();
            prop_assert_eq!(tools.len(), ids.len());
            // Repeated ids keep their first offer, so compare on distinct ids only.
            let mut seen = BTreeSet::new();
            let distinct: Vec<DirectCandidate> =
                candidates.iter().filter(|c| seen.insert(c.capability_id.clone())).cloned().collect();
            let mut shuffled = distinct.clone();
            shuffled.reverse();
            prop_assert_eq!(direct_tools(&distinct), direct_tools(&shuffled));
        }
    }

    #[test]
    fn precheck_answers_what_the_sdk_would_not() {
        assert_eq!(precheck("{nope", 64).map(|frame| frame["error"]["code"].clone()), Some(serde_json::json!(-32700)));
        let bad = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":"str"}}"#;
        let frame = precheck(bad, 64).unwrap();
        assert_eq!(
            (frame["id"].clone(), frame["error"]["code"].clone()),
            (serde_json::json!(7), serde_json::json!(-32602))
        );
        let good = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"x","arguments":{}}}"#;
        assert_eq!(precheck(good, 64), None);
        assert_eq!(precheck(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#, 64), None);
        let huge = format!("{{\"x\":\"{}\"}}", "a".repeat(MAX_MESSAGE_BYTES));
        assert_eq!(precheck(&huge, 64).unwrap()["error"]["code"], -32600);
    }

    #[test]
    fn precheck_refuses_a_message_nested_one_deeper_than_the_limit_naming_the_setting() {
        // The envelope, params and arguments are 3 levels; `extra` arrays add more.
        let nested = |extra: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"x","arguments":{{"a":{}1{}}}}}}}"#,
                "[".repeat(extra),
                "]".repeat(extra)
            )
        };
        for max in [3, 8, 64] {
            assert_eq!(precheck(&nested(max - 3), max), None, "at the limit {max}");
            let frame = precheck(&nested(max - 2), max).expect("one over the limit is refused");
            assert_eq!(frame["error"]["code"], -32600);
            let message = frame["error"]["message"].as_str().unwrap();
            assert!(message.contains("limits.max_json_depth") && message.contains("json_too_deep"), "{message}");
        }
    }
}
