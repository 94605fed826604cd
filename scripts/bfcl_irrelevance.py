#!/usr/bin/env python3
"""Convert BFCL's `irrelevance` category into a capdex eval query file.

usage: scripts/bfcl_irrelevance.py BFCL_EVAL_WHEEL_OR_DATA_DIR > tests/fixtures/bench/nothing-fits/bfcl-irrelevance.jsonl

Input: the `bfcl-eval` package from PyPI (Apache-2.0), as its wheel or its unpacked `bfcl_eval/data`
folder, e.g. `pip download bfcl-eval==2026.3.23 --no-deps -d /tmp/bfcl` in a scratch environment.
Each request comes with its own few functions, none of which fits it. Output: one
{"query", "relevant": [], "qid", "split": "irrelevance", "tools": [...]} a line, the tools in the
tools.jsonl shape (`{"id","name","description","category","tags","params"}`), so `capdex eval`
ranks the request against those functions alone and the right answer is an empty Tier 1.
The `live_*` categories are left out on purpose: they are kept for held-out measurement.
"""
import json
import sys
import zipfile
from pathlib import Path

NAME = "BFCL_v4_irrelevance.json"


def entries(source: Path, name: str = NAME):
    """The JSON lines of `name` (a file under `bfcl_eval/data`) in the wheel or data folder `source`."""
    if source.is_file():
        with zipfile.ZipFile(source) as wheel:
            lines = wheel.read(f"bfcl_eval/data/{name}").decode("utf-8").splitlines()
    else:
        lines = (source / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def last_user_message(entry):
    turns = [message for turn in entry["question"] for message in turn if message.get("role") == "user"]
    return turns[-1]["content"]


def unanswerable(entry, split):
    """An entry as a request nothing fits, ranked against its own functions."""
    return {
        "query": last_user_message(entry),
        "relevant": [],
        "qid": entry["id"],
        "split": split,
        "tools": [tool(function) for function in entry["function"]],
    }


def tool(function):
    parameters = function.get("parameters") or {}
    required = set(parameters.get("required") or [])
    params = [
        {
            "name": name,
            "type": spec.get("type"),
            "description": spec.get("description", ""),
            "required": name in required,
        }
        for name, spec in (parameters.get("properties") or {}).items()
    ]
    return {
        "id": function["name"],
        "name": function["name"],
        "description": function.get("description", ""),
        "category": "irrelevance",
        "tags": [],
        "params": params,
    }


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for entry in entries(Path(sys.argv[1])):
        print(json.dumps(unanswerable(entry, "irrelevance"), ensure_ascii=False))


if __name__ == "__main__":
    main()
