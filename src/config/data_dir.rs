//! The top-level `data_dir` key: where capdex keeps its state (sled).

use super::error::{InvalidKind, InvalidSetting};
use std::path::PathBuf;

/// Checks `data_dir`: any folder, but not an empty path.
pub fn data_dir_from_raw(raw: PathBuf) -> Result<PathBuf, InvalidSetting> {
    if raw.as_os_str().is_empty() {
        return Err(InvalidSetting::new("data_dir", InvalidKind::Empty, "must not be empty"));
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{defaults, load};

    #[test]
    fn data_dir_is_any_folder_but_not_empty() {
        assert_eq!(data_dir_from_raw(defaults().data_dir).unwrap(), PathBuf::from("data"));
        let err = data_dir_from_raw(PathBuf::new()).unwrap_err();
        assert_eq!((err.field.as_str(), err.kind), ("data_dir", InvalidKind::Empty));
        assert_eq!(load(&[("CAPDEX_DATA_DIR", "/var/lib/capdex")]).unwrap().data_dir, PathBuf::from("/var/lib/capdex"));
        let err = load(&[("CAPDEX_DATA_DIR", "")]).unwrap_err();
        assert_eq!(err.to_string(), "setting data_dir is not valid: must not be empty");
    }
}
