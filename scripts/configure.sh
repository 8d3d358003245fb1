#!/usr/bin/env bash
# Configures build/PRESET (`cmake --preset PRESET ARGS...`, quietly). A tree configured before with
# another compiler (the asan preset built with gcc until 2026-12-03) cannot switch in place: CMake
# drops its cache and stops; such a tree is configured afresh, once.
#   bash scripts/configure.sh PRESET [CMAKE ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=$1
shift
if ! cmake --preset "$preset" "$@" >/dev/null 2>&1; then
  echo "configure.sh: build/$preset did not configure (another compiler's tree?): configuring it afresh" >&2
  rm -rf "build/$preset/CMakeCache.txt" "build/$preset/CMakeFiles"
  cmake --preset "$preset" "$@" >/dev/null
fi
