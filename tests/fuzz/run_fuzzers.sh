#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` CMake preset: clang, ASan + UBSan, -O1) and runs each one
# for SECONDS with its seed corpus; fails on the first crash, leak, sanitizer report or check failure.
#   tests/fuzz/run_fuzzers.sh 600 journal_reader_fuzz
#   tests/fuzz/run_fuzzers.sh --preset asan 10    # CI (17 targets x 10 s): the test build's fuzzers
# --preset PRESET: use that preset's tree (build/PRESET) instead of `fuzz`: the `asan` preset builds
# the fuzzers too (at -O0: fewer runs per second, no second build), so CI fuzzes what it tested.
#   tests/fuzz/run_fuzzers.sh --regressions [TARGET...]
# New inputs found go to build/PRESET/corpus/<target>/ (never into the source tree); a crashing
# input is written to build/PRESET/artifacts/<target>/.
#
# --regressions runs each target once over the inputs in tests/fuzz/regressions/<seed dir>/:
# minimized inputs of crashes found by fuzzing whose fix is not in yet (see the README there).
set -euo pipefail

usage() {
  echo "usage: $0 [--preset PRESET] SECONDS [TARGET...] | $0 [--preset PRESET] --regressions [TARGET...]" >&2
  exit 2
}
preset=fuzz
if [[ "${1:-}" == "--preset" ]]; then
  [[ $# -ge 2 ]] || usage
  preset=$2
  shift 2
fi
[[ $# -ge 1 ]] || usage
mode=fuzz
if [[ "$1" == "--regressions" ]]; then
  mode=regressions
elif [[ ! "$1" =~ ^[0-9]+$ ]]; then
  usage
fi
seconds=$1
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

# Target -> directory name under tests/fuzz/corpus/ (seeds) and tests/fuzz/regressions/.
declare -A seeds=(
  [journal_reader_fuzz]=journal
  [batch_decoder_fuzz]=batch
  [kv_events_config_fuzz]=kv_events_config
  [kv_transfer_config_fuzz]=kv_transfer_config
  [request_params_fuzz]=request_params
  [indexer_config_fuzz]=indexer_config
  [source_flag_fuzz]=source_flag
  [http_api_fuzz]=http_api
  [router_query_fuzz]=router_query
  [kv_event_sources_fuzz]=kv_event_sources
  [event_json_fuzz]=event_json
  [trace_reader_fuzz]=trace_reader
  [manager_ops_fuzz]=manager_ops
  [replay_frames_fuzz]=replay_frames
  [fs_names_fuzz]=fs_names
  [fs_config_fuzz]=fs_config
  [fs_record_fuzz]=fs_record
)
# The largest input libFuzzer may build, per target (default 65536).
declare -A max_len=()

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(journal_reader_fuzz batch_decoder_fuzz kv_events_config_fuzz kv_transfer_config_fuzz
           request_params_fuzz indexer_config_fuzz source_flag_fuzz http_api_fuzz event_json_fuzz
           trace_reader_fuzz manager_ops_fuzz replay_frames_fuzz fs_names_fuzz fs_config_fuzz
           fs_record_fuzz router_query_fuzz kv_event_sources_fuzz)
fi
for t in "${targets[@]}"; do
  [[ -n "${seeds[$t]:-}" ]] || { echo "unknown fuzz target '$t'" >&2; exit 2; }
done

bash scripts/configure.sh "$preset"
cmake --build --preset "$preset" --target "${targets[@]}"
tree=build/$preset

# One target on each core at a time (KVO_FUZZ_JOBS overrides): the time budget is per target.
parallel=${KVO_FUZZ_JOBS:-$(nproc)}
fuzz_one() {
  local t=$1 bin=$tree/tests/fuzz/$1
  local work=$tree/corpus/$t artifacts=$tree/artifacts/$t
  local seed_dir=tests/fuzz/corpus/${seeds[$t]} len=${max_len[$t]:-65536}
  mkdir -p "$work" "$artifacts"
  rm -f "$tree/logs/$t.failed"
  {
    echo "== $t: ${seconds}s, max_len $len, seeds from $seed_dir"
    # The first corpus directory receives new inputs; the seed directory is only read.
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$len" \
      -print_final_stats=1 -artifact_prefix="$artifacts/" "$work" "$seed_dir" 2>&1 ||
      touch "$tree/logs/$t.failed"
  } >"$tree/logs/$t.log"
}
mkdir -p "$tree/logs"

status=0
for t in "${targets[@]}"; do
  bin=$tree/tests/fuzz/$t
  if [[ $mode == regressions ]]; then
    dir=tests/fuzz/regressions/${seeds[$t]}
    [[ -d $dir ]] || continue
    mapfile -t inputs < <(find "$dir" -type f ! -name '*.md' | sort)
    [[ ${#inputs[@]} -gt 0 ]] || continue
    echo "== $t: ${#inputs[@]} regression inputs from $dir"
    if ! "$bin" -rss_limit_mb=2048 "${inputs[@]}"; then
      echo "== $t FAILED on a regression input" >&2
      status=1
    fi
    continue
  fi
  jobs_running=$(jobs -rp | wc -l)
  while (( jobs_running >= parallel )); do
    wait -n || true
    jobs_running=$(jobs -rp | wc -l)
  done
  fuzz_one "$t" &
done
wait
# Each target's output, in order, once all have run (they run $parallel at a time).
for t in "${targets[@]}"; do
  [[ $mode == fuzz ]] || break
  cat "$tree/logs/$t.log"
  if [[ -e "$tree/logs/$t.failed" ]]; then
    echo "== $t FAILED; reproduce with: $tree/tests/fuzz/$t $tree/artifacts/$t/<crash file>" >&2
    status=1
  fi
done
exit $status
