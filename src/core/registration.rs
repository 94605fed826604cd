//! Source normalisation: runtime registrations (`{tools, skills, extensions,
//! channels, presets}`) and catalog arrays become [`CapabilityDescriptor`]s,
//! item by item, with a diagnostic for every item that cannot be used.
//!
//! The rules are the design's:
//!
//! | source | id | displayName | category | tags | available | Tier 2 |
//! |---|---|---|---|---|---|---|
//! | tool | `tool:{name}` | as given, else the name | as given, else `general` | as given | true | `fullSchema` = `inputSchema` |
//! | skill | `skill:{name}` | name segments capitalised | as given, else front matter, else `general` | as given, else front matter | true | `fullContent` = SKILL.md body |
//! | extension | `extension:{name}` | as given, else the name | as given, else `general` | as given | `available`, else false | — |
//! | channel | `channel:{platform}` | as given, else the platform | always `communication` | its `capabilities` | true | — |
//!
//! A skill's content may open with YAML front matter (`---` … `---`): fields the
//! registration leaves out (description, category, tags, required tools and
//! secrets) are taken from it, and the body after it becomes `fullContent`.

use crate::core::compact_json::CompactJson;
use crate::core::descriptor::{display_name_from, CapabilityDescriptor, CapabilityKind, DefinitionRef};
use crate::core::graph::Preset;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A field at fault and the problem with it.
type Problem = (String, String);
/// Normalises one item of a section.
type Normaliser = fn(&Map<String, Value>, usize) -> Result<CapabilityDescriptor, Problem>;

/// A registration payload, as runtimes send it (and as `--sources` files hold it).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistrationPayload {
    /// The registering runtime; registrations of one runtime form one origin.
    #[serde(default)]
    pub runtime_id: Option<String>,
    #[serde(default)]
    pub tools: Vec<Value>,
    #[serde(default)]
    pub skills: Vec<Value>,
    #[serde(default)]
    pub extensions: Vec<Value>,
    #[serde(default)]
    pub channels: Vec<Value>,
    #[serde(default)]
    pub presets: Vec<Value>,
}

/// One item that could not be used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemDiagnostic {
    /// `tools`, `skills`, `extensions`, `channels`, `presets` or `catalog`.
    pub section: String,
    pub index: usize,
    pub field: String,
    pub problem: String,
}

/// Normalised descriptors and presets, with the items left out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Normalised {
    pub descriptors: Vec<CapabilityDescriptor>,
    pub presets: Vec<Preset>,
    pub diagnostics: Vec<ItemDiagnostic>,
}

/// Normalises a registration payload. Sections are visited in the design's
/// order: tools, skills, extensions, channels. A name is at most
/// `max_id_bytes` (`[limits]`).
pub fn normalise_registration(payload: &RegistrationPayload, max_id_bytes: usize) -> Normalised {
    let mut out = Normalised::default();
    let sections: [(&str, &Vec<Value>, Normaliser); 4] = [
        ("tools", &payload.tools, tool),
        ("skills", &payload.skills, skill),
        ("extensions", &payload.extensions, extension),
        ("channels", &payload.channels, channel),
    ];
    for (section, items, normalise) in sections {
        for (index, item) in items.iter().enumerate() {
            let result = match item {
                Value::Object(map) => normalise(map, max_id_bytes),
                _ => Err(("(item)".to_string(), "must be an object".to_string())),
            };
            match result {
                Ok(descriptor) => out.descriptors.push(descriptor),
                Err((field, problem)) => {
                    out.diagnostics.push(ItemDiagnostic { section: section.into(), index, field, problem })
                }
            }
        }
    }
    for (index, item) in payload.presets.iter().enumerate() {
        match preset(item) {
            Ok(preset) => out.presets.push(preset),
            Err((field, problem)) => {
                out.diagnostics.push(ItemDiagnostic { section: "presets".into(), index, field, problem })
            }
        }
    }
    out
}

/// Normalises a catalog: an array of descriptors in the design's field names
/// (`id, kind, name, displayName, description, category, tags, requiredSecrets,
/// requiredTools, hasSideEffects`, optional `skillContent`, `inputSchema`, and
/// `available` or `extra.available`).
pub fn normalise_catalog(items: &[Value], max_id_bytes: usize) -> Normalised {
    let mut out = Normalised::default();
    for (index, item) in items.iter().enumerate() {
        let result = match item {
            Value::Object(map) => catalog_entry(map, max_id_bytes),
            _ => Err(("(item)".to_string(), "must be an object".to_string())),
        };
        match result {
            Ok(descriptor) => out.descriptors.push(descriptor),
            Err((field, problem)) => {
                out.diagnostics.push(ItemDiagnostic { section: "catalog".into(), index, field, problem })
            }
        }
    }
    out
}

