//! CAPABILITY.yaml manifests: parsing and validation into descriptors.
//!
//! Parsing never panics and never fails silently: a manifest either yields a
//! [`ManifestDraft`] or a [`ManifestProblem`] naming the field and what is wrong
//! with it. Reading the folder (and the files a manifest points at) is the
//! scanner's job; this module only judges text and paths.

use crate::core::compact_json::CompactJson;
use crate::core::descriptor::{display_name_from, CapabilityDescriptor, CapabilityKind, DefinitionRef};
use serde_json::{Map, Value};
use std::collections::HashMap;

/// The largest manifest capdex reads, in bytes.
pub const MAX_MANIFEST_BYTES: u64 = 256 * 1024;
/// The largest SKILL.md or schema.json capdex reads, in bytes.
pub const MAX_ATTACHMENT_BYTES: u64 = 1024 * 1024;

/// Size limits for the files a scan of capability folders reads (the
/// top-level `max_manifest_bytes` and `max_attachment_bytes` settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanLimits {
    pub max_manifest_bytes: u64,
    pub max_attachment_bytes: u64,
    /// YAML aliases and depth of a manifest (`[limits]`).
    pub text: crate::core::limits::Limits,
}

impl Default for ScanLimits {
    fn default() -> Self {
        ScanLimits {
            max_manifest_bytes: MAX_MANIFEST_BYTES,
            max_attachment_bytes: MAX_ATTACHMENT_BYTES,
            text: crate::core::limits::Limits::default(),
        }
    }
}

/// Why a manifest was refused: the field at fault and the problem with it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestProblem {
    pub field: String,
    pub problem: String,
}

impl ManifestProblem {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> ManifestProblem {
        ManifestProblem { field: field.into(), problem: problem.into() }
    }
}

/// A manifest that parsed and validated, still waiting for its attachments.
#[derive(Clone, Debug, PartialEq)]
pub struct ManifestDraft {
    pub id: String,
    pub kind: CapabilityKind,
    pub name: String,
    pub display_name: String,
    pub description: String,
    pub category: String,
    pub tags: Vec<String>,
    pub required_secrets: Vec<String>,
    pub required_tools: Vec<String>,
    pub has_side_effects: Option<bool>,
    pub available: bool,
    pub input_schema: Option<Value>,
    pub skill_content: Option<String>,
    /// The file named by `skillContent`, relative to the capability folder.
    pub skill_content_path: Option<String>,
}

impl ManifestDraft {
    /// Completes the draft with what the scanner read beside it.
    ///
    /// `skill_file` is the text of the file named by `skillContent` (or of a
    /// plain `SKILL.md`), `schema_file` the parsed `schema.json`. Inline values
    /// in the manifest win over files, as the design says.
    pub fn into_descriptor(
        self,
        manifest_path: &str,
        skill_file: Option<String>,
        schema_file: Option<Value>,
    ) -> CapabilityDescriptor {
        CapabilityDescriptor {
            id: self.id,
            kind: self.kind,
            name: self.name,
            display_name: self.display_name,
            description: self.description,
            category: self.category,
            tags: self.tags,
            required_secrets: self.required_secrets,
            required_tools: self.required_tools,
            available: self.available,
            has_side_effects: self.has_side_effects,
            full_schema: self.input_schema.or(schema_file).map(CompactJson::from),
            // A SKILL.md's front matter is metadata the manifest already carries: Tier 2 shows the body.
            full_content: self
                .skill_content
                .or(skill_file.and_then(|text| crate::core::registration::split_front_matter(&text).1)),
            definition_ref: DefinitionRef::Manifest { manifest_path: manifest_path.to_string() },
        }
    }
}

/// Parses and validates the text of a CAPABILITY.yaml.
///
/// # Examples
/// ```
/// use capdex::core::manifest::parse;
/// let draft = parse("name: echo\nkind: tool\ndescription: Echoes text\n").unwrap();
/// assert_eq!(draft.id, "tool:echo");
/// assert_eq!(draft.category, "custom");
/// assert_eq!(parse("name: echo\nkind: tool\n").unwrap_err().field, "description");
/// ```
pub fn parse(text: &str) -> Result<ManifestDraft, ManifestProblem> {
    parse_limited(text, &crate::core::limits::Limits::default())
}

