//! The `[nats]` section: the servers (one URL, or a comma-separated list of a
//! cluster's servers to fail over between), the subject prefix, the service
//! name, payload and drain limits, authentication (one method at most) and TLS.

use super::error::{in_range, InvalidKind, InvalidSetting};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// `[nats]` as written; every key is documented in `config/capdex.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNats {
    pub url: String,
    pub subject_prefix: String,
    pub service_name: String,
    pub max_payload_bytes: usize,
    pub drain_timeout_ms: u64,
    pub plain_subjects: bool,
    pub user: String,
    pub password: String,
    pub password_file: PathBuf,
    pub token: String,
    pub token_file: PathBuf,
    pub nkey_seed: String,
    pub nkey_seed_file: PathBuf,
    pub creds_file: PathBuf,
    pub tls_ca_file: PathBuf,
    pub tls_cert_file: PathBuf,
    pub tls_key_file: PathBuf,
    pub tls_required: bool,
}

#[derive(Clone, Debug)]
pub struct NatsSettings {
    /// The setting as written (for logs and error messages).
    pub url: String,
    /// Each server of `url`, trimmed, in the order given: the client tries
    /// them in that order on connect and reconnect, so a node lists its
    /// nearest server first.
    pub servers: Vec<String>,
    pub subject_prefix: String,
    pub service_name: String,
    pub max_payload_bytes: usize,
    pub drain_timeout_ms: u64,
    /// Serve the plain `dispatch` and `approval.<id>.approve|reject` subjects,
    /// whose caller the payload names (trusted single-tenant setups); per-agent
    /// and per-approver subjects are served either way.
    pub plain_subjects: bool,
    pub auth: NatsAuth,
    pub tls: NatsTls,
}

/// A secret setting (password, token, nkey seed): its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    /// Returns the secret itself; only for handing it to the NATS client.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Where a secret comes from: the setting itself, or a file read at connect time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    Value(Secret),
    File(PathBuf),
}

/// How capdex authenticates to NATS (`[nats]` `user`, `token`, `nkey_seed`, `creds_file`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NatsAuth {
    #[default]
    None,
    UserPassword {
        user: String,
        password: SecretSource,
    },
    Token(SecretSource),
    NkeySeed(SecretSource),
    CredsFile(PathBuf),
}

/// TLS to NATS (`[nats]` `tls_*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatsTls {
    /// PEM CA certificates to trust.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Refuse plain text (also implied by a `tls://` URL).
    pub required: bool,
}

impl NatsSettings {
    /// Checks the section: URL scheme, subject prefix, service name, payload bound, auth and TLS.
    pub fn from_raw(raw: RawNats) -> Result<NatsSettings, InvalidSetting> {
        validate_prefix(&raw.subject_prefix)
            .map_err(|problem| InvalidSetting::new("nats.subject_prefix", InvalidKind::Malformed, problem))?;
        let servers = server_list(&raw.url)
            .map_err(|problem| InvalidSetting::new("nats.url", InvalidKind::Malformed, problem))?;
        if raw.service_name.is_empty()
            || !raw.service_name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(InvalidSetting::new(
                "nats.service_name",
                InvalidKind::Malformed,
                format!("must be letters, digits, - or _, got {:?}", raw.service_name),
            ));
        }
        let auth = nats_auth(&raw)?;
        let tls = nats_tls(&raw)?;
        in_range("nats.max_payload_bytes", raw.max_payload_bytes, 1024..=64 * 1024 * 1024)?;
        Ok(NatsSettings {
            url: raw.url,
            servers,
            subject_prefix: raw.subject_prefix,
            service_name: raw.service_name,
            max_payload_bytes: raw.max_payload_bytes,
            drain_timeout_ms: raw.drain_timeout_ms,
            plain_subjects: raw.plain_subjects,
            auth,
            tls,
        })
    }
}

/// Splits `url` at commas into server URLs and checks each: `nats://` or
/// `tls://`, an optional `user:password@`, a host, an optional numeric port,
/// nothing after it. At most 32 servers, none listed twice.
fn server_list(url: &str) -> Result<Vec<String>, String> {
    const MAX_SERVERS: usize = 32;
    let servers: Vec<String> = url.split(',').map(|server| server.trim().to_string()).collect();
    if servers.len() > MAX_SERVERS {
        return Err(format!("lists {} servers, at most {MAX_SERVERS} are allowed", servers.len()));
    }
    for (position, server) in servers.iter().enumerate() {
        let bad = |problem: &str| format!("server {} of {:?} ({server:?}) {problem}", position + 1, url);
        let Some(rest) = server.strip_prefix("nats://").or_else(|| server.strip_prefix("tls://")) else {
            return Err(bad("must start with nats:// or tls://"));
        };
        let authority = rest.rsplit_once('@').map_or(rest, |(_, host_port)| host_port);
        let (host, port) = match authority.rsplit_once(':') {
            // An IPv6 literal without a port: `[::1]`.
            Some((host, port)) if !port.ends_with(']') => (host, Some(port)),
            _ => (authority, None),
        };
        if host.is_empty() || host.contains(['/', '?', '#', ' ']) {
            return Err(bad("needs a host and nothing after the port"));
        }
        if let Some(port) = port {
            if port.parse::<u16>().map_or(true, |port| port == 0) {
                return Err(bad("has a port that is not a number from 1 to 65535"));
            }
        }
        if servers[..position].contains(server) {
            return Err(bad("is listed twice"));
        }
    }
    Ok(servers)
}

