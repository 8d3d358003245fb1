#!/usr/bin/env bash
# The whole test suite: install what is missing, build (debug), run every test with ctest.
# Usage: scripts/test.sh [preset]   (debug by default; asan and tsan also work)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-debug}"
bash scripts/deps.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset" -j "$(nproc)" --timeout 600
