//! The grammar of an id that may become a NATS subject token (agent ids,
//! capability slugs, source ids, approval ids, runtime ids, organisation and
//! persona ids): non-empty, at most `[limits] max_id_bytes` bytes, and none
//! of `.` (a token separator), `*` and `>` (wildcards), whitespace or control
//! characters. Edges check every such id with [`check`], given the configured
//! `max_id_bytes`, and refuse it with a typed error naming the field (and, for
//! a long one, the setting), so one id never reads as two tokens or as a
//! wildcard, and two different ids never share a subject.

use crate::core::limits::{Limit, LimitExceeded};

/// Why a value is not a subject token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenProblem {
    Empty,
    /// Its length in bytes is over `limits.max_id_bytes`.
    TooLong(LimitExceeded),
    /// The first character a token cannot hold.
    Forbidden(char),
}

/// A field whose value is not a subject token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} {}", describe(.problem))]
pub struct TokenError {
    pub field: String,
    pub problem: TokenProblem,
}

impl TokenError {
    /// The stable code: `id_too_long` for a long id, else `bad_token`.
    pub fn code(&self) -> &'static str {
        match self.problem {
            TokenProblem::TooLong(exceeded) => exceeded.limit.code(),
            _ => "bad_token",
        }
    }
}

/// The problem alone, without the field (for errors that name the field themselves).
pub fn problem_text(err: &TokenError) -> String {
    describe(&err.problem)
}

fn describe(problem: &TokenProblem) -> String {
    match problem {
        TokenProblem::Empty => "must not be empty".to_string(),
        TokenProblem::TooLong(exceeded) => too_long_text(exceeded),
        TokenProblem::Forbidden(c) => {
            format!("must not hold {c:?} ('.', '*', '>', whitespace and control characters are not allowed)")
        }
    }
}

/// How a refusal of a long id reads after its field:
/// `is 129 bytes, over limits.max_id_bytes: at most 128`.
pub fn too_long_text(exceeded: &LimitExceeded) -> String {
    format!("is {} bytes, over {}: at most {}", exceeded.found, exceeded.limit.setting(), exceeded.max)
}

/// Checks an id's length alone against `max_id_bytes` (for ids with a grammar
/// of their own that do not become subject tokens, such as execution ids).
pub fn check_len(value: &str, max_id_bytes: usize) -> Result<(), LimitExceeded> {
    crate::core::limits::check(Limit::IdBytes, value.len(), max_id_bytes)
}

/// True for a character a token cannot hold.
pub fn forbidden(c: char) -> bool {
    matches!(c, '.' | '*' | '>') || c.is_whitespace() || c.is_control()
}

/// What is wrong with `value` as a token of at most `max_id_bytes` bytes, if anything.
pub fn problem(value: &str, max_id_bytes: usize) -> Option<TokenProblem> {
    if value.is_empty() {
        Some(TokenProblem::Empty)
    } else if let Some(c) = value.chars().find(|&c| forbidden(c)) {
        Some(TokenProblem::Forbidden(c))
    } else {
        check_len(value, max_id_bytes).err().map(TokenProblem::TooLong)
    }
}

/// True when `value` is a subject token of at most `max_id_bytes` bytes.
pub fn is_token(value: &str, max_id_bytes: usize) -> bool {
    problem(value, max_id_bytes).is_none()
}

