//! The `[kpi]` section: the rolling window and its scopes, alerts, adaptive
//! execution and per-scope gauges. The outcome prior is configured under
//! `[discovery]` but kept by the KPI actor, so [`KpiSettings`] carries it too.

use super::error::{at_most, in_range, unit_rate, InvalidKind, InvalidSetting};
use crate::core::kpi_window::{AlertPolicy, OutcomeLimits, ScopeMode, WindowSpec};
use crate::core::outcome_prior::OutcomePriorSettings;
use crate::core::turn_planner::AdaptivePolicy;
use serde::Deserialize;

/// `[kpi]` as written; every key is documented in `config/capdex.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKpi {
    pub rolling_window_size: usize,
    pub scope: ScopeMode,
    pub emit_alerts: bool,
    pub alert_below_weighted_success_rate: f32,
    pub alert_min_samples: usize,
    pub alert_cooldown_ms: u64,
    pub horizon_ms: u64,
    pub adaptive_enabled: bool,
    pub adaptive_min_samples: usize,
    pub adaptive_min_weighted_success_rate: f32,
    pub adaptive_recover_weighted_success_rate: f32,
    pub adaptive_force_all_tools_when_degraded: bool,
    pub adaptive_force_fail_open_when_degraded: bool,
    pub metrics_max_scopes: usize,
}

#[derive(Clone, Debug)]
pub struct KpiSettings {
    pub window: WindowSpec,
    pub scope: ScopeMode,
    pub alerts: AlertPolicy,
    pub adaptive: AdaptivePolicy,
    /// The outcome prior's settings (`[discovery] outcome_prior*`).
    pub prior: OutcomePriorSettings,
    /// At most one prior is sent to the Discoverer per this many milliseconds (0: after every change).
    pub prior_publish_interval_ms: u64,
    /// Scopes that get per-scope Prometheus gauges (the first ones seen).
    pub metrics_max_scopes: usize,
    /// What an outcome may give (`[limits] max_id_bytes`, `max_capabilities_per_outcome`).
    pub outcome_limits: OutcomeLimits,
}

const DAY_MS: u64 = 86_400_000;

