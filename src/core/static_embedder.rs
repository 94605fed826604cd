//! The static embedder: a token-embedding table distilled from
//! all-MiniLM-L6-v2, compiled in, so it is semantic with no model files.
//!
//! `assets/static-minilm/` holds the table (`table.bin`) and its vocabulary
//! (`vocab.txt`: MiniLM's BERT WordPiece vocabulary, then the corpus's words
//! that it holds only as pieces, so that "cryptocurrency" is one token, not
//! five); `PROVENANCE.md` there says how `scripts/distill_static.py` made
//! them: MiniLM's sentence output for every single token and added word
//! (model2vec), then the rows fitted so that a
//! sentence's weighted mean of rows is MiniLM's embedding of it, over a corpus
//! of software and tool language and everyday English (WordNet's definitions;
//! `scripts/static_corpus.py`; a rare token keeps its one-pass row),
//! projected on the directions MiniLM's sentences use, a per-token weight,
//! int8 with a scale per row. Both files are included with
//! `include_bytes!`/`include_str!`.
//!
//! A text is embedded as:
//!
//! 1. [`BertTokenizer::tokenize`]: MiniLM's own tokenizer (BERT normaliser:
//!    control characters dropped, CJK ideographs split, accents stripped,
//!    lower case; then split on whitespace and punctuation; then greedy
//!    longest-match-first WordPiece with `##` continuations, `[UNK]` for a
//!    word no piece sequence covers or longer than 100 characters);
//! 2. the sum of the table rows of its tokens (the weights are folded into
//!    the rows, special tokens and `[UNK]` are zero rows), L2-normalised, so
//!    a dot product is a cosine. A text without known tokens is the zero vector.
//!
//! Deterministic (integer table, a fixed summation order); the model id names
//! the table's dimension and the start of its SHA-256 ([`MODEL_ID`]; a test
//! checks the hash), so stored vectors are re-embedded whenever it changes.

use crate::core::embedder::{Embed, EmbedError};
use foldhash::HashMap;
use std::sync::OnceLock;
use unicode_categories::UnicodeCategories;
use unicode_normalization_alignments::UnicodeNormalization;

/// The distilled table (see the module docs and `assets/static-minilm/PROVENANCE.md`).
static TABLE: &[u8] = include_bytes!("../../assets/static-minilm/table.bin");
/// MiniLM's WordPiece vocabulary, one token a line, line number = token id.
static VOCAB: &str = include_str!("../../assets/static-minilm/vocab.txt");

/// The model id: scheme, dimensions and the first 12 hex digits of the
/// table's SHA-256 (`tests::the_model_id_names_the_table` checks it).
pub const MODEL_ID: &str = "capdex-static-minilm-v1-128-885cdc616aa8";

/// Longest word WordPiece splits; a longer one is `[UNK]` (BERT's 100).
pub const MAX_INPUT_CHARS_PER_WORD: usize = 100;

const MAGIC: &[u8; 4] = b"CDXS";
const HEADER_BYTES: usize = 16;

/// BERT's uncased WordPiece tokenizer over a vocabulary, as the
/// `tokenizers` package runs MiniLM's `tokenizer.json` (without the
/// `[CLS]`/`[SEP]` it adds around a sequence).
#[derive(Clone, Debug)]
pub struct BertTokenizer {
    /// Tokens that start a word, and continuations (`##` stripped), so a
    /// piece is looked up as a slice of its word, never copied.
    words: HashMap<&'static str, u32>,
    continuations: HashMap<&'static str, u32>,
    /// The longest token of each kind, in bytes: no longer piece can match.
    longest_word: usize,
    longest_continuation: usize,
    unk: u32,
}

impl BertTokenizer {
    /// Builds the tokenizer from a vocabulary (one token a line); `None`
    /// when it has no `[UNK]`.
    pub fn new(vocab: &'static str) -> Option<BertTokenizer> {
        let mut tokenizer = BertTokenizer {
            words: HashMap::default(),
            continuations: HashMap::default(),
            longest_word: 0,
            longest_continuation: 0,
            unk: 0,
        };
        for (id, token) in vocab.lines().enumerate() {
            // A later line with the same token wins, as in a map of the whole vocabulary.
            match token.strip_prefix("##") {
                Some(rest) => {
                    tokenizer.continuations.insert(rest, id as u32);
                    tokenizer.longest_continuation = tokenizer.longest_continuation.max(rest.len());
                }
                None => {
                    tokenizer.words.insert(token, id as u32);
                    tokenizer.longest_word = tokenizer.longest_word.max(token.len());
                }
            }
        }
        tokenizer.unk = *tokenizer.words.get("[UNK]")?;
        Some(tokenizer)
    }