fn problem(field: &str, text: impl Into<String>) -> Problem {
    (field.to_string(), text.into())
}

fn text(map: &Map<String, Value>, field: &str) -> Result<Option<String>, Problem> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
        Some(_) => Err(problem(field, "must be text")),
    }
}

fn required(map: &Map<String, Value>, field: &str) -> Result<String, Problem> {
    text(map, field)?.ok_or_else(|| problem(field, "is required"))
}

fn list(map: &Map<String, Value>, field: &str) -> Result<Option<Vec<String>>, Problem> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => {
            let mut out: Vec<String> = Vec::new();
            for item in items {
                let Value::String(s) = item else { return Err(problem(field, "must be a list of text")) };
                if !s.trim().is_empty() && !out.iter().any(|seen| seen == s.trim()) {
                    out.push(s.trim().to_string());
                }
            }
            Ok(Some(out))
        }
        Some(_) => Err(problem(field, "must be a list of text")),
    }
}

fn flag(map: &Map<String, Value>, field: &str) -> Result<Option<bool>, Problem> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(problem(field, "must be true or false")),
    }
}

fn schema(map: &Map<String, Value>, field: &str) -> Result<Option<Value>, Problem> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(object @ Value::Object(_)) => Ok(Some(object.clone())),
        Some(_) => Err(problem(field, "must be a JSON schema object")),
    }
}

/// A name usable in an id: no whitespace, no `:` (which separates kind and
/// name), at most `max_id_bytes` (`[limits]`).
fn checked_name(field: &str, name: String, max_id_bytes: usize) -> Result<String, Problem> {
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) || name.contains(':') {
        return Err(problem(field, format!("{name:?} is not a usable name (no spaces, no ':')")));
    }
    if let Err(exceeded) = crate::core::subject_token::check_len(&name, max_id_bytes) {
        return Err(problem(field, crate::core::subject_token::too_long_text(&exceeded)));
    }
    Ok(name)
}

fn tool(map: &Map<String, Value>, max_id_bytes: usize) -> Result<CapabilityDescriptor, Problem> {
    let name = checked_name("name", required(map, "name")?, max_id_bytes)?;
    Ok(CapabilityDescriptor {
        id: format!("tool:{name}"),
        kind: CapabilityKind::Tool,
        display_name: text(map, "displayName")?.unwrap_or_else(|| name.clone()),
        description: required(map, "description")?,
        category: text(map, "category")?.unwrap_or_else(|| "general".into()),
        tags: list(map, "tags")?.unwrap_or_default(),
        required_secrets: list(map, "requiredSecrets")?.unwrap_or_default(),
        required_tools: list(map, "requiredTools")?.unwrap_or_default(),
        available: flag(map, "available")?.unwrap_or(true),
        has_side_effects: flag(map, "hasSideEffects")?,
        full_schema: schema(map, "inputSchema")?.map(CompactJson::from),
        full_content: None,
        definition_ref: DefinitionRef::Tool,
        name,
    })
}

