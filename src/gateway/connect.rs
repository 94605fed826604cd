//! NATS connection options from `[nats]`: credentials (user and password,
//! token, nkey seed or creds file), TLS (CA file, optional client certificate),
//! and connection-event logging.
//!
//! Secret files are read here, at connect time, and their contents go straight
//! to the client: no secret is ever logged or put in an error message (errors
//! name the file, never its contents).

use crate::config::{NatsAuth, NatsSettings, SecretSource};
use crate::gateway::service::GatewayError;
use async_nats::ConnectOptions;
use std::path::Path;

/// Builds the client options for `settings`: name, credentials, TLS, and a
/// callback that logs disconnections and reconnections.
pub async fn connect_options(settings: &NatsSettings) -> Result<ConnectOptions, GatewayError> {
    let mut options = ConnectOptions::new()
        .name(format!("{}-{}", settings.service_name, std::process::id()))
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Connected => tracing::info!("connected to NATS"),
                async_nats::Event::Disconnected => tracing::warn!("disconnected from NATS; reconnecting"),
                other => tracing::debug!(event = %other, "NATS client event"),
            }
        });
    options = match &settings.auth {
        NatsAuth::None => options,
        NatsAuth::UserPassword { user, password } => {
            options.user_and_password(user.clone(), read_secret("nats.password", password)?)
        }
        NatsAuth::Token(token) => options.token(read_secret("nats.token", token)?),
        NatsAuth::NkeySeed(seed) => options.nkey(read_secret("nats.nkey_seed", seed)?),
        NatsAuth::CredsFile(path) => options.credentials_file(path).await.map_err(|err| GatewayError::Credentials {
            setting: "nats.creds_file".into(),
            problem: format!("{}: {err}", path.display()),
        })?,
    };
    let tls = &settings.tls;
    if let Some(ca_file) = &tls.ca_file {
        require_file("nats.tls_ca_file", ca_file)?;
        options = options.add_root_certificates(ca_file.clone());
    }
    if let Some((cert, key)) = &tls.client_cert {
        require_file("nats.tls_cert_file", cert)?;
        require_file("nats.tls_key_file", key)?;
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    if tls.required {
        options = options.require_tls(true);
    }
    Ok(options)
}

/// Returns the secret, reading (and trimming) its file if it comes from one.
fn read_secret(setting: &str, source: &SecretSource) -> Result<String, GatewayError> {
    match source {
        SecretSource::Value(secret) => Ok(secret.expose().to_string()),
        SecretSource::File(path) => {
            let text = std::fs::read_to_string(path).map_err(|err| GatewayError::Credentials {
                setting: format!("{setting}_file"),
                problem: format!("cannot read {}: {err}", path.display()),
            })?;
            let secret = text.trim();
            if secret.is_empty() {
                return Err(GatewayError::Credentials {
                    setting: format!("{setting}_file"),
                    problem: format!("{} is empty", path.display()),
                });
            }
            Ok(secret.to_string())
        }
    }
}

fn require_file(setting: &str, path: &Path) -> Result<(), GatewayError> {
    if path.is_file() {
        Ok(())
    } else {
        Err(GatewayError::Credentials { setting: setting.into(), problem: format!("{} is not a file", path.display()) })
    }
}
