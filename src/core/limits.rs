//! Limits on everything that comes from outside (`[limits]` in `config/capdex.toml`):
//! nesting depth of JSON and msgpack bodies and of YAML documents, YAML
//! aliases, tools per source, operations per spec, `$ref` hops in a chain, the
//! bytes of an id, the capabilities one task outcome lists. Each refusal is a [`LimitExceeded`] naming its setting.
//! Payload sizes are `[nats] max_payload_bytes` and the scanner's
//! `max_manifest_bytes`; the grammar of an id that becomes a subject token is
//! `subject_token`'s, its length `max_id_bytes`. A `$ref`
//! chain that comes back on itself ends where it repeats (the mappers treat it
//! as an empty schema).
//!
//! The scanners read the raw bytes before any parser sees them, without
//! recursion, so a document too deep for a recursive parser is refused first.

use serde::Serialize;

/// The limits, each a `[limits]` setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Deepest nesting of arrays and objects in a JSON or msgpack body or document.
    pub max_json_depth: usize,
    /// Deepest nesting of a YAML document (manifests, SKILL.md front matter, OpenAPI YAML).
    pub max_yaml_depth: usize,
    /// Most aliases (`*name`) one YAML document may use.
    pub max_yaml_aliases: usize,
    /// Most tools one source offers (an MCP tool list, a registration's tools).
    pub max_tools_per_source: usize,
    /// Most operations one OpenAPI document offers.
    pub max_operations_per_spec: usize,
    /// Most `$ref` hops one chain in an OpenAPI document or MCP tool list
    /// takes (a `$ref` to a schema that is itself a `$ref`, and so on).
    pub max_ref_hops: usize,
    /// Longest id from outside, in bytes: every id that becomes a NATS subject
    /// token or a store key (agent, approval, runtime, organisation and persona
    /// ids, a capability's slug or source id, execution and step ids, the
    /// names a registration gives its capabilities).
    pub max_id_bytes: usize,
    /// Most capability ids one task outcome may list (`capabilities`).
    pub max_capabilities_per_outcome: usize,
    /// Most capability ids one discover, plan or search request may exclude
    /// (`excludedCapabilityIds`).
    pub max_excluded_capabilities: usize,
    /// Most pages of `tools/list` followed from one MCP source (a server that
    /// always answers a next cursor is cut there).
    pub max_tool_pages: usize,
    /// Most anchors one memory deposit names (`capdex.v1.memory.deposit`).
    pub max_anchors: usize,
}

/// The range `max_id_bytes` may take. At most 256: an id is one token of a
/// subject that also holds the prefix and an operation, and one part of a
/// store key, so ids stay short beside the server's payload and the store's
/// page. At least 64: the ids with a grammar of their own (a registered slug,
/// an OpenAI function name; a live source's id) are up to 64 bytes, and a
/// smaller setting would refuse at one edge what another accepted.
pub const MAX_ID_BYTES_RANGE: std::ops::RangeInclusive<usize> = 64..=256;

/// The longest tool name a source may give, in bytes (the MCP mapper's and a
/// live source's limit).
pub const MAX_TOOL_NAME_BYTES: usize = 256;

/// The longest capability id from outside, in bytes, given `max_id_bytes`: a
/// source capability id is a source id (at most `max_id_bytes`), `#` and a
/// tool name (at most [`MAX_TOOL_NAME_BYTES`]); every other capability id (a
/// slug, `tool:<name>`) is shorter.
pub fn max_capability_id_bytes(max_id_bytes: usize) -> usize {
    max_id_bytes + 1 + MAX_TOOL_NAME_BYTES
}