impl KpiSettings {
    /// Checks the section; `prior` and `prior_publish_interval_ms` come
    /// validated from `[discovery]`, `outcome_limits` from `[limits]`.
    pub fn from_raw(
        raw: RawKpi,
        prior: OutcomePriorSettings,
        prior_publish_interval_ms: u64,
        outcome_limits: OutcomeLimits,
    ) -> Result<KpiSettings, InvalidSetting> {
        let window_size = in_range("kpi.rolling_window_size", raw.rolling_window_size, 1..=100_000)?;
        let threshold = unit_rate("kpi.alert_below_weighted_success_rate", raw.alert_below_weighted_success_rate)?;
        let adaptive_min = unit_rate("kpi.adaptive_min_weighted_success_rate", raw.adaptive_min_weighted_success_rate)?;
        let adaptive_recover =
            unit_rate("kpi.adaptive_recover_weighted_success_rate", raw.adaptive_recover_weighted_success_rate)?;
        if adaptive_recover < adaptive_min {
            return Err(InvalidSetting::new(
                "kpi.adaptive_recover_weighted_success_rate",
                InvalidKind::Conflict,
                format!(
                    "must be at least kpi.adaptive_min_weighted_success_rate ({adaptive_min}), got {adaptive_recover}"
                ),
            ));
        }
        for (field, value) in
            [("kpi.alert_min_samples", raw.alert_min_samples), ("kpi.adaptive_min_samples", raw.adaptive_min_samples)]
        {
            if !(1..=window_size).contains(&value) {
                return Err(InvalidSetting::out_of_range(
                    field,
                    format!("must be in 1..=kpi.rolling_window_size ({window_size}), got {value}"),
                ));
            }
        }
        at_most("kpi.alert_cooldown_ms", raw.alert_cooldown_ms, DAY_MS)?;
        at_most("kpi.horizon_ms", raw.horizon_ms, 365 * DAY_MS)?;
        at_most("kpi.metrics_max_scopes", raw.metrics_max_scopes, 10_000)?;
        let window = WindowSpec::new(window_size, raw.horizon_ms)
            .ok_or_else(|| InvalidSetting::out_of_range("kpi.rolling_window_size", "must not be 0"))?;
        Ok(KpiSettings {
            window,
            scope: raw.scope,
            alerts: AlertPolicy {
                enabled: raw.emit_alerts,
                below_weighted_success_rate: threshold,
                min_samples: raw.alert_min_samples,
                cooldown_ms: raw.alert_cooldown_ms,
            },
            adaptive: AdaptivePolicy {
                enabled: raw.adaptive_enabled,
                min_samples: raw.adaptive_min_samples,
                min_weighted_success_rate: adaptive_min,
                recover_weighted_success_rate: adaptive_recover,
                force_all_tools_when_degraded: raw.adaptive_force_all_tools_when_degraded,
                force_fail_open_when_degraded: raw.adaptive_force_fail_open_when_degraded,
            },
            prior,
            prior_publish_interval_ms,
            metrics_max_scopes: raw.metrics_max_scopes,
            outcome_limits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{defaults, load, Case};

    fn check(edit: impl FnOnce(&mut RawKpi)) -> Result<KpiSettings, InvalidSetting> {
        let mut raw = defaults().kpi;
        edit(&mut raw);
        KpiSettings::from_raw(raw, OutcomePriorSettings::default(), 0, OutcomeLimits::default())
    }

    #[test]
    fn the_defaults_are_the_design_defaults() {
        let settings = check(|_| {}).unwrap();
        assert_eq!(settings.window, WindowSpec::new(100, 0).unwrap());
        assert_eq!(settings.scope, ScopeMode::OrganizationPersona);
        assert_eq!(settings.alerts, AlertPolicy::default());
        assert_eq!(settings.adaptive, AdaptivePolicy::default());
        assert_eq!(settings.metrics_max_scopes, 100);
        let equal = check(|raw| raw.adaptive_recover_weighted_success_rate = raw.adaptive_min_weighted_success_rate);
        assert!(equal.is_ok(), "recovering at the minimum itself is allowed");
    }

    #[test]
    fn each_invalid_value_names_its_key_and_kind() {
        use InvalidKind::*;
        let cases: Vec<Case<RawKpi>> = vec![
            (Box::new(|r| r.rolling_window_size = 0), "kpi.rolling_window_size", OutOfRange),
            (Box::new(|r| r.rolling_window_size = 100_001), "kpi.rolling_window_size", OutOfRange),
            (
                Box::new(|r| r.alert_below_weighted_success_rate = f32::NAN),
                "kpi.alert_below_weighted_success_rate",
                OutOfRange,
            ),
            (
                Box::new(|r| r.adaptive_min_weighted_success_rate = -0.5),
                "kpi.adaptive_min_weighted_success_rate",
                OutOfRange,
            ),
            (
                Box::new(|r| r.adaptive_recover_weighted_success_rate = 0.5),
                "kpi.adaptive_recover_weighted_success_rate",
                Conflict,
            ),
            (Box::new(|r| r.alert_min_samples = 0), "kpi.alert_min_samples", OutOfRange),
            (Box::new(|r| r.adaptive_min_samples = 101), "kpi.adaptive_min_samples", OutOfRange),
            (Box::new(|r| r.alert_cooldown_ms = DAY_MS + 1), "kpi.alert_cooldown_ms", OutOfRange),
            (Box::new(|r| r.horizon_ms = 365 * DAY_MS + 1), "kpi.horizon_ms", OutOfRange),
            (Box::new(|r| r.metrics_max_scopes = 10_001), "kpi.metrics_max_scopes", OutOfRange),
        ];
        for (edit, field, kind) in cases {
            let err = check(edit).unwrap_err();
            assert_eq!((err.field.as_str(), err.kind), (field, kind), "{err}");
        }
    }

    #[test]
    fn the_environment_overrides_the_section() {
        let settings = load(&[("CAPDEX_KPI_SCOPE", "global"), ("CAPDEX_KPI_HORIZON_MS", "60000")]).unwrap();
        assert_eq!(settings.kpi.scope, ScopeMode::Global);
        assert_eq!(settings.kpi.window, WindowSpec::new(100, 60_000).unwrap());
    }
}
