#!/usr/bin/env bash
# clang-tidy, the curated check set of .clang-tidy (warnings are errors), over every library and
# tool source (not tests, fuzz targets, benchmarks or the CUDA engine), using the compile commands
# of a clang build (build/tsan by default; CI runs this after that build) without its precompiled
# header, so a missing #include fails here.
# A file is tidied unless its exact inputs were found clean before: .clang-tidy-clean records, for
# each file, the SHA-256 of the clang-tidy version, .clang-tidy, the compile command and the
# preprocessed file with comments and macro definitions (scripts/tidy_inputs.py); a run without a
# finding updates it (commit it with your change). A change to a file, to a header it includes,
# to a flag or to the checks changes the key, and the file is tidied again. Every file: ~12 min
# on 2 cores; --all ignores the record.
#   bash scripts/clang_tidy.sh [--all] [BUILD_DIR] [FILE...]
set -euo pipefail
cd "$(dirname "$0")/.."
record=.clang-tidy-clean
if [ "${1:-}" = "--all" ]; then record=-; shift; fi
build=${1:-build/tsan}
shift || true
[ -f "$build/compile_commands.json" ] || { echo "clang_tidy.sh: no $build/compile_commands.json (configure a clang build first)" >&2; exit 2; }
if [ $# -gt 0 ]; then files=("$@"); else
  mapfile -t files < <(git ls-files '*.cc' | grep -vE '^(tests|bench|fuzz)/|/cuda/')
fi
# Only files the build compiles (a file of an optional component may be absent from it).
mapfile -t files < <(for f in "${files[@]}"; do
  grep -q "\"file\": \"$PWD/$f\"" "$build/compile_commands.json" && echo "$PWD/$f"; done)
work=$(mktemp -d); log="$work/log"; trap 'rm -rf "$work"' EXIT
mapfile -t todo < <(/usr/bin/python3 scripts/tidy_inputs.py plan "$build" "$work" "$record" "${files[@]}")
echo "clang-tidy: ${#files[@]} files, ${#todo[@]} with inputs not found clean before ($record), $(nproc) jobs"
if [ ${#todo[@]} -gt 0 ]; then
  if ! run-clang-tidy -p "$work" -j "$(nproc)" -quiet "${todo[@]}" >"$log" 2>&1 ||
     grep -q "warning:\|error:" "$log"; then
    grep -E "(warning|error):" "$log" | sed 's/\x1b\[[0-9;]*m//g' | sort -u | head -100
    echo "clang-tidy: failed (the lines above; checks in .clang-tidy)" >&2
    exit 1
  fi
fi
/usr/bin/python3 scripts/tidy_inputs.py record "$work" .clang-tidy-clean
echo "clang-tidy: clean"
