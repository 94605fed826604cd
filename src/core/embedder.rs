//! The built-in offline embedder: feature hashing, no model files.
//!
//! `HashingEmbedder` maps a text to a fixed-size, L2-normalised vector:
//!
//! 1. the text is split into word tokens ([`word_tokens`]: lower case,
//!    camelCase and snake_case split), stopwords dropped, each word stemmed;
//! 2. each stem contributes `1 + ln(tf)` to one signed bucket
//!    (FNV-1a 64 of `w:<stem>`; bucket = hash mod dim, sign = top bit);
//! 3. each stem's character trigrams (of `#stem#`) contribute
//!    [`TRIGRAM_WEIGHT`] / sqrt(number of trigrams), so typos and partial
//!    words still meet;
//! 4. the vector is L2-normalised, so a dot product is a cosine.
//!
//! It is deterministic across runs, platforms and processes (FNV, not the
//! randomised std hasher), so stored vectors stay valid: [`HashingEmbedder::model_id`]
//! names the scheme and its dimension and changes whenever either does.

use crate::core::text::{for_each_word_token, is_stopword, stem_into};

/// Default number of dimensions.
pub const DEFAULT_DIMENSIONS: usize = 512;
/// Total weight of a word's character trigrams relative to the word itself.
pub const TRIGRAM_WEIGHT: f32 = 0.5;

/// Why an embedder could not embed: a stable code and a message for people.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct EmbedError {
    pub code: EmbedErrorCode,
    pub message: String,
}

/// The kinds of [`EmbedError`]; [`EmbedErrorCode::as_str`] is the wire form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EmbedErrorCode {
    /// The backend could not be reached or did not answer in time.
    Unavailable,
    /// The backend answered with an error status (after the retries).
    Rejected,
    /// The backend answered, but not with one vector per text of one dimension.
    BadResponse,
    /// The backend is not configured correctly (missing model files, key, ...).
    Config,
    /// The model itself failed (tokenizer, tensor shapes, ...).
    Model,
}

impl EmbedErrorCode {
    /// The code as written in diagnostics and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            EmbedErrorCode::Unavailable => "embedder_unavailable",
            EmbedErrorCode::Rejected => "embedder_rejected",
            EmbedErrorCode::BadResponse => "embedder_bad_response",
            EmbedErrorCode::Config => "embedder_config",
            EmbedErrorCode::Model => "embedder_model",
        }
    }
}

impl std::fmt::Display for EmbedErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl EmbedError {
    pub fn new(code: EmbedErrorCode, message: impl Into<String>) -> EmbedError {
        EmbedError { code, message: message.into() }
    }
}

/// Texts per embedding request unless configured otherwise (the design's 32).
pub const DEFAULT_BATCH_SIZE: usize = 32;

/// Something that turns texts into unit vectors of a fixed dimension.
///
/// Embedding may fail (a remote backend is down, a model file is bad); the
/// caller decides what to do without vectors (capdex falls back to its
/// lexical and graph signals).
pub trait Embed {
    /// Names the model (and its version) that produced a vector.
    fn model_id(&self) -> String;
    /// Number of dimensions of every vector this embedder returns; 0 while
    /// unknown (a remote model before its first answer).
    fn dimensions(&self) -> usize;
    /// Embeds a batch, in order: one vector per text.
    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError>;
    /// Embeds one text.
    fn embed(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        let mut vectors = self.embed_batch(&[text.to_string()])?;
        match vectors.pop() {
            Some(vector) if vectors.is_empty() => Ok(vector),
            _ => Err(EmbedError::new(EmbedErrorCode::BadResponse, "expected one vector for one text")),
        }
    }
    /// Embeds a batch of requests (a discovery query and its clauses), in
    /// order. The same as [`Embed::embed_batch`] unless the model embeds
    /// queries differently from the texts they are matched against
    /// ([`Prefixed`]: an instruction or prefix in front of queries only).
    fn embed_queries(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_batch(texts)
    }
}

/// How a sentence model turns its token states into one vector
/// (sentence-transformers' `1_Pooling/config.json`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of the tokens' states (all-MiniLM-L6-v2, e5, gte).
    #[default]
    Mean,
    /// The first token's (`[CLS]`) state (bge).
    Cls,
    /// The largest value of each dimension over the tokens.
    Max,
}

impl Pooling {
    /// Parses `mean`, `cls` or `max`.
    pub fn parse(text: &str) -> Result<Pooling, String> {
        match text {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "max" => Ok(Pooling::Max),
            other => Err(format!("must be \"mean\", \"cls\" or \"max\", got {other:?}")),
        }
    }

