#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for FUZZ_SECONDS each (default 25), on
# stable Rust (libFuzzer's coverage, no sanitizer: capdex is safe Rust, so a
# panic, an overflow, a recursion or an allocation over the RSS limit is what
# a crash is). Each target starts from its committed seeds (fuzz/seeds/<target>)
# (and, for SQL DDL and MCP tool lists, the test fixtures' folders) and its local corpus
# (fuzz/corpus/<target>, gitignored). Prints, per target,
# the CPU seconds, executions and crashes, and exits non-zero on any crash
# (the reproducer is in fuzz/artifacts/<target>/).
#
#   bash scripts/fuzz.sh                 # every target, 25 s each
#   FUZZ_SECONDS=3600 bash scripts/fuzz.sh openapi_map sql_ddl
#   FUZZ_CPU_SECONDS=3600 nice -n 19 bash scripts/fuzz.sh sql_ddl
#
# FUZZ_CPU_SECONDS runs each target until its fuzzer has used that many CPU
# seconds (not wall seconds: a niced run on a busy machine still gets its
# hour), then interrupts it; libFuzzer prints its final statistics either way.
#
# Every target's run, finished or interrupted (SIGINT or SIGTERM to this
# script stops the running fuzzer, records it and exits), is appended to
# fuzz/ledger.tsv (date, target, CPU s, executions, crashes, exit status,
# commit, build). The corpus carries over from run to run, so a target's
# fuzzing adds up across runs; its CPU seconds so far, release builds only:
#
#   awk -F'\t' '$8 == "release" {cpu[$2] += $3; n[$2]++; c[$2] += $5}
#     END {for (t in cpu) printf "%-22s %6d CPU s in %d runs, %d crashes\n", t, cpu[t], n[t], c[t]}' fuzz/ledger.tsv
#
# Do not pause a fuzzer (SIGSTOP, to keep a benchmark's machine quiet): libFuzzer
# times each input by the wall clock, so the input running at the pause is
# reported, on resume, as a timeout (-timeout=10) and the run ends with a
# false crash. Stop it (SIGTERM to this script, which records the run) and
# start it again later: the corpus carries over.
#
# FUZZ_BUILD=dev builds without optimisations (minutes instead of tens of
# minutes from a clean clone, fewer executions a second): .ci/run's smoke.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"

seconds="${FUZZ_SECONDS:-25}"
profile=()
if [ "${FUZZ_BUILD:-release}" = dev ]; then
  profile=(--dev)
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "==> cargo install cargo-fuzz --locked"
  cargo install cargo-fuzz --locked
fi

echo "==> cargo fuzz build --sanitizer none ${profile[*]}"
cargo fuzz build --sanitizer none "${profile[@]}"

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi

crashed=0
ledger="$PWD/ledger.tsv"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
# A stop asked for from outside: interrupt the running fuzzer, record it, end.
stopping=0
fuzzer_of() { pgrep -n -f "/release/$1 |/debug/$1 " || true; }
stop() {
  stopping=1
  local fuzzer
  fuzzer=$(fuzzer_of "$target")
  [ -n "$fuzzer" ] && kill -INT "$fuzzer" 2>/dev/null || true
}
trap stop INT TERM
printf '%-22s %10s %12s %8s\n' target cpu_s execs crashes
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target" "artifacts/$target"
  log="$(mktemp)"
  before=$(find "artifacts/$target" -type f | wc -l)
  status=0
  # bash's `time` gives the user and system CPU seconds of the run.
  # -timeout: one input may take 10 s at most; -rss_limit_mb: 2 GiB.
  TIMEFORMAT='%U %S'
  # Seeds: the target's own (fuzz/seeds/<target>) and, for SQL DDL and MCP tool
  # lists, the test fixtures' folders themselves (real captures, not copies).
  # libFuzzer takes folders here: a file argument would only be run, not fuzzed.
  seeds=()
  [ -d "seeds/$target" ] && seeds+=("seeds/$target")
  case "$target" in
    sql_ddl) seeds+=(../tests/fixtures/sql) ;;
    mcp_tool_list) seeds+=(../tests/fixtures/mcp) ;;
  esac
  if [ -n "${FUZZ_CPU_SECONDS:-}" ]; then
    # Wall time is only a backstop here: the watcher below stops the fuzzer
    # once its own CPU time (utime + stime, /proc/PID/stat) reaches the budget.
    wall=$((FUZZ_CPU_SECONDS * 50))
    { time cargo fuzz run --sanitizer none "${profile[@]}" "$target" "corpus/$target" "${seeds[@]}" -- \
        -max_total_time="$wall" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1; } 2>"$log.time" &
    runner=$!
    ticks=$(getconf CLK_TCK)
    interrupted=0
    used=0
    while kill -0 "$runner" 2>/dev/null; do
      sleep 5
      fuzzer=$(fuzzer_of "$target")
      [ -n "$fuzzer" ] || continue
      used=$(awk -v t="$ticks" '{printf "%d", ($14 + $15) / t}' "/proc/$fuzzer/stat" 2>/dev/null || echo 0)
      if [ "$used" -ge "$FUZZ_CPU_SECONDS" ]; then
        kill -INT "$fuzzer" 2>/dev/null || true
        interrupted=1
        break
      fi
    done
    # `wait` returns early when a trapped signal arrives: wait again until the runner has ended.
    while :; do
      if wait "$runner"; then status=0; else status=$?; fi
      kill -0 "$runner" 2>/dev/null || break
    done
    # libFuzzer exits 72 when interrupted (cargo fuzz passes on a failure of
    # its own): the budget spent, not a crash, when no reproducer was written.
    if { [ "$interrupted" -eq 1 ] || [ "$stopping" -eq 1 ]; } && [ "$(find "artifacts/$target" -type f | wc -l)" -eq "$before" ]; then
      status=0
    fi
  else
    { time cargo fuzz run --sanitizer none "${profile[@]}" "$target" "corpus/$target" "${seeds[@]}" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1 || status=$?; } 2>"$log.time"
  fi
  cpu=$(awk '{printf "%.0f", $1 + $2}' "$log.time" 2>/dev/null || true)
  # No `time` line (its subshell was stopped too): the watcher's last reading.
  [ -n "$cpu" ] || cpu="${used:-?}"
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  after=$(find "artifacts/$target" -type f | wc -l)
  crashes=$((after - before))
  if [ "$status" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    crashed=1
    echo "---- $target failed (exit $status):"
    tail -n 40 "$log"
  fi
  printf '%-22s %10s %12s %8s\n' "$target" "$cpu" "${execs:-?}" "$crashes"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$target" "$cpu" "${execs:-0}" "$crashes" \
    "$status" "$commit" "${FUZZ_BUILD:-release}" >>"$ledger"
  rm -f "$log" "$log.time"
  [ "$stopping" -eq 1 ] && break
done
exit "$crashed"
