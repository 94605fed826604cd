//! The local neural embedder: a BERT-family sentence model on the CPU (candle + tokenizers).
//!
//! Two encoders are read: BERT (`model_type` `"bert"` or absent: all-MiniLM-L6-v2, BGE, E5, GTE
//! and the other BERT checkpoints, through candle-transformers) and MPNet (`"mpnet"`:
//! all-mpnet-base-v2, through [`crate::embedders::mpnet`]).
//!
//! [`NeuralEmbedder::load`] reads a model directory holding the files a
//! sentence-transformers model ships (for all-MiniLM-L6-v2, `scripts/fetch-minilm.sh`
//! puts them in `.models/all-MiniLM-L6-v2`):
//!
//! - `config.json`: the encoder's configuration (`model_type`, hidden size, layers, heads,
//!   vocabulary);
//! - `tokenizer.json`: the Hugging Face tokenizer;
//! - `model.safetensors`: the weights;
//! - optionally `sentence_bert_config.json`, whose `max_seq_length` bounds the tokens per text
//!   (256 when absent, sentence-transformers' value for all-MiniLM-L6-v2);
//! - optionally `1_Pooling/config.json`, sentence-transformers' pooling (`pooling_mode_mean_tokens`,
//!   `pooling_mode_cls_token` or `pooling_mode_max_tokens`); when absent, the pooling the caller
//!   gives ([`NeuralEmbedder::load_with`], `[embedder] pooling`), mean by default.
//!
//! [`NeuralEmbedder::embed_texts`] does what sentence-transformers' `encode` does:
//!
//! 1. tokenize every text, with the file's own padding turned off (all-MiniLM-L6-v2's
//!    `tokenizer.json` pads every text to 128 tokens, which costs 5x the time and is not what
//!    sentence-transformers does) and truncation at `max_seq_length` tokens (the file says 128);
//! 2. sort the texts by token count and run them in batches of [`BATCH_SIZE`], each batch padded
//!    to its longest text, with an attention mask that hides the padding;
//! 3. pool the last hidden states over the attention mask ([`Pooling`]: mean, the `[CLS]` token,
//!    or max), then L2-normalise, and return the vectors in input order.
//!
//! [`NeuralEmbedder::model_id`] is derived from the directory's contents (a SHA-256 of
//! `config.json`, `tokenizer.json`, `model.safetensors`, the sequence limit and the pooling), so
//! vectors cached under one model are never reused for another. A query instruction or prefix
//! is not this module's: `core::embedder::Prefixed` puts it in front (`[embedder] query_prefix`).

