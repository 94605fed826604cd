//! The `[[sources]]` tables: live sources declared in the config file, added
//! on every start (beside those added over NATS, which the store keeps).
//! Each table is one source's settings, as `capdex.v1.sources.add` takes them
//! (`core::sources::settings::SourceSettings`; snake_case aliases accepted).

use super::error::{InvalidKind, InvalidSetting};
use crate::core::sources::settings::SourceSettings;
use std::collections::BTreeSet;

/// Checks every declared source and that no id is declared twice.
pub fn sources_from_raw(raw: Vec<SourceSettings>) -> Result<Vec<SourceSettings>, InvalidSetting> {
    let mut seen = BTreeSet::new();
    for (index, source) in raw.iter().enumerate() {
        source.validate().map_err(|err| {
            InvalidSetting::new(format!("sources[{index}].{}", err.field), InvalidKind::Malformed, err.problem)
        })?;
        if !seen.insert(source.id.as_str()) {
            return Err(InvalidSetting::new(
                format!("sources[{index}].id"),
                InvalidKind::Conflict,
                format!("the source id {:?} is declared twice", source.id),
            ));
        }
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use crate::config::tests::defaults;
    use crate::config::{ConfigError, Environment, Settings};

    fn load(toml: &str) -> Result<Settings, ConfigError> {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), toml).unwrap();
        Settings::load(Some(file.path()), &Environment::default())
    }

    #[test]
    fn sources_are_read_checked_and_off_by_default() {
        assert!(defaults().sources.is_empty());
        let settings = load(
            r#"
[[sources]]
id = "time"
kind = "mcp"
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
call_timeout_ms = 5000

[[sources]]
id = "pets"
kind = "openapi"
url = "http://127.0.0.1:8080/openapi.json"
lazy = true
auth = { type = "bearer", token = "${env:PETS_TOKEN}" }
"#,
        )
        .unwrap();
        let ids: Vec<&str> = settings.sources.iter().map(|source| source.id.as_str()).collect();
        assert_eq!(ids, ["time", "pets"]);
        assert_eq!(settings.sources[0].call_timeout_ms(), 5000);
        let twice = load("[[sources]]\nid = \"a\"\nkind = \"sql\"\npath = \"a.sql\"\n[[sources]]\nid = \"a\"\nkind = \"sql\"\npath = \"b.sql\"\n");
        assert!(twice.unwrap_err().to_string().contains("sources[1].id"), "a repeated id is refused");
        let bad = load("[[sources]]\nid = \"Bad Id\"\nkind = \"mcp\"\ncommand = \"x\"\n");
        assert!(bad.unwrap_err().to_string().contains("sources[0].id"));
    }
}
