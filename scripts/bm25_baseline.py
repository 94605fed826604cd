#!/usr/bin/env python3
"""Plain Okapi BM25, the reference baseline of ../shared/data/README.md, as a run file.

usage: scripts/bm25_baseline.py TOOLS.jsonl QUERIES.jsonl RUN.jsonl [--fields name,description,...]

k1 1.2, b 0.75, lower-cased [a-z0-9]+ tokens, idf ln(1 + (N - df + 0.5) / (df + 0.5)); the text of a
tool is the chosen fields joined (default: name, description, category, tags, params — parameter
names and descriptions). Score the run with `python3 eval.py QUERIES RUN`.
"""
import argparse
import json
import math
import re
from collections import Counter, defaultdict

TOKEN = re.compile(r"[a-z0-9]+")


def tokens(text):
    return TOKEN.findall(text.lower())


def tool_text(tool, fields):
    parts = []
    for field in fields:
        if field == "params":
            for p in tool.get("params") or []:
                parts += [p.get("name") or "", p.get("description") or ""]
        elif field == "tags":
            parts += tool.get("tags") or []
        else:
            parts.append(tool.get(field) or "")
    return " ".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tools")
    ap.add_argument("queries")
    ap.add_argument("run")
    ap.add_argument("--fields", default="name,description,category,tags,params")
    ap.add_argument("--depth", type=int, default=20)
    a = ap.parse_args()
    fields = a.fields.split(",")
    tools = [json.loads(l) for l in open(a.tools, encoding="utf-8") if l.strip()]
    docs = [Counter(tokens(tool_text(t, fields))) for t in tools]
    lengths = [sum(d.values()) for d in docs]
    avg = sum(lengths) / len(lengths)
    df = Counter(term for d in docs for term in d)
    n = len(docs)
    idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
    postings = defaultdict(list)
    for i, d in enumerate(docs):
        for term, tf in d.items():
            postings[term].append((i, tf))
    k1, b = 1.2, 0.75
    with open(a.run, "w", encoding="utf-8") as out:
        for qi, line in enumerate(l for l in open(a.queries, encoding="utf-8") if l.strip()):
            query = json.loads(line)["query"]
            scores = defaultdict(float)
            for term in set(tokens(query)):
                for i, tf in postings.get(term, []):
                    scores[i] += idf[term] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * lengths[i] / avg))
            ranked = sorted(scores, key=lambda i: (-scores[i], i))[: a.depth]
            out.write(json.dumps({"query_idx": qi, "ranked": [tools[i]["id"] for i in ranked]}) + "\n")


if __name__ == "__main__":
    main()
