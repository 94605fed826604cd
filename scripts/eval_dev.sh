#!/usr/bin/env bash
# Evaluates one configuration on the three dev sets at once, with the
# "nothing fits" requests in the same run, and prints one table row per set.
#
# usage: scripts/eval_dev.sh [capdex eval options...]
#   e.g. scripts/eval_dev.sh --embedder static
#        scripts/eval_dev.sh --embedder local --model-dir .models/all-MiniLM-L6-v2 --replay 1
# Environment: CAPDEX (the binary, default target/release/capdex), BENCH (default ../shared/data/bench),
# HELDOUT (a folder scripts/bfcl_live.py wrote: adds a last row, `bfcl-live`, the held-out set, to be
# measured after a decision, never to make one), HELDOUT_CHATTER (non-empty: every set also ranks
# tests/fixtures/bench/nothing-fits/chatterbot.jsonl, small talk nobody here wrote, reported as its own
# split; held out in the same sense).
# Each set is ranked with its dev queries, the small-talk requests against its whole catalog and,
# for bfcl, BFCL's irrelevance requests against their own functions (bfcl-live: live_irrelevance's).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
capdex="${CAPDEX:-$here/target/release/capdex}"
bench="${BENCH:-$here/../shared/data/bench}"
nothing="$here/tests/fixtures/bench/nothing-fits"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
printf '%-11s %8s %8s %8s %8s %12s %10s %12s %s\n' set NDCG@10 R@5 R@1 MRR "empty(%)" "kept(%)" "gate kept(%)" replay
sets=(seal-tools metatool bfcl)
if [ -n "${HELDOUT:-}" ]; then sets+=(bfcl-live); fi
for set in "${sets[@]}"; do
  extra=(--queries "$nothing/small-talk.jsonl")
  if [ "$set" = bfcl-live ]; then
    tools="$HELDOUT/tools.jsonl" queries="$HELDOUT/queries.jsonl"
    extra+=(--queries "$HELDOUT/irrelevance.jsonl")
  else
    tools="$bench/$set/tools.jsonl" queries="$bench/$set/dev_queries.jsonl"
  fi
  if [ "$set" = bfcl ]; then extra+=(--queries "$nothing/bfcl-irrelevance.jsonl"); fi
  if [ -n "${HELDOUT_CHATTER:-}" ]; then extra+=(--queries "$nothing/chatterbot.jsonl"); fi
  "$capdex" eval --json --tools "$tools" --queries "$queries" \
    "${extra[@]}" --out "$out/$set.run.jsonl" "$@" > "$out/$set.json" 2> "$out/$set.err" ||
    { cat "$out/$set.err" >&2; exit 1; }
  python3 - "$set" "$out/$set.json" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
report = json.load(open(path))
m, f = report["metrics"], report["nothingFits"]
replay = report.get("replay")
def learning(l):
    if not l: return "none"
    memory = (f"+memory k={l['memoryOwnWeight']:g}" if l["memoryOwnWeight"] else
              "+words" if l.get("memoryWords") else "")
    return ("prior" if l["prior"] else "") + memory
r = (f"{replay['withoutLearning']['ndcgAt10']:.2f} -> {replay['learned']['ndcgAt10']:.2f} ({learning(replay['chosen'])};"
     f" {replay['trials']} trials, {replay['unseenTrials']} unseen)"
     f" (unseen {replay['unseen']}: {replay['unseenWithoutLearning']['ndcgAt10']:.2f} -> {replay['unseenLearned']['ndcgAt10']:.2f})"
     if replay else "")
if replay:
    sv = replay["served"]
    r += (f" | as served: {sv['asServed']['ndcgAt10']:.2f} -> {sv['learned']['ndcgAt10']:.2f}"
          f" ({learning(sv['chosen'])}; unseen {sv['unseenAsServed']['ndcgAt10']:.2f} -> {sv['unseenLearned']['ndcgAt10']:.2f})")
splits = f.get("unanswerableBySplit", {})
by_split = (" (" + ", ".join(f"{k} {v['answeredEmptyShare']:.1f}%" for k, v in splits.items()) + ")"
            if len(splits) > 1 else "")
print(f"{name:11s} {m['ndcgAt10']:8.2f} {m['recallAt5']:8.2f} {m['recallAt1']:8.2f} {m['mrr']:8.2f} "
      f"{f['answeredEmptyShare']:11.1f}% {f['keptShare']:9.2f}% {f['gateKeptShare']:11.2f}% {r}{by_split}")
PY
done
