#!/usr/bin/env bash
# ctest fixture of the fuzz smoke tests: configures and builds the `fuzz` preset (clang, libFuzzer,
# ASan, UBSan; build/fuzz) from the source tree. ccache makes a rebuild cheap.
set -euo pipefail
cd "$(dirname "$0")/../.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cmake --preset fuzz >"$log" 2>&1 || { cat "$log"; exit 1; }
cmake --build --preset fuzz -j "$(nproc)"
