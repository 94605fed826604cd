//! NATS connection options from `[nats]`: credentials (user and password,
//! token, nkey seed or creds file), TLS (CA file, optional client certificate),
//! connection-event logging, and the order of the servers.
//!
//! With several servers (`[nats] url` a comma-separated list) the client
//! connects to the first that answers, in the order given, and on losing its
//! server reconnects to the next one that answers (and to the servers the
//! cluster announces); requests in flight on the lost connection time out and
//! may be sent again.
//!
//! Secret files are read here, at connect time, and their contents go straight
//! to the client: no secret is ever logged or put in an error message (errors
//! name the file, never its contents).

use crate::config::{NatsAuth, NatsSettings, SecretSource};
use crate::gateway::errors::GatewayError;
use async_nats::ConnectOptions;
use std::path::Path;

/// The longest wait between two reconnection attempts. The client's default
/// doubles up to 4 s, so a node could stay away for up to 4 s after its server
/// came back; with 500 ms it answers again within a second of the server's
/// return (`benches/trials.rs`, `docs/performance.md`). An attempt on a server
/// that is down is one refused TCP connect, so trying twice a second costs nothing.
const MAX_RECONNECT_DELAY: std::time::Duration = std::time::Duration::from_millis(500);

/// The wait before reconnection attempt `attempts`: none for the first, then
/// doubling from 2 ms, at most [`MAX_RECONNECT_DELAY`].
fn reconnect_delay(attempts: usize) -> std::time::Duration {
    if attempts <= 1 {
        return std::time::Duration::ZERO;
    }
    let exponent = u32::try_from(attempts - 1).unwrap_or(u32::MAX).min(20);
    std::time::Duration::from_millis(2u64.saturating_pow(exponent)).min(MAX_RECONNECT_DELAY)
}

/// Builds the client options for `settings`: name, credentials, TLS, the
/// reconnection backoff, and a callback that logs disconnections and reconnections.
pub async fn connect_options(settings: &NatsSettings) -> Result<ConnectOptions, GatewayError> {
    let mut options = ConnectOptions::new()
        .name(format!("{}-{}", settings.service_name, std::process::id()))
        .reconnect_delay_callback(reconnect_delay)
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
    if settings.servers.len() > 1 {
        // Each node lists its nearest server first; the default would shuffle them.
        options = options.retain_servers_order();
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn problem(result: Result<String, GatewayError>) -> String {
        match result {
            Err(GatewayError::Credentials { setting, problem }) => format!("{setting}: {problem}"),
            other => panic!("expected a credentials error, got {other:?}"),
        }
    }

    #[test]
    fn reconnection_waits_double_from_nothing_and_never_exceed_half_a_second() {
        let waits: Vec<u128> = (1..=12).map(|attempt| reconnect_delay(attempt).as_millis()).collect();
        assert_eq!(waits, [0, 2, 4, 8, 16, 32, 64, 128, 256, 500, 500, 500]);
        assert_eq!(reconnect_delay(usize::MAX), MAX_RECONNECT_DELAY);
    }

    #[test]
    fn secrets_come_from_the_setting_or_a_trimmed_file_and_errors_never_show_them() {
        let dir = tempfile::tempdir().unwrap();
        let given = SecretSource::Value(Secret::new("pw-inline".into()));
        assert_eq!(read_secret("nats.password", &given).unwrap(), "pw-inline");
        let file = dir.path().join("token");
        std::fs::write(&file, "  tok-from-file\n").unwrap();
        assert_eq!(read_secret("nats.token", &SecretSource::File(file)).unwrap(), "tok-from-file");

        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let message = problem(read_secret("nats.token", &SecretSource::File(empty)));
        assert!(message.starts_with("nats.token_file: ") && message.ends_with("is empty"), "{message}");
        let missing = problem(read_secret("nats.nkey_seed", &SecretSource::File(dir.path().join("absent"))));
        assert!(missing.starts_with("nats.nkey_seed_file: cannot read "), "{missing}");
        let debug = format!("{given:?}");
        assert!(!debug.contains("pw-inline"), "{debug}");
    }

    #[tokio::test]
    async fn missing_tls_and_creds_files_are_named_at_startup() {
        let defaults = crate::config::Settings::load(None, &Default::default()).unwrap().nats;
        let mut settings = defaults.clone();
        settings.tls.ca_file = Some("/nonexistent/ca.pem".into());
        match connect_options(&settings).await {
            Err(GatewayError::Credentials { setting, .. }) => assert_eq!(setting, "nats.tls_ca_file"),
            other => panic!("{:?}", other.map(|_| ())),
        }
        let mut settings = defaults;
        settings.auth = NatsAuth::CredsFile("/nonexistent/capdex.creds".into());
        match connect_options(&settings).await {
            Err(GatewayError::Credentials { setting, .. }) => assert_eq!(setting, "nats.creds_file"),
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}
