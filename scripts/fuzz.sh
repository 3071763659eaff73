#!/usr/bin/env bash
# Fuzzes every parser that reads bytes from outside the process (tests/fuzz), with libFuzzer,
# ASan and UBSan (the `fuzz` preset, clang). Each target starts from the kept corpus
# tests/fuzz/corpus/<target> plus the crash inputs tests/fuzz/regressions/<target>; inputs that
# reach new code go to build/fuzz/corpus/<target> (kept between runs, not in git); a crash leaves
# its input in build/fuzz/crashes/<target>/ and makes the script fail.
#   scripts/fuzz.sh [SECONDS] [TARGET...]     # SECONDS per target (default 60); all targets
#   FUZZ_JOBS=2 scripts/fuzz.sh 600 tokenizer_fuzz
# To keep a crash as a regression input once it is fixed:
#   cp build/fuzz/crashes/<target>/crash-* tests/fuzz/regressions/<target>/
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=${1:-60}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(sed -n 's/^trainctl_fuzzer(\([a-z_]*\) .*/\1/p' tests/fuzz/CMakeLists.txt)
fi

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)" >/dev/null

failed=()
printf '%-24s %8s %12s %8s %8s  %s\n' TARGET SECONDS EXECS COV CORPUS RESULT
for target in "${targets[@]}"; do
  bin=$root/build/fuzz/tests/fuzz/$target
  [[ -x $bin ]] || { echo "fuzz: no target $target (tests/fuzz/CMakeLists.txt)" >&2; exit 2; }
  grown=$root/build/fuzz/corpus/$target crashes=$root/build/fuzz/crashes/$target
  mkdir -p "$grown" "$crashes" "tests/fuzz/regressions/$target"
  log=$root/build/fuzz/$target.log
  start=$(date +%s)
  result=ok
  parallel=()  # libFuzzer's -jobs write fuzz-N.log into the working directory: build/fuzz
  if ((${FUZZ_JOBS:-1} > 1)); then parallel=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS"); fi
  if ! (cd build/fuzz && "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
    -max_len=65536 "${parallel[@]}" -print_final_stats=1 -artifact_prefix="$crashes/" "$grown" \
    "$root/tests/fuzz/corpus/$target" "$root/tests/fuzz/regressions/$target" >"$log" 2>&1); then
    result="CRASH (see $log, input in $crashes/)"
    failed+=("$target")
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  printf '%-24s %8s %12s %8s %8s  %s\n' "$target" "$(($(date +%s) - start))" "${execs:-?}" \
    "${cov:-?}" "$(find "$grown" -type f | wc -l)" "$result"
done
if ((${#failed[@]})); then
  echo "fuzz: crashes in ${failed[*]}" >&2
  exit 1
fi
