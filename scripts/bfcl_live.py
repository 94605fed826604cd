#!/usr/bin/env python3
"""Convert BFCL's `live_*` categories into a held-out capdex eval set.

usage: scripts/bfcl_live.py BFCL_EVAL_WHEEL_OR_DATA_DIR OUT_DIR

Input: the `bfcl-eval` package from PyPI (Apache-2.0), as its wheel or its unpacked
`bfcl_eval/data` folder, e.g. `pip download bfcl-eval==2026.3.23 --no-deps -d /tmp/bfcl`.
The live categories are requests users sent to hosted function-calling models; capdex's
decisions are made on the dev sets, never on these (measure once, after deciding).

Writes, in the dev sets' shapes (`../shared/data/README.md`):
- OUT_DIR/tools.jsonl: every distinct function of live_simple, live_multiple, live_parallel and
  live_parallel_multiple; a name that comes with different descriptions carries a `~xxxxxx`
  suffix (the first hex digits of its description's SHA-1), so ids are unique;
- OUT_DIR/queries.jsonl: their requests (the last user message), each with the ids of its
  ground-truth functions (`possible_answer`), `split` its category;
- OUT_DIR/irrelevance.jsonl: live_irrelevance's requests, each with its own functions
  (`tools`), none of which fits (`"relevant": []`), as `scripts/bfcl_irrelevance.py` writes them.
Requests whose ground truth names a function the request was not offered are left out.
"""
import hashlib
import json
import sys
from pathlib import Path

from bfcl_irrelevance import entries, last_user_message, tool, unanswerable

ANSWERABLE = ["live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    categories = {category: entries(source, f"BFCL_v4_{category}.json") for category in ANSWERABLE}
    answers = {
        category: {answer["id"]: answer for answer in entries(source, f"possible_answer/BFCL_v4_{category}.json")}
        for category in ANSWERABLE
    }
    descriptions = {}
    for requests in categories.values():
        for entry in requests:
            for function in entry["function"]:
                descriptions.setdefault(function["name"], set()).add(function.get("description", ""))

    def tool_id(function):
        name = function["name"]
        if len(descriptions[name]) == 1:
            return name
        digest = hashlib.sha1(function.get("description", "").encode("utf-8")).hexdigest()[:6]
        return f"{name}~{digest}"

    tools, queries, left_out = {}, [], 0
    for category, requests in categories.items():
        for entry in requests:
            offered = {function["name"]: function for function in entry["function"]}
            for function in entry["function"]:
                record = tool(function)
                record.update(id=tool_id(function), category=category)
                tools.setdefault(record["id"], record)
            called = [name for call in answers[category][entry["id"]]["ground_truth"] for name in call]
            if not called or any(name not in offered for name in called):
                left_out += 1
                continue
            relevant = list(dict.fromkeys(tool_id(offered[name]) for name in called))
            queries.append(
                {"query": last_user_message(entry), "relevant": relevant, "qid": entry["id"], "split": category}
            )
    with open(out / "tools.jsonl", "w", encoding="utf-8") as file:
        for record in tools.values():
            file.write(json.dumps(record, ensure_ascii=False) + "\n")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as file:
        for record in queries:
            file.write(json.dumps(record, ensure_ascii=False) + "\n")
    with open(out / "irrelevance.jsonl", "w", encoding="utf-8") as file:
        for entry in entries(source, "BFCL_v4_live_irrelevance.json"):
            file.write(json.dumps(unanswerable(entry, "live_irrelevance"), ensure_ascii=False) + "\n")
    print(f"{len(tools)} tools, {len(queries)} requests ({left_out} left out), irrelevance written", file=sys.stderr)


if __name__ == "__main__":
    main()