/// `None` when `capability_id` is at most [`max_capability_id_bytes`] long,
/// else how its refusal reads after its field (naming `limits.max_id_bytes`).
pub fn capability_id_too_long(capability_id: &str, max_id_bytes: usize) -> Option<String> {
    let max = max_capability_id_bytes(max_id_bytes);
    (capability_id.len() > max).then(|| {
        format!(
            "is {} bytes, over limits.max_id_bytes: a capability id is at most {max} (a source id of at most \
             limits.max_id_bytes ({max_id_bytes}), '#', a tool name of at most {MAX_TOOL_NAME_BYTES} bytes)",
            capability_id.len()
        )
    })
}

/// The default depth of JSON and YAML nesting (serde_json refuses at 128 on its own).
pub const DEFAULT_MAX_DEPTH: usize = 64;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_json_depth: DEFAULT_MAX_DEPTH,
            max_yaml_depth: DEFAULT_MAX_DEPTH,
            max_yaml_aliases: 64,
            max_tools_per_source: 5_000,
            max_operations_per_spec: 5_000,
            max_ref_hops: 16,
            max_id_bytes: 128,
            max_capabilities_per_outcome: 256,
            max_excluded_capabilities: 256,
            max_tool_pages: 100,
            max_anchors: 8,
        }
    }
}

/// Which limit a refusal is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    JsonDepth,
    YamlDepth,
    YamlAliases,
    ToolsPerSource,
    OperationsPerSpec,
    RefHops,
    IdBytes,
    CapabilitiesPerOutcome,
    ExcludedCapabilities,
    ToolPages,
}

impl Limit {
    /// The setting, as written in the config.
    pub fn setting(self) -> &'static str {
        match self {
            Limit::JsonDepth => "limits.max_json_depth",
            Limit::YamlDepth => "limits.max_yaml_depth",
            Limit::YamlAliases => "limits.max_yaml_aliases",
            Limit::ToolsPerSource => "limits.max_tools_per_source",
            Limit::OperationsPerSpec => "limits.max_operations_per_spec",
            Limit::RefHops => "limits.max_ref_hops",
            Limit::IdBytes => "limits.max_id_bytes",
            Limit::CapabilitiesPerOutcome => "limits.max_capabilities_per_outcome",
            Limit::ExcludedCapabilities => "limits.max_excluded_capabilities",
            Limit::ToolPages => "limits.max_tool_pages",
        }
    }

    /// The error code of a refusal (413 on NATS).
    pub fn code(self) -> &'static str {
        match self {
            Limit::JsonDepth => "json_too_deep",
            Limit::YamlDepth => "yaml_too_deep",
            Limit::YamlAliases => "too_many_yaml_aliases",
            Limit::ToolsPerSource => "too_many_tools",
            Limit::OperationsPerSpec => "too_many_operations",
            Limit::RefHops => "ref_chain_too_long",
            Limit::IdBytes => "id_too_long",
            Limit::CapabilitiesPerOutcome => "too_many_capabilities",
            Limit::ExcludedCapabilities => "too_many_excluded",
            Limit::ToolPages => "too_many_pages",
        }
    }
}

/// A refusal: `found` is over the `max` of `limit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{found} is over {}: at most {max}", .limit.setting())]
pub struct LimitExceeded {
    pub limit: Limit,
    pub found: usize,
    pub max: usize,
}

/// How a refusal of too many items reads after its field:
/// `lists 257 ids, over limits.max_capabilities_per_outcome: at most 256` reads
/// `257 ids, over ...` here, `what` being `ids`.
pub fn too_many_text(exceeded: &LimitExceeded, what: &str) -> String {
    format!("{} {what}, over {}: at most {}", exceeded.found, exceeded.limit.setting(), exceeded.max)
}

/// `Ok` when `found` is at most `max`, else the refusal naming `limit`.
pub fn check(limit: Limit, found: usize, max: usize) -> Result<(), LimitExceeded> {
    if found > max {
        Err(LimitExceeded { limit, found, max })
    } else {
        Ok(())
    }
}