/// Checks `value`, the value of `field`, as a subject token of at most `max_id_bytes` bytes.
///
/// # Examples
///
/// ```
/// use capdex::core::subject_token::check;
/// assert!(check("agentId", "bot-1", 128).is_ok());
/// let err = check("agentId", "bot-12", 5).unwrap_err();
/// assert_eq!(err.to_string(), "agentId is 6 bytes, over limits.max_id_bytes: at most 5");
/// assert_eq!(err.code(), "id_too_long");
/// ```
pub fn check(field: &str, value: &str, max_id_bytes: usize) -> Result<(), TokenError> {
    match problem(value, max_id_bytes) {
        None => Ok(()),
        Some(problem) => Err(TokenError { field: field.to_string(), problem }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `[limits] max_id_bytes` as shipped.
    const MAX: usize = 128;

    #[test]
    fn tokens_refuse_separators_wildcards_and_blanks() {
        for ok in ["agent-1", "tool:lookup_order", "acme/bot", "a#B", "ü", &"x".repeat(MAX)] {
            assert_eq!(check("agentId", ok, MAX), Ok(()), "{ok}");
        }
        for (bad, problem) in [
            ("", TokenProblem::Empty),
            ("a.b", TokenProblem::Forbidden('.')),
            ("*", TokenProblem::Forbidden('*')),
            ("a>", TokenProblem::Forbidden('>')),
            ("a b", TokenProblem::Forbidden(' ')),
            ("a\tb", TokenProblem::Forbidden('\t')),
            ("a\u{0}", TokenProblem::Forbidden('\u{0}')),
            ("a\u{a0}b", TokenProblem::Forbidden('\u{a0}')),
        ] {
            let err = check("agentId", bad, MAX).unwrap_err();
            assert_eq!(err.problem, problem, "{bad:?}");
            assert!(err.to_string().starts_with("agentId "), "{err}");
        }
        let long = "é".repeat(65);
        assert_eq!(
            problem(&long, MAX),
            Some(TokenProblem::TooLong(LimitExceeded { limit: Limit::IdBytes, found: 130, max: MAX })),
            "bytes, not characters"
        );
    }

    #[test]
    fn an_id_at_the_configured_limit_passes_and_one_byte_more_is_refused_naming_the_setting() {
        for max in [1, 7, 128, 256] {
            assert_eq!(check("agentId", &"a".repeat(max), max), Ok(()), "{max}");
            let err = check("agentId", &"a".repeat(max + 1), max).unwrap_err();
            assert_eq!(
                err.problem,
                TokenProblem::TooLong(LimitExceeded { limit: Limit::IdBytes, found: max + 1, max })
            );
            assert_eq!(err.code(), "id_too_long");
            assert_eq!(
                err.to_string(),
                format!("agentId is {} bytes, over limits.max_id_bytes: at most {max}", max + 1)
            );
            assert_eq!(check_len(&"a".repeat(max), max), Ok(()));
            assert_eq!(check_len(&"a".repeat(max + 1), max).unwrap_err().limit, Limit::IdBytes);
        }
        assert_eq!(check("agentId", "a.b", 1).unwrap_err().code(), "bad_token", "the grammar is checked first");
    }

    proptest! {
        /// A token is exactly a non-empty string of at most `max_id_bytes` bytes free of the forbidden characters.
        #[test]
        fn the_check_matches_the_grammar(
            value in "\\PC{0,70}|[a-z.*> \t]{0,8}|[a-z]{120,140}",
            max in prop::sample::select(vec![1usize, 16, 64, 128, 130, 256]),
        ) {
            let expected = !value.is_empty()
                && value.len() <= max
                && !value.chars().any(|c| c == '.' || c == '*' || c == '>' || c.is_whitespace() || c.is_control());
            prop_assert_eq!(is_token(&value, max), expected);
        }

        /// A token never splits into two subject tokens or reads as a wildcard.
        #[test]
        fn a_token_is_one_literal_subject_token(value in "\\PC{1,40}") {
            if is_token(&value, MAX) {
                let subject = format!("capdex.v1.kpi.{value}");
                prop_assert_eq!(subject.split('.').count(), 4);
                prop_assert!(subject.split('.').all(|part| part != "*" && part != ">"));
            }
        }

        /// Inserting any forbidden character into a token makes it refused, naming the field.
        #[test]
        fn any_forbidden_character_is_refused(
            prefix in "[a-zA-Z0-9_-]{0,20}",
            bad in prop::sample::select(vec!['.', '*', '>', ' ', '\t', '\n', '\r', '\u{0}', '\u{7f}', '\u{85}', '\u{2028}', '\u{3000}']),
            suffix in "[a-zA-Z0-9_-]{0,20}",
        ) {
            let value = format!("{prefix}{bad}{suffix}");
            let err = check("slug", &value, MAX).unwrap_err();
            prop_assert_eq!(err.problem, TokenProblem::Forbidden(bad));
            prop_assert_eq!(err.field, "slug");
        }
    }
}
