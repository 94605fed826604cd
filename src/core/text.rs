//! Texts derived from a descriptor: the embedding text, the Tier 1 summary line
//! and the Tier 2 detail, plus the tokeniser the built-in embedder uses.

use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind};
use serde_json::Value;

/// Returns the intent-oriented text a capability is embedded with.
///
/// Name and display name, description, category, tags, parameter names (tools)
/// and dependencies, one per line. Schemas, skill bodies and secrets stay out:
/// they are Tier 2 material and would drown the intent.
///
/// The name is written as its words (`AusSurfReport` → `aus surf report`,
/// `math.gcd` → `math gcd`): an embedder reads words, not identifier
/// fragments. A display name that says something else comes first; one that
/// is the name's words (`Web Search` for `web-search`) stands alone. Exact
/// names are matched lexically (`core::lexical`), not through the embedding.
pub fn embedding_text(descriptor: &CapabilityDescriptor) -> String {
    let mut parts: Vec<String> = Vec::with_capacity(6);
    let name = word_tokens(&descriptor.name).join(" ");
    let display = &descriptor.display_name;
    parts.push(if display.to_lowercase() == name {
        display.clone()
    } else if display.is_empty() || word_tokens(display).join(" ") == name {
        name
    } else {
        format!("{display} ({name})")
    });
    if !descriptor.description.is_empty() {
        parts.push(descriptor.description.clone());
    }
    if !descriptor.category.is_empty() {
        parts.push(format!("Category: {}", descriptor.category));
    }
    if !descriptor.tags.is_empty() {
        parts.push(format!("Use cases: {}", descriptor.tags.join(", ")));
    }
    let parameters = descriptor.parameter_names();
    if !parameters.is_empty() {
        parts.push(format!("Parameters: {}", parameters.join(", ")));
    }
    if !descriptor.required_tools.is_empty() {
        parts.push(format!("Requires: {}", descriptor.required_tools.join(", ")));
    }
    parts.join("\n")
}

/// The longest description a Tier 1 summary carries, in characters.
const SUMMARY_DESCRIPTION_CHARS: usize = 120;

/// Returns the compact one-line Tier 1 summary of a capability.
pub fn summary_line(descriptor: &CapabilityDescriptor) -> String {
    let mut parts: Vec<String> = vec![format!("{} ({})", descriptor.name, descriptor.kind)];
    if !descriptor.description.is_empty() {
        let description = descriptor.description.trim_end_matches('.');
        parts.push(truncate_chars(description, SUMMARY_DESCRIPTION_CHARS));
    }
    if descriptor.kind == CapabilityKind::Tool {
        let parameters = descriptor.parameter_names();
        if !parameters.is_empty() {
            let shown: Vec<&str> = parameters.iter().take(3).map(String::as_str).collect();
            parts.push(format!("Params: {}", shown.join(", ")));
        }
    }
    if !descriptor.required_tools.is_empty() {
        parts.push(format!("Requires: {}", descriptor.required_tools.join(", ")));
    }
    if descriptor.has_side_effects == Some(true) {
        parts.push("Has side effects".to_string());
    }
    if !descriptor.available {
        parts.push("[not available: missing secrets or dependencies]".to_string());
    }
    parts.join(". ")
}

/// Returns the full Tier 2 text: schema or skill instructions included.
pub fn detail_text(descriptor: &CapabilityDescriptor) -> String {
    let mut out = format!(
        "# {}\nKind: {} | Category: {}\n\n{}\n",
        descriptor.display_name, descriptor.kind, descriptor.category, descriptor.description
    );
    if let Some(schema) = &descriptor.full_schema {
        out.push_str("\n## Input Schema\n");
        out.push_str(&render_schema(&schema.value()));
    }
    if let Some(content) = &descriptor.full_content {
        out.push_str("\n## Skill Instructions\n");
        out.push_str(content.trim_end());
        out.push('\n');
    }
    if descriptor.has_side_effects == Some(true) {
        out.push_str("\nHas side effects: yes\n");
    }
    if !descriptor.required_secrets.is_empty() {
        out.push_str(&format!("\nRequired secrets: {}\n", descriptor.required_secrets.join(", ")));
    }
    if !descriptor.tags.is_empty() {
        out.push_str(&format!("Tags: {}\n", descriptor.tags.join(", ")));
    }
    out
}