/// [`parse`] within `limits` (YAML aliases and depth): over one, the problem names its setting.
pub fn parse_limited(text: &str, limits: &crate::core::limits::Limits) -> Result<ManifestDraft, ManifestProblem> {
    use crate::core::limits::{parse_yaml, YamlRefusal};
    let value: Value = parse_yaml(text, limits).map_err(|refusal| match refusal {
        YamlRefusal::Limit(exceeded) => ManifestProblem::new("(document)", exceeded.to_string()),
        YamlRefusal::Syntax(err) => ManifestProblem::new("(document)", format!("not valid YAML: {err}")),
    })?;
    let map = match value {
        Value::Object(map) => map,
        Value::Null => return Err(ManifestProblem::new("(document)", "the manifest is empty")),
        _ => return Err(ManifestProblem::new("(document)", "the manifest is not a mapping of fields")),
    };
    draft_from_map(&map)
}

fn draft_from_map(map: &Map<String, Value>) -> Result<ManifestDraft, ManifestProblem> {
    let name = required_string(map, "name")?;
    let kind_text = required_string(map, "kind")?;
    let description = required_string(map, "description")?;
    let kind = CapabilityKind::parse(&kind_text).ok_or_else(|| {
        let known: Vec<&str> = CapabilityKind::ALL.iter().map(|kind| kind.as_str()).collect();
        ManifestProblem::new("kind", format!("unknown kind {kind_text:?}; expected one of {}", known.join(", ")))
    })?;
    let id = optional_string(map, "id")?.unwrap_or_else(|| format!("{kind}:{name}"));
    let display_name = optional_string(map, "displayName")?.unwrap_or_else(|| {
        if kind == CapabilityKind::Skill {
            display_name_from(&name)
        } else {
            name.clone()
        }
    });
    let category = if kind == CapabilityKind::Channel {
        "communication".to_string()
    } else {
        optional_string(map, "category")?.unwrap_or_else(|| "custom".to_string())
    };
    let input_schema = match map.get("inputSchema") {
        None | Some(Value::Null) => None,
        Some(schema @ Value::Object(_)) => Some(schema.clone()),
        Some(_) => return Err(ManifestProblem::new("inputSchema", "must be a JSON object")),
    };
    let (skill_content, skill_content_path) = match map.get("skillContent") {
        None => (None, None),
        Some(Value::String(text)) if looks_like_path(text) => {
            let path =
                resolve_skill_content_path(text).map_err(|problem| ManifestProblem::new("skillContent", problem))?;
            (None, Some(path))
        }
        Some(Value::String(text)) if !text.trim().is_empty() => (Some(text.clone()), None),
        Some(other) => {
            return Err(ManifestProblem::new(
                "skillContent",
                format!("must name a file in the capability folder, got {}", describe(other)),
            ))
        }
    };
    Ok(ManifestDraft {
        id,
        kind,
        name,
        display_name,
        description,
        category,
        tags: string_list(map, "tags")?,
        required_secrets: string_list(map, "requiredSecrets")?,
        required_tools: string_list(map, "requiredTools")?,
        has_side_effects: optional_bool(map, "hasSideEffects")?,
        available: optional_bool(map, "available")?.unwrap_or(true),
        input_schema,
        skill_content,
        skill_content_path,
    })
}

/// Checks a `skillContent` value and returns the relative path it names.
///
/// The path is joined by `/` after an optional leading `./`; no segment may be
/// empty, `.`, `..` or start with a dot, and absolute paths are refused.
pub fn resolve_skill_content_path(text: &str) -> Result<String, String> {
    let trimmed = text.trim();
    let relative = trimmed.strip_prefix("./").unwrap_or(trimmed);
    if relative.is_empty() {
        return Err("names no file".to_string());
    }
    if relative.starts_with('/') || relative.contains('\\') {
        return Err(format!("{trimmed:?} is not a relative path inside the capability folder"));
    }
    for segment in relative.split('/') {
        if segment.is_empty() || segment.starts_with('.') {
            return Err(format!("{trimmed:?} has a segment that is empty or starts with a dot"));
        }
    }
    Ok(relative.to_string())
}

/// A `skillContent` value names a file when it is one line ending in a file extension.
fn looks_like_path(text: &str) -> bool {
    let trimmed = text.trim();
    !trimmed.contains('\n')
        && !trimmed.contains(' ')
        && (trimmed.starts_with("./") || trimmed.starts_with('/') || trimmed.contains('.'))
}

fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "no value",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "an empty string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn required_string(map: &Map<String, Value>, field: &str) -> Result<String, ManifestProblem> {
    optional_string(map, field)?.ok_or_else(|| ManifestProblem::new(field, "is required"))
}