/// The deepest nesting of arrays and objects in JSON text (strings skipped,
/// escapes honoured); malformed text is measured as far as it goes.
pub fn json_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &byte in bytes {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Checks a JSON text's nesting against `limits.max_json_depth`.
pub fn check_json(bytes: &[u8], limits: &Limits) -> Result<(), LimitExceeded> {
    check(Limit::JsonDepth, json_depth(bytes), limits.max_json_depth)
}

/// The deepest nesting of arrays and maps in the first msgpack value of
/// `bytes`; a truncated or malformed value is measured as far as it goes.
pub fn msgpack_depth(bytes: &[u8]) -> usize {
    // The items each open container still holds, innermost last.
    let mut open: Vec<u64> = Vec::new();
    let mut deepest = 0usize;
    let mut at = 0usize;
    let read = |at: usize, width: usize| -> Option<u64> {
        let slice = bytes.get(at..at + width)?;
        Some(slice.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b)))
    };
    while let Some(&marker) = bytes.get(at) {
        at += 1;
        // (bytes to skip, items of a container that opens here)
        let (skip, items): (u64, Option<u64>) = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, None),
            0x80..=0x8f => (0, Some(2 * u64::from(marker & 0x0f))),
            0x90..=0x9f => (0, Some(u64::from(marker & 0x0f))),
            0xa0..=0xbf => (u64::from(marker & 0x1f), None),
            0xc4 | 0xd9 => (read(at, 1).map_or(u64::MAX, |n| 1 + n), None),
            0xc5 | 0xda => (read(at, 2).map_or(u64::MAX, |n| 2 + n), None),
            0xc6 | 0xdb => (read(at, 4).map_or(u64::MAX, |n| 4 + n), None),
            0xc7 => (read(at, 1).map_or(u64::MAX, |n| 2 + n), None),
            0xc8 => (read(at, 2).map_or(u64::MAX, |n| 3 + n), None),
            0xc9 => (read(at, 4).map_or(u64::MAX, |n| 5 + n), None),
            0xca => (4, None),
            0xcb => (8, None),
            0xcc | 0xd0 => (1, None),
            0xcd | 0xd1 => (2, None),
            0xce | 0xd2 => (4, None),
            0xcf | 0xd3 => (8, None),
            0xd4 => (2, None),
            0xd5 => (3, None),
            0xd6 => (5, None),
            0xd7 => (9, None),
            0xd8 => (17, None),
            0xdc => (2, read(at, 2)),
            0xdd => (4, read(at, 4)),
            0xde => (2, read(at, 2).map(|n| 2 * n)),
            0xdf => (4, read(at, 4).map(|n| 2 * n)),
            0xc1 => return deepest, // never used: malformed, the decoder refuses it
        };
        at = at.saturating_add(usize::try_from(skip).unwrap_or(usize::MAX));
        match items {
            Some(n) if n > 0 => {
                open.push(n);
                deepest = deepest.max(open.len());
                continue;
            }
            Some(_) => deepest = deepest.max(open.len() + 1),
            None if matches!(marker, 0xdc..=0xdf) => return deepest, // truncated length
            None => {}
        }
        // One item is complete: close every container it completes.
        loop {
            match open.last_mut() {
                None => return deepest,
                Some(left) => {
                    *left -= 1;
                    if *left > 0 {
                        break;
                    }
                    open.pop();
                }
            }
        }
    }
    deepest
}

/// Checks a msgpack body's nesting against `limits.max_json_depth`.
pub fn check_msgpack(bytes: &[u8], limits: &Limits) -> Result<(), LimitExceeded> {
    check(Limit::JsonDepth, msgpack_depth(bytes), limits.max_json_depth)
}

