//! MPNet's encoder (Song et al. 2020, "MPNet: Masked and Permuted Pre-training"), for the local
//! embedder: the model behind sentence-transformers' all-mpnet-base-v2. candle-transformers has
//! BERT but not MPNet, so the forward pass is here, built from candle-nn's layers.
//!
//! MPNet is BERT's encoder with three differences, all in how positions enter:
//!
//! - no token-type embeddings;
//! - absolute positions are counted as RoBERTa does, from `pad_token_id + 1` over the real tokens,
//!   and a padding position gets `pad_token_id` ([`position_ids`]);
//! - every layer's attention scores get a learnt bias per head for the *relative* position of key
//!   and query, looked up in `encoder.relative_attention_bias` (one table shared by the layers)
//!   through T5's logarithmic buckets ([`relative_position_bucket`]).
//!
//! Weight names are those of Hugging Face's `MPNetModel` (`embeddings.*`, `encoder.layer.N.
//! attention.attn.{q,k,v,o}`, `encoder.layer.N.attention.LayerNorm`, `...intermediate.dense`,
//! `...output.{dense,LayerNorm}`, `encoder.relative_attention_bias`); a checkpoint saved with the
//! `mpnet.` prefix is read too. The pooler is not used (sentence models pool the token states).
//! `scripts/mpnet_reference.py` is an independent NumPy forward pass; `tests/neural.rs` checks this
//! one against it on a small random model committed as a fixture.

use candle_core::{Device, Module, Result, Tensor, D};
use candle_nn::{embedding, layer_norm, linear, Embedding, LayerNorm, Linear, VarBuilder};
use serde::Deserialize;

/// The part of an MPNet `config.json` the forward pass needs.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct MpNetConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    /// Only `"gelu"` (erf) is run; `parse_config` in `neural` refuses another.
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    pub layer_norm_eps: f64,
    #[serde(default = "default_pad_token_id")]
    pub pad_token_id: usize,
    #[serde(default = "default_buckets")]
    pub relative_attention_num_buckets: usize,
    #[serde(default)]
    pub model_type: Option<String>,
}

fn default_pad_token_id() -> usize {
    1
}

fn default_buckets() -> usize {
    32
}

/// The farthest relative distance with a bucket of its own scale (Hugging Face's `max_distance`).
pub const MAX_DISTANCE: i64 = 128;

/// T5's bucket of a relative position `key − query`, as `MPNetEncoder.relative_position_bucket`
/// computes it: half the buckets for keys before the query and half for keys after; within a
/// half, distances below a quarter of the buckets have one each, longer ones share buckets on a
/// logarithmic scale up to [`MAX_DISTANCE`], and farther ones take the half's last bucket.
pub fn relative_position_bucket(relative_position: i64, num_buckets: usize) -> usize {
    let half = (num_buckets / 2) as i64;
    let distance = -relative_position;
    let mut bucket = if distance < 0 { half } else { 0 };
    let distance = distance.abs();
    let max_exact = half / 2;
    if distance < max_exact {
        bucket += distance;
    } else {
        // Truncated towards zero, as torch's `.to(torch.long)` does (the value is positive).
        let scaled = ((distance as f32 / max_exact as f32).ln() / (MAX_DISTANCE as f32 / max_exact as f32).ln()
            * (half - max_exact) as f32) as i64;
        bucket += (max_exact + scaled).min(half - 1);
    }
    bucket as usize
}

