#!/usr/bin/env bash
# CI's fuzz smoke for one target: every kept input (tests/fuzz/corpus/<target>) and every crash
# input found before (tests/fuzz/regressions/<target>) runs once and must pass; then libFuzzer
# mutates from them for SECONDS. New inputs go to a scratch directory, not to the kept corpus.
#   tests/fuzz/smoke.sh TARGET SECONDS
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
target=$1 seconds=$2
bin=$src/build/fuzz/tests/fuzz/$target
[[ -x $bin ]] || { echo "smoke: $bin is missing: build the fuzz preset (tests/fuzz/build.sh)" >&2; exit 1; }
corpus=$src/tests/fuzz/corpus/$target regressions=$src/tests/fuzz/regressions/$target
[[ -d $corpus ]] || { echo "smoke: no kept corpus $corpus" >&2; exit 1; }
inputs=("$corpus"/*)
if [[ -d $regressions ]]; then inputs+=("$regressions"/*); fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# Replay: each input once (a regression that crashes again fails here, naming the input).
for input in "${inputs[@]}"; do
  [[ -f $input ]] || continue
  "$bin" -runs=1 "$input" >"$scratch/replay.log" 2>&1 ||
    { cat "$scratch/replay.log"; echo "smoke: $target crashes on $input" >&2; exit 1; }
done
mkdir "$scratch/grown"
if ! "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
  -print_final_stats=1 -artifact_prefix="$scratch/" "$scratch/grown" "$corpus" \
  >"$scratch/fuzz.log" 2>&1; then
  cat "$scratch/fuzz.log"
  for crash in "$scratch"/crash-* "$scratch"/leak-* "$scratch"/timeout-* "$scratch"/oom-*; do
    [[ -f $crash ]] && echo "smoke: crash input (base64): $(base64 -w0 "$crash")" >&2
  done
  echo "smoke: $target crashed within $seconds s" >&2
  exit 1
fi
grep -E '^stat::number_of_executed_units|^#[0-9]+ +DONE' "$scratch/fuzz.log" || true