/// The aliases (`*name` where a value starts) a YAML text uses, outside quotes and comments.
pub fn yaml_aliases(text: &str) -> usize {
    let mut aliases = 0;
    for line in text.lines() {
        let (mut quote, mut previous) = (None::<char>, ' ');
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match quote {
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == '#' && previous.is_whitespace() => break,
                None if (c == '"' || c == '\'') && matches!(previous, ' ' | '\t' | '[' | '{' | ',' | ':' | '-') => {
                    quote = Some(c)
                }
                None if c == '*'
                    && matches!(previous, ' ' | '\t' | '[' | '{' | ',')
                    && chars.peek().is_some_and(|next| !next.is_whitespace() && !matches!(next, ',' | ']' | '}')) =>
                {
                    aliases += 1
                }
                None => {}
            }
            previous = c;
        }
    }
    aliases
}

/// The deepest nesting of arrays and objects in a parsed document, without recursion.
pub fn value_depth(value: &serde_json::Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((value, depth)) = stack.pop() {
        match value {
            serde_json::Value::Array(items) => {
                deepest = deepest.max(depth);
                stack.extend(items.iter().map(|item| (item, depth + 1)));
            }
            serde_json::Value::Object(map) => {
                deepest = deepest.max(depth);
                stack.extend(map.values().map(|item| (item, depth + 1)));
            }
            _ => {}
        }
    }
    deepest
}

/// Checks a YAML text's aliases before it is parsed.
pub fn check_yaml_text(text: &str, limits: &Limits) -> Result<(), LimitExceeded> {
    check(Limit::YamlAliases, yaml_aliases(text), limits.max_yaml_aliases)
}

/// Checks a parsed YAML document's nesting.
pub fn check_yaml_value(value: &serde_json::Value, limits: &Limits) -> Result<(), LimitExceeded> {
    check(Limit::YamlDepth, value_depth(value), limits.max_yaml_depth)
}

/// Parses YAML text into a value within `limits`: its aliases are counted
/// before parsing, its depth measured after.
pub fn parse_yaml(text: &str, limits: &Limits) -> Result<serde_json::Value, YamlRefusal> {
    check_yaml_text(text, limits).map_err(YamlRefusal::Limit)?;
    let value: serde_json::Value = serde_norway::from_str(text).map_err(|err| YamlRefusal::Syntax(err.to_string()))?;
    check_yaml_value(&value, limits).map_err(YamlRefusal::Limit)?;
    Ok(value)
}

