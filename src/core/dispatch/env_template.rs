//! `${env:VAR}` templates in binding configs and source settings, resolved at
//! call time so secrets never sit in the store. `VAR` is `[A-Z][A-Z0-9_]*`; a
//! malformed template stays literal; an unset or empty variable fails closed.
//!
//! What a template may read is an [`EnvAllow`]: the `[dispatch] env_allow`
//! patterns for anything a NATS or MCP client registered (capabilities'
//! bindings, `sources.add`), and [`EnvAllow::any`] only for what the operator
//! wrote in the config file. A name outside it is refused before it is read.

/// Why a template could not be resolved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvRefusal {
    /// A variable a template needs is unset or empty.
    #[error("environment variable {0} is not set")]
    Missing(String),
    /// A variable outside the allowlist (`[dispatch] env_allow`).
    #[error("environment variable {0} is not allowed: `${{env:…}}` reads only names matching [dispatch] env_allow")]
    NotAllowed(String),
}

impl EnvRefusal {
    /// The wire code: `missing_env` or `env_not_allowed`.
    pub fn code(&self) -> &'static str {
        match self {
            EnvRefusal::Missing(_) => "missing_env",
            EnvRefusal::NotAllowed(_) => "env_not_allowed",
        }
    }

    /// The variable it is about.
    pub fn name(&self) -> &str {
        match self {
            EnvRefusal::Missing(name) | EnvRefusal::NotAllowed(name) => name,
        }
    }
}

/// The default allowlist: `CAPDEX_SECRET_*`.
pub const DEFAULT_ENV_ALLOW: &str = "CAPDEX_SECRET_*";

/// Which variable names a template may read: glob patterns over
/// `[A-Z0-9_]`, where `*` stands for any run of characters (`CAPDEX_SECRET_*`,
/// `STRIPE_KEY`, `*_TOKEN`, or `*` for every name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvAllow {
    patterns: Vec<String>,
}

impl Default for EnvAllow {
    /// `CAPDEX_SECRET_*`.
    fn default() -> EnvAllow {
        EnvAllow { patterns: vec![DEFAULT_ENV_ALLOW.to_string()] }
    }
}

impl EnvAllow {
    /// Every name: only for templates the operator wrote (the config file).
    pub fn any() -> EnvAllow {
        EnvAllow { patterns: vec!["*".to_string()] }
    }

    /// Checks each pattern: non-empty, only `A-Z`, `0-9`, `_` and `*`.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> Result<EnvAllow, String> {
        let mut checked = Vec::with_capacity(patterns.len());
        for pattern in patterns {
            let pattern = pattern.as_ref().trim();
            if pattern.is_empty()
                || !pattern.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_' || b == b'*')
            {
                return Err(format!("{pattern:?} is not a pattern of A-Z, 0-9, _ and *"));
            }
            checked.push(pattern.to_string());
        }
        Ok(EnvAllow { patterns: checked })
    }

    /// The patterns, as given.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// True when some pattern matches the whole `name`.
    pub fn allows(&self, name: &str) -> bool {
        self.patterns.iter().any(|pattern| glob(pattern.as_bytes(), name.as_bytes()))
    }

    /// The first variable `text` refers to that this allowlist refuses.
    pub fn refused_in(&self, text: &str) -> Option<EnvRefusal> {
        references(text).into_iter().find(|name| !self.allows(name)).map(EnvRefusal::NotAllowed)
    }
}

