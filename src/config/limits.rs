//! The `[limits]` section: limits on everything from outside (`core::limits`),
//! each a setting with a default and a `CAPDEX_LIMITS_*` override.

use super::error::{in_range, InvalidSetting};
use crate::core::limits::Limits;
use serde::Deserialize;

/// `[limits]` as written; documented in `config/capdex.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub max_json_depth: usize,
    pub max_yaml_depth: usize,
    pub max_yaml_aliases: usize,
    pub max_tools_per_source: usize,
    pub max_operations_per_spec: usize,
    pub max_ref_hops: usize,
    pub max_id_bytes: usize,
    pub max_capabilities_per_outcome: usize,
    pub max_excluded_capabilities: usize,
    pub max_tool_pages: usize,
    pub max_anchors: usize,
}

/// The deepest nesting a setting may allow: serde_json and serde_norway refuse
/// deeper documents on their own (at 128), so a larger value would mean nothing.
const MAX_DEPTH: usize = 128;

/// Checks each limit's range.
pub fn limits_from_raw(raw: RawLimits) -> Result<Limits, InvalidSetting> {
    Ok(Limits {
        max_json_depth: in_range("limits.max_json_depth", raw.max_json_depth, 1..=MAX_DEPTH)?,
        max_yaml_depth: in_range("limits.max_yaml_depth", raw.max_yaml_depth, 1..=MAX_DEPTH)?,
        max_yaml_aliases: in_range("limits.max_yaml_aliases", raw.max_yaml_aliases, 0..=100_000)?,
        max_tools_per_source: in_range("limits.max_tools_per_source", raw.max_tools_per_source, 1..=1_000_000)?,
        max_operations_per_spec: in_range(
            "limits.max_operations_per_spec",
            raw.max_operations_per_spec,
            1..=1_000_000,
        )?,
        max_ref_hops: in_range("limits.max_ref_hops", raw.max_ref_hops, 1..=crate::core::scg::schema::MAX_REF_HOPS)?,
        max_id_bytes: in_range("limits.max_id_bytes", raw.max_id_bytes, crate::core::limits::MAX_ID_BYTES_RANGE)?,
        max_capabilities_per_outcome: in_range(
            "limits.max_capabilities_per_outcome",
            raw.max_capabilities_per_outcome,
            1..=100_000,
        )?,
        max_excluded_capabilities: in_range(
            "limits.max_excluded_capabilities",
            raw.max_excluded_capabilities,
            0..=100_000,
        )?,
        max_tool_pages: in_range("limits.max_tool_pages", raw.max_tool_pages, 1..=100_000)?,
        max_anchors: in_range("limits.max_anchors", raw.max_anchors, 1..=1_000)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::error::InvalidKind;
    use crate::config::tests::{defaults, load};

    #[test]
    fn the_file_s_defaults_are_the_core_s() {
        assert_eq!(limits_from_raw(defaults().limits).unwrap(), Limits::default());
    }

    #[test]
    fn each_limit_has_an_override_and_a_range() {
        let settings =
            load(&[("CAPDEX_LIMITS_MAX_JSON_DEPTH", "12"), ("CAPDEX_LIMITS_MAX_TOOLS_PER_SOURCE", "7")]).unwrap();
        assert_eq!((settings.limits.max_json_depth, settings.limits.max_tools_per_source), (12, 7));
        let settings = load(&[("CAPDEX_LIMITS_MAX_ID_BYTES", "256")]).unwrap();
        assert_eq!(settings.limits.max_id_bytes, 256);
        assert_eq!(
            (settings.dispatch.max_id_bytes, settings.kpi.outcome_limits.max_id_bytes),
            (256, 256),
            "the dispatcher and the KPI read the one setting"
        );
        let settings = load(&[("CAPDEX_LIMITS_MAX_CAPABILITIES_PER_OUTCOME", "3")]).unwrap();
        assert_eq!(settings.limits.max_capabilities_per_outcome, 3);
        assert_eq!(settings.kpi.outcome_limits.max_capabilities, 3, "the KPI reads it");
        let settings = load(&[("CAPDEX_LIMITS_MAX_EXCLUDED_CAPABILITIES", "0")]).unwrap();
        assert_eq!(settings.limits.max_excluded_capabilities, 0, "0: a query may exclude nothing");
        for (variable, value, field) in [
            ("CAPDEX_LIMITS_MAX_JSON_DEPTH", "0", "limits.max_json_depth"),
            ("CAPDEX_LIMITS_MAX_YAML_DEPTH", "129", "limits.max_yaml_depth"),
            ("CAPDEX_LIMITS_MAX_OPERATIONS_PER_SPEC", "0", "limits.max_operations_per_spec"),
            ("CAPDEX_LIMITS_MAX_REF_HOPS", "0", "limits.max_ref_hops"),
            ("CAPDEX_LIMITS_MAX_REF_HOPS", "33", "limits.max_ref_hops"),
            ("CAPDEX_LIMITS_MAX_ID_BYTES", "63", "limits.max_id_bytes"),
            ("CAPDEX_LIMITS_MAX_ID_BYTES", "257", "limits.max_id_bytes"),
            ("CAPDEX_LIMITS_MAX_CAPABILITIES_PER_OUTCOME", "0", "limits.max_capabilities_per_outcome"),
            ("CAPDEX_LIMITS_MAX_CAPABILITIES_PER_OUTCOME", "100001", "limits.max_capabilities_per_outcome"),
            ("CAPDEX_LIMITS_MAX_EXCLUDED_CAPABILITIES", "100001", "limits.max_excluded_capabilities"),
            ("CAPDEX_LIMITS_MAX_TOOL_PAGES", "0", "limits.max_tool_pages"),
            ("CAPDEX_LIMITS_MAX_ANCHORS", "1001", "limits.max_anchors"),
        ] {
            let err = load(&[(variable, value)]).unwrap_err().to_string();
            assert!(err.contains(field), "{variable}={value}: {err}");
        }
        let _ = InvalidKind::OutOfRange;
    }
}
