//! The top-level keys for reading capability folders from disk:
//! `capability_dirs` (a leading `~` is the home folder of the given
//! [`Environment`]), the file size limits, and watching for changes.

use super::environment::Environment;
use super::error::in_range;
use super::error::InvalidSetting;
use crate::core::manifest::ScanLimits;
use std::path::PathBuf;

/// The scanning keys as written (top level of `config/capdex.toml`).
#[derive(Clone, Debug)]
pub struct RawScanning {
    pub capability_dirs: Vec<PathBuf>,
    pub max_manifest_bytes: u64,
    pub max_attachment_bytes: u64,
    pub watch: bool,
    pub watch_debounce_ms: u64,
}

/// The scanning keys, validated; [`super::Settings`] spreads them over its fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanningSection {
    /// With a leading `~` replaced by the home folder.
    pub capability_dirs: Vec<PathBuf>,
    pub scan_limits: ScanLimits,
    pub watch: bool,
    pub watch_debounce_ms: u64,
}

/// The largest file size limit, in bytes (64 MiB).
const MAX_FILE_LIMIT_BYTES: u64 = 64 * 1024 * 1024;

impl ScanningSection {
    /// Checks the size limits and expands `~` with the home folder of `env`.
    pub fn from_raw(raw: RawScanning, env: &Environment) -> Result<ScanningSection, InvalidSetting> {
        let scan_limits = ScanLimits {
            max_manifest_bytes: in_range("max_manifest_bytes", raw.max_manifest_bytes, 1..=MAX_FILE_LIMIT_BYTES)?,
            max_attachment_bytes: in_range("max_attachment_bytes", raw.max_attachment_bytes, 1..=MAX_FILE_LIMIT_BYTES)?,
            text: crate::core::limits::Limits::default(),
        };
        Ok(ScanningSection {
            capability_dirs: raw.capability_dirs.into_iter().map(|dir| env.expand_home(dir)).collect(),
            scan_limits,
            watch: raw.watch,
            watch_debounce_ms: raw.watch_debounce_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::error::InvalidKind;
    use crate::config::tests::{defaults, load};

    fn raw() -> RawScanning {
        let raw = defaults();
        RawScanning {
            capability_dirs: raw.capability_dirs,
            max_manifest_bytes: raw.max_manifest_bytes,
            max_attachment_bytes: raw.max_attachment_bytes,
            watch: raw.watch,
            watch_debounce_ms: raw.watch_debounce_ms,
        }
    }

    #[test]
    fn the_user_folder_comes_from_the_given_home() {
        let env: Environment = [("HOME", "/home/ada")].into_iter().collect();
        let section = ScanningSection::from_raw(raw(), &env).unwrap();
        assert_eq!(
            section.capability_dirs,
            [PathBuf::from("/home/ada/.capdex/capabilities"), PathBuf::from(".capdex/capabilities")]
        );
        assert_eq!(section.scan_limits, ScanLimits::default(), "the file's limits are the scanner's defaults");
        assert!(section.watch);
        assert_eq!(section.watch_debounce_ms, 500);
        let homeless = ScanningSection::from_raw(raw(), &Environment::default()).unwrap();
        assert_eq!(homeless.capability_dirs[0], PathBuf::from("~/.capdex/capabilities"), "no HOME, no expansion");
    }

    #[test]
    fn each_invalid_limit_names_its_key() {
        for (field, edit) in [
            ("max_manifest_bytes", (|r: &mut RawScanning| r.max_manifest_bytes = 0) as fn(&mut RawScanning)),
            ("max_attachment_bytes", |r| r.max_attachment_bytes = MAX_FILE_LIMIT_BYTES + 1),
        ] {
            let mut raw = raw();
            edit(&mut raw);
            let err = ScanningSection::from_raw(raw, &Environment::default()).unwrap_err();
            assert_eq!((err.field.as_str(), err.kind), (field, InvalidKind::OutOfRange), "{err}");
        }
    }

    #[test]
    fn the_environment_overrides_and_adds_folders() {
        let settings = load(&[
            ("HOME", "/home/ada"),
            ("CAPDEX_CAPABILITY_DIRS", "/extra"),
            ("CAPDEX_MAX_MANIFEST_BYTES", "1000"),
            ("CAPDEX_WATCH", "false"),
        ])
        .unwrap();
        assert_eq!(settings.capability_dirs.len(), 3);
        assert_eq!(settings.capability_dirs[0], PathBuf::from("/home/ada/.capdex/capabilities"));
        assert_eq!(settings.capability_dirs[2], PathBuf::from("/extra"));
        assert_eq!(settings.scan_limits.max_manifest_bytes, 1000);
        assert!(!settings.watch);
    }
}