fn optional_string(map: &Map<String, Value>, field: &str) -> Result<Option<String>, ManifestProblem> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if text.trim().is_empty() => Err(ManifestProblem::new(field, "is empty")),
        Some(Value::String(text)) => Ok(Some(text.trim().to_string())),
        Some(Value::Number(number)) => Ok(Some(number.to_string())),
        Some(other) => Err(ManifestProblem::new(field, format!("must be text, got {}", describe(other)))),
    }
}

fn optional_bool(map: &Map<String, Value>, field: &str) -> Result<Option<bool>, ManifestProblem> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(flag)) => Ok(Some(*flag)),
        Some(other) => Err(ManifestProblem::new(field, format!("must be true or false, got {}", describe(other)))),
    }
}

fn string_list(map: &Map<String, Value>, field: &str) -> Result<Vec<String>, ManifestProblem> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(text)) if !text.trim().is_empty() => Ok(vec![text.trim().to_string()]),
        Some(Value::Array(items)) => {
            let mut out: Vec<String> = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::String(text) if !text.trim().is_empty() => {
                        let text = text.trim().to_string();
                        if !out.contains(&text) {
                            out.push(text);
                        }
                    }
                    other => {
                        return Err(ManifestProblem::new(
                            field,
                            format!("must be a list of non-empty text, found {}", describe(other)),
                        ))
                    }
                }
            }
            Ok(out)
        }
        Some(other) => Err(ManifestProblem::new(field, format!("must be a list, got {}", describe(other)))),
    }
}

/// What a scan offers the index, and what it remembers for the next scan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LastGood {
    /// The descriptors to offer: those found, plus the last good one of each manifest now refused.
    pub offered: Vec<CapabilityDescriptor>,
    /// The last valid descriptor of each manifest path, for the next scan.
    pub by_path: HashMap<String, CapabilityDescriptor>,
}