    /// The name [`Pooling::parse`] reads.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Max => "max",
        }
    }
}

/// What a text is to the model: a capability's text, or a request matched against them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TextRole {
    /// A capability's embedding text ([`Embed::embed_batch`]).
    #[default]
    Document,
    /// A request or one of its clauses ([`Embed::embed_queries`]).
    Query,
}

/// Embeds `texts` in their `role` in requests of at most `batch_size` texts
/// ([`embed_in_batches`] for documents).
pub fn embed_in_batches_as(
    embedder: &(impl Embed + ?Sized),
    texts: &[String],
    batch_size: usize,
    role: TextRole,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    match role {
        TextRole::Document => embed_in_batches(embedder, texts, batch_size),
        TextRole::Query => batched(texts, batch_size, |chunk| embedder.embed_queries(chunk)),
    }
}

/// An embedder whose queries and documents get a fixed text in front before
/// the inner model sees them: the instruction or prefix models such as
/// bge (`"Represent this sentence for searching relevant passages: "` on
/// queries) or e5 (`"query: "` / `"passage: "`) were trained with.
///
/// A blank text stays blank (no prefix), so it keeps the inner model's
/// meaning of "no text" (a zero vector). The model id names both prefixes
/// (by hash), so vectors made with other prefixes are never reused.
pub struct Prefixed<E> {
    inner: E,
    query_prefix: String,
    document_prefix: String,
    model_id: String,
}

impl<E: Embed> Prefixed<E> {
    /// Wraps `inner`; with both prefixes empty it embeds exactly as `inner`
    /// (and keeps its model id).
    pub fn new(inner: E, query_prefix: impl Into<String>, document_prefix: impl Into<String>) -> Prefixed<E> {
        let (query_prefix, document_prefix) = (query_prefix.into(), document_prefix.into());
        let model_id = if query_prefix.is_empty() && document_prefix.is_empty() {
            inner.model_id()
        } else {
            let hash = text_hash(&query_prefix, &document_prefix);
            format!("{}+prefix-{}", inner.model_id(), &hash[..12])
        };
        Prefixed { inner, query_prefix, document_prefix, model_id }
    }

    fn with_prefix(prefix: &str, texts: &[String]) -> Vec<String> {
        texts
            .iter()
            .map(
                |text| {
                    if prefix.is_empty() || text.trim().is_empty() {
                        text.clone()
                    } else {
                        format!("{prefix}{text}")
                    }
                },
            )
            .collect()
    }
}

impl<E: Embed> Embed for Prefixed<E> {
    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    fn dimensions(&self) -> usize {
        self.inner.dimensions()
    }

    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.inner.embed_batch(&Self::with_prefix(&self.document_prefix, texts))
    }

    fn embed_queries(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.inner.embed_batch(&Self::with_prefix(&self.query_prefix, texts))
    }
}

impl<E: Embed + ?Sized> Embed for Box<E> {
    fn model_id(&self) -> String {
        (**self).model_id()
    }

    fn dimensions(&self) -> usize {
        (**self).dimensions()
    }

    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        (**self).embed_batch(texts)
    }

    fn embed(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        (**self).embed(text)
    }

    fn embed_queries(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        (**self).embed_queries(texts)
    }
}

/// Vectors another embedder computed earlier (off the caller's thread), served by text:
/// lets a pure function that takes an [`Embed`] use a slow embedder's vectors. A text it
/// was not given is an error, so the caller falls back as it would for a failing embedder.
#[derive(Clone, Debug, Default)]
pub struct PrecomputedEmbedder {
    model_id: String,
    dimensions: usize,
    vectors: std::collections::HashMap<String, Vec<f32>>,
}

impl PrecomputedEmbedder {
    /// Pairs `texts` with `vectors` (in order) under the model that made them.
    pub fn new(model_id: String, dimensions: usize, texts: &[String], vectors: Vec<Vec<f32>>) -> PrecomputedEmbedder {
        let vectors = texts.iter().cloned().zip(vectors).collect();
        PrecomputedEmbedder { model_id, dimensions, vectors }
    }
}

impl Embed for PrecomputedEmbedder {
    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    fn dimensions(&self) -> usize {
        self.dimensions
    }

    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        texts
            .iter()
            .map(|text| {
                self.vectors
                    .get(text)
                    .cloned()
                    .ok_or_else(|| EmbedError::new(EmbedErrorCode::Unavailable, "no precomputed vector for this text"))
            })
            .collect()
    }
}

