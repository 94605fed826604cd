//! The `[dispatch]` section: call timeouts, approvals, bindings, rate windows
//! the SSRF allowlist and the `${env:VAR}` allowlist.

use super::error::{in_range, InvalidKind, InvalidSetting};
use crate::core::dispatch::{env_template::EnvAllow, pipeline::BindingMode, registry, ssrf::Cidr};
use serde::Deserialize;

/// `[dispatch]` as written; every key is documented in `config/capdex.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDispatch {
    pub default_timeout_ms: u64,
    pub approval_ttl_ms: u64,
    pub binding_mode: String,
    pub rate_window_ms: u64,
    pub ssrf_allowlist: Vec<String>,
    pub env_allow: Vec<String>,
}

/// Dispatch settings (`[dispatch]` in config/capdex.toml).
#[derive(Clone, Debug)]
pub struct DispatchSettings {
    pub default_timeout_ms: u64,
    pub approval_ttl_ms: u64,
    pub binding_mode: BindingMode,
    pub rate_window_ms: u64,
    pub ssrf_allowlist: Vec<Cidr>,
    /// The variables a client's `${env:VAR}` may read (`env_allow`).
    pub env_allow: EnvAllow,
    /// The longest id a call, a registration or a binding may give (`[limits] max_id_bytes`).
    pub max_id_bytes: usize,
}

impl DispatchSettings {
    /// Checks the bounds, the binding mode and every allowlist CIDR; ids are
    /// at most `max_id_bytes` (`[limits]`, checked there).
    pub fn from_raw(raw: RawDispatch, max_id_bytes: usize) -> Result<DispatchSettings, InvalidSetting> {
        in_range("dispatch.default_timeout_ms", raw.default_timeout_ms, 1..=registry::MAX_CALL_TIMEOUT_MS)?;
        in_range("dispatch.approval_ttl_ms", raw.approval_ttl_ms, 1..=7 * 86_400_000)?;
        in_range("dispatch.rate_window_ms", raw.rate_window_ms, 1_000..=3_600_000)?;
        let binding_mode = match raw.binding_mode.as_str() {
            "open" => BindingMode::Open,
            "strict" => BindingMode::Strict,
            other => {
                return Err(InvalidSetting::new(
                    "dispatch.binding_mode",
                    InvalidKind::UnknownChoice,
                    format!("must be \"open\" or \"strict\", got {other:?}"),
                ))
            }
        };
        let ssrf_allowlist = raw
            .ssrf_allowlist
            .iter()
            .map(|entry| {
                Cidr::parse(entry)
                    .map_err(|problem| InvalidSetting::new("dispatch.ssrf_allowlist", InvalidKind::Malformed, problem))
            })
            .collect::<Result<_, _>>()?;
        let env_allow = EnvAllow::parse(&raw.env_allow)
            .map_err(|problem| InvalidSetting::new("dispatch.env_allow", InvalidKind::Malformed, problem))?;
        Ok(DispatchSettings {
            default_timeout_ms: raw.default_timeout_ms,
            approval_ttl_ms: raw.approval_ttl_ms,
            binding_mode,
            rate_window_ms: raw.rate_window_ms,
            ssrf_allowlist,
            env_allow,
            max_id_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{defaults, load, Case};

    fn check(edit: impl FnOnce(&mut RawDispatch)) -> Result<DispatchSettings, InvalidSetting> {
        let mut raw = defaults().dispatch;
        edit(&mut raw);
        DispatchSettings::from_raw(raw, crate::core::limits::Limits::default().max_id_bytes)
    }

    #[test]
    fn the_defaults_are_open_with_an_empty_allowlist() {
        let settings = check(|_| {}).unwrap();
        assert_eq!(settings.binding_mode, BindingMode::Open);
        assert!(settings.ssrf_allowlist.is_empty());
        assert_eq!(settings.env_allow, EnvAllow::default(), "CAPDEX_SECRET_* only");
        assert!(!settings.env_allow.allows("HOME"));
        assert_eq!((settings.default_timeout_ms, settings.rate_window_ms), (10_000, 60_000));
        let strict = check(|raw| {
            raw.binding_mode = "strict".into();
            raw.ssrf_allowlist = vec!["127.0.0.1/32".into(), "fd00::/8".into()];
        })
        .unwrap();
        assert_eq!((strict.binding_mode, strict.ssrf_allowlist.len()), (BindingMode::Strict, 2));
    }

    #[test]
    fn each_invalid_value_names_its_key_and_kind() {
        use InvalidKind::*;
        let cases: Vec<Case<RawDispatch>> = vec![
            (Box::new(|r| r.default_timeout_ms = 0), "dispatch.default_timeout_ms", OutOfRange),
            (
                Box::new(|r| r.default_timeout_ms = registry::MAX_CALL_TIMEOUT_MS + 1),
                "dispatch.default_timeout_ms",
                OutOfRange,
            ),
            (Box::new(|r| r.approval_ttl_ms = 7 * 86_400_000 + 1), "dispatch.approval_ttl_ms", OutOfRange),
            (Box::new(|r| r.rate_window_ms = 999), "dispatch.rate_window_ms", OutOfRange),
            (Box::new(|r| r.binding_mode = "closed".into()), "dispatch.binding_mode", UnknownChoice),
            (Box::new(|r| r.ssrf_allowlist = vec!["10.0.0.0/33".into()]), "dispatch.ssrf_allowlist", Malformed),
            (Box::new(|r| r.env_allow = vec!["home".into()]), "dispatch.env_allow", Malformed),
        ];
        for (edit, field, kind) in cases {
            let err = check(edit).unwrap_err();
            assert_eq!((err.field.as_str(), err.kind), (field, kind), "{err}");
        }
    }

    #[test]
    fn the_environment_overrides_the_section() {
        let settings =
            load(&[("CAPDEX_DISPATCH_SSRF_ALLOWLIST", "10.0.0.0/8"), ("CAPDEX_DISPATCH_BINDING_MODE", "strict")])
                .unwrap();
        assert_eq!(settings.dispatch.ssrf_allowlist.len(), 1);
        assert_eq!(settings.dispatch.binding_mode, BindingMode::Strict);
        let settings = load(&[
            ("CAPDEX_DISPATCH_ENV_ALLOW", "CAPDEX_SECRET_*, STRIPE_*"),
            ("CAPDEX_SECRET_STRIPE", "not a setting, and not refused as one"),
        ])
        .unwrap();
        assert_eq!(settings.dispatch.env_allow.patterns(), ["CAPDEX_SECRET_*", "STRIPE_*"], "comma-separated");
        let err = load(&[("CAPDEX_DISPATCH_ENV_ALLOW", "lower")]).unwrap_err();
        assert!(err.to_string().contains("dispatch.env_allow"), "{err}");
    }
}