fn skill(map: &Map<String, Value>, max_id_bytes: usize) -> Result<CapabilityDescriptor, Problem> {
    let name = checked_name("name", required(map, "name")?, max_id_bytes)?;
    let content = text(map, "content")?;
    let (front, body) = content.as_deref().map(split_front_matter).unwrap_or((Map::new(), None));
    let from_front = |keys: &[&str]| keys.iter().find_map(|key| front.get(*key)).cloned();
    let front_list = |keys: &[&str]| -> Vec<String> {
        match from_front(keys) {
            Some(Value::Array(items)) => items.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
            _ => Vec::new(),
        }
    };
    let required_tools = match list(map, "requiredTools")? {
        Some(tools) => tools,
        None => match map.get("metadata").and_then(|m| m.pointer("/requires/bins")) {
            Some(Value::Array(bins)) => bins.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
            _ => front_list(&["requires_tools", "requiredTools"]),
        },
    };
    let description = match text(map, "description")? {
        Some(description) => description,
        None => from_front(&["description"])
            .and_then(|v| v.as_str().map(str::to_string))
            .ok_or_else(|| problem("description", "is required"))?,
    };
    Ok(CapabilityDescriptor {
        id: format!("skill:{name}"),
        kind: CapabilityKind::Skill,
        display_name: display_name_from(&name),
        description,
        category: text(map, "category")?
            .or_else(|| from_front(&["category"]).and_then(|v| v.as_str().map(str::to_string)))
            .unwrap_or_else(|| "general".into()),
        tags: list(map, "tags")?.unwrap_or_else(|| front_list(&["tags"])),
        required_secrets: list(map, "requiredSecrets")?
            .unwrap_or_else(|| front_list(&["requires_secrets", "requiredSecrets"])),
        required_tools,
        available: flag(map, "available")?.unwrap_or(true),
        has_side_effects: flag(map, "hasSideEffects")?,
        full_schema: None,
        full_content: body,
        definition_ref: DefinitionRef::Skill { skill_path: text(map, "sourcePath")?.or(text(map, "skillPath")?) },
        name,
    })
}

fn extension(map: &Map<String, Value>, max_id_bytes: usize) -> Result<CapabilityDescriptor, Problem> {
    let name = checked_name("name", required(map, "name")?, max_id_bytes)?;
    Ok(CapabilityDescriptor {
        id: format!("extension:{name}"),
        kind: CapabilityKind::Extension,
        display_name: text(map, "displayName")?.unwrap_or_else(|| name.clone()),
        description: required(map, "description")?,
        category: text(map, "category")?.unwrap_or_else(|| "general".into()),
        tags: list(map, "tags")?.unwrap_or_default(),
        required_secrets: list(map, "requiredSecrets")?.unwrap_or_default(),
        required_tools: list(map, "requiredTools")?.unwrap_or_default(),
        available: flag(map, "available")?.unwrap_or(false),
        has_side_effects: flag(map, "hasSideEffects")?,
        full_schema: schema(map, "inputSchema")?.map(CompactJson::from),
        full_content: None,
        definition_ref: DefinitionRef::Extension {
            package_name: text(map, "packageName")?,
            extension_id: text(map, "id")?.unwrap_or_else(|| name.clone()),
        },
        name,
    })
}

fn channel(map: &Map<String, Value>, max_id_bytes: usize) -> Result<CapabilityDescriptor, Problem> {
    let platform = checked_name("platform", required(map, "platform")?, max_id_bytes)?;
    let display_name = text(map, "displayName")?.unwrap_or_else(|| platform.clone());
    Ok(CapabilityDescriptor {
        id: format!("channel:{platform}"),
        kind: CapabilityKind::Channel,
        description: text(map, "description")?
            .unwrap_or_else(|| format!("Send and receive messages on {display_name}")),
        display_name,
        category: "communication".into(),
        tags: list(map, "capabilities")?.unwrap_or_default(),
        required_secrets: list(map, "requiredSecrets")?.unwrap_or_default(),
        required_tools: Vec::new(),
        available: flag(map, "available")?.unwrap_or(true),
        has_side_effects: flag(map, "hasSideEffects")?,
        full_schema: None,
        full_content: None,
        definition_ref: DefinitionRef::Channel,
        name: platform,
    })
}

fn preset(item: &Value) -> Result<Preset, Problem> {
    let Value::Object(map) = item else { return Err(problem("(item)", "must be an object")) };
    let name = text(map, "presetName")?.or(text(map, "name")?).ok_or_else(|| problem("presetName", "is required"))?;
    let capability_ids = list(map, "capabilityIds")?.ok_or_else(|| problem("capabilityIds", "is required"))?;
    Ok(Preset { name, capability_ids })
}