use crate::core::embedder::Pooling;
use crate::embedders::mpnet::{MpNetConfig, MpNetModel};
use candle_core::{DType, Device, IndexOp, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::{Path, PathBuf};
use tokenizers::{Tokenizer, TruncationParams};

/// Texts per forward pass: sentence-transformers' default batch size.
pub const BATCH_SIZE: usize = 32;
/// Token limit per text (special tokens included) when the model directory does not say.
pub const DEFAULT_MAX_SEQ_LENGTH: usize = 256;
/// Name of the weights file in a model directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// Name of the tokenizer file in a model directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Name of the BERT configuration file in a model directory.
pub const CONFIG_FILE: &str = "config.json";
/// Name of sentence-transformers' optional settings file (for `max_seq_length`).
pub const SENTENCE_CONFIG_FILE: &str = "sentence_bert_config.json";
/// Name of sentence-transformers' optional pooling file, relative to the model directory.
pub const POOLING_FILE: &str = "1_Pooling/config.json";
/// Version of the normalisation after pooling; part of the model id (after the pooling's name).
const PIPELINE_VERSION: &str = "l2-v1";

/// Why a model directory could not be loaded, or texts not embedded.
#[derive(Debug, thiserror::Error)]
pub enum NeuralError {
    /// A required file is not in the model directory.
    #[error("model file {} is missing (run scripts/fetch-minilm.sh or point model_dir at a directory holding model.safetensors, tokenizer.json and config.json)", path.display())]
    MissingFile { path: PathBuf },
    /// A file exists but could not be read.
    #[error("failed to read model file {}: {source}", path.display())]
    ReadFile { path: PathBuf, source: std::io::Error },
    /// `config.json` (or `sentence_bert_config.json`) is not a usable configuration.
    #[error("bad model configuration {}: {message}", path.display())]
    BadConfig { path: PathBuf, message: String },
    /// `tokenizer.json` is not a usable tokenizer, or does not fit the configuration.
    #[error("bad tokenizer {}: {message}", path.display())]
    BadTokenizer { path: PathBuf, message: String },
    /// `model.safetensors` does not hold the weights the configuration describes.
    #[error("bad model weights {}: {message}", path.display())]
    BadWeights { path: PathBuf, message: String },
    /// The tokenizer failed on an input text.
    #[error("failed to tokenize text {index}: {message}")]
    Tokenize { index: usize, message: String },
    /// The forward pass failed.
    #[error("model inference failed: {message}")]
    Inference { message: String },
}

impl NeuralError {
    /// Returns a stable, machine-readable code for the kind of failure.
    pub fn code(&self) -> &'static str {
        match self {
            NeuralError::MissingFile { .. } => "model_file_missing",
            NeuralError::ReadFile { .. } => "model_file_unreadable",
            NeuralError::BadConfig { .. } => "model_config_invalid",
            NeuralError::BadTokenizer { .. } => "model_tokenizer_invalid",
            NeuralError::BadWeights { .. } => "model_weights_invalid",
            NeuralError::Tokenize { .. } => "tokenize_failed",
            NeuralError::Inference { .. } => "inference_failed",
        }
    }
}

/// A BERT-family sentence embedder loaded from a model directory (see the module docs).
///
/// # Examples
///
/// ```no_run
/// use capdex::embedders::neural::NeuralEmbedder;
/// use std::path::Path;
///
/// let embedder = NeuralEmbedder::load(Path::new(".models/all-MiniLM-L6-v2"))?;
/// let vectors = embedder.embed_texts(&["send a message on telegram".to_string()])?;
/// assert_eq!(vectors[0].len(), embedder.dimensions());
/// # Ok::<(), capdex::embedders::neural::NeuralError>(())
/// ```
pub struct NeuralEmbedder {
    model: Encoder,
    tokenizer: Tokenizer,
    device: Device,
    dimensions: usize,
    max_seq_length: usize,
    pad_token_id: u32,
    pooling: Pooling,
    model_id: String,
}

impl fmt::Debug for NeuralEmbedder {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("NeuralEmbedder")
            .field("model_id", &self.model_id)
            .field("dimensions", &self.dimensions)
            .field("max_seq_length", &self.max_seq_length)
            .field("pooling", &self.pooling)
            .finish_non_exhaustive()
    }
}

/// The transformer under the pooling.
enum Encoder {
    Bert(BertModel),
    MpNet(MpNetModel),
}

/// An encoder's configuration, by `config.json`'s `model_type`.
enum ModelConfig {
    Bert(BertConfig),
    MpNet(MpNetConfig),
}

/// What capdex reads of either configuration, the same for both encoders.
struct Shape<'a> {
    model_type: Option<&'a str>,
    hidden_size: usize,
    num_attention_heads: usize,
    num_hidden_layers: usize,
    vocab_size: usize,
    pad_token_id: usize,
    /// The most tokens a text can have: MPNet's positions start after the padding id.
    max_tokens: usize,
}