/// Embeds `texts` with `embedder` in requests of at most `batch_size` texts
/// (at least 1), checking that every request gives one vector per text.
pub fn embed_in_batches(
    embedder: &(impl Embed + ?Sized),
    texts: &[String],
    batch_size: usize,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    batched(texts, batch_size, |chunk| embedder.embed_batch(chunk))
}

/// Calls `embed` on chunks of at most `batch_size` texts (at least 1),
/// checking that each call gives one vector per text.
fn batched(
    texts: &[String],
    batch_size: usize,
    embed: impl Fn(&[String]) -> Result<Vec<Vec<f32>>, EmbedError>,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    let mut vectors = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(batch_size.max(1)) {
        let embedded = embed(chunk)?;
        if embedded.len() != chunk.len() {
            return Err(EmbedError::new(
                EmbedErrorCode::BadResponse,
                format!("{} vectors for {} texts", embedded.len(), chunk.len()),
            ));
        }
        vectors.extend(embedded);
    }
    Ok(vectors)
}

/// Hash of what a vector is computed from, model and text: the key of
/// embedding caches (a vector is valid while both are unchanged).
pub fn text_hash(model_id: &str, text: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest =
        Sha256::new().chain_update(model_id.as_bytes()).chain_update([0u8]).chain_update(text.as_bytes()).finalize();
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The feature-hashing embedder described in the module docs.
#[derive(Clone, Copy, Debug)]
pub struct HashingEmbedder {
    dimensions: usize,
}

impl HashingEmbedder {
    /// Returns an embedder with `dimensions` buckets, `None` when zero.
    pub fn new(dimensions: usize) -> Option<HashingEmbedder> {
        (dimensions > 0).then_some(HashingEmbedder { dimensions })
    }
}

impl Default for HashingEmbedder {
    fn default() -> Self {
        HashingEmbedder { dimensions: DEFAULT_DIMENSIONS }
    }
}

impl Embed for HashingEmbedder {
    fn model_id(&self) -> String {
        // v2: the longer stop list (`core::text::STOPWORDS`) changed every text's terms.
        format!("capdex-hashing-v2-{}", self.dimensions)
    }

    fn dimensions(&self) -> usize {
        self.dimensions
    }

    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(HashingEmbedder::embed_batch(self, texts))
    }

    fn embed(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        Ok(HashingEmbedder::embed(self, text))
    }
}

impl HashingEmbedder {
    /// Embeds a batch, in order; the built-in embedder cannot fail.
    pub fn embed_batch(&self, texts: &[String]) -> Vec<Vec<f32>> {
        texts.iter().map(|text| self.embed(text)).collect()
    }

    /// Embeds one text; an empty text gives the zero vector. Never fails.
    ///
    /// Terms are counted by sorting them, not in a map: every term is
    /// appended to one buffer and the sorted spans are walked in runs, so a
    /// text costs a few allocations whatever its length. The terms are
    /// visited in byte order, which fixes the order of float additions: the
    /// vector is identical every run.
    pub fn embed(&self, text: &str) -> Vec<f32> {
        let mut vector = vec![0.0f32; self.dimensions];
        let mut terms = String::new();
        let mut spans: Vec<(u32, u32)> = Vec::new();
        for_each_word_token(text, |token| {
            if !is_stopword(token) {
                let start = terms.len();
                stem_into(token, &mut terms);
                spans.push((start as u32, terms.len() as u32));
            }
        });
        let term = |&(start, end): &(u32, u32)| &terms[start as usize..end as usize];
        spans.sort_unstable_by(|a, b| term(a).cmp(term(b)));
        let word_prefix = fnv1a64(b"w:");
        let trigram_prefix = fnv1a64(b"c:");
        // `#term#` and the byte offset of each of its characters, plus its end.
        let mut padded = String::new();
        let mut bounds: Vec<usize> = Vec::new();
        let mut at = 0;
        while at < spans.len() {
            let word = term(&spans[at]);
            let count = spans[at..].iter().take_while(|span| term(span) == word).count();
            at += count;
            let weight = 1.0 + (count as f32).ln();
            add_hashed_feature(&mut vector, fnv1a64_continue(word_prefix, word.as_bytes()), weight);
            // Trigrams of `#term#`, hashed as `c:<trigram>` without building the strings.
            padded.clear();
            padded.push('#');
            padded.push_str(word);
            padded.push('#');
            bounds.clear();
            bounds.extend(padded.char_indices().map(|(offset, _)| offset));
            bounds.push(padded.len());
            let n_trigrams = (bounds.len() - 1).saturating_sub(2);
            if n_trigrams > 0 {
                let trigram_weight = weight * TRIGRAM_WEIGHT / (n_trigrams as f32).sqrt();
                for window in bounds.windows(4) {
                    let hash = fnv1a64_continue(trigram_prefix, &padded.as_bytes()[window[0]..window[3]]);
                    add_hashed_feature(&mut vector, hash, trigram_weight);
                }
            }
        }
        normalize(&mut vector);
        vector
    }
}