    /// Number of tokens in the vocabulary.
    fn len(&self) -> usize {
        self.words.len() + self.continuations.len()
    }

    /// The token ids of `text`, in order.
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        let normalized = normalize(text);
        let mut ids = Vec::new();
        for word in pre_tokenize(&normalized) {
            self.word_piece(word, &mut ids);
        }
        ids
    }

    /// The tokens of `text` as strings (for tests and diagnostics).
    pub fn tokens(&self, text: &str) -> Vec<String> {
        let mut by_id: HashMap<u32, String> = self.words.iter().map(|(token, id)| (*id, token.to_string())).collect();
        by_id.extend(self.continuations.iter().map(|(rest, id)| (*id, format!("##{rest}"))));
        self.tokenize(text).into_iter().map(|id| by_id[&id].clone()).collect()
    }

    fn word_piece(&self, word: &str, ids: &mut Vec<u32>) {
        // A word of at most 100 bytes has at most 100 characters.
        if word.len() > MAX_INPUT_CHARS_PER_WORD && word.chars().count() > MAX_INPUT_CHARS_PER_WORD {
            ids.push(self.unk);
            return;
        }
        let first = ids.len();
        let mut start = 0;
        while start < word.len() {
            let (pieces, longest) = if start == 0 {
                (&self.words, self.longest_word)
            } else {
                (&self.continuations, self.longest_continuation)
            };
            // Longest match first, from the longest piece the vocabulary could hold.
            let mut end = (start + longest).min(word.len());
            while !word.is_char_boundary(end) {
                end -= 1;
            }
            let mut found = None;
            while start < end {
                if let Some(id) = pieces.get(&word[start..end]) {
                    found = Some(*id);
                    break;
                }
                end -= word[start..end].chars().next_back().map_or(1, char::len_utf8);
            }
            match found {
                Some(id) => {
                    ids.push(id);
                    start = end;
                }
                None => {
                    ids.truncate(first);
                    ids.push(self.unk);
                    return;
                }
            }
        }
    }
}

/// The BERT normaliser: drops NUL, U+FFFD and control characters, makes
/// every whitespace a space, pads CJK ideographs with spaces, strips accents
/// (NFD without non-spacing marks) and lower-cases character by character.
fn normalize(text: &str) -> String {
    if text.is_ascii() {
        return normalize_ascii(text);
    }
    normalize_unicode(text)
}

/// [`normalize`] of ASCII text, byte by byte: the control characters
/// (including vertical tab and form feed) dropped, tab, newline, carriage
/// return and space made spaces, letters lower-cased.
fn normalize_ascii(text: &str) -> String {
    let mut normalized = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'\t' | b'\n' | b'\r' | b' ' => normalized.push(' '),
            0x00..=0x1f | 0x7f => {}
            _ => normalized.push(char::from(byte.to_ascii_lowercase())),
        }
    }
    normalized
}

/// [`normalize`] of any text.
fn normalize_unicode(text: &str) -> String {
    let mut cleaned = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\0' || c == '\u{fffd}' || is_control(c) {
            continue;
        }
        if is_whitespace(c) {
            cleaned.push(' ');
        } else if is_chinese_char(c) {
            cleaned.push(' ');
            cleaned.push(c);
            cleaned.push(' ');
        } else {
            cleaned.push(c);
        }
    }
    // ASCII has no decomposition and no marks, and lower-cases byte by byte:
    // the common case skips the Unicode tables.
    if cleaned.is_ascii() {
        cleaned.make_ascii_lowercase();
        return cleaned;
    }
    fold_accents_and_case(&cleaned)
}

/// NFD without non-spacing marks, lower-cased character by character.
fn fold_accents_and_case(cleaned: &str) -> String {
    let mut normalized = String::with_capacity(cleaned.len());
    for (c, _) in cleaned.nfd() {
        if !c.is_mark_nonspacing() {
            normalized.extend(c.to_lowercase());
        }
    }
    normalized
}

/// Splits on whitespace (dropped) and punctuation (kept, one character a word).
fn pre_tokenize(text: &str) -> Vec<&str> {
    let mut words = Vec::new();
    for chunk in text.split(char::is_whitespace) {
        let mut start = 0;
        for (at, c) in chunk.char_indices() {
            // An ASCII character's Unicode punctuation is within ASCII punctuation.
            if c.is_ascii_punctuation() || (!c.is_ascii() && c.is_punctuation()) {
                if start < at {
                    words.push(&chunk[start..at]);
                }
                words.push(&chunk[at..at + c.len_utf8()]);
                start = at + c.len_utf8();
            }
        }
        if start < chunk.len() {
            words.push(&chunk[start..]);
        }
    }
    words
}