/// Why a YAML text was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum YamlRefusal {
    #[error("{0}")]
    Limit(LimitExceeded),
    #[error("{0}")]
    Syntax(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nested_json(depth: usize) -> String {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn json_depth_is_refused_above_its_limit_only() {
        let limits = Limits::default();
        let max = limits.max_json_depth;
        assert_eq!(check_json(nested_json(max).as_bytes(), &limits), Ok(()));
        assert_eq!(
            check_json(nested_json(max + 1).as_bytes(), &limits),
            Err(LimitExceeded { limit: Limit::JsonDepth, found: max + 1, max })
        );
        assert_eq!(json_depth(br#"{"a": "[[[[{{{", "b": [{"c": "\"]["}]}"#), 3, "strings do not count");
        assert_eq!(json_depth(b"[[[[[["), 6, "a truncated text is measured as far as it goes");
        let err = check_json(nested_json(max + 1).as_bytes(), &limits).unwrap_err();
        assert_eq!(err.to_string(), format!("{} is over limits.max_json_depth: at most {max}", max + 1));
        assert_eq!(err.limit.code(), "json_too_deep");
    }

    #[test]
    fn msgpack_depth_matches_the_encoded_value() {
        let limits = Limits::default();
        let max = limits.max_json_depth;
        let nested = |depth: usize| {
            let value: serde_json::Value = serde_json::from_str(&nested_json(depth)).unwrap();
            rmp_serde::to_vec_named(&value).unwrap()
        };
        assert_eq!(check_msgpack(&nested(max), &limits), Ok(()));
        assert_eq!(
            check_msgpack(&nested(max + 1), &limits),
            Err(LimitExceeded { limit: Limit::JsonDepth, found: max + 1, max })
        );
        let value = serde_json::json!({"a": [1, "x", {"b": [], "c": {}}], "d": -5, "e": 1.5, "f": null});
        assert_eq!(msgpack_depth(&rmp_serde::to_vec_named(&value).unwrap()), value_depth(&value));
        assert_eq!(msgpack_depth(&[0xdd, 0xff, 0xff, 0xff, 0xff]), 1, "a huge declared array is one level");
        assert_eq!(msgpack_depth(&[0xc1]), 0);
    }

    #[test]
    fn yaml_aliases_and_depth_are_refused_above_their_limits_only() {
        let limits = Limits { max_yaml_aliases: 3, max_yaml_depth: 3, ..Limits::default() };
        let aliases = |n: usize| {
            let refs: Vec<String> = (0..n).map(|i| format!("k{i}: *a")).collect();
            format!("base: &a [1, 2]\n{}\n", refs.join("\n"))
        };
        assert!(parse_yaml(&aliases(3), &limits).is_ok());
        assert_eq!(
            parse_yaml(&aliases(4), &limits),
            Err(YamlRefusal::Limit(LimitExceeded { limit: Limit::YamlAliases, found: 4, max: 3 }))
        );
        assert_eq!(yaml_aliases("a: '*not'\nb: \"*no\" # *comment\nc: 2*3\nd: [*x, *y]\n"), 2);
        assert!(parse_yaml("a:\n  b: [1]\n", &limits).is_ok(), "depth 3");
        assert_eq!(
            parse_yaml("a:\n  b:\n    c: [1]\n", &limits),
            Err(YamlRefusal::Limit(LimitExceeded { limit: Limit::YamlDepth, found: 4, max: 3 }))
        );
        assert!(matches!(parse_yaml("a: [", &limits), Err(YamlRefusal::Syntax(_))));
    }

    #[test]
    fn a_capability_id_is_a_source_id_a_hash_and_a_tool_name_at_their_longest() {
        for max_id_bytes in [MAX_ID_BYTES_RANGE.start().to_owned(), 128, MAX_ID_BYTES_RANGE.end().to_owned()] {
            let longest = format!("{}#{}", "s".repeat(max_id_bytes), "n".repeat(MAX_TOOL_NAME_BYTES));
            assert_eq!(longest.len(), max_capability_id_bytes(max_id_bytes));
            assert_eq!(capability_id_too_long(&longest, max_id_bytes), None);
            let text = capability_id_too_long(&format!("{longest}n"), max_id_bytes).unwrap();
            assert!(text.starts_with(&format!("is {} bytes, over limits.max_id_bytes", longest.len() + 1)), "{text}");
        }
    }

    #[test]
    fn counts_are_refused_above_their_limit_only() {
        for limit in [
            Limit::YamlAliases,
            Limit::ToolsPerSource,
            Limit::OperationsPerSpec,
            Limit::IdBytes,
            Limit::CapabilitiesPerOutcome,
        ] {
            assert_eq!(check(limit, 10, 10), Ok(()));
            let err = check(limit, 11, 10).unwrap_err();
            assert!(err.to_string().contains(limit.setting()), "{err}");
        }
    }

    proptest! {
        #[test]
        fn the_scanners_agree_with_the_parsers(value in arbitrary_value()) {
            let json = serde_json::to_vec(&value).unwrap();
            prop_assert_eq!(json_depth(&json), value_depth(&value));
            prop_assert_eq!(msgpack_depth(&rmp_serde::to_vec_named(&value).unwrap()), value_depth(&value));
        }

        #[test]
        fn the_scanners_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = json_depth(&bytes);
            let _ = msgpack_depth(&bytes);
            let _ = yaml_aliases(&String::from_utf8_lossy(&bytes));
        }
    }

    fn arbitrary_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "[a-z\\[\\]{}\"\\\\]{0,8}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(6, 64, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                proptest::collection::btree_map("[a-z]{1,4}", inner, 0..6)
                    .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
            ]
        })
    }
}
