#!/usr/bin/env python3
"""Convert the ChatterBot corpus's chit-chat into a held-out "nothing fits" query file.

usage: scripts/chatterbot_small_talk.py CHATTERBOT_CORPUS_WHEEL_OR_DATA_DIR OUT_FILE

Input: the `chatterbot-corpus` package from PyPI (BSD-3-Clause, Gunther Cox), as its wheel or its
unpacked `chatterbot_corpus/data` folder, e.g.
`pip download chatterbot-corpus==1.3.3 --no-deps -d /tmp/chatterbot`.

The small talk capdex's chatter gate was built with (`tests/fixtures/bench/nothing-fits/small-talk.jsonl`
and `core::nothing_fits::GENERIC_SENTENCES`) was written by capdex's developers; this file is small talk
nobody here wrote, to measure the gate on after deciding, never to decide with. It takes the opening
utterance of every conversation in the English chit-chat categories (greetings, conversations, emotion,
botprofile, psychology: remarks to and about the bot, a few of them carrying a topic or a task, "Have you
heard the news?"), unchanged, once each (case and surrounding spaces ignored), in the corpus's order. The categories about topics (ai, computers,
money, food, history, ...) are left out: their questions ("What is the stock market?") are knowledge
requests a catalog may answer, and so is humor's "Tell me a joke" (a jokes tool).

Writes one `{"query", "relevant": [], "qid", "split": "chatterbot"}` per line, the dev sets' shape
(`tests/fixtures/README.md`).
"""
import io
import json
import sys
import zipfile
from pathlib import Path

import yaml

CATEGORIES = ["greetings", "conversations", "emotion", "botprofile", "psychology"]


def category_text(source: Path, category: str) -> str:
    name = f"english/{category}.yml"
    if source.is_dir():
        return (source / name).read_text(encoding="utf-8")
    with zipfile.ZipFile(source) as wheel:
        return io.TextIOWrapper(wheel.open(f"chatterbot_corpus/data/{name}"), encoding="utf-8").read()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, out = Path(sys.argv[1]), Path(sys.argv[2])
    seen, queries = set(), []
    for category in CATEGORIES:
        for conversation in yaml.safe_load(category_text(source, category))["conversations"]:
            if not conversation:
                continue
            opening = str(conversation[0]).strip()
            key = opening.lower()
            if not opening or key in seen:
                continue
            seen.add(key)
            queries.append(
                {"query": opening, "relevant": [], "qid": f"chatterbot_{category}_{len(queries)}", "split": "chatterbot"}
            )
    with open(out, "w", encoding="utf-8") as file:
        for record in queries:
            file.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"{len(queries)} requests from {', '.join(CATEGORIES)}", file=sys.stderr)


if __name__ == "__main__":
    main()
