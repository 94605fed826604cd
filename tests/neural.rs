//! The local neural embedder against reference embeddings, and its typed load errors.
//!
//! Needs the all-MiniLM-L6-v2 files: `scripts/fetch-minilm.sh` puts them in
//! `.models/all-MiniLM-L6-v2`; `CAPDEX_TEST_MODEL_DIR` points elsewhere. Without them every
//! test here fails with a message saying so (a missing model must not pass silently).
//! `tests/fixtures/minilm_reference.json` comes from `scripts/minilm_reference.py` (an
//! independent NumPy BERT forward pass over the same files; see its header).
//!
//! The MPNet encoder is checked on `tests/fixtures/mpnet-tiny`, a small random MPNet model, against
//! `tests/fixtures/mpnet_reference.json`; both come from `scripts/mpnet_reference.py` (an
//! independent NumPy MPNet forward pass), and need no download.
#![cfg(feature = "neural")]

use capdex::core::embedder::{dot, Embed, Pooling};
use capdex::embedders::neural::{NeuralEmbedder, NeuralError};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Fixture {
    dimensions: usize,
    max_seq_length: usize,
    texts: Vec<FixtureText>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FixtureText {
    text: String,
    n_tokens: usize,
    embedding: Vec<f32>,
    /// The same hidden states pooled by the [CLS] token, and by the max per dimension.
    cls_embedding: Vec<f32>,
    max_embedding: Vec<f32>,
}

fn model_dir() -> PathBuf {
    match std::env::var_os("CAPDEX_TEST_MODEL_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".models/all-MiniLM-L6-v2"),
    }
}

/// The model, loaded once for every test in this binary.
fn embedder() -> &'static NeuralEmbedder {
    static EMBEDDER: OnceLock<NeuralEmbedder> = OnceLock::new();
    EMBEDDER.get_or_init(|| {
        let dir = model_dir();
        assert!(
            dir.join("model.safetensors").is_file(),
            "all-MiniLM-L6-v2 not found in {}: run scripts/fetch-minilm.sh (or set CAPDEX_TEST_MODEL_DIR)",
            dir.display()
        );
        NeuralEmbedder::load(&dir).unwrap_or_else(|error| panic!("failed to load {}: {error}", dir.display()))
    })
}

fn fixture() -> Fixture {
    read_fixture("minilm_reference.json")
}

/// Reads `tests/fixtures/<name>` as JSON.
fn read_fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn cosine(left: &[f32], right: &[f32]) -> f32 {
    dot(left, right) / (dot(left, left).sqrt() * dot(right, right).sqrt())
}

fn assert_matches_reference(fixture: &Fixture, vectors: &[Vec<f32>], how: &str) {
    assert_matches_pooled(fixture, vectors, how, |entry| &entry.embedding);
}

fn assert_matches_pooled(
    fixture: &Fixture,
    vectors: &[Vec<f32>],
    how: &str,
    pooled: impl Fn(&FixtureText) -> &Vec<f32>,
) {
    assert_eq!(vectors.len(), fixture.texts.len());
    for (reference, vector) in fixture.texts.iter().zip(vectors) {
        let reference_embedding = pooled(reference);
        assert_eq!(vector.len(), fixture.dimensions);
        let similarity = cosine(reference_embedding, vector);
        assert!(
            similarity >= 0.999,
            "{how}: cosine {similarity:.6} < 0.999 for {:?} ({} tokens)",
            reference.text,
            reference.n_tokens
        );
    }
}

#[test]
fn fixture_covers_short_long_truncated_unicode_and_empty_texts() {
    let fixture = fixture();
    assert!(fixture.texts.len() >= 20);
    assert!(fixture.texts.iter().any(|entry| entry.text.is_empty()));
    assert!(fixture.texts.iter().any(|entry| entry.n_tokens > 128 && entry.n_tokens < fixture.max_seq_length));
    assert!(fixture.texts.iter().any(|entry| entry.n_tokens == fixture.max_seq_length));
    assert!(fixture.texts.iter().any(|entry| !entry.text.is_ascii()));
}

#[test]
fn one_padded_batch_matches_the_reference() {
    let fixture = fixture();
    let embedder = embedder();
    assert_eq!(embedder.dimensions(), fixture.dimensions);
    assert_eq!(embedder.max_seq_length(), fixture.max_seq_length);
    let texts: Vec<String> = fixture.texts.iter().map(|entry| entry.text.clone()).collect();
    // Every text in one batch: lengths from 2 to 256 tokens, so most rows are padded.
    let vectors = embedder.embed_texts(&texts).expect("embed fixture texts");
    assert_matches_reference(&fixture, &vectors, "batched");
    for vector in &vectors {
        let norm = dot(vector, vector).sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    }
}