/// The absolute position of each token of right-padded rows: `pad + 1, pad + 2, …` over a row's
/// real tokens, `pad` over its padding (RoBERTa's `create_position_ids_from_input_ids`).
pub fn position_ids(lengths: &[usize], seq_len: usize, pad_token_id: usize) -> Vec<u32> {
    let mut ids = Vec::with_capacity(lengths.len() * seq_len);
    for &length in lengths {
        ids.extend((0..seq_len).map(|position| {
            if position < length {
                (pad_token_id + 1 + position) as u32
            } else {
                pad_token_id as u32
            }
        }));
    }
    ids
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// MPNet's embeddings and encoder (see the module docs).
pub struct MpNetModel {
    word_embeddings: Embedding,
    position_embeddings: Embedding,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    relative_attention_bias: Embedding,
    num_heads: usize,
    head_size: usize,
    num_buckets: usize,
    pad_token_id: usize,
}

impl MpNetModel {
    /// Loads the weights `config` describes from `var_builder`.
    pub fn load(var_builder: VarBuilder, config: &MpNetConfig) -> Result<MpNetModel> {
        let var_builder = if var_builder.contains_tensor("mpnet.embeddings.word_embeddings.weight") {
            var_builder.pp("mpnet")
        } else {
            var_builder
        };
        let hidden = config.hidden_size;
        let eps = config.layer_norm_eps;
        let embeddings = var_builder.pp("embeddings");
        let encoder = var_builder.pp("encoder");
        let layers = (0..config.num_hidden_layers)
            .map(|index| {
                let layer = encoder.pp(format!("layer.{index}"));
                let attention = layer.pp("attention");
                Ok(Layer {
                    query: linear(hidden, hidden, attention.pp("attn.q"))?,
                    key: linear(hidden, hidden, attention.pp("attn.k"))?,
                    value: linear(hidden, hidden, attention.pp("attn.v"))?,
                    out: linear(hidden, hidden, attention.pp("attn.o"))?,
                    attention_norm: layer_norm(hidden, eps, attention.pp("LayerNorm"))?,
                    intermediate: linear(hidden, config.intermediate_size, layer.pp("intermediate.dense"))?,
                    output: linear(config.intermediate_size, hidden, layer.pp("output.dense"))?,
                    output_norm: layer_norm(hidden, eps, layer.pp("output.LayerNorm"))?,
                })
            })
            .collect::<Result<Vec<Layer>>>()?;
        Ok(MpNetModel {
            word_embeddings: embedding(config.vocab_size, hidden, embeddings.pp("word_embeddings"))?,
            position_embeddings: embedding(
                config.max_position_embeddings,
                hidden,
                embeddings.pp("position_embeddings"),
            )?,
            embedding_norm: layer_norm(hidden, eps, embeddings.pp("LayerNorm"))?,
            layers,
            relative_attention_bias: embedding(
                config.relative_attention_num_buckets,
                config.num_attention_heads,
                encoder.pp("relative_attention_bias"),
            )?,
            num_heads: config.num_attention_heads,
            head_size: hidden / config.num_attention_heads,
            num_buckets: config.relative_attention_num_buckets,
            pad_token_id: config.pad_token_id,
        })
    }

    /// The last hidden states, `[batch, seq_len, hidden]`, of right-padded `input_ids`
    /// (`[batch, seq_len]`, u32) whose rows hold `lengths` real tokens each.
    pub fn forward(&self, input_ids: &Tensor, lengths: &[usize]) -> Result<Tensor> {
        let device = input_ids.device();
        let (batch, seq_len) = input_ids.dims2()?;
        let positions = Tensor::from_vec(position_ids(lengths, seq_len, self.pad_token_id), (batch, seq_len), device)?;
        let hidden = (self.word_embeddings.forward(input_ids)? + self.position_embeddings.forward(&positions)?)?;
        let mut hidden = self.embedding_norm.forward(&hidden)?;

        let bias = self.position_bias(seq_len, device)?;
        let mask = key_mask(lengths, seq_len, device)?;
        let bias = bias.broadcast_add(&mask)?; // [batch, heads, seq_len, seq_len]
        let scale = (self.head_size as f64).sqrt();
        for layer in &self.layers {
            let heads = |projection: &Linear| -> Result<Tensor> {
                projection
                    .forward(&hidden)?
                    .reshape((batch, seq_len, self.num_heads, self.head_size))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let (query, key, value) = (heads(&layer.query)?, heads(&layer.key)?, heads(&layer.value)?);
            let scores = ((query.matmul(&key.t()?)? / scale)? + &bias)?;
            let probabilities = candle_nn::ops::softmax_last_dim(&scores)?;
            let context = probabilities.matmul(&value)?.transpose(1, 2)?.contiguous()?.flatten_from(D::Minus2)?;
            let attended = layer.attention_norm.forward(&(layer.out.forward(&context)? + &hidden)?)?;
            let intermediate = layer.intermediate.forward(&attended)?.gelu_erf()?;
            hidden = layer.output_norm.forward(&(layer.output.forward(&intermediate)? + &attended)?)?;
        }
        Ok(hidden)
    }

    /// `[1, heads, seq_len, seq_len]`: each head's learnt bias for key `j` seen from query `i`.
    fn position_bias(&self, seq_len: usize, device: &Device) -> Result<Tensor> {
        let mut buckets = Vec::with_capacity(seq_len * seq_len);
        for query in 0..seq_len as i64 {
            for key in 0..seq_len as i64 {
                buckets.push(relative_position_bucket(key - query, self.num_buckets) as u32);
            }
        }
        let buckets = Tensor::from_vec(buckets, (seq_len, seq_len), device)?;
        self.relative_attention_bias.forward(&buckets)?.permute((2, 0, 1))?.unsqueeze(0)
    }
}

/// `[batch, 1, 1, seq_len]`: 0 for a real key, a large negative number for padding.
fn key_mask(lengths: &[usize], seq_len: usize, device: &Device) -> Result<Tensor> {
    let mut values = Vec::with_capacity(lengths.len() * seq_len);
    for &length in lengths {
        values.extend((0..seq_len).map(|position| if position < length { 0.0f32 } else { f32::MIN }));
    }
    Tensor::from_vec(values, (lengths.len(), 1, 1, seq_len), device)
}
