#!/usr/bin/env bash
# The whole test suite: install what is missing, build with AddressSanitizer + UBSan (clang), run every
# test with ctest (a sanitizer build costs no more to build than a plain debug one and catches
# more). Usage: scripts/test.sh [preset]   (asan by default; debug, tsan and release also work)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-asan}"
bash scripts/deps.sh
bash scripts/configure.sh "$preset"
cmake --build --preset "$preset"
# KVO_CTEST_ARGS: extra ctest arguments (CI's TSan run passes -LE fault: see .ci/run).
# shellcheck disable=SC2086
ctest --preset "$preset" -j "$(nproc)" --timeout 600 ${KVO_CTEST_ARGS:-}