#[test]
fn each_text_alone_matches_the_reference() {
    let fixture = fixture();
    let embedder = embedder();
    let vectors: Vec<Vec<f32>> = fixture
        .texts
        .iter()
        .map(|entry| embedder.embed_texts(std::slice::from_ref(&entry.text)).expect("embed one text").remove(0))
        .collect();
    assert_matches_reference(&fixture, &vectors, "alone");
}

#[test]
fn more_texts_than_a_batch_keep_their_order() {
    let fixture = fixture();
    let embedder = embedder();
    // 3 x 22 texts = 66: three batches of 32, 32 and 2, in shuffled length order.
    let texts: Vec<String> = (0..3).flat_map(|_| fixture.texts.iter().rev().map(|entry| entry.text.clone())).collect();
    let vectors = embedder.embed_texts(&texts).expect("embed");
    assert_eq!(vectors.len(), texts.len());
    for (text, vector) in texts.iter().zip(&vectors) {
        let reference = fixture.texts.iter().find(|entry| &entry.text == text).unwrap();
        assert!(cosine(&reference.embedding, vector) >= 0.999, "{text:?}");
    }
    assert!(embedder.embed_texts(&[]).expect("no texts").is_empty());
}

#[test]
fn the_embed_trait_gives_zero_for_blank_texts_and_model_vectors_otherwise() {
    let embedder = embedder();
    let texts = ["".to_string(), "send a message on telegram".to_string(), " \n ".to_string()];
    let vectors = Embed::embed_batch(embedder, &texts).expect("the model embeds");
    assert!(vectors[0].iter().all(|x| *x == 0.0));
    assert!(vectors[2].iter().all(|x| *x == 0.0));
    let direct = embedder.embed_texts(&texts[1..2]).unwrap();
    assert!(cosine(&vectors[1], &direct[0]) > 0.99999);
    assert_eq!(Embed::embed(embedder, "send a message on telegram").expect("the model embeds").len(), 384);
    assert_eq!(Embed::model_id(embedder), embedder.model_id());
    assert_eq!(Embed::dimensions(embedder), 384);
}

/// A temp model directory: the real files linked in, `overrides` written instead.
fn model_dir_with(overrides: &[(&str, &[u8])], omit: &[&str]) -> tempfile::TempDir {
    let source = model_dir();
    let temp = tempfile::tempdir().expect("tempdir");
    for name in ["config.json", "tokenizer.json", "model.safetensors", "sentence_bert_config.json"] {
        if omit.contains(&name) || !source.join(name).exists() {
            continue;
        }
        match overrides.iter().find(|(file, _)| *file == name) {
            Some((_, bytes)) => std::fs::write(temp.path().join(name), bytes).unwrap(),
            None => std::os::unix::fs::symlink(source.join(name), temp.path().join(name)).unwrap(),
        }
    }
    // Files the model directory does not have (sentence-transformers' pooling file).
    for (name, bytes) in overrides.iter().filter(|(name, _)| !temp.path().join(name).exists()) {
        let path = temp.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    temp
}

/// The model pooling by `pooling` (no pooling file in its directory), loaded once per pooling.
fn pooled_embedder(pooling: Pooling) -> &'static NeuralEmbedder {
    static CLS: OnceLock<NeuralEmbedder> = OnceLock::new();
    static MAX: OnceLock<NeuralEmbedder> = OnceLock::new();
    let cell = match pooling {
        Pooling::Mean => return embedder(),
        Pooling::Cls => &CLS,
        Pooling::Max => &MAX,
    };
    cell.get_or_init(|| {
        let dir = model_dir();
        assert!(!dir.join("1_Pooling/config.json").exists(), "the test model directory must have no pooling file");
        NeuralEmbedder::load_with(&dir, pooling).expect("load with another pooling")
    })
}

/// Picks one pooling's reference vector out of a fixture entry.
type Reference = fn(&FixtureText) -> &Vec<f32>;