impl ModelConfig {
    fn shape(&self) -> Shape<'_> {
        match self {
            ModelConfig::Bert(config) => Shape {
                model_type: config.model_type.as_deref(),
                hidden_size: config.hidden_size,
                num_attention_heads: config.num_attention_heads,
                num_hidden_layers: config.num_hidden_layers,
                vocab_size: config.vocab_size,
                pad_token_id: config.pad_token_id,
                max_tokens: config.max_position_embeddings,
            },
            ModelConfig::MpNet(config) => Shape {
                model_type: config.model_type.as_deref().or(Some("mpnet")),
                hidden_size: config.hidden_size,
                num_attention_heads: config.num_attention_heads,
                num_hidden_layers: config.num_hidden_layers,
                vocab_size: config.vocab_size,
                pad_token_id: config.pad_token_id,
                max_tokens: config.max_position_embeddings.saturating_sub(config.pad_token_id.saturating_add(1)),
            },
        }
    }
}

/// The part of `sentence_bert_config.json` capdex reads.
#[derive(Deserialize)]
struct SentenceConfig {
    max_seq_length: Option<usize>,
}

/// Loads a model directory; a free function so callers can write `neural::load(dir)`.
pub fn load(dir: &Path) -> Result<NeuralEmbedder, NeuralError> {
    NeuralEmbedder::load(dir)
}

impl NeuralEmbedder {
    /// Loads `config.json`, `tokenizer.json` and `model.safetensors` from `dir` (CPU, f32),
    /// pooling as `1_Pooling/config.json` says, or by the mean without it.
    ///
    /// Every problem with the directory is a typed [`NeuralError`] naming the file.
    pub fn load(dir: &Path) -> Result<NeuralEmbedder, NeuralError> {
        NeuralEmbedder::load_with(dir, Pooling::Mean)
    }

    /// [`NeuralEmbedder::load`], pooling by `fallback` when the directory has no
    /// `1_Pooling/config.json` (the model's own file wins when it is there).
    pub fn load_with(dir: &Path, fallback: Pooling) -> Result<NeuralEmbedder, NeuralError> {
        let pooling = read_pooling(dir)?.unwrap_or(fallback);
        let config_path = dir.join(CONFIG_FILE);
        let tokenizer_path = dir.join(TOKENIZER_FILE);
        let weights_path = dir.join(WEIGHTS_FILE);
        let config_bytes = read_required(&config_path)?;
        let tokenizer_bytes = read_required(&tokenizer_path)?;
        let weights_bytes = read_required(&weights_path)?;

        let config = parse_config(&config_path, &config_bytes)?;
        let shape = config.shape();
        let max_seq_length = read_max_seq_length(dir)?.min(shape.max_tokens);
        if max_seq_length < 2 {
            return Err(NeuralError::BadConfig {
                path: config_path,
                message: format!("a sequence limit of {max_seq_length} tokens leaves no room for text"),
            });
        }

        let mut tokenizer = Tokenizer::from_bytes(&tokenizer_bytes)
            .map_err(|error| NeuralError::BadTokenizer { path: tokenizer_path.clone(), message: error.to_string() })?;
        let vocab_size = tokenizer.get_vocab_size(true);
        if vocab_size > shape.vocab_size {
            return Err(NeuralError::BadTokenizer {
                path: tokenizer_path,
                message: format!("{vocab_size} tokens, more than the model's vocab_size {}", shape.vocab_size),
            });
        }
        // Padding is done per batch below; the file's own truncation limit is replaced.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: max_seq_length, ..TruncationParams::default() }))
            .map_err(|error| NeuralError::BadTokenizer { path: tokenizer_path.clone(), message: error.to_string() })?;

        let model_id =
            derive_model_id(&config, &config_bytes, &tokenizer_bytes, &weights_bytes, max_seq_length, pooling);
        let device = Device::Cpu;
        let var_builder = VarBuilder::from_buffered_safetensors(weights_bytes, DType::F32, &device)
            .map_err(|error| NeuralError::BadWeights { path: weights_path.clone(), message: error.to_string() })?;
        let bad_weights = |error: candle_core::Error| NeuralError::BadWeights {
            path: weights_path.clone(),
            message: error.to_string(),
        };
        let model = match &config {
            ModelConfig::Bert(bert) => Encoder::Bert(BertModel::load(var_builder, bert).map_err(bad_weights)?),
            ModelConfig::MpNet(mpnet) => Encoder::MpNet(MpNetModel::load(var_builder, mpnet).map_err(bad_weights)?),
        };
        let pad_token_id = u32::try_from(shape.pad_token_id).unwrap_or(0);
        Ok(NeuralEmbedder {
            model,
            tokenizer,
            device,
            dimensions: shape.hidden_size,
            max_seq_length,
            pad_token_id,
            pooling,
            model_id,
        })
    }

