#!/usr/bin/env bash
# clang-tidy, the curated check set of .clang-tidy (warnings are errors), over every library and
# tool source (not tests, fuzz targets, benchmarks or the CUDA engine), using the compile commands
# of a clang build: build/tsan by default (CI runs this after that build). ~5 min on 2 cores.
#   bash scripts/clang_tidy.sh [BUILD_DIR] [FILE...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/tsan}
shift || true
[ -f "$build/compile_commands.json" ] || { echo "clang_tidy.sh: no $build/compile_commands.json (configure a clang build first)" >&2; exit 2; }
if [ $# -gt 0 ]; then files=("$@"); else
  mapfile -t files < <(git ls-files '*.cc' | grep -vE '^(tests|bench|fuzz)/|/cuda/')
fi
# Only files the build compiles (a file of an optional component may be absent from it).
mapfile -t files < <(for f in "${files[@]}"; do
  grep -q "\"file\": \"$PWD/$f\"" "$build/compile_commands.json" && echo "$PWD/$f"; done)
echo "clang-tidy: ${#files[@]} files, $(nproc) jobs"
log=$(mktemp); trap 'rm -f "$log"' EXIT
if ! run-clang-tidy -p "$build" -j "$(nproc)" -quiet "${files[@]}" >"$log" 2>&1 ||
   grep -q "warning:\|error:" "$log"; then
  grep -E "(warning|error):" "$log" | sed 's/\x1b\[[0-9;]*m//g' | sort -u | head -100
  echo "clang-tidy: failed (the lines above; checks in .clang-tidy)" >&2
  exit 1
fi
echo "clang-tidy: clean"
