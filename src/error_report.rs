//! The one line an error becomes on the command line.
//!
//! Most of capdex's errors say their cause in their own message (`failed to
//! read {path}: {source}`, so that a NATS reply or a log line carries it) and
//! also expose it as their `source()`. Printing the chain as is (anyhow's
//! `{:#}`) would say every such cause twice; [`one_line`] says each once.

use std::error::Error;

/// Returns `error`'s message followed by each cause in its chain that the
/// message so far does not already say, joined by `": "`.
pub fn one_line(error: &(dyn Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let said = next.to_string();
        if !said.is_empty() && !line.contains(&said) {
            line.push_str(": ");
            line.push_str(&said);
        }
        cause = next.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("failed to read {path}: {source}")]
        Says { path: &'static str, source: std::io::Error },
        #[error("failed to read {path}")]
        Hides { path: &'static str, source: std::io::Error },
        #[error("embedding cache: {0}")]
        Wraps(#[from] Middle),
    }

    #[derive(Debug, thiserror::Error)]
    #[error("the store is locked")]
    struct Middle {
        source: std::io::Error,
    }

    fn not_found() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")
    }

    #[test]
    fn a_cause_the_message_already_says_is_said_once() {
        let error = Outer::Says { path: "/a", source: not_found() };
        assert_eq!(one_line(&error), "failed to read /a: no such file");
    }

    #[test]
    fn a_cause_the_message_leaves_out_is_appended() {
        let error = Outer::Hides { path: "/a", source: not_found() };
        assert_eq!(one_line(&error), "failed to read /a: no such file");
    }

    #[test]
    fn every_level_of_a_chain_is_said_once() {
        let error = Outer::Wraps(Middle { source: not_found() });
        assert_eq!(one_line(&error), "embedding cache: the store is locked: no such file");
    }

    #[test]
    fn an_anyhow_context_chain_is_said_once() {
        let error = anyhow::Error::new(Outer::Says { path: "/a", source: not_found() }).context("loading the catalog");
        assert_eq!(one_line(error.as_ref()), "loading the catalog: failed to read /a: no such file");
    }
}