#[test]
fn cls_and_max_pooling_match_the_reference_batched_and_alone() {
    let fixture = fixture();
    let texts: Vec<String> = fixture.texts.iter().map(|entry| entry.text.clone()).collect();
    let cases: [(Pooling, Reference); 2] =
        [(Pooling::Cls, |entry| &entry.cls_embedding), (Pooling::Max, |entry| &entry.max_embedding)];
    for (pooling, reference) in cases {
        let embedder = pooled_embedder(pooling);
        assert_eq!(embedder.pooling(), pooling);
        // Batched, most rows padded: padding must reach neither the [CLS] row nor the max.
        let batched = embedder.embed_texts(&texts).expect("embed fixture texts");
        assert_matches_pooled(&fixture, &batched, &format!("{pooling:?} batched"), reference);
        let alone: Vec<Vec<f32>> =
            texts.iter().map(|text| embedder.embed_texts(std::slice::from_ref(text)).unwrap().remove(0)).collect();
        assert_matches_pooled(&fixture, &alone, &format!("{pooling:?} alone"), reference);
        // Another pooling is another model: its vectors are never mixed with the mean's.
        assert_ne!(embedder.model_id(), embedder_mean_id());
    }
}

fn embedder_mean_id() -> String {
    embedder().model_id()
}

#[test]
fn the_pooling_file_of_the_model_wins_over_the_configured_pooling() {
    let cls =
        br#"{"word_embedding_dimension": 384, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#;
    let dir = model_dir_with(&[("1_Pooling/config.json", cls)], &[]);
    let loaded = NeuralEmbedder::load_with(dir.path(), Pooling::Max).expect("load");
    assert_eq!(loaded.pooling(), Pooling::Cls);
    assert_eq!(loaded.model_id(), pooled_embedder(Pooling::Cls).model_id());
    let mean = br#"{"pooling_mode_mean_tokens": true}"#;
    let dir = model_dir_with(&[("1_Pooling/config.json", mean)], &[]);
    assert_eq!(NeuralEmbedder::load_with(dir.path(), Pooling::Cls).unwrap().model_id(), embedder().model_id());

    for bad in [
        &br#"{"pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": true}"#[..],
        br#"{"pooling_mode_mean_sqrt_len_tokens": true}"#,
        br#"{"pooling_mode_mean_tokens": false}"#,
        br#"[1, 2]"#,
    ] {
        let dir = model_dir_with(&[("1_Pooling/config.json", bad)], &[]);
        let error = load_error(dir.path());
        assert_eq!(error.code(), "model_config_invalid", "{error}");
        assert!(error.to_string().contains("1_Pooling"), "{error}");
    }
}

