//! The grammar of an id that may become a NATS subject token (agent ids,
//! capability slugs, source ids, approval ids, runtime ids, organisation and
//! persona ids): non-empty, at most [`MAX_TOKEN_BYTES`] bytes, and none of
//! `.` (a token separator), `*` and `>` (wildcards), whitespace or control
//! characters. Edges check every such id with [`check`] and refuse it with a
//! typed error naming the field, so one id never reads as two tokens or as a
//! wildcard, and two different ids never share a subject.

/// The longest token, in bytes.
pub const MAX_TOKEN_BYTES: usize = 128;

/// Why a value is not a subject token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenProblem {
    Empty,
    /// Its length in bytes.
    TooLong(usize),
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
    /// The stable code, `bad_token`.
    pub fn code(&self) -> &'static str {
        "bad_token"
    }
}

/// The problem alone, without the field (for errors that name the field themselves).
pub fn problem_text(err: &TokenError) -> String {
    describe(&err.problem)
}

fn describe(problem: &TokenProblem) -> String {
    match problem {
        TokenProblem::Empty => "must not be empty".to_string(),
        TokenProblem::TooLong(len) => format!("is {len} bytes, more than {MAX_TOKEN_BYTES}"),
        TokenProblem::Forbidden(c) => {
            format!("must not hold {c:?} ('.', '*', '>', whitespace and control characters are not allowed)")
        }
    }
}

/// True for a character a token cannot hold.
pub fn forbidden(c: char) -> bool {
    matches!(c, '.' | '*' | '>') || c.is_whitespace() || c.is_control()
}

/// What is wrong with `value` as a token, if anything.
pub fn problem(value: &str) -> Option<TokenProblem> {
    if value.is_empty() {
        Some(TokenProblem::Empty)
    } else if let Some(c) = value.chars().find(|&c| forbidden(c)) {
        Some(TokenProblem::Forbidden(c))
    } else if value.len() > MAX_TOKEN_BYTES {
        Some(TokenProblem::TooLong(value.len()))
    } else {
        None
    }
}

/// True when `value` is a subject token.
pub fn is_token(value: &str) -> bool {
    problem(value).is_none()
}

/// Checks `value`, the value of `field`, as a subject token.
pub fn check(field: &str, value: &str) -> Result<(), TokenError> {
    match problem(value) {
        None => Ok(()),
        Some(problem) => Err(TokenError { field: field.to_string(), problem }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn tokens_refuse_separators_wildcards_and_blanks() {
        for ok in ["agent-1", "tool:lookup_order", "acme/bot", "a#B", "ü", &"x".repeat(MAX_TOKEN_BYTES)] {
            assert_eq!(check("agentId", ok), Ok(()), "{ok}");
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
            let err = check("agentId", bad).unwrap_err();
            assert_eq!(err.problem, problem, "{bad:?}");
            assert!(err.to_string().starts_with("agentId "), "{err}");
        }
        let long = "é".repeat(65);
        assert_eq!(problem(&long), Some(TokenProblem::TooLong(130)), "bytes, not characters");
    }

    proptest! {
        /// A token is exactly a non-empty string of at most 128 bytes free of the forbidden characters.
        #[test]
        fn the_check_matches_the_grammar(value in "\\PC{0,70}|[a-z.*> \t]{0,8}|[a-z]{120,140}") {
            let expected = !value.is_empty()
                && value.len() <= MAX_TOKEN_BYTES
                && !value.chars().any(|c| c == '.' || c == '*' || c == '>' || c.is_whitespace() || c.is_control());
            prop_assert_eq!(is_token(&value), expected);
        }

        /// A token never splits into two subject tokens or reads as a wildcard.
        #[test]
        fn a_token_is_one_literal_subject_token(value in "\\PC{1,40}") {
            if is_token(&value) {
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
            let err = check("slug", &value).unwrap_err();
            prop_assert_eq!(err.problem, TokenProblem::Forbidden(bad));
            prop_assert_eq!(err.field, "slug");
        }
    }
}
