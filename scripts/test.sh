#!/usr/bin/env bash
# The whole test suite: install what is missing, build with AddressSanitizer + UBSan, run every
# test with ctest (a sanitizer build costs no more to build than a plain debug one and catches
# more). Usage: scripts/test.sh [preset]   (asan by default; debug, tsan and release also work)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-asan}"
bash scripts/deps.sh
# A tree configured before with another compiler (the asan preset built with gcc until 2026-12-03)
# cannot switch in place: CMake drops its cache and stops. Configure such a tree afresh, once.
if ! cmake --preset "$preset" >/dev/null 2>&1; then
  echo "scripts/test.sh: build/$preset did not configure (another compiler's tree?): configuring it afresh" >&2
  rm -rf "build/$preset/CMakeCache.txt" "build/$preset/CMakeFiles"
  cmake --preset "$preset" >/dev/null
fi
cmake --build --preset "$preset"
# KVO_CTEST_ARGS: extra ctest arguments (CI's TSan run passes -LE fault: see .ci/run).
# shellcheck disable=SC2086
ctest --preset "$preset" -j "$(nproc)" --timeout 600 ${KVO_CTEST_ARGS:-}