fn catalog_entry(map: &Map<String, Value>, max_id_bytes: usize) -> Result<CapabilityDescriptor, Problem> {
    let kind_text = required(map, "kind")?;
    let kind =
        CapabilityKind::parse(&kind_text).ok_or_else(|| problem("kind", format!("unknown kind {kind_text:?}")))?;
    let name = checked_name("name", required(map, "name")?, max_id_bytes)?;
    let available = match flag(map, "available")? {
        Some(available) => available,
        None => match map.get("extra").and_then(|extra| extra.get("available")) {
            Some(Value::Bool(available)) => *available,
            _ => kind != CapabilityKind::Extension,
        },
    };
    let (_, body) = match text(map, "skillContent")? {
        Some(content) => split_front_matter(&content),
        None => (Map::new(), None),
    };
    let id = text(map, "id")?.unwrap_or_else(|| format!("{kind}:{name}"));
    let definition_ref = match kind {
        CapabilityKind::Skill => DefinitionRef::Skill {
            skill_path: map.get("extra").and_then(|e| e.get("skillPath")).and_then(Value::as_str).map(str::to_string),
        },
        CapabilityKind::Extension => DefinitionRef::Extension {
            package_name: map
                .get("extra")
                .and_then(|e| e.get("packageName"))
                .and_then(Value::as_str)
                .map(str::to_string),
            extension_id: id.strip_prefix("extension:").unwrap_or(&id).to_string(),
        },
        CapabilityKind::Channel => DefinitionRef::Channel,
        _ => DefinitionRef::Tool,
    };
    Ok(CapabilityDescriptor {
        display_name: text(map, "displayName")?.unwrap_or_else(|| {
            if kind == CapabilityKind::Skill {
                display_name_from(&name)
            } else {
                name.clone()
            }
        }),
        // Catalogs list some packs without a description; the name still finds them.
        description: text(map, "description")?.or(text(map, "displayName")?).unwrap_or_else(|| name.clone()),
        category: if kind == CapabilityKind::Channel {
            "communication".into()
        } else {
            text(map, "category")?.unwrap_or_else(|| "general".into())
        },
        tags: list(map, "tags")?.unwrap_or_default(),
        required_secrets: list(map, "requiredSecrets")?.unwrap_or_default(),
        required_tools: list(map, "requiredTools")?.unwrap_or_default(),
        available,
        has_side_effects: flag(map, "hasSideEffects")?,
        full_schema: schema(map, "inputSchema")?.map(CompactJson::from),
        full_content: body,
        definition_ref,
        id,
        kind,
        name,
    })
}

