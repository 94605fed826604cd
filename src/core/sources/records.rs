//! A source's tools as capdex offers them: the descriptor discovery indexes
//! (origin `source:<id>`, id `<source_id>#<Name>`) and the record dispatch
//! runs (`executionType: source`, slug = the same id), both made from one
//! [`SourceTool`] and what the source says of itself ([`SourceFacts`]).

use super::{capability_id, Invocation, SourceTool};
use crate::core::compact_json::CompactJson;
use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind, DefinitionRef};
use crate::core::dispatch::registry::{CapabilityRecord, ExecutionType, FunctionDefinition};

/// What a source says of itself that its descriptors and records carry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SourceFacts<'a> {
    pub source_id: &'a str,
    /// The source's `category` setting; its id when `None`.
    pub category: Option<&'a str>,
    pub tags: &'a [String],
    /// A lazy source not connected now.
    pub loadable: bool,
    /// The source's call timeout, in ms (`None`: the dispatcher's default).
    pub timeout_ms: Option<u64>,
}

/// The descriptor of one of a source's tools, id `<source_id>#<Name>`.
pub fn descriptor_of(source: &SourceFacts<'_>, tool: &SourceTool) -> CapabilityDescriptor {
    let mut tags = source.tags.to_vec();
    if !tags.iter().any(|tag| tag == source.source_id) {
        tags.push(source.source_id.to_string());
    }
    let category = category_of(source);
    CapabilityDescriptor {
        id: capability_id(source.source_id, &tool.name),
        kind: CapabilityKind::Tool,
        name: tool.name.clone(),
        display_name: tool.title.clone().unwrap_or_else(|| tool.name.clone()),
        description: tool.description.clone(),
        category: category.to_string(),
        tags,
        required_secrets: Vec::new(),
        required_tools: Vec::new(),
        available: true,
        has_side_effects: None,
        full_schema: Some(CompactJson::new(&tool.input_schema)),
        full_content: None,
        definition_ref: DefinitionRef::Source { source_id: source.source_id.to_string(), loadable: source.loadable },
    }
}

/// The source's `category` setting, else its id.
fn category_of<'a>(source: &SourceFacts<'a>) -> &'a str {
    source.category.map(str::trim).filter(|category| !category.is_empty()).unwrap_or(source.source_id)
}

/// The dispatch record of one of a source's tools: slug = its capability id,
/// `executionType: source`, `handler` = the source id.
pub fn record_of(source: &SourceFacts<'_>, tool: &SourceTool) -> CapabilityRecord {
    let slug = capability_id(source.source_id, &tool.name);
    let parameters =
        if tool.input_schema.is_object() { tool.input_schema.clone() } else { serde_json::json!({"type": "object"}) };
    CapabilityRecord {
        name: tool.title.clone().unwrap_or_else(|| tool.name.clone()),
        description: tool.description.clone(),
        category: category_of(source).to_string(),
        execution_type: ExecutionType::Source,
        handler: source.source_id.to_string(),
        function_definition: FunctionDefinition {
            name: function_name(&slug),
            description: tool.description.clone(),
            parameters,
        },
        requires_approval: false,
        approval_timeout_ms: None,
        rate_limit: None,
        is_idempotent: false,
        is_active: true,
        processes_pii: false,
        redaction: None,
        timeout_ms: source.timeout_ms,
        policy_version: 1,
        hidden: false,
        invocation: Some(tool.invocation.clone()),
        slug,
    }
}

