//! The process environment as a value: built once from `std::env::vars()` by
//! the binary (or from a map in tests) and handed to [`super::Settings::load`],
//! so nothing in config reads the environment itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Environment variables by name: the `CAPDEX_*` overrides and `HOME`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    vars: BTreeMap<String, String>,
}

impl Environment {
    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// The home folder (`HOME`), if set.
    pub fn home(&self) -> Option<&Path> {
        self.get("HOME").map(Path::new)
    }

    /// Every variable whose name starts with `prefix`, in name order.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        self.vars.iter().filter(move |(name, _)| name.starts_with(prefix)).map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// `path` with a leading `~` replaced by the home folder; unchanged without one.
    pub fn expand_home(&self, path: PathBuf) -> PathBuf {
        match (path.strip_prefix("~"), self.home()) {
            (Ok(rest), Some(home)) => home.join(rest),
            _ => path,
        }
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Environment {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Environment {
        Environment { vars: pairs.into_iter().map(|(name, value)| (name.into(), value.into())).collect() }
    }
}

impl From<BTreeMap<String, String>> for Environment {
    fn from(vars: BTreeMap<String, String>) -> Environment {
        Environment { vars }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_expansion_uses_the_given_home_only() {
        let env: Environment = [("HOME", "/home/ada"), ("CAPDEX_LOG", "debug"), ("PATH", "/bin")].into_iter().collect();
        assert_eq!(env.expand_home("~/.capdex/capabilities".into()), PathBuf::from("/home/ada/.capdex/capabilities"));
        assert_eq!(env.expand_home("~".into()), PathBuf::from("/home/ada"));
        assert_eq!(env.expand_home("a/~/b".into()), PathBuf::from("a/~/b"));
        assert_eq!(env.expand_home("~ada/x".into()), PathBuf::from("~ada/x"), "only a leading ~ component");
        let none = Environment::default();
        assert_eq!(none.expand_home("~/x".into()), PathBuf::from("~/x"));
        assert_eq!(env.with_prefix("CAPDEX_").collect::<Vec<_>>(), [("CAPDEX_LOG", "debug")]);
    }
}