/// Splits `---\n<yaml>\n---\n<body>` into the front matter (empty when there
/// is none or it is not a YAML mapping) and the body (`None` when empty).
pub fn split_front_matter(content: &str) -> (Map<String, Value>, Option<String>) {
    let body_of = |text: &str| {
        let trimmed = text.trim_start_matches(['\n', '\r']);
        (!trimmed.trim().is_empty()).then(|| trimmed.to_string())
    };
    let Some(rest) = content.strip_prefix("---\n").or_else(|| content.strip_prefix("---\r\n")) else {
        return (Map::new(), body_of(content));
    };
    let Some(end) = rest.find("\n---") else { return (Map::new(), body_of(content)) };
    let yaml = &rest[..end];
    let after = &rest[end + 4..];
    let after = after.split_once('\n').map_or("", |(_, body)| body);
    match crate::core::limits::parse_yaml(yaml, &crate::core::limits::Limits::default()) {
        Ok(Value::Object(map)) => (map, body_of(after)),
        _ => (Map::new(), body_of(content)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_source_kind_follows_the_design() {
        let payload: RegistrationPayload = serde_json::from_value(json!({
            "tools": [{"id": "ignored", "name": "web-search", "description": "Search the web", "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}}}],
            "skills": [{"name": "github-issues", "description": "Work with GitHub issues", "content": "---\nname: github-issues\ntags: [git, issues]\nrequires_tools: [gh]\n---\n# GitHub\nUse gh.\n"}],
            "extensions": [{"id": "com.x.giphy", "name": "giphy", "displayName": "Giphy", "description": "GIF search", "category": "media"}],
            "channels": [{"platform": "telegram", "displayName": "Telegram", "description": "Telegram bot", "capabilities": ["voice", "documents"]}],
            "presets": [{"presetName": "research", "capabilityIds": ["tool:web-search", "skill:github-issues"]}]
        }))
        .unwrap();
        let out = normalise_registration(&payload, 128);
        assert!(out.diagnostics.is_empty(), "{:?}", out.diagnostics);
        let ids: Vec<&str> = out.descriptors.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, vec!["tool:web-search", "skill:github-issues", "extension:giphy", "channel:telegram"]);
        let [tool, skill, extension, channel] = &out.descriptors[..] else { panic!() };
        assert_eq!((tool.category.as_str(), tool.available), ("general", true));
        assert!(tool.full_schema.is_some());
        assert_eq!(skill.display_name, "Github Issues");
        assert_eq!(skill.tags, vec!["git", "issues"]);
        assert_eq!(skill.required_tools, vec!["gh"]);
        assert_eq!(skill.full_content.as_deref(), Some("# GitHub\nUse gh."));
        assert!(!extension.available);
        assert_eq!(
            extension.definition_ref,
            DefinitionRef::Extension { package_name: None, extension_id: "com.x.giphy".into() }
        );
        assert_eq!((channel.category.as_str(), channel.tags.len()), ("communication", 2));
        assert_eq!(out.presets[0].capability_ids.len(), 2);
    }

    #[test]
    fn bad_items_are_reported_and_the_rest_kept() {
        let payload: RegistrationPayload = serde_json::from_value(json!({
            "tools": [{"name": "ok", "description": "fine"}, {"description": "no name"}, 3, {"name": "a b", "description": "d"}, {"name": "t", "description": "d", "inputSchema": "no"}],
            "channels": [{"displayName": "no platform"}]
        }))
        .unwrap();
        let out = normalise_registration(&payload, 128);
        assert_eq!(out.descriptors.len(), 1);
        let fields: Vec<(&str, usize, &str)> =
            out.diagnostics.iter().map(|d| (d.section.as_str(), d.index, d.field.as_str())).collect();
        assert_eq!(
            fields,
            vec![
                ("tools", 1, "name"),
                ("tools", 2, "(item)"),
                ("tools", 3, "name"),
                ("tools", 4, "inputSchema"),
                ("channels", 0, "platform")
            ]
        );
        assert!(serde_json::from_value::<RegistrationPayload>(json!({"tools": [], "bogus": 1})).is_err());
    }

    #[test]
    fn a_name_one_byte_over_max_id_bytes_is_refused_naming_the_setting() {
        let max = 16;
        let payload: RegistrationPayload = serde_json::from_value(json!({
            "tools": [{"name": "t".repeat(max), "description": "d"}, {"name": "t".repeat(max + 1), "description": "d"}],
            "skills": [{"name": "s".repeat(max + 1), "description": "d"}],
            "channels": [{"platform": "p".repeat(max + 1)}]
        }))
        .unwrap();
        let out = normalise_registration(&payload, max);
        let ids: Vec<&str> = out.descriptors.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, [format!("tool:{}", "t".repeat(max))]);
        let refused: Vec<(&str, &str, &str)> =
            out.diagnostics.iter().map(|d| (d.section.as_str(), d.field.as_str(), d.problem.as_str())).collect();
        let problem = "is 17 bytes, over limits.max_id_bytes: at most 16";
        assert_eq!(
            refused,
            [("tools", "name", problem), ("skills", "name", problem), ("channels", "platform", problem)]
        );
        assert_eq!(normalise_registration(&payload, max + 1).descriptors.len(), 4, "the setting is read");
        let items = vec![json!({"kind": "tool", "name": "c".repeat(max + 1), "description": "d"})];
        assert_eq!(normalise_catalog(&items, max).diagnostics[0].problem, problem);
        assert_eq!(normalise_catalog(&items, max + 1).descriptors.len(), 1);
    }

    #[test]
    fn catalog_entries_keep_ids_and_availability() {
        let items = vec![
            json!({"id": "extension:auth", "kind": "extension", "name": "auth", "displayName": "Authentication", "description": "Auth", "category": "tool", "extra": {"available": false, "packageName": "@x/auth"}}),
            json!({"id": "skill:notes", "kind": "skill", "name": "notes", "description": "Notes", "skillContent": "---\nname: notes\n---\n\n# Notes\n"}),
            json!({"kind": "gadget", "name": "x", "description": "d"}),
        ];
        let out = normalise_catalog(&items, 128);
        assert_eq!(out.descriptors[0].id, "extension:auth");
        assert!(!out.descriptors[0].available);
        assert_eq!(out.descriptors[1].full_content.as_deref(), Some("# Notes"));
        assert_eq!(out.diagnostics[0].field, "kind");
    }

    #[test]
    fn front_matter_edge_cases() {
        assert_eq!(split_front_matter("no front matter").1.as_deref(), Some("no front matter"));
        assert_eq!(split_front_matter("---\nunterminated").1.as_deref(), Some("---\nunterminated"));
        assert_eq!(split_front_matter("---\n- a list\n---\nbody").1.as_deref(), Some("---\n- a list\n---\nbody"));
        assert_eq!(split_front_matter("---\na: 1\n---\n").1, None);
    }
}