fn render_schema(schema: &Value) -> String {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return "(no parameters)\n".to_string();
    };
    if properties.is_empty() {
        return "(no parameters)\n".to_string();
    }
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = String::new();
    for (name, property) in properties {
        let kind = property.get("type").map(type_label).unwrap_or_else(|| "any".to_string());
        out.push_str(&format!("{name} ({kind}"));
        if required.contains(&name.as_str()) {
            out.push_str(", required");
        }
        out.push(')');
        if let Some(description) = property.get("description").and_then(Value::as_str) {
            out.push_str(": ");
            out.push_str(description);
        }
        if let Some(options) = property.get("enum").and_then(Value::as_array) {
            let options: Vec<String> = options.iter().map(plain_json).collect();
            out.push_str(&format!(" [{}]", options.join("|")));
        }
        if let Some(default) = property.get("default") {
            out.push_str(&format!(" (default: {default})"));
        }
        out.push('\n');
    }
    out
}

fn type_label(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Array(items) => items.iter().map(plain_json).collect::<Vec<_>>().join("|"),
        other => other.to_string(),
    }
}

fn plain_json(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Cuts `text` to at most `max_chars` characters, ending an abridged text with `…`.
pub fn truncate_chars(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let kept: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    format!("{}…", kept.trim_end())
}

/// Splits text into lower-cased word tokens, also splitting camelCase and
/// snake_case names (`getUserById` → `get user by id`).
pub fn word_tokens(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    for_each_word_token(text, |token| tokens.push(token.to_string()));
    tokens
}

/// Calls `each` with every token [`word_tokens`] gives, in order, from one
/// reused buffer: no allocation per token.
pub fn for_each_word_token(text: &str, mut each: impl FnMut(&str)) {
    let mut current = String::new();
    let mut previous: Option<char> = None;
    for ch in text.chars() {
        if ch.is_alphanumeric() {
            let boundary = match previous {
                Some(prev) => {
                    (prev.is_lowercase() && ch.is_uppercase()) || (prev.is_alphabetic() != ch.is_alphabetic())
                }
                None => false,
            };
            if boundary && !current.is_empty() {
                each(&current);
                current.clear();
            }
            if ch.is_ascii() {
                current.push(ch.to_ascii_lowercase());
            } else {
                current.extend(ch.to_lowercase());
            }
            previous = Some(ch);
        } else {
            if !current.is_empty() {
                each(&current);
                current.clear();
            }
            previous = None;
        }
    }
    if !current.is_empty() {
        each(&current);
    }
}

/// Returns the terms a text is indexed and searched with: [`word_tokens`],
/// stopwords dropped, each word [`stem`]med.
pub fn index_terms(text: &str) -> Vec<String> {
    let mut terms = Vec::new();
    for_each_index_term(text, |term| terms.push(term.to_string()));
    terms
}

/// Calls `each` with every term [`index_terms`] gives, in order, from reused
/// buffers: no allocation per term.
pub fn for_each_index_term(text: &str, mut each: impl FnMut(&str)) {
    let mut stemmed = String::new();
    for_each_word_token(text, |token| {
        if !is_stopword(token) {
            stemmed.clear();
            stem_into(token, &mut stemmed);
            each(&stemmed);
        }
    });
}

/// English words too common to say anything about intent: the Snowball
/// project's English stop list (its contractions as the tokens they split
/// into, `isn't` → `isn`, `t`; but not `won`, also a verb), and the request
/// words `can`, `get`, `give`, `need`, `please`, `use`, `using`, `want`,
/// `will`. Dropped from the lexical index and from the built-in embedder's
/// terms, so that a message matches a capability by what it asks for, not by
/// how it is phrased.
#[rustfmt::skip]
const STOPWORDS: &[&str] = &[
    "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "aren", "as", "at",
    "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "cannot", "could",
    "couldn", "d", "did", "didn", "do", "does", "doesn", "doing", "don", "down", "during", "each", "few", "for",
    "from", "further", "get", "give", "had", "hadn", "has", "hasn", "have", "haven", "having", "he", "her", "here",
    "hers", "herself", "him", "himself", "his", "how", "i", "if", "in", "into", "is", "isn", "it", "its", "itself",
    "let", "ll", "m", "me", "more", "most", "mustn", "my", "myself", "need", "no", "nor", "not", "of", "off", "on",
    "once", "only", "or", "other", "ought", "our", "ours", "ourselves", "out", "over", "own", "please", "re", "s",
    "same", "shan", "she", "should", "shouldn", "so", "some", "such", "t", "than", "that", "the", "their", "theirs",
    "them", "themselves", "then", "there", "these", "they", "this", "those", "through", "to", "too", "under", "until",
    "up", "use", "using", "ve", "very", "want", "was", "wasn", "we", "were", "weren", "what", "when", "where",
    "which", "while", "who", "whom", "why", "will", "with", "would", "wouldn", "you", "your", "yours", "yourself",
    "yourselves",
];

/// The longest stopword, in bytes (`themselves`, `yourselves`); a
/// [`stopword_key`] holds up to 15.
const MAX_STOPWORD_BYTES: usize = 10;
const _: () = assert!(MAX_STOPWORD_BYTES <= 15, "a stopword key holds 15 bytes and the length");

/// A word of at most [`MAX_STOPWORD_BYTES`] bytes as one integer: its bytes,
/// then its length in the top byte (so `a` and `a\0` differ).
const fn stopword_key(word: &[u8]) -> u128 {
    let mut key = (word.len() as u128) << 120;
    let mut i = 0;
    while i < word.len() {
        key |= (word[i] as u128) << (8 * i);
        i += 1;
    }
    key
}

/// [`STOPWORDS`] as sorted [`stopword_key`]s: a lookup is a binary search
/// over integers, not over strings.
const STOPWORD_KEYS: [u128; STOPWORDS.len()] = {
    let mut keys = [0u128; STOPWORDS.len()];
    let mut i = 0;
    while i < keys.len() {
        keys[i] = stopword_key(STOPWORDS[i].as_bytes());
        // Insertion sort: a const context has no `sort`.
        let mut j = i;
        while j > 0 && keys[j - 1] > keys[j] {
            let swap = keys[j - 1];
            keys[j - 1] = keys[j];
            keys[j] = swap;
            j -= 1;
        }
        i += 1;
    }
    keys
};

/// Per length, the first bytes of the [`STOPWORDS`] of that length, as bits
/// (`1 << (byte % 64)`): most words are ruled out by one lookup before any
/// search.
const STOPWORD_STARTS: [u64; MAX_STOPWORD_BYTES + 1] = {
    let mut starts = [0u64; MAX_STOPWORD_BYTES + 1];
    let mut i = 0;
    while i < STOPWORDS.len() {
        let word = STOPWORDS[i].as_bytes();
        starts[word.len()] |= 1 << (word[0] % 64);
        i += 1;
    }
    starts
};

/// Returns true for a stopword.
pub fn is_stopword(token: &str) -> bool {
    let bytes = token.as_bytes();
    // Every stopword is 1 to 10 bytes long: a longer token is ruled out by length alone.
    match bytes.first() {
        Some(&first) if bytes.len() <= MAX_STOPWORD_BYTES => {
            STOPWORD_STARTS[bytes.len()] & (1 << (first % 64)) != 0
                && STOPWORD_KEYS.binary_search(&stopword_key(bytes)).is_ok()
        }
        _ => false,
    }
}

/// Reduces an English word to a crude stem so that inflections meet:
/// `searches`, `searching`, `searched` and `search` all become `search`, and
/// `messages` and `message` both become `messag`. Deterministic; only ASCII
/// words of four or more characters are touched.
pub fn stem(token: &str) -> String {
    let mut word = String::with_capacity(token.len());
    stem_into(token, &mut word);
    word
}

/// Appends [`stem`] of `token` to `out`, without allocating.
///
/// The rules, in order: `-ies` becomes `-y` (and nothing more applies);
/// `-sses`, `-ches`, `-shes`, `-xes`, `-zes` lose `es`, or else a final `s`
/// not after `s`, `u` or `i` goes; then one of `-ing`, `-ed` goes when three
/// letters stay; then a final `e` goes when four stay.
pub fn stem_into(token: &str, out: &mut String) {
    if token.len() < 4 || !token.bytes().all(|byte| byte.is_ascii_lowercase()) {
        out.push_str(token);
        return;
    }
    if let Some(base) = token.strip_suffix("ies") {
        out.push_str(base);
        out.push('y');
        return;
    }
    let mut word = token;
    if ["sses", "ches", "shes", "xes", "zes"].iter().any(|end| word.ends_with(end)) {
        word = &word[..word.len() - 2];
    } else if word.ends_with('s') && !["ss", "us", "is"].iter().any(|end| word.ends_with(end)) {
        word = &word[..word.len() - 1];
    }
    for suffix in ["ing", "ed"] {
        if word.len() >= suffix.len() + 3 && word.ends_with(suffix) {
            word = &word[..word.len() - suffix.len()];
            break;
        }
    }
    if word.len() >= 4 && word.ends_with('e') {
        word = &word[..word.len() - 1];
    }
    out.push_str(word);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::descriptor::DefinitionRef;
    use serde_json::json;

    fn tool() -> CapabilityDescriptor {
        CapabilityDescriptor {
            id: "tool:web-search".into(),
            kind: CapabilityKind::Tool,
            name: "web-search".into(),
            display_name: "Web Search".into(),
            description: "Search the web for current information.".into(),
            category: "information".into(),
            tags: vec!["search".into(), "news".into()],
            required_secrets: vec!["SERPER_API_KEY".into()],
            required_tools: vec![],
            available: true,
            has_side_effects: Some(false),
            full_schema: Some(
                json!({"type":"object","properties":{"query":{"type":"string","description":"The search query"},"max_results":{"type":"number","default":5}},"required":["query"]}).into(),
            ),
            full_content: None,
            definition_ref: DefinitionRef::Builtin,
        }
    }

    #[test]
    fn embedding_text_has_intent_fields_only() {
        let text = embedding_text(&tool());
        assert_eq!(
            text,
            "Web Search\nSearch the web for current information.\nCategory: information\nUse cases: search, news\nParameters: query, max_results"
        );
        assert!(!text.contains("SERPER"));
    }

    #[test]
    fn embedders_read_names_as_words() {
        let mut named = tool();
        named.name = "AusSurfReport".into();
        named.display_name = "AusSurfReport".into();
        assert!(embedding_text(&named).starts_with("aus surf report\n"));
        // A display name made from the name (`display_name_from`) is not words either.
        named.display_name = "Math.gcd".into();
        named.name = "math.gcd".into();
        assert!(embedding_text(&named).starts_with("math gcd\n"));
        named.name = "kinematics.final_velocity".into();
        named.display_name = String::new();
        assert!(embedding_text(&named).starts_with("kinematics final velocity\n"));
        named.display_name = "Final velocity (physics)".into();
        assert!(embedding_text(&named).starts_with("Final velocity (physics) (kinematics final velocity)\n"));
    }

    #[test]
    fn summary_and_detail() {
        assert_eq!(
            summary_line(&tool()),
            "web-search (tool). Search the web for current information. Params: query, max_results"
        );
        let detail = detail_text(&tool());
        assert!(detail.contains("query (string, required): The search query\n"));
        assert!(detail.contains("max_results (number) (default: 5)\n"));
        assert!(detail.contains("Required secrets: SERPER_API_KEY"));
    }

    #[test]
    fn truncation_marks_abridged_text() {
        assert_eq!(truncate_chars("abcdef", 6), "abcdef");
        assert_eq!(truncate_chars("abcdefg", 4), "abc…");
        assert_eq!(truncate_chars("ééééé", 3).chars().count(), 3);
    }

    /// The stemmer as first written, building the word step by step.
    fn reference_stem(token: &str) -> String {
        if token.len() < 4 || !token.bytes().all(|byte| byte.is_ascii_lowercase()) {
            return token.to_string();
        }
        let mut word = token.to_string();
        if let Some(base) = word.strip_suffix("ies") {
            word = format!("{base}y");
        } else if let Some(base) = word.strip_suffix("sses") {
            word = format!("{base}ss");
        } else if word.ends_with("es") && ["ches", "shes", "xes", "zes", "sses"].iter().any(|end| word.ends_with(end)) {
            word.truncate(word.len() - 2);
        } else if word.ends_with('s') && !["ss", "us", "is"].iter().any(|end| word.ends_with(end)) {
            word.truncate(word.len() - 1);
        }
        for suffix in ["ing", "ed"] {
            if word.len() >= suffix.len() + 3 && word.ends_with(suffix) {
                word.truncate(word.len() - suffix.len());
                break;
            }
        }
        if word.len() >= 4 && word.ends_with('e') {
            word.truncate(word.len() - 1);
        }
        word
    }

    proptest::proptest! {
        #[test]
        fn stem_matches_the_reference(token in "[a-z]{0,12}(ies|sses|ches|shes|xes|zes|es|ss|us|is|s|ing|ed|e)?") {
            proptest::prop_assert_eq!(stem(&token), reference_stem(&token));
        }

        #[test]
        fn stem_matches_the_reference_on_any_text(token in "\\PC{0,12}") {
            proptest::prop_assert_eq!(stem(&token), reference_stem(&token));
        }

        #[test]
        fn stopwords_are_exactly_the_list(token in "[a-z\\x00]{0,11}|\\PC{0,16}") {
            proptest::prop_assert_eq!(is_stopword(&token), STOPWORDS.contains(&token.as_str()));
        }
    }

    #[test]
    fn every_stopword_is_found() {
        assert!(STOPWORDS.iter().all(|word| is_stopword(word)));
        assert!(!is_stopword("") && !is_stopword("a\0") && !is_stopword("youx") && !is_stopword("abouts"));
        assert!(!is_stopword("yourselvez") && !is_stopword("themselve") && !is_stopword("won"));
        // A request keeps what it asks for, not how it is phrased.
        assert_eq!(
            index_terms("Could you tell me if there are any flights to Tokyo?"),
            vec!["tell", "flight", "tokyo"]
        );
        assert_eq!(index_terms("Searching the messages of getUserById"), vec!["search", "messag", "user", "id"]);
    }

    #[test]
    fn tokens_split_identifiers() {
        assert_eq!(
            word_tokens("getUserById snake_case HTTP2x"),
            vec!["get", "user", "by", "id", "snake", "case", "http", "2", "x"]
        );
        for word in ["search", "searches", "searching", "searched"] {
            assert_eq!(stem(word), "search", "{word}");
        }
        assert_eq!(stem("messages"), stem("message"));
        assert_eq!(stem("queries"), "query");
        assert_eq!(stem("news"), "new");
        assert_eq!(stem("bus"), "bus");
        assert!(is_stopword("the") && !is_stopword("search"));
        let mut sorted = STOPWORDS.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, STOPWORDS, "STOPWORDS stays sorted, so a reader finds a word at a glance");
        assert!(
            STOPWORDS.iter().all(|word| (1..=MAX_STOPWORD_BYTES).contains(&word.len())),
            "every stopword packs into a key"
        );
        assert_eq!(word_tokens("ÉCOLE Straße"), vec!["école", "straße"]);
    }
}
