#!/usr/bin/env bash
# Crash and fault trials (issue 24): runs `benches/trials.rs` against real
# nats-server and `capdex serve` processes, each path repeated with seeded
# random kill points, and prints a table per path (trials, acknowledged,
# lost, doubled, failures, NATS recovery p50/p99/max). Exits non-zero if
# anything acknowledged was lost or doubled, or a trial failed.
#
#   bash scripts/trials.sh                        # 20 trials per path, every path
#   TRIALS=2 bash scripts/trials.sh               # the smoke CI can run
#   SEED=42 PATHS=kill9,nats bash scripts/trials.sh
#   CAPDEX_BENCH_SERVE_BIN=target/debug/capdex bash scripts/trials.sh
#
# Paths: kill9, nats, sigterm, diskfull (mounts a tmpfs: needs root, else it
# is reported as skipped), corrupt, second. The node is the bench build's
# capdex (release) unless CAPDEX_BENCH_SERVE_BIN names another binary;
# nats-server is CAPDEX_NATS_SERVER, .venv/bin/nats-server or PATH.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

args=(--trials "${TRIALS:-20}")
if [ -n "${SEED:-}" ]; then
  args+=(--seed "$SEED")
fi
if [ -n "${PATHS:-}" ]; then
  args+=(--paths "$PATHS")
fi
exec cargo bench --locked --bench trials -- --bench "${args[@]}"