/// The tool a stored source descriptor stands for (a restart rebuilds the
/// dispatch records of mapped sources from the catalog); `None` when the
/// descriptor is not one of `source_id`'s.
pub fn tool_of_descriptor(
    source_id: &str,
    descriptor: &CapabilityDescriptor,
    invocation: Invocation,
) -> Option<SourceTool> {
    if descriptor.definition_ref.source_id() != Some(source_id)
        || descriptor.id != capability_id(source_id, &descriptor.name)
    {
        return None;
    }
    Some(SourceTool {
        name: descriptor.name.clone(),
        title: (descriptor.display_name != descriptor.name).then(|| descriptor.display_name.clone()),
        description: descriptor.description.clone(),
        input_schema: descriptor
            .full_schema
            .as_ref()
            .map(|schema| schema.value())
            .unwrap_or_else(|| serde_json::json!({"type": "object"})),
        output_schema: None,
        invocation,
    })
}

/// An OpenAI function name (`^[a-zA-Z0-9_-]{1,64}$`) for a capability id:
/// other characters become `_`, and a longer name keeps its first 55
/// characters and a hash of the whole id.
///
/// # Examples
/// ```
/// use capdex::core::sources::records::function_name;
/// assert_eq!(function_name("pets#GET /pets/{id}"), "pets_GET__pets__id_");
/// ```
pub fn function_name(id: &str) -> String {
    let cleaned: String =
        id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    if (1..=64).contains(&cleaned.len()) {
        return cleaned;
    }
    // FNV-1a: stable across runs and platforms.
    let hash =
        id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3));
    format!("{}_{:08x}", &cleaned[..cleaned.len().min(55)], hash as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::sources::split_capability_id;
    use serde_json::json;

    fn tool(name: &str) -> SourceTool {
        SourceTool {
            name: name.into(),
            title: None,
            description: "Show a pet".into(),
            input_schema: json!({"type": "object", "properties": {"petId": {"type": "integer"}}}),
            output_schema: None,
            invocation: Invocation::NotCallable,
        }
    }

    #[test]
    fn descriptors_and_records_share_the_capability_id() {
        let tags = vec!["animals".to_string()];
        let facts =
            SourceFacts { source_id: "pets", category: None, tags: &tags, loadable: true, timeout_ms: Some(900) };
        let descriptor = descriptor_of(&facts, &tool("showPet"));
        assert_eq!((descriptor.id.as_str(), descriptor.category.as_str()), ("pets#showPet", "pets"));
        assert_eq!(descriptor.tags, ["animals", "pets"]);
        assert_eq!(descriptor.full_schema.as_ref().unwrap().value()["properties"]["petId"]["type"], "integer");
        assert_eq!(descriptor.definition_ref, DefinitionRef::Source { source_id: "pets".into(), loadable: true });
        let record = record_of(&facts, &tool("showPet"));
        assert_eq!((record.slug.as_str(), record.handler.as_str()), ("pets#showPet", "pets"));
        assert_eq!(record.discovery_id(), descriptor.id);
        assert_eq!((record.execution_type, record.timeout_ms), (ExecutionType::Source, Some(900)));
        assert_eq!(record.function_definition.name, "pets_showPet");
        let back = tool_of_descriptor("pets", &descriptor, Invocation::NotCallable).unwrap();
        assert_eq!((back.name.as_str(), &back.input_schema), ("showPet", &tool("showPet").input_schema));
        assert!(tool_of_descriptor("shop", &descriptor, Invocation::NotCallable).is_none());
        let categorised = SourceFacts { category: Some("zoo"), ..facts };
        assert_eq!(descriptor_of(&categorised, &tool("x")).category, "zoo");
    }

    #[test]
    fn function_names_are_valid_and_long_ids_stay_distinct() {
        let long_a = format!("s#{}", "a".repeat(80));
        let long_b = format!("s#{}b", "a".repeat(79));
        let (a, b) = (function_name(&long_a), function_name(&long_b));
        assert_ne!(a, b);
        for name in [a, b, function_name("s#ok"), function_name("ünï#cödé")] {
            assert!((1..=64).contains(&name.len()), "{name}");
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'), "{name}");
        }
        assert_eq!(split_capability_id("pets#showPet"), Some(("pets", "showPet")));
        assert_eq!(split_capability_id("tool:x#y"), None);
    }
}
