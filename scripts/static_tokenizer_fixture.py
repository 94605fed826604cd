#!/usr/bin/env python3
"""Writes tests/fixtures/static_tokenizer.json: the token ids of MiniLM's tokenizer.json pipeline
over the static embedder's vocabulary (assets/static-minilm/vocab.txt: the model's, then the words
scripts/distill_static.py --new-words added), through the Python `tokenizers` package, without
[CLS]/[SEP], for a few hundred varied strings, so the
static embedder's own BERT WordPiece tokenizer (src/core/static_embedder.rs) is checked against
it. Run once, never in CI (same scratch virtualenv as scripts/minilm_reference.py):

    /tmp/minilm-venv/bin/python scripts/static_tokenizer_fixture.py [MODEL_DIR] [OUT_JSON]

Strings: the texts of minilm_reference.py, hand-picked edge cases (accents, CJK, control and
zero-width characters, long words, punctuation of many scripts), the first 150 tool
descriptions of the Seal-Tools and 60 of the MetaTool benchmark files (when present), and 80
seeded random strings over a mix of Unicode blocks.
"""

import json
import os
import random
import sys

import tokenizers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import minilm_reference as ref  # noqa: E402

EDGE = [
    "Héllo, World!",
    "ÀÉÎÕÜ àéîõü Çç Ññ Øø Åå ß ẞ İstanbul ΣΊΣΥΦΟΣ",
    "naïve café — “quoted” ‘single’ «guillemets» ¿qué? ¡sí!",
    "東京タワー 서울 北京市 𠀀𪜀 漢字かな混じり文",
    "tab\there\nnewline\r\nzero\u200bwidth\u200djoiner soft\u00adhyphen bom\ufeffx nul\x00x",
    "replacement \ufffd char and \x07 bell and \x1b escape",
    "x" * 101,
    "y" * 100,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "getUserById snake_case_name kebab-case-name SCREAMING_CASE v2.3.1 1,000,000 3.14159",
    "emails a.b@c.com urls https://example.com/a?b=c#d paths /usr/bin/env C:\\Windows",
    "¯\\_(ツ)_/¯ (╯°□°)╯︵ ┻━┻ ★☆♥♦ ① ② ③ ½ ¼ ™ © ®",
    "ﬁ ﬂ ligatures Ⅳ Roman ｆｕｌｌｗｉｄｔｈ ＡＢＣ１２３",
    "Ελληνικά Русский עברית हिन्दी ภาษาไทย ქართული Հայերեն",
    "",
    "   ",
    "!!!",
    "a-b_c.d/e\\f:g;h<i>j?k@l[m]n^o`p{q|r}s~t",
    "A TypeScript plugin for the CLI; Plugins, plugin-based, PLUGINS!",
    "cryptocurrencies and cryptocurrency wallets: a JSON-RPC SDK, javascriptish",
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, ".models", "all-MiniLM-L6-v2")
    out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "tests", "fixtures", "static_tokenizer.json")
    # MiniLM's pipeline (normaliser, pre-tokenizer, WordPiece settings) over the static
    # embedder's vocabulary: the model's own, then the words the distillation added to it.
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    with open(os.path.join(root, "assets", "static-minilm", "vocab.txt"), encoding="utf-8") as f:
        vocab = f.read().splitlines()
    assert all(spec["model"]["vocab"].get(token, i) == i for i, token in enumerate(vocab[: len(spec["model"]["vocab"])]))
    spec["model"]["vocab"] = {token: i for i, token in enumerate(vocab)}
    tokenizer = tokenizers.Tokenizer.from_str(json.dumps(spec))
    tokenizer.no_padding()
    tokenizer.no_truncation()

    texts = list(ref.TEXTS) + EDGE
    bench = os.path.join(root, "..", "shared", "data", "bench")
    for name, count in (("seal-tools", 150), ("metatool", 60)):
        path = os.path.join(bench, name, "tools.jsonl")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line in list(f)[:count]:
                    tool = json.loads(line)
                    texts.append(f"{tool.get('name', '')}: {tool.get('description', '')}")
    rng = random.Random(4)
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
              (0x900, 0x97F), (0x2000, 0x206F), (0x3000, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xACFF),
              (0xFF00, 0xFFEF), (0x1F300, 0x1F6FF)]
    for _ in range(80):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(blocks)
            chars.append(chr(rng.randint(lo, hi)))
            if rng.random() < 0.2:
                chars.append(" ")
        texts.append("".join(chars))

    entries = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        entries.append({"text": text, "ids": ids})
    fixture = {
        "generator": f"scripts/static_tokenizer_fixture.py, tokenizers {tokenizers.__version__}, "
        "all-MiniLM-L6-v2 tokenizer.json over assets/static-minilm/vocab.txt, no padding or truncation, "
        "no special tokens",
        "texts": entries,
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"wrote {len(entries)} texts to {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
