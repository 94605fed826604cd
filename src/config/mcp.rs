//! The `[mcp]` section: capdex's MCP face (`capdex mcp` on stdio, and
//! streamable HTTP in `capdex serve` when `listen` is set), its bearer token,
//! the agent id its sessions act as, and direct mode.

use super::environment::Environment;
use super::error::{in_range, InvalidKind, InvalidSetting};
use super::listener::{listener, Listener};
use super::nats::Secret;
use serde::Deserialize;
use std::net::SocketAddr;

/// `[mcp]` as written; documented in `config/capdex.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMcp {
    pub listen: String,
    pub path: String,
    pub token: String,
    pub token_agent_id: String,
    pub agent_id: String,
    pub direct: bool,
    pub direct_max_tools: u64,
}

/// The MCP face's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpSettings {
    /// Where `capdex serve` serves streamable HTTP; `None` serves none.
    pub listen: Option<SocketAddr>,
    /// The HTTP path of the MCP endpoint (`/mcp`).
    pub path: String,
    /// The bearer token every HTTP request must carry, `${env:VAR}` resolved; `None`: loopback only.
    pub token: Option<Secret>,
    /// The agent id of HTTP sessions that carry the token.
    pub token_agent_id: Option<String>,
    /// The agent id of every session, whatever the client declares.
    pub agent_id: Option<String>,
    /// Offer the session's most relevant capabilities as tools of their own.
    pub direct: bool,
    /// How many capabilities direct mode offers at most.
    pub direct_max_tools: usize,
}

/// The most capabilities direct mode may offer.
pub const MAX_DIRECT_TOOLS: u64 = 64;

impl McpSettings {
    /// Checks the address, the path, the ids (at most `max_id_bytes`, `[limits]`)
    /// and the token; `${env:VAR}` in the token is read from `env`.
    pub fn from_raw(raw: RawMcp, env: &Environment, max_id_bytes: usize) -> Result<McpSettings, InvalidSetting> {
        let Listener { listen, token } = listener("mcp", &raw.listen, &raw.token, env)?;
        if !raw.path.starts_with('/') || raw.path.chars().any(|c| c.is_whitespace() || c == '?' || c == '#') {
            return Err(InvalidSetting::new(
                "mcp.path",
                InvalidKind::Malformed,
                format!("{:?} must start with / and hold no spaces, ? or #", raw.path),
            ));
        }
        let agent = |key: &str, text: &str| -> Result<Option<String>, InvalidSetting> {
            match text.trim() {
                "" => Ok(None),
                id => match crate::core::subject_token::problem(id, max_id_bytes) {
                    None => Ok(Some(id.to_string())),
                    Some(crate::core::subject_token::TokenProblem::TooLong(exceeded)) => Err(InvalidSetting::new(
                        key,
                        InvalidKind::OutOfRange,
                        crate::core::subject_token::too_long_text(&exceeded),
                    )),
                    Some(_) => Err(InvalidSetting::new(
                        key,
                        InvalidKind::Malformed,
                        "no '.', '*', '>', whitespace or control characters (an agent id is a subject token)",
                    )),
                },
            }
        };
        let token_agent_id = agent("mcp.token_agent_id", &raw.token_agent_id)?;
        if token_agent_id.is_some() && token.is_none() {
            return Err(InvalidSetting::new("mcp.token_agent_id", InvalidKind::Incomplete, "set mcp.token too"));
        }
        Ok(McpSettings {
            listen,
            path: raw.path,
            token,
            token_agent_id,
            agent_id: agent("mcp.agent_id", &raw.agent_id)?,
            direct: raw.direct,
            direct_max_tools: in_range("mcp.direct_max_tools", raw.direct_max_tools, 1..=MAX_DIRECT_TOOLS)? as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{defaults, load, Case};

    fn raw() -> RawMcp {
        defaults().mcp
    }

    #[test]
    fn the_defaults_serve_no_http_and_no_direct_mode() {
        let settings = McpSettings::from_raw(raw(), &Environment::default(), 128).unwrap();
        assert_eq!(settings.listen, None);
        assert_eq!(settings.path, "/mcp");
        assert_eq!((settings.token, settings.agent_id, settings.direct), (None, None, false));
        assert_eq!(settings.direct_max_tools, 8);
    }

    #[test]
    fn a_token_is_read_from_the_environment_and_never_shown() {
        let env: Environment = [("MCP_TOKEN", "0123456789abcdef-xyz")].into_iter().collect();
        let mut given = raw();
        given.token = "${env:MCP_TOKEN}".into();
        given.listen = "0.0.0.0:8765".into();
        given.token_agent_id = "desk".into();
        let settings = McpSettings::from_raw(given.clone(), &env, 128).unwrap();
        assert_eq!(settings.token.as_ref().unwrap().expose(), "0123456789abcdef-xyz");
        assert_eq!(settings.token_agent_id.as_deref(), Some("desk"));
        assert!(!format!("{settings:?}").contains("0123456789abcdef"));
        let err = McpSettings::from_raw(given, &Environment::default(), 128).unwrap_err();
        assert_eq!((err.field.as_str(), err.kind), ("mcp.token", InvalidKind::Incomplete));
    }

    #[test]
    fn bad_values_are_refused() {
        let cases: Vec<Case<RawMcp>> = vec![
            (Box::new(|r| r.listen = "0.0.0.0:8765".into()), "mcp.listen", InvalidKind::Conflict),
            (Box::new(|r| r.listen = "nowhere".into()), "mcp.listen", InvalidKind::Malformed),
            (Box::new(|r| r.path = "mcp".into()), "mcp.path", InvalidKind::Malformed),
            (Box::new(|r| r.token = "short".into()), "mcp.token", InvalidKind::Malformed),
            (Box::new(|r| r.token_agent_id = "desk".into()), "mcp.token_agent_id", InvalidKind::Incomplete),
            (Box::new(|r| r.agent_id = "a\nb".into()), "mcp.agent_id", InvalidKind::Malformed),
            (Box::new(|r| r.direct_max_tools = 0), "mcp.direct_max_tools", InvalidKind::OutOfRange),
            (Box::new(|r| r.direct_max_tools = 65), "mcp.direct_max_tools", InvalidKind::OutOfRange),
        ];
        for (edit, field, kind) in cases {
            let mut given = raw();
            edit(&mut given);
            let err = McpSettings::from_raw(given, &Environment::default(), 128).unwrap_err();
            assert_eq!((err.field.as_str(), err.kind), (field, kind));
        }
        let mut loopback = raw();
        loopback.listen = "127.0.0.1:0".into();
        assert!(McpSettings::from_raw(loopback, &Environment::default(), 128).is_ok());
        let mut long = raw();
        long.agent_id = "a".repeat(10);
        assert!(McpSettings::from_raw(long.clone(), &Environment::default(), 10).is_ok(), "at limits.max_id_bytes");
        long.agent_id.push('a');
        let err = McpSettings::from_raw(long, &Environment::default(), 10).unwrap_err();
        assert_eq!((err.field.as_str(), err.kind), ("mcp.agent_id", InvalidKind::OutOfRange));
        assert!(err.to_string().contains("limits.max_id_bytes"), "{err}");
    }

    #[test]
    fn the_environment_overrides_the_section() {
        let settings = load(&[("CAPDEX_MCP_LISTEN", "127.0.0.1:8765"), ("CAPDEX_MCP_DIRECT", "true")]).unwrap();
        assert_eq!(settings.mcp.listen, Some("127.0.0.1:8765".parse().unwrap()));
        assert!(settings.mcp.direct);
    }
}
