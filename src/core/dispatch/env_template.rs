//! `${env:VAR}` templates in binding configs, resolved at call time so secrets
//! never sit in the store. `VAR` is `[A-Z][A-Z0-9_]*`; a malformed template
//! stays literal; an unset or empty variable fails closed.

/// A variable a template needs that is unset or empty.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {0} is not set")]
pub struct MissingEnv(pub String);

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

/// Resolves every `${env:NAME}` in `text` with `lookup`; the values used are
/// appended to `secrets` so callers can scrub them from anything they record.
pub fn resolve(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    secrets: &mut Vec<String>,
) -> Result<String, MissingEnv> {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some((start, end, name)) = next_ref(text, at) {
        let value = lookup(name).filter(|v| !v.is_empty()).ok_or_else(|| MissingEnv(name.to_string()))?;
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

    #[test]
    fn templates_resolve_or_fail_closed() {
        let lookup = |name: &str| match name {
            "TOKEN" => Some("s3cr3t".to_string()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        let mut secrets = Vec::new();
        assert_eq!(resolve("Bearer ${env:TOKEN}!", &lookup, &mut secrets).unwrap(), "Bearer s3cr3t!");
        assert_eq!(secrets, vec!["s3cr3t"]);
        assert_eq!(resolve("${env:NOPE}", &lookup, &mut secrets), Err(MissingEnv("NOPE".into())));
        assert_eq!(resolve("${env:EMPTY}", &lookup, &mut secrets), Err(MissingEnv("EMPTY".into())));
        assert_eq!(
            resolve("${env:lower} ${env:} ${env:A", &lookup, &mut secrets).unwrap(),
            "${env:lower} ${env:} ${env:A"
        );
        assert_eq!(references("${env:A1}/${env:x}/${env:B_2}"), vec!["A1", "B_2"]);
    }
}
