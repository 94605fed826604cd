//! PII redaction for provenance: masks for emails, phone numbers, bearer
//! tokens, free text and named keys; a scrubber that removes known secret
//! values, emails and bearer tokens from any text; and the 480-character
//! result preview.

use crate::core::dispatch::registry::RedactionRule;
use serde_json::Value;

/// The longest result preview, in characters (the design's `PROVENANCE_PREVIEW_CAP`).
pub const PREVIEW_CHARS: usize = 480;

/// `[redacted:<label>]`: for free text where even its shape leaks signal.
pub fn redacted_string(label: &str) -> String {
    format!("[redacted:{label}]")
}

/// Keeps the first character and the top-level domain: `alice@example.com` → `a***@***.com`.
pub fn mask_email(email: &str) -> String {
    match email.rsplit_once('@') {
        Some((local, domain)) if !local.is_empty() && !domain.is_empty() => {
            let first: String = local.chars().take(1).collect();
            let tld = domain.rsplit_once('.').map(|(_, tld)| format!(".{tld}")).unwrap_or_default();
            format!("{first}***@***{tld}")
        }
        _ => redacted_string("email"),
    }
}

/// Keeps the last four digits: `+1 (555) 123-4567` → `***4567`.
pub fn mask_phone(phone: &str) -> String {
    let digits: Vec<char> = phone.chars().filter(char::is_ascii_digit).collect();
    if digits.len() < 7 {
        return "***".to_string();
    }
    format!("***{}", digits[digits.len() - 4..].iter().collect::<String>())
}

/// Keeps only the scheme word: `Bearer abc` → `Bearer [redacted]`; anything else → `[redacted:token]`.
pub fn mask_bearer_token(token: &str) -> String {
    match token.trim().split_once(char::is_whitespace) {
        Some((scheme, _)) if scheme.chars().all(|c| c.is_ascii_alphabetic()) => format!("{scheme} [redacted]"),
        _ => redacted_string("token"),
    }
}

/// Replaces the value of every key in `keys` (case-insensitive, at any depth) with `mask(value)`;
/// non-string values become `[redacted:<key>]`.
pub fn mask_keys_in_object(value: &mut Value, keys: &[String], mask: &dyn Fn(&str, &str) -> String) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                if keys.iter().any(|k| k.eq_ignore_ascii_case(key)) {
                    *inner = Value::String(match inner {
                        Value::String(text) => mask(key, text),
                        _ => redacted_string(key),
                    });
                } else {
                    mask_keys_in_object(inner, keys, mask);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| mask_keys_in_object(item, keys, mask)),
        _ => {}
    }
}

fn is_local_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._%+-".contains(c)
}

fn is_domain_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '.' || c == '-'
}

/// Masks every email-shaped run (`local@domain.tld`) in free text.
fn mask_emails_in_text(text: &str) -> String {
    if !text.contains('@') {
        return text.to_string();
    }
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut copied = 0;
    while i < chars.len() {
        if chars[i] == '@' {
            let mut start = i;
            while start > copied && is_local_char(chars[start - 1]) {
                start -= 1;
            }
            let mut end = i + 1;
            while end < chars.len() && is_domain_char(chars[end]) {
                end += 1;
            }
            let domain: String = chars[i + 1..end].iter().collect();
            if start < i && domain.trim_matches('.').contains('.') {
                out.extend(&chars[copied..start]);
                out.push_str(&mask_email(&chars[start..end].iter().collect::<String>()));
                copied = end;
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out.extend(&chars[copied..]);
    out
}

/// Masks the credential after every `Bearer ` / `Basic ` (any case) and every JWT-shaped word.
fn mask_tokens_in_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut mask_next = false;
    for (i, word) in text.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let jwt = word.starts_with("eyJ") && word.matches('.').count() >= 2;
        if (mask_next && !word.is_empty()) || jwt {
            out.push_str("[redacted]");
            mask_next = false;
            continue;
        }
        let bare = word.trim_start_matches(|c: char| !c.is_ascii_alphabetic());
        mask_next =
            bare.eq_ignore_ascii_case("bearer") || bare.eq_ignore_ascii_case("basic") || (mask_next && word.is_empty());
        out.push_str(word);
    }
    out
}

/// Removes every known secret value, email address and bearer token from `text`.
pub fn scrub_text(text: &str, secrets: &[String]) -> String {
    let secrets = || secrets.iter().filter(|s| !s.is_empty());
    let mut out = text.to_string();
    for secret in secrets() {
        out = out.replace(secret.as_str(), "[redacted:secret]");
    }
    let out = mask_tokens_in_text(&mask_emails_in_text(&out));
    // A secret that a mask itself spells (say "redacted") would survive; then nothing is kept.
    if secrets().any(|secret| out.contains(secret.as_str())) {
        return String::new();
    }
    out
}

/// Applies [`scrub_text`] to every string (and object key) in `value`.
pub fn scrub_value(value: &mut Value, secrets: &[String]) {
    match value {
        Value::String(text) => *text = scrub_text(text, secrets),
        Value::Array(items) => items.iter_mut().for_each(|item| scrub_value(item, secrets)),
        Value::Object(map) => {
            let entries: Vec<(String, Value)> = std::mem::take(map).into_iter().collect();
            for (key, mut inner) in entries {
                scrub_value(&mut inner, secrets);
                map.insert(scrub_text(&key, secrets), inner);
            }
        }
        _ => {}
    }
}

/// Collects the string values held under `keys` (case-insensitive, any depth).
fn collect_values_of_keys(value: &Value, keys: &[String], into: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                match inner {
                    Value::String(text) if keys.iter().any(|k| k.eq_ignore_ascii_case(key)) => into.push(text.clone()),
                    _ => collect_values_of_keys(inner, keys, into),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_values_of_keys(item, keys, into)),
        _ => {}
    }
}