fn is_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || c.is_whitespace()
}

fn is_control(c: char) -> bool {
    !matches!(c, '\t' | '\n' | '\r') && c.is_other()
}

fn is_chinese_char(c: char) -> bool {
    matches!(
        c as u32,
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            | 0x2B920..=0x2CEAF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

/// The parsed table: borrowed int8 rows and their scales.
#[derive(Debug)]
struct Table {
    dimensions: usize,
    scales: Vec<f32>,
    values: &'static [u8],
}

impl Table {
    /// Parses `table.bin` (layout in `scripts/distill_static.py`).
    fn parse(bytes: &'static [u8]) -> Result<Table, String> {
        let u32_at = |at: usize| bytes.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        if bytes.get(..4) != Some(MAGIC.as_slice()) || u32_at(4) != Some(1) {
            return Err("not a version 1 capdex static table".into());
        }
        let rows = u32_at(8).ok_or("truncated header")? as usize;
        let dimensions = u32_at(12).ok_or("truncated header")? as usize;
        let values_at = HEADER_BYTES + rows * 4;
        if dimensions == 0 || bytes.len() != values_at + rows * dimensions {
            return Err(format!("{} bytes do not hold {rows} rows of {dimensions} dimensions", bytes.len()));
        }
        let scales = bytes[HEADER_BYTES..values_at]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(Table { dimensions, scales, values: &bytes[values_at..] })
    }

    fn rows(&self) -> usize {
        self.scales.len()
    }

    /// Adds row `id` into `sum` (integer values, one scale).
    fn add_row(&self, id: usize, sum: &mut [f32]) {
        let scale = self.scales[id];
        if scale == 0.0 {
            return;
        }
        let row = &self.values[id * self.dimensions..(id + 1) * self.dimensions];
        for (s, v) in sum.iter_mut().zip(row) {
            *s += scale * f32::from(*v as i8);
        }
    }
}

/// The compiled-in tokenizer and table, parsed once per process.
fn model() -> &'static (BertTokenizer, Table) {
    static MODEL: OnceLock<(BertTokenizer, Table)> = OnceLock::new();
    MODEL.get_or_init(|| {
        // The assets are part of the build: a bad one is a build defect the tests catch.
        let tokenizer = BertTokenizer::new(VOCAB).expect("assets/static-minilm/vocab.txt has [UNK]");
        let table = Table::parse(TABLE).expect("assets/static-minilm/table.bin is a valid table");
        assert_eq!(table.rows(), tokenizer.len(), "one table row per vocabulary token");
        (tokenizer, table)
    })
}

/// The static embedder described in the module docs. Cheap to create (the
/// table is parsed once per process) and cannot fail.
#[derive(Clone, Copy, Debug, Default)]
pub struct StaticEmbedder;

impl StaticEmbedder {
    pub fn new() -> StaticEmbedder {
        StaticEmbedder
    }

    /// Embeds one text; a text without known tokens gives the zero vector.
    pub fn embed(&self, text: &str) -> Vec<f32> {
        let (tokenizer, table) = model();
        let mut sum = vec![0.0f32; table.dimensions];
        for id in tokenizer.tokenize(text) {
            table.add_row(id as usize, &mut sum);
        }
        let norm = sum.iter().map(|v| v * v).sum::<f32>().sqrt();
        if norm > 0.0 {
            sum.iter_mut().for_each(|v| *v /= norm);
        }
        sum
    }
}

impl Embed for StaticEmbedder {
    fn model_id(&self) -> String {
        MODEL_ID.to_string()
    }

    fn dimensions(&self) -> usize {
        model().1.dimensions
    }

    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts.iter().map(|text| StaticEmbedder::embed(self, text)).collect())
    }

    fn embed(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        Ok(StaticEmbedder::embed(self, text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sha2::{Digest, Sha256};

    proptest! {
        #[test]
        fn the_ascii_path_folds_as_the_unicode_one(text in "[\\x00-\\x7f]{0,64}") {
            prop_assert_eq!(fold_accents_and_case(&text), text.to_ascii_lowercase());
            prop_assert_eq!(normalize_ascii(&text), normalize_unicode(&text));
        }

        #[test]
        fn ascii_punctuation_is_all_the_punctuation_ascii_has(c in proptest::char::range('\0', '\x7f')) {
            prop_assert!(!c.is_punctuation() || c.is_ascii_punctuation());
        }
    }

    /// WordPiece as first written: every candidate from the whole word down,
    /// `##` pasted on, looked up in one map of the whole vocabulary.
    fn reference_tokenize(text: &str) -> Vec<u32> {
        let vocab: std::collections::HashMap<&str, u32> =
            VOCAB.lines().enumerate().map(|(id, token)| (token, id as u32)).collect();
        let unk = vocab["[UNK]"];
        let mut ids = Vec::new();
        for word in pre_tokenize(&normalize_unicode(text)) {
            if word.chars().count() > MAX_INPUT_CHARS_PER_WORD {
                ids.push(unk);
                continue;
            }
            let (first, mut start) = (ids.len(), 0);
            while start < word.len() {
                let mut end = word.len();
                let mut found = None;
                while start < end {
                    let piece =
                        if start > 0 { format!("##{}", &word[start..end]) } else { word[start..end].to_string() };
                    if let Some(id) = vocab.get(piece.as_str()) {
                        found = Some(*id);
                        break;
                    }
                    end -= word[start..end].chars().next_back().map_or(1, char::len_utf8);
                }
                match found {
                    Some(id) => {
                        ids.push(id);
                        start = end;
                    }
                    None => {
                        ids.truncate(first);
                        ids.push(unk);
                        break;
                    }
                }
            }
        }
        ids
    }

    proptest! {
        #[test]
        fn tokenizes_as_the_reference_word_piece(
            text in "([a-zA-Z_]{1,40}|[0-9]{1,6}|[ .,:;!?#()\\-]|caf\u{e9}|na\u{ef}ve|\u{6771}\u{4eac}|\u{3b1}\u{3b2}\u{3b3}| ){0,24}",
        ) {
            let (tokenizer, _) = model();
            prop_assert_eq!(tokenizer.tokenize(&text), reference_tokenize(&text));
        }
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn the_model_id_names_the_table() {
        let digest = Sha256::digest(TABLE);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let expected = format!("capdex-static-minilm-v1-{}-{}", model().1.dimensions, &hex[..12]);
        assert_eq!(MODEL_ID, expected);
    }

    #[test]
    fn vectors_are_unit_length_deterministic_and_semantic() {
        let embedder = StaticEmbedder::new();
        let weather = embedder.embed("What's the weather forecast for tomorrow?");
        assert_eq!(weather.len(), model().1.dimensions);
        assert!((cosine(&weather, &weather) - 1.0).abs() < 1e-5);
        assert_eq!(weather, embedder.embed("What's the weather forecast for tomorrow?"));
        let rain = embedder.embed("will it rain in Paris");
        let invoice = embedder.embed("create an invoice for the customer");
        assert!(cosine(&weather, &rain) > cosine(&weather, &invoice), "weather ~ rain, not invoices");
        assert!(embedder.embed("").iter().all(|v| *v == 0.0));
        assert!(embedder.embed(" \t\n ").iter().all(|v| *v == 0.0));
    }

    /// `tests/fixtures/static_tokenizer.json`: the Python `tokenizers` ids of
    /// 330 varied strings (`scripts/static_tokenizer_fixture.py`).
    #[test]
    fn tokenizes_as_the_python_tokenizers_package_does() {
        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/static_tokenizer.json")).unwrap();
        let (tokenizer, _) = model();
        let texts = fixture["texts"].as_array().unwrap();
        assert!(texts.len() >= 300);
        for entry in texts {
            let text = entry["text"].as_str().unwrap();
            let expected: Vec<u32> =
                entry["ids"].as_array().unwrap().iter().map(|id| id.as_u64().unwrap() as u32).collect();
            assert_eq!(tokenizer.tokenize(text), expected, "{text:?}");
        }
    }

    #[test]
    fn tokenizes_like_bert() {
        let (tokenizer, _) = model();
        assert_eq!(tokenizer.tokens("Héllo, World!"), ["hello", ",", "world", "!"]);
        assert_eq!(tokenizer.tokens("東京"), ["東", "京"]);
        assert_eq!(tokenizer.tokens(&"x".repeat(101)), ["[UNK]"]);
        assert!(tokenizer.tokens("getUserById").len() > 1);
        // Words of the distillation corpus that MiniLM's vocabulary splits are tokens of their own.
        assert_eq!(tokenizer.tokens("Cryptocurrency"), ["cryptocurrency"]);
        assert_eq!(tokenizer.tokens("cryptocurrencyx"), ["cryptocurrency", "##x"]);
    }
}
