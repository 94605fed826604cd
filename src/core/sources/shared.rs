//! What a live source definition read from the shared (JetStream) copy does to
//! one node's sources: every node serves every shared source itself (it
//! connects to the upstream on its own), except the sources its own config
//! file declares (`[[sources]]`), which stay as the file says.

use crate::core::sources::settings::SourceSettings;

/// What one node does with one shared definition.
#[derive(Clone, Debug, PartialEq)]
pub enum SourceChange {
    /// The node serves this definition already, its config declares the id,
    /// or the change names nothing the node serves.
    Keep,
    /// Add the source, or replace the one of its id (boxed: settings are large, the other changes small).
    Add(Box<SourceSettings>),
    /// Remove the source of this id.
    Remove(String),
}

/// What the definition shared under the id `id` (`None`: removed) does to a
/// node that serves `held` under that id and whose config does (`declared`)
/// or does not declare it. A definition whose own id is not `id` is kept
/// out: it was not written by a node.
pub fn change_of(
    id: &str,
    declared: bool,
    held: Option<&SourceSettings>,
    shared: Option<SourceSettings>,
) -> SourceChange {
    if declared {
        return SourceChange::Keep;
    }
    match shared {
        Some(settings) if settings.id != id => SourceChange::Keep,
        Some(settings) if held == Some(&settings) => SourceChange::Keep,
        Some(settings) => SourceChange::Add(Box::new(settings)),
        None if held.is_some() => SourceChange::Remove(id.to_string()),
        None => SourceChange::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(id: &str, url: &str) -> SourceSettings {
        let text = format!(
            r#"{{"id": "{id}", "kind": "mcp", "url": "{url}", "headers": {{"Authorization": "${{env:TOKEN}}"}}}}"#
        );
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn a_shared_definition_adds_replaces_removes_or_is_kept() {
        let one = settings("wiki", "http://127.0.0.1:1/mcp");
        let two = settings("wiki", "http://127.0.0.1:2/mcp");
        assert_eq!(change_of("wiki", false, None, Some(one.clone())), SourceChange::Add(Box::new(one.clone())));
        assert_eq!(change_of("wiki", false, Some(&one), Some(one.clone())), SourceChange::Keep);
        assert_eq!(change_of("wiki", false, Some(&one), Some(two.clone())), SourceChange::Add(Box::new(two.clone())));
        assert_eq!(change_of("wiki", false, Some(&one), None), SourceChange::Remove("wiki".into()));
        assert_eq!(change_of("wiki", false, None, None), SourceChange::Keep);
        assert_eq!(change_of("wiki", true, None, Some(one.clone())), SourceChange::Keep, "the config file wins");
        assert_eq!(change_of("wiki", true, Some(&one), None), SourceChange::Keep);
        assert_eq!(change_of("other", false, None, Some(one)), SourceChange::Keep, "a key that names another id");
        assert_eq!(two.headers["Authorization"], "${env:TOKEN}", "templates stay unresolved");
    }
}