#[test]
fn model_id_follows_the_directory_contents() {
    let embedder = embedder();
    let model_id = embedder.model_id();
    assert!(model_id.starts_with("bert-l6-h384-"), "{model_id}");
    let same = model_dir_with(&[], &[]);
    assert_eq!(NeuralEmbedder::load(same.path()).unwrap().model_id(), model_id);
    // Any change to config.json gives another id, even one that leaves the output alone.
    let config = std::fs::read_to_string(model_dir().join("config.json")).unwrap();
    let changed = config.replace("\"initializer_range\": 0.02", "\"initializer_range\": 0.03");
    assert_ne!(changed, config);
    let other = model_dir_with(&[("config.json", changed.as_bytes())], &[]);
    assert_ne!(NeuralEmbedder::load(other.path()).unwrap().model_id(), model_id);
    // So does another sequence limit.
    let shorter = model_dir_with(&[("sentence_bert_config.json", br#"{"max_seq_length": 128}"#)], &[]);
    let shorter = NeuralEmbedder::load(shorter.path()).unwrap();
    assert_eq!(shorter.max_seq_length(), 128);
    assert_ne!(shorter.model_id(), model_id);
}

fn load_error(dir: &Path) -> NeuralError {
    NeuralEmbedder::load(dir).expect_err("load must fail")
}

#[test]
fn bad_model_directories_give_typed_errors() {
    let missing_dir = tempfile::tempdir().unwrap();
    let error = load_error(&missing_dir.path().join("nowhere"));
    assert_eq!(error.code(), "model_file_missing", "{error}");
    assert!(error.to_string().contains("fetch-minilm.sh"), "{error}");

    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        let dir = model_dir_with(&[], &[file]);
        let error = load_error(dir.path());
        assert!(matches!(&error, NeuralError::MissingFile { path } if path.ends_with(file)), "{file}: {error}");
    }

    let cases: [(&str, &[u8], &str); 7] = [
        ("config.json", b"not json", "model_config_invalid"),
        ("config.json", br#"{"hidden_size": 384}"#, "model_config_invalid"),
        ("tokenizer.json", b"{\"version\": 1}", "model_tokenizer_invalid"),
        ("model.safetensors", b"", "model_weights_invalid"),
        ("model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ", "model_weights_invalid"),
        ("sentence_bert_config.json", b"[1, 2", "model_config_invalid"),
        ("sentence_bert_config.json", br#"{"max_seq_length": 1}"#, "model_config_invalid"),
    ];
    for (file, bytes, code) in cases {
        let dir = model_dir_with(&[(file, bytes)], &[]);
        let error = load_error(dir.path());
        assert_eq!(error.code(), code, "{file} = {:?}: {error}", String::from_utf8_lossy(bytes));
    }

    // A configuration whose heads do not divide the hidden size is refused before candle sees it.
    let config = std::fs::read_to_string(model_dir().join("config.json")).unwrap();
    let odd_heads = config.replace("\"num_attention_heads\": 12", "\"num_attention_heads\": 7");
    let dir = model_dir_with(&[("config.json", odd_heads.as_bytes())], &[]);
    assert_eq!(load_error(dir.path()).code(), "model_config_invalid");
    // A vocabulary smaller than the tokenizer's would index past the embedding table.
    let small_vocab = config.replace("\"vocab_size\": 30522", "\"vocab_size\": 1000");
    let dir = model_dir_with(&[("config.json", small_vocab.as_bytes())], &[]);
    assert_eq!(load_error(dir.path()).code(), "model_tokenizer_invalid");
    // Weights of another shape than the configuration describes.
    let wider = config.replace("\"intermediate_size\": 1536", "\"intermediate_size\": 1024");
    let dir = model_dir_with(&[("config.json", wider.as_bytes())], &[]);
    assert_eq!(load_error(dir.path()).code(), "model_weights_invalid");
}

#[test]
fn the_local_backend_puts_the_configured_prefixes_in_front_of_queries_and_documents() {
    use capdex::config::{EmbedderBackend, EmbedderSettings};
    let settings = EmbedderSettings {
        backend: EmbedderBackend::Local,
        dimensions: 512,
        model_dir: model_dir(),
        endpoint: String::new(),
        model: String::new(),
        api_key_env: String::new(),
        batch_size: 32,
        timeout_ms: 1000,
        retries: 0,
        pooling: Pooling::Mean,
        query_prefix: "query: ".into(),
        document_prefix: "passage: ".into(),
        static_share: 0.0,
    };
    let built = capdex::embedders::backend::build(&settings).expect("build local");
    let text = vec!["book a flight to Paris".to_string()];
    let as_query = built.embed_queries(&text).unwrap().remove(0);
    let as_document = built.embed_batch(&text).unwrap().remove(0);
    let model = embedder();
    let expected_query = model.embed_texts(&["query: book a flight to Paris".to_string()]).unwrap().remove(0);
    let expected_document = model.embed_texts(&["passage: book a flight to Paris".to_string()]).unwrap().remove(0);
    assert!(cosine(&as_query, &expected_query) > 0.99999);
    assert!(cosine(&as_document, &expected_document) > 0.99999);
    assert!(cosine(&as_query, &as_document) < 0.9999, "the prefixes must change the vectors");
    assert_ne!(built.model_id(), model.model_id());
    assert!(built.model_id().starts_with(&model.model_id()));
}

/// `tests/fixtures/mpnet_reference.json`: mean-pooled embeddings of the tiny MPNet model.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MpNetFixture {
    dimensions: usize,
    max_seq_length: usize,
    texts: Vec<MpNetFixtureText>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MpNetFixtureText {
    text: String,
    n_tokens: usize,
    embedding: Vec<f32>,
}

fn tiny_mpnet_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mpnet-tiny")
}

/// Every value within 1e-4 of the reference (float32 against float64): a random model's
/// vectors are not alike the way a sentence model's are, so a cosine alone would say too little.
fn assert_matches_mpnet(fixture: &MpNetFixture, vectors: &[Vec<f32>], how: &str) {
    assert_eq!(vectors.len(), fixture.texts.len());
    for (reference, vector) in fixture.texts.iter().zip(vectors) {
        assert_eq!(vector.len(), fixture.dimensions);
        let worst = reference.embedding.iter().zip(vector).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "{how}: off by {worst} for {:?} ({} tokens)", reference.text, reference.n_tokens);
    }
}

#[test]
fn mpnet_matches_its_reference_batched_and_alone() {
    let fixture: MpNetFixture = read_fixture("mpnet_reference.json");
    assert!(fixture.texts.iter().any(|entry| entry.n_tokens == fixture.max_seq_length), "a truncated text");
    assert!(fixture.texts.iter().any(|entry| entry.text.is_empty()));
    let embedder = NeuralEmbedder::load(&tiny_mpnet_dir()).expect("load the tiny MPNet model");
    assert_eq!(embedder.dimensions(), fixture.dimensions);
    assert_eq!(embedder.max_seq_length(), fixture.max_seq_length);
    assert!(embedder.model_id().starts_with("mpnet-l2-h16-"), "{}", embedder.model_id());
    let texts: Vec<String> = fixture.texts.iter().map(|entry| entry.text.clone()).collect();
    // One batch, padded to the longest text: padding must change nothing.
    assert_matches_mpnet(&fixture, &embedder.embed_texts(&texts).expect("embed"), "batched");
    let alone: Vec<Vec<f32>> =
        texts.iter().map(|text| embedder.embed_texts(std::slice::from_ref(text)).expect("embed").remove(0)).collect();
    assert_matches_mpnet(&fixture, &alone, "alone");
}

#[test]
fn mpnet_configurations_capdex_cannot_run_are_typed_errors() {
    let source = tiny_mpnet_dir();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(source.join("config.json")).unwrap()).unwrap();
    let with = |key: &str, value: serde_json::Value| {
        let temp = tempfile::tempdir().expect("tempdir");
        for name in ["tokenizer.json", "model.safetensors"] {
            std::fs::copy(source.join(name), temp.path().join(name)).unwrap();
        }
        let mut changed = config.clone();
        changed[key] = value;
        std::fs::write(temp.path().join("config.json"), serde_json::to_vec(&changed).unwrap()).unwrap();
        temp
    };
    for (key, value, code) in [
        ("hidden_act", serde_json::json!("relu"), "model_config_invalid"),
        ("num_attention_heads", serde_json::json!(3), "model_config_invalid"),
        ("relative_attention_num_buckets", serde_json::json!(0), "model_config_invalid"),
        ("hidden_size", serde_json::json!("wide"), "model_config_invalid"),
        // Positions start after the padding id: none would be left for text.
        ("pad_token_id", serde_json::json!(u64::MAX), "model_config_invalid"),
        ("pad_token_id", serde_json::json!(38), "model_config_invalid"),
        // The weights are 16 wide: a config that says 32 does not fit them.
        ("hidden_size", serde_json::json!(32), "model_weights_invalid"),
        ("num_hidden_layers", serde_json::json!(3), "model_weights_invalid"),
    ] {
        let dir = with(key, value.clone());
        let error = load_error(dir.path());
        assert_eq!(error.code(), code, "{key} = {value}: {error}");
    }
}

// The MPNet encoder's position rules (`embedders::mpnet`), here because this test binary is the
// one built with the `neural` feature.

#[test]
fn mpnet_buckets_follow_t5s_scheme() {
    use capdex::embedders::mpnet::relative_position_bucket;
    // Keys at or before the query: buckets 0..16; after it: 16..32.
    assert_eq!(relative_position_bucket(0, 32), 0);
    assert_eq!(relative_position_bucket(-1, 32), 1);
    assert_eq!(relative_position_bucket(-7, 32), 7);
    assert_eq!(relative_position_bucket(1, 32), 17);
    assert_eq!(relative_position_bucket(7, 32), 23);
    // Logarithmic from 8 on: 8 + floor(ln(n / 8) / ln(16) * 8).
    assert_eq!(relative_position_bucket(-8, 32), 8);
    assert_eq!(relative_position_bucket(-16, 32), 10);
    assert_eq!(relative_position_bucket(-127, 32), 15);
    assert_eq!(relative_position_bucket(-500, 32), 15);
    assert_eq!(relative_position_bucket(500, 32), 31);
    for buckets in [2usize, 4, 8, 32, 64] {
        for relative in -1000i64..1000 {
            assert!(relative_position_bucket(relative, buckets) < buckets, "{relative} in {buckets}");
        }
    }
}

#[test]
fn mpnet_positions_count_from_after_the_padding_id() {
    assert_eq!(capdex::embedders::mpnet::position_ids(&[3, 1], 3, 1), vec![2, 3, 4, 2, 1, 1]);
}