/// Keeps a manifest that turned invalid indexed with its last valid descriptor
/// (`previous`, by manifest path) until it is fixed or deleted; `refused_paths`
/// are the manifest paths this scan refused. A deleted manifest is forgotten.
pub fn keep_last_good<'a>(
    found: &[CapabilityDescriptor],
    refused_paths: impl IntoIterator<Item = &'a str>,
    previous: &HashMap<String, CapabilityDescriptor>,
) -> LastGood {
    let mut offered = found.to_vec();
    let mut by_path = HashMap::new();
    for descriptor in found {
        if let DefinitionRef::Manifest { manifest_path } = &descriptor.definition_ref {
            by_path.insert(manifest_path.clone(), descriptor.clone());
        }
    }
    for path in refused_paths {
        if let Some(kept) = previous.get(path) {
            if !offered.iter().any(|d| d.id == kept.id) {
                offered.push(kept.clone());
                by_path.insert(path.to_string(), kept.clone());
            }
        }
    }
    LastGood { offered, by_path }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_manifest(name: &str, path: &str) -> CapabilityDescriptor {
        let mut descriptor = crate::core::descriptor::test_tool(name, "does a thing");
        descriptor.definition_ref = DefinitionRef::Manifest { manifest_path: path.into() };
        descriptor
    }

    #[test]
    fn yaml_aliases_and_depth_are_refused_above_their_limits_naming_the_setting() {
        use crate::core::limits::Limits;
        let limits = Limits { max_yaml_aliases: 2, max_yaml_depth: 2, ..Limits::default() };
        let with_aliases = |n: usize| {
            let tags: Vec<&str> = std::iter::repeat_n("*t", n).collect();
            format!("name: echo\nkind: tool\ndescription: &t Echoes text\ntags: [{}]\n", tags.join(", "))
        };
        assert!(parse_limited(&with_aliases(2), &limits).is_ok());
        let refused = parse_limited(&with_aliases(3), &limits).unwrap_err();
        assert_eq!(refused.field, "(document)");
        assert!(refused.problem.contains("limits.max_yaml_aliases"), "{refused:?}");
        let nested = "name: echo\nkind: tool\ndescription: Echoes\nmetadata: {a: 1}\n";
        assert!(parse_limited(nested, &limits).is_ok(), "depth 2");
        let deeper = "name: echo\nkind: tool\ndescription: Echoes\nmetadata: {a: [1]}\n";
        let refused = parse_limited(deeper, &limits).unwrap_err();
        assert!(refused.problem.contains("limits.max_yaml_depth"), "{refused:?}");
    }

    #[test]
    fn a_refused_manifest_keeps_its_last_good_descriptor_and_a_deleted_one_is_forgotten() {
        let gauge = from_manifest("gauge", "/c/gauge/CAPABILITY.yaml");
        let meter = from_manifest("meter", "/c/meter/CAPABILITY.yaml");
        let first = keep_last_good(&[gauge.clone(), meter.clone()], [], &HashMap::new());
        assert_eq!(first.offered, [gauge.clone(), meter.clone()]);
        assert_eq!(first.by_path.len(), 2);
        // gauge turns invalid: still offered as it was; meter is deleted: gone.
        let second = keep_last_good(&[], ["/c/gauge/CAPABILITY.yaml"], &first.by_path);
        assert_eq!(second.offered, std::slice::from_ref(&gauge));
        assert_eq!(second.by_path.keys().collect::<Vec<_>>(), ["/c/gauge/CAPABILITY.yaml"]);
        // A refused path never read valid offers nothing; a valid twin's id is not offered twice.
        let third = keep_last_good(
            std::slice::from_ref(&gauge),
            ["/c/new/CAPABILITY.yaml", "/c/gauge/CAPABILITY.yaml"],
            &second.by_path,
        );
        assert_eq!(third.offered, [gauge]);
    }

    fn refused(text: &str) -> (String, String) {
        let problem = parse(text).unwrap_err();
        (problem.field, problem.problem)
    }

    #[test]
    fn full_manifest_parses() {
        let text = r#"
id: tool:my-custom-tool
kind: tool
name: my-custom-tool
displayName: My Custom Tool
description: Searches a proprietary API for internal documents
category: information
tags: [search, internal, documents]
requiredSecrets: [INTERNAL_API_KEY]
hasSideEffects: false
inputSchema: {"type": "object", "properties": {"query": {"type": "string"}}}
skillContent: ./SKILL.md
"#;
        let draft = parse(text).unwrap();
        assert_eq!(draft.id, "tool:my-custom-tool");
        assert_eq!(draft.tags, vec!["search", "internal", "documents"]);
        assert_eq!(draft.has_side_effects, Some(false));
        assert_eq!(draft.skill_content_path.as_deref(), Some("SKILL.md"));
        assert!(draft.input_schema.unwrap()["properties"]["query"].is_object());
    }

    #[test]
    fn block_lists_and_defaults() {
        let draft = parse("name: notes\nkind: skill\ndescription: d\ntags:\n  - a\n  - b\n").unwrap();
        assert_eq!(draft.tags, vec!["a", "b"]);
        assert_eq!(draft.display_name, "Notes");
        assert_eq!(draft.category, "custom");
        let channel = parse("name: telegram\nkind: channel\ndescription: d\ncategory: chat\n").unwrap();
        assert_eq!(channel.category, "communication");
    }

    #[test]
    fn refusals_name_the_field() {
        assert_eq!(refused("kind: tool\ndescription: d\n").0, "name");
        assert_eq!(refused("name: x\ndescription: d\n").0, "kind");
        assert_eq!(refused("name: x\nkind: gadget\ndescription: d\n").0, "kind");
        assert_eq!(refused("name: x\nkind: tool\ndescription: \"\"\n").0, "description");
        assert_eq!(refused("name: x\nkind: tool\ndescription: d\ntags: {a: 1}\n").0, "tags");
        assert_eq!(refused("name: x\nkind: tool\ndescription: d\nhasSideEffects: maybe\n").0, "hasSideEffects");
        assert_eq!(refused("name: x\nkind: tool\ndescription: d\ninputSchema: [1]\n").0, "inputSchema");
        assert_eq!(refused("- a\n- b\n").0, "(document)");
        assert_eq!(refused("").0, "(document)");
        assert_eq!(refused("name: [unclosed\n").0, "(document)");
    }

    #[test]
    fn skill_content_must_stay_in_the_folder() {
        for bad in ["../secret.md", "./../x.md", "/etc/passwd", "a/../b.md", ".hidden.md", "a//b.md"] {
            let text = format!("name: x\nkind: skill\ndescription: d\nskillContent: {bad}\n");
            assert_eq!(refused(&text).0, "skillContent", "{bad}");
        }
        for bad in
            ["skillContent: null", "skillContent:", "skillContent: false", "skillContent: 3", "skillContent: \"\""]
        {
            let text = format!("name: x\nkind: skill\ndescription: d\n{bad}\n");
            assert_eq!(refused(&text).0, "skillContent", "{bad}");
        }
        let ok = parse("name: x\nkind: skill\ndescription: d\nskillContent: docs/SKILL.md\n").unwrap();
        assert_eq!(ok.skill_content_path.as_deref(), Some("docs/SKILL.md"));
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(text in "\\PC{0,200}") {
            let _ = parse(&text);
        }
    }
}