    /// Returns the id of this model: its shape and a hash of the directory's contents.
    pub fn model_id(&self) -> String {
        self.model_id.clone()
    }

    /// Returns the number of dimensions of every vector (the model's hidden size).
    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    /// Returns how token states become one vector.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Returns the token limit per text, special tokens included.
    pub fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    /// Embeds `texts` in batches; returns one unit vector per text, in order.
    ///
    /// An empty text is embedded like sentence-transformers does (its `[CLS] [SEP]` tokens).
    pub fn embed_texts(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, NeuralError> {
        let mut token_ids: Vec<Vec<u32>> = Vec::with_capacity(texts.len());
        for (index, text) in texts.iter().enumerate() {
            let encoding = self
                .tokenizer
                .encode(text.as_str(), true)
                .map_err(|error| NeuralError::Tokenize { index, message: error.to_string() })?;
            debug_assert!(encoding.get_ids().len() <= self.max_seq_length);
            token_ids.push(encoding.get_ids().to_vec());
        }
        // Longest first, as sentence-transformers does, so each batch pads little.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&index| std::cmp::Reverse(token_ids[index].len()));

        let mut vectors: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        for batch in order.chunks(BATCH_SIZE) {
            let batch_ids: Vec<&[u32]> = batch.iter().map(|&index| token_ids[index].as_slice()).collect();
            let batch_vectors = self
                .embed_token_batch(&batch_ids)
                .map_err(|error| NeuralError::Inference { message: error.to_string() })?;
            for (&index, vector) in batch.iter().zip(batch_vectors) {
                vectors[index] = vector;
            }
        }
        debug_assert!(vectors.iter().all(|vector| vector.len() == self.dimensions));
        Ok(vectors)
    }

    /// Runs one batch of token id lists (each already truncated) through the model.
    fn embed_token_batch(&self, batch_ids: &[&[u32]]) -> candle_core::Result<Vec<Vec<f32>>> {
        let n_texts = batch_ids.len();
        let seq_len = batch_ids.iter().map(|ids| ids.len()).max().unwrap_or(0).max(1);
        let mut input_ids = Vec::with_capacity(n_texts * seq_len);
        let mut attention_mask = Vec::with_capacity(n_texts * seq_len);
        for ids in batch_ids {
            input_ids.extend_from_slice(ids);
            input_ids.extend(std::iter::repeat_n(self.pad_token_id, seq_len - ids.len()));
            attention_mask.extend(std::iter::repeat_n(1u32, ids.len()));
            attention_mask.extend(std::iter::repeat_n(0u32, seq_len - ids.len()));
        }
        let input_ids = Tensor::from_vec(input_ids, (n_texts, seq_len), &self.device)?;
        let attention_mask = Tensor::from_vec(attention_mask, (n_texts, seq_len), &self.device)?;
        let hidden = match &self.model {
            Encoder::Bert(model) => model.forward(&input_ids, &input_ids.zeros_like()?, Some(&attention_mask))?,
            Encoder::MpNet(model) => {
                let lengths: Vec<usize> = batch_ids.iter().map(|ids| ids.len()).collect();
                model.forward(&input_ids, &lengths)?
            }
        };

        let mask = attention_mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let pooled = match self.pooling {
            // Mean over real tokens: sum(hidden * mask) / max(sum(mask), tiny).
            Pooling::Mean => {
                let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
                let counts = mask.sum(1)?.clamp(1e-9f32, f32::MAX)?;
                summed.broadcast_div(&counts)?
            }
            // The first token, [CLS], is never padding.
            Pooling::Cls => hidden.i((.., 0, ..))?.contiguous()?,
            // Max over real tokens: padding is pushed to -1e9 first, as sentence-transformers does.
            Pooling::Max => {
                let push_down = mask.affine(1e9, -1e9)?;
                hidden.broadcast_add(&push_down)?.max(1)?
            }
        };
        // L2 normalisation, guarded like torch's F.normalize (eps 1e-12).
        let norms = pooled.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12f32, f32::MAX)?;
        pooled.broadcast_div(&norms)?.to_vec2::<f32>()
    }
}