fn add_hashed_feature(vector: &mut [f32], hash: u64, weight: f32) {
    let bucket = (hash % vector.len() as u64) as usize;
    let sign = if hash >> 63 == 0 { 1.0 } else { -1.0 };
    vector[bucket] += sign * weight;
}

/// FNV-1a, 64 bit: stable across platforms and releases, unlike `DefaultHasher`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_continue(0xcbf2_9ce4_8422_2325, bytes)
}

/// Continues an FNV-1a 64 hash over more bytes: hashing `a` then `b` equals hashing `a ++ b`.
pub fn fnv1a64_continue(mut hash: u64, bytes: &[u8]) -> u64 {
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Scales a vector to unit length; the zero vector stays zero.
pub fn normalize(vector: &mut [f32]) {
    let norm: f32 = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
}

/// Dot product of two equally long vectors (a cosine for unit vectors).
///
/// Eight independent accumulators let the compiler vectorise the loop (a
/// single running sum cannot be reordered, so it would stay scalar).
pub fn dot(left: &[f32], right: &[f32]) -> f32 {
    debug_assert_eq!(left.len(), right.len());
    let mut lanes = [0.0f32; 8];
    let left_chunks = left.chunks_exact(8);
    let right_chunks = right.chunks_exact(8);
    let tail: f32 = left_chunks.remainder().iter().zip(right_chunks.remainder()).map(|(a, b)| a * b).sum();
    for (a, b) in left_chunks.zip(right_chunks) {
        for lane in 0..8 {
            lanes[lane] += a[lane] * b[lane];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precomputed_vectors_are_served_by_text_and_others_fail() {
        let texts = vec!["a".to_string(), "b".to_string()];
        let table = PrecomputedEmbedder::new("m".into(), 2, &texts, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
        assert_eq!(table.embed_batch(&texts[1..]).unwrap(), [vec![0.0, 1.0]]);
        assert_eq!((table.model_id().as_str(), table.dimensions()), ("m", 2));
        assert!(table.embed("c").is_err());
    }
    use crate::core::text::{stem, word_tokens};
    use std::collections::HashMap;

    #[test]
    fn vectors_are_unit_and_deterministic() {
        let embedder = HashingEmbedder::default();
        let first = embedder.embed("Search the web for current information");
        let second = embedder.embed("Search the web for current information");
        assert_eq!(first, second);
        let norm: f32 = first.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
        assert!(embedder.embed("the of and").iter().all(|x| *x == 0.0));
        assert!(HashingEmbedder::new(0).is_none());
    }

    /// Records the texts it is asked to embed (the prefixes, seen from inside).
    struct Recording(std::sync::Mutex<Vec<String>>);

    impl Embed for Recording {
        fn model_id(&self) -> String {
            "rec".into()
        }
        fn dimensions(&self) -> usize {
            1
        }
        fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
            self.0.lock().unwrap().extend(texts.iter().cloned());
            Ok(texts.iter().map(|_| vec![1.0]).collect())
        }
    }

    #[test]
    fn prefixes_go_in_front_of_queries_and_documents_apart_and_name_the_model() {
        let texts = vec!["find flights".to_string(), "  ".to_string()];
        let prefixed = Prefixed::new(Recording(Default::default()), "query: ", "passage: ");
        embed_in_batches_as(&prefixed, &texts, 1, TextRole::Query).unwrap();
        embed_in_batches_as(&prefixed, &texts[..1], 8, TextRole::Document).unwrap();
        let seen = prefixed.inner.0.lock().unwrap().clone();
        assert_eq!(seen, ["query: find flights", "  ", "passage: find flights"]);
        assert!(prefixed.model_id().starts_with("rec+prefix-"), "{}", prefixed.model_id());
        let other = Prefixed::new(Recording(Default::default()), "query: ", "");
        assert_ne!(other.model_id(), prefixed.model_id());
        // Without prefixes the wrapper is the model itself, id included.
        let plain = Prefixed::new(Recording(Default::default()), "", "");
        assert_eq!(plain.model_id(), "rec");
        plain.embed_queries(&texts[..1]).unwrap();
        assert_eq!(plain.inner.0.lock().unwrap().as_slice(), ["find flights"]);
        // Every other embedder embeds a query as any text.
        let hashing = HashingEmbedder::default();
        assert_eq!(hashing.embed_queries(&texts[..1]).unwrap(), vec![hashing.embed("find flights")]);
    }

    #[test]
    fn related_texts_score_higher_than_unrelated() {
        let embedder = HashingEmbedder::default();
        let query = embedder.embed("send a message on telegram");
        let telegram =
            embedder.embed("telegram (channel)\nSend messages to Telegram chats and groups\nCategory: communication");
        let weather = embedder.embed("weather\nGet the current weather forecast for a city\nCategory: information");
        assert!(dot(&query, &telegram) > dot(&query, &weather) + 0.2);
    }

    #[test]
    fn dot_matches_the_plain_sum() {
        let left: Vec<f32> = (0..37).map(|i| i as f32 * 0.25 - 3.0).collect();
        let right: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.125).collect();
        let plain: f32 = left.iter().zip(&right).map(|(a, b)| a * b).sum();
        assert!((dot(&left, &right) - plain).abs() < 1e-3);
        assert_eq!(dot(&[], &[]), 0.0);
    }

    /// The embedder as first written, building every feature string: the
    /// streaming hashes must give the very same vectors (stored vectors stay valid).
    fn reference_embed(dimensions: usize, text: &str) -> Vec<f32> {
        let mut vector = vec![0.0f32; dimensions];
        let mut term_counts: HashMap<String, u32> = HashMap::new();
        for token in word_tokens(text) {
            if !is_stopword(&token) {
                *term_counts.entry(stem(&token)).or_insert(0) += 1;
            }
        }
        let mut terms: Vec<(String, u32)> = term_counts.into_iter().collect();
        terms.sort_unstable();
        let mut add = |feature: &str, weight: f32| add_hashed_feature(&mut vector, fnv1a64(feature.as_bytes()), weight);
        for (term, count) in &terms {
            let weight = 1.0 + (*count as f32).ln();
            add(&format!("w:{term}"), weight);
            let padded: Vec<char> = format!("#{term}#").chars().collect();
            let n_trigrams = padded.len().saturating_sub(2);
            if n_trigrams > 0 {
                let trigram_weight = weight * TRIGRAM_WEIGHT / (n_trigrams as f32).sqrt();
                for window in padded.windows(3) {
                    let trigram: String = window.iter().collect();
                    add(&format!("c:{trigram}"), trigram_weight);
                }
            }
        }
        normalize(&mut vector);
        vector
    }

    #[test]
    fn streaming_hashes_match_the_reference() {
        let embedder = HashingEmbedder::default();
        for text in ["Search the web for current information", "getUserById café naïve 東京 x", "", "a b c searches"]
        {
            assert_eq!(embedder.embed(text), reference_embed(DEFAULT_DIMENSIONS, text), "{text}");
        }
    }

    proptest::proptest! {
        #[test]
        fn streaming_hashes_match_the_reference_on_any_text(text in "\\PC{0,60}") {
            proptest::prop_assert_eq!(HashingEmbedder::default().embed(&text), reference_embed(DEFAULT_DIMENSIONS, &text));
        }
    }

    /// Records the size of every batch it is given; returns one 1-d vector per text.
    struct Counting(std::cell::RefCell<Vec<usize>>);

    impl Embed for Counting {
        fn model_id(&self) -> String {
            "counting".into()
        }
        fn dimensions(&self) -> usize {
            1
        }
        fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
            self.0.borrow_mut().push(texts.len());
            if texts.iter().any(|t| t == "boom") {
                return Ok(vec![vec![1.0]]);
            }
            Ok(texts.iter().map(|_| vec![1.0]).collect())
        }
    }

    #[test]
    fn batches_are_split_and_checked() {
        let counting = Counting(Default::default());
        let texts: Vec<String> = (0..70).map(|i| i.to_string()).collect();
        assert_eq!(embed_in_batches(&counting, &texts, 32).unwrap().len(), 70);
        assert_eq!(*counting.0.borrow(), vec![32, 32, 6]);
        let err = embed_in_batches(&counting, &["a".into(), "boom".into()], 32).unwrap_err();
        assert_eq!(err.code, EmbedErrorCode::BadResponse);
        assert_eq!(err.to_string(), "embedder_bad_response: 1 vectors for 2 texts");
        assert_eq!(Embed::embed(&HashingEmbedder::default(), "x").unwrap(), HashingEmbedder::default().embed("x"));
    }

    #[test]
    fn model_id_names_the_dimension() {
        assert_eq!(HashingEmbedder::default().model_id(), "capdex-hashing-v2-512");
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