/// `*`-only glob matching of a whole name (iterative, linear backtracking).
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, n));
            p += 1;
        } else if p < pattern.len() && pattern[p] == name[n] {
            p += 1;
            n += 1;
        } else if let Some((star_p, star_n)) = star {
            p = star_p + 1;
            n = star_n + 1;
            star = Some((star_p, star_n + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// Finds the next well-formed `${env:NAME}` at or after `from`: (start, end, name).
fn next_ref(text: &str, from: usize) -> Option<(usize, usize, &str)> {
    let mut at = from;
    while let Some(found) = text[at..].find("${env:") {
        let start = at + found;
        let name_start = start + "${env:".len();
        let name_len = text[name_start..]
            .bytes()
            .enumerate()
            .take_while(|&(i, b)| {
                if i == 0 {
                    b.is_ascii_uppercase()
                } else {
                    b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'
                }
            })
            .count();
        if name_len > 0 && text[name_start + name_len..].starts_with('}') {
            return Some((start, name_start + name_len + 1, &text[name_start..name_start + name_len]));
        }
        at = name_start;
    }
    None
}

/// The variable names a template refers to, in order.
pub fn references(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut at = 0;
    while let Some((_, end, name)) = next_ref(text, at) {
        names.push(name.to_string());
        at = end;
    }
    names
}

/// Resolves every `${env:NAME}` in `text` with `lookup`, reading only names
/// `allow` permits (a refused name is never looked up); the values used are
/// appended to `secrets` so callers can scrub them from anything they record.
pub fn resolve(
    text: &str,
    allow: &EnvAllow,
    lookup: &dyn Fn(&str) -> Option<String>,
    secrets: &mut Vec<String>,
) -> Result<String, EnvRefusal> {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some((start, end, name)) = next_ref(text, at) {
        if !allow.allows(name) {
            return Err(EnvRefusal::NotAllowed(name.to_string()));
        }
        let value = lookup(name).filter(|v| !v.is_empty()).ok_or_else(|| EnvRefusal::Missing(name.to_string()))?;
        out.push_str(&text[at..start]);
        out.push_str(&value);
        secrets.push(value);
        at = end;
    }
    out.push_str(&text[at..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn templates_resolve_or_fail_closed() {
        let lookup = |name: &str| match name {
            "TOKEN" => Some("s3cr3t".to_string()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        let mut secrets = Vec::new();
        let any = EnvAllow::any();
        assert_eq!(resolve("Bearer ${env:TOKEN}!", &any, &lookup, &mut secrets).unwrap(), "Bearer s3cr3t!");
        assert_eq!(secrets, vec!["s3cr3t"]);
        assert_eq!(resolve("${env:NOPE}", &any, &lookup, &mut secrets), Err(EnvRefusal::Missing("NOPE".into())));
        assert_eq!(resolve("${env:EMPTY}", &any, &lookup, &mut secrets), Err(EnvRefusal::Missing("EMPTY".into())));
        assert_eq!(
            resolve("${env:lower} ${env:} ${env:A", &any, &lookup, &mut secrets).unwrap(),
            "${env:lower} ${env:} ${env:A"
        );
        assert_eq!(references("${env:A1}/${env:x}/${env:B_2}"), vec!["A1", "B_2"]);
    }

    #[test]
    fn names_outside_the_allowlist_are_refused_before_they_are_read() {
        let read = std::cell::RefCell::new(Vec::new());
        let lookup = |name: &str| {
            read.borrow_mut().push(name.to_string());
            Some("value".to_string())
        };
        let allow = EnvAllow::default();
        let mut secrets = Vec::new();
        let refused = resolve("Bearer ${env:HOME}", &allow, &lookup, &mut secrets).unwrap_err();
        assert_eq!(refused, EnvRefusal::NotAllowed("HOME".into()));
        assert_eq!(refused.code(), "env_not_allowed");
        assert!(refused.to_string().contains("HOME") && refused.to_string().contains("env_allow"), "{refused}");
        assert!(read.borrow().is_empty(), "a refused name is never looked up");
        assert!(secrets.is_empty());
        assert_eq!(resolve("${env:CAPDEX_SECRET_X}", &allow, &lookup, &mut secrets).unwrap(), "value");
        assert_eq!(
            allow.refused_in("a ${env:CAPDEX_SECRET_A} ${env:PATH}"),
            Some(EnvRefusal::NotAllowed("PATH".into()))
        );
        assert_eq!(allow.refused_in("${env:CAPDEX_SECRET_A} ${env:lower}"), None);
    }

    #[test]
    fn patterns_are_globs_over_whole_names() {
        let allow = EnvAllow::parse(&["CAPDEX_SECRET_*", "STRIPE_KEY", "*_TOKEN", "A*B*C"]).unwrap();
        for name in ["CAPDEX_SECRET_", "CAPDEX_SECRET_X", "STRIPE_KEY", "GH_TOKEN", "_TOKEN", "ABC", "AXXBYYC"] {
            assert!(allow.allows(name), "{name}");
        }
        for name in ["CAPDEX_SECRETS", "STRIPE_KEY2", "XSTRIPE_KEY", "GH_TOKENS", "HOME", "ACB", "CAPDEX_CONFIG"] {
            assert!(!allow.allows(name), "{name}");
        }
        assert!(EnvAllow::any().allows("HOME"));
        assert!(!EnvAllow::parse::<&str>(&[]).unwrap().allows("A"), "an empty list allows nothing");
        for bad in ["", " ", "lower_*", "A-B", "A.B", "${env:A}"] {
            assert!(EnvAllow::parse(&[bad]).is_err(), "{bad:?}");
        }
    }

    proptest! {
        /// A pattern without `*` allows exactly itself; `prefix*` allows exactly the names starting with it.
        #[test]
        fn globs_agree_with_prefix_and_equality(prefix in "[A-Z_]{0,6}", name in "[A-Z_]{0,8}") {
            let exact = EnvAllow::parse(std::slice::from_ref(&prefix));
            if let Ok(exact) = exact {
                prop_assert_eq!(exact.allows(&name), name == prefix);
            }
            let star = EnvAllow::parse(&[format!("{prefix}*")]).unwrap();
            prop_assert_eq!(star.allows(&name), name.starts_with(&prefix));
        }
    }
}
