//! The rule `[mcp]` and `[console]` share for what they serve over HTTP: an
//! address (none when empty), a token (none when empty; `${env:VAR}` read from
//! the environment; at least 16 characters, no spaces), and no address beyond
//! loopback without a token.

use super::environment::Environment;
use super::error::{InvalidKind, InvalidSetting};
use super::nats::Secret;
use crate::core::dispatch::env_template;
use std::net::SocketAddr;

/// A section's checked `listen` and `token`.
pub(super) struct Listener {
    pub listen: Option<SocketAddr>,
    pub token: Option<Secret>,
}

/// Checks `<section>.listen` and `<section>.token` as written.
pub(super) fn listener(
    section: &str,
    listen: &str,
    token: &str,
    env: &Environment,
) -> Result<Listener, InvalidSetting> {
    let listen = match listen.trim() {
        "" => None,
        text => Some(text.parse::<SocketAddr>().map_err(|err| {
            InvalidSetting::new(
                format!("{section}.listen"),
                InvalidKind::Malformed,
                format!("{text:?} is not host:port ({err})"),
            )
        })?),
    };
    let token = match token.trim() {
        "" => None,
        text => {
            let lookup = |name: &str| env.get(name).map(str::to_string);
            // The operator wrote this template, so it may read any variable.
            let any = env_template::EnvAllow::any();
            let resolved = env_template::resolve(text, &any, &lookup, &mut Vec::new()).map_err(|missing| {
                InvalidSetting::new(format!("{section}.token"), InvalidKind::Incomplete, missing.to_string())
            })?;
            if resolved.len() < 16 || resolved.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(InvalidSetting::new(
                    format!("{section}.token"),
                    InvalidKind::Malformed,
                    "the token must be at least 16 characters, without spaces",
                ));
            }
            Some(Secret::new(resolved))
        }
    };
    if let Some(addr) = listen {
        if token.is_none() && !addr.ip().is_loopback() {
            return Err(InvalidSetting::new(
                format!("{section}.listen"),
                InvalidKind::Conflict,
                format!("{addr} is not a loopback address: set {section}.token to serve it beyond this machine"),
            ));
        }
    }
    Ok(Listener { listen, token })
}
