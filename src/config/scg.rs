//! The `[scg]` section: the Source Capability Graph's path roots and memory half-life.

use super::error::{in_range, InvalidSetting};
use serde::Deserialize;
use std::path::PathBuf;

/// `[scg]` as written; documented in `config/capdex.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawScg {
    pub map_path_roots: Vec<PathBuf>,
    pub memory_half_life_ms: u64,
}

/// The Source Capability Graph's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScgSettings {
    /// Folders `capdex.v1.map` may read sources from by path; empty refuses paths.
    pub map_path_roots: Vec<PathBuf>,
    /// Half-life of a memory note's influence, in milliseconds (at least 1).
    pub memory_half_life_ms: u64,
}

/// The longest memory half-life: ten years of days, in milliseconds.
const MAX_MEMORY_HALF_LIFE_MS: u64 = 3650 * 86_400_000;

impl ScgSettings {
    /// Checks the half-life bounds.
    pub fn from_raw(raw: RawScg) -> Result<ScgSettings, InvalidSetting> {
        Ok(ScgSettings {
            map_path_roots: raw.map_path_roots,
            memory_half_life_ms: in_range(
                "scg.memory_half_life_ms",
                raw.memory_half_life_ms,
                1..=MAX_MEMORY_HALF_LIFE_MS,
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
    fn the_defaults_refuse_every_path_and_halve_in_a_week() {
        let settings = ScgSettings::from_raw(defaults().scg).unwrap();
        assert_eq!(settings, ScgSettings { map_path_roots: vec![], memory_half_life_ms: 7 * 86_400_000 });
    }

    #[test]
    fn the_half_life_is_bounded() {
        for bad in [0, MAX_MEMORY_HALF_LIFE_MS + 1] {
            let err = ScgSettings::from_raw(RawScg { map_path_roots: vec![], memory_half_life_ms: bad }).unwrap_err();
            assert_eq!((err.field.as_str(), err.kind), ("scg.memory_half_life_ms", InvalidKind::OutOfRange), "{bad}");
        }
    }

    #[test]
    fn the_environment_overrides_the_section() {
        let settings = load(&[("CAPDEX_SCG_MAP_PATH_ROOTS", "/srv/a:/srv/b")]).unwrap();
        assert_eq!(settings.scg.map_path_roots, [PathBuf::from("/srv/a"), PathBuf::from("/srv/b")]);
    }
}
