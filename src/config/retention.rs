//! The `[retention]` section: the age and count limits of every store that
//! grows, and how often the sweep applies them (see `actors::retention`).

use super::error::{at_most, in_range, InvalidSetting};
use crate::core::retention::Limits;
use serde::Deserialize;

/// `[retention]` as written; every key is documented in `config/capdex.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetention {
    pub sweep_interval_ms: u64,
    pub provenance_max_age_ms: u64,
    pub provenance_max_count: usize,
    pub redrive_max_age_ms: u64,
    pub redrive_max_count: usize,
    pub approvals_max_age_ms: u64,
    pub approvals_max_count: usize,
    pub memory_max_age_ms: u64,
    pub memory_max_count: usize,
    pub outcome_ids_max_age_ms: u64,
    pub outcome_ids_max_count: usize,
    pub kpi_max_age_ms: u64,
    pub kpi_max_count: usize,
    pub outcome_prior_max_count: usize,
    pub dispatch_figures_max_count: usize,
}

/// The limits of each store that grows, and the sweep's interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionSettings {
    pub sweep_interval_ms: u64,
    pub provenance: Limits,
    pub redrive: Limits,
    pub approvals: Limits,
    pub memory: Limits,
    pub outcome_ids: Limits,
    /// KPI scopes (their windows and alert state), by their last update.
    pub kpi: Limits,
    /// The most capabilities the outcome prior's statistics track (`OutcomeStats`).
    pub outcome_prior_max_count: usize,
    /// The most capabilities the dispatcher keeps call figures for (`DispatchFigures`).
    pub dispatch_figures_max_count: usize,
}

/// The longest age a limit may name: ten years, in milliseconds.
const MAX_AGE_MS: u64 = 10 * 365 * 86_400_000;
/// The largest count a limit may name.
const MAX_COUNT: usize = 1_000_000_000;
/// The most capabilities a table in memory may be set to track.
const MAX_TRACKED: usize = 10_000_000;

impl RetentionSettings {
    /// Checks the section: the interval in 100 ms..1 day, ages at most ten years.
    pub fn from_raw(raw: RawRetention) -> Result<RetentionSettings, InvalidSetting> {
        let limits = |name: &str, max_age_ms: u64, max_count: usize| -> Result<Limits, InvalidSetting> {
            Ok(Limits {
                max_age_ms: at_most(&format!("retention.{name}_max_age_ms"), max_age_ms, MAX_AGE_MS)?,
                max_count: at_most(&format!("retention.{name}_max_count"), max_count, MAX_COUNT)?,
            })
        };
        Ok(RetentionSettings {
            sweep_interval_ms: in_range("retention.sweep_interval_ms", raw.sweep_interval_ms, 100..=86_400_000)?,
            provenance: limits("provenance", raw.provenance_max_age_ms, raw.provenance_max_count)?,
            redrive: limits("redrive", raw.redrive_max_age_ms, raw.redrive_max_count)?,
            approvals: limits("approvals", raw.approvals_max_age_ms, raw.approvals_max_count)?,
            memory: limits("memory", raw.memory_max_age_ms, raw.memory_max_count)?,
            outcome_ids: limits("outcome_ids", raw.outcome_ids_max_age_ms, raw.outcome_ids_max_count)?,
            kpi: limits("kpi", raw.kpi_max_age_ms, raw.kpi_max_count)?,
            // Bounds of tables in memory: never off, so at least 1.
            outcome_prior_max_count: in_range(
                "retention.outcome_prior_max_count",
                raw.outcome_prior_max_count,
                1..=MAX_TRACKED,
            )?,
            dispatch_figures_max_count: in_range(
                "retention.dispatch_figures_max_count",
                raw.dispatch_figures_max_count,
                1..=MAX_TRACKED,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::defaults;

    #[test]
    fn defaults_bound_every_store_and_bad_values_are_named() {
        let settings = RetentionSettings::from_raw(defaults().retention).unwrap();
        assert_eq!(settings.sweep_interval_ms, 60_000);
        for limits in [
            settings.provenance,
            settings.redrive,
            settings.approvals,
            settings.memory,
            settings.outcome_ids,
            settings.kpi,
        ] {
            assert!(limits.max_age_ms > 0 && limits.max_count > 0, "{limits:?}");
        }
        let mut raw = defaults().retention;
        raw.sweep_interval_ms = 99;
        assert_eq!(RetentionSettings::from_raw(raw).unwrap_err().field, "retention.sweep_interval_ms");
        let mut raw = defaults().retention;
        raw.memory_max_age_ms = MAX_AGE_MS + 1;
        assert_eq!(RetentionSettings::from_raw(raw).unwrap_err().field, "retention.memory_max_age_ms");
        let mut raw = defaults().retention;
        raw.kpi_max_count = MAX_COUNT + 1;
        assert_eq!(RetentionSettings::from_raw(raw).unwrap_err().field, "retention.kpi_max_count");
        let settings = crate::config::tests::load(&[
            ("CAPDEX_RETENTION_KPI_MAX_AGE_MS", "1000"),
            ("CAPDEX_RETENTION_KPI_MAX_COUNT", "3"),
        ])
        .unwrap();
        assert_eq!(settings.retention.kpi, Limits { max_age_ms: 1000, max_count: 3 });
        assert_eq!(
            (settings.retention.outcome_prior_max_count, settings.retention.dispatch_figures_max_count),
            (
                crate::core::outcome_prior::DEFAULT_MAX_TRACKED_CAPABILITIES,
                crate::core::dispatch::figures::DEFAULT_MAX_CAPABILITIES
            ),
            "the file's defaults are the core's"
        );
        for (edit, field) in [
            (
                Box::new(|r: &mut RawRetention| r.outcome_prior_max_count = 0) as Box<dyn Fn(&mut RawRetention)>,
                "retention.outcome_prior_max_count",
            ),
            (Box::new(|r| r.outcome_prior_max_count = MAX_TRACKED + 1), "retention.outcome_prior_max_count"),
            (Box::new(|r| r.dispatch_figures_max_count = 0), "retention.dispatch_figures_max_count"),
            (Box::new(|r| r.dispatch_figures_max_count = MAX_TRACKED + 1), "retention.dispatch_figures_max_count"),
        ] {
            let mut raw = defaults().retention;
            edit(&mut raw);
            assert_eq!(RetentionSettings::from_raw(raw).unwrap_err().field, field);
        }
        let settings = crate::config::tests::load(&[
            ("CAPDEX_RETENTION_OUTCOME_PRIOR_MAX_COUNT", "7"),
            ("CAPDEX_RETENTION_DISPATCH_FIGURES_MAX_COUNT", "9"),
        ])
        .unwrap();
        assert_eq!((settings.retention.outcome_prior_max_count, settings.retention.dispatch_figures_max_count), (7, 9));
        let mut raw = defaults().retention;
        raw.provenance_max_count = 0;
        assert_eq!(
            RetentionSettings::from_raw(raw).unwrap().provenance,
            Limits { max_age_ms: 2_592_000_000, max_count: 0 }
        );
    }
}