impl crate::core::embedder::Embed for NeuralEmbedder {
    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    fn dimensions(&self) -> usize {
        self.dimensions
    }

    /// Embeds a batch, in order; blank texts give zero vectors (no dense signal),
    /// and a failure of the model is an [`EmbedError`] with code `embedder_model`,
    /// so the Indexer keeps the texts pending and ranking falls back to the
    /// lexical and graph signals.
    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, crate::core::embedder::EmbedError> {
        let non_blank: Vec<usize> = (0..texts.len()).filter(|&index| !texts[index].trim().is_empty()).collect();
        let to_embed: Vec<String> = non_blank.iter().map(|&index| texts[index].clone()).collect();
        let mut vectors = vec![vec![0.0f32; self.dimensions]; texts.len()];
        let embedded = self.embed_texts(&to_embed).map_err(|error| {
            crate::core::embedder::EmbedError::new(
                crate::core::embedder::EmbedErrorCode::Model,
                format!("{}: {error}", error.code()),
            )
        })?;
        for (index, vector) in non_blank.into_iter().zip(embedded) {
            vectors[index] = vector;
        }
        Ok(vectors)
    }
}

fn read_required(path: &Path) -> Result<Vec<u8>, NeuralError> {
    std::fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => NeuralError::MissingFile { path: path.to_path_buf() },
        _ => NeuralError::ReadFile { path: path.to_path_buf(), source },
    })
}

/// Just `model_type`, to tell the encoders apart before reading the rest.
#[derive(Deserialize)]
struct ModelType {
    #[serde(default)]
    model_type: Option<String>,
}

fn parse_config(path: &Path, bytes: &[u8]) -> Result<ModelConfig, NeuralError> {
    let bad = |message: String| NeuralError::BadConfig { path: path.to_path_buf(), message };
    let kind: ModelType = serde_json::from_slice(bytes).map_err(|error| bad(error.to_string()))?;
    let config = match kind.model_type.as_deref() {
        Some("mpnet") => ModelConfig::MpNet(serde_json::from_slice(bytes).map_err(|error| bad(error.to_string()))?),
        _ => {
            let config: BertConfig = serde_json::from_slice(bytes).map_err(|error| bad(error.to_string()))?;
            if config.type_vocab_size == 0 {
                return Err(bad("type_vocab_size must be positive".to_string()));
            }
            ModelConfig::Bert(config)
        }
    };
    let Shape { hidden_size: hidden, num_attention_heads: heads, num_hidden_layers: layers, vocab_size, .. } =
        config.shape();
    // Checked here because candle would otherwise fail later, or not at all, on such shapes.
    if hidden == 0 || heads == 0 || layers == 0 {
        return Err(bad("hidden_size, num_attention_heads and num_hidden_layers must be positive".to_string()));
    }
    if !hidden.is_multiple_of(heads) {
        return Err(bad(format!("hidden_size {hidden} is not a multiple of num_attention_heads {heads}")));
    }
    if vocab_size == 0 {
        return Err(bad("vocab_size must be positive".to_string()));
    }
    if let ModelConfig::MpNet(mpnet) = &config {
        if mpnet.relative_attention_num_buckets < 2 {
            return Err(bad("relative_attention_num_buckets must be at least 2".to_string()));
        }
        if mpnet.hidden_act != "gelu" {
            return Err(bad(format!("hidden_act {:?} is not supported for mpnet (gelu only)", mpnet.hidden_act)));
        }
    }
    Ok(config)
}

