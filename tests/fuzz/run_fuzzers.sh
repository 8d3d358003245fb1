#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` CMake preset: clang, ASan + UBSan) and runs each one for
# SECONDS with its seed corpus; fails on the first crash, leak, sanitizer report or check failure.
#   tests/fuzz/run_fuzzers.sh 20          # CI
#   tests/fuzz/run_fuzzers.sh 600 journal_reader_fuzz
# New inputs found go to build/fuzz/corpus/<target>/ (never into the source tree); a crashing input
# is written to build/fuzz/artifacts/<target>/.
set -euo pipefail

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 SECONDS [TARGET...]" >&2
  exit 2
fi
seconds=$1
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(journal_reader_fuzz batch_decoder_fuzz)
fi

cmake --preset fuzz
cmake --build --preset fuzz --target "${targets[@]}"

declare -A seeds=([journal_reader_fuzz]=journal [batch_decoder_fuzz]=batch)
status=0
for t in "${targets[@]}"; do
  bin=build/fuzz/tests/fuzz/$t
  work=build/fuzz/corpus/$t
  artifacts=build/fuzz/artifacts/$t
  mkdir -p "$work" "$artifacts"
  seed_dir=tests/fuzz/corpus/${seeds[$t]:-$t}
  echo "== $t: ${seconds}s, seeds from $seed_dir"
  # The first corpus directory receives new inputs; the seed directory is only read.
  if ! "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$artifacts/" "$work" "$seed_dir"; then
    echo "== $t FAILED; reproduce with: $bin $artifacts/<crash file>" >&2
    status=1
  fi
done
exit $status
