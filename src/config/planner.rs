//! The `[planner]` section: what a turn plan does when discovery fails or
//! finds nothing, which tools it offers, and how often discovery is retried.

use super::error::{at_most, InvalidSetting};
use crate::core::kpi_window::ToolSelectionMode;
use crate::core::turn_planner::{PlannerDefaults, ToolFailureMode};
use serde::Deserialize;

/// `[planner]` as written; every key is documented in `config/capdex.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlanner {
    pub default_tool_failure_mode: ToolFailureMode,
    pub default_tool_selection_mode: ToolSelectionMode,
    pub discovery_max_retries: u32,
    pub discovery_retry_backoff_ms: u64,
}

/// The `[planner]` section, validated; [`super::Settings`] spreads it over its `planner*` fields.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannerSection {
    pub defaults: PlannerDefaults,
    pub discovery_max_retries: u32,
    pub discovery_retry_backoff_ms: u64,
}

impl PlannerSection {
    /// Checks the retry bounds (the modes are checked as they are read).
    pub fn from_raw(raw: RawPlanner) -> Result<PlannerSection, InvalidSetting> {
        Ok(PlannerSection {
            defaults: PlannerDefaults {
                tool_failure_mode: raw.default_tool_failure_mode,
                tool_selection_mode: raw.default_tool_selection_mode,
            },
            discovery_max_retries: at_most("planner.discovery_max_retries", raw.discovery_max_retries, 5)?,
            discovery_retry_backoff_ms: at_most(
                "planner.discovery_retry_backoff_ms",
                raw.discovery_retry_backoff_ms,
                10_000,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::error::InvalidKind;
    use crate::config::tests::{defaults, load};

    #[test]
    fn the_defaults_fail_open_with_one_retry() {
        let section = PlannerSection::from_raw(defaults().planner).unwrap();
        assert_eq!(section.defaults, PlannerDefaults::default());
        assert_eq!((section.discovery_max_retries, section.discovery_retry_backoff_ms), (1, 150));
    }

    #[test]
    fn each_invalid_value_names_its_key_and_kind() {
        for (edit, field) in [
            (
                Box::new(|r: &mut RawPlanner| r.discovery_max_retries = 6) as Box<dyn Fn(&mut RawPlanner)>,
                "planner.discovery_max_retries",
            ),
            (
                Box::new(|r: &mut RawPlanner| r.discovery_retry_backoff_ms = 10_001),
                "planner.discovery_retry_backoff_ms",
            ),
        ] {
            let mut raw = defaults().planner;
            edit(&mut raw);
            let err = PlannerSection::from_raw(raw).unwrap_err();
            assert_eq!((err.field.as_str(), err.kind), (field, InvalidKind::OutOfRange), "{err}");
        }
        let err = load(&[("CAPDEX_PLANNER_DEFAULT_TOOL_SELECTION_MODE", "some")]).unwrap_err();
        assert!(err.to_string().contains("some"), "a mode is checked as it is read: {err}");
    }

    #[test]
    fn the_environment_overrides_the_section() {
        let settings = load(&[
            ("CAPDEX_PLANNER_DEFAULT_TOOL_FAILURE_MODE", "fail_closed"),
            ("CAPDEX_PLANNER_DISCOVERY_MAX_RETRIES", "0"),
        ])
        .unwrap();
        assert_eq!(settings.planner.tool_failure_mode, ToolFailureMode::FailClosed);
        assert_eq!(settings.planner_discovery_max_retries, 0);
    }
}
