//! Capability descriptors: the one normalised shape every source is mapped into.
//!
//! A descriptor is what capdex knows about one capability (a tool, a skill, an
//! extension, a channel, ...). Sources (manifests, registrations, catalogs) are
//! normalised into it; everything downstream (embedding text, index, graph,
//! tiers) reads only this type.

use crate::core::compact_json::CompactJson;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What kind of capability a descriptor describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapabilityKind {
    Tool,
    Skill,
    Extension,
    Channel,
    Voice,
    Productivity,
    EmergentTool,
}

impl CapabilityKind {
    /// Every kind, in declaration order.
    pub const ALL: [CapabilityKind; 7] = [
        CapabilityKind::Tool,
        CapabilityKind::Skill,
        CapabilityKind::Extension,
        CapabilityKind::Channel,
        CapabilityKind::Voice,
        CapabilityKind::Productivity,
        CapabilityKind::EmergentTool,
    ];

    /// Returns the wire spelling of the kind (`tool`, `emergent-tool`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            CapabilityKind::Tool => "tool",
            CapabilityKind::Skill => "skill",
            CapabilityKind::Extension => "extension",
            CapabilityKind::Channel => "channel",
            CapabilityKind::Voice => "voice",
            CapabilityKind::Productivity => "productivity",
            CapabilityKind::EmergentTool => "emergent-tool",
        }
    }

    /// Parses the wire spelling; `None` for anything else.
    ///
    /// # Examples
    /// ```
    /// use capdex::core::descriptor::CapabilityKind;
    /// assert_eq!(CapabilityKind::parse("skill"), Some(CapabilityKind::Skill));
    /// assert_eq!(CapabilityKind::parse("gadget"), None);
    /// ```
    pub fn parse(text: &str) -> Option<CapabilityKind> {
        CapabilityKind::ALL.into_iter().find(|kind| kind.as_str() == text)
    }
}

impl fmt::Display for CapabilityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of source a descriptor was normalised from, so Tier 2 content
/// can be traced back (the design's `sourceRef` union, plus capdex's built-ins).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum DefinitionRef {
    /// A runtime's tool.
    Tool,
    /// A skill; `skillPath` names its SKILL.md when known.
    #[serde(rename_all = "camelCase")]
    Skill { skill_path: Option<String> },
    /// A catalog extension (pack).
    #[serde(rename_all = "camelCase")]
    Extension { package_name: Option<String>, extension_id: String },
    /// A messaging channel.
    Channel,
    /// A CAPABILITY.yaml manifest on disk.
    #[serde(rename_all = "camelCase")]
    Manifest { manifest_path: String },
    /// Built into capdex itself (for example `tool:echo`).
    Builtin,
    /// A tool or operation of a source (`core::sources`); `loadable` marks a
    /// lazy source that is not connected now.
    #[serde(rename_all = "camelCase")]
    Source {
        source_id: String,
        #[serde(default)]
        loadable: bool,
    },
}

impl DefinitionRef {
    /// Returns the id of the source a capability belongs to, if it belongs to one.
    pub fn source_id(&self) -> Option<&str> {
        match self {
            DefinitionRef::Source { source_id, .. } => Some(source_id),
            _ => None,
        }
    }
}

/// The normalised description of one capability.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapabilityDescriptor {
    pub id: String,
    pub kind: CapabilityKind,
    pub name: String,
    pub display_name: String,
    pub description: String,
    pub category: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub required_secrets: Vec<String>,
    #[serde(default)]
    pub required_tools: Vec<String>,
    pub available: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub has_side_effects: Option<bool>,
    /// Tier 2: the input JSON schema of a tool, kept as its compact text. Not embedded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_schema: Option<CompactJson>,
    /// Tier 2: the instructions of a skill (SKILL.md). Not embedded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_content: Option<String>,
    /// Where the definition lives, to load it on demand (the design's `sourceRef`, its wire name).
    #[serde(rename = "sourceRef")]
    pub definition_ref: DefinitionRef,
}

impl CapabilityDescriptor {
    /// Returns the top-level parameter names of the input schema, in schema order.
    pub fn parameter_names(&self) -> Vec<String> {
        self.full_schema.as_ref().map(CompactJson::property_names).unwrap_or_default()
    }
}

/// Builds a display name from a kebab/snake-case name: `web-search` → `Web Search`.
pub fn display_name_from(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_uppercase().chain(chars).collect::<String>(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A tool `tool:<name>` with `description` in category `ops`, for tests anywhere in the crate.
#[cfg(test)]
pub(crate) fn test_tool(name: &str, description: &str) -> CapabilityDescriptor {
    CapabilityDescriptor {
        id: format!("tool:{name}"),
        kind: CapabilityKind::Tool,
        name: name.into(),
        display_name: name.into(),
        description: description.into(),
        category: "ops".into(),
        tags: vec![],
        required_secrets: vec![],
        required_tools: vec![],
        available: true,
        has_side_effects: None,
        full_schema: None,
        full_content: None,
        definition_ref: DefinitionRef::Builtin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_spelling() {
        for kind in CapabilityKind::ALL {
            assert_eq!(CapabilityKind::parse(kind.as_str()), Some(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
        }
    }

    #[test]
    fn a_source_ref_has_the_wire_shape_of_the_contract() {
        let reference = DefinitionRef::Source { source_id: "pets".into(), loadable: true };
        assert_eq!(
            serde_json::to_value(&reference).unwrap(),
            serde_json::json!({"type": "source", "sourceId": "pets", "loadable": true})
        );
        assert_eq!(reference.source_id(), Some("pets"));
        assert_eq!(DefinitionRef::Builtin.source_id(), None);
    }

    #[test]
    fn display_names_capitalise_segments() {
        assert_eq!(display_name_from("web-search"), "Web Search");
        assert_eq!(display_name_from("git_hub--x"), "Git Hub X");
        assert_eq!(display_name_from(""), "");
    }
}