/// The part of `1_Pooling/config.json` capdex reads: one `pooling_mode_*` flag must be set.
#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(flatten)]
    others: serde_json::Map<String, serde_json::Value>,
}

/// Reads the pooling from the optional `1_Pooling/config.json`: `None` without the file; a
/// file that asks for no pooling, several at once, or one capdex does not do is an error.
fn read_pooling(dir: &Path) -> Result<Option<Pooling>, NeuralError> {
    let path = dir.join(POOLING_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(NeuralError::ReadFile { path, source }),
    };
    let bad = |message: String| NeuralError::BadConfig { path: path.clone(), message };
    let config: PoolingConfig = serde_json::from_slice(&bytes).map_err(|error| bad(error.to_string()))?;
    let unsupported: Vec<&str> = config
        .others
        .iter()
        .filter(|(key, value)| key.starts_with("pooling_mode_") && value.as_bool() == Some(true))
        .map(|(key, _)| key.as_str())
        .collect();
    if !unsupported.is_empty() {
        return Err(bad(format!("{} is not supported (mean, cls or max tokens only)", unsupported.join(", "))));
    }
    let chosen: Vec<Pooling> = [
        (config.pooling_mode_mean_tokens, Pooling::Mean),
        (config.pooling_mode_cls_token, Pooling::Cls),
        (config.pooling_mode_max_tokens, Pooling::Max),
    ]
    .into_iter()
    .filter_map(|(on, pooling)| on.then_some(pooling))
    .collect();
    match chosen.as_slice() {
        [one] => Ok(Some(*one)),
        [] => Err(bad("no pooling_mode_* is true".to_string())),
        _ => Err(bad("several pooling modes at once (concatenated vectors) are not supported".to_string())),
    }
}

/// Reads `max_seq_length` from the optional `sentence_bert_config.json`.
fn read_max_seq_length(dir: &Path) -> Result<usize, NeuralError> {
    let path = dir.join(SENTENCE_CONFIG_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => return Ok(DEFAULT_MAX_SEQ_LENGTH),
        Err(source) => return Err(NeuralError::ReadFile { path, source }),
    };
    let sentence_config: SentenceConfig = serde_json::from_slice(&bytes)
        .map_err(|error| NeuralError::BadConfig { path: path.clone(), message: error.to_string() })?;
    Ok(sentence_config.max_seq_length.unwrap_or(DEFAULT_MAX_SEQ_LENGTH))
}

/// Returns `<type>-l<layers>-h<hidden>-<12 hex digits>`, e.g. `bert-l6-h384-0123456789ab`.
///
/// The hash covers every input of the output vectors: the three files, the sequence limit and
/// the pooling pipeline, each length-prefixed so no two different inputs hash alike.
fn derive_model_id(
    config: &ModelConfig,
    config_bytes: &[u8],
    tokenizer_bytes: &[u8],
    weights_bytes: &[u8],
    max_seq_length: usize,
    pooling: Pooling,
) -> String {
    let mut hasher = Sha256::new();
    // Mean pooling hashes as before pooling was a choice ("mean-l2-v1"), so cached vectors stay valid.
    let settings = format!("{}-{PIPELINE_VERSION}|max_seq_length={max_seq_length}", pooling.as_str());
    for part in [config_bytes, tokenizer_bytes, weights_bytes, settings.as_bytes()] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let hex: String = digest.iter().take(6).map(|byte| format!("{byte:02x}")).collect();
    let shape = config.shape();
    let sanitized_type: String = shape
        .model_type
        .unwrap_or("bert")
        .chars()
        .filter(|ch| ch.is_ascii_alphanumeric() || *ch == '-' || *ch == '_')
        .take(24)
        .collect::<String>()
        .to_ascii_lowercase();
    let label = if sanitized_type.is_empty() { "bert" } else { sanitized_type.as_str() };
    format!("{label}-l{}-h{}-{hex}", shape.num_hidden_layers, shape.hidden_size)
}