/// JSON text cut to [`PREVIEW_CHARS`] characters (the last one `…` when cut).
pub fn preview(text: &str) -> String {
    if text.chars().count() <= PREVIEW_CHARS {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(PREVIEW_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// Applies a capability's redaction rule (if it has one), then scrubs secrets,
/// emails and tokens: returns what provenance may keep of `args` and `result`.
pub fn redact_for_provenance(
    rule: Option<&RedactionRule>,
    args: &Value,
    result: &Value,
    secrets: &[String],
) -> (Value, String) {
    let mut args = args.clone();
    let mut result = result.clone();
    let mut secrets = secrets.to_vec();
    if let Some(rule) = rule {
        // Values masked in the arguments are masked wherever the result repeats them, too.
        let keys: Vec<String> = [&rule.redact_keys, &rule.email_keys, &rule.phone_keys, &rule.token_keys]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        collect_values_of_keys(&args, &keys, &mut secrets);
        for value in [&mut args, &mut result] {
            mask_keys_in_object(value, &rule.redact_keys, &|key, _| redacted_string(key));
            mask_keys_in_object(value, &rule.email_keys, &|_, text| mask_email(text));
            mask_keys_in_object(value, &rule.phone_keys, &|_, text| mask_phone(text));
            mask_keys_in_object(value, &rule.token_keys, &|_, text| mask_bearer_token(text));
        }
        if rule.redact_all_args {
            args = Value::String(redacted_string("args"));
        }
        if rule.redact_all_result {
            result = Value::String(redacted_string("result"));
        }
    }
    scrub_value(&mut args, &secrets);
    scrub_value(&mut result, &secrets);
    let preview = preview(&serde_json::to_string(&result).unwrap_or_default());
    (args, preview)
}

/// What may be shown of a call's arguments beside its approval: exactly the
/// arguments provenance keeps ([`redact_for_provenance`] with no resolved
/// secrets, since none are resolved before a call runs).
pub fn redact_arguments(rule: Option<&RedactionRule>, args: &Value) -> Value {
    redact_for_provenance(rule, args, &Value::Null, &[]).0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn helpers_mask() {
        assert_eq!(mask_email("alice@example.com"), "a***@***.com");
        assert_eq!(mask_phone("+1 (555) 123-4567"), "***4567");
        assert_eq!(mask_phone("12"), "***");
        assert_eq!(mask_bearer_token("Bearer abc.def"), "Bearer [redacted]");
        assert_eq!(mask_bearer_token("sk_live_123"), "[redacted:token]");
        assert_eq!(redacted_string("memory-value"), "[redacted:memory-value]");
        let mut value = json!({"user": {"Email": "bob@corp.io", "n": 1}, "list": [{"email": 3}]});
        mask_keys_in_object(&mut value, &["email".into()], &|_, t| mask_email(t));
        assert_eq!(value, json!({"user": {"Email": "b***@***.io", "n": 1}, "list": [{"email": "[redacted:email]"}]}));
        assert_eq!(
            scrub_text("mail carol@x.org now, Authorization: Bearer tok123 ok", &[]),
            "mail c***@***.org now, Authorization: Bearer [redacted] ok"
        );
        assert_eq!(scrub_text("key=s3cr3t-v4lue;", &["s3cr3t-v4lue".into()]), "key=[redacted:secret];");
        assert_eq!(preview(&"x".repeat(1000)).chars().count(), PREVIEW_CHARS);
        assert_eq!(preview("short"), "short");
    }

    #[test]
    fn rules_apply_to_args_and_result() {
        let rule =
            RedactionRule { redact_keys: vec!["note".into()], phone_keys: vec!["phone".into()], ..Default::default() };
        let (args, preview) = redact_for_provenance(
            Some(&rule),
            &json!({"note": "private words", "phone": "555-123-9876"}),
            &json!({"echo": {"text": "you said: private words"}, "token": "abc"}),
            &["abc".into()],
        );
        assert_eq!(args, json!({"note": "[redacted:note]", "phone": "***9876"}));
        assert!(!preview.contains("private words") && !preview.contains("\"abc\""), "{preview}");
    }

    proptest! {
        /// No secret, email address or bearer token survives scrubbing, wherever it sits in the text.
        #[test]
        fn scrubbing_never_leaks(
            before in "[ -~]{0,40}",
            after in "[ -~]{0,40}",
            secret in "[A-Za-z0-9_\\-]{6,24}",
            local in "[a-z0-9][a-z0-9._+-]{0,12}",
            domain in "[a-z0-9]{1,10}\\.[a-z]{2,6}",
            token in "[A-Za-z0-9._~+/-]{8,30}",
        ) {
            let email = format!("{local}@{domain}");
            let text = format!("{before}{secret} {email} Authorization: Bearer {token} {after}");
            let out = scrub_text(&text, std::slice::from_ref(&secret));
            prop_assert!(!out.contains(&secret), "{}", out);
            prop_assert!(!out.contains(&email), "{}", out);
            prop_assert!(!out.contains(&format!("Bearer {token}")), "{}", out);
            let mut value = json!({"k": text, "n": [text]});
            scrub_value(&mut value, std::slice::from_ref(&secret));
            let json = value.to_string();
            prop_assert!(!json.contains(&secret) && !json.contains(&email));
        }

        /// A preview is never longer than 480 characters.
        #[test]
        fn previews_are_bounded(text in "\\PC{0,700}") {
            prop_assert!(preview(&text).chars().count() <= PREVIEW_CHARS);
        }
    }
}