/// Checks a subject prefix: dot-separated tokens of letters, digits, `-` and `_`.
fn validate_prefix(prefix: &str) -> Result<(), String> {
    let ok = !prefix.is_empty()
        && prefix
            .split('.')
            .all(|token| !token.is_empty() && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    if ok {
        Ok(())
    } else {
        Err(format!("{prefix:?} is not a subject prefix (dot-separated tokens of letters, digits, - or _)"))
    }
}

/// Returns `Some(path)` unless the setting is empty.
fn some_path(path: &Path) -> Option<PathBuf> {
    (!path.as_os_str().is_empty()).then(|| path.to_path_buf())
}

/// Validates the `[nats]` authentication keys: at most one method, each complete.
fn nats_auth(raw: &RawNats) -> Result<NatsAuth, InvalidSetting> {
    let secret = |field: &str, value: &str, file: &Path| -> Result<Option<SecretSource>, InvalidSetting> {
        match (value.is_empty(), some_path(file)) {
            (true, None) => Ok(None),
            (false, None) => Ok(Some(SecretSource::Value(Secret::new(value.to_string())))),
            (true, Some(path)) => Ok(Some(SecretSource::File(path))),
            (false, Some(_)) => {
                Err(InvalidSetting::new(field, InvalidKind::Conflict, "give the secret or its file, not both"))
            }
        }
    };
    let password = secret("nats.password", &raw.password, &raw.password_file)?;
    let token = secret("nats.token", &raw.token, &raw.token_file)?;
    let nkey_seed = secret("nats.nkey_seed", &raw.nkey_seed, &raw.nkey_seed_file)?;
    let creds_file = some_path(&raw.creds_file);
    let user = (!raw.user.is_empty()).then(|| raw.user.clone());
    let methods = [user.is_some() || password.is_some(), token.is_some(), nkey_seed.is_some(), creds_file.is_some()];
    if methods.iter().filter(|set| **set).count() > 1 {
        return Err(InvalidSetting::new(
            "nats.user",
            InvalidKind::Conflict,
            "set at most one of user and password, token, nkey seed or creds file",
        ));
    }
    let incomplete = |field: &str, problem: &str| Err(InvalidSetting::new(field, InvalidKind::Incomplete, problem));
    Ok(match (user, password, token, nkey_seed, creds_file) {
        (Some(user), Some(password), ..) => NatsAuth::UserPassword { user, password },
        (Some(_), None, ..) => return incomplete("nats.password", "a user needs a password"),
        (None, Some(_), ..) => return incomplete("nats.user", "a password needs a user"),
        (_, _, Some(token), ..) => NatsAuth::Token(token),
        (_, _, _, Some(seed), _) => NatsAuth::NkeySeed(seed),
        (.., Some(path)) => NatsAuth::CredsFile(path),
        _ => NatsAuth::None,
    })
}

/// Validates the `[nats]` TLS keys: a client certificate needs its key and the reverse.
fn nats_tls(raw: &RawNats) -> Result<NatsTls, InvalidSetting> {
    let client_cert = match (some_path(&raw.tls_cert_file), some_path(&raw.tls_key_file)) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err(InvalidSetting::new(
                "nats.tls_cert_file",
                InvalidKind::Incomplete,
                "a client certificate needs its key (tls_key_file) and the reverse",
            ))
        }
    };
    Ok(NatsTls {
        ca_file: some_path(&raw.tls_ca_file),
        client_cert,
        required: raw.tls_required || raw.url.split(',').any(|server| server.trim().starts_with("tls://")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{defaults, load, Case};

    fn check(edit: impl FnOnce(&mut RawNats)) -> Result<NatsSettings, InvalidSetting> {
        let mut raw = defaults().nats;
        edit(&mut raw);
        NatsSettings::from_raw(raw)
    }

    #[test]
    fn the_defaults_connect_in_plain_text_without_credentials() {
        let settings = check(|_| {}).unwrap();
        assert_eq!((settings.url.as_str(), settings.subject_prefix.as_str()), ("nats://127.0.0.1:4222", "capdex.v1"));
        assert_eq!(settings.servers, ["nats://127.0.0.1:4222"]);
        assert_eq!((settings.auth, settings.tls), (NatsAuth::None, NatsTls::default()));
        let tls = check(|raw| {
            raw.tls_cert_file = "/c.pem".into();
            raw.tls_key_file = "/k.pem".into();
            raw.tls_ca_file = "/ca.pem".into();
        })
        .unwrap()
        .tls;
        assert_eq!(tls.client_cert, Some(("/c.pem".into(), "/k.pem".into())));
        assert_eq!(tls.ca_file, Some("/ca.pem".into()));
        assert!(!tls.required, "a nats:// URL with tls_required = false may be plain");
        let seed = check(|raw| raw.nkey_seed_file = "/seed".into()).unwrap().auth;
        assert_eq!(seed, NatsAuth::NkeySeed(SecretSource::File("/seed".into())));
    }

    #[test]
    fn each_invalid_value_names_its_key_and_kind() {
        use InvalidKind::*;
        let cases: Vec<Case<RawNats>> = vec![
            (Box::new(|r| r.url = "http://h:4222".into()), "nats.url", Malformed),
            (Box::new(|r| r.url = "nats://a:4222,".into()), "nats.url", Malformed),
            (Box::new(|r| r.url = "nats://a:4222,http://b:4222".into()), "nats.url", Malformed),
            (Box::new(|r| r.url = "nats://a:4222,nats://b:42x".into()), "nats.url", Malformed),
            (Box::new(|r| r.url = "nats://a:4222,nats://:4222".into()), "nats.url", Malformed),
            (Box::new(|r| r.url = "nats://a:0".into()), "nats.url", Malformed),
            (Box::new(|r| r.url = "nats://a:4222/path".into()), "nats.url", Malformed),
            (Box::new(|r| r.url = "nats://a:4222, nats://a:4222".into()), "nats.url", Malformed),
            (Box::new(|r| r.url = vec!["nats://h:1"; 33].join(",")), "nats.url", Malformed),
            (Box::new(|r| r.subject_prefix = "capdex..v1".into()), "nats.subject_prefix", Malformed),
            (Box::new(|r| r.subject_prefix = "capdex.*".into()), "nats.subject_prefix", Malformed),
            (Box::new(|r| r.service_name = String::new()), "nats.service_name", Malformed),
            (Box::new(|r| r.max_payload_bytes = 1023), "nats.max_payload_bytes", OutOfRange),
            (Box::new(|r| r.max_payload_bytes = 64 * 1024 * 1024 + 1), "nats.max_payload_bytes", OutOfRange),
            (Box::new(|r| r.user = "u".into()), "nats.password", Incomplete),
            (Box::new(|r| r.password_file = "/pw".into()), "nats.user", Incomplete),
            (
                Box::new(|r| {
                    r.token = "t".into();
                    r.creds_file = "/c.creds".into();
                }),
                "nats.user",
                Conflict,
            ),
            (
                Box::new(|r| {
                    r.nkey_seed = "SU".into();
                    r.nkey_seed_file = "/seed".into();
                }),
                "nats.nkey_seed",
                Conflict,
            ),
            (Box::new(|r| r.tls_key_file = "/k.pem".into()), "nats.tls_cert_file", Incomplete),
        ];
        for (edit, field, kind) in cases {
            let err = check(edit).unwrap_err();
            assert_eq!((err.field.as_str(), err.kind), (field, kind), "{err}");
        }
    }

    #[test]
    fn a_comma_separated_url_lists_the_servers_of_a_cluster_in_order() {
        let settings =
            check(|raw| raw.url = "nats://10.0.0.3:4222, nats://u:p@nats-1:4223,tls://[::1]:4224,nats://nats-2".into())
                .unwrap();
        assert_eq!(
            settings.servers,
            ["nats://10.0.0.3:4222", "nats://u:p@nats-1:4223", "tls://[::1]:4224", "nats://nats-2"]
        );
        assert!(settings.tls.required, "one tls:// server requires TLS for all");
        let message = check(|raw| raw.url = "nats://a:4222,nats://b:99999".into()).unwrap_err().to_string();
        assert!(message.contains("server 2 of") && message.contains("nats://b:99999"), "{message}");
    }

    #[test]
    fn the_environment_overrides_the_section() {
        let settings =
            load(&[("CAPDEX_NATS_SUBJECT_PREFIX", "acme.capdex"), ("CAPDEX_NATS_TLS_REQUIRED", "1")]).unwrap();
        assert_eq!(settings.nats.subject_prefix, "acme.capdex");
        assert!(settings.nats.tls.required);
    }
}
