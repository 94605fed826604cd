#!/usr/bin/env python3
"""Builds the sentence corpus that scripts/distill_static.py --corpus feeds to its teacher.

The `static` embedder's table is distilled from all-MiniLM-L6-v2. One pass per vocabulary
token (`[CLS] t [SEP]`) gives each token its meaning out of context; the corpus gives the
teacher's meaning of whole sentences, so that a token's row can be fitted to the sentences it
occurs in (tokenlearn-style). The corpus is software and tool language and everyday English,
read from files a Debian machine has (WordNet from the wordnet-base package), none of them a
benchmark set:

  1. Debian package descriptions (the apt lists' `Description:` lines): what a tool does,
     in a line ("command-line utility to resize images").
  2. Manual pages (/usr/share/man/man1..8, English): each page's NAME line and the sentences of
     its DESCRIPTION section, with troff markup stripped.
  3. Python's standard library docstrings (functions, classes, methods; the first paragraph),
     parsed with `ast`, nothing imported: API language ("Return the number of items ...").
  4. Optionally (--listing TSV, repeatable), package registries' one-line summaries from a
     listing with the summary in a column headed `summary` (PyPI's and npm's): what libraries,
     SDKs, CLIs and MCP servers of every domain do (travel, food, finance, games, ...), which
     the first three sources, about software itself, rarely talk about.
  5. WordNet 3.0's synsets (Debian's wordnet-base, /usr/share/wordnet): each synset's words with
     their definition ("sunrise, dawn, dawning: the first light of day") and each usage example.
     Everyday English of every domain (science, sport, law, food, travel), each word beside what
     it means: the words users' requests are made of and software's texts rarely use.

Sentences are deduplicated (case-folded), kept at 3 to 60 words, shuffled with a fixed seed and
cut to --max sentences per source. Output: one sentence a line, and its SHA-256 on stderr.
--sources picks the built-in sources; --extend CORPUS keeps an earlier corpus as it is and
appends only the new sentences, so distill_static.py embeds only those with its teacher (its
cache of CORPUS is checked against the corpus's first lines and extended).

Usage: python3 scripts/static_corpus.py OUT.txt [--max 60000] [--seed 20261205]
           [--listing TSV ...] [--sources debian,man,python,wordnet] [--extend CORPUS]
"""

import argparse
import ast
import glob
import gzip
import hashlib
import os
import random
import re
import subprocess
import sys
import sysconfig

WORD = re.compile(r"\S+")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")


def clean(text):
    text = re.sub(r"\s+", " ", text).strip()
    n = len(WORD.findall(text))
    if n < 3 or n > 60:
        return None
    if sum(c.isalpha() for c in text) < 0.6 * len(text):
        return None
    return text


def debian_descriptions():
    out = []
    for path in sorted(glob.glob("/var/lib/apt/lists/*_Packages*")):
        if path.endswith(".lz4"):
            data = subprocess.run(["lz4cat", path], check=True, capture_output=True).stdout
        else:
            with open(path, "rb") as f:
                data = f.read()
        for line in data.decode("utf-8", "replace").splitlines():
            if line.startswith("Description: "):
                out.append(line[len("Description: ") :])
    return out


TROFF_FONT = re.compile(r"\\f(\[[^\]]*\]|\(..|.)")
TROFF_ESCAPE = re.compile(r"\\(\(..|\[[^\]]*\]|[-&e|^ ]|\*\(..|\*.|s[-+]?\d)")


def troff_text(line):
    line = TROFF_FONT.sub("", line)
    line = line.replace("\\-", "-").replace("\\(em", "-").replace("\\(aq", "'")
    line = TROFF_ESCAPE.sub(" ", line)
    return line.replace("\\", "")


def man_sentences():
    out = []
    for path in sorted(glob.glob("/usr/share/man/man[1-8]/*.gz")):
        try:
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except (OSError, EOFError):
            continue
        section = None
        paragraph = []

        def flush():
            if paragraph and section in ("NAME", "DESCRIPTION"):
                text = " ".join(paragraph)
                if section == "NAME" and " - " in text:
                    text = text.split(" - ", 1)[1]
                out.extend(SENTENCE_END.split(text))
            paragraph.clear()

        for line in lines:
            if line.startswith(".SH") or line.startswith(".Sh"):
                flush()
                section = line[3:].strip().strip('"').upper()
            elif line.startswith((".PP", ".P", ".LP", ".TP", ".IP", ".Pp", ".sp", ".br")) or not line.strip():
                flush()
            elif line.startswith((".B ", ".I ", ".BR ", ".IR ", ".RB ", ".BI ", ".IB ", ".Nm ", ".Nd ")):
                parts = line.split(None, 1)
                if len(parts) == 2:
                    paragraph.append(troff_text(parts[1].replace('"', "")))
            elif line.startswith((".", "'")):
                continue
            else:
                paragraph.append(troff_text(line))
        flush()
    return out


