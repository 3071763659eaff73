#!/usr/bin/env bash
# The test command: set-up, configure, build, then every test. Used by .ci/run and by developers.
#   scripts/test.sh            # everything
#   scripts/test.sh -R Store   # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/check-layout.sh  # ARCHITECTURE.md names every room; no source file over 800 lines
scripts/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"
ctest --preset default -j "$(nproc)" "$@"