def python_docstrings():
    out = []
    stdlib = sysconfig.get_paths()["stdlib"]
    for path in sorted(glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True)):
        if "/test" in path or "/idlelib/" in path or "site-packages" in path:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc:
                    first = doc.split("\n\n", 1)[0]
                    out.extend(SENTENCE_END.split(first.replace("\n", " ")))
    return out


WORDNET_MARKER = re.compile(r"\([a-z]+\)$")


def wordnet_glosses(folder="/usr/share/wordnet"):
    """WordNet 3.0's synsets (Debian's wordnet-base): each synset's words and definition as
    one sentence ("sunrise, dawn, dawning: the first light of day"), and each usage example
    as another. Everyday English of every domain, each word beside what it means."""
    out = []
    paths = [os.path.join(folder, f"data.{part}") for part in ("noun", "verb", "adj", "adv")]
    if not all(os.path.exists(path) for path in paths):
        sys.exit(f"WordNet is not in {folder}: install Debian's wordnet-base, or leave it out with --sources")
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  ") or " | " not in line:
                    continue  # the licence header
                head, gloss = line.split(" | ", 1)
                fields = head.split()
                count = int(fields[3], 16)
                words = [WORDNET_MARKER.sub("", fields[4 + 2 * i]).replace("_", " ") for i in range(count)]
                pieces = [p.strip() for p in gloss.strip().split(";")]
                definition = "; ".join(p for p in pieces if p and not p.startswith('"'))
                if definition:
                    out.append(f"{', '.join(words[:3])}: {definition}")
                out.extend(p.strip('"') for p in pieces if p.startswith('"'))
    return out


def listing_summaries(path):
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        header = f.readline().rstrip("\n").split("\t")
        column = next(i for i, name in enumerate(header) if name.startswith("summary"))
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) > column and fields[column].isascii():
                out.append(fields[column])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--max", type=int, default=60000, help="sentences kept per source")
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--listing", action="append", default=[], help="a registry listing (TSV with a summary column)")
    ap.add_argument(
        "--sources",
        default=",".join(SOURCES),
        help=f"the built-in sources to read, comma separated (default: {','.join(SOURCES)})",
    )
    ap.add_argument(
        "--extend",
        metavar="CORPUS",
        help="keep CORPUS as it is and append the sources' sentences it does not hold (shuffled per source, "
        "not with CORPUS), so a teacher cache of CORPUS stays valid for its first lines",
    )
    args = ap.parse_args()
    rng = random.Random(args.seed)
    seen = set()
    base = []
    if args.extend:
        with open(args.extend, encoding="utf-8") as f:
            base = f.read().splitlines()
        seen.update(text.casefold() for text in base)
    corpus = []
    names = [name for name in args.sources.split(",") if name]
    unknown = [name for name in names if name not in SOURCES]
    if unknown:
        ap.error(f"unknown source(s) {', '.join(unknown)}; known: {', '.join(SOURCES)}")
    sources = [(name, SOURCES[name]) for name in names]
    sources += [(os.path.basename(path), lambda path=path: listing_summaries(path)) for path in args.listing]
    for name, source in sources:
        kept = []
        for raw in source():
            text = clean(raw)
            if text is None:
                continue
            key = text.casefold()
            if key in seen:
                continue
            seen.add(key)
            kept.append(text)
        rng.shuffle(kept)
        kept = kept[: args.max]
        print(f"{name}: {len(kept)} sentences", file=sys.stderr)
        corpus.extend(kept)
    if not args.extend:
        rng.shuffle(corpus)
    corpus = base + corpus
    data = ("\n".join(corpus) + "\n").encode("utf-8")
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"{len(corpus)} sentences, sha256 {hashlib.sha256(data).hexdigest()}", file=sys.stderr)


SOURCES = {
    "debian": debian_descriptions,
    "man": man_sentences,
    "python": python_docstrings,
    "wordnet": wordnet_glosses,
}


if __name__ == "__main__":
    main()
